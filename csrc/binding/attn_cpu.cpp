// CPU implementations of the operators: op_impl.h's flow with the CPU engine, whose parallelism
// goes through PyTorch's intra-op pool.
#include "op_impl.h"

namespace fusedattn::binding {
namespace {

struct CpuBackend {
  static constexpr bool kWritesRngZeros = false;
  struct Scope {
    explicit Scope(const Placement&) {}
  };
  static Status run_fwd(const FwdParams& params, const Placement&) { return run_fwd_cpu(params, StableExecutor{}); }
  // The CPU engine is bitwise deterministic for any thread count: nothing to alert.
  static Status run_bwd(const BwdParams& params, const Placement&, int64_t) {
    return run_bwd_cpu(params, StableExecutor{});
  }
};

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fusedattn, CPU, m) {
  m.impl("fwd", &boxed_fwd<CpuBackend>);
  m.impl("bwd", &boxed_bwd<CpuBackend>);
}

}  // namespace fusedattn::binding
