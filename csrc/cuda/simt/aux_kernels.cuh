// Small kernels around the SIMT backward: the dO.O row sums, the learnable softmax offset's
// gradient and the fp32/fp64 workspace -> output conversions (the fills are common/aux_kernels.cuh).
#pragma once

#include "common.cuh"
#include "common/aux_kernels.cuh"
#include "workspace.h"

namespace fusedattn {
namespace simt {

// Row index of (b, i) in the backward's workspaces: the token for thd q,
// b * s_q + i otherwise.
__device__ __forceinline__ int64_t ws_row(const FwdParams& p, const SeqInfo& s, int b, int i) {
  return p.seqlens.q_is_thd ? s.tok_q + i : int64_t(b) * p.prob.s_q + i;
}

// D[row, h] = sum_c dO[row, h, c] * O[row, h, c]: one warp per row and head.
// grid (ceil(s_q / 8), h_q, b), 256 threads.
template <class T>
__global__ void __launch_bounds__(256) bwd_dot_kernel(const BwdParams p, AccT<T>* dsum) {
  using A = AccT<T>;
  const FwdParams& f = p.fwd;
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = static_cast<int>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const SeqInfo s = seq_info(f, b);
  if (i >= s.len_q) return;
  const T* o = static_cast<const T*>(f.out.data) + row_base(f.out, b, s.tok_q + i, h);
  const T* d = static_cast<const T*>(p.dout.data) + row_base(p.dout, b, s.tok_q + i, h);
  A acc = A(0);
  for (int c = lane; c < f.prob.d_v; c += 32) {
    acc += static_cast<A>(to_acc(o[c * f.out.stride_d])) * static_cast<A>(to_acc(d[c * p.dout.stride_d]));
  }
  acc = group_sum<32>(acc);
  if (lane == 0) dsum[ws_row(f, s, b, i) * f.prob.h_q + h] = acc;
}

// d_softmax_offset[h] = -sum over rows of exp(offset[h] - lse) * D, in a
// fixed order (deterministic). One block per head; rows without any visible
// key have D = 0 (their output is zero) and padded rows are skipped. The lse
// is buf.lse2's (log2 units) where the backward recomputed it (fp64).
template <class T>
__global__ void __launch_bounds__(kAuxThreads)
    bwd_softmax_offset_kernel(const BwdParams p, const BwdBuffers<AccT<T>> buf) {
  using A = AccT<T>;
  const FwdParams& f = p.fwd;
  const int h = blockIdx.x;
  const A sink = static_cast<A>(f.softmax.offset[h]);
  A acc = A(0);
  for (int b = 0; b < f.prob.b; ++b) {
    const SeqInfo s = seq_info(f, b);
    for (int i = threadIdx.x; i < s.len_q; i += kAuxThreads) {
      const int64_t row = ws_row(f, s, b, i) * f.prob.h_q + h;
      A e;
      if (buf.lse2 != nullptr) {
        if (buf.lse2[row] == neg_inf<A>()) continue;
        e = fast_exp2(sink * Consts<A>::kLog2e - buf.lse2[row]);
      } else {
        const float lse = f.lse[b * f.lse_stride_b + h * f.lse_stride_h + (s.tok_q + i) * f.lse_stride_s];
        if (lse == -INFINITY) continue;
        e = exp(sink - static_cast<A>(lse));
      }
      acc += e * buf.dsum[row];
    }
  }
  __shared__ A red[kAuxThreads / 32];
  acc = group_sum<32>(acc);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    A total = A(0);
    for (int w = 0; w < kAuxThreads / 32; ++w) total += red[w];
    p.d_softmax_offset[h] = static_cast<float>(-total);
  }
}

// dq[row, h, c] = scale * dq_acc[row, h, c] for every row of the q tensor
// (rows no sequence covers get the workspace's zeros).
template <class T>
__global__ void convert_dq_kernel(const BwdParams p, const AccT<T>* acc) {
  using A = AccT<T>;
  const FwdParams& f = p.fwd;
  const int64_t d = f.prob.d_qk, h = f.prob.h_q;
  const int64_t rows = f.seqlens.q_is_thd ? f.prob.t_q : f.prob.b * f.prob.s_q;
  const int64_t n = rows * h * d;
  const A scale = static_cast<A>(f.scale);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % d, r = e / d;
    const int64_t hh = r % h, row = r / h;
    const int64_t b = f.seqlens.q_is_thd ? 0 : row / f.prob.s_q;
    const int64_t tok = f.seqlens.q_is_thd ? row : row % f.prob.s_q;
    static_cast<T*>(p.dq.data)[b * p.dq.stride_b + tok * p.dq.stride_s + hh * p.dq.stride_h + c * p.dq.stride_d] =
        from_acc<T>(acc[e] * scale);
  }
}

// dbias (the bias's own shape) from its contiguous accumulator.
template <class T>
__global__ void convert_dbias_kernel(const PairTensor t, const AccT<T>* acc) {
  const int64_t s1 = t.sizes[1], s2 = t.sizes[2], s3 = t.sizes[3];
  const int64_t n = t.sizes[0] * s1 * s2 * s3;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % s3, i = (e / s3) % s2, hh = (e / (s3 * s2)) % s1, b = e / (s3 * s2 * s1);
    static_cast<T*>(t.data)[b * t.stride_b + hh * t.stride_h + i * t.stride_i + j * t.stride_j] = from_acc<T>(acc[e]);
  }
}

}  // namespace simt
}  // namespace fusedattn
