// Tile sizes of the CPU engine, with the reason for each number.
#pragma once

#include <cstdint>

#include "cpu_isa.h"

namespace fusedattn {
namespace cpu {
inline namespace FUSEDATTN_CPU_ISA {

// Query rows per work item. The Q tile and the O accumulator (64 x d floats,
// 16-64 KiB at d = 64-256) stay in L2 while every key tile streams past, and
// 64 rows amortise the per-tile softmax bookkeeping. Smaller would multiply
// the passes over the K/V panels; larger would leave 2-core machines with
// too few items at s = 512.
constexpr int kBlockM = 64;

// Keys per tile: one S row is 64 floats (4 AVX-512 / 8 AVX2 vectors), the
// K^T tile (d x 64) fits L1/L2, and a multiple of 4 keeps the Philox groups
// of four dropout draws aligned to tiles.
constexpr int kBlockN = 64;

// Keys and values are converted once per (batch, kv head) into float panels
// (K^T tiles, V rows) shared by all query tiles and all query heads of the
// group. Panels are built for a chunk of heads at a time so the scratch stays
// under this budget (at least one head is always staged).
constexpr int64_t kStageBudgetBytes = int64_t{64} << 20;

static_assert(kBlockN % 4 == 0, "dropout draws come in groups of 4 keys");

}  // namespace FUSEDATTN_CPU_ISA
}  // namespace cpu
}  // namespace fusedattn
