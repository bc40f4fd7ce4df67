// CUDA implementations of fusedattn::copy_to_kv_cache and fusedattn::fwd_kvcache: kv_cache_impl.h's
// flow with the CUDA engine (csrc/cuda/kv_cache) on the current stream of the first tensor's device.
// No host synchronisation; the step's workspace comes from PyTorch's caching allocator, so both ops
// capture in CUDA graphs. Compiled only with the CUDA engine (FUSEDATTN_WITH_CUDA).
#if defined(FUSEDATTN_WITH_CUDA)

#include "cuda_context.h"
#include "fusedattn/cuda_api.h"
#include "kv_cache_impl.h"

namespace fusedattn::binding {
namespace {

struct CudaKvEngine {
  using Scope = CudaScope;
  static Status run_kv_append(const KvAppendParams& params, const Placement& where) {
    CudaLaunch l;
    l.stream = current_cuda_stream(where.device_index);
    return run_kv_append_cuda(params, l);
  }
  // The workspace is freed when the call returns; the allocator hands it out again only to work
  // ordered after this call's kernels on this stream.
  static Status run_kv_step(const KvStepParams& params, const Placement& where) {
    KvStepPlan plan;
    FUSEDATTN_RETURN_IF_ERROR(plan_kv_step_cuda(params, &plan));
    CudaLaunch l;
    l.stream = current_cuda_stream(where.device_index);
    std::optional<Tensor> ws;
    if (plan.workspace_bytes > 0) {
      ws.emplace(empty_bytes(static_cast<int64_t>(plan.workspace_bytes), where));
      l.workspace = ws->data_ptr();
      l.workspace_bytes = plan.workspace_bytes;
    }
    return run_kv_step_cuda(params, plan, l);
  }
};

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) {
  m.impl("copy_to_kv_cache", &boxed_kv_append<CudaKvEngine>);
  m.impl("fwd_kvcache", &boxed_kv_step<CudaKvEngine>);
}

}  // namespace fusedattn::binding

#endif  // FUSEDATTN_WITH_CUDA
