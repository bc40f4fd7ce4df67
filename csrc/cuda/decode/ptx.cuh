// The decode kernels' own sm_80+ pieces beside the shared wrappers (common/ptx.cuh: ldmatrix,
// mma.sync, cp.async commit/wait, pack2, the swizzle): a cp.async with an L2 hint and a byte count,
// and ldmatrix row addresses without SwzAddr's chunk offset.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/ptx.cuh"

namespace fusedattn {
namespace decode {

using namespace gpu;

// 16 bytes global -> shared, L2 only (the cache is read once). src_bytes 0
// writes 16 zero bytes without reading src (src must still be a valid address).
__device__ __forceinline__ void cp_async16_l2(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// The element offset of `p` from `base` (two T arrays of the flat global address space), and the
// decode kernel's marker of a key outside the cache.
constexpr long long kNoKey = -0x7fffffffffffffffLL - 1;
template <class T>
__device__ __forceinline__ long long elem_distance(const T* p, const T* base) {
  const long long bytes = static_cast<long long>(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base));
  return bytes / static_cast<long long>(sizeof(T));
}

// ldmatrix row addresses of one operand with the swizzle folded into four
// registers: common/ptx.cuh's SwzAddr for operands of at most 4 k-steps per line, without its chunk
// offset (which costs the decode kernel's prologue a few instructions). Each lane reads chunk
// 2 * kk + hi of its row at k-step kk; every 8x8 matrix starts at a row that is a multiple of 8, so
// (row & 7) is the same for all of a lane's rows, and chunk (2kk + hi) ^ (row & 7) is (kk / 4)
// whole 128-byte lines plus one of four lane-dependent offsets.
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
