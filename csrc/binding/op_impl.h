// The operators' implementation, shared by every backend: convert the call, let the core validate
// and fill params, allocate outputs with the core's shape rules, run the backend's engine. A
// backend is a small policy:
//
//   struct Engine {
//     struct Scope { explicit Scope(const Placement& q); };  // held for the whole call
//     static constexpr bool kWritesRngZeros;  // fills FwdParams::rng_out_zero itself
//     static Status run_fwd(const FwdParams&, const Placement& q);
//     static Status run_bwd(const BwdParams&, const Placement& q, int64_t deterministic);
//   };
//
// attn_cpu.cpp and attn_cuda.cpp register boxed_fwd<Engine> / boxed_bwd<Engine>.
#pragma once

#include <limits>

#include "call_args.h"

namespace fusedattn::binding {

FUSEDATTN_CALL_STRUCT(FwdCall, FUSEDATTN_FWD_ARGS);
FUSEDATTN_CALL_STRUCT(BwdCall, FUSEDATTN_BWD_ARGS);

template <class Engine>
std::array<Tensor, 4> fwd_impl(const FwdCall& c) {
  checked_overrides();
  const Placement where = placement_of(c.q);
  const typename Engine::Scope scope(where);
  const FwdArgs args = make_args(c, c.return_max_logit);
  const FwdInputs in = make_inputs(c, c.k, c.v, c.rng_state, c.page_table);

  CheckedProblem prob;
  raise_if_error(check_fwd(args, in, &prob));
  const FwdOutputShapes shapes = fwd_output_shapes(args, prob.get());
  Tensor out = empty(shapes.out, where);
  Tensor lse = empty(shapes.lse, where);
  Tensor max_logit = empty(shapes.max_logit, where);
  // The op returns its own copy of rng_state: outputs never alias inputs. Without dropout it is
  // {0, 0}, written by the engine where it can (FwdParams::rng_out_zero).
  const bool dropout = c.dropout_p > 0;
  const bool engine_zeroes = !dropout && Engine::kWritesRngZeros;
  Tensor rng_out = dropout ? cloned(*c.rng_state) : empty(OutputShape{1, {2}, DType::kInt64}, where);
  if (!dropout && !engine_zeroes) fill_zeros(rng_out);

  if (lse.numel() == 0) {  // no query rows (b, s_q, t_q or h_q is 0): nothing to compute
    fill_value(max_logit, -std::numeric_limits<float>::infinity());
    if (engine_zeroes) fill_zeros(rng_out);
    return {out, lse, rng_out, max_logit};
  }
  FwdOutputs outs{to_ref(out, "out"), to_ref(lse, "softmax_lse"), to_ref(max_logit, "max_logit")};
  FwdParams params;
  raise_if_error(make_fwd_params(args, in, prob, outs, &params));
  if (engine_zeroes) params.rng_out_zero = static_cast<int64_t*>(rng_out.data_ptr());
  raise_if_error(Engine::run_fwd(params, where));
  return {out, lse, rng_out, max_logit};
}

template <class Engine>
std::array<Tensor, 5> bwd_impl(const BwdCall& c) {
  checked_overrides();
  if (c.deterministic < 0 || c.deterministic > 2) {
    raise_status(Status::Invalid(cat("deterministic must be 0 (off), 1 (on) or 2 (warn only); got ", c.deterministic)));
  }
  const Placement where = placement_of(c.q);
  const typename Engine::Scope scope(where);
  BwdArgs args;
  args.fwd = make_args(c, false);
  args.need_dbias = c.need_dbias;
  args.deterministic = c.deterministic != 0;
  BwdInputs in;
  in.fwd = make_inputs(c, c.k, c.v, c.rng_state, std::nullopt);
  in.dout = to_ref(c.dout, "dout");
  in.out = to_ref(c.out, "out");
  in.lse = to_ref(c.softmax_lse, "softmax_lse");

  CheckedProblem prob;
  raise_if_error(check_bwd(args, in, &prob));
  const BwdOutputShapes shapes = bwd_output_shapes(args, in, prob.get());
  std::array<Tensor, 5> grads{empty(shapes.dq, where), empty(shapes.dk, where), empty(shapes.dv, where),
                              empty(shapes.dbias, where), empty(shapes.d_softmax_offset, where)};

  if (in.lse.numel() == 0) {  // no query rows: no key, bias or offset takes part in an output
    for (size_t i = 1; i < grads.size(); ++i) fill_zeros(grads[i]);
    return grads;
  }
  BwdOutputs outs{to_ref(grads[0], "dq"), to_ref(grads[1], "dk"), to_ref(grads[2], "dv"), to_ref(grads[3], "dbias"),
                  to_ref(grads[4], "d_softmax_offset")};
  BwdParams params;
  raise_if_error(make_bwd_params(args, in, prob, outs, &params));
  raise_if_error(Engine::run_bwd(params, where, c.deterministic));
  return grads;
}

// The boxed kernels a backend registers (STABLE_TORCH_LIBRARY_IMPL).
template <class Engine>
void boxed_fwd(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  run_boxed<FwdCall>(stack, num_args, num_outputs, &fwd_impl<Engine>);
}

template <class Engine>
void boxed_bwd(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  run_boxed<BwdCall>(stack, num_args, num_outputs, &bwd_impl<Engine>);
}

}  // namespace fusedattn::binding
