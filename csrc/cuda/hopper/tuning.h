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
};

inline FwdVariant choose_fwd_variant(int d, bool causal, int64_t s_kv) {
  if (d == 64) {
    // Persistent vs v2: +25 / +15 / +10% non-causal and +15 / +10 / +7% causal at s = 512 / 1k / 2k
    // (short tiles: the per-CTA prologue and epilogue are a large share). Three consumers vs v2:
    // +7 to +13% at s >= 4k, causal or not (each K/V tile serves 192 rows), but -3 to -6% causal at
    // s <= 1k; at 2k the two tie (438 vs 428 TFLOP/s non-causal, 348 vs 348 causal).
    return s_kv <= 2048 ? FwdVariant::kPersistent : FwdVariant::kThreeConsumer;
  }
  // Causal at d = 128 / 256: the persistent kernel is 2-20% slower. Its static round-robin hands a
  // CTA tiles of unequal length, and a CTA's share can exceed the one-tile-per-CTA v2 tail.
  if (causal) return FwdVariant::kV2;
  // Non-causal d = 128: +14 / +8 / +4% at s = 512 / 1k / 2k, within 1% above; d = 256: +7 / +1.5% at
  // s = 512 / 1k, 1-4% slower from 2k (its 2-stage ring gains nothing from continuing across tiles).
  return s_kv <= (d == 128 ? 2048 : 1024) ? FwdVariant::kPersistent : FwdVariant::kV2;
}

}  // namespace hopper
}  // namespace fusedattn
