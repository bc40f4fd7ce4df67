// Tile sizes and warp layouts of the tensor-core kernels, one place for every
// tuning choice. Numbers follow FlashAttention-2's sm80/sm90 choices where our
// kernels have the same structure; each carries its reason. "fast" is the
// variant without per-element extras (bias, ALiBi, explicit mask, dropout);
// "general" takes all of them as runtime branches and trades tile width for
// the registers those branches need.
#pragma once

namespace fusedattn {
namespace tc {

// ---------------------------------------------------------------- forward
// kBlockM query rows x kBlockN keys per step, kNWarps warps; each warp owns
// kBlockM / kNWarps consecutive rows (16 or 32), so the O accumulator of a
// thread is (rows / 16) * kD / 2 floats and the S tile (rows / 16) * kBlockN / 2.
template <int kD, bool kGeneral>
struct FwdTile;

// d=64: 128x128 with 4 warps (32 rows each): O acc 64 regs + S 128 regs; wide
// kBlockN halves the per-row softmax bookkeeping, which is what limits d=64.
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
// d=256: 128x64 with 8 warps (16 rows each): a 32-row warp would need 256
// accumulator registers. smem 128 KB -> 1 block (8 warps) per SM.
template <>
struct FwdTile<256, false> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8, kMinBlocks = 1;
};
template <>
struct FwdTile<256, true> {
  static constexpr int kBlockM = 128, kBlockN = 32, kNWarps = 8, kMinBlocks = 1;
};

// ---------------------------------------------------------------- backward
// One block owns kBlockN keys of one kv head and walks the query tiles of
// every query head of its group, keeping dK and dV in registers. Every warp
// computes 16-row slices: kSdpWN warps along keys for S^T = K Q^T and
// dP^T = V dO^T (the rest along queries), kDkvWN along keys for dK/dV (the
// rest split the head dim), kDqWM along queries for dQ = dS K.
// 8 warps everywhere: 256 threads x 255 registers is one block per SM, and
// the Q/dO double buffer plus K, V, P, dS tiles fill most of shared memory.
template <int kD, bool kGeneral>
struct BwdTile;

// d=64 and d=128: 64 queries x 128 keys. S^T/dP^T: 8 warps x 16 keys, all 64
// queries (32 + 32 regs); dK/dV: 8 x 16 keys x full d (d/4 + d/4 regs at
// d=128: 64 + 64); dQ: 4 x 2 warps of 16 queries x d/2.
template <bool G>
struct BwdTile<64, G> {
  static constexpr int kBlockM = 64, kBlockN = 128, kNWarps = 8;
  static constexpr int kSdpWN = 8, kDkvWN = 8, kDqWM = 4;
};
template <bool G>
struct BwdTile<128, G> {
  static constexpr int kBlockM = 64, kBlockN = 128, kNWarps = 8;
  static constexpr int kSdpWN = 8, kDkvWN = 8, kDqWM = 4;
};
// d=256: 64 x 64. dK/dV split the head dim over 2 warps (16 keys x 128 dims:
// 64 + 64 regs); S^T/dP^T 4 x 2 warps of 16 keys x 32 queries. smem: K, V
// 32 KB each, Q and dO double-buffered 128 KB, P and dS 16 KB: 208 KB.
template <bool G>
struct BwdTile<256, G> {
  static constexpr int kBlockM = 64, kBlockN = 64, kNWarps = 8;
  static constexpr int kSdpWN = 4, kDkvWN = 4, kDqWM = 4;
};

}  // namespace tc
}  // namespace fusedattn
