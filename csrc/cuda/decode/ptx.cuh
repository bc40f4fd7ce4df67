// The sm_80+ instructions of the decode kernels: cp.async (with zero fill),
// ldmatrix and mma.sync m16n8k16 with fp32 accumulation. The wrappers they
// share with the tensor-core engine come from its header (csrc/cuda/tc/ptx.h,
// a header only, so FUSEDATTN_CUDA_TC=OFF builds still have it); the ones
// here differ (cp_async16's L2 hint and byte count, the decode tiles' swizzle).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tc/ptx.h"

namespace fusedattn {
namespace decode {

// The wrappers both mma.sync engines use, from the tensor-core engine's header.
using tc::cp_async_commit;
using tc::cp_async_wait;
using tc::ldsm_x4;
using tc::ldsm_x4_t;
using tc::pack2;
using tc::smem_u32;

// 16 bytes global -> shared, L2 only (the cache is read once). src_bytes 0
// writes 16 zero bytes without reading src (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// c += a * b for one m16n8k16 tile (tc::mma under the name the decode kernels use).
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  tc::mma<T>(c, a, b0, b1);
}

// Byte offset of 16-byte chunk c of row r in a tile of kRowBytes-byte rows:
// chunk c lives at c ^ (r & 7), so the 8 rows one ldmatrix 8x8 matrix reads
// (same logical chunk, consecutive rows) hit 8 different bank groups.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  static_assert(kRowBytes >= 128 && kRowBytes % 128 == 0, "swizzle needs rows of whole 128-byte lines");
  return static_cast<uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
}

// ldmatrix row addresses of one operand with the swizzle folded into four
// registers. Each lane reads chunk 2 * kk + hi of its row at k-step kk; every
// 8x8 matrix starts at a row that is a multiple of 8, so (row & 7) is the
// same for all of a lane's rows, and chunk (2kk + hi) ^ (row & 7) is
// (kk / 4) whole 128-byte lines plus one of four lane-dependent offsets.
// Further rows (multiples of 8 away) and stages are added as offsets.
template <int kRowBytes>
struct SwzRows {
  uint32_t p[4];
  __device__ __forceinline__ SwzRows(uint32_t base, int row, int hi) {
    const int r = row & 7;
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = base + row * kRowBytes + (((2 * k + hi) ^ r) << 4);
  }
  __device__ __forceinline__ uint32_t at(int kk) const { return p[kk & 3] + (kk >> 2) * 128; }
};

}  // namespace decode
}  // namespace fusedattn
