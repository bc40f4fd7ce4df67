// Register-blocked micro-GEMM of the CPU engine:
//   C[M x N] (= or +=) A(M x K) * B[K x N]
// A is read one element at a time through two strides, so a transposed
// operand (P^T, dS^T in backward) needs no copy; B and C rows are contiguous
// with N a multiple of the vector width (scratch rows are padded with zeros).
// A block of MR rows x NV vectors of C lives in registers for the whole K
// loop: per k, NV vector loads of B, MR broadcasts of A, MR*NV FMAs.
#pragma once

#include <cstdint>

#include "cpu_isa.h"
#include "cpu_simd.h"

namespace fusedattn {
namespace cpu {
inline namespace FUSEDATTN_CPU_ISA {

// MR x NV accumulators plus NV B vectors and one broadcast must fit the
// register file: 16 + 4 + 1 of 32 zmm (AVX-512); 12 + 2 + 1 of 16 ymm (AVX2);
// 8 + 2 + 1 of 16 xmm (SSE/NEON).
#ifndef FA_MR
#define FA_MR (kVecBytes == 64 ? 4 : (kVecBytes == 32 ? 6 : 4))
#define FA_NV (kVecBytes == 64 ? 4 : 2)
#endif
template <class A>
struct GemmShape {
  static constexpr int MR = FA_MR;
  static constexpr int NV = FA_NV;
};

// GCC folds the B loads into the FMAs as memory operands, reloading each B
// vector MR times; an empty asm that "modifies" the vector pins it in a
// register, so B is loaded once per k and the A broadcasts fold instead.
#if defined(__GNUC__) && defined(__AVX512F__)
#define FA_KEEP_IN_REGISTER(x) asm("" : "+v"(x))
#elif defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FA_KEEP_IN_REGISTER(x) asm("" : "+x"(x))
#elif defined(__GNUC__) && defined(__aarch64__)
#define FA_KEEP_IN_REGISTER(x) asm("" : "+w"(x))
#else
#define FA_KEEP_IN_REGISTER(x) (void)0
#endif

template <class A, int MR, int NV, bool kAccumulate>
inline void gemm_block(int K, const A* __restrict a, int64_t ars, int64_t acs, const A* __restrict b, int64_t ldb,
                       A* __restrict c, int64_t ldc) {
  using S = Simd<A>;
  using V = typename S::V;
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? vload(c + r * ldc + v * S::N) : V{};
  for (int k = 0; k < K; ++k) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = vload(b + k * ldb + v * S::N);
      FA_KEEP_IN_REGISTER(bv[v]);  // keep B in a register: one load per k, the A broadcasts fold into the FMAs
    }
    const A* ak = a + k * acs;
    for (int r = 0; r < MR; ++r) {
      const V av = vsplat<A>(ak[r * ars]);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) vstore(c + r * ldc + v * S::N, acc[r][v]);
}

// The last M % MR rows, with a block of exactly that many rows.
template <class A, int R, int NV, bool kAccumulate>
inline void gemm_row_tail(int rem, int K, const A* a, int64_t ars, int64_t acs, const A* b, int64_t ldb, A* c,
                          int64_t ldc) {
  if constexpr (R > 0) {
    if (rem == R) {
      gemm_block<A, R, NV, kAccumulate>(K, a, ars, acs, b, ldb, c, ldc);
    } else {
      gemm_row_tail<A, R - 1, NV, kAccumulate>(rem, K, a, ars, acs, b, ldb, c, ldc);
    }
  }
}

// One column block of NV vectors, all M rows.
template <class A, int NV, bool kAccumulate>
inline void gemm_column_block(int M, int K, const A* a, int64_t ars, int64_t acs, const A* b, int64_t ldb, A* c,
                              int64_t ldc) {
  constexpr int MR = GemmShape<A>::MR;
  int i = 0;
  for (; i + MR <= M; i += MR) gemm_block<A, MR, NV, kAccumulate>(K, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc);
  if (i < M) gemm_row_tail<A, MR - 1, NV, kAccumulate>(M - i, K, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc);
}

// The last column vectors (fewer than NV).
template <class A, int NV, bool kAccumulate>
inline void gemm_column_tail(int vecs, int M, int K, const A* a, int64_t ars, int64_t acs, const A* b, int64_t ldb,
                             A* c, int64_t ldc) {
  if constexpr (NV > 0) {
    if (vecs == NV) {
      gemm_column_block<A, NV, kAccumulate>(M, K, a, ars, acs, b, ldb, c, ldc);
    } else {
      gemm_column_tail<A, NV - 1, kAccumulate>(vecs, M, K, a, ars, acs, b, ldb, c, ldc);
    }
  }
}

template <class A, bool kAccumulate>
inline void gemm(int M, int N, int K, const A* a, int64_t ars, int64_t acs, const A* b, int64_t ldb, A* c,
                 int64_t ldc) {
  constexpr int NV = GemmShape<A>::NV;
  constexpr int W = Simd<A>::N;
  int j = 0;
  for (; j + NV * W <= N; j += NV * W) gemm_column_block<A, NV, kAccumulate>(M, K, a, ars, acs, b + j, ldb, c + j, ldc);
  if (j < N) gemm_column_tail<A, NV - 1, kAccumulate>((N - j) / W, M, K, a, ars, acs, b + j, ldb, c + j, ldc);
}

}  // namespace FUSEDATTN_CPU_ISA
}  // namespace cpu
}  // namespace fusedattn
