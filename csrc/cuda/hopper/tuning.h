// The Hopper kernels' tuning: tile sizes, ring depths and per-warpgroup options per head dim, which
// forward variant takes a call, the persistent kernels' causal tile order and the one-tile causal
// chunk. Every variant is correct for every shape the Hopper path admits; this header only picks
// the fastest, with the reason for each choice here and the measurements in docs/perf-notes.md.
// Host and device code include it (the constants are compile-time).
#pragma once

#include <cstdint>

namespace fusedattn {
namespace hopper {

// ---------------------------------------------------------------- forward tiles
// BN keys per tile, STAGES K / V ring slots, PP: the consumer warpgroups take turns issuing their
// GEMMs (one's softmax under the others' GEMMs), SKIP: a warpgroup skips the key tiles its rows
// never see. A CTA's query tile is 64 rows per consumer warpgroup. NCONS = 2 is the general layout
// (240 registers per consumer thread: O, S, P of a 64-row slice); NCONS = 3 serves d = 64 only.
template <int D, int NCONS, bool CAUSAL>
struct FwdTileConfig;
// d = 64: 128-key tiles (a 64 x 128 S tile is only 4 k-steps, so wider tiles amortise each tile's
// barriers); 4 stages fit easily (16 KB per K or V slot).
template <bool CAUSAL>
struct FwdTileConfig<64, 2, CAUSAL> {
  static constexpr int BN = 128, STAGES = 4;
  static constexpr bool PP = true, SKIP = false;
};
// d = 128: 128-key tiles, 3 stages (32 KB per slot: a fourth does not fit beside Q).
template <bool CAUSAL>
struct FwdTileConfig<128, 2, CAUSAL> {
  static constexpr int BN = 128, STAGES = 3;
  static constexpr bool PP = true, SKIP = false;
};
// d = 256: O alone takes 128 registers per thread, so 80-key tiles (S 40 + P 20 registers) and 2
// stages (64 KB Q + 4 x 40 KB). The turns pay off only for causal calls, whose masked diagonal
// tiles lengthen the softmax that the other warpgroup's GEMMs then hide; without masking the
// softmax is short beside two 256-wide GEMMs and the turns only add waits.
template <bool CAUSAL>
struct FwdTileConfig<256, 2, CAUSAL> {
  static constexpr int BN = 80, STAGES = 2;
  static constexpr bool PP = CAUSAL, SKIP = false;
};
// d = 64 with three consumers (192-row query tiles): each K / V tile serves 1.5x the rows per load,
// producer iteration and barrier round trip, which is what bounds d = 64, and two warpgroups' GEMMs
// cover one's softmax. 160 registers per consumer thread hold O 32 + S 64 + P 32. SKIP: causally,
// and in a grid's last query tile, some warpgroups' key tiles would be all P = 0.
template <bool CAUSAL>
struct FwdTileConfig<64, 3, CAUSAL> {
  static constexpr int BN = 128, STAGES = 4;
  static constexpr bool PP = true, SKIP = true;
};

// Q in registers for the S GEMM (an RS wgmma): the S wgmmas then read only K from shared memory,
// and the Q slot frees as soon as the fragments are loaded, so a persistent CTA's next Q lands a
// whole tile earlier; it costs D / 4 registers per thread. Taken where that pays: the persistent
// two-consumer kernel at d = 128 with 128-key tiles (a one-tile CTA has no next Q to hurry; d = 256
// has no room beside O; gen_wgmma.py's RSK_N has N = 128).
constexpr bool fwd_q_in_registers(int d, int bn, int ncons, bool persistent) {
  return persistent && ncons == 2 && d == 128 && bn == 128;
}

// ---------------------------------------------------------------- backward tiles
// BM query rows per iteration, BN keys per CTA (two consumers of 64 keys each; d = 256 splits the
// head dim instead, see bwd_kernel_d256.cuh), STAGES Q / dO ring slots. d = 64 / 128: the fp32 dK
// and dV accumulators of 64 keys take D registers per thread, so d = 128 streams 64-row query tiles
// and d = 64 128-row ones (S^T and dP^T accumulators of BM / 2 registers each).
template <int D>
struct BwdTile;
template <>
struct BwdTile<64> {
  static constexpr int BM = 128, BN = 128, STAGES = 2;
};
template <>
struct BwdTile<128> {
  static constexpr int BM = 64, BN = 128, STAGES = 2;
};
template <>
struct BwdTile<256> {
  static constexpr int BM = 64, BN = 64, STAGES = 2;
};

// ---------------------------------------------------------------- forward variant
enum class FwdVariant {
  kOneTile,        // one CTA per 128-row query tile, two consumer warpgroups
  kPersistent,     // the same tiles on min(#tiles, #SMs) CTAs that loop over them
  kThreeConsumer,  // d = 64 only: one CTA per 192-row query tile, three consumer warpgroups
  kThreeConsumerPersistent,  // the three-consumer tiles on min(#tiles, #SMs) looping CTAs
};

// The deciding quantity is s_kv, the work of one query tile. A one-tile CTA pays a prologue
// (barrier init, tensor-map prefetch, the first Q and K loads) and an epilogue (O normalisation,
// stores) that overlap nothing; a persistent CTA overlaps them with its next tile, which matters
// where tiles are short. Causal tiles of one grid have many lengths, which the persistent static
// schedule balances less well than the hardware's dispatch of one-tile CTAs at long s.
inline FwdVariant choose_fwd_variant(int d, bool causal, int64_t s_kv) {
  if (d == 64) {
    // Three consumers win from s = 2k on; on the persistent schedule they also win below it, except
    // causally at s <= 1k, where the two-consumer persistent kernel's shorter (128-row) tiles
    // balance better; from 4k on the one-tile-per-CTA three-consumer kernel is ahead.
    if (s_kv <= 1024) return causal ? FwdVariant::kPersistent : FwdVariant::kThreeConsumerPersistent;
    return s_kv <= 2048 ? FwdVariant::kThreeConsumerPersistent : FwdVariant::kThreeConsumer;
  }
  // d = 128 / 256: persistent everywhere, except causal calls past 8k, where the one-tile kernel's
  // hardware-dispatched order balances the unequal tiles better.
  if (causal) return s_kv <= 8192 ? FwdVariant::kPersistent : FwdVariant::kOneTile;
  return FwdVariant::kPersistent;
}

// The general forward's consumer warpgroups: two, or three at d = 64, where the plain kernels'
// three-consumer tiles run about 10% more score pairs per second (a K / V tile serves 1.5x the rows;
// +7 to +13% at s >= 4k). Not with softcap: its tanh keeps more live registers than three consumers'
// 160 each (ptxas spills).
constexpr bool general_fwd_may_take_three(int d, bool softcap) { return d == 64 && !softcap; }

// A general call's band of keys around the diagonal: row i sees keys [i + diag - wl, i + diag + wr]
// (fusedattn/visibility.h; -1 unbounded).
struct GeneralBand {
  int64_t wl = -1, wr = -1, diag = 0;
};

// Keys per query row that BM-row tiles of BN-key tiles compute under a band bounded on both sides,
// averaged over the tiles' alignments to the key tiles (lcm(BM, BN) rows), sequence ends ignored:
// every row of a tile computes all keys of every key tile the tile's band touches.
inline double band_keys_per_row(const GeneralBand& band, int bm, int bn) {
  int64_t period = bm;
  while (period % bn != 0) period += bm;
  const int64_t diag = ((band.diag % bn) + bn) % bn;
  const int64_t r_first = period * ((band.wl + period - 1) / period + 1);  // rows whose keys start past 0
  int64_t tiles = 0;
  for (int64_t r0 = r_first; r0 < r_first + period; r0 += bm) {
    tiles += (r0 + bm - 1 + diag + band.wr) / bn - (r0 + diag - band.wl) / bn + 1;
  }
  return static_cast<double>(tiles) * bn * bm / static_cast<double>(period);
}

// Three consumers unless the band is narrow: a 192-row tile's band spans 64 more keys than a 128-row
// one's, which on a window of 128 (gpt-oss) means three key tiles per row instead of two; three win
// once their rate covers the extra keys.
inline int general_fwd_consumers(int d, bool softcap, const GeneralBand& band, int bn) {
  if (!general_fwd_may_take_three(d, softcap)) return 2;
  if (band.wl < 0 || band.wr < 0) return 3;  // unbounded on a side: long rows
  return band_keys_per_row(band, 192, bn) < 1.10 * band_keys_per_row(band, 128, bn) ? 3 : 2;
}
// The general forward's key tile: the tile's, except d_v <= 128 on the 256 tile (192 / 128, MLA),
// whose O takes 64 registers instead of 128, so 128-key tiles fit beside it as at d = 128 (S 64 + P 32).
constexpr int general_fwd_bn(int d, int dv, int bn) { return d == 256 && dv <= 128 ? 128 : bn; }

// ---------------------------------------------------------------- persistent causal order
// Which causal tile order the persistent kernels take (tile_scheduler.cuh's kTilesSnake and
// kTilesSnakeHeadMajor; non-causal calls have one tile length and one order).
enum class V3Schedule { kSnake, kSnakeHeadMajor };

// The work-tile grid of a persistent causal call: n_m query tiles of bm rows per (batch, head),
// n_hb (batch, head) pairs, g CTAs; a query tile m sees min(ceil(s_kv / bn), ceil((m + 1) bm / bn))
// key tiles.
struct V3Grid {
  int64_t n_m = 0, n_hb = 0, s_kv = 0;
  int g = 0, bm = 128, bn = 128;
};

// The busiest CTA's key tiles over the mean under the snake schedule (round j covers tiles
// [j g, (j + 1) g), odd rounds in reverse CTA order), with the tiles in the head-major causal order
// (a head's query tiles adjacent, longest first) or the m-major one (longest first over all heads).
// tools/hopper's v3_protocol_model.py has the same model (balance()).
inline double v3_snake_imbalance(const V3Grid& gr, bool head_major) {
  const int64_t n_tiles = gr.n_m * gr.n_hb;
  const int64_t full = (gr.s_kv + gr.bn - 1) / gr.bn;
  const auto work = [&](int64_t t) {
    const int64_t m = head_major ? gr.n_m - 1 - t % gr.n_m : gr.n_m - 1 - t / gr.n_hb;
    const int64_t nb = ((m + 1) * gr.bm + gr.bn - 1) / gr.bn;
    return nb < full ? nb : full;
  };
  const int64_t g = gr.g < n_tiles ? gr.g : n_tiles;
  int64_t busiest = 0, total = 0;
  for (int64_t cta = 0; cta < g; ++cta) {
    int64_t sum = 0;
    for (int64_t r = 0;; ++r) {
      const int64_t t = r * g + ((r & 1) ? g - 1 - cta : cta);
      if (t >= n_tiles) break;
      sum += work(t);
    }
    busiest = sum > busiest ? sum : busiest;
    total += sum;
  }
  return total > 0 ? static_cast<double>(busiest) * g / static_cast<double>(total) : 1.0;
}

// Head-major keeps a round's CTAs on few heads, so they share K / V in L2, which wins even against
// a little more modelled imbalance; where its rounds drift against the head boundaries the
// imbalance grows large and the m-major snake wins. Hence head-major unless its modelled imbalance
// exceeds snake's by more than 10%. The model costs one pass over the tiles, so it runs for grids
// of up to 2^17 tiles and the last shapes' answers are kept per thread; larger grids take snake,
// whose modelled imbalance stays near even on long grids.
inline V3Schedule choose_v3_schedule(const V3Grid& gr) {
  struct Entry {
    V3Grid key;
    V3Schedule value = V3Schedule::kSnake;
    bool used = false;
  };
  constexpr int kCache = 8;
  thread_local Entry cache[kCache];
  thread_local int next = 0;
  const auto same = [&](const V3Grid& k) {
    return k.n_m == gr.n_m && k.n_hb == gr.n_hb && k.s_kv == gr.s_kv && k.g == gr.g && k.bm == gr.bm &&
           k.bn == gr.bn;
  };
  for (const Entry& e : cache)
    if (e.used && same(e.key)) return e.value;
  V3Schedule choice = V3Schedule::kSnake;
  if (gr.n_m * gr.n_hb <= (int64_t{1} << 17) &&
      v3_snake_imbalance(gr, true) <= 1.10 * v3_snake_imbalance(gr, false)) {
    choice = V3Schedule::kSnakeHeadMajor;
  }
  cache[next] = Entry{gr, choice, true};
  next = (next + 1) % kCache;
  return choice;
}

// ---------------------------------------------------------------- one-tile causal chunk
// The causal tile order of the one-tile kernels (tile_scheduler.cuh's chunked_tile: the one-tile
// forwards, the backward): how many groups ((batch, head) forward, (batch, kv head) backward) share
// a chunk, inside which the blocks go tile-major so that every group's longest tile starts early.
// With `tiles` tiles per group, a chunk holds about C tiles / 2 times the longest tile's work, and
// its longest tiles end no later than the rest when that covers every SM once: C >= 2 sms / tiles.
// The largest power of two at or below that keeps C, hence the rows that concurrent CTAs touch,
// small (tools/hopper's bwd_order_model.py models the idle tail it removes).
inline int choose_causal_chunk(int64_t tiles, int64_t groups, int sms) {
  if (sms <= 0 || tiles <= 0 || groups <= 1) return 1;
  const int64_t want = 2 * int64_t{sms} / tiles;
  int64_t c = 1;
  while (c * 2 <= want) c *= 2;
  return static_cast<int>(c < groups ? c : groups);
}

// The chunk a causal launch uses: `requested` (> 0, e.g. FUSEDATTN_HOPPER_CAUSAL_CHUNK) or
// choose_causal_chunk's; 1 for non-causal calls and for grids whose linear block index would not
// fit in int (chunked_tile computes it in int).
inline int causal_chunk_for(bool causal, int requested, int64_t tiles, int64_t groups, int sms) {
  if (!causal || tiles * groups > 0x7fffffff) return 1;
  if (requested > 0) return static_cast<int>(requested < groups ? requested : groups);
  return choose_causal_chunk(tiles, groups, sms);
}

}  // namespace hopper
}  // namespace fusedattn
