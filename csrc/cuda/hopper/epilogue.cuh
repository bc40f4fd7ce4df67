// The kernels' last step: a consumer thread's fp32 accumulator rows to global memory as 16-bit
// values, for the forward's O (with lse) and the backward's dK, dV.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "params.h"
#include "ptx_sm90.cuh"

namespace fusedattn {
namespace hopper {

// Whether 16-bit rows at base, addressed through the given element strides, start on 16-byte
// boundaries (store_frag_row's vector path); uniform over a launch.
template <typename T>
__device__ __forceinline__ bool rows_16b_aligned(const void* base, int64_t s0, int64_t s1, int64_t s2) {
  return ((reinterpret_cast<uintptr_t>(base) | static_cast<uintptr_t>((s0 | s1 | s2) * int64_t{sizeof(T)})) & 15u) == 0;
}

// Stores fragment row hf of a thread's fp32 wgmma accumulator (N columns: acc[4j + 2hf + e] is
// column 8j + 2qd + e, the same row in the four threads of a quad), times scale, as T at
// dst[0, N) when active (uniform over the quad); with ZERO_UNSCALED, zeros where scale is 0 (a row
// that saw no key, whose accumulators may hold 0 x inf or NaN of masked keys). Plain 4-byte stores
// put each warp instruction on 8 rows, 16 bytes each, and leave the epilogue issue-bound; with vec16
// (dst 16-byte aligned) a 4 x 4 transpose of 32-bit pairs within the quad (two shfl_xor rounds) gives
// each thread 8 consecutive columns, stored as one 16-byte vector: a quarter of the store
// instructions. Every lane of the warp must call it (the shuffles). Only columns below ncols (a
// multiple of 8) are stored: a head dim below the tile's.
template <typename T, int N, bool ZERO_UNSCALED = false>
__device__ __forceinline__ void store_frag_row(T* dst, const float (&acc)[N / 2], int hf, float scale, int qd,
                                               bool vec16, bool active, int ncols = N) {
  constexpr bool F16 = std::is_same<T, __half>::value;
  static_assert(N % 32 == 0, "whole 4-chunk groups");
  const bool zero = ZERO_UNSCALED && scale == 0.f;
  const auto scaled = [&](int i) { return zero ? 0.f : acc[i] * scale; };
  if (!vec16) {
    if (active) {
#pragma unroll
      for (int j = 0; j < N / 8; ++j)
        if (8 * j < ncols)
          *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * qd) =
              pack2<F16>(scaled(4 * j + 2 * hf), scaled(4 * j + 2 * hf + 1));
    }
    return;
  }
  const bool b1 = (qd & 2) != 0, b0 = (qd & 1) != 0;
#pragma unroll
  for (int g = 0; g < N / 32; ++g) {
    if (32 * g >= ncols) break;  // uniform over the warp
    // x[c]: this thread's pair of chunk 4g + c; after the transpose, the pair c of chunk 4g + qd.
    uint32_t x[4];
#pragma unroll
    for (int c = 0; c < 4; ++c)
      x[c] = pack2<F16>(scaled(4 * (4 * g + c) + 2 * hf), scaled(4 * (4 * g + c) + 2 * hf + 1));
    // Round 1 swaps the off-diagonal 2 x 2 blocks between lanes qd and qd ^ 2, round 2 the
    // off-diagonal elements within each block between qd and qd ^ 1.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t r = __shfl_xor_sync(0xffffffffu, b1 ? x[k] : x[k + 2], 2);
      if (b1) x[k] = r;
      else x[k + 2] = r;
    }
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      const uint32_t r = __shfl_xor_sync(0xffffffffu, b0 ? x[k] : x[k + 1], 1);
      if (b0) x[k] = r;
      else x[k + 1] = r;
    }
    if (active && 8 * (4 * g + qd) < ncols)
      *reinterpret_cast<uint4*>(dst + 8 * (4 * g + qd)) = make_uint4(x[0], x[1], x[2], x[3]);
  }
}

// The rows a forward tile stores: rows [0, n) from token tok of the output (tok 0 but for thd).
struct OutRows {
  int64_t tok;
  int n;
};

// The forward's epilogue for a consumer thread's two rows (accumulator fragment rows row_base and
// row_base + 8): O / l to the output (rows < rows.n) and lse = max ln2 + ln l, -inf for a row that saw
// no key (l = 0); a NaN sum (a NaN score) carries into both. o holds the thread's D / 2 fp32
// accumulators, of which DV columns are stored; row_l its columns' part of the row sums (summed over
// the quad here). GENERAL: with off-by-one or learnable softmax (p.softmax_type) the sink logit (0,
// softmax_offset[head]) joins the normaliser: l' = l 2^(m - mt) + 2^(sink - mt), mt = max(m, sink)
// (log2 units), so a row without a visible key has lse = the sink logit and a zero output. VARLEN: such
// a row stores exact zeros (its masked key tile may be a sequence's only, read where it has no keys).
// vec16: rows_16b_aligned of the output (the caller's, once per CTA).
template <typename T, int D, int DV, bool GENERAL, bool VARLEN = false>
__device__ __forceinline__ void fwd_store_rows(const KParams& p, const float (&o)[D / 2], const float (&row_m)[2],
                                               const float (&row_l)[2], int row_base, int batch, int head, int qd,
                                               const OutRows& rows, bool vec16) {
  T* out = reinterpret_cast<T*>(p.o);
  const bool sink = GENERAL && p.softmax_type != 0;
  const float sink2 = GENERAL && p.softmax_type == 2 ? p.softmax_offset[head] * 1.4426950408889634f : 0.f;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = row_l[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float inv = (l != 0.f) ? 1.f / l : 0.f;
    float m2 = row_m[hf];  // log2 units; the normaliser is l 2^m2
    if (sink) {
      const float mt = fmaxf(m2, sink2);  // finite: the sink is (a NaN offset carries through tot)
      const float tot = l * fast_exp2(m2 - mt) + fast_exp2(sink2 - mt);
      inv = fast_exp2(m2 - mt) / tot;
      l = tot;
      m2 = mt;
    }
    const int row = row_base + 8 * hf;
    const bool active = row < rows.n;
    const int64_t tok = rows.tok + (active ? row : 0);
    T* orow = out + batch * p.o_sb + tok * p.o_ss + head * p.o_sh;
    store_frag_row<T, D, VARLEN>(orow, o, hf, inv, qd, vec16, active, DV);
    if (active && qd == 0) {
      const float lse = (l != 0.f) ? (m2 * 0.69314718055994531f + logf(l)) : -INFINITY;
      p.lse[batch * p.lse_sb + head * p.lse_sh + tok * p.lse_ss] = lse;
    }
  }
}

}  // namespace hopper
}  // namespace fusedattn
