// Tile sizes and warp layouts of the tensor-core kernels, one place for every
// tuning choice. Numbers follow FlashAttention-2's sm80/sm90 choices where our
// kernels have the same structure; each carries its reason. "fast" is the
// variant without per-element extras (bias, ALiBi, explicit mask, dropout;
// its softcap variant, kargs.h's Variant, only caps the logits); "general"
// takes all of them as runtime branches and trades tile width for the
// registers those branches need.
#pragma once

#include "kargs.h"

namespace fusedattn {
namespace tc {

// ---------------------------------------------------------------- forward
// kBlockM query rows x kBlockN keys per step, kNWarps warps; each warp owns
// kBlockM / kNWarps consecutive rows (16 or 32), so the O accumulator of a
// thread is (rows / 16) * kD / 2 floats and the S tile (rows / 16) * kBlockN / 2.
template <int kD, bool kGeneral>
struct FwdTile;

// d=64: 128x128 with 4 warps (32 rows each): O acc 64 regs + S 128 regs; wide
// kBlockN halves the per-row softmax bookkeeping, which is what limits d=64
// (docs/perf-notes.md has the timings of both tiles).
template <>
struct FwdTile<64, false> {
  static constexpr int kBlockM = 128, kBlockN = 128, kNWarps = 4, kMinBlocks = 2;
};
// General: the bias/dropout paths need ~40 more registers; halve S.
template <>
struct FwdTile<64, true> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4, kMinBlocks = 2;
};
// d=128: 128x64 with 4 warps (32 rows each): O acc 128 regs + S 64 regs; 32
// rows per warp give 32 FLOP per shared-memory byte read (16 rows give 16,
// which would cap mma.sync below the target). smem 64 KB -> 2-3 blocks/SM,
// registers allow 2 (8 warps).
template <>
struct FwdTile<128, false> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4, kMinBlocks = 2;
};
template <>
struct FwdTile<128, true> {
  static constexpr int kBlockM = 128, kBlockN = 32, kNWarps = 4, kMinBlocks = 2;
};
// d=256: 64x64 with 4 warps (16 rows each: a 32-row warp would need 256
// accumulator registers). smem 96 KB -> 2 blocks per SM, so one block's
// barrier waits overlap the other's matmuls; faster than 128x64 with 8 warps
// (one block per SM; docs/perf-notes.md).
template <>
struct FwdTile<256, false> {
  static constexpr int kBlockM = 64, kBlockN = 64, kNWarps = 4, kMinBlocks = 2;
};
template <>
struct FwdTile<256, true> {
  static constexpr int kBlockM = 64, kBlockN = 32, kNWarps = 4, kMinBlocks = 2;
};

// A variant's forward tile. softcap: the fast tiles, except at d=64, where the tanh of
// every score spills 136 bytes in 128x128 and none in the general variant's 128x64.
template <int kD, Variant kV>
using FwdTileOf = FwdTile<kD, kV == Variant::kGeneral || (kV == Variant::kSoftcap && kD == 64)>;

// ---------------------------------------------------------------- backward
// One block owns kBlockN keys of one kv head and walks the query tiles of
// every query head of its GQA group, keeping dK and dV in registers. Warp
// slices: kSdpWN warps along keys for S^T = K Q^T and dP^T = V dO^T (the rest
// along queries), kDkvWN along keys for dK/dV (the rest split the head dim),
// kDqWM along queries for dQ = dS K (the rest split the head dim).
// The backward is bound by shared-memory reads (ldmatrix), not by the tensor
// cores: a warp slice of R rows x C columns reads (R + C) x 16 x 2 bytes per
// k16 step for R x C x 32 FLOP, so slices are made as square as the registers
// allow (32 x 32 rather than 16 x 64 cuts the reads per FLOP by 20%).
// 8 warps everywhere: 256 threads x 255 registers is one block per SM, and
// the Q/dO double buffer plus K, V, P, dS tiles fill most of shared memory.
template <int kD, bool kGeneral>
struct BwdTile;

// d=64: 128 queries x 128 keys (FlashAttention-2's choice): twice the work per
// step of 64 x 128 for the same barriers, lse/D loads and prefetch. S^T/dP^T
// 4 x 2 warps of 32 keys x 64 queries (64 + 64 regs); dK/dV 4 x 2 warps of
// 32 keys x 32 dims; dQ 4 x 2 warps of 32 queries x 32 dims.
template <>
struct BwdTile<64, false> {
  static constexpr int kBlockM = 128, kBlockN = 128, kNWarps = 8;
  static constexpr int kSdpWN = 4, kDkvWN = 4, kDqWM = 4;
};
// General: 64 x 128 (S^T 32 x 32 per warp); 128 x 128 spills ~500 bytes there.
template <>
struct BwdTile<64, true> {
  static constexpr int kBlockM = 64, kBlockN = 128, kNWarps = 8;
  static constexpr int kSdpWN = 4, kDkvWN = 4, kDqWM = 4;
};
// d=128: 64 x 128 (FlashAttention-2's choice). S^T/dP^T 4 x 2 warps of 32 x 32
// (32 + 32 regs); dK/dV 4 x 2 warps of 32 keys x 64 dims (64 + 64 regs); dQ
// 2 x 4 warps of 32 queries x 32 dims.
template <>
struct BwdTile<128, false> {
  static constexpr int kBlockM = 64, kBlockN = 128, kNWarps = 8;
  static constexpr int kSdpWN = 4, kDkvWN = 4, kDqWM = 2;
};
// General: 64 x 64 keys (dK/dV 16 x 64 per warp): the bias/mask/dropout paths
// spill ~400 bytes with 128 keys.
template <>
struct BwdTile<128, true> {
  static constexpr int kBlockM = 64, kBlockN = 64, kNWarps = 8;
  static constexpr int kSdpWN = 4, kDkvWN = 4, kDqWM = 2;
};
// d=256: 64 x 64. S^T/dP^T 4 x 2 warps of 16 keys x 32 queries; dK/dV 2 x 4
// warps of 32 keys x 64 dims (64 + 64 regs); dQ 2 x 4 warps of 32 x 64. smem:
// K, V 32 KB each, Q and dO double-buffered 128 KB, P and dS 16 KB: 208 KB.
template <bool G>
struct BwdTile<256, G> {
  static constexpr int kBlockM = 64, kBlockN = 64, kNWarps = 8;
  static constexpr int kSdpWN = 4, kDkvWN = 2, kDqWM = 2;
};

// A variant's backward tile: softcap takes the fast tiles (its tanh's factor is folded into dP^T at
// once, so no extra array of registers stays live).
template <int kD, Variant kV>
using BwdTileOf = BwdTile<kD, kV == Variant::kGeneral>;

}  // namespace tc
}  // namespace fusedattn
