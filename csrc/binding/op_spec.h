// The operators' argument lists, written once. schema.cpp builds the schema strings from these
// lists; op_impl.h / kv_cache_impl.h declare each operator's call struct from the same list and
// read the boxed stack into it, so schema, struct and unboxing cannot disagree;
// python/fusedattn/_ops.py reads the order from the registered schema, and tests/test_contract.py
// checks FwdArgs, BwdArgs and the fakes against it.
//
// Every entry is X(schema type, C++ type, name, default) with default "" or "=value"; a list
// is a plain sequence of entries, in schema order.
#pragma once

// The `Tensor?` inputs of the attention operators, in schema order.
#define FUSEDATTN_OPTIONAL_INPUTS(X)                \
  X("Tensor?", OptTensor, bias, "")                 \
  X("Tensor?", OptTensor, softmax_offset, "")       \
  X("Tensor?", OptTensor, attn_mask, "")            \
  X("Tensor?", OptTensor, alibi_slopes, "")         \
  X("Tensor?", OptTensor, cu_seqlens_q, "")         \
  X("Tensor?", OptTensor, cu_seqlens_kv, "")        \
  X("Tensor?", OptTensor, cu_seqlens_q_padded, "")  \
  X("Tensor?", OptTensor, cu_seqlens_kv_padded, "")

// The non-tensor settings of the attention operators, in schema order; each is a field of the
// core's FwdArgs (csrc/core/include/fusedattn/attn_args.h).
#define FUSEDATTN_SETTINGS(X)                       \
  X("str", std::string, q_format, "")               \
  X("str", std::string, kv_format, "")              \
  X("str", std::string, mask_type, "")              \
  X("int", int64_t, window_left, "")                \
  X("int", int64_t, window_right, "")               \
  X("int", int64_t, bottom_right_diagonal, "")      \
  X("str", std::string, softmax_type, "")           \
  X("float", double, scale, "")                     \
  X("float", double, softcap, "")                   \
  X("float", double, dropout_p, "")                 \
  X("SymInt", int64_t, max_seqlen_q, "")            \
  X("SymInt", int64_t, max_seqlen_kv, "")

#define FUSEDATTN_FWD_ARGS(X)              \
  X("Tensor", Tensor, q, "")               \
  X("Tensor", Tensor, k, "")               \
  X("Tensor", Tensor, v, "")               \
  FUSEDATTN_OPTIONAL_INPUTS(X)             \
  X("Tensor?", OptTensor, rng_state, "")   \
  FUSEDATTN_SETTINGS(X)                    \
  X("bool", bool, return_max_logit, "")    \
  X("Tensor?", OptTensor, page_table, "=None")
#define FUSEDATTN_FWD_RETURNS "(Tensor out, Tensor softmax_lse, Tensor rng_state_out, Tensor max_logit)"

// deterministic: torch.use_deterministic_algorithms as the Python caller reads it (the stable ABI
// cannot): 0 off, 1 on (a non-deterministic algorithm raises), 2 on with warn_only (it warns).
#define FUSEDATTN_BWD_ARGS(X)              \
  X("Tensor", Tensor, dout, "")            \
  X("Tensor", Tensor, q, "")               \
  X("Tensor", Tensor, k, "")               \
  X("Tensor", Tensor, v, "")               \
  X("Tensor", Tensor, out, "")             \
  X("Tensor", Tensor, softmax_lse, "")     \
  X("Tensor", Tensor, rng_state, "")       \
  FUSEDATTN_OPTIONAL_INPUTS(X)             \
  FUSEDATTN_SETTINGS(X)                    \
  X("bool", bool, need_dbias, "")          \
  X("int", int64_t, deterministic, "")
#define FUSEDATTN_BWD_RETURNS "(Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor d_softmax_offset)"

// KV-cache append (fusedattn/kv_cache.h): writes the step's new keys/values into the caches in
// place. The caches are marked mutated so the op stays inside a compiled graph (functionalised)
// and CUDA graphs replay it.
#define FUSEDATTN_KV_APPEND_ARGS(X)        \
  X("Tensor", Tensor, new_k, "")           \
  X("Tensor", Tensor, new_v, "")           \
  X("Tensor(a!)", Tensor, k_cache, "")     \
  X("Tensor(b!)", Tensor, v_cache, "")     \
  X("Tensor", Tensor, page_table, "")      \
  X("Tensor", Tensor, cu_new_lens, "")     \
  X("Tensor", Tensor, cache_seqlens, "")   \
  X("str", std::string, qkv_format, "")
#define FUSEDATTN_KV_APPEND_RETURNS "()"

// A decoding (or prefill) step against a KV cache the caller owns (fusedattn/kv_cache.h): new_k /
// new_v are appended to the caches in place, then q attends over them. The caches are marked
// mutated, so torch.compile functionalises the op and CUDA graphs replay it. page_table=None:
// per-sequence caches [b, s_cache, h_kv, d], sequence b in row b.
#define FUSEDATTN_FWD_KVCACHE_ARGS(X)      \
  X("Tensor", Tensor, q, "")               \
  X("Tensor", Tensor, new_k, "")           \
  X("Tensor", Tensor, new_v, "")           \
  X("Tensor(a!)", Tensor, k_cache, "")     \
  X("Tensor(b!)", Tensor, v_cache, "")     \
  X("Tensor", Tensor, cache_seqlens, "")   \
  X("Tensor?", OptTensor, page_table, "")  \
  FUSEDATTN_OPTIONAL_INPUTS(X)             \
  FUSEDATTN_SETTINGS(X)                    \
  X("bool", bool, return_max_logit, "")
#define FUSEDATTN_FWD_KVCACHE_RETURNS "(Tensor out, Tensor softmax_lse, Tensor max_logit)"

// Uses of a list: its schema entries, its call struct's members, and their values read off a
// boxed stack (in a braced initializer, so in order).
#define FUSEDATTN_SCHEMA_ENTRY(stype, ctype, name, dflt) stype " " #name dflt,
#define FUSEDATTN_CALL_MEMBER(stype, ctype, name, dflt) ctype name;
#define FUSEDATTN_CALL_READ(stype, ctype, name, dflt) stack.next<ctype>(),
#define FUSEDATTN_CALL_COUNT(stype, ctype, name, dflt) +1

// The call struct of a list: its arguments as members, their count, and unbox() taking them off
// a boxed stack (bridge.h's BoxedStack).
#define FUSEDATTN_CALL_STRUCT(NAME, LIST)                               \
  struct NAME {                                                        \
    LIST(FUSEDATTN_CALL_MEMBER)                                        \
    static constexpr uint64_t kNumArgs = 0 LIST(FUSEDATTN_CALL_COUNT); \
    static NAME unbox(BoxedStack& stack) { return NAME{LIST(FUSEDATTN_CALL_READ)}; } \
  }
