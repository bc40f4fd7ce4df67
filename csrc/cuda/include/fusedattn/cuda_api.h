// Entry points of the CUDA engine. Torch-free: the binding passes the stream
// and a workspace it allocated with PyTorch's caching allocator, so the engine
// never allocates, never synchronises with the host and never reads device
// memory (cu_seqlens included) from the host. Every launch goes on
// `stream`, which makes the engine capturable in CUDA graphs.
//
// Order of a call (the binding's):
//   bytes = fwd_workspace_bytes(params)   -> allocate `bytes` on the device
//   run_fwd_cuda(params, {stream, workspace, bytes, sm_count})
#pragma once

#include <cstddef>

#include "fusedattn/kv_cache.h"
#include "fusedattn/params.h"

namespace fusedattn {

struct CudaLaunch {
  void* stream = nullptr;        // cudaStream_t; null is the legacy default stream
  void* workspace = nullptr;     // device scratch of at least *_workspace_bytes(params)
  size_t workspace_bytes = 0;
  int sm_count = 0;              // multiprocessors of the device (for persistent grids)
};

// Scratch the engine needs for one call (0: none). Depends only on the
// problem's shapes and dtype, never on device data.
size_t fwd_workspace_bytes(const FwdParams& params);
size_t bwd_workspace_bytes(const BwdParams& params);

// Run on the stream of `launch`. Outputs must be allocated with the shapes of
// fwd_output_shapes / bwd_output_shapes; the engine writes every element of
// them (padded rows and thd gaps included). Returns a Status for unsupported
// configurations and for launch failures (with cudaGetErrorString's message).
Status run_fwd_cuda(const FwdParams& params, const CudaLaunch& launch);
Status run_bwd_cuda(const BwdParams& params, const CudaLaunch& launch);
// Whether run_bwd_cuda honours params.deterministic for this call (the
// tensor-core engine does; the SIMT engine sums dQ and dbias with atomics).
bool bwd_deterministic_available(const BwdParams& params);

// fusedattn::copy_to_kv_cache on the device (see fusedattn/kv_cache.h): one
// kernel on launch.stream, no workspace, no host synchronisation. Tokens the
// CPU engine would reject (lengths, positions past the page table, pages
// outside the pool) are skipped, never written out of bounds.
Status run_kv_append_cuda(const KvAppendParams& params, const CudaLaunch& launch);

// Hooks of the tensor-core engine (csrc/cuda/tc). run_*_cuda asks them first;
// a hook that takes the call sets *handled and returns its status, one that
// does not leaves *handled false and returns Ok, and the SIMT engine runs.
// csrc/cuda/tc_default.cu defines weak defaults that handle nothing.
namespace tc {
Status try_run_fwd(const FwdParams& params, const CudaLaunch& launch, bool* handled);
Status try_run_bwd(const BwdParams& params, const CudaLaunch& launch, bool* handled);
// Scratch the tensor-core engine would need for a call it takes (0 otherwise).
size_t fwd_workspace_bytes(const FwdParams& params);
size_t bwd_workspace_bytes(const BwdParams& params);
}  // namespace tc

// Hooks of the Hopper path (csrc/cuda/hopper, built for sm_90a only): asked
// before the tensor-core hooks, same contract. Weak defaults in
// csrc/cuda/tc_default.cu.
namespace hopper {
Status try_run_fwd(const FwdParams& params, const CudaLaunch& launch, bool* handled);
Status try_run_bwd(const BwdParams& params, const CudaLaunch& launch, bool* handled);
size_t bwd_workspace_bytes(const BwdParams& params);
}  // namespace hopper

}  // namespace fusedattn
