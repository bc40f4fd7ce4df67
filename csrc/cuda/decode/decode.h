// The decode engine: attention of a few query tokens per sequence against a
// KV cache read through a page table (FwdParams::paged), fp16 and bf16, head
// dims up to 256. Split-KV (flash-decoding): the keys of a sequence are cut
// into `splits` ranges computed by separate blocks, whose partial (out, lse)
// a combine kernel merges. The split count comes from the shapes and the SM
// count only (never from cu_seqlens), so the workspace has a fixed size and
// the call captures in a CUDA graph; the keys a split covers are derived on
// the device from the actual cache length.
//
// plan_fwd (host) -> workspace bytes -> run_fwd (decode kernel [+ combine]).
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
};

// "" and a filled plan (CudaPlan::decode, the workspace) when the engine takes the call, else why
// not. The split count comes from the shapes and the device's SM count.
std::string plan_fwd(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan);

// Launch a call planned here (launch.workspace of at least plan.workspace_bytes).
Status run_fwd(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch);

// Typed launchers (decode_<dtype>_hd<D>.cu).
template <class T, int D>
Status launch_decode(const FwdParams& p, const DecodeSchedule& plan, const KernelArgs& a, void* stream);
template <class T>
Status launch_combine(const FwdParams& p, const KernelArgs& a, void* stream);
template <class T>
Status launch_init_outputs(const FwdParams& p, void* stream);

}  // namespace decode
}  // namespace fusedattn
