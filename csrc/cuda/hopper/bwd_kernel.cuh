// The Hopper backward's main kernel at d = 64 and 128 (bwd_common.cuh has the shared roles and
// the overall design): one CTA per (key tile of BN = 128 keys, kv head, batch); consumer cw owns
// keys [64 cw, 64 cw + 64) of the tile and the whole head dim. Per query tile (BM rows):
//   S^T  = K_cw Q^T, dP^T = V_cw dO^T      wgmma SS m64nBMk16 (both K-major)
//   P^T  = exp2(S^T scale log2e - lse2[q]), masked -> 0;  dS^T = P^T (dP^T - Dsum[q])
//   P^T, dS^T -> 16-bit A fragments in registers (as the forward's P); dS^T -> shared memory,
//          [key][query] with the 128B swizzle (query-contiguous = M-major A for dQ), then a named
//          barrier over both consumers (double-buffered by iteration parity: one barrier an
//          iteration suffices)
//   dQ_part = dS K   wgmma SS, trans-a = trans-b = 1 (d = 128, BM = 64: consumer cw computes
//          dQ[:, 64 cw..] over all 128 keys; d = 64, BM = 128: dQ[64 cw.., :])
//   dV += P^T dO (RS, dO MN-major), dK += dS^T Q (RS)
//   dQ_part (64 x 64 fp32) -> this consumer's staging tile -> two TMA reduce-adds into the fp32
//          accumulator, while the dV / dK wgmmas run (wait_group 1).
// Registers per consumer thread (fp32 accumulators): d = 128: dK 64 + dV 64 + S^T 32 + dP^T 32
// (then P / dS fragments 16 + 16 and dQ 32); d = 64: dK 32 + dV 32 + S^T 64 + dP^T 64 (then 32 + 32
// fragments and dQ 32). Shared memory: about 195 KB at both head dims (BwdSmem).
#pragma once

#include "bwd_common.cuh"

namespace fusedattn {
namespace hopper {

// Two dS^T tiles and the dQ staging tiles.
template <int D, bool VARLEN = false>
using BwdSmem = BwdSmemLayout<D, 2, true, VARLEN>;

// The body of both kernels below. Each consumer writes its 64 x 64 fp32 dQ_part to its own
// staging tile, two boxes of [64 rows][32 fp32] (128 B rows, 128B swizzle), fences (generic ->
// async proxy), syncs its 4 warps (named barrier 2 + cw) and one thread issues two TMA reduce-adds
// (rows >= s_q are out of bounds and not written). Single-buffered: that thread waits for the bulk
// group's shared-memory reads (wait_group.read 0) before the next iteration's barrier 1, which every
// consumer thread passes before rewriting the tile. DET: the reduces take turns on the counters
// dq_cnt (bwd_common.cuh); the key tiles run in reverse blockIdx.x order.
template <typename T, int D, class Feat, bool DET_>
struct BwdConsumer {
  using Smem = BwdSmem<D, Feat::VARLEN>;
  using Mask = TileMask<Feat::MASK, Feat::VARLEN>;
  static constexpr bool DET = DET_, kDqInQ = false;
  static __device__ __forceinline__ void consume(const BwdCtx<Smem, Mask>& c, const CUtensorMap* tmdQ,
                                                 const BwdKParams& p, int* dq_cnt);
};

template <typename T, int D, class Feat, bool DET>
__device__ __forceinline__ void BwdConsumer<T, D, Feat, DET>::consume(const BwdCtx<Smem, Mask>& c,
                                                                     const CUtensorMap* tmdQ, const BwdKParams& p,
                                                                     int* dq_cnt) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr bool F16 = std::is_same<T, __half>::value;
  constexpr int BM = Smem::BM, BN = Smem::BN, STAGES = Smem::STAGES;
  constexpr bool SPLIT_M = (BM == 128);      // dQ work split over the two consumers by rows (else by d columns)
  constexpr int NDQ = SPLIT_M ? D : D / 2;  // dQ columns per consumer
  static_assert(BN == 128, "two consumer warpgroups x 64 keys");
  static_assert(BM == 64 || BM == 128, "query tile");
  static_assert(NDQ == 64, "staging: a 64 x 64 dQ_part per consumer");

  const auto& sh = c.sh;
  const uint32_t sbase = c.sbase, sK = sh.sK, sV = sh.sV, sQ0 = sh.sQ0, sdO0 = sh.sdO0;
  const uint32_t sdS0 = sbase + Smem::kTiles;
  const float *gL0 = c.gL0, *gDs0 = c.gDs0;
  const int n_blk = c.cta.n_blk, hk = c.cta.hk, batch = c.cta.batch, G = c.cta.G, n_m = c.cta.n_m;
  const int map_batch = c.cta.map_batch;
  const int m_start = c.cta.m_start, m_end = c.cta.m_end;
  const int cw = c.cw;  // keys [64cw, 64cw+64) of the tile
  const int ltid = c.ltid, warp = c.warp, lane = c.lane, qd = c.qd, r0 = c.r0;
  // This thread's key rows (accumulator fragment rows) inside the tile: key_l, key_l + 8.
  const int key_l = cw * 64 + warp * 16 + r0;
  const int key_g = n_blk * BN + key_l;
  // General masks: the thread's two keys' bases for mask.cuh's one-compare test.
  uint32_t kbase[2] = {0u, 0u}, kspan = 0u;
  if constexpr (Mask::GENERAL) {
    kbase[0] = c.mask.key_base(key_g);
    kbase[1] = c.mask.key_base(key_g + 8);
    kspan = c.mask.key_span();
  }
  const float sl2 = Feat::SOFTCAP ? p.softcap_log2 : p.scale_log2;  // softmax.cuh's softcap_scores

  float dk[D / 2], dv[D / 2];
  bool timed_out = bwd_consumer_start(dk, dv, sh);

  // DET, thread ltid 0: the turn counter of the last reduces issued and the value that releases it
  // (null: none pending).
  int* rel_cnt = nullptr;
  int rel_val = 0;

  int it = 0;
  for (int g = 0; g < G; ++g) {
    const int head = hk * G + g;
    for (int m = m_start; m < m_end; ++m, ++it) {
      const int s = it % STAGES;
      const uint32_t ph = (it / STAGES) & 1u;
      const uint32_t sQ = sQ0 + s * Smem::kQBytes;
      const uint32_t sdO = sdO0 + s * Smem::kQBytes;
      const uint32_t sdS = sdS0 + (it & 1) * Smem::kTileBytes;

      // ---------------- S^T = K Q^T, dP^T = V dO^T (64 keys x BM queries per WG)
      float sacc[BM / 2], pacc[BM / 2];
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        sacc[i] = 0.f;
        pacc[i] = 0.f;
      }
      timed_out |= !mbar_wait<false>(sh.bar_full(s), ph);
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
      const float* Ls = gL0 + s * Smem::kRowFloats + c.cta.row_shift;
      const float* Dss = gDs0 + s * Smem::kRowFloats + c.cta.row_shift;
      const bool diag = c.mask.crosses_diagonal(n_blk * BN + BN - 1, m * BM);
      // Keys >= s_kv (TMA zero rows) would get P = exp2(-lse2), harmless when
      // finite (K rows are 0) but able to overflow to inf (-> NaN): mask them.
      const bool ktail = c.mask.has_key_tail((n_blk + 1) * BN);
      // General masks: any score of a tile the window cuts (keys past s_kv included).
      const bool partial = c.mask.template tile_partial<BM, BN>(m * BM, n_blk * BN);
      uint32_t pa[BM / 16][4], da[BM / 16][4];
      // P^T of accumulator element idx = 4j + 2hf + e (key key_g + 8hf, query m BM + 8j + 2qd + e):
      // capped (SOFTCAP: the score's gradient factor 1 - tanh^2 into g), masked (causal diagonal,
      // keys past s_kv, a general mask), exponentiated against the row's lse2 (l2e). Varlen: a
      // hidden score gets P = 0 and g = 0 outright (then dS = 0), whatever its row's lse2 and Dsum
      // (a row past the sequence has another sequence's).
      auto p_of = [&](int j, int hf, int e, float l2e, float& g) {
        float sv = sacc[4 * j + 2 * hf + e];
        if constexpr (Feat::SOFTCAP) {
          sv = softcap_tanh(sv, p.softcap_k2);
          g = 1.f - sv * sv;
        }
        if constexpr (Mask::GENERAL) {
          const int q = m * BM + 8 * j + 2 * qd + e;
          bool hidden = !Mask::seen_from_key(kbase[hf], q, kspan);
          if constexpr (Mask::VARLEN) hidden = hidden || q >= c.mask.s_q;
          if (partial && hidden) {
            if constexpr (Mask::VARLEN) {
              g = 0.f;
              return 0.f;
            }
            sv = -INFINITY;
          }
        } else {
          if (diag) {
            const int q = m * BM + 8 * j + 2 * qd + e;
            if (c.mask.above_diagonal(q, key_g + 8 * hf)) sv = -INFINITY;
          }
          if (ktail && c.mask.past_keys(key_g + 8 * hf)) sv = -INFINITY;
        }
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
          // (varlen: the slices start at any row, so no 8-byte loads)
          const float2 l2 = Feat::VARLEN ? make_float2(Ls[8 * j + 2 * qd], Ls[8 * j + 2 * qd + 1])
                                         : *reinterpret_cast<const float2*>(Ls + 8 * j + 2 * qd);
          const float2 dd = Feat::VARLEN ? make_float2(Dss[8 * j + 2 * qd], Dss[8 * j + 2 * qd + 1])
                                         : *reinterpret_cast<const float2*>(Dss + 8 * j + 2 * qd);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int idx = 4 * j + 2 * hf + e;
              float g = 1.f;
              const float pv = p_of(j, hf, e, e ? l2.y : l2.x, g);
              sacc[idx] = pv;
              pacc[idx] = pv * (pacc[idx] - (e ? dd.y : dd.x));
              if constexpr (Feat::SOFTCAP) pacc[idx] *= g;
              if constexpr (Feat::VARLEN) pacc[idx] = g != 0.f ? pacc[idx] : 0.f;
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
      // The previous iteration's dQ reduces have read this consumer's staging tile; the barrier
      // below publishes that to the consumer's threads.
      if (ltid == 0) bulk_wait_group_read<0>();
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
          const int n_last = c.mask.template last_key_tile<BM, BN>(m, n_kt);
          const int turn = n_last - n_blk;
          int* cnt = dq_cnt + ((static_cast<size_t>(batch) * p.h + head) * n_m + m) * 2 + cw;
          // After a give-up (here or in mbar_wait) the results are garbage anyway: stop
          // waiting, so that a protocol bug costs one timeout per consumer, not one per tile.
          if (!timed_out) timed_out = !dq_wait_turn(cnt, turn);
          rel_cnt = cnt;
          rel_val = turn + 1;
        }
        reduce_dq_part<NDQ / 32>(tmdQ, stg, col0, head, row0, map_batch);
      }

      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < D / 2; ++i) {
        reg_fence(dk[i]);
        reg_fence(dv[i]);
      }
      // All wgmma reading stage s (Q, dO) have completed in this warp.
      __syncwarp();
      if (lane == 0) mbar_arrive(sh.bar_empty(s));
    }
  }

  // The reduces read this CTA's shared memory: complete them before exit. With DET first, since
  // the next CTA's turn waits on the release; otherwise after the dK / dV stores, which they overlap.
  if constexpr (DET) {
    if (ltid == 0) bulk_wait_group<0>();
    if (ltid == 0 && rel_cnt != nullptr) st_release_gpu(rel_cnt, rel_val);  // the last tile's turn
  }

  // ---------------------------------------------------------------- epilogue
  bwd_store_dkdv<T, D, D, Feat::template DQK_OF<D>, Feat::template DV_OF<D>>(
      p, dk, dv, [&](int hf) { return key_g + 8 * hf; }, hk, OutRows{c.cta.kv_row0, c.cta.len_kv}, cw, qd);
  if constexpr (!DET) {
    if (ltid == 0) bulk_wait_group<0>();
  }
  timeout_vote<kBwdTimeoutBar, kBwdTimeoutVoters>(timed_out);  // a wait gave up: the launch fails
#endif
}

// tmdQ: the fp32 map over p.dq_acc (tma_host.h's make_dq_acc_map). Feat: features.h.
template <typename T, int D, class Feat>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                    const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                    const BwdKParams p, const __grid_constant__ CUtensorMap tmdQ) {
  bwd_kernel_body<BwdConsumer<T, D, Feat, false>>(tmQ, tmK, tmV, tmdO, &tmdQ, p, nullptr);
}

// Deterministic dQ: dq_cnt, the turn and ticket counters after the workspace
// (bwd_sm90_det_workspace_bytes), zeroed by the deterministic preprocess.
template <typename T, int D, class Feat>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_det_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                        const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                        const BwdKParams p, const __grid_constant__ CUtensorMap tmdQ, int* dq_cnt) {
  bwd_kernel_body<BwdConsumer<T, D, Feat, true>>(tmQ, tmK, tmV, tmdO, &tmdQ, p, dq_cnt);
}

}  // namespace hopper
}  // namespace fusedattn
