// Workspace layout of the SIMT backward (host-side, shared by the launcher
// and the workspace-size query).
#pragma once

#include <cstddef>

#include "fusedattn/params.h"

namespace fusedattn {
namespace simt {

// Workspace of one backward call, in the accumulation type: dq_acc
// [rows, h_q, d_qk], dsum [rows, h_q], dbias_acc [dbias numel], and for fp64
// lse2 [rows, h_q] (the rows' log-sum-exps recomputed in double, log2 units);
// rows = t_q for thd, b * s_q otherwise. Each part starts on a 256-byte boundary.
struct BwdWorkspace {
  size_t dq_off = 0, dsum_off = 0, dbias_off = 0, lse2_off = 0, bytes = 0;
  size_t dq_bytes = 0, dbias_bytes = 0, lse2_bytes = 0;
};

inline BwdWorkspace bwd_workspace(const BwdParams& bp, size_t acc_size) {
  const FwdParams& p = bp.fwd;
  const Problem& pr = p.prob;
  const auto up = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t rows = static_cast<size_t>(p.seqlens.q_is_thd ? pr.t_q : pr.b * pr.s_q);
  BwdWorkspace w;
  w.dq_bytes = rows * pr.h_q * pr.d_qk * acc_size;
  const size_t dsum_bytes = rows * pr.h_q * acc_size;
  if (bp.dbias.data != nullptr) {
    w.dbias_bytes = acc_size * bp.dbias.sizes[0] * bp.dbias.sizes[1] * bp.dbias.sizes[2] * bp.dbias.sizes[3];
  }
  if (acc_size == sizeof(double)) w.lse2_bytes = dsum_bytes;
  w.dq_off = 0;
  w.dsum_off = up(w.dq_bytes);
  w.dbias_off = w.dsum_off + up(dsum_bytes);
  w.lse2_off = w.dbias_off + up(w.dbias_bytes);
  w.bytes = w.lse2_off + up(w.lse2_bytes);
  return w;
}

// The workspace's parts as the kernels use them (lse2 null except for fp64).
template <class A>
struct BwdBuffers {
  A* dq_acc;
  A* dsum;
  A* dbias_acc;  // null without a broadcast-reduced dbias
  A* lse2;
};

template <class A>
BwdBuffers<A> bwd_buffers(const BwdWorkspace& w, void* workspace) {
  char* ws = static_cast<char*>(workspace);
  return BwdBuffers<A>{reinterpret_cast<A*>(ws + w.dq_off), reinterpret_cast<A*>(ws + w.dsum_off),
                       w.dbias_bytes > 0 ? reinterpret_cast<A*>(ws + w.dbias_off) : nullptr,
                       w.lse2_bytes > 0 ? reinterpret_cast<A*>(ws + w.lse2_off) : nullptr};
}

}  // namespace simt
}  // namespace fusedattn
