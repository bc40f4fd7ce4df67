// Tile shapes of the decode kernels (decode_kernel.cuh), one per (head-dim
// bucket D, row warps WM). Host and device code both read them.
//
// A block handles one (sequence, KV head, row chunk, split): its rows are the
// query rows of the KV head's group folded together, row r = i * group + g
// for query i and query head hk * group + g, so K and V are read once for all
// h_q / h_kv heads (GQA). Four warps: WM warps along rows (16 rows each, one
// m16n8k16 row tile) times WN = 4 / WM warps along keys. Each warp keeps its
// own online softmax over its KW keys of every tile; the warps' partial
// results meet in shared memory at the end (the split-KV combine inside the
// block), and the blocks' partials in decode_combine_kernel (split-KV across
// blocks).
#pragma once

#include <cstddef>

namespace fusedattn {
namespace decode {

// Why these numbers:
// - BN = 64 keys per tile: a tile of d=128 K + V is 32 KB, a few microseconds
//   of one SM's share of HBM bandwidth; that keeps the pipeline shallow and
//   the last partial tile of a split cheap.
// - 3 stages (2 tiles in flight while one is computed) for M <= 32 rows: with
//   2 blocks per SM at d <= 128 that is >= 128 KB in flight per SM, several
//   times what HBM latency x per-SM bandwidth asks for. M = 64 rows (prefill
//   chunks, or wide GQA groups) computes 4x more per tile, so 2 stages do and
//   keep 2 blocks per SM at d=128.
// - d=256 takes 1 block per SM (a 64 KB tile per stage); 3 stages keep two
//   tiles = 128 KB in flight, 2 for M=64 to fit 227 KB.
// - The epilogue's fp32 O of all warps (64 rows x (D + 8)) reuses the stage
//   buffers; the 8-float row padding keeps its float2 stores conflict-free.
constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr int kBlockN = 64;        // keys per tile
constexpr int kMaxSplits = 128;    // bound of the split-KV count (workspace and combine loop)

template <int D, int WM>
struct Tile {
  static_assert(D == 64 || D == 128 || D == 256, "head-dim buckets are 64, 128, 256");
  static_assert(WM == 1 || WM == 2 || WM == 4, "row warps");
  static constexpr int kD = D;
  static constexpr int kWM = WM;
  static constexpr int kWN = kWarps / WM;
  static constexpr int M = 16 * WM;               // rows per block
  static constexpr int BN = kBlockN;
  static constexpr int KW = BN / kWN;             // keys per warp per tile (16, 32, 64)
  // Keys per softmax step: a warp's KW keys at once, except at d=256 where
  // 128 fp32 accumulators of O leave room for 16 keys of S at a time.
  static constexpr int KS = D == 256 ? 16 : KW;
  static constexpr int STAGES = M == 64 ? 2 : 3;
  static constexpr int CH = D / 8;                // 16-byte chunks per row
  static constexpr int OS = D + 8;                // epilogue fp32 row stride
  static constexpr size_t kQBytes = size_t(M) * D * 2;
  static constexpr size_t kStageBytes = size_t(BN) * D * 2;  // one of K or V
  static constexpr size_t kKVBytes = 2 * STAGES * kStageBytes;
  static constexpr size_t kOffBytes = size_t(STAGES) * BN * 16;  // (k, v) element offsets per key
  static constexpr size_t kSmemBytes = kQBytes + kKVBytes + kOffBytes;
  static_assert(size_t(kWarps) * 16 * OS * 4 <= kKVBytes, "epilogue O must fit in the stage buffers");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
  static_assert(KW % 16 == 0 && KW % KS == 0 && KS % 16 == 0, "a warp's keys are whole k16 steps of P.V");
};

}  // namespace decode
}  // namespace fusedattn
