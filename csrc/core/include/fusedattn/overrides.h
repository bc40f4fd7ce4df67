// The FUSEDATTN_* environment variables, parsed once per process by one strict parser: an unset or
// empty variable takes its default, any other value must be one the table accepts, else every
// operator call fails with a ValueError that names the variable and lists the accepted values.
// FUSEDATTN_CUDA_ENGINE is the user-facing engine selector; the others are debugging switches for
// A/B timing and triage (results do not depend on them, up to the order of fp32 additions):
//
// | variable                      | values (default first)                               |
// | FUSEDATTN_CUDA_ENGINE         | auto, simt (every CUDA call on SIMT), sm80 (no Hopper)|
// | FUSEDATTN_HOPPER_FWD          | auto, v2, persistent, three_consumer,                |
// |                               | three_consumer_persistent (the last two d = 64 only)  |
// | FUSEDATTN_HOPPER_BWD          | on, off (1 and 0 too): off sends the backward to sm80 |
// | FUSEDATTN_HOPPER_CAUSAL_CHUNK | auto, 0 (= auto) or 1..65535 groups per causal chunk  |
// | FUSEDATTN_DECODE_SPLITS       | auto, 0 (= auto) or 1..128 split-KV blocks            |
// | FUSEDATTN_DECODE_PDL          | 2, 1 (combine only), 0 (plain launches) on sm_90      |
#pragma once

#include "fusedattn/types.h"

namespace fusedattn {

enum class CudaEngineChoice : int8_t { kAuto, kSimt, kSm80 };
enum class HopperFwdChoice : int8_t { kAuto, kV2, kPersistent, kThreeConsumer, kThreeConsumerPersistent };

struct Overrides {
  static constexpr int kMaxDecodeSplits = 128;  // the decode engine's bound (decode/tile.h asserts it)
  CudaEngineChoice cuda_engine = CudaEngineChoice::kAuto;
  HopperFwdChoice hopper_fwd = HopperFwdChoice::kAuto;
  bool hopper_bwd = true;
  int hopper_causal_chunk = 0;  // 0: hopper/tuning.h's choice
  int decode_splits = 0;        // 0: decode/run.cu's cost model
  int decode_pdl = 2;
};

// Parses the variables through `lookup` (nullptr: unset); the first bad value is an Invalid status.
using EnvLookup = const char* (*)(const char* name);
Status parse_overrides(EnvLookup lookup, Overrides* out);

// The process's overrides, parsed from the environment at the first call and kept, together with
// the parse status (a bad value fails every call, not only the first).
struct ProcessOverrides {
  Status status;
  Overrides values;
};
const ProcessOverrides& process_overrides();

}  // namespace fusedattn
