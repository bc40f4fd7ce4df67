// What the Hopper kernels take: the host-side arguments of one call (Sm90Args, Sm90BwdArgs, filled
// by sm90.cu) and the parameter structs the kernels read from constant memory (KParams,
// BwdKParams). Tensors are [b, s, h, d] with their own (b, s, h) element strides and a unit
// head-dim stride; lse is fp32 [b, h, s_q] in natural log. Varlen calls (features.h's VARLEN) add
// per-sequence lengths: thd tensors are [t, h, d] (stride_b 0) and lse [h, t_q].
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/seq.cuh"  // gpu::SeqExtents
#include "tuning.h"        // BwdTile

namespace fusedattn {
namespace hopper {

// Forward kernel parameters (besides the q, k, v tensor maps).
struct KParams {
  void* o;  // [b, s_q, h, d] by o_s*, same dtype as q
  int64_t o_sb, o_ss, o_sh;
  float* lse;  // by lse_s*
  int64_t lse_sb, lse_sh, lse_ss;
  int b, s_q, s_kv, h, h_kv;
  float scale_log2;  // softmax scale * log2(e)
  int causal_chunk;  // one-tile causal order: (batch, head) groups per chunk (<= 1: none); tile_scheduler.cuh
  // The general kernels' window (fusedattn/visibility.h's, clamped; -1: unbounded) and diagonal, and
  // softmax: 0 vanilla, 1 off-by-one, 2 learnable (a sink logit softmax_offset[h] in the normaliser).
  int window_left, window_right, bottom_right;
  int softmax_type;
  const float* softmax_offset;
  // Softcap kernels: softcap log2(e) (the capped scores' scale in the softmax) and 2 log2(e) scale /
  // softcap (softmax.cuh's softcap_scores).
  float softcap_log2, softcap_k2;
  // Varlen kernels: the sequences (s_q, s_kv their maximum lengths) and their tensor maps
  // (varlen.cuh's seq_map: q, k, v of each sequence), which the varlen prologue builds.
  gpu::SeqExtents seq;
  const uint8_t* seq_maps;
};

// Backward main-kernel parameters (besides the tensor maps). The workspace holds the fp32 dQ
// accumulator and the per-row lse2 / Dsum, padded to s_pad rows.
struct BwdKParams {
  float* dq_acc;      // [b, s_q, h, D] fp32, zeroed by the preprocess kernel
  const float* lse2;  // [b, h, s_pad] (log2 domain, +inf padding)
  const float* dsum;  // [b, h, s_pad] (0 padding)
  void* dk;           // [b, s_kv, h_kv, D]
  void* dv;           // [b, s_kv, h_kv, D]
  int b, s_q, s_kv, h, h_kv, s_pad;
  float scale_log2;  // softmax scale * log2(e)
  float scale;       // softmax scale
  int causal_chunk;  // causal, not deterministic: (kv head, batch) groups per chunk of the key-tile order
  int window_left, window_right, bottom_right;  // as KParams's
  float softcap_log2, softcap_k2;              // as KParams's
  // Varlen kernels: as KParams's (seq_maps: q, k, v, dO and the dQ accumulator of each sequence). The
  // workspace rows are bwd_sm90_varlen_rows' (thd: one per token), lse2 / Dsum slices
  // BwdSmemLayout::kRowFloats long from the 4-aligned row below a tile's first.
  gpu::SeqExtents seq;
  const uint8_t* seq_maps;
};

namespace detail {
// A [b, s, hh, d] tensor given by element strides (unit stride on d), as the tensor maps take it.
// The strides must be multiples of 8 elements (16 bytes).
struct MapDesc {
  const void* ptr;
  int b, s, hh, d;
  int64_t stride_b, stride_s, stride_h;
};
}  // namespace detail

// One forward call's tensors and settings.
struct Sm90Args {
  detail::MapDesc q, k, v;  // k, v: hh = h_kv
  KParams out;              // o, lse and their strides; b, s_q, s_kv, h, h_kv; scale_log2; the window
  bool causal;
  // The device's SM count: the persistent grid and the one-tile causal order's chunk (0, unknown:
  // group by group).
  int sm_count = 0;
  int causal_chunk = 0;  // > 0: that chunk instead of tuning.h's choice
  // Varlen: a workspace of fwd_sm90_varlen_workspace_bytes(), 16-byte aligned (q, k, v, out, lse
  // strides as FwdParams's: thd has stride_b 0).
  void* ws = nullptr;
};

// Element strides of a [b, s, h, d] tensor with a unit head-dim stride; all zero means contiguous.
struct BshdStrides {
  int64_t b = 0, s = 0, h = 0;
  // These strides, or where all are zero those of a contiguous [., s_len, h_len, d] tensor (thd: b 0).
  BshdStrides or_contiguous(int64_t s_len, int64_t h_len, int64_t d, bool thd = false) const {
    if (b != 0 || s != 0 || h != 0) return *this;
    return BshdStrides{thd ? 0 : s_len * h_len * d, h_len * d, d};
  }
};

// One backward call. q, k, v, dout: any BshdStrides whose byte strides are multiples of 16 (the
// tensor maps and the preprocess's 16-byte loads take them); o, dq, dk, dv contiguous bshd; lse fp32
// [b, h, s_q]. ws: a workspace of
// bwd_sm90_workspace_bytes() bytes (bwd_sm90_det_workspace_bytes() when deterministic), 16-byte
// aligned.
struct Sm90BwdArgs {
  const void *q, *k, *v, *o, *dout;
  BshdStrides q_strides, k_strides, v_strides, do_strides;
  const float* lse;
  void *dq, *dk, *dv;
  void* ws;
  int b, s_q, s_kv, h, h_kv;
  float scale;
  bool causal;
  // The causal key-tile order: groups per chunk, 0 for tuning.h's choice, which needs the device's
  // SM count (0, unknown: group by group).
  int causal_chunk = 0;
  int sm_count = 0;
  // The general kernels' window and diagonal (KParams's), softmax type and learnable offset, and
  // d_softmax_offset (fp32 [h], learnable only; the workspace then also holds
  // bwd_sm90_dsink_partials() floats).
  int window_left = -1, window_right = -1;
  bool bottom_right = false;
  int softmax_type = 0;
  const float* softmax_offset = nullptr;
  float* d_softmax_offset = nullptr;
  double softcap = 0;  // > 0: the softcap kernels' cap
  // Varlen kernels: the sequences (b of them; s_q, s_kv their maximum lengths). q, k, v strides as
  // FwdParams's (thd: stride_b 0), dout's as q's; o, dq contiguous in q's format, dk, dv in k's, lse contiguous
  // ([b, h, s_q] or thd [h, t_q]); ws of bwd_sm90_varlen_workspace().
  gpu::SeqExtents seq{};
};

// The backward's workspace: the fp32 dQ accumulator [b, s_q, h, d], then lse2 and Dsum rows
// [b, h, s_pad] (s_q padded to kBwdRowPad, at least every BM, so that a query tile's row slice is
// whole), 256 bytes of slack; the deterministic mode adds its dQ turn counters.
constexpr int kBwdRowPad = 128;

inline int bwd_sm90_s_pad(int s_q) { return (s_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad; }

inline size_t bwd_sm90_workspace_bytes(int b, int s_q, int h, int d) {
  const size_t nacc = static_cast<size_t>(b) * s_q * h * d;
  const size_t nrow = static_cast<size_t>(b) * h * bwd_sm90_s_pad(s_q);
  return (nacc + 2 * nrow) * sizeof(float) + 256;
}

// DET variant (d = 64, 128): one int32 turn counter per (batch, head, query tile, consumer), then
// the ticket counter (bwd_common.cuh), placed after the bwd_sm90_workspace_bytes() bytes of the other
// variants.
inline long long bwd_sm90_det_counters(int b, int s_q, int h, int d) {
  const int bm = d == 64 ? BwdTile<64>::BM : BwdTile<128>::BM;
  return static_cast<long long>(b) * h * ((s_q + bm - 1) / bm) * 2 + 1;
}
inline size_t bwd_sm90_det_workspace_bytes(int b, int s_q, int h, int d) {
  return bwd_sm90_workspace_bytes(b, s_q, h, d) +
         static_cast<size_t>(bwd_sm90_det_counters(b, s_q, h, d)) * sizeof(int);
}

// The learnable softmax's d_softmax_offset partial sums: one per preprocess block (bwd_prepost.cuh:
// 8 warps of 256 / d rows each, within one (batch, head)), after the bytes of the variants above.
inline int bwd_sm90_pre_rows_per_block(int d) { return 8 * (256 / d); }
inline long long bwd_sm90_dsink_partials(int b, int s_q, int h, int d) {
  return static_cast<long long>(b) * h * (bwd_sm90_s_pad(s_q) / bwd_sm90_pre_rows_per_block(d));
}

// ---- varlen (features.h's VARLEN)
// Per-sequence tensor maps (varlen.cuh): 128 bytes each, 128-byte aligned in the workspace (one slot
// of slack for the alignment).
constexpr size_t kSeqMapBytes = 128;
inline size_t seq_maps_bytes(int nseq, int maps_per_seq) {
  return (static_cast<size_t>(nseq) * maps_per_seq + 1) * kSeqMapBytes;
}
inline size_t fwd_sm90_varlen_workspace_bytes(int nseq) { return seq_maps_bytes(nseq, 3); }

// The varlen backward's query rows as its preprocess, workspace and postprocess see them: b x s rows
// (bshd / sbhd with a padding mask: the call's b x s_q; thd: 1 x t_q, a row per token, whichever
// sequence owns it) with lse2 / Dsum rows padded to s_pad, kBwdRowPad + 4 past the rows: a
// sequence's query tile may start at any token and reads BM + 4 of them from the 4-aligned row below
// its first (the bulk copy's 16-byte alignment).
struct BwdRows {
  int b, s, s_pad;
};
inline BwdRows bwd_sm90_varlen_rows(int b, int s_q, int64_t t_q, bool thd) {
  const int s = thd ? static_cast<int>(t_q) : s_q;
  return BwdRows{thd ? 1 : b, s, bwd_sm90_s_pad(s + kBwdRowPad + 4)};
}
// Its workspace: the dQ accumulator, lse2 and Dsum over the rows, the deterministic mode's turn
// counters (per batch, head and query tile of the longest sequence, as bwd_sm90_det_counters) and the
// d_softmax_offset partials (per preprocess block), then the five maps of each sequence; byte offsets.
struct BwdVarlenWorkspace {
  size_t lse2, dsum, counters, dsink, maps, bytes;
};
inline BwdVarlenWorkspace bwd_sm90_varlen_workspace(const BwdRows& r, int b, int s_q, int h, int d) {
  BwdVarlenWorkspace w;
  const size_t nacc = static_cast<size_t>(r.b) * r.s * h * d;
  const size_t nrow = static_cast<size_t>(r.b) * h * r.s_pad;
  w.lse2 = nacc * sizeof(float);
  w.dsum = w.lse2 + nrow * sizeof(float);
  w.counters = w.dsum + nrow * sizeof(float) + 256;
  w.dsink = w.counters + static_cast<size_t>(bwd_sm90_det_counters(b, s_q, h, d)) * sizeof(int);
  w.maps = w.dsink + (nrow / bwd_sm90_pre_rows_per_block(d)) * sizeof(float);
  w.bytes = w.maps + seq_maps_bytes(b, 5);
  return w;
}

}  // namespace hopper
}  // namespace fusedattn
