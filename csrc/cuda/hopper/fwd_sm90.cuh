// Hopper (sm_90a) FlashAttention forward, v1: TMA + mbarrier ring +
// warp-specialised producer / consumer warpgroups + wgmma. The library runs
// v2 (fwd_sm90_v2.cuh), which builds on this file's host plumbing; the v1
// kernel is the harness's baseline (tests/gpu/hopper/harness.cu).
//
//   q [b, s_q, h, d], k/v [b, s_kv, h_kv, d], o like q, lse fp32 [b, h, s_q]
//   (natural log), each addressed through its own (b, s, h) element strides
//   with a unit head-dim stride (bshd, sbhd and packed layouts alike). GQA:
//   h % h_kv == 0. Causal is the top-left diagonal (key j visible to query i
//   iff j <= i).
//
// CTA = 3 warpgroups (384 threads), one CTA per (128-row query tile, head, batch):
//   WG0  producer: setmaxnreg.dec 24; one thread issues TMA loads of Q (once)
//        and of K/V tiles into a STAGES-deep ring (full barriers with
//        complete_tx, empty barriers with 8 warp arrivals).
//   WG1,WG2 consumers: setmaxnreg.inc 240; each owns 64 query rows.
//        S = Q K^T (wgmma SS, K-major both), online softmax in registers
//        (exp2, scale*log2e folded), P -> 16-bit A fragments in registers,
//        O += P V (wgmma RS, V MN-major via trans-b). Stage released after the
//        PV wgmma has completed. Epilogue: O / rowsum, plain stores, lse.
// Shared-memory tiles are stored as 64-column (128-byte) chunks, each chunk a
// [rows][64] block with the TMA/wgmma 128B swizzle (see ptx_sm90.cuh).
#pragma once

#include <cuda.h>  // CUtensorMap & enums only (driver entry point fetched at run time; no -lcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fusedattn/visibility.h"
#include "ptx_sm90.cuh"
#include "tuning.h"  // causal_chunk_for
#include "wgmma.cuh"

namespace fusedattn {
namespace hopper {

// The Hopper path's visibility (fusedattn/visibility.h): no window but causal's (top-left, or
// bottom-right with s_q = s_kv, the same diagonal), so key j is visible to query i iff j < s_kv and,
// causal, j <= i. The kernels do not bound rows by s_q here (rows past it are not stored).
template <bool CAUSAL>
__device__ __forceinline__ Visibility<int> sm90_vis(int s_q, int s_kv) {
  return Visibility<int>::make(-1, CAUSAL ? 0 : -1, false, s_q, s_kv);
}

template <int D>
struct FwdTile;
// d = 64/128: 128 query rows x 128 keys, 2 stages (smem 80 KB / 160 KB).
template <>
struct FwdTile<64> {
  static constexpr int BM = 128, BN = 128, STAGES = 2;
};
template <>
struct FwdTile<128> {
  static constexpr int BM = 128, BN = 128, STAGES = 2;
};
// d = 256: 128 x 64 tiles, 2 stages (smem 64 KB Q + 4 x 32 KB = 192 KB);
// registers per consumer thread: O 128 + S 32 + P 16 floats/words.
template <>
struct FwdTile<256> {
  static constexpr int BM = 128, BN = 64, STAGES = 2;
};

struct KParams {
  void* o;  // [b, s_q, h, d] by o_s*, same dtype as q
  int64_t o_sb, o_ss, o_sh;
  float* lse;  // by lse_s*
  int64_t lse_sb, lse_sh, lse_ss;
  int b, s_q, s_kv, h, h_kv;
  float scale_log2;  // softmax scale * log2(e)
  int causal_chunk;  // causal v2 / three-consumer: (batch, head) groups per chunk of the tile order (<= 1: none)
};

// The causal tile order shared by the non-persistent kernels (v2 and three-consumer forwards, the
// backward): a grid of (tiles per group, groups...) is dispatched in increasing linear block index,
// x fastest. Group by group, each group's longest tile first, the longest tiles of the last groups
// would start last and leave SMs idle at the end (3-7% of the time on the benchmark's causal shapes
// in tests/gpu/hopper/bwd_order_model.py's list-scheduling model). Dealt in chunks of `chunk` groups
// (the last chunk may hold fewer), tile-major inside a chunk, every chunk's long tiles start early
// while the CTAs that run together still cover only `chunk` groups' rows in L2. Returns the rank of
// the block's tile within its group (0: the one dispatched first) and its group. chunk > 1 only:
// callers keep the plain block indices for chunk <= 1 (group by group), which is also what
// causal_chunk_for gives grids whose linear index would not fit in int. tuning.h's
// choose_causal_chunk picks the chunk.
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

// The query tile, head and batch of a v2 / three-consumer forward CTA: causally the heaviest query
// tiles first (rank 0 is the last tile), in chunks of p.causal_chunk (batch, head) groups.
struct FwdTileIdx {
  int m_blk, head, batch;
};
template <bool CAUSAL>
__device__ __forceinline__ FwdTileIdx fwd_tile_idx(const KParams& p) {
  const int n_m = static_cast<int>(gridDim.x);
  if (!CAUSAL || p.causal_chunk <= 1) {
    const int m = static_cast<int>(blockIdx.x);
    return {CAUSAL ? n_m - 1 - m : m, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
  }
  const ChunkedTile t = chunked_tile(n_m, static_cast<int>(gridDim.y * gridDim.z), p.causal_chunk);
  return {n_m - 1 - t.rank, t.group % static_cast<int>(gridDim.y), t.group / static_cast<int>(gridDim.y)};
}

template <int D>
struct FwdSmem {
  using Tile = FwdTile<D>;
  static constexpr int kQBytes = Tile::BM * D * 2;
  static constexpr int kKVBytes = Tile::BN * D * 2;
  static constexpr int kBarOffset = kQBytes + 2 * Tile::STAGES * kKVBytes;
  static constexpr int kBarBytes = 8 * (1 + 3 * Tile::STAGES);
  // + 1024 slack for aligning the dynamic smem base to the swizzle atom.
  static constexpr int kTotal = kBarOffset + ((kBarBytes + 127) / 128) * 128 + 1024;
};

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Whether 16-bit rows at base, addressed through the given element strides, start on 16-byte
// boundaries (store_frag_row's vector path); uniform over a launch.
template <typename T>
__device__ __forceinline__ bool rows_16b_aligned(const void* base, int64_t s0, int64_t s1, int64_t s2) {
  return ((reinterpret_cast<uintptr_t>(base) | static_cast<uintptr_t>((s0 | s1 | s2) * int64_t{sizeof(T)})) & 15u) == 0;
}

// Stores fragment row hf of a thread's fp32 wgmma accumulator (N columns: acc[4j + 2hf + e] is
// column 8j + 2qd + e, the same row in the four threads of a quad), times scale, as T at
// dst[0, N) when active (uniform over the quad). Plain 4-byte stores put each warp instruction
// on 8 rows, 16 bytes each: at d = 256 the forward's epilogue took 3.7 us per tile, issue-bound.
// With vec16 (dst 16-byte aligned) a 4 x 4 transpose of 32-bit pairs within the quad (two
// shfl_xor rounds) gives each thread 8 consecutive columns, stored as one 16-byte vector: a
// quarter of the store instructions. Every lane of the warp must call it (the shuffles).
template <typename T, int N>
__device__ __forceinline__ void store_frag_row(T* dst, const float (&acc)[N / 2], int hf, float scale, int qd,
                                               bool vec16, bool active) {
  constexpr bool F16 = std::is_same<T, __half>::value;
  static_assert(N % 32 == 0, "whole 4-chunk groups");
  if (!vec16) {
    if (active) {
#pragma unroll
      for (int j = 0; j < N / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * qd) =
            pack2<F16>(acc[4 * j + 2 * hf] * scale, acc[4 * j + 2 * hf + 1] * scale);
    }
    return;
  }
  const bool b1 = (qd & 2) != 0, b0 = (qd & 1) != 0;
#pragma unroll
  for (int g = 0; g < N / 32; ++g) {
    // x[c]: this thread's pair of chunk 4g + c; after the transpose, the pair c of chunk 4g + qd.
    uint32_t x[4];
#pragma unroll
    for (int c = 0; c < 4; ++c)
      x[c] = pack2<F16>(acc[4 * (4 * g + c) + 2 * hf] * scale, acc[4 * (4 * g + c) + 2 * hf + 1] * scale);
    // Round 1 swaps the off-diagonal 2 x 2 blocks between lanes qd and qd ^ 2, round 2 the
    // off-diagonal elements within each block between qd and qd ^ 1.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t r = __shfl_xor_sync(0xffffffffu, b1 ? x[k] : x[k + 2], 2);
      if (b1) x[k] = r;
      else x[k + 2] = r;
    }
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      const uint32_t r = __shfl_xor_sync(0xffffffffu, b0 ? x[k] : x[k + 1], 1);
      if (b0) x[k] = r;
      else x[k + 1] = r;
    }
    if (active) *reinterpret_cast<uint4*>(dst + 8 * (4 * g + qd)) = make_uint4(x[0], x[1], x[2], x[3]);
  }
}

constexpr int kFwdThreads = 384;
constexpr int kConsumerWarps = 8;

// The forward kernels' last step for a consumer thread's two rows (accumulator fragment rows
// row_base and row_base + 8): O / l to the output (rows < s_q) and lse = max ln2 + ln l, NaN when
// a wait of the tile gave up (timed_out, see mbar_wait), -inf for a row that saw no key. o holds
// the thread's D / 2 fp32 accumulators; row_l its columns' part of the row sums (summed over the
// quad here).
template <typename T, int D>
__device__ __forceinline__ void fwd_store_rows(const KParams& p, const float (&o)[D / 2], const float (&row_m)[2],
                                               const float (&row_l)[2], int row_base, int batch, int head, int qd,
                                               bool timed_out) {
  T* out = reinterpret_cast<T*>(p.o);
  const bool vec16 = rows_16b_aligned<T>(p.o, p.o_sb, p.o_ss, p.o_sh);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = row_l[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = (l > 0.f) ? 1.f / l : 0.f;
    const int row = row_base + 8 * hf;
    const bool active = row < p.s_q;
    T* orow = out + batch * p.o_sb + (active ? row : 0) * p.o_ss + head * p.o_sh;
    store_frag_row<T, D>(orow, o, hf, inv, qd, vec16, active);
    if (active && qd == 0) {
      float lse = (l > 0.f) ? (row_m[hf] * 0.69314718055994531f + logf(l)) : -INFINITY;
      if (timed_out) lse = __int_as_float(0x7fffffff);
      p.lse[batch * p.lse_sb + head * p.lse_sh + row * p.lse_ss] = lse;
    }
  }
}

// Phase stamps, built only with FUSEDATTN_HOPPER_STAMPS (the harnesses' `stamps` modes; in the
// library these functions are empty): thread 0 of consumer 0 writes its SM's clock64 at phase i (< 6)
// of its CTA's local work tile `tile` (v2 and the backward: always 0) to g_phase_stamps[CTA][tile][i],
// and %globaltimer (ns) at phases 0 and 5 to slots kStampTimerStart and kStampTimerEnd (the cycle
// counter resolves the short phases; the timer, whose update interval may be as coarse as a
// microsecond, converts cycles to time over a whole tile and orders CTAs across SMs). Tile 0 also
// holds the SM's id (kStampSm) and a count (kStampCount: the persistent kernel's tiles, the
// backward's query tiles); tiles past kStampTiles are not recorded. They split a CTA's fixed cost
// into its phases (docs/perf-notes.md).
#ifdef FUSEDATTN_HOPPER_STAMPS
constexpr int kStampSm = 6, kStampCount = 7, kStampTimerStart = 8, kStampTimerEnd = 9;
constexpr int kStampSlots = 10, kStampTiles = 32;
__device__ unsigned long long* g_phase_stamps = nullptr;  // the harness is one translation unit
__device__ __forceinline__ unsigned long long* phase_stamp_slots(int tile) {
  if (g_phase_stamps == nullptr || threadIdx.x != 128 || tile >= kStampTiles) return nullptr;
  const size_t cta = blockIdx.x + gridDim.x * (blockIdx.y + static_cast<size_t>(gridDim.y) * blockIdx.z);
  return g_phase_stamps + (cta * kStampTiles + tile) * kStampSlots;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif
__device__ __forceinline__ void phase_stamp(int tile, int i) {
#ifdef FUSEDATTN_HOPPER_STAMPS
  if (unsigned long long* slots = phase_stamp_slots(tile)) {
    slots[i] = static_cast<unsigned long long>(clock64());
    if (i == 0) slots[kStampTimerStart] = global_ns();
    if (i == 5) slots[kStampTimerEnd] = global_ns();
  }
#else
  (void)tile;
  (void)i;
#endif
}
// The SM this CTA runs on, into tile 0's kStampSm slot.
__device__ __forceinline__ void phase_stamp_sm() {
#ifdef FUSEDATTN_HOPPER_STAMPS
  if (unsigned long long* slots = phase_stamp_slots(0)) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    slots[kStampSm] = smid;
  }
#endif
}
__device__ __forceinline__ void phase_stamp_count(unsigned long long n) {
#ifdef FUSEDATTN_HOPPER_STAMPS
  if (unsigned long long* slots = phase_stamp_slots(0)) slots[kStampCount] = n;
#else
  (void)n;
#endif
}

template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                    const __grid_constant__ CUtensorMap tmV, const KParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr bool F16 = std::is_same<T, __half>::value;
  using Tile = FwdTile<D>;
  using Smem = FwdSmem<D>;
  constexpr int BM = Tile::BM, BN = Tile::BN, STAGES = Tile::STAGES;
  constexpr int DCH = D / 64;  // 128-byte chunks per row
  static_assert(BM == 128, "two consumer warpgroups x 64 rows");
  static_assert(BN % 16 == 0 && BN <= 256 && D <= 256, "wgmma shape");

  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sQ = (sraw + 1023u) & ~1023u;
  const uint32_t sK0 = sQ + Smem::kQBytes;
  const uint32_t sV0 = sK0 + STAGES * Smem::kKVBytes;
  const uint32_t bar0 = sQ + Smem::kBarOffset;
  const uint32_t bar_q = bar0;
  auto bar_k = [&](int s) { return bar0 + 8u * (1 + s); };
  auto bar_v = [&](int s) { return bar0 + 8u * (1 + STAGES + s); };
  auto bar_e = [&](int s) { return bar0 + 8u * (1 + 2 * STAGES + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  // Causal: heaviest query tiles first.
  const int m_blk = CAUSAL ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_kv = head / (p.h / p.h_kv);
  int n_blocks = (p.s_kv + BN - 1) / BN;
  if (CAUSAL) n_blocks = min(n_blocks, ((m_blk + 1) * BM + BN - 1) / BN);

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_k(s), 1);
      mbar_init(bar_v(s), 1);
      mbar_init(bar_e(s), kConsumerWarps);
    }
    mbar_fence_init();
    tma_prefetch_desc(&tmQ);
    tma_prefetch_desc(&tmK);
    tma_prefetch_desc(&tmV);
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<24>();
    if (tid == 0) {
      // Tensor-map dims are (d, h, s, b): coordinates (d0, head, seq, batch).
      mbar_arrive_expect_tx(bar_q, Smem::kQBytes);
#pragma unroll
      for (int c = 0; c < DCH; ++c) tma_load_4d(sQ + c * BM * 128, &tmQ, bar_q, c * 64, head, m_blk * BM, batch);
      for (int n = 0; n < n_blocks; ++n) {
        const int s = n % STAGES;
        const uint32_t use = n / STAGES;
        mbar_wait<true>(bar_e(s), (use & 1u) ^ 1u);
        mbar_arrive_expect_tx(bar_k(s), Smem::kKVBytes);
#pragma unroll
        for (int c = 0; c < DCH; ++c)
          tma_load_4d(sK0 + s * Smem::kKVBytes + c * BN * 128, &tmK, bar_k(s), c * 64, head_kv, n * BN, batch);
        mbar_arrive_expect_tx(bar_v(s), Smem::kKVBytes);
#pragma unroll
        for (int c = 0; c < DCH; ++c)
          tma_load_4d(sV0 + s * Smem::kKVBytes + c * BN * 128, &tmV, bar_v(s), c * 64, head_kv, n * BN, batch);
      }
    }
    return;
  }

  // -------------------------------------------------------------- consumers
  setmaxnreg_inc<240>();
  const int cw = wg - 1;  // consumer warpgroup: query rows [64*cw, 64*cw+64) of the tile
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  const int qd = lane & 3;
  // This thread's two rows (accumulator fragment: row = 16*warp + lane/4 + 8*hf).
  const int row_base = m_blk * BM + cw * 64 + warp * 16 + (lane >> 2);
  const int wg_row0 = m_blk * BM + cw * 64;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_m[2] = {-INFINITY, -INFINITY};  // running max, log2-scaled domain
  float row_l[2] = {0.f, 0.f};              // running sum (this thread's columns only)
  const float sl2 = p.scale_log2;

  // Watchdog give-ups (see mbar_wait) are reported as NaN lse for the rows.
  bool timed_out = !mbar_wait<false>(bar_q, 0);
  __syncwarp();

  for (int n = 0; n < n_blocks; ++n) {
    const int s = n % STAGES;
    const uint32_t ph = (n / STAGES) & 1u;
    const uint32_t sK = sK0 + s * Smem::kKVBytes;
    const uint32_t sV = sV0 + s * Smem::kKVBytes;

    // ---------------- S = Q K^T  (64 x BN per warpgroup)
    float sacc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) sacc[i] = 0.f;
    timed_out |= !mbar_wait<false>(bar_k(s), ph);
    __syncwarp();  // reconverge after the spin before the .aligned wgmma ops
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) reg_fence(sacc[i]);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const uint32_t a_addr = sQ + (k / 4) * (BM * 128) + cw * (64 * 128) + (k % 4) * 32;
      const uint32_t b_addr = sK + (k / 4) * (BN * 128) + (k % 4) * 32;
      Wgmma<BN, F16>::ss(sacc, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) reg_fence(sacc[i]);

    // ---------------- masking (kv tail and causal diagonal: visibility.h's rule)
    const Visibility<int> vis = sm90_vis<CAUSAL>(p.s_q, p.s_kv);
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

    // ---------------- online softmax (rows r and r+8; 4 threads per row)
    float corr[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        mx = fmaxf(mx, sacc[4 * j + 2 * hf]);
        mx = fmaxf(mx, sacc[4 * j + 2 * hf + 1]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_m[hf], mx * sl2);
      const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
      corr[hf] = fast_exp2(row_m[hf] - m_use);  // exp2(-inf) = 0 on the first tile
      row_m[hf] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = fast_exp2(fmaf(sacc[4 * j + 2 * hf + e], sl2, -m_use));
          sacc[4 * j + 2 * hf + e] = pv;
          sum += pv;
        }
      }
      row_l[hf] = row_l[hf] * corr[hf] + sum;
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j + 0] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }

    // ---------------- P (16-bit A fragments) ; O += P V
    // A fragment of k-step t (keys 16t..16t+15): {S[8t+0,1]} row r cols 2q,2q+1;
    // {S[8t+2,3]} row r+8; {S[8t+4,5]} row r cols 8+2q..; {S[8t+6,7]} row r+8.
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int t = 0; t < BN / 16; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[t][i] = pack2<F16>(sacc[8 * t + 2 * i], sacc[8 * t + 2 * i + 1]);
    }
    timed_out |= !mbar_wait<false>(bar_v(s), ph);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);
#pragma unroll
    for (int t = 0; t < BN / 16; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) reg_fence(pa[t][i]);
    }
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < BN / 16; ++t) {
      // 16 kv rows per k-step: 16 * 128 B; MN (d) chunks BN*128 B apart.
      const uint32_t b_addr = sV + t * (16 * 128);
      Wgmma<D, F16>::rs(o, pa[t], make_smem_desc(b_addr, BN * 128, 1024), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);

    // Both wgmma groups that read stage s have completed in this warp.
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_e(s));
  }

  // ---------------------------------------------------------------- epilogue
  fwd_store_rows<T, D>(p, o, row_m, row_l, row_base, batch, head, qd, timed_out);
#endif
}

// =================================================================== host
namespace detail {

typedef CUresult (*EncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

typedef CUresult (*CtxGetCurrentFn)(CUcontext*);

inline void* driver_entry_point(const char* name) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult qres;
  if (cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &qres) != cudaSuccess ||
      qres != cudaDriverEntryPointSuccess)
    return nullptr;
  return ptr;
}

// The encoder, callable on this thread. cuTensorMapEncodeTiled is a driver call and needs a current
// context, which a thread only gets from its first runtime call: autograd's backward thread can reach
// the Hopper backward before any (torch selects the device there without creating the context), and the
// encode then fails with CUDA_ERROR_INVALID_CONTEXT. cudaSetDevice makes the device's primary context
// current (CUDA >= 12); it is not a stream operation, so it is also legal during graph capture.
inline EncodeTiledFn get_encode_fn() {
  static EncodeTiledFn fn = reinterpret_cast<EncodeTiledFn>(driver_entry_point("cuTensorMapEncodeTiled"));
  static CtxGetCurrentFn ctx_get = reinterpret_cast<CtxGetCurrentFn>(driver_entry_point("cuCtxGetCurrent"));
  if (!fn || !ctx_get) return nullptr;
  CUcontext ctx = nullptr;
  if (ctx_get(&ctx) != CUDA_SUCCESS) return nullptr;
  if (ctx == nullptr) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) return nullptr;
  }
  return fn;
}

// Raises kern's dynamic shared-memory limit to smem on the current device, once per device:
// the attribute is per device, so a process driving several GPUs sets it on each. `done` is
// the caller's per-kernel bit set of devices already raised (atomic: launches may come from
// several host threads). Strictly the attribute belongs to the context: a process that drives
// one device through two contexts (PyTorch uses only the primary one) would need it per context.
inline cudaError_t raise_smem_limit(const void* kern, int smem, std::atomic<uint64_t>& done) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;  // devices past 64: set on every call
  if (bit != 0 && (done.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return e;
}

// A [b, s, hh, d] tensor given by element strides (unit stride on d), as a
// 4-D map with dims (d, hh, s, b); box = (64, 1, rows, 1), 128B swizzle,
// reads out of bounds -> zeros. The strides must be multiples of 8 elements.
struct MapDesc {
  const void* ptr;
  int b, s, hh, d;
  int64_t stride_b, stride_s, stride_h;
};

template <typename T>
inline bool make_map(CUtensorMap* map, const MapDesc& m, int rows) {
  EncodeTiledFn enc = get_encode_fn();
  if (!enc) return false;
  const CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t es = 2;
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(m.d), static_cast<cuuint64_t>(m.hh), static_cast<cuuint64_t>(m.s),
                        static_cast<cuuint64_t>(m.b)};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(m.stride_h) * es, static_cast<cuuint64_t>(m.stride_s) * es,
                           static_cast<cuuint64_t>(m.stride_b) * es};
  cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(rows), 1};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  CUresult r = enc(map, dt, 4, const_cast<void*>(m.ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace detail

// A prepared launch: tensor maps + params + grid. Preparing encodes the three
// tensor maps on the host (cuTensorMapEncodeTiled) and raises the kernel's
// dynamic shared-memory limit; launching is then a bare kernel launch (what the
// harness times).
struct FwdLaunch {
  CUtensorMap tq, tk, tv;
  KParams p;
  dim3 grid;
  int smem;
  bool causal;
  void (*kern)(CUtensorMap, CUtensorMap, CUtensorMap, KParams);
};

// One call's tensors and settings (element strides, unit head-dim stride).
struct Sm90Args {
  detail::MapDesc q, k, v;  // k, v: hh = h_kv
  KParams out;      // o, lse and their strides; b, s_q, s_kv, h, h_kv; scale_log2
  bool causal;
  // The device's SM count, for the causal tile order's chunk (out.causal_chunk is set by the v2 and
  // three-consumer prepare functions from it; 0, unknown: group by group) and the persistent grid.
  int sm_count = 0;
  int causal_chunk = 0;  // > 0: that chunk instead of tuning.h's choice
};

// T = __nv_bfloat16 or __half; D in {64, 128, 256}: D must equal the head dim.
// Returns cudaErrorInvalidValue on unsupported arguments or a failed map encode.
template <typename T, int D>
inline cudaError_t fwd_sm90_prepare(FwdLaunch* L, const Sm90Args& a) {
  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  using Tile = FwdTile<D>;
  const KParams& p = a.out;
  if (p.b <= 0 || p.s_q <= 0 || p.s_kv <= 0 || p.h <= 0 || p.h_kv <= 0 || p.h % p.h_kv != 0 || p.h > 65535 ||
      p.b > 65535 || a.q.d != D || a.k.d != D || a.v.d != D)
    return cudaErrorInvalidValue;
  // TMA needs 16-byte aligned base addresses; the epilogue stores 4-byte pairs.
  if ((reinterpret_cast<uintptr_t>(a.q.ptr) | reinterpret_cast<uintptr_t>(a.k.ptr) |
       reinterpret_cast<uintptr_t>(a.v.ptr)) & 15)
    return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(p.o) & 3) return cudaErrorInvalidValue;
  if (!detail::make_map<T>(&L->tq, a.q, Tile::BM) || !detail::make_map<T>(&L->tk, a.k, Tile::BN) ||
      !detail::make_map<T>(&L->tv, a.v, Tile::BN))
    return cudaErrorInvalidValue;
  L->p = p;
  L->smem = FwdSmem<D>::kTotal;
  L->grid = dim3((p.s_q + Tile::BM - 1) / Tile::BM, p.h, p.b);
  L->causal = a.causal;
  L->kern = a.causal ? fwd_sm90_kernel<T, D, true> : fwd_sm90_kernel<T, D, false>;
  static std::atomic<uint64_t> raised[2];  // per instantiation of this function: causal or not
  return detail::raise_smem_limit(reinterpret_cast<const void*>(L->kern), L->smem, raised[a.causal ? 1 : 0]);
}

inline cudaError_t fwd_sm90_launch(const FwdLaunch& L, cudaStream_t stream = 0) {
  L.kern<<<L.grid, dim3(kFwdThreads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.p);
  return cudaGetLastError();
}

}  // namespace hopper
}  // namespace fusedattn
