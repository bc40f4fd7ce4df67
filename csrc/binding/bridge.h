// The only code that converts between torch's tensors and the core's TensorRef, and between the
// core's Status and exceptions. Everything here goes through the LibTorch stable ABI (the C shim
// and the header-only torch::stable wrappers, as of torch 2.10: TORCH_TARGET_VERSION), so the
// library loads on every torch from 2.10 on.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "fusedattn/api.h"
#include "fusedattn/cat.h"
#include "fusedattn/overrides.h"

namespace fusedattn::binding {

using Tensor = torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;

// ---- errors ----------------------------------------------------------------------------------
// A stable kernel's exception reaches Python as RuntimeError. The kind of a core Status travels as
// the message's prefix: python/fusedattn/_ops.py raises ValueError / NotImplementedError for these
// two (with the same message), and anything else stays a RuntimeError.
inline constexpr const char* kInvalidArgumentPrefix = "fusedattn: invalid argument: ";
inline constexpr const char* kUnsupportedPrefix = "fusedattn: unsupported configuration: ";

[[noreturn]] inline void raise_status(const Status& st) {
  throw std::runtime_error(
      cat(st.code == StatusCode::kUnsupported ? kUnsupportedPrefix : kInvalidArgumentPrefix, st.message));
}

inline void raise_if_error(const Status& st) {
  if (!st.ok()) raise_status(st);
}

// A failed stable-ABI call: torch's own error, as RuntimeError.
inline void check_shim(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) throw std::runtime_error(cat("fusedattn: torch's ", what, " failed"));
}

// The FUSEDATTN_* switches, parsed once; a malformed one fails every call (on any device).
inline const Overrides& checked_overrides() {
  const ProcessOverrides& o = process_overrides();
  raise_if_error(o.status);
  return o.values;
}

// torch.use_deterministic_algorithms as the Python caller passed it (FUSEDATTN_BWD_ARGS'
// deterministic). A call whose algorithm is not deterministic raises, or under warn_only warns,
// with torch's own words (as at::Context::alertNotDeterministic does).
inline void alert_not_deterministic(int64_t mode, const std::string& caller) {
  if (mode == 1) {
    throw std::runtime_error(cat(
        caller,
        " does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True)'. "
        "You can turn off determinism just for this operation, or you can use the 'warn_only=True' option, if "
        "that's acceptable for your application. You can also file an issue at "
        "https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic support for this "
        "operation."));
  }
  if (mode == 2) {
    const std::string msg =
        cat(caller,
            " does not have a deterministic implementation, but you set "
            "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue at "
            "https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic support for this "
            "operation.");
    aoti_torch_warn(__func__, __FILE__, __LINE__, msg.c_str());
  }
}

// ---- boxed calls -----------------------------------------------------------------------------
// A stable kernel receives its arguments as a stack of StableIValues whose handles it owns. The
// call structs (op_spec.h) take every argument off the stack before anything can throw, so an
// error never leaks a tensor.
class BoxedStack {
 public:
  explicit BoxedStack(StableIValue* stack) : stack_(stack) {}

  template <class T>
  T next() {
    return torch::stable::detail::to<T>(stack_[i_++]);
  }

 private:
  StableIValue* stack_;
  uint64_t i_ = 0;
};

// Read directly (torch::stable's std::string conversion of 2.10-2.13 leaks a copy per call).
template <>
inline std::string BoxedStack::next<std::string>() {
  StringHandle h = torch::stable::detail::to<StringHandle>(stack_[i_++]);
  size_t n = 0;
  const char* data = nullptr;
  const bool ok = torch_string_length(h, &n) == AOTI_TORCH_SUCCESS && torch_string_c_str(h, &data) == AOTI_TORCH_SUCCESS;
  std::string s = ok ? std::string(data, n) : std::string();
  torch_delete_string(h);
  check_shim(ok ? AOTI_TORCH_SUCCESS : AOTI_TORCH_FAILURE, "string argument");
  return s;
}

// Checks the registered schema against the kernel (its call struct, fn's output count), takes the
// arguments, runs `fn` and puts its outputs (a std::array of tensors) on the stack.
template <class Call, class Fn>
void run_boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs, Fn&& fn) {
  using Outputs = std::invoke_result_t<Fn, const Call&>;
  constexpr size_t kNumOutputs = std::tuple_size_v<Outputs>;
  if (num_args != Call::kNumArgs || num_outputs != kNumOutputs) {
    throw std::runtime_error(cat("fusedattn: the registered schema has ", num_args, " arguments and ", num_outputs,
                                 " outputs; the kernel takes ", Call::kNumArgs, " and returns ", kNumOutputs));
  }
  BoxedStack in(stack);
  const Call call = Call::unbox(in);
  Outputs outputs = fn(call);
  for (size_t i = 0; i < kNumOutputs; ++i) stack[i] = torch::stable::detail::from(outputs[i]);
}

// ---- tensors ---------------------------------------------------------------------------------
// The shim's dtype and device codes, fetched once (they are calls, not constants).
struct ShimCodes {
  int32_t f32 = aoti_torch_dtype_float32(), f16 = aoti_torch_dtype_float16(), bf16 = aoti_torch_dtype_bfloat16(),
          f64 = aoti_torch_dtype_float64(), i32 = aoti_torch_dtype_int32(), i64 = aoti_torch_dtype_int64(),
          b8 = aoti_torch_dtype_bool(), u8 = aoti_torch_dtype_uint8();
  int32_t cpu = aoti_torch_device_type_cpu(), cuda = aoti_torch_device_type_cuda();
};
inline const ShimCodes& shim_codes() {
  static const ShimCodes codes;
  return codes;
}

inline DType to_dtype(int32_t code) {
  const ShimCodes& c = shim_codes();
  if (code == c.f32) return DType::kFloat32;
  if (code == c.f16) return DType::kFloat16;
  if (code == c.bf16) return DType::kBFloat16;
  if (code == c.f64) return DType::kFloat64;
  if (code == c.i32) return DType::kInt32;
  if (code == c.i64) return DType::kInt64;
  if (code == c.b8) return DType::kBool;
  return DType::kOther;
}

inline int32_t to_shim_dtype(DType t) {
  const ShimCodes& c = shim_codes();
  switch (t) {
    case DType::kFloat32: return c.f32;
    case DType::kFloat16: return c.f16;
    case DType::kBFloat16: return c.bf16;
    case DType::kFloat64: return c.f64;
    case DType::kInt32: return c.i32;
    case DType::kInt64: return c.i64;
    case DType::kBool: return c.b8;
    default: throw std::runtime_error(cat("fusedattn: no torch dtype for ", dtype_name(t)));
  }
}

// Where a call's outputs go: the device of its first tensor.
struct Placement {
  int32_t device_type = 0;
  int32_t device_index = -1;
  bool is_cuda = false;
};

inline Placement placement_of(const Tensor& t) {
  Placement p;
  check_shim(aoti_torch_get_device_type(t.get(), &p.device_type), "device query");
  check_shim(aoti_torch_get_device_index(t.get(), &p.device_index), "device query");
  p.is_cuda = p.device_type == shim_codes().cuda;
  return p;
}

inline TensorRef to_ref(const Tensor& t, const char* name) {
  AtenTensorHandle h = t.get();
  TensorRef r;
  int64_t ndim = 0;
  check_shim(aoti_torch_get_dim(h, &ndim), "tensor query");
  if (ndim > kMaxRank) {
    raise_status(Status::Invalid(cat(name, " has ", ndim, " dims; at most ", kMaxRank, " are supported")));
  }
  int32_t dtype = 0, device_type = 0, device_index = -1;
  int64_t *sizes = nullptr, *strides = nullptr;
  check_shim(aoti_torch_get_dtype(h, &dtype), "tensor query");
  check_shim(aoti_torch_get_device_type(h, &device_type), "tensor query");
  check_shim(aoti_torch_get_device_index(h, &device_index), "tensor query");
  check_shim(aoti_torch_get_sizes(h, &sizes), "tensor query");
  check_shim(aoti_torch_get_strides(h, &strides), "tensor query");
  const ShimCodes& c = shim_codes();
  r.dtype = to_dtype(dtype);
  r.device = device_type == c.cpu ? DeviceType::kCPU : (device_type == c.cuda ? DeviceType::kCUDA : DeviceType::kOther);
  // A meta (or other) tensor has no data here: the core rejects its device before anything reads it.
  if (r.device != DeviceType::kOther) check_shim(aoti_torch_get_data_ptr(h, &r.data), "tensor query");
  r.device_index = r.device == DeviceType::kCPU ? -1 : device_index;
  r.ndim = static_cast<int>(ndim);
  for (int i = 0; i < r.ndim; ++i) {
    r.sizes[i] = sizes[i];
    r.strides[i] = strides[i];
  }
  return r;
}

inline TensorRef to_ref(const OptTensor& t, const char* name) { return t.has_value() ? to_ref(*t, name) : TensorRef{}; }

// Uninitialised and contiguous, from torch's allocator for the device (on CUDA: the caching
// allocator, on the current stream).
inline Tensor empty_with_code(const int64_t* sizes, int ndim, int32_t shim_dtype, const Placement& where) {
  std::array<int64_t, kMaxRank> strides{};
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= sizes[i] > 0 ? sizes[i] : 1;
  }
  AtenTensorHandle h = nullptr;
  check_shim(aoti_torch_empty_strided(ndim, sizes, strides.data(), shim_dtype, where.device_type, where.device_index, &h),
             "allocation");
  return Tensor(h);
}

inline Tensor empty(const OutputShape& s, const Placement& where) {
  return empty_with_code(s.sizes, s.ndim, to_shim_dtype(s.dtype), where);
}

inline Tensor empty_bytes(int64_t n, const Placement& where) { return empty_with_code(&n, 1, shim_codes().u8, where); }

inline void fill_zeros(const Tensor& t) { check_shim(aoti_torch_zero_(t.get()), "zero_"); }

inline void fill_value(const Tensor& t, double value) { check_shim(aoti_torch_aten_fill__Scalar(t.get(), value), "fill_"); }

inline Tensor cloned(const Tensor& t) {
  AtenTensorHandle h = nullptr;
  check_shim(aoti_torch_clone(t.get(), &h), "clone");
  return Tensor(h);
}

// The CPU engine's parallelism goes through PyTorch's intra-op pool, so torch.set_num_threads
// governs it like any other CPU op.
class StableExecutor final : public Executor {
 public:
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const override {
    torch::stable::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { fn(b, e); });
  }
  int num_threads() const override { return static_cast<int>(torch::stable::get_num_threads()); }
  // Where one thread and two of the pool took the same time on a 2-core x86 machine (a forward of
  // 2^18 multiply-adds; the backward's phases likewise).
  int64_t serial_macs() const override { return int64_t{1} << 18; }
};

}  // namespace fusedattn::binding
