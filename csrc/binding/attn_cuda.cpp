// CUDA implementations of the operators: op_impl.h's flow with the CUDA engine, on the current
// stream of q's device, with scratch from PyTorch's caching allocator (so the call captures in
// CUDA graphs and never synchronises with the host). Compiled only when the build enables the
// CUDA engine (FUSEDATTN_WITH_CUDA, cmake/cuda.cmake).
#if defined(FUSEDATTN_WITH_CUDA)

#include "cuda_context.h"
#include "fusedattn/cuda_api.h"
#include "op_impl.h"

namespace fusedattn::binding {
namespace {

// The launch of a planned call: the current stream, and the plan's workspace from the caching
// allocator (freed when the call returns; the allocator hands the block out again only to work
// ordered after this call's kernels on this stream).
CudaLaunch launch_for(const Placement& where, const CudaPlan& plan, std::optional<Tensor>* workspace) {
  CudaLaunch l;
  l.stream = current_cuda_stream(where.device_index);
  if (plan.workspace_bytes > 0) {
    workspace->emplace(empty_bytes(static_cast<int64_t>(plan.workspace_bytes), where));
    l.workspace = (*workspace)->data_ptr();
    l.workspace_bytes = plan.workspace_bytes;
  }
  return l;
}

struct CudaBackend {
  static constexpr bool kWritesRngZeros = true;
  using Scope = CudaScope;
  static Status run_fwd(const FwdParams& params, const Placement& where) {
    CudaPlan plan;
    FUSEDATTN_RETURN_IF_ERROR(plan_fwd_cuda(params, &plan));
    std::optional<Tensor> ws;
    return run_fwd_cuda(params, plan, launch_for(where, plan, &ws));
  }
  static Status run_bwd(const BwdParams& params, const Placement& where, int64_t deterministic) {
    CudaPlan plan;
    FUSEDATTN_RETURN_IF_ERROR(plan_bwd_cuda(params, &plan));
    if (params.deterministic && !plan.deterministic) {
      alert_not_deterministic(deterministic,
                              "fusedattn::bwd on CUDA with the SIMT engine (float32/float64, or a configuration the "
                              "tensor-core kernels do not take): its dQ and dbias are summed with atomics");
    }
    std::optional<Tensor> ws;
    return run_bwd_cuda(params, plan, launch_for(where, plan, &ws));
  }
};

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) {
  m.impl("fwd", &boxed_fwd<CudaBackend>);
  m.impl("bwd", &boxed_bwd<CudaBackend>);
}

}  // namespace fusedattn::binding

#endif  // FUSEDATTN_WITH_CUDA
