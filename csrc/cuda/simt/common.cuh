// Device-side vocabulary of the SIMT kernels: element conversion, vector
// access to shared memory, tile loads from strided global tensors, sequence
// extents, visibility, bias and dropout. Every kernel reads the problem from
// the core's params structs (passed by value as kernel arguments) and reads
// cu_seqlens on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "fusedattn/params.h"
#include "fusedattn/philox.h"

namespace fusedattn {
namespace simt {

// ---- element types ---------------------------------------------------------

// Accumulation type: fp32 for the 16-bit dtypes and fp32, fp64 for fp64.
template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class T>
using AccT = typename AccOf<T>::type;

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_acc(float x);
template <class T>
__device__ __forceinline__ T from_acc(double x);
template <>
__device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ double from_acc<double>(double x) { return x; }

template <class A>
struct Consts;
template <>
struct Consts<float> {
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kLn2 = 0.6931471805599453f;
};
template <>
struct Consts<double> {
  static constexpr double kLog2e = 1.4426950408889634074;
  static constexpr double kLn2 = 0.69314718055994530942;
};

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}
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

// Whether a q/k/v-like tensor can be read 8 elements (one head-dim chunk) at a
// time with 16-byte loads: unit stride along d and every row start 16-byte
// aligned. Head dims are multiples of 8, so chunks never straddle rows.
template <class T>
inline bool rows_vectorizable(const SeqTensor& t) {
  const auto aligned = [](int64_t s) { return s % 8 == 0; };
  return t.stride_d == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && aligned(t.stride_b) &&
         aligned(t.stride_s) && aligned(t.stride_h);
}

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

// Positions inside a sequence fit in 32 bits (cu_seqlens are int32); token
// offsets and addresses stay 64-bit.
struct SeqInfo {
  int len_q, len_kv;      // clamped to [0, s_q] / [0, s_kv]
  int64_t tok_q, tok_kv;  // token of position 0 (0 for bshd/sbhd)
  int diag;               // bottom-right: len_kv - len_q, else 0
  int wl, wr;             // < 0: unbounded
};

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int clamp_len(int64_t v, int64_t hi) {
  return static_cast<int>(v < 0 ? 0 : (v > hi ? hi : v));
}

// Lengths come from cu_seqlens on the device. A length above s_q / s_kv (a
// max_seqlen smaller than a sequence) is clamped: rows past it stay zero.
__device__ __forceinline__ SeqInfo seq_info(const FwdParams& p, int b) {
  const SeqlenParams& sl = p.seqlens;
  SeqInfo s;
  s.len_q = sl.cu_seqlens_q ? clamp_len(int64_t(sl.cu_seqlens_q[b + 1]) - sl.cu_seqlens_q[b], p.prob.s_q)
                            : clamp_len(p.prob.s_q, p.prob.s_q);
  s.len_kv = sl.cu_seqlens_kv ? clamp_len(int64_t(sl.cu_seqlens_kv[b + 1]) - sl.cu_seqlens_kv[b], p.prob.s_kv)
                              : clamp_len(p.prob.s_kv, p.prob.s_kv);
  // thd offsets come from the device too: a sequence is kept inside the token
  // dim, so inconsistent cu_seqlens give wrong rows, never an out-of-bounds
  // access (the CPU engine, which can read them, reports them as errors).
  if (sl.q_is_thd) {
    s.tok_q = min64(max64(sl.offsets_q[b], 0), p.prob.t_q);
    s.len_q = static_cast<int>(min64(s.len_q, p.prob.t_q - s.tok_q));
  } else {
    s.tok_q = 0;
  }
  if (sl.kv_is_thd) {
    s.tok_kv = min64(max64(sl.offsets_kv[b], 0), p.prob.t_kv);
    s.len_kv = static_cast<int>(min64(s.len_kv, p.prob.t_kv - s.tok_kv));
  } else {
    s.tok_kv = 0;
  }
  s.diag = p.mask.bottom_right ? s.len_kv - s.len_q : 0;
  // A window wider than both sequences constrains nothing; dropping it keeps
  // i + diag +- w far from overflow (the CPU engine does the same).
  const int64_t reach = int64_t(s.len_q) + s.len_kv + 1;
  s.wl = p.mask.window_left >= 0 && p.mask.window_left <= reach ? static_cast<int>(p.mask.window_left) : -1;
  s.wr = p.mask.window_right >= 0 && p.mask.window_right <= reach ? static_cast<int>(p.mask.window_right) : -1;
  return s;
}

__device__ __forceinline__ bool in_window(const SeqInfo& s, int i, int j) {
  return (s.wl < 0 || j >= i + s.diag - s.wl) && (s.wr < 0 || j <= i + s.diag + s.wr);
}

// Keys [lo, hi) that row i may see by lengths and window (empty past len_q).
struct KeyRange {
  int lo, hi;
};
__device__ __forceinline__ KeyRange key_range(const SeqInfo& s, int i) {
  if (i >= s.len_q) return {0, 0};
  KeyRange k{0, s.len_kv};
  if (s.wl >= 0) k.lo = max(0, i + s.diag - s.wl);
  if (s.wr >= 0) k.hi = min(s.len_kv, i + s.diag + s.wr + 1);
  return k;
}

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
  if (p.mask.mask.data != nullptr || i0 + nr > s.len_q || j0 + nc > s.len_kv) return false;
  return in_window(s, i0 + nr - 1, j0) && in_window(s, i0, j0 + nc - 1);
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
  __device__ __forceinline__ A at(int b, int h, int i, int j, int diag) const {
    A x = A(0);
    if (bias != nullptr) x = static_cast<A>(to_acc(bias[pair_index(t, b, h, i, j)])) * Consts<A>::kLog2e;
    if (has_alibi) {
      const int dist = j - i - diag;
      x -= alibi * static_cast<A>(dist < 0 ? -dist : dist);
    }
    return x;
  }
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

// max(a, b), NaN if either is (fmax drops a NaN): a NaN logit makes its row's
// maximum NaN, which the online softmax carries into the sum, lse and output.
template <class A>
__device__ __forceinline__ A max_nan(A a, A b) {
  return (a != a || b != b) ? a + b : fmax(a, b);
}

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

// atomic max on a float through its ordered integer images (no NaN inputs).
__device__ __forceinline__ void atomic_max_float(float* addr, float v) {
  if (v >= 0.f) {
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  } else {
    atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
  }
}

__device__ __forceinline__ int64_t row_base(const SeqTensor& t, int b, int64_t tok, int h) {
  return b * t.stride_b + tok * t.stride_s + h * t.stride_h;
}

// ---- host helpers -------------------------------------------------------------

inline Status cuda_error(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string("CUDA error in fusedattn ") + what + ": " + cudaGetErrorString(e));
}

// The error of the launch just made (configuration errors surface here;
// asynchronous faults surface at a later synchronising call, as in PyTorch).
inline Status check_launch(const char* what) { return cuda_error(cudaGetLastError(), what); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Raises a kernel's dynamic shared-memory limit to `bytes` (once per device
// and kernel; `done` is the kernel's own flag word), or says why the device
// cannot give that much. None of these calls synchronises, and after a call's
// first (eager) run none is a driver call at all, so capture is unaffected.
template <class Kernel>
inline Status prepare_smem(Kernel kernel, size_t bytes, const char* what, std::atomic<uint64_t>* done) {
  int dev = 0;
  FUSEDATTN_RETURN_IF_ERROR(cuda_error(cudaGetDevice(&dev), what));
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit != 0 && (done->load(std::memory_order_relaxed) & bit)) return Status::Ok();
  int optin = 0;
  FUSEDATTN_RETURN_IF_ERROR(
      cuda_error(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), what));
  if (bytes > static_cast<size_t>(optin)) {
    return Status::Unsupported(std::string("fusedattn CUDA ") + what + " needs " + std::to_string(bytes) +
                               " bytes of shared memory per block; this device allows " + std::to_string(optin));
  }
  if (bytes > 48 * 1024) {
    FUSEDATTN_RETURN_IF_ERROR(cuda_error(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what));
  }
  done->fetch_or(bit, std::memory_order_relaxed);
  return Status::Ok();
}

inline Status check_grid(int64_t y, int64_t z, const char* what) {
  if (y > 65535 || z > 65535) {
    return Status::Unsupported(std::string("fusedattn CUDA ") + what + ": heads (" + std::to_string(y) +
                               ") and batch (" + std::to_string(z) + ") must each be <= 65535");
  }
  return Status::Ok();
}

}  // namespace simt
}  // namespace fusedattn
