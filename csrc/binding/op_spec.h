// The operators' argument lists, written once. schema.cpp builds the schema strings from these
// lists, op_impl.h the implementations' parameter lists and the unpacking into the core's args, so
// schema, signature and unpacking cannot disagree; python/fusedattn/_ops.py reads the order from
// the registered schema, and tests/test_contract.py checks FwdArgs, BwdArgs and the fakes against it.
//
//   fwd(q, k, v, <optional inputs>, rng_state, <settings>, return_max_logit, page_table=None)
//   bwd(dout, q, k, v, out, softmax_lse, rng_state, <optional inputs>, <settings>, need_dbias)
//   fwd_kvcache(q, new_k, new_v, k_cache!, v_cache!, cache_seqlens, page_table, <optional inputs>,
//               <settings>, return_max_logit)
#pragma once

// X(name): a `Tensor?` input of both operators, in schema order.
#define FUSEDATTN_OPTIONAL_INPUTS(X) \
  X(bias)                            \
  X(softmax_offset)                  \
  X(attn_mask)                       \
  X(alibi_slopes)                    \
  X(cu_seqlens_q)                    \
  X(cu_seqlens_kv)                   \
  X(cu_seqlens_q_padded)             \
  X(cu_seqlens_kv_padded)

// X(schema type, C++ parameter type, name): the non-tensor settings of both operators, in schema
// order; each is a field of the core's FwdArgs (csrc/core/include/fusedattn/attn_args.h).
#define FUSEDATTN_SETTINGS(X)                      \
  X("str", const std::string&, q_format)           \
  X("str", const std::string&, kv_format)          \
  X("str", const std::string&, mask_type)          \
  X("int", int64_t, window_left)                   \
  X("int", int64_t, window_right)                  \
  X("int", int64_t, bottom_right_diagonal)         \
  X("str", const std::string&, softmax_type)       \
  X("float", double, scale)                        \
  X("float", double, softcap)                      \
  X("float", double, dropout_p)                    \
  X("SymInt", int64_t, max_seqlen_q)               \
  X("SymInt", int64_t, max_seqlen_kv)

#define FUSEDATTN_SCHEMA_OPTIONAL(name) "Tensor? " #name ", "
#define FUSEDATTN_SCHEMA_SETTING(stype, ctype, name) stype " " #name ", "
#define FUSEDATTN_PARAM_OPTIONAL(name) const std::optional<at::Tensor>&name,
#define FUSEDATTN_PARAM_SETTING(stype, ctype, name) ctype name,
#define FUSEDATTN_NAME_OPTIONAL(name) name,
#define FUSEDATTN_NAME_SETTING(stype, ctype, name) name,
#define FUSEDATTN_FIELD_OPTIONAL(name) const std::optional<at::Tensor>& name;
#define FUSEDATTN_FIELD_SETTING(stype, ctype, name) ctype name;

#define FUSEDATTN_FWD_SCHEMA                                                                       \
  "fwd(Tensor q, Tensor k, Tensor v, " FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_SCHEMA_OPTIONAL)        \
      "Tensor? rng_state, " FUSEDATTN_SETTINGS(FUSEDATTN_SCHEMA_SETTING)                           \
          "bool return_max_logit, Tensor? page_table=None) -> (Tensor out, Tensor softmax_lse, "   \
          "Tensor rng_state_out, Tensor max_logit)"

#define FUSEDATTN_BWD_SCHEMA                                                                               \
  "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor rng_state, "      \
      FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_SCHEMA_OPTIONAL) FUSEDATTN_SETTINGS(FUSEDATTN_SCHEMA_SETTING)    \
          "bool need_dbias) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor d_softmax_offset)"

// A decoding (or prefill) step against a KV cache the caller owns (fusedattn/kv_cache.h): new_k / new_v
// are appended to the caches in place, then q attends over them. The caches are marked mutated, so
// torch.compile functionalises the op and CUDA graphs replay it. page_table=None: per-sequence caches
// [b, s_cache, h_kv, d], sequence b in row b.
#define FUSEDATTN_FWD_KVCACHE_SCHEMA                                                                          \
  "fwd_kvcache(Tensor q, Tensor new_k, Tensor new_v, Tensor(a!) k_cache, Tensor(b!) v_cache, "                \
  "Tensor cache_seqlens, Tensor? page_table, " FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_SCHEMA_OPTIONAL)           \
      FUSEDATTN_SETTINGS(FUSEDATTN_SCHEMA_SETTING) "bool return_max_logit) -> (Tensor out, Tensor softmax_lse, " \
                                                   "Tensor max_logit)"
