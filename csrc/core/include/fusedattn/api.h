// Entry points of the core. The binding calls, in order:
//   check_fwd -> fwd_output_shapes -> (allocate) -> make_fwd_params -> run_fwd
// and the same for backward. Each returns a Status; none throws or aborts on
// user input.
#pragma once

#include <cstdint>
#include <functional>

#include "fusedattn/attn_args.h"
#include "fusedattn/params.h"

namespace fusedattn {

// How the CPU engine runs work in parallel. The binding supplies one backed
// by PyTorch's intra-op pool (so torch.set_num_threads applies); unit tests
// use SerialExecutor or ThreadExecutor. fn(begin, end) handles items [begin, end).
class Executor {
 public:
  virtual ~Executor() = default;
  virtual void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const = 0;
  virtual int num_threads() const = 0;
  // Work (multiply-adds of one parallel phase) below which handing items to this executor costs more
  // than it saves, so the engine runs them on the calling thread; 0: always hand them over.
  virtual int64_t serial_macs() const { return 0; }
};

class SerialExecutor final : public Executor {
 public:
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const override {
    if (n > 0) fn(0, n);
  }
  int num_threads() const override { return 1; }
};

class CheckedProblem;

// Validates every argument and derives the problem dimensions. Invalid
// arguments and unsupported configurations are told apart by the status code.
Status check_fwd(const FwdArgs& args, const FwdInputs& in, CheckedProblem* prob);
Status check_bwd(const BwdArgs& args, const BwdInputs& in, CheckedProblem* prob);

// The problem check_fwd / check_bwd derived from one call's arguments and
// inputs. Only they fill one in, so make_*_params take it as the proof that
// the call was validated and do not validate it again (pass the same args and
// inputs that were checked).
class CheckedProblem {
 public:
  const Problem& get() const { return prob_; }
  bool valid() const { return valid_; }

 private:
  friend Status check_fwd(const FwdArgs&, const FwdInputs&, CheckedProblem*);
  friend Status check_bwd(const BwdArgs&, const BwdInputs&, CheckedProblem*);
  Problem prob_;
  bool valid_ = false;
};

FwdOutputShapes fwd_output_shapes(const FwdArgs& args, const Problem& prob);
BwdOutputShapes bwd_output_shapes(const BwdArgs& args, const BwdInputs& in, const Problem& prob);

// Fill the engine parameters of a checked call (Invalid if `prob` was not
// filled in by a successful check).
Status make_fwd_params(const FwdArgs& args, const FwdInputs& in, const CheckedProblem& prob, const FwdOutputs& out,
                       FwdParams* params);
Status make_bwd_params(const BwdArgs& args, const BwdInputs& in, const CheckedProblem& prob, const BwdOutputs& out,
                       BwdParams* params);

// CPU engine. Outputs must be allocated with the shapes above; the engine
// writes every element of them (padded rows included).
Status run_fwd_cpu(const FwdParams& params, const Executor& exec);
Status run_bwd_cpu(const BwdParams& params, const Executor& exec);

}  // namespace fusedattn
