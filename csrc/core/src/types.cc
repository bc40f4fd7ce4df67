#include "fusedattn/types.h"

#include "fusedattn/cat.h"
#include "fusedattn/params.h"

namespace fusedattn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    default: return "an unsupported dtype";
  }
}

const char* device_name(DeviceType t) {
  switch (t) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda";
    default: return "an unsupported device";
  }
}

std::string shape_str(const TensorRef& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += cat(i ? ", " : "", t.sizes[i]);
  return s + "]";
}

namespace {
template <typename E>
struct Named {
  std::string_view name;
  E value;
};

constexpr Named<Format> kFormats[] = {{"bshd", Format::kBSHD}, {"sbhd", Format::kSBHD}, {"thd", Format::kTHD}};

// TransformerEngine's aliases of padding_causal are accepted too. python/fusedattn/attention.py's
// MASK_TYPES and MASK_ALIASES name the same table (tests/test_contract.py holds them to it).
constexpr Named<MaskType> kMasks[] = {
    {"no_mask", MaskType::kNoMask},
    {"padding", MaskType::kPadding},
    {"causal", MaskType::kCausal},
    {"padding_causal", MaskType::kPaddingCausal},
    {"causal_bottom_right", MaskType::kCausalBottomRight},
    {"padding_causal_bottom_right", MaskType::kPaddingCausalBottomRight},
    {"arbitrary", MaskType::kArbitrary},
    {"padding,causal", MaskType::kPaddingCausal},
    {"causal,padding", MaskType::kPaddingCausal},
    {"causal_padding", MaskType::kPaddingCausal},
};

constexpr Named<SoftmaxType> kSoftmax[] = {
    {"vanilla", SoftmaxType::kVanilla}, {"off-by-one", SoftmaxType::kOffByOne}, {"learnable", SoftmaxType::kLearnable}};

template <typename E, size_t N>
Status parse(std::string_view s, const Named<E> (&table)[N], const char* what, E* out) {
  for (const auto& e : table) {
    if (e.name == s) {
      *out = e.value;
      return Status::Ok();
    }
  }
  std::string msg = std::string(what) + " must be one of ";
  for (size_t i = 0; i < N; ++i) msg += (i ? ", '" : "'") + std::string(table[i].name) + "'";
  msg += "; got '" + std::string(s) + "'";
  return Status::Invalid(msg);
}

template <typename E, size_t N>
const char* name_of(E v, const Named<E> (&table)[N]) {
  for (const auto& e : table)
    if (e.value == v) return e.name.data();
  return "?";
}
}  // namespace

Status parse_format(std::string_view s, Format* out) { return parse(s, kFormats, "qkv_format", out); }
Status parse_mask_type(std::string_view s, MaskType* out) { return parse(s, kMasks, "attn_mask_type", out); }
Status parse_softmax_type(std::string_view s, SoftmaxType* out) { return parse(s, kSoftmax, "softmax_type", out); }
const char* format_name(Format f) { return name_of(f, kFormats); }
const char* mask_type_name(MaskType m) { return name_of(m, kMasks); }
const char* softmax_type_name(SoftmaxType s) { return name_of(s, kSoftmax); }

bool mask_is_causal(MaskType m) {
  return m == MaskType::kCausal || m == MaskType::kPaddingCausal || m == MaskType::kCausalBottomRight ||
         m == MaskType::kPaddingCausalBottomRight;
}

bool mask_has_padding(MaskType m) {
  return m == MaskType::kPadding || m == MaskType::kPaddingCausal || m == MaskType::kPaddingCausalBottomRight;
}

bool mask_default_bottom_right(MaskType m) { return !(m == MaskType::kCausal || m == MaskType::kPaddingCausal); }

}  // namespace fusedattn
