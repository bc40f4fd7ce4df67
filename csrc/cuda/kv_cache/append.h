// The append kernel's entry beside run_kv_append_cuda (cuda_api.h), for a KV-cache step the decode
// engine does not fuse (step.cu): the same append, and the step's key lengths written for the
// attention launched after it.
#pragma once

#include <cstdint>

#include "fusedattn/cuda_api.h"

namespace fusedattn {

// cu_kv [b + 1] int32 (device): where the append kernel writes the step's cumulative key lengths,
// each kv_step_len(cache_seqlens[b], len(b)) clamped into [0, s_kv] with len(b) in [0, s_q];
// null: an append alone.
struct StepKeyLens {
  int32_t* cu_kv = nullptr;
  int64_t s_q = 0, s_kv = 0;
};

Status launch_kv_append(const KvAppendParams& params, const StepKeyLens& lens, const CudaLaunch& launch);

}  // namespace fusedattn
