// The decode kernel (see tile.h for the block's shape and decode.h for the
// split-KV scheme).
//
// Per block: Q rows of one KV head's group -> shared memory once; then key
// tiles of BN keys stream through a STAGES-deep cp.async ring. The page of
// every key of a tile is looked up one tile ahead of its copy (a register per
// thread, then a (k, v) element-offset table in shared memory), so the copy
// of tile x + STAGES - 1 never waits on a page-table read. Per tile and warp:
// S = Q K^T (mma.sync m16n8k16, fp32), scale, ALiBi, mask, online softmax in
// exp2, P (rounded to the input dtype) . V into fp32 registers. At the end the
// warps' partial softmax states merge in shared memory and the block writes
// either the final output and lse (one split) or its normalised partial O and
// log2-lse to the workspace (several splits; decode_combine_kernel finishes).
// decode_cluster_kernel (sm_90, opt-in: run.cu) is the same block with another
// end: the splits of a cluster merge in distributed shared memory (cluster.cuh).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cluster.cuh"
#include "decode.h"
#include "epilogue.cuh"
#include "ptx.cuh"
#include "simt/common.cuh"
#include "tile.h"

namespace fusedattn {
namespace decode {

using simt::SeqInfo;

// The block's code: decode_block.inc (see there why it is included rather than called).
template <class T, int D, int WM>
__global__ void __launch_bounds__(kThreads) decode_kernel(const FwdParams p, const KernelArgs a) {
  constexpr bool kCluster = false;
#include "decode_block.inc"
}

// Launched with cluster dims (a.splits, 1, 1) over a grid of a.splits blocks along x. run.cu
// chooses it on sm_90 devices running code built for sm_90 only: the library also builds
// sm_80, where the cluster instructions do not exist and the body is empty.
template <class T, int D, int WM>
__global__ void __launch_bounds__(kThreads) decode_cluster_kernel(const FwdParams p, const KernelArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kCluster = true;
#include "decode_block.inc"
#endif
}

// ---- launchers ------------------------------------------------------------------

template <class T, int D, int WM>
Status launch_variant(const FwdParams& p, const Plan& plan, const KernelArgs& a, cudaStream_t stream) {
  using C = Tile<D, WM>;
  const auto kernel = decode_kernel<T, D, WM>;
  static std::atomic<uint64_t> smem_ready{0};
  FUSEDATTN_RETURN_IF_ERROR(simt::prepare_smem(kernel, C::kSmemBytes, "decode", &smem_ready));
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(p.prob.h_kv * plan.chunks),
                  static_cast<unsigned>(p.prob.b));
  kernel<<<grid, kThreads, C::kSmemBytes, stream>>>(p, a);
  return simt::check_launch("decode kernel");
}

// The cluster kernel's set-up, once per device and kernel: its dynamic shared-memory limit
// (prepare_smem) and permission for clusters above the portable 8 CTAs (kMaxCluster). No call
// synchronises, and after the first none reaches the driver (capture is unaffected).
template <class T, int D, int WM>
Status prepare_cluster_kernel() {
  const auto kernel = decode_cluster_kernel<T, D, WM>;
  static std::atomic<uint64_t> smem_ready{0}, nonportable_ready{0};
  FUSEDATTN_RETURN_IF_ERROR(simt::prepare_smem(kernel, Tile<D, WM>::kSmemBytes, "decode cluster", &smem_ready));
  int dev = 0;
  FUSEDATTN_RETURN_IF_ERROR(simt::cuda_error(cudaGetDevice(&dev), "decode cluster"));
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit != 0 && (nonportable_ready.load(std::memory_order_relaxed) & bit)) return Status::Ok();
  FUSEDATTN_RETURN_IF_ERROR(simt::cuda_error(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "decode cluster"));
  nonportable_ready.fetch_or(bit, std::memory_order_relaxed);
  return Status::Ok();
}

// Launch configuration of the cluster kernel over `grid`: one cluster per (x extent = splits)
// row of the grid. *attr holds the cluster attribute the configuration points to.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, size_t smem, cudaStream_t stream,
                                                cudaLaunchAttribute* attr) {
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = grid.x;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clusters of `splits` CTAs of decode_cluster_kernel<T, D, WM> the current device holds at
// once; 0 when it cannot run them: the kernel's set-up or the query fails, or the code the
// device runs was built for an architecture below sm_90 (a build without sm_90 code whose PTX
// the driver compiled: the kernel's body is empty there). Asked once per device and size.
template <class T, int D, int WM>
int cluster_fit(int splits) {
  static std::atomic<int> cache[64][kMaxCluster + 1];  // clusters + 1; 0: not asked yet
  int dev = 0;
  if (splits < 2 || splits > kMaxCluster || cudaGetDevice(&dev) != cudaSuccess) return 0;
  std::atomic<int>* slot = dev >= 0 && dev < 64 ? &cache[dev][splits] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) > 0) return slot->load(std::memory_order_relaxed) - 1;
  const auto kernel = decode_cluster_kernel<T, D, WM>;
  cudaFuncAttributes fa = {};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      cluster_launch_config(dim3(static_cast<unsigned>(splits)), Tile<D, WM>::kSmemBytes, nullptr, &attr);
  int n = 0;
  // ptxVersion: the virtual architecture (x 10) the function was compiled from.
  if (!prepare_cluster_kernel<T, D, WM>().ok() || cudaFuncGetAttributes(&fa, kernel) != cudaSuccess ||
      fa.ptxVersion < 90 || cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();  // a refusal means "no cluster path", not an error for the next launch to report
    n = 0;
  }
  if (slot != nullptr) slot->store(n + 1, std::memory_order_relaxed);
  return n;
}

template <class T, int D, int WM>
Status launch_cluster_variant(const FwdParams& p, const Plan& plan, const KernelArgs& a, cudaStream_t stream) {
  FUSEDATTN_RETURN_IF_ERROR((prepare_cluster_kernel<T, D, WM>()));
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(p.prob.h_kv * plan.chunks),
                  static_cast<unsigned>(p.prob.b));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(grid, Tile<D, WM>::kSmemBytes, stream, &attr);
  // A refused launch sets the last error, which check_launch reports and clears.
  cudaLaunchKernelEx(&cfg, decode_cluster_kernel<T, D, WM>, p, a);
  return simt::check_launch("decode cluster kernel");
}

template <class T, int D>
int max_active_clusters(const Plan& plan) {
  switch (plan.wm) {
    case 1: return cluster_fit<T, D, 1>(plan.splits);
    case 2: return cluster_fit<T, D, 2>(plan.splits);
    default: return cluster_fit<T, D, 4>(plan.splits);
  }
}

template <class T, int D>
Status launch_decode(const FwdParams& p, const Plan& plan, const KernelArgs& a, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (plan.cluster) {
    switch (plan.wm) {
      case 1: return launch_cluster_variant<T, D, 1>(p, plan, a, st);
      case 2: return launch_cluster_variant<T, D, 2>(p, plan, a, st);
      default: return launch_cluster_variant<T, D, 4>(p, plan, a, st);
    }
  }
  switch (plan.wm) {
    case 1: return launch_variant<T, D, 1>(p, plan, a, st);
    case 2: return launch_variant<T, D, 2>(p, plan, a, st);
    default: return launch_variant<T, D, 4>(p, plan, a, st);
  }
}

}  // namespace decode
}  // namespace fusedattn
