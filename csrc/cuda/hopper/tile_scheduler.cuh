// Which work tile a CTA runs, as a type the kernels take:
//   OneTileScheduler         one forward query tile per CTA (grid n_m x h x b); causally the longest
//                            tiles first, in chunks of groups (chunked_tile).
//   PersistentScheduler      min(#tiles, #SMs) CTAs, each looping over a static list of forward
//                            tiles; causal orders snake and snake head-major (below).
//   VarlenScheduler          the persistent tiles over the longest sequence's query tiles, each
//                            carrying its sequence's lengths; tiles past their sequence skipped.
//   bwd_work                 the backward's key tile per CTA (grid n_kt x h_kv x b), chunked like
//                            the one-tile forward, or in the deterministic mode's fixed order.
// tuning.h picks the order and the chunk; the rest of a kernel does not depend on them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mask.cuh"
#include "params.h"

namespace fusedattn {
namespace hopper {

// The causal tile order shared by the one-tile forwards and the backward: a grid of (tiles per
// group, groups...) is dispatched in increasing linear block index, x fastest. Group by group,
// each group's longest tile first, the longest tiles of the last groups would start last and leave
// SMs idle at the end. Dealt in chunks of `chunk` groups (the last chunk may hold fewer),
// tile-major inside a chunk, every chunk's long tiles start early while the CTAs that run together
// still cover only `chunk` groups' rows in L2. Returns the rank of the block's tile within its
// group (0: the one dispatched first) and its group. chunk > 1 only: callers keep the plain block
// indices for chunk <= 1, which is also what tuning.h's causal_chunk_for gives grids whose linear
// index would not fit in int.
struct ChunkedTile {
  int rank, group;
};
__device__ __forceinline__ ChunkedTile chunked_tile(int tiles, int groups, int chunk) {
  const int lin = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int g0 = lin / (chunk * tiles) * chunk;  // the chunk's first group
  const int cc = min(chunk, groups - g0);       // groups in this chunk
  const int within = lin - g0 * tiles;
  return {within / cc, g0 + within % cc};
}

// A forward work tile: query tile m_blk of (head, batch), its K / V head, and the key tiles it
// runs, [n_first, n_first + n_blocks) (the mask's key_tiles, n_blocks >= 1; n_first is 0 but for
// general masks). Every consumer warpgroup of a CTA runs all of them. The persistent schedulers'
// tiles also carry hb = batch * h + head, VarlenScheduler's their sequence's lengths.
struct FwdWork {
  int m_blk, head, batch, head_kv, n_blocks, n_first;
  int hb;
  int len_q, len_kv;
};
// Where the consumers store a tile: its batch and head, from each scheduler's out_coords.
struct OutCoords {
  int batch, head;
};
// The key tiles of query tile m_blk into w.
template <int BM, int BN, class Mask>
__device__ __forceinline__ void set_key_tiles(FwdWork& w, const Mask& mask) {
  const TileRange r = mask.template key_tiles<BM, BN>(w.m_blk);
  w.n_first = r.first;
  w.n_blocks = r.count;
}

// One query tile per CTA: blockIdx (x: query tile, y: head, z: batch), causally the heaviest query
// tiles first (rank 0 is the last tile), in chunks of p.causal_chunk (batch, head) groups. Ring
// positions count key tiles from 0 in int.
template <bool CAUSAL_>
struct OneTileScheduler {
  static constexpr bool CAUSAL = CAUSAL_, kPersistent = false;
  using Pos = int;
  FwdWork w;

  struct Coord {
    int m_blk, head, batch;
  };
  __device__ __forceinline__ static Coord coord(const KParams& p) {
    const int n_m = static_cast<int>(gridDim.x);
    if (!CAUSAL || p.causal_chunk <= 1) {
      const int m = static_cast<int>(blockIdx.x);
      return {CAUSAL ? n_m - 1 - m : m, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    }
    const ChunkedTile t = chunked_tile(n_m, static_cast<int>(gridDim.y * gridDim.z), p.causal_chunk);
    return {n_m - 1 - t.rank, t.group % static_cast<int>(gridDim.y), t.group / static_cast<int>(gridDim.y)};
  }
  template <int BM, int BN, class Mask>
  __device__ __forceinline__ static OneTileScheduler make(const KParams& p, const Mask& mask) {
    const Coord c = coord(p);
    OneTileScheduler s;
    s.w.m_blk = c.m_blk;
    s.w.head = c.head;
    s.w.batch = c.batch;
    s.w.head_kv = c.head / (p.h / p.h_kv);
    set_key_tiles<BM, BN>(s.w, mask);
    return s;
  }
  // The first query row of the CTA's tiles when it is the same for all of them (0 otherwise).
  template <int BM>
  __device__ __forceinline__ int fixed_row0() const {
    return w.m_blk * BM;
  }
  __device__ __forceinline__ static OutCoords out_coords(const FwdWork& w, const KParams&) { return {w.batch, w.head}; }
  // f(work, j, last): j the CTA's local tile index (the Q slot ring), last whether it is its last.
  template <int BM, int BN, class Mask, class F>
  __device__ __forceinline__ void for_each(const KParams&, const Mask&, F&& f) const {
    f(w, 0u, true);
  }
  static dim3 grid(const KParams& p, int bm, int) { return dim3((p.s_q + bm - 1) / bm, p.h, p.b); }
};

// Causal tile orders of the persistent scheduler. Non-causal tiles all have one length and take
// kTilesPlain: hb-major (a head's query tiles adjacent, so K / V are shared in L2).
//   kTilesSnake           m-major (longest query tiles first over all heads, so a round of G
//                         tiles has nearly equal lengths), odd rounds handed out in reverse CTA
//                         order, which pairs each CTA's longer tiles of one round with shorter
//                         ones of the next.
//   kTilesSnakeHeadMajor  snake over the head-major order (a head's query tiles adjacent, longest
//                         first): a round's CTAs share few heads' K / V in L2, but its rounds can
//                         drift against the head boundaries (tuning.h's choose_v3_schedule).
constexpr int kTilesPlain = 0, kTilesSnake = 1, kTilesSnakeHeadMajor = 2;

// Work tile t in [0, n_m * h * b) on CTA blockIdx.x: t = i, then round by round (round j covers
// tiles [j G, (j + 1) G), G = gridDim.x), so every CTA has a tile in every round but the last and
// all consumers of a CTA see the same sequence. hb = batch * h + head. Ring positions count key
// tiles over the CTA's life in uint32_t.
template <bool CAUSAL_, int ORDER>
struct PersistentScheduler {
  static constexpr bool CAUSAL = CAUSAL_, kPersistent = true;
  static constexpr bool kSnake = CAUSAL && ORDER != kTilesPlain;
  static constexpr bool kHeadMajor = CAUSAL && ORDER == kTilesSnakeHeadMajor;
  using Pos = uint32_t;
  int n_m, n_hb, n_tiles;  // the host keeps n_tiles plus a round of indices within int
  int group;               // query heads per K / V head

  template <int BM, int BN, class Mask>
  __device__ __forceinline__ static PersistentScheduler make(const KParams& p, const Mask&) {
    PersistentScheduler s;
    s.n_m = (p.s_q + BM - 1) / BM;
    s.n_hb = p.h * p.b;
    s.n_tiles = s.n_m * s.n_hb;
    s.group = p.h / p.h_kv;
    return s;
  }
  // Tile t's query tile, head, batch and K / V head.
  __device__ __forceinline__ FwdWork coords(int t, const KParams& p) const {
    FwdWork r;
    int hb;
    if (CAUSAL && !kHeadMajor) {
      const int m_idx = t / n_hb;
      hb = t - m_idx * n_hb;
      r.m_blk = n_m - 1 - m_idx;
    } else {
      hb = t / n_m;
      r.m_blk = t - hb * n_m;
      if (CAUSAL) r.m_blk = n_m - 1 - r.m_blk;  // head-major causal: the head's longest tile first
    }
    r.hb = hb;
    const OutCoords c = split_hb(hb, p);
    r.batch = c.batch;
    r.head = c.head;
    r.head_kv = r.head / group;
    return r;
  }
  __device__ __forceinline__ static OutCoords split_hb(int hb, const KParams& p) {
    const int batch = hb / p.h;
    return {batch, hb - batch * p.h};
  }
  // The consumers divide hb where they store the tile (coords' batch and head are unused in them,
  // so its division is dropped): it then runs under the tile's last PV GEMM, not between two tiles.
  __device__ __forceinline__ static OutCoords out_coords(const FwdWork& w, const KParams& p) {
    return split_hb(w.hb, p);
  }
  template <int BM, int BN, class Mask>
  __device__ __forceinline__ FwdWork decode(int t, const KParams& p, const Mask& mask) const {
    FwdWork r = coords(t, p);
    set_key_tiles<BM, BN>(r, mask);
    return r;
  }
  template <int BM>
  __device__ __forceinline__ int fixed_row0() const {
    return 0;
  }
  // The index of this CTA's (j+1)-th tile, given its j-th, t. Indices grow with j, so the first
  // one >= n_tiles ends the CTA's loop.
  __device__ __forceinline__ static int next(int t, uint32_t j) {
    const int G = static_cast<int>(gridDim.x);
    if (!kSnake) return t + G;
    const int r = static_cast<int>(j) + 1, cta = static_cast<int>(blockIdx.x);
    return r * G + ((r & 1) ? G - 1 - cta : cta);
  }
  template <int BM, int BN, class Mask, class F>
  __device__ __forceinline__ void for_each(const KParams& p, const Mask& mask, F&& f) const {
    uint32_t j = 0;
    for (int t = blockIdx.x; t < n_tiles; t = next(t, j), ++j) f(decode<BM, BN>(t, p, mask), j, next(t, j) >= n_tiles);
  }
  static dim3 grid(const KParams& p, int bm, int num_sms) {
    const int64_t n_tiles = static_cast<int64_t>((p.s_q + bm - 1) / bm) * p.h * p.b;
    return dim3(static_cast<unsigned>(n_tiles < num_sms ? n_tiles : num_sms), 1, 1);
  }
};

// Varlen (features.h's VARLEN, the general kernels): PersistentScheduler's tiles and order over the
// query tiles of the longest sequence (s_q), each tile with its sequence's lengths and the key tiles
// its mask gives them. A tile whose rows lie past its sequence's queries is skipped (it costs the
// reads of its sequence's lengths, which L1 holds), and `last` flags the last tile a CTA runs. The
// snake's rounds count every tile, run or skipped, so all consumers and the producer of a CTA still
// see one sequence.
template <int ORDER>
struct VarlenScheduler : PersistentScheduler<true, ORDER> {
  using Base = PersistentScheduler<true, ORDER>;
  template <int BM, int BN, class Mask>
  __device__ __forceinline__ static VarlenScheduler make(const KParams& p, const Mask& mask) {
    VarlenScheduler s;
    static_cast<Base&>(s) = Base::template make<BM, BN>(p, mask);
    return s;
  }
  // The tile's sequence is read at its start (decode), so its batch is there already.
  __device__ __forceinline__ static OutCoords out_coords(const FwdWork& w, const KParams&) { return {w.batch, w.head}; }
  template <int BM>
  __device__ __forceinline__ bool runs(int t, const KParams& p) const {
    const FwdWork w = this->coords(t, p);
    return w.m_blk * BM < gpu::seq_span(p.seq, w.batch).len_q;
  }
  template <int BM, int BN, class Mask>
  __device__ __forceinline__ FwdWork decode(int t, const KParams& p, const Mask& mask) const {
    FwdWork r = this->coords(t, p);
    const gpu::SeqSpan sp = gpu::seq_span(p.seq, r.batch);
    r.len_q = sp.len_q;
    r.len_kv = sp.len_kv;
    set_key_tiles<BM, BN>(r, mask.seq(sp.len_q, sp.len_kv));
    return r;
  }
  template <int BM, int BN, class Mask, class F>
  __device__ __forceinline__ void for_each(const KParams& p, const Mask& mask, F&& f) const {
    // (t, round): a tile index and the CTA's round it falls in; the next one that runs.
    const auto skip = [&](int& t, uint32_t& round) {
      while (t < this->n_tiles && !runs<BM>(t, p)) t = Base::next(t, round++);
    };
    int t = blockIdx.x;
    uint32_t round = 0;
    skip(t, round);
    for (uint32_t j = 0; t < this->n_tiles; ++j) {
      int t2 = Base::next(t, round);
      uint32_t round2 = round + 1;
      skip(t2, round2);
      f(decode<BM, BN>(t, p, mask), j, t2 >= this->n_tiles);
      t = t2;
      round = round2;
    }
  }
};

// The backward's CTA: key tile n_blk of K / V head hk and batch. Non-causal key tiles all do the
// same work: group by group, so that a group's CTAs run side by side and share its Q, dO and dQ
// rows in L2. Causally key tile n sees the query tiles from n BN / BM on, so tile 0 does the most
// work and leads each group, the groups dealt in chunks of p.causal_chunk (chunked_tile). DET (the
// deterministic mode) takes the work from its ticket (drawn on arrival, in [0, #CTAs)) instead of
// blockIdx, the key tiles in decreasing order within a group, which its dQ turn-taking relies on,
// not chunked.
struct BwdWork {
  int n_blk, hk, batch;
};
template <bool CAUSAL, bool DET>
__device__ __forceinline__ BwdWork bwd_work(const BwdKParams& p, int ticket) {
  const int n_kt = static_cast<int>(gridDim.x);
  if constexpr (DET) {
    const int h_kv = static_cast<int>(gridDim.y);
    const int group = ticket / n_kt;
    return {n_kt - 1 - (ticket - group * n_kt), group % h_kv, group / h_kv};
  }
  if (!CAUSAL || p.causal_chunk <= 1) {
    return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
  }
  const ChunkedTile t = chunked_tile(n_kt, static_cast<int>(gridDim.y * gridDim.z), p.causal_chunk);
  return {t.rank, t.group % static_cast<int>(gridDim.y), t.group / static_cast<int>(gridDim.y)};
}

}  // namespace hopper
}  // namespace fusedattn
