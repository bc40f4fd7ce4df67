// KV-cache append: the torch-free contract of fusedattn::copy_to_kv_cache.
//
//   KvAppendArgs --check_kv_append--> (ok) --make_kv_append_params--> KvAppendParams
//   --run_kv_append_cpu / run_kv_append_cuda--> the caches are written in place.
//
// One decoding (or prefill) step appends len(b) = cu_new_lens[b+1] - cu_new_lens[b]
// new tokens to every sequence b of the step: token i of sequence b goes to
// cache position pos = cache_seqlens[b] + i, i.e. page
// page_table[b, pos / page_size], slot pos % page_size of k_cache / v_cache.
// A non-paged cache [max_batch, max_seqlen, h_kv, d] is the case
// page_size = max_seqlen with page_table = batch indices [b, 1] (as in the
// forward's FwdInputs::page_table), so there is one code path.
//
// Data-dependent validity (positions past the page table's capacity, page
// indices outside the pool, negative or non-monotone lengths) lives in device
// memory. The CPU engine checks all of it before writing anything and returns
// kInvalidArgument, so a bad call leaves the caches untouched. A CUDA engine
// cannot report it without a host synchronisation: it must never write out of
// bounds (it skips any token whose position or page is out of range) and the
// Python side (InferenceParams.pre_step) checks the same rules on the host,
// where the bookkeeping lives, before any device work.
#pragma once

#include <cstdint>

#include "fusedattn/params.h"
#include "fusedattn/types.h"

namespace fusedattn {

// Every argument of one append. Tensors as the operator receives them.
struct KvAppendArgs {
  Format new_format = Format::kBSHD;  // qkv_format of new_k / new_v
  TensorRef new_k, new_v;      // bshd [b, s_new, h_kv, d], sbhd [s_new, b, h_kv, d] or thd [t, h_kv, d]
  TensorRef k_cache, v_cache;  // [num_pages, page_size, h_kv, d_k|d_v]; same dtype and device as new_k/new_v
  TensorRef page_table;        // int32 [b, max_pages_per_seq]
  TensorRef cu_new_lens;       // int32 [b + 1]: cumulative step lengths (thd: token offsets into new_k/new_v)
  TensorRef cache_seqlens;     // int32 [b]: every sequence's cache length before this step
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
  // page_table, its row stride, page_size, max_pages (per sequence) and
  // num_pages (pool size), exactly as the forward's FwdParams::paged.
  PagedKV paged;
  const int32_t* cu_new_lens = nullptr;    // [b + 1]
  const int32_t* cache_seqlens = nullptr;  // [b]
  // Positions a sequence can hold: paged.max_pages * paged.page_size.
  int64_t capacity = 0;
};

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

}  // namespace fusedattn
