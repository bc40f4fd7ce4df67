// The Hopper (sm_90a) forward kernel: one template composed of a tile configuration (Cfg: element
// type, head dim, consumer warpgroups, tile and ring sizes, per-warpgroup options; tuning.h picks
// them), a tile scheduler (Sched: one tile per CTA, persistent or varlen; tile_scheduler.cuh) and the
// features it computes (Feat, features.h: the mask kind, varlen), with the roles of fwd_mainloop.cuh
// (producer, consumers), mask.cuh, softmax.cuh and epilogue.cuh; varlen.cuh builds a varlen call's
// per-sequence tensor maps before it.
//
//   q [b, s_q, h, d], k / v [b, s_kv, h_kv, d], o like q, lse fp32 [b, h, s_q] (natural log), each
//   through its own (b, s, h) element strides with a unit head-dim stride. GQA: h % h_kv == 0.
//
// CTA = 1 + NCONS warpgroups, one CTA per SM (shared memory): warpgroup 0 is the producer (24
// registers per thread; one thread issues every TMA load), warpgroups 1..NCONS the consumers (the
// rest of the register file), each owning 64 query rows of the BM = 64 NCONS row tile. Shared
// memory: QBUF Q slots, the K and V rings, the barriers; tiles are stored as 64-column (128-byte)
// chunks, each a [rows][64] block with the TMA / wgmma 128B swizzle (ptx_sm90.cuh).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "features.h"
#include "fwd_mainloop.cuh"
#include "kernels.h"
#include "params.h"
#include "tile_scheduler.cuh"
#include "tma_host.h"
#include "tuning.h"
#include "varlen.cuh"

namespace fusedattn {
namespace hopper {

// A forward tile configuration (see tuning.h's FwdTileConfig for the values and their reasons).
template <typename T_, int D_, int NCONS_, int BN_, int STAGES_, bool PP_, bool SKIP_>
struct FwdConfig {
  using T = T_;
  static constexpr int D = D_, NCONS = NCONS_, BN = BN_, STAGES = STAGES_;
  static constexpr bool PP = PP_, SKIP = SKIP_;
};
// The configuration tuning.h gives a head dim, consumer count and causality.
template <typename T, int D, int NCONS, bool CAUSAL>
using FwdConfigFor = FwdConfig<T, D, NCONS, FwdTileConfig<D, NCONS, CAUSAL>::BN, FwdTileConfig<D, NCONS, CAUSAL>::STAGES,
                               FwdTileConfig<D, NCONS, CAUSAL>::PP, FwdTileConfig<D, NCONS, CAUSAL>::SKIP>;

// Everything the roles read at compile time: the configuration, what the scheduler and the features
// imply, the thread and register split, and the shared-memory layout.
template <class Cfg, class Sched, class Feat>
struct FwdTraits : Cfg {
  using T = typename Cfg::T;
  using Scheduler = Sched;
  using Pos = typename Sched::Pos;
  using Mask = TileMask<Feat::MASK, Feat::VARLEN>;
  static constexpr bool GENERAL = Feat::GENERAL, SOFTCAP = Feat::SOFTCAP, VARLEN = Feat::VARLEN;
  static constexpr int DQK = Feat::template DQK_OF<Cfg::D>, DV = Feat::template DV_OF<Cfg::D>;  // the problem's
  static constexpr int D = Cfg::D, NCONS = Cfg::NCONS, BN = Cfg::BN, STAGES = Cfg::STAGES;
  static constexpr bool kPersistent = Sched::kPersistent;
  static constexpr bool F16 = std::is_same<T, __half>::value;
  static constexpr int BM = 64 * NCONS;
  // The widths the GEMMs and buffers take (the tile's D for the plain kernels): S = Q K^T contracts
  // over QKW = DQK rounded up to a k-step (16), Q and K are stored QW = DQK rounded up to a 128-byte
  // chunk (64) wide, and O, V and the PV GEMM's N are VW = DV rounded up to a chunk, so a head dim
  // below the tile's pays for its own columns only (192 / 128: 12 k-steps of S and N = 128 of O,
  // not 16 and 256).
  static constexpr int QKW = (DQK + 15) / 16 * 16, QW = (DQK + 63) / 64 * 64, VW = (DV + 63) / 64 * 64;
  static constexpr int kThreads = 128 * (NCONS + 1), kConsumerWarps = 4 * NCONS;
  // setmaxnreg within the CTA's pool (ptx_sm90.cuh's launch_regs): the producer takes 24, or for
  // general masks (their key-tile ranges: ptxas spills the producer at 24) 40 with two consumers
  // (every count from 25 to 40 leaves them 232) and 32 with three (160 each, as the plain kernel's),
  // the consumers what the pool has left.
  static constexpr int kLaunchRegs = launch_regs(kThreads);
  static constexpr int kProducerRegs = Feat::GENERAL ? (NCONS == 3 ? 32 : 40) : 24;
  static constexpr int kConsumerRegs = ((NCONS + 1) * kLaunchRegs - kProducerRegs) / NCONS / 8 * 8;
  static constexpr bool QREG = fwd_q_in_registers(D, BN, NCONS, Sched::kPersistent);
  // A persistent CTA's consumers release each Q slot for the producer's next tiles.
  static constexpr bool Q_EMPTY = Sched::kPersistent;
  // Rebuilt per tile as warp-uniform values, the K / V ring bases stay in uniform registers in the
  // two-consumer persistent kernel (else ptxas rebuilt its d = 256 descriptors in vector registers).
  static constexpr bool kUniformRing = Sched::kPersistent && NCONS == 2;
  // A consumer thread's rows: computed once per CTA with two consumers, per tile with three
  // (consume_tile).
  static constexpr bool kRowsHeld = NCONS == 2;
  static constexpr int kQBytes = BM * QW * 2, kKBytes = BN * QW * 2, kVBytes = BN * VW * 2;
  static constexpr int kSmemLimit = 232448;  // 227 KB of dynamic shared memory per block
  static constexpr int total(int qbuf) {
    return qbuf * kQBytes + STAGES * (kKBytes + kVBytes) +
           ((8 * ((Q_EMPTY ? 2 : 1) * qbuf + 4 * STAGES) + 127) / 128) * 128 + 1024;  // + alignment slack
  }
  // Persistent: two Q slots where they fit (the next tile's Q is loaded while this one runs).
  static constexpr int QBUF = Sched::kPersistent && total(2) <= kSmemLimit ? 2 : 1;
  using Bars = FwdBarriers<QBUF, STAGES, Q_EMPTY>;
  static constexpr int kKOffset = QBUF * kQBytes;
  static constexpr int kBarOffset = kKOffset + STAGES * (kKBytes + kVBytes);
  static constexpr int kTotal = total(QBUF);
  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  static_assert(tile_head_dim(DQK, DV) == D, "the problem's head dims belong to this tile");
  static_assert(NCONS == 2 || NCONS == 3, "consumer warpgroups (turn and vote barrier ids)");
  static_assert(NCONS == 2 || D == 64, "three consumers: d = 64 (registers)");
  static_assert(BM <= 256, "TMA box rows");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N / PV k-steps");
  static_assert((BN * 128) % 1024 == 0 && kQBytes % 1024 == 0, "chunks start on 1024-byte swizzle atoms");
  static_assert(STAGES >= 2, "ring depth");  // one slot would expose every load's latency
  static_assert(kTotal <= kSmemLimit, "dynamic shared memory");
  static_assert(!Feat::GENERAL || !Cfg::SKIP, "general masks: no SKIP (mask.cuh's n_key_tiles_of_rows)");
  static_assert(kProducerRegs * 128 + NCONS * kConsumerRegs * 128 <= kThreads * kLaunchRegs, "setmaxnreg pool");
  static_assert(!VARLEN || Sched::kPersistent, "varlen: VarlenScheduler");
};

template <class Cfg, class Sched, class Feat>
__global__ void __launch_bounds__(FwdTraits<Cfg, Sched, Feat>::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                    const __grid_constant__ CUtensorMap tmV, const KParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using K = FwdTraits<Cfg, Sched, Feat>;
  using Pos = typename K::Pos;
  constexpr int BM = K::BM, BN = K::BN;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sQ0 = (sraw + 1023u) & ~1023u;
  const uint32_t sK0 = sQ0 + K::kKOffset;
  const uint32_t sV0 = sK0 + K::STAGES * K::kKBytes;
  const typename K::Bars bars{sQ0 + K::kBarOffset};

  const int tid = threadIdx.x;
  const int wg = warpgroup_index();
  const typename K::Mask mask = K::Mask::of(p);
  const Sched sched = Sched::template make<BM, BN>(p, mask);

  // Thread 0 initialises the barriers and prefetches the tensor maps; the whole CTA syncs, so that
  // no thread waits on a barrier before its init.
  if (tid == 0) {
    bars.init(K::kConsumerWarps);
    tma_prefetch_desc(&tmQ);
    tma_prefetch_desc(&tmK);
    tma_prefetch_desc(&tmV);
  }
  __syncthreads();

  constexpr int kVoters = K::NCONS * 128 + 32;  // the consumers and the producer's first warp
  if (wg == 0) {
    setmaxnreg_dec<K::kProducerRegs>();
    if (tid < 32) {
      if (tid == 0) {
        const FwdProducerIo io{&tmQ, &tmK, &tmV, sQ0, sK0, sV0};
        Pos kv = 0;  // the ring position of the tile's first key tile
        sched.template for_each<BM, BN>(p, mask, [&](const FwdWork& w, uint32_t j, bool) {
          if constexpr (K::VARLEN) {
            // The tile's sequence's maps, batch coordinate 0 (varlen.cuh).
            FwdProducerIo sio = io;
            sio.tmQ = static_cast<const CUtensorMap*>(seq_map(p.seq_maps, kFwdSeqMaps, w.batch, kMapQ));
            sio.tmK = static_cast<const CUtensorMap*>(seq_map(p.seq_maps, kFwdSeqMaps, w.batch, kMapK));
            sio.tmV = static_cast<const CUtensorMap*>(seq_map(p.seq_maps, kFwdSeqMaps, w.batch, kMapV));
            tensormap_acquire(sio.tmQ);
            tensormap_acquire(sio.tmK);
            tensormap_acquire(sio.tmV);
            FwdWork sw = w;
            sw.batch = 0;
            produce_tile<K>(sio, bars, sw, kv, j);
          } else {
            produce_tile<K>(io, bars, w, kv, j);
          }
          kv += w.n_blocks;
        });
      }
      __syncwarp();
      timeout_trap<kFwdTimeoutBar, kVoters>();
    }
    return;
  }

  setmaxnreg_inc<K::kConsumerRegs>();
  const int cw = wg - 1;
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  const int qd = lane & 3;
  // The thread's first row: fixed for a one-tile CTA; a persistent CTA adds each tile's first row.
  const int row0 = sched.template fixed_row0<BM>() + cw * 64 + warp * 16 + (lane >> 2);
  const int wg_row0 = sched.template fixed_row0<BM>() + cw * 64;
  // O's alignment once per CTA, in a uniform register: tested in the tile loop it reloads O's strides
  // from the parameter bank every tile, and held as a bool it takes a vector register (the d = 256
  // general kernels then spill).
  const uint32_t o_vec16 = warp_uniform_here(rows_16b_aligned<typename K::T>(p.o, p.o_sb, p.o_ss, p.o_sh));
  const ConsumerThread th{cw, warp, lane, qd, row0, o_vec16};
  // The last consumer hands consumer 0 the first turn of the CTA.
  if (K::PP && cw == K::NCONS - 1) pass_turn<K::NCONS>(cw);
  float sacc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) sacc[i] = 0.f;
  bool timed_out = false;  // sticky for the CTA's life; voted at its end
  Pos kv = 0;
  sched.template for_each<BM, BN>(p, mask, [&](const FwdWork& w, uint32_t j, bool last) {
    FwdConsumerIo<K> io;
    if (K::kRowsHeld) {
      io.row_base = Sched::kPersistent ? w.m_blk * BM + row0 : row0;
      io.wg_row0 = Sched::kPersistent ? w.m_blk * BM + wg_row0 : wg_row0;
    }
    const uint32_t qs = j % K::QBUF;
    io.sQ = K::Q_EMPTY ? warp_uniform_here(sQ0 + qs * K::kQBytes) : sQ0;
    io.sK0 = K::kUniformRing ? warp_uniform_here(sK0) : sK0;
    io.sV0 = K::kUniformRing ? warp_uniform_here(sV0) : sV0;
    io.q_full = bars.qf(qs);
    io.q_phase = (j / K::QBUF) & 1u;
    io.q_empty = bars.qe(qs);
    io.kv = kv;
    // The epilogue's stores run while the producer's next loads are in flight and the other
    // consumers issue their GEMMs.
    consume_tile<K>(p, mask, w, io, bars, th, sacc, timed_out, last);
    kv += w.n_blocks;
    if (Sched::kPersistent) __syncwarp();  // reconverge (row < s_q) before the next tile's .aligned ops
  });
  // A wait that gave up (mbar_wait's watchdog) fails the launch, through the producer's trap.
  timeout_vote<kFwdTimeoutBar, kVoters>(timed_out);
#endif
}

// =================================================================== host
// A prepared launch: the tensor maps encoded, the kernel's shared-memory limit raised; launching is
// then a bare kernel launch.
struct FwdLaunch {
  CUtensorMap tq, tk, tv;
  KParams p;
  dim3 grid;
  int smem, threads;
  void (*kern)(CUtensorMap, CUtensorMap, CUtensorMap, KParams);
  // Varlen: the prologue that builds the sequences' maps and writes the rows no sequence owns.
  bool varlen = false;
  VarlenPrologue pro;
  int sm_count = 0;
};

// A varlen call's maps (varlen.cuh): the templates as the kernel's tq, tk, tv and in the prologue,
// which rebases them per sequence into the workspace and zero-fills out (lse -inf) where no sequence
// owns a row.
template <class K>
inline bool fwd_prepare_varlen(FwdLaunch* L, const Sm90Args& a) {
  using T = typename K::T;
  const KParams& p = a.out;
  VarlenPrologue& pro = L->pro;
  pro = VarlenPrologue{};
  if (!varlen_map<T>(&L->tq, &pro.map[kMapQ], a.q, false, K::BM) ||
      !varlen_map<T>(&L->tk, &pro.map[kMapK], a.k, true, K::BN) ||
      !varlen_map<T>(&L->tv, &pro.map[kMapV], a.v, true, K::BN))
    return false;
  pro.tmpl[kMapQ] = L->tq;
  pro.tmpl[kMapK] = L->tk;
  pro.tmpl[kMapV] = L->tv;
  pro.n_maps = kFwdSeqMaps;
  pro.maps = seq_map_slots(a.ws);
  pro.fill[0] = RowFill{static_cast<char*>(p.o), p.o_sb * int64_t{sizeof(T)}, p.o_ss * int64_t{sizeof(T)},
                        p.o_sh * int64_t{sizeof(T)}, p.h, K::DV * static_cast<int>(sizeof(T)), false};
  pro.n_fill = 1;
  pro.lse = p.lse;
  pro.lse_sb = p.lse_sb;
  pro.lse_sh = p.lse_sh;
  pro.lse_ss = p.lse_ss;
  pro.lse_heads = p.h;
  pro.seq = p.seq;
  pro.nseq = p.b;
  L->varlen = true;
  L->sm_count = a.sm_count;
  L->p.seq_maps = pro.maps;
  return true;
}

// Returns cudaErrorInvalidValue on arguments the kernel does not take or a failed map encode.
template <class Cfg, class Sched, class Feat = PlainFeatures<Sched::CAUSAL>>
inline cudaError_t fwd_prepare(FwdLaunch* L, const Sm90Args& a) {
  using K = FwdTraits<Cfg, Sched, Feat>;
  const KParams& p = a.out;
  if (p.b <= 0 || p.s_q <= 0 || p.s_kv <= 0 || p.h <= 0 || p.h_kv <= 0 || p.h % p.h_kv != 0 || a.q.d != K::DQK ||
      a.k.d != K::DQK || a.v.d != K::DV)
    return cudaErrorInvalidValue;
  if (Sched::kPersistent) {
    // The kernel's tile indices (up to one round past the last) must fit in int.
    const int64_t n_tiles = static_cast<int64_t>((p.s_q + K::BM - 1) / K::BM) * p.h * p.b;
    if (a.sm_count <= 0 || n_tiles + 2LL * a.sm_count > 0x7fffffffLL) return cudaErrorInvalidValue;
  } else if (p.h > 65535 || p.b > 65535) {
    return cudaErrorInvalidValue;
  }
  // TMA needs 16-byte aligned base addresses; the epilogue stores 4-byte pairs.
  if ((reinterpret_cast<uintptr_t>(a.q.ptr) | reinterpret_cast<uintptr_t>(a.k.ptr) |
       reinterpret_cast<uintptr_t>(a.v.ptr)) & 15)
    return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(p.o) & 3) return cudaErrorInvalidValue;
  L->p = p;
  if constexpr (K::VARLEN) {
    // The fills store 16-byte vectors; the maps need the workspace.
    if (a.ws == nullptr || (reinterpret_cast<uintptr_t>(p.o) & 15) || (p.o_sb | p.o_ss | p.o_sh) % 8 != 0 ||
        !fwd_prepare_varlen<K>(L, a))
      return cudaErrorInvalidValue;
  } else if (!detail::make_map<typename K::T>(&L->tq, a.q, K::BM) ||
             !detail::make_map<typename K::T>(&L->tk, a.k, K::BN) ||
             !detail::make_map<typename K::T>(&L->tv, a.v, K::BN)) {
    return cudaErrorInvalidValue;
  }
  if (!Sched::kPersistent) {
    L->p.causal_chunk =
        causal_chunk_for(a.causal, a.causal_chunk, (p.s_q + K::BM - 1) / K::BM, int64_t{p.h} * p.b, a.sm_count);
  }
  L->grid = Sched::grid(p, K::BM, a.sm_count);
  L->smem = K::kTotal;
  L->threads = K::kThreads;
  L->kern = fwd_sm90_kernel<Cfg, Sched, Feat>;
  static std::atomic<uint64_t> raised;  // per instantiation: devices whose limit is raised
  return gpu::raise_smem_once(reinterpret_cast<const void*>(L->kern), static_cast<size_t>(L->smem), &raised);
}

inline cudaError_t fwd_launch(const FwdLaunch& L, cudaStream_t stream) {
  if (L.varlen) {
    const cudaError_t e = varlen_prologue(L.pro, L.sm_count, stream);
    if (e != cudaSuccess) return e;
  }
  L.kern<<<L.grid, dim3(L.threads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.p);
  return cudaGetLastError();
}

// One CTA per query tile, the configuration tuning.h gives (T, D, NCONS) and the call's causality.
template <typename T, int D, int NCONS>
inline cudaError_t fwd_prepare_one_tile(FwdLaunch* L, const Sm90Args& a) {
  if (a.causal) return fwd_prepare<FwdConfigFor<T, D, NCONS, true>, OneTileScheduler<true>>(L, a);
  return fwd_prepare<FwdConfigFor<T, D, NCONS, false>, OneTileScheduler<false>>(L, a);
}

// Persistent on a.sm_count CTAs; causally with the tile order tuning.h's choose_v3_schedule picks.
template <typename T, int D, int NCONS>
inline cudaError_t fwd_prepare_persistent(FwdLaunch* L, const Sm90Args& a) {
  if (!a.causal) return fwd_prepare<FwdConfigFor<T, D, NCONS, false>, PersistentScheduler<false, kTilesPlain>>(L, a);
  using Cfg = FwdConfigFor<T, D, NCONS, true>;
  V3Grid gr;
  gr.bm = 64 * NCONS;
  gr.bn = Cfg::BN;
  gr.n_m = (a.out.s_q + gr.bm - 1) / gr.bm;
  gr.n_hb = int64_t{a.out.h} * a.out.b;
  gr.s_kv = a.out.s_kv;
  gr.g = a.sm_count;
  if (choose_v3_schedule(gr) == V3Schedule::kSnakeHeadMajor)
    return fwd_prepare<Cfg, PersistentScheduler<true, kTilesSnakeHeadMajor>>(L, a);
  return fwd_prepare<Cfg, PersistentScheduler<true, kTilesSnake>>(L, a);
}

// =================================================================== entries (kernels.h)
// Instantiated one per line of kernels.list (generated/).
// Prepare and launch.
inline cudaError_t fwd_run(cudaError_t (*prepare)(FwdLaunch*, const Sm90Args&), const Sm90Args& a,
                           cudaStream_t stream) {
  FwdLaunch L;
  const cudaError_t e = prepare(&L, a);
  if (e != cudaSuccess) return e;
  return fwd_launch(L, stream);
}
template <typename T, int D>
cudaError_t run_fwd_one_tile(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run(fwd_prepare_one_tile<T, D, 2>, a, stream);
}
template <typename T, int D>
cudaError_t run_fwd_persistent(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run(fwd_prepare_persistent<T, D, 2>, a, stream);
}
template <typename T>
cudaError_t run_fwd_three_consumer(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run(fwd_prepare_one_tile<T, 64, 3>, a, stream);
}
template <typename T>
cudaError_t run_fwd_three_consumer_persistent(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run(fwd_prepare_persistent<T, 64, 3>, a, stream);
}
// The general kernel (features.h) for head dims DQK, DV, on the tile of features.h's tile_head_dim:
// persistent, NCONS consumers (their tiles without SKIP, which general masks lack), the tiles longest
// first (snake).
template <typename T, int DQK, int DV, bool SOFTCAP, int NCONS>
inline cudaError_t fwd_prepare_general_on(FwdLaunch* L, const Sm90Args& a) {
  constexpr int D = tile_head_dim(DQK, DV);
  using Tile = FwdTileConfig<D, NCONS, true>;
  using Cfg = FwdConfig<T, D, NCONS, general_fwd_bn(D, DV, Tile::BN), Tile::STAGES, Tile::PP, false>;
  using Feat = GeneralFeatures<DQK == D ? 0 : DQK, DV == D ? 0 : DV, SOFTCAP>;
  return fwd_prepare<Cfg, PersistentScheduler<true, kTilesSnake>, Feat>(L, a);
}
// ... on tuning.h's consumer count for the call's band.
template <typename T, int DQK, int DV, bool SOFTCAP>
inline cudaError_t fwd_prepare_general(FwdLaunch* L, const Sm90Args& a) {
  constexpr int D = tile_head_dim(DQK, DV);
  if constexpr (general_fwd_may_take_three(D, SOFTCAP)) {
    static_assert(FwdTileConfig<D, 3, true>::BN == FwdTileConfig<D, 2, true>::BN, "one key tile for both counts");
    const KParams& p = a.out;
    const GeneralBand band{p.window_left, p.window_right, p.bottom_right ? int64_t{p.s_kv} - p.s_q : 0};
    if (general_fwd_consumers(D, SOFTCAP, band, FwdTileConfig<D, 3, true>::BN) == 3)
      return fwd_prepare_general_on<T, DQK, DV, SOFTCAP, 3>(L, a);
  }
  return fwd_prepare_general_on<T, DQK, DV, SOFTCAP, 2>(L, a);
}
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_fwd_general(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run(fwd_prepare_general<T, DQK, DV, SOFTCAP>, a, stream);
}
// The general kernel on per-sequence lengths (varlen.cuh), the tiles in the same order.
template <typename T, int DQK, int DV, bool SOFTCAP>
inline cudaError_t fwd_prepare_varlen_general(FwdLaunch* L, const Sm90Args& a) {
  constexpr int D = tile_head_dim(DQK, DV);
  using Feat = VarlenFeatures<DQK == D ? 0 : DQK, DV == D ? 0 : DV, SOFTCAP>;
  return fwd_prepare<FwdConfigFor<T, D, 2, true>, VarlenScheduler<kTilesSnake>, Feat>(L, a);
}
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_fwd_varlen(const Sm90Args& a, cudaStream_t stream) {
  return fwd_run(fwd_prepare_varlen_general<T, DQK, DV, SOFTCAP>, a, stream);
}

}  // namespace hopper
}  // namespace fusedattn
