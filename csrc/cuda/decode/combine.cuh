// Split-KV combine (several splits per row) and the output initialisation
// that precedes the decode kernel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "decode.h"
#include "epilogue.cuh"
#include "launch.cuh"
#include "common/aux_kernels.cuh"
#include "common/host.h"
#include "common/seq.cuh"
#include "tile.h"

namespace fusedattn {
namespace decode {

using gpu::SeqInfo;

// Merges the splits' partials (KernelArgs::ws_o / ws_lse) of every output row (b, i, h) and writes
// it (out and lse; zeros and -inf for a padded bshd/sbhd row, nothing for a thd row past the
// sequence). One block per row: warp w takes splits w, w + kCombineWarps, ..., lane l the 4-column
// groups l and (CH = 2, d_v > 128) l + 32. Every load of a row (the splits' lse, the warp's partial
// rows, cu_seqlens) is issued before any is used, so a row costs one memory round trip, then a
// shared-memory sum of the warps' weighted partials (a merge in one warp pays one round trip per
// 16 splits). PER: the splits a warp holds (registers for PER x CH float4): 8 up to 32 splits, else
// 32; sized for 128 splits throughout, an 8-warp block would take one SM alone. Four warps (~11 K
// registers a block at PER = 8) also fit beside two decode blocks on an SM, where a programmatic
// dependent launch (FUSEDATTN_DECODE_PDL) places them before the decode grid ends.
constexpr int kCombineWarps = 4;

template <class T, int CH, int PER>
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(const FwdParams p, const KernelArgs a) {
  constexpr int kPer = PER;  // splits per warp, at most
  static_assert(PER * kCombineWarps <= kMaxSplits, "splits per warp");
  static_assert(kMaxSplits % 32 == 0 && 32 % kCombineWarps == 0, "split sp = warp + kCombineWarps k sits in lane "
                "sp % 32 of ls[sp / 32], and sp / 32 = k / (32 / kCombineWarps)");
  __shared__ float4 part[kCombineWarps][32 * CH];
  const Problem& pr = p.prob;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int dv = static_cast<int>(pr.d_v);
  const int64_t stride_split = pr.b * pr.h_kv * a.rows;  // ws rows between two splits' rows
  // Rows (i, h) of sequence b = blockIdx.y; s_q * h_q < 2^31 (make_plan), so the row's indices take
  // 32-bit divisions (the 64-bit ones of a flat (b, i, h) index were ~250 instructions ahead of the
  // first load).
  const int b = static_cast<int>(blockIdx.y);
  const int h_q = static_cast<int>(pr.h_q), nrows = static_cast<int>(pr.s_q) * h_q;
  T* out = static_cast<T*>(p.out.data);
  for (int w = static_cast<int>(blockIdx.x); w < nrows; w += static_cast<int>(gridDim.x)) {
    const int h = static_cast<int>(a.div_hq.mod(w)), i = static_cast<int>(a.div_hq.div(w));
    const int hk = static_cast<int>(a.div_group.div(h));
    // The workspace row exists for every (b, i < s_q, h); a padded row's values are loaded and ignored.
    const int64_t wrow = (int64_t(b) * pr.h_kv + hk) * a.rows + int64_t(i) * a.group + a.div_group.mod(h);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Launched as a programmatic dependent of the decode kernel (KernelArgs::pdl): wait for its
    // grid to complete and its partials to be visible. Otherwise this returns at once.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    // The next call's decode kernel, when a programmatic dependent (KernelArgs::pdl_main), may
    // start launching: it waits for this grid's completion before touching memory.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    float ls[kMaxSplits / 32];  // lane l: the lse of splits l, l + 32, ...
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k) {
      const int sp = lane + 32 * k;
      ls[k] = sp < a.splits ? a.ws_lse[sp * stride_split + wrow] : -INFINITY;
    }
    float4 x[kPer][CH];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int sp = warp + kCombineWarps * k;
      const float* orow = a.ws_o + (sp * stride_split + wrow) * dv;
#pragma unroll
      for (int q = 0; q < CH; ++q) {
        const int c = (lane + 32 * q) * 4;
        // Every split wrote O for every valid row (zeros when it saw no key).
        x[k][q] = sp < a.splits && c < dv ? *reinterpret_cast<const float4*>(orow + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    const SeqInfo si = gpu::seq_info(p, b);
    if (i >= si.len_q) {  // the same for the whole block
      if (!p.seqlens.q_is_thd && warp == 0) {
        T* row = out + gpu::row_base(p.out, b, i, h);
        for (int c = lane * 4; c < dv; c += 128) store4<T>(row, p.out.stride_d, c, a.out_vec, 0.f, 0.f, 0.f, 0.f);
        if (lane == 0) p.lse[int64_t(b) * p.lse_stride_b + int64_t(h) * p.lse_stride_h + int64_t(i) * p.lse_stride_s] =
            -INFINITY;
      }
      continue;
    }
    // Every warp reduces the lse alike (a fixed shuffle tree: the same max and sum in each warp). A
    // NaN partial (a NaN row in its split) makes the max NaN, hence the row's out and lse.
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k) mx = gpu::max_nan(mx, ls[k]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = gpu::max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float den = 0.f;
    float4 acc[CH];
#pragma unroll
    for (int q = 0; q < CH; ++q) acc[q] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mx != -INFINITY) {
#pragma unroll
      for (int k = 0; k < kMaxSplits / 32; ++k) den += exp2f(ls[k] - mx);  // 0 for an empty split
#pragma unroll
      for (int off = 16; off > 0; off /= 2) den += __shfl_xor_sync(0xffffffffu, den, off);
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int sp = warp + kCombineWarps * k;
        if (sp >= a.splits) break;  // warp-uniform
        const float lsj = __shfl_sync(0xffffffffu, ls[k / (32 / kCombineWarps)], sp % 32);
        const float wj = exp2f(lsj - mx);
#pragma unroll
        for (int q = 0; q < CH; ++q) {
          acc[q].x += wj * x[k][q].x;
          acc[q].y += wj * x[k][q].y;
          acc[q].z += wj * x[k][q].z;
          acc[q].w += wj * x[k][q].w;
        }
      }
    }
#pragma unroll
    for (int q = 0; q < CH; ++q) part[warp][lane + 32 * q] = acc[q];
    __syncthreads();
    if (warp == 0) {
      float fct, lse;
      finalize_row(p, h, den, mx, &fct, &lse);
      T* row = out + gpu::row_base(p.out, b, si.tok_q + i, h);
#pragma unroll
      for (int q = 0; q < CH; ++q) {
        const int c = (lane + 32 * q) * 4;
        float4 sum = part[0][lane + 32 * q];
#pragma unroll
        for (int v = 1; v < kCombineWarps; ++v) {
          const float4 y = part[v][lane + 32 * q];
          sum.x += y.x;
          sum.y += y.y;
          sum.z += y.z;
          sum.w += y.w;
        }
        if (c < dv) store4<T>(row, p.out.stride_d, c, a.out_vec, sum.x * fct, sum.y * fct, sum.z * fct, sum.w * fct);
      }
      if (lane == 0) {
        p.lse[int64_t(b) * p.lse_stride_b + int64_t(h) * p.lse_stride_h + (si.tok_q + i) * p.lse_stride_s] = lse;
      }
    }
    __syncthreads();  // part is rewritten for the block's next row
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
    gpu::zero_rows_kernel<T><<<gpu::aux_blocks(pr.t_q * pr.h_q * pr.d_v), gpu::kAuxThreads, 0, st>>>(
        p.out, 1, pr.t_q, static_cast<int>(pr.h_q), static_cast<int>(pr.d_v));
    FUSEDATTN_RETURN_IF_ERROR(gpu::check_launch("decode zero-fill"));
    gpu::fill_lse_kernel<<<gpu::aux_blocks(pr.t_q * pr.h_q), gpu::kAuxThreads, 0, st>>>(
        p.lse, p.lse_stride_h, p.lse_stride_s, static_cast<int>(pr.h_q), pr.t_q, -INFINITY);
    FUSEDATTN_RETURN_IF_ERROR(gpu::check_launch("decode lse fill"));
  }
  if (p.max_logit != nullptr && pr.h_q > 0) {
    gpu::fill_kernel<<<1, gpu::kAuxThreads, 0, st>>>(p.max_logit, pr.h_q, -INFINITY);
    FUSEDATTN_RETURN_IF_ERROR(gpu::check_launch("decode max_logit fill"));
  }
  return Status::Ok();
}

template <class T>
Status launch_combine(const FwdParams& p, const KernelArgs& a, void* stream) {
  const int64_t nrows = p.prob.s_q * p.prob.h_q;  // per sequence
  if (nrows <= 0 || p.prob.b <= 0) return Status::Ok();
  const dim3 blocks(static_cast<unsigned>(std::min<int64_t>(nrows, int64_t(1) << 16)), static_cast<unsigned>(p.prob.b));
  const auto st = static_cast<cudaStream_t>(stream);
  constexpr int kFew = 32 / kCombineWarps, kAll = kMaxSplits / kCombineWarps;
  const bool wide = p.prob.d_v > 128, few = a.splits <= 32;
  const auto kernel = wide ? (few ? decode_combine_kernel<T, 2, kFew> : decode_combine_kernel<T, 2, kAll>)
                           : (few ? decode_combine_kernel<T, 1, kFew> : decode_combine_kernel<T, 1, kAll>);
  if (!a.pdl || !built_with_dependency_wait()) {
    kernel<<<blocks, kCombineWarps * 32, 0, st>>>(p, a);
    return gpu::check_launch("decode combine kernel");
  }
  launch_programmatic(kernel, blocks, dim3(kCombineWarps * 32), 0, st, p, a);
  return gpu::check_launch("decode combine kernel (programmatic launch)");
}

}  // namespace decode
}  // namespace fusedattn
