// Entry points of the CUDA engine. Torch-free: the binding passes the stream
// and a workspace it allocated with PyTorch's caching allocator, so the engine
// never allocates, never synchronises with the host and never reads device
// memory (cu_seqlens included) from the host. Every launch goes on
// `stream`, which makes the engine capturable in CUDA graphs.
//
// Order of a call (the binding's):
//   plan_fwd_cuda(params, &plan)   -> which engine and kernel run it, and the workspace they need
//   allocate plan.workspace_bytes on the device
//   run_fwd_cuda(params, plan, {stream, workspace, bytes})
// The plan is made once per call, on the current device, from shapes, dtype, layout and the
// device's attributes alone (never from device data), so equal calls get equal plans.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedattn/kv_cache.h"
#include "fusedattn/params.h"

namespace fusedattn {

enum class CudaEngine : int8_t { kSimt, kTensorCore, kHopper, kDecode };

// The split-KV decode engine's schedule (csrc/cuda/decode/decode.h).
struct DecodeSchedule {
  int head_dim = 0;    // bucket: 64, 128, 256
  int row_warps = 1;   // 16 * row_warps query rows per block
  int chunks = 1;      // row chunks per (sequence, KV head)
  int splits = 1;      // blocks per chunk along the keys
  size_t ws_o_off = 0, ws_lse_off = 0;  // split partials in the workspace (splits > 1)
  bool pdl = false, pdl_main = false;   // programmatic launches of the combine / the decode kernel
};

struct CudaPlan {
  CudaEngine engine = CudaEngine::kSimt;
  size_t workspace_bytes = 0;
  // Backward: dQ, a broadcast dbias and d_softmax_offset are summed in a fixed order (bitwise
  // reproducible); BwdParams::deterministic asks for it, and a plan without it is what the binding
  // reports as a non-deterministic algorithm.
  bool deterministic = false;
  int kernel = 0;     // tensor-core: kernel table entry; Hopper forward: hopper::KernelEntry
  int sm_count = 0;   // the device's multiprocessors
  DecodeSchedule decode;
};

struct CudaLaunch {
  void* stream = nullptr;     // cudaStream_t; null is the legacy default stream
  void* workspace = nullptr;  // device scratch of at least plan.workspace_bytes
  size_t workspace_bytes = 0;
};

// The plan of a call on the current device; Unsupported (with the reason) when no engine takes it.
Status plan_fwd_cuda(const FwdParams& params, CudaPlan* plan);
Status plan_bwd_cuda(const BwdParams& params, CudaPlan* plan);

// Run a planned call on the stream of `launch`. Outputs must be allocated with the shapes of
// fwd_output_shapes / bwd_output_shapes; the engine writes every element of them (padded rows and
// thd gaps included). Returns a Status for launch failures (with cudaGetErrorString's message).
Status run_fwd_cuda(const FwdParams& params, const CudaPlan& plan, const CudaLaunch& launch);
Status run_bwd_cuda(const BwdParams& params, const CudaPlan& plan, const CudaLaunch& launch);

// fusedattn::copy_to_kv_cache on the device (see fusedattn/kv_cache.h): one
// kernel on launch.stream, no workspace, no host synchronisation. Tokens the
// CPU engine would reject (lengths, positions past the page table, pages
// outside the pool) are skipped, never written out of bounds.
Status run_kv_append_cuda(const KvAppendParams& params, const CudaLaunch& launch);

// fusedattn::fwd_kvcache on the device (see fusedattn/kv_cache.h). Fused: the decode engine appends
// inside its attention launch. Otherwise the append kernel runs first (writing the step's key
// lengths at lens_off of the workspace) and the attention plan `attn` reads the appended caches.
struct KvStepPlan {
  bool fused = false;
  CudaPlan attn;
  size_t lens_off = 0;
  size_t workspace_bytes = 0;
};
Status plan_kv_step_cuda(const KvStepParams& params, KvStepPlan* plan);
Status run_kv_step_cuda(const KvStepParams& params, const KvStepPlan& plan, const CudaLaunch& launch);

}  // namespace fusedattn
