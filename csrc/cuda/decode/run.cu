// The decode engine's host side: whether it takes a call, its schedule (split count) and
// workspace (from shapes and the device alone), and the launches.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/rows.h"
#include "decode.h"
#include "fusedattn/overrides.h"
#include "fusedattn/visibility.h"
#include "tile.h"

namespace fusedattn {
namespace decode {
namespace {

template <int D>
size_t smem_of(int wm) {
  switch (wm) {
    case 1: return Tile<D, 1>::kSmemBytes;
    case 2: return Tile<D, 2>::kSmemBytes;
    default: return Tile<D, 4>::kSmemBytes;
  }
}

// Resident blocks per SM: shared memory (plus ~1 KB static and 1 KB the
// runtime reserves per block) and registers (d <= 128 stays under 128
// registers a thread, d = 256 under 255).
int blocks_per_sm(int d, int wm, int smem_per_sm) {
  const size_t need = (d == 64 ? smem_of<64>(wm) : d == 128 ? smem_of<128>(wm) : smem_of<256>(wm)) + 2048;
  const int by_smem = smem_per_sm > 0 ? static_cast<int>(static_cast<size_t>(smem_per_sm) / need) : 1;
  const int by_regs = d == 256 ? 2 : 4;
  return std::max(1, std::min(by_smem, by_regs));
}

// Splits per (sequence, KV head, row chunk) for `units` such groups of `tiles`
// key tiles: the s that minimises the modelled time waves(s) x (tiles per
// split + 1 for a block's start-up latency), plus one tile's worth for the
// combine launch when s > 1; ties go to fewer splits. Only s that are the
// smallest for their tiles-per-split are tried.
int choose_splits(int64_t units, int64_t tiles, int64_t cap) {
  const int64_t max_s = std::min<int64_t>(kMaxSplits, tiles);
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int64_t s = 1; s <= max_s; ++s) {
    const int64_t per = (tiles + s - 1) / s;
    if ((tiles + per - 1) / per != s) continue;
    const int64_t waves = (units * s + cap - 1) / cap;
    const int64_t cost = waves * (per + 1) + (s > 1 ? 1 : 0);
    if (cost < best_cost) {
      best_cost = cost;
      best = static_cast<int>(s);
    }
  }
  return best;
}

// FUSEDATTN_DECODE_SPLITS=n (fusedattn/overrides.h) fixes the split count (capped by the key tiles),
// for measuring choose_splits' model against the device.
static_assert(kMaxSplits == Overrides::kMaxDecodeSplits, "the parser's bound is the engine's");
int forced_splits() { return process_overrides().values.decode_splits; }

// Programmatic dependent launches on sm_90+ (FUSEDATTN_DECODE_PDL, fusedattn/overrides.h):
// 2 (the default): the decode kernel is a programmatic dependent of whatever precedes it on the
// stream (it waits for that work before its first global access, so only its launch overlaps), and
// the combine one of the decode kernel (its launch overlaps the decode blocks' epilogues).
// 1: the combine only. 0: plain launches. The default is the fastest (docs/perf-notes.md).
int pdl_mode() { return process_overrides().values.decode_pdl; }

}  // namespace

namespace {

// What the engine needs of any call over a cache (a page pool, or per-sequence rows in a step).
std::string plan_cache(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  const Problem& pr = p.prob;
  if (pr.dtype != DType::kFloat16 && pr.dtype != DType::kBFloat16) return "dtype is not float16/bfloat16";
  if (p.bias.type == BiasType::kPostScaleBias || p.mask.mask.data != nullptr || p.dropout.p > 0.f) {
    return "bias, explicit mask or dropout";
  }
  if (p.softcap > 0) return "softcap";
  const int64_t dmax = std::max(pr.d_qk, pr.d_v);
  if (dmax > 256) return "head dim above 256";
  if (pr.d_qk == 0 || pr.d_v == 0) return "an empty head dim";
  if (!gpu::rows16(p.q) || !gpu::rows16(p.k) || !gpu::rows16(p.v)) {
    return "q, k, v need a unit head-dim stride and 16-byte aligned rows";
  }
  if (p.paged.page_size <= 0 || p.paged.max_pages <= 0 || p.paged.num_pages <= 0) return "empty page pool";
  if (pr.b <= 0 || pr.s_q <= 0 || pr.h_q <= 0) return "empty problem";
  if (pr.s_q + pr.s_kv >= kMaxPositionSum32) return "s_q + s_kv >= 2^30 (positions in int32)";
  const int64_t group = pr.h_q / pr.h_kv;
  const int64_t rows = pr.s_q * group;
  if (rows >= (int64_t(1) << 30) || pr.s_q * pr.h_q >= (int64_t(1) << 31)) return "too many query rows";
  DecodeSchedule sc;
  sc.row_warps = rows <= 16 ? 1 : (rows <= 32 ? 2 : 4);
  sc.chunks = static_cast<int>((rows + 16 * sc.row_warps - 1) / (16 * sc.row_warps));
  if (pr.h_kv * sc.chunks > 65535 || pr.b > 65535) return "grid too large";
  sc.head_dim = dmax <= 64 ? 64 : (dmax <= 128 ? 128 : 256);

  const int sms = dev.sm_count > 0 ? dev.sm_count : 1;
  const int64_t cap = int64_t(sms) * blocks_per_sm(sc.head_dim, sc.row_warps, dev.smem_per_sm);
  const int64_t tiles = std::max<int64_t>(1, (pr.s_kv + kBlockN - 1) / kBlockN);
  sc.splits = choose_splits(pr.b * pr.h_kv * sc.chunks, tiles, cap);
  if (const int forced = forced_splits(); forced > 0) sc.splits = static_cast<int>(std::min<int64_t>(forced, tiles));
  size_t bytes = 0;
  if (sc.splits > 1) {
    const auto up = [](size_t x) { return (x + 255) / 256 * 256; };
    const size_t prow = static_cast<size_t>(sc.splits) * pr.b * pr.h_kv * rows;
    sc.ws_o_off = 0;
    sc.ws_lse_off = up(prow * pr.d_v * sizeof(float));
    bytes = sc.ws_lse_off + up(prow * sizeof(float));
  }
  const bool sm90 = dev.major >= 9;
  sc.pdl = sc.splits > 1 && pdl_mode() >= 1 && sm90;
  sc.pdl_main = pdl_mode() >= 2 && sm90;
  *plan = CudaPlan{};
  plan->engine = CudaEngine::kDecode;
  plan->sm_count = dev.sm_count;
  plan->workspace_bytes = bytes;
  plan->decode = sc;
  return "";
}

}  // namespace

std::string plan_fwd(const FwdParams& p, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  if (p.paged.page_table == nullptr) return "not a paged KV cache";
  return plan_cache(p, dev, plan);
}

std::string plan_step(const KvStepParams& s, const gpu::DeviceAttrs& dev, CudaPlan* plan) {
  // The owner blocks copy new tokens in 16-byte pieces, and the kernel reads them as cache rows.
  if (!gpu::rows16(s.append.new_k) || !gpu::rows16(s.append.new_v)) {
    return "new_k and new_v need a unit head-dim stride and 16-byte aligned rows";
  }
  return plan_cache(s.attn, dev, plan);
}

namespace {

template <class T>
Status run_typed(const FwdParams& p, const DecodeSchedule& plan, const KernelArgs& a, void* stream) {
  FUSEDATTN_RETURN_IF_ERROR(launch_init_outputs<T>(p, stream));
  switch (plan.head_dim) {
    case 64: FUSEDATTN_RETURN_IF_ERROR((launch_decode<T, 64>(p, plan, a, stream))); break;
    case 128: FUSEDATTN_RETURN_IF_ERROR((launch_decode<T, 128>(p, plan, a, stream))); break;
    default: FUSEDATTN_RETURN_IF_ERROR((launch_decode<T, 256>(p, plan, a, stream))); break;
  }
  if (plan.splits > 1) FUSEDATTN_RETURN_IF_ERROR(launch_combine<T>(p, a, stream));
  return Status::Ok();
}

}  // namespace

Status run_fwd(const FwdParams& p, const CudaPlan& plan, const CudaLaunch& launch, const KvStepParams* step) {
  const DecodeSchedule& sc = plan.decode;
  KernelArgs a;
  a.group = static_cast<int>(p.prob.h_q / p.prob.h_kv);
  a.rows = static_cast<int>(p.prob.s_q * a.group);
  a.splits = sc.splits;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  a.out_vec = gpu::rows16(p.out);
  a.div_hkv = FastDiv(static_cast<uint32_t>(p.prob.h_kv));
  a.div_group = FastDiv(static_cast<uint32_t>(a.group));
  a.div_splits = FastDiv(static_cast<uint32_t>(sc.splits));
  a.div_ps = FastDiv(static_cast<uint32_t>(p.paged.page_size));
  a.div_hq = FastDiv(static_cast<uint32_t>(p.prob.h_q));
  a.pdl = sc.pdl;
  a.pdl_main = sc.pdl_main;
  if (step != nullptr) {
    a.cache_seqlens = step->append.cache_seqlens;
    a.new_k = step->append.new_k;
    a.new_v = step->append.new_v;
  }
  if (sc.splits > 1) {
    unsigned char* ws = static_cast<unsigned char*>(launch.workspace);
    a.ws_o = reinterpret_cast<float*>(ws + sc.ws_o_off);
    a.ws_lse = reinterpret_cast<float*>(ws + sc.ws_lse_off);
  }
  if (p.prob.dtype == DType::kFloat16) return run_typed<__half>(p, sc, a, launch.stream);
  return run_typed<__nv_bfloat16>(p, sc, a, launch.stream);
}

}  // namespace decode
}  // namespace fusedattn
