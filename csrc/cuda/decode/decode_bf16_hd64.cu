// One instantiation of the decode kernels (bf16, head-dim bucket 64, every
// row-warp variant): one file per dtype and bucket so that they compile in
// parallel.
#include "decode_kernel.cuh"

namespace fusedattn {
namespace decode {
template Status launch_decode<__nv_bfloat16, 64>(const FwdParams&, const DecodeSchedule&, const KernelArgs&, void*);
}  // namespace decode
}  // namespace fusedattn
