// CUDA implementations of the operators: op_impl.h's flow with the CUDA
// engine, on the current stream of q's device, with scratch from PyTorch's
// caching allocator (so the call captures in CUDA graphs and never
// synchronises with the host). Compiled only when the build enables the CUDA
// engine (FUSEDATTN_WITH_CUDA, cmake/cuda.cmake).
#if defined(FUSEDATTN_WITH_CUDA)

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "fusedattn/cuda_api.h"
#include "op_impl.h"

namespace fusedattn::binding {
namespace {

// The launch of a planned call: the current stream, and the plan's workspace from the caching
// allocator (freed when the call returns; the allocator hands the block out again only to work
// ordered after this call's kernels on this stream).
CudaLaunch launch_for(const at::Tensor& q, const CudaPlan& plan, at::Tensor* workspace) {
  CudaLaunch l;
  l.stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  if (plan.workspace_bytes > 0) {
    *workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, q.options().dtype(at::kByte));
    l.workspace = workspace->data_ptr();
    l.workspace_bytes = plan.workspace_bytes;
  }
  return l;
}

struct CudaBackend {
  static constexpr bool kWritesRngZeros = true;
  // q may sit elsewhere when another argument brought the call here; the
  // core then reports the device mismatch.
  struct Scope {
    c10::cuda::OptionalCUDAGuard guard;
    explicit Scope(const at::Tensor& q) : guard(q.is_cuda() ? std::optional<c10::Device>(q.device()) : std::nullopt) {}
  };
  static Status run_fwd(const FwdParams& params, const at::Tensor& q) {
    CudaPlan plan;
    FUSEDATTN_RETURN_IF_ERROR(plan_fwd_cuda(params, &plan));
    at::Tensor ws;
    return run_fwd_cuda(params, plan, launch_for(q, plan, &ws));
  }
  static Status run_bwd(const BwdParams& params, const at::Tensor& q) {
    CudaPlan plan;
    FUSEDATTN_RETURN_IF_ERROR(plan_bwd_cuda(params, &plan));
    if (params.deterministic && !plan.deterministic) {
      // Raises, or warns under warn_only, as torch's own non-deterministic kernels do.
      at::globalContext().alertNotDeterministic(
          "fusedattn::bwd on CUDA with the SIMT engine (float32/float64, or a configuration the tensor-core "
          "kernels do not take): its dQ and dbias are summed with atomics");
    }
    at::Tensor ws;
    return run_bwd_cuda(params, plan, launch_for(q, plan, &ws));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) {
  m.impl("fwd", &fwd_impl<CudaBackend>);
  m.impl("bwd", &bwd_impl<CudaBackend>);
}

}  // namespace fusedattn::binding

#endif  // FUSEDATTN_WITH_CUDA
