// The Hopper backward's preprocess and postprocess kernels (bwd_launch.cuh launches them around
// the main kernel of bwd_common.cuh):
//  preprocess: per query row Dsum = rowsum(dO * O) (fp32) and lse2 = lse * log2(e) (+inf for rows
//    with lse = -inf and for the padding rows up to s_pad = roundup(s_q, kBwdRowPad), so P = 0
//    there); zeroes the fp32 dQ accumulator [b, s_q, h, d] (and the deterministic mode's counters);
//  postprocess: dq = dQ_acc * scale in 16 bits.
// Varlen: both run over the call's rows (thd: one per token).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "params.h"
#include "ptx_sm90.cuh"

namespace fusedattn {
namespace hopper {

// ------------------------------------------------------------- preprocess
// Rows of the preprocess per warp: a row of O and of dO is D / 8 lanes' 16-byte loads (d = 64: 8
// lanes, so 4 rows per warp; d = 128: 2; d = 256: 1): 16-byte loads reach the DRAM rate at every d,
// where one row per warp would give a d = 64 lane 4-byte loads.
template <int D>
constexpr int kBwdPreRowsPerWarp = 256 / D;

// The preprocess, one kernel for every variant. Per (b, h, row < s_pad): a group of D / 8 lanes
// reads its row of O and dO (8 elements each per lane, one 16-byte load), zeroes the row's dQ
// accumulator slice (two 16-byte stores per lane) and sums Dsum across the group by shuffles; rows
// i >= s take part with zeros. O and dO rows hold DV columns (<= D; the lanes past them read
// nothing), the accumulator D. O is contiguous in q's format, dO any rows16 strides (bwd_prepare
// checks the 16-byte alignment). The deterministic mode's n_cnt counters are zeroed here, so every
// call and CUDA-graph replay starts from turn 0 and ticket 0 without a memset; with the learnable
// softmax each block writes the sum of its rows' d_softmax_offset terms (-exp(offset[h] - lse)
// Dsum; its rows lie in one (batch, head)), summed per head in a fixed order by bwd_dsink_kernel,
// so d_softmax_offset is reproducible in every mode. The launch covers b h s_pad rows exactly (s_pad
// a multiple of 128): every block is whole, and no thread may leave before the block's barrier.
struct BwdPreArgs {
  const void *o, *dout;
  BshdStrides dout_st;  // element strides, resolved (thd: b 0)
  const float* lse;
  float *lse2, *dsum, *dq_acc;
  int b, s, h, s_pad;
  int* dq_cnt;  // the deterministic mode: n_cnt counters to zero (else null)
  long long n_cnt;
  const float* softmax_offset;  // learnable softmax: the offsets, and where each block's sum of the
  float* dsink_part;            // rows' d_softmax_offset terms goes (bwd_sm90_dsink_partials); else null
};
template <typename T, int D, int DV>
__global__ void __launch_bounds__(256) bwd_pre_kernel(const BwdPreArgs a) {
  constexpr int PER = 8;
  constexpr int LPR = D / PER;  // lanes per row
  static_assert(LPR * kBwdPreRowsPerWarp<D> == 32, "a warp covers whole rows");
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n_cnt;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    a.dq_cnt[i] = 0;
  const T* o = static_cast<const T*>(a.o);
  const T* dout = static_cast<const T*>(a.dout);
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int sub = lane % LPR;
  const long long row = warp * kBwdPreRowsPerWarp<D> + lane / LPR;
  const int i = static_cast<int>(row % a.s_pad);
  const long long bh = row / a.s_pad;
  const int hh = static_cast<int>(bh % a.h);
  const int bb = static_cast<int>(bh / a.h);
  const bool in_range = row < static_cast<long long>(a.b) * a.h * a.s_pad;  // always, as launched
  const bool valid = in_range && i < a.s;
  float acc = 0.f;
  if (valid && (DV == D || sub * PER < DV)) {
    const size_t ob = ((static_cast<size_t>(bb) * a.s + i) * a.h + hh) * DV + sub * PER;
    const int64_t db = bb * a.dout_st.b + i * a.dout_st.s + hh * a.dout_st.h + sub * PER;
    const uint4 ov = *reinterpret_cast<const uint4*>(o + ob);
    const uint4 dv = *reinterpret_cast<const uint4*>(dout + db);
    T oe[PER], de[PER];
    memcpy(oe, &ov, sizeof(uint4));
    memcpy(de, &dv, sizeof(uint4));
#pragma unroll
    for (int e = 0; e < PER; ++e) {
      if constexpr (std::is_same<T, __half>::value) {
        acc = fmaf(__half2float(oe[e]), __half2float(de[e]), acc);
      } else {
        acc = fmaf(__bfloat162float(oe[e]), __bfloat162float(de[e]), acc);
      }
    }
  }
  if (valid) {
    const size_t base = ((static_cast<size_t>(bb) * a.s + i) * a.h + hh) * D + sub * PER;
    *reinterpret_cast<float4*>(a.dq_acc + base) = make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(a.dq_acc + base + 4) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int off = LPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  float dsink = 0.f;
  if (sub == 0) {
    if (valid) {
      a.dsum[row] = acc;
      const float l = a.lse[bh * a.s + i];
      a.lse2[row] = (l == -INFINITY) ? INFINITY : l * 1.4426950408889634f;
      // lse -inf: a row no sequence owns (varlen; the sink keeps every other row's finite).
      if (a.softmax_offset != nullptr && l != -INFINITY) dsink = -expf(a.softmax_offset[hh] - l) * acc;
    } else if (in_range) {
      a.dsum[row] = 0.f;
      a.lse2[row] = INFINITY;
    }
  }
  if (a.dsink_part == nullptr) return;
  __shared__ float part[8];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) dsink += __shfl_xor_sync(0xffffffffu, dsink, off);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = dsink;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < 8; ++w) sum += part[w];
    a.dsink_part[blockIdx.x] = sum;
  }
}

// d_softmax_offset[h] = the sum of head h's per-block partials [b][h][per_bh], in a fixed order (one
// warp of W = 32 lanes per head: strided lanes, then a fixed shuffle tree). A template so that every
// translation unit including this header may define it.
template <int W = 32>
__global__ void __launch_bounds__(W) bwd_dsink_kernel(const float* part, float* d_sink, int b, int h, int per_bh) {
  static_assert(W == 32, "one warp");
  const int hh = blockIdx.x, lane = threadIdx.x;
  float t = 0.f;
  for (long long i = lane; i < static_cast<long long>(b) * per_bh; i += W) {
    const long long bb = i / per_bh, k = i - bb * per_bh;
    t += part[(bb * h + hh) * per_bh + k];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
  if (lane == 0) d_sink[hh] = t;
}

// ------------------------------------------------------------ postprocess
// dq = dQ_acc * scale in 16 bits: n4 groups of 4 columns of dq, whose rows hold DQK of the
// accumulator's D columns.
template <typename T, int D, int DQK>
__global__ void __launch_bounds__(256) bwd_post_kernel(const float* dq_acc, void* dq_, long long n4, float scale) {
  T* dq = static_cast<T*>(dq_);
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long src = DQK == D ? i : i / (DQK / 4) * (D / 4) + i % (DQK / 4);
    const float4 v = reinterpret_cast<const float4*>(dq_acc)[src];
    uint2 w;
    if constexpr (std::is_same<T, __half>::value) {
      w.x = pack2<true>(v.x * scale, v.y * scale);
      w.y = pack2<true>(v.z * scale, v.w * scale);
    } else {
      w.x = pack2<false>(v.x * scale, v.y * scale);
      w.y = pack2<false>(v.z * scale, v.w * scale);
    }
    reinterpret_cast<uint2*>(dq)[i] = w;
  }
}

}  // namespace hopper
}  // namespace fusedattn
