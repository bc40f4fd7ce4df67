// Split-KV combine (several splits per row) and the output initialisation
// that precedes the decode kernel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "decode.h"
#include "epilogue.cuh"
#include "simt/aux_kernels.cuh"
#include "simt/common.cuh"
#include "tile.h"

namespace fusedattn {
namespace decode {

using simt::SeqInfo;

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

// Merges the splits' partials of every output row: one warp per (b, i, h_q)
// (combine_row above). Also writes the padded bshd/sbhd rows.
template <class T>
__global__ void __launch_bounds__(256) decode_combine_kernel(const FwdParams p, const KernelArgs a) {
  const Problem& pr = p.prob;
  const int lane = threadIdx.x & 31;
  const int64_t nrows = pr.b * pr.s_q * pr.h_q;
  const CombineShape<T> cs(p, a);
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < nrows;
       w += int64_t(gridDim.x) * (blockDim.x / 32)) {
    const int h = static_cast<int>(w % pr.h_q);
    const int64_t bi = w / pr.h_q;
    const int i = static_cast<int>(bi % pr.s_q), b = static_cast<int>(bi / pr.s_q);
    combine_row<T>(p, a, cs, lane, b, i, h);
  }
}

// lse[h, t] = -inf over a thd lse [h_q, t_q]; max_logit[h] = -inf.
static __global__ void decode_fill_lse_kernel(float* lse, int64_t stride_h, int64_t stride_s, int h, int64_t ntok) {
  const int64_t n = ntok * h;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    lse[(e / ntok) * stride_h + (e % ntok) * stride_s] = -INFINITY;
  }
}

static __global__ void decode_fill_neg_inf_kernel(float* x, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    x[e] = -INFINITY;
  }
}

// Before the decode kernel: thd outputs are zero-filled with lse -inf (tokens
// of no sequence, gaps; the kernels then write the sequences' rows), and
// max_logit starts at -inf for the kernels' atomic max.
template <class T>
Status launch_init_outputs(const FwdParams& p, void* stream) {
  const Problem& pr = p.prob;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (p.seqlens.q_is_thd && pr.t_q > 0) {
    simt::zero_rows_kernel<T><<<simt::aux_blocks(pr.t_q * pr.h_q * pr.d_v), simt::kAuxThreads, 0, st>>>(
        p.out, 1, pr.t_q, static_cast<int>(pr.h_q), static_cast<int>(pr.d_v));
    FUSEDATTN_RETURN_IF_ERROR(simt::check_launch("decode zero-fill"));
    decode_fill_lse_kernel<<<simt::aux_blocks(pr.t_q * pr.h_q), simt::kAuxThreads, 0, st>>>(
        p.lse, p.lse_stride_h, p.lse_stride_s, static_cast<int>(pr.h_q), pr.t_q);
    FUSEDATTN_RETURN_IF_ERROR(simt::check_launch("decode lse fill"));
  }
  if (p.max_logit != nullptr && pr.h_q > 0) {
    decode_fill_neg_inf_kernel<<<1, simt::kAuxThreads, 0, st>>>(p.max_logit, pr.h_q);
    FUSEDATTN_RETURN_IF_ERROR(simt::check_launch("decode max_logit fill"));
  }
  return Status::Ok();
}

template <class T>
Status launch_combine(const FwdParams& p, const KernelArgs& a, void* stream) {
  const int64_t nrows = p.prob.b * p.prob.s_q * p.prob.h_q;
  const int64_t blocks = std::min<int64_t>(simt::ceil_div(nrows, 8), int64_t(1) << 20);
  if (blocks <= 0) return Status::Ok();
  decode_combine_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(p, a);
  return simt::check_launch("decode combine kernel");
}

}  // namespace decode
}  // namespace fusedattn
