// The kernels' view of one call: a flat struct of pointers, element strides
// and pre-computed scalars, filled on the host from FwdParams / BwdParams in
// one function (make_kargs in dispatch.cu) and passed by value as a
// __grid_constant__ parameter. Also the per-sequence helpers every kernel
// shares; visibility is fusedattn/visibility.h's rule (seq_vis).
#pragma once

#include <cstdint>

#include "fusedattn/visibility.h"

namespace fusedattn {
namespace tc {

// What a main-kernel instantiation handles (kernels.list's variant column). kFast: windows, causal
// and padding masks; kSoftcap: kFast with capped logits (FwdParams::softcap); kGeneral: post-scale
// bias, ALiBi, boolean mask, dropout, dbias and softcap too, each a runtime branch.
enum class Variant { kFast, kSoftcap, kGeneral };

struct KArgs {
  // q, k, v and the forward output (an output in forward, an input in backward).
  const void* q;
  const void* k;
  const void* v;
  void* o;
  int64_t q_sb, q_ss, q_sh;
  int64_t k_sb, k_ss, k_sh;
  int64_t v_sb, v_ss, v_sh;
  int64_t o_sb, o_ss, o_sh;
  float* lse;  // (b, h, token) with the strides below
  int64_t lse_sb, lse_sh, lse_ss;
  float* max_logit;  // [h_q] or null

  // sequences
  const int32_t* cu_q;   // null: every sequence has length s_q
  const int32_t* cu_kv;
  const int32_t* off_q;  // thd token offsets; null for bshd/sbhd
  const int32_t* off_kv;
  int64_t t_q, t_kv;  // thd token dims: offsets are clamped into them
  int q_thd, kv_thd;
  int b, h_q, h_kv, group, s_q, s_kv, d_qk, d_v;

  // visibility (MaskParams' windows: -1 or at most s_q + s_kv)
  int wl, wr, bottom_right;
  const uint8_t* mask;  // bool, true = masked out; null when absent
  int64_t mk_sb, mk_sh, mk_si, mk_sj;

  // bias: 0 none, 1 post-scale tensor, 2 ALiBi
  int bias_type;
  const void* bias;
  int64_t bs_sb, bs_sh, bs_si, bs_sj;
  const float* alibi;
  int64_t al_sb, al_sh;

  // softmax: 0 vanilla, 1 off-by-one, 2 learnable
  int softmax_type;
  const float* sink;  // [h_q], learnable

  // dropout
  int dropout;
  uint32_t drop_thr;
  float rp_drop;  // 1 / (1 - p)
  const int64_t* rng;

  float scale, scale_log2;
  // softcap (FwdParams::softcap; 0: off): logits softcap * tanh(scale q.k / softcap).
  float softcap;
  float softcap_scale;  // scale / softcap: tanh's argument per unit of q.k
  float softcap_log2;   // softcap * log2(e): the capped logit in the softmax's log2 units

  // ---- backward only ----
  const void* dout;
  int64_t do_sb, do_ss, do_sh;
  void* dq;
  void* dk;
  void* dv;
  int64_t dq_sb, dq_ss, dq_sh;
  int64_t dk_sb, dk_ss, dk_sh;
  int64_t dv_sb, dv_ss, dv_sh;
  void* dbias;  // q's dtype, contiguous, bias's own (possibly broadcast) shape
  int64_t db_sizes[4];
  int64_t db_sb, db_sh, db_si, db_sj;
  int dbias_direct;  // 1: full shape, each element written once; 0: fp32 atomics into dbias_acc
  float* dbias_acc;
  float* d_sink;  // [h_q], learnable
  // workspace: dq accumulator [rows_q][h_q][kD] and row statistics [h_q][rows_q]
  float* dq_acc;
  float* lse2;  // lse * log2(e), +inf for rows that see no key or lie past the sequence
  float* dsum;  // rowsum(dO * O)
  int64_t rows_q;  // t_q (thd) or b * s_q
  int acc_d;       // the head-dim bucket: row length of dq_acc
  // Deterministic backward only (null otherwise; see BwdParams::deterministic).
  int* dq_lock;       // [b][h_q][dq_lock_mt]: key-tile blocks done adding into each query tile's dQ,
                      // then one ticket counter (bwd_kernel.h: blocks take their tile in arrival order)
  int dq_lock_mt;     // query tiles per (b, h_q): ceil(s_q / 16), enough for any kBlockM
  float* dsink_part;  // [h_q][b][preprocess blocks]: d_softmax_offset partial sums, reduced in order
};

struct SeqInfo {
  int len_q, len_kv;
  int64_t off_q, off_kv;  // token index of position 0 (thd), else 0
};

__device__ __forceinline__ SeqInfo seq_info(const KArgs& a, int b) {
  SeqInfo s;
  int lq = a.s_q, lk = a.s_kv;
  if (a.cu_q) lq = a.cu_q[b + 1] - a.cu_q[b];
  if (a.cu_kv) lk = a.cu_kv[b + 1] - a.cu_kv[b];
  // Lengths beyond the declared maxima would index bias/mask out of bounds.
  s.len_q = max(0, min(lq, a.s_q));
  s.len_kv = max(0, min(lk, a.s_kv));
  s.off_q = a.off_q ? a.off_q[b] : 0;
  s.off_kv = a.off_kv ? a.off_kv[b] : 0;
  // thd offsets come from the device too: a sequence is kept inside the token
  // dim, so inconsistent cu_seqlens give wrong rows, never an out-of-bounds
  // access (the CPU engine, which can read them, reports them as errors).
  if (a.off_q) {
    s.off_q = s.off_q < 0 ? 0 : (s.off_q > a.t_q ? a.t_q : s.off_q);
    s.len_q = static_cast<int>(s.len_q < a.t_q - s.off_q ? s.len_q : a.t_q - s.off_q);
  }
  if (a.off_kv) {
    s.off_kv = s.off_kv < 0 ? 0 : (s.off_kv > a.t_kv ? a.t_kv : s.off_kv);
    s.len_kv = static_cast<int>(s.len_kv < a.t_kv - s.off_kv ? s.len_kv : a.t_kv - s.off_kv);
  }
  return s;
}

// Row of a query in the workspace's per-row arrays: its token for thd, else b * s_q + i.
__device__ __forceinline__ int64_t q_row_token(const KArgs& a, const SeqInfo& sq, int b, int i) {
  return a.q_thd ? sq.off_q + i : static_cast<int64_t>(b) * a.s_q + i;
}

// The sequence's visibility rule (fusedattn/visibility.h). Windows arrive clamped to s_q + s_kv
// (make_fwd_params), which the engine keeps below 2^30, so everything stays inside int.
__device__ __forceinline__ Visibility<int> seq_vis(const KArgs& a, const SeqInfo& s) {
  return Visibility<int>::make(a.wl, a.wr, a.bottom_right, s.len_q, s.len_kv);
}

}  // namespace tc
}  // namespace fusedattn
