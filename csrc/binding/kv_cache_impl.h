// The KV-cache operators (fusedattn::copy_to_kv_cache, fusedattn::fwd_kvcache), shared by every
// backend: convert the call, let the core validate and fill params, allocate the step's outputs with
// the core's shapes, run the backend's engine. A backend is a small policy:
//
//   struct Engine {
//     struct Scope { explicit Scope(const at::Tensor& t); };  // held for the whole call
//     static Status run_kv_append(const KvAppendParams&, const at::Tensor& new_k);
//     static Status run_kv_step(const KvStepParams&, const at::Tensor& q);
//   };
//
// kv_cache_cpu.cpp and kv_cache_cuda.cpp register kv_append_impl<Engine> / kv_step_impl<Engine>.
#pragma once

#include <optional>
#include <limits>
#include <string>
#include <tuple>

#include "call_args.h"
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

template <class Engine>
std::tuple<at::Tensor, at::Tensor, at::Tensor> kv_step_impl(
    const at::Tensor& q, const at::Tensor& new_k, const at::Tensor& new_v, at::Tensor& k_cache, at::Tensor& v_cache,
    const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& page_table,
    FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_PARAM_OPTIONAL) FUSEDATTN_SETTINGS(FUSEDATTN_PARAM_SETTING)
        bool return_max_logit) {
  checked_overrides();
  const typename Engine::Scope scope(q);
  const OpSettings settings{FUSEDATTN_SETTINGS(FUSEDATTN_NAME_SETTING)};
  const FwdArgs args = make_args(settings, return_max_logit);
  const OpTensors opt{FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_NAME_OPTIONAL)};
  KvStepInputs in;
  in.attn = make_inputs(q, k_cache, v_cache, opt, std::nullopt, page_table);
  in.new_k = to_ref(new_k, "new_k");
  in.new_v = to_ref(new_v, "new_v");
  in.cache_seqlens = to_ref(cache_seqlens, "cache_seqlens");

  CheckedProblem prob;
  raise_if_error(check_kv_step(args, in, &prob));
  const FwdOutputShapes shapes = fwd_output_shapes(args, prob.get());
  const auto opts = q.options();
  at::Tensor out = empty_like_shape(shapes.out, opts);
  at::Tensor lse = empty_like_shape(shapes.lse, opts);
  at::Tensor max_logit = empty_like_shape(shapes.max_logit, opts);
  if (lse.numel() == 0) {  // no query rows, so no new token either (they are the queries')
    max_logit.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse, max_logit};
  }
  FwdOutputs outs{to_ref(out, "out"), to_ref(lse, "softmax_lse"), to_ref(max_logit, "max_logit")};
  KvStepParams params;
  raise_if_error(make_kv_step_params(args, in, prob, outs, &params));
  raise_if_error(Engine::run_kv_step(params, q));
  return {out, lse, max_logit};
}

}  // namespace fusedattn::binding
