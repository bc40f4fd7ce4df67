// The operator schemas: the one block that declares fusedattn's ops. Fake
// implementations and autograd are registered from python/fusedattn/_ops.py.
#include <torch/library.h>

TORCH_LIBRARY(fusedattn, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? softmax_offset, Tensor? attn_mask, "
      "Tensor? alibi_slopes, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? cu_seqlens_q_padded, "
      "Tensor? cu_seqlens_kv_padded, Tensor? rng_state, str q_format, str kv_format, str mask_type, "
      "int window_left, int window_right, int bottom_right_diagonal, str softmax_type, float scale, "
      "float dropout_p, SymInt max_seqlen_q, SymInt max_seqlen_kv, bool return_max_logit, "
      "Tensor? page_table=None) -> (Tensor out, Tensor softmax_lse, Tensor rng_state_out, Tensor max_logit)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor rng_state, "
      "Tensor? bias, Tensor? softmax_offset, Tensor? attn_mask, Tensor? alibi_slopes, Tensor? cu_seqlens_q, "
      "Tensor? cu_seqlens_kv, Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded, str q_format, "
      "str kv_format, str mask_type, int window_left, int window_right, int bottom_right_diagonal, "
      "str softmax_type, float scale, float dropout_p, SymInt max_seqlen_q, SymInt max_seqlen_kv, "
      "bool need_dbias) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor d_softmax_offset)");
  // KV-cache append (fusedattn/kv_cache.h): writes the step's new keys/values
  // into the caches in place. The caches are marked mutated so the op stays
  // inside a compiled graph (functionalised) and CUDA graphs replay it.
  m.def(
      "copy_to_kv_cache(Tensor new_k, Tensor new_v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor page_table, "
      "Tensor cu_new_lens, Tensor cache_seqlens, str qkv_format) -> ()");
}
