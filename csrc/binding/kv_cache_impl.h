// The KV-cache operators (fusedattn::copy_to_kv_cache, fusedattn::fwd_kvcache), shared by every
// backend: convert the call, let the core validate and fill params, allocate the step's outputs with
// the core's shapes, run the backend's engine. A backend is a small policy:
//
//   struct Engine {
//     struct Scope { explicit Scope(const Placement& t); };  // held for the whole call
//     static Status run_kv_append(const KvAppendParams&, const Placement& new_k);
//     static Status run_kv_step(const KvStepParams&, const Placement& q);
//   };
//
// kv_cache_cpu.cpp and kv_cache_cuda.cpp register boxed_kv_append<Engine> / boxed_kv_step<Engine>.
#pragma once

#include <limits>

#include "call_args.h"
#include "fusedattn/kv_cache.h"

namespace fusedattn::binding {

FUSEDATTN_CALL_STRUCT(KvAppendCall, FUSEDATTN_KV_APPEND_ARGS);
FUSEDATTN_CALL_STRUCT(KvStepCall, FUSEDATTN_FWD_KVCACHE_ARGS);

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
std::array<Tensor, 3> kv_step_impl(const KvStepCall& c) {
  checked_overrides();
  const Placement where = placement_of(c.q);
  const typename Engine::Scope scope(where);
  const FwdArgs args = make_args(c, c.return_max_logit);
  KvStepInputs in;
  in.attn = make_inputs(c, c.k_cache, c.v_cache, std::nullopt, c.page_table);
  in.new_k = to_ref(c.new_k, "new_k");
  in.new_v = to_ref(c.new_v, "new_v");
  in.cache_seqlens = to_ref(c.cache_seqlens, "cache_seqlens");

  CheckedProblem prob;
  raise_if_error(check_kv_step(args, in, &prob));
  const FwdOutputShapes shapes = fwd_output_shapes(args, prob.get());
  std::array<Tensor, 3> outputs{empty(shapes.out, where), empty(shapes.lse, where), empty(shapes.max_logit, where)};
  if (outputs[1].numel() == 0) {  // no query rows, so no new token either (they are the queries')
    fill_value(outputs[2], -std::numeric_limits<float>::infinity());
    return outputs;
  }
  FwdOutputs outs{to_ref(outputs[0], "out"), to_ref(outputs[1], "softmax_lse"), to_ref(outputs[2], "max_logit")};
  KvStepParams params;
  raise_if_error(make_kv_step_params(args, in, prob, outs, &params));
  raise_if_error(Engine::run_kv_step(params, where));
  return outputs;
}

template <class Engine>
void boxed_kv_step(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  run_boxed<KvStepCall>(stack, num_args, num_outputs, &kv_step_impl<Engine>);
}

template <class Engine>
void boxed_kv_append(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  run_boxed<KvAppendCall>(stack, num_args, num_outputs, &kv_append_impl<Engine>);
}

}  // namespace fusedattn::binding
