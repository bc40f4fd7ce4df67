// The splits of one (sequence, KV head, row chunk) merged inside a thread-block
// cluster (sm_90): the epilogue of decode_cluster_kernel (decode_kernel.cuh).
//
// The default path writes every split's partial (O normalised by its own sum,
// fp32, and lse) to the workspace and a second kernel, decode_combine_kernel,
// reads them back and merges them. Here the splits are the CTAs of one cluster
// along grid x (cluster dims (splits, 1, 1), so cluster rank == blockIdx.x ==
// split); each CTA leaves its partial in its own shared memory, and after a
// cluster barrier every CTA merges a slice of the head-dim columns of all the
// block's rows by reading the peers' partials through distributed shared
// memory. No workspace, no second launch, no global round trip of the partials.
//
// The numbers are bitwise those of the combine kernel with the same split
// count: the partial is computed with the same expressions as the decode
// kernel's workspace write (warp sum in warp order, times 1 / L; lse = m +
// log2 L), and the merge adds split 0, 1, 2, ... in order, as combine_row does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode.h"
#include "epilogue.cuh"
#include "ptx.cuh"
#include "simt/common.cuh"
#include "tile.h"

namespace fusedattn {
namespace decode {

// ---- cluster instructions (sm_90). Only decode_cluster_kernel calls them, and its body is
// compiled for sm_90 and newer alone; the guards keep the sm_80 build of these headers free of
// instructions it cannot assemble. ----

// Every thread of the cluster arrives and waits: the release / acquire pair makes each CTA's
// shared-memory writes before the barrier visible to the other CTAs' reads after it. The
// .aligned forms: every call site is in uniform control flow (all threads of the block).
__device__ __forceinline__ void cluster_sync_release_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#endif
}

// The address in CTA `rank`'s shared memory of the variable at `addr` in this CTA's (shared::cta
// address -> shared::cluster address).
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, int rank) {
  uint32_t out = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}

// Loads from distributed shared memory (an address from map_to_rank). volatile: they must stay
// after the cluster barrier that publishes the data.
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
#endif
  return v;
}

__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#endif
  return v;
}

// A block's state after its warps have merged (decode_kernel.cuh), in its shared memory, and
// where its rows go.
struct BlockState {
  float* o_s;          // [WN][M][OS]: each warp's O rows, scaled to the block's row max
  const float* row_m;  // [M]: the block's row max (log2 units; -inf: no visible key)
  const float* row_l;  // [M]: the row's sum relative to row_m
  int row0, hk, b;     // first row, KV head, sequence
  simt::SeqInfo si;
};

// The epilogue of a CTA of the cluster: publish this split's partial, merge all splits' partials
// of this CTA's column slice, write out and lse as decode_combine_kernel does (padded bshd/sbhd
// rows: zeros and -inf; thd rows past a sequence: nothing).
template <class T, int D, int WM>
__device__ __forceinline__ void merge_splits_in_cluster(const FwdParams& p, const KernelArgs& a, const BlockState& st) {
  using C = Tile<D, WM>;
  constexpr int M = C::M, WN = C::kWN, OS = C::OS, C4 = D / 4;
  __shared__ float row_lse[M];  // this split's lse per row (log2 units), read by the peers

  const int tid = threadIdx.x;
  const int group = a.group, dv = static_cast<int>(p.prob.d_v);
  const int nr = min(M, a.rows - st.row0);  // the block's rows that exist (r < rows)
  const simt::SeqInfo& si = st.si;

  // ---- this split's partial, as the decode kernel writes it to the workspace: O of the warps
  // summed in warp order and normalised by the row's sum, in place in warp 0's slab of o_s (each
  // element is read and written by one thread), and lse = m + log2 L. ----
  for (int u = tid; u < nr * C4; u += kThreads) {
    const int lr = u / C4, c = (u % C4) * 4;
    if (c >= dv || (st.row0 + lr) / group >= si.len_q) continue;
    float4 acc = *reinterpret_cast<const float4*>(st.o_s + lr * OS + c);
#pragma unroll
    for (int w = 1; w < WN; ++w) {
      const float4 x4 = *reinterpret_cast<const float4*>(st.o_s + (w * M + lr) * OS + c);
      acc.x += x4.x;
      acc.y += x4.y;
      acc.z += x4.z;
      acc.w += x4.w;
    }
    const float L = st.row_l[lr];
    const float inv = L > 0.f ? 1.f / L : 0.f;
    *reinterpret_cast<float4*>(st.o_s + lr * OS + c) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  }
  for (int lr = tid; lr < nr; lr += kThreads) {
    const int r = st.row0 + lr;
    if (r / group >= si.len_q) continue;
    const float L = st.row_l[lr], mx = st.row_m[lr];
    row_lse[lr] = L > 0.f ? mx + log2f(L) : -INFINITY;
    // Each split's own row max, as on the default path (a max: the order does not matter).
    if (p.max_logit != nullptr && L > 0.f) simt::atomic_max_float(p.max_logit + st.hk * group + r % group, mx * kLn2);
  }
  cluster_sync_release_acquire();  // every split's partial is in its CTA's shared memory

  // ---- merge: CTA `rank` takes the 4-column groups [lo, lo + span) of every row (the rows are
  // few at decode: 4 of 16 with a GQA group of 4, so slicing the columns keeps all CTAs busy).
  const int splits = a.splits, rank = static_cast<int>(blockIdx.x);
  const int nc4 = (dv + 3) / 4;
  const int lo = rank * nc4 / splits, span = (rank + 1) * nc4 / splits - lo;
  const uint32_t lse_base = smem_u32(row_lse), o_base = smem_u32(st.o_s);
  T* out = static_cast<T*>(p.out.data);
  for (int u = tid; u < nr * span; u += kThreads) {
    const int lr = u / span, c = (lo + u % span) * 4;
    const int r = st.row0 + lr, i = r / group, h = st.hk * group + r % group;
    float* lse_row = p.lse + int64_t(st.b) * p.lse_stride_b + int64_t(h) * p.lse_stride_h;
    if (i >= si.len_q) {
      if (!p.seqlens.q_is_thd) {
        store4<T>(out + simt::row_base(p.out, st.b, i, h), p.out.stride_d, c, a.out_vec, 0.f, 0.f, 0.f, 0.f);
        if (c == 0) lse_row[int64_t(i) * p.lse_stride_s] = -INFINITY;
      }
      continue;
    }
    // All splits' lse, then all their partial columns, before any is used (two round trips to
    // the peers rather than one per split); the same additions in the same order as combine_row.
    const uint32_t lse_addr = lse_base + lr * 4, o_addr = o_base + (lr * OS + c) * 4;
    float ls[kMaxCluster];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kMaxCluster; ++j) {
      ls[j] = j < splits ? ld_cluster_f32(map_to_rank(lse_addr, j)) : -INFINITY;
      mx = fmaxf(mx, ls[j]);
    }
    float den = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mx != -INFINITY) {
      float4 x[kMaxCluster];
#pragma unroll
      for (int j = 0; j < kMaxCluster; ++j) {
        x[j] = j < splits ? ld_cluster_f32x4(map_to_rank(o_addr, j)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < kMaxCluster; ++j) {
        if (j >= splits) break;
        const float wj = exp2f(ls[j] - mx);  // 0 for a split that saw no key
        den += wj;
        acc.x += wj * x[j].x;
        acc.y += wj * x[j].y;
        acc.z += wj * x[j].z;
        acc.w += wj * x[j].w;
      }
    }
    float fct, lse;
    finalize_row(p, h, den, mx, &fct, &lse);
    store4<T>(out + simt::row_base(p.out, st.b, si.tok_q + i, h), p.out.stride_d, c, a.out_vec, acc.x * fct,
              acc.y * fct, acc.z * fct, acc.w * fct);
    if (c == 0) lse_row[(si.tok_q + i) * p.lse_stride_s] = lse;
  }
  // No CTA leaves (and frees its shared memory) while a peer may still read it.
  cluster_sync_release_acquire();
}

}  // namespace decode
}  // namespace fusedattn
