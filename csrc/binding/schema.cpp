// The operator schemas: the one block that declares fusedattn's ops (the attention ops' argument
// lists come from op_spec.h). Fake implementations and autograd are registered from
// python/fusedattn/_ops.py.
#include <torch/library.h>

#include "op_spec.h"

TORCH_LIBRARY(fusedattn, m) {
  m.def(FUSEDATTN_FWD_SCHEMA);
  m.def(FUSEDATTN_BWD_SCHEMA);
  // KV-cache append (fusedattn/kv_cache.h): writes the step's new keys/values
  // into the caches in place. The caches are marked mutated so the op stays
  // inside a compiled graph (functionalised) and CUDA graphs replay it.
  m.def(
      "copy_to_kv_cache(Tensor new_k, Tensor new_v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor page_table, "
      "Tensor cu_new_lens, Tensor cache_seqlens, str qkv_format) -> ()");
  m.def(FUSEDATTN_FWD_KVCACHE_SCHEMA);
}
