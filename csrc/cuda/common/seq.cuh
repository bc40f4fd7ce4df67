// A sequence of a call on the device: its lengths from cu_seqlens and its first tokens (SeqSpan), with
// its visibility rule (fusedattn/visibility.h) for FwdParams' engines (SeqInfo); and the address of a
// row of a q/k/v-like tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedattn/params.h"
#include "fusedattn/visibility.h"

namespace fusedattn {
namespace gpu {

// Positions inside a sequence fit in 32 bits (cu_seqlens are int32, and the engine takes
// s_q + s_kv < kMaxPositionSum32, visibility.h); token offsets and addresses stay 64-bit.
struct SeqInfo {
  int len_q, len_kv;      // clamped to [0, s_q] / [0, s_kv]
  int64_t tok_q, tok_kv;  // token of position 0 (0 for bshd/sbhd)
  Visibility<int> vis;    // the sequence's visibility rule (window, diagonal, lengths)
};

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int clamp_len(int64_t v, int64_t hi) {
  return static_cast<int>(v < 0 ? 0 : (v > hi ? hi : v));
}

// What the lengths and first tokens of a call's sequences are read from: its cu_seqlens and offsets,
// the bounds the lengths are clamped to (max lengths s_q, s_kv) and, for thd, the token dims.
struct SeqExtents {
  SeqlenParams seqlens;
  int64_t s_q, s_kv, t_q, t_kv;
};
// Sequence b's lengths and first tokens, without its visibility rule (the Hopper kernels carry the
// rule in their mask). A length above s_q / s_kv (a max_seqlen smaller than a sequence) is clamped:
// rows past it stay zero.
struct SeqSpan {
  int len_q, len_kv;
  int64_t tok_q, tok_kv;
};
__device__ __forceinline__ SeqSpan seq_span(const SeqExtents& e, int b) {
  const SeqlenParams& sl = e.seqlens;
  SeqSpan s;
  s.len_q = clamp_len(sl.cu_seqlens_q ? int64_t(sl.cu_seqlens_q[b + 1]) - sl.cu_seqlens_q[b] : e.s_q, e.s_q);
  s.len_kv = clamp_len(sl.cu_seqlens_kv ? int64_t(sl.cu_seqlens_kv[b + 1]) - sl.cu_seqlens_kv[b] : e.s_kv, e.s_kv);
  // thd offsets come from the device too: a sequence is kept inside the token
  // dim, so inconsistent cu_seqlens give wrong rows, never an out-of-bounds
  // access (the CPU engine, which can read them, reports them as errors).
  if (sl.q_is_thd) {
    s.tok_q = min64(max64(sl.offsets_q[b], 0), e.t_q);
    s.len_q = static_cast<int>(min64(s.len_q, e.t_q - s.tok_q));
  } else {
    s.tok_q = 0;
  }
  if (sl.kv_is_thd) {
    s.tok_kv = min64(max64(sl.offsets_kv[b], 0), e.t_kv);
    s.len_kv = static_cast<int>(min64(s.len_kv, e.t_kv - s.tok_kv));
  } else {
    s.tok_kv = 0;
  }
  return s;
}

__device__ __forceinline__ SeqInfo seq_info(const FwdParams& p, int b) {
  const SeqSpan sp = seq_span(SeqExtents{p.seqlens, p.prob.s_q, p.prob.s_kv, p.prob.t_q, p.prob.t_kv}, b);
  SeqInfo s;
  s.len_q = sp.len_q;
  s.len_kv = sp.len_kv;
  s.tok_q = sp.tok_q;
  s.tok_kv = sp.tok_kv;
  // Windows arrive clamped to s_q + s_kv (make_fwd_params), so they fit in int.
  s.vis = Visibility<int>::make(static_cast<int>(p.mask.window_left), static_cast<int>(p.mask.window_right),
                                p.mask.bottom_right, s.len_q, s.len_kv);
  return s;
}

// Keys [lo, hi) that row i may see by lengths and window (empty past len_q).
struct KeyRange {
  int lo, hi;
};
__device__ __forceinline__ KeyRange key_range(const SeqInfo& s, int i) {
  if (i >= s.len_q) return {0, 0};
  return {s.vis.key_lo(i), s.vis.key_hi(i)};
}

__device__ __forceinline__ int64_t row_base(const SeqTensor& t, int b, int64_t tok, int h) {
  return b * t.stride_b + tok * t.stride_s + h * t.stride_h;
}

}  // namespace gpu
}  // namespace fusedattn
