// fusedattn::fwd_kvcache on the device (fusedattn/kv_cache.h). When the decode engine takes the
// step, its attention launch also appends (plus its combine when the keys are split): no separate
// append kernel. Otherwise the append kernel runs first and writes the step's key lengths into the
// workspace, and the attention's engine (dispatch.cu's choice) reads the appended caches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "append.h"
#include "common/device.h"
#include "decode/decode.h"
#include "fusedattn/cat.h"
#include "fusedattn/cuda_api.h"
#include "fusedattn/overrides.h"

namespace fusedattn {
namespace {

// The attention of an unfused step: key lengths from `cu_kv`, and per-sequence caches (no table)
// read as a bshd k / v whose batch rows are the sequences.
FwdParams unfused_attention(const KvStepParams& s, const int32_t* cu_kv) {
  FwdParams a = s.attn;
  a.seqlens.cu_seqlens_kv = cu_kv;
  if (a.paged.page_table == nullptr) a.paged = PagedKV{};
  return a;
}

}  // namespace

Status plan_kv_step_cuda(const KvStepParams& s, KvStepPlan* plan) {
  if (s.attn.prob.device != DeviceType::kCUDA) {
    return Status::Invalid("the CUDA engine got tensors that are not on a CUDA device");
  }
  const gpu::DeviceAttrs* dev = nullptr;
  FUSEDATTN_RETURN_IF_ERROR(gpu::current_device(&dev));
  *plan = KvStepPlan{};
  if (process_overrides().values.cuda_engine != CudaEngineChoice::kSimt &&
      decode::plan_step(s, *dev, &plan->attn).empty()) {
    plan->fused = true;
    plan->workspace_bytes = plan->attn.workspace_bytes;
    return Status::Ok();
  }
  const Problem& pr = s.attn.prob;
  if (pr.b * pr.s_kv > INT32_MAX) {
    return Status::Unsupported(cat("a KV-cache step the decode engine does not take needs its key lengths as int32 "
                                   "cu_seqlens: batch x cache capacity must stay below 2^31; got ", pr.b, " x ",
                                   pr.s_kv));
  }
  // The attention reads the key lengths the append kernel writes into the workspace, whose address
  // the plan does not know: cache_seqlens stands in (engines plan on whether lengths are given,
  // never on their values or address), so no engine that ignores lengths is chosen.
  FUSEDATTN_RETURN_IF_ERROR(plan_fwd_cuda(unfused_attention(s, s.append.cache_seqlens), &plan->attn));
  plan->lens_off = (plan->attn.workspace_bytes + 255) / 256 * 256;
  plan->workspace_bytes = plan->lens_off + static_cast<size_t>(pr.b + 1) * sizeof(int32_t);
  return Status::Ok();
}

Status run_kv_step_cuda(const KvStepParams& s, const KvStepPlan& plan, const CudaLaunch& launch) {
  if (launch.workspace_bytes < plan.workspace_bytes || (plan.workspace_bytes > 0 && launch.workspace == nullptr)) {
    return Status::Invalid(cat("fwd_kvcache: the plan needs a workspace of ", plan.workspace_bytes, " bytes; got ",
                               launch.workspace_bytes));
  }
  if (plan.fused) return decode::run_fwd(s.attn, plan.attn, launch, &s);
  int32_t* cu_kv = reinterpret_cast<int32_t*>(static_cast<unsigned char*>(launch.workspace) + plan.lens_off);
  FUSEDATTN_RETURN_IF_ERROR(launch_kv_append(s.append, StepKeyLens{cu_kv, s.attn.prob.s_q, s.attn.prob.s_kv}, launch));
  CudaLaunch attn = launch;
  attn.workspace_bytes = plan.lens_off;
  if (plan.lens_off == 0) attn.workspace = nullptr;
  return run_fwd_cuda(unfused_attention(s, cu_kv), plan.attn, attn);
}

}  // namespace fusedattn
