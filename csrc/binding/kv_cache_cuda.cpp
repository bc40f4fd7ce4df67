// CUDA implementations of fusedattn::copy_to_kv_cache and fusedattn::fwd_kvcache: kv_cache_impl.h's
// flow with the CUDA engine (csrc/cuda/kv_cache) on the current stream of the first tensor's device.
// No host synchronisation; the step's workspace comes from PyTorch's caching allocator, so both ops
// capture in CUDA graphs. Compiled only with the CUDA engine (FUSEDATTN_WITH_CUDA).
#if defined(FUSEDATTN_WITH_CUDA)

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "fusedattn/cuda_api.h"
#include "kv_cache_impl.h"

namespace fusedattn::binding {
namespace {

struct CudaKvEngine {
  // t (new_k, or q) may sit elsewhere when another argument brought the call here; the
  // core then reports the device mismatch.
  struct Scope {
    c10::cuda::OptionalCUDAGuard guard;
    explicit Scope(const at::Tensor& t) : guard(t.is_cuda() ? std::optional<c10::Device>(t.device()) : std::nullopt) {}
  };
  static Status run_kv_append(const KvAppendParams& params, const at::Tensor& new_k) {
    CudaLaunch l;
    l.stream = c10::cuda::getCurrentCUDAStream(new_k.get_device()).stream();
    return run_kv_append_cuda(params, l);
  }
  // The workspace is freed when the call returns; the allocator hands it out again only to work
  // ordered after this call's kernels on this stream.
  static Status run_kv_step(const KvStepParams& params, const at::Tensor& q) {
    KvStepPlan plan;
    FUSEDATTN_RETURN_IF_ERROR(plan_kv_step_cuda(params, &plan));
    CudaLaunch l;
    l.stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
    at::Tensor ws;
    if (plan.workspace_bytes > 0) {
      ws = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, q.options().dtype(at::kByte));
      l.workspace = ws.data_ptr();
      l.workspace_bytes = plan.workspace_bytes;
    }
    return run_kv_step_cuda(params, plan, l);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) {
  m.impl("copy_to_kv_cache", &kv_append_impl<CudaKvEngine>);
  m.impl("fwd_kvcache", &kv_step_impl<CudaKvEngine>);
}

}  // namespace fusedattn::binding

#endif  // FUSEDATTN_WITH_CUDA
