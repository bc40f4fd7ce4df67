// What a kernel instantiation computes beyond plain attention: a template argument of the forward
// and backward kernels, whose default (PlainFeatures) is the plain kernel, top-left causal or
// unmasked. The general kernels (GeneralFeatures) read the call's window and diagonal (mask.cuh's
// kMaskGeneral) and softmax type (off-by-one / learnable: epilogue.cuh, the backward's preprocess)
// at run time. kernels.list says which instantiations exist, and sm90.cu takes a call
// only where one does.
#pragma once

namespace fusedattn {
namespace hopper {

// The mask kinds (mask.cuh's TileMask).
enum : int { kMaskNone = 0, kMaskCausal = 1, kMaskGeneral = 2 };

template <int MASK_>
struct Features {
  static constexpr int MASK = MASK_;
  static constexpr bool CAUSAL = MASK == kMaskCausal;
  static constexpr bool GENERAL = MASK == kMaskGeneral;
};
template <bool CAUSAL>
using PlainFeatures = Features<CAUSAL ? kMaskCausal : kMaskNone>;
using GeneralFeatures = Features<kMaskGeneral>;

}  // namespace hopper
}  // namespace fusedattn
