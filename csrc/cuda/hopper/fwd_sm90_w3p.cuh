// Hopper (sm_90a) FlashAttention forward, d = 64: the three-consumer kernel
// (fwd_sm90_v2w3.cuh) with the persistent tile scheduler of v3
// (fwd_sm90_v3.cuh). tuning.h gives it non-causal calls with s <= 2k and causal
// ones with 1k < s <= 2k. Harness (H200, 2026-12-02): checkw3p 138/138 bitwise
// equal to v2; benchw3p against the three-consumer kernel +3% at s = 2k causal,
// +1-3% at s = 1k / 2k, +13% non-causal at 512, within -2 to +1% at 4k, -1 to
// -7% at 8k / 16k. Operator grid (same day, 3 rounds): d = 64 2k causal 398
// against 389 TFLOP/s, non-causal +9 / +6.5 / +2.3% at 512 / 1k / 2k.
//
// Why: at s = 2k causal the three-consumer kernel's CTAs run ~9 key tiles on
// average, and a fit of the 2k causal / non-causal harness times puts a fixed
// cost of ~4.5 us on each ~16 us CTA (Q and first K/V latency, pipeline fill
// and drain, epilogue), which nothing overlaps at one CTA per SM. It is the
// last forward point below cuDNN (0.98 / 1.00 / 0.98 in the three grids of
// 2026-12-02). v3 removed the same cost from v2 (+4.6% at d = 64 2k causal).
//
// Per tile the consumers run the three-consumer kernel's code (w3_consume_tile:
// S_0 alone; steady iterations S_n + PV_{n-1} under the 3-way rotation;
// SKIP's iterations for key tiles a warpgroup's rows never see; PV_last alone),
// and the producer is v3's (v3_produce), so with the same BN the outputs are
// bitwise equal to v2's and to the three-consumer kernel's. What changes is
// across tiles, as in v3:
// (1) Schedule: v3's (v3_decode with BM = 192, v3_next; snake or snake
//     head-major, picked per call by tuning.h's choose_v3_schedule).
// (2) Q: two 24 KB slots (2 x 24 + 2 x 4 x 16 KB = 176 KB of 227), each with a
//     full (tx) and an empty barrier (12 consumer-warp arrivals). A warp
//     releases the slot after its warpgroup's last S of the tile: S_0 when it
//     sees one key tile (n_eff = 1, SKIP), else after the softmax of
//     S_{n_eff - 1} (whose slow path may issue that S again). The producer
//     issues tile j's Q after its K_0, into slot j % 2, once tile j - 2 has
//     released it.
// (3) K / V rings run across tiles: block counter it = (key tiles of the
//     CTA's earlier tiles) + n, slot it % STAGES, phase (it / STAGES) & 1. The
//     last V slot of a tile is released after PV_last (later loads wait on it).
// (4) Rotation across tiles: one sequence c0, c1, c2, c0, ... over the CTA's
//     life. Every consumer takes n_blocks + 1 turns per tile (SKIP iterations
//     included), all consumers run the same tiles, consumer 2 passes once
//     before its first tile and skips only the pass of its last turn of its
//     last tile: bar 1 gets 1 + (T - 1) arrivals and T syncs, bars 2 and 3 T
//     each (T = sum over tiles of n_blocks + 1), so every barrier ends empty,
//     and the fwd_sm90_v2w3.cuh argument (at most one pending arrival per
//     barrier) holds across tile boundaries unchanged.
// Deadlock freedom, as in v3's header: every consumer wait is on a load the
// producer issues before any load it may then block on, and the producer
// blocks only on slots released by GEMMs earlier in the consumers' program
// order (Q slot j % 2 by tile j - 2's S GEMMs, K / V slots by blocks
// it - STAGES). tests/gpu/hopper/w3_protocol_model.py checks the rotation,
// the rings and SKIP with several tiles per CTA (persistent mode).
// Bounded mbarrier waits as in v3 (producer traps; a consumer warp that gave
// up reports NaN lse for its rows of this and later tiles and keeps every
// turn and arrival).
#pragma once

#include "fwd_sm90_v2w3.cuh"
#include "fwd_sm90_v3.cuh"

namespace fusedattn {
namespace hopper {

template <int BN_, int STAGES_, bool PP_, bool SKIP_ = true>
struct FwdW3PCfg {
  static constexpr int D = 64;
  static constexpr int BM = 64 * kW3Consumers, BN = BN_, STAGES = STAGES_, QBUF = 2;
  static constexpr bool PP = PP_, SKIP = SKIP_;
  static constexpr int kQBytes = BM * D * 2;  // 24 KB
  static constexpr int kKVBytes = BN * D * 2;
  static constexpr int kKOffset = QBUF * kQBytes;
  static constexpr int kBarOffset = kKOffset + 2 * STAGES * kKVBytes;
  static constexpr int kBarBytes = 8 * (2 * QBUF + 4 * STAGES);  // qf[], qe[], kf[], vf[], ke[], ve[]
  static constexpr int kTotal = kBarOffset + ((kBarBytes + 127) / 128) * 128 + 1024;  // + alignment slack
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "swizzle atoms");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N / PV k-steps");
  static_assert(STAGES >= 2, "ring depth");
  static_assert(kTotal <= 232448, "dynamic shared memory (227 KB)");
};

template <typename T, bool CAUSAL, int BN_, int STAGES_, bool PP_, bool SKIP_, int SCHED_>
__global__ void __launch_bounds__(kW3Threads, 1)
    fwd_sm90_w3p_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                        const __grid_constant__ CUtensorMap tmV, const KParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Cfg = FwdW3PCfg<BN_, STAGES_, PP_, SKIP_>;
  constexpr int D = 64;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES, QBUF = Cfg::QBUF;
  constexpr bool PP = Cfg::PP;
  constexpr bool kSnake = CAUSAL && SCHED_ != kV3RoundRobin;
  constexpr bool kHeadMajor = CAUSAL && SCHED_ == kV3SnakeHeadMajor;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sQ0 = (sraw + 1023u) & ~1023u;
  const uint32_t sK0 = sQ0 + Cfg::kKOffset;
  const uint32_t sV0 = sK0 + STAGES * Cfg::kKVBytes;
  const V3Bars<QBUF, STAGES> bars{sQ0 + Cfg::kBarOffset};

  const int tid = threadIdx.x;
  const int wg = warpgroup_index();
  const int n_m = (p.s_q + BM - 1) / BM;
  const int n_hb = p.h * p.b;
  const int n_tiles = n_m * n_hb;  // host: fits in int, gridDim.x <= n_tiles

  fwd_cta_start(bars, kW3ConsumerWarps, tmQ, tmK, tmV);

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<kW3ProducerRegs>();
    if (tid == 0) {
      v3_produce<D, BM, BN, STAGES, QBUF, CAUSAL, kSnake, kHeadMajor>(
          p, V3ProducerArgs{&tmQ, &tmK, &tmV, sQ0, sK0, sV0, n_m, n_hb, n_tiles, p.h / p.h_kv}, bars);
    }
    return;
  }

  // -------------------------------------------------------------- consumers
  setmaxnreg_inc<kW3ConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup 0..2: query rows [64*cw, 64*cw+64) of each tile

  // Rotation: the last consumer hands consumer 0 the first turn of the whole persistent loop.
  if (PP && cw == kW3Consumers - 1) w3_pass_turn(cw);

  // Zeroed once: the first k-step of every S GEMM ignores the old value.
  float sacc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) sacc[i] = 0.f;

  bool timed_out = false;  // sticky for the CTA's life
  uint32_t kv = 0;         // key tiles of this CTA's earlier tiles
  uint32_t j = 0;          // local tile index (Q ring)
  for (int t = blockIdx.x; t < n_tiles; t = v3_next<kSnake>(t, j), ++j) {
    const V3Tile ti = v3_decode<CAUSAL, BM, BN, kHeadMajor>(t, n_m, n_hb, p);
    const uint32_t qs = j % QBUF;
    W3TileIo io;
    io.m_blk = ti.m_blk;
    io.head = ti.head;
    io.batch = ti.batch;
    io.n_blocks = ti.n_blocks;
    io.sQ = warp_uniform_here(sQ0 + qs * Cfg::kQBytes);
    io.q_full = bars.qf(qs);
    io.q_phase = (j / QBUF) & 1u;
    io.q_empty = bars.qe(qs);
    io.sK0 = sK0;
    io.sV0 = sV0;
    io.kf0 = bars.kf(0);
    io.kv = kv;
    io.last_tile = v3_next<kSnake>(t, j) >= n_tiles;  // the same in every consumer
    // The epilogue's stores run while the producer's next Q / K_0 loads are in flight and the
    // other consumers issue.
    w3_consume_tile<T, CAUSAL, Cfg, true>(p, io, cw, sacc, timed_out);
    kv += ti.n_blocks;
    __syncwarp();  // reconverge (row < s_q) before the next tile's .aligned ops
  }
#endif
}

// =================================================================== host
// fwd_sm90_v2w3_prepare_cfg's contract plus the SM count: the grid is min(#work tiles, num_sms)
// CTAs; launch with fwd_sm90_v2w3_launch (512 threads). SCHED: v3's tile schedule for causal calls.
template <typename T, int BN, int STAGES, bool PP, bool SKIP, int SCHED>
inline cudaError_t fwd_sm90_w3p_prepare_cfg(FwdLaunch* L, const Sm90Args& a, int num_sms) {
  using Cfg = FwdW3PCfg<BN, STAGES, PP, SKIP>;
  const cudaError_t e = detail::persistent_prepare<T>(L, a, num_sms, Cfg::D, Cfg::BM, Cfg::BN, Cfg::kTotal);
  if (e != cudaSuccess) return e;
  // Non-causal calls ignore SCHED (one tile length; head-major order).
  L->kern = a.causal ? fwd_sm90_w3p_kernel<T, true, BN, STAGES, PP, SKIP, SCHED>
                     : fwd_sm90_w3p_kernel<T, false, BN, STAGES, PP, SKIP, kV3RoundRobin>;
  static std::atomic<uint64_t> raised[2];  // per instantiation of this function: causal or not
  return detail::raise_smem_limit(reinterpret_cast<const void*>(L->kern), L->smem, raised[a.causal ? 1 : 0]);
}

// The three-consumer default config (FwdV2W3Default) with the schedule tuning.h picks for the call,
// as the library's persistent forward does for v3.
template <typename T>
inline cudaError_t fwd_sm90_w3p_prepare(FwdLaunch* L, const Sm90Args& a, int num_sms) {
  using C = FwdV2W3Default;
  constexpr int BM = FwdW3PCfg<C::BN, C::STAGES, C::PP, C::SKIP>::BM;
  if (a.causal && detail::causal_schedule(a, num_sms, BM, C::BN) == V3Schedule::kSnakeHeadMajor)
    return fwd_sm90_w3p_prepare_cfg<T, C::BN, C::STAGES, C::PP, C::SKIP, kV3SnakeHeadMajor>(L, a, num_sms);
  return fwd_sm90_w3p_prepare_cfg<T, C::BN, C::STAGES, C::PP, C::SKIP, kV3Snake>(L, a, num_sms);
}

}  // namespace hopper
}  // namespace fusedattn
