// Micro-benchmark of the CPU engine (not a ctest test): forward and backward
// milliseconds per call on a std::thread executor.
//   bench_cpu_attn [threads] [b h s d] [fp32|bf16|fp16] [causal 0|1] [bwd 0|1] [dropout p]
#include <cstdlib>
#include <ctime>

#include "attn_test_util.h"

using namespace fa_test;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  Config cfg;
  cfg.b = argc > 2 ? std::atoi(argv[2]) : 1;
  cfg.hq = cfg.hkv = argc > 3 ? std::atoi(argv[3]) : 8;
  cfg.sq = cfg.skv = argc > 4 ? std::atoi(argv[4]) : 2048;
  cfg.dqk = cfg.dv = argc > 5 ? std::atoi(argv[5]) : 64;
  const std::string dt = argc > 6 ? argv[6] : "fp32";
  cfg.dt = dt == "bf16" ? DType::kBFloat16 : dt == "fp16" ? DType::kFloat16 : DType::kFloat32;
  if (argc > 7 && std::atoi(argv[7])) cfg.wr = 0;
  const bool bwd = argc > 8 && std::atoi(argv[8]);
  if (argc > 9) cfg.p_drop = static_cast<float>(std::atof(argv[9]));
  cfg.scale = 1.0 / std::sqrt(static_cast<double>(cfg.dqk));
  cfg.max_logit = false;
  Case c = build_case(cfg);
  ThreadExecutor exec(threads);
  FwdParams p = fwd_params(c);
  BwdParams bp = bwd_params(c, false);
  // Best wall time of 5 runs; also the process CPU time of that run (on a
  // shared machine CPU time / threads is the better estimate of free-machine wall time).
  double cpu_ms = 0;
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  };
  auto time_it = [&](auto&& fn) {
    fn();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const double c0 = cpu_now();
      auto t0 = std::chrono::steady_clock::now();
      fn();
      const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (wall < best) {
        best = wall;
        cpu_ms = cpu_now() - c0;
      }
    }
    return best;
  };
  const double fwd_ms = time_it([&] { run_fwd_cpu(p, exec); });
  const double flops = 4.0 * cfg.b * cfg.hq * cfg.sq * cfg.skv * cfg.dqk * (cfg.wr == 0 ? 0.5 : 1.0);
  std::printf("fwd b=%lld h=%lld s=%lld d=%lld %s causal=%d threads=%d: %.2f ms (%.1f GFLOP/s), cpu %.2f ms\n",
              (long long)cfg.b, (long long)cfg.hq, (long long)cfg.sq, (long long)cfg.dqk, dt.c_str(), cfg.wr == 0,
              threads, fwd_ms, flops / fwd_ms * 1e-6, cpu_ms);
  if (bwd) {
    const double bwd_ms = time_it([&] { run_bwd_cpu(bp, exec); });
    std::printf("bwd: %.2f ms (%.1f GFLOP/s at 2.5x fwd flops), cpu %.2f ms\n", bwd_ms, 2.5 * flops / bwd_ms * 1e-6,
                cpu_ms);
  }
  return 0;
}
