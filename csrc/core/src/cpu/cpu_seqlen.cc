#include "cpu_seqlen.h"

#include <algorithm>
#include <string>

namespace fusedattn {
namespace cpu {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Lengths from cu (or the fixed length when cu is null) and starts from
// offsets (thd) or 0. `side` is "q" or "kv" and `s_name` what bounds a
// bshd/sbhd length, for messages.
Status fill_side(const char* side, int64_t batch, const int32_t* cu, const int32_t* offsets, bool thd, int64_t s,
                 int64_t t, bool q_side, const std::string& s_name, std::vector<SeqExtent>* seq) {
  const std::string cu_name = std::string("cu_seqlens_") + side;
  const std::string off_name = offsets == cu ? cu_name : cu_name + "_padded";
  if (thd && offsets == nullptr) {
    return Status::Invalid("thd format for " + std::string(side) + " needs " + cu_name);
  }
  for (int64_t b = 0; b < batch; ++b) {
    int64_t len = s;
    if (cu != nullptr) {
      if (cu[b + 1] < cu[b]) {
        return Status::Invalid(cu_name + " must be non-decreasing; got " + cu_name + "[" + str(b + 1) +
                               "] = " + str(cu[b + 1]) + " < " + cu_name + "[" + str(b) + "] = " + str(cu[b]));
      }
      len = static_cast<int64_t>(cu[b + 1]) - cu[b];
    }
    // In thd, s is max_seqlen when given, else the token count t.
    if (thd && len > t) {
      return Status::Invalid(cu_name + " gives sequence " + str(b) + " the length " + str(len) +
                             ", more than the token dim (" + str(t) + ")");
    }
    if (len > s) {
      return Status::Invalid(cu_name + " gives sequence " + str(b) + " the length " + str(len) + ", more than " +
                             (thd ? std::string("max_seqlen_") + side : s_name) + " (" + str(s) + ")");
    }
    int64_t start = 0;
    if (thd) {
      start = offsets[b];
      if (start < 0) {
        return Status::Invalid(off_name + "[" + str(b) + "] = " + str(start) + " must be >= 0");
      }
      if (start + len > t) {
        return Status::Invalid(off_name + " places sequence " + str(b) + " at tokens [" + str(start) + ", " +
                               str(start + len) + "), beyond the token dim (" + str(t) + ")");
      }
      if (b + 1 < batch && start + len > offsets[b + 1]) {
        return Status::Invalid(off_name + " makes sequences " + str(b) + " and " + str(b + 1) +
                               " overlap: sequence " + str(b) + " covers tokens [" + str(start) + ", " +
                               str(start + len) + ") but " + off_name + "[" + str(b + 1) + "] = " +
                               str(offsets[b + 1]));
      }
    }
    SeqExtent& e = (*seq)[b];
    if (q_side) {
      e.len_q = len;
      e.tok_q = start;
    } else {
      e.len_kv = len;
      e.tok_kv = start;
    }
  }
  return Status::Ok();
}

}  // namespace

Status make_seq_layout(const FwdParams& p, SeqLayout* out) {
  const Problem& pr = p.prob;  // validated by check_fwd / check_bwd
  SeqLayout lay;
  lay.q_thd = p.seqlens.q_is_thd;
  lay.kv_thd = p.seqlens.kv_is_thd;
  lay.s_q = pr.s_q;
  lay.s_kv = pr.s_kv;
  lay.t_q = pr.t_q;
  lay.t_kv = pr.t_kv;
  lay.seq.resize(static_cast<size_t>(pr.b));
  const SeqlenParams& sl = p.seqlens;
  const PagedKV& pk = p.paged;
  const std::string kv_bound = pk.page_table == nullptr
                                   ? std::string("the sequence dim")
                                   : "what its page_table row holds, " + str(pk.max_pages) + " pages of " +
                                         str(pk.page_size) + " slots";
  FUSEDATTN_RETURN_IF_ERROR(fill_side("q", pr.b, sl.cu_seqlens_q, sl.offsets_q, lay.q_thd, pr.s_q, pr.t_q, true,
                                      "the sequence dim", &lay.seq));
  FUSEDATTN_RETURN_IF_ERROR(fill_side("kv", pr.b, sl.cu_seqlens_kv, sl.offsets_kv, lay.kv_thd, pr.s_kv, pr.t_kv,
                                      false, kv_bound, &lay.seq));
  *out = std::move(lay);
  return Status::Ok();
}

std::vector<TokenRange> uncovered_tokens(const SeqLayout& lay, bool q_side) {
  std::vector<TokenRange> r;
  const bool thd = q_side ? lay.q_thd : lay.kv_thd;
  if (!thd) {
    const int64_t s = q_side ? lay.s_q : lay.s_kv;
    for (size_t b = 0; b < lay.seq.size(); ++b) {
      const int64_t len = q_side ? lay.seq[b].len_q : lay.seq[b].len_kv;
      if (len < s) r.push_back({static_cast<int64_t>(b), len, s});
    }
    return r;
  }
  // Sequences are sorted and disjoint (validated), so the gaps are the complement.
  int64_t pos = 0;
  for (const SeqExtent& e : lay.seq) {
    const int64_t start = q_side ? e.tok_q : e.tok_kv;
    const int64_t len = q_side ? e.len_q : e.len_kv;
    if (len == 0) continue;
    if (start > pos) r.push_back({0, pos, start});
    pos = std::max(pos, start + len);
  }
  const int64_t t = q_side ? lay.t_q : lay.t_kv;
  if (pos < t) r.push_back({0, pos, t});
  return r;
}

}  // namespace cpu
}  // namespace fusedattn
