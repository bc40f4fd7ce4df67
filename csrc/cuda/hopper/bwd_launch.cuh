// Host side of the Hopper backward: a call's tensor maps, kernel parameters and grids
// (bwd_prepare), then (varlen: the prologue,) the preprocess, main and postprocess kernels on one
// stream (bwd_launch).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "bwd_kernel.cuh"
#include "bwd_kernel_d256.cuh"
#include "bwd_prepost.cuh"
#include "features.h"
#include "kernels.h"
#include "params.h"
#include "tma_host.h"
#include "tuning.h"
#include "varlen.cuh"

namespace fusedattn {
namespace hopper {

struct BwdLaunch {
  CUtensorMap tq, tk, tv, tdo;
  CUtensorMap tdq;  // fp32 map over p.dq_acc (the reduce-adds' target)
  BwdKParams p;
  void* dq;
  dim3 grid;
  int smem;
  int pre_blocks, post_blocks;
  long long n4;
  void (*pre)(BwdPreArgs) = nullptr;
  BwdPreArgs pre_args{};
  void (*kern)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, BwdKParams, CUtensorMap) = nullptr;
  void (*post)(const float*, void*, long long, float);
  // Deterministic mode (else null): launched instead of kern, with the n_cnt turn and ticket
  // counters (which the preprocess zeroes).
  void (*kern_det)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, BwdKParams, CUtensorMap, int*) = nullptr;
  int* dq_cnt = nullptr;
  long long n_cnt = 0;
  // The learnable softmax: the d_softmax_offset sum over dsink_per_bh partials per (row batch, head).
  float* d_sink = nullptr;
  int dsink_per_bh = 0;
  // Varlen: the prologue that builds the sequences' maps and zero-fills dk, dv where no sequence
  // owns a key (varlen.cuh), launched first.
  bool varlen = false;
  VarlenPrologue pro;
  int sm_count = 0;
};

// The maps of a call and the rows of its workspace: the whole tensors (b x s_q rows of q), or varlen
// the templates of its sequences' maps (varlen.cuh) over its rows (bwd_sm90_varlen_rows) and the
// prologue's map specs. dout_st: dout's strides over those rows (bwd_prepare's, which the preprocess
// reads too).
template <typename T, int D, int DQK, int DV, bool VARLEN>
inline bool bwd_maps(BwdLaunch* L, const Sm90BwdArgs& a, const BwdRows& rows, const BshdStrides& dout_st) {
  using Tile = BwdTile<D>;
  // The maps' head dims are the problem's: the columns up to D read as zeros. Strides all zero:
  // contiguous.
  auto desc = [](const void* ptr, BshdStrides st, int b, int s, int h, int d) {
    st = st.or_contiguous(s, h, d);
    return detail::MapDesc{ptr, b, s, h, d, st.b, st.s, st.h};
  };
  if constexpr (!VARLEN) {
    const detail::MapDesc mq = desc(a.q, a.q_strides, a.b, a.s_q, a.h, DQK);
    const detail::MapDesc mdo{a.dout, a.b, a.s_q, a.h, DV, dout_st.b, dout_st.s, dout_st.h};
    const detail::MapDesc mk = desc(a.k, a.k_strides, a.b, a.s_kv, a.h_kv, DQK);
    const detail::MapDesc mv = desc(a.v, a.v_strides, a.b, a.s_kv, a.h_kv, DV);
    return detail::make_map<T>(&L->tq, mq, Tile::BM) && detail::make_map<T>(&L->tdo, mdo, Tile::BM) &&
           detail::make_map<T>(&L->tk, mk, Tile::BN) && detail::make_map<T>(&L->tv, mv, Tile::BN) &&
           detail::make_dq_acc_map(&L->tdq, L->p.dq_acc, a.b, a.s_q, a.h, D);
  } else {
    const SeqlenParams& sl = a.seq.seqlens;
    // thd: one batch of the token dim (stride_b 0).
    const int s_q = sl.q_is_thd ? static_cast<int>(a.seq.t_q) : a.s_q;
    const int s_kv = sl.kv_is_thd ? static_cast<int>(a.seq.t_kv) : a.s_kv;
    const detail::MapDesc mq = desc(a.q, a.q_strides, a.b, s_q, a.h, DQK);
    const detail::MapDesc mdo{a.dout, a.b, s_q, a.h, DV, dout_st.b, dout_st.s, dout_st.h};
    const detail::MapDesc mk = desc(a.k, a.k_strides, a.b, s_kv, a.h_kv, DQK);
    const detail::MapDesc mv = desc(a.v, a.v_strides, a.b, s_kv, a.h_kv, DV);
    VarlenPrologue& pro = L->pro;
    pro = VarlenPrologue{};
    if (!varlen_map<T>(&L->tq, &pro.map[kMapQ], mq, false, Tile::BM) ||
        !varlen_map<T>(&L->tk, &pro.map[kMapK], mk, true, Tile::BN) ||
        !varlen_map<T>(&L->tv, &pro.map[kMapV], mv, true, Tile::BN) ||
        !varlen_map<T>(&L->tdo, &pro.map[kMapDO], mdo, false, Tile::BM) ||
        !detail::make_dq_acc_map(&L->tdq, L->p.dq_acc, 1, rows.s, a.h, D))
      return false;
    // The accumulator's rows are the workspace rows: [b, s_q] or thd [t_q].
    const int64_t acc_row = int64_t{a.h} * D * sizeof(float);
    pro.map[kMapDQ] = SeqMapSpec{reinterpret_cast<const char*>(L->p.dq_acc), sl.q_is_thd ? 0 : a.s_q * acc_row,
                                 acc_row, false};
    pro.tmpl[kMapQ] = L->tq;
    pro.tmpl[kMapK] = L->tk;
    pro.tmpl[kMapV] = L->tv;
    pro.tmpl[kMapDO] = L->tdo;
    pro.tmpl[kMapDQ] = L->tdq;
    pro.n_maps = kBwdSeqMaps;
    // dk, dv: contiguous in k's format.
    const int64_t es = sizeof(T);
    const auto fill = [&](void* g, int d) {
      const int64_t row = int64_t{a.h_kv} * d * es;
      return RowFill{static_cast<char*>(g), sl.kv_is_thd ? 0 : a.s_kv * row, row, d * es, a.h_kv,
                     static_cast<int>(d * es), true};
    };
    pro.fill[0] = fill(a.dk, DQK);
    pro.fill[1] = fill(a.dv, DV);
    pro.n_fill = 2;
    pro.seq = a.seq;
    pro.nseq = a.b;
    L->varlen = true;
    L->sm_count = a.sm_count;
    return true;
  }
}

// DET: the deterministic mode (d = 64, 128; a.ws of bwd_sm90_det_workspace_bytes()); GENERAL: the
// general kernel (features.h) for head dims DQK, DV on the tile of head dim D, else the plain one for
// a.causal; VARLEN: the general kernel on per-sequence lengths (a.ws of bwd_sm90_varlen_workspace()).
// Returns cudaErrorInvalidValue on arguments the kernels do not take or a failed map encode.
template <typename T, int D, bool DET, bool GENERAL = false, int DQK = D, int DV = D, bool SOFTCAP = false,
          bool VARLEN = false>
inline cudaError_t bwd_prepare(BwdLaunch* L, const Sm90BwdArgs& a) {
  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  static_assert(!DET || D != 256, "deterministic mode: d = 64, 128");
  static_assert(tile_head_dim(DQK, DV) == D && (GENERAL || (DQK == D && DV == D)), "head dims");
  static_assert(GENERAL || !VARLEN, "varlen: general kernels");
  using Tile = BwdTile<D>;
  if (a.b <= 0 || a.s_q <= 0 || a.s_kv <= 0 || a.h <= 0 || a.h_kv <= 0 || a.h % a.h_kv != 0 || a.h_kv > 65535 ||
      a.b > 65535)
    return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v) |
       reinterpret_cast<uintptr_t>(a.o) | reinterpret_cast<uintptr_t>(a.dout) | reinterpret_cast<uintptr_t>(a.ws) |
       reinterpret_cast<uintptr_t>(a.dq)) &
      15)
    return cudaErrorInvalidValue;
  // (varlen: the fills store 16-byte vectors)
  if ((reinterpret_cast<uintptr_t>(a.dk) | reinterpret_cast<uintptr_t>(a.dv)) & (VARLEN ? 15 : 3))
    return cudaErrorInvalidValue;
  // The workspace's query rows: b x s_q, or varlen's (thd: one per token).
  const BwdRows rows = VARLEN ? bwd_sm90_varlen_rows(a.b, a.s_q, a.seq.t_q, a.seq.seqlens.q_is_thd)
                              : BwdRows{a.b, a.s_q, bwd_sm90_s_pad(a.s_q)};
  const BwdVarlenWorkspace vws = bwd_sm90_varlen_workspace(rows, a.b, a.s_q, a.h, D);
  char* const wsb = static_cast<char*>(a.ws);
  float* ws = static_cast<float*>(a.ws);
  const size_t nacc = static_cast<size_t>(rows.b) * rows.s * a.h * D;
  const size_t nrow = static_cast<size_t>(rows.b) * a.h * rows.s_pad;
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
  p.s_pad = rows.s_pad;
  p.scale = a.scale;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.window_left = a.window_left;
  p.window_right = a.window_right;
  p.bottom_right = a.bottom_right ? 1 : 0;
  p.softcap_log2 = static_cast<float>(a.softcap * 1.4426950408889634);
  p.softcap_k2 = a.softcap > 0 ? static_cast<float>(2 * 1.4426950408889634 * a.scale / a.softcap) : 0.f;
  p.seq = a.seq;
  p.seq_maps = VARLEN ? seq_map_slots(wsb + vws.maps) : nullptr;
  const int n_kt = (a.s_kv + Tile::BN - 1) / Tile::BN;
  // The deterministic mode keeps its own order (tile_scheduler.cuh's bwd_work), general masks the
  // plain one.
  p.causal_chunk =
      DET || GENERAL ? 1 : causal_chunk_for(a.causal, a.causal_chunk, n_kt, int64_t{a.h_kv} * a.b, a.sm_count);
  // dout's strides over the workspace's rows (all zero: contiguous in q's format; thd: stride_b 0).
  const BshdStrides dout_st = a.do_strides.or_contiguous(rows.s, a.h, DV, VARLEN && a.seq.seqlens.q_is_thd);
  if (!bwd_maps<T, D, DQK, DV, VARLEN>(L, a, rows, dout_st)) return cudaErrorInvalidValue;
  if constexpr (VARLEN) L->pro.maps = const_cast<uint8_t*>(p.seq_maps);
  L->dq = a.dq;
  L->grid = dim3(n_kt, a.h_kv, a.b);
  const long long n_rows = static_cast<long long>(rows.b) * a.h * rows.s_pad;
  constexpr int kPreRowsPerBlock = 8 * kBwdPreRowsPerWarp<D>;  // 8 warps of 256 threads
  static_assert(kPreRowsPerBlock * D == 8 * 256, "params.h's bwd_sm90_pre_rows_per_block");
  L->pre_blocks = static_cast<int>((n_rows + kPreRowsPerBlock - 1) / kPreRowsPerBlock);
  L->n4 = static_cast<long long>(nacc / D * DQK / 4);  // float4 groups of dq
  L->post_blocks = static_cast<int>(std::min<long long>((L->n4 + 255) / 256, 132LL * 16));
  L->post = bwd_post_kernel<T, D, DQK>;
  // The kernel's features: general (varlen), or plain for the call's causality (index 1 causal, 0 not).
  using General = Features<kMaskGeneral, DQK == D ? 0 : DQK, DV == D ? 0 : DV, SOFTCAP, VARLEN>;
  using Causal = std::conditional_t<GENERAL, General, PlainFeatures<true>>;
  using NoMask = std::conditional_t<GENERAL, General, PlainFeatures<false>>;
  const int which = !GENERAL && a.causal ? 1 : 0;
  const void* main_kern;
  if constexpr (D == 256) {
    L->smem = BwdSmemD256<VARLEN>::kTotal;
    L->kern = which ? bwd_sm90_d256_kernel<T, Causal> : bwd_sm90_d256_kernel<T, NoMask>;
    main_kern = reinterpret_cast<const void*>(L->kern);
  } else if constexpr (DET) {
    L->smem = BwdSmem<D, VARLEN>::kTotal;
    L->kern_det = which ? bwd_sm90_det_kernel<T, D, Causal> : bwd_sm90_det_kernel<T, D, NoMask>;
    L->dq_cnt = reinterpret_cast<int*>(wsb + (VARLEN ? vws.counters : bwd_sm90_workspace_bytes(a.b, a.s_q, a.h, D)));
    L->n_cnt = bwd_sm90_det_counters(a.b, a.s_q, a.h, D);
    main_kern = reinterpret_cast<const void*>(L->kern_det);
  } else {
    L->smem = BwdSmem<D, VARLEN>::kTotal;
    L->kern = which ? bwd_sm90_kernel<T, D, Causal> : bwd_sm90_kernel<T, D, NoMask>;
    main_kern = reinterpret_cast<const void*>(L->kern);
  }
  BwdPreArgs& pa = L->pre_args;
  pa.o = a.o;
  pa.dout = a.dout;
  pa.dout_st = dout_st;
  pa.lse = a.lse;
  pa.lse2 = const_cast<float*>(p.lse2);
  pa.dsum = const_cast<float*>(p.dsum);
  pa.dq_acc = p.dq_acc;
  pa.b = rows.b;
  pa.s = rows.s;
  pa.h = a.h;
  pa.s_pad = rows.s_pad;
  pa.dq_cnt = L->dq_cnt;
  pa.n_cnt = L->n_cnt;
  L->pre = bwd_pre_kernel<T, D, DV>;
  if (GENERAL && a.softmax_type == 2 && a.d_softmax_offset != nullptr) {
    // The partials follow the variant's workspace (params.h's bwd_sm90_dsink_partials), varlen's
    // their own part.
    const size_t base = VARLEN ? vws.dsink
                        : DET  ? bwd_sm90_det_workspace_bytes(a.b, a.s_q, a.h, D)
                               : bwd_sm90_workspace_bytes(a.b, a.s_q, a.h, D);
    pa.softmax_offset = a.softmax_offset;
    pa.dsink_part = reinterpret_cast<float*>(wsb + base);
    L->d_sink = a.d_softmax_offset;
    L->dsink_per_bh = rows.s_pad / bwd_sm90_pre_rows_per_block(D);
  }
  static std::atomic<uint64_t> raised[2];  // per instantiation of this function and kernel
  return gpu::raise_smem_once(main_kern, static_cast<size_t>(L->smem), &raised[which]);
}

// (Varlen: the prologue,) preprocess, main and postprocess on one stream.
inline cudaError_t bwd_launch(const BwdLaunch& L, cudaStream_t stream) {
  const BwdKParams& p = L.p;
  if (L.varlen) {
    const cudaError_t e = varlen_prologue(L.pro, L.sm_count, stream);
    if (e != cudaSuccess) return e;
  }
  L.pre<<<L.pre_blocks, 256, 0, stream>>>(L.pre_args);
  if (L.d_sink != nullptr) {
    bwd_dsink_kernel<<<p.h, 32, 0, stream>>>(L.pre_args.dsink_part, L.d_sink, L.pre_args.b, p.h, L.dsink_per_bh);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (L.kern_det)
    L.kern_det<<<L.grid, dim3(kBwdThreads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.tdo, L.p, L.tdq, L.dq_cnt);
  else
    L.kern<<<L.grid, dim3(kBwdThreads), L.smem, stream>>>(L.tq, L.tk, L.tv, L.tdo, L.p, L.tdq);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (L.n4 > 0) L.post<<<L.post_blocks, 256, 0, stream>>>(p.dq_acc, L.dq, L.n4, p.scale);
  return cudaGetLastError();
}

template <typename T, int D, bool DET, bool GENERAL = false, int DQK = D, int DV = D, bool SOFTCAP = false,
          bool VARLEN = false>
inline cudaError_t bwd_run(const Sm90BwdArgs& a, cudaStream_t stream) {
  BwdLaunch L;
  const cudaError_t e = bwd_prepare<T, D, DET, GENERAL, DQK, DV, SOFTCAP, VARLEN>(&L, a);
  if (e != cudaSuccess) return e;
  return bwd_launch(L, stream);
}

// =================================================================== entries (kernels.h)
// Instantiated one per line of kernels.list (generated/).
template <typename T, int D>
cudaError_t run_bwd(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, D, false>(a, stream);
}
template <typename T, int D>
cudaError_t run_bwd_deterministic(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, D, true>(a, stream);
}
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_general(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, tile_head_dim(DQK, DV), false, true, DQK, DV, SOFTCAP>(a, stream);
}
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_general_deterministic(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, tile_head_dim(DQK, DV), true, true, DQK, DV, SOFTCAP>(a, stream);
}
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_varlen(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, tile_head_dim(DQK, DV), false, true, DQK, DV, SOFTCAP, true>(a, stream);
}
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_varlen_deterministic(const Sm90BwdArgs& a, cudaStream_t stream) {
  return bwd_run<T, tile_head_dim(DQK, DV), true, true, DQK, DV, SOFTCAP, true>(a, stream);
}

}  // namespace hopper
}  // namespace fusedattn
