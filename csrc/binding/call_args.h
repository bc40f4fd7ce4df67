// Operator arguments -> the core's FwdArgs / inputs. Shared by every backend's implementation so
// that all of them read a call the same way. `Call` is an attention operator's call struct
// (op_impl.h, kv_cache_impl.h): it has q and the FUSEDATTN_SETTINGS and FUSEDATTN_OPTIONAL_INPUTS members
// by name.
#pragma once

#include "bridge.h"
#include "op_spec.h"

namespace fusedattn::binding {

template <class Call>
FwdArgs make_args(const Call& s, bool return_max_logit) {
  FwdArgs a;
  raise_if_error(parse_format(s.q_format, &a.q_format));
  raise_if_error(parse_format(s.kv_format, &a.kv_format));
  raise_if_error(parse_mask_type(s.mask_type, &a.mask_type));
  raise_if_error(parse_softmax_type(s.softmax_type, &a.softmax_type));
  a.window_left = s.window_left;
  a.window_right = s.window_right;
  a.bottom_right_diagonal = static_cast<int>(s.bottom_right_diagonal);
  a.scale = s.scale;
  a.softcap = s.softcap;
  a.dropout_p = s.dropout_p;
  a.max_seqlen_q = s.max_seqlen_q;
  a.max_seqlen_kv = s.max_seqlen_kv;
  a.return_max_logit = return_max_logit;
  return a;
}

// k and v: the call's keys and values (a KV-cache step's caches).
template <class Call>
FwdInputs make_inputs(const Call& t, const Tensor& k, const Tensor& v, const OptTensor& rng_state,
                      const OptTensor& page_table) {
  FwdInputs in;
  in.q = to_ref(t.q, "q");
  in.k = to_ref(k, "k");
  in.v = to_ref(v, "v");
  in.bias = to_ref(t.bias, "core_attention_bias");
  in.softmax_offset = to_ref(t.softmax_offset, "softmax_offset");
  in.attn_mask = to_ref(t.attn_mask, "attention_mask");
  in.alibi_slopes = to_ref(t.alibi_slopes, "alibi_slopes");
  in.cu_seqlens_q = to_ref(t.cu_seqlens_q, "cu_seqlens_q");
  in.cu_seqlens_kv = to_ref(t.cu_seqlens_kv, "cu_seqlens_kv");
  in.cu_seqlens_q_padded = to_ref(t.cu_seqlens_q_padded, "cu_seqlens_q_padded");
  in.cu_seqlens_kv_padded = to_ref(t.cu_seqlens_kv_padded, "cu_seqlens_kv_padded");
  in.rng_state = to_ref(rng_state, "rng_state");
  in.page_table = to_ref(page_table, "page_table");
  return in;
}

}  // namespace fusedattn::binding
