// The decode engine: attention of a few query tokens per sequence against a
// KV cache read through a page table (FwdParams::paged), fp16 and bf16, head
// dims up to 256. Split-KV (flash-decoding): the keys of a sequence are cut
// into `splits` ranges computed by separate blocks, whose partial (out, lse)
// a combine kernel merges. The split count comes from the shapes and the SM
// count only (never from cu_seqlens), so the workspace has a fixed size and
// the call captures in a CUDA graph; the keys a split covers are derived on
// the device from the actual cache length.
//
// A KV-cache step (fwd_kvcache) runs on the same kernels: the step's new tokens are read from
// new_k / new_v as the last keys of each sequence and written into the cache by their owner block.
//
// plan_fwd / plan_step (host) -> workspace bytes -> run_fwd (decode kernel [+ combine]).
#pragma once

#include <cstddef>
#include <string>

#include "common/device.h"
#include "fastdiv.h"
#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace decode {

// Everything the kernels need beyond FwdParams.
struct KernelArgs {
  int group = 1;       // h_q / h_kv
  int rows = 0;        // query rows per (sequence, KV head): s_q * group
  int splits = 1;      // blocks per (sequence, KV head, row chunk) along the keys
  float scale_log2 = 0.f;  // softmax scale * log2(e)
  bool out_vec = false;    // out rows can take 8-byte stores
  // Split partials (splits > 1): O normalised by its own sum, fp32
  // [splits, b, h_kv, rows, d_v]; lse in log2 units [splits, b, h_kv, rows]
  // (-inf: no visible key in that split).
  float* ws_o = nullptr;
  float* ws_lse = nullptr;
  // The kernels' launch-wide divisors: h_kv, group, splits, page_size, h_q.
  FastDiv div_hkv, div_group, div_splits, div_ps, div_hq;
  // sm_90 (FUSEDATTN_DECODE_PDL, run.cu): the combine is launched as a programmatic dependent of
  // the decode kernel (pdl), the decode kernel as one of the work before it (pdl_main).
  bool pdl = false;
  bool pdl_main = false;
  // A KV-cache step (fusedattn/kv_cache.h; null cache_seqlens: plain attention over the cache).
  // Sequence b's keys are its c_b = cache_seqlens[b] cached ones, then its len_q(b) new ones, which
  // are read from new_k / new_v at the queries' tokens (never from the slots being written). New
  // token i of (sequence, KV head) is written into its slot by one block: the one whose
  // chunk * splits + split is i modulo chunks * splits.
  const int32_t* cache_seqlens = nullptr;
  SeqTensor new_k, new_v;
};

// "" and a filled plan (CudaPlan::decode, the workspace) when the engine takes the call, else why
// not. The split count comes from the shapes and the device's SM count.
std::string plan_fwd(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan);
// The same for a KV-cache step: s.attn is the attention (its page table may be null: per-sequence
// caches, page b = sequence b's row), s.append the step's new tokens.
std::string plan_step(const KvStepParams& s, const gpu::DeviceAttrs& dev, CudaPlan* plan);

// Launch a call planned here (launch.workspace of at least plan.workspace_bytes); `step` for a
// call planned by plan_step (then p is step->attn).
Status run_fwd(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch, const KvStepParams* step = nullptr);

// Typed launchers (decode_<dtype>_hd<D>.cu).
template <class T, int D>
Status launch_decode(const FwdParams& p, const DecodeSchedule& plan, const KernelArgs& a, void* stream);
template <class T>
Status launch_combine(const FwdParams& p, const KernelArgs& a, void* stream);
template <class T>
Status launch_init_outputs(const FwdParams& p, void* stream);

}  // namespace decode
}  // namespace fusedattn
