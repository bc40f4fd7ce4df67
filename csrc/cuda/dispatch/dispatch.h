// The dispatch's choice for a device given by its attributes: plan_fwd_cuda / plan_bwd_cuda ask it
// with the current device's, tools/support_table with those of the devices docs/api.md's
// supported-configuration table describes.
#pragma once

#include <string>

#include "common/device.h"
#include "fusedattn/cuda_api.h"

namespace fusedattn {

// Why each engine the dispatch asked before the one that took the call declined it, indexed by
// CudaEngine ("" for an engine not asked).
struct Declined {
  std::string why[4];
};

Status plan_fwd_on(const FwdParams& params, const gpu::DeviceAttrs& dev, CudaPlan* plan, Declined* declined = nullptr);
Status plan_bwd_on(const BwdParams& params, const gpu::DeviceAttrs& dev, CudaPlan* plan, Declined* declined = nullptr);

}  // namespace fusedattn
