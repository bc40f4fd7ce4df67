// Row epilogue shared by the decode kernel (one split) and the combine kernel
// (several): the final scale and lse of a row, with the softmax sink,
// 4-element output stores, and the merge of one row's split partials
// (combine_row, for decode_combine_kernel).
#pragma once

#include "decode.h"
#include "fusedattn/params.h"
#include "ptx.cuh"
#include "simt/common.cuh"
#include "tile.h"

namespace fusedattn {
namespace decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Output scale factor and lse (natural log) of a row from its unnormalised
// sum L relative to the max mx (log2 units), with the softmax sink.
__device__ __forceinline__ void finalize_row(const FwdParams& p, int h, float L, float mx, float* f, float* lse) {
  const bool has_sink = p.softmax.type != SoftmaxType::kVanilla;
  const float sink = p.softmax.type == SoftmaxType::kLearnable ? p.softmax.offset[h] : 0.f;
  if (!(L > 0.f)) {
    *f = 0.f;  // no visible key: zero output
    *lse = has_sink ? sink : -INFINITY;
  } else if (!has_sink) {
    *f = 1.f / L;
    *lse = (mx + log2f(L)) * kLn2;
  } else {
    const float s2 = sink * kLog2e;
    const float top = fmaxf(mx, s2);
    const float al = exp2f(mx - top);
    const float den = L * al + exp2f(s2 - top);
    *f = al / den;
    *lse = (top + log2f(den)) * kLn2;
  }
}

// 4 consecutive head-dim elements of an output row.
template <class T>
__device__ __forceinline__ void store4(T* row, int64_t stride_d, int c, bool vec, float x0, float x1, float x2,
                                       float x3) {
  if (vec) {
    uint2 w;
    w.x = pack2<T>(x0, x1);
    w.y = pack2<T>(x2, x3);
    *reinterpret_cast<uint2*>(row + c) = w;
  } else {
    row[(c + 0) * stride_d] = simt::from_acc<T>(x0);
    row[(c + 1) * stride_d] = simt::from_acc<T>(x1);
    row[(c + 2) * stride_d] = simt::from_acc<T>(x2);
    row[(c + 3) * stride_d] = simt::from_acc<T>(x3);
  }
}

// What combine_row needs beyond the row (computed once per thread).
template <class T>
struct CombineShape {
  int dv;
  int64_t stride_split;  // ws elements between two splits' rows
  T* out;
  __device__ __forceinline__ explicit CombineShape(const FwdParams& p, const KernelArgs& a)
      : dv(static_cast<int>(p.prob.d_v)),
        stride_split(p.prob.b * p.prob.h_kv * a.rows),
        out(static_cast<T*>(p.out.data)) {}
};

// Merges the splits' partials (KernelArgs::ws_o / ws_lse) of output row
// (b, i, h) and writes it (out and lse; zeros and -inf for a padded bshd/sbhd
// row, nothing for a thd row past the sequence). One warp, lanes along the
// head dim (4 floats each, d_v <= 256); every lane calls it.
template <class T>
__device__ __forceinline__ void combine_row(const FwdParams& p, const KernelArgs& a, const CombineShape<T>& cs,
                                            int lane, int b, int i, int h) {
  const Problem& pr = p.prob;
  const int dv = cs.dv;
  const int64_t stride_split = cs.stride_split;
  T* out = cs.out;
  // The splits' lse and partial rows do not depend on the sequence lengths:
  // their loads are issued before seq_info's, so the row costs about three
  // dependent memory round trips (lse and cu_seqlens, partials, store)
  // rather than one per batch of splits. The workspace row exists for every
  // (b, i < s_q, h); a padded row's values are loaded and ignored.
  const int hk = h / a.group;
  const int64_t wrow = (int64_t(b) * pr.h_kv + hk) * a.rows + int64_t(i) * a.group + h % a.group;
  // Lane k holds the lse of splits k, k + 32, ...
  float ls[kMaxSplits / 32];
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    const int sp = lane + 32 * k;
    ls[k] = sp < a.splits ? a.ws_lse[sp * stride_split + wrow] : -INFINITY;
  }
  const simt::SeqInfo si = simt::seq_info(p, b);
  float* lse_row = p.lse + int64_t(b) * p.lse_stride_b + int64_t(h) * p.lse_stride_h;
  if (i >= si.len_q) {
    if (!p.seqlens.q_is_thd) {
      T* row = out + simt::row_base(p.out, b, i, h);
      for (int c = lane * 4; c < dv; c += 128) store4<T>(row, p.out.stride_d, c, a.out_vec, 0.f, 0.f, 0.f, 0.f);
      if (lane == 0) lse_row[int64_t(i) * p.lse_stride_s] = -INFINITY;
    }
    return;
  }
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) mx = fmaxf(mx, ls[k]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float den = 0.f;
  float4 acc[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  if (mx != -INFINITY) {
    constexpr int kBatch = 16;  // partial rows loaded before any is used
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k) {
      if (32 * k >= a.splits) break;
      const int ns = min(32, a.splits - 32 * k);
      for (int j0 = 0; j0 < ns; j0 += kBatch) {
        float4 x[kBatch][2];
#pragma unroll
        for (int jj = 0; jj < kBatch; ++jj) {
          // Every split wrote O for every valid row (zeros when it saw no
          // key), so only the split count bounds the loads.
          const float* orow = a.ws_o + ((32 * k + j0 + jj) * stride_split + wrow) * dv;
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int c = (lane + 32 * q) * 4;
            x[jj][q] = (j0 + jj < ns && c < dv) ? *reinterpret_cast<const float4*>(orow + c)
                                                : make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
        // Same order of additions as one split at a time.
#pragma unroll
        for (int jj = 0; jj < kBatch; ++jj) {
          if (j0 + jj >= ns) break;
          const float lsj = __shfl_sync(0xffffffffu, ls[k], j0 + jj);
          const float wj = exp2f(lsj - mx);  // 0 for an empty split
          den += wj;
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            acc[q].x += wj * x[jj][q].x;
            acc[q].y += wj * x[jj][q].y;
            acc[q].z += wj * x[jj][q].z;
            acc[q].w += wj * x[jj][q].w;
          }
        }
      }
    }
  }
  float fct, lse;
  finalize_row(p, h, den, mx, &fct, &lse);
  T* row = out + simt::row_base(p.out, b, si.tok_q + i, h);
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int c = (lane + 32 * q) * 4;
    if (c < dv) {
      store4<T>(row, p.out.stride_d, c, a.out_vec, acc[q].x * fct, acc[q].y * fct, acc[q].z * fct, acc[q].w * fct);
    }
  }
  if (lane == 0) lse_row[(si.tok_q + i) * p.lse_stride_s] = lse;
}

}  // namespace decode
}  // namespace fusedattn
