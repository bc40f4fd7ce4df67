// Hopper (sm_90a) FlashAttention backward, head dims 64 and 128, variant IC ("independent
// consumers"): the DQ_TMA kernel (bwd_sm90_main<T, D, CAUSAL, true>) with no synchronisation
// between its two consumer warpgroups. Included by bwd_sm90.cuh (do not include it directly): the
// same producer and ring (bwd_produce), tiles (d = 128: 64 queries x 128 keys; d = 64: 128 x 128;
// 2 stages), per-element arithmetic, dQ staging (stage_dq_part) and TMA reduce-adds, workspace,
// pre/post kernels and host plumbing; bwd_sm90_prepare<T, D, true, false, true> launches
// bwd_sm90_ic_kernel.
//
// Why. In the DQ_TMA kernel consumer cw computes dQ_part for half of the tile's dQ (d = 128: its
// 64 columns, d = 64: its 64 query rows) over all 128 keys, so it needs the other consumer's half
// of dS^T, and both meet at named barrier 1 in every iteration: both compute P^T / dS^T at the same
// time, and for that phase no wgmma of either is in flight (the seventh session's profile: tensor
// pipe 57% active, the S^T / dP^T wait and the barrier among the top stalls). Taking turns across
// that barrier (the PP candidate, measured 2026-12-01 and removed: 0.84-1.00x) made it worse.
// cuDNN's backward on this GPU runs 64 x 64 tiles in CTAs of their own (kernel
// ..._64x64x128_1x4x1_...): nothing couples one tile's elementwise phase to another's.
//
// What changes. Consumer cw computes the dQ_part of its own 64 keys only, for the whole tile
// (d = 128: 64 queries x 128 columns; d = 64: 128 queries x 64 columns), as two 64 x 64 halves
// (d = 128: column halves; d = 64: row halves; N = 64, K = 64 keys, 4 k-steps each), staged in two
// tiles of its own and reduce-added by TMA. So it reads only its own rows of dS^T, and the consumers
// share nothing but the producer's ring (each releases a stage on its own): their elementwise phases
// drift apart, and one's runs under the other's wgmmas. The cost: the reduce-adds carry twice the
// bytes (each consumer adds a whole tile's dQ_part instead of half of it; 64 KB per 128 x 64
// block at d = 128, as the d = 256 kernel's already), and each consumer's dQ chain is two 4-step
// wgmmas instead of one 8-step.
// Synchronisation inside a consumer: dS^T has one buffer (the consumer rewrites its rows in
// iteration j + 1 after waiting for its dQ wgmmas of j, before its staging barrier of j, which all
// its warps pass); its staging tiles are single-buffered: the issuing thread waits for the last
// reduces' reads at the top of the iteration and a barrier of the consumer's 128 threads publishes
// that before the first staging writes.
// Numerics: P^T, dS^T, dV and dK are the DQ_TMA kernel's (dK and dV come out bitwise equal to it);
// dQ differs only in the order of the fp32 reduce-adds.
#pragma once

namespace fusedattn {
namespace hopper {

template <typename T, int D, bool CAUSAL>
__device__ __forceinline__ void bwd_sm90_ic_main(const CUtensorMap& tmQ, const CUtensorMap& tmK,
                                                 const CUtensorMap& tmV, const CUtensorMap& tmdO,
                                                 const CUtensorMap* tmdQ, const BwdKParams& p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr bool F16 = std::is_same<T, __half>::value;
  using Smem = BwdSmem<D, true, 4, 1>;
  constexpr int BM = Smem::BM, BN = Smem::BN, STAGES = Smem::STAGES;
  constexpr int DCH = D / 64;
  constexpr bool ROW_HALVES = (BM == 128);  // d = 64: the halves are query rows, else d columns
  static_assert(BN == 128 && BM * D == 64 * 128, "two consumers x 64 keys; a dQ_part tile of 64 x 128");

  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023u) & ~1023u;
  uint8_t* gbase = smem_raw + (sbase - sraw);
  const uint32_t sK = sbase + Smem::kK;
  const uint32_t sV = sbase + Smem::kV;
  const uint32_t sQ0 = sbase + Smem::kQ;
  const uint32_t sdO0 = sbase + Smem::kdO;
  const uint32_t sdS = sbase + Smem::kdS;
  const uint32_t sL0 = sbase + Smem::kL;
  const uint32_t sDs0 = sbase + Smem::kDs;
  const float* gL0 = reinterpret_cast<const float*>(gbase + Smem::kL);
  const float* gDs0 = reinterpret_cast<const float*>(gbase + Smem::kDs);
  const uint32_t bar0 = sbase + Smem::kBar;
  const uint32_t bar_kv = bar0;
  auto bar_full = [&](int s) { return bar0 + 8u * (1 + s); };
  auto bar_empty = [&](int s) { return bar0 + 8u * (1 + STAGES + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int n_blk = static_cast<int>(blockIdx.x);
  const int hk = blockIdx.y;
  const int batch = blockIdx.z;
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
    tma_prefetch_desc(tmdQ);
  }
  __syncthreads();

  if (wg == 0) {
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
  const int cw = wg - 1;  // keys [64cw, 64cw + 64) of the tile
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  const int qd = lane & 3;
  const int r0 = lane >> 2;
  const int key_l = cw * 64 + warp * 16 + r0;
  const int key_g = n_blk * BN + key_l;
  const float sl2 = p.scale_log2;
  // This consumer's two staging tiles (halves 0 and 1 of its dQ_part).
  const uint32_t stg0 = sbase + Smem::kStg + (2 * cw) * Smem::kStgBytes;

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    dk[i] = 0.f;
    dv[i] = 0.f;
  }
  bool timed_out = !mbar_wait<false>(bar_kv, 0);
  __syncwarp();

  // dQ_part half hh = dS(rows of this consumer's keys) K(the same keys): A = dS^T read M-major
  // (M = queries), B = K (N = d, MN-major); 4 k-steps of 16 keys. Issued without a commit.
  auto issue_dq_half = [&](float (&dq)[32], int hh) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint32_t a_addr = sdS + (ROW_HALVES ? hh * (BN * 128) : 0) + cw * (64 * 128) + t * (16 * 128);
      const uint32_t b_addr = sK + (ROW_HALVES ? 0 : hh * (BN * 128)) + cw * (64 * 128) + t * (16 * 128);
      WgmmaTT<64, F16>::ss(dq, make_smem_desc(a_addr, BN * 128, 1024), make_smem_desc(b_addr, BN * 128, 1024),
                           t > 0 ? 1 : 0);
    }
  };
  // Half hh of the dQ_part of query tile m of `head` -> its staging tile -> two TMA reduce-adds.
  auto reduce_dq_half = [&](const float (&dq)[32], int hh, int head, int m) {
    const uint32_t stg = stg0 + hh * Smem::kStgBytes;
    stage_dq_part<8>(stg, warp, r0, qd, dq);
    fence_proxy_async_smem();
    if (cw == 0)
      named_bar_sync(2, 128);
    else
      named_bar_sync(3, 128);
    if (ltid == 0) {
      const int col0 = ROW_HALVES ? 0 : 64 * hh;
      const int row0 = m * BM + (ROW_HALVES ? 64 * hh : 0);
      tma_reduce_add_4d(tmdQ, stg, col0, head, row0, batch);
      tma_reduce_add_4d(tmdQ, stg + 64 * 128, col0 + 32, head, row0, batch);
      bulk_commit_group();
    }
  };

  int it = 0;
  for (int g = 0; g < G; ++g) {
    const int head = hk * G + g;
    for (int m = m_start; m < n_m; ++m, ++it) {
      const int s = it % STAGES;
      const uint32_t ph = (it / STAGES) & 1u;
      const uint32_t sQ = sQ0 + s * Smem::kQBytes;
      const uint32_t sdO = sdO0 + s * Smem::kQBytes;

      // ---------------- S^T = K Q^T, dP^T = V dO^T (64 keys x BM queries)
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
      // The last iteration's reduces have read the staging tiles (published by the barrier below).
      if (ltid == 0) bulk_wait_group_read<0>();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        reg_fence(sacc[i]);
        reg_fence(pacc[i]);
      }

      // ---------------- P^T, dS^T: the DQ_TMA kernel's arithmetic (see bwd_sm90_main)
      const float* Ls = gL0 + s * BM;
      const float* Dss = gDs0 + s * BM;
      const bool diag = CAUSAL && (n_blk * BN + BN - 1 > m * BM);
      const bool ktail = (n_blk + 1) * BN > p.s_kv;
      uint32_t pa[BM / 16][4], da[BM / 16][4];
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
              float sv = sacc[idx];
              if (diag) {
                const int q = m * BM + 8 * j + 2 * qd + e;
                if (key_g + 8 * hf > q) sv = -INFINITY;
              }
              if (ktail && key_g + 8 * hf >= p.s_kv) sv = -INFINITY;
              const float pv = fast_exp2(fmaf(sv, sl2, -(e ? l2.y : l2.x)));
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
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = 16 * t + 8 * (i >> 1) + 2 * qd;
          const int kl = key_l + 8 * (i & 1);
          const int cc = c & 63;
          const uint32_t addr =
              sdS + (c >> 6) * (BN * 128) + kl * 128 + ((((cc >> 3) ^ (kl & 7)) & 7) << 4) + (cc & 7) * 2;
          st_shared_b32(addr, da[t][i]);
        }
      }
      fence_proxy_async_smem();
      // This consumer's dS^T rows are in (its own dQ wgmmas read them) and its staging tiles are free.
      if (cw == 0)
        named_bar_sync(2, 128);
      else
        named_bar_sync(3, 128);

      // ---------------- dQ_part (two halves), dV += P^T dO, dK += dS^T Q
      float dq0[32], dq1[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) dq0[i] = 0.f;
#pragma unroll
      for (int i = 0; i < 32; ++i) reg_fence(dq0[i]);
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
      // Order: dQ half 0, dV | stage half 0 | dQ half 1, dK | stage half 1. (Both halves in flight
      // together, with dV / dK, kept 224 registers of accumulators and operands live: ptxas
      // spilled 48-64 bytes at d = 128.) The other consumer's wgmmas cover this one's staging.
      wgmma_fence();
      issue_dq_half(dq0, 0);
      wgmma_commit();
#pragma unroll
      for (int t = 0; t < BM / 16; ++t) {
        const uint32_t b_addr = sdO + t * (16 * 128);
        Wgmma<D, F16>::rs(dv, pa[t], make_smem_desc(b_addr, BM * 128, 1024), 1);
      }
      wgmma_commit();
      wgmma_wait<1>();  // half 0 done
#pragma unroll
      for (int i = 0; i < 32; ++i) reg_fence(dq0[i]);
      reduce_dq_half(dq0, 0, head, m);
#pragma unroll
      for (int i = 0; i < 32; ++i) dq1[i] = 0.f;
#pragma unroll
      for (int i = 0; i < 32; ++i) reg_fence(dq1[i]);
      wgmma_fence();
      issue_dq_half(dq1, 1);
      wgmma_commit();
#pragma unroll
      for (int t = 0; t < BM / 16; ++t) {
        const uint32_t b_addr = sQ + t * (16 * 128);
        Wgmma<D, F16>::rs(dk, da[t], make_smem_desc(b_addr, BM * 128, 1024), 1);
      }
      wgmma_commit();
      wgmma_wait<1>();  // dV, half 1 done
#pragma unroll
      for (int i = 0; i < 32; ++i) reg_fence(dq1[i]);
      reduce_dq_half(dq1, 1, head, m);

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
  // The reduces read this CTA's shared memory: complete them before exit.
  if (ltid == 0) bulk_wait_group<0>();

  bwd_store_dkdv<T, D>(p, dk, dv, key_g, hk, batch, qd, timed_out);
#endif
}

// tmdQ as for bwd_sm90_dqtma_kernel (fp32 map over p.dq_acc, box 32 x 1 x 64 x 1, 128B swizzle).
template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_ic_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                       const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                       const BwdKParams p, const __grid_constant__ CUtensorMap tmdQ) {
  bwd_sm90_ic_main<T, D, CAUSAL>(tmQ, tmK, tmV, tmdO, &tmdQ, p);
}

}  // namespace hopper
}  // namespace fusedattn
