// One instantiation of the SIMT forward launcher (f64): one file per
// dtype and direction so that the heavy kernels compile in parallel.
#include "fwd_kernel.cuh"

namespace fusedattn {
namespace simt {
template Status launch_fwd<double>(const FwdParams&, const CudaLaunch&);
}  // namespace simt
}  // namespace fusedattn
