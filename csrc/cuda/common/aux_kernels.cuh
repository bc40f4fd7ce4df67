// Fill kernels around the attention kernels (grid-stride, kAuxThreads threads, aux_blocks blocks):
// zeros over a q/k/v-like tensor (thd gaps between sequences), a value over a thd lse or an fp32
// vector (max_logit's -inf start). Templates, so that every translation unit may include them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/host.h"
#include "common/numeric.cuh"
#include "fusedattn/params.h"

namespace fusedattn {
namespace gpu {

constexpr int kAuxThreads = 256;

inline int aux_blocks(int64_t n) {
  const int64_t b = ceil_div(n, kAuxThreads);
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

// Zeros every [b, token, head, d] element of a q/k/v-like tensor (strided;
// nb = 1 for thd). Used for thd outputs, whose gaps no attention block
// covers; the attention kernels then overwrite the rows of the sequences.
template <class T>
__global__ void zero_rows_kernel(SeqTensor t, int64_t nb, int64_t ntok, int h, int d) {
  const int64_t n = nb * ntok * h * d;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % d, r = e / d;
    const int64_t hh = r % h, bt = r / h;
    const int64_t tok = bt % ntok, b = bt / ntok;
    static_cast<T*>(t.data)[b * t.stride_b + tok * t.stride_s + hh * t.stride_h + c * t.stride_d] =
        from_acc<T>(AccT<T>(0));
  }
}

// lse[h, t] = value for every head and token of a thd lse ([h_q, t_q]).
template <class V>
__global__ void fill_lse_kernel(V* lse, int64_t stride_h, int64_t stride_s, int h, int64_t ntok, V value) {
  const int64_t n = ntok * h;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    lse[(e / ntok) * stride_h + (e % ntok) * stride_s] = value;
  }
}

template <class V>
__global__ void fill_kernel(V* p, int64_t n, V value) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    p[e] = value;
  }
}

}  // namespace gpu
}  // namespace fusedattn
