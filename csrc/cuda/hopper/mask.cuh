// Which scores a query sees: the one place the Hopper kernels ask, for a whole tile (which key tiles
// a query tile runs, which query tiles a key tile meets) and for one score, by the library's one rule
// (fusedattn/visibility.h). The kind is a template argument of the kernels:
//   kMaskNone     keys past s_kv only;
//   kMaskCausal   the top-left diagonal (key j visible to query i iff j <= i; bottom-right too when
//                 s_q = s_kv);
//   kMaskGeneral  the call's window (left, right; -1 unbounded; causal is right = 0) on either
//                 diagonal, read at run time: tiles wholly outside it are skipped, and a query tile
//                 that sees no key runs one fully masked tile (zero output, lse -inf).
// VARLEN: s_q, s_kv are one sequence's lengths (seq()), and the backward also hides the rows past
// s_q (the tile's rows there belong to no row of this sequence: their lse2 and Dsum are another's).
#pragma once

#include <cmath>

#include "features.h"  // the mask kinds
#include "fusedattn/visibility.h"

namespace fusedattn {
namespace hopper {

// A range of key (forward) or query (backward) tiles.
struct TileRange {
  int first, count;
};

template <int MASK_, bool VARLEN_ = false>
struct TileMask {
  static constexpr int MASK = MASK_;
  static constexpr bool CAUSAL = MASK == kMaskCausal;
  static constexpr bool GENERAL = MASK == kMaskGeneral;
  static constexpr bool VARLEN = VARLEN_;
  static_assert(GENERAL || !VARLEN, "varlen: general masks");
  int s_q, s_kv;
  // kMaskGeneral: the window (clamped, fusedattn/visibility.h) and its diagonal.
  int wl = -1, wr = -1;
  bool bottom_right = false;

  // The mask of a call, from the kernel parameters (KParams, BwdKParams).
  template <class P>
  __device__ __forceinline__ static TileMask of(const P& p) {
    TileMask m{p.s_q, p.s_kv};
    if constexpr (GENERAL) {
      m.wl = p.window_left;
      m.wr = p.window_right;
      m.bottom_right = p.bottom_right != 0;
    }
    return m;
  }
  // The same rule on a sequence of lengths len_q, len_kv.
  __device__ __forceinline__ TileMask seq(int len_q, int len_kv) const {
    TileMask m = *this;
    m.s_q = len_q;
    m.s_kv = len_kv;
    return m;
  }

  // The visibility rule: no window but causal's for the fixed kinds (top-left, or bottom-right with
  // s_q = s_kv, the same diagonal). Rows past s_q are not bounded here: the forward does not store
  // them, the backward's lse2 padding gives them P = 0 (varlen: tile_partial and hidden bound them).
  __device__ __forceinline__ Visibility<int> visibility() const {
    if constexpr (GENERAL) return Visibility<int>::make(wl, wr, bottom_right, s_q, s_kv);
    return Visibility<int>::make(-1, CAUSAL ? 0 : -1, false, s_q, s_kv);
  }

  // ---- whole tiles
  // Forward: the key tiles [0, n) of BN keys that query tile m_blk (BM rows) sees; n >= 1.
  template <int BM, int BN>
  __device__ __forceinline__ int n_key_tiles(int m_blk) const {
    static_assert(!GENERAL, "key_tiles");
    int nb = (s_kv + BN - 1) / BN;
    if (CAUSAL) nb = min(nb, ((m_blk + 1) * BM + BN - 1) / BN);
    return nb;
  }
  // Forward: the key tiles query tile m_blk sees, at least one (a tile that sees no key runs one
  // fully masked key tile). The keys some row of [i0, i1] sees are [key_lo(i0), key_hi(i1)) exactly
  // (each row's keys are an interval moving right with the row), so this and the backward's
  // query_tiles describe the same tile pairs, which the deterministic dQ order relies on.
  template <int BM, int BN>
  __device__ __forceinline__ TileRange key_tiles(int m_blk) const {
    if constexpr (!GENERAL) {
      return TileRange{0, n_key_tiles<BM, BN>(m_blk)};
    } else {
      const Visibility<int> vis = visibility();
      const int n_total = (s_kv + BN - 1) / BN;
      const int i0 = m_blk * BM, i1 = min(i0 + BM, s_q) - 1;
      const int lo = vis.key_lo(i0), hi = vis.key_hi(i1);
      if (hi <= lo) return TileRange{max(0, min(lo / BN, n_total - 1)), 1};  // n_total 0: no key at all
      return TileRange{lo / BN, (hi - 1) / BN - lo / BN + 1};
    }
  }
  // Forward: of a query tile's n_blocks key tiles, how many a warpgroup's 64 rows from row0 see
  // (at least 1): causally up to the last of them below s_q; 1 for rows wholly past s_q. (row0 by
  // reference: the comparisons then compile as they did written inline at the call site.) The
  // three-consumer kernels' SKIP only, which take the fixed kinds (fwd_kernel.cuh).
  template <int BN>
  __device__ __forceinline__ int n_key_tiles_of_rows(const int& row0, int n_blocks) const {
    int n = n_blocks;
    if (row0 >= s_q) {
      n = 1;
    } else if (CAUSAL) {
      n = min(n_blocks, min(row0 + 63, s_q - 1) / BN + 1);
    }
    return n;
  }
  // Backward: the first query tile (BM rows) that key tile n_blk (BN keys) meets; n_m if none.
  template <int BM, int BN>
  __device__ __forceinline__ int first_query_tile(int n_blk, int n_m) const {
    return CAUSAL ? min((n_blk * BN) / BM, n_m) : 0;
  }
  // Backward: the query tiles [first, first + count) that key tile n_blk meets (count 0: none), of
  // n_m: the rows that see some key of [j0, j1] are [row_lo(j0), row_hi(j1)) exactly.
  template <int BM, int BN>
  __device__ __forceinline__ TileRange query_tiles(int n_blk, int n_m) const {
    if constexpr (!GENERAL) {
      const int m0 = first_query_tile<BM, BN>(n_blk, n_m);
      return TileRange{m0, n_m - m0};
    } else {
      const Visibility<int> vis = visibility();
      const int j0 = n_blk * BN, j1 = min(j0 + BN, s_kv) - 1;
      if (j1 < j0) return TileRange{0, 0};  // a key tile past the sequence's keys
      const int lo = vis.row_lo(j0), hi = vis.row_hi(j1);
      if (hi <= lo) return TileRange{0, 0};
      return TileRange{lo / BM, (hi - 1) / BM - lo / BM + 1};
    }
  }
  // Backward: the last of the n_kt key tiles that query tile m meets (it meets at least one).
  template <int BM, int BN>
  __device__ __forceinline__ int last_key_tile(int m, int n_kt) const {
    if constexpr (GENERAL) {
      const int i1 = min(m * BM + BM, s_q) - 1;
      return (visibility().key_hi(i1) - 1) / BN;
    }
    return CAUSAL ? min(n_kt - 1, m * BM / BN) : n_kt - 1;
  }

  // ---- inside a tile. Arguments compared against s_q / s_kv come by const reference: the
  // compiler canonicalises a comparison against a by-value parameter before inlining, and the
  // callers' code would then differ from the same test written out where it is used.
  // A tile whose keys end (exclusive) at key_end holds keys past s_kv.
  __device__ __forceinline__ bool has_key_tail(const int& key_end) const { return key_end > s_kv; }
  // The diagonal cuts a tile whose last key is key_last and whose first query is q_first.
  __device__ __forceinline__ bool crosses_diagonal(int key_last, int q_first) const {
    return CAUSAL && key_last > q_first;
  }
  __device__ __forceinline__ bool past_keys(const int& key) const { return key >= s_kv; }
  __device__ __forceinline__ bool above_diagonal(int q, int key) const { return CAUSAL && key > q; }
  // Backward, kMaskGeneral (the fixed kinds test the diagonal and the key tail apart, and get false
  // here): whether the tile of queries [q0, q0 + BM) and keys [k0, k0 + BN) needs its scores masked
  // one by one.
  template <int BM, int BN>
  __device__ __forceinline__ bool tile_partial(int q0, int k0) const {
    if constexpr (VARLEN) return !visibility().tile_all_visible(q0, BM, k0, BN);
    return GENERAL && !visibility().keys_all_visible(q0, q0 + BM - 1, k0, BN);
  }
  // Backward, kMaskGeneral, the same rule as one compare per score: query q sees key `key` iff
  // key_base(key) - q <= key_span() in uint32_t arithmetic (Visibility's offset bounds on key - q;
  // varlen: and q < s_q), a key past s_kv getting a base that no row meets; or, with the query
  // fixed instead (d = 256's S tiles), iff key - query_base(q) <= key_span() and key < s_kv.
  __device__ __forceinline__ uint32_t key_base(int key) const {
    if (key >= s_kv) return 0xC0000000u;
    return static_cast<uint32_t>(key) - static_cast<uint32_t>(visibility().offset_lo());
  }
  __device__ __forceinline__ uint32_t query_base(int q) const {
    return static_cast<uint32_t>(q) + static_cast<uint32_t>(visibility().offset_lo());
  }
  __device__ __forceinline__ uint32_t key_span() const {
    const Visibility<int> vis = visibility();
    return static_cast<uint32_t>(vis.offset_hi()) - static_cast<uint32_t>(vis.offset_lo());
  }
  // The test itself, key-fixed (kbase = key_base(key)) and query-fixed (qbase = query_base(q)).
  static __device__ __forceinline__ bool seen_from_key(uint32_t kbase, int q, uint32_t span) {
    return kbase - static_cast<uint32_t>(q) <= span;
  }
  __device__ __forceinline__ bool seen_from_query(uint32_t qbase, int key, uint32_t span) const {
    return key < s_kv && static_cast<uint32_t>(key) - qbase <= span;
  }

  // Forward: key tile n (BN keys) of S in a consumer thread's accumulator fragment (rows row_base
  // and row_base + 8 of a warpgroup whose 64 rows start at wg_row0; columns 8j + 2qd + e): scores the
  // query does not see become -inf. Tiles all of whose keys every row sees are left alone.
  template <int BN>
  __device__ __forceinline__ void apply(float (&sacc)[BN / 2], int n, int row_base, int wg_row0, int qd) const {
    const Visibility<int> vis = visibility();
    if (!vis.keys_all_visible(wg_row0, wg_row0 + 63, n * BN, BN)) {
      // General masks: the run-time window by the one-compare test.
      const uint32_t span = GENERAL ? key_span() : 0u;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = n * BN + 8 * j + 2 * qd + e;
            const int row = row_base + 8 * hf;
            const bool seen = GENERAL ? seen_from_query(query_base(row), col, span) : vis.key_visible(row, col);
            if (!seen) sacc[4 * j + 2 * hf + e] = -INFINITY;
          }
        }
      }
    }
  }
};

}  // namespace hopper
}  // namespace fusedattn
