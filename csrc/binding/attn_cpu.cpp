// CPU implementations of the operators: op_impl.h's flow with the CPU engine,
// whose parallelism goes through PyTorch's intra-op pool.
#include <torch/library.h>

#include "op_impl.h"

namespace fusedattn::binding {
namespace {

struct CpuBackend {
  static constexpr bool kWritesRngZeros = false;
  struct Scope {
    explicit Scope(const at::Tensor&) {}
  };
  static Status run_fwd(const FwdParams& params, const at::Tensor&) { return run_fwd_cpu(params, AtenExecutor{}); }
  static Status run_bwd(const BwdParams& params, const at::Tensor&) { return run_bwd_cpu(params, AtenExecutor{}); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedattn, CPU, m) {
  m.impl("fwd", &fwd_impl<CpuBackend>);
  m.impl("bwd", &bwd_impl<CpuBackend>);
}

}  // namespace fusedattn::binding
