// Which scores a query sees: the one place the Hopper kernels ask, for a whole tile (which key tiles
// a query tile runs, which query tiles a key tile meets) and for one score, by the library's one rule
// (fusedattn/visibility.h). Today: keys past s_kv never, and with CAUSAL the top-left diagonal (key j
// visible to query i iff j <= i). A sliding window, per-sequence bounds (varlen) and a softcap
// belong here too.
#pragma once

#include <cmath>

#include "fusedattn/visibility.h"

namespace fusedattn {
namespace hopper {

template <bool CAUSAL_>
struct TileMask {
  static constexpr bool CAUSAL = CAUSAL_;
  int s_q, s_kv;

  // ---- whole tiles
  // Forward: the key tiles [0, n) of BN keys that query tile m_blk (BM rows) sees; n >= 1.
  template <int BM, int BN>
  __device__ __forceinline__ int n_key_tiles(int m_blk) const {
    int nb = (s_kv + BN - 1) / BN;
    if (CAUSAL) nb = min(nb, ((m_blk + 1) * BM + BN - 1) / BN);
    return nb;
  }
  // Forward: of a query tile's n_blocks key tiles, how many a warpgroup's 64 rows from row0 see
  // (at least 1): causally up to the last of them below s_q; 1 for rows wholly past s_q. (row0 by
  // reference: the comparisons then compile as they did written inline at the call site.)
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
  // Backward: the last of the n_kt key tiles that query tile m meets.
  template <int BM, int BN>
  __device__ __forceinline__ int last_key_tile(int m, int n_kt) const {
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

  // The Hopper path's visibility (fusedattn/visibility.h): no window but causal's (top-left, or
  // bottom-right with s_q = s_kv, the same diagonal). Rows past s_q are not bounded here (they are not
  // stored).
  __device__ __forceinline__ Visibility<int> visibility() const {
    return Visibility<int>::make(-1, CAUSAL ? 0 : -1, false, s_q, s_kv);
  }
  // Forward: key tile n (BN keys) of S in a consumer thread's accumulator fragment (rows row_base
  // and row_base + 8 of a warpgroup whose 64 rows start at wg_row0; columns 8j + 2qd + e): scores the
  // query does not see become -inf. Tiles all of whose keys every row sees are left alone.
  template <int BN>
  __device__ __forceinline__ void apply(float (&sacc)[BN / 2], int n, int row_base, int wg_row0, int qd) const {
    const Visibility<int> vis = visibility();
    if (!vis.keys_all_visible(wg_row0, wg_row0 + 63, n * BN, BN)) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = n * BN + 8 * j + 2 * qd + e;
            const int row = row_base + 8 * hf;
            if (!vis.key_visible(row, col)) sacc[4 * j + 2 * hf + e] = -INFINITY;
          }
        }
      }
    }
  }
};

}  // namespace hopper
}  // namespace fusedattn
