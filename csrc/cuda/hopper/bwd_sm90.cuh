// Hopper (sm_90a) FlashAttention backward (FlashAttention-3-like): TMA +
// mbarrier ring from a producer warpgroup, two wgmma consumer warpgroups.
// Called by sm90.cu for the calls it takes; checked and timed on its own by
// tests/gpu/hopper/bwd_harness.cu.
//
//   q, dO, o [b, s_q, h, d]; k, v [b, s_kv, h_kv, d]; lse fp32 [b, h, s_q]
//   (natural log); dq like q; dk, dv like k. All bshd CONTIGUOUS, bf16/fp16,
//   d in {64, 128} here and d = 256 in bwd_sm90_d256.cuh (its own main
//   kernel; same pre/post kernels, params, workspace and host entry points).
//   GQA: h % h_kv == 0 (a CTA walks all the query heads of its group, so
//   dK/dV need no cross-CTA reduction). Causal = top-left diagonal (key j
//   visible to query i iff j <= i).
//
// Three kernels:
//  (1) bwd_pre_kernel: per query row, Dsum = rowsum(dO * O) (fp32), lse2 =
//      lse * log2(e) (+inf for rows with lse = -inf and for the padding rows up
//      to s_pad = roundup(s_q, 128), so P = 0 there), zeroes the fp32 dQ
//      accumulator [b, s_q, h, d].
//  (2) bwd_sm90_kernel: one CTA per (key tile of BN = 128 keys, kv head, batch),
//      384 threads:
//      WG0 producer (setmaxnreg.dec 24): one thread TMA-loads K, V once, then
//          streams (Q tile, dO tile, lse2 row slice, Dsum row slice) through a
//          STAGES-deep ring (full barrier with complete_tx, empty barrier with
//          8 consumer-warp arrivals); the row slices come by cp.async.bulk.
//      WG1, WG2 consumers (setmaxnreg.inc 240); consumer cw owns keys
//          [64cw, 64cw+64) of the tile. Per query tile (BM rows):
//            S^T  = K_cw Q^T       wgmma SS  m64nBMk16 (both K-major)
//            dP^T = V_cw dO^T      wgmma SS
//            P^T  = exp2(S^T*scale*log2e - lse2[q]), causal mask -> 0
//            dS^T = P^T (dP^T - Dsum[q])
//            P^T, dS^T -> 16-bit A fragments in registers (as the forward's P)
//            dS^T -> shared memory, [key][query] with the 128B swizzle
//                    (query-contiguous = M-major A for dQ), fence.proxy.async,
//                    named barrier over both consumer WGs (double-buffered by
//                    iteration parity, so one barrier per iteration suffices)
//            dQ_part = dS K        wgmma SS with trans-a = trans-b = 1
//                    (d=128, BM=64 : WG cw computes dQ[:, 64cw..64cw+63] over
//                                    all 128 keys)
//                    (d=64, BM=128 : WG cw computes dQ[64cw..64cw+63, :] over
//                                    all 128 keys)
//            dV  += P^T dO         wgmma RS (dO MN-major via trans-b)
//            dK  += dS^T Q         wgmma RS
//            dQ_part -> fp32 atomicAdd(float2) into the dQ accumulator
//                    (overlapped with the dV/dK wgmmas: wait_group 1).
//          Epilogue: dK * scale, dV -> 16-bit, plain stores.
//  (3) bwd_post_kernel: dq = dQ_acc * scale -> 16-bit.
//
// Tiles: d=128: BM=64, BN=128; d=64: BM=128, BN=128; STAGES = 2
// (d=256: BM=64, BN=64 with a different consumer split, see bwd_sm90_d256.cuh).
// Registers per consumer thread (fp32 accumulators): d=128: dK 64 + dV 64 +
// S^T 32 + dP^T 32 (then P/dS fragments 16 + 16 and dQ 32); d=64: dK 32 +
// dV 32 + S^T 64 + dP^T 64 (then 32 + 32 fragments and dQ 32).
// Shared memory: d=128: K 32K + V 32K + 2 x (Q 16K + dO 16K) + 2 x dS 16K
// + 2 x 512 B rows ~ 162 KB; d=64: 16K + 16K + 2 x 32K + 2 x dS 32K + 2 KB ~ 162 KB.
//
// Variant DQ_TMA (bwd_sm90_dqtma_kernel, bwd_sm90_prepare<T, D, true>; d = 64/128;
// the library's choice since 2026-11-30): dQ_part (64 x 64 fp32 per consumer in both
// configs) goes through a 16 KB shared staging tile per consumer (+ 32 KB:
// d=128 195 KB, d=64 196 KB) and two TMA reduce-adds (cp.reduce.async.bulk.tensor
// .add, fp32 map over the accumulator) instead of 32 atomicAdd(float2) per thread.
// Measured on the H200 (bwd harness bench2, b*s = 16k, h*d = 2048): 1.00-1.14x the
// atomic kernel at every point (d = 128: 1.07-1.14x at s = 1k and s >= 8k). The
// atomic kernel (DQ_TMA = false) stays as the harness's baseline.
//
// Variant DET (bwd_sm90_dqtma_det_kernel, bwd_sm90_prepare<T, D, true, true>; the library's
// deterministic mode at d = 64/128 since 2026-11-30, measured 0.71-0.89x the DQ_TMA kernel on
// the H200, 261-403 TFLOP/s): DQ_TMA with dQ bitwise reproducible. The reduce-adds into each
// (batch, head, query tile m) take turns in a fixed order of key tiles, so every dQ element
// sums its terms in one order whatever the CTAs' timing (dK, dV are per-CTA register sums
// and already reproducible; they stay bitwise equal to DQ_TMA's).
//  * Order: key tiles n_last(m), n_last(m) - 1, ..., 0, where n_last(m) is the highest key
//    tile that sees m (causal: min(N - 1, m BM / BN), key tile n sees m >= n BN / BM, so every
//    lower tile sees m too; else N - 1). Key tile n's turn at m is n_last(m) - n, and the key
//    tiles are dispatched in decreasing order (n = gridDim.x - 1 - blockIdx.x). Why not
//    n = 0, 1, ...: causally, tile n's first query tile is n BN / BM, which tile 0 reaches only
//    after that many iterations, so every CTA of a (kv head, batch) would wait for tile 0 and
//    hold its SM for tile 0's whole run (tests/gpu/hopper/bwd_det_model.py: 0.45-0.60x the
//    DQ_TMA kernel). In decreasing order the tile a CTA waits for (n + 1) reaches every m
//    BN / BM iterations earlier and was dispatched earlier, so in steady state nobody waits
//    (FlashAttention-3's deterministic causal backward makes the same choice). Without causal
//    masking every tile sees every m and the two orders are mirror images.
//  * Counters: one int32 per (batch, head, m, consumer) after the usual workspace
//    (bwd_sm90_det_workspace_bytes), zeroed by bwd_pre_det_kernel, so each call and each
//    CUDA-graph replay starts from 0. One per consumer because the two consumers' dQ_parts
//    of an iteration are disjoint (d = 128: columns 64cw..64cw+63; d = 64: rows
//    64cw..64cw+63 of the tile): ordering each consumer's reduces on its own fixes the
//    order for every element, and the two issuing threads wait and release independently,
//    with no extra barrier between the consumers.
//  * Protocol (the consumer's issuing thread, ltid 0): after the staging barrier it polls
//    the counter with ld.acquire.gpu until it equals its turn, executes
//    fence.proxy.async.global, issues the two reduces and commits them. The release is
//    deferred to the next tile, right after that tile's S^T / dP^T wgmmas are issued (or to
//    after the loop), so the reduces complete under the dV / dK wgmmas: wait_group 0, then
//    st.release.gpu of turn + 1. PTX ISA rules relied on (8.x, "Asynchronous copy" and
//    cp.async.bulk.wait_group): cp{.reduce}.async.bulk operations are performed in the async
//    proxy, and accessing the same memory across proxies needs a cross-proxy fence;
//    cp.async.bulk.wait_group without .read waits until the group's writes have been made
//    visible to the executing thread; the completion of a cp{.reduce}.async.bulk is followed
//    by an implicit generic-async proxy fence, so its result is visible to the generic proxy
//    once the completion is observed. Hence on the writer side wait_group 0 then a generic
//    release store (release: the writes this thread has observed are ordered before it, at gpu
//    scope), and on the reader side the acquire load, then fence.proxy.async.global, so that
//    its own async-proxy reduces are ordered after what the acquire made visible.
//  * Deadlock freedom, assuming (as csrc/cuda/tc's deterministic dQ does) that the hardware
//    dispatches CTAs in increasing linear block index, i.e. a CTA becomes resident only after
//    the CTAs of its (kv head, batch) with a lower blockIdx.x: a CTA's waits (its consumers'
//    turns, and through its producer's ring and the consumers' shared barriers the same turns)
//    depend only on those CTAs (higher key tiles), never on higher-indexed ones; a consumer
//    releases a tile's turn before it waits for its next one. So the lowest-indexed unfinished
//    CTA of a group finds all the turns it needs released (its predecessors have finished),
//    never waits for another CTA and finishes; by induction all do. CUDA does not guarantee
//    the dispatch order; the watchdog (dq_wait_turn gives up after 2^26 polls, NaN dK) turns
//    a violation into a failed check instead of a hang.
//  * Cost: each CTA's turn at m comes one handoff (reduce completion + release seen by the
//    poll, ~2-3 us) after its predecessor's, so the CTAs of a group that start together
//    skew by that much per key tile; see docs/perf-notes.md for the prediction.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "epilogue.cuh"
#include "params.h"
#include "ptx_sm90.cuh"
#include "tile_scheduler.cuh"
#include "tma_host.h"
#include "tuning.h"
#include "wgmma.cuh"

namespace fusedattn {
namespace hopper {

constexpr int kBwdRowPad = 128;  // s_pad = roundup(s_q, kBwdRowPad) for lse2/Dsum rows (>= every BM)

// DQ_TMA (variant, see bwd_sm90_main): + one fp32 dQ staging tile of 64 x 64
// per consumer (2 x 16 KB, 1024-aligned for the 128B swizzle), single-buffered.
template <int D, bool DQ_TMA = false>
struct BwdSmem {
  using Tile = BwdTile<D>;
  static constexpr int BM = Tile::BM, BN = Tile::BN, STAGES = Tile::STAGES;
  static constexpr int kKVBytes = BN * D * 2;  // one of K, V
  static constexpr int kQBytes = BM * D * 2;   // one of Q, dO (per stage)
  static constexpr int kDSBytes = BM * BN * 2;  // one dS^T buffer
  static constexpr int kRowBytes = BM * 4;      // one lse2 / Dsum slice
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKVBytes;
  static constexpr int kQ = kV + kKVBytes;
  static constexpr int kdO = kQ + STAGES * kQBytes;
  static constexpr int kdS = kdO + STAGES * kQBytes;
  static constexpr int kL = kdS + 2 * kDSBytes;
  static constexpr int kDs = kL + STAGES * kRowBytes;
  static constexpr int kBar = kDs + STAGES * kRowBytes;
  static constexpr int kBarBytes = 8 * (1 + 2 * STAGES);
  static constexpr int kStgBytes = 64 * 64 * 4;  // one consumer's dQ_part staging tile (DQ_TMA)
  static constexpr int kStg = ((kBar + kBarBytes + 1023) / 1024) * 1024;
  static constexpr int kTotal = DQ_TMA ? kStg + 2 * kStgBytes + 1024
                                       : kBar + ((kBarBytes + 127) / 128) * 128 + 1024;  // + alignment slack
  static_assert(kQ % 1024 == 0 && kdO % 1024 == 0 && kdS % 1024 == 0 && kL % 16 == 0, "swizzle atoms 1024-aligned");
  static_assert(kTotal <= 227 * 1024, "shared memory");
  static_assert(kStg % 1024 == 0, "staging tiles 1024-aligned (128B swizzle)");
};

constexpr int kBwdThreads = 384;
constexpr int kBwdConsumerWarps = 8;

// Reduce-adds a staging tile written by stage_dq_part<4 NB> (NB boxes of [64 rows][32 fp32] at
// stg + b * 8 KB) into the fp32 dQ accumulator's map at columns col0 + 32 b, query rows row0..,
// as one bulk group of the calling thread (rows >= s_q are out of bounds and skipped).
template <int NB>
__device__ __forceinline__ void reduce_dq_part(const CUtensorMap* tmdQ, uint32_t stg, int col0, int head, int row0,
                                               int batch) {
#pragma unroll
  for (int b = 0; b < NB; ++b) tma_reduce_add_4d(tmdQ, stg + b * (64 * 128), col0 + 32 * b, head, row0, batch);
  bulk_commit_group();
}

// The producer warpgroup's work, the same for the d = 64/128 kernel and the
// d = 256 one (bwd_sm90_d256.cuh): one thread TMA-loads the CTA's K and V tiles
// once (barrier bar0), then streams (Q, dO, lse2 row slice, Dsum row slice) of
// every query tile of every query head of the KV group through the STAGES-deep
// ring (full barrier bar0 + 8(1 + s), empty barrier bar0 + 8(1 + STAGES + s)).
// Smem supplies the tile shape and byte sizes; DCH is the number of 64-wide
// head-dim chunks (one TMA box each). Addresses are shared-space.
//
// DQ_Q (the d = 256 kernel, bwd_sm90_d256.cuh "dQ by TMA reduce-add"): consumer 1 stages its fp32
// dQ_part columns [128, 256) of each iteration in that iteration's Q tile and releases the stage
// without reducing; this thread reduce-adds the staged tile into tmdQ (the fp32 accumulator's map)
// once the stage's empty barrier completes, starts the stage's dO refill (dO holds consumer 0's
// dQ_part, whose reduces consumer 0 has waited for), and refills Q once the reduces have read it.
// So no consumer waits for those reads, and the refill waits for them only where it must. After
// the last refill it waits for the stages still in use and reduces them, then for completion.
struct BwdProducerArgs {
  uint32_t sK, sV, sQ0, sdO0, sL0, sDs0, bar0;
  const CUtensorMap *tmQ, *tmK, *tmV, *tmdO;
  int n_blk, hk, batch;  // the CTA's key tile, KV head, batch
  int m_start, n_m;      // its query tiles [m_start, n_m)
  const CUtensorMap* tmdQ;  // DQ_Q only
};

template <class Smem, int DCH, bool DQ_Q = false>
__device__ __forceinline__ void bwd_produce(const BwdProducerArgs& a, const BwdKParams& p) {
  constexpr int BM = Smem::BM, BN = Smem::BN, STAGES = Smem::STAGES;
  const uint32_t bar_kv = a.bar0;
  auto bar_full = [&](int s) { return a.bar0 + 8u * (1 + s); };
  auto bar_empty = [&](int s) { return a.bar0 + 8u * (1 + STAGES + s); };
  // Tensor-map dims are (d, heads, seq, batch).
  mbar_arrive_expect_tx(bar_kv, 2 * Smem::kKVBytes);
#pragma unroll
  for (int c = 0; c < DCH; ++c) tma_load_4d(a.sK + c * BN * 128, a.tmK, bar_kv, c * 64, a.hk, a.n_blk * BN, a.batch);
#pragma unroll
  for (int c = 0; c < DCH; ++c) tma_load_4d(a.sV + c * BN * 128, a.tmV, bar_kv, c * 64, a.hk, a.n_blk * BN, a.batch);
  const int G = p.h / p.h_kv;
  // DQ_Q: consumer 1's staged dQ_part of iteration j (query tile and head recomputed from j).
  const int per_head = a.n_m - a.m_start;
  const auto reduce_dq = [&](int j) {
    // Consumer 1's half: columns [DCH * 32, DCH * 64), DCH boxes of 32.
    reduce_dq_part<DCH>(a.tmdQ, a.sQ0 + (j % STAGES) * Smem::kQBytes, DCH * 32, a.hk * G + j / per_head,
                        (a.m_start + j % per_head) * BM, a.batch);
  };
  int it = 0;
  for (int g = 0; g < G; ++g) {
    const int head = a.hk * G + g;
    for (int m = a.m_start; m < a.n_m; ++m, ++it) {
      const int s = it % STAGES;
      const uint32_t use = it / STAGES;
      mbar_wait<true>(bar_empty(s), (use & 1u) ^ 1u);
      if constexpr (DQ_Q) {
        if (it >= STAGES) reduce_dq(it - STAGES);
      }
      mbar_arrive_expect_tx(bar_full(s), 2 * Smem::kQBytes + 2 * Smem::kRowBytes);
      const auto load_q = [&] {
#pragma unroll
        for (int c = 0; c < DCH; ++c)
          tma_load_4d(a.sQ0 + s * Smem::kQBytes + c * BM * 128, a.tmQ, bar_full(s), c * 64, head, m * BM, a.batch);
      };
      if constexpr (!DQ_Q) load_q();
#pragma unroll
      for (int c = 0; c < DCH; ++c)
        tma_load_4d(a.sdO0 + s * Smem::kQBytes + c * BM * 128, a.tmdO, bar_full(s), c * 64, head, m * BM, a.batch);
      const size_t row_off = (static_cast<size_t>(a.batch) * p.h + head) * p.s_pad + static_cast<size_t>(m) * BM;
      bulk_g2s(a.sL0 + s * Smem::kRowBytes, p.lse2 + row_off, Smem::kRowBytes, bar_full(s));
      bulk_g2s(a.sDs0 + s * Smem::kRowBytes, p.dsum + row_off, Smem::kRowBytes, bar_full(s));
      if constexpr (DQ_Q) {
        bulk_wait_group_read<0>();  // the Q tile's staged dQ_part read
        load_q();
      }
    }
  }
  if constexpr (DQ_Q) {
    for (int j = it < STAGES ? 0 : it - STAGES; j < it; ++j) {
      const uint32_t use = j / STAGES + 1;
      mbar_wait<true>(bar_empty(j % STAGES), (use & 1u) ^ 1u);
      reduce_dq(j);
    }
    // The reduces read this CTA's shared memory: complete before the CTA exits.
    bulk_wait_group<0>();
  }
}


__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// ---- DET variant: the dQ turn counters (see "Variant DET" at the top) ----
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Bidirectional generic <-> async proxy fence for global memory.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// One thread waits until the counter shows `turn`, i.e. every earlier adder's
// reduces have completed and been released; then its own reduces (async
// proxy) may follow. Watchdog as in mbar_wait<false>, the consumer side's
// (with a __trap path here ptxas spilled ~700 bytes and serialised the wgmmas):
// after 2^26 polls (each an L2 round trip: seconds, where a legitimate wait is
// at most the time a predecessor needs to reach this query tile) it gives up
// and returns false; the caller reports NaN dK and stops taking turns.
__device__ __forceinline__ bool dq_wait_turn(const int* cnt, int turn) {
  uint32_t polls = 0;
  while (ld_acquire_gpu(cnt) != turn) {
    if (++polls == (1u << 26)) return false;
  }
  fence_proxy_async_global();
  return true;
}

// ------------------------------------------------------------- preprocess
// Rows of the preprocess per warp: a row of O and of dO is D / 8 lanes' 16-byte loads (d = 64: 8
// lanes, so 4 rows per warp; d = 128: 2; d = 256: 1). One row per warp at d = 64 gave each lane a
// 4-byte load and the kernel took 114 us on the benchmark's shapes where cuDNN's took 70 (bench_gpu.py
// --profile, 2026-12-01); 16-byte loads reach the DRAM rate at every d.
template <int D>
constexpr int kBwdPreRowsPerWarp = 256 / D;

// Per (b, h, row < s_pad): a group of D / 8 lanes reads its row of O and dO (8 elements each per
// lane, one vector load), zeroes the row's dQ accumulator slice (two 16-byte stores per lane), and
// sums Dsum across the group by shuffles. s_pad is a multiple of 128, so a warp's rows are all in
// range or all out (the early return is warp-uniform); rows i >= s in range take part in the
// shuffles with zeros. bwd_sm90_prepare checks the 16-byte alignment this needs. The body of
// bwd_pre_kernel and bwd_pre_det_kernel.
template <typename T, int D>
__device__ __forceinline__ void bwd_pre_rows(const void* o_, const void* dout_, const float* lse, float* lse2,
                                             float* dsum, float* dq_acc, int b, int s, int h, int s_pad) {
  constexpr int PER = 8;
  constexpr int LPR = D / PER;  // lanes per row
  static_assert(LPR * kBwdPreRowsPerWarp<D> == 32, "a warp covers whole rows");
  const T* o = static_cast<const T*>(o_);
  const T* dout = static_cast<const T*>(dout_);
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int sub = lane % LPR;
  const long long row = warp * kBwdPreRowsPerWarp<D> + lane / LPR;
  const long long total = static_cast<long long>(b) * h * s_pad;
  if (warp * kBwdPreRowsPerWarp<D> >= total) return;
  const int i = static_cast<int>(row % s_pad);
  const long long bh = row / s_pad;
  const int hh = static_cast<int>(bh % h);
  const int bb = static_cast<int>(bh / h);
  const bool valid = i < s;
  float acc = 0.f;
  if (valid) {
    const size_t base = ((static_cast<size_t>(bb) * s + i) * h + hh) * D + sub * PER;
    const uint4 ov = *reinterpret_cast<const uint4*>(o + base);
    const uint4 dv = *reinterpret_cast<const uint4*>(dout + base);
    T oe[PER], de[PER];
    memcpy(oe, &ov, sizeof(uint4));
    memcpy(de, &dv, sizeof(uint4));
#pragma unroll
    for (int e = 0; e < PER; ++e) {
      if constexpr (std::is_same<T, __half>::value) {
        acc = fmaf(__half2float(oe[e]), __half2float(de[e]), acc);
      } else {
        acc = fmaf(__bfloat162float(oe[e]), __bfloat162float(de[e]), acc);
      }
    }
    *reinterpret_cast<float4*>(dq_acc + base) = make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(dq_acc + base + 4) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int off = LPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (sub == 0) {
    if (valid) {
      dsum[row] = acc;
      const float l = lse[bh * s + i];
      lse2[row] = (l == -INFINITY) ? INFINITY : l * 1.4426950408889634f;
    } else {
      dsum[row] = 0.f;
      lse2[row] = INFINITY;
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(256) bwd_pre_kernel(const void* o_, const void* dout_, const float* lse, float* lse2,
                                                      float* dsum, float* dq_acc, int b, int s, int h, int s_pad) {
  bwd_pre_rows<T, D>(o_, dout_, lse, lse2, dsum, dq_acc, b, s, h, s_pad);
}

// DET variant (bwd_sm90_dqtma_det_kernel): also zeroes the n_cnt dQ turn
// counters, so that every call and every CUDA-graph replay starts from turn 0
// without a memset of its own.
template <typename T, int D>
__global__ void __launch_bounds__(256)
    bwd_pre_det_kernel(const void* o_, const void* dout_, const float* lse, float* lse2, float* dsum, float* dq_acc,
                       int b, int s, int h, int s_pad, int* dq_cnt, long long n_cnt) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_cnt;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    dq_cnt[i] = 0;
  bwd_pre_rows<T, D>(o_, dout_, lse, lse2, dsum, dq_acc, b, s, h, s_pad);
}

// ------------------------------------------------------------ postprocess
template <typename T>
__global__ void __launch_bounds__(256) bwd_post_kernel(const float* dq_acc, void* dq_, long long n4, float scale) {
  T* dq = static_cast<T*>(dq_);
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(dq_acc)[i];
    uint2 w;
    if constexpr (std::is_same<T, __half>::value) {
      w.x = pack2<true>(v.x * scale, v.y * scale);
      w.y = pack2<true>(v.z * scale, v.w * scale);
    } else {
      w.x = pack2<false>(v.x * scale, v.y * scale);
      w.y = pack2<false>(v.z * scale, v.w * scale);
    }
    reinterpret_cast<uint2*>(dq)[i] = w;
  }
}

// A consumer's fp32 dQ_part fragments (64 query rows x 8 NJ columns: thread rows
// 16 warp + r0 (+ 8), columns 8j + 2qd (+1)) -> a shared staging tile of NJ / 4 boxes of
// [64 rows][32 fp32] (128 B rows, 128B swizzle: 16-byte chunk index XOR row & 7), box j / 4
// at stg + (j / 4) * 8 KB, the layout of the tmdQ map's box for cp.reduce.async.bulk.tensor.
// Fragment j of thread (r0, qd) belongs in chunk (2 (j % 4) + qd / 2) ^ r0. Stored in j order,
// a half-warp's 16 64-bit stores would hit only 8 distinct 8-byte bank slots (lanes (r0, qd)
// and (r0 ^ 1, qd ^ 2) collide: a 2-way conflict, Nsight Compute's 4 wavefronts per store
// instead of 2); so in store j the threads with qd >= 2 write fragment j ^ 2 (same box), whose
// chunk (2 (j % 4) ^ 4 + 1) ^ r0 lies in the other half of the row: 16 distinct slots.
template <int NJ>
__device__ __forceinline__ void stage_dq_part(uint32_t stg, int warp, int r0, int qd, const float* dq) {
  const uint32_t trow = stg + (warp * 16 + r0) * 128 + (qd & 1) * 8;
  const bool hi = qd >= 2;
  const int x = (hi ? 5 : 0) ^ r0;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const uint32_t addr = trow + (j >> 2) * (64 * 128) + hf * (8 * 128) + (((2 * (j & 3)) ^ x) << 4);
      const int f = 4 * j + 2 * hf, g = 4 * (j ^ 2) + 2 * hf;
      st_shared_v2_f32(addr, hi ? dq[g] : dq[f], hi ? dq[g + 1] : dq[f + 1]);
    }
  }
}

// ------------------------------------------------------------ main kernel
// The body of both entries below. DQ_TMA = false: dQ_part goes to the fp32
// accumulator by atomicAdd(float2) (bwd_sm90_kernel, the harness's baseline).
// DQ_TMA = true (bwd_sm90_dqtma_kernel, the library's at d = 64/128): each consumer writes its
// 64 x 64 fp32 dQ_part to its own shared staging tile, laid out as two boxes of
// [64 rows][32 fp32] (128 B rows, 128B swizzle: the 16-byte chunk index XOR
// row & 7), fences (generic -> async proxy), syncs its 4 warps (named barrier
// 2 + cw) and one thread issues two TMA reduce-adds (box 32 x 1 x 64 x 1 of the
// fp32 map tmdQ over the accumulator [b, s_q, h, D]; rows >= s_q are out of
// bounds and not written) + commit. Single-buffered: that thread waits for the
// bulk group's smem reads (wait_group.read 0) before the next iteration's
// barrier 1, which every consumer thread passes before rewriting the tile.
// DET (with DQ_TMA; bwd_sm90_dqtma_det_kernel): the reduces take turns on the
// counters dq_cnt (see "Variant DET" at the top); the key tiles run in
// reverse blockIdx.x order.
template <typename T, int D, bool CAUSAL, bool DQ_TMA, bool DET = false>
__device__ __forceinline__ void bwd_sm90_main(const CUtensorMap& tmQ, const CUtensorMap& tmK, const CUtensorMap& tmV,
                                              const CUtensorMap& tmdO, const CUtensorMap* tmdQ,
                                              const BwdKParams& p, int* dq_cnt = nullptr) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr bool F16 = std::is_same<T, __half>::value;
  using Smem = BwdSmem<D, DQ_TMA>;
  constexpr int BM = Smem::BM, BN = Smem::BN, STAGES = Smem::STAGES;
  constexpr int DCH = D / 64;
  constexpr bool SPLIT_M = (BM == 128);      // dQ work split over the two consumers by rows (else by d columns)
  constexpr int NDQ = SPLIT_M ? D : D / 2;  // dQ columns per consumer
  static_assert(BN == 128, "two consumer warpgroups x 64 keys");
  static_assert(BM == 64 || BM == 128, "query tile");
  static_assert(NDQ == 64 || NDQ == 128, "dQ wgmma N (MN-major B needs whole 64-wide chunks)");
  static_assert(!DQ_TMA || NDQ == 64, "DQ_TMA staging: a 64 x 64 dQ_part per consumer");
  static_assert(!DET || DQ_TMA, "DET orders the DQ_TMA reduces");

  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023u) & ~1023u;
  uint8_t* gbase = smem_raw + (sbase - sraw);  // generic pointer to the same aligned base
  const uint32_t sK = sbase + Smem::kK;
  const uint32_t sV = sbase + Smem::kV;
  const uint32_t sQ0 = sbase + Smem::kQ;
  const uint32_t sdO0 = sbase + Smem::kdO;
  const uint32_t sdS0 = sbase + Smem::kdS;
  const uint32_t sL0 = sbase + Smem::kL;
  const uint32_t sDs0 = sbase + Smem::kDs;
  const float* gL0 = reinterpret_cast<const float*>(gbase + Smem::kL);
  const float* gDs0 = reinterpret_cast<const float*>(gbase + Smem::kDs);
  const uint32_t bar0 = sbase + Smem::kBar;
  const uint32_t bar_kv = bar0;
  auto bar_full = [&](int s) { return bar0 + 8u * (1 + s); };
  auto bar_empty = [&](int s) { return bar0 + 8u * (1 + STAGES + s); };

  const int tid = threadIdx.x;
  const int wg = warpgroup_index();
  // DET: key tiles dispatched in decreasing order, so that the tiles a CTA waits for come first.
  const BwdWork tile = bwd_work<CAUSAL, DET>(p);
  const int n_blk = tile.n_blk;
  const int hk = tile.hk;
  const int batch = tile.batch;
  const int G = p.h / p.h_kv;
  const int n_m = (p.s_q + BM - 1) / BM;
  const int m_start = CAUSAL ? min((n_blk * BN) / BM, n_m) : 0;

  if (tid == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), kBwdConsumerWarps);
    }
    mbar_fence_init();
    tma_prefetch_desc(&tmQ);
    tma_prefetch_desc(&tmK);
    tma_prefetch_desc(&tmV);
    tma_prefetch_desc(&tmdO);
    if constexpr (DQ_TMA) tma_prefetch_desc(tmdQ);
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<24>();
    if (tid == 0) {
      bwd_produce<Smem, DCH>(BwdProducerArgs{sK, sV, sQ0, sdO0, sL0, sDs0, bar0, &tmQ, &tmK, &tmV, &tmdO, n_blk, hk,
                                              batch, m_start, n_m},
                             p);
    }
    return;
  }

  // -------------------------------------------------------------- consumers
  setmaxnreg_inc<240>();
  const int cw = wg - 1;  // keys [64cw, 64cw+64) of the tile
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  const int qd = lane & 3;
  const int r0 = lane >> 2;
  // This thread's key rows (accumulator fragment rows) inside the tile: key_l, key_l + 8.
  const int key_l = cw * 64 + warp * 16 + r0;
  const int key_g = n_blk * BN + key_l;
  const float sl2 = p.scale_log2;

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    dk[i] = 0.f;
    dv[i] = 0.f;
  }

  // Watchdog give-ups (see mbar_wait) are reported as NaN dK.
  bool timed_out = !mbar_wait<false>(bar_kv, 0);
  __syncwarp();

  // DET, thread ltid 0: the turn counter of the last reduces issued and the value that releases it
  // (null: none pending).
  int* rel_cnt = nullptr;
  int rel_val = 0;

  int it = 0;
  for (int g = 0; g < G; ++g) {
    const int head = hk * G + g;
    for (int m = m_start; m < n_m; ++m, ++it) {
      const int s = it % STAGES;
      const uint32_t ph = (it / STAGES) & 1u;
      const uint32_t sQ = sQ0 + s * Smem::kQBytes;
      const uint32_t sdO = sdO0 + s * Smem::kQBytes;
      const uint32_t sdS = sdS0 + (it & 1) * Smem::kDSBytes;

      // ---------------- S^T = K Q^T, dP^T = V dO^T (64 keys x BM queries per WG)
      float sacc[BM / 2], pacc[BM / 2];
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        sacc[i] = 0.f;
        pacc[i] = 0.f;
      }
      timed_out |= !mbar_wait<false>(bar_full(s), ph);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        reg_fence(sacc[i]);
        reg_fence(pacc[i]);
      }
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < D / 16; ++k) {
        const uint32_t a_addr = sK + (k / 4) * (BN * 128) + cw * (64 * 128) + (k % 4) * 32;
        const uint32_t b_addr = sQ + (k / 4) * (BM * 128) + (k % 4) * 32;
        Wgmma<BM, F16>::ss(sacc, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
      }
#pragma unroll
      for (int k = 0; k < D / 16; ++k) {
        const uint32_t a_addr = sV + (k / 4) * (BN * 128) + cw * (64 * 128) + (k % 4) * 32;
        const uint32_t b_addr = sdO + (k / 4) * (BM * 128) + (k % 4) * 32;
        Wgmma<BM, F16>::ss(pacc, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
      }
      wgmma_commit();
      if constexpr (DET) {
        // Release the previous tile's turn while these wgmmas run: its reduces have had the
        // dV/dK wgmmas' time to complete. wait_group 0 (not .read) returns once their writes
        // are visible to this thread, and their completion implies a generic-async proxy
        // fence, so the release store publishes them at gpu scope.
        if (ltid == 0 && rel_cnt != nullptr) {
          bulk_wait_group<0>();
          st_release_gpu(rel_cnt, rel_val);
        }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        reg_fence(sacc[i]);
        reg_fence(pacc[i]);
      }

      // ---------------- P^T, dS^T (fragment: rows key_l (+8 hf), cols 8j + 2qd + e),
      // packed into 16-bit A fragments step by step (k-step t = queries 16t..16t+15,
      // same mapping as the forward's P) so the fp32 S/dP registers die early.
      const float* Ls = gL0 + s * BM;
      const float* Dss = gDs0 + s * BM;
      const bool diag = CAUSAL && (n_blk * BN + BN - 1 > m * BM);
      // Keys >= s_kv (TMA zero rows) would get P = exp2(-lse2), harmless when
      // finite (K rows are 0) but able to overflow to inf (-> NaN): mask them.
      const bool ktail = (n_blk + 1) * BN > p.s_kv;
      uint32_t pa[BM / 16][4], da[BM / 16][4];
      // P^T of accumulator element idx = 4j + 2hf + e (key key_g + 8hf, query m BM + 8j + 2qd + e):
      // masked (causal diagonal, keys past s_kv), exponentiated against the row's lse2 (l2e).
      auto p_of = [&](int j, int hf, int e, float l2e) {
        float sv = sacc[4 * j + 2 * hf + e];
        if (diag) {
          const int q = m * BM + 8 * j + 2 * qd + e;
          if (key_g + 8 * hf > q) sv = -INFINITY;
        }
        if (ktail && key_g + 8 * hf >= p.s_kv) sv = -INFINITY;
        return fast_exp2(fmaf(sv, sl2, -l2e));
      };
      // dS^T -> smem [key][query], 64-query chunks of [BN][64] (128 B rows, 128B swizzle).
      // Fragment word i of step t: key key_l + 8*(i&1), queries 16t + 8*(i>>1) + 2qd (+1).
      auto store_ds = [&](int t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = 16 * t + 8 * (i >> 1) + 2 * qd;
          const int kl = key_l + 8 * (i & 1);
          const int cc = c & 63;
          const uint32_t addr =
              sdS + (c >> 6) * (BN * 128) + kl * 128 + ((((cc >> 3) ^ (kl & 7)) & 7) << 4) + (cc & 7) * 2;
          st_shared_b32(addr, da[t][i]);
        }
      };
      // dV += P^T dO: P^T from registers (RS), dO MN-major through trans-b.
      auto issue_dv = [&]() {
#pragma unroll
        for (int t = 0; t < BM / 16; ++t) {
          const uint32_t b_addr = sdO + t * (16 * 128);
          Wgmma<D, F16>::rs(dv, pa[t], make_smem_desc(b_addr, BM * 128, 1024), 1);
        }
      };
#pragma unroll
      for (int t = 0; t < BM / 16; ++t) {
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 2 * t + jj;
          const float2 l2 = *reinterpret_cast<const float2*>(Ls + 8 * j + 2 * qd);
          const float2 dd = *reinterpret_cast<const float2*>(Dss + 8 * j + 2 * qd);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int idx = 4 * j + 2 * hf + e;
              const float pv = p_of(j, hf, e, e ? l2.y : l2.x);
              sacc[idx] = pv;
              pacc[idx] = pv * (pacc[idx] - (e ? dd.y : dd.x));
            }
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pa[t][i] = pack2<F16>(sacc[8 * t + 2 * i], sacc[8 * t + 2 * i + 1]);
          da[t][i] = pack2<F16>(pacc[8 * t + 2 * i], pacc[8 * t + 2 * i + 1]);
        }
        store_ds(t);
      }
      fence_proxy_async_smem();
      if constexpr (DQ_TMA) {
        // The previous iteration's dQ reduces have read this consumer's staging
        // tile; the barrier below publishes that to the consumer's threads.
        if (ltid == 0) bulk_wait_group_read<0>();
      }
      named_bar_sync(1, 256);  // both consumers' halves of dS^T are in smem

      // ---------------- dQ_part = dS K ; dV += P^T dO ; dK += dS^T Q
      float dq[NDQ / 2];
#pragma unroll
      for (int i = 0; i < NDQ / 2; ++i) dq[i] = 0.f;
#pragma unroll
      for (int i = 0; i < NDQ / 2; ++i) reg_fence(dq[i]);
#pragma unroll
      for (int i = 0; i < D / 2; ++i) {
        reg_fence(dk[i]);
        reg_fence(dv[i]);
      }
#pragma unroll
      for (int t = 0; t < BM / 16; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          reg_fence(pa[t][i]);
          reg_fence(da[t][i]);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < BN / 16; ++t) {
        // A = dS (M = queries, M-major): one 64-query chunk; B = K (N = d, N-major).
        const uint32_t a_addr = sdS + (SPLIT_M ? cw * (BN * 128) : 0) + t * (16 * 128);
        const uint32_t b_addr = sK + (SPLIT_M ? 0 : cw * (NDQ / 64) * (BN * 128)) + t * (16 * 128);
        WgmmaTT<NDQ, F16>::ss(dq, make_smem_desc(a_addr, BN * 128, 1024), make_smem_desc(b_addr, BN * 128, 1024),
                              t > 0 ? 1 : 0);
      }
      wgmma_commit();
      issue_dv();
#pragma unroll
      for (int t = 0; t < BM / 16; ++t) {
        const uint32_t b_addr = sQ + t * (16 * 128);
        Wgmma<D, F16>::rs(dk, da[t], make_smem_desc(b_addr, BM * 128, 1024), 1);
      }
      wgmma_commit();
      wgmma_wait<1>();  // dQ group done
#pragma unroll
      for (int i = 0; i < NDQ / 2; ++i) reg_fence(dq[i]);

      if constexpr (DQ_TMA) {
        // dQ partial -> this consumer's staging tile (two boxes) -> TMA reduce-adds.
        const uint32_t stg = sbase + Smem::kStg + cw * Smem::kStgBytes;
        stage_dq_part<NDQ / 8>(stg, warp, r0, qd, dq);
        fence_proxy_async_smem();
        // This consumer's 4 warps have written the tile (barrier 2 + cw; literal ids,
        // so that ptxas counts 4 barriers rather than all 16 for a register id).
        if (cw == 0)
          named_bar_sync(2, 128);
        else
          named_bar_sync(3, 128);
        if (ltid == 0) {
          const int col0 = SPLIT_M ? 0 : cw * NDQ;
          const int row0 = m * BM + (SPLIT_M ? cw * 64 : 0);
          if constexpr (DET) {
            // Key tiles n_last(m), n_last(m) - 1, ..., 0 add into query tile m in this order.
            const int n_kt = static_cast<int>(gridDim.x);  // key tiles
            const int n_last = CAUSAL ? min(n_kt - 1, m * BM / BN) : n_kt - 1;
            const int turn = n_last - n_blk;
            int* cnt = dq_cnt + ((static_cast<size_t>(batch) * p.h + head) * n_m + m) * 2 + cw;
            // After a give-up (here or in mbar_wait) the results are garbage anyway: stop
            // waiting, so that a protocol bug costs one timeout per consumer, not one per tile.
            if (!timed_out) timed_out = !dq_wait_turn(cnt, turn);
            rel_cnt = cnt;
            rel_val = turn + 1;
          }
          reduce_dq_part<NDQ / 32>(tmdQ, stg, col0, head, row0, batch);
        }
      } else {
        // dQ partial -> fp32 accumulator (rows: queries; cols: d).
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int qrow = m * BM + (SPLIT_M ? cw * 64 : 0) + warp * 16 + r0 + 8 * hf;
          if (qrow < p.s_q) {
            float* dst = p.dq_acc + ((static_cast<size_t>(batch) * p.s_q + qrow) * p.h + head) * D +
                         (SPLIT_M ? 0 : cw * NDQ) + 2 * qd;
#pragma unroll
            for (int j = 0; j < NDQ / 8; ++j)
              atomicAdd(reinterpret_cast<float2*>(dst + 8 * j),
                        make_float2(dq[4 * j + 2 * hf], dq[4 * j + 2 * hf + 1]));
          }
        }
      }

      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < D / 2; ++i) {
        reg_fence(dk[i]);
        reg_fence(dv[i]);
      }
      // All wgmma reading stage s (Q, dO) have completed in this warp.
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty(s));
    }
  }

  // The reduces read this CTA's shared memory: complete them before exit. With DET first, since
  // the next CTA's turn waits on the release; otherwise after the dK / dV stores, which they overlap.
  if constexpr (DQ_TMA && DET) {
    if (ltid == 0) bulk_wait_group<0>();
    if (ltid == 0 && rel_cnt != nullptr) st_release_gpu(rel_cnt, rel_val);  // the last tile's turn
  }

  // ---------------------------------------------------------------- epilogue
  T* dkp = reinterpret_cast<T*>(p.dk);
  T* dvp = reinterpret_cast<T*>(p.dv);
  const float ks = timed_out ? __int_as_float(0x7fffffff) : p.scale;
  // dk, dv are contiguous bshd: rows D elements apart, so only the bases decide the 16-byte path.
  const bool vec16 = rows_16b_aligned<T>(p.dk, 0, 0, 0) && rows_16b_aligned<T>(p.dv, 0, 0, 0);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = key_g + 8 * hf;
    const bool active = key < p.s_kv;
    const size_t off = ((static_cast<size_t>(batch) * p.s_kv + (active ? key : 0)) * p.h_kv + hk) * D;
    store_frag_row<T, D>(dkp + off, dk, hf, ks, qd, vec16, active);
    store_frag_row<T, D>(dvp + off, dv, hf, 1.f, qd, vec16, active);
  }
  if constexpr (DQ_TMA && !DET) {
    if (ltid == 0) bulk_wait_group<0>();
  }
#endif
}

template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                    const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                    const BwdKParams p) {
  bwd_sm90_main<T, D, CAUSAL, false>(tmQ, tmK, tmV, tmdO, nullptr, p);
}

// DQ_TMA variant: tmdQ = fp32 map over p.dq_acc, box 32 x 1 x 64 x 1, 128B swizzle.
template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_dqtma_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                          const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                          const BwdKParams p, const __grid_constant__ CUtensorMap tmdQ) {
  bwd_sm90_main<T, D, CAUSAL, true>(tmQ, tmK, tmV, tmdO, &tmdQ, p);
}

// DET variant (deterministic dQ): as the DQ_TMA kernel, plus dq_cnt, the turn counters of
// bwd_sm90_det_workspace_bytes (zeroed by bwd_pre_det_kernel).
template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_dqtma_det_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                              const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                              const BwdKParams p, const __grid_constant__ CUtensorMap tmdQ, int* dq_cnt) {
  bwd_sm90_main<T, D, CAUSAL, true, true>(tmQ, tmK, tmV, tmdO, &tmdQ, p, dq_cnt);
}

}  // namespace hopper
}  // namespace fusedattn

// d = 256 main kernel (uses the definitions above; defines BwdSmemD256 and
// bwd_sm90_d256_kernel for the host code below).
#include "bwd_sm90_d256.cuh"

namespace fusedattn {
namespace hopper {

// =================================================================== host

inline int bwd_sm90_s_pad(int s_q) { return (s_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad; }

inline size_t bwd_sm90_workspace_bytes(int b, int s_q, int h, int d) {
  const size_t nacc = static_cast<size_t>(b) * s_q * h * d;
  const size_t nrow = static_cast<size_t>(b) * h * bwd_sm90_s_pad(s_q);
  return (nacc + 2 * nrow) * sizeof(float) + 256;
}

// DET variant (d = 64, 128): one int32 turn counter per (batch, head, query tile, consumer),
// placed after the bwd_sm90_workspace_bytes() bytes of the other variants.
inline long long bwd_sm90_det_counters(int b, int s_q, int h, int d) {
  const int bm = d == 64 ? BwdTile<64>::BM : BwdTile<128>::BM;
  return static_cast<long long>(b) * h * ((s_q + bm - 1) / bm) * 2;
}
inline size_t bwd_sm90_det_workspace_bytes(int b, int s_q, int h, int d) {
  return bwd_sm90_workspace_bytes(b, s_q, h, d) +
         static_cast<size_t>(bwd_sm90_det_counters(b, s_q, h, d)) * sizeof(int);
}

struct BwdLaunch {
  CUtensorMap tq, tk, tv, tdo;
  CUtensorMap tdq;  // DQ_TMA only: fp32 map over p.dq_acc
  BwdKParams p;
  const void *o, *dout;
  const float* lse;
  void* dq;
  dim3 grid;
  int smem;
  int pre_blocks, post_blocks;
  long long n4;
  void (*pre)(const void*, const void*, const float*, float*, float*, float*, int, int, int, int);
  void (*kern)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, BwdKParams);
  // DQ_TMA only (else null): launched instead of kern, with tdq as the last argument.
  void (*kern_dq)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, BwdKParams, CUtensorMap) = nullptr;
  void (*post)(const float*, void*, long long, float);
  // DET only (else null): launched instead of pre and kern_dq, with the n_cnt turn counters dq_cnt.
  void (*pre_det)(const void*, const void*, const float*, float*, float*, float*, int, int, int, int, int*,
                  long long) = nullptr;
  void (*kern_det)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, BwdKParams, CUtensorMap, int*) = nullptr;
  int* dq_cnt = nullptr;
  long long n_cnt = 0;
};

// DQ_TMA = true: the dQ-by-TMA-reduce main kernel; DET = true (with DQ_TMA, d = 64 / 128): its
// deterministic variant, a.ws of bwd_sm90_det_workspace_bytes().
template <typename T, int D, bool DQ_TMA = false, bool DET = false>
inline cudaError_t bwd_sm90_prepare(BwdLaunch* L, const Sm90BwdArgs& a) {
  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  static_assert(!DET || (DQ_TMA && D != 256), "DET: a DQ_TMA variant at d = 64, 128");
  using Tile = BwdTile<D>;
  if (a.b <= 0 || a.s_q <= 0 || a.s_kv <= 0 || a.h <= 0 || a.h_kv <= 0 || a.h % a.h_kv != 0 || a.h_kv > 65535 ||
      a.b > 65535)
    return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v) |
       reinterpret_cast<uintptr_t>(a.o) | reinterpret_cast<uintptr_t>(a.dout) | reinterpret_cast<uintptr_t>(a.ws) |
       reinterpret_cast<uintptr_t>(a.dq)) &
      15)
    return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(a.dk) | reinterpret_cast<uintptr_t>(a.dv)) & 3) return cudaErrorInvalidValue;
  const int s_pad = bwd_sm90_s_pad(a.s_q);
  auto desc = [](const void* ptr, BshdStrides st, int b, int s, int h) {
    if (st.b == 0 && st.s == 0 && st.h == 0) st = BshdStrides{int64_t{s} * h * D, int64_t{h} * D, D};
    return detail::MapDesc{ptr, b, s, h, D, st.b, st.s, st.h};
  };
  const detail::MapDesc mq = desc(a.q, a.q_strides, a.b, a.s_q, a.h);
  const detail::MapDesc mdo = desc(a.dout, BshdStrides{}, a.b, a.s_q, a.h);
  const detail::MapDesc mk = desc(a.k, a.k_strides, a.b, a.s_kv, a.h_kv);
  const detail::MapDesc mv = desc(a.v, a.v_strides, a.b, a.s_kv, a.h_kv);
  if (!detail::make_map<T>(&L->tq, mq, Tile::BM) || !detail::make_map<T>(&L->tdo, mdo, Tile::BM) ||
      !detail::make_map<T>(&L->tk, mk, Tile::BN) || !detail::make_map<T>(&L->tv, mv, Tile::BN))
    return cudaErrorInvalidValue;
  float* ws = static_cast<float*>(a.ws);
  const size_t nacc = static_cast<size_t>(a.b) * a.s_q * a.h * D;
  const size_t nrow = static_cast<size_t>(a.b) * a.h * s_pad;
  BwdKParams& p = L->p;
  p.dq_acc = ws;
  p.lse2 = ws + nacc;
  p.dsum = ws + nacc + nrow;
  p.dk = a.dk;
  p.dv = a.dv;
  p.b = a.b;
  p.s_q = a.s_q;
  p.s_kv = a.s_kv;
  p.h = a.h;
  p.h_kv = a.h_kv;
  p.s_pad = s_pad;
  p.scale = a.scale;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  const int n_kt = (a.s_kv + Tile::BN - 1) / Tile::BN;
  // DET keeps its own order (bwd_tile_idx).
  p.causal_chunk = DET ? 1 : causal_chunk_for(a.causal, a.causal_chunk, n_kt, int64_t{a.h_kv} * a.b, a.sm_count);
  L->o = a.o;
  L->dout = a.dout;
  L->lse = a.lse;
  L->dq = a.dq;
  L->grid = dim3(n_kt, a.h_kv, a.b);
  if constexpr (D == 256) {
    L->smem = BwdSmemD256::kTotal;
  } else {
    L->smem = BwdSmem<D, DQ_TMA>::kTotal;
  }
  const long long rows = static_cast<long long>(a.b) * a.h * s_pad;
  constexpr int kPreRowsPerBlock = 8 * kBwdPreRowsPerWarp<D>;  // 8 warps of 256 threads
  L->pre_blocks = static_cast<int>((rows + kPreRowsPerBlock - 1) / kPreRowsPerBlock);
  L->n4 = static_cast<long long>(nacc / 4);
  L->post_blocks = static_cast<int>(std::min<long long>((L->n4 + 255) / 256, 132LL * 16));
  L->pre = bwd_pre_kernel<T, D>;
  L->post = bwd_post_kernel<T>;
  L->kern_dq = nullptr;
  L->pre_det = nullptr;
  L->kern_det = nullptr;
  L->dq_cnt = nullptr;
  L->n_cnt = 0;
  if constexpr (D == 256 && DQ_TMA) {
    if (!detail::make_dq_acc_map(&L->tdq, p.dq_acc, a.b, a.s_q, a.h, D)) return cudaErrorInvalidValue;
    L->kern = nullptr;
    L->kern_dq = a.causal ? bwd_sm90_d256_dqtma_kernel<T, true> : bwd_sm90_d256_dqtma_kernel<T, false>;
  } else if constexpr (D == 256) {
    L->kern = a.causal ? bwd_sm90_d256_kernel<T, true> : bwd_sm90_d256_kernel<T, false>;
  } else if constexpr (DQ_TMA) {
    if (!detail::make_dq_acc_map(&L->tdq, p.dq_acc, a.b, a.s_q, a.h, D)) return cudaErrorInvalidValue;
    L->kern = nullptr;
    if constexpr (DET) {
      L->kern_det = a.causal ? bwd_sm90_dqtma_det_kernel<T, D, true> : bwd_sm90_dqtma_det_kernel<T, D, false>;
      L->pre = nullptr;
      L->pre_det = bwd_pre_det_kernel<T, D>;
      L->dq_cnt = reinterpret_cast<int*>(static_cast<char*>(a.ws) + bwd_sm90_workspace_bytes(a.b, a.s_q, a.h, D));
      L->n_cnt = bwd_sm90_det_counters(a.b, a.s_q, a.h, D);
    } else {
      L->kern_dq = a.causal ? bwd_sm90_dqtma_kernel<T, D, true> : bwd_sm90_dqtma_kernel<T, D, false>;
    }
  } else {
    L->kern = a.causal ? bwd_sm90_kernel<T, D, true> : bwd_sm90_kernel<T, D, false>;
  }
  static std::atomic<uint64_t> raised[2];  // per instantiation of this function: causal or not
  const void* main_kern = DET      ? reinterpret_cast<const void*>(L->kern_det)
                          : DQ_TMA ? reinterpret_cast<const void*>(L->kern_dq)
                                   : reinterpret_cast<const void*>(L->kern);
  return detail::raise_smem_limit(main_kern, L->smem, raised[a.causal ? 1 : 0]);
}

// preprocess + main + postprocess on one stream.
inline cudaError_t bwd_sm90_launch(const BwdLaunch& L, cudaStream_t stream = 0) {
  const BwdKParams& p = L.p;
  if (L.pre_det)
    L.pre_det<<<L.pre_blocks, 256, 0, stream>>>(L.o, L.dout, L.lse, const_cast<float*>(p.lse2),
                                                const_cast<float*>(p.dsum), p.dq_acc, p.b, p.s_q, p.h, p.s_pad,
                                                L.dq_cnt, L.n_cnt);
  else
    L.pre<<<L.pre_blocks, 256, 0, stream>>>(L.o, L.dout, L.lse, const_cast<float*>(p.lse2),
                                            const_cast<float*>(p.dsum), p.dq_acc, p.b, p.s_q, p.h, p.s_pad);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (L.kern_det)
    L.kern_det<<<L.grid, dim3(kBwdThreads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.tdo, L.p, L.tdq, L.dq_cnt);
  else if (L.kern_dq)
    L.kern_dq<<<L.grid, dim3(kBwdThreads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.tdo, L.p, L.tdq);
  else
    L.kern<<<L.grid, dim3(kBwdThreads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.tdo, L.p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (L.n4 > 0) L.post<<<L.post_blocks, 256, 0, stream>>>(p.dq_acc, L.dq, L.n4, p.scale);
  return cudaGetLastError();
}

// The library's Hopper backward: DQ_TMA (see above); DET = true (d = 64, 128): its deterministic
// variant (a.ws of bwd_sm90_det_workspace_bytes()).
template <typename T, int D, bool DQ_TMA = true, bool DET = false>
inline cudaError_t bwd_sm90(const Sm90BwdArgs& a, cudaStream_t stream = 0) {
  BwdLaunch L;
  cudaError_t e = bwd_sm90_prepare<T, D, DQ_TMA, DET>(&L, a);
  if (e != cudaSuccess) return e;
  return bwd_sm90_launch(L, stream);
}

}  // namespace hopper
}  // namespace fusedattn
