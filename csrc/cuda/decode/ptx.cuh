// The sm_80+ instructions of the decode kernels: cp.async (with zero fill),
// ldmatrix and mma.sync m16n8k16 with fp32 accumulation. Kept apart from the
// tensor-core engine's own wrappers (csrc/cuda/tc/ptx.h) so that the decode
// kernels build with FUSEDATTN_CUDA_TC=OFF too.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fusedattn {
namespace decode {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, L2 only (the cache is read once). src_bytes 0
// writes 16 zero bytes without reading src (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for one m16n8k16 tile (a: 4 registers of the row-major A
// fragment, b0/b1: the column-major B fragment).
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit elements (lower address first).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
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
