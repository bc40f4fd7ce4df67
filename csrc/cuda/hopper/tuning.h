// Which Hopper forward kernel takes a call. Every variant is correct for every shape the Hopper
// path admits (the harness compares them bit for bit, tests/gpu runs each one forced); this file
// only picks the fastest, so it lives apart from the kernels. The thresholds come from the forward
// harness on the H200 (bench3 / benchw3, bf16, b*s = 16k tokens, h*d = 2048, 2026-11-30; table and
// ratios in docs/perf-notes.md). The deciding quantity is s_kv, the work of one query tile.
#pragma once

#include <cstdint>

namespace fusedattn {
namespace hopper {

enum class FwdVariant {
  kV2,             // fwd_sm90_v2.cuh: one CTA per 128-row query tile, two consumer warpgroups
  kPersistent,     // fwd_sm90_v3.cuh: v2's tiles on min(#tiles, #SMs) CTAs that loop over them
  kThreeConsumer,  // fwd_sm90_v2w3.cuh: d = 64 only, 192-row tiles, three consumer warpgroups
  // fwd_sm90_w3p.cuh: the three-consumer tiles on min(#tiles, #SMs) CTAs that loop over them.
  kThreeConsumerPersistent,
};

inline FwdVariant choose_fwd_variant(int d, bool causal, int64_t s_kv) {
  if (d == 64) {
    // Persistent vs v2: +25 / +15 / +10% non-causal and +29 / +17 / +10% causal at s = 512 / 1k / 2k
    // (short tiles: the per-CTA prologue and epilogue are a large share). Three consumers vs v2:
    // +7 to +13% at s >= 4k, causal or not (each K/V tile serves 192 rows). The three consumers on
    // the persistent schedule (2026-12-02, harness benchw3p and an operator grid of
    // FUSEDATTN_HOPPER_FWD=three_consumer_persistent against this rule's predecessor, 3 rounds
    // each): non-causal 370 / 437 / 519 TFLOP/s at s = 512 / 1k / 2k against the persistent
    // kernel's 339 / 401 and the three-consumer kernel's 516 (operator +9 / +6.5 / +2.3%); causal
    // at 2k +3% (harness) / +2.3% (operator) over the three-consumer kernel. Causal at s <= 1k the
    // persistent kernel stays ahead (harness 307 vs 285 TFLOP/s at 1k, 222 vs 219 at 512), and from
    // 4k the one-tile-per-CTA three-consumer kernel does (non-causal -2% at 4k, -3 to -7% at
    // 8k / 16k for the persistent one).
    if (s_kv <= 1024) return causal ? FwdVariant::kPersistent : FwdVariant::kThreeConsumerPersistent;
    return s_kv <= 2048 ? FwdVariant::kThreeConsumerPersistent : FwdVariant::kThreeConsumer;
  }
  // Causal at d = 128 / 256 with the schedule choose_v3_schedule picks, against v2: d = 128 +24 /
  // +19 / +12 / +6 / +3% at s = 512 / 1k / 2k / 4k / 8k, d = 256 +19 / +10 / +13 / +12 / +9%; at 16k
  // both 1-2% slower (2026-11-30 run 1 of the fifth session). With round-robin tiles it was 2-20%
  // slower: unequal tile lengths and, at short s, one query tile of every head in a round.
  if (causal) return s_kv <= 8192 ? FwdVariant::kPersistent : FwdVariant::kV2;
  // Non-causal d = 128 / 256: the persistent kernel at every length. Against v2, d = 128: +14 / +8 /
  // +4% at s = 512 / 1k / 2k; with the lazy row max (twelfth session) and Q in registers the harness
  // has it ahead at every length (+3% at 2k, +2% at 4k, +2 / +3.5% at 8k / 16k). d = 256: +7 / +1.5%
  // at 512 / 1k, +4.6% at 2k and +4% at 8k with the lazy row max. The operator grid (thirteenth
  // session, three alternated rounds of FUSEDATTN_HOPPER_FWD=persistent against the old thresholds)
  // confirmed the rest: d = 128 +1.6 / +4.7% at 8k / 16k, d = 256 +5.8% at 16k (-0.8% at 8k, where
  // both runs already took it).
  return FwdVariant::kPersistent;
}

// The persistent kernel's work-tile schedule for a causal call (fwd_sm90_v3.cuh, kV3Snake and
// kV3SnakeHeadMajor; non-causal calls have one tile length and one schedule).
enum class V3Schedule { kSnake, kSnakeHeadMajor };

// The work-tile grid of a persistent causal call: n_m query tiles of bm rows per (batch, head),
// n_hb (batch, head) pairs, g CTAs; a query tile m sees min(ceil(s_kv / bn), ceil((m + 1) bm / bn))
// key tiles (the kernel's v3_decode).
struct V3Grid {
  int64_t n_m = 0, n_hb = 0, s_kv = 0;
  int g = 0, bm = 128, bn = 128;
};

// The busiest CTA's key tiles over the mean under the snake schedule (round j covers tiles
// [j g, (j + 1) g), odd rounds in reverse CTA order), with the tiles in the head-major causal order
// (a head's query tiles adjacent, longest first) or the m-major one (longest first over all heads).
// The same model as tests/gpu/hopper/v3_protocol_model.py's balance(), which matched the measured
// losses: at d = 128, s = 16k (16 heads, 128 query tiles each, 132 CTAs) head-major gives 1.54,
// where the rounds drift against the head boundaries, and the kernel ran at 0.68x v2.
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

// Head-major keeps a round's CTAs on few heads, so they share K/V in L2: at s <= 2k it beat the
// m-major snake by 10-30% (d = 128 causal: 1.24 / 1.19 / 1.12x v2 against 1.01 / 0.93 / 0.91x at
// s = 512 / 1k / 2k), and it won even where the model gave it 8% more imbalance (d = 256, s = 1k:
// 1.10x against 0.83x). Where the model gives it much more (the rounds drifting against the head
// boundaries: 1.5-1.8 at d = 128 s = 16k and d = 256 s >= 8k), it lost 23-40% and snake wins.
// Hence: head-major unless its modelled imbalance exceeds snake's by more than 10%. The model costs
// one pass over the tiles, so it runs for grids of up to 2^17 tiles (a microsecond per thousand
// tiles on the host) and the last shapes' answers are kept per thread; larger grids take snake,
// whose modelled imbalance stays within 1% of even on every measured shape.
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

// The causal tile order of the non-persistent kernels (fwd_sm90.cuh's chunked_tile: the v2 and
// three-consumer forwards, the backward): how many groups ((batch, head) forward, (batch, kv head)
// backward) share a chunk, inside which the blocks go tile-major so that every group's longest tile
// starts early. With `tiles` tiles per group, a chunk holds about C tiles / 2 times the longest
// tile's work, and its longest tiles end no later than the rest when that covers every SM once:
// C >= 2 sms / tiles. The largest power of two at or below that keeps C, hence the rows that
// concurrent CTAs touch, small; tests/gpu/hopper/bwd_order_model.py gives the backward's idle tail
// at the end as 0-2% with it against 3-7% group by group (C = 1) on the benchmark's causal shapes at
// s = 1k-8k, and the same model of the d = 64 three-consumer forward 0.8-1.8% against 3.5-4.9%.
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
