// The Hopper kernels' host entry points, defined in fwd_kernel.cuh and bwd_launch.cuh and
// instantiated by the generated files of kernels.list, and the table of those instantiations
// (generated/table.cu) through which sm90.cu, which decides what runs, finds them: what the table
// holds is what the Hopper path takes. Each entry returns cudaErrorInvalidValue on arguments its
// kernel does not take (the support checks in sm90.cu are meant to rule those out first).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "params.h"  // Sm90Args, Sm90BwdArgs, the backward workspace sizes

namespace fusedattn {
namespace hopper {

// T = __half or __nv_bfloat16; D = 64, 128 or 256. The persistent entries take a.sm_count CTAs.
template <typename T, int D>
cudaError_t run_fwd_one_tile(const Sm90Args& a, cudaStream_t stream);
template <typename T, int D>
cudaError_t run_fwd_persistent(const Sm90Args& a, cudaStream_t stream);
template <typename T>
cudaError_t run_fwd_three_consumer(const Sm90Args& a, cudaStream_t stream);  // D = 64
template <typename T>
cudaError_t run_fwd_three_consumer_persistent(const Sm90Args& a, cudaStream_t stream);  // D = 64
// The general kernels (features.h: the call's window, diagonal and softmax at run time), persistent,
// for head dims DQK, DV (on the tile of head dim features.h's tile_head_dim(DQK, DV)), with softcap.
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_fwd_general(const Sm90Args& a, cudaStream_t stream);
// The general kernels on per-sequence lengths (thd, padding masks: features.h's VARLEN; a.ws of
// fwd_sm90_varlen_workspace_bytes(), the backward's of bwd_sm90_varlen_workspace()).
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_fwd_varlen(const Sm90Args& a, cudaStream_t stream);
template <typename T, int D>
cudaError_t run_bwd(const Sm90BwdArgs& a, cudaStream_t stream);
// dQ, dK, dV bitwise reproducible (bwd_common.cuh's deterministic mode); D = 64, 128; a.ws of
// bwd_sm90_det_workspace_bytes().
template <typename T, int D>
cudaError_t run_bwd_deterministic(const Sm90BwdArgs& a, cudaStream_t stream);
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_general(const Sm90BwdArgs& a, cudaStream_t stream);
template <typename T, int DQK, int DV, bool SOFTCAP>  // tile_head_dim(DQK, DV) = 64, 128
cudaError_t run_bwd_general_deterministic(const Sm90BwdArgs& a, cudaStream_t stream);
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_varlen(const Sm90BwdArgs& a, cudaStream_t stream);
template <typename T, int DQK, int DV, bool SOFTCAP>  // tile_head_dim(DQK, DV) = 64, 128
cudaError_t run_bwd_varlen_deterministic(const Sm90BwdArgs& a, cudaStream_t stream);

// The entries of kernels.list.
enum class KernelEntry {
  kFwdOneTile,
  kFwdPersistent,
  kFwdThreeConsumer,
  kFwdThreeConsumerPersistent,
  kFwdGeneral,
  kBwd,
  kBwdDeterministic,
  kBwdGeneral,
  kBwdGeneralDeterministic,
  kFwdVarlen,
  kBwdVarlen,
  kBwdVarlenDeterministic,
};
// One instantiation: its entry, dtype (fp16 or bf16), head dims and whether it caps logits, and the
// function (fwd for the forward entries, bwd for the backward ones).
struct KernelRow {
  KernelEntry entry;
  bool f16;
  int d_qk, d_v;
  bool softcap;
  cudaError_t (*fwd)(const Sm90Args&, cudaStream_t);
  cudaError_t (*bwd)(const Sm90BwdArgs&, cudaStream_t);
};
extern const KernelRow kKernelRows[];  // generated/table.cu
extern const int kKernelRowCount;

// Whether this build holds sm_90a machine code the current device can run.
bool kernels_loadable();

}  // namespace hopper
}  // namespace fusedattn
