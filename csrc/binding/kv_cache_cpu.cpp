// CPU implementations of fusedattn::copy_to_kv_cache and fusedattn::fwd_kvcache (kv_cache_impl.h's
// flow with the CPU engine, which checks the device-side data before writing).
#include "kv_cache_impl.h"

namespace fusedattn::binding {
namespace {

struct CpuKvEngine {
  struct Scope {
    explicit Scope(const Placement&) {}
  };
  static Status run_kv_append(const KvAppendParams& params, const Placement&) { return run_kv_append_cpu(params); }
  static Status run_kv_step(const KvStepParams& params, const Placement&) {
    return run_kv_step_cpu(params, StableExecutor{});
  }
};

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fusedattn, CPU, m) {
  m.impl("copy_to_kv_cache", &boxed_kv_append<CpuKvEngine>);
  m.impl("fwd_kvcache", &boxed_kv_step<CpuKvEngine>);
}

}  // namespace fusedattn::binding
