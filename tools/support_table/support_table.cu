// Which engine and kernel the CUDA dispatch plans for a configuration, on a device described by its
// attributes (no GPU needed), or why it is declined: the core's checks and the engines' support
// functions answer, through the same calls the binding makes (check_* -> make_*_params -> plan).
// support_table.py builds this program, feeds it one configuration per line on stdin and turns the
// answers into docs/api.md's supported-configuration table.
//
// Input line: key=value words (defaults in Config). Output line, tab-separated:
//   ok <engine> <kernel> <deterministic> <declined>   or   rejected <status message>
// <kernel>: the variant ("-" where the engine has none), <deterministic>: 1 when the backward's
// sums are ordered (CudaPlan::deterministic), <declined>: "engine: reason" for each engine the
// dispatch asked before the one that took the call, joined by " | ".
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dispatch/dispatch.h"
#include "fusedattn/api.h"
#include "hopper/kernels.h"
#include "stubs.h"

namespace fusedattn {
namespace {

struct Config {
  std::string dir = "fwd";      // fwd, bwd
  std::string device = "sm90";  // sm90, sm80
  std::string dtype = "fp16";   // fp16, bf16, fp32, fp64
  int64_t d_qk = 128, d_v = 128;
  // bshd, sbhd; bhsd: [b, s, h, d] views of a [b, h, s, d] tensor; packed: views of one
  // [b, s, 3, h, d] buffer; thd; stride2: a head-dim stride of 2.
  std::string layout = "bshd";
  std::string mask = "no_mask";
  int64_t window_left = -1, window_right = -1;
  std::string bias = "none";  // none, bias, alibi
  double dropout = 0, softcap = 0;
  std::string softmax = "vanilla";
  bool max_logit = false, dbias = false, deterministic = false;
  bool kv_cache = false;  // k, v as page pools read through a page table
  int64_t b = 2, s_q = 1024, s_kv = 1024, h_q = 16, h_kv = 16;
  int64_t page_size = 256;
};

bool parse_config(const std::string& line, Config* c, std::string* error) {
  std::istringstream words(line);
  std::string w;
  while (words >> w) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) {
      *error = "expected key=value, got '" + w + "'";
      return false;
    }
    const std::string k = w.substr(0, eq), v = w.substr(eq + 1);
    const auto num = [&] { return std::strtoll(v.c_str(), nullptr, 10); };
    if (k == "dir") c->dir = v;
    else if (k == "device") c->device = v;
    else if (k == "dtype") c->dtype = v;
    else if (k == "d_qk") c->d_qk = num();
    else if (k == "d_v") c->d_v = num();
    else if (k == "layout") c->layout = v;
    else if (k == "mask") c->mask = v;
    else if (k == "window") {
      if (std::sscanf(v.c_str(), "%lld,%lld", reinterpret_cast<long long*>(&c->window_left),
                      reinterpret_cast<long long*>(&c->window_right)) != 2) {
        *error = "window=left,right, got '" + v + "'";
        return false;
      }
    } else if (k == "bias") c->bias = v;
    else if (k == "dropout") c->dropout = std::strtod(v.c_str(), nullptr);
    else if (k == "softcap") c->softcap = std::strtod(v.c_str(), nullptr);
    else if (k == "softmax") c->softmax = v;
    else if (k == "max_logit") c->max_logit = v == "1";
    else if (k == "dbias") c->dbias = v == "1";
    else if (k == "deterministic") c->deterministic = v == "1";
    else if (k == "kv_cache") c->kv_cache = v == "1";
    else if (k == "b") c->b = num();
    else if (k == "s_q") c->s_q = num();
    else if (k == "s_kv") c->s_kv = num();
    else if (k == "h_q") c->h_q = num();
    else if (k == "h_kv") c->h_kv = num();
    else {
      *error = "unknown key '" + k + "'";
      return false;
    }
  }
  return true;
}

// Representative devices: an H100 / H200 (sm_90) and an A100 (sm_80).
bool device_attrs(const std::string& name, gpu::DeviceAttrs* a) {
  if (name == "sm90") {
    *a = gpu::DeviceAttrs{0, 9, 0, 132, 233472, 232448};
  } else if (name == "sm80") {
    *a = gpu::DeviceAttrs{0, 8, 0, 108, 167936, 166912};
  } else {
    return false;
  }
  return true;
}

// Tensors are never read: planning looks at shapes, strides and alignment only. Each gets its own
// 256-byte aligned fake address.
class FakeTensors {
 public:
  TensorRef make(DType dt, std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
    TensorRef t;
    t.data = reinterpret_cast<void*>(next_);
    next_ += uintptr_t{1} << 36;
    t.dtype = dt;
    t.device = DeviceType::kCUDA;
    t.device_index = 0;
    t.ndim = static_cast<int>(sizes.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.sizes[i] = sizes[i];
      t.strides[i] = strides.empty() ? stride : strides[i];
      stride *= sizes[i];
    }
    return t;
  }
  TensorRef like(const OutputShape& s) {
    return make(s.dtype, std::vector<int64_t>(s.sizes, s.sizes + s.ndim));
  }

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
};

DType dtype_of(const std::string& s) {
  if (s == "fp16") return DType::kFloat16;
  if (s == "bf16") return DType::kBFloat16;
  if (s == "fp32") return DType::kFloat32;
  if (s == "fp64") return DType::kFloat64;
  return DType::kOther;
}

// q (or k / v: s, h, d of theirs) in the configuration's layout.
TensorRef seq_tensor(FakeTensors& f, const Config& c, DType dt, int64_t s, int64_t h, int64_t d) {
  const int64_t b = c.b;
  if (c.layout == "sbhd") return f.make(dt, {s, b, h, d});
  if (c.layout == "thd") return f.make(dt, {b * s, h, d});
  if (c.layout == "bhsd") return f.make(dt, {b, s, h, d}, {h * s * d, d, s * d, 1});
  if (c.layout == "packed") return f.make(dt, {b, s, h, d}, {s * 3 * h * d, 3 * h * d, d, 1});
  if (c.layout == "stride2") return f.make(dt, {b, s, h, d}, {s * h * d * 2, h * d * 2, d * 2, 2});
  return f.make(dt, {b, s, h, d});
}

struct Call {
  FwdArgs args;
  FwdInputs in;
};

Status make_call(FakeTensors& f, const Config& c, Call* call) {
  FwdArgs& a = call->args;
  FwdInputs& in = call->in;
  const DType dt = dtype_of(c.dtype);
  const bool thd = c.layout == "thd";
  a.q_format = thd ? Format::kTHD : c.layout == "sbhd" ? Format::kSBHD : Format::kBSHD;
  a.kv_format = c.kv_cache ? Format::kBSHD : a.q_format;
  FUSEDATTN_RETURN_IF_ERROR(parse_mask_type(c.mask, &a.mask_type));
  FUSEDATTN_RETURN_IF_ERROR(parse_softmax_type(c.softmax, &a.softmax_type));
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.scale = 1.0 / 8;
  a.softcap = c.softcap;
  a.dropout_p = c.dropout;
  a.return_max_logit = c.max_logit;
  in.q = seq_tensor(f, c, dt, c.s_q, c.h_q, c.d_qk);
  if (c.kv_cache) {
    const int64_t pages = (c.s_kv + c.page_size - 1) / c.page_size;
    in.k = f.make(dt, {c.b * pages, c.page_size, c.h_kv, c.d_qk});
    in.v = f.make(dt, {c.b * pages, c.page_size, c.h_kv, c.d_v});
    in.page_table = f.make(DType::kInt32, {c.b, pages});
    in.cu_seqlens_kv = f.make(DType::kInt32, {c.b + 1});
  } else {
    in.k = seq_tensor(f, c, dt, c.s_kv, c.h_kv, c.d_qk);
    in.v = seq_tensor(f, c, dt, c.s_kv, c.h_kv, c.d_v);
  }
  if (thd || mask_has_padding(a.mask_type)) {
    in.cu_seqlens_q = f.make(DType::kInt32, {c.b + 1});
    if (!c.kv_cache) in.cu_seqlens_kv = f.make(DType::kInt32, {c.b + 1});
    if (thd) {
      a.max_seqlen_q = c.s_q;
      a.max_seqlen_kv = c.s_kv;
    }
  }
  if (c.bias == "bias") in.bias = f.make(dt, {1, c.h_q, c.s_q, c.s_kv});
  if (c.bias == "alibi") in.alibi_slopes = f.make(DType::kFloat32, {c.h_q});
  if (a.mask_type == MaskType::kArbitrary) in.attn_mask = f.make(DType::kBool, {c.b, 1, c.s_q, c.s_kv});
  if (a.softmax_type == SoftmaxType::kLearnable) in.softmax_offset = f.make(DType::kFloat32, {c.h_q});
  if (c.dropout > 0 || c.dir == "bwd") in.rng_state = f.make(DType::kInt64, {2});
  return Status::Ok();
}

// The kernel variant: the Hopper forward's plain, general or varlen kernels, the tensor-core kernels'
// fast, softcap or general ones.
std::string kernel_name(const CudaPlan& plan, bool backward) {
  if (plan.engine == CudaEngine::kHopper && !backward) {
    const auto entry = static_cast<hopper::KernelEntry>(plan.kernel);
    return entry == hopper::KernelEntry::kFwdGeneral ? "general"
           : entry == hopper::KernelEntry::kFwdVarlen ? "varlen"
                                                       : "plain";
  }
  if (plan.engine == CudaEngine::kTensorCore) {
    const tc::Variant v = tc::kStubRows[plan.kernel].variant;
    return v == tc::Variant::kGeneral ? "general" : v == tc::Variant::kSoftcap ? "softcap" : "fast";
  }
  return "-";
}

const char* engine_name(CudaEngine e) {
  switch (e) {
    case CudaEngine::kHopper: return "hopper";
    case CudaEngine::kTensorCore: return "tc";
    case CudaEngine::kDecode: return "decode";
    case CudaEngine::kSimt: return "simt";
  }
  return "?";
}

std::string answer(const Config& c) {
  gpu::DeviceAttrs dev;
  if (!device_attrs(c.device, &dev)) return "error\tunknown device '" + c.device + "'";
  FakeTensors f;
  Call call;
  Status st = make_call(f, c, &call);
  CudaPlan plan;
  Declined declined;
  const bool backward = c.dir == "bwd";
  if (st.ok() && !backward) {
    CheckedProblem prob;
    st = check_fwd(call.args, call.in, &prob);
    FwdParams params;
    if (st.ok()) {
      const FwdOutputShapes s = fwd_output_shapes(call.args, prob.get());
      const FwdOutputs out{f.like(s.out), f.like(s.lse), f.like(s.max_logit)};
      st = make_fwd_params(call.args, call.in, prob, out, &params);
    }
    if (st.ok()) st = plan_fwd_on(params, dev, &plan, &declined);
  } else if (st.ok()) {
    BwdArgs args;
    args.fwd = call.args;
    args.fwd.return_max_logit = false;
    args.need_dbias = c.dbias;
    args.deterministic = c.deterministic;
    BwdInputs in;
    in.fwd = call.in;
    CheckedProblem prob;
    {
      CheckedProblem fwd_prob;
      st = check_fwd(args.fwd, in.fwd, &fwd_prob);
      if (st.ok()) {
        const FwdOutputShapes s = fwd_output_shapes(args.fwd, fwd_prob.get());
        in.out = f.like(s.out);
        in.dout = f.like(s.out);
        in.lse = f.like(s.lse);
      }
    }
    if (st.ok()) st = check_bwd(args, in, &prob);
    BwdParams params;
    if (st.ok()) {
      const BwdOutputShapes s = bwd_output_shapes(args, in, prob.get());
      const BwdOutputs out{f.like(s.dq), f.like(s.dk), f.like(s.dv), f.like(s.dbias), f.like(s.d_softmax_offset)};
      st = make_bwd_params(args, in, prob, out, &params);
    }
    if (st.ok()) st = plan_bwd_on(params, dev, &plan, &declined);
  }
  if (!st.ok()) return "rejected\t" + st.message;
  std::string why;
  for (CudaEngine e : {CudaEngine::kDecode, CudaEngine::kHopper, CudaEngine::kTensorCore}) {
    const std::string& r = declined.why[static_cast<int>(e)];
    if (!r.empty()) why += (why.empty() ? "" : " | ") + std::string(engine_name(e)) + ": " + r;
  }
  return std::string("ok\t") + engine_name(plan.engine) + "\t" + kernel_name(plan, backward) + "\t" +
         (plan.deterministic ? "1" : "0") + "\t" + why;
}

}  // namespace
}  // namespace fusedattn

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    fusedattn::Config c;
    std::string error;
    if (!fusedattn::parse_config(line, &c, &error)) {
      std::printf("error\t%s\n", error.c_str());
    } else {
      std::printf("%s\n", fusedattn::answer(c).c_str());
    }
  }
  return 0;
}
