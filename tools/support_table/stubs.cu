// The kernels' launchers, which the planning code links to (its kernel tables hold their addresses)
// but the support table never runs: each one here fails if called. Compiling the kernels themselves
// would take most of an hour; the tables are the real generated ones (hopper/generated/table.cu,
// tc/generated/table.inc), so what is planned is what a full build plans.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "decode/decode.h"
#include "hopper/kernels.h"
#include "simt/simt.h"
#include "stubs.h"

namespace fusedattn {
namespace {
Status not_launched() { return Status::Invalid("support_table: kernels are not launched"); }
}  // namespace

namespace hopper {
template <typename T, int D>
cudaError_t run_fwd_one_tile(const Sm90Args&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int D>
cudaError_t run_fwd_persistent(const Sm90Args&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T>
cudaError_t run_fwd_three_consumer(const Sm90Args&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T>
cudaError_t run_fwd_three_consumer_persistent(const Sm90Args&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_fwd_general(const Sm90Args&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int D>
cudaError_t run_bwd(const Sm90BwdArgs&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int D>
cudaError_t run_bwd_deterministic(const Sm90BwdArgs&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_general(const Sm90BwdArgs&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_general_deterministic(const Sm90BwdArgs&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_fwd_varlen(const Sm90Args&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_varlen(const Sm90BwdArgs&, cudaStream_t) { return cudaErrorNotSupported; }
template <typename T, int DQK, int DV, bool SOFTCAP>
cudaError_t run_bwd_varlen_deterministic(const Sm90BwdArgs&, cudaStream_t) { return cudaErrorNotSupported; }

// The table describes a build with sm_90a code, on a device that loads it.
bool kernels_loadable() { return true; }
}  // namespace hopper
}  // namespace fusedattn

// kKernelRows, with the launchers above.
#include "hopper/generated/table.cu"

namespace fusedattn {
namespace tc {
template <typename Elem, int kD, Variant kV>
Status run_fwd(const KArgs&, cudaStream_t) { return not_launched(); }
template <typename Elem, int kD, Variant kV>
Status run_bwd(const KArgs&, cudaStream_t) { return not_launched(); }

// Every launcher the table names, instantiated through it.
const StubRow kStubRows[] = {
#include "tc/generated/table.inc"
};
}  // namespace tc

namespace simt {
template <class T>
Status launch_fwd(const FwdParams&, const CudaLaunch&) { return not_launched(); }
template <class T>
Status launch_bwd(const BwdParams&, const CudaLaunch&) { return not_launched(); }
template Status launch_fwd<__half>(const FwdParams&, const CudaLaunch&);
template Status launch_fwd<__nv_bfloat16>(const FwdParams&, const CudaLaunch&);
template Status launch_fwd<float>(const FwdParams&, const CudaLaunch&);
template Status launch_fwd<double>(const FwdParams&, const CudaLaunch&);
template Status launch_bwd<__half>(const BwdParams&, const CudaLaunch&);
template Status launch_bwd<__nv_bfloat16>(const BwdParams&, const CudaLaunch&);
template Status launch_bwd<float>(const BwdParams&, const CudaLaunch&);
template Status launch_bwd<double>(const BwdParams&, const CudaLaunch&);
}  // namespace simt

namespace decode {
template <class T, int D>
Status launch_decode(const FwdParams&, const DecodeSchedule&, const KernelArgs&, void*) { return not_launched(); }
template <class T>
Status launch_combine(const FwdParams&, const KernelArgs&, void*) { return not_launched(); }
template <class T>
Status launch_init_outputs(const FwdParams&, void*) { return not_launched(); }
#define FUSEDATTN_STUB_DECODE(T)                                                                       \
  template Status launch_decode<T, 64>(const FwdParams&, const DecodeSchedule&, const KernelArgs&, void*);  \
  template Status launch_decode<T, 128>(const FwdParams&, const DecodeSchedule&, const KernelArgs&, void*); \
  template Status launch_decode<T, 256>(const FwdParams&, const DecodeSchedule&, const KernelArgs&, void*); \
  template Status launch_combine<T>(const FwdParams&, const KernelArgs&, void*);                          \
  template Status launch_init_outputs<T>(const FwdParams&, void*);
FUSEDATTN_STUB_DECODE(__half)
FUSEDATTN_STUB_DECODE(__nv_bfloat16)
#undef FUSEDATTN_STUB_DECODE
}  // namespace decode
}  // namespace fusedattn
