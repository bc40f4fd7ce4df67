// CPU implementations of fusedattn::copy_to_kv_cache and fusedattn::fwd_kvcache (kv_cache_impl.h's
// flow with the CPU engine, which checks the device-side data before writing).
#include <torch/library.h>

#include "kv_cache_impl.h"

namespace fusedattn::binding {
namespace {

struct CpuKvEngine {
  struct Scope {
    explicit Scope(const at::Tensor&) {}
  };
  static Status run_kv_append(const KvAppendParams& params, const at::Tensor&) { return run_kv_append_cpu(params); }
  static Status run_kv_step(const KvStepParams& params, const at::Tensor&) {
    return run_kv_step_cpu(params, AtenExecutor{});
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedattn, CPU, m) {
  m.impl("copy_to_kv_cache", &kv_append_impl<CpuKvEngine>);
  m.impl("fwd_kvcache", &kv_step_impl<CpuKvEngine>);
}

}  // namespace fusedattn::binding
