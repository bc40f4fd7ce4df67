// The CUDA append of fusedattn/kv_cache.h: copy_to_kv_cache, and the append of a KV-cache step that
// the decode engine does not fuse (kv_cache/step.cu), which also writes the step's key lengths for
// the attention launched after it. Every new token's k and v head vectors are copied into its page
// and slot.
//
// One warp per new token (grid-stride): lane 0 reads the sequence's lengths
// and the page, the warp copies the token's h_kv x (d_k + d_v) elements in
// 16-byte pieces when both sides allow (else element by element). Nothing is
// checked on the host (the data lives on the device): a token the CPU engine
// would reject is skipped, so a bad call never writes out of bounds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "append.h"
#include "fusedattn/cuda_api.h"

namespace fusedattn {
namespace {

constexpr int kThreads = 256;

struct AppendArgs {
  KvAppendParams p;
  int es;            // element bytes
  bool k_vec, v_vec;  // 16-byte pieces possible for k / v
  int64_t tokens;    // bshd/sbhd: b * s_new (token i of sequence b is u = b * s_new + i); thd: s_new
  StepKeyLens lens;  // a step's key lengths (block 0 writes them), or none
};

// Where token u of the step goes, or false to skip it.
struct Dest {
  int64_t b, i, page, slot;
};

__device__ bool locate(const AppendArgs& a, int64_t u, Dest* d) {
  const KvAppendParams& p = a.p;
  int64_t b, i;
  if (p.new_is_thd) {
    // The sequence whose [cu[b], cu[b+1]) holds token u (cu assumed sorted;
    // any other cu still maps u to at most one sequence and passes the range
    // checks below before anything is written).
    int64_t lo = 0, hi = p.b - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (p.cu_new_lens[mid] <= u) lo = mid; else hi = mid - 1;
    }
    b = lo;
    i = u - p.cu_new_lens[b];
  } else {
    b = u / p.s_new;
    i = u % p.s_new;
  }
  const int64_t start = p.cu_new_lens != nullptr ? p.cu_new_lens[b] : 0, len = kv_new_len(p, b);
  const int64_t cached = p.cache_seqlens[b];
  if (start < 0 || len <= 0 || i < 0 || i >= len || cached < 0) return false;
  if (p.new_is_thd ? start + len > p.s_new : len > p.s_new) return false;
  const int64_t pos = cached + i;
  if (pos >= p.capacity) return false;
  const int64_t page = kv_page_of(p.paged, b, pos);
  if (page < 0 || page >= p.paged.num_pages) return false;
  *d = {b, i, page, pos % p.paged.page_size};
  return true;
}

template <class E>
__device__ __forceinline__ void copy_elems(const SeqTensor& src, int64_t src_row, const SeqTensor& dst,
                                           int64_t dst_row, int64_t h, int64_t d, int lane) {
  const E* s = static_cast<const E*>(src.data) + src_row;
  E* t = static_cast<E*>(dst.data) + dst_row;
  for (int64_t e = lane; e < h * d; e += 32) {
    const int64_t hh = e / d, c = e % d;
    t[hh * dst.stride_h + c * dst.stride_d] = s[hh * src.stride_h + c * src.stride_d];
  }
}

// One token's h x d block of one tensor pair; rows start at src_row / dst_row (elements).
__device__ void copy_token(const AppendArgs& a, bool vec, const SeqTensor& src, int64_t src_row, const SeqTensor& dst,
                           int64_t dst_row, int64_t d, int lane) {
  const int64_t h = a.p.h_kv;
  if (vec) {
    const int64_t per_row = d * a.es / 16;  // 16-byte pieces per head
    const char* s = static_cast<const char*>(src.data) + src_row * a.es;
    char* t = static_cast<char*>(dst.data) + dst_row * a.es;
    for (int64_t e = lane; e < h * per_row; e += 32) {
      const int64_t hh = e / per_row, c = e % per_row;
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(s + hh * src.stride_h * a.es) + c);
      reinterpret_cast<uint4*>(t + hh * dst.stride_h * a.es)[c] = v;
    }
    return;
  }
  switch (a.es) {
    case 2: copy_elems<uint16_t>(src, src_row, dst, dst_row, h, d, lane); break;
    case 4: copy_elems<uint32_t>(src, src_row, dst, dst_row, h, d, lane); break;
    default: copy_elems<uint64_t>(src, src_row, dst, dst_row, h, d, lane); break;
  }
}

// cu_kv[b + 1] - cu_kv[b] = kv_step_len(cache_seqlens[b], len(b)), both clamped into the attention's
// dims (as the decode engine clamps them), summed in 64 bits and saturated at int32's maximum (the
// plan keeps b * s_kv below it). One block: thread t sums a run of sequences, then the runs' sums
// are scanned in shared memory.
__device__ void write_step_lens(const AppendArgs& a) {
  const KvAppendParams& p = a.p;
  const StepKeyLens& l = a.lens;
  __shared__ int64_t run_sum[kThreads];
  const auto keys = [&](int64_t b) -> int64_t {
    const int64_t cached = min(max(int64_t(p.cache_seqlens[b]), int64_t(0)), l.s_kv);
    const int64_t len = min(max(kv_new_len(p, b), int64_t(0)), l.s_q);
    return min(kv_step_len(cached, len), l.s_kv);
  };
  const int64_t per = (p.b + kThreads - 1) / kThreads;
  const int64_t lo = threadIdx.x * per, hi = min(p.b, lo + per);
  int64_t sum = 0;
  for (int64_t b = lo; b < hi; ++b) sum += keys(b);
  run_sum[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t acc = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int64_t v = run_sum[t];
      run_sum[t] = acc;
      acc += v;
    }
    l.cu_kv[0] = 0;
  }
  __syncthreads();
  int64_t acc = run_sum[threadIdx.x];
  for (int64_t b = lo; b < hi; ++b) {
    acc += keys(b);
    l.cu_kv[b + 1] = static_cast<int32_t>(min(acc, int64_t(INT32_MAX)));
  }
}

__global__ void __launch_bounds__(kThreads) kv_append_kernel(const AppendArgs a) {
  const KvAppendParams& p = a.p;
  if (a.lens.cu_kv != nullptr && blockIdx.x == 0) write_step_lens(a);
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t u = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32; u < a.tokens; u += warps) {
    Dest d{};
    int ok = 0;
    if (lane == 0) ok = locate(a, u, &d);
    ok = __shfl_sync(0xffffffffu, ok, 0);
    if (!ok) continue;
    d.b = __shfl_sync(0xffffffffu, d.b, 0);
    d.i = __shfl_sync(0xffffffffu, d.i, 0);
    d.page = __shfl_sync(0xffffffffu, d.page, 0);
    d.slot = __shfl_sync(0xffffffffu, d.slot, 0);
    const int64_t row0 = p.new_is_thd ? int64_t(p.cu_new_lens[d.b]) : 0;  // thd has cu_new_lens
    const int64_t src_k = d.b * p.new_k.stride_b + (row0 + d.i) * p.new_k.stride_s;
    const int64_t src_v = d.b * p.new_v.stride_b + (row0 + d.i) * p.new_v.stride_s;
    copy_token(a, a.k_vec, p.new_k, src_k, p.k_cache, d.page * p.k_cache.stride_b + d.slot * p.k_cache.stride_s,
               p.d_k, lane);
    copy_token(a, a.v_vec, p.new_v, src_v, p.v_cache, d.page * p.v_cache.stride_b + d.slot * p.v_cache.stride_s,
               p.d_v, lane);
  }
}

// Rows of h x d elements in 16-byte pieces: unit head-dim stride, 16-byte
// aligned base and strides, and whole pieces per head.
bool pieces16(const SeqTensor& t, int64_t d, int es) {
  const auto al = [es](int64_t s) { return (s * es) % 16 == 0; };
  return t.stride_d == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && al(t.stride_b) && al(t.stride_s) &&
         al(t.stride_h) && al(d);
}

}  // namespace

Status launch_kv_append(const KvAppendParams& params, const StepKeyLens& lens, const CudaLaunch& launch) {
  AppendArgs a;
  a.p = params;
  a.lens = lens;
  a.es = static_cast<int>(float_dtype_bytes(params.dtype));
  if (a.es == 0) return Status::Unsupported(std::string("copy_to_kv_cache: unsupported dtype ") + dtype_name(params.dtype));
  if (params.paged.page_size <= 0) return Status::Invalid("copy_to_kv_cache: page_size must be positive");
  a.k_vec = pieces16(params.new_k, params.d_k, a.es) && pieces16(params.k_cache, params.d_k, a.es);
  a.v_vec = pieces16(params.new_v, params.d_v, a.es) && pieces16(params.v_cache, params.d_v, a.es);
  a.tokens = params.new_is_thd ? params.s_new : params.b * params.s_new;
  if (params.h_kv <= 0) a.tokens = 0;
  if (a.tokens <= 0 && lens.cu_kv == nullptr) return Status::Ok();
  const int64_t blocks = std::clamp<int64_t>((a.tokens + kThreads / 32 - 1) / (kThreads / 32), 1, 65535);
  kv_append_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(launch.stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::Invalid(std::string("CUDA error in fusedattn copy_to_kv_cache: ") + cudaGetErrorString(e));
  }
  return Status::Ok();
}

Status run_kv_append_cuda(const KvAppendParams& params, const CudaLaunch& launch) {
  return launch_kv_append(params, StepKeyLens{}, launch);
}

}  // namespace fusedattn
