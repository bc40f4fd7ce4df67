// The KV-cache append operator (fusedattn::copy_to_kv_cache), shared by every backend: convert the
// call, let the core validate and fill params, run the backend's append. A backend is a small
// policy:
//
//   struct Engine {
//     struct Scope { explicit Scope(const Placement& new_k); };  // held for the whole call
//     static Status run_kv_append(const KvAppendParams&, const Placement& new_k);
//   };
//
// kv_cache_cpu.cpp registers boxed_kv_append<CpuKvEngine>; the CUDA backend registers its own
// policy the same way.
#pragma once

#include "bridge.h"
#include "fusedattn/kv_cache.h"
#include "op_spec.h"

namespace fusedattn::binding {

FUSEDATTN_CALL_STRUCT(KvAppendCall, FUSEDATTN_KV_APPEND_ARGS);

inline KvAppendArgs make_kv_append_args(const KvAppendCall& c) {
  KvAppendArgs a;
  raise_if_error(parse_format(c.qkv_format, &a.new_format));
  a.new_k = to_ref(c.new_k, "new_k");
  a.new_v = to_ref(c.new_v, "new_v");
  a.k_cache = to_ref(c.k_cache, "k_cache");
  a.v_cache = to_ref(c.v_cache, "v_cache");
  a.page_table = to_ref(c.page_table, "page_table");
  a.cu_new_lens = to_ref(c.cu_new_lens, "cu_new_lens");
  a.cache_seqlens = to_ref(c.cache_seqlens, "cache_seqlens");
  return a;
}

template <class Engine>
std::array<Tensor, 0> kv_append_impl(const KvAppendCall& c) {
  checked_overrides();
  const Placement where = placement_of(c.new_k);
  const typename Engine::Scope scope(where);
  KvAppendParams params;
  raise_if_error(make_kv_append_params(make_kv_append_args(c), &params));
  raise_if_error(Engine::run_kv_append(params, where));
  return {};
}

template <class Engine>
void boxed_kv_append(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  run_boxed<KvAppendCall>(stack, num_args, num_outputs, &kv_append_impl<Engine>);
}

}  // namespace fusedattn::binding
