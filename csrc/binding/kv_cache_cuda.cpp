// CUDA implementation of fusedattn::copy_to_kv_cache: kv_cache_impl.h's flow
// with the CUDA append kernel (csrc/cuda/kv_cache/append.cu) on the current stream of
// new_k's device. No host synchronisation and no allocation, so the op captures
// in CUDA graphs. Compiled only with the CUDA engine (FUSEDATTN_WITH_CUDA).
#if defined(FUSEDATTN_WITH_CUDA)

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "fusedattn/cuda_api.h"
#include "kv_cache_impl.h"

namespace fusedattn::binding {
namespace {

struct CudaKvEngine {
  // new_k may sit elsewhere when another argument brought the call here; the
  // core then reports the device mismatch.
  struct Scope {
    c10::cuda::OptionalCUDAGuard guard;
    explicit Scope(const at::Tensor& new_k)
        : guard(new_k.is_cuda() ? std::optional<c10::Device>(new_k.device()) : std::nullopt) {}
  };
  static Status run_kv_append(const KvAppendParams& params, const at::Tensor& new_k) {
    CudaLaunch l;
    l.stream = c10::cuda::getCurrentCUDAStream(new_k.get_device()).stream();
    return run_kv_append_cuda(params, l);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) { m.impl("copy_to_kv_cache", &kv_append_impl<CudaKvEngine>); }

}  // namespace fusedattn::binding

#endif  // FUSEDATTN_WITH_CUDA
