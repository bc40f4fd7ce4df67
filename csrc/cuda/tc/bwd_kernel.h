// FlashAttention-2-style backward, main pass: one block per (key tile,
// kv head, sequence). The block keeps its K and V tiles in shared memory and
// dK, dV in registers while it walks every query tile of every query head of
// its GQA group (so dK/dV need no cross-block reduction). Per query tile:
//   S^T = K Q^T and dP^T = V dO^T                     (registers)
//   P^T = exp2(S^T * scale*log2e - lse2), dS^T = P^T (dP^T - D)  (masks, dropout)
//   P^T, dS^T -> shared memory
//   dV += P^T dO, dK += dS^T Q                        (registers)
//   dQ  = dS K -> fp32 atomics into the workspace accumulator
// Q/dO (and their lse2 / D rows) are double-buffered: the next tile's cp.async
// is issued before the current tile's matmuls. Computing the transposed scores
// keeps the key rows of every warp's fragments, which is what dK/dV need.
#pragma once

#include "fwd_kernel.h"

namespace fusedattn {
namespace tc {

template <int kD, int kBlockM, int kBlockN>
struct BwdSmem {
  static constexpr int kRowBytes = kD * 2;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kBlockN * kRowBytes;
  static constexpr int kQ = kV + kBlockN * kRowBytes;
  static constexpr int kdO = kQ + 2 * kBlockM * kRowBytes;
  static constexpr int kP = kdO + 2 * kBlockM * kRowBytes;
  static constexpr int kdS = kP + kBlockN * kBlockM * 2;
  static constexpr int kLse = kdS + kBlockN * kBlockM * 2;
  static constexpr int kDsum = kLse + 2 * kBlockM * 4;
  static constexpr int kBytes = kDsum + 2 * kBlockM * 4;
};

template <typename Elem, int kD, int kBlockM, int kBlockN, int kNWarps, int kSdpWN, int kDkvWN, int kDqWM,
          bool kGeneral>
__global__ void __launch_bounds__(kNWarps * 32, 1) bwd_kernel(const __grid_constant__ KArgs a) {
  constexpr int kThreads = kNWarps * 32;
  constexpr int kRowBytes = kD * 2;
  constexpr int kPRowBytes = kBlockM * 2;
  // S^T / dP^T: kSdpWN warps along keys (kSdpMT 16-row tiles each), the rest
  // along queries (kSdpCols each).
  constexpr int kSdpMT = kBlockN / kSdpWN / 16;
  constexpr int kSdpCols = kBlockM / (kNWarps / kSdpWN);
  constexpr int kSdpNT = kSdpCols / 8;
  // dK / dV: kDkvWN warps along keys, the rest split the head dim.
  constexpr int kDkvMT = kBlockN / kDkvWN / 16;
  constexpr int kDkvCols = kD / (kNWarps / kDkvWN);
  constexpr int kDkvNT = kDkvCols / 8;
  // dQ: kDqWM warps along queries, the rest split the head dim.
  constexpr int kDqMT = kBlockM / kDqWM / 16;
  constexpr int kDqCols = kD / (kNWarps / kDqWM);
  constexpr int kDqNT = kDqCols / 8;
  static_assert(kSdpMT >= 1 && kDkvMT >= 1 && kDqMT >= 1, "whole 16-row tiles per warp");
  static_assert(kBlockN == 16 * kSdpMT * kSdpWN && kBlockN == 16 * kDkvMT * kDkvWN && kBlockM == 16 * kDqMT * kDqWM,
                "warp slices cover the tile");
  static_assert(kSdpCols % 16 == 0 && kDkvCols % 16 == 0 && kDqCols % 16 == 0, "whole k16 steps");
  static_assert((kDkvCols % 64 == 0 || kDkvNT <= 8) && (kDqCols % 64 == 0 || kDqNT <= 8), "SwzAddr chunk offsets");
  using L = BwdSmem<kD, kBlockM, kBlockN>;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = smem_u32(smem);
  const uint32_t sK = s0 + L::kK, sV = s0 + L::kV, sQ = s0 + L::kQ, sdO = s0 + L::kdO;
  const uint32_t sP = s0 + L::kP, sdS = s0 + L::kdS, sLse = s0 + L::kLse, sDsum = s0 + L::kDsum;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqInfo sq = seq_info(a, b);
  const int n0 = n_block * kBlockN;
  const int rows_out = a.kv_thd ? sq.len_kv : a.s_kv;
  if (n0 >= rows_out) return;
  const int rows_here = min(kBlockN, rows_out - n0);

  const Elem* gK = static_cast<const Elem*>(a.k) + b * a.k_sb + (sq.off_kv + n0) * a.k_ss + hk * a.k_sh;
  const Elem* gV = static_cast<const Elem*>(a.v) + b * a.v_sb + (sq.off_kv + n0) * a.v_ss + hk * a.v_sh;
  Elem* gdK = static_cast<Elem*>(a.dk) + b * a.dk_sb + (sq.off_kv + n0) * a.dk_ss + hk * a.dk_sh;
  Elem* gdV = static_cast<Elem*>(a.dv) + b * a.dv_sb + (sq.off_kv + n0) * a.dv_ss + hk * a.dv_sh;

  // Query rows that see any key of the tile.
  const int diag = seq_diag(a, sq);
  const int n_end = min(n0 + kBlockN, sq.len_kv);
  int i_lo = 0, i_hi = sq.len_q;
  if (a.wr >= 0) i_lo = max(0, n0 - diag - a.wr);
  if (a.wl >= 0) i_hi = min(i_hi, n_end - 1 - diag + a.wl + 1);
  if (n_end <= n0 || i_hi <= i_lo) {
    zero_tile<kBlockN, kD, kThreads>(gdK, a.dk_ss, rows_here, a.d_qk, tid);
    zero_tile<kBlockN, kD, kThreads>(gdV, a.dv_ss, rows_here, a.d_v, tid);
    return;
  }
  const int m_lo = i_lo / kBlockM;
  const int nm = (i_hi + kBlockM - 1) / kBlockM - m_lo;
  const int n_it = a.group * nm;

  int64_t seed = 0, offset = 0;
  if (kGeneral && a.dropout) {
    seed = a.rng[0];
    offset = a.rng[1];
  }

  auto load_qdo = [&](int it, int buf) {
    const int h = hk * a.group + it / nm;
    const int mm0 = (m_lo + it % nm) * kBlockM;
    const Elem* gQ = static_cast<const Elem*>(a.q) + b * a.q_sb + (sq.off_q + mm0) * a.q_ss + h * a.q_sh;
    const Elem* gdO = static_cast<const Elem*>(a.dout) + b * a.do_sb + (sq.off_q + mm0) * a.do_ss + h * a.do_sh;
    load_tile<kBlockM, kD, kThreads>(sQ + buf * kBlockM * kRowBytes, gQ, a.q_ss, sq.len_q - mm0, a.d_qk, tid);
    load_tile<kBlockM, kD, kThreads>(sdO + buf * kBlockM * kRowBytes, gdO, a.do_ss, sq.len_q - mm0, a.d_v, tid);
    if (tid < kBlockM) {
      const bool pred = mm0 + tid < sq.len_q;
      const int64_t row = static_cast<int64_t>(h) * a.rows_q + q_row_token(a, sq, b, mm0 + tid);
      cp_async4(sLse + (buf * kBlockM + tid) * 4, pred ? a.lse2 + row : a.lse2, pred);
      cp_async4(sDsum + (buf * kBlockM + tid) * 4, pred ? a.dsum + row : a.dsum, pred);
    }
  };

  load_qdo(0, 0);
  load_tile<kBlockN, kD, kThreads>(sK, gK, a.k_ss, sq.len_kv - n0, a.d_qk, tid);
  load_tile<kBlockN, kD, kThreads>(sV, gV, a.v_ss, sq.len_kv - n0, a.d_v, tid);
  cp_async_commit();

  float dk[kDkvMT][kDkvNT][4], dv[kDkvMT][kDkvNT][4];
#pragma unroll
  for (int mt = 0; mt < kDkvMT; ++mt)
#pragma unroll
    for (int t = 0; t < kDkvNT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[mt][t][e] = dv[mt][t][e] = 0.f;

  const int wn = warp % kSdpWN, wm = warp / kSdpWN;     // S^T / dP^T slice
  const int wn2 = warp % kDkvWN, wd2 = warp / kDkvWN;   // dK / dV slice
  const int wm3 = warp % kDqWM, wd3 = warp / kDqWM;     // dQ slice
  const int jw = wn * kSdpMT * 16;                      // first key row of the S^T slice
  // Matmuls run over the whole bucket: columns past d_qk / d_v were loaded as
  // zeros (no runtime guards inside the unrolled loops; see fwd_kernel.h).
  const SwzAddr<kRowBytes> aK(sK, jw + (lane & 15), lane >> 4);  // A: key rows (sV at the same offsets)
  const SwzAddr<kRowBytes> aQ(sQ, wm * kSdpCols + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);  // B: queries
  const SwzAddr<kPRowBytes> aP(sP, wn2 * kDkvMT * 16 + (lane & 15), lane >> 4);  // A: P^T rows (sdS alike)
  const SwzAddr<kRowBytes> aQt(sQ, (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4, wd2 * (kDkvCols / 8));
  const SwzAddr<kRowBytes> aKt(sK, (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4, wd3 * (kDqCols / 8));
  uint32_t aS_t[kDqMT];  // A (transposed): dS rows = query columns of sdS
#pragma unroll
  for (int mt = 0; mt < kDqMT; ++mt) {
    aS_t[mt] = sdS + (((lane >> 4) << 3) + (lane & 7)) * kPRowBytes +
               ((((wm3 * kDqMT + mt) * 2 + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
  }
  constexpr uint32_t kVoff = L::kV - L::kK, kdOoff = L::kdO - L::kQ, kdSoff = L::kdS - L::kP;

  for (int it = 0; it < n_it; ++it) {
    const int buf = it & 1;
    const int h = hk * a.group + it / nm;
    const int mm0 = (m_lo + it % nm) * kBlockM;
    cp_async_wait<0>();
    __syncthreads();  // this tile's Q/dO landed; every warp is done with the other buffer and with sP/sdS
    if (it + 1 < n_it) {
      load_qdo(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const uint32_t boff = buf * kBlockM * kRowBytes;
    const uint32_t sLb = sLse + buf * kBlockM * 4, sDb = sDsum + buf * kBlockM * 4;

    float st[kSdpMT][kSdpNT][4], dpt[kSdpMT][kSdpNT][4];
#pragma unroll
    for (int mt = 0; mt < kSdpMT; ++mt)
#pragma unroll
      for (int t = 0; t < kSdpNT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[mt][t][e] = dpt[mt][t][e] = 0.f;

    // S^T = K Q^T, dP^T = V dO^T
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ka[kSdpMT][4], va[kSdpMT][4];
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt) {
        ldsm_x4(aK.at(kk, mt * 16), ka[mt]);
        ldsm_x4(aK.at(kk, mt * 16) + kVoff, va[mt]);
      }
#pragma unroll
      for (int np = 0; np < kSdpNT / 2; ++np) {
        uint32_t qb[4], ob[4];
        ldsm_x4(aQ.at(kk, np * 16) + boff, qb);
        ldsm_x4(aQ.at(kk, np * 16) + boff + kdOoff, ob);
#pragma unroll
        for (int mt = 0; mt < kSdpMT; ++mt) {
          mma<Elem>(st[mt][2 * np], ka[mt], qb[0], qb[1]);
          mma<Elem>(st[mt][2 * np + 1], ka[mt], qb[2], qb[3]);
          mma<Elem>(dpt[mt][2 * np], va[mt], ob[0], ob[1]);
          mma<Elem>(dpt[mt][2 * np + 1], va[mt], ob[2], ob[3]);
        }
      }
    }

    // P^T and dS^T, element-wise. Rows of the fragments are keys, columns queries.
    const bool edge = tile_needs_mask(a, mm0, kBlockM, n0, kBlockN, sq.len_kv, diag);
    float slope = 0.f;
    if (kGeneral && a.bias_type == 2) slope = a.alibi[b * a.al_sb + h * a.al_sh];
    const int64_t bh = static_cast<int64_t>(b) * a.h_q + h;
#pragma unroll
    for (int nt = 0; nt < kSdpNT; ++nt) {
      const int il0 = wm * kSdpCols + nt * 8 + 2 * (lane & 3);
      const float l0 = ld_shared_f32(sLb + il0 * 4), l1 = ld_shared_f32(sLb + il0 * 4 + 4);
      const float d0 = ld_shared_f32(sDb + il0 * 4), d1 = ld_shared_f32(sDb + il0 * 4 + 4);
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int jl = jw + mt * 16 + (lane >> 2) + 8 * (e >> 1);
          const int j = n0 + jl, i = mm0 + il0 + (e & 1);
          float p;
          if (!kGeneral) {
            // One FFMA: exp2(qk * scale * log2(e) - lse2).
            p = fast_exp2(fmaf(st[mt][nt][e], a.scale_log2, -((e & 1) ? l1 : l0)));
            if (edge) {
              // Queries that see key j form the interval [lo, hi].
              const int lo = j >= sq.len_kv ? INT_MAX / 2 : (a.wr >= 0 ? j - diag - a.wr : INT_MIN / 2);
              const int hi = a.wl >= 0 ? j - diag + a.wl : INT_MAX / 2;
              if (i < lo || i > hi) p = 0.f;
            }
          } else {
            const float s2 = general_logit<Elem>(a, st[mt][nt][e], b, h, i, j, sq, diag, edge, slope);
            p = fast_exp2(s2 - ((e & 1) ? l1 : l0));
          }
          float dp = dpt[mt][nt][e], pd = p;
          if (kGeneral && a.dropout) {
            const Philox4 r = dropout_draws(seed, offset, bh, i, j >> 2);
            const int sub = j & 3;
            const uint32_t x = sub == 0 ? r.x[0] : sub == 1 ? r.x[1] : sub == 2 ? r.x[2] : r.x[3];
            const bool keep = x >= a.drop_thr;
            dp = keep ? dp * a.rp_drop : 0.f;
            pd = keep ? p * a.rp_drop : 0.f;
          }
          const float ds = p * (dp - ((e & 1) ? d1 : d0));
          st[mt][nt][e] = pd;
          dpt[mt][nt][e] = ds;
          if (kGeneral && a.dbias != nullptr && i < sq.len_q && j < sq.len_kv) {
            const int64_t di = b * a.db_sb + h * a.db_sh + i * a.db_si + j * a.db_sj;
            if (a.dbias_direct) {
              static_cast<Elem*>(a.dbias)[di] = from_float<Elem>(ds);
            } else {
              atomicAdd(a.dbias_acc + di, ds);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int jl = jw + mt * 16 + (lane >> 2) + 8 * r;
          const uint32_t off = swz<kPRowBytes>(jl, il0 >> 3) + (lane & 3) * 4;
          st_shared32(sP + off, pack2<Elem>(st[mt][nt][2 * r], st[mt][nt][2 * r + 1]));
          st_shared32(sdS + off, pack2<Elem>(dpt[mt][nt][2 * r], dpt[mt][nt][2 * r + 1]));
        }
      }
    }
    __syncthreads();  // P^T and dS^T complete

    // dV += P^T dO, dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t pa[kDkvMT][4], sa[kDkvMT][4];
#pragma unroll
      for (int mt = 0; mt < kDkvMT; ++mt) {
        ldsm_x4(aP.at(kk, mt * 16), pa[mt]);
        ldsm_x4(aP.at(kk, mt * 16) + kdSoff, sa[mt]);
      }
#pragma unroll
      for (int dp = 0; dp < kDkvNT / 2; ++dp) {
        const uint32_t brow = aQt.at(dp, kk * 16) + boff;
        uint32_t ob[4], qb[4];
        ldsm_x4_t(brow + kdOoff, ob);
        ldsm_x4_t(brow, qb);
#pragma unroll
        for (int mt = 0; mt < kDkvMT; ++mt) {
          mma<Elem>(dv[mt][2 * dp], pa[mt], ob[0], ob[1]);
          mma<Elem>(dv[mt][2 * dp + 1], pa[mt], ob[2], ob[3]);
          mma<Elem>(dk[mt][2 * dp], sa[mt], qb[0], qb[1]);
          mma<Elem>(dk[mt][2 * dp + 1], sa[mt], qb[2], qb[3]);
        }
      }
    }

    // dQ = dS K, accumulated in fp32 across key tiles.
    float dq[kDqMT][kDqNT][4];
#pragma unroll
    for (int mt = 0; mt < kDqMT; ++mt)
#pragma unroll
      for (int t = 0; t < kDqNT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[mt][t][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t da[kDqMT][4];
#pragma unroll
      for (int mt = 0; mt < kDqMT; ++mt) ldsm_x4_t(aS_t[mt] + kk * 16 * kPRowBytes, da[mt]);
#pragma unroll
      for (int dp = 0; dp < kDqNT / 2; ++dp) {
        uint32_t kb[4];
        ldsm_x4_t(aKt.at(dp, kk * 16), kb);
#pragma unroll
        for (int mt = 0; mt < kDqMT; ++mt) {
          mma<Elem>(dq[mt][2 * dp], da[mt], kb[0], kb[1]);
          mma<Elem>(dq[mt][2 * dp + 1], da[mt], kb[2], kb[3]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < kDqMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = mm0 + (wm3 * kDqMT + mt) * 16 + (lane >> 2) + 8 * r;
        if (i < sq.len_q) {
          float* row = a.dq_acc + (q_row_token(a, sq, b, i) * a.h_q + h) * a.acc_d;
#pragma unroll
          for (int nt = 0; nt < kDqNT; ++nt) {
            const int col = wd3 * kDqCols + nt * 8 + 2 * (lane & 3);
            if (col < a.d_qk) atomic_add2(row + col, dq[mt][nt][2 * r], dq[mt][nt][2 * r + 1]);
          }
        }
      }
  }

  // Epilogue: dK (scaled) and dV through shared memory into 16-byte stores.
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kDkvMT; ++mt)
#pragma unroll
    for (int t = 0; t < kDkvNT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = (wn2 * kDkvMT + mt) * 16 + (lane >> 2) + 8 * r;
        const uint32_t off = swz<kRowBytes>(row, wd2 * (kDkvCols / 8) + t) + (lane & 3) * 4;
        st_shared32(sK + off, pack2<Elem>(dk[mt][t][2 * r] * a.scale, dk[mt][t][2 * r + 1] * a.scale));
        st_shared32(sV + off, pack2<Elem>(dv[mt][t][2 * r], dv[mt][t][2 * r + 1]));
      }
  __syncthreads();
  store_tile<kBlockN, kD, kThreads>(sK, gdK, a.dk_ss, rows_here, a.d_qk, tid);
  store_tile<kBlockN, kD, kThreads>(sV, gdV, a.dv_ss, rows_here, a.d_v, tid);
}

}  // namespace tc
}  // namespace fusedattn
