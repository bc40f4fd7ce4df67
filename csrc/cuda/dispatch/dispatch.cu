// Which CUDA engine runs a call, decided once per call (plan_*_cuda), and the launch of that plan.
// A forward over a paged KV cache (params.paged.page_table set) goes to the decode engine
// (csrc/cuda/decode) when it takes it, else to the SIMT engine; the other engines do not read pages.
// Every other call: the Hopper path (csrc/cuda/hopper, when built) is asked first, then the
// tensor-core engine (csrc/cuda/tc, when built), and the SIMT engine (csrc/cuda/simt), which covers
// every dtype and feature, takes the rest. FUSEDATTN_CUDA_ENGINE (fusedattn/overrides.h) narrows the
// choice: simt asks the SIMT engine only, sm80 skips the Hopper path.
#include <cuda_runtime.h>

#include <string>

#include "common/device.h"
#include "common/host.h"
#include "decode/decode.h"
#include "dispatch/dispatch.h"
#include "fusedattn/cat.h"
#include "fusedattn/cuda_api.h"
#include "fusedattn/overrides.h"
#include "simt/simt.h"
#if FUSEDATTN_HAS_TC
#include "tc/tc_api.h"
#endif
#if FUSEDATTN_HAS_HOPPER
#include "hopper/hopper.h"
#endif

namespace fusedattn {
namespace {

CudaEngineChoice engine_choice() { return process_overrides().values.cuda_engine; }

Status on_device(const Problem& pr, const gpu::DeviceAttrs** dev) {
  if (pr.device != DeviceType::kCUDA) return Status::Invalid("the CUDA engine got tensors that are not on a CUDA device");
  return gpu::current_device(dev);
}

Status none_takes(const std::string& simt_why) {
  return Status::Unsupported(cat("no CUDA engine takes this call; the SIMT engine, which takes the most: ", simt_why));
}

// An engine's answer: true when it took the call, else its reason is kept for the caller.
struct Asker {
  Declined* declined;
  bool operator()(CudaEngine e, std::string why) const {
    if (why.empty()) return true;
    if (declined != nullptr) declined->why[static_cast<int>(e)] = std::move(why);
    return false;
  }
};

Status check_workspace(const CudaPlan& plan, const CudaLaunch& launch) {
  if (plan.workspace_bytes == 0 || (launch.workspace != nullptr && launch.workspace_bytes >= plan.workspace_bytes)) {
    return Status::Ok();
  }
  return Status::Invalid(cat("CUDA engine: the plan needs a workspace of ", plan.workspace_bytes, " bytes; got ",
                             launch.workspace_bytes));
}

}  // namespace

Status plan_fwd_on(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan, Declined* declined) {
  [[maybe_unused]] const CudaEngineChoice choice = engine_choice();
  Asker ask{declined};
  if (p.paged.page_table != nullptr) {
    if (choice != CudaEngineChoice::kSimt && ask(CudaEngine::kDecode, decode::plan_fwd(p, dev, plan))) {
      return Status::Ok();
    }
  } else {
#if FUSEDATTN_HAS_HOPPER
    if (choice == CudaEngineChoice::kAuto && ask(CudaEngine::kHopper, hopper::plan_fwd(p, dev, plan))) {
      return Status::Ok();
    }
#endif
#if FUSEDATTN_HAS_TC
    if (choice != CudaEngineChoice::kSimt && ask(CudaEngine::kTensorCore, tc::plan_fwd(p, dev, plan))) {
      return Status::Ok();
    }
#endif
  }
  const std::string why = simt::plan_fwd(p, dev, plan);
  return why.empty() ? Status::Ok() : none_takes(why);
}

Status plan_bwd_on(const BwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan, Declined* declined) {
  [[maybe_unused]] const CudaEngineChoice choice = engine_choice();
  [[maybe_unused]] Asker ask{declined};
#if FUSEDATTN_HAS_HOPPER
  if (choice == CudaEngineChoice::kAuto && ask(CudaEngine::kHopper, hopper::plan_bwd(p, dev, plan))) {
    return Status::Ok();
  }
#endif
#if FUSEDATTN_HAS_TC
  if (choice != CudaEngineChoice::kSimt && ask(CudaEngine::kTensorCore, tc::plan_bwd(p, dev, plan))) {
    return Status::Ok();
  }
#endif
  const std::string why = simt::plan_bwd(p, dev, plan);
  return why.empty() ? Status::Ok() : none_takes(why);
}

Status plan_fwd_cuda(const FwdParams& p, CudaPlan* plan) {
  const gpu::DeviceAttrs* dev = nullptr;
  FUSEDATTN_RETURN_IF_ERROR(on_device(p.prob, &dev));
  return plan_fwd_on(p, *dev, plan);
}

Status plan_bwd_cuda(const BwdParams& p, CudaPlan* plan) {
  const gpu::DeviceAttrs* dev = nullptr;
  FUSEDATTN_RETURN_IF_ERROR(on_device(p.fwd.prob, &dev));
  return plan_bwd_on(p, *dev, plan);
}

Status run_fwd_cuda(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch) {
  FUSEDATTN_RETURN_IF_ERROR(check_workspace(plan, launch));
  switch (plan.engine) {
    case CudaEngine::kDecode:
      // The decode kernel writes rng_out_zero itself: no fill kernel ahead of a decode step.
      return decode::run_fwd(p, plan, launch);
#if FUSEDATTN_HAS_HOPPER
    case CudaEngine::kHopper: FUSEDATTN_RETURN_IF_ERROR(hopper::run_fwd(p, plan, launch)); break;
#endif
#if FUSEDATTN_HAS_TC
    case CudaEngine::kTensorCore: FUSEDATTN_RETURN_IF_ERROR(tc::run_fwd(p, plan, launch)); break;
#endif
    case CudaEngine::kSimt: FUSEDATTN_RETURN_IF_ERROR(simt::run_fwd(p, plan, launch)); break;
    default: return Status::Invalid("run_fwd_cuda: the plan names an engine this build does not have");
  }
  if (p.rng_out_zero != nullptr) {
    // After the attention kernels, so that they do not wait behind it.
    FUSEDATTN_RETURN_IF_ERROR(gpu::cuda_error(
        cudaMemsetAsync(p.rng_out_zero, 0, 2 * sizeof(int64_t), static_cast<cudaStream_t>(launch.stream)),
        "rng_state fill"));
  }
  return Status::Ok();
}

Status run_bwd_cuda(const BwdParams& p, const CudaPlan& plan, const CudaLaunch& launch) {
  FUSEDATTN_RETURN_IF_ERROR(check_workspace(plan, launch));
  switch (plan.engine) {
#if FUSEDATTN_HAS_HOPPER
    case CudaEngine::kHopper: return hopper::run_bwd(p, plan, launch);
#endif
#if FUSEDATTN_HAS_TC
    case CudaEngine::kTensorCore: return tc::run_bwd(p, plan, launch);
#endif
    case CudaEngine::kSimt: return simt::run_bwd(p, plan, launch);
    default: return Status::Invalid("run_bwd_cuda: the plan names an engine this build does not have");
  }
}

}  // namespace fusedattn
