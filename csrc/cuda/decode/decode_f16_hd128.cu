// One instantiation of the decode kernels (f16, head-dim bucket 128, every
// row-warp variant): one file per dtype and bucket so that they compile in
// parallel.
#include "decode_kernel.cuh"

namespace fusedattn {
namespace decode {
template Status launch_decode<__half, 128>(const FwdParams&, const DecodeSchedule&, const KernelArgs&, void*);
}  // namespace decode
}  // namespace fusedattn
