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

// Merges the splits' partials of every output row: one warp per (b, i, h_q)
// (combine_row, epilogue.cuh). Also writes the padded bshd/sbhd rows.
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
