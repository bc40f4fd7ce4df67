// The only code that converts between at::Tensor and the core's TensorRef, and
// between the core's Status and Python exceptions.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>

#include "fusedattn/api.h"
#include "fusedattn/cat.h"
#include "fusedattn/overrides.h"

namespace fusedattn::binding {

inline DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kBool: return DType::kBool;
    default: return DType::kOther;
  }
}

inline at::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat64: return at::kDouble;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
    case DType::kBool: return at::kBool;
    default: TORCH_CHECK(false, "fusedattn: no torch dtype for ", dtype_name(t));
  }
}

inline TensorRef to_ref(const at::Tensor& t, const char* name) {
  TensorRef r;
  TORCH_CHECK_VALUE(t.dim() <= kMaxRank, cat(name, " has ", t.dim(), " dims; at most ", kMaxRank, " are supported"));
  r.dtype = to_dtype(t.scalar_type());
  r.device = t.is_cpu() ? DeviceType::kCPU : (t.is_cuda() ? DeviceType::kCUDA : DeviceType::kOther);
  // A meta (or other) tensor has no data here: the core rejects its device before anything reads it.
  r.data = r.device == DeviceType::kOther ? nullptr : t.data_ptr();
  r.device_index = t.is_cpu() ? -1 : t.get_device();
  r.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < r.ndim; ++i) {
    r.sizes[i] = t.size(i);
    r.strides[i] = t.stride(i);
  }
  return r;
}

inline TensorRef to_ref(const std::optional<at::Tensor>& t, const char* name) {
  return t.has_value() ? to_ref(*t, name) : TensorRef{};
}

inline void raise_if_error(const Status& st) {
  if (st.ok()) return;
  if (st.code == StatusCode::kUnsupported) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "fusedattn: unsupported configuration: ", st.message);
  }
  TORCH_CHECK_VALUE(false, "fusedattn: ", st.message);
}

// The FUSEDATTN_* switches, parsed once; a malformed one fails every call (on any device).
inline const Overrides& checked_overrides() {
  const ProcessOverrides& o = process_overrides();
  raise_if_error(o.status);
  return o.values;
}

inline at::Tensor empty_like_shape(const OutputShape& s, const at::TensorOptions& opts) {
  std::vector<int64_t> sizes(s.sizes, s.sizes + s.ndim);
  return at::empty(sizes, opts.dtype(to_scalar_type(s.dtype)));
}

// The CPU engine's parallelism goes through PyTorch's intra-op pool, so
// torch.set_num_threads governs it like any other CPU op.
class AtenExecutor final : public Executor {
 public:
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const override {
    at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { fn(b, e); });
  }
  int num_threads() const override { return at::get_num_threads(); }
};

}  // namespace fusedattn::binding
