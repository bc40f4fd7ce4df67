// FlashAttention-2-style backward, main pass: one block per (key tile,
// kv head, sequence). The block keeps its K and V tiles in shared memory and
// dK, dV in registers while it walks every query tile of every query head of
// its GQA group (so dK/dV need no cross-block reduction). Per query tile:
//   S^T = K Q^T and dP^T = V dO^T                     (registers)
//   P^T = exp2(S^T * scale*log2e - lse2), dS^T = P^T (dP^T - D)  (softcap, masks, dropout)
//   P^T, dS^T -> shared memory
//   dV += P^T dO, dK += dS^T Q                        (registers)
//   dQ  = dS K -> fp32 atomics into the workspace accumulator
// Q/dO (and their lse2 / D rows) are double-buffered: the next tile's cp.async
// is issued once P^T/dS^T are in shared memory, before the tile's dK/dV/dQ
// matmuls. Computing the transposed scores keeps the key rows of every warp's
// fragments, which is what dK/dV need.
#pragma once

#include "fwd_kernel.h"


namespace fusedattn {
namespace tc {

// Query rows [lo, hi) that see some key of key tile n_block (empty when
// hi <= lo). The main kernel's loop bounds and the deterministic ordering below
// both come from here, so they cannot disagree.
struct RowRange {
  int lo, hi;
};

template <int kBlockN>
__device__ __forceinline__ RowRange key_tile_rows(const Visibility<int>& vis, int n_block) {
  const int n0 = n_block * kBlockN, n_end = min(n0 + kBlockN, vis.len_kv);
  if (n_end <= n0) return RowRange{0, 0};
  return RowRange{vis.row_lo(n0), vis.row_hi(n_end - 1)};
}

// Deterministic dQ (KArgs::dq_lock): the blocks that add into one query tile
// m do so in key-tile order, so every dQ element sums its terms in one fixed
// order. The visitors of m are a contiguous run of key tiles (row ranges only
// grow with the key tile; empty ranges lie before the first or after the last
// visitor), so block n's turn is n - first(m), where first(m) is the smallest
// key tile whose rows reach tile m: a binary search over tiles 0..n.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int dq_turn(const Visibility<int>& vis, int n_block, int m) {
  int lo = 0, hi = n_block;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const RowRange r = key_tile_rows<kBlockN>(vis, mid);
    if (r.hi > r.lo && (r.hi + kBlockM - 1) / kBlockM > m) hi = mid; else lo = mid + 1;
  }
  return n_block - lo;
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Waits until *lock == turn. A block waits only for blocks with a lower ticket
// (block_tile), which had started when it drew its own, so the wait ends; a
// counter that never gets there is a bug, and trapping (a launch error) beats
// hanging the GPU.
__device__ __forceinline__ void wait_turn(const int* lock, int turn) {
  for (long long spins = 0; ld_acquire_gpu(lock) != turn; ++spins) {
    if (spins > (1ll << 31)) __trap();
    __nanosleep(32);
  }
}

// The (key tile, kv head, batch) a block works on. Deterministic mode takes it from a ticket drawn
// in arrival order (the counter after the dQ locks, zeroed before the launch), linear in the grid's
// x-fastest order, instead of from blockIdx: CUDA does not promise that blocks start in index
// order, and a block must only wait for blocks that are already running.
struct BlockTile {
  int n_block, hk, b;
};
__device__ __forceinline__ BlockTile block_tile(const KArgs& a, int* bcast) {
  if (a.dq_lock == nullptr) return BlockTile{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                                             static_cast<int>(blockIdx.z)};
  if (threadIdx.x == 0) *bcast = atomicAdd(a.dq_lock + static_cast<int64_t>(a.b) * a.h_q * a.dq_lock_mt, 1);
  __syncthreads();
  const int t = *bcast;
  __syncthreads();  // *bcast is shared memory the kernel reuses
  const int gx = static_cast<int>(gridDim.x), gy = static_cast<int>(gridDim.y);
  return BlockTile{t % gx, (t / gx) % gy, t / (gx * gy)};
}

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
          Variant kV>
__global__ void __launch_bounds__(kNWarps * 32, 1) bwd_kernel(const __grid_constant__ KArgs a) {
  constexpr bool kGeneral = kV == Variant::kGeneral, kCap = kV == Variant::kSoftcap;
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
  const BlockTile bt = block_tile(a, reinterpret_cast<int*>(smem + L::kLse));
  const int n_block = bt.n_block, hk = bt.hk, b = bt.b;
  const SeqInfo sq = seq_info(a, b);
  const int n0 = n_block * kBlockN;
  const int rows_out = a.kv_thd ? sq.len_kv : a.s_kv;
  if (n0 >= rows_out) return;
  const int rows_here = min(kBlockN, rows_out - n0);

  const Elem* gK = static_cast<const Elem*>(a.k) + b * a.k_sb + (sq.off_kv + n0) * a.k_ss + hk * a.k_sh;
  const Elem* gV = static_cast<const Elem*>(a.v) + b * a.v_sb + (sq.off_kv + n0) * a.v_ss + hk * a.v_sh;
  // dK / dV destinations (computed where used, not kept live across the main loop).
  auto dk_ptr = [&]() {
    return static_cast<Elem*>(a.dk) + b * a.dk_sb + (sq.off_kv + n0) * a.dk_ss + hk * a.dk_sh;
  };
  auto dv_ptr = [&]() {
    return static_cast<Elem*>(a.dv) + b * a.dv_sb + (sq.off_kv + n0) * a.dv_ss + hk * a.dv_sh;
  };

  // Query rows that see any key of the tile.
  const Visibility<int> vis = seq_vis(a, sq);
  const RowRange rows = key_tile_rows<kBlockN>(vis, n_block);
  const int i_lo = rows.lo, i_hi = rows.hi;
  if (i_hi <= i_lo) {
    zero_tile<kBlockN, kD, kThreads>(dk_ptr(), a.dk_ss, rows_here, a.d_qk, tid);
    zero_tile<kBlockN, kD, kThreads>(dv_ptr(), a.dv_ss, rows_here, a.d_v, tid);
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

  // Loader geometry: each thread copies one 16-byte column chunk of every
  // kLdStep-th row; its global and shared offsets are fixed, so per tile only
  // the (uniform) tile origin changes.
  constexpr int kLdChunks = kD / 8, kLdStep = kThreads / kLdChunks;
  static_assert(kThreads % kLdChunks == 0 && kBlockM % kLdStep == 0 && kLdStep % 8 == 0, "loader shape");
  // Row of query position 0 in the workspace's per-row arrays (q_row_token is linear in i).
  const int64_t tok0 = a.q_thd ? sq.off_q : static_cast<int64_t>(b) * a.s_q;

  auto load_qdo = [&](int h, int mm0, int buf) {
    // Thread offsets are recomputed here (cheap) rather than kept live across the loop.
    const int ft = fresh_tid(), lc = ft % kLdChunks, lr = ft / kLdChunks;
    const bool q_col_ok = lc * 8 < a.d_qk, do_col_ok = lc * 8 < a.d_v;
    // Predicated-off copies read nothing (see load_tile): no address clamping.
    const Elem* gq = static_cast<const Elem*>(a.q) + (b * a.q_sb + (sq.off_q + mm0) * a.q_ss + h * a.q_sh) +
                     (lr * a.q_ss + lc * 8);
    const Elem* gdo = static_cast<const Elem*>(a.dout) + (b * a.do_sb + (sq.off_q + mm0) * a.do_ss + h * a.do_sh) +
                      (lr * a.do_ss + lc * 8);
    const uint32_t soff = swz<kRowBytes>(lr, lc);
    const uint32_t dq_ = sQ + buf * kBlockM * kRowBytes + soff, ddo = sdO + buf * kBlockM * kRowBytes + soff;
    const int rows_left = sq.len_q - mm0 - lr;
#pragma unroll
    for (int r = 0; r < kBlockM / kLdStep; ++r) {
      const bool row_ok = r * kLdStep < rows_left;
      cp_async16(dq_ + r * kLdStep * kRowBytes, gq + r * kLdStep * a.q_ss, q_col_ok && row_ok);
      cp_async16(ddo + r * kLdStep * kRowBytes, gdo + r * kLdStep * a.do_ss, do_col_ok && row_ok);
    }
    if (tid < kBlockM) {
      const bool pred = mm0 + tid < sq.len_q;
      const int64_t row = static_cast<int64_t>(h) * a.rows_q + tok0 + mm0 + tid;
      cp_async4(sLse + (buf * kBlockM + tid) * 4, a.lse2 + row, pred);
      cp_async4(sDsum + (buf * kBlockM + tid) * 4, a.dsum + row, pred);
    }
  };

  // Tiles are visited head-major: (h, m) = (hk * group + it / nm, m_lo + it % nm),
  // tracked incrementally (no integer division in the loop).
  int h_cur = hk * a.group, m_cur = m_lo;
  load_qdo(h_cur, m_cur * kBlockM, 0);
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
  // dQ atomics: a thread's rows are (wm3 * kDqMT + mt) * 16 + (lane >> 2) + 8 r of the
  // tile, its columns wd3 * kDqCols + nt * 8 + 2 (lane & 3); workspace rows are
  // h_q * acc_d floats apart. Columns past d_qk (inside the bucket) receive exact
  // zeros (K's padding columns are zero), so only rows need a check.
  const int dq_rstride = a.h_q * a.acc_d;
  const int dq_lrow = wm3 * kDqMT * 16 + (lane >> 2);
  const int dq_toff = dq_lrow * dq_rstride + wd3 * kDqCols + 2 * (lane & 3);

  for (int it = 0; it < n_it; ++it) {
    const int buf = it & 1;
    const int h = h_cur;
    const int mm0 = m_cur * kBlockM;
    // The next tile.
    if (++m_cur == m_lo + nm) {
      m_cur = m_lo;
      ++h_cur;
    }
    cp_async_wait<0>();
    __syncthreads();  // this tile's Q/dO landed; every warp is done with the other buffer and with sP/sdS
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
    const bool edge = !vis.keys_all_visible(mm0, mm0 + kBlockM - 1, n0, kBlockN);
    float slope = 0.f;
    if (kGeneral && a.bias_type == 2) slope = a.alibi[b * a.al_sb + h * a.al_sh];
    const int64_t bh = static_cast<int64_t>(b) * a.h_q + h;
    // (1) Fast variants: P^T = exp2(S^T * scale * log2(e) - lse2). kSoftcap: P^T = exp2(tanh(S^T *
    // scale / softcap) * softcap * log2(e) - lse2), and the tanh's factor goes into dP^T here, with D:
    // dP^T <- (dP^T - D) (1 - tanh^2), so nothing of the tanh stays live into (3).
    if (!kGeneral) {
#pragma unroll
      for (int nt = 0; nt < kSdpNT; ++nt) {
        const int il0 = wm * kSdpCols + nt * 8 + 2 * (lane & 3);
        const float l0 = ld_shared_f32(sLb + il0 * 4), l1 = ld_shared_f32(sLb + il0 * 4 + 4);
        float d0 = 0.f, d1 = 0.f;
        if (kCap) {
          d0 = ld_shared_f32(sDb + il0 * 4);
          d1 = ld_shared_f32(sDb + il0 * 4 + 4);
        }
#pragma unroll
        for (int mt = 0; mt < kSdpMT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float l = (e & 1) ? l1 : l0;
            if (kCap) {
              const float t = softcap_tanh(a, st[mt][nt][e]);
              st[mt][nt][e] = fast_exp2(fmaf(t, a.softcap_log2, -l));
              dpt[mt][nt][e] = (dpt[mt][nt][e] - ((e & 1) ? d1 : d0)) * (1.f - t * t);
            } else {
              // One FFMA: exp2(qk * scale * log2(e) - lse2).
              st[mt][nt][e] = fast_exp2(fmaf(st[mt][nt][e], a.scale_log2, -l));
            }
          }
      }
    }
    // (2) Window / length mask, only on the tiles that need it (a uniform
    // branch: interior tiles skip the compares). Key j is visible to query i
    // iff j < len_kv and t_lo <= i - j <= t_hi; i - j is a per-thread base
    // plus compile-time offsets, so nothing per row has to stay live across
    // the loop.
    if (!kGeneral && edge) {
      const int jt = n0 + jw + (lane >> 2);
      const int tb = mm0 + wm * kSdpCols + 2 * (lane & 3) - jt;
      const int kv_left = sq.len_kv - jt;
      const int t_lo = -vis.offset_hi(), t_hi = -vis.offset_lo();
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const bool row_ok = mt * 16 + 8 * r < kv_left;
#pragma unroll
          for (int nt = 0; nt < kSdpNT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int t = tb + nt * 8 + c - mt * 16 - 8 * r;
              if (!row_ok || t < t_lo || t > t_hi) st[mt][nt][2 * r + c] = 0.f;
            }
        }
    }
    // (3) dS^T = P^T (dP^T - D) (kSoftcap: D and the tanh's factor are in dP^T already). The
    // general variant does all of its per-element work here: logits (capped, bias, masks), P^T,
    // dropout, dS^T, dbias (the bias comes after the cap: its gradient is dS itself), and the cap's
    // factor 1 - tanh^2 on dS^T.
#pragma unroll
    for (int nt = 0; nt < kSdpNT; ++nt) {
      const int il0 = wm * kSdpCols + nt * 8 + 2 * (lane & 3);
      float d0 = 0.f, d1 = 0.f, l0 = 0.f, l1 = 0.f;
      if (!kCap) {
        d0 = ld_shared_f32(sDb + il0 * 4);
        d1 = ld_shared_f32(sDb + il0 * 4 + 4);
      }
      if (kGeneral) {
        l0 = ld_shared_f32(sLb + il0 * 4);
        l1 = ld_shared_f32(sLb + il0 * 4 + 4);
      }
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = (e & 1) ? d1 : d0;
          if (!kGeneral) {
            dpt[mt][nt][e] = st[mt][nt][e] * (dpt[mt][nt][e] - d);
          } else {
            const int jl = jw + mt * 16 + (lane >> 2) + 8 * (e >> 1);
            const int j = n0 + jl, i = mm0 + il0 + (e & 1);
            float g;
            const float x = general_score(a, st[mt][nt][e], g);
            const float p = fast_exp2(general_logit<Elem>(a, x, b, h, i, j, sq, vis, edge, slope) - (e & 1 ? l1 : l0));
            float dp = dpt[mt][nt][e], pd = p;
            if (a.dropout) {
              const Philox4 r = dropout_draws(seed, offset, bh, i, j >> 2);
              const int sub = j & 3;
              const uint32_t u = sub == 0 ? r.x[0] : sub == 1 ? r.x[1] : sub == 2 ? r.x[2] : r.x[3];
              const bool keep = u >= a.drop_thr;
              dp = keep ? dp * a.rp_drop : 0.f;
              pd = keep ? p * a.rp_drop : 0.f;
            }
            const float ds = p * (dp - d);
            st[mt][nt][e] = pd;
            dpt[mt][nt][e] = ds * g;
            if (a.dbias != nullptr && i < sq.len_q && j < sq.len_kv) {
              const int64_t di = b * a.db_sb + h * a.db_sh + i * a.db_si + j * a.db_sj;
              if (a.dbias_direct) {
                static_cast<Elem*>(a.dbias)[di] = from_float<Elem>(ds);
              } else {
                atomicAdd(a.dbias_acc + di, ds);
              }
            }
          }
        }
      }
    }
#if !FUSEDATTN_TC_HAS_STMATRIX
#pragma unroll
    for (int nt = 0; nt < kSdpNT; ++nt)
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int jl = jw + mt * 16 + (lane >> 2) + 8 * r;
          const uint32_t off = swz<kPRowBytes>(jl, (wm * kSdpCols >> 3) + nt) + (lane & 3) * 4;
          st_shared32(sP + off, pack2<Elem>(st[mt][nt][2 * r], st[mt][nt][2 * r + 1]));
          st_shared32(sdS + off, pack2<Elem>(dpt[mt][nt][2 * r], dpt[mt][nt][2 * r + 1]));
        }
#else
    {
      // stmatrix x4 per (16 keys x 16 queries): matrices (rows +0/+8) x (query
      // chunks nt, nt+1); lane l addresses row l%8 of matrix l/8.
      const SwzAddr<kPRowBytes> aPs(sP, jw + (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4,
                                    wm * (kSdpCols / 8));
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt)
#pragma unroll
        for (int np = 0; np < kSdpNT / 2; ++np) {
          const uint32_t ad = aPs.at(np, mt * 16);
          stsm_x4(ad, pack2<Elem>(st[mt][2 * np][0], st[mt][2 * np][1]),
                  pack2<Elem>(st[mt][2 * np][2], st[mt][2 * np][3]),
                  pack2<Elem>(st[mt][2 * np + 1][0], st[mt][2 * np + 1][1]),
                  pack2<Elem>(st[mt][2 * np + 1][2], st[mt][2 * np + 1][3]));
          stsm_x4(ad + kdSoff, pack2<Elem>(dpt[mt][2 * np][0], dpt[mt][2 * np][1]),
                  pack2<Elem>(dpt[mt][2 * np][2], dpt[mt][2 * np][3]),
                  pack2<Elem>(dpt[mt][2 * np + 1][0], dpt[mt][2 * np + 1][1]),
                  pack2<Elem>(dpt[mt][2 * np + 1][2], dpt[mt][2 * np + 1][3]));
        }
    }
#endif
    __syncthreads();  // P^T and dS^T complete

    // Prefetch the next tile's Q/dO into the other buffer (every warp is past
    // this tile's first barrier, so none still reads it). Issued here, not
    // right after that barrier: the address arithmetic then overlaps the other
    // warps' matmuls instead of delaying this tile's first HMMA, and S^T/dP^T
    // are no longer live (register pressure).
    if (it + 1 < n_it) {
      load_qdo(h_cur, m_cur * kBlockM, buf ^ 1);
      cp_async_commit();
    }

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
    int* lock = nullptr;
    if (a.dq_lock != nullptr) {
      lock = a.dq_lock + (static_cast<int64_t>(b) * a.h_q + h) * a.dq_lock_mt + mm0 / kBlockM;
      if (tid == 0) wait_turn(lock, dq_turn<kBlockM, kBlockN>(vis, n_block, mm0 / kBlockM));
      __syncthreads();
    }
    float* dq_tile = a.dq_acc + ((tok0 + mm0) * a.h_q + h) * a.acc_d + dq_toff;
    const int rows_left = sq.len_q - mm0 - dq_lrow;
#pragma unroll
    for (int mt = 0; mt < kDqMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (mt * 16 + 8 * r < rows_left) {
          float* row = dq_tile + (mt * 16 + 8 * r) * dq_rstride;
#pragma unroll
          for (int nt = 0; nt < kDqNT; ++nt) atomic_add2(row + nt * 8, dq[mt][nt][2 * r], dq[mt][nt][2 * r + 1]);
        }
      }
    if (lock != nullptr) {
      // Every thread's additions are visible device-wide before the next
      // block of the tile may start its own.
      __threadfence();
      __syncthreads();
      if (tid == 0) atomicAdd(lock, 1);
    }
  }

  // Epilogue: dK (scaled) and dV through shared memory into 16-byte stores. Keys past the sequence
  // (bshd / sbhd padding) get zeros: a NaN or inf query row or dO row reaches their accumulators
  // through 0 * NaN.
  __syncthreads();
  const int keys_here = sq.len_kv - n0;
#pragma unroll
  for (int mt = 0; mt < kDkvMT; ++mt)
#pragma unroll
    for (int t = 0; t < kDkvNT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = (wn2 * kDkvMT + mt) * 16 + (lane >> 2) + 8 * r;
        const uint32_t off = swz<kRowBytes>(row, wd2 * (kDkvCols / 8) + t) + (lane & 3) * 4;
        const bool real = row < keys_here;
        st_shared32(sK + off, real ? pack2<Elem>(dk[mt][t][2 * r] * a.scale, dk[mt][t][2 * r + 1] * a.scale) : 0u);
        st_shared32(sV + off, real ? pack2<Elem>(dv[mt][t][2 * r], dv[mt][t][2 * r + 1]) : 0u);
      }
  __syncthreads();
  // fresh_tid(), not tid: keeps the store offsets from living across the main loop.
  store_tile<kBlockN, kD, kThreads>(sK, dk_ptr(), a.dk_ss, rows_here, a.d_qk, fresh_tid());
  store_tile<kBlockN, kD, kThreads>(sV, dv_ptr(), a.dv_ss, rows_here, a.d_v, fresh_tid());
}

}  // namespace tc
}  // namespace fusedattn
