// What the CPU forward and backward share: the per-call context (dims,
// sequence extents, windows, dropout), row addressing of strided tensors,
// and the logits tile pipeline (scale, bias, mask).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_bias.h"
#include "cpu_convert.h"
#include "cpu_dropout.h"
#include "cpu_mask.h"
#include "cpu_seqlen.h"
#include "cpu_simd.h"
#include "cpu_tiles.h"
#include "fusedattn/params.h"

namespace fusedattn {
namespace cpu {

template <class T>
struct AttnCtx {
  using A = typename Elem<T>::Acc;

  const FwdParams* p = nullptr;
  SeqLayout lay;
  std::vector<Window> win;  // per batch entry
  int64_t B = 0, hq = 0, hkv = 0, group = 1, dqk = 0, dv = 0;
  int64_t dqk_p = 0, dv_p = 0;  // head dims padded to whole vectors
  A scale = 1;
  A softcap = 0;    // > 0: logits capped (FwdParams::softcap)
  A cap_scale = 0;  // scale / softcap
  Dropout<A> drop;
  bool has_sink = false;

  Status init(const FwdParams& params) {
    p = &params;
    FUSEDATTN_RETURN_IF_ERROR(make_seq_layout(params, &lay));
    const Problem& pr = params.prob;
    B = pr.b;
    hq = pr.h_q;
    hkv = pr.h_kv;
    group = hkv > 0 ? hq / hkv : 1;  // no heads: an empty problem
    dqk = pr.d_qk;
    dv = pr.d_v;
    dqk_p = round_up(dqk, kPadElems);
    dv_p = round_up(dv, kPadElems);
    scale = static_cast<A>(params.scale);
    if (params.softcap > 0) {
      softcap = static_cast<A>(params.softcap);
      cap_scale = scale / softcap;
    }
    drop = Dropout<A>::make(params.dropout);
    has_sink = params.softmax.type != SoftmaxType::kVanilla;
    // The page table's entries are device data the checks could not read: the engine checks them.
    const PagedKV& pk = params.paged;
    if (pk.page_table != nullptr) {
      if (pk.page_size <= 0) return Status::Invalid("paged KV: page_size must be positive");
      for (int64_t b = 0; b < B; ++b) {
        const int64_t pages = (lay.seq[b].len_kv + pk.page_size - 1) / pk.page_size;
        for (int64_t k = 0; k < pages; ++k) {
          const int64_t page = pk.page_table[b * pk.stride_b + k];
          if (page < 0 || page >= pk.num_pages) {
            return Status::Invalid("page_table[" + std::to_string(b) + ", " + std::to_string(k) + "] = " +
                                   std::to_string(page) + " is outside the page pool of " +
                                   std::to_string(pk.num_pages) + " pages");
          }
        }
      }
    }
    win.resize(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) win[b] = window_of(params.mask, lay.seq[b].len_q, lay.seq[b].len_kv);
    return Status::Ok();
  }

  A sink(int64_t h) const {
    return p->softmax.type == SoftmaxType::kLearnable ? static_cast<A>(p->softmax.offset[h]) : static_cast<A>(0);
  }

  // A NaN ALiBi slope or softmax offset enters every logit (or the normaliser)
  // of head h of sequence b: every row of it is NaN, also one that sees no key.
  bool head_params_nan(int64_t b, int64_t h) const {
    const BiasParams& bp = p->bias;
    if (bp.type == BiasType::kAlibi) {
      const float slope = bp.alibi_slopes[b * bp.alibi_stride_b + h * bp.alibi_stride_h];
      if (slope != slope) return true;
    }
    const A s = sink(h);
    return s != s;
  }

  // Number of key tiles a query tile sees (0 if none): the work of a forward item.
  int64_t key_tiles(int64_t b, int64_t i0, int nr) const {
    int64_t lo, hi;
    keys_for_rows(win[b], i0, i0 + nr, &lo, &hi);
    return hi > lo ? (hi - 1) / kBlockN - lo / kBlockN + 1 : 0;
  }

  // Logits tile for (b, h), rows i0.. (nr), keys j0.. (nj real, ncols computed):
  // S holds q.k on entry; on return the logits are f * S with f the returned
  // factor (1, or the scale left for the softmax's FMA), invisible entries -inf.
  // With a softcap, S = softcap * tanh(scale * q.k / softcap) before the bias (params.h), and
  // dcap (row stride kBlockN), when given, receives 1 - tanh^2, the backward's factor (cap_grad).
  A finish_logits(int64_t b, int64_t h, int64_t i0, int nr, int64_t j0, int nj, int ncols, A* S,
                  A* dcap = nullptr) const {
    const Window& w = win[b];
    A s_scale = scale;
    if (softcap > 0) {
      for (int r = 0; r < nr; ++r) {
        A* s = S + r * kBlockN;
        A* d = dcap != nullptr ? dcap + r * kBlockN : nullptr;
        for (int c = 0; c < ncols; ++c) {
          const A t = std::tanh(s[c] * cap_scale);
          s[c] = softcap * t;
          if (d != nullptr) d[c] = 1 - t * t;
        }
      }
      s_scale = 1;
    }
    const A f = scale_and_bias_tile<T, A>(p->bias, w, b, h, i0, nr, j0, nj, ncols, s_scale, S, kBlockN);
    if (p->mask.mask.data != nullptr || !w.tile_all_visible(i0, nr, j0, ncols)) {
      mask_tile<A>(w, p->mask.mask, b, h, i0, nr, j0, ncols, S, kBlockN);
    }
    return f;
  }

  // dS <- dS * (1 - tanh^2) (from finish_logits' dcap): the gradient of the capped logits taken
  // back to scale * q.k. A no-op without a softcap.
  void cap_grad(A* dS, const A* dcap, int nr, int ncols) const {
    if (!(softcap > 0)) return;
    for (int r = 0; r < nr; ++r)
      for (int c = 0; c < ncols; ++c) dS[r * kBlockN + c] *= dcap[r * kBlockN + c];
  }
};

// Element (b, token, h, 0) of a sequence tensor (b ignored for thd, whose b stride is 0).
template <class T>
inline T* row_ptr(const SeqTensor& t, int64_t b, int64_t token, int64_t h) {
  return static_cast<T*>(t.data) + b * t.stride_b + token * t.stride_s + h * t.stride_h;
}

// Element (key position j of sequence b, kv head hk, 0) of k or v: through the
// page table for a paged KV cache, else at token tok_kv(b) + j.
template <class T, class Ctx>
inline const T* kv_row(const Ctx& c, const SeqTensor& t, int64_t b, int64_t j, int64_t hk) {
  const PagedKV& pk = c.p->paged;
  if (pk.page_table != nullptr) {
    const int64_t page = pk.page_table[b * pk.stride_b + j / pk.page_size];
    return static_cast<const T*>(t.data) + page * t.stride_b + (j % pk.page_size) * t.stride_s + hk * t.stride_h;
  }
  return row_ptr<const T>(t, c.lay.kv_thd ? 0 : b, c.lay.seq[b].tok_kv + j, hk);
}

// dst[0..d) = src[k * sd], dst[d..dpad) = 0.
template <class T, class A>
inline void load_row(const T* src, int64_t sd, int64_t d, int64_t dpad, A* __restrict dst) {
  if (sd == 1) {
    for (int64_t k = 0; k < d; ++k) dst[k] = static_cast<A>(Elem<T>::load(src + k));
  } else {
    for (int64_t k = 0; k < d; ++k) dst[k] = static_cast<A>(Elem<T>::load(src + k * sd));
  }
  for (int64_t k = d; k < dpad; ++k) dst[k] = 0;
}

// dst[k * sd] = f * src[k].
template <class T, class A>
inline void store_row(T* dst, int64_t sd, int64_t d, const A* __restrict src, A f) {
  for (int64_t k = 0; k < d; ++k) Elem<T>::store(dst + k * sd, static_cast<typename Elem<T>::Acc>(src[k] * f));
}

template <class T>
inline void fill_row(T* dst, int64_t sd, int64_t d, typename Elem<T>::Acc v) {
  for (int64_t k = 0; k < d; ++k) Elem<T>::store(dst + k * sd, v);
}

template <class T>
inline void zero_row(T* dst, int64_t sd, int64_t d) {
  fill_row(dst, sd, d, 0);
}

template <class A>
constexpr A quiet_nan() {
  return std::numeric_limits<A>::quiet_NaN();
}

// Zeros rows (all heads) of a sequence tensor at the uncovered tokens.
template <class T>
void zero_uncovered(const SeqTensor& t, const std::vector<TokenRange>& ranges, int64_t heads, int64_t d) {
  for (const TokenRange& r : ranges)
    for (int64_t tok = r.begin; tok < r.end; ++tok)
      for (int64_t h = 0; h < heads; ++h) zero_row(row_ptr<T>(t, r.b, tok, h), t.stride_d, d);
}

}  // namespace cpu
}  // namespace fusedattn
