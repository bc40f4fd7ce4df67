// One instantiation of the SIMT forward launcher (bf16): one file per
// dtype and direction so that the heavy kernels compile in parallel.
#include "fwd_kernel.cuh"

namespace fusedattn {
namespace simt {
template Status launch_fwd<__nv_bfloat16>(const FwdParams&, const CudaLaunch&);
}  // namespace simt
}  // namespace fusedattn
