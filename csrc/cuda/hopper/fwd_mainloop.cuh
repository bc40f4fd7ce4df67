// The forward's mainloop roles: the producer thread's TMA loads into the Q slots and the K / V
// rings, and a consumer warpgroup's pass over one work tile (S = Q K^T, mask, online softmax,
// O += P V, epilogue). fwd_kernel.cuh composes them with a tile scheduler.
//
// Waits are bounded (mbar_wait): the producer traps; a consumer thread that gave up skips its later
// waits but keeps every turn and arrival, and reports it at the end of the CTA (fwd_kernel.cuh:
// ptx_sm90.cuh's timeout_vote, on which the producer's first warp traps), so the launch fails
// instead of returning numbers from stale shared memory.
#pragma once

#include "epilogue.cuh"
#include "mask.cuh"
#include "ptx_sm90.cuh"
#include "softmax.cuh"
#include "tile_scheduler.cuh"
#include "wgmma.cuh"

namespace fusedattn {
namespace hopper {

// Rings: K and V have separate full barriers (one arrival plus the TMA transaction bytes) and empty
// barriers (one arrival per consumer warp), STAGES slots each, so a K slot is refilled once its S
// GEMM is done in every consumer while the V of the same tile may still be read. Ring positions
// count key tiles (Sched::Pos; a persistent CTA counts over its whole life, so nothing is
// re-initialised between tiles): slot it % STAGES, phase (it / STAGES) & 1. Q has QBUF slots; a
// persistent kernel's consumers release a slot after their last S GEMM of the tile (or once Q is in
// registers), and its producer waits for that before loading the next tile's Q into it.
//
// The mbarriers, eight bytes each from bar0: qf[QBUF], qe[QBUF] (Q_EMPTY only), kf[STAGES],
// vf[STAGES], ke[STAGES], ve[STAGES].
template <int QBUF, int STAGES, bool Q_EMPTY>
struct FwdBarriers {
  static constexpr int kQBars = Q_EMPTY ? 2 * QBUF : QBUF;
  static constexpr int kCount = kQBars + 4 * STAGES;
  uint32_t bar0;
  __device__ __forceinline__ uint32_t qf(uint32_t s) const { return bar0 + 8u * s; }           // Q full (tx)
  __device__ __forceinline__ uint32_t qe(uint32_t s) const { return bar0 + 8u * (QBUF + s); }  // Q empty
  __device__ __forceinline__ uint32_t kf(uint32_t s) const { return bar0 + 8u * (kQBars + s); }
  __device__ __forceinline__ uint32_t vf(uint32_t s) const { return bar0 + 8u * (kQBars + STAGES + s); }
  __device__ __forceinline__ uint32_t ke(uint32_t s) const { return bar0 + 8u * (kQBars + 2 * STAGES + s); }
  __device__ __forceinline__ uint32_t ve(uint32_t s) const { return bar0 + 8u * (kQBars + 3 * STAGES + s); }
  // One thread, before the block's first __syncthreads.
  __device__ __forceinline__ void init(int consumer_warps) const {
    for (int s = 0; s < QBUF; ++s) {
      mbar_init(qf(s), 1);
      if (Q_EMPTY) mbar_init(qe(s), consumer_warps);
    }
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(kf(s), 1);
      mbar_init(vf(s), 1);
      mbar_init(ke(s), consumer_warps);
      mbar_init(ve(s), consumer_warps);
    }
    mbar_fence_init();
  }
};

// ------------------------------------------------------------------ producer
// Producer order per tile: Q, K_0 (a one-tile CTA's Q slot is always free), or K_0, Q (persistent:
// K_0's slot frees as soon as an earlier S GEMM is done, Q's only after the previous tile's last
// S); then per key tile n: K_{n+1}, V_n. Consumer iteration n needs K_n and V_{n-1}, both earlier in
// this order, and its releases never wait on a later load: between the S wait and the K release a
// consumer waits only on its own warpgroup (the vote) and its own GEMMs. So no wait cycle
// (tools/hopper's protocol models check it).
//
// Where the producer loads: the tensor maps and the slots' first addresses.
struct FwdProducerIo {
  const CUtensorMap *tmQ, *tmK, *tmV;
  uint32_t sQ0, sK0, sV0;
};

// One work tile's loads (the order in the header; key tile n of the work is the mask's w.n_first + n);
// kv: the ring position of its first key tile, j:
// the CTA's local tile index (Q slot j % QBUF). QW / 64 (V: VW / 64) boxes of 128-byte rows per load; BM-row Q
// boxes (rows past s_q are zero-filled and still counted in the transaction bytes), BN-row K / V.
template <class K, class Bars>
__device__ __forceinline__ void produce_tile(const FwdProducerIo& a, const Bars& bars, const FwdWork& w,
                                             typename K::Pos kv, uint32_t j) {
  using Pos = typename K::Pos;
  constexpr int BM = K::BM, BN = K::BN, STAGES = K::STAGES, QBUF = K::QBUF;
  constexpr int QCH = K::QW / 64, VCH = K::VW / 64;  // 128-byte chunks per row of Q / K and of V
  constexpr uint32_t kQBytes = K::kQBytes, kKBytes = K::kKBytes, kVBytes = K::kVBytes;
  auto load_k = [&](int n) {
    const Pos it = kv + n;
    const Pos s = it % STAGES;
    mbar_wait<true>(bars.ke(s), ((it / STAGES) & 1u) ^ 1u);  // fresh barrier: parity 1 passes at once
    mbar_arrive_expect_tx(bars.kf(s), kKBytes);
#pragma unroll
    for (int c = 0; c < QCH; ++c)
      tma_load_4d(a.sK0 + s * kKBytes + c * BN * 128, a.tmK, bars.kf(s), c * 64, w.head_kv, (w.n_first + n) * BN,
                  w.batch);
  };
  auto load_v = [&](int n) {
    const Pos it = kv + n;
    const Pos s = it % STAGES;
    mbar_wait<true>(bars.ve(s), ((it / STAGES) & 1u) ^ 1u);
    mbar_arrive_expect_tx(bars.vf(s), kVBytes);
#pragma unroll
    for (int c = 0; c < VCH; ++c)
      tma_load_4d(a.sV0 + s * kVBytes + c * BN * 128, a.tmV, bars.vf(s), c * 64, w.head_kv, (w.n_first + n) * BN,
                  w.batch);
  };
  // Tensor-map dims are (d, h, s, b): coordinates (d0, head, seq, batch).
  auto load_q = [&] {
    const uint32_t qs = j % QBUF;
    if (K::Q_EMPTY) mbar_wait<true>(bars.qe(qs), ((j / QBUF) & 1u) ^ 1u);
    mbar_arrive_expect_tx(bars.qf(qs), kQBytes);
#pragma unroll
    for (int c = 0; c < QCH; ++c)
      tma_load_4d(a.sQ0 + qs * kQBytes + c * BM * 128, a.tmQ, bars.qf(qs), c * 64, w.head, w.m_blk * BM, w.batch);
  };
  if (!K::Q_EMPTY) load_q();
  load_k(0);
  if (K::Q_EMPTY) load_q();
  for (int n = 0; n < w.n_blocks; ++n) {
    if (n + 1 < w.n_blocks) load_k(n + 1);
    load_v(n);
  }
}

// ------------------------------------------------------------------ consumer
// A consumer warpgroup owns 64 query rows. Per tile: S_0 alone (first_step); then per n >= 1 in its
// turn S_n and O += P_{n-1} V_{n-1} as two wgmma groups, S_n's softmax on the CUDA cores while the
// PV group runs (steady_step); then PV_last alone (last_step). With PP the consumer warpgroups take
// turns to issue their GEMMs (a rotation on named barriers 1..NCONS: consumer c waits on 1 + c and
// passes to 1 + (c + 1) % NCONS), so one's softmax runs under the others' GEMMs. The turns form one
// sequence over the CTA's life: each consumer takes n_blocks + 1 turns per tile, the last consumer
// hands consumer 0 the first turn and skips the pass of its very last turn, so every barrier ends
// balanced with at most one pending arrival.
//
// The turn rotation's named barriers 1..NCONS (0 is __syncthreads). cw is uniform per warpgroup,
// so each branch is taken by whole warps; immediate ids let ptxas count the barriers.
template <int NCONS>
__device__ __forceinline__ void wait_turn(int cw) {
  if (cw == 0)
    bar_sync_imm<1, 256>();
  else if (NCONS == 2 || cw == 1)
    bar_sync_imm<2, 256>();
  else
    bar_sync_imm<3, 256>();
}
template <int NCONS>
__device__ __forceinline__ void pass_turn(int cw) {
  if (cw == 0)
    bar_arrive_imm<2, 256>();
  else if (NCONS == 3 && cw == 1)
    bar_arrive_imm<3, 256>();
  else
    bar_arrive_imm<1, 256>();
}

// S = Q K^T for this warpgroup's 64 rows: QKW / 16 k-steps, K-major A and B. Q from shared memory
// (chunks of BM rows), or from registers (qa: load_q_frags) when QREG.
template <class K, int QK>
__device__ __forceinline__ void issue_s(float (&sacc)[K::BN / 2], const uint32_t (&qa)[QK][4], uint32_t sQ,
                                       uint32_t sK, int cw) {
  constexpr int BM = K::BM, BN = K::BN;
#pragma unroll
  for (int k = 0; k < K::QKW / 16; ++k) {
    if constexpr (K::QREG) {
      static_assert(QK == K::QKW / 16, "one A fragment per k-step");
      const uint32_t b_addr = sK + (k / 4) * (BN * 128) + (k % 4) * 32;
      Wgmma<BN, K::F16>::rs_k(sacc, qa[k], make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
    } else {
      const uint32_t a_addr = sQ + (k / 4) * (BM * 128) + cw * (64 * 128) + (k % 4) * 32;
      const uint32_t b_addr = sK + (k / 4) * (BN * 128) + (k % 4) * 32;
      Wgmma<BN, K::F16>::ss(sacc, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
    }
  }
}

// This warpgroup's Q rows as A fragments, k-step k < D / 16 in qa[k], from the 128-byte-swizzled Q
// tile (chunks of [BM rows][64], 16-byte unit u of row r at unit u ^ (r % 8)). Lane l reads row l % 8
// (+ 8 for the matrices 1 and 3) and 16-byte unit 2 (k % 4) + l / 16 of its chunk.
template <int D, int BM>
__device__ __forceinline__ void load_q_frags(uint32_t (&qa)[D / 16][4], uint32_t sQ, int cw, int warp, int lane) {
  const int r8 = lane & 7;
  const int row = cw * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + r8;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    const int unit = (k % 4) * 2 + (lane >> 4);
    ldmatrix_x4(qa[k], sQ + (k / 4) * (BM * 128) + row * 128 + ((unit ^ r8) << 4));
  }
}

// O += P V as one committed wgmma group, its register operands O and P fenced first: BN / 16
// k-steps of 16 keys, V MN-major (d chunks BN * 128 bytes apart).
template <class K>
__device__ __forceinline__ void commit_pv(float (&o)[K::VW / 2], uint32_t (&pa)[K::BN / 16][4], uint32_t sV) {
  fence_regs(o);
  fence_regs(pa);
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < K::BN / 16; ++t)
    Wgmma<K::VW, K::F16>::rs(o, pa[t], make_smem_desc(sV + t * (16 * 128), K::BN * 128, 1024), 1);
  wgmma_commit();
}

// A consumer warpgroup's registers for one tile, by reference: S_n's accumulators, O, P as A
// fragments, and the two rows' running max, sum and owed rescale.
template <class K>
struct FwdRegs {
  float (&sacc)[K::BN / 2];
  float (&o)[K::VW / 2];
  uint32_t (&pa)[K::BN / 16][4];
  float (&row_m)[2];
  float (&row_l)[2];
  float (&corr)[2];
};

// Where a step's tiles are: K_n's ring position and the K / V ring bases; the warpgroup and lane.
template <class K>
struct FwdStep {
  typename K::Pos it;
  uint32_t sK0, sV0;
  int cw, lane;
  float sl2;
};

// The first key tile of a work tile: S_0 alone in this warpgroup's turn, K_0 released once it
// completed, its softmax (no max to keep yet) and P_0 packed. Hooks: wait_full(bar, parity) (the
// bounded wait), issue_s(sK) (S against the K tile at sK; also the steady slow path's reissue),
// mask() (the tile's mask), k_released() (lane 0, after the K release: a persistent kernel frees
// its Q slot after the tile's last S GEMM).
template <class K, class Bars, class WaitFull, class IssueS, class Mask, class KReleased>
__device__ __forceinline__ void first_step(const FwdStep<K>& st, const Bars& bars, const FwdRegs<K>& r,
                                           WaitFull&& wait_full, IssueS&& issue_s, Mask&& mask,
                                           KReleased&& k_released) {
  const auto s = st.it % K::STAGES;
  wait_full(bars.kf(s), (st.it / K::STAGES) & 1u);
  __syncwarp();  // reconverge after the spins before the .aligned ops
  if (K::PP) wait_turn<K::NCONS>(st.cw);
  fence_regs(r.sacc);
  wgmma_fence();
  issue_s(st.sK0 + s * K::kKBytes);
  wgmma_commit();
  if (K::PP) pass_turn<K::NCONS>(st.cw);
  wgmma_wait<0>();
  fence_regs(r.sacc);
  __syncwarp();
  if (st.lane == 0) {
    mbar_arrive(bars.ke(s));
    k_released();
  }
  mask();
  softmax_update<K::BN>(r.sacc, r.row_m, r.row_l, r.corr, st.sl2);  // corr = 0 here; O is still 0
  pack_p<K::BN, K::F16>(r.pa, r.sacc);
}

// One steady iteration n >= 1: in this warpgroup's turn S_n (group A) and O += P_{n-1} V_{n-1}
// (group B); S_n's softmax while B runs; K_n released after it (the slow path reads K_n again),
// V_{n-1} after B; then P_n packed (only now: P_{n-1} was an operand of B). Hooks as in first_step.
template <class K, class Bars, class WaitFull, class IssueS, class Mask, class KReleased>
__device__ __forceinline__ void steady_step(const FwdStep<K>& st, const Bars& bars, const FwdRegs<K>& r,
                                            WaitFull&& wait_full, IssueS&& issue_s, Mask&& mask,
                                            KReleased&& k_released) {
  using Pos = typename K::Pos;
  constexpr int STAGES = K::STAGES;
  const Pos s = st.it % STAGES;
  const uint32_t ph = (st.it / STAGES) & 1u;
  const Pos sp = (st.it - 1) % STAGES;  // slot of tile n-1 (its V)
  const uint32_t php = ((st.it - 1) / STAGES) & 1u;

  wait_full(bars.kf(s), ph);
  __syncwarp();
  if (K::PP) wait_turn<K::NCONS>(st.cw);
  fence_regs(r.sacc);
  wgmma_fence();
  issue_s(st.sK0 + s * K::kKBytes);
  wgmma_commit();
  // O is not an operand of any wgmma in flight: rescale it for tile n-1.
  rescale_o<K::VW>(r.o, r.corr);
  wait_full(bars.vf(sp), php);
  __syncwarp();
  commit_pv<K>(r.o, r.pa, st.sV0 + sp * K::kVBytes);
  if (K::PP) pass_turn<K::NCONS>(st.cw);

  wgmma_wait<1>();  // group A (S_n) complete; B may still run
  fence_regs(r.sacc);
  softmax_steady<K::BN, K::NCONS>(
      r.sacc, r.row_m, r.row_l, r.corr, st.sl2, st.cw,
      [&] { issue_s(st.sK0 + (warp_uniform_here(st.it) % STAGES) * K::kKBytes); }, mask);
  __syncwarp();
  if (st.lane == 0) {
    mbar_arrive(bars.ke(s));
    k_released();
  }
  // Pin the softmax before the wait (else the compiler may sink it past wait_group 0 and the
  // overlap with PV_{n-1} is lost).
  fence_regs(r.sacc);
  reg_fence(r.row_l[0]);
  reg_fence(r.row_l[1]);

  wgmma_wait<0>();  // group B complete: O final for tile n-1, P_{n-1} free
  fence_regs(r.o);
  fence_regs(r.pa);
  __syncwarp();
  if (st.lane == 0) mbar_arrive(bars.ve(sp));
  pack_p<K::BN, K::F16>(r.pa, r.sacc);
}

// A key tile this warpgroup's rows never see (SKIP: every consumer runs the CTA's n_blocks, so a
// warpgroup whose rows lie wholly above a causal key tile, or past s_q, would spend a whole S GEMM
// and its exponentials on P = 0). It keeps the iteration's turn, K_n's wait and release and the
// PV of the previous tile: the last real tile's P in the first of these, zeros after it (pa zeroed,
// corr = 1), exact zeros as the full tiles added. A loop of its own: S or PV issued under a
// per-warpgroup condition inside the steady loop made ptxas serialise every wgmma of the kernel.
template <class K, class Bars, class WaitFull>
__device__ __forceinline__ void skip_step(const FwdStep<K>& st, const Bars& bars, const FwdRegs<K>& r,
                                          WaitFull&& wait_full) {
  using Pos = typename K::Pos;
  constexpr int STAGES = K::STAGES;
  const Pos s = st.it % STAGES;
  const uint32_t ph = (st.it / STAGES) & 1u;
  const Pos sp = (st.it - 1) % STAGES;
  const uint32_t php = ((st.it - 1) / STAGES) & 1u;
  wait_full(bars.kf(s), ph);  // K_n unused: waited so that the arrival below lands in its phase
  __syncwarp();
  if (K::PP) wait_turn<K::NCONS>(st.cw);
  rescale_o<K::VW>(r.o, r.corr);
  wait_full(bars.vf(sp), php);
  __syncwarp();
  commit_pv<K>(r.o, r.pa, st.sV0 + sp * K::kVBytes);
  if (K::PP) pass_turn<K::NCONS>(st.cw);
  __syncwarp();
  if (st.lane == 0) mbar_arrive(bars.ke(s));
  wgmma_wait<0>();
  fence_regs(r.o);
  fence_regs(r.pa);
  __syncwarp();
  if (st.lane == 0) mbar_arrive(bars.ve(sp));
#pragma unroll
  for (int t = 0; t < K::BN / 16; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) r.pa[t][i] = 0u;
  }
  r.corr[0] = r.corr[1] = 1.f;
}

// The last iteration: O += P_last V_last alone in this warpgroup's turn (st.it: V_last's ring
// position), passing the turn on only when pass_turn (some consumer has a turn left). V_last's
// release: a persistent producer's later loads wait on it.
template <class K, class Bars, class WaitFull>
__device__ __forceinline__ void last_step(const FwdStep<K>& st, const Bars& bars, const FwdRegs<K>& r,
                                          WaitFull&& wait_full, bool pass) {
  const auto s = st.it % K::STAGES;
  wait_full(bars.vf(s), (st.it / K::STAGES) & 1u);
  __syncwarp();
  if (K::PP) wait_turn<K::NCONS>(st.cw);
  rescale_o<K::VW>(r.o, r.corr);
  commit_pv<K>(r.o, r.pa, st.sV0 + s * K::kVBytes);
  if (K::PP && pass) pass_turn<K::NCONS>(st.cw);
  wgmma_wait<0>();
  fence_regs(r.o);
  __syncwarp();
  if (st.lane == 0) mbar_arrive(bars.ve(s));
}

// A consumer thread's place: its warpgroup cw (query rows [64 cw, 64 cw + 64) of each tile), warp,
// lane, quad lane qd, and its first row (accumulator fragment rows 16 warp + lane / 4 and + 8 of
// the warpgroup's slice; relative to the tile for a persistent CTA); o_vec16: nonzero when O's rows
// start on 16-byte boundaries (fwd_store_rows's vector stores).
struct ConsumerThread {
  int cw, warp, lane, qd, row0;
  uint32_t o_vec16;
};

// Where one consumer warpgroup's pass over a tile reads: the Q slot (address, full barrier and
// phase, empty barrier), the K / V ring bases, the ring position kv of the tile's first key tile,
// and (two consumers) the thread's first row and its warpgroup's first row in the tile.
template <class K>
struct FwdConsumerIo {
  uint32_t sQ, q_full, q_phase, q_empty;
  uint32_t sK0, sV0;
  typename K::Pos kv;
  int row_base, wg_row0;
};

// One consumer warpgroup's work on one tile, from Q's arrival to the stored rows. sacc is the
// caller's (zeroed once: the first k-step of every S GEMM ignores the old value). last_tile: the
// CTA's last tile, whose last turn the last consumer does not pass on.
template <class K, class Bars>
__device__ __forceinline__ void consume_tile(const KParams& p, const typename K::Mask& call_mask, const FwdWork& w,
                                             const FwdConsumerIo<K>& io, const Bars& bars, const ConsumerThread& th,
                                             float (&sacc)[K::BN / 2], bool& timed_out, bool last_tile) {
  using Pos = typename K::Pos;
  constexpr int BM = K::BM, BN = K::BN, VW = K::VW;
  // The thread's rows: two consumers take them from the CTA start (th, io); three consumers (160
  // registers a thread) derive them again per tile rather than hold them across the tile loop.
  constexpr bool kHeld = K::kRowsHeld;
  const int cw = th.cw;
  const int warp = kHeld ? th.warp : (threadIdx.x & 127) / 32;
  const int lane = kHeld ? th.lane : threadIdx.x & 31;
  const int qd = kHeld ? th.qd : lane & 3;
  const int row_base = kHeld ? io.row_base : w.m_blk * BM + cw * 64 + warp * 16 + (lane >> 2);
  const int wg_row0 = kHeld ? io.wg_row0 : w.m_blk * BM + cw * 64;
  const int n_blocks = w.n_blocks;
  const float sl2 = K::SOFTCAP ? p.softcap_log2 : p.scale_log2;  // softcap_scores's scale
  // Varlen: the rule on the tile's sequence.
  const typename K::Mask mask = [&] {
    if constexpr (K::VARLEN) return call_mask.seq(w.len_q, w.len_kv);
    return call_mask;
  }();
  // The key tiles this warpgroup's rows see (SKIP), at least 1: S_0 is always computed.
  const int n_eff = K::SKIP ? mask.template n_key_tiles_of_rows<BN>(wg_row0, n_blocks) : n_blocks;

  float o[VW / 2];
#pragma unroll
  for (int i = 0; i < VW / 2; ++i) o[i] = 0.f;
  uint32_t pa[BN / 16][4];
  uint32_t qa[K::QREG ? K::QKW / 16 : 1][4];
  float row_m[2] = {-INFINITY, -INFINITY};  // running max, log2-scaled domain
  float row_l[2] = {0.f, 0.f};              // running sum (this thread's columns only)
  float corr[2] = {1.f, 1.f};               // O rescale owed to the last softmax

  // After the first give-up a warp skips every later wait (garbage, but the CTA ends in about one
  // watchdog period instead of one per tile).
  auto wait_full = [&](uint32_t bar, uint32_t parity) {
    if (!timed_out) timed_out = !mbar_wait<false>(bar, parity);
  };
  wait_full(io.q_full, io.q_phase);
  if constexpr (K::QREG) {
    // Q lives in registers from here, so its slot is free at once: the producer can issue the next
    // tile's Q a whole tile earlier than after this tile's last S GEMM.
    __syncwarp();
    load_q_frags<K::QKW, BM>(qa, io.sQ, cw, warp, lane);
    __syncwarp();
    if (lane == 0) mbar_arrive(io.q_empty);
  }
  // The persistent kernels' Q slot is free after this warpgroup's last S GEMM of the tile.
  const auto q_released = [&](int n) {
    if (K::Q_EMPTY && !K::QREG && n == n_eff - 1) mbar_arrive(io.q_empty);
  };

  const FwdRegs<K> regs{sacc, o, pa, row_m, row_l, corr};
  const auto issue = [&](uint32_t sK) { issue_s<K>(sacc, qa, io.sQ, sK, cw); };
  const auto step = [&](Pos it) { return FwdStep<K>{it, io.sK0, io.sV0, cw, lane, sl2}; };
  // A tile's scores before its softmax: capped (SOFTCAP), then masked.
  const auto cap_and_mask = [&](int n) {
    if constexpr (K::SOFTCAP) softcap_scores(sacc, p.softcap_k2);
    mask.template apply<BN>(sacc, w.n_first + n, row_base, wg_row0, qd);
  };
  first_step<K>(
      step(io.kv), bars, regs, wait_full, issue, [&] { cap_and_mask(0); }, [&] { q_released(0); });
  for (int n = 1; n < n_eff; ++n)
    steady_step<K>(
        step(io.kv + n), bars, regs, wait_full, issue, [&] { cap_and_mask(n); }, [&] { q_released(n); });
  if constexpr (K::SKIP) {
    for (int n = n_eff; n < n_blocks; ++n) skip_step<K>(step(io.kv + n), bars, regs, wait_full);
  }
  // The CTA's very last turn (the last consumer's, on the last tile) passes nothing; the one-tile
  // two-consumer form of that test (cw == 0) lets ptxas keep a single predicated bar.arrive.
  const bool pass = K::NCONS == 2 && !K::kPersistent ? cw == 0 : !(cw == K::NCONS - 1 && last_tile);
  last_step<K>(step(io.kv + n_blocks - 1), bars, regs, wait_full, pass);
  // The rows to store: the sequence's (varlen: from its first token), else the call's s_q.
  OutRows rows{0, p.s_q};
  if constexpr (K::VARLEN) rows = OutRows{gpu::seq_span(p.seq, w.batch).tok_q, w.len_q};
  const OutCoords at = K::Scheduler::out_coords(w, p);
  fwd_store_rows<typename K::T, VW, K::DV, K::GENERAL, K::VARLEN>(p, o, row_m, row_l, row_base, at.batch, at.head, qd,
                                                                  rows, th.o_vec16 != 0);
}

}  // namespace hopper
}  // namespace fusedattn
