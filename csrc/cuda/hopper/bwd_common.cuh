// The Hopper (sm_90a) backward's shared roles: the shared-memory layout, the CTA's work, the
// producer, the dQ staging and reduce-adds and the deterministic mode's turn-taking. Two main
// kernels use them: bwd_kernel.cuh (d = 64, 128: each consumer warpgroup owns 64 keys and the whole
// head dim) and bwd_kernel_d256.cuh (d = 256: the consumers split the head dim); bwd_prepost.cuh has
// the pre- and postprocess, bwd_launch.cuh launches.
//
//   q, dO, o [b, s_q, h, d]; k, v [b, s_kv, h_kv, d]; lse fp32 [b, h, s_q]; q, k, v and dO through
//   tensor maps with their own strides, o and the gradients contiguous bshd. GQA: a CTA walks all
//   the query heads of its group, so dK / dV need no cross-CTA reduction. Main kernel: one CTA per
//   (key tile, kv head, batch), 384 threads: warpgroup 0 the producer (one thread: K, V once, then
//   Q, dO, lse2, Dsum of each query tile through a STAGES-deep ring), warpgroups 1, 2 the consumers
//   (dV += P^T dO, dK += dS^T Q in registers; dQ_part = dS K staged in shared memory and
//   reduce-added into the fp32 accumulator by TMA). Varlen: varlen.cuh's prologue builds each
//   sequence's maps; the mask hides a tile's rows past its sequence.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "epilogue.cuh"
#include "mask.cuh"
#include "varlen.cuh"  // seq_map
#include "softmax.cuh"  // softcap_tanh
#include "params.h"
#include "ptx_sm90.cuh"
#include "tile_scheduler.cuh"
#include "tuning.h"
#include "wgmma.cuh"

namespace fusedattn {
namespace hopper {

constexpr int kBwdThreads = 384;
constexpr int kBwdConsumerWarps = 8;
// setmaxnreg: the producer warpgroup's and each consumer warpgroup's share of the CTA's pool.
constexpr int kBwdProducerRegs = 24, kBwdConsumerRegs = 240;
static_assert(128 * kBwdProducerRegs + 256 * kBwdConsumerRegs <= kBwdThreads * launch_regs(kBwdThreads),
              "setmaxnreg pool (ptx_sm90.cuh's launch_regs)");
// The end-of-CTA timeout vote (ptx_sm90.cuh's timeout_vote) of the consumers and the producer's
// first warp; the main kernels' own named barriers are 1-5.
constexpr int kBwdTimeoutBar = 6, kBwdTimeoutVoters = 256 + 32;

// A main kernel's shared memory: K, V; STAGES x (Q, dO); kTileBufs 16-bit [BM][BN] tiles (dS^T, or
// P and dS, each double-buffered by iteration parity); STAGES x (lse2, Dsum) row slices; the
// barriers; with kStaging one fp32 64 x 64 dQ_part staging tile per consumer (single-buffered).
// Tiles read by wgmma or TMA start on 1024-byte swizzle atoms.
template <int D_, int kTileBufs, bool kStaging, bool VARLEN = false>
struct BwdSmemLayout {
  static constexpr int D = D_;
  using Tile = BwdTile<D>;
  static constexpr int BM = Tile::BM, BN = Tile::BN, STAGES = Tile::STAGES;
  static constexpr int kKVBytes = BN * D * 2;    // one of K, V
  static constexpr int kQBytes = BM * D * 2;     // one of Q, dO (per stage)
  static constexpr int kTileBytes = BM * BN * 2;  // one 16-bit [BM][BN] tile
  // One lse2 / Dsum slice: BM rows, varlen BM + 4 from the 4-aligned row below the first.
  static constexpr int kRowFloats = VARLEN ? BM + 4 : BM;
  static constexpr int kRowBytes = kRowFloats * 4;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKVBytes;
  static constexpr int kQ = kV + kKVBytes;
  static constexpr int kdO = kQ + STAGES * kQBytes;
  static constexpr int kTiles = kdO + STAGES * kQBytes;
  static constexpr int kL = kTiles + kTileBufs * kTileBytes;
  static constexpr int kDs = kL + STAGES * kRowBytes;
  static constexpr int kBar = kDs + STAGES * kRowBytes;
  // The barriers, then 8 bytes for the deterministic mode's ticket (bwd_kernel_body).
  static constexpr int kBarBytes = 8 * (1 + 2 * STAGES) + 8;
  static constexpr int kStgBytes = 64 * 64 * 4;  // one consumer's dQ_part staging tile
  static constexpr int kStg = ((kBar + kBarBytes + 1023) / 1024) * 1024;
  // + 1024 slack for aligning the dynamic shared-memory base to the swizzle atom
  static constexpr int kTotal = kStaging ? kStg + 2 * kStgBytes + 1024 : kBar + ((kBarBytes + 127) / 128) * 128 + 1024;
  static_assert(kV % 1024 == 0 && kQ % 1024 == 0 && kdO % 1024 == 0 && kTiles % 1024 == 0 && kTileBytes % 1024 == 0,
                "swizzle atoms 1024-aligned");
  static_assert(kL % 16 == 0 && kRowBytes % 16 == 0 && kBar % 8 == 0, "bulk-copy and barrier alignment");
  static_assert(BM <= kBwdRowPad, "row slices inside the padded lse2 / Dsum rows");
  static_assert(kTotal <= 227 * 1024, "shared memory");
};

// The shared-memory pieces both main kernels have, from the 1024-aligned base sbase (Smem gives
// the offsets): K, V, the Q / dO ring, the lse2 / Dsum row slices, and the barriers (K / V full,
// then STAGES full and STAGES empty ring barriers).
template <class Smem>
struct BwdShared {
  uint32_t sK, sV, sQ0, sdO0, sL0, sDs0;
  uint32_t bar0;
  __device__ __forceinline__ uint32_t bar_kv() const { return bar0; }
  __device__ __forceinline__ uint32_t bar_full(int s) const { return bar0 + 8u * (1 + s); }
  __device__ __forceinline__ uint32_t bar_empty(int s) const { return bar0 + 8u * (1 + Smem::STAGES + s); }
};
template <class Smem>
__device__ __forceinline__ BwdShared<Smem> bwd_shared(uint32_t sbase) {
  BwdShared<Smem> sh;
  sh.sK = sbase + Smem::kK;
  sh.sV = sbase + Smem::kV;
  sh.sQ0 = sbase + Smem::kQ;
  sh.sdO0 = sbase + Smem::kdO;
  sh.sL0 = sbase + Smem::kL;
  sh.sDs0 = sbase + Smem::kDs;
  sh.bar0 = sbase + Smem::kBar;
  return sh;
}

// A CTA's work: key tile n_blk of K / V head hk and batch (tile_scheduler.cuh's bwd_work; ticket: the
// deterministic mode's), the G query heads of the group, and the query tiles [m_start, m_end) of each
// that the key tile meets, of n_m. Its sequence (varlen: from cu_seqlens; else the call's lengths):
// the lengths, the row of its key 0 in dk / dv (kv_row0), its query rows in the workspace (row
// batch, and q_row0 from that (batch, head)'s first; thd: batch 0, from the token), the 4-aligned
// slices' shift and the tensor maps' batch coordinate.
struct BwdCta {
  int n_blk, hk, batch, G, n_m, m_start, m_end;
  int len_q, len_kv, row_shift, map_batch, row_batch;
  int64_t kv_row0, q_row0;
};
template <int BM, int BN, bool DET, class Mask>
__device__ __forceinline__ BwdCta bwd_cta(const BwdKParams& p, const Mask& mask, int ticket) {
  const BwdWork tile = bwd_work<Mask::CAUSAL, DET>(p, ticket);
  BwdCta c;
  c.n_blk = tile.n_blk;
  c.hk = tile.hk;
  c.batch = tile.batch;
  c.G = p.h / p.h_kv;
  c.n_m = (p.s_q + BM - 1) / BM;
  c.len_q = p.s_q;
  c.len_kv = p.s_kv;
  c.row_shift = 0;
  c.map_batch = c.batch;
  c.row_batch = c.batch;
  c.kv_row0 = static_cast<int64_t>(c.batch) * p.s_kv;
  c.q_row0 = 0;
  if constexpr (Mask::VARLEN) {
    const gpu::SeqSpan sp = gpu::seq_span(p.seq, c.batch);
    c.len_q = sp.len_q;
    c.len_kv = sp.len_kv;
    c.map_batch = 0;
    if (p.seq.seqlens.kv_is_thd) c.kv_row0 = sp.tok_kv;
    if (p.seq.seqlens.q_is_thd) c.row_batch = 0;
    c.q_row0 = sp.tok_q;  // 0 but for thd
    c.row_shift = static_cast<int>(sp.tok_q & 3);
  }
  const TileRange r = mask.seq(c.len_q, c.len_kv).template query_tiles<BM, BN>(c.n_blk, c.n_m);
  c.m_start = r.first;
  c.m_end = r.first + r.count;
  return c;
}

// Thread 0 initialises the barriers, prefetches the tensor maps and, given a ticket counter (the
// deterministic mode), draws the CTA's ticket into *ticket_smem; the whole CTA syncs, so that no
// thread waits on a barrier before its init and every thread sees the ticket.
template <class Smem>
__device__ __forceinline__ void bwd_cta_start(const BwdShared<Smem>& sh, const CUtensorMap& tmQ,
                                              const CUtensorMap& tmK, const CUtensorMap& tmV,
                                              const CUtensorMap& tmdO, const CUtensorMap* tmdQ,
                                              int* ticket_counter, int* ticket_smem) {
  if (threadIdx.x == 0) {
    if (ticket_counter != nullptr) *ticket_smem = atomicAdd(ticket_counter, 1);
    mbar_init(sh.bar_kv(), 1);
    for (int s = 0; s < Smem::STAGES; ++s) {
      mbar_init(sh.bar_full(s), 1);
      mbar_init(sh.bar_empty(s), kBwdConsumerWarps);
    }
    mbar_fence_init();
    tma_prefetch_desc(&tmQ);
    tma_prefetch_desc(&tmK);
    tma_prefetch_desc(&tmV);
    tma_prefetch_desc(&tmdO);
    tma_prefetch_desc(tmdQ);
  }
  __syncthreads();
}

// A consumer's start: its dK / dV accumulators zeroed, then its wait for K and V. Returns whether
// the wait gave up (mbar_wait's watchdog; voted at the end of the CTA, kBwdTimeoutBar).
template <int N, class Smem>
__device__ __forceinline__ bool bwd_consumer_start(float (&dk)[N], float (&dv)[N], const BwdShared<Smem>& sh) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    dk[i] = 0.f;
    dv[i] = 0.f;
  }
  const bool timed_out = !mbar_wait<false>(sh.bar_kv(), 0);
  __syncwarp();
  return timed_out;
}

// The epilogue: a consumer thread's dK (times scale) and dV rows key_of(0) and key_of(1) (its
// accumulator fragment rows), N columns (the whole head dim, or consumer cw's N-column part when
// N < D), as 16-bit values; keys >= keys.n are not stored, nor columns past the problem's head dims
// DQK (dK) and DV (dV). dk, dv are contiguous ([b, s_kv] or thd [t_kv] rows of h_kv heads; keys.tok
// the row of key 0): rows DQK / DV elements apart (multiples of 8), so only the bases decide the
// 16-byte path.
template <typename T, int D, int N, int DQK = D, int DV = D, class KeyOf>
__device__ __forceinline__ void bwd_store_dkdv(const BwdKParams& p, const float (&dk)[N / 2], const float (&dv)[N / 2],
                                               KeyOf&& key_of, int hk, const OutRows& keys, int cw, int qd) {
  T* dkp = reinterpret_cast<T*>(p.dk);
  T* dvp = reinterpret_cast<T*>(p.dv);
  const float ks = p.scale;
  const bool vec16 = rows_16b_aligned<T>(p.dk, 0, 0, 0) && rows_16b_aligned<T>(p.dv, 0, 0, 0);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = key_of(hf);
    const bool active = key < keys.n;
    const int col0 = N < D ? cw * N : 0;
    const size_t row = static_cast<size_t>(keys.tok + (active ? key : 0)) * p.h_kv + hk;
    if constexpr (DQK == D && DV == D) {
      store_frag_row<T, N>(dkp + row * D + col0, dk, hf, ks, qd, vec16, active);
      store_frag_row<T, N>(dvp + row * D + col0, dv, hf, 1.f, qd, vec16, active);
    } else {
      store_frag_row<T, N>(dkp + row * DQK + col0, dk, hf, ks, qd, vec16, active, DQK - col0);
      store_frag_row<T, N>(dvp + row * DV + col0, dv, hf, 1.f, qd, vec16, active, DV - col0);
    }
  }
}

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

// The producer warpgroup's work, the same for both main kernels: one thread TMA-loads the CTA's K
// and V tiles once (barrier bar0), then streams (Q, dO, lse2 row slice, Dsum row slice) of every
// query tile of every query head of the KV group through the STAGES-deep ring (full barrier
// bar0 + 8(1 + s), empty barrier bar0 + 8(1 + STAGES + s)). Smem supplies the tile shape and byte
// sizes; DCH is the number of 64-wide head-dim chunks (one TMA box each). Addresses are
// shared-space.
//
// DQ_Q (the d = 256 kernel, bwd_kernel_d256.cuh): consumer 1 stages its fp32
// dQ_part columns [128, 256) of each iteration in that iteration's Q tile and releases the stage
// without reducing; this thread reduce-adds the staged tile into tmdQ (the fp32 accumulator's map)
// once the stage's empty barrier completes, starts the stage's dO refill (dO holds consumer 0's
// dQ_part, whose reduces consumer 0 has waited for), and refills Q once the reduces have read it.
// So no consumer waits for those reads, and the refill waits for them only where it must. After
// the last refill it waits for the stages still in use and reduces them, then for completion.
struct BwdProducerArgs {
  uint32_t sK, sV, sQ0, sdO0, sL0, sDs0, bar0;
  const CUtensorMap *tmQ, *tmK, *tmV, *tmdO;
  int n_blk, hk, batch;  // the CTA's key tile, KV head, batch coordinate of its maps
  int m_start, m_end;    // its query tiles [m_start, m_end)
  const CUtensorMap* tmdQ;  // DQ_Q only
  int row_batch;            // BwdCta's: its lse2 / Dsum rows
  int64_t q_row0;
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
  const int per_head = a.m_end - a.m_start;
  const auto reduce_dq = [&](int j) {
    // Consumer 1's half: columns [DCH * 32, DCH * 64), DCH boxes of 32.
    reduce_dq_part<DCH>(a.tmdQ, a.sQ0 + (j % STAGES) * Smem::kQBytes, DCH * 32, a.hk * G + j / per_head,
                        (a.m_start + j % per_head) * BM, a.batch);
  };
  int it = 0;
  for (int g = 0; g < G; ++g) {
    const int head = a.hk * G + g;
    for (int m = a.m_start; m < a.m_end; ++m, ++it) {
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
      size_t row_off = (static_cast<size_t>(a.row_batch) * p.h + head) * p.s_pad + a.q_row0 +
                       static_cast<size_t>(m) * BM;
      if constexpr (Smem::kRowFloats != BM) row_off &= ~size_t{3};  // varlen: 16-byte aligned slices
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


// The main kernels' shared body: the shared-memory carve-up, the CTA's work, the barrier init, the
// producer warpgroup, then the consumer role (Consumer::consume: bwd_kernel.cuh's and
// bwd_kernel_d256.cuh's), which gets the pieces in a BwdCtx.
template <class Smem, class Mask>
struct BwdCtx {
  const BwdShared<Smem>& sh;
  uint32_t sbase;
  const float *gL0, *gDs0;  // the lse2 / Dsum slices, generic pointers
  const Mask& mask;
  const BwdCta& cta;
  // The consumer thread: warpgroup cw (0, 1), its thread ltid, warp, lane, quad lane qd and
  // fragment row r0 (lane / 4).
  int cw, ltid, warp, lane, qd, r0;
};
template <class Consumer>
__device__ __forceinline__ void bwd_kernel_body(const CUtensorMap& tmQ, const CUtensorMap& tmK, const CUtensorMap& tmV,
                                                const CUtensorMap& tmdO, const CUtensorMap* tmdQ, const BwdKParams& p,
                                                int* dq_cnt) {
  using Smem = typename Consumer::Smem;
  using Mask = typename Consumer::Mask;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023u) & ~1023u;
  uint8_t* gbase = smem_raw + (sbase - sraw);  // generic pointer to the same aligned base
  const BwdShared<Smem> sh = bwd_shared<Smem>(sbase);
  const float* gL0 = reinterpret_cast<const float*>(gbase + Smem::kL);
  const float* gDs0 = reinterpret_cast<const float*>(gbase + Smem::kDs);

  const int tid = threadIdx.x;
  const int wg = warpgroup_index();
  const Mask mask = Mask::of(p);
  constexpr bool DET = Consumer::DET;
  // The deterministic mode's ticket counter follows the dQ turn counters (one per batch, head,
  // query tile and consumer).
  int* const ticket_counter =
      DET ? dq_cnt + static_cast<size_t>(p.b) * p.h * ((p.s_q + Smem::BM - 1) / Smem::BM) * 2 : nullptr;
  int* const ticket_smem = reinterpret_cast<int*>(gbase + Smem::kBar + Smem::kBarBytes - 8);
  BwdCta cta;
  if constexpr (!DET) {
    cta = bwd_cta<Smem::BM, Smem::BN, DET>(p, mask, 0);
    if (Mask::VARLEN && cta.n_blk * Smem::BN >= cta.len_kv) return;  // past the sequence's keys: nothing to do
  }
  bwd_cta_start(sh, tmQ, tmK, tmV, tmdO, tmdQ, ticket_counter, ticket_smem);
  if constexpr (DET) {
    cta = bwd_cta<Smem::BM, Smem::BN, DET>(p, mask, *ticket_smem);
    if (Mask::VARLEN && cta.n_blk * Smem::BN >= cta.len_kv) return;  // (no turn of any query tile is its)
  }
  // The maps of the CTA's tiles: varlen, its sequence's (varlen.cuh); every thread that issues TMA
  // through one acquires it first.
  const CUtensorMap *mq = &tmQ, *mk = &tmK, *mv = &tmV, *mdo = &tmdO, *mdq = tmdQ;
  if constexpr (Mask::VARLEN) {
    const auto map = [&](int i) {
      return static_cast<const CUtensorMap*>(seq_map(p.seq_maps, kBwdSeqMaps, cta.batch, i));
    };
    mq = map(kMapQ);
    mk = map(kMapK);
    mv = map(kMapV);
    mdo = map(kMapDO);
    mdq = map(kMapDQ);
  }
  // The CTA's rule: varlen, its sequence's lengths.
  const Mask smask = mask.seq(cta.len_q, cta.len_kv);

  if (wg == 0) {
    setmaxnreg_dec<kBwdProducerRegs>();
    if (tid < 32) {
      if (tid == 0) {
        if constexpr (Mask::VARLEN) {
          tensormap_acquire(mq);
          tensormap_acquire(mk);
          tensormap_acquire(mv);
          tensormap_acquire(mdo);
          tensormap_acquire(mdq);
        }
        bwd_produce<Smem, Smem::D / 64, Consumer::kDqInQ>(
            BwdProducerArgs{sh.sK, sh.sV, sh.sQ0, sh.sdO0, sh.sL0, sh.sDs0, sh.bar0, mq, mk, mv, mdo, cta.n_blk, cta.hk,
                            cta.map_batch, cta.m_start, cta.m_end, mdq, cta.row_batch, cta.q_row0},
            p);
      }
      __syncwarp();
      timeout_trap<kBwdTimeoutBar, kBwdTimeoutVoters>();
    }
    return;
  }
  setmaxnreg_inc<kBwdConsumerRegs>();
  const int cw = wg - 1;
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  if (Mask::VARLEN && ltid == 0) tensormap_acquire(mdq);  // the consumer's reduce-adds
  Consumer::consume(BwdCtx<Smem, Mask>{sh, sbase, gL0, gDs0, smask, cta, cw, ltid, warp, lane, lane & 3, lane >> 2},
                    mdq, p, dq_cnt);
}

// Deterministic mode (DET, d = 64 / 128): the reduce-adds into each (batch, head, query tile m)
// take turns in a fixed order of key tiles, so every dQ element sums its terms in one order
// whatever the CTAs' timing (dK, dV are per-CTA register sums and already reproducible).
//  * Order: key tiles n_last(m), n_last(m) - 1, ..., 0 (n_last: the mask's last key tile that
//    meets m), the key tiles taken in decreasing order (tile_scheduler.cuh's bwd_work). In that
//    order the tile a CTA waits for (n + 1) reaches every m earlier and was taken earlier, so in
//    steady state nobody waits; in increasing order every CTA of a group would wait for tile 0,
//    which reaches the later query tiles last (causally).
//  * Counters: one int32 per (batch, head, m, consumer) after the workspace
//    (bwd_sm90_det_workspace_bytes), then the ticket counter, all zeroed by the preprocess. One per
//    consumer because the two consumers' dQ_parts of an iteration are disjoint, so ordering each
//    consumer's reduces on its own fixes the order for every element, with no barrier between the
//    consumers.
//  * Protocol (the consumer's issuing thread): after the staging barrier it polls the counter with
//    ld.acquire.gpu until it equals its turn, executes fence.proxy.async.global, issues and
//    commits its reduces. The release is deferred to the next tile, right after that tile's
//    S^T / dP^T wgmmas are issued (or to after the loop), so the reduces complete under other
//    work: wait_group 0 (writes done and visible to the thread; a bulk completion implies a
//    generic-async proxy fence), then st.release.gpu of turn + 1.
//  * Deadlock freedom: a CTA takes its key tile from a ticket drawn on arrival (an atomic counter,
//    as csrc/cuda/tc's deterministic dQ does), not from blockIdx, whose start order CUDA does not
//    promise. Its waits are then on CTAs with lower tickets, which were running when it drew its
//    own, and a consumer releases a tile's turn before it waits for its next one, so every wait
//    ends. A protocol bug instead meets the watchdog (dq_wait_turn gives up), and the CTA's
//    timeout vote fails the launch: never plausible numbers.
//
// One thread waits until the counter shows `turn`, i.e. every earlier adder's reduces have
// completed and been released; then its own reduces (async proxy) may follow. Watchdog as in
// mbar_wait<false> (a __trap path would make ptxas spill and serialise the wgmmas): after 2^26
// polls (each an L2 round trip: seconds, where a legitimate wait is at most the time a predecessor
// needs to reach this query tile) it gives up and returns false; the caller stops taking turns and
// votes the timeout at the end of the CTA (kBwdTimeoutBar), which fails the launch.
__device__ __forceinline__ bool dq_wait_turn(const int* cnt, int turn) {
  uint32_t polls = 0;
  while (ld_acquire_gpu(cnt) != turn) {
    if (++polls == (1u << 26)) return false;
  }
  fence_proxy_async_global();
  return true;
}

// A consumer's fp32 dQ_part fragments (64 query rows x 8 NJ columns: thread rows
// 16 warp + r0 (+ 8), columns 8j + 2qd (+1)) -> a shared staging tile of NJ / 4 boxes of
// [64 rows][32 fp32] (128 B rows, 128B swizzle: 16-byte chunk index XOR row & 7), box j / 4
// at stg + (j / 4) * 8 KB, the layout of the tmdQ map's box for cp.reduce.async.bulk.tensor.
// Fragment j of thread (r0, qd) belongs in chunk (2 (j % 4) + qd / 2) ^ r0. Stored in j order,
// a half-warp's 16 64-bit stores would hit only 8 distinct 8-byte bank slots (lanes (r0, qd)
// and (r0 ^ 1, qd ^ 2) collide: a 2-way conflict, 4 wavefronts per store instead of 2); so in
// store j the threads with qd >= 2 write fragment j ^ 2 (same box), whose chunk (2 (j % 4) ^ 4 + 1) ^ r0 lies in the other half of the row: 16 distinct slots.
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

}  // namespace hopper
}  // namespace fusedattn
