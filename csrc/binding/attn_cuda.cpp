// CUDA implementations of the operators: op_impl.h's flow with the CUDA
// engine, on the current stream of q's device, with scratch from PyTorch's
// caching allocator (so the call captures in CUDA graphs and never
// synchronises with the host). Compiled only when the build enables the CUDA
// engine (FUSEDATTN_WITH_CUDA, cmake/cuda.cmake).
#if defined(FUSEDATTN_WITH_CUDA)

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include "fusedattn/cuda_api.h"
#include "op_impl.h"

namespace fusedattn::binding {
namespace {

CudaLaunch launch_for(const at::Tensor& q, size_t workspace_bytes, at::Tensor* workspace) {
  CudaLaunch l;
  l.stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  // An attribute query: no synchronisation, legal during graph capture.
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, q.get_device()) == cudaSuccess) l.sm_count = sms;
  if (workspace_bytes > 0) {
    // Freed when the call returns; the caching allocator hands the block out
    // again only to work ordered after this call's kernels on this stream.
    *workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, q.options().dtype(at::kByte));
    l.workspace = workspace->data_ptr();
    l.workspace_bytes = workspace_bytes;
  }
  return l;
}

struct CudaEngine {
  static constexpr bool kWritesRngZeros = true;
  // q may sit elsewhere when another argument brought the call here; the
  // core then reports the device mismatch.
  struct Scope {
    c10::cuda::OptionalCUDAGuard guard;
    explicit Scope(const at::Tensor& q) : guard(q.is_cuda() ? std::optional<c10::Device>(q.device()) : std::nullopt) {}
  };
  static Status run_fwd(const FwdParams& params, const at::Tensor& q) {
    at::Tensor ws;
    return run_fwd_cuda(params, launch_for(q, fwd_workspace_bytes(params), &ws));
  }
  static Status run_bwd(const BwdParams& params, const at::Tensor& q) {
    if (params.deterministic && !bwd_deterministic_available(params)) {
      // Raises, or warns under warn_only, as torch's own non-deterministic kernels do.
      at::globalContext().alertNotDeterministic(
          "fusedattn::bwd on CUDA with the SIMT engine (float32/float64, or a configuration the tensor-core "
          "kernels do not take): its dQ and dbias are summed with atomics");
    }
    at::Tensor ws;
    return run_bwd_cuda(params, launch_for(q, bwd_workspace_bytes(params), &ws));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) {
  m.impl("fwd", &fwd_impl<CudaEngine>);
  m.impl("bwd", &bwd_impl<CudaEngine>);
}

}  // namespace fusedattn::binding

#endif  // FUSEDATTN_WITH_CUDA
