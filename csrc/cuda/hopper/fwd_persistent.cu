// Host entry of the persistent forward (fwd_sm90_v3.cuh) and its instantiations; see kernels.h.
#include "fwd_sm90_v3.cuh"
#include "kernels.h"
#include "tuning.h"

namespace fusedattn {
namespace hopper {

template <typename T, int D>
cudaError_t run_fwd_persistent(const Sm90Args& a, int num_sms, cudaStream_t stream) {
  using C = FwdV3Default<D>;
  using Cfg = FwdV3Cfg<D, C::BN, C::STAGES, C::PP>;
  FwdLaunch L;
  cudaError_t e;
  // Causal calls take the schedule tuning.h picks for their tile grid; non-causal ones have one.
  V3Schedule sched = V3Schedule::kSnake;
  if (a.causal) {
    V3Grid gr;
    gr.n_m = (a.out.s_q + Cfg::BM - 1) / Cfg::BM;
    gr.n_hb = int64_t{a.out.h} * a.out.b;
    gr.s_kv = a.out.s_kv;
    gr.g = num_sms;
    gr.bm = Cfg::BM;
    gr.bn = C::BN;
    sched = choose_v3_schedule(gr);
  }
  if (sched == V3Schedule::kSnakeHeadMajor) {
    e = fwd_sm90_v3_prepare_cfg<T, D, C::BN, C::STAGES, C::PP, kV3SnakeHeadMajor, C::PP_CAUSAL>(&L, a, num_sms);
  } else {
    e = fwd_sm90_v3_prepare_cfg<T, D, C::BN, C::STAGES, C::PP, kV3Snake, C::PP_CAUSAL>(&L, a, num_sms);
  }
  if (e != cudaSuccess) return e;
  return fwd_sm90_launch(L, stream);
}

template cudaError_t run_fwd_persistent<__half, 64>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__half, 128>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__half, 256>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 64>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 128>(const Sm90Args&, int, cudaStream_t);
template cudaError_t run_fwd_persistent<__nv_bfloat16, 256>(const Sm90Args&, int, cudaStream_t);

}  // namespace hopper
}  // namespace fusedattn
