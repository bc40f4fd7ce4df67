"""CUDA timing shared by the GPU benchmarks (bench_gpu.py, bench_decode.py, bench_zoo.py)."""

from __future__ import annotations

import statistics

import torch


def median_event_ms(body, reps):
    """Median over `reps` runs of the milliseconds CUDA events measure around body()."""
    ts = []
    for _ in range(reps):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        body()
        e.record()
        e.synchronize()
        ts.append(a.elapsed_time(e))
    return statistics.median(ts)


def cuda_kernel_times(body, n):
    """{kernel name: [microseconds of each launch]} of the CUDA kernels n runs of body() launch
    (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            body()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(e.name, []).append(e.device_time)
    return times
