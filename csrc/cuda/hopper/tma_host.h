// Host side of the Hopper kernels' launches: tensor-map encoding (cuTensorMapEncodeTiled, fetched
// from the driver at run time, so there is no -lcuda) and the dynamic shared-memory limit.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums only
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common/smem.h"
#include "params.h"

namespace fusedattn {
namespace hopper {
namespace detail {

typedef CUresult (*EncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

typedef CUresult (*CtxGetCurrentFn)(CUcontext*);

inline void* driver_entry_point(const char* name) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult qres;
  if (cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &qres) != cudaSuccess ||
      qres != cudaDriverEntryPointSuccess)
    return nullptr;
  return ptr;
}

// The encoder, callable on this thread. cuTensorMapEncodeTiled is a driver call and needs a current
// context, which a thread only gets from its first runtime call: autograd's backward thread can reach
// the Hopper backward before any (torch selects the device there without creating the context), and the
// encode then fails with CUDA_ERROR_INVALID_CONTEXT. cudaSetDevice makes the device's primary context
// current (CUDA >= 12); it is not a stream operation, so it is also legal during graph capture.
inline EncodeTiledFn get_encode_fn() {
  static EncodeTiledFn fn = reinterpret_cast<EncodeTiledFn>(driver_entry_point("cuTensorMapEncodeTiled"));
  static CtxGetCurrentFn ctx_get = reinterpret_cast<CtxGetCurrentFn>(driver_entry_point("cuCtxGetCurrent"));
  if (!fn || !ctx_get) return nullptr;
  CUcontext ctx = nullptr;
  if (ctx_get(&ctx) != CUDA_SUCCESS) return nullptr;
  if (ctx == nullptr) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) return nullptr;
  }
  return fn;
}

// A 16-bit [b, s, hh, d] tensor as a 4-D map with dims (d, hh, s, b); box (64, 1, rows, 1): one
// 128-byte row chunk of `rows` rows, 128B swizzle (the layout the wgmma descriptors expect), reads
// out of bounds give zeros.
template <typename T>
inline bool make_map(CUtensorMap* map, const MapDesc& m, int rows) {
  EncodeTiledFn enc = get_encode_fn();
  if (!enc) return false;
  const CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t es = 2;
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(m.d), static_cast<cuuint64_t>(m.hh), static_cast<cuuint64_t>(m.s),
                        static_cast<cuuint64_t>(m.b)};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(m.stride_h) * es, static_cast<cuuint64_t>(m.stride_s) * es,
                           static_cast<cuuint64_t>(m.stride_b) * es};
  cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(rows), 1};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  CUresult r = enc(map, dt, 4, const_cast<void*>(m.ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// The fp32 dQ accumulator [b, s, h, d] (contiguous) as the backward's reduce-add target: box (32
// columns = 128 B, 1 head, 64 rows, 1), 128B swizzle (the staging tiles' layout). Rows >= s are
// out of bounds, which a reduce skips.
inline bool make_dq_acc_map(CUtensorMap* map, float* acc, int b, int s, int h, int d) {
  EncodeTiledFn enc = get_encode_fn();
  if (!enc) return false;
  const cuuint64_t es = 4;
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(h), static_cast<cuuint64_t>(s),
                        static_cast<cuuint64_t>(b)};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(d) * es, static_cast<cuuint64_t>(h) * d * es,
                           static_cast<cuuint64_t>(s) * h * d * es};
  cuuint32_t box[4] = {32, 1, 64, 1};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, acc, dims, strides, box, estr,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace detail
}  // namespace hopper
}  // namespace fusedattn
