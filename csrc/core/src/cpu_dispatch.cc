// The CPU engine's public entry points: one copy of the engine per instruction set
// (src/cpu/cpu_isa.h), chosen once per process from what the CPU runs, capped by
// FUSEDATTN_CPU_ISA. Compiled for the baseline, like the rest of the core: a portable build has
// no compile-time ISA flags outside the engine's own copies.
#include "fusedattn/api.h"
#include "fusedattn/overrides.h"

namespace fusedattn {
namespace cpu {
namespace base {
Status run_fwd(const FwdParams& params, const Executor& exec);
Status run_bwd(const BwdParams& params, const Executor& exec);
}  // namespace base
#if FUSEDATTN_CPU_X86_COPIES
namespace avx2 {
Status run_fwd(const FwdParams& params, const Executor& exec);
Status run_bwd(const BwdParams& params, const Executor& exec);
}  // namespace avx2
namespace avx512 {
Status run_fwd(const FwdParams& params, const Executor& exec);
Status run_bwd(const BwdParams& params, const Executor& exec);
}  // namespace avx512
#endif
}  // namespace cpu

#if FUSEDATTN_CPU_X86_COPIES
namespace {

enum class CpuIsa : int8_t { kBase, kAvx2, kAvx512 };

// The widest copy this CPU (and OS: the features' register state) runs.
CpuIsa widest_supported() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
  return CpuIsa::kBase;
}

CpuIsa selected_isa() {
  static const CpuIsa isa = [] {
    const CpuIsa widest = widest_supported();
    switch (process_overrides().values.cpu_isa) {
      case CpuIsaChoice::kBase: return CpuIsa::kBase;
      case CpuIsaChoice::kAvx2: return widest == CpuIsa::kBase ? CpuIsa::kBase : CpuIsa::kAvx2;
      default: return widest;
    }
  }();
  return isa;
}

}  // namespace
#endif

namespace {

// A call too small to repay a fork and join of the executor's pool per parallel phase runs on the
// calling thread: below `phases` times the executor's serial_macs() multiply-adds of QK^T and PV over
// the whole problem (masks ignored; thd counts every sequence at max_seqlen). The forward has one
// such phase, the backward about four.
constexpr int64_t kFwdPhases = 1, kBwdPhases = 4;

const Executor& executor_for(const Problem& pr, const Executor& pool, int64_t phases) {
  static const SerialExecutor serial;
  const double macs = static_cast<double>(pr.b) * pr.h_q * pr.s_q * pr.s_kv * (pr.d_qk + pr.d_v);
  return macs < static_cast<double>(pool.serial_macs()) * phases ? serial : pool;
}

}  // namespace

Status run_fwd_cpu(const FwdParams& params, const Executor& pool) {
  const Executor& exec = executor_for(params.prob, pool, kFwdPhases);
#if FUSEDATTN_CPU_X86_COPIES
  switch (selected_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::run_fwd(params, exec);
    case CpuIsa::kAvx2: return cpu::avx2::run_fwd(params, exec);
    default: break;
  }
#endif
  return cpu::base::run_fwd(params, exec);
}

Status run_bwd_cpu(const BwdParams& params, const Executor& pool) {
  const Executor& exec = executor_for(params.fwd.prob, pool, kBwdPhases);
#if FUSEDATTN_CPU_X86_COPIES
  switch (selected_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::run_bwd(params, exec);
    case CpuIsa::kAvx2: return cpu::avx2::run_bwd(params, exec);
    default: break;
  }
#endif
  return cpu::base::run_bwd(params, exec);
}

}  // namespace fusedattn
