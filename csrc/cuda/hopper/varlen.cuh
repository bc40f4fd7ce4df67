// Varlen calls on the Hopper kernels (features.h's VARLEN): per-sequence lengths read on the device,
// for thd (packed sequences, with or without cu_seqlens_*_padded offsets) and bshd / sbhd with a
// padding mask.
//
// Every sequence gets its own tensor maps: the call's map with its global address moved to the
// sequence's row 0 and its sequence dim cut to the sequence's length (at least 1), rebased on the device
// (tensormap.replace). So TMA zero-fills a tile's rows past the sequence, as it does past s_q in bshd,
// and the dQ reduce-adds skip them: the kernels' bshd logic holds per sequence, and rows no sequence
// owns (thd gaps and tails, bshd padding: any values, NaN included) are never read. A sequence's
// tiles take coordinates from its row 0 and batch coordinate 0. The prologue kernel below builds the
// maps before the main kernel and writes the rows no sequence owns in the outputs (zeros; lse -inf),
// so the main kernels store only rows inside sequences.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/seq.cuh"
#include "params.h"
#include "ptx_sm90.cuh"
#include "tma_host.h"

namespace fusedattn {
namespace hopper {

// The maps of a sequence, in this order (the forward has the first three).
enum : int { kMapQ = 0, kMapK = 1, kMapV = 2, kMapDO = 3, kMapDQ = 4, kFwdSeqMaps = 3, kBwdSeqMaps = 5 };

// Sequence b's map i (per_seq maps a sequence) in the workspace's map slots.
__device__ __forceinline__ const void* seq_map(const uint8_t* maps, int per_seq, int b, int i) {
  return maps + (static_cast<size_t>(b) * per_seq + i) * kSeqMapBytes;
}

// The 128-byte aligned map slots inside a workspace part of seq_maps_bytes().
inline uint8_t* seq_map_slots(void* part) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(part);
  return reinterpret_cast<uint8_t*>((a + kSeqMapBytes - 1) / kSeqMapBytes * kSeqMapBytes);
}

// A side of the call: the queries' or the keys' lengths, first tokens and rows.
struct SeqSide {
  int len;
  int64_t tok;
  bool thd;
  int64_t rows;  // thd: the token dim; else the sequence dim (max length)
  const int32_t* offsets;
};
__device__ __forceinline__ SeqSide seq_side(const gpu::SeqExtents& e, const gpu::SeqSpan& sp, bool kv) {
  const SeqlenParams& sl = e.seqlens;
  return kv ? SeqSide{sp.len_kv, sp.tok_kv, sl.kv_is_thd, sl.kv_is_thd ? e.t_kv : e.s_kv, sl.offsets_kv}
            : SeqSide{sp.len_q, sp.tok_q, sl.q_is_thd, sl.q_is_thd ? e.t_q : e.s_q, sl.offsets_q};
}

// A tensor whose sequences get maps: the template map (the call's, b = 1), where element (0, 0, 0, 0)
// is and the byte strides that find a sequence's row 0 (bshd / sbhd: batch b; thd: token tok).
struct SeqMapSpec {
  const char* base;
  int64_t stride_b, stride_s;
  bool kv;
};
// An output whose rows no sequence owns get zeros: `row_bytes` (a multiple of 16) per (row, head).
struct RowFill {
  char* base;
  int64_t stride_b, stride_s, stride_h;  // bytes
  int heads, row_bytes;
  bool kv;
};

constexpr int kMaxSeqMaps = 5;
struct VarlenPrologue {
  CUtensorMap tmpl[kMaxSeqMaps];
  SeqMapSpec map[kMaxSeqMaps];
  int n_maps;
  uint8_t* maps;  // n_maps slots per sequence (seq_map_slots)
  RowFill fill[2];
  int n_fill;
  float* lse;  // forward: -inf at the query rows no sequence owns (element strides), else null
  int64_t lse_sb, lse_sh, lse_ss;
  int lse_heads;
  gpu::SeqExtents seq;
  int nseq;
};

// The rows of sequence b's side that no sequence owns: bshd [len, rows) of batch b; thd the gap from
// the sequence's end to the next sequence's first token (the last sequence: to the token dim's end),
// and for b = 0 the tokens before it. Clamped, so inconsistent offsets give an empty range, never an
// out-of-bounds one.
struct RowRanges {
  int64_t a0, e0, a1, e1;  // [a0, e0), [a1, e1)
};
__device__ __forceinline__ RowRanges unowned_rows(const SeqSide& s, int b, int nseq) {
  RowRanges r{0, 0, 0, 0};
  if (!s.thd) {
    r.a0 = s.len;
    r.e0 = s.rows;
    return r;
  }
  r.a0 = s.tok + s.len;
  r.e0 = b + 1 < nseq ? gpu::min64(gpu::max64(s.offsets[b + 1], 0), s.rows) : s.rows;
  if (b == 0) r.e1 = s.tok;
  return r;
}

// Grid (chunks, nseq), 256 threads. Block (0, b): warp i rebases map i for sequence b. Every block: its
// share of sequence b's unowned rows in the fills and lse.
template <int N = kMaxSeqMaps>
__global__ void __launch_bounds__(256) varlen_prologue_kernel(const __grid_constant__ VarlenPrologue a) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const int b = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const gpu::SeqSpan sp = gpu::seq_span(a.seq, b);
  if (blockIdx.x == 0 && warp < a.n_maps) {
    __shared__ alignas(128) uint32_t smaps[N][kSeqMapBytes / 4];
    const SeqMapSpec& m = a.map[warp];
    const SeqSide s = seq_side(a.seq, sp, m.kv);
    smaps[warp][lane] = reinterpret_cast<const uint32_t*>(&a.tmpl[warp])[lane];
    __syncwarp();
    if (lane == 0) {
      // An empty sequence's map (a forward's one masked key tile still loads) is the tensor's first row,
      // which exists (sm90.cu declines empty token dims), where its own row 0 may lie past the end.
      const char* row0 = s.len == 0 ? m.base : m.base + (s.thd ? s.tok * m.stride_s : b * m.stride_b);
      tensormap_rebase_smem(smem_u32(smaps[warp]), row0, static_cast<uint32_t>(s.len > 0 ? s.len : 1));
    }
    __syncwarp();
    tensormap_publish(a.maps + (static_cast<size_t>(b) * a.n_maps + warp) * kSeqMapBytes, smem_u32(smaps[warp]));
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int f = 0; f < a.n_fill; ++f) {
    const RowFill& t = a.fill[f];
    const SeqSide s = seq_side(a.seq, sp, t.kv);
    const RowRanges r = unowned_rows(s, b, a.nseq);
    const int64_t n0 = gpu::max64(r.e0 - r.a0, 0), n1 = gpu::max64(r.e1 - r.a1, 0);
    const int vecs = t.row_bytes / 16;
    char* const base = t.base + (s.thd ? 0 : b * t.stride_b);
    for (int64_t i = first; i < (n0 + n1) * t.heads * vecs; i += step) {
      const int64_t row_i = i / (static_cast<int64_t>(t.heads) * vecs);
      const int64_t rest = i - row_i * t.heads * vecs;
      const int64_t row = row_i < n0 ? r.a0 + row_i : r.a1 + (row_i - n0);
      char* dst = base + row * t.stride_s + (rest / vecs) * t.stride_h + (rest % vecs) * 16;
      *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  if (a.lse != nullptr) {
    const SeqSide s = seq_side(a.seq, sp, false);
    const RowRanges r = unowned_rows(s, b, a.nseq);
    const int64_t n0 = gpu::max64(r.e0 - r.a0, 0), n1 = gpu::max64(r.e1 - r.a1, 0);
    float* const base = a.lse + (s.thd ? 0 : b * a.lse_sb);
    for (int64_t i = first; i < (n0 + n1) * a.lse_heads; i += step) {
      const int64_t row_i = i / a.lse_heads;
      const int64_t row = row_i < n0 ? r.a0 + row_i : r.a1 + (row_i - n0);
      base[(i - row_i * a.lse_heads) * a.lse_sh + row * a.lse_ss] = -INFINITY;
    }
  }
#endif
}

inline cudaError_t varlen_prologue(const VarlenPrologue& a, int sm_count, cudaStream_t stream) {
  // Blocks per sequence: enough for two per SM over the call, at most 64 (a sequence's unowned rows
  // are a few tiles at most but for a long thd tail).
  int chunks = sm_count > 0 ? (2 * sm_count + a.nseq - 1) / a.nseq : 1;
  chunks = chunks < 1 ? 1 : (chunks > 64 ? 64 : chunks);
  varlen_prologue_kernel<><<<dim3(chunks, a.nseq), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

// A call's tensor (m: thd has b = 1 and s = the token dim) as a varlen template map (b = 1, the
// sequence dim rebased per sequence; `rows`-row boxes) and its spec.
template <typename T>
inline bool varlen_map(CUtensorMap* tmpl, SeqMapSpec* spec, const detail::MapDesc& m, bool kv, int rows) {
  // The template's batch stride is never used (one batch); it only has to be a valid stride.
  const detail::MapDesc one{m.ptr, 1, m.s, m.hh, m.d, m.stride_s * m.s, m.stride_s, m.stride_h};
  *spec = SeqMapSpec{static_cast<const char*>(m.ptr), m.stride_b * int64_t{sizeof(T)},
                     m.stride_s * int64_t{sizeof(T)}, kv};
  return detail::make_map<T>(tmpl, one, rows);
}

}  // namespace hopper
}  // namespace fusedattn
