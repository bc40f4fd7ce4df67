"""CUDA-event timing shared by the GPU benchmarks (bench_gpu.py, bench_decode.py)."""

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
