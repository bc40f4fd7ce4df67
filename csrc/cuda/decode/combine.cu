// Instantiations of the decode engine's small kernels (combine, output
// initialisation) for float16 and bfloat16.
#include "combine.cuh"

namespace fusedattn {
namespace decode {
template Status launch_combine<__half>(const FwdParams&, const KernelArgs&, void*);
template Status launch_combine<__nv_bfloat16>(const FwdParams&, const KernelArgs&, void*);
template Status launch_init_outputs<__half>(const FwdParams&, void*);
template Status launch_init_outputs<__nv_bfloat16>(const FwdParams&, void*);
}  // namespace decode
}  // namespace fusedattn
