// Vocabulary of the torch-free core: dtypes, devices, enums, the status type
// and the torch-free view of a tensor. Nothing here knows about PyTorch; the
// binding converts at::Tensor into TensorRef in exactly one function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fusedattn {

enum class DType : int8_t { kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kBool, kOther };
enum class DeviceType : int8_t { kCPU, kCUDA, kOther };

// Layout of a q/k/v-like tensor. Packed layouts (bs3hd, sbh3d, t3hd, hd_2hd,
// ...) are not formats of their own: they reach the core as three strided views
// of one buffer, and the core addresses every tensor through its strides.
enum class Format : int8_t { kBSHD, kSBHD, kTHD };

// Masking is decomposed into orthogonal parts (see attn_args.h): whether
// per-sequence lengths apply, whether a causal window applies and to which
// diagonal it is aligned, and whether an explicit boolean mask is given.
enum class MaskType : int8_t {
  kNoMask,
  kPadding,
  kCausal,
  kPaddingCausal,
  kCausalBottomRight,
  kPaddingCausalBottomRight,
  kArbitrary,
};

enum class SoftmaxType : int8_t { kVanilla, kOffByOne, kLearnable };
enum class BiasType : int8_t { kNoBias, kPostScaleBias, kAlibi };

enum class StatusCode : int8_t { kOk, kInvalidArgument, kUnsupported };

// Every user-facing failure travels as a Status: the binding turns
// kInvalidArgument into ValueError and kUnsupported into NotImplementedError.
// The core never aborts or asserts on user input.
struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  static Status Ok() { return {}; }
  static Status Invalid(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  bool ok() const { return code == StatusCode::kOk; }
};

#define FUSEDATTN_RETURN_IF_ERROR(expr)   \
  do {                                    \
    ::fusedattn::Status _st = (expr);     \
    if (!_st.ok()) return _st;            \
  } while (0)

constexpr int kMaxRank = 6;

// A non-owning description of a tensor: enough for validation (dtype, device,
// sizes) and for addressing (data pointer, strides in elements).
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kOther;
  DeviceType device = DeviceType::kCPU;
  int device_index = -1;
  int ndim = -1;  // -1: absent (an optional argument that was not given)
  int64_t sizes[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};

  bool defined() const { return ndim >= 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    return n;
  }
  int64_t size(int dim) const { return sizes[dim < 0 ? dim + ndim : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + ndim : dim]; }
};

const char* dtype_name(DType t);
// Bytes per element of a floating dtype; 0 for the others.
constexpr int64_t float_dtype_bytes(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 ? 2 : t == DType::kFloat32 ? 4 : t == DType::kFloat64 ? 8 : 0;
}
const char* device_name(DeviceType t);
std::string shape_str(const TensorRef& t);

Status parse_format(std::string_view s, Format* out);
Status parse_mask_type(std::string_view s, MaskType* out);
Status parse_softmax_type(std::string_view s, SoftmaxType* out);
const char* format_name(Format f);
const char* mask_type_name(MaskType m);
const char* softmax_type_name(SoftmaxType s);

}  // namespace fusedattn
