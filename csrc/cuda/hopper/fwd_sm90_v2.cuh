// Hopper (sm_90a) FlashAttention forward, variant 2 ("v2"), the library's
// Hopper forward (fwd_sm90<T, D> at the end of this file, called by sm90.cu):
// the v1 kernel of fwd_sm90.cuh (same inputs, outputs, numerics, launch shape
// and host plumbing: KParams, Sm90Args, FwdLaunch, fwd_sm90_launch) with the
// FlashAttention-3 overlaps added. Measured on the H200 (harness bench2, same
// inputs): 1.00-1.14x v1 at d = 64/128 and s >= 1k, up to 680 TFLOP/s at
// d = 128; v1 stays as the harness's simpler baseline (HDIFF compares them).
//
// CTA = 3 warpgroups (384 threads), one CTA per (128-row query tile, head, batch):
//   WG0  producer (setmaxnreg.dec 24), one thread: Q and K_0, then per kv
//        tile n: K_{n+1}, V_n into a STAGES-deep ring. K and V have SEPARATE
//        full and empty barriers (kf/vf: complete_tx; ke/ve: 8 consumer-warp
//        arrivals), so a K slot is refilled once its S GEMM is done in both
//        consumers, while the V of the same tile may still be read.
//   WG1, WG2 consumers (setmaxnreg.inc 240), 64 query rows each.
//
// (1) Intra-warpgroup pipelining. Per consumer, with P_{n-1} already in
//     registers (16-bit A fragments) and corr_{n-1} its rescale factor:
//        [turn]  issue S_n = Q K_n^T (SS)            commit  -> group A
//                O *= corr_{n-1}      (O is idle: PV_{n-2} was waited)
//                issue O += P_{n-1} V_{n-1} (RS)     commit  -> group B
//        [pass]  wait_group 1  -> S_n done (B may still run)
//                mask + online softmax of S_n (fp32, in place) -> corr_n;
//                rarely S_n again first (v2_softmax_steady); release K_n
//                wait_group 0  -> PV_{n-1} done; release V_{n-1}
//                P_n = pack(S_n)  (only now: P_{n-1} was an operand of B)
//     so the softmax of tile n runs on the CUDA cores while the tensor cores
//     do PV_{n-1}. Prologue: S_0 alone; epilogue: PV_{last} alone. Registers
//     live at the peak: O (D/2) + S (BN/2) + P (BN/4) per thread.
// (2) Ping-pong (PP): [turn] / [pass] above are named barriers, ids 1 and 2
//     (0 is __syncthreads): consumer c waits on bar 1+c (bar.sync, 256
//     threads) before issuing its GEMMs and arrives on the other consumer's
//     bar (bar.arrive, 256) after committing them, so the two warpgroups
//     issue strictly alternately and one's softmax runs under the other's
//     GEMMs. Consumer 1 arrives on bar 1 once at the start (consumer 0 goes
//     first) and skips its very last arrive, so both barriers end balanced:
//     each consumer has n_blocks + 1 turns.
// (3) STAGES (ring depth) and BN are template parameters; FwdV2Default<D>
//     picks the defaults (d=64: 128/4, d=128: 128/3, d=256: 80/2 with PP for
//     causal calls only); the harness sweep times the alternatives.
// Bounded mbarrier waits as in v1 (producer traps, consumers give up and
// report NaN lse), so a pipeline bug cannot hang the GPU; a consumer warp
// that gave up once skips its later waits. The named barriers are not
// bounded: they rely on both consumers taking exactly n_blocks + 1 turns,
// which holds whatever the data (no early exits).
#pragma once

#include "fwd_sm90.cuh"
#include "wgmma.cuh"

namespace fusedattn {
namespace hopper {

// Ping-pong ids: consumer 0 waits on 1, consumer 1 on 2 (0 is __syncthreads).
constexpr int kV2PingPongBar = 1;
// cw is uniform per warpgroup, so each branch is taken by whole warps.
__device__ __forceinline__ void v2_pp_wait_turn(int cw) {
  if (cw == 0)
    bar_sync_imm<kV2PingPongBar + 0, 256>();
  else
    bar_sync_imm<kV2PingPongBar + 1, 256>();
}
__device__ __forceinline__ void v2_pp_pass_turn(int cw) {
  if (cw == 0)
    bar_arrive_imm<kV2PingPongBar + 1, 256>();
  else
    bar_arrive_imm<kV2PingPongBar + 0, 256>();
}

// ------------------------------------------------------------------ config
// Bytes of one K or V ring slot (BN rows of D 16-bit elements): the ring stride of v2, v3 and the step helpers.
template <int D, int BN>
constexpr int kV2KVBytes = BN * D * 2;

template <int D, int BN_, int STAGES_, bool PP_>
struct FwdV2Cfg {
  static constexpr int BM = 128, BN = BN_, STAGES = STAGES_;
  static constexpr bool PP = PP_;
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kKVBytes = kV2KVBytes<D, BN>;
  static constexpr int kBarOffset = kQBytes + 2 * STAGES * kKVBytes;
  static constexpr int kBarBytes = 8 * (1 + 4 * STAGES);  // q, kf[], vf[], ke[], ve[]
  // + 1024 slack for aligning the dynamic smem base to the swizzle atom.
  static constexpr int kTotal = kBarOffset + ((kBarBytes + 127) / 128) * 128 + 1024;
  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N / PV k-steps");
  // Every [BN][64] chunk must start on a 1024-byte swizzle atom.
  static_assert((BN * 128) % 1024 == 0, "BN multiple of 8");
  static_assert(STAGES >= 2, "ring depth");  // one slot would expose every load's latency
  static_assert(kTotal <= 232448, "dynamic shared memory (227 KB)");
};

// PP: the ping-pong of non-causal calls; PP_CAUSAL: of causal ones (their kernels are separate
// instantiations anyway, so the two can differ at no cost).
template <int D>
struct FwdV2Default;
template <>
struct FwdV2Default<64> {
  static constexpr int BN = 128, STAGES = 4;
  static constexpr bool PP = true, PP_CAUSAL = true;
};
template <>
struct FwdV2Default<128> {
  static constexpr int BN = 128, STAGES = 3;
  static constexpr bool PP = true, PP_CAUSAL = true;
};
// d = 256: without the ping-pong non-causal (FA3's choice: harness sweep2, 2026-12-01, s = 2k-8k
// 615 / 671 / 706 TFLOP/s against 613 / 658 / 690 with it; 16k 685 / 706), with it causal (+6-7% at
// every s from 2k to 16k: 472 -> 506, 559 -> 599, 624 -> 667, 714 -> 759; the causal tiles' masked
// diagonal work lengthens the softmax, which the ping-pong hides under the other warpgroup's GEMMs).
template <>
struct FwdV2Default<256> {
  static constexpr int BN = 80, STAGES = 2;
  static constexpr bool PP = false, PP_CAUSAL = true;
};

// ------------------------------------------------------------ consumer pieces
// S = Q K^T for this warpgroup's 64 rows: D/16 k-steps, K-major A and B.
template <int D, int BN, bool F16>
__device__ __forceinline__ void v2_issue_s(float (&sacc)[BN / 2], uint32_t sQ, uint32_t sK, int cw) {
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    const uint32_t a_addr = sQ + (k / 4) * (128 * 128) + cw * (64 * 128) + (k % 4) * 32;
    const uint32_t b_addr = sK + (k / 4) * (BN * 128) + (k % 4) * 32;
    Wgmma<BN, F16>::ss(sacc, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
  }
}

// Q in registers for the S GEMM (an RS wgmma with this warpgroup's 64 Q rows as 16-bit A
// fragments), taken by the persistent kernel (fwd_sm90_v3.cuh) at d = 128: the S wgmmas then read
// only K from shared memory (a third fewer bytes for that GEMM), at the price of D / 4 registers per
// thread loaded once per query tile, and the kernel frees its one Q slot as soon as the fragments
// are loaded, so the next tile's Q lands a whole tile earlier. Measured (twelfth session, with the
// lazy row max): operator grid +2-4% on the persistent kernel's d = 128 points, harness -1 to +2%;
// v2 gained nothing there (operator -4 to +1%, harness -1.3%), so v2 keeps Q in shared memory.
// d = 256 has no room for 64 more registers beside O's 128; the K-major RS wrapper exists for
// N = 128 (gen_wgmma.py's RSK_N).
template <int D, int BN>
constexpr bool kFwdQInRegs = D == 128 && BN == 128;

// This warpgroup's Q rows as A fragments, k-step k in qa[k], from the 128-byte-swizzled Q tile
// ([D / 64] chunks of [128 rows][64], 16-byte unit u of row r at unit u ^ (r % 8)). Lane l reads
// row l % 8 (+ 8 for the matrices 1 and 3) and 16-byte unit 2 (k % 4) + l / 16 of its chunk.
template <int D>
__device__ __forceinline__ void v2_load_q_frags(uint32_t (&qa)[D / 16][4], uint32_t sQ, int cw, int warp, int lane) {
  const int r8 = lane & 7;
  const int row = cw * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + r8;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    const int unit = (k % 4) * 2 + (lane >> 4);
    ldmatrix_x4(qa[k], sQ + (k / 4) * (128 * 128) + row * 128 + ((unit ^ r8) << 4));
  }
}

// S = Q K^T with Q from registers (v2_load_q_frags) when QREG, else from shared memory (v2_issue_s).
template <int D, int BN, bool F16, bool QREG, int QK>
__device__ __forceinline__ void v2_issue_s_q(float (&sacc)[BN / 2], const uint32_t (&qa)[QK][4], uint32_t sQ,
                                             uint32_t sK, int cw) {
  if constexpr (QREG) {
    static_assert(QK == D / 16, "one A fragment per k-step");
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const uint32_t b_addr = sK + (k / 4) * (BN * 128) + (k % 4) * 32;
      Wgmma<BN, F16>::rs_k(sacc, qa[k], make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
    }
  } else {
    v2_issue_s<D, BN, F16>(sacc, sQ, sK, cw);
  }
}

// O += P V: BN/16 k-steps (16 kv rows each), V MN-major (d chunks BN*128 B apart).
template <int D, int BN, bool F16>
__device__ __forceinline__ void v2_issue_pv(float (&o)[D / 2], const uint32_t (&pa)[BN / 16][4], uint32_t sV) {
#pragma unroll
  for (int t = 0; t < BN / 16; ++t) {
    const uint32_t b_addr = sV + t * (16 * 128);
    Wgmma<D, F16>::rs(o, pa[t], make_smem_desc(b_addr, BN * 128, 1024), 1);
  }
}

// kv tail and causal diagonal (top-left: key j visible to query i iff j <= i).
template <int BN, bool CAUSAL>
__device__ __forceinline__ void v2_mask(float (&sacc)[BN / 2], int n, int s_kv, int row_base, int wg_row0, int qd) {
  const bool tail = (n + 1) * BN > s_kv;
  const bool diag = CAUSAL && ((n + 1) * BN - 1 > wg_row0);
  if (tail || diag) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n * BN + 8 * j + 2 * qd + e;
          const int row = row_base + 8 * hf;
          bool masked = col >= s_kv;
          if (CAUSAL) masked = masked || (col > row);
          if (masked) sacc[4 * j + 2 * hf + e] = -INFINITY;
        }
      }
    }
  }
}

// A row keeps its reference max until a tile's max exceeds it by more than this (log2 domain), so
// P stays <= 2^8 (exact range in fp32 and in both 16-bit P types) and O is rescaled only in the
// tiles that raise the max that much: after the first tiles of a row almost none do. Each skipped
// rescale saves D / 2 FMULs per thread, in the softmax phase, whose issued instructions the
// tensor pipe waits for (a quarter more of them there cost 10% at d = 64 and 128; perf-notes,
// eleventh session). FlashAttention-4 keeps its max the same way. This is v2_softmax's rule (a
// row's first tile, and the slow path of the others); steady-state tiles first try a looser one,
// P <= 2^15 without any max (v2_softmax_steady).
constexpr float kV2MaxSlack = 8.f;

// Online softmax of one S tile in place (S -> unnormalised P, fp32), rows r
// and r+8 of this thread (4 threads per row). corr[hf] is the factor O owes
// (1 when the row kept its max, 0 on the first unmasked tile).
template <int BN>
__device__ __forceinline__ void v2_softmax(float (&sacc)[BN / 2], float (&row_m)[2], float (&row_l)[2],
                                           float (&corr)[2], float sl2) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      mx = fmaxf(mx, sacc[4 * j + 2 * hf]);
      mx = fmaxf(mx, sacc[4 * j + 2 * hf + 1]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // -inf + slack stays -inf: a row's first unmasked tile always sets its max.
    const bool grow = mx * sl2 > row_m[hf] + kV2MaxSlack;
    const float m_new = grow ? mx * sl2 : row_m[hf];
    const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
    corr[hf] = grow ? fast_exp2(row_m[hf] - m_use) : 1.f;  // exp2(-inf) = 0 on the first tile
    row_m[hf] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = fast_exp2(fmaf(sacc[4 * j + 2 * hf + e], sl2, -m_use));
        sacc[4 * j + 2 * hf + e] = pv;
        sum += pv;
      }
    }
    row_l[hf] = row_l[hf] * corr[hf] + sum;  // corr is exactly 1 where the row kept its max
  }
}

// P (fp32 S accumulator layout) -> 16-bit A fragments of the PV wgmma:
// k-step t (keys 16t..16t+15) = {S[8t+0,1], S[8t+2,3], S[8t+4,5], S[8t+6,7]}.
template <int BN, bool F16>
__device__ __forceinline__ void v2_pack_p(uint32_t (&pa)[BN / 16][4], const float (&sacc)[BN / 2]) {
#pragma unroll
  for (int t = 0; t < BN / 16; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[t][i] = pack2<F16>(sacc[8 * t + 2 * i], sacc[8 * t + 2 * i + 1]);
  }
}

// Skipped by the whole warp when none of its rows owes a factor (a warp-uniform branch: no wgmma
// inside, and the common case by far once the rows' maxima have settled).
template <int D>
__device__ __forceinline__ void v2_rescale_o(float (&o)[D / 2], const float (&corr)[2]) {
  if (!__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[4 * j + 0] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

template <int N>
__device__ __forceinline__ void v2_fence_f(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}
template <int N>
__device__ __forceinline__ void v2_fence_p(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int t = 0; t < N; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) reg_fence(r[t][i]);
  }
}

// O += P V (v2_issue_pv) as one committed wgmma group, its register operands O and P fenced first:
// the steady iterations' PV_{n-1} and the last tile's PV of every forward kernel.
template <int D, int BN, bool F16>
__device__ __forceinline__ void v2_commit_pv(float (&o)[D / 2], uint32_t (&pa)[BN / 16][4], uint32_t sV) {
  v2_fence_f(o);
  v2_fence_p(pa);
  wgmma_fence();
  v2_issue_pv<D, BN, F16>(o, pa, sV);
  wgmma_commit();
}

// Steady-state tiles (n >= 1) leave a row's reference max alone while P stays in range, so their
// softmax need not find the tile's row max first: that costs one FMNMX per score and two shuffles
// per row, ~80 of the ~450 instructions a thread issues per tile at d = 64, and the tensor pipe
// waits for that issue stream (perf-notes, eleventh session). S is exponentiated against the
// reference directly and checked afterwards: every P is at most its thread's partial row sum
// (P >= 0), so both partial sums <= 2^15 bound them all (2^15 fits fp16, bf16 and fp32 P; l and O
// stay far from fp32's range). The compare also fails on an inf or a NaN, hence for a row without a
// reference yet: row_m = -inf makes the exponent +inf, or NaN on a masked score (ex2 keeps both).
constexpr float kV2SteadyPBound = 32768.f;

// One vote barrier per consumer warpgroup, ids 4, 5, 6 (0 is __syncthreads, 1-3 the ping-pong's
// and the three-consumer rotation's).
constexpr int kV2VoteBar = 4;
// True in the whole warpgroup iff pred is true in any of its 128 threads. One bar.red.or is the
// vote across the 4 warps; a warp vote first would add an instruction and save nothing, as the
// warps' results still meet in a barrier. Each warp waits there for the other 3, which costs
// little: the next S GEMM, collective over the warpgroup, waits for them anyway.
template <int NCONS>
__device__ __forceinline__ bool v2_wg_any(bool pred, int cw) {
  static_assert(NCONS == 2 || NCONS == 3, "vote barrier ids");
  bool any;
  if (cw == 0)
    any = bar_red_or_imm<kV2VoteBar + 0, 128>(pred);
  else if (NCONS == 2 || cw == 1)
    any = bar_red_or_imm<kV2VoteBar + 1, 128>(pred);
  else
    any = bar_red_or_imm<kV2VoteBar + 2, 128>(pred);
  return any;
}

// Online softmax of a steady-state tile, S_n complete in sacc: v2_softmax without the row max
// while every P of the warpgroup is in range (above). mask() applies the tile's v2_mask; issue_s()
// issues the tile's S GEMM into sacc again (same Q, same K slot).
// Slow path, when any thread of the warpgroup fails the check: P has overwritten S, and scores far
// above the reference may have become inf, so S_n is computed again, masked and run through
// v2_softmax, which moves the reference. That reissue is a wgmma, collective over the warpgroup,
// hence a warpgroup vote and not a warp vote. It reads K_n (and Q) again: the caller releases the
// K slot (and the persistent kernel's Q slot) only after this returns. Its wait_group 0 also waits
// for the PV GEMM in flight, and it is issued outside the ping-pong turn (one more GEMM between
// the other warpgroup's, no turn count changed); both are fine for a path only tiles that raise a
// row's max by ~10 (log2) or more take. issue_s derives the K slot from warp_uniform_here(n)
// instead of reusing the first issue's address: kept live across the softmax, that address left
// too few uniform registers at d = 256 (16 descriptor pairs per S GEMM), and ptxas moved
// descriptors through vector registers (28-31 R2UR a tile instead of 13; main has 3-9).
template <int BN, int NCONS, typename IssueS, typename Mask>
__device__ __forceinline__ void v2_softmax_steady(float (&sacc)[BN / 2], float (&row_m)[2], float (&row_l)[2],
                                                  float (&corr)[2], float sl2, int cw, IssueS&& issue_s,
                                                  Mask&& mask) {
  mask();
  float sum[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    sum[hf] = 0.f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = fast_exp2(fmaf(sacc[4 * j + 2 * hf + e], sl2, -row_m[hf]));
        sacc[4 * j + 2 * hf + e] = pv;
        sum[hf] += pv;
      }
    }
  }
  const bool in_range = sum[0] <= kV2SteadyPBound && sum[1] <= kV2SteadyPBound;
  if (!v2_wg_any<NCONS>(!in_range, cw)) {
    row_l[0] += sum[0];
    row_l[1] += sum[1];
    corr[0] = corr[1] = 1.f;
    return;
  }
  v2_fence_f(sacc);
  wgmma_fence();
  issue_s();
  wgmma_commit();
  wgmma_wait<0>();
  v2_fence_f(sacc);
  mask();
  v2_softmax<BN>(sacc, row_m, row_l, corr, sl2);
}

// A consumer warpgroup's main-loop registers (v2 and v3), by reference: S_n's accumulators, O, P
// as A fragments, and the two rows' running max, sum and owed rescale.
template <int D, int BN>
struct V2Regs {
  float (&sacc)[BN / 2];
  float (&o)[D / 2];
  uint32_t (&pa)[BN / 16][4];
  float (&row_m)[2];
  float (&row_l)[2];
  float (&corr)[2];
};

// Where a steady iteration's tiles are: K_n's ring position (Pos: int in v2, whose positions are
// the key tiles; uint32_t in v3, which counts them over the CTA's life) and the K / V ring bases.
template <typename Pos>
struct V2Step {
  Pos it;
  uint32_t sK0, sV0;
  int cw, lane;
  float sl2;
};

// One steady iteration n >= 1 of the v2 / v3 consumer loop: in this warpgroup's ping-pong turn S_n
// (group A) and O += P_{n-1} V_{n-1} (group B); S_n's softmax while B runs; K_n released after it,
// V_{n-1} after B; then P_n packed. Hooks: wait_full(bar, parity) (the watchdog wait),
// issue_s(sK) (S_n's chain against the K tile at sK; the slow path's reissue too), mask() (S_n's
// mask), k_released() (lane 0, after K_n's release: v3 frees its Q slot after the last S GEMM).
template <int D, int BN, int STAGES, bool F16, bool PP, typename Pos, class Bars, class WaitFull, class IssueS,
          class Mask, class KReleased>
__device__ __forceinline__ void v2_steady_step(const V2Step<Pos>& st, const Bars& bars, const V2Regs<D, BN>& r,
                                               WaitFull&& wait_full, IssueS&& issue_s, Mask&& mask,
                                               KReleased&& k_released) {
  constexpr int kKVBytes = kV2KVBytes<D, BN>;
  const Pos s = st.it % STAGES;
  const uint32_t ph = (st.it / STAGES) & 1u;
  const Pos sp = (st.it - 1) % STAGES;  // slot of tile n-1 (its V)
  const uint32_t php = ((st.it - 1) / STAGES) & 1u;

  wait_full(bars.kf(s), ph);
  __syncwarp();
  if (PP) v2_pp_wait_turn(st.cw);
  // group A: S_n
  v2_fence_f(r.sacc);
  wgmma_fence();
  issue_s(st.sK0 + s * kKVBytes);
  wgmma_commit();
  // O is not an operand of any wgmma in flight: rescale it for tile n-1.
  v2_rescale_o<D>(r.o, r.corr);
  wait_full(bars.vf(sp), php);
  __syncwarp();
  // group B: O += P_{n-1} V_{n-1}
  v2_commit_pv<D, BN, F16>(r.o, r.pa, st.sV0 + sp * kKVBytes);
  if (PP) v2_pp_pass_turn(st.cw);

  wgmma_wait<1>();  // group A (S_n) complete; B may still run
  v2_fence_f(r.sacc);
  v2_softmax_steady<BN, 2>(
      r.sacc, r.row_m, r.row_l, r.corr, st.sl2, st.cw,
      [&] { issue_s(st.sK0 + (warp_uniform_here(st.it) % STAGES) * kKVBytes); }, mask);
  __syncwarp();
  if (st.lane == 0) {  // only now: the softmax's slow path reads K_n (and Q, if not in registers) again
    mbar_arrive(bars.ke(s));
    k_released();
  }
  // Pin the softmax before the wait (else the compiler may sink it past
  // wait_group 0 and the overlap with PV_{n-1} is lost).
  v2_fence_f(r.sacc);
  reg_fence(r.row_l[0]);
  reg_fence(r.row_l[1]);

  wgmma_wait<0>();  // group B complete: O final for tile n-1, P_{n-1} free
  v2_fence_f(r.o);
  v2_fence_p(r.pa);
  __syncwarp();
  if (st.lane == 0) mbar_arrive(bars.ve(sp));
  v2_pack_p<BN, F16>(r.pa, r.sacc);
}

// The first iteration of the v2 / v3 consumer loop: S_0 alone in this warpgroup's turn, K_0
// released once it completed, then its softmax (no max to keep yet) and P_0 packed. Hooks as in
// v2_steady_step.
template <int D, int BN, int STAGES, bool F16, bool PP, typename Pos, class Bars, class WaitFull, class IssueS,
          class Mask, class KReleased>
__device__ __forceinline__ void v2_first_step(const V2Step<Pos>& st, const Bars& bars, const V2Regs<D, BN>& r,
                                              WaitFull&& wait_full, IssueS&& issue_s, Mask&& mask,
                                              KReleased&& k_released) {
  const Pos s = st.it % STAGES;
  wait_full(bars.kf(s), (st.it / STAGES) & 1u);
  __syncwarp();  // reconverge after the spins before the .aligned ops
  if (PP) v2_pp_wait_turn(st.cw);
  v2_fence_f(r.sacc);
  wgmma_fence();
  issue_s(st.sK0 + s * kV2KVBytes<D, BN>);
  wgmma_commit();
  if (PP) v2_pp_pass_turn(st.cw);
  wgmma_wait<0>();
  v2_fence_f(r.sacc);
  __syncwarp();
  if (st.lane == 0) {
    mbar_arrive(bars.ke(s));
    k_released();
  }
  mask();
  v2_softmax<BN>(r.sacc, r.row_m, r.row_l, r.corr, st.sl2);  // corr = 0 here; O is still 0
  v2_pack_p<BN, F16>(r.pa, r.sacc);
}

// The last iteration: O += P_last V_last alone in this warpgroup's turn (st.it: V_last's ring
// position), which passes the turn on only when pass_turn (the other consumer has a turn left).
template <int D, int BN, int STAGES, bool F16, bool PP, typename Pos, class Bars, class WaitFull>
__device__ __forceinline__ void v2_last_step(const V2Step<Pos>& st, const Bars& bars, const V2Regs<D, BN>& r,
                                             WaitFull&& wait_full, bool pass_turn) {
  const Pos s = st.it % STAGES;
  wait_full(bars.vf(s), (st.it / STAGES) & 1u);
  __syncwarp();
  if (PP) v2_pp_wait_turn(st.cw);
  v2_rescale_o<D>(r.o, r.corr);
  v2_commit_pv<D, BN, F16>(r.o, r.pa, st.sV0 + s * kV2KVBytes<D, BN>);
  if (PP && pass_turn) v2_pp_pass_turn(st.cw);
  wgmma_wait<0>();
  v2_fence_f(r.o);
  __syncwarp();
  if (st.lane == 0) mbar_arrive(bars.ve(s));
}

// The K / V rings' barriers of a barrier map (FwdBars here, V3Bars in fwd_sm90_v3.cuh): full ones
// count one arrival (with the TMA transaction bytes), empty ones one per consumer warp.
template <int STAGES, class Bars>
__device__ __forceinline__ void init_kv_ring(const Bars& b, int consumer_warps) {
  for (int s = 0; s < STAGES; ++s) {
    mbar_init(b.kf(s), 1);
    mbar_init(b.vf(s), 1);
    mbar_init(b.ke(s), consumer_warps);
    mbar_init(b.ve(s), consumer_warps);
  }
}

// The one-tile-per-CTA forwards' mbarriers (v2 here, the three-consumer one in fwd_sm90_v2w3.cuh),
// eight bytes each from bar0: q, kf[STAGES], vf[STAGES], ke[STAGES], ve[STAGES]. The full barriers
// count one arrival (with the TMA transaction bytes), the empty ones one per consumer warp.
template <int STAGES>
struct FwdBars {
  uint32_t bar0;
  __device__ __forceinline__ uint32_t q() const { return bar0; }                                // Q full (tx)
  __device__ __forceinline__ uint32_t kf(int s) const { return bar0 + 8u * (1 + s); }           // K full (tx)
  __device__ __forceinline__ uint32_t vf(int s) const { return bar0 + 8u * (1 + STAGES + s); }  // V full (tx)
  __device__ __forceinline__ uint32_t ke(int s) const { return bar0 + 8u * (1 + 2 * STAGES + s); }  // K empty
  __device__ __forceinline__ uint32_t ve(int s) const { return bar0 + 8u * (1 + 3 * STAGES + s); }  // V empty
  // One thread, before the block's first __syncthreads.
  __device__ __forceinline__ void init(int consumer_warps) const {
    mbar_init(q(), 1);
    init_kv_ring<STAGES>(*this, consumer_warps);
    mbar_fence_init();
  }
};

// The forward kernels' CTA start (v2, v3 and both three-consumer kernels): thread 0 initialises the
// barrier map (FwdBars or V3Bars) and prefetches the three tensor maps, then the whole CTA syncs, so
// that no thread waits on a barrier before its init.
template <class Bars>
__device__ __forceinline__ void fwd_cta_start(const Bars& bars, int consumer_warps, const CUtensorMap& tmQ,
                                              const CUtensorMap& tmK, const CUtensorMap& tmV) {
  if (threadIdx.x == 0) {
    bars.init(consumer_warps);
    tma_prefetch_desc(&tmQ);
    tma_prefetch_desc(&tmK);
    tma_prefetch_desc(&tmV);
  }
  __syncthreads();
}

// A one-tile CTA's work: its query tile (causal: heaviest first, fwd_tile_idx), the K / V head, and
// the key tiles it runs. The count is per CTA, not per consumer warpgroup: every consumer runs them
// all, which the turn barriers' counts rely on. Always >= 1.
struct FwdOneTile {
  int m_blk, head, batch, head_kv, n_blocks;
};
template <bool CAUSAL, int BM, int BN>
__device__ __forceinline__ FwdOneTile fwd_one_tile(const KParams& p) {
  const FwdTileIdx tile = fwd_tile_idx<CAUSAL>(p);
  FwdOneTile t;
  t.m_blk = tile.m_blk;
  t.head = tile.head;
  t.batch = tile.batch;
  t.head_kv = tile.head / (p.h / p.h_kv);
  t.n_blocks = (p.s_kv + BN - 1) / BN;
  if (CAUSAL) t.n_blocks = min(t.n_blocks, ((tile.m_blk + 1) * BM + BN - 1) / BN);
  return t;
}

// What the one-tile producer reads besides its compile-time shape: the tensor maps, the
// shared-memory slots, and the tile (its key tiles, K / V head).
struct FwdProducerArgs {
  const CUtensorMap *tmQ, *tmK, *tmV;
  uint32_t sQ, sK0, sV0;
  int m_blk, head, head_kv, batch, n_blocks;
};

// The one-tile forwards' producer, one thread. Order Q, K_0, then per n: K_{n+1}, V_n (FA3's order).
// K_j waits for its slot's previous tile j-STAGES to be released by every consumer after its
// softmax of it (mid consumer iteration j-STAGES), V_j for PV_{j-STAGES} (end of iteration
// j-STAGES+1). Consumer iteration n needs K_n and V_{n-1}, both earlier in this order, and its
// releases never wait on a later load: between the S wait and the K release a consumer waits only
// on its own warpgroup (the vote) and its own GEMMs (the slow path's wait_group 0), whose operands
// are all resident: no cycle (checked in a protocol model for STAGES 2..4, n_blocks 1..13, slow
// path at random). D / 64 boxes of 128-byte rows per load; a BM-row Q box (rows past s_q are
// zero-filled and still counted in the transaction bytes), BN-row K / V boxes.
template <int D, int BM, int BN, int STAGES>
__device__ __forceinline__ void v2_produce(const FwdProducerArgs& a, const FwdBars<STAGES>& bars) {
  constexpr int DCH = D / 64;  // 128-byte chunks per row
  constexpr int kQBytes = BM * D * 2, kKVBytes = kV2KVBytes<D, BN>;
  auto load_k = [&](int n) {
    const int s = n % STAGES;
    mbar_wait<true>(bars.ke(s), ((n / STAGES) & 1u) ^ 1u);  // fresh barrier: parity 1 passes at once
    mbar_arrive_expect_tx(bars.kf(s), kKVBytes);
#pragma unroll
    for (int c = 0; c < DCH; ++c)
      tma_load_4d(a.sK0 + s * kKVBytes + c * BN * 128, a.tmK, bars.kf(s), c * 64, a.head_kv, n * BN, a.batch);
  };
  auto load_v = [&](int n) {
    const int s = n % STAGES;
    mbar_wait<true>(bars.ve(s), ((n / STAGES) & 1u) ^ 1u);
    mbar_arrive_expect_tx(bars.vf(s), kKVBytes);
#pragma unroll
    for (int c = 0; c < DCH; ++c)
      tma_load_4d(a.sV0 + s * kKVBytes + c * BN * 128, a.tmV, bars.vf(s), c * 64, a.head_kv, n * BN, a.batch);
  };
  // Tensor-map dims are (d, h, s, b): coordinates (d0, head, seq, batch).
  mbar_arrive_expect_tx(bars.q(), kQBytes);
#pragma unroll
  for (int c = 0; c < DCH; ++c)
    tma_load_4d(a.sQ + c * BM * 128, a.tmQ, bars.q(), c * 64, a.head, a.m_blk * BM, a.batch);
  load_k(0);
  for (int n = 0; n < a.n_blocks; ++n) {
    if (n + 1 < a.n_blocks) load_k(n + 1);
    load_v(n);
  }
}

// ------------------------------------------------------------------- kernel
template <typename T, int D, bool CAUSAL, int BN_, int STAGES_, bool PP_>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_sm90_v2_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                       const __grid_constant__ CUtensorMap tmV, const KParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr bool F16 = std::is_same<T, __half>::value;
  using Cfg = FwdV2Cfg<D, BN_, STAGES_, PP_>;
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

  fwd_cta_start(bars, kConsumerWarps, tmQ, tmK, tmV);

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<24>();
    if (tid == 0)
      v2_produce<D, BM, BN, STAGES>(
          FwdProducerArgs{&tmQ, &tmK, &tmV, sQ, sK0, sV0, m_blk, head, head_kv, batch, n_blocks}, bars);
    return;
  }

  // -------------------------------------------------------------- consumers
  setmaxnreg_inc<240>();
  const int cw = wg - 1;  // consumer warpgroup: query rows [64*cw, 64*cw+64) of the tile
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  const int qd = lane & 3;
  // This thread's two rows (accumulator fragment: row = 16*warp + lane/4 + 8*hf).
  const int row_base = m_blk * BM + cw * 64 + warp * 16 + (lane >> 2);
  const int wg_row0 = m_blk * BM + cw * 64;
  const float sl2 = p.scale_log2;

  // Ping-pong: consumer 0 takes the first turn.
  if (PP && cw == 1) v2_pp_pass_turn(cw);

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  // Zeroed once: the first k-step of every S GEMM ignores the old value
  // (scale-d = 0); later tiles pass the dead P floats back in.
  float sacc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) sacc[i] = 0.f;
  uint32_t pa[BN / 16][4];
  float row_m[2] = {-INFINITY, -INFINITY};  // running max, log2-scaled domain
  float row_l[2] = {0.f, 0.f};              // running sum (this thread's columns only)
  float corr[2] = {1.f, 1.f};               // O rescale owed to the last softmax

  // Watchdog give-ups (see mbar_wait) are reported as NaN lse for the rows.
  // After the first give-up a warp skips every later wait (garbage, but the
  // CTA ends in ~1 watchdog period instead of one per tile).
  bool timed_out = !mbar_wait<false>(bars.q(), 0);
  auto wait_full = [&](uint32_t bar, uint32_t parity) {
    if (!timed_out) timed_out = !mbar_wait<false>(bar, parity);
  };

  // ------------------------------------------------ prologue: S_0 alone
  const V2Regs<D, BN> regs{sacc, o, pa, row_m, row_l, corr};
  const auto issue_s = [&](uint32_t sK) { v2_issue_s<D, BN, F16>(sacc, sQ, sK, cw); };
  v2_first_step<D, BN, STAGES, F16, PP>(
      V2Step<int>{0, sK0, sV0, cw, lane, sl2}, bars, regs, wait_full, issue_s,
      [&] { v2_mask<BN, CAUSAL>(sacc, 0, p.s_kv, row_base, wg_row0, qd); }, [] {});

  // ------------------------------------------------ steady state
  for (int n = 1; n < n_blocks; ++n)
    v2_steady_step<D, BN, STAGES, F16, PP>(
        V2Step<int>{n, sK0, sV0, cw, lane, sl2}, bars, regs, wait_full, issue_s,
        [&] { v2_mask<BN, CAUSAL>(sacc, n, p.s_kv, row_base, wg_row0, qd); }, [] {});

  // ------------------------------------------------ epilogue: PV_{last} alone
  // (V_last's release has no waiter here; kept for symmetry.) Consumer 1's last turn passes
  // nothing: consumer 0 has no turn left.
  v2_last_step<D, BN, STAGES, F16, PP>(V2Step<int>{n_blocks - 1, sK0, sV0, cw, lane, sl2}, bars, regs, wait_full,
                                       cw == 0);

  // ---------------------------------------------------------------- epilogue
  fwd_store_rows<T, D>(p, o, row_m, row_l, row_base, batch, head, qd, timed_out);
#endif
}

// =================================================================== host
namespace detail {
// What the one-tile forwards (v2 here, the three-consumer one in fwd_sm90_v2w3.cuh) check and set
// alike: the arguments, the tensor maps (bm-row Q boxes, bn-row K / V boxes), the causal tile order
// and the grid of one CTA per (bm-row query tile, head, batch).
template <typename T>
inline cudaError_t one_tile_prepare(FwdLaunch* L, const Sm90Args& a, int d, int bm, int bn, int smem) {
  const KParams& p = a.out;
  if (p.b <= 0 || p.s_q <= 0 || p.s_kv <= 0 || p.h <= 0 || p.h_kv <= 0 || p.h % p.h_kv != 0 || p.h > 65535 ||
      p.b > 65535 || a.q.d != d || a.k.d != d || a.v.d != d)
    return cudaErrorInvalidValue;
  // TMA needs 16-byte aligned base addresses; the epilogue stores 4-byte pairs.
  if ((reinterpret_cast<uintptr_t>(a.q.ptr) | reinterpret_cast<uintptr_t>(a.k.ptr) |
       reinterpret_cast<uintptr_t>(a.v.ptr)) & 15)
    return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(p.o) & 3) return cudaErrorInvalidValue;
  if (!make_map<T>(&L->tq, a.q, bm) || !make_map<T>(&L->tk, a.k, bn) || !make_map<T>(&L->tv, a.v, bn))
    return cudaErrorInvalidValue;
  L->p = p;
  L->p.causal_chunk =
      causal_chunk_for(a.causal, a.causal_chunk, (p.s_q + bm - 1) / bm, int64_t{p.h} * p.b, a.sm_count);
  L->smem = smem;
  L->grid = dim3((p.s_q + bm - 1) / bm, p.h, p.b);
  L->causal = a.causal;
  return cudaSuccess;
}
}  // namespace detail

// Same contract as fwd_sm90_prepare (fwd_sm90.cuh); launch with fwd_sm90_launch.
// PP_CAUSAL: the ping-pong of the causal kernel (default: PP).
template <typename T, int D, int BN, int STAGES, bool PP, bool PP_CAUSAL = PP>
inline cudaError_t fwd_sm90_v2_prepare_cfg(FwdLaunch* L, const Sm90Args& a) {
  using Cfg = FwdV2Cfg<D, BN, STAGES, PP>;
  const cudaError_t e = detail::one_tile_prepare<T>(L, a, D, Cfg::BM, Cfg::BN, Cfg::kTotal);
  if (e != cudaSuccess) return e;
  L->kern = a.causal ? fwd_sm90_v2_kernel<T, D, true, BN, STAGES, PP_CAUSAL>
                     : fwd_sm90_v2_kernel<T, D, false, BN, STAGES, PP>;
  static std::atomic<uint64_t> raised[2];  // per instantiation of this function: causal or not
  return detail::raise_smem_limit(reinterpret_cast<const void*>(L->kern), L->smem, raised[a.causal ? 1 : 0]);
}

template <typename T, int D>
inline cudaError_t fwd_sm90_v2_prepare(FwdLaunch* L, const Sm90Args& a) {
  using C = FwdV2Default<D>;
  return fwd_sm90_v2_prepare_cfg<T, D, C::BN, C::STAGES, C::PP, C::PP_CAUSAL>(L, a);
}

// The library's Hopper forward (sm90.cu): prepare + launch of v2's default
// configuration for D.
template <typename T, int D>
inline cudaError_t fwd_sm90(const Sm90Args& a, cudaStream_t stream = 0) {
  FwdLaunch L;
  const cudaError_t e = fwd_sm90_v2_prepare<T, D>(&L, a);
  if (e != cudaSuccess) return e;
  return fwd_sm90_launch(L, stream);
}

}  // namespace hopper
}  // namespace fusedattn
