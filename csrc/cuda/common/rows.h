// The layout the 16-byte row paths need (cp.async, TMA, vector loads and stores of q/k/v/out-like
// tensors): unit head-dim stride, a 16-byte aligned base, and every other stride a multiple of 8
// elements. Head dims are multiples of 8 (check.cc), so 8-element chunks never straddle rows.
#pragma once

#include <cstdint>
#include <string>

#include "fusedattn/cat.h"
#include "fusedattn/params.h"

namespace fusedattn {
namespace gpu {

inline bool rows16(const SeqTensor& t) {
  return t.data != nullptr && t.stride_d == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
         t.stride_b % 8 == 0 && t.stride_s % 8 == 0 && t.stride_h % 8 == 0;
}

// Why `t` (named `name`) does not have that layout; "" when it does.
inline std::string rows16_problem(const SeqTensor& t, const char* name) {
  if (rows16(t)) return "";
  if (t.stride_d != 1) return cat(name, " has stride ", t.stride_d, " on the head dim (16-byte rows need 1)");
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return cat(name, " is not 16-byte aligned");
  return cat(name, " strides (b ", t.stride_b, ", s ", t.stride_s, ", h ", t.stride_h,
             ") are not multiples of 8 elements");
}

}  // namespace gpu
}  // namespace fusedattn
