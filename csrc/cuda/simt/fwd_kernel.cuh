// SIMT forward: one block per (query tile, head, batch entry), online softmax
// over key tiles (FlashAttention-2's schedule) with CUDA-core FMAs.
//
// Per key tile: K^T -> smem, S = Q K^T in registers, mask / bias / ALiBi,
// running max and sum, P (dropped and rescaled) -> smem, V -> smem (reusing
// K^T's buffer), O += P V in registers. Q is pre-scaled by scale * log2(e) so
// that the softmax runs on exp2 (a softcap, common.cuh's SoftCap, works in those units).
//
// kLseOnly: the fp64 backward's pass that recomputes every row's log-sum-exp in double (the op's
// softmax_lse is fp32, whose rounding would bound the gradients near 1e-8): no P V and no outputs,
// and the logits formed as the backward forms them (q . k summed in the same order, then times
// scale * log2(e)), so that the backward's probabilities match these up to the last bits.
#pragma once

#include "aux_kernels.cuh"
#include "common.cuh"
#include "simt.h"
#include "tile_config.h"

namespace fusedattn {
namespace simt {

template <class T, int DPAD>
struct FwdLayout {
  using A = AccT<T>;
  using C = FwdTile<A, DPAD>;
  static constexpr int VEC = 16 / sizeof(A);  // elements per 16-byte smem access
  static constexpr int PAD = VEC;             // row padding: conflict-free 16-byte column walks
  static constexpr int CV = DPAD / (C::VS * C::TX);  // output column chunks per thread
  static_assert(DPAD % (C::VS * C::TX) == 0, "head-dim bucket must be a multiple of a thread row's width");
  static constexpr int QS = DPAD + PAD;  // Q row stride
  static constexpr int KS = C::BK + PAD;  // K^T row stride (one row per head-dim index)
  static constexpr int VST = DPAD + PAD;  // V row stride
  static constexpr int PS = C::BK + PAD;  // P row stride
  static constexpr int KV_ELEMS = DPAD * KS > C::BK * VST ? DPAD * KS : C::BK * VST;
  static constexpr size_t kSmemBytes = sizeof(A) * (size_t(C::BQ) * QS + KV_ELEMS + size_t(C::BQ) * PS);
};

struct FwdFlags {
  bool q_vec, k_vec, v_vec;
};

// A row's log-sum-exp in log2 units from its running max m and sum l (both in log2 units), with a
// softmax sink of logit `sink` (natural units) in the normaliser: the sink alone (or -inf) for a row
// that saw no key; NaN for a NaN row.
template <class A>
__device__ __forceinline__ A row_lse2_of(A l, A m, bool has_sink, A sink) {
  const A s2 = sink * Consts<A>::kLog2e;
  if (l == A(0)) return has_sink ? s2 : neg_inf<A>();
  if (!has_sink) return m + fast_log2(l);
  const A top = fmax(m, s2);
  return top + fast_log2(l * fast_exp2(m - top) + fast_exp2(s2 - top));
}

// row_lse2 (kLseOnly): [rows, h_q] log-sum-exps in log2 units, rows indexed as ws_row.
template <class T, int DPAD, bool kLseOnly>
__global__ void __launch_bounds__(FwdTile<AccT<T>, DPAD>::NT, 2)
    fwd_kernel(const FwdParams p, const FwdFlags fl, AccT<T>* row_lse2) {
  using A = AccT<T>;
  using L = FwdLayout<T, DPAD>;
  using C = typename L::C;
  constexpr int NT = C::NT, BQ = C::BQ, BK = C::BK, VS = C::VS, TX = C::TX, TY = C::TY, RQ = C::RQ;
  constexpr int VEC = L::VEC, CV = L::CV, QS = L::QS, KS = L::KS, VST = L::VST, PS = L::PS;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* Qs = reinterpret_cast<A*>(smem_raw);
  A* KVs = Qs + BQ * QS;
  A* Ps = KVs + L::KV_ELEMS;
  __shared__ A red[NT / 32];

  const Problem& pr = p.prob;
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  const int b = blockIdx.z, h = blockIdx.y;
  const int hk = h / static_cast<int>(pr.h_q / pr.h_kv);
  const int q0 = static_cast<int>(blockIdx.x) * BQ;
  const int dqk = static_cast<int>(pr.d_qk), dv = static_cast<int>(pr.d_v);
  const SeqInfo si = seq_info(p, b);
  const bool q_thd = p.seqlens.q_is_thd;
  T* out = static_cast<T*>(p.out.data);

  if (q0 >= si.len_q) {
    if (kLseOnly) return;
    // Padded rows of bshd/sbhd (thd rows past a sequence belong to other
    // sequences or to gaps, which were zero-filled before this launch).
    if (!q_thd) {
      const int nr = static_cast<int>(min64(BQ, pr.s_q - q0));
      for (int e = tid; e < nr * dv; e += NT) {
        const int r = e / dv, c = e % dv;
        out[row_base(p.out, b, q0 + r, h) + c * p.out.stride_d] = from_acc<T>(A(0));
      }
      for (int r = tid; r < nr; r += NT) {
        p.lse[b * p.lse_stride_b + h * p.lse_stride_h + (q0 + r) * p.lse_stride_s] = -INFINITY;
      }
    }
    return;
  }
  const int q_end = min(q0 + BQ, si.len_q);  // real rows [q0, q_end)

  LogitBias<T, A> lb;
  lb.init(p, b, h);
  SoftCap<A> cap;
  cap.init(p);
  DeviceDropout<A> drop;
  drop.init(p.dropout);
  const int64_t bh = int64_t(b) * pr.h_q + h;
  const A scale_l2 = static_cast<A>(p.scale) * Consts<A>::kLog2e;

  load_tile<NT, false>(Qs, QS, static_cast<const T*>(p.q.data) + row_base(p.q, b, si.tok_q + q0, h), p.q.stride_s,
                       p.q.stride_d, fl.q_vec, static_cast<int>(q_end - q0), BQ, dqk, dqk, kLseOnly ? A(1) : scale_l2);

  // Keys any row of the tile can see.
  const int j_lo = key_range(si, q0).lo, j_hi = key_range(si, q_end - 1).hi;

  A m_run[RQ], l_run[RQ], o[RQ][CV][VS];
#pragma unroll
  for (int r = 0; r < RQ; ++r) {
    m_run[r] = neg_inf<A>();
    l_run[r] = A(0);
#pragma unroll
    for (int cc = 0; cc < CV; ++cc)
#pragma unroll
      for (int u = 0; u < VS; ++u) o[r][cc][u] = A(0);
  }
  A mx = neg_inf<A>();  // largest visible logit this thread saw (log2 units)

  // A paged KV cache (inference) is read through its page table, key by key;
  // otherwise k/v rows of sequence b are strided from its first token.
  const bool paged = p.paged.page_table != nullptr;
  const T* kbase = static_cast<const T*>(p.k.data) + (paged ? 0 : row_base(p.k, b, si.tok_kv, hk));
  const T* vbase = static_cast<const T*>(p.v.data) + (paged ? 0 : row_base(p.v, b, si.tok_kv, hk));

  for (int j0 = (j_lo / BK) * BK; j0 < j_hi; j0 += BK) {
    const int kv_valid = min(BK, si.len_kv - j0);
    __syncthreads();  // the previous tile's V is consumed
    if (paged) {
      load_tile_rows<NT, true, T, A>(
          KVs, KS, [&](int r) { return paged_kv_row<T>(p.paged, p.k, b, j0 + r, hk); }, p.k.stride_d, fl.k_vec,
          kv_valid, BK, dqk, dqk, A(1));
    } else {
      load_tile<NT, true>(KVs, KS, kbase + int64_t(j0) * p.k.stride_s, p.k.stride_s, p.k.stride_d, fl.k_vec, kv_valid,
                          BK, dqk, dqk, A(1));
    }
    __syncthreads();

    A s[RQ][VS];
#pragma unroll
    for (int r = 0; r < RQ; ++r)
#pragma unroll
      for (int u = 0; u < VS; ++u) s[r][u] = A(0);
#pragma unroll 2
    for (int k = 0; k < dqk; k += VEC) {
      A qv[RQ][VEC];
#pragma unroll
      for (int r = 0; r < RQ; ++r) lds<VEC>(Qs + (ty + TY * r) * QS + k, qv[r]);
#pragma unroll
      for (int kk = 0; kk < VEC; ++kk) {
        A kv[VS];
        lds<VS>(KVs + (k + kk) * KS + VS * tx, kv);
#pragma unroll
        for (int r = 0; r < RQ; ++r)
#pragma unroll
          for (int u = 0; u < VS; ++u) s[r][u] = fma(qv[r][kk], kv[u], s[r][u]);
      }
    }

    const bool full = tile_all_visible(p, si, q0, BQ, j0, BK);
#pragma unroll
    for (int r = 0; r < RQ; ++r) {
      const int i = q0 + ty + TY * r;
      const KeyRange kr = key_range(si, i);
#pragma unroll
      for (int u = 0; u < VS; ++u) {
        const int j = j0 + VS * tx + u;
        if (full || visible(p, kr, b, h, i, j)) {
          const A qk = kLseOnly ? s[r][u] * scale_l2 : s[r][u];
          const A x = (cap.on ? cap.cap * cap.tanh_of(qk) : qk) + lb.at(b, h, i, j, si.vis);
          mx = max_nan(mx, x);
          s[r][u] = x;
        } else {
          s[r][u] = neg_inf<A>();
        }
      }
      A tmax = s[r][0];
#pragma unroll
      for (int u = 1; u < VS; ++u) tmax = max_nan(tmax, s[r][u]);
      tmax = group_max<TX>(tmax);
      const A m_new = max_nan(m_run[r], tmax);
      const A m_use = m_new == neg_inf<A>() ? A(0) : m_new;  // no visible key yet: p = 0 below
      const A alpha = fast_exp2(m_run[r] - m_use);
      m_run[r] = m_new;
      l_run[r] *= alpha;
#pragma unroll
      for (int cc = 0; cc < CV; ++cc)
#pragma unroll
        for (int u = 0; u < VS; ++u) o[r][cc][u] *= alpha;
      A pv[VS];
#pragma unroll
      for (int u = 0; u < VS; ++u) {
        pv[u] = fast_exp2(s[r][u] - m_use);
        l_run[r] += pv[u];
      }
      if (kLseOnly) continue;
      if (drop.on && i < si.len_q) {
        A f[VS];
        drop.template factors<VS>(bh, i, j0 + VS * tx, f);
#pragma unroll
        for (int u = 0; u < VS; ++u) pv[u] *= f[u];
      }
      sts<VS>(Ps + (ty + TY * r) * PS + VS * tx, pv);
    }
    if (kLseOnly) continue;  // the next tile's barrier orders K^T's reuse
    __syncthreads();  // K^T consumed, P complete
    if (paged) {
      load_tile_rows<NT, false, T, A>(
          KVs, VST, [&](int r) { return paged_kv_row<T>(p.paged, p.v, b, j0 + r, hk); }, p.v.stride_d, fl.v_vec,
          kv_valid, BK, dv, DPAD, A(1));
    } else {
      load_tile<NT, false>(KVs, VST, vbase + int64_t(j0) * p.v.stride_s, p.v.stride_s, p.v.stride_d, fl.v_vec,
                           kv_valid, BK, dv, DPAD, A(1));
    }
    __syncthreads();

#pragma unroll 1
    for (int jj = 0; jj < BK; jj += VEC) {
      A pr_[RQ][VEC];
#pragma unroll
      for (int r = 0; r < RQ; ++r) lds<VEC>(Ps + (ty + TY * r) * PS + jj, pr_[r]);
#pragma unroll
      for (int kk = 0; kk < VEC; ++kk) {
#pragma unroll
        for (int cc = 0; cc < CV; ++cc) {
          A vv[VS];
          lds<VS>(KVs + (jj + kk) * VST + VS * tx + VS * TX * cc, vv);
#pragma unroll
          for (int r = 0; r < RQ; ++r)
#pragma unroll
            for (int u = 0; u < VS; ++u) o[r][cc][u] = fma(pr_[r][kk], vv[u], o[r][cc][u]);
        }
      }
    }
  }

  // Epilogue: the sink joins the normaliser, rows are written with their lse.
  const bool has_sink = p.softmax.type != SoftmaxType::kVanilla;
  const A sink = p.softmax.type == SoftmaxType::kLearnable ? static_cast<A>(p.softmax.offset[h]) : A(0);
#pragma unroll
  for (int r = 0; r < RQ; ++r) {
    const A l = group_sum<TX>(l_run[r]);
    const int i = q0 + ty + TY * r;
    if (i >= pr.s_q) continue;
    if (q_thd && i >= si.len_q) continue;  // another sequence's token
    if (kLseOnly) {
      if (tx == 0 && i < si.len_q) {
        row_lse2[ws_row(p, si, b, i) * pr.h_q + h] = row_lse2_of(l, m_run[r], has_sink, sink);
      }
      continue;
    }
    T* orow = out + row_base(p.out, b, si.tok_q + i, h);
    float* lse = p.lse + b * p.lse_stride_b + h * p.lse_stride_h + (si.tok_q + i) * p.lse_stride_s;
    A f = A(0);
    float lse_v;
    if (i >= si.len_q) {
      lse_v = -INFINITY;  // padded row
    } else if (l == A(0)) {  // a NaN row goes on: NaN output and lse
      lse_v = has_sink ? static_cast<float>(sink) : -INFINITY;  // no visible key: zero output
    } else if (!has_sink) {
      f = A(1) / l;
      lse_v = static_cast<float>((m_run[r] + fast_log2(l)) * Consts<A>::kLn2);
    } else {
      const A s2 = sink * Consts<A>::kLog2e;
      const A top = fmax(m_run[r], s2);
      const A a = fast_exp2(m_run[r] - top);
      const A denom = l * a + fast_exp2(s2 - top);
      f = a / denom;
      lse_v = static_cast<float>((top + fast_log2(denom)) * Consts<A>::kLn2);
    }
#pragma unroll
    for (int cc = 0; cc < CV; ++cc)
#pragma unroll
      for (int u = 0; u < VS; ++u) {
        const int c = VS * tx + u + VS * TX * cc;
        if (c < dv) orow[c * p.out.stride_d] = from_acc<T>(o[r][cc][u] * f);
      }
    if (tx == 0) *lse = lse_v;
  }

  if (!kLseOnly && p.max_logit != nullptr) {
    mx = group_max<32>(mx);
    if (tid % 32 == 0) red[tid / 32] = mx;
    __syncthreads();
    if (tid == 0) {
      A m = red[0];
      for (int w = 1; w < NT / 32; ++w) m = max_nan(m, red[w]);
      if (m != neg_inf<A>()) atomic_max_float(p.max_logit + h, static_cast<float>(m * Consts<A>::kLn2));
    }
  }
}

template <class T, int DPAD, bool kLseOnly>
Status launch_fwd_tile(const FwdParams& p, cudaStream_t stream, AccT<T>* row_lse2) {
  using L = FwdLayout<T, DPAD>;
  using C = typename L::C;
  const auto kernel = fwd_kernel<T, DPAD, kLseOnly>;
  static std::atomic<uint64_t> smem_ready{0};
  FUSEDATTN_RETURN_IF_ERROR(prepare_smem(kernel, L::kSmemBytes, "forward", &smem_ready));
  const FwdFlags fl{gpu::rows16(p.q), gpu::rows16(p.k), gpu::rows16(p.v)};
  const dim3 grid(static_cast<unsigned>(ceil_div(p.prob.s_q, C::BQ)), static_cast<unsigned>(p.prob.h_q),
                  static_cast<unsigned>(p.prob.b));
  kernel<<<grid, C::NT, L::kSmemBytes, stream>>>(p, fl, row_lse2);
  return check_launch(kLseOnly ? "backward lse kernel" : "forward kernel");
}

// The forward kernel over every query tile (kLseOnly: the rows' log2-lse into row_lse2 only); no
// launch without query rows (a zero grid dimension is a launch error).
template <class T, bool kLseOnly>
Status launch_fwd_rows(const FwdParams& p, cudaStream_t stream, AccT<T>* row_lse2) {
  const Problem& pr = p.prob;
  if (pr.s_q == 0 || pr.h_q == 0 || pr.b == 0) return Status::Ok();
  switch (head_dim_bucket(pr.d_qk > pr.d_v ? pr.d_qk : pr.d_v)) {
    case 64: return launch_fwd_tile<T, 64, kLseOnly>(p, stream, row_lse2);
    case 128: return launch_fwd_tile<T, 128, kLseOnly>(p, stream, row_lse2);
    default: return launch_fwd_tile<T, 256, kLseOnly>(p, stream, row_lse2);
  }
}

template <class T>
Status launch_fwd(const FwdParams& p, const CudaLaunch& launch) {
  const Problem& pr = p.prob;
  cudaStream_t stream = static_cast<cudaStream_t>(launch.stream);
  if (p.seqlens.q_is_thd && pr.t_q > 0) {
    // Tokens of no sequence: zero output, lse -inf (the CPU engine's rule).
    zero_rows_kernel<T><<<aux_blocks(pr.t_q * pr.h_q * pr.d_v), kAuxThreads, 0, stream>>>(
        p.out, 1, pr.t_q, static_cast<int>(pr.h_q), static_cast<int>(pr.d_v));
    FUSEDATTN_RETURN_IF_ERROR(check_launch("forward zero-fill"));
    fill_lse_kernel<<<aux_blocks(pr.t_q * pr.h_q), kAuxThreads, 0, stream>>>(
        p.lse, p.lse_stride_h, p.lse_stride_s, static_cast<int>(pr.h_q), pr.t_q, -INFINITY);
    FUSEDATTN_RETURN_IF_ERROR(check_launch("forward lse fill"));
  }
  if (p.max_logit != nullptr && pr.h_q > 0) {
    fill_kernel<<<1, kAuxThreads, 0, stream>>>(p.max_logit, pr.h_q, -INFINITY);
    FUSEDATTN_RETURN_IF_ERROR(check_launch("forward max_logit fill"));
  }
  return launch_fwd_rows<T, false>(p, stream, nullptr);
}

}  // namespace simt
}  // namespace fusedattn
