// CPU forward: tiled flash attention with online softmax.
//
// For a chunk of (batch, kv head) pairs, keys and values are first converted
// once into float panels (K^T per key tile, V rows), then every (batch,
// query head, query tile) item runs over the key tiles its rows can see:
// S = Q K^T (micro-GEMM), scale/bias/mask, running max and sum, O += P V.
// Items write disjoint rows of out/lse, so the result does not depend on the
// thread count or schedule.
//
// NaN (docs/robustness.md): a NaN logit makes its row's maximum NaN
// (row_max, max_nan), which carries into the row's sum, lse and output with no
// pass of its own. Inputs that reach rows whose logits they do not touch, as
// in torch's math attention, are flagged where they are loaded anyway: a NaN
// key of a (batch, kv head) (found while staging the panels), a NaN query row,
// a NaN ALiBi slope or softmax offset make whole rows NaN; a NaN in feature d of
// a value makes feature d of every row NaN (0 * NaN in torch's P V).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_attn_common.h"
#include "cpu_gemm.h"
#include "cpu_sched.h"
#include "fusedattn/api.h"

namespace fusedattn {
namespace cpu {
namespace {

// Float panels of one chunk of (batch, kv head) pairs.
template <class A>
struct KvPanels {
  std::vector<int64_t> first_pair;  // pair index of chunk entry
  std::vector<int64_t> kt_off, v_off;  // element offsets per chunk entry
  Buf<A> kt, v;
};

template <class T>
struct FwdRun {
  using A = typename Elem<T>::Acc;
  const AttnCtx<T>& c;
  const FwdParams& p;

  struct Item {
    int64_t entry;  // chunk entry (pair)
    int64_t h;      // query head
    int64_t qt;     // query tile
  };

  struct Scratch {
    Buf<A> q, s, o, m, l;
  };

  bool init_scratch(Scratch& w) const {
    return w.q.alloc(kBlockM * c.dqk_p) && w.s.alloc(kBlockM * kBlockN) && w.o.alloc(kBlockM * c.dv_p) &&
           w.m.alloc(kBlockM) && w.l.alloc(kBlockM);
  }

  // K^T tile kt of pair (b, hk): [dqk][kBlockN]; V rows of the tile: [kBlockN][dv_p]. Pads are zero.
  // Returns kKeyNan | kValueNan for a NaN among the staged keys / values.
  static constexpr uint8_t kKeyNan = 1, kValueNan = 2;
  uint8_t stage_tile(int64_t b, int64_t hk, int64_t kt, A* __restrict ktile, A* __restrict vrows) const {
    const SeqExtent& e = c.lay.seq[b];
    const int64_t j0 = kt * kBlockN;
    const int nj = static_cast<int>(std::min<int64_t>(kBlockN, e.len_kv - j0));
    A krow[1024];
    bool k_nan = false, v_nan = false;
    for (int jj = 0; jj < kBlockN; ++jj) {
      A* vdst = vrows + jj * c.dv_p;
      if (jj < nj) {
        const T* ks = kv_row<T>(c, p.k, b, j0 + jj, hk);
        for (int64_t d0 = 0; d0 < c.dqk; d0 += 1024) {
          const int64_t dn = std::min<int64_t>(1024, c.dqk - d0);
          load_row<T, A>(ks + d0 * p.k.stride_d, p.k.stride_d, dn, dn, krow);
          k_nan |= any_nan(krow, dn);
          for (int64_t d = 0; d < dn; ++d) ktile[(d0 + d) * kBlockN + jj] = krow[d];
        }
        load_row<T, A>(kv_row<T>(c, p.v, b, j0 + jj, hk), p.v.stride_d, c.dv, c.dv_p, vdst);
        v_nan |= any_nan(vdst, c.dv);
      } else {
        for (int64_t d = 0; d < c.dqk; ++d) ktile[d * kBlockN + jj] = 0;
        for (int64_t d = 0; d < c.dv_p; ++d) vdst[d] = 0;
      }
    }
    return static_cast<uint8_t>((k_nan ? kKeyNan : 0) | (v_nan ? kValueNan : 0));
  }

  // One query tile: returns the largest visible logit of its rows (-inf if none, NaN for a NaN row).
  // k_nan: a key of the tile's (batch, kv head) is NaN; v_nan_cols: null, or per value feature whether
  // a value of the (batch, kv head) is NaN there.
  A run_item(Scratch& w, int64_t b, int64_t h, int64_t qt, const A* kt_panel, const A* v_panel, bool k_nan,
             const uint8_t* v_nan_cols) const {
    const SeqExtent& e = c.lay.seq[b];
    const Window& win = c.win[b];
    const int64_t bq = c.lay.q_thd ? 0 : b;
    const int64_t i0 = qt * kBlockM;
    const int nr = static_cast<int>(std::min<int64_t>(kBlockM, e.len_q - i0));
    A* __restrict qs = w.q.get();
    A* __restrict S = w.s.get();
    A* __restrict O = w.o.get();
    A* __restrict m = w.m.get();
    A* __restrict l = w.l.get();
    bool nan_row[kBlockM];
    const bool nan_head = k_nan || c.head_params_nan(b, h);
    for (int r = 0; r < nr; ++r) {
      load_row<T, A>(row_ptr<const T>(p.q, bq, e.tok_q + i0 + r, h), p.q.stride_d, c.dqk, c.dqk_p, qs + r * c.dqk_p);
      nan_row[r] = nan_head || any_nan(qs + r * c.dqk_p, c.dqk);
      m[r] = neg_inf<A>();
      l[r] = 0;
    }
    std::memset(O, 0, sizeof(A) * nr * c.dv_p);

    const int64_t bh = b * c.hq + h;
    int64_t klo, khi;
    keys_for_rows(win, i0, i0 + nr, &klo, &khi);
    for (int64_t kt = klo / kBlockN; klo < khi && kt * kBlockN < khi; ++kt) {
      const int64_t j0 = kt * kBlockN;
      const int nj = static_cast<int>(std::min<int64_t>(kBlockN, e.len_kv - j0));
      const int ncols = static_cast<int>(round_up(nj, kPadElems));
      gemm<A, false>(nr, ncols, static_cast<int>(c.dqk), qs, c.dqk_p, 1, kt_panel + kt * c.dqk * kBlockN, kBlockN, S,
                     kBlockN);
      const A f = c.finish_logits(b, h, i0, nr, j0, nj, ncols, S);
      for (int r = 0; r < nr; ++r) {
        A* s = S + r * kBlockN;
        const A mnew = max_nan(m[r], row_max(s, ncols) * f);
        if (mnew == neg_inf<A>()) {  // nothing visible in this row yet
          row_fill<A>(s, ncols, 0);
          continue;
        }
        A fs = f;
        if (std::fabs(mnew) > huge_logit<A>()) {
          row_scale(s, ncols, f);
          fs = 1;
        }
        const A sum = row_exp_sum(s, ncols, fs, mnew);
        if (mnew != m[r]) {
          const A alpha = exp_acc(m[r] - mnew);
          if (l[r] > 0) row_scale(O + r * c.dv_p, static_cast<int>(c.dv_p), alpha);
          l[r] = l[r] * alpha + sum;
          m[r] = mnew;
        } else {
          l[r] += sum;
        }
        if (c.drop.on) c.drop.apply_row(bh, i0 + r, j0, ncols, s);
      }
      gemm<A, true>(nr, static_cast<int>(c.dv_p), nj, S, kBlockN, 1, v_panel + j0 * c.dv_p, c.dv_p, O, c.dv_p);
    }

    // Normalise and write rows; lse of the undropped softmax, with the sink.
    A tile_max = neg_inf<A>();
    const A sink = c.sink(h);
    for (int r = 0; r < nr; ++r) {
      const int64_t tok = e.tok_q + i0 + r;
      T* orow = row_ptr<T>(p.out, bq, tok, h);
      float* lse = p.lse + b * p.lse_stride_b + h * p.lse_stride_h + tok * p.lse_stride_s;
      if (nan_row[r] || l[r] != l[r]) {
        *lse = quiet_nan<float>();
        fill_row(orow, p.out.stride_d, c.dv, quiet_nan<A>());
        tile_max = quiet_nan<A>();
        continue;
      }
      if (l[r] == 0) {  // no visible key
        *lse = c.has_sink ? static_cast<float>(sink) : -std::numeric_limits<float>::infinity();
        zero_row(orow, p.out.stride_d, c.dv);
      } else {
        tile_max = max_nan(tile_max, m[r]);
        A row_lse, f;
        if (!c.has_sink) {
          row_lse = m[r] + std::log(l[r]);
          f = static_cast<A>(1) / l[r];
        } else {
          const A top = std::max(m[r], sink);
          const A a = std::exp(m[r] - top);
          const A denom = l[r] * a + std::exp(sink - top);
          row_lse = top + std::log(denom);
          f = a / denom;
        }
        *lse = static_cast<float>(row_lse);
        store_row<T, A>(orow, p.out.stride_d, c.dv, O + r * c.dv_p, f);
      }
      if (v_nan_cols != nullptr) {
        for (int64_t d = 0; d < c.dv; ++d)
          if (v_nan_cols[d]) Elem<T>::store(orow + d * p.out.stride_d, quiet_nan<A>());
      }
    }
    return tile_max;
  }

  Status run(const Executor& exec) {
    const int64_t pairs = c.B * c.hkv;
    auto ntiles = [&](int64_t len, int64_t blk) { return (len + blk - 1) / blk; };
    std::vector<A> head_max(static_cast<size_t>(c.hq), neg_inf<A>());

    int64_t first = 0;
    while (first < pairs) {
      // Chunk of pairs [first, last) whose panels fit the budget (at least one).
      int64_t last = first;
      int64_t kt_elems = 0, v_elems = 0;
      std::vector<int64_t> kt_off, v_off;
      while (last < pairs) {
        const int64_t rows = ntiles(c.lay.seq[last / c.hkv].len_kv, kBlockN) * kBlockN;
        const int64_t add_kt = rows * c.dqk, add_v = rows * c.dv_p;
        if (last > first && (kt_elems + add_kt + v_elems + add_v) * static_cast<int64_t>(sizeof(A)) > kStageBudgetBytes) break;
        kt_off.push_back(kt_elems);
        v_off.push_back(v_elems);
        kt_elems += add_kt;
        v_elems += add_v;
        ++last;
      }
      Buf<A> kt_panel, v_panel;
      if (!kt_panel.alloc(static_cast<size_t>(kt_elems)) || !v_panel.alloc(static_cast<size_t>(v_elems))) {
        return out_of_memory("key/value panels");
      }

      // Stage: one item per key tile.
      std::vector<std::pair<int64_t, int64_t>> stage_items;  // (entry, kt)
      for (int64_t pi = first; pi < last; ++pi) {
        const int64_t n = ntiles(c.lay.seq[pi / c.hkv].len_kv, kBlockN);
        for (int64_t kt = 0; kt < n; ++kt) stage_items.push_back({pi - first, kt});
      }
      std::vector<uint8_t> tile_nan(stage_items.size(), 0);
      struct NoScratch {};
      FUSEDATTN_RETURN_IF_ERROR(parallel_items<NoScratch>(
          exec, static_cast<int64_t>(stage_items.size()), [](NoScratch&) { return true; },
          [&](NoScratch&, int64_t k) {
            const int64_t entry = stage_items[k].first, kt = stage_items[k].second;
            const int64_t pi = first + entry;
            tile_nan[k] = stage_tile(pi / c.hkv, pi % c.hkv, kt, kt_panel.get() + kt_off[entry] + kt * c.dqk * kBlockN,
                                     v_panel.get() + v_off[entry] + kt * kBlockN * c.dv_p);
          }));
      std::vector<uint8_t> entry_nan(static_cast<size_t>(last - first), 0);
      for (size_t k = 0; k < stage_items.size(); ++k) entry_nan[stage_items[k].first] |= tile_nan[k];
      // Rare: which value features hold a NaN, from the staged panel of each such entry.
      std::vector<std::vector<uint8_t>> v_nan_cols(entry_nan.size());
      for (size_t en = 0; en < entry_nan.size(); ++en) {
        if (!(entry_nan[en] & kValueNan)) continue;
        v_nan_cols[en].assign(static_cast<size_t>(c.dv), 0);
        const A* vp = v_panel.get() + v_off[en];
        const int64_t rows = ntiles(c.lay.seq[(first + en) / c.hkv].len_kv, kBlockN) * kBlockN;
        for (int64_t j = 0; j < rows; ++j)
          for (int64_t d = 0; d < c.dv; ++d) v_nan_cols[en][d] |= vp[j * c.dv_p + d] != vp[j * c.dv_p + d];
      }

      // Compute: one item per (pair, query head of the group, query tile).
      std::vector<Item> items;
      for (int64_t pi = first; pi < last; ++pi) {
        const int64_t b = pi / c.hkv, hk = pi % c.hkv;
        const int64_t n = ntiles(c.lay.seq[b].len_q, kBlockM);
        for (int64_t g = 0; g < c.group; ++g)
          for (int64_t qt = 0; qt < n; ++qt) items.push_back({pi - first, hk * c.group + g, qt});
      }
      const int64_t n_items = static_cast<int64_t>(items.size());
      auto cost = [&](int64_t k) {
        const Item& it = items[k];
        const int64_t b = (first + it.entry) / c.hkv;
        const int64_t i0 = it.qt * kBlockM;
        const int nr = static_cast<int>(std::min<int64_t>(kBlockM, c.lay.seq[b].len_q - i0));
        return c.key_tiles(b, i0, nr);
      };
      std::vector<int64_t> order;
      order_by_cost(n_items, cost, &order);
      std::vector<A> item_max(static_cast<size_t>(n_items), neg_inf<A>());
      FUSEDATTN_RETURN_IF_ERROR(parallel_items<Scratch>(
          exec, n_items, [&](Scratch& w) { return init_scratch(w); },
          [&](Scratch& w, int64_t k) {
            const int64_t idx = order[k];
            const Item& it = items[idx];
            const int64_t pi = first + it.entry;
            item_max[idx] = run_item(w, pi / c.hkv, it.h, it.qt, kt_panel.get() + kt_off[it.entry],
                                     v_panel.get() + v_off[it.entry], (entry_nan[it.entry] & kKeyNan) != 0,
                                     v_nan_cols[it.entry].empty() ? nullptr : v_nan_cols[it.entry].data());
          }));
      for (int64_t k = 0; k < n_items; ++k) head_max[items[k].h] = max_nan(head_max[items[k].h], item_max[k]);
      first = last;
    }
    if (p.max_logit != nullptr) {
      for (int64_t h = 0; h < c.hq; ++h) p.max_logit[h] = static_cast<float>(head_max[h]);
    }
    return Status::Ok();
  }
};

template <class T>
Status fwd_typed(const FwdParams& p, const Executor& exec) {
  AttnCtx<T> c;
  FUSEDATTN_RETURN_IF_ERROR(c.init(p));
  // Rows no sequence covers: zeros in out, -inf in lse.
  const std::vector<TokenRange> gaps = uncovered_tokens(c.lay, true);
  zero_uncovered<T>(p.out, gaps, c.hq, c.dv);
  for (const TokenRange& r : gaps)
    for (int64_t tok = r.begin; tok < r.end; ++tok)
      for (int64_t h = 0; h < c.hq; ++h)
        p.lse[r.b * p.lse_stride_b + h * p.lse_stride_h + tok * p.lse_stride_s] = -std::numeric_limits<float>::infinity();
  FwdRun<T> run{c, p};
  return run.run(exec);
}

}  // namespace
}  // namespace cpu

Status run_fwd_cpu(const FwdParams& params, const Executor& exec) {
  Status st = Status::Unsupported(std::string("CPU forward: unsupported dtype ") + dtype_name(params.prob.dtype));
  cpu::dispatch_float_dtype(params.prob.dtype, [&](auto tag) { st = cpu::fwd_typed<decltype(tag)>(params, exec); });
  return st;
}

}  // namespace fusedattn
