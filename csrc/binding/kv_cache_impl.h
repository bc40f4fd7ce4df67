// The KV-cache append operator (fusedattn::copy_to_kv_cache), shared by every
// backend: convert the call, let the core validate and fill params, run the
// backend's append. A backend is a small policy:
//
//   struct Engine {
//     struct Scope { explicit Scope(const at::Tensor& new_k); };  // held for the whole call
//     static Status run_kv_append(const KvAppendParams&, const at::Tensor& new_k);
//   };
//
// kv_cache_cpu.cpp registers kv_append_impl<CpuKvEngine>; the CUDA backend
// registers its own policy the same way.
#pragma once

#include <string>

#include "bridge.h"
#include "fusedattn/kv_cache.h"

namespace fusedattn::binding {

inline KvAppendArgs make_kv_append_args(const at::Tensor& new_k, const at::Tensor& new_v, const at::Tensor& k_cache,
                                        const at::Tensor& v_cache, const at::Tensor& page_table,
                                        const at::Tensor& cu_new_lens, const at::Tensor& cache_seqlens,
                                        const std::string& qkv_format) {
  KvAppendArgs a;
  raise_if_error(parse_format(qkv_format, &a.new_format));
  a.new_k = to_ref(new_k, "new_k");
  a.new_v = to_ref(new_v, "new_v");
  a.k_cache = to_ref(k_cache, "k_cache");
  a.v_cache = to_ref(v_cache, "v_cache");
  a.page_table = to_ref(page_table, "page_table");
  a.cu_new_lens = to_ref(cu_new_lens, "cu_new_lens");
  a.cache_seqlens = to_ref(cache_seqlens, "cache_seqlens");
  return a;
}

template <class Engine>
void kv_append_impl(const at::Tensor& new_k, const at::Tensor& new_v, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& page_table, const at::Tensor& cu_new_lens, const at::Tensor& cache_seqlens,
                    const std::string& qkv_format) {
  checked_overrides();
  const typename Engine::Scope scope(new_k);
  const KvAppendArgs args =
      make_kv_append_args(new_k, new_v, k_cache, v_cache, page_table, cu_new_lens, cache_seqlens, qkv_format);
  KvAppendParams params;
  raise_if_error(make_kv_append_params(args, &params));
  raise_if_error(Engine::run_kv_append(params, new_k));
}

}  // namespace fusedattn::binding
