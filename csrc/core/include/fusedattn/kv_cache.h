// The torch-free contracts of the KV-cache operators:
//   copy_to_kv_cache: KvAppendArgs -> check_kv_append -> KvAppendParams -> run_kv_append_{cpu,cuda}
//   fwd_kvcache (append, then attention over the caches): FwdArgs + KvStepInputs -> check_kv_step
//     -> KvStepParams -> run_kv_step_cpu / run_kv_step_cuda
// Token i of sequence b goes to cache position pos = cache_seqlens[b] + i: page
// page_table[b, pos / page_size], slot pos % page_size. A non-paged cache [max_batch, max_seqlen,
// h_kv, d] is page_size = max_seqlen with page_table = batch indices [b, 1] (or no table: row b).
// Data-dependent validity (positions past the table's capacity, pages outside the pool, negative
// or non-monotone lengths) lives in device memory: the CPU engine checks all of it before writing
// anything, so a failed call leaves the caches untouched; a CUDA engine cannot report it without a
// host synchronisation, so it skips such tokens (never writes out of bounds) and
// InferenceParams.pre_step checks the same rules on the host.
#pragma once

#include <cstdint>

#include "fusedattn/api.h"
#include "fusedattn/host_device.h"
#include "fusedattn/params.h"
#include "fusedattn/types.h"

namespace fusedattn {

// Every argument of one append. Tensors as the operator receives them.
struct KvAppendArgs {
  Format new_format = Format::kBSHD;  // qkv_format of new_k / new_v
  TensorRef new_k, new_v;      // bshd [b, s_new, h_kv, d], sbhd [s_new, b, h_kv, d] or thd [t, h_kv, d]
  TensorRef k_cache, v_cache;  // [num_pages, page_size, h_kv, d_k|d_v]; same dtype and device as new_k/new_v
  TensorRef page_table;        // int32 [b, max_pages_per_seq]; absent: sequence b in row (page) b
  TensorRef cu_new_lens;       // int32 [b + 1]: cumulative step lengths (thd: token offsets into new_k/new_v);
                               // absent (bshd/sbhd only): every sequence appends s_new tokens
  TensorRef cache_seqlens;     // int32 [b]: every sequence's cache length before this step
  const char* cu_new_lens_name = "cu_new_lens";  // in messages: the caller's name for it
};

// Engine-facing parameters, filled only by make_kv_append_params.
struct KvAppendParams {
  int64_t b = 0;        // sequences in this step (rows of page_table)
  int64_t s_new = 0;    // bshd/sbhd: the new tensors' sequence dim (an upper bound of every len(b));
                        // thd: the token dim t (sum of len(b) <= t)
  int64_t h_kv = 0, d_k = 0, d_v = 0;
  DType dtype = DType::kOther;
  bool new_is_thd = false;
  // Rows of new_k/new_v: bshd/sbhd read token i of sequence b at
  // b * stride_b + i * stride_s; thd (stride_b == 0) at
  // (cu_new_lens[b] + i) * stride_s. Any strides.
  SeqTensor new_k, new_v;
  // The caches: stride_b is the page stride, stride_s the slot stride.
  SeqTensor k_cache, v_cache;
  // page_table, its row stride, page_size, max_pages (per sequence) and num_pages (pool size),
  // exactly as the forward's FwdParams::paged. page_table null: page b holds sequence b
  // (max_pages = 1, page_size = the caches' sequence dim).
  PagedKV paged;
  const int32_t* cu_new_lens = nullptr;    // [b + 1]; null: len(b) = s_new (bshd/sbhd)
  const int32_t* cache_seqlens = nullptr;  // [b]
  const char* cu_new_lens_name = "cu_new_lens";
  // Positions a sequence can hold: paged.max_pages * paged.page_size.
  int64_t capacity = 0;
};

// Sequence b's new tokens and their page-table entry: what every engine reads the same way.
FUSEDATTN_HD int64_t kv_new_len(const KvAppendParams& p, int64_t b) {
  return p.cu_new_lens != nullptr ? int64_t(p.cu_new_lens[b + 1]) - p.cu_new_lens[b] : p.s_new;
}
FUSEDATTN_HD int64_t kv_page_of(const PagedKV& pk, int64_t b, int64_t pos) {
  return pk.page_table != nullptr ? int64_t(pk.page_table[b * pk.stride_b + pos / pk.page_size]) : b;
}

// Validates everything that can be checked without reading device data
// (dtypes, devices, shapes, formats, dense 1-D arguments, caches without
// stride-0 dims, and attention's head-dim rule: a cache is appended to be
// attended to). Messages name the argument and value.
Status check_kv_append(const KvAppendArgs& args);

// Calls check_kv_append, then fills *params.
Status make_kv_append_params(const KvAppendArgs& args, KvAppendParams* params);

// CPU engine. Reads cu_new_lens / cache_seqlens / page_table, rejects (with
// kInvalidArgument, before writing anything) a non-monotone cu_new_lens, a
// negative cache length, a step longer than s_new (bshd/sbhd) or past the
// token dim (thd), a position >= capacity, and a page index outside
// [0, num_pages); then copies every new token into its slot.
Status run_kv_append_cpu(const KvAppendParams& params);

// The CUDA engine (csrc/cuda, declared in fusedattn/cuda_api.h):
//   Status run_kv_append_cuda(const KvAppendParams& params, const CudaLaunch& launch);
// on launch.stream, no workspace, no host synchronisation; skips (never
// writes) tokens that the CPU engine would reject.

// ---- fwd_kvcache: one step of a decoder layer against its KV cache ----
//
// The step's new tokens are the queries' own: new_k / new_v have q's format and token layout, so
// sequence b appends len_q(b) tokens (cu_seqlens_q, or s_q each in bshd/sbhd without it), and its
// queries attend over its keys [0, cache_seqlens[b] + len_q(b)): the cache, then the new tokens.
// On CUDA the decode engine does both in its attention launch (the blocks read the new tokens
// from new_k / new_v, and exactly one block per (sequence, KV head, token) writes them into the
// cache); elsewhere the append runs first, then the attention.
struct KvStepInputs {
  // q, k = k_cache and v = v_cache (page pools, or per-sequence caches [>= b, s_cache, h_kv, d]
  // when page_table is absent), page_table, cu_seqlens_q, alibi_slopes, softmax_offset.
  // cu_seqlens_kv and the *_padded offsets are not taken: the key lengths follow from
  // cache_seqlens; bias, attn_mask and dropout are not taken with a KV cache.
  FwdInputs attn;
  TensorRef new_k, new_v;   // q's format and token dims, the caches' heads and head dims
  TensorRef cache_seqlens;  // int32 [b]: cache lengths before the step
};

struct KvStepParams {
  // Attention over the caches. seqlens.cu_seqlens_kv is null: sequence b's key count is
  // kv_step_len(cache_seqlens[b], len_q(b)). paged.page_table is null for per-sequence caches
  // (page b, of page_size s_cache, is sequence b's row).
  FwdParams attn;
  // The append into the same caches: new_k / new_v in q's layout, cu_new_lens = cu_seqlens_q.
  KvAppendParams append;
};

// Keys of a sequence in a step: its cache and its new tokens.
FUSEDATTN_HD int64_t kv_step_len(int64_t cached, int64_t len_q) { return cached + len_q; }

// The attention call's check (check_fwd, which fills *prob) and the append's (check_kv_append),
// plus what a step adds: new_k / new_v in q's layout, cache_seqlens int32 [b], no key lengths or
// padded offsets of the caller's own.
Status check_kv_step(const FwdArgs& args, const KvStepInputs& in, CheckedProblem* prob);

// Output shapes are fwd_output_shapes(args, prob.get()). Fills *params from a call that
// check_kv_step validated (the same args and inputs).
Status make_kv_step_params(const FwdArgs& args, const KvStepInputs& in, const CheckedProblem& prob,
                           const FwdOutputs& out, KvStepParams* params);

// CPU engine: every rule of run_kv_append_cpu plus the pages attention reads below the new tokens
// (page_table[b, 0 .. (cache_seqlens[b] + len(b) - 1) / page_size] inside the pool) are checked
// before anything is written; then the append, then the attention (run_fwd_cpu).
Status run_kv_step_cpu(const KvStepParams& params, const Executor& exec);

// The CUDA engine (fusedattn/cuda_api.h): plan_kv_step_cuda / run_kv_step_cuda.

}  // namespace fusedattn
