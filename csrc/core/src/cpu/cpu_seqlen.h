// Sequence extents of the CPU engine: per batch entry, the query/key lengths
// and the first token of each sequence in the token dim, read from the host
// cu_seqlens and validated (the CPU engine can look at them, unlike a GPU
// launch); plus the token ranges that no sequence covers, which outputs fill
// with zeros.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_isa.h"
#include "fusedattn/params.h"

namespace fusedattn {
namespace cpu {
inline namespace FUSEDATTN_CPU_ISA {

struct SeqExtent {
  int64_t len_q = 0, len_kv = 0;
  int64_t tok_q = 0, tok_kv = 0;  // token of position 0 (0 for bshd/sbhd)
};

struct SeqLayout {
  std::vector<SeqExtent> seq;  // one per batch entry
  bool q_thd = false, kv_thd = false;
  int64_t s_q = 0, s_kv = 0;  // sequence dims (bshd/sbhd) or max seqlens (thd)
  int64_t t_q = 0, t_kv = 0;  // token dims (thd)
};

// Validates the problem dims and cu_seqlens and fills the layout.
Status make_seq_layout(const FwdParams& p, SeqLayout* out);

// A run of tokens [begin, end) of batch entry b (b = 0 for thd, whose b stride is 0).
struct TokenRange {
  int64_t b, begin, end;
};

// Token ranges of the query (q_side) or key side not covered by any sequence:
// positions len..s-1 of each batch entry for bshd/sbhd, gaps between packed
// sequences (and the tail) for thd.
std::vector<TokenRange> uncovered_tokens(const SeqLayout& lay, bool q_side);

}  // namespace FUSEDATTN_CPU_ISA
}  // namespace cpu
}  // namespace fusedattn
