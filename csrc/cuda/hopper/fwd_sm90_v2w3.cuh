// Hopper (sm_90a) FlashAttention forward, d = 64 only: v2 (fwd_sm90_v2.cuh)
// with THREE consumer warpgroups, BM = 192 query rows per CTA (FlashAttention-3's
// 192 x 128 tile for head dim 64). On the H200 (2026-11-30) the harness's
// checkw3 passed (bitwise v2's outputs) and benchw3 measured +7-13% over v2 at
// s >= 2k (docs/perf-notes.md); the library runs it where tuning.h says so
// (fwd_three_consumer.cu is its host entry).
//
// Why: at d = 64 a 64 x 128 S tile is only 4 wgmma k-steps, so per K/V tile
// the tensor-core work is small next to the softmax and the per-tile
// synchronisation, and each K/V tile brought into shared memory serves only
// 128 query rows in v2. Here it serves 192 (1.5x the MMA work per loaded tile,
// per producer iteration and per mbarrier round trip), and with three
// consumers two warpgroups' GEMMs can cover one warpgroup's softmax.
//
// CTA = 4 warpgroups (512 threads, __launch_bounds__(512, 1)), one CTA per
// (192-row query tile, head, batch):
//   WG0   producer, setmaxnreg.dec 24, one thread: Q (one 192-row TMA box),
//         K_0, then per kv tile n: K_{n+1}, V_n into a STAGES-deep ring;
//         separate K / V full (complete_tx) and empty barriers; the empty
//         barriers count 12 consumer-warp arrivals.
//   WG1-3 consumers, setmaxnreg.inc 160, 64 query rows each (rows 64*cw..).
// Register budget: 65536 / 512 = 128 per thread at launch. Producer 24 x 128
// + consumers 3 x 128 x 160 = 3072 + 61440 = 64512 <= 65536 (160 is the
// largest multiple of 8 with (65536 - 24*128) / 384 = 162.7). Consumer
// peak: O 32 + S BN/2 = 64 + P BN/4 = 32 fp32/b32 registers = 128, plus
// row_m/row_l/corr (6), addresses, loop state: fits 160 at BN = 128 (ptxas
// reports 0 spills; see harness build).
// Per-warpgroup schedule and numerics: exactly v2's (intra-warpgroup overlap:
// the softmax of S_n runs under O += P_{n-1} V_{n-1}; same per-tile
// arithmetic order, same helper functions), so each row's output is bit for
// bit v2's with the same BN -- except rows whose CTA does a causal kv tile
// that is fully masked for them (e.g. rows 0..63 of query tile 0 see the
// all-masked tile 1): that tile adds P = 0 (corr = 1, O += 0 * V), which
// leaves O and l unchanged unless O held -0 (sign of zero), so still equal in
// practice.
// Cross-warpgroup schedule (PP = true, the default, FA3's choice at d = 64):
// a 3-way rotation on named barriers 1, 2, 3 (0 is __syncthreads). Consumer
// c waits on bar 1+c (bar.sync, 256 = 128 waiting + 128 arriving threads)
// before issuing its GEMMs of a turn and arrives on bar 1+next(c) (bar.arrive,
// 256) after committing them, next(c) = (c+1) % 3. Each consumer has
// T = n_blocks + 1 turns (prologue S_0, n_blocks - 1 steady iterations,
// epilogue PV_last). Balance: bar 2 gets T arrivals from c0 and T syncs from
// c1; bar 3 gets T from c1 and T syncs from c2; bar 1 gets c2's initial
// arrive (gives c0 the first turn) + T - 1 (c2 skips its last pass: c0 has
// no turn left) = T arrivals and T syncs from c0. Turns are strictly
// c0, c1, c2, c0, ...: c's k-th sync can only complete after pred(c)'s k-th
// pass, which follows pred(c)'s k-th sync, so each barrier has at most one
// pending arrival and phases never mix. Inside a turn a consumer may wait on
// the V_{n-1} full barrier; the producer's load of V_{n-1} needs only
// releases from iterations <= n-STAGES+1 (earlier turns of every consumer),
// so holding the turn cannot deadlock (same argument as v2's, whose protocol
// model checked 2 consumers; the rotation only changes who goes next). As
// in v2, K_n is released after the softmax (v2_softmax_steady), which waits
// only on the consumer's own warpgroup (vote barrier 4 + c) and own GEMMs.
// PP = false: no named barriers at all; each consumer runs v2's per-warpgroup
// schedule independently (the harness times both).
// SKIP (the library's FwdV2W3Default since 2026-12-02; +2.6% / +3.5% at d = 64 s = 2k / 4k causal,
// +0.5-2% elsewhere, harness benchw3s on the H200): a warpgroup skips the key tiles its own rows
// never see. Every consumer runs the CTA's n_blocks, so a warpgroup whose 64
// rows lie wholly above a causal key tile, or wholly past s_q in the last 192-row query tile, spent
// a whole tile's S GEMM and exponentials on scores that only add P = 0: 10.2% of the consumer-tiles
// at s = 2k causal, 8.3% at 4k (docs/perf-notes.md, thirteenth session). With SKIP a warpgroup runs
// the steady iterations n < n_eff as before (n_eff: the key tiles its rows see, at least 1) and
// then, for n_eff <= n < n_blocks, iterations with no S_n and no softmax (the exponentials bound
// this kernel at d = 64), whose PV multiplies P = 0 (pa zeroed, corr = 1 after PV_{n_eff - 1}): exact
// zeros, as the full tiles added. The PV stays, and the skipping iterations are a loop of their own,
// because S or PV issued under a per-warpgroup condition inside the steady loop made ptxas serialise
// every wgmma of the kernel (C7518: a compiler-inserted warpgroup wait in a divergent path). Each
// iteration of either loop waits for its own wgmma groups, so none crosses from one loop to the
// other. Everything the protocol counts is kept: each turn's wait and pass on the rotation barriers
// (T = n_blocks + 1 turns, as above) and each K / V slot's full wait and empty arrival. Outputs
// bitwise equal to v2's, as without SKIP.
// Bounded mbarrier waits as in v2 (producer traps, consumers give up and
// report NaN lse).
#pragma once

#include "fwd_sm90_v2.cuh"

namespace fusedattn {
namespace hopper {

constexpr int kW3Threads = 512;                 // 4 warpgroups
constexpr int kW3Consumers = 3;                 // consumer warpgroups
constexpr int kW3ConsumerWarps = 4 * kW3Consumers;  // empty-barrier arrival count (12)
constexpr int kW3ProducerRegs = 24;
constexpr int kW3ConsumerRegs = 160;
static_assert(kW3ProducerRegs * 128 + kW3Consumers * kW3ConsumerRegs * 128 <= 65536, "setmaxnreg budget");
static_assert(kW3ConsumerRegs % 8 == 0 && kW3ProducerRegs % 8 == 0, "setmaxnreg granularity");
static_assert(kW3ConsumerRegs >= 65536 / kW3Threads && kW3ProducerRegs <= 65536 / kW3Threads, "inc / dec");

// ------------------------------------------------------------------ config
template <int BN_, int STAGES_, bool PP_, bool SKIP_ = false>
struct FwdV2W3Cfg {
  static constexpr int D = 64;
  static constexpr int BM = 64 * kW3Consumers, BN = BN_, STAGES = STAGES_;
  static constexpr bool PP = PP_, SKIP = SKIP_;
  static constexpr int kQBytes = BM * D * 2;  // 24 KB
  static constexpr int kKVBytes = BN * D * 2;
  static constexpr int kBarOffset = kQBytes + 2 * STAGES * kKVBytes;
  static constexpr int kBarBytes = 8 * (1 + 4 * STAGES);  // q, kf[], vf[], ke[], ve[]
  // + 1024 slack for aligning the dynamic smem base to the swizzle atom.
  static constexpr int kTotal = kBarOffset + ((kBarBytes + 127) / 128) * 128 + 1024;
  static_assert(BM <= 256, "TMA box rows");
  // Each consumer's 64-row slice of Q, and K/V slots, start on 1024-byte
  // swizzle atoms (8 rows x 128 B).
  static_assert((64 * 128) % 1024 == 0 && kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "swizzle atoms");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N / PV k-steps");
  static_assert(STAGES >= 2, "ring depth");
  static_assert(kTotal <= 232448, "dynamic shared memory (227 KB)");
};

struct FwdV2W3Default {
  static constexpr int BN = 128, STAGES = 4;  // smem 24 + 4 x 32 KB = 152 KB (+ barriers, slack)
  static constexpr bool PP = true, SKIP = true;
};

// ------------------------------------------------------- 3-way rotation
// Consumer c waits on bar 1+c and passes to bar 1+(c+1)%3. cw is uniform per
// warpgroup, so each branch is taken by whole warps.
constexpr int kW3RotBar = 1;  // ids 1, 2, 3
__device__ __forceinline__ void w3_wait_turn(int cw) {
  if (cw == 0)
    bar_sync_imm<kW3RotBar + 0, 256>();
  else if (cw == 1)
    bar_sync_imm<kW3RotBar + 1, 256>();
  else
    bar_sync_imm<kW3RotBar + 2, 256>();
}
__device__ __forceinline__ void w3_pass_turn(int cw) {
  if (cw == 0)
    bar_arrive_imm<kW3RotBar + 1, 256>();
  else if (cw == 1)
    bar_arrive_imm<kW3RotBar + 2, 256>();
  else
    bar_arrive_imm<kW3RotBar + 0, 256>();
}

// S = Q K^T for this warpgroup's 64 rows (D = 64: 4 k-steps, one 128-byte
// chunk). Q is one [192][64] swizzled chunk: rows 64*cw.. start at 64*cw*128
// bytes (a multiple of the 1024-byte atom). Same instructions as v2_issue_s.
template <int BN, bool F16>
__device__ __forceinline__ void w3_issue_s(float (&sacc)[BN / 2], uint32_t sQ, uint32_t sK, int cw) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t a_addr = sQ + cw * (64 * 128) + k * 32;
    const uint32_t b_addr = sK + k * 32;
    Wgmma<BN, F16>::ss(sacc, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
  }
}

// ------------------------------------------------- one query tile, one consumer
// Where one consumer warpgroup's pass over a 192-row query tile reads and signals, shared by the
// one-tile-per-CTA kernel below and the persistent one (fwd_sm90_w3p.cuh): the tile; its Q slot
// with the slot's full barrier and phase and, persistent only, its empty barrier; the K / V rings
// (slot 0's addresses; the barriers kf, vf, ke, ve follow each other, STAGES of each, from kf0)
// and the ring position of the tile's first key tile; whether it is the CTA's last tile.
struct W3TileIo {
  int m_blk, head, batch, n_blocks;
  uint32_t sQ, q_full, q_phase, q_empty;
  uint32_t sK0, sV0, kf0;
  uint32_t kv;
  bool last_tile;
};

// One consumer warpgroup's work on one tile, from Q's arrival to the stored rows: S_0 alone, the
// steady iterations S_n + PV_{n-1} under the 3-way rotation, SKIP's iterations, PV_last alone (the
// header above). sacc is the caller's, so the persistent kernel zeroes it once. PERSISTENT: the CTA
// runs several tiles, so the warpgroup arrives on the Q slot's empty barrier after its last S GEMM
// of the tile, and ring positions continue from io.kv (unsigned: they grow over the CTA's life);
// the one-tile kernel counts them from 0 in int, as it did before the two kernels shared this code
// (the unsigned form cost it 1-2.5% at s >= 4k causal, harness A/B of 2026-12-02). timed_out is
// sticky: a warp that gave up on a barrier reports NaN lse for this and later tiles and keeps every
// turn and arrival.
template <typename T, bool CAUSAL, class Cfg, bool PERSISTENT>
__device__ __forceinline__ void w3_consume_tile(const KParams& p, const W3TileIo& io, int cw,
                                                float (&sacc)[Cfg::BN / 2], bool& timed_out) {
  constexpr bool F16 = std::is_same<T, __half>::value;
  constexpr int D = 64, BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES;
  constexpr bool PP = Cfg::PP, SKIP = Cfg::SKIP;
  const auto kf = [&](uint32_t s) { return io.kf0 + 8u * s; };
  const auto vf = [&](uint32_t s) { return io.kf0 + 8u * (STAGES + s); };
  const auto ke = [&](uint32_t s) { return io.kf0 + 8u * (2 * STAGES + s); };
  const auto ve = [&](uint32_t s) { return io.kf0 + 8u * (3 * STAGES + s); };
  const int ltid = threadIdx.x & 127;
  const int warp = ltid / 32;
  const int lane = threadIdx.x & 31;
  const int qd = lane & 3;
  // This thread's two rows (accumulator fragment: row = 16*warp + lane/4 + 8*hf).
  const int row_base = io.m_blk * BM + cw * 64 + warp * 16 + (lane >> 2);
  const int wg_row0 = io.m_blk * BM + cw * 64;
  const int n_blocks = io.n_blocks;
  using Pos = std::conditional_t<PERSISTENT, uint32_t, int>;  // ring position
  const Pos kv = PERSISTENT ? static_cast<Pos>(io.kv) : Pos{0};
  const uint32_t sQ = io.sQ;
  const float sl2 = p.scale_log2;
  // SKIP: the key tiles this warpgroup's rows see, at least 1 (S_0 is always computed): causally up
  // to its last row below s_q (top-left, as n_blocks); 1 for rows wholly past s_q (not stored).
  int n_eff = n_blocks;
  if constexpr (SKIP) {
    if (wg_row0 >= p.s_q) {
      n_eff = 1;
    } else if (CAUSAL) {
      n_eff = min(n_blocks, min(wg_row0 + 63, p.s_q - 1) / BN + 1);
    }
  }

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  uint32_t pa[BN / 16][4];
  float row_m[2] = {-INFINITY, -INFINITY};  // running max, log2-scaled domain
  float row_l[2] = {0.f, 0.f};              // running sum (this thread's columns only)
  float corr[2] = {1.f, 1.f};               // O rescale owed to the last softmax

  auto wait_full = [&](uint32_t bar, uint32_t parity) {
    if (!timed_out) timed_out = !mbar_wait<false>(bar, parity);
  };
  wait_full(io.q_full, io.q_phase);

  // ------------------------------------------------ prologue: S_0 alone
  {
    const Pos s = kv % STAGES;
    wait_full(kf(s), (kv / STAGES) & 1u);
    __syncwarp();  // reconverge after the spins before the .aligned ops
    if (PP) w3_wait_turn(cw);
    v2_fence_f(sacc);
    wgmma_fence();
    w3_issue_s<BN, F16>(sacc, sQ, io.sK0 + s * Cfg::kKVBytes, cw);
    wgmma_commit();
    if (PP) w3_pass_turn(cw);
    wgmma_wait<0>();
    v2_fence_f(sacc);
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(ke(s));
      if (PERSISTENT && n_eff == 1) mbar_arrive(io.q_empty);  // S_0 was this warpgroup's last read of Q
    }
    v2_mask<BN, CAUSAL>(sacc, 0, p.s_q, p.s_kv, row_base, wg_row0, qd);
    v2_softmax<BN>(sacc, row_m, row_l, corr, sl2);  // corr = 0 here; O is still 0
    v2_pack_p<BN, F16>(pa, sacc);
  }

  // O += P_{n-1} V_{n-1} for the block before ring position it, in slot sp (the steady and SKIP
  // iterations): O rescaled for the tile first (no wgmma in flight has O as an operand), once
  // V_{n-1} has landed.
  auto issue_pv_prev = [&](Pos sp, uint32_t php) {
    v2_rescale_o<D>(o, corr);
    wait_full(vf(sp), php);
    __syncwarp();
    v2_commit_pv<D, BN, F16>(o, pa, io.sV0 + sp * Cfg::kKVBytes);
  };
  // That PV complete (its group the last in flight): O final for tile n-1, P_{n-1} free, V slot released.
  auto finish_pv_prev = [&](Pos sp) {
    wgmma_wait<0>();
    v2_fence_f(o);
    v2_fence_p(pa);
    __syncwarp();
    if (lane == 0) mbar_arrive(ve(sp));
  };

  // ------------------------------------------------ steady state
  for (int n = 1; n < n_eff; ++n) {
    const Pos it = kv + n;
    const Pos s = it % STAGES;
    const uint32_t ph = (it / STAGES) & 1u;
    const Pos sp = (it - 1) % STAGES;  // slot of block it - 1 (its V)
    const uint32_t php = ((it - 1) / STAGES) & 1u;

    wait_full(kf(s), ph);
    __syncwarp();
    if (PP) w3_wait_turn(cw);
    // group A: S_n
    v2_fence_f(sacc);
    wgmma_fence();
    w3_issue_s<BN, F16>(sacc, sQ, io.sK0 + s * Cfg::kKVBytes, cw);
    wgmma_commit();
    issue_pv_prev(sp, php);  // group B
    if (PP) w3_pass_turn(cw);

    wgmma_wait<1>();  // group A (S_n) complete; B may still run
    v2_fence_f(sacc);
    v2_softmax_steady<BN, kW3Consumers>(
        sacc, row_m, row_l, corr, sl2, cw,
        [&] { w3_issue_s<BN, F16>(sacc, sQ, io.sK0 + (warp_uniform_here(it) % STAGES) * Cfg::kKVBytes, cw); },
        [&] { v2_mask<BN, CAUSAL>(sacc, n, p.s_q, p.s_kv, row_base, wg_row0, qd); });
    __syncwarp();
    if (lane == 0) {  // only now: the softmax's slow path reads K_n and Q again
      mbar_arrive(ke(s));
      if (PERSISTENT && n == n_eff - 1) mbar_arrive(io.q_empty);  // this warpgroup's last S of the tile
    }
    // Pin the softmax before the wait (else it may sink past wait_group 0).
    v2_fence_f(sacc);
    reg_fence(row_l[0]);
    reg_fence(row_l[1]);

    finish_pv_prev(sp);  // group B
    v2_pack_p<BN, F16>(pa, sacc);
  }

  // ------------------------------------------------ SKIP: tiles this warpgroup's rows never see
  if constexpr (SKIP) {
    for (int n = n_eff; n < n_blocks; ++n) {
      const Pos it = kv + n;
      const Pos s = it % STAGES;
      const uint32_t ph = (it / STAGES) & 1u;
      const Pos sp = (it - 1) % STAGES;
      const uint32_t php = ((it - 1) / STAGES) & 1u;
      wait_full(kf(s), ph);  // K_n unused: waited so that the arrival below lands in its phase
      __syncwarp();
      if (PP) w3_wait_turn(cw);
      issue_pv_prev(sp, php);  // the last real tile's P in the first of these iterations, 0 after it
      if (PP) w3_pass_turn(cw);
      __syncwarp();
      if (lane == 0) mbar_arrive(ke(s));
      finish_pv_prev(sp);
#pragma unroll
      for (int t = 0; t < BN / 16; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) pa[t][i] = 0u;
      }
      corr[0] = corr[1] = 1.f;
    }
  }

  // ------------------------------------------------ PV_last alone
  {
    const Pos it = kv + n_blocks - 1;
    const Pos s = it % STAGES;
    wait_full(vf(s), (it / STAGES) & 1u);
    __syncwarp();
    if (PP) w3_wait_turn(cw);
    v2_rescale_o<D>(o, corr);
    v2_commit_pv<D, BN, F16>(o, pa, io.sV0 + s * Cfg::kKVBytes);
    // The last consumer's last turn of the CTA passes nothing: consumer 0 has no turn left.
    if (PP && !(cw == kW3Consumers - 1 && io.last_tile)) w3_pass_turn(cw);
    wgmma_wait<0>();
    v2_fence_f(o);
    __syncwarp();
    if (lane == 0) mbar_arrive(ve(s));  // the persistent producer's later loads wait on it
  }

  // ---------------------------------------------------------------- epilogue
  fwd_store_rows<T, D>(p, o, row_m, row_l, row_base, io.batch, io.head, qd, timed_out);
}

// ------------------------------------------------------------------- kernel
template <typename T, bool CAUSAL, int BN_, int STAGES_, bool PP_ = true, bool SKIP_ = false>
__global__ void __launch_bounds__(kW3Threads, 1)
    fwd_sm90_v2w3_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                         const __grid_constant__ CUtensorMap tmV, const KParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Cfg = FwdV2W3Cfg<BN_, STAGES_, PP_, SKIP_>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES;
  constexpr bool PP = Cfg::PP;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sQ = (sraw + 1023u) & ~1023u;
  const uint32_t sK0 = sQ + Cfg::kQBytes;
  const uint32_t sV0 = sK0 + STAGES * Cfg::kKVBytes;
  const FwdBars<STAGES> bars{sQ + Cfg::kBarOffset};

  const int tid = threadIdx.x;
  const int wg = warpgroup_index();
  const FwdOneTile tile = fwd_one_tile<CAUSAL, BM, BN>(p);
  const int m_blk = tile.m_blk, head = tile.head, batch = tile.batch;
  const int head_kv = tile.head_kv, n_blocks = tile.n_blocks;

  fwd_cta_start(bars, kW3ConsumerWarps, tmQ, tmK, tmV);

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    // v2's (one 192-row Q box, one 128-byte chunk per row).
    setmaxnreg_dec<kW3ProducerRegs>();
    if (tid == 0)
      v2_produce<64, BM, BN, STAGES>(
          FwdProducerArgs{&tmQ, &tmK, &tmV, sQ, sK0, sV0, m_blk, head, head_kv, batch, n_blocks}, bars);
    return;
  }

  // -------------------------------------------------------------- consumers
  setmaxnreg_inc<kW3ConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup 0..2: query rows [64*cw, 64*cw+64) of the tile
  // Rotation: the last consumer hands consumer 0 its first turn.
  if (PP && cw == kW3Consumers - 1) w3_pass_turn(cw);
  float sacc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) sacc[i] = 0.f;
  bool timed_out = false;
  const W3TileIo io{m_blk, head, batch, n_blocks, sQ, bars.q(), 0u, 0u, sK0, sV0, bars.kf(0), 0u, true};
  w3_consume_tile<T, CAUSAL, Cfg, false>(p, io, cw, sacc, timed_out);
#endif
}

// =================================================================== host
// Same contract as fwd_sm90_v2_prepare_cfg for D = 64; launch with
// fwd_sm90_v2w3_launch (512 threads), NOT fwd_sm90_launch (384).
template <typename T, int BN, int STAGES, bool PP = true, bool SKIP = false>
inline cudaError_t fwd_sm90_v2w3_prepare_cfg(FwdLaunch* L, const Sm90Args& a) {
  using Cfg = FwdV2W3Cfg<BN, STAGES, PP, SKIP>;
  const cudaError_t e = detail::one_tile_prepare<T>(L, a, Cfg::D, Cfg::BM, Cfg::BN, Cfg::kTotal);
  if (e != cudaSuccess) return e;
  L->kern = a.causal ? fwd_sm90_v2w3_kernel<T, true, BN, STAGES, PP, SKIP>
                     : fwd_sm90_v2w3_kernel<T, false, BN, STAGES, PP, SKIP>;
  static std::atomic<uint64_t> raised[2];  // per instantiation of this function: causal or not
  return detail::raise_smem_limit(reinterpret_cast<const void*>(L->kern), L->smem, raised[a.causal ? 1 : 0]);
}

template <typename T>
inline cudaError_t fwd_sm90_v2w3_prepare(FwdLaunch* L, const Sm90Args& a) {
  using C = FwdV2W3Default;
  return fwd_sm90_v2w3_prepare_cfg<T, C::BN, C::STAGES, C::PP, C::SKIP>(L, a);
}

inline cudaError_t fwd_sm90_v2w3_launch(const FwdLaunch& L, cudaStream_t stream = 0) {
  L.kern<<<L.grid, dim3(kW3Threads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.p);
  return cudaGetLastError();
}

}  // namespace hopper
}  // namespace fusedattn
