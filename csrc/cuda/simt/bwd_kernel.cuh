// SIMT backward, FlashAttention-2's schedule:
//   1. D = rowsum(dO * O)                          (bwd_dot_kernel)
//   2. one block per (key tile, kv head, batch entry): K^T and V^T of the tile
//      stay in smem; for every query head of the GQA group and every query
//      tile that can see the keys, recompute P = exp(S - lse), then
//        dV += P_dropped^T dO,  dP = dO V^T,  dS = P * (dP_dropped - D),
//        dK += dS^T Q (registers, no atomics: the block owns its keys and
//        loops over the group's heads itself),
//        dQ += dS K   (fp32/fp64 atomics into a workspace),
//        dbias += dS  (atomics into a workspace, reduced over broadcast dims)
//   3. dq / dbias converted from their workspaces.
// fp64 first recomputes every row's log-sum-exp in double (fwd_kernel.cuh's kLseOnly pass) and
// reads it instead of the op's fp32 softmax_lse, so that the gradients are float64-accurate.
// dQ's atomics make dq (and a broadcast dbias) non-deterministic in the last
// bits; dk, dv and d_softmax_offset are deterministic.
#pragma once

#include <type_traits>

#include "aux_kernels.cuh"
#include "common.cuh"
#include "fwd_kernel.cuh"
#include "simt.h"
#include "tile_config.h"
#include "workspace.h"

namespace fusedattn {
namespace simt {

template <class T, int DPAD>
struct BwdLayout {
  using A = AccT<T>;
  using C = BwdTile<A, DPAD>;
  static constexpr int VEC = 16 / sizeof(A);
  static constexpr int PAD = VEC;
  static constexpr int QS = DPAD + PAD;   // Q / dO row stride
  static constexpr int KS = C::BK + PAD;  // K^T / V^T / P / dS row stride
  // dK/dV tile [BK x DPAD]: 16 threads along d (VEC columns each, chunks of
  // 16 * VEC), NT / 16 along keys.
  static constexpr int TX2 = 16, TY2 = C::NT / TX2, RK = C::BK / TY2, CV2 = DPAD / (TX2 * VEC);
  // dQ tile [BQ x DPAD]: 16 threads along d with a stride of 16 columns (so a
  // warp reads K^T rows in distinct banks), NT / 16 along queries.
  static constexpr int TY3 = C::NT / 16, RQ3 = C::BQ / TY3, CC3 = DPAD / 16;
  static constexpr int CH = CC3 < 8 ? CC3 : 8;  // dQ columns accumulated per pass
  static_assert(RK >= 1 && C::BK % TY2 == 0 && CV2 >= 1 && RQ3 >= 1 && C::BQ % TY3 == 0, "bad backward tile");
  static constexpr size_t kSmemBytes =
      sizeof(A) * (2 * size_t(C::BQ) * QS + 2 * size_t(DPAD) * KS + 2 * size_t(C::BQ) * KS + 2 * size_t(C::BQ));
};

struct BwdFlags {
  bool q_vec, k_vec, v_vec, do_vec;
};

template <class T, int DPAD>
__global__ void __launch_bounds__(BwdTile<AccT<T>, DPAD>::NT, (sizeof(AccT<T>) == 4 ? 2 : 1))
    bwd_kv_kernel(const BwdParams bp, const BwdFlags fl, const BwdBuffers<AccT<T>> buf) {
  using A = AccT<T>;
  using L = BwdLayout<T, DPAD>;
  using C = typename L::C;
  constexpr int NT = C::NT, BQ = C::BQ, BK = C::BK, VS = C::VS, TX = C::TX, TY = C::TY, RQ = C::RQ;
  constexpr int VEC = L::VEC, QS = L::QS, KS = L::KS;
  constexpr int TX2 = L::TX2, TY2 = L::TY2, RK = L::RK, CV2 = L::CV2, TY3 = L::TY3, RQ3 = L::RQ3, CC3 = L::CC3,
                CH = L::CH;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* Qs = reinterpret_cast<A*>(smem_raw);
  A* dOs = Qs + BQ * QS;
  A* Kt = dOs + BQ * QS;
  A* Vt = Kt + DPAD * KS;
  A* Ps = Vt + DPAD * KS;
  A* dSs = Ps + BQ * KS;
  A* lse_s = dSs + BQ * KS;
  A* dd_s = lse_s + BQ;

  const FwdParams& p = bp.fwd;
  const Problem& pr = p.prob;
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX, tx2 = tid % TX2, ty2 = tid / TX2;
  const int b = blockIdx.z, hk = blockIdx.y;
  const int group = static_cast<int>(pr.h_q / pr.h_kv);
  const int k0 = static_cast<int>(blockIdx.x) * BK;
  const int dqk = static_cast<int>(pr.d_qk), dv = static_cast<int>(pr.d_v);
  const SeqInfo si = seq_info(p, b);
  const bool kv_thd = p.seqlens.kv_is_thd;
  T* dk_out = static_cast<T*>(bp.dk.data);
  T* dv_out = static_cast<T*>(bp.dv.data);

  if (k0 >= si.len_kv) {
    if (!kv_thd) {  // padded keys of bshd/sbhd get zero gradients
      const int nr = static_cast<int>(min64(BK, pr.s_kv - k0));
      for (int e = tid; e < nr * dqk; e += NT) {
        dk_out[row_base(bp.dk, b, k0 + e / dqk, hk) + (e % dqk) * bp.dk.stride_d] = from_acc<T>(A(0));
      }
      for (int e = tid; e < nr * dv; e += NT) {
        dv_out[row_base(bp.dv, b, k0 + e / dv, hk) + (e % dv) * bp.dv.stride_d] = from_acc<T>(A(0));
      }
    }
    return;
  }
  const int k_end = min(k0 + BK, si.len_kv);
  const int kv_valid = k_end - k0;
  load_tile<NT, true>(Kt, KS, static_cast<const T*>(p.k.data) + row_base(p.k, b, si.tok_kv + k0, hk), p.k.stride_s,
                      p.k.stride_d, fl.k_vec, kv_valid, BK, dqk, dqk, A(1));
  load_tile<NT, true>(Vt, KS, static_cast<const T*>(p.v.data) + row_base(p.v, b, si.tok_kv + k0, hk), p.v.stride_s,
                      p.v.stride_d, fl.v_vec, kv_valid, BK, dv, dv, A(1));

  // Query rows that can see any key of the tile.
  const int i_lo = si.vis.row_lo(k0), i_hi = si.vis.row_hi(k_end - 1);

  A dk[RK][CV2][VEC], dvv[RK][CV2][VEC];
#pragma unroll
  for (int r = 0; r < RK; ++r)
#pragma unroll
    for (int cc = 0; cc < CV2; ++cc)
#pragma unroll
      for (int u = 0; u < VEC; ++u) dk[r][cc][u] = dvv[r][cc][u] = A(0);

  DeviceDropout<A> drop;
  drop.init(p.dropout);
  SoftCap<A> cap;
  cap.init(p);
  const A scale_l2 = static_cast<A>(p.scale) * Consts<A>::kLog2e;
  const PairTensor& db = bp.dbias;

  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    const int64_t bh = int64_t(b) * pr.h_q + h;
    LogitBias<T, A> lb;
    lb.init(p, b, h);
    for (int i0 = (i_lo / BQ) * BQ; i0 < i_hi; i0 += BQ) {
      const int rows_valid = min(BQ, si.len_q - i0);
      __syncthreads();  // the previous tile's Q, dO, P, dS are consumed
      load_tile<NT, false>(Qs, QS, static_cast<const T*>(p.q.data) + row_base(p.q, b, si.tok_q + i0, h),
                           p.q.stride_s, p.q.stride_d, fl.q_vec, rows_valid, BQ, dqk, DPAD, A(1));
      load_tile<NT, false>(dOs, QS, static_cast<const T*>(bp.dout.data) + row_base(bp.dout, b, si.tok_q + i0, h),
                           bp.dout.stride_s, bp.dout.stride_d, fl.do_vec, rows_valid, BQ, dv, DPAD, A(1));
      for (int r = tid; r < BQ; r += NT) {
        const int i = i0 + r;
        const bool ok = r < rows_valid;
        const int64_t wr = ok ? ws_row(p, si, b, i) * pr.h_q + h : 0;
        if (!ok) {
          lse_s[r] = A(0);
        } else if (buf.lse2 != nullptr) {
          lse_s[r] = buf.lse2[wr];
        } else {
          lse_s[r] = static_cast<A>(p.lse[b * p.lse_stride_b + h * p.lse_stride_h + (si.tok_q + i) * p.lse_stride_s]) *
                     Consts<A>::kLog2e;
        }
        dd_s[r] = ok ? buf.dsum[wr] : A(0);
      }
      __syncthreads();

      // S = Q K^T and dP = dO V^T for this thread's RQ x VS elements.
      A s[RQ][VS], dp[RQ][VS];
#pragma unroll
      for (int r = 0; r < RQ; ++r)
#pragma unroll
        for (int u = 0; u < VS; ++u) s[r][u] = dp[r][u] = A(0);
#pragma unroll 2
      for (int k = 0; k < dqk; k += VEC) {
        A qv[RQ][VEC];
#pragma unroll
        for (int r = 0; r < RQ; ++r) lds<VEC>(Qs + (ty + TY * r) * QS + k, qv[r]);
#pragma unroll
        for (int kk = 0; kk < VEC; ++kk) {
          A kv[VS];
          lds<VS>(Kt + (k + kk) * KS + VS * tx, kv);
#pragma unroll
          for (int r = 0; r < RQ; ++r)
#pragma unroll
            for (int u = 0; u < VS; ++u) s[r][u] = fma(qv[r][kk], kv[u], s[r][u]);
        }
      }
#pragma unroll 2
      for (int k = 0; k < dv; k += VEC) {
        A ov[RQ][VEC];
#pragma unroll
        for (int r = 0; r < RQ; ++r) lds<VEC>(dOs + (ty + TY * r) * QS + k, ov[r]);
#pragma unroll
        for (int kk = 0; kk < VEC; ++kk) {
          A vt[VS];
          lds<VS>(Vt + (k + kk) * KS + VS * tx, vt);
#pragma unroll
          for (int r = 0; r < RQ; ++r)
#pragma unroll
            for (int u = 0; u < VS; ++u) dp[r][u] = fma(ov[r][kk], vt[u], dp[r][u]);
        }
      }

      const bool full = tile_all_visible(p, si, i0, BQ, k0, BK);
#pragma unroll
      for (int r = 0; r < RQ; ++r) {
        const int row = ty + TY * r;
        const int i = i0 + row;
        const KeyRange kr = key_range(si, i);
        A f[VS];
#pragma unroll
        for (int u = 0; u < VS; ++u) f[u] = A(1);
        if (drop.on && i < si.len_q) drop.template factors<VS>(bh, i, k0 + VS * tx, f);
        A pd[VS], ds[VS];
#pragma unroll
        for (int u = 0; u < VS; ++u) {
          const int j = k0 + VS * tx + u;
          pd[u] = ds[u] = A(0);
          if (full || visible(p, kr, b, h, i, j)) {
            A x = s[r][u] * scale_l2, dcap = A(1);
            if (cap.on) {
              const A t = cap.tanh_of(x);
              x = cap.cap * t;
              dcap = A(1) - t * t;
            }
            x += lb.at(b, h, i, j, si.vis);
            const A pe = fast_exp2(x - lse_s[row]);
            pd[u] = pe * f[u];
            ds[u] = pe * (dp[r][u] * f[u] - dd_s[row]);
            if (buf.dbias_acc != nullptr) {  // the bias is added after the cap: its gradient is dS itself
              const int64_t bb = db.sizes[0] == 1 ? 0 : b, hh = db.sizes[1] == 1 ? 0 : h;
              const int64_t ii = db.sizes[2] == 1 ? 0 : i, jj = db.sizes[3] == 1 ? 0 : j;
              atomicAdd(buf.dbias_acc + ((bb * db.sizes[1] + hh) * db.sizes[2] + ii) * db.sizes[3] + jj, ds[u]);
            }
            ds[u] *= dcap;
          }
        }
        sts<VS>(Ps + row * KS + VS * tx, pd);
        sts<VS>(dSs + row * KS + VS * tx, ds);
      }
      __syncthreads();

      // dV += P_dropped^T dO, dK += dS^T Q.
      for (int ir = 0; ir < rows_valid; ++ir) {
        A pcol[RK], dscol[RK];
#pragma unroll
        for (int r = 0; r < RK; ++r) {
          pcol[r] = Ps[ir * KS + ty2 + TY2 * r];
          dscol[r] = dSs[ir * KS + ty2 + TY2 * r];
        }
#pragma unroll
        for (int cc = 0; cc < CV2; ++cc) {
          A ov[VEC], qv[VEC];
          lds<VEC>(dOs + ir * QS + VEC * tx2 + TX2 * VEC * cc, ov);
          lds<VEC>(Qs + ir * QS + VEC * tx2 + TX2 * VEC * cc, qv);
#pragma unroll
          for (int r = 0; r < RK; ++r)
#pragma unroll
            for (int u = 0; u < VEC; ++u) {
              dvv[r][cc][u] = fma(pcol[r], ov[u], dvv[r][cc][u]);
              dk[r][cc][u] = fma(dscol[r], qv[u], dk[r][cc][u]);
            }
        }
      }

      // dQ += dS K, accumulated in the workspace.
#pragma unroll
      for (int r3 = 0; r3 < RQ3; ++r3) {
        const int row = ty2 + TY3 * r3;
        const int i = i0 + row;
#pragma unroll
        for (int cc0 = 0; cc0 < CC3; cc0 += CH) {
          if (16 * cc0 >= dqk) break;
          A acc[CH];
#pragma unroll
          for (int ch = 0; ch < CH; ++ch) acc[ch] = A(0);
#pragma unroll 2
          for (int j = 0; j < BK; j += VEC) {
            A dsv[VEC];
            lds<VEC>(dSs + row * KS + j, dsv);
#pragma unroll
            for (int ch = 0; ch < CH; ++ch) {
              A kv[VEC];
              lds<VEC>(Kt + (tx2 + 16 * (cc0 + ch)) * KS + j, kv);
#pragma unroll
              for (int u = 0; u < VEC; ++u) acc[ch] = fma(dsv[u], kv[u], acc[ch]);
            }
          }
          if (row < rows_valid) {
            A* dst = buf.dq_acc + (ws_row(p, si, b, i) * pr.h_q + h) * dqk;
#pragma unroll
            for (int ch = 0; ch < CH; ++ch) {
              const int c = tx2 + 16 * (cc0 + ch);
              if (c < dqk) atomicAdd(dst + c, acc[ch]);
            }
          }
        }
      }
    }
  }

  // dK = scale * dS^T Q, dV; keys past the sequence get zeros (bshd/sbhd).
  const A scale = static_cast<A>(p.scale);
#pragma unroll
  for (int r = 0; r < RK; ++r) {
    const int j = k0 + ty2 + TY2 * r;
    if (j >= pr.s_kv || (kv_thd && j >= si.len_kv)) continue;
    const bool real = j < si.len_kv;
    T* dkrow = dk_out + row_base(bp.dk, b, si.tok_kv + j, hk);
    T* dvrow = dv_out + row_base(bp.dv, b, si.tok_kv + j, hk);
#pragma unroll
    for (int cc = 0; cc < CV2; ++cc)
#pragma unroll
      for (int u = 0; u < VEC; ++u) {
        const int c = VEC * tx2 + u + TX2 * VEC * cc;
        if (c < dqk) dkrow[c * bp.dk.stride_d] = from_acc<T>(real ? dk[r][cc][u] * scale : A(0));
        if (c < dv) dvrow[c * bp.dv.stride_d] = from_acc<T>(real ? dvv[r][cc][u] : A(0));
      }
  }
}

template <class T, int DPAD>
Status launch_bwd_tile(const BwdParams& bp, cudaStream_t stream, const BwdBuffers<AccT<T>>& buf) {
  using L = BwdLayout<T, DPAD>;
  using C = typename L::C;
  const FwdParams& p = bp.fwd;
  const auto kernel = bwd_kv_kernel<T, DPAD>;
  static std::atomic<uint64_t> smem_ready{0};
  FUSEDATTN_RETURN_IF_ERROR(prepare_smem(kernel, L::kSmemBytes, "backward", &smem_ready));
  const BwdFlags fl{gpu::rows16(p.q), gpu::rows16(p.k), gpu::rows16(p.v),
                    gpu::rows16(bp.dout)};
  const dim3 grid(static_cast<unsigned>(ceil_div(p.prob.s_kv, C::BK)), static_cast<unsigned>(p.prob.h_kv),
                  static_cast<unsigned>(p.prob.b));
  kernel<<<grid, C::NT, L::kSmemBytes, stream>>>(bp, fl, buf);
  return check_launch("backward kernel");
}

template <class T>
Status launch_bwd(const BwdParams& bp, const CudaLaunch& launch) {
  using A = AccT<T>;
  const FwdParams& p = bp.fwd;
  const Problem& pr = p.prob;
  cudaStream_t stream = static_cast<cudaStream_t>(launch.stream);
  const BwdWorkspace w = bwd_workspace(bp, sizeof(A));  // plan_bwd's size; run_bwd_cuda checked the launch's
  const BwdBuffers<A> buf = bwd_buffers<A>(w, launch.workspace);
  if (w.dq_bytes > 0) {
    FUSEDATTN_RETURN_IF_ERROR(cuda_error(cudaMemsetAsync(buf.dq_acc, 0, w.dq_bytes, stream), "memset"));
  }
  if (w.dbias_bytes > 0) {
    FUSEDATTN_RETURN_IF_ERROR(cuda_error(cudaMemsetAsync(buf.dbias_acc, 0, w.dbias_bytes, stream), "memset"));
  }
  if constexpr (std::is_same_v<A, double>) {  // bwd_workspace gives fp64 its lse2
    FUSEDATTN_RETURN_IF_ERROR((launch_fwd_rows<T, true>(p, stream, buf.lse2)));
  }
  const bool any_rows = pr.s_q > 0 && pr.h_q > 0 && pr.b > 0;
  // Key rows no attention block writes: thd gaps, or every key when there are
  // no query rows at all.
  const bool kv_thd = p.seqlens.kv_is_thd;
  if ((kv_thd || !any_rows) && pr.h_kv > 0) {
    const int64_t nb = kv_thd ? 1 : pr.b, ntok = kv_thd ? pr.t_kv : pr.s_kv;
    if (nb * ntok > 0) {
      zero_rows_kernel<T><<<aux_blocks(nb * ntok * pr.h_kv * pr.d_qk), kAuxThreads, 0, stream>>>(
          bp.dk, nb, ntok, static_cast<int>(pr.h_kv), static_cast<int>(pr.d_qk));
      FUSEDATTN_RETURN_IF_ERROR(check_launch("backward zero-fill"));
      zero_rows_kernel<T><<<aux_blocks(nb * ntok * pr.h_kv * pr.d_v), kAuxThreads, 0, stream>>>(
          bp.dv, nb, ntok, static_cast<int>(pr.h_kv), static_cast<int>(pr.d_v));
      FUSEDATTN_RETURN_IF_ERROR(check_launch("backward zero-fill"));
    }
  }
  if (any_rows) {
    const dim3 grid(static_cast<unsigned>(ceil_div(pr.s_q, 8)), static_cast<unsigned>(pr.h_q),
                    static_cast<unsigned>(pr.b));
    bwd_dot_kernel<T><<<grid, 256, 0, stream>>>(bp, buf.dsum);
    FUSEDATTN_RETURN_IF_ERROR(check_launch("backward dO.O kernel"));
  }
  if (bp.d_softmax_offset != nullptr && pr.h_q > 0) {
    bwd_softmax_offset_kernel<T><<<static_cast<unsigned>(pr.h_q), kAuxThreads, 0, stream>>>(bp, buf);
    FUSEDATTN_RETURN_IF_ERROR(check_launch("backward softmax-offset kernel"));
  }
  if (any_rows && pr.s_kv > 0) {
    Status st;
    switch (head_dim_bucket(pr.d_qk > pr.d_v ? pr.d_qk : pr.d_v)) {
      case 64: st = launch_bwd_tile<T, 64>(bp, stream, buf); break;
      case 128: st = launch_bwd_tile<T, 128>(bp, stream, buf); break;
      default: st = launch_bwd_tile<T, 256>(bp, stream, buf); break;
    }
    FUSEDATTN_RETURN_IF_ERROR(st);
  }
  if (w.dq_bytes > 0) {
    const int64_t n = static_cast<int64_t>(w.dq_bytes / sizeof(A));
    convert_dq_kernel<T><<<aux_blocks(n), kAuxThreads, 0, stream>>>(bp, buf.dq_acc);
    FUSEDATTN_RETURN_IF_ERROR(check_launch("backward dq conversion"));
  }
  if (buf.dbias_acc != nullptr) {
    convert_dbias_kernel<T><<<aux_blocks(static_cast<int64_t>(w.dbias_bytes / sizeof(A))), kAuxThreads, 0, stream>>>(
        bp.dbias, buf.dbias_acc);
    FUSEDATTN_RETURN_IF_ERROR(check_launch("backward dbias conversion"));
  }
  return Status::Ok();
}

}  // namespace simt
}  // namespace fusedattn
