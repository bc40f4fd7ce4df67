// Row epilogue shared by the decode kernel (one split) and the combine kernel
// (several): the final scale and lse of a row, with the softmax sink, and
// 4-element output stores.
#pragma once

#include "decode.h"
#include "fusedattn/params.h"
#include "ptx.cuh"
#include "common/host.h"
#include "common/numeric.cuh"
#include "common/seq.cuh"

namespace fusedattn {
namespace decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Output scale factor and lse (natural log) of a row from its unnormalised
// sum L relative to the max mx (log2 units), with the softmax sink. L is 0 for
// a row without a visible key and NaN for a NaN row, whose f and lse are NaN.
__device__ __forceinline__ void finalize_row(const FwdParams& p, int h, float L, float mx, float* f, float* lse) {
  const bool has_sink = p.softmax.type != SoftmaxType::kVanilla;
  const float sink = p.softmax.type == SoftmaxType::kLearnable ? p.softmax.offset[h] : 0.f;
  if (L == 0.f) {
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
    row[(c + 0) * stride_d] = gpu::from_acc<T>(x0);
    row[(c + 1) * stride_d] = gpu::from_acc<T>(x1);
    row[(c + 2) * stride_d] = gpu::from_acc<T>(x2);
    row[(c + 3) * stride_d] = gpu::from_acc<T>(x3);
  }
}

}  // namespace decode
}  // namespace fusedattn
