// The small memory-bound kernels around the two main ones: backward
// preprocessing (D = rowsum(dO * O), lse in the log2 domain, d_softmax_offset),
// dQ conversion from the fp32 accumulator, dbias conversion for broadcast
// shapes, max_logit initialisation, and zero-filling thd tokens that belong to
// no sequence (gaps from cu_seqlens_*_padded, and the tail past the last one).
#pragma once

#include <cmath>

#include "fwd_kernel.h"

namespace fusedattn {
namespace tc {

// One warp per (query row, head): D = dO . O, lse2 = lse * log2(e) (+inf where
// the row sees no key or lies past its sequence, so P = exp2(s - lse2) = 0; NaN
// for a NaN row, whose P, dq and its keys' dk, dv are then NaN),
// and for the learnable softmax d_offset[h] -= exp(offset[h] - lse) * D.
template <typename Elem>
__global__ void __launch_bounds__(256) bwd_preprocess_kernel(const __grid_constant__ KArgs a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * 8 + warp, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo sq = seq_info(a, b);
  const int rows = a.q_thd ? sq.len_q : a.s_q;
  float contrib = 0.f;
  if (i < rows) {
    float dot = 0.f;
    if (i < sq.len_q) {
      const Elem* o = static_cast<const Elem*>(a.o) + b * a.o_sb + (sq.off_q + i) * a.o_ss + h * a.o_sh;
      const Elem* g = static_cast<const Elem*>(a.dout) + b * a.do_sb + (sq.off_q + i) * a.do_ss + h * a.do_sh;
      for (int c = lane * 8; c < a.d_v; c += 256) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
        const uint4 gv = *reinterpret_cast<const uint4*>(g + c);
        const Elem* oe = reinterpret_cast<const Elem*>(&ov);
        const Elem* ge = reinterpret_cast<const Elem*>(&gv);
#pragma unroll
        for (int t = 0; t < 8; ++t) dot += to_float(oe[t]) * to_float(ge[t]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float lse = i < sq.len_q ? a.lse[b * a.lse_sb + h * a.lse_sh + (sq.off_q + i) * a.lse_ss] : -INFINITY;
    const bool live = i < sq.len_q && lse != -INFINITY;
    if (lane == 0) {
      const int64_t row = static_cast<int64_t>(h) * a.rows_q + q_row_token(a, sq, b, i);
      a.lse2[row] = live ? lse * kLog2e : INFINITY;
      a.dsum[row] = i < sq.len_q ? dot : 0.f;
    }
    if (a.softmax_type == 2 && live) contrib = -expf(a.sink[h] - lse) * dot;
  }
  if (a.softmax_type == 2 && a.d_sink != nullptr) {
    __shared__ float part[8];
    if (lane == 0) part[warp] = contrib;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int w = 0; w < 8; ++w) t += part[w];
      if (a.dsink_part != nullptr) {
        a.dsink_part[(static_cast<int64_t>(h) * gridDim.z + b) * gridDim.x + blockIdx.x] = t;
      } else if (t != 0.f) {
        atomicAdd(a.d_sink + h, t);
      }
    }
  }
}

// Deterministic d_softmax_offset: one warp per head sums the preprocess
// blocks' partials in a fixed order (strided lanes, then a fixed shuffle tree).
__global__ void dsink_reduce_kernel(const float* part, float* d_sink, int h_q, int64_t per_head) {
  const int h = blockIdx.x, lane = threadIdx.x;
  if (h >= h_q) return;
  float t = 0.f;
  for (int64_t i = lane; i < per_head; i += 32) t += part[h * per_head + i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  if (lane == 0) d_sink[h] = t;
}

// Deterministic broadcast dbias: the main kernel wrote each (b, h_q, i, j)
// term once into a full fp32 buffer; element t of dbias sums its terms over
// the broadcast dims in index order.
template <typename Elem>
__global__ void dbias_reduce_kernel(const float* full, Elem* dbias, int64_t b, int64_t h, int64_t s_q, int64_t s_kv,
                                    int64_t db0, int64_t db1, int64_t db2) {
  const int64_t n = db0 * db1 * db2 * s_kv;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = t % s_kv, i0 = t / s_kv % db2, h0 = t / (s_kv * db2) % db1, b0 = t / (s_kv * db2 * db1);
    float acc = 0.f;
    for (int64_t bb = (db0 == 1 ? 0 : b0); bb < (db0 == 1 ? b : b0 + 1); ++bb)
      for (int64_t hh = (db1 == 1 ? 0 : h0); hh < (db1 == 1 ? h : h0 + 1); ++hh)
        for (int64_t ii = (db2 == 1 ? 0 : i0); ii < (db2 == 1 ? s_q : i0 + 1); ++ii)
          acc += full[((bb * h + hh) * s_q + ii) * s_kv + j];
    dbias[t] = from_float<Elem>(acc);
  }
}

// dq = scale * dq_acc for every accumulator row (rows that no sequence owns
// hold zeros). One warp per (row, head).
template <typename Elem>
__global__ void __launch_bounds__(256) dq_convert_kernel(const __grid_constant__ KArgs a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (idx >= a.rows_q * a.h_q) return;
  const int64_t row = idx / a.h_q;
  const int h = static_cast<int>(idx % a.h_q);
  const float* src = a.dq_acc + idx * a.acc_d;
  Elem* dst;
  if (a.q_thd) {
    dst = static_cast<Elem*>(a.dq) + row * a.dq_ss + h * a.dq_sh;
  } else {
    const int64_t b = row / a.s_q, i = row % a.s_q;
    dst = static_cast<Elem*>(a.dq) + b * a.dq_sb + i * a.dq_ss + h * a.dq_sh;
  }
  for (int c = lane * 8; c < a.d_qk; c += 256) {
    const float4 x0 = *reinterpret_cast<const float4*>(src + c);
    const float4 x1 = *reinterpret_cast<const float4*>(src + c + 4);
    uint4 v;
    v.x = pack2<Elem>(x0.x * a.scale, x0.y * a.scale);
    v.y = pack2<Elem>(x0.z * a.scale, x0.w * a.scale);
    v.z = pack2<Elem>(x1.x * a.scale, x1.y * a.scale);
    v.w = pack2<Elem>(x1.z * a.scale, x1.w * a.scale);
    *reinterpret_cast<uint4*>(dst + c) = v;
  }
}

template <typename Elem>
__global__ void dbias_convert_kernel(const float* acc, Elem* dbias, int64_t n) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dbias[t] = from_float<Elem>(acc[t]);
  }
}

// Zero the rows of a thd tensor [t, h, d] (and set lse to -inf) at tokens that
// lie in no sequence: token t belongs to the last sequence b with
// off[b] <= t, and is inside it when t - off[b] < len(b). One warp per token.
template <typename Elem>
__global__ void __launch_bounds__(256) thd_fill_gaps_kernel(Elem* base, int64_t ss, int64_t sh, int heads, int d,
                                                            int64_t tokens, const int32_t* off, const int32_t* cu,
                                                            int nseq, int s_max, float* lse, int64_t lse_sh,
                                                            int64_t lse_ss) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (t >= tokens) return;
  int lo = 0, hi = nseq;  // largest b in [0, nseq] with off[b] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (off[mid] <= t) lo = mid; else hi = mid - 1;
  }
  bool inside = false;
  if (lo < nseq && off[lo] <= t) {
    const int len = max(0, min(cu[lo + 1] - cu[lo], s_max));
    inside = t - off[lo] < len;
  }
  if (inside) return;
  for (int h = 0; h < heads; ++h) {
    Elem* row = base + t * ss + h * sh;
    for (int c = lane * 8; c < d; c += 256) *reinterpret_cast<uint4*>(row + c) = make_uint4(0, 0, 0, 0);
    if (lse != nullptr && lane == 0) lse[h * lse_sh + t * lse_ss] = -INFINITY;
  }
}

}  // namespace tc
}  // namespace fusedattn
