// What a kernel instantiation computes beyond plain attention: a template argument of the forward
// and backward kernels, whose default (PlainFeatures) is the plain kernel, top-left causal or
// unmasked. The general kernels (GeneralFeatures) read the call's window and diagonal (mask.cuh's
// kMaskGeneral) and softmax type (off-by-one / learnable: epilogue.cuh, the backward's preprocess)
// at run time, and may take head dims DQK, DV below the tile's D (0: D): the tensor maps zero-fill the
// columns past them, so the scores are exact and O's extra columns are zeros, and the epilogues store
// DV columns of O and dV, DQK of dK and dQ (tile_head_dim gives D); SOFTCAP: logits capped as
// softcap tanh(scale q.k / softcap) before the masks (softmax.cuh's softcap_scores), with the
// backward's factor 1 - tanh^2; VARLEN (VarlenFeatures, general kernels only): per-sequence lengths
// read on the device, thd or a padding mask (varlen.cuh). kernels.list says which instantiations
// exist, and sm90.cu takes a call only where one does.
#pragma once

namespace fusedattn {
namespace hopper {

// The mask kinds (mask.cuh's TileMask).
enum : int { kMaskNone = 0, kMaskCausal = 1, kMaskGeneral = 2 };

// The kernels' head dim (64, 128 or 256) for a problem's d_qk, d_v (up to 256); 0 if none.
constexpr int tile_head_dim(int d_qk, int d_v) {
  const int d = d_qk > d_v ? d_qk : d_v;
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0;
}

template <int MASK_, int DQK_ = 0, int DV_ = 0, bool SOFTCAP_ = false, bool VARLEN_ = false>
struct Features {
  static constexpr int MASK = MASK_;
  static constexpr bool CAUSAL = MASK == kMaskCausal;
  static constexpr bool GENERAL = MASK == kMaskGeneral;
  static constexpr bool SOFTCAP = SOFTCAP_;
  static constexpr bool VARLEN = VARLEN_;
  // The problem's head dims in a kernel of head dim D: DQK_OF<D>, DV_OF<D>.
  template <int D>
  static constexpr int DQK_OF = DQK_ ? DQK_ : D;
  template <int D>
  static constexpr int DV_OF = DV_ ? DV_ : D;
  static_assert(GENERAL || (DQK_ == 0 && DV_ == 0 && !SOFTCAP && !VARLEN),
                "head dims below the tile's, softcap, varlen: general kernels");
  static_assert(DQK_ % 16 == 0 && DV_ % 16 == 0, "16-element column groups (16-byte TMA strides, stores)");
};
template <bool CAUSAL>
using PlainFeatures = Features<CAUSAL ? kMaskCausal : kMaskNone>;
template <int DQK = 0, int DV = 0, bool SOFTCAP = false>
using GeneralFeatures = Features<kMaskGeneral, DQK, DV, SOFTCAP>;
template <int DQK = 0, int DV = 0, bool SOFTCAP = false>
using VarlenFeatures = Features<kMaskGeneral, DQK, DV, SOFTCAP, true>;

}  // namespace hopper
}  // namespace fusedattn
