// FUSEDATTN_HD marks small functions that both the host (the CPU engine, host-side planning) and
// CUDA kernels call: __host__ __device__ and inlined under nvcc, plain inline elsewhere, so the
// torch-free core compiles them without CUDA.
#pragma once

#if defined(__CUDACC__)
#define FUSEDATTN_HD __host__ __device__ __forceinline__
#else
#define FUSEDATTN_HD inline
#endif
