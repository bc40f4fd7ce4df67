// CUDA implementation of fusedattn::copy_to_kv_cache: kv_cache_impl.h's flow with the CUDA append
// kernel (csrc/cuda/kv_cache/append.cu) on the current stream of new_k's device. No host
// synchronisation and no allocation, so the op captures in CUDA graphs. Compiled only with the
// CUDA engine (FUSEDATTN_WITH_CUDA).
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
};

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) { m.impl("copy_to_kv_cache", &boxed_kv_append<CudaKvEngine>); }

}  // namespace fusedattn::binding

#endif  // FUSEDATTN_WITH_CUDA
