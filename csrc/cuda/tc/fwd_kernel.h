// FlashAttention-2-style forward kernel: one block per (query tile, head,
// sequence); Q stays in shared memory, K and V tiles stream through
// cp.async with the load of the next tile overlapping the current matmul
// (K[n-1] is in flight during P V[n], V[n] during Q K[n]^T and the softmax),
// S and O live in registers (mma.sync m16n8k16, fp32 accumulation), and P goes
// from the S accumulators straight into the A operand of P V.
// Key tiles are walked from the last to the first, so under a causal window
// the one tile that needs per-element masking comes first; fully masked tiles
// are never visited.
#pragma once

#include <cmath>

#include "common/numeric.cuh"
#include "common/ptx.cuh"
#include "fusedattn/philox.h"
#include "kargs.h"

namespace fusedattn {
namespace tc {

using namespace gpu;  // the shared sm_80 instruction wrappers (csrc/cuda/common)

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Copy rows [0, kRows) x chunks [0, kD/8) of a row-major global tile into a
// swizzled shared tile. Rows >= rows_valid and columns >= d_valid read as zero.
// Each thread keeps one column chunk and steps kStep rows at a time; when kStep
// is a multiple of 8 the swizzle is the same on every step and the shared
// address advances linearly (no per-step address registers).
// A copy whose predicate is false has src-size 0: it zero-fills and reads
// nothing (SASS: LDGSTS's zero-fill predicate), so its source address is never
// dereferenced and needs no clamping (no per-row pointer selects).
template <int kRows, int kD, int kThreads, typename Elem>
__device__ __forceinline__ void load_tile(uint32_t sbase, const Elem* g, int64_t row_stride, int rows_valid,
                                          int d_valid, int tid) {
  constexpr int kChunks = kD / 8;
  constexpr int kStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kStep == 0, "loader shape");
  const int c = tid % kChunks, r0 = tid / kChunks;
  const bool col_ok = c * 8 < d_valid;
  const Elem* src = g + r0 * row_stride + c * 8;
  const int64_t step = kStep * row_stride;
  const uint32_t dst = sbase + swz<kD * 2>(r0, c);
  const int rows_left = rows_valid - r0;
#pragma unroll
  for (int it = 0; it < kRows / kStep; ++it) {
    const bool pred = col_ok && it * kStep < rows_left;
    const uint32_t d = kStep % 8 == 0 ? dst + it * kStep * kD * 2 : sbase + swz<kD * 2>(r0 + it * kStep, c);
    cp_async16(d, src + it * step, pred);
  }
}

// Shared tile (swizzled, kD columns) -> global rows with 16-byte stores.
template <int kRows, int kD, int kThreads, typename Elem>
__device__ __forceinline__ void store_tile(uint32_t sbase, Elem* g, int64_t row_stride, int rows_valid,
                                           int d_valid, int tid) {
  constexpr int kChunks = kD / 8;
  constexpr int kStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kStep == 0, "store shape");
  const int c = tid % kChunks, r0 = tid / kChunks;
  if (c * 8 >= d_valid) return;
  Elem* dst = g + r0 * row_stride + c * 8;
  const uint32_t src = sbase + swz<kD * 2>(r0, c);
#pragma unroll
  for (int it = 0; it < kRows / kStep; ++it) {
    if (r0 + it * kStep < rows_valid) {
      const uint32_t sa = kStep % 8 == 0 ? src + it * kStep * kD * 2 : sbase + swz<kD * 2>(r0 + it * kStep, c);
      *reinterpret_cast<uint4*>(dst + it * kStep * row_stride) = ld_shared128(sa);
    }
  }
}

// Zeros into rows [0, rows) x [0, d) of a global tile.
template <int kRows, int kD, int kThreads, typename Elem>
__device__ __forceinline__ void zero_tile(Elem* g, int64_t row_stride, int rows, int d, int tid) {
  constexpr int kChunks = kD / 8;
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    if (r < rows && c * 8 < d) *reinterpret_cast<uint4*>(g + r * row_stride + c * 8) = make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// tanh(scale q.k / softcap) of a capped logit (KArgs::softcap): the logit is softcap times it,
// and 1 - tanh^2 is the backward's factor for scale q.k. tanhf (a few ulps, also where the argument
// is small) rather than tanh.approx, whose relative 2^-11 would move a logit of 50 by 0.025, or
// 1 - 2 / (1 + 2^2x), whose absolute error of a few ulps of 1 grows with the cap.
__device__ __forceinline__ float softcap_tanh(const KArgs& a, float qk) { return tanhf(qk * a.softcap_scale); }

// The general variant's logit before bias, ALiBi and masks (the CPU engine's order): scale * q.k, or
// capped; g = its derivative by scale * q.k (the backward's; the forward applies the same rule to a
// whole tile at a time).
__device__ __forceinline__ float general_score(const KArgs& a, float qk, float& g) {
  if (a.softcap > 0.f) {
    const float t = softcap_tanh(a, qk);
    g = 1.f - t * t;
    return a.softcap * t;
  }
  g = 1.f;
  return qk * a.scale;
}

// Logit of element (i, j) before the softmax in the general variant, in log2 units: x (the score
// scaled or capped, general_score's rule) plus bias or ALiBi, -inf when not visible. Positions are
// inside the sequence.
template <typename Elem>
__device__ __forceinline__ float general_logit(const KArgs& a, float x, int b, int h, int i, int j, const SeqInfo& sq,
                                               const Visibility<int>& rule, bool check_window, float slope) {
  bool vis = true;
  if (check_window) vis = rule.key_visible(i, j);
  const bool inside = i < sq.len_q && j < sq.len_kv;
  if (a.mask != nullptr && inside) {
    vis = vis && a.mask[b * a.mk_sb + h * a.mk_sh + i * a.mk_si + j * a.mk_sj] == 0;
  }
  if (a.bias_type == 1 && inside) {
    x += to_float(static_cast<const Elem*>(a.bias)[b * a.bs_sb + h * a.bs_sh + i * a.bs_si + j * a.bs_sj]);
  } else if (a.bias_type == 2) {
    x -= slope * static_cast<float>(rule.alibi_distance(i, j));
  }
  return vis ? x * kLog2e : -INFINITY;
}

template <typename Elem, int kD, int kBlockM, int kBlockN, int kNWarps, int kMinBlocks, Variant kV>
__global__ void __launch_bounds__(kNWarps * 32, kMinBlocks) fwd_kernel(const __grid_constant__ KArgs a) {
  constexpr bool kGeneral = kV == Variant::kGeneral;
  constexpr int kThreads = kNWarps * 32;
  constexpr int kMT = kBlockM / (16 * kNWarps);  // 16-row mma tiles per warp
  constexpr int kNT = kBlockN / 8;               // 8-column tiles of S
  constexpr int kDT = kD / 8;                    // 8-column tiles of O
  constexpr int kRowBytes = kD * 2;
  static_assert(kMT >= 1 && kBlockM % (16 * kNWarps) == 0, "whole 16-row tiles per warp");
  static_assert(kBlockN % 16 == 0 && kD % 64 == 0, "tile shapes");

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + kBlockM * kRowBytes;
  const uint32_t sV = sK + kBlockN * kRowBytes;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / a.group;
  const SeqInfo sq = seq_info(a, b);
  const int m0 = m_block * kBlockM;
  // Rows this block owns in out/lse: for thd the rows past the sequence are
  // other sequences' tokens; for bshd/sbhd they are padding and get zeros.
  const int rows_out = a.q_thd ? sq.len_q : a.s_q;
  if (m0 >= rows_out) return;

  const Elem* gQ = static_cast<const Elem*>(a.q) + b * a.q_sb + (sq.off_q + m0) * a.q_ss + h * a.q_sh;
  // Key / value tile n (uniform: formed per load, not kept live across the loop).
  auto k_tile = [&](int nn) {
    return static_cast<const Elem*>(a.k) + (b * a.k_sb + (sq.off_kv + static_cast<int64_t>(nn) * kBlockN) * a.k_ss +
                                            hk * a.k_sh);
  };
  auto v_tile = [&](int nn) {
    return static_cast<const Elem*>(a.v) + (b * a.v_sb + (sq.off_kv + static_cast<int64_t>(nn) * kBlockN) * a.v_ss +
                                            hk * a.v_sh);
  };
  // Output pointers are formed where used (not kept live across the main loop).
  auto o_ptr = [&]() { return static_cast<Elem*>(a.o) + b * a.o_sb + (sq.off_q + m0) * a.o_ss + h * a.o_sh; };
  auto l_ptr = [&]() { return a.lse + b * a.lse_sb + h * a.lse_sh + (sq.off_q + m0) * a.lse_ss; };
  const int rows_here = min(kBlockM, rows_out - m0);

  // Keys visible to any in-sequence row of the tile.
  const Visibility<int> vis = seq_vis(a, sq);
  const int m_last = min(m0 + kBlockM, sq.len_q) - 1;
  const int j_lo = vis.key_lo(m0), j_hi = vis.key_hi(m_last);
  // Rows with no visible key: lse is the sink logit (off-by-one: 0,
  // learnable: the offset), -inf without one; padded rows are -inf too.
  const float empty_lse = a.softmax_type == 0 ? -INFINITY : a.softmax_type == 1 ? 0.f : a.sink[h];
  if (m_last < m0 || j_hi <= j_lo) {
    zero_tile<kBlockM, kD, kThreads>(o_ptr(), a.o_ss, rows_here, a.d_v, tid);
    float* gL = l_ptr();
    for (int r = tid; r < rows_here; r += kThreads) gL[r * a.lse_ss] = m0 + r < sq.len_q ? empty_lse : -INFINITY;
    return;
  }
  const int n_min = j_lo / kBlockN;
  const int n_max = (j_hi + kBlockN - 1) / kBlockN;

  float slope = 0.f;
  if (kGeneral && a.bias_type == 2) slope = a.alibi[b * a.al_sb + h * a.al_sh];
  int64_t seed = 0, offset = 0;
  if (kGeneral && a.dropout) {
    seed = a.rng[0];
    offset = a.rng[1];
  }
  const int64_t bh = static_cast<int64_t>(b) * a.h_q + h;

  int n = n_max - 1;
  load_tile<kBlockM, kD, kThreads>(sQ, gQ, a.q_ss, sq.len_q - m0, a.d_qk, tid);
  load_tile<kBlockN, kD, kThreads>(sK, k_tile(n), a.k_ss,
                                   sq.len_kv - n * kBlockN, a.d_qk, tid);
  cp_async_commit();

  float acc_o[kMT][kDT][4];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][dt][e] = 0.f;
  float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.f;
  }
  const int warp_row = warp * kMT * 16;
  const SwzAddr<kRowBytes> aQ(sQ, warp_row + (lane & 15), lane >> 4);
  const SwzAddr<kRowBytes> aK(sK, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const SwzAddr<kRowBytes> aV(sV, (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
  // Every k-step runs even past d_qk / d_v: those columns were loaded as zeros,
  // and a runtime guard per step would split the unrolled matmul into basic
  // blocks that ptxas cannot schedule ldmatrix across.

  for (; n >= n_min; --n) {
    cp_async_wait<0>();
    __syncthreads();  // K[n] (and Q) landed; every warp is done with V[n+1]
    load_tile<kBlockN, kD, kThreads>(sV, v_tile(n), a.v_ss,
                                     sq.len_kv - n * kBlockN, a.d_v, fresh_tid());
    cp_async_commit();

    float s[kMT][kNT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][nt][e] = 0.f;

    // S = Q K^T
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          ldsm_x4(aQ.at(kk, mi * 16), qa[mi]);
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t kb[4];
          ldsm_x4(aK.at(kk, np * 16), kb);
#pragma unroll
          for (int mi = 0; mi < kMT; ++mi) {
            mma<Elem>(s[mi][2 * np], qa[mi], kb[0], kb[1]);
            mma<Elem>(s[mi][2 * np + 1], qa[mi], kb[2], kb[3]);
          }
        }
      }
    }

    // Logits in the log2 domain, -inf where not visible.
    const int n0 = n * kBlockN;
    const bool edge = !vis.keys_all_visible(m0, m0 + kBlockM - 1, n0, kBlockN);
    if (!kGeneral) {
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (kV == Variant::kSoftcap) {
              s[mi][nt][e] = softcap_tanh(a, s[mi][nt][e]) * a.softcap_log2;
            } else {
              s[mi][nt][e] *= a.scale_log2;
            }
          }
      if (edge) {
        // Key j is visible to row i iff j < len_kv and t_lo <= j - i <= t_hi;
        // j - i is a per-thread base plus compile-time offsets, so no per-row
        // bound has to stay live across the loop.
        const int jt = n0 + 2 * (lane & 3);
        const int tb = jt - (m0 + warp_row + (lane >> 2));
        const int j_left = sq.len_kv - jt;
        const int t_lo = vis.offset_lo(), t_hi = vis.offset_hi();
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int t = tb + nt * 8 + c - mi * 16 - 8 * r;
                if (nt * 8 + c >= j_left || t < t_lo || t > t_hi) s[mi][nt][2 * r + c] = -INFINITY;
              }
      }
    } else {
      // Scaled or capped (general_score's rule), in loops of their own: a per-element choice
      // between the two costs the d=128 tile its registers (spills).
      if (a.softcap > 0.f) {
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mi][nt][e] = a.softcap * softcap_tanh(a, s[mi][nt][e]);
      } else {
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mi][nt][e] *= a.scale;
      }
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = m0 + warp_row + mi * 16 + (lane >> 2) + 8 * (e >> 1);
            const int j = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
            s[mi][nt][e] = general_logit<Elem>(a, s[mi][nt][e], b, h, i, j, sq, vis, edge, slope);
          }
    }

    // Online softmax. Each row lives in the 4 threads of a quad.
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mi][r];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = max_nan(mx, max_nan(s[mi][nt][2 * r], s[mi][nt][2 * r + 1]));
        mx = quad_max(mx);
        const float m_use = mx == -INFINITY ? 0.f : mx;
        const float alpha = fast_exp2(row_max[mi][r] - m_use);
        row_max[mi][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          s[mi][nt][2 * r] = fast_exp2(s[mi][nt][2 * r] - m_use);
          s[mi][nt][2 * r + 1] = fast_exp2(s[mi][nt][2 * r + 1] - m_use);
          sum += s[mi][nt][2 * r] + s[mi][nt][2 * r + 1];
        }
        row_sum[mi][r] = row_sum[mi][r] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          acc_o[mi][dt][2 * r] *= alpha;
          acc_o[mi][dt][2 * r + 1] *= alpha;
        }
      }

    // Dropout zeroes P for the value product only; the normaliser keeps it.
    if (kGeneral && a.dropout) {
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = m0 + warp_row + mi * 16 + (lane >> 2) + 8 * r;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const int j = n0 + nt * 8 + 2 * (lane & 3);
            const Philox4 d = dropout_draws(seed, offset, bh, i, j >> 2);
            const bool hi = (j & 2) != 0;
            const uint32_t x0 = hi ? d.x[2] : d.x[0], x1 = hi ? d.x[3] : d.x[1];
            if (x0 < a.drop_thr) s[mi][nt][2 * r] = 0.f;
            if (x1 < a.drop_thr) s[mi][nt][2 * r + 1] = 0.f;
          }
        }
    }

    cp_async_wait<0>();
    __syncthreads();  // V[n] landed; every warp is done with K[n]
    if (n > n_min) {
      load_tile<kBlockN, kD, kThreads>(sK, k_tile(n - 1), a.k_ss,
                                       sq.len_kv - (n - 1) * kBlockN, a.d_qk, fresh_tid());
      cp_async_commit();
    }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < kNT / 2; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        pa[mi][0] = pack2<Elem>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
        pa[mi][1] = pack2<Elem>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
        pa[mi][2] = pack2<Elem>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
        pa[mi][3] = pack2<Elem>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        {
          uint32_t vb[4];
          ldsm_x4_t(aV.at(dp, kk * 16), vb);
#pragma unroll
          for (int mi = 0; mi < kMT; ++mi) {
            mma<Elem>(acc_o[mi][2 * dp], pa[mi], vb[0], vb[1]);
            mma<Elem>(acc_o[mi][2 * dp + 1], pa[mi], vb[2], vb[3]);
          }
        }
      }
    }
  }

  // Epilogue: normalise (with the sink logit of off-by-one / learnable
  // softmax), write lse and the row maxima, stage O through shared memory.
  float sink2 = 0.f;
  if (a.softmax_type == 2) sink2 = a.sink[h] * kLog2e;
  float warp_max = -INFINITY;
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = m0 + warp_row + mi * 16 + (lane >> 2) + 8 * r;
      const float mx = row_max[mi][r];
      const float sum = quad_sum(row_sum[mi][r]);
      float inv = 0.f, lse = i < sq.len_q ? empty_lse : -INFINITY;
      if (i < sq.len_q && mx != -INFINITY) {
        warp_max = max_nan(warp_max, mx);  // a NaN row makes max_logit NaN
        if (a.softmax_type != 0) {
          const float mt = fmaxf(mx, sink2);
          const float so = fast_exp2(mx - mt);
          const float tot = sum * so + fast_exp2(sink2 - mt);
          inv = so / tot;
          lse = (mt + __log2f(tot)) * kLn2;
        } else {
          inv = 1.f / sum;
          lse = (mx + __log2f(sum)) * kLn2;
        }
        if (kGeneral && a.dropout) inv *= a.rp_drop;
      }
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        acc_o[mi][dt][2 * r] *= inv;
        acc_o[mi][dt][2 * r + 1] *= inv;
      }
      if ((lane & 3) == 0 && i - m0 < rows_here) l_ptr()[(i - m0) * a.lse_ss] = lse;
    }
  if (a.max_logit != nullptr) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) warp_max = max_nan(warp_max, __shfl_xor_sync(0xffffffffu, warp_max, o));
    if (lane == 0 && warp_max != -INFINITY) atomic_max_float(a.max_logit + h, warp_max * kLn2);
  }

  // sQ is free: every warp passed the barrier after its last Q K^T.
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row + mi * 16 + (lane >> 2) + 8 * r;
        st_shared32(sQ + swz<kRowBytes>(row, dt) + (lane & 3) * 4,
                    pack2<Elem>(acc_o[mi][dt][2 * r], acc_o[mi][dt][2 * r + 1]));
      }
  __syncthreads();
  store_tile<kBlockM, kD, kThreads>(sQ, o_ptr(), a.o_ss, rows_here, a.d_v, fresh_tid());
}

}  // namespace tc
}  // namespace fusedattn
