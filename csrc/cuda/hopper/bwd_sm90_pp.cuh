// Hopper (sm_90a) FlashAttention backward, head dim 128, variant PP: the DQ_TMA kernel
// (bwd_sm90_main<T, 128, CAUSAL, true>) with its two consumer warpgroups taking turns instead of
// meeting every iteration. Included by bwd_sm90.cuh (do not include it directly): the same
// producer and ring (bwd_produce), tiles (BM = 64 queries, BN = 128 keys, 2 stages), shared-memory
// layout (BwdSmem<128, true>), per-element arithmetic, dQ staging (stage_dq_part) and TMA
// reduce-adds, workspace, pre/post kernels and host plumbing; bwd_sm90_prepare<T, 128, true,
// false, true> launches bwd_sm90_pp_kernel.
//
// Why. In the DQ_TMA kernel both consumers pass named barrier 1 in every iteration (dQ_part = dS K
// needs both consumers' halves of dS^T), so both compute P^T / dS^T at the same time, and for that
// phase no wgmma of either is in flight: the tensor cores idle for the exp2s, masks, packing and
// dS^T stores of the whole tile (~400 of a ~3,100-clock iteration at d = 128, plus the barrier's
// skew; Nsight Compute, docs/perf-notes.md: tensor pipe 57% active, the S^T / dP^T wait and the
// barrier among the top stalls).
//
// What changes. Consumer cw still owns keys [64cw, 64cw + 64) of the tile and dQ columns
// [64cw, 64cw + 64) (over all 128 keys), but consumer 0 computes its dQ_part for the PREVIOUS
// iteration's query tile and consumer 1 for the current one. Then consumer 1 needs consumer 0's
// dS^T half of this iteration and consumer 0 needs consumer 1's half of the last one: two one-way
// handoffs (the writer arrives on a named barrier, the reader syncs on it) instead of a rendezvous:
//   kPpDs0Bar: "dS0(j) written": cw 0 arrives after writing it; cw 1 syncs before its P / dS^T
//              phase of iteration j;
//   kPpDs1Bar: "dS1(j) written": cw 1 arrives; cw 0 syncs before its P / dS^T phase of j + 1
//              (and once after the loop, for its last dQ_part).
// So the P / dS^T phases alternate, cw0(j), cw1(j), cw0(j + 1), ..., and while one consumer
// computes its phase, the other consumer's wgmmas (dQ_part, dV, dK, then the next S^T / dP^T) keep
// the tensor cores busy. Within a consumer the order is DQ_TMA's: S^T / dP^T are issued at the top
// of an iteration, once the last one's dV / dK are done and its stage released. (Issuing them
// behind one's own dV / dK instead, at the bottom of the loop body, left their accumulators live
// across the back edge: ptxas spilled 544 bytes. The other consumer's wgmmas cover this one's
// gap between its dV / dK and its next S^T / dP^T.)
// Barrier order: each barrier's arrivals and syncs alternate (arrive dS0(j) < sync dS0(j) < arrive
// dS1(j) < sync dS1(j) < arrive dS0(j + 1)), so one id each suffices; every arrival has its sync
// (n_it of each), whatever the data (no early exits).
// Buffers (dS^T double-buffered by iteration parity, as in DQ_TMA): cw 0 writes dS0(j) into
// buffer j & 1 after syncing on dS1(j - 1), which cw 1 arrives at after its wait for its
// dQ_part(j - 2) (its last read of that buffer); cw 1 writes dS1(j) after syncing on dS0(j), which
// cw 0 arrives at after its wait for dQ_part(j - 2) (computed in its iteration j - 1). Each
// consumer's staging tile is single-buffered as in DQ_TMA: its issuing thread waits for the last
// reduces' reads before the handoff barrier, which all its threads pass before staging again.
// In iteration 0 consumer 0 has no dQ_part to make; it runs the dQ wgmmas anyway (on the
// other buffer, whose contents it discards) so that every iteration issues the same wgmma groups
// and waits (a conditional wgmma group makes ptxas serialise the wgmmas).
// Numerics: P^T, dS^T, dV and dK are the DQ_TMA kernel's (same operations in the same order: dK and
// dV come out bitwise equal to it); dQ differs only in the order of the fp32 reduce-adds.
#pragma once

namespace fusedattn {
namespace hopper {

constexpr int kPpDs0Bar = 4;  // ids 2 and 3: each consumer's staging barrier (as in DQ_TMA)
constexpr int kPpDs1Bar = 5;

template <typename T, bool CAUSAL>
__device__ __forceinline__ void bwd_sm90_pp_main(const CUtensorMap& tmQ, const CUtensorMap& tmK,
                                                 const CUtensorMap& tmV, const CUtensorMap& tmdO,
                                                 const CUtensorMap* tmdQ, const BwdKParams& p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr int D = 128;
  constexpr bool F16 = std::is_same<T, __half>::value;
  using Smem = BwdSmem<D, true>;
  constexpr int BM = Smem::BM, BN = Smem::BN, STAGES = Smem::STAGES;
  constexpr int DCH = D / 64;
  constexpr int NDQ = D / 2;  // dQ columns per consumer
  static_assert(BM == 64 && BN == 128, "two consumer warpgroups x 64 keys, 64-query tiles");

  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023u) & ~1023u;
  uint8_t* gbase = smem_raw + (sbase - sraw);
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
  const int cw = wg - 1;
  const int ltid = tid & 127;
  const int warp = ltid / 32;
  const int lane = tid & 31;
  const int qd = lane & 3;
  const int r0 = lane >> 2;
  const int key_l = cw * 64 + warp * 16 + r0;
  const int key_g = n_blk * BN + key_l;
  const float sl2 = p.scale_log2;
  const int per_head = n_m - m_start;  // query tiles per query head of the group
  const int n_it = G * per_head;
  const uint32_t stg = sbase + Smem::kStg + cw * Smem::kStgBytes;

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    dk[i] = 0.f;
    dv[i] = 0.f;
  }
  bool timed_out = !mbar_wait<false>(bar_kv, 0);
  __syncwarp();

  float sacc[BM / 2], pacc[BM / 2];
  // S^T = K_cw Q^T and dP^T = V_cw dO^T of iteration j, one wgmma group (after its stage is full).
  auto issue_sdp = [&](int j) {
    const int s = j % STAGES;
    timed_out |= !mbar_wait<false>(bar_full(s), (j / STAGES) & 1u);
    __syncwarp();
    const uint32_t sQ = sQ0 + s * Smem::kQBytes;
    const uint32_t sdO = sdO0 + s * Smem::kQBytes;
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      sacc[i] = 0.f;
      pacc[i] = 0.f;
    }
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
  };
  // dQ_part[:, 64cw ..] = dS(jq) K[:, 64cw ..] over all 128 keys: A = dS^T buffer jq & 1 (M = queries,
  // M-major), B = K (N = d, N-major). Issued without a commit.
  auto issue_dq = [&](float (&dq)[NDQ / 2], int jq) {
    const uint32_t sdS = sdS0 + (jq & 1) * Smem::kDSBytes;
#pragma unroll
    for (int t = 0; t < BN / 16; ++t) {
      const uint32_t a_addr = sdS + t * (16 * 128);
      const uint32_t b_addr = sK + cw * (NDQ / 64) * (BN * 128) + t * (16 * 128);
      WgmmaTT<NDQ, F16>::ss(dq, make_smem_desc(a_addr, BN * 128, 1024), make_smem_desc(b_addr, BN * 128, 1024),
                            t > 0 ? 1 : 0);
    }
  };
  // dQ_part of iteration jq -> the staging tile -> two TMA reduce-adds (box rows >= s_q skipped).
  auto reduce_dq = [&](const float (&dq)[NDQ / 2], int jq) {
    stage_dq_part<NDQ / 8>(stg, warp, r0, qd, dq);
    fence_proxy_async_smem();
    if (cw == 0)
      named_bar_sync(2, 128);
    else
      named_bar_sync(3, 128);
    if (ltid == 0) {
      const int head = hk * G + jq / per_head;
      const int row0 = (m_start + jq % per_head) * BM;
      tma_reduce_add_4d(tmdQ, stg, cw * NDQ, head, row0, batch);
      tma_reduce_add_4d(tmdQ, stg + 64 * 128, cw * NDQ + 32, head, row0, batch);
      bulk_commit_group();
    }
  };

  for (int j = 0; j < n_it; ++j) {
    issue_sdp(j);
    const int s = j % STAGES;
    const int m = m_start + j % per_head;
    const uint32_t sQ = sQ0 + s * Smem::kQBytes;
    const uint32_t sdO = sdO0 + s * Smem::kQBytes;
    const uint32_t sdS = sdS0 + (j & 1) * Smem::kDSBytes;

    wgmma_wait<0>();  // S^T, dP^T of j (and this consumer's dV / dK of j - 1)
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      reg_fence(sacc[i]);
      reg_fence(pacc[i]);
    }
    // The last reduces have read the staging tile; the barrier publishes it to this consumer's warps.
    if (ltid == 0) bulk_wait_group_read<0>();
    if (cw == 0) {
      if (j > 0) bar_sync_imm<kPpDs1Bar, 256>();
    } else {
      bar_sync_imm<kPpDs0Bar, 256>();
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
        const int jc = 2 * t + jj;
        const float2 l2 = *reinterpret_cast<const float2*>(Ls + 8 * jc + 2 * qd);
        const float2 dd = *reinterpret_cast<const float2*>(Dss + 8 * jc + 2 * qd);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int idx = 4 * jc + 2 * hf + e;
            float sv = sacc[idx];
            if (diag) {
              const int q = m * BM + 8 * jc + 2 * qd + e;
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
    if (cw == 0)
      bar_arrive_imm<kPpDs0Bar, 256>();
    else
      bar_arrive_imm<kPpDs1Bar, 256>();

    // ---------------- dQ_part (cw 0: of j - 1; cw 1: of j), dV += P^T dO, dK += dS^T Q
    const int jq = cw == 0 ? j - 1 : j;
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
    issue_dq(dq, jq < 0 ? 1 : jq);
    wgmma_commit();
#pragma unroll
    for (int t = 0; t < BM / 16; ++t) {
      const uint32_t b_addr = sdO + t * (16 * 128);
      Wgmma<D, F16>::rs(dv, pa[t], make_smem_desc(b_addr, BM * 128, 1024), 1);
    }
#pragma unroll
    for (int t = 0; t < BM / 16; ++t) {
      const uint32_t b_addr = sQ + t * (16 * 128);
      Wgmma<D, F16>::rs(dk, da[t], make_smem_desc(b_addr, BM * 128, 1024), 1);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dQ_part done
#pragma unroll
    for (int i = 0; i < NDQ / 2; ++i) reg_fence(dq[i]);
    if (jq >= 0) reduce_dq(dq, jq);

    // ---------------- release the stage once dV / dK are done
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) {
      reg_fence(dk[i]);
      reg_fence(dv[i]);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_empty(s));
  }

  // Consumer 0's last dQ_part (of iteration n_it - 1), once consumer 1's dS^T half is in.
  if (cw == 0 && n_it > 0) {
    if (ltid == 0) bulk_wait_group_read<0>();
    bar_sync_imm<kPpDs1Bar, 256>();
    float dq[NDQ / 2];
#pragma unroll
    for (int i = 0; i < NDQ / 2; ++i) dq[i] = 0.f;
#pragma unroll
    for (int i = 0; i < NDQ / 2; ++i) reg_fence(dq[i]);
    wgmma_fence();
    issue_dq(dq, n_it - 1);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < NDQ / 2; ++i) reg_fence(dq[i]);
    reduce_dq(dq, n_it - 1);
  }
  // The reduces read this CTA's shared memory: complete them before exit.
  if (ltid == 0) bulk_wait_group<0>();

  bwd_store_dkdv<T, D>(p, dk, dv, key_g, hk, batch, qd, timed_out);
#endif
}

// tmdQ as for bwd_sm90_dqtma_kernel (fp32 map over p.dq_acc, box 32 x 1 x 64 x 1, 128B swizzle).
template <typename T, bool CAUSAL>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_sm90_pp_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                       const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                       const BwdKParams p, const __grid_constant__ CUtensorMap tmdQ) {
  bwd_sm90_pp_main<T, CAUSAL>(tmQ, tmK, tmV, tmdO, &tmdQ, p);
}

}  // namespace hopper
}  // namespace fusedattn
