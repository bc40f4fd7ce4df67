// The Hopper backward's main kernel at d = 256 (bwd_common.cuh has the shared roles; same contract,
// workspace and pre / post kernels as d = 64 / 128). A separate kernel because at d = 256 a 64-key
// fp32 dK accumulator alone is 128 registers per consumer thread (dV another 128), so the d = 64 /
// 128 partition (each consumer owns 64 keys and the whole head dim) cannot fit: here the two
// consumers split each iteration's GEMMs and the head dim (the steps are described at
// BwdConsumerD256).
#pragma once

#include "bwd_common.cuh"

namespace fusedattn {
namespace hopper {

// Two P and two dS tiles, no staging (the dQ_parts are staged in the dead Q and dO tiles).
template <bool VARLEN = false>
using BwdSmemD256 = BwdSmemLayout<256, 4, false, VARLEN>;
static_assert(BwdSmemD256<>::BM == 64 && BwdSmemD256<>::BN == 64, "one wgmma M tile of queries and of keys");

namespace d256 {

// Byte offset, inside a [64 rows][64] 16-bit block with the 128B swizzle, of the
// element pair (row, 8j + 2qd .. +1).
__device__ __forceinline__ uint32_t swz_pair(int row, int j, int qd) {
  return static_cast<uint32_t>(row * 128 + (((j ^ row) & 7) << 4) + 4 * qd);
}

}  // namespace d256

// One CTA per (key tile of BN = 64 keys, kv head, batch), 384 threads; query
// tiles of BM = 64 rows stream through a 2-stage TMA ring exactly as at d = 64 / 128
// (producer WG0, setmaxnreg.dec 24; full barrier complete_tx,
// empty barrier 8 consumer-warp arrivals; lse2 / Dsum row slices by bulk copy).
// The two consumer warpgroups (setmaxnreg.inc 240), cw = 0, 1, split the work
// of one (query tile m, key tile n) iteration as follows:
//
//   (a) GEMM split of the two 64x64 (K = 256) score products, both computed
//       in the natural orientation (M = 64 queries, N = 64 keys), SS wgmma
//       m64n64k16 with K-major Q/dO (A) and K/V (B), 16 k-steps:
//         cw 0:  S  = Q  K^T            cw 1:  dP = dO V^T
//   (b) cw 0: P = exp2(S * scale*log2e - lse2[q]) (causal diagonal tile and
//       keys >= s_kv masked to 0), packed to 16 bit and stored to smem sP as
//       [query][key] (one 64 x 128 B swizzle-128B atom block).
//       Both WGs: fence.proxy.async (writer), named barrier 1 (256 threads).
//   (c) Both: dV[:, 128cw : 128cw+128] += P^T dO[:, half]   (WgmmaTT, SS:
//       A = P^T, M = keys, read M-major from sP; B = dO, MN-major), issued
//       at once so it runs under (d).
//   (d) cw 1: dS = P (dP - Dsum[q]) with P read back (16-bit) from sP at its
//       own fragment positions, stored to smem sdS as [query][key].
//       Both: fence.proxy.async (writer), named barrier 2 (256 threads).
//   (e) Both: dQ_part[:, half] = dS K[:, half]   (WgmmaNT, SS: A = dS, M =
//       queries, K-major from sdS; B = K, MN-major), commit;
//       dK[:, half] += dS^T Q[:, half]  (WgmmaTT: A = dS^T M-major from sdS;
//       B = Q MN-major), commit; wait_group 1 (dV, dQ done) -> dQ_part into
//       the workspace's fp32 accumulator (TMA reduce-add, below) while dK runs;
//       wait_group 0; each warp releases the stage.
//   Epilogue: WG cw stores dK[:, half] * scale, dV[:, half] (plain stores).
//
// dQ by TMA reduce-add: shared memory has no room for 64 KB of fp32 staging, but a stage's Q and dO
// tiles are 32 KB each, exactly one consumer's 64 x 128 fp32 dQ_part, and are dead once the
// iteration's wgmmas have read them. Each consumer writes four
// [64][32] fp32 boxes (128B swizzle, stage_dq_part) and fences; rows >= s_q are out of bounds of
// the map and skipped by the cp.reduce.async.bulk.tensor adds.
//   cw 0 waits for both consumers' dV (barrier 3: cw 1 arrives after its wait_group 1), stages in
//   the dO tile while the dK wgmmas run, syncs its 4 warps (barrier 5) and one thread issues the
//   four reduces. Its warp 0 defers its arrival on the stage's empty barrier to the next
//   iteration, after that thread's wait_group.read (issued under the next S wgmmas, which give the
//   reads time).
//   cw 1 waits for both consumers' dK (barrier 4: cw 0 arrives after its wait_group 0), stages in
//   the Q tile and releases the stage at once; the producer thread issues the four reduces once
//   the stage's empty barrier completes and refills Q after their reads (bwd_produce, DQ_Q). cw 1's
//   reduces go out at the very end of an iteration, so a consumer waiting for their reads under its
//   next wgmmas would stall; the producer waits for them only where the refill must, and the stage
//   is refilled for the iteration after next.
//
// sP and sdS are double-buffered by iteration parity, so barriers 1 and 2 are
// the only consumer-consumer synchronisation: WG0 writes sP(i+2) only after
// passing barrier 1 of i+1, which WG1 reaches after its wait_group 0 of
// iteration i (its last reads of sP(i), generic and by wgmma); WG1 writes
// sdS(i+2) only after barrier 1 of i+2, which WG0 reaches after its wait_group 0
// of i+1. Both consumers pass barriers 1 and 2 exactly once per iteration and
// run the same iterations (no early exits), so the barrier counts balance.
// Barriers 3 and 4 (one side arrives, the other syncs) cannot take a second
// arrival from the arriving side before the syncing side's sync of the same
// iteration: that would need the arriving side to pass barrier 1 of the next
// iteration, which the syncing side reaches only after its sync.
//
// Registers per consumer thread at the peak (e), fp32 accumulators:
//   dK half 64 + dV half 64 + dQ half 64 = 192 (+ ~25 addresses/indices);
//   in (a)-(d): dK 64 + dV 64 + S or dP 32 = 160. Limit 240 (setmaxnreg).
// Shared memory (bytes): K 32768 + V 32768 + 2 stages x (Q 32768 + dO 32768)
//   + 2 x sP 8192 + 2 x sdS 8192 + 2 x 2 x 256 rows + 128 barriers + 1024
//   alignment slack = 231552 <= 232448 (227 KB); varlen's row slices take 4 x 16 bytes more.
// The 256-wide rows of K, V, Q, dO are 4 chunks of [rows][64] (128 B rows,
// 128B swizzle, chunk c at c * rows * 128), loaded by 4 TMA boxes (64, 1,
// rows, 1); a K-major k16 step at d-offset 16k reads chunk k/4 at +32(k%4) B,
// an MN-major N = 128 half starts at chunk 2cw with LBO = rows * 128.
template <typename T, class Feat>
struct BwdConsumerD256 {
  using Smem = BwdSmemD256<Feat::VARLEN>;
  using Mask = TileMask<Feat::MASK, Feat::VARLEN>;
  static constexpr bool DET = false, kDqInQ = true;
  static __device__ __forceinline__ void consume(const BwdCtx<Smem, Mask>& c, const CUtensorMap* tmdQ,
                                                 const BwdKParams& p, int*);
};

template <typename T, class Feat>
__device__ __forceinline__ void BwdConsumerD256<T, Feat>::consume(const BwdCtx<Smem, Mask>& c,
                                                                 const CUtensorMap* tmdQ, const BwdKParams& p, int*) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr bool F16 = std::is_same<T, __half>::value;
  constexpr int D = Smem::D, BM = Smem::BM, BN = Smem::BN, STAGES = Smem::STAGES;
  constexpr int DCH = D / 64;  // 64-wide chunks per row
  constexpr int DH = D / 2;    // head-dim columns of dK, dV, dQ per consumer
  static_assert(DH == 128 && DCH == 4, "two 64-wide chunks per consumer half");
  // The problem's head dims (192 / 128 on this tile): S contracts over d_qk and dP over d_v only
  // (their k-steps, as the forward's QKW), and a consumer whose dV half lies past d_v issues no dV
  // GEMM (its dv stays 0 and is not stored).
  constexpr int DQK = Feat::template DQK_OF<D>, DVP = Feat::template DV_OF<D>;
  constexpr int KS_S = (DQK + 15) / 16, KS_P = (DVP + 15) / 16;

  const auto& sh = c.sh;
  const uint32_t sbase = c.sbase, sK = sh.sK, sV = sh.sV, sQ0 = sh.sQ0, sdO0 = sh.sdO0;
  const uint32_t sP0 = sbase + Smem::kTiles;
  const uint32_t sdS0 = sP0 + 2 * Smem::kTileBytes;
  const float *gL0 = c.gL0, *gDs0 = c.gDs0;
  const int n_blk = c.cta.n_blk, hk = c.cta.hk, map_batch = c.cta.map_batch, G = c.cta.G;
  const int m_start = c.cta.m_start, m_end = c.cta.m_end;
  const int cw = c.cw;  // head-dim half [128cw, 128cw + 128) of dK, dV, dQ; S (cw 0) or dP (cw 1)
  const int ltid = c.ltid, warp = c.warp, lane = c.lane, qd = c.qd, r0 = c.r0;
  // Accumulator fragment rows of this thread: row_l, row_l + 8 (queries for
  // S / dP / dQ, keys for dK / dV); columns 8j + 2qd (+1).
  const int row_l = warp * 16 + r0;
  const float sl2 = Feat::SOFTCAP ? p.softcap_log2 : p.scale_log2;  // softmax.cuh's softcap_scores
  // Operands of this consumer's score GEMM: S = Q K^T (cw 0), dP = dO V^T (cw 1).
  const uint32_t sA0 = cw == 0 ? sQ0 : sdO0;
  const uint32_t sB = cw == 0 ? sK : sV;

  float dk[DH / 2], dv[DH / 2];
  bool timed_out = bwd_consumer_start(dk, dv, sh);

  // Thread ltid 0: the stage whose release (warp 0's arrival on its empty barrier) waits
  // for this thread's reduces to have read their staging tile (-1: none).
  int pend = -1;

  int it = 0;
  for (int g = 0; g < G; ++g) {
    const int head = hk * G + g;
    for (int m = m_start; m < m_end; ++m, ++it) {
      const int s = it % STAGES;
      const uint32_t ph = (it / STAGES) & 1u;
      const uint32_t sQ = sQ0 + s * Smem::kQBytes;
      const uint32_t sdO = sdO0 + s * Smem::kQBytes;
      const uint32_t sA = sA0 + s * Smem::kQBytes;
      const uint32_t sP = sP0 + (it & 1) * Smem::kTileBytes;
      const uint32_t sdS = sdS0 + (it & 1) * Smem::kTileBytes;

      // ---------------- (a) S = Q K^T (cw 0) or dP = dO V^T (cw 1): 64 queries x 64 keys
      float acc[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
      timed_out |= !mbar_wait<false>(sh.bar_full(s), ph);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) reg_fence(acc[i]);
      wgmma_fence();
      const auto score_gemm = [&](auto steps) {
#pragma unroll
        for (int k = 0; k < decltype(steps)::value; ++k) {
          const uint32_t a_addr = sA + (k / 4) * (BM * 128) + (k % 4) * 32;
          const uint32_t b_addr = sB + (k / 4) * (BN * 128) + (k % 4) * 32;
          Wgmma<BN, F16>::ss(acc, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, 16, 1024), k > 0 ? 1 : 0);
        }
      };
      if (cw == 0)
        score_gemm(std::integral_constant<int, KS_S>{});
      else
        score_gemm(std::integral_constant<int, KS_P>{});
      wgmma_commit();
      // cw 0: release the previous tile's stage while these wgmmas run: its reduces have had the dK
      // wgmmas' time to read the staging tile (at cw 0's idle wait before barrier 2 the dO refill
      // would come late).
      if (ltid == 0 && pend >= 0) {
        bulk_wait_group_read<0>();
        mbar_arrive(sh.bar_empty(pend));
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) reg_fence(acc[i]);

      const float* Ls = gL0 + s * Smem::kRowFloats + c.cta.row_shift;
      const float* Dss = gDs0 + s * Smem::kRowFloats + c.cta.row_shift;
      // ---------------- (b) P -> sP [query][key] (cw 0)
      if (cw == 0) {
        const bool diag = c.mask.crosses_diagonal(n_blk * BN + BN - 1, m * BM);
        // Keys >= s_kv (TMA zero rows) would get P = exp2(-lse2), harmless when
        // finite but able to overflow to inf (-> NaN): mask them.
        const bool ktail = c.mask.has_key_tail((n_blk + 1) * BN);
        // General masks: any score of a tile the window cuts (keys past s_kv included).
        const bool partial = c.mask.template tile_partial<BM, BN>(m * BM, n_blk * BN);
        const uint32_t kspan = Mask::GENERAL ? c.mask.key_span() : 0u;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int ql = row_l + 8 * hf;
          const int q = m * BM + ql;
          const float l2 = Ls[ql];
          // General masks: the row's base for mask.cuh's one-compare test.
          const uint32_t qbase = Mask::GENERAL ? c.mask.query_base(q) : 0u;
          const bool row_out = Mask::VARLEN && q >= c.mask.s_q;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int idx = 4 * j + 2 * hf + e;
              const int key = n_blk * BN + 8 * j + 2 * qd + e;
              float sv = acc[idx];
              if constexpr (Feat::SOFTCAP) sv = softcap_tanh(sv, p.softcap_k2);
              bool hid = false;  // varlen: P = 0 outright (a row past the sequence has another's lse2)
              if constexpr (Mask::GENERAL) {
                if (partial && (row_out || !c.mask.seen_from_query(qbase, key, kspan))) {
                  sv = -INFINITY;
                  hid = Mask::VARLEN;
                }
              } else {
                if (diag && c.mask.above_diagonal(q, key)) sv = -INFINITY;
                if (ktail && c.mask.past_keys(key)) sv = -INFINITY;
              }
              acc[idx] = hid ? 0.f : fast_exp2(fmaf(sv, sl2, -l2));
            }
            st_shared_b32(sP + d256::swz_pair(ql, j, qd), pack2<F16>(acc[4 * j + 2 * hf], acc[4 * j + 2 * hf + 1]));
          }
        }
        fence_proxy_async_smem();
      }
      bar_sync_imm<1, 256>();  // P in smem (cw 0 wrote it; cw 1 reads it below)

      // ---------------- (c) dV[:, half] += P^T dO[:, half]
#pragma unroll
      for (int i = 0; i < DH / 2; ++i) reg_fence(dv[i]);
      wgmma_fence();
      if (DVP > DH || cw == 0) {
#pragma unroll
        for (int t = 0; t < BM / 16; ++t) {
          // A = P^T (M = 64 keys, K = queries 16t..16t+15), M-major: rows 16t.. of sP.
          // B = dO (K = queries, N = d 128cw..), MN-major: chunks 2cw, 2cw+1.
          const uint32_t a_addr = sP + t * (16 * 128);
          const uint32_t b_addr = sdO + (2 * cw) * (BM * 128) + t * (16 * 128);
          WgmmaTT<DH, F16>::ss(dv, make_smem_desc(a_addr, BN * 128, 1024), make_smem_desc(b_addr, BM * 128, 1024),
                               1);
        }
      }
      wgmma_commit();  // (an empty group where the half issues none: the group counts stay the same)

      // ---------------- (d) dS = P (dP - Dsum) -> sdS [query][key] (cw 1)
      if (cw == 1) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int ql = row_l + 8 * hf;
          const float dd = Dss[ql];
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const uint32_t off = d256::swz_pair(ql, j, qd);
            const float2 pv = unpack2<F16>(ld_shared_b32(sP + off));
            float d0 = pv.x * (acc[4 * j + 2 * hf] - dd);
            float d1 = pv.y * (acc[4 * j + 2 * hf + 1] - dd);
            if constexpr (Feat::VARLEN) {
              // P = 0 (hidden, or no weight): dS = 0 whatever the row's Dsum (a row past the
              // sequence has another's).
              d0 = pv.x != 0.f ? d0 : 0.f;
              d1 = pv.y != 0.f ? d1 : 0.f;
            }
            if constexpr (Feat::SOFTCAP) {
              // The capped score t behind P = 2^(cap log2(e) t - lse2), from P (consumer 0 keeps t;
              // shared memory has no room for it): t = (log2 P + lse2) / (cap log2(e)), exact to
              // P's 16-bit rounding. P = 0 contributes nothing.
              const float l2 = Ls[ql], inv = fast_rcp(sl2);
              const float t0 = (fast_log2(pv.x) + l2) * inv, t1 = (fast_log2(pv.y) + l2) * inv;
              d0 = pv.x > 0.f ? d0 * (1.f - t0 * t0) : 0.f;
              d1 = pv.y > 0.f ? d1 * (1.f - t1 * t1) : 0.f;
            }
            st_shared_b32(sdS + off, pack2<F16>(d0, d1));
          }
        }
        fence_proxy_async_smem();
      }
      bar_sync_imm<2, 256>();  // dS in smem

      // ---------------- (e) dQ_part = dS K[:, half] ; dK[:, half] += dS^T Q[:, half]
      float dq[DH / 2];
#pragma unroll
      for (int i = 0; i < DH / 2; ++i) dq[i] = 0.f;
#pragma unroll
      for (int i = 0; i < DH / 2; ++i) {
        reg_fence(dq[i]);
        reg_fence(dk[i]);
      }
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < BN / 16; ++t) {
        // A = dS (M = 64 queries, K = keys 16t..), K-major: +32 B per k16 step.
        // B = K (K = keys, N = d 128cw..), MN-major: chunks 2cw, 2cw+1, rows 16t..
        const uint32_t a_addr = sdS + t * 32;
        const uint32_t b_addr = sK + (2 * cw) * (BN * 128) + t * (16 * 128);
        WgmmaNT<DH, F16>::ss(dq, make_smem_desc(a_addr, 16, 1024), make_smem_desc(b_addr, BN * 128, 1024),
                             t > 0 ? 1 : 0);
      }
      wgmma_commit();
#pragma unroll
      for (int t = 0; t < BM / 16; ++t) {
        // A = dS^T (M = 64 keys, K = queries 16t..), M-major: rows 16t.. of sdS.
        // B = Q (K = queries, N = d 128cw..), MN-major.
        const uint32_t a_addr = sdS + t * (16 * 128);
        const uint32_t b_addr = sQ + (2 * cw) * (BM * 128) + t * (16 * 128);
        WgmmaTT<DH, F16>::ss(dk, make_smem_desc(a_addr, BN * 128, 1024), make_smem_desc(b_addr, BM * 128, 1024), 1);
      }
      wgmma_commit();
      wgmma_wait<1>();  // dV and dQ groups done (groups complete in order)
#pragma unroll
      for (int i = 0; i < DH / 2; ++i) reg_fence(dq[i]);

      // cw 0 stages its dQ_part in stage s's dO tile once both consumers' dV wgmmas are done
      // (barrier 3), while the dK wgmmas run, and one thread reduce-adds the four boxes; cw 1
      // stages in the Q tile once both consumers' dK wgmmas are done (barrier 4), and the
      // producer reduce-adds it after the stage's release (bwd_produce, DQ_Q).
      if (cw == 0) {
        bar_sync_imm<3, 256>();
        stage_dq_part<DH / 8>(sdO, warp, r0, qd, dq);
        fence_proxy_async_smem();
        bar_sync_imm<5, 128>();
        if (ltid == 0) reduce_dq_part<DH / 32>(tmdQ, sdO, 0, head, m * BM, map_batch);
        wgmma_wait<0>();
        bar_arrive_imm<4, 256>();
      } else {
        bar_arrive_imm<3, 256>();
        wgmma_wait<0>();
        bar_sync_imm<4, 256>();
        stage_dq_part<DH / 8>(sQ, warp, r0, qd, dq);
        fence_proxy_async_smem();
      }

#pragma unroll
      for (int i = 0; i < DH / 2; ++i) {
        reg_fence(dk[i]);
        reg_fence(dv[i]);
      }
      // All wgmma reading stage s (Q, dO) have completed in this warp, and its
      // generic reads of the stage's lse2 / Dsum slices are done. Warp 0's arrival waits for its
      // reduces' reads of the staging tile (next tile, or below).
      __syncwarp();
      if (lane == 0) {
        if (cw == 0 && warp == 0)
          pend = s;
        else
          mbar_arrive(sh.bar_empty(s));
      }
    }
  }

  // ---------------------------------------------------------------- epilogue
  bwd_store_dkdv<T, D, DH, Feat::template DQK_OF<D>, Feat::template DV_OF<D>>(
      p, dk, dv, [&](int hf) { return n_blk * BN + row_l + 8 * hf; }, hk, OutRows{c.cta.kv_row0, c.cta.len_kv}, cw,
      qd);
  // cw 0's reduces read this CTA's shared memory: complete them before exit (after the dK / dV
  // stores, which they overlap). Then the last release: the producer waits for it before it reduces
  // cw 1's last staged tile.
  if (cw == 0 && ltid == 0) {
    bulk_wait_group<0>();
    if (pend >= 0) mbar_arrive(sh.bar_empty(pend));
  }
  timeout_vote<kBwdTimeoutBar, kBwdTimeoutVoters>(timed_out);  // a wait gave up: the launch fails
#endif
}

// tmdQ: the fp32 map over p.dq_acc (tma_host.h's make_dq_acc_map).
template <typename T, class Feat>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_d256_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                         const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                         const BwdKParams p, const __grid_constant__ CUtensorMap tmdQ) {
  bwd_kernel_body<BwdConsumerD256<T, Feat>>(tmQ, tmK, tmV, tmdO, &tmdQ, p, nullptr);
}

}  // namespace hopper
}  // namespace fusedattn
