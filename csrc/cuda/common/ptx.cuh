// Thin wrappers over the sm_80+ instructions the tensor-core and decode kernels are built
// from: ldmatrix, mma.sync m16n8k16 (fp32 accumulation), cp.async and the
// swizzled shared-memory addressing that keeps ldmatrix free of bank conflicts.
// The shared-memory wrappers are asm volatile: the compiler must not move them
// across the __syncthreads() that order the pipeline stages. mma is a pure
// register operation and is left free to schedule (a volatile mma pins every
// ldmatrix next to its consumer and exposes the ldmatrix latency).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fusedattn {
namespace gpu {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A tile of rows of kRowBytes bytes (>= 128), addressed in 16-byte chunks.
// Chunk c of row r lives at chunk (c ^ (r & 7)): the 8 rows that one ldmatrix
// 8x8 matrix reads (same logical chunk, consecutive rows) then fall on 8
// different 16-byte bank groups, and so do the 16-byte cp.async writes of
// 8 consecutive chunks of one row.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  static_assert(kRowBytes >= 128 && kRowBytes % 128 == 0, "swizzle needs rows of whole 128-byte lines");
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// ldmatrix row addresses of one operand, with the swizzle folded into four
// registers. A warp's 8x8 matrices always start at rows that are multiples of
// 8, so row & 7 == lane & 7 for every matrix and every lane reads chunk
// (2*kk + hi) ^ (lane & 7) of its row at k-step kk: that is (kk / 4) whole
// 128-byte lines plus one of four lane-dependent offsets (kk % 4). Further
// rows are multiples of 8 away, i.e. compile-time immediates.
// c0 (a runtime chunk offset) must be a multiple of 8, or the operand must
// take at most 4 k-steps.
template <int kRowBytes>
struct SwzAddr {
  uint32_t p[4];
  __device__ __forceinline__ SwzAddr(uint32_t base, int row, int hi, int c0 = 0) {
    const int r = row & 7;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c = c0 + 2 * k + hi;
      p[k] = base + row * kRowBytes + ((c >> 3) << 7) + (((c & 7) ^ r) << 4);
    }
  }
  // Address of chunk pair kk (chunks 2kk, 2kk+1 selected by hi) at row + drow (drow % 8 == 0).
  __device__ __forceinline__ uint32_t at(int kk, int drow = 0) const {
    return p[kk & 3] + (kk >> 2) * 128 + drow * kRowBytes;
  }
};

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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FUSEDATTN_TC_HAS_STMATRIX 1
// sm_90: four 8x8 b16 matrices from mma accumulator fragments (lane l holds
// row l/4, columns 2(l%4), 2(l%4)+1 of each) to shared memory; lane l gives
// the address of row l%8 of matrix l/8. One instruction replaces 8 st.shared.b32.
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3));
}
#else
#define FUSEDATTN_TC_HAS_STMATRIX 0
#endif

template <typename Elem>
struct MmaOp;

template <>
struct MmaOp<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct MmaOp<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <typename Elem>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  MmaOp<Elem>::run(c, a, b0, b1);
}

// Two floats to a packed pair; the first lands in the low half (the lower
// column of an mma fragment).
template <typename Elem>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename Elem>
__device__ __forceinline__ float to_float(Elem x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename Elem>
__device__ __forceinline__ Elem from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16-byte global -> shared copy; when !pred nothing is read and the 16 bytes
// are zero-filled (src-size 0), which is how tiles are padded past a
// sequence's end and past the real head dim.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void st_shared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
}

__device__ __forceinline__ uint4 ld_shared128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}

// threadIdx.x read afresh (volatile: not merged with earlier reads), so that
// offsets derived from it are recomputed where used instead of being kept in
// registers, or spilled, across a long loop.
__device__ __forceinline__ int fresh_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

// 2^x with the MUFU unit (ex2.approx(-inf) = +0, which the masked-out logits rely on).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// fp32 accumulation into global memory: one vector reduction for a pair on
// sm_90, two scalar ones before.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// atomic_add2 under a predicate, without a branch on sm_90 (a predicated
// red.v2): a row of dQ atomics then does not split the surrounding matmul
// code into basic blocks that ptxas cannot schedule across.
__device__ __forceinline__ void atomic_add2_if(float* p, float a, float b, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %3, 0;\n @q red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(p),
      "f"(a), "f"(b), "r"(static_cast<int>(pred)));
#else
  if (pred) {
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
  }
#endif
}

}  // namespace gpu
}  // namespace fusedattn
