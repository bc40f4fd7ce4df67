// One instantiation of the SIMT backward launcher (bf16): one file per
// dtype and direction so that the heavy kernels compile in parallel.
#include "bwd_kernel.cuh"

namespace fusedattn {
namespace simt {
template Status launch_bwd<__nv_bfloat16>(const BwdParams&, const CudaLaunch&);
}  // namespace simt
}  // namespace fusedattn
