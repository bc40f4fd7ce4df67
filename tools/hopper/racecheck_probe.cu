// Does compute-sanitizer racecheck understand the backward's row-slice ring? The Hopper backward
// streams per-row lse / Dsum slices into shared memory by cp.async.bulk (completing on a "full"
// mbarrier) and its consumer warps read them with ordinary loads, then release the slot on an
// "empty" mbarrier that the producer waits on before the next bulk copy. racecheck reported
// write (bulk copy) / read (ld.shared) hazards there. This probe is that protocol alone, in two
// versions:
//   ordered: the consumer releases a slot after its reads (the backward's order);
//   early:   the consumer releases a slot before reading it (a real race).
// If racecheck flags `ordered` as it flags `early`, it does not model this synchronisation and
// the backward's report is a false positive; if it flags only `early`, the backward needs a look.
//   nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o probe racecheck_probe.cu
//   compute-sanitizer --tool racecheck ./probe ordered   (then: early)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "../../csrc/cuda/hopper/ptx_sm90.cuh"

namespace hp = fusedattn::hopper;

constexpr int kStages = 2, kIters = 8, kRow = 128;  // floats per slice (512 bytes)

template <bool EARLY_RELEASE>
__global__ void __launch_bounds__(96, 1) probe_kernel(const float* src, float* out) {
  __shared__ __align__(128) float rows[kStages][kRow];
  __shared__ __align__(8) uint64_t bars[2 * kStages];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t bar0 = hp::smem_u32(bars);
  auto full = [&](int s) { return bar0 + 8u * s; };
  auto empty = [&](int s) { return bar0 + 8u * (kStages + s); };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      hp::mbar_init(full(s), 1);
      hp::mbar_init(empty(s), 2);  // the two consumer warps
    }
    hp::mbar_fence_init();
  }
  __syncthreads();
  if (warp == 0) {
    if (lane == 0) {
      for (int it = 0; it < kIters; ++it) {
        const int s = it % kStages;
        hp::mbar_wait<true>(empty(s), ((it / kStages) & 1u) ^ 1u);
        hp::mbar_arrive_expect_tx(full(s), kRow * 4);
        hp::bulk_g2s(hp::smem_u32(rows[s]), src + it * kRow, kRow * 4, full(s));
      }
    }
    return;
  }
  float acc = 0.f;
  for (int it = 0; it < kIters; ++it) {
    const int s = it % kStages;
    hp::mbar_wait<true>(full(s), (it / kStages) & 1u);
    if (EARLY_RELEASE) {
      __syncwarp();
      if (lane == 0) hp::mbar_arrive(empty(s));
    }
    for (int j = lane; j < kRow; j += 32) acc += rows[s][j];
    if (!EARLY_RELEASE) {
      __syncwarp();
      if (lane == 0) hp::mbar_arrive(empty(s));
    }
  }
  out[(warp - 1) * 32 + lane] = acc;
}

int main(int argc, char** argv) {
  const bool early = argc > 1 && std::strcmp(argv[1], "early") == 0;
  float *src, *out;
  cudaMalloc(&src, kIters * kRow * sizeof(float));
  cudaMalloc(&out, 64 * sizeof(float));
  float h[kIters * kRow];
  for (int i = 0; i < kIters * kRow; ++i) h[i] = static_cast<float>(i % 7);
  cudaMemcpy(src, h, sizeof(h), cudaMemcpyHostToDevice);
  if (early)
    probe_kernel<true><<<1, 96>>>(src, out);
  else
    probe_kernel<false><<<1, 96>>>(src, out);
  const cudaError_t e = cudaDeviceSynchronize();
  float o[64];
  cudaMemcpy(o, out, sizeof(o), cudaMemcpyDeviceToHost);
  double want = 0, got = 0;
  for (int i = 0; i < kIters * kRow; ++i) want += h[i];
  for (int i = 0; i < 64; ++i) got += o[i];
  std::printf("probe %s: %s, sum %.0f (want %.0f)\n", early ? "early" : "ordered", cudaGetErrorString(e), got,
              2 * want);
  return e == cudaSuccess ? 0 : 1;
}
