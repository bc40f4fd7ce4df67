// Hopper (sm_90a) FlashAttention forward, variant 3 ("v3"): v2
// (fwd_sm90_v2.cuh) + a persistent tile scheduler. Written without a GPU and
// checked by the Python protocol model tests/gpu/hopper/v3_protocol_model.py;
// on the H200 (2026-11-30) the harness's check3 passed (bitwise v2's outputs)
// and bench3 measured where it beats v2 (docs/perf-notes.md). The library runs
// it where tuning.h says so (fwd_persistent.cu is its host entry).
//
// Why: at short sequences (b*s = 16k tokens, s = 512: ~4k CTAs of 4 kv tiles
// each) every v2 CTA pays a prologue (barrier init, tensor-map prefetch, Q
// load, first K) and an epilogue (O normalisation, stores, lse) that overlap
// nothing. v3 launches min(#tiles, #SMs) CTAs that loop over work tiles and
// start the next tile's loads while the current one finishes.
//
// Per tile the arithmetic is v2's, operation for operation (same S / PV wgmma
// chains, same mask, softmax, rescale, pack and epilogue code, the v2_*
// helpers themselves), so for the same BN/STAGES the outputs are bitwise
// equal to v2's (harness check3 compares them bit for bit).
//
// (1) Schedule. Work tile t in [0, n_m * h * b) (n_m = ceil(s_q / 128)); CTA
//     i takes t = i, i + G, i + 2G, ... (G = gridDim.x = min(#tiles, #SMs)),
//     a static round-robin, so every CTA has >= 1 tile and both consumers of
//     a CTA see the same tile sequence. Decoding t:
//       causal:     t = m_idx * (h*b) + hb, m_blk = n_m - 1 - m_idx: the
//                   longest query tiles come first and each round of G tiles
//                   has (nearly) equal lengths (an hb-major order would give
//                   CTA i the same m_blk every round when G % n_m == 0).
//       non-causal: t = hb * n_m + m_blk (v2's hardware order: the query
//                   tiles of one head are adjacent, so K/V are shared in L2).
//     hb = batch * h + head (heads of one GQA group adjacent).
// (2) Q. QBUF (1 or 2) Q slots, each with a full (tx) and an empty (8
//     consumer-warp arrivals) mbarrier; local tile j uses slot j % QBUF with
//     phase (j / QBUF) & 1 -- the same ring rule as K/V. Q is read only by
//     the S GEMMs, so a consumer warp releases the Q slot once its LAST S
//     GEMM of the tile has completed (wait_group: after S_0 in the prologue
//     when the tile has one kv block, else after the softmax of S_{last} in
//     the last steady-state iteration, whose slow path may issue S_{last}
//     again), i.e. before that tile's last P V and epilogue. QBUF = 2 where
//     it fits in 227 KB (d = 64): the next Q is issued right after the
//     current tile's last V load; else 1 (d = 128 at 3 stages, d = 256 at 2
//     stages: a second 32 / 64 KB slot does not fit): the next Q is issued
//     once both consumers have released the slot, and lands during their
//     last PV and epilogue.
//     With Q in registers (kFwdQInRegs, d = 128) each consumer warp loads its
//     fragments right after the Q barrier and releases the slot at once (the
//     slow path's S reissue then takes Q from the registers too).
//     Smem (default configs): d=64 165,120 B (2 Q slots), d=128 230,528 B,
//     d=256 230,528 B (1 Q slot each) of 232,448.
// (3) K/V rings continue across tiles. Producer and consumers count kv blocks
//     over the CTA's whole life (it = kv blocks of earlier tiles + n): slot
//     it % STAGES, phase (it / STAGES) & 1, exactly v2's rule with n
//     replaced by it; nothing is re-initialised between tiles. The V slot of
//     a tile's last block is released after its PV (in v2 that arrival had no
//     waiter; here the producer's later loads wait on it).
//     Producer order per tile: K_0, Q, then per n: K_{n+1}, V_n (v2's order
//     with Q after K_0: K_0's slot is free as soon as S_{it-STAGES} is done,
//     Q's only after the previous tile's last S). Every consumer wait is on
//     a load earlier in this order than any load the producer may be blocked
//     on while that wait is pending: the producer blocks only on slots whose
//     release comes from GEMMs issued earlier in the consumer's program
//     order. The K and last Q releases of a steady-state iteration follow
//     its softmax, whose only waits are on the consumer's own warpgroup (the
//     vote) and own GEMMs (the slow path's S reissue, wait_group 0), never on
//     the producer (checked by the model for 1-6 tiles per CTA, 1-7 kv
//     blocks per tile, STAGES 2-4, QBUF 1-2, slow path at random).
// (4) Ping-pong across tiles. The turns form ONE alternating sequence over
//     the CTA's whole loop, not one per tile: consumer c takes its turns
//     (wait bar 1+c, issue, arrive on the other's bar) in program order; per
//     tile each consumer takes n_blocks + 1 turns (S_0; n_blocks - 1 x
//     {S_n, PV_{n-1}}; PV_last). Consumer 1 arrives on bar 1 once before its
//     first tile, and skips only the arrival of its LAST turn of its LAST
//     tile. Balance: both consumers iterate the same tiles (the schedule
//     depends only on blockIdx / gridDim / shapes), so both take the same
//     number of turns T = sum_tiles (n_blocks + 1). Bar 1: consumer 0 syncs
//     T times, consumer 1 arrives 1 + (T - 1) = T times. Bar 2: consumer 1
//     syncs T times, consumer 0 arrives T times. So both barriers end with no
//     pending arrival. At most one arrival is outstanding on either barrier
//     at any time: consumer 1's k-th arrival on bar 1 follows its (k-1)-th
//     sync on bar 2, which needs consumer 0's (k-1)-th arrival on bar 2,
//     which follows consumer 0's (k-1)-th sync on bar 1 that consumed
//     consumer 1's (k-1)-th arrival (symmetrically for bar 2), so no
//     generation of a hardware barrier ever mixes arrivals of two turns.
//     Across a tile boundary consumer 1's last turn of tile j (PV_last)
//     passes to consumer 0's first turn of tile j+1 (S_0), which consumer 0
//     reaches after its own epilogue; a per-tile reset (v2's rule repeated
//     every tile) would also balance but would hold consumer 0's S_0 of tile
//     j+1 until consumer 1 finished its epilogue of tile j. The model checks
//     the balance and seeds the per-tile-skip bug.
// Bounded mbarrier waits as in v2: the producer traps, a consumer warp that
// gave up reports NaN lse for its rows of this and every later tile and
// skips its later waits (it still takes every turn and makes every arrival,
// so the named barriers stay balanced and the CTA ends).
#pragma once

#include "fwd_sm90.cuh"
#include "fwd_sm90_v2.cuh"
#include "tuning.h"
#include "wgmma.cuh"

namespace fusedattn {
namespace hopper {

// ------------------------------------------------------------------ config
template <int D, int BN_, int STAGES_, bool PP_>
struct FwdV3Cfg {
  static constexpr int BM = 128, BN = BN_, STAGES = STAGES_;
  static constexpr bool PP = PP_;
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kKVBytes = kV2KVBytes<D, BN>;
  static constexpr int kSmemLimit = 232448;  // 227 KB of dynamic shared memory per block
  static constexpr int bar_bytes(int qbuf) { return 8 * (2 * qbuf + 4 * STAGES); }  // qf[], qe[], kf[], vf[], ke[], ve[]
  // + 1024 slack for aligning the dynamic smem base to the swizzle atom.
  static constexpr int total(int qbuf) {
    return qbuf * kQBytes + 2 * STAGES * kKVBytes + ((bar_bytes(qbuf) + 127) / 128) * 128 + 1024;
  }
  // Two Q slots where they fit (the next tile's Q is issued right after the
  // current tile's last V load, up to STAGES kv blocks before the tile's
  // end), else one (it is issued once the current tile's last S GEMM is done
  // in both consumers).
  static constexpr int QBUF = total(2) <= kSmemLimit ? 2 : 1;
  static constexpr int kKOffset = QBUF * kQBytes;
  static constexpr int kBarOffset = kKOffset + 2 * STAGES * kKVBytes;
  static constexpr int kBarBytes = bar_bytes(QBUF);
  static constexpr int kTotal = total(QBUF);
  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N / PV k-steps");
  static_assert((BN * 128) % 1024 == 0, "BN multiple of 8");
  static_assert(STAGES >= 2, "ring depth");
  static_assert(kTotal <= kSmemLimit, "dynamic shared memory (227 KB)");
};

// Same tile shapes as v2's defaults (bitwise-equal outputs need the same BN).
template <int D>
using FwdV3Default = FwdV2Default<D>;

// Default configs: d=64 2 Q slots, d=128 and d=256 one (a second does not fit).
static_assert(FwdV3Cfg<64, 128, 4, true>::QBUF == 2 && FwdV3Cfg<64, 128, 4, true>::kTotal == 165120,
              "d=64 smem: 2 x 16 KB Q + 4 x 2 x 16 KB K/V + barriers + slack");
static_assert(FwdV3Cfg<128, 128, 3, true>::QBUF == 1 && FwdV3Cfg<128, 128, 3, true>::kTotal == 230528,
              "d=128 smem: 32 KB Q + 3 x 2 x 32 KB K/V + barriers + slack");
static_assert(FwdV3Cfg<256, 80, 2, false>::QBUF == 1 && FwdV3Cfg<256, 80, 2, false>::kTotal == 230528,
              "d=256 smem: 64 KB Q + 2 x 2 x 40 KB K/V + barriers + slack");

// Work-tile schedules (the kernel's SCHED argument), for causal calls (non-causal tiles all have one
// length and already use the head-major order). The library runs kV3Snake or kV3SnakeHeadMajor,
// chosen per call by tuning.h's choose_v3_schedule; kV3RoundRobin stays as the harness's baseline:
//   kV3RoundRobin      (1) above: causal tiles m-major (longest first), CTA i takes j G + i.
//   kV3Snake           the same order, odd rounds handed out in reverse CTA order (v3_next).
//   kV3SnakeHeadMajor  snake, and causal tiles head-major (a head's query tiles adjacent, longest
//                      first within the head). The m-major order puts one query tile of every head
//                      in a round, so no two concurrent CTAs share a head's K/V in L2; at s = 512
//                      (b = 32, 16 heads, 4 query tiles a head) each head's K/V is read from DRAM
//                      up to 4 times, where v2's order (a head's tiles adjacent) reads it about once.
//                      Measured (H200, fifth session): 1.24x v2 at d = 128 s = 512 where the
//                      m-major snake gave 1.01x, but 0.68x at s = 16k, where its rounds drift
//                      against the head boundaries (tuning.h).
constexpr int kV3RoundRobin = 0, kV3Snake = 1, kV3SnakeHeadMajor = 2;

// One work tile of the static schedule (see (1) above).
struct V3Tile {
  int m_blk, head, batch, n_blocks;
};
template <bool CAUSAL, int BM, int BN, bool HEAD_MAJOR = false>
__device__ __forceinline__ V3Tile v3_decode(int t, int n_m, int n_hb, const KParams& p) {
  V3Tile r;
  int hb;
  if (CAUSAL && !HEAD_MAJOR) {
    const int m_idx = t / n_hb;
    hb = t - m_idx * n_hb;
    r.m_blk = n_m - 1 - m_idx;
  } else {
    hb = t / n_m;
    r.m_blk = t - hb * n_m;
    if (CAUSAL) r.m_blk = n_m - 1 - r.m_blk;  // head-major causal: the head's longest tile first
  }
  r.batch = hb / p.h;
  r.head = hb - r.batch * p.h;
  int nb = (p.s_kv + BN - 1) / BN;
  if (CAUSAL) nb = min(nb, ((r.m_blk + 1) * BM + BN - 1) / BN);
  r.n_blocks = nb;  // >= 1
  return r;
}

// The global index of this CTA's (j+1)-th work tile, given its j-th, t (the first is t = blockIdx.x);
// G = gridDim.x CTAs, round j covers tiles [j G, (j + 1) G).
// Round-robin (SNAKE = false): CTA i takes tile j G + i in every round. Snake (kV3Snake and
// kV3SnakeHeadMajor): odd rounds go the other way, j G + G - 1 - i. With the causal
// order (longest query tiles first) a round spans several tile lengths, and round-robin gives
// CTA 0 the longest of every round: at d = 128, s = 16k (16 heads, 128 query tiles of 16 tiles
// each per round of 132) about 6% more work than the mean, and the kernel ends with its last CTA
// (measured: 0.91-0.93x v2 causal). Alternating the direction pairs each CTA's longer tiles of one
// round with shorter ones of the next. Indices grow with j, so a CTA's first index >= n_tiles ends
// its loop; every CTA still has a tile in every round but the last.
template <bool SNAKE>
__device__ __forceinline__ int v3_next(int t, uint32_t j) {
  const int G = static_cast<int>(gridDim.x);
  if (!SNAKE) return t + G;
  const int r = static_cast<int>(j) + 1, cta = static_cast<int>(blockIdx.x);
  return r * G + ((r & 1) ? G - 1 - cta : cta);
}

// The persistent forwards' mbarriers (v3 here, the three-consumer one in fwd_sm90_w3p.cuh), eight
// bytes each from bar0: qf[QBUF], qe[QBUF], kf[STAGES], vf[STAGES], ke[STAGES], ve[STAGES]. The
// full barriers count one arrival (with the TMA transaction bytes), the empty ones one per
// consumer warp.
template <int QBUF, int STAGES>
struct V3Bars {
  uint32_t bar0;
  __device__ __forceinline__ uint32_t qf(uint32_t s) const { return bar0 + 8u * s; }                 // Q full (tx)
  __device__ __forceinline__ uint32_t qe(uint32_t s) const { return bar0 + 8u * (QBUF + s); }        // Q empty
  __device__ __forceinline__ uint32_t kf(uint32_t s) const { return bar0 + 8u * (2 * QBUF + s); }    // K full (tx)
  __device__ __forceinline__ uint32_t vf(uint32_t s) const { return bar0 + 8u * (2 * QBUF + STAGES + s); }
  __device__ __forceinline__ uint32_t ke(uint32_t s) const { return bar0 + 8u * (2 * QBUF + 2 * STAGES + s); }
  __device__ __forceinline__ uint32_t ve(uint32_t s) const { return bar0 + 8u * (2 * QBUF + 3 * STAGES + s); }
  // One thread, before the block's first __syncthreads.
  __device__ __forceinline__ void init(int consumer_warps) const {
    for (int s = 0; s < QBUF; ++s) {
      mbar_init(qf(s), 1);
      mbar_init(qe(s), consumer_warps);
    }
    init_kv_ring<STAGES>(*this, consumer_warps);
    mbar_fence_init();
  }
};

// What the persistent producer reads besides its compile-time shape: the tensor maps, the
// shared-memory slots, and the work-tile grid (n_m query tiles of each of n_hb (batch, head)
// pairs, n_tiles in all; group query heads per K / V head).
struct V3ProducerArgs {
  const CUtensorMap *tmQ, *tmK, *tmV;
  uint32_t sQ0, sK0, sV0;
  int n_m, n_hb, n_tiles, group;
};

// The persistent forwards' producer, one thread: per work tile K_0, Q, then per key tile n:
// K_{n+1}, V_n ((3) in the header), the K / V rings running on across tiles (ring position kv + n).
// D / 64 boxes of 128-byte rows per load; BM-row Q and BN-row K / V boxes.
template <int D, int BM, int BN, int STAGES, int QBUF, bool CAUSAL, bool SNAKE, bool HEAD_MAJOR>
__device__ __forceinline__ void v3_produce(const KParams& p, const V3ProducerArgs& a,
                                           const V3Bars<QBUF, STAGES>& bars) {
  constexpr int DCH = D / 64;  // 128-byte chunks per row
  constexpr uint32_t kQBytes = BM * D * 2, kKVBytes = BN * D * 2;
  uint32_t kv = 0;  // kv blocks of this CTA's earlier tiles
  uint32_t j = 0;   // local tile index (Q ring)
  for (int t = blockIdx.x; t < a.n_tiles; t = v3_next<SNAKE>(t, j), ++j) {
    const V3Tile ti = v3_decode<CAUSAL, BM, BN, HEAD_MAJOR>(t, a.n_m, a.n_hb, p);
    const int head_kv = ti.head / a.group;
    auto load_k = [&](int n) {
      const uint32_t it = kv + n;
      const uint32_t s = it % STAGES;
      mbar_wait<true>(bars.ke(s), ((it / STAGES) & 1u) ^ 1u);  // fresh barrier: parity 1 passes at once
      mbar_arrive_expect_tx(bars.kf(s), kKVBytes);
#pragma unroll
      for (int c = 0; c < DCH; ++c)
        tma_load_4d(a.sK0 + s * kKVBytes + c * BN * 128, a.tmK, bars.kf(s), c * 64, head_kv, n * BN, ti.batch);
    };
    auto load_v = [&](int n) {
      const uint32_t it = kv + n;
      const uint32_t s = it % STAGES;
      mbar_wait<true>(bars.ve(s), ((it / STAGES) & 1u) ^ 1u);
      mbar_arrive_expect_tx(bars.vf(s), kKVBytes);
#pragma unroll
      for (int c = 0; c < DCH; ++c)
        tma_load_4d(a.sV0 + s * kKVBytes + c * BN * 128, a.tmV, bars.vf(s), c * 64, head_kv, n * BN, ti.batch);
    };
    load_k(0);
    {
      const uint32_t qs = j % QBUF;
      mbar_wait<true>(bars.qe(qs), ((j / QBUF) & 1u) ^ 1u);
      mbar_arrive_expect_tx(bars.qf(qs), kQBytes);
      // Tensor-map dims are (d, h, s, b): coordinates (d0, head, seq, batch). Rows past s_q are
      // zero-filled and still counted in the transaction bytes (full box).
#pragma unroll
      for (int c = 0; c < DCH; ++c)
        tma_load_4d(a.sQ0 + qs * kQBytes + c * BM * 128, a.tmQ, bars.qf(qs), c * 64, ti.head, ti.m_blk * BM,
                    ti.batch);
    }
    for (int n = 0; n < ti.n_blocks; ++n) {
      if (n + 1 < ti.n_blocks) load_k(n + 1);
      load_v(n);
    }
    kv += ti.n_blocks;
  }
}

// ------------------------------------------------------------------- kernel
template <typename T, int D, bool CAUSAL, int BN_, int STAGES_, bool PP_, int SCHED_ = kV3RoundRobin>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_sm90_v3_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                       const __grid_constant__ CUtensorMap tmV, const KParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr bool F16 = std::is_same<T, __half>::value;
  using Cfg = FwdV3Cfg<D, BN_, STAGES_, PP_>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES, QBUF = Cfg::QBUF;
  constexpr bool PP = Cfg::PP;
  constexpr bool QREG = kFwdQInRegs<D, BN>;

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
  const int group = p.h / p.h_kv;
  constexpr bool kSnake = CAUSAL && SCHED_ != kV3RoundRobin;  // non-causal: one tile length, nothing to balance
  constexpr bool kHeadMajor = CAUSAL && SCHED_ == kV3SnakeHeadMajor;

  fwd_cta_start(bars, kConsumerWarps, tmQ, tmK, tmV);

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<24>();
    if (tid == 0) {
      v3_produce<D, BM, BN, STAGES, QBUF, CAUSAL, kSnake, kHeadMajor>(
          p, V3ProducerArgs{&tmQ, &tmK, &tmV, sQ0, sK0, sV0, n_m, n_hb, n_tiles, group}, bars);
    }
    return;
  }

  // -------------------------------------------------------------- consumers
  setmaxnreg_inc<240>();
  const int cw = wg - 1;  // consumer warpgroup: query rows [64*cw, 64*cw+64) of each tile
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  const int qd = lane & 3;
  const int row_in_tile = cw * 64 + warp * 16 + (lane >> 2);
  const float sl2 = p.scale_log2;

  // Ping-pong: consumer 0 takes the first turn of the whole persistent loop.
  if (PP && cw == 1) v2_pp_pass_turn(cw);

  // Zeroed once: the first k-step of every S GEMM ignores the old value.
  float sacc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) sacc[i] = 0.f;
  float o[D / 2];
  uint32_t pa[BN / 16][4];
  uint32_t qa[QREG ? D / 16 : 1][4];

  bool timed_out = false;  // sticky for the CTA's life (see the header)
  auto wait_full = [&](uint32_t bar, uint32_t parity) {
    if (!timed_out) timed_out = !mbar_wait<false>(bar, parity);
  };

  uint32_t kv = 0;  // kv blocks of this CTA's earlier tiles
  uint32_t j = 0;   // local tile index (Q ring)
  for (int t = blockIdx.x; t < n_tiles; t = v3_next<kSnake>(t, j), ++j) {
    const V3Tile ti = v3_decode<CAUSAL, BM, BN, kHeadMajor>(t, n_m, n_hb, p);
    const int n_blocks = ti.n_blocks;
    const bool last_tile = v3_next<kSnake>(t, j) >= n_tiles;  // same in both consumers
    const int row_base = ti.m_blk * BM + row_in_tile;
    const int wg_row0 = ti.m_blk * BM + cw * 64;
    const uint32_t qs = j % QBUF;
    const uint32_t sQ = warp_uniform_here(sQ0 + qs * Cfg::kQBytes);
    const uint32_t sKt = warp_uniform_here(sK0), sVt = warp_uniform_here(sV0);

#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    float row_m[2] = {-INFINITY, -INFINITY};  // running max, log2-scaled domain
    float row_l[2] = {0.f, 0.f};              // running sum (this thread's columns only)
    float corr[2] = {1.f, 1.f};               // O rescale owed to the last softmax

    wait_full(bars.qf(qs), (j / QBUF) & 1u);
    if constexpr (QREG) {
      // Q lives in registers from here, so its slot is free at once: the producer can issue the
      // next tile's Q a whole tile earlier than after this tile's last S GEMM.
      __syncwarp();
      v2_load_q_frags<D>(qa, sQ, cw, warp, lane);
      __syncwarp();
      if (lane == 0) mbar_arrive(bars.qe(qs));
    }

    // ---------------------------------------------- prologue: S_0 alone
    const V2Regs<D, BN> regs{sacc, o, pa, row_m, row_l, corr};
    const auto issue_s = [&](uint32_t sK) { v2_issue_s_q<D, BN, F16, QREG>(sacc, qa, sQ, sK, cw); };
    v2_first_step<D, BN, STAGES, F16, PP>(
        V2Step<uint32_t>{kv, sKt, sVt, cw, lane, sl2}, bars, regs, wait_full, issue_s,
        [&] { v2_mask<BN, CAUSAL>(sacc, 0, p.s_kv, row_base, wg_row0, qd); },
        [&] {
          if (!QREG && n_blocks == 1) mbar_arrive(bars.qe(qs));  // S_0 was this tile's last read of Q
        });

    // ---------------------------------------------- steady state
    for (int n = 1; n < n_blocks; ++n)
      v2_steady_step<D, BN, STAGES, F16, PP>(
          V2Step<uint32_t>{kv + n, sKt, sVt, cw, lane, sl2}, bars, regs, wait_full, issue_s,
          [&] { v2_mask<BN, CAUSAL>(sacc, n, p.s_kv, row_base, wg_row0, qd); },
          [&] {
            if (!QREG && n == n_blocks - 1) mbar_arrive(bars.qe(qs));  // last S GEMM of the tile: Q slot free
          });

    // ---------------------------------------------- PV_{last} alone
    // V_last's release: the producer's later loads wait on it. Only consumer 1's last turn of the
    // whole loop passes nothing.
    v2_last_step<D, BN, STAGES, F16, PP>(V2Step<uint32_t>{kv + n_blocks - 1, sKt, sVt, cw, lane, sl2}, bars, regs,
                                         wait_full, !(cw == 1 && last_tile));
    kv += n_blocks;

    // ---------------------------------------------------------- epilogue
    // Runs while the producer's next Q / K_0 loads are in flight and the
    // other consumer issues its GEMMs.
    fwd_store_rows<T, D>(p, o, row_m, row_l, row_base, ti.batch, ti.head, qd, timed_out);
    __syncwarp();  // reconverge (row < s_q) before the next tile's .aligned ops
  }
#endif
}

// =================================================================== host
namespace detail {
// What the persistent forwards (v3 here, the three-consumer one in fwd_sm90_w3p.cuh) check and set
// alike: the arguments, the tensor maps (BM-row Q boxes, BN-row K / V boxes), and the grid of
// min(#work tiles, num_sms) CTAs (one per SM: 1 CTA/SM by smem and threads).
template <typename T>
inline cudaError_t persistent_prepare(FwdLaunch* L, const Sm90Args& a, int num_sms, int d, int bm, int bn, int smem) {
  const KParams& p = a.out;
  if (num_sms <= 0 || p.b <= 0 || p.s_q <= 0 || p.s_kv <= 0 || p.h <= 0 || p.h_kv <= 0 || p.h % p.h_kv != 0 ||
      a.q.d != d || a.k.d != d || a.v.d != d)
    return cudaErrorInvalidValue;
  const int64_t n_tiles = static_cast<int64_t>((p.s_q + bm - 1) / bm) * p.h * p.b;
  // The kernel's tile indices (up to one round past the last, v3_next) must not overflow int.
  if (n_tiles + 2LL * num_sms > 0x7fffffffLL) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(a.q.ptr) | reinterpret_cast<uintptr_t>(a.k.ptr) |
       reinterpret_cast<uintptr_t>(a.v.ptr)) & 15)
    return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(p.o) & 3) return cudaErrorInvalidValue;
  if (!make_map<T>(&L->tq, a.q, bm) || !make_map<T>(&L->tk, a.k, bn) || !make_map<T>(&L->tv, a.v, bn))
    return cudaErrorInvalidValue;
  L->p = p;
  L->smem = smem;
  L->grid = dim3(static_cast<unsigned>(n_tiles < num_sms ? n_tiles : num_sms), 1, 1);
  L->causal = a.causal;
  return cudaSuccess;
}

// The tile schedule tuning.h's choose_v3_schedule picks for a causal persistent call of bm x bn
// tiles on num_sms CTAs.
inline V3Schedule causal_schedule(const Sm90Args& a, int num_sms, int bm, int bn) {
  V3Grid gr;
  gr.n_m = (a.out.s_q + bm - 1) / bm;
  gr.n_hb = int64_t{a.out.h} * a.out.b;
  gr.s_kv = a.out.s_kv;
  gr.g = num_sms;
  gr.bm = bm;
  gr.bn = bn;
  return choose_v3_schedule(gr);
}
}  // namespace detail

// Same contract as fwd_sm90_v2_prepare_cfg plus the SM count (the grid: detail::persistent_prepare).
// Launch with fwd_sm90_launch (FwdLaunch::grid holds the 1-D grid).
// PP_CAUSAL: the ping-pong of the causal kernel (default: PP), as in fwd_sm90_v2_prepare_cfg.
template <typename T, int D, int BN, int STAGES, bool PP, int SCHED = kV3RoundRobin, bool PP_CAUSAL = PP>
inline cudaError_t fwd_sm90_v3_prepare_cfg(FwdLaunch* L, const Sm90Args& a, int num_sms) {
  using Cfg = FwdV3Cfg<D, BN, STAGES, PP>;
  const cudaError_t e = detail::persistent_prepare<T>(L, a, num_sms, D, Cfg::BM, Cfg::BN, Cfg::kTotal);
  if (e != cudaSuccess) return e;
  // Non-causal calls ignore SCHED: the round-robin instantiation serves every schedule.
  L->kern = a.causal ? fwd_sm90_v3_kernel<T, D, true, BN, STAGES, PP_CAUSAL, SCHED>
                     : fwd_sm90_v3_kernel<T, D, false, BN, STAGES, PP, kV3RoundRobin>;
  static std::atomic<uint64_t> raised[2];  // per instantiation of this function: causal or not
  return detail::raise_smem_limit(reinterpret_cast<const void*>(L->kern), L->smem, raised[a.causal ? 1 : 0]);
}

// A config with the tile schedule tuning.h picks for the call: causal calls take the one
// choose_v3_schedule gives for their tile grid, non-causal ones have one.
template <typename T, int D, int BN, int STAGES, bool PP, bool PP_CAUSAL>
inline cudaError_t fwd_sm90_v3_prepare_tuned(FwdLaunch* L, const Sm90Args& a, int num_sms) {
  constexpr int BM = FwdV3Cfg<D, BN, STAGES, PP>::BM;
  if (a.causal && detail::causal_schedule(a, num_sms, BM, BN) == V3Schedule::kSnakeHeadMajor) {
    return fwd_sm90_v3_prepare_cfg<T, D, BN, STAGES, PP, kV3SnakeHeadMajor, PP_CAUSAL>(L, a, num_sms);
  }
  return fwd_sm90_v3_prepare_cfg<T, D, BN, STAGES, PP, kV3Snake, PP_CAUSAL>(L, a, num_sms);
}

// The library's persistent forward (fwd_persistent.cu): the default config, schedule as tuned.
template <typename T, int D>
inline cudaError_t fwd_sm90_v3_prepare(FwdLaunch* L, const Sm90Args& a, int num_sms) {
  using C = FwdV3Default<D>;
  return fwd_sm90_v3_prepare_tuned<T, D, C::BN, C::STAGES, C::PP, C::PP_CAUSAL>(L, a, num_sms);
}

}  // namespace hopper
}  // namespace fusedattn
