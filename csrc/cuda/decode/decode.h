// The decode engine: attention of a few query tokens per sequence against a
// KV cache read through a page table (FwdParams::paged), fp16 and bf16, head
// dims up to 256. Split-KV (flash-decoding): the keys of a sequence are cut
// into `splits` ranges computed by separate blocks, whose partial (out, lse)
// a combine kernel merges. The split count comes from the shapes and the SM
// count only (never from cu_seqlens), so the workspace has a fixed size and
// the call captures in a CUDA graph; the keys a split covers are derived on
// the device from the actual cache length.
//
// Plan (host) -> workspace bytes -> launch (decode kernel [+ combine]).
#pragma once

#include <cstddef>

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

struct Plan {
  bool applies = false;
  const char* why = "";  // when it does not
  int d = 0;             // head-dim bucket: 64, 128, 256
  int wm = 1;            // row warps: 16 * wm rows per block
  int chunks = 1;        // row chunks per (sequence, KV head)
  int splits = 1;
  size_t ws_o_off = 0, ws_lse_off = 0, bytes = 0;
};

// The plan for a call (sm_count <= 0: the current device's).
Plan make_plan(const FwdParams& p, int sm_count);

// Workspace of a call the decode engine takes (0 otherwise).
size_t fwd_workspace_bytes(const FwdParams& p);

// Takes the call when the plan applies (sets *handled).
Status try_run_fwd(const FwdParams& p, const CudaLaunch& launch, bool* handled);

// Typed launchers (decode_<dtype>_hd<D>.cu).
template <class T, int D>
Status launch_decode(const FwdParams& p, const Plan& plan, const KernelArgs& a, void* stream);
template <class T>
Status launch_combine(const FwdParams& p, const KernelArgs& a, void* stream);
template <class T>
Status launch_init_outputs(const FwdParams& p, void* stream);

}  // namespace decode
}  // namespace fusedattn
