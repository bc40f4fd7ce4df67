// Host launchers of the two main kernels for one (dtype, head-dim bucket,
// variant: kargs.h's Variant). Each generated instantiation file
// (generated/*.cu) compiles one of these, so the heavy kernels build in
// parallel; dispatch.cu reaches them through the generated table.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "common/host.h"
#include "fusedattn/types.h"
#include "kargs.h"
#include "tile_size.h"

namespace fusedattn {
namespace tc {

using KernelFn = Status (*)(const KArgs&, cudaStream_t);

inline Status launch_status(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok();
  return Status::Unsupported(std::string("fusedattn tensor-core ") + what + " launch failed: " + cudaGetErrorString(e));
}

template <typename Elem, int kD, Variant kV>
Status run_fwd(const KArgs& a, cudaStream_t stream);

template <typename Elem, int kD, Variant kV>
Status run_bwd(const KArgs& a, cudaStream_t stream);

}  // namespace tc
}  // namespace fusedattn

#if defined(__CUDACC__) && defined(FUSEDATTN_TC_DEFINE_LAUNCHERS)
#include "bwd_kernel.h"
#include "fwd_kernel.h"

namespace fusedattn {
namespace tc {

template <typename Elem, int kD, Variant kV>
Status run_fwd(const KArgs& a, cudaStream_t stream) {
  using T = FwdTileOf<kD, kV>;
  constexpr int kSmem = (T::kBlockM + 2 * T::kBlockN) * kD * 2;
  auto kernel = fwd_kernel<Elem, kD, T::kBlockM, T::kBlockN, T::kNWarps, T::kMinBlocks, kV>;
  static std::atomic<uint64_t> smem_ready{0};
  FUSEDATTN_RETURN_IF_ERROR(gpu::prepare_smem(kernel, kSmem, "tensor-core forward", &smem_ready));
  const dim3 grid((a.s_q + T::kBlockM - 1) / T::kBlockM, a.h_q, a.b);
  if (gpu::empty_grid(grid)) return Status::Ok();
  kernel<<<grid, T::kNWarps * 32, kSmem, stream>>>(a);
  return launch_status("forward");
}

template <typename Elem, int kD, Variant kV>
Status run_bwd(const KArgs& a, cudaStream_t stream) {
  using T = BwdTileOf<kD, kV>;
  constexpr int kSmem = BwdSmem<kD, T::kBlockM, T::kBlockN>::kBytes;
  auto kernel =
      bwd_kernel<Elem, kD, T::kBlockM, T::kBlockN, T::kNWarps, T::kSdpWN, T::kDkvWN, T::kDqWM, kV>;
  static std::atomic<uint64_t> smem_ready{0};
  FUSEDATTN_RETURN_IF_ERROR(gpu::prepare_smem(kernel, kSmem, "tensor-core backward", &smem_ready));
  const dim3 grid((a.s_kv + T::kBlockN - 1) / T::kBlockN, a.h_kv, a.b);
  if (gpu::empty_grid(grid)) return Status::Ok();  // no sequence or no key: dq stays zero, thd gaps get zeros
  kernel<<<grid, T::kNWarps * 32, kSmem, stream>>>(a);
  return launch_status("backward");
}

}  // namespace tc
}  // namespace fusedattn
#endif
