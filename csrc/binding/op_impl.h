// The operators' implementation, shared by every backend: convert the call,
// let the core validate and fill params, allocate outputs with the core's
// shape rules, run the backend's engine. A backend is a small policy:
//
//   struct Engine {
//     struct Scope { explicit Scope(const at::Tensor& q); };  // held for the whole call
//     static constexpr bool kWritesRngZeros;  // fills FwdParams::rng_out_zero itself
//     static Status run_fwd(const FwdParams&, const at::Tensor& q);
//     static Status run_bwd(const BwdParams&, const at::Tensor& q);
//   };
//
// attn_cpu.cpp and attn_cuda.cpp register fwd_impl<Engine> / bwd_impl<Engine>.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "call_args.h"

namespace fusedattn::binding {

using OptT = std::optional<at::Tensor>;

template <class Engine>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fwd_impl(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_PARAM_OPTIONAL) const OptT& rng_state,
    FUSEDATTN_SETTINGS(FUSEDATTN_PARAM_SETTING) bool return_max_logit, const OptT& page_table) {
  checked_overrides();
  const typename Engine::Scope scope(q);
  const OpSettings settings{FUSEDATTN_SETTINGS(FUSEDATTN_NAME_SETTING)};
  const FwdArgs args = make_args(settings, return_max_logit);
  const OpTensors opt{FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_NAME_OPTIONAL)};
  const FwdInputs in = make_inputs(q, k, v, opt, rng_state, page_table);

  CheckedProblem prob;
  raise_if_error(check_fwd(args, in, &prob));
  const FwdOutputShapes shapes = fwd_output_shapes(args, prob.get());
  const auto opts = q.options();
  at::Tensor out = empty_like_shape(shapes.out, opts);
  at::Tensor lse = empty_like_shape(shapes.lse, opts);
  at::Tensor max_logit = empty_like_shape(shapes.max_logit, opts);
  // The op returns its own copy of rng_state: outputs never alias inputs. Without dropout it is
  // {0, 0}, written by the engine where it can (FwdParams::rng_out_zero).
  const bool engine_zeroes = dropout_p <= 0 && Engine::kWritesRngZeros;
  at::Tensor rng_out = dropout_p > 0 ? rng_state->clone()
                       : engine_zeroes ? at::empty({2}, opts.dtype(at::kLong))
                                       : at::zeros({2}, opts.dtype(at::kLong));

  if (lse.numel() == 0) {  // no query rows (b, s_q, t_q or h_q is 0): nothing to compute
    max_logit.fill_(-std::numeric_limits<float>::infinity());
    if (engine_zeroes) rng_out.zero_();
    return {out, lse, rng_out, max_logit};
  }
  FwdOutputs outs{to_ref(out, "out"), to_ref(lse, "softmax_lse"), to_ref(max_logit, "max_logit")};
  FwdParams params;
  raise_if_error(make_fwd_params(args, in, prob, outs, &params));
  if (engine_zeroes) params.rng_out_zero = rng_out.data_ptr<int64_t>();
  raise_if_error(Engine::run_fwd(params, q));
  return {out, lse, rng_out, max_logit};
}

template <class Engine>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd_impl(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& softmax_lse, const at::Tensor& rng_state, FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_PARAM_OPTIONAL)
        FUSEDATTN_SETTINGS(FUSEDATTN_PARAM_SETTING) bool need_dbias) {
  checked_overrides();
  const typename Engine::Scope scope(q);
  const OpSettings settings{FUSEDATTN_SETTINGS(FUSEDATTN_NAME_SETTING)};
  BwdArgs args;
  args.fwd = make_args(settings, false);
  args.need_dbias = need_dbias;
  args.deterministic = at::globalContext().deterministicAlgorithms();
  const OpTensors opt{FUSEDATTN_OPTIONAL_INPUTS(FUSEDATTN_NAME_OPTIONAL)};
  BwdInputs in;
  in.fwd = make_inputs(q, k, v, opt, rng_state);
  in.dout = to_ref(dout, "dout");
  in.out = to_ref(out, "out");
  in.lse = to_ref(softmax_lse, "softmax_lse");

  CheckedProblem prob;
  raise_if_error(check_bwd(args, in, &prob));
  const BwdOutputShapes shapes = bwd_output_shapes(args, in, prob.get());
  const auto opts = q.options();
  at::Tensor dq = empty_like_shape(shapes.dq, opts);
  at::Tensor dk = empty_like_shape(shapes.dk, opts);
  at::Tensor dv = empty_like_shape(shapes.dv, opts);
  at::Tensor dbias = empty_like_shape(shapes.dbias, opts);
  at::Tensor d_off = empty_like_shape(shapes.d_softmax_offset, opts);

  if (softmax_lse.numel() == 0) {  // no query rows: no key, bias or offset takes part in an output
    for (at::Tensor* t : {&dk, &dv, &dbias, &d_off}) t->zero_();
    return {dq, dk, dv, dbias, d_off};
  }
  BwdOutputs outs{to_ref(dq, "dq"), to_ref(dk, "dk"), to_ref(dv, "dv"), to_ref(dbias, "dbias"),
                  to_ref(d_off, "d_softmax_offset")};
  BwdParams params;
  raise_if_error(make_bwd_params(args, in, prob, outs, &params));
  raise_if_error(Engine::run_bwd(params, q));
  return {dq, dk, dv, dbias, d_off};
}

}  // namespace fusedattn::binding
