// The attributes of a CUDA device the engines plan with, queried once per device and kept (attribute
// queries neither synchronise nor break stream capture, but are not free: a call asks for them
// every time it plans).
#pragma once

#include "fusedattn/types.h"

namespace fusedattn {
namespace gpu {

struct DeviceAttrs {
  int index = -1;
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;          // multiprocessors
  int smem_per_sm = 0;       // shared memory per multiprocessor, bytes
  int smem_optin = 0;        // shared memory one block may opt in to, bytes
};

// The current device's attributes (the caller has made q's device current).
Status current_device(const DeviceAttrs** out);

}  // namespace gpu
}  // namespace fusedattn
