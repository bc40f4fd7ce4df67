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

#include "ptx_sm90.cuh"
#include "tuning.h"  // causal_chunk_for
#include "wgmma.cuh"

namespace fusedattn {
namespace hopper {

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

inline cudaError_t fwd_sm90_launch(const FwdLaunch& L, cudaStream_t stream = 0) {
  L.kern<<<L.grid, dim3(kFwdThreads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.p);
  return cudaGetLastError();
}

}  // namespace hopper
}  // namespace fusedattn
