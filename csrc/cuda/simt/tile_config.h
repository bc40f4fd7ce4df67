// Tile shapes of the SIMT kernels, one row per (accumulator type, head-dim
// bucket). Head dims are bucketed to 64 / 128 / 256 (the bucket of
// max(d_qk, d_v)); register arrays are sized by the bucket, loops run to the
// real head dims.
#pragma once

namespace fusedattn {
namespace simt {

// Thread layout (see fwd_kernel.cuh / bwd_kernel.cuh): a score tile [BQ x BK]
// is spread over NT threads as TX = BK / VS threads along keys (VS consecutive
// keys each, so one Philox call serves a thread's keys) and TY = NT / TX along
// queries (RQ = BQ / TY rows each, strided by TY). TX divides 32, so a row's
// threads sit in one warp and reduce with shuffles.
//
// Why these numbers:
// - Every configuration fits in 99 KB of shared memory, the opt-in limit of
//   sm_86/sm_89, except the fp64 d=256 backward (141 KB: sm_80/sm_90 only;
//   elsewhere the launcher reports it unsupported).
// - fp32 accumulators: 16-byte vectors (VS = 4) on both smem operands of the
//   inner products; 256 threads. Register tiles stay <= 64 accumulators per
//   thread (forward O: RQ * CV * VS; backward dK + dV: 2 * RK * CV2 * 4).
// - fp64 accumulators: 16-byte vectors are 2 doubles (VS = 2); tiles halve so
//   that register and smem footprints match the fp32 ones.
// - Forward d<=128: BQ = BK = 64 reuses each K/V element over 64 query rows;
//   d=256 drops to 32 x 32 to fit smem with 2 blocks/SM on H100/H200.
// - Backward holds K^T and V^T of its key tile for the whole block plus a Q /
//   dO tile, so its tiles are smaller than the forward's.
template <int NT_, int BQ_, int BK_, int VS_>
struct TileShape {
  static constexpr int NT = NT_, BQ = BQ_, BK = BK_, VS = VS_;
  static constexpr int TX = BK / VS, TY = NT / TX, RQ = BQ / TY;
  static_assert(BK % VS == 0 && NT % TX == 0 && BQ % TY == 0 && RQ >= 1, "inconsistent score tile");
  static_assert(32 % TX == 0, "a row's threads must share a warp");
};

template <class Acc, int DPAD>
struct FwdTile;
template <class Acc, int DPAD>
struct BwdTile;

// clang-format off
template <> struct FwdTile<float, 64>   : TileShape<256, 64, 64, 4> {};
template <> struct FwdTile<float, 128>  : TileShape<256, 64, 64, 4> {};
template <> struct FwdTile<float, 256>  : TileShape<256, 32, 32, 4> {};
template <> struct FwdTile<double, 64>  : TileShape<128, 32, 32, 2> {};
template <> struct FwdTile<double, 128> : TileShape<128, 32, 32, 2> {};
template <> struct FwdTile<double, 256> : TileShape<128, 16, 16, 2> {};

template <> struct BwdTile<float, 64>   : TileShape<256, 32, 64, 4> {};
template <> struct BwdTile<float, 128>  : TileShape<256, 32, 32, 4> {};
template <> struct BwdTile<float, 256>  : TileShape<256, 16, 16, 1> {};
template <> struct BwdTile<double, 64>  : TileShape<128, 32, 32, 2> {};
template <> struct BwdTile<double, 128> : TileShape<128, 16, 16, 2> {};
template <> struct BwdTile<double, 256> : TileShape<256, 16, 16, 1> {};
// clang-format on

inline int head_dim_bucket(long long d) { return d <= 64 ? 64 : (d <= 128 ? 128 : 256); }

}  // namespace simt
}  // namespace fusedattn
