// The forward consumer's online softmax, in registers. A thread holds two query rows (r and r + 8
// of its warp's 16) and, per row, the running max m (log2-scaled), its part l of the row sum (its
// columns only; the quad sums them in the epilogue) and corr, the factor O still owes the last
// tile's rescale. S arrives in the wgmma accumulator layout: acc[4j + 2hf + e] is row r + 8hf,
// column 8j + 2qd + e (qd = lane % 4).
//
// A row keeps its reference max until a tile's max exceeds it by more than kMaxSlack (log2), so P
// stays <= 2^8 and O is rescaled only in tiles that raise the max that much: after a row's first
// tiles almost none do, and each skipped rescale saves D / 2 multiplies in the phase the tensor
// pipe waits on. Steady-state tiles go further (softmax_steady): no row max at all while every P of
// the warpgroup stays <= kSteadyPBound.
#pragma once

#include <cmath>

#include "common/numeric.cuh"  // max_nan
#include "ptx_sm90.cuh"

namespace fusedattn {
namespace hopper {

constexpr float kMaxSlack = 8.f;
// Every P is at most its thread's partial row sum (P >= 0), so both partial sums <= 2^15 bound
// them all; 2^15 fits fp16, bf16 and fp32 P, and l and O stay far from fp32's range.
constexpr float kSteadyPBound = 32768.f;

template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int t = 0; t < N; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) reg_fence(r[t][i]);
  }
}

// Online softmax of one S tile in place (S -> unnormalised P, fp32). corr[hf] is the factor O owes
// (1 when the row kept its max, 0 on the row's first unmasked tile).
template <int BN>
__device__ __forceinline__ void softmax_update(float (&sacc)[BN / 2], float (&row_m)[2], float (&row_l)[2],
                                               float (&corr)[2], float sl2) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    // NaN-propagating maximum: a row with a NaN score keeps a NaN in its sum (grow is false for a
    // NaN maximum, so its exponentials run against the old reference and one of them is NaN), hence
    // in its output and lse, as in torch's math attention.
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      mx = gpu::max_nan(mx, sacc[4 * j + 2 * hf]);
      mx = gpu::max_nan(mx, sacc[4 * j + 2 * hf + 1]);
    }
    mx = gpu::max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = gpu::max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // -inf + slack stays -inf: a row's first unmasked tile always sets its max.
    const bool grow = mx * sl2 > row_m[hf] + kMaxSlack;
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

// P (fp32 accumulator layout) -> 16-bit A fragments of the PV wgmma: k-step t (keys 16t..16t+15) =
// {S[8t+0,1], S[8t+2,3], S[8t+4,5], S[8t+6,7]}.
template <int BN, bool F16>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[BN / 16][4], const float (&sacc)[BN / 2]) {
#pragma unroll
  for (int t = 0; t < BN / 16; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[t][i] = pack2<F16>(sacc[8 * t + 2 * i], sacc[8 * t + 2 * i + 1]);
  }
}

// O *= corr, skipped by the whole warp when none of its rows owes a factor (a warp-uniform branch:
// no wgmma inside, and the common case by far once the rows' maxima have settled).
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&corr)[2]) {
  if (!__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[4 * j + 0] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

// Logit soft-capping (FwdParams::softcap, features.h's SOFTCAP), the scores' first step: S = q.k ->
// tanh(scale S / cap), computed as 1 - 2 / (1 + 2^(k2 S)) with k2 = 2 log2(e) scale / cap (ex2 and
// rcp), whose absolute error is a few fp32 ulps of 1, so the capped logit cap tanh(.) is off by a few
// ulps of cap (tanh.approx's relative 2^-11 would move a logit of 50 by 0.025). The softmax then runs
// on these with cap log2(e) in place of scale log2(e); they are bounded by 1, so the lazy maximum's
// vote fails only where the capped logits spread by more than ~10 (log2).
__device__ __forceinline__ float softcap_tanh(float s, float k2) {
  return 1.f - 2.f * fast_rcp(1.f + fast_exp2(s * k2));
}
template <int N>
__device__ __forceinline__ void softcap_scores(float (&sacc)[N], float k2) {
#pragma unroll
  for (int i = 0; i < N; ++i) sacc[i] = softcap_tanh(sacc[i], k2);
}

// One vote barrier per consumer warpgroup, ids 4, 5, 6 (0 is __syncthreads, 1-3 the turn rotation);
// id 7 is the end-of-CTA timeout vote (ptx_sm90.cuh's timeout_vote).
constexpr int kVoteBar = 4;
constexpr int kFwdTimeoutBar = 7;
// True in the whole warpgroup iff pred is true in any of its 128 threads: one bar.red.or across
// its 4 warps (the next S GEMM, collective over the warpgroup, waits for all of them anyway).
template <int NCONS>
__device__ __forceinline__ bool warpgroup_any(bool pred, int cw) {
  static_assert(NCONS == 2 || NCONS == 3, "vote barrier ids");
  bool any;
  if (cw == 0)
    any = bar_red_or_imm<kVoteBar + 0, 128>(pred);
  else if (NCONS == 2 || cw == 1)
    any = bar_red_or_imm<kVoteBar + 1, 128>(pred);
  else
    any = bar_red_or_imm<kVoteBar + 2, 128>(pred);
  return any;
}

// Online softmax of a steady-state tile, S_n complete in sacc: S is exponentiated against the
// reference max directly (no row max: one max per score and two shuffles per row saved) and
// checked afterwards; the check also fails on inf or NaN, hence for a row without a reference yet.
// mask() applies the tile's mask; issue_s() issues the tile's S GEMM into sacc again.
// Slow path, when any thread of the warpgroup fails the check: P has overwritten S, and scores far
// above the reference may have become inf, so S_n is computed again, masked and run through
// softmax_update, which moves the reference. The reissue is a wgmma, collective over the
// warpgroup, hence a warpgroup vote. It reads K_n (and Q) again: the caller releases the K slot
// (and a persistent kernel's Q slot) only after this returns. Its wait_group 0 also waits for the
// PV GEMM in flight, and it runs outside the turn rotation; both are fine for a path only tiles
// that raise a row's max by ~10 (log2) take. issue_s should derive the K slot again rather than
// keep the first issue's address live across the softmax (uniform registers run short at d = 256).
template <int BN, int NCONS, typename IssueS, typename Mask>
__device__ __forceinline__ void softmax_steady(float (&sacc)[BN / 2], float (&row_m)[2], float (&row_l)[2],
                                               float (&corr)[2], float sl2, int cw, IssueS&& issue_s, Mask&& mask) {
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
  const bool in_range = sum[0] <= kSteadyPBound && sum[1] <= kSteadyPBound;
  if (!warpgroup_any<NCONS>(!in_range, cw)) {
    row_l[0] += sum[0];
    row_l[1] += sum[1];
    corr[0] = corr[1] = 1.f;
    return;
  }
  fence_regs(sacc);
  wgmma_fence();
  issue_s();
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(sacc);
  mask();
  softmax_update<BN>(sacc, row_m, row_l, corr, sl2);
}

}  // namespace hopper
}  // namespace fusedattn
