// Device-side vocabulary of the SIMT kernels (beside csrc/cuda/common's): vector access to shared
// memory, tile loads from strided global tensors (16-byte rows: common/rows.h), visibility with the
// explicit mask, bias, softcap and dropout. Every kernel reads the problem from the core's params
// structs (passed by value as kernel arguments) and reads cu_seqlens on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/host.h"
#include "common/numeric.cuh"
#include "common/rows.h"
#include "common/seq.cuh"
#include "fusedattn/params.h"
#include "fusedattn/philox.h"
#include "fusedattn/visibility.h"

namespace fusedattn {
namespace simt {

using namespace gpu;  // the shared CUDA vocabulary (csrc/cuda/common)

// ---- exp2 / log2 in the accumulation type ---------------------------------------

__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }
__device__ __forceinline__ double fast_exp2(double x) { return exp2(x); }
__device__ __forceinline__ float fast_log2(float x) { return log2f(x); }
__device__ __forceinline__ double fast_log2(double x) { return log2(x); }

// ---- shared-memory vectors -----------------------------------------------

template <int N, class A>
struct alignas(N * sizeof(A)) VecN {
  A v[N];
};

template <int N, class A>
__device__ __forceinline__ void lds(const A* p, A (&out)[N]) {
  const VecN<N, A> x = *reinterpret_cast<const VecN<N, A>*>(p);
#pragma unroll
  for (int e = 0; e < N; ++e) out[e] = x.v[e];
}

template <int N, class A>
__device__ __forceinline__ void sts(A* p, const A (&in)[N]) {
  VecN<N, A> x;
#pragma unroll
  for (int e = 0; e < N; ++e) x.v[e] = in[e];
  *reinterpret_cast<VecN<N, A>*>(p) = x;
}

// ---- global tile loads -----------------------------------------------------

// 8 consecutive elements along d starting at p, converted (and scaled) to A.
template <class T, class A>
__device__ __forceinline__ void load8(const T* p, int64_t stride_d, bool vec, A scale, A (&out)[8]) {
  if (vec) {
    constexpr int kWords = 8 * static_cast<int>(sizeof(T)) / 16;
    uint4 w[kWords];
    const uint4* src = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int n = 0; n < kWords; ++n) w[n] = __ldg(src + n);
    const T* v = reinterpret_cast<const T*>(w);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = static_cast<A>(to_acc(v[e])) * scale;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = static_cast<A>(to_acc(p[e * stride_d])) * scale;
  }
}

// A rows x d tile of a [.., rows, .., d] tensor into shared memory, row-major
// (dst[r * ld + c]) or transposed (dst[c * ld + r]). Rows >= rows_valid and
// columns in [d, dfill) are zero-filled so that no garbage (possibly NaN)
// reaches a product. `base` points at the tile's first row.
// row_ptr(r) gives the address of row r (< rows_valid): a strided tensor's
// rows, or a paged KV cache's (see paged_kv_row).
template <int NT, bool kTransposed, class T, class A, class RowPtr>
__device__ __forceinline__ void load_tile_rows(A* dst, int ld, RowPtr row_ptr, int64_t stride_d, bool vec,
                                               int rows_valid, int rows_total, int d, int dfill, A scale) {
  const int n8 = dfill / 8;
  const int units = rows_total * n8;
  for (int u = threadIdx.x; u < units; u += NT) {
    // Transposed stores walk rows fastest so that a warp writes consecutive
    // shared-memory words; row-major ones walk columns fastest (coalesced).
    const int r = kTransposed ? u % rows_total : u / n8;
    const int c8 = (kTransposed ? u / rows_total : u % n8) * 8;
    A v[8];
    if (r < rows_valid && c8 < d) {
      load8<T, A>(row_ptr(r) + c8 * stride_d, stride_d, vec, scale, v);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = A(0);
    }
    if (kTransposed) {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[(c8 + e) * ld + r] = v[e];
    } else {
      constexpr int kV = 16 / sizeof(A);
#pragma unroll
      for (int e = 0; e < 8; e += kV) {
        A w[kV];
#pragma unroll
        for (int x = 0; x < kV; ++x) w[x] = v[e + x];
        sts<kV>(dst + r * ld + c8 + e, w);
      }
    }
  }
}

template <int NT, bool kTransposed, class T, class A>
__device__ __forceinline__ void load_tile(A* dst, int ld, const T* base, int64_t stride_row, int64_t stride_d,
                                          bool vec, int rows_valid, int rows_total, int d, int dfill, A scale) {
  load_tile_rows<NT, kTransposed, T, A>(
      dst, ld, [=](int r) { return base + r * stride_row; }, stride_d, vec, rows_valid, rows_total, d, dfill, scale);
}

// Key j of sequence b, KV head hk, of k or v in a paged KV cache: page
// page_table[b, j / page_size], slot j % page_size. A page index outside the
// pool is clamped into it, so a bad table gives wrong numbers but never an
// out-of-bounds read (the CPU engine reports it as an error).
template <class T>
__device__ __forceinline__ const T* paged_kv_row(const PagedKV& pk, const SeqTensor& t, int b, int j, int hk) {
  int64_t page = pk.page_table[b * pk.stride_b + j / pk.page_size];
  page = page < 0 ? 0 : (page >= pk.num_pages ? pk.num_pages - 1 : page);
  return static_cast<const T*>(t.data) + page * t.stride_b + (j % pk.page_size) * t.stride_s + hk * t.stride_h;
}

// ---- sequences and visibility ------------------------------------------------

__device__ __forceinline__ int64_t pair_index(const PairTensor& t, int64_t b, int64_t h, int64_t i, int64_t j) {
  return b * t.stride_b + h * t.stride_h + i * t.stride_i + j * t.stride_j;
}

// Visible: inside the row's key range and not masked out (true = masked).
__device__ __forceinline__ bool visible(const FwdParams& p, const KeyRange& kr, int b, int h, int i, int j) {
  if (j < kr.lo || j >= kr.hi) return false;
  const PairTensor& m = p.mask.mask;
  return m.data == nullptr || !static_cast<const uint8_t*>(m.data)[pair_index(m, b, h, i, j)];
}

// Whether every (row, key) of the tile [i0, i0 + nr) x [j0, j0 + nc) is visible.
__device__ __forceinline__ bool tile_all_visible(const FwdParams& p, const SeqInfo& s, int i0, int nr, int j0, int nc) {
  return p.mask.mask.data == nullptr && s.vis.tile_all_visible(i0, nr, j0, nc);
}

// Additive logit terms (post-scale bias or ALiBi) in log2 units.
template <class T, class A>
struct LogitBias {
  const T* bias = nullptr;
  PairTensor t;
  A alibi = A(0);  // slope * log2(e); 0 without ALiBi
  bool has_alibi = false;

  __device__ __forceinline__ void init(const FwdParams& p, int b, int h) {
    if (p.bias.type == BiasType::kPostScaleBias) {
      bias = static_cast<const T*>(p.bias.bias.data);
      t = p.bias.bias;
    } else if (p.bias.type == BiasType::kAlibi) {
      has_alibi = true;
      alibi = static_cast<A>(p.bias.alibi_slopes[b * p.bias.alibi_stride_b + h * p.bias.alibi_stride_h]) *
              Consts<A>::kLog2e;
    }
  }
  __device__ __forceinline__ A at(int b, int h, int i, int j, const Visibility<int>& vis) const {
    A x = A(0);
    if (bias != nullptr) x = static_cast<A>(to_acc(bias[pair_index(t, b, h, i, j)])) * Consts<A>::kLog2e;
    if (has_alibi) x -= alibi * static_cast<A>(vis.alibi_distance(i, j));
    return x;
  }
};

// Logit soft-capping (FwdParams::softcap) of x = log2(e) * scale * q.k: x -> cap * tanh(x / cap) with
// cap = log2(e) * softcap, i.e. softcap * tanh(scale q.k / softcap) in log2 units; the backward's factor
// for the gradient of scale q.k is 1 - tanh^2.
template <class A>
struct SoftCap {
  bool on = false;
  A cap = A(0), inv_cap = A(0);

  __device__ __forceinline__ void init(const FwdParams& p) {
    on = p.softcap > 0;
    if (on) {
      cap = static_cast<A>(p.softcap) * Consts<A>::kLog2e;
      inv_cap = A(1) / cap;
    }
  }
  // tanh(x / cap); the capped logit is cap * t.
  __device__ __forceinline__ A tanh_of(A x) const { return tanh(x * inv_cap); }
};

// Dropout keep factors: philox.h's draw of (b, h, i, j); one Philox call
// yields 4 consecutive keys, which is why threads own VS consecutive keys.
template <class A>
struct DeviceDropout {
  bool on = false;
  int64_t seed = 0, offset = 0;
  uint32_t threshold = 0;
  A keep_scale = A(1);

  __device__ __forceinline__ void init(const DropoutParams& d) {
    if (!(d.p > 0.f) || d.rng_state == nullptr) return;
    on = true;
    seed = d.rng_state[0];
    offset = d.rng_state[1];
    threshold = dropout_threshold(d.p);
    keep_scale = A(1) / (A(1) - static_cast<A>(d.p));
  }
  // factor[u] for keys j0 + u, u < VS, where j0 is a multiple of VS and VS divides 4.
  template <int VS>
  __device__ __forceinline__ void factors(int64_t bh, int64_t i, int64_t j0, A (&f)[VS]) const {
    const Philox4 r = dropout_draws(seed, offset, bh, i, j0 >> 2);
#pragma unroll
    for (int u = 0; u < VS; ++u) f[u] = r.x[(j0 + u) & 3] >= threshold ? keep_scale : A(0);
  }
};

// ---- reductions and atomics -------------------------------------------------

template <int WIDTH, class A>
__device__ __forceinline__ A group_max(A v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off /= 2) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
template <int WIDTH, class A>
__device__ __forceinline__ A group_sum(A v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace simt
}  // namespace fusedattn
