// CPU backward: flash-attention backward that recomputes P from q, k and the
// saved lse. Every output element has exactly one writer and every sum runs
// in a fixed order, so results are deterministic and race-free without
// atomics, whatever the thread count. Two schedules:
//   fused (enough (batch, kv head) pairs to keep the threads busy, no dbias):
//     one item per pair does the FA2 loop (key tiles outer, query tiles
//     inner) and owns dK, dV and the dQ of its whole head group;
//   two passes (otherwise):
//     pass 1, one item per (batch, kv head, key tile): dK and dV of the tile,
//             summed over all query heads of the GQA group and all query tiles;
//     pass 2, one item per (dbias slot, query tile): dQ of the tile, and the
//             dbias rows, summed in a fixed order over the (batch, head) pairs
//             that a broadcast bias shares.
//   The two passes recompute P and dP twice (7 instead of 5 GEMMs) but
//   expose per-tile parallelism.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_attn_common.h"
#include "cpu_gemm.h"
#include "cpu_sched.h"
#include "fusedattn/api.h"

namespace fusedattn {
namespace cpu {
inline namespace FUSEDATTN_CPU_ISA {
namespace {

inline int64_t ntiles(int64_t len, int64_t blk) { return (len + blk - 1) / blk; }

// The two schedules read float panels staged once per chunk of (batch, kv head) pairs:
// Q, dO, lse and D = rowsum(dO * O) per query head; K^T, K and V^T per key
// tile. For fp64 the staged lse (stored in fp32 by contract) is computed again
// in double with one pass over the keys, so gradients are fp64-accurate.
template <class T>
struct BwdRun {
  using A = typename Elem<T>::Acc;
  const AttnCtx<T>& c;
  const BwdParams& bp;
  const FwdParams& p;  // bp.fwd
  bool dbias_on = false;
  int64_t dbias_w = 0;  // dbias row width (s_kv)

  // Panel layout of one (batch, kv head) pair inside a chunk.
  struct PairPanels {
    int64_t b = 0, hk = 0;
    int64_t nq = 0, nk = 0;  // query rows / key rows, padded to whole tiles
    A* q = nullptr;          // [group][nq][dqk_p]
    A* dout = nullptr;       // [group][nq][dv_p]
    A* lse = nullptr;        // [group][nq]
    A* dd = nullptr;         // [group][nq]  D = rowsum(dO * O)
    A* kt = nullptr;         // [nk / BN][dqk][BN]
    A* k = nullptr;          // [nk][dqk_p]
    A* vt = nullptr;         // [nk / BN][dv][BN]

    static int64_t elems(const AttnCtx<T>& c, int64_t nq, int64_t nk) {
      return c.group * nq * (c.dqk_p + c.dv_p + 2) + nk * (c.dqk + c.dqk_p + c.dv);
    }
    void place(const AttnCtx<T>& c, A* base) {
      q = base;
      dout = q + c.group * nq * c.dqk_p;
      lse = dout + c.group * nq * c.dv_p;
      dd = lse + c.group * nq;
      kt = dd + c.group * nq;
      k = kt + nk * c.dqk;
      vt = k + nk * c.dqk_p;
    }
  };

  bool fused = false;
  int64_t fused_dq_elems = 0;  // dQ accumulator of one pair (fused schedule)

  struct Scratch {
    Buf<A> s, dp, pd, acc_a, acc_b, dbias, dq, dcap;
  };

  bool init_scratch(Scratch& w) const {
    const int64_t tile = kBlockM * kBlockN;
    const int64_t accn = std::max(kBlockN, kBlockM) * std::max(c.dqk_p, c.dv_p);
    return w.s.alloc(tile) && w.dp.alloc(tile) && w.pd.alloc(tile) && w.acc_a.alloc(accn) && w.acc_b.alloc(accn) &&
           (!dbias_on || w.dbias.alloc(static_cast<size_t>(kBlockM * dbias_w))) &&
           (!fused || w.dq.alloc(static_cast<size_t>(fused_dq_elems))) && (!(c.softcap > 0) || w.dcap.alloc(tile));
  }

  // ---- staging ------------------------------------------------------------------------
  // Query tile qt of head g of the pair: Q, dO, lse, D rows.
  void stage_q_tile(const PairPanels& pp, int64_t g, int64_t qt) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const int64_t bq = c.lay.q_thd ? 0 : pp.b;
    const int64_t h = pp.hk * c.group + g;
    const int64_t i0 = qt * kBlockM;
    const int nr = static_cast<int>(std::min<int64_t>(kBlockM, e.len_q - i0));
    for (int r = 0; r < kBlockM; ++r) {
      const int64_t row = g * pp.nq + i0 + r;
      A* qd = pp.q + row * c.dqk_p;
      A* od = pp.dout + row * c.dv_p;
      if (r >= nr) {
        std::memset(qd, 0, sizeof(A) * c.dqk_p);
        std::memset(od, 0, sizeof(A) * c.dv_p);
        pp.lse[row] = neg_inf<A>();
        pp.dd[row] = 0;
        continue;
      }
      const int64_t tok = e.tok_q + i0 + r;
      load_row<T, A>(row_ptr<const T>(p.q, bq, tok, h), p.q.stride_d, c.dqk, c.dqk_p, qd);
      load_row<T, A>(row_ptr<const T>(bp.dout, bq, tok, h), bp.dout.stride_d, c.dv, c.dv_p, od);
      const T* orow = row_ptr<const T>(p.out, bq, tok, h);
      A dsum = 0;
      for (int64_t d = 0; d < c.dv; ++d) dsum += od[d] * static_cast<A>(Elem<T>::load(orow + d * p.out.stride_d));
      const A lse = static_cast<A>(p.lse[pp.b * p.lse_stride_b + h * p.lse_stride_h + tok * p.lse_stride_s]);
      pp.lse[row] = lse;
      pp.dd[row] = dsum;
    }
  }

  // fp64 only: the row's lse in double, by the forward's online softmax over the keys it sees (the
  // staged fp32 value only tells rows without visible keys (-inf) and NaN rows, which keep it; one
  // beyond fp32's range was stored as +inf).
  void refine_lse(A* __restrict S, const PairPanels& pp, int64_t g, int64_t qt) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const int64_t h = pp.hk * c.group + g;
    const int64_t i0 = qt * kBlockM;
    const int nr = static_cast<int>(std::min<int64_t>(kBlockM, e.len_q - i0));
    if (nr <= 0) return;
    const int64_t row0 = g * pp.nq + i0;
    A* lse = pp.lse + row0;
    A m[kBlockM], l[kBlockM];
    for (int r = 0; r < nr; ++r) {
      m[r] = neg_inf<A>();
      l[r] = 0;
    }
    int64_t klo, khi;
    keys_for_rows(c.win[pp.b], i0, i0 + nr, &klo, &khi);
    for (int64_t kt = klo / kBlockN; klo < khi && kt * kBlockN < khi; ++kt) {
      const int64_t j0 = kt * kBlockN;
      const int nj = static_cast<int>(std::min<int64_t>(kBlockN, e.len_kv - j0));
      const int ncols = static_cast<int>(round_up(nj, kPadElems));
      gemm<A, false>(nr, ncols, static_cast<int>(c.dqk), pp.q + row0 * c.dqk_p, c.dqk_p, 1,
                     pp.kt + kt * c.dqk * kBlockN, kBlockN, S, kBlockN);
      const A f = c.finish_logits(pp.b, h, i0, nr, j0, nj, ncols, S);
      for (int r = 0; r < nr; ++r) {
        A* s = S + r * kBlockN;
        const A mnew = std::max(m[r], row_max(s, ncols) * f);
        if (lse[r] == neg_inf<A>() || lse[r] != lse[r] || mnew == neg_inf<A>()) continue;
        A fs = f;
        if (std::fabs(mnew) > huge_logit<A>()) {
          row_scale(s, ncols, f);
          fs = 1;
        }
        l[r] = l[r] * std::exp(m[r] - mnew) + row_exp_sum(s, ncols, fs, mnew);
        m[r] = mnew;
      }
    }
    const A sink = c.sink(h);
    for (int r = 0; r < nr; ++r) {
      if (lse[r] == neg_inf<A>() || lse[r] != lse[r]) continue;
      const A top = c.has_sink ? std::max(m[r], sink) : m[r];
      lse[r] = top + std::log(l[r] * std::exp(m[r] - top) + (c.has_sink ? std::exp(sink - top) : 0));
    }
  }

  // NaN (docs/robustness.md), as in torch's math backward: a row whose lse or D
  // is NaN has NaN dq and dbias rows and NaN dk for every key of its (batch, kv
  // head); dv is NaN for every key when its lse is NaN, and at the features where
  // its dO is NaN. The tiles reach only the keys the row sees, so this final pass
  // writes the rest, for the pair's rows after their gradients are written.
  void write_nan_rows(const PairPanels& pp) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const int64_t bq = c.lay.q_thd ? 0 : pp.b, bk = c.lay.kv_thd ? 0 : pp.b;
    const PairTensor& db = bp.dbias;
    bool any = false, dv_nan = false;
    std::vector<uint8_t> dv_cols;  // rare: the features of dO rows that hold a NaN
    for (int64_t g = 0; g < c.group; ++g) {
      const int64_t h = pp.hk * c.group + g;
      for (int64_t i = 0; i < e.len_q; ++i) {
        const int64_t row = g * pp.nq + i;
        const bool p_nan = pp.lse[row] != pp.lse[row];
        dv_nan |= p_nan;
        const A* drow = pp.dout + row * c.dv_p;
        if (any_nan(drow, c.dv)) {
          dv_cols.resize(static_cast<size_t>(c.dv));
          for (int64_t d = 0; d < c.dv; ++d) dv_cols[d] |= drow[d] != drow[d];
        }
        if (!p_nan && pp.dd[row] == pp.dd[row]) continue;
        any = true;
        fill_row(row_ptr<T>(bp.dq, bq, e.tok_q + i, h), bp.dq.stride_d, c.dqk, quiet_nan<A>());
        if (dbias_on) {
          T* drow = static_cast<T*>(db.data) + (db.sizes[0] == 1 ? 0 : pp.b) * db.stride_b +
                    (db.sizes[1] == 1 ? 0 : h) * db.stride_h + (db.sizes[2] == 1 ? 0 : i) * db.stride_i;
          fill_row(drow, db.stride_j, db.sizes[3], quiet_nan<A>());
        }
      }
    }
    for (int64_t j = 0; j < e.len_kv; ++j) {
      if (any) fill_row(row_ptr<T>(bp.dk, bk, e.tok_kv + j, pp.hk), bp.dk.stride_d, c.dqk, quiet_nan<A>());
      T* dvrow = row_ptr<T>(bp.dv, bk, e.tok_kv + j, pp.hk);
      if (dv_nan) {
        fill_row(dvrow, bp.dv.stride_d, c.dv, quiet_nan<A>());
      } else if (!dv_cols.empty()) {
        for (int64_t d = 0; d < c.dv; ++d)
          if (dv_cols[d]) Elem<T>::store(dvrow + d * bp.dv.stride_d, quiet_nan<A>());
      }
    }
  }

  void stage_k_tile(const PairPanels& pp, int64_t kt) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const int64_t j0 = kt * kBlockN;
    const int nj = static_cast<int>(std::min<int64_t>(kBlockN, e.len_kv - j0));
    A* ktile = pp.kt + kt * c.dqk * kBlockN;
    A* vtile = pp.vt + kt * c.dv * kBlockN;
    A vrow[1024];
    for (int jj = 0; jj < kBlockN; ++jj) {
      A* krow = pp.k + (j0 + jj) * c.dqk_p;
      if (jj < nj) {
        load_row<T, A>(kv_row<T>(c, p.k, pp.b, j0 + jj, pp.hk), p.k.stride_d, c.dqk, c.dqk_p, krow);
        for (int64_t d = 0; d < c.dqk; ++d) ktile[d * kBlockN + jj] = krow[d];
        const T* vs = kv_row<T>(c, p.v, pp.b, j0 + jj, pp.hk);
        for (int64_t d0 = 0; d0 < c.dv; d0 += 1024) {
          const int64_t dn = std::min<int64_t>(1024, c.dv - d0);
          load_row<T, A>(vs + d0 * p.v.stride_d, p.v.stride_d, dn, dn, vrow);
          for (int64_t d = 0; d < dn; ++d) vtile[(d0 + d) * kBlockN + jj] = vrow[d];
        }
      } else {
        std::memset(krow, 0, sizeof(A) * c.dqk_p);
        for (int64_t d = 0; d < c.dqk; ++d) ktile[d * kBlockN + jj] = 0;
        for (int64_t d = 0; d < c.dv; ++d) vtile[d * kBlockN + jj] = 0;
      }
    }
  }

  // ---- the shared tile step ----------------------------------------------------------------
  // For rows i0.. (nr) of head h (group index g) and key tile kt of the pair:
  // S <- P (0 where invisible), dP <- dS = P * (dP_dropped - D); with dropout
  // and want_pd, PD <- P * keep / (1 - p) (else PD is not written).
  void tile_grads(Scratch& w, const PairPanels& pp, int64_t h, int64_t g, int64_t i0, int nr, int64_t kt,
                  bool want_pd) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const int64_t j0 = kt * kBlockN;
    const int nj = static_cast<int>(std::min<int64_t>(kBlockN, e.len_kv - j0));
    const int ncols = static_cast<int>(round_up(nj, kPadElems));
    const int64_t row0 = g * pp.nq + i0;
    const A* qs = pp.q + row0 * c.dqk_p;
    const A* dos = pp.dout + row0 * c.dv_p;
    const A* lse = pp.lse + row0;
    const A* dd = pp.dd + row0;
    A* __restrict S = w.s.get();
    A* __restrict dP = w.dp.get();
    A* __restrict PD = w.pd.get();
    gemm<A, false>(nr, ncols, static_cast<int>(c.dqk), qs, c.dqk_p, 1, pp.kt + kt * c.dqk * kBlockN, kBlockN, S,
                   kBlockN);
    const A f = c.finish_logits(pp.b, h, i0, nr, j0, nj, ncols, S, w.dcap.get());
    gemm<A, false>(nr, ncols, static_cast<int>(c.dv), dos, c.dv_p, 1, pp.vt + kt * c.dv * kBlockN, kBlockN, dP,
                   kBlockN);
    const int64_t bh = pp.b * c.hq + h;
    using S_ = Simd<A>;
    for (int r = 0; r < nr; ++r) {
      A* s = S + r * kBlockN;
      A* dp = dP + r * kBlockN;
      if (lse[r] == neg_inf<A>()) {  // no visible key in this row (a NaN lse goes on: NaN gradients)
        row_fill<A>(s, ncols, 0);
        row_fill<A>(dp, ncols, 0);
        if (want_pd) row_fill<A>(PD + r * kBlockN, ncols, 0);
        continue;
      }
      if (std::fabs(lse[r]) > huge_logit<A>()) {  // see huge_logit
        row_scale(s, ncols, f);
        row_exp(s, ncols, static_cast<A>(1), lse[r]);
      } else {
        row_exp(s, ncols, f, lse[r]);
      }
      if (c.drop.on) {
        A* f = PD + r * kBlockN;
        c.drop.row_factors(bh, i0 + r, j0, ncols, f);
        for (int j = 0; j < ncols; j += S_::N) {
          const typename S_::V fv = vload(f + j);
          vstore(dp + j, vload(dp + j) * fv);
          if (want_pd) vstore(f + j, vload(s + j) * fv);
        }
      }
      const typename S_::V dv = vsplat(dd[r]);
      for (int j = 0; j < ncols; j += S_::N) vstore(dp + j, vload(s + j) * (vload(dp + j) - dv));
    }
  }

  // ---- one key tile: dK, dV summed over the query tiles that see it ---------------------------------
  // Pass 1 calls it with dq == nullptr; the fused schedule passes its dQ
  // accumulator of the pair ([group][nq][dqk_p]), which then also takes
  // dQ += dS K from the same dS.
  void run_kv_item(Scratch& w, const PairPanels& pp, int64_t kt, A* __restrict dq) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const Window& win = c.win[pp.b];
    const int64_t bk = c.lay.kv_thd ? 0 : pp.b;
    const int64_t j0 = kt * kBlockN;
    const int nj = static_cast<int>(std::min<int64_t>(kBlockN, e.len_kv - j0));
    A* __restrict dk = w.acc_a.get();  // [nj][dqk_p]
    A* __restrict dv = w.acc_b.get();  // [nj][dv_p]
    std::memset(dk, 0, sizeof(A) * kBlockN * c.dqk_p);
    std::memset(dv, 0, sizeof(A) * kBlockN * c.dv_p);
    int64_t ilo, ihi;
    rows_for_keys(win, j0, j0 + nj, &ilo, &ihi);
    for (int64_t g = 0; g < c.group; ++g) {
      const int64_t h = pp.hk * c.group + g;
      for (int64_t qt = ilo / kBlockM; ilo < ihi && qt * kBlockM < ihi; ++qt) {
        const int64_t i0 = qt * kBlockM;
        const int nr = static_cast<int>(std::min<int64_t>(kBlockM, e.len_q - i0));
        tile_grads(w, pp, h, g, i0, nr, kt, true);
        c.cap_grad(w.dp.get(), w.dcap.get(), nr, nj);
        const int64_t row0 = g * pp.nq + i0;
        const A* pd = c.drop.on ? w.pd.get() : w.s.get();
        const A* ds = w.dp.get();
        // dV += (P dropped)^T dO ; dK += dS^T Q  (A operands read transposed)
        gemm<A, true>(nj, static_cast<int>(c.dv_p), nr, pd, 1, kBlockN, pp.dout + row0 * c.dv_p, c.dv_p, dv, c.dv_p);
        gemm<A, true>(nj, static_cast<int>(c.dqk_p), nr, ds, 1, kBlockN, pp.q + row0 * c.dqk_p, c.dqk_p, dk, c.dqk_p);
        if (dq != nullptr) {
          gemm<A, true>(nr, static_cast<int>(c.dqk_p), nj, ds, kBlockN, 1, pp.k + j0 * c.dqk_p, c.dqk_p,
                        dq + row0 * c.dqk_p, c.dqk_p);
        }
      }
    }
    for (int jj = 0; jj < nj; ++jj) {
      const int64_t tok = e.tok_kv + j0 + jj;
      store_row<T, A>(row_ptr<T>(bp.dk, bk, tok, pp.hk), bp.dk.stride_d, c.dqk, dk + jj * c.dqk_p, c.scale);
      store_row<T, A>(row_ptr<T>(bp.dv, bk, tok, pp.hk), bp.dv.stride_d, c.dv, dv + jj * c.dv_p, static_cast<A>(1));
    }
  }

  // ---- pass 2: dQ of one query tile of (pair, g), dbias rows into `dbias_acc` ----------------------
  void run_q_tile(Scratch& w, const PairPanels& pp, int64_t g, int64_t qt, A* dbias_acc, bool dbias_row_sum) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const Window& win = c.win[pp.b];
    const int64_t bq = c.lay.q_thd ? 0 : pp.b;
    const int64_t h = pp.hk * c.group + g;
    const int64_t i0 = qt * kBlockM;
    const int nr = static_cast<int>(std::min<int64_t>(kBlockM, e.len_q - i0));
    if (nr <= 0) return;
    A* __restrict dq = w.acc_a.get();  // [nr][dqk_p]
    std::memset(dq, 0, sizeof(A) * nr * c.dqk_p);
    int64_t klo, khi;
    keys_for_rows(win, i0, i0 + nr, &klo, &khi);
    for (int64_t kt = klo / kBlockN; klo < khi && kt * kBlockN < khi; ++kt) {
      const int64_t j0 = kt * kBlockN;
      const int nj = static_cast<int>(std::min<int64_t>(kBlockN, e.len_kv - j0));
      tile_grads(w, pp, h, g, i0, nr, kt, false);
      A* ds = w.dp.get();
      if (dbias_acc != nullptr) {
        for (int r = 0; r < nr; ++r) {
          A* acc = dbias_acc + (dbias_row_sum ? 0 : r * dbias_w) + j0;
          const A* src = ds + r * kBlockN;
          for (int jj = 0; jj < nj; ++jj) acc[jj] += src[jj];
        }
      }
      c.cap_grad(ds, w.dcap.get(), nr, nj);  // after dbias: the bias is added after the cap
      gemm<A, true>(nr, static_cast<int>(c.dqk_p), nj, ds, kBlockN, 1, pp.k + j0 * c.dqk_p, c.dqk_p, dq, c.dqk_p);
    }
    for (int r = 0; r < nr; ++r) {
      const int64_t tok = e.tok_q + i0 + r;
      store_row<T, A>(row_ptr<T>(bp.dq, bq, tok, h), bp.dq.stride_d, c.dqk, dq + r * c.dqk_p, c.scale);
    }
  }

  // ---- fused: one (batch, kv head) pair, all of its tiles ------------------------------------------------
  void run_pair_item(Scratch& w, const PairPanels& pp) const {
    const SeqExtent& e = c.lay.seq[pp.b];
    const int64_t bq = c.lay.q_thd ? 0 : pp.b;
    A* __restrict dq = w.dq.get();  // [group][nq][dqk_p]
    std::memset(dq, 0, sizeof(A) * c.group * pp.nq * c.dqk_p);
    for (int64_t kt = 0; kt < pp.nk / kBlockN; ++kt) run_kv_item(w, pp, kt, dq);
    for (int64_t g = 0; g < c.group; ++g) {
      const int64_t h = pp.hk * c.group + g;
      for (int64_t i = 0; i < e.len_q; ++i) {
        store_row<T, A>(row_ptr<T>(bp.dq, bq, e.tok_q + i, h), bp.dq.stride_d, c.dqk, dq + (g * pp.nq + i) * c.dqk_p,
                        c.scale);
      }
    }
  }

  // ---- driver ---------------------------------------------------------------------------------------
  Status run(const Executor& exec) {
    const PairTensor& db = bp.dbias;
    const int64_t pairs = c.B * c.hkv;
    const bool db_b1 = dbias_on && db.sizes[0] == 1, db_h1 = dbias_on && db.sizes[1] == 1;
    const bool db_i1 = dbias_on && db.sizes[2] == 1;
    // Pairs that share a dbias slot must be in one chunk: order pairs by slot
    // key, and cut chunks only between different keys.
    auto pair_key = [&](int64_t pi) {
      const int64_t b = pi / c.hkv, hk = pi % c.hkv;
      return (db_b1 ? 0 : b) * c.hkv + (db_h1 ? 0 : hk);
    };
    std::vector<int64_t> porder(static_cast<size_t>(pairs));
    for (int64_t k = 0; k < pairs; ++k) porder[k] = k;
    std::stable_sort(porder.begin(), porder.end(), [&](int64_t x, int64_t y) { return pair_key(x) < pair_key(y); });

    // Fused schedule: no dbias (whose broadcast slots cross pairs), at least two
    // pairs per thread, and a dQ accumulator per thread of moderate size.
    int64_t max_nq = 0;
    for (const SeqExtent& e : c.lay.seq) max_nq = std::max(max_nq, ntiles(e.len_q, kBlockM) * kBlockM);
    const int64_t threads = std::max(1, exec.num_threads());
    fused_dq_elems = c.group * max_nq * c.dqk_p;
    fused = !dbias_on && pairs >= 2 * threads &&
            fused_dq_elems * static_cast<int64_t>(sizeof(A)) <= kStageBudgetBytes;
    const int64_t min_chunk = fused ? 2 * threads : 1;

    std::vector<double> dsink(static_cast<size_t>(c.B * c.hq), 0.0);  // per (b, h)
    int64_t first = 0;
    while (first < pairs) {
      std::vector<PairPanels> pan;
      int64_t elems = 0, last = first;
      while (last < pairs) {
        const int64_t pi = porder[last];
        PairPanels pp;
        pp.b = pi / c.hkv;
        pp.hk = pi % c.hkv;
        pp.nq = ntiles(c.lay.seq[pp.b].len_q, kBlockM) * kBlockM;
        pp.nk = ntiles(c.lay.seq[pp.b].len_kv, kBlockN) * kBlockN;
        const int64_t add = PairPanels::elems(c, pp.nq, pp.nk);
        const bool same_slot = last > first && pair_key(pi) == pair_key(porder[last - 1]);
        if (last - first >= min_chunk && !same_slot &&
            (elems + add) * static_cast<int64_t>(sizeof(A)) > kStageBudgetBytes) {
          break;
        }
        pan.push_back(pp);
        elems += add;
        ++last;
      }
      Buf<A> panel;
      if (!panel.alloc(static_cast<size_t>(elems))) return out_of_memory("backward panels");
      int64_t off = 0;
      for (PairPanels& pp : pan) {
        pp.place(c, panel.get() + off);
        off += PairPanels::elems(c, pp.nq, pp.nk);
      }
      const int64_t np = static_cast<int64_t>(pan.size());

      // Stage: items (entry, kind 0: key tile kt | kind 1: query tile (g, qt)).
      struct StageItem {
        int64_t entry, g, t;  // g < 0: key tile t
      };
      std::vector<StageItem> st;
      for (int64_t en = 0; en < np; ++en) {
        for (int64_t kt = 0; kt < pan[en].nk / kBlockN; ++kt) st.push_back({en, -1, kt});
        for (int64_t g = 0; g < c.group; ++g)
          for (int64_t qt = 0; qt < pan[en].nq / kBlockM; ++qt) st.push_back({en, g, qt});
      }
      struct NoScratch {};
      FUSEDATTN_RETURN_IF_ERROR(parallel_items<NoScratch>(
          exec, static_cast<int64_t>(st.size()), [](NoScratch&) { return true; },
          [&](NoScratch&, int64_t k) {
            const StageItem& it = st[k];
            if (it.g < 0) {
              stage_k_tile(pan[it.entry], it.t);
            } else {
              stage_q_tile(pan[it.entry], it.g, it.t);
            }
          }));
      if constexpr (std::is_same_v<A, double>) {
        std::vector<StageItem> q_tiles;
        for (const StageItem& it : st)
          if (it.g >= 0) q_tiles.push_back(it);
        struct LseScratch {
          Buf<A> s;
        };
        FUSEDATTN_RETURN_IF_ERROR(parallel_items<LseScratch>(
            exec, static_cast<int64_t>(q_tiles.size()), [](LseScratch& w) { return w.s.alloc(kBlockM * kBlockN); },
            [&](LseScratch& w, int64_t k) {
              refine_lse(w.s.get(), pan[q_tiles[k].entry], q_tiles[k].g, q_tiles[k].t);
            }));
      }
      if (c.has_sink) {  // d_softmax_offset[h] = -sum_rows exp(sink - lse) * D, in a fixed order
        for (const PairPanels& pp : pan)
          for (int64_t g = 0; g < c.group; ++g) {
            const int64_t h = pp.hk * c.group + g;
            const double sink = c.sink(h);
            for (int64_t i = 0; i < c.lay.seq[pp.b].len_q; ++i) {
              const A lse = pp.lse[g * pp.nq + i];
              if (lse != neg_inf<A>()) dsink[pp.b * c.hq + h] += std::exp(sink - lse) * pp.dd[g * pp.nq + i];
            }
          }
      }

      std::vector<int64_t> order;
      if (fused) {
        order_by_cost(
            np,
            [&](int64_t en) {
              int64_t cost = 0;
              const int64_t len = c.lay.seq[pan[en].b].len_q;
              for (int64_t i0 = 0; i0 < len; i0 += kBlockM)
                cost += c.key_tiles(pan[en].b, i0, static_cast<int>(std::min<int64_t>(kBlockM, len - i0)));
              return cost;
            },
            &order);
        FUSEDATTN_RETURN_IF_ERROR(parallel_items<Scratch>(
            exec, np, [&](Scratch& w) { return init_scratch(w); },
            [&](Scratch& w, int64_t k) { run_pair_item(w, pan[order[k]]); }));
        for (const PairPanels& pp : pan) write_nan_rows(pp);
        first = last;
        continue;
      }

      // Pass 1: dK, dV per key tile.
      std::vector<std::pair<int64_t, int64_t>> kv_items;  // (entry, kt)
      for (int64_t en = 0; en < np; ++en)
        for (int64_t kt = 0; kt < pan[en].nk / kBlockN; ++kt) kv_items.push_back({en, kt});
      order_by_cost(
          static_cast<int64_t>(kv_items.size()),
          [&](int64_t k) {
            const PairPanels& pp = pan[kv_items[k].first];
            const int64_t j0 = kv_items[k].second * kBlockN;
            int64_t lo, hi;
            rows_for_keys(c.win[pp.b], j0, std::min(j0 + kBlockN, c.lay.seq[pp.b].len_kv), &lo, &hi);
            return hi > lo ? (hi - 1) / kBlockM - lo / kBlockM + 1 : 0;
          },
          &order);
      FUSEDATTN_RETURN_IF_ERROR(parallel_items<Scratch>(
          exec, static_cast<int64_t>(kv_items.size()), [&](Scratch& w) { return init_scratch(w); },
          [&](Scratch& w, int64_t k) {
            const auto& it = kv_items[order[k]];
            run_kv_item(w, pan[it.first], it.second, nullptr);
          }));

      // Pass 2: dQ (and dbias) per (slot, query tile). A slot is one (b, h) without
      // a broadcast dbias, else the (b, h) that share one dbias (b', h').
      struct Member {
        int64_t entry, g;
      };
      std::vector<std::vector<Member>> slots;
      std::vector<int64_t> slot_of_key;  // dbias slot id -> index in slots
      std::vector<std::pair<int64_t, int64_t>> slot_id;  // (b', h') per slot
      for (int64_t en = 0; en < np; ++en)
        for (int64_t g = 0; g < c.group; ++g) {
          const int64_t h = pan[en].hk * c.group + g;
          const int64_t sb = db_b1 ? 0 : pan[en].b, sh = db_h1 ? 0 : h;
          int64_t idx = -1;
          if (dbias_on) {
            for (size_t s = 0; s < slot_id.size(); ++s)
              if (slot_id[s].first == sb && slot_id[s].second == sh) idx = static_cast<int64_t>(s);
          }
          if (idx < 0) {
            idx = static_cast<int64_t>(slots.size());
            slots.emplace_back();
            slot_id.push_back({sb, sh});
          }
          slots[idx].push_back({en, g});
        }
      struct QItem {
        int64_t slot, qt;  // qt < 0: every query tile (dbias without a query dim)
      };
      std::vector<QItem> q_items;
      for (int64_t s = 0; s < static_cast<int64_t>(slots.size()); ++s) {
        if (db_i1) {
          q_items.push_back({s, -1});
          continue;
        }
        int64_t n = 0;
        for (const Member& m : slots[s]) n = std::max(n, pan[m.entry].nq / kBlockM);
        for (int64_t qt = 0; qt < n; ++qt) q_items.push_back({s, qt});
      }
      auto q_cost = [&](int64_t k) {
        int64_t cost = 0;
        for (const Member& m : slots[q_items[k].slot]) {
          const PairPanels& pp = pan[m.entry];
          const int64_t len = c.lay.seq[pp.b].len_q;
          const int64_t t0 = q_items[k].qt < 0 ? 0 : q_items[k].qt;
          const int64_t t1 = q_items[k].qt < 0 ? pp.nq / kBlockM : q_items[k].qt + 1;
          for (int64_t qt = t0; qt < t1; ++qt) {
            const int64_t i0 = qt * kBlockM;
            if (i0 < len) cost += c.key_tiles(pp.b, i0, static_cast<int>(std::min<int64_t>(kBlockM, len - i0)));
          }
        }
        return cost;
      };
      order_by_cost(static_cast<int64_t>(q_items.size()), q_cost, &order);
      FUSEDATTN_RETURN_IF_ERROR(parallel_items<Scratch>(
          exec, static_cast<int64_t>(q_items.size()), [&](Scratch& w) { return init_scratch(w); },
          [&](Scratch& w, int64_t k) {
            const QItem& it = q_items[order[k]];
            A* acc = dbias_on ? w.dbias.get() : nullptr;
            const int64_t acc_rows = db_i1 ? 1 : kBlockM;
            if (acc) std::memset(acc, 0, sizeof(A) * acc_rows * dbias_w);
            for (const Member& m : slots[it.slot]) {
              const PairPanels& pp = pan[m.entry];
              const int64_t t0 = it.qt < 0 ? 0 : it.qt;
              const int64_t t1 = it.qt < 0 ? pp.nq / kBlockM : std::min(it.qt + 1, pp.nq / kBlockM);
              for (int64_t qt = t0; qt < t1; ++qt) run_q_tile(w, pp, m.g, qt, acc, db_i1);
            }
            if (acc) write_dbias(slot_id[it.slot].first, slot_id[it.slot].second, it.qt, acc, acc_rows);
          }));
      for (const PairPanels& pp : pan) write_nan_rows(pp);
      first = last;
    }

    if (bp.d_softmax_offset != nullptr) {
      for (int64_t h = 0; h < c.hq; ++h) {
        double s = 0;
        for (int64_t b = 0; b < c.B; ++b) s += dsink[b * c.hq + h];
        bp.d_softmax_offset[h] = static_cast<float>(0.0 - s);  // +0 when nothing contributes
      }
    }
    return Status::Ok();
  }

  // Rows of slot (b', h') covered by query tile qt (qt < 0: the single row of a [.., 1, s_kv] dbias).
  void write_dbias(int64_t sb, int64_t sh, int64_t qt, const A* acc, int64_t acc_rows) const {
    const PairTensor& db = bp.dbias;
    T* base = static_cast<T*>(db.data) + sb * db.stride_b + sh * db.stride_h;
    const int64_t i0 = qt < 0 ? 0 : qt * kBlockM;
    const int64_t rows = std::min<int64_t>(acc_rows, db.sizes[2] - i0);
    for (int64_t r = 0; r < rows; ++r) {
      T* dst = base + (i0 + r) * db.stride_i;
      for (int64_t j = 0; j < dbias_w; ++j) Elem<T>::store(dst + j * db.stride_j, acc[r * dbias_w + j]);
    }
  }
};

template <class T>
Status bwd_typed(const BwdParams& bp, const Executor& exec) {
  const FwdParams& p = bp.fwd;
  AttnCtx<T> c;
  FUSEDATTN_RETURN_IF_ERROR(c.init(p));
  BwdRun<T> run{c, bp, p};
  if (bp.dbias.data != nullptr) {
    const PairTensor& db = bp.dbias;  // the bias's shape (bwd_output_shapes)
    run.dbias_on = true;
    run.dbias_w = db.sizes[3];
    // Elements that no visible (b, h, i, j) reaches stay zero.
    for (int64_t b = 0; b < db.sizes[0]; ++b)
      for (int64_t h = 0; h < db.sizes[1]; ++h)
        for (int64_t i = 0; i < db.sizes[2]; ++i) {
          T* row = static_cast<T*>(db.data) + b * db.stride_b + h * db.stride_h + i * db.stride_i;
          for (int64_t j = 0; j < db.sizes[3]; ++j) Elem<T>::store(row + j * db.stride_j, 0);
        }
  }
  zero_uncovered<T>(bp.dq, uncovered_tokens(c.lay, true), c.hq, c.dqk);
  const std::vector<TokenRange> kv_gaps = uncovered_tokens(c.lay, false);
  zero_uncovered<T>(bp.dk, kv_gaps, c.hkv, c.dqk);
  zero_uncovered<T>(bp.dv, kv_gaps, c.hkv, c.dv);
  return run.run(exec);
}

}  // namespace

// This copy's entry point (cpu_isa.h); run_bwd_cpu (src/cpu_dispatch.cc) picks the copy.
Status run_bwd(const BwdParams& params, const Executor& exec) {
  Status st = Status::Unsupported(std::string("CPU backward: unsupported dtype ") + dtype_name(params.fwd.prob.dtype));
  dispatch_float_dtype(params.fwd.prob.dtype, [&](auto tag) { st = bwd_typed<decltype(tag)>(params, exec); });
  return st;
}

}  // namespace FUSEDATTN_CPU_ISA
}  // namespace cpu
}  // namespace fusedattn
