"""GPU benchmark: fusedattn vs torch SDPA's FLASH_ATTENTION (FlashAttention-2) and CUDNN_ATTENTION.

The grid of the CUDA engine issue: bf16, b*s = 16k tokens, h*d = 2048, d in {64, 128, 256},
s in {512 .. 16k}, causal and not, forward and forward+backward, all in one run on the same
inputs. TFLOP/s as FlashAttention counts them: forward 4*b*h*s*s*d, halved when causal;
forward+backward 3.5x forward. Times are medians of triton.testing.do_bench (CUDA events).

    python bench/bench_gpu.py [--quick] [--dims 128] [--s 2048,8192] [--timing loop] [--inputs uniform]
                              [--out bench/RESULTS.md]

--deterministic times fusedattn's forward+backward alone under
torch.use_deterministic_algorithms(True) next to its default backward, at d = 64 and 128
(the head dims of the Hopper deterministic backward); run it again with
FUSEDATTN_HOPPER_BWD=0 for the sm80-class deterministic backward (the header records it).

--rounds N times every implementation N times per point, in turn (fusedattn, FA2, cuDNN, then
again), and reports each one's median over the rounds: a slow drift of the GPU's clocks (it runs at
its power limit) then weighs on all three alike instead of on whichever was timed during it.

--profile prints, per point, each CUDA kernel of a fusedattn and a cuDNN call (forward, and
forward+backward) with its mean duration (torch.profiler, L2 flushed between calls), to show where
the time of a call goes (the backward's preprocess and dQ conversion beside its main kernel).

--clocks samples the SM clock and the board power with nvidia-smi every 20 ms while the grid runs and
prints, per point and implementation, the mean clock and power during its timed calls: the GPU runs
at its power limit, so two kernels of equal work can run at different clocks.

--precede idle | own | gemm | none says what runs before every timed measurement, for --precede-s
seconds (default 0.4): the GPU idle (default), the implementation's own calls back to back, bf16
8192^3 matmuls back to back (a load at the power limit), or nothing. The board runs at its power
limit and a measurement of about 50 ms is shorter than the power controller's reaction, so without a
common predecessor each implementation starts from the clocks the one before left: in the fixed
order fusedattn follows cuDNN's forward+backward at the limit and cuDNN follows FA2's, which draws
less and leaves higher clocks (up to ~10% on a ratio; docs/perf-notes.md, Method). `idle` times
every kernel from the same state, at the same clocks; `own` times each at the clocks its own power
draw settles at, as in a long training run. --sustain S is --precede own --precede-s S.

--energy SECONDS measures, instead of the grid, each implementation's energy per call: after
SECONDS of back-to-back calls (to reach the power limit), NVML's board energy counter is read around
another SECONDS of them; per point and implementation the table gives the calls' sustained TFLOP/s,
the mean board power, joules per call and picojoules per FLOP. At the power limit a kernel's speed
follows its energy per FLOP, so this says which of two kernels a long run favours, and a variant's
table says what one change costs in energy.

--order rotate starts round r with the (r mod 3)-th implementation (fusedattn, FA2, cuDNN, ...); the
default, fixed, times them in the same order every round. A rotation keeps each implementation's
predecessor within a round (fusedattn still follows cuDNN, cuDNN still follows FA2), so it does not
remove the predecessor's effect on the clocks; --precede does.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import math
import os
import statistics
import subprocess
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from fusedattn._ops import FwdArgs, attention
from bench_timing import cuda_kernel_times, median_event_ms


def tflops(ms, flops):
    return flops / ms / 1e9 if ms == ms else float("nan")


TIMING = "do_bench"  # --timing: how time_ms measures (main sets it)


def time_loop_ms(fn, warmup=5, reps=20):
    """Median of CUDA-event-timed calls issued back to back, no L2 flush between them: the Hopper
    harnesses' method, to tell the method's share in a harness / operator difference."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return median_event_ms(fn, reps)


def time_ms(fn):
    try:
        if TIMING == "loop":
            return time_loop_ms(fn)
        return do_bench(fn, warmup=10, rep=40, return_mode="median")
    except RuntimeError:  # a peer backend that refuses the shape
        return float("nan")


INPUTS = "randn"  # --inputs (main sets it)


def grid_inputs(d, s, causal, dtype):
    """A grid point's q, k, v (requiring grad), dout [b, s, h, d] and fusedattn's FwdArgs. --inputs uniform:
    q, k uniform in [-2, 2), v, dout in [-1, 1), as the Hopper harnesses draw them."""
    b, h = 16384 // s, 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(0)

    def draw(half_width):
        if INPUTS == "uniform":
            u = torch.rand(b, s, h, d, device="cuda", dtype=torch.float32, generator=gen)
            return ((2 * u - 1) * half_width).to(dtype)
        return torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=gen)

    q, k, v, dout = draw(2.0), draw(2.0), draw(1.0), draw(1.0)
    for t in (q, k, v):
        t.requires_grad_()
    return q, k, v, dout, FwdArgs(scale=1 / math.sqrt(d), mask_type="causal" if causal else "no_mask")


def write_table(title, caption, lines, out_path):
    """Prints the markdown table (title with date, GPU, torch and the FUSEDATTN_ switches) and
    appends it to out_path when given."""
    switches = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("FUSEDATTN_"))
    # The peer's library version and which physical GPU ran the table: the cuDNN figures moved 8-12%
    # between machines with the same torch, and these tell a changed library or machine apart from
    # noise.
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))[:13]
    head = (f"## {title}, {datetime.date.today()}, {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
            f"cuDNN {torch.backends.cudnn.version()}{', GPU ' + uuid if uuid else ''}"
            f"{', ' + switches if switches else ''}\n\n{caption}\n\n")
    table = head + "\n".join(lines) + "\n"
    print("\n" + table)
    if out_path:
        with open(out_path, "a") as f:
            f.write("\n" + table)


def point_impls(d, s, causal, dtype=torch.bfloat16):
    """A grid point's implementations: name -> (forward callable, forward+backward callable), all on
    the same q, k, v, dout (the peers see them as [b, h, s, d] views of the same memory)."""
    q, k, v, dout, args = grid_inputs(d, s, causal, dtype)
    qt, kt, vt, dt = (t.transpose(1, 2) for t in (q, k, v, dout))

    def ours():
        return attention(q, k, v, args)[0]

    def peer(backend):
        def f():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return f

    def fwd_only(fn):
        def f():
            with torch.no_grad():
                return fn()
        return f

    def fwd_bwd(fn, g):
        def f():
            torch.autograd.grad(fn(), (q, k, v), g)
        return f

    impls = {"fusedattn": (ours, dout), "fa2": (peer(SDPBackend.FLASH_ATTENTION), dt),
             "cudnn": (peer(SDPBackend.CUDNN_ATTENTION), dt)}
    return {name: (fwd_only(fn), fwd_bwd(fn, g)) for name, (fn, g) in impls.items()}


ROUNDS = 1  # --rounds (main sets it)


# nvidia-smi's clock event (throttle) reason bits, by the names the clock table prints.
CLOCK_REASONS = ((0x4, "sw-power-cap"), (0x8, "hw-slowdown"), (0x20, "sw-thermal"), (0x40, "hw-thermal"),
                 (0x80, "hw-power-brake"), (0x10, "sync-boost"))


def smi_field(*names):
    """The first of these nvidia-smi query fields that the driver reports (drivers renamed
    clocks_throttle_reasons to clocks_event_reasons), or None."""
    for name in names:
        probe = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={name}", "--format=csv,noheader"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and "not supported" not in probe.stdout.lower():
            return name
    return None


class ClockSampler:
    """nvidia-smi in the background, one sample every 20 ms (--clocks): host time, SM MHz, W, and where
    the driver reports them the GPU temperature and the active clock event reasons (a bit mask)."""

    def __init__(self):
        self.samples = []
        self.extra = [f for f in (smi_field("temperature.gpu"),
                                  smi_field("clocks_event_reasons.active", "clocks_throttle_reasons.active")) if f]
        self.has_temp = bool(self.extra) and self.extra[0] == "temperature.gpu"
        self.has_reasons = bool(self.extra) and self.extra[-1] != "temperature.gpu"
        self.proc = subprocess.Popen(
            ["nvidia-smi", "-i", "0", "--query-gpu=" + ",".join(["timestamp", "clocks.sm", "power.draw"] + self.extra),
             "--format=csv,noheader,nounits", "-lms", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            parts = [x.strip() for x in line.split(",")]
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                temp = float(parts[3]) if self.has_temp else float("nan")
                reasons = int(parts[-1], 16) if self.has_reasons else 0
                self.samples.append((t, float(parts[1]), float(parts[2]), temp, reasons))
            except (ValueError, IndexError):  # a header or a field the driver does not report
                continue

    def window(self, t0, t1):
        """Over the samples taken in [t0, t1] (host time): mean SM clock, power and temperature (NaN when
        there are none), and the clock event reasons active in at least a tenth of them."""
        inside = [x for x in list(self.samples) if t0 <= x[0] <= t1]
        if not inside:
            return float("nan"), float("nan"), float("nan"), ""
        reasons = [name for bit, name in CLOCK_REASONS
                   if sum(1 for x in inside if x[4] & bit) * 10 >= len(inside)]
        return (statistics.mean(x[1] for x in inside), statistics.mean(x[2] for x in inside),
                statistics.mean(x[3] for x in inside), "+".join(reasons))

    def stop(self):
        self.proc.terminate()


def clock_cell(sample):
    """One measurement's clock-table entry: '1845 MHz 690 W 61 C sw-power-cap'."""
    mhz, watts, temp, reasons = sample
    cell = f"{mhz:.0f} MHz {watts:.0f} W"
    if not math.isnan(temp):
        cell += f" {temp:.0f} C"
    return cell + (f" {reasons}" if reasons else "")


SAMPLER = None  # --clocks (main sets it)
PRECEDE_S = 0.0  # --precede-s (main sets it)
PRECEDE = "idle"  # --precede (main sets it)
CAUSAL = (False, True)  # --causal (main sets it)
ROTATE = False  # --order rotate (main sets it)


def sustain(fn, seconds):
    """Calls fn back to back for `seconds` seconds (at most 32 calls queued ahead of the GPU); returns
    the number of calls and the seconds they took."""
    t0, calls = time.perf_counter(), 0
    end = t0 + seconds
    while time.perf_counter() < end:
        for _ in range(32):
            fn()
        calls += 32
        torch.cuda.synchronize()
    return calls, time.perf_counter() - t0


_GEMM = []  # --precede gemm's operands, made on first use


def precede(fn):
    """What runs for PRECEDE_S seconds before a timed measurement (--precede): fn itself, the GPU idle, a
    bf16 matmul load that holds the board at its power limit whatever was timed before, or nothing."""
    if PRECEDE == "none" or PRECEDE_S <= 0:
        return
    if PRECEDE == "own":
        sustain(fn, PRECEDE_S)
    elif PRECEDE == "idle":
        torch.cuda.synchronize()
        time.sleep(PRECEDE_S)
    else:
        if not _GEMM:
            gen = torch.Generator(device="cuda").manual_seed(1)
            _GEMM.extend(torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
                         for _ in range(2))
        a, b = _GEMM
        sustain(lambda: torch.mm(a, b), PRECEDE_S)


class NvmlEnergy:
    """NVML's total board energy counter (millijoules since the driver loaded) of GPU 0, through
    ctypes, so that no Python package is needed."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise RuntimeError(f"--energy needs NVML (libnvidia-ml.so.1): {e}") from e
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("--energy: nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0), ctypes.byref(self.handle)) != 0:
            raise RuntimeError("--energy: no NVML handle for GPU 0")
        self.millijoules()  # fails here, not mid-table, on a GPU without the counter

    def millijoules(self):
        e = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(e))
        if rc != 0:
            raise RuntimeError(f"--energy: nvmlDeviceGetTotalEnergyConsumption returned {rc}")
        return e.value


def fwd_flops(d, s, causal):
    """A grid point's forward FLOPs by FlashAttention's count (b*s = 16k tokens, h*d = 2048): 4 b h s^2 d,
    halved when causal; forward+backward counts 3.5x this."""
    b, h = 16384 // s, 2048 // d
    return 4 * b * h * s * s * d / (2 if causal else 1)


def energy_point(d, s, causal, meter, seconds):
    """Per implementation and mode (fwd, fb): calls, sustained TFLOP/s, mean W, J per call, pJ per FLOP
    over `seconds` of back-to-back calls, after as long a warm-up of the same calls."""
    flops = fwd_flops(d, s, causal)
    rows = []
    for name, (fwd, fb) in point_impls(d, s, causal).items():
        for mode, fn, work in (("fwd", fwd, flops), ("fb", fb, 3.5 * flops)):
            sustain(fn, seconds)
            e0, t0 = meter.millijoules(), time.time()
            calls, dt = sustain(fn, seconds)
            joules = (meter.millijoules() - e0) / 1000.0
            # With --clocks, the SM clock the power limit left this implementation while metered.
            clock = clock_cell(SAMPLER.window(t0, time.time())) if SAMPLER is not None else ""
            rows.append((name, mode, calls, calls * work / dt / 1e12, joules / dt, joules / calls,
                         joules / calls / work * 1e12, clock))
    return rows


def run_point(d, s, causal, dtype=torch.bfloat16):
    impls = point_impls(d, s, causal, dtype)
    flops = fwd_flops(d, s, causal)
    times = {}
    clocks = {}
    for r in range(ROUNDS):
        order = list(impls.items())
        if ROTATE:
            k = r % len(order)
            order = order[k:] + order[:k]
        for name, (fwd, fb) in order:
            for mode, fn in (("fwd", fwd), ("fb", fb)):
                precede(fn)
                t0 = time.time()
                times.setdefault(name + "_" + mode, []).append(time_ms(fn))
                if SAMPLER is not None:
                    clocks.setdefault(name + "_" + mode, []).append(SAMPLER.window(t0, time.time()))
    row = {key: tflops(statistics.median(ts), (3.5 if key.endswith("_fb") else 1) * flops)
           for key, ts in times.items()}
    # --clocks: the clock table's lines for this point, one per measurement.
    row["clock_lines"] = [f"| {d} | {s} | {'yes' if causal else 'no'} | {key} | "
                          + " / ".join(clock_cell(c) for c in cw) + " |" for key, cw in clocks.items()]
    # The spread of the ratio to cuDNN over the rounds (each round times the two back to back), to
    # tell a ratio from the drift of the GPU's clocks between rounds.
    for mode in ("fwd", "fb"):
        ratios = [c / f for f, c in zip(times["fusedattn_" + mode], times["cudnn_" + mode])]
        row["cudnn_range_" + mode] = (min(ratios), max(ratios))
    return row


def ratio_cell(r, mode):
    """fusedattn / cuDNN, with the per-round range when there are several rounds."""
    cell = f"{r['fusedattn_' + mode] / r['cudnn_' + mode]:.2f}"
    lo, hi = r["cudnn_range_" + mode]
    return cell + (f" ({lo:.2f}-{hi:.2f})" if ROUNDS > 1 else "")


def profile_point(d, s, causal, calls=20):
    """Each CUDA kernel of fusedattn's and cuDNN's forward and forward+backward at one grid point, with
    its mean duration per call (torch.profiler; a 256 MB write between calls evicts L2, as do_bench's
    flush does)."""
    impls = point_impls(d, s, causal)
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.int8)

    flush_names = set(cuda_kernel_times(lambda: flush.add_(1), 2))
    print(f"## profile d={d} s={s} causal={'yes' if causal else 'no'}")
    for name in ("fusedattn", "cudnn"):
        for mode, fn in zip(("fwd", "f+b"), impls[name]):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()

            def body(fn=fn):
                flush.add_(1)
                fn()

            total = {n: ts for n, ts in cuda_kernel_times(body, calls).items() if n not in flush_names}
            per_call = {n: sum(ts) / calls for n, ts in total.items()}
            kern_us = sum(per_call.values())
            wall_us = 1e3 * time_ms(fn)
            # Host time to enqueue one call (GPU otherwise idle, so nothing queued ahead blocks it):
            # near the wall time would mean the call waits for the GPU somewhere.
            host = []
            for _ in range(10):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                host.append(1e6 * (time.perf_counter() - t0))
            torch.cuda.synchronize()
            print(f"  {name} {mode}: {kern_us:.1f} us of kernels per call, {wall_us:.1f} us per call "
                  f"({TIMING}; {wall_us - kern_us:.1f} us not in kernels), host enqueue {statistics.median(host):.1f} us")
            for n, us in sorted(per_call.items(), key=lambda kv: -kv[1]):
                print(f"    {us:9.1f} us x {len(total[n]) / calls:.0f}/call  {n[:100]}")


def run_det_point(d, s, causal, dtype=torch.bfloat16):
    """fusedattn forward+backward TFLOP/s: (deterministic, default)."""
    q, k, v, dout, args = grid_inputs(d, s, causal, dtype)

    def fb():
        torch.autograd.grad(attention(q, k, v, args)[0], (q, k, v), dout)

    flops = 3.5 * fwd_flops(d, s, causal)
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        det = tflops(time_ms(fb), flops)
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    return det, tflops(time_ms(fb), flops)


def main_deterministic(out_path):
    lines = ["| d | s | causal | f+b deterministic | f+b default | deterministic / default |",
             "|---|---|---|---|---|---|"]
    for d in (64, 128):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in CAUSAL:
                det, dflt = run_det_point(d, s, causal)
                lines.append(f"| {d} | {s} | {'yes' if causal else 'no'} | {det:.0f} | {dflt:.0f} | {det / dflt:.2f} |")
                print(lines[-1], flush=True)
    write_table("Deterministic backward",
                "fusedattn forward+backward TFLOP/s under torch.use_deterministic_algorithms(True) and without, "
                "same inputs and process; bf16, b*s = 16384 tokens, h*d = 2048, medians of triton do_bench.",
                lines, out_path)


def main_energy(ds, ss, seconds, out_path):
    meter = NvmlEnergy()
    lines = ["| d | s | causal | implementation | mode | calls | TFLOP/s | W | J per call | pJ per FLOP "
             "| pJ per FLOP vs cuDNN | clock |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in ds:
        for s in ss:
            for causal in CAUSAL:
                rows = energy_point(d, s, causal, meter, seconds)
                per_flop = {(name, mode): pj for name, mode, *_, pj, _clock in rows}
                for name, mode, calls, tf, watts, jpc, pj, clock in rows:
                    lines.append(f"| {d} | {s} | {'yes' if causal else 'no'} | {name} | {mode} | {calls} | {tf:.0f} | "
                                 f"{watts:.0f} | {jpc:.4f} | {pj:.3f} | {pj / per_flop[('cudnn', mode)]:.3f} | {clock} |")
                    print(lines[-1], flush=True)
    write_table("Energy per call",
                f"bf16, b*s = 16384 tokens, h*d = 2048; per implementation and mode, {seconds:g} s of back-to-back "
                f"calls after {seconds:g} s of them; NVML board energy; TFLOP/s by FlashAttention's count (fwd+bwd "
                "3.5x fwd); the last column below 1 means fewer joules per FLOP than cuDNN.",
                lines, out_path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="d=128 only")
    ap.add_argument("--dims", help="comma-separated head dims (default 64,128,256)")
    ap.add_argument("--out", help="append the table to this markdown file")
    ap.add_argument("--timing", choices=("do_bench", "loop"), default="do_bench",
                    help="do_bench (default: triton's, L2 flushed before each call) or loop (events around calls "
                         "issued back to back, no flush: the Hopper harnesses' method)")
    ap.add_argument("--s", help="comma-separated sequence lengths (default 512..16384)")
    ap.add_argument("--inputs", choices=("randn", "uniform"), default="randn",
                    help="randn (default) or uniform (the Hopper harnesses' inputs)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the three implementations this many times in turn per point; medians over rounds")
    ap.add_argument("--profile", action="store_true",
                    help="each kernel of a fusedattn and a cuDNN call with its duration instead of the grid")
    ap.add_argument("--clocks", action="store_true",
                    help="also report the mean SM clock and board power during each timed measurement")
    ap.add_argument("--precede", choices=("idle", "own", "gemm", "none"), default="idle",
                    help="before each measurement, for --precede-s seconds: the GPU idle (default), the "
                         "implementation's own calls, bf16 matmuls at the power limit, or nothing")
    ap.add_argument("--precede-s", type=float, default=0.4, help="seconds of --precede (default 0.4)")
    ap.add_argument("--sustain", type=float, default=None, metavar="SECONDS",
                    help="the same as --precede own --precede-s SECONDS")
    ap.add_argument("--causal", choices=("both", "no", "yes"), default="both",
                    help="which of the non-causal and causal points to run")
    ap.add_argument("--order", choices=("fixed", "rotate"), default="fixed",
                    help="fixed (default): the implementations in the same order every round; rotate: round r "
                         "starts with the (r mod 3)-th")
    ap.add_argument("--energy", type=float, default=0.0, metavar="SECONDS",
                    help="energy per call (NVML) over this many seconds of back-to-back calls instead of the grid")
    ap.add_argument("--deterministic", action="store_true",
                    help="fusedattn forward+backward deterministic vs default (d = 64, 128) instead of the grid")
    opts = ap.parse_args()
    global TIMING, INPUTS, ROUNDS, SAMPLER, PRECEDE_S, ROTATE, PRECEDE, CAUSAL
    TIMING, INPUTS, ROUNDS = opts.timing, opts.inputs, max(1, opts.rounds)
    PRECEDE, PRECEDE_S = ("own", opts.sustain) if opts.sustain is not None else (opts.precede, opts.precede_s)
    PRECEDE_S = max(0.0, PRECEDE_S)
    CAUSAL = {"both": (False, True), "no": (False,), "yes": (True,)}[opts.causal]
    ROTATE = opts.order == "rotate"
    if opts.clocks:
        SAMPLER = ClockSampler()
    if opts.deterministic:
        main_deterministic(opts.out)
        return
    ds = (128,) if opts.quick else (64, 128, 256)
    if opts.dims:
        ds = tuple(int(x) for x in opts.dims.split(","))

    def lengths(default):
        return tuple(int(x) for x in opts.s.split(",")) if opts.s else default

    if opts.energy > 0:
        main_energy(ds, lengths((2048, 8192)), opts.energy, opts.out)
        return
    if opts.profile:
        for d in ds:
            for s in lengths((2048, 8192)):
                for causal in CAUSAL:
                    profile_point(d, s, causal)
        return
    lines = ["| d | s | causal | fwd fusedattn | fwd FA2 | fwd cuDNN | fwd vs FA2 | fwd vs cuDNN "
             "| f+b fusedattn | f+b FA2 | f+b cuDNN | f+b vs FA2 | f+b vs cuDNN |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    clock_lines = []
    for d in ds:
        for s in lengths((512, 1024, 2048, 4096, 8192, 16384)):
            for causal in CAUSAL:
                r = run_point(d, s, causal)
                lines.append(
                    f"| {d} | {s} | {'yes' if causal else 'no'} | {r['fusedattn_fwd']:.0f} | {r['fa2_fwd']:.0f} | "
                    f"{r['cudnn_fwd']:.0f} | {r['fusedattn_fwd'] / r['fa2_fwd']:.2f} | "
                    f"{ratio_cell(r, 'fwd')} | {r['fusedattn_fb']:.0f} | {r['fa2_fb']:.0f} | "
                    f"{r['cudnn_fb']:.0f} | {r['fusedattn_fb'] / r['fa2_fb']:.2f} | "
                    f"{ratio_cell(r, 'fb')} |")
                print(lines[-1], flush=True)
                clock_lines += r["clock_lines"]
    write_table("GPU attention",
                "bf16, b*s = 16384 tokens, h*d = 2048, TFLOP/s (FlashAttention's count: fwd 4bhs^2d, /2 causal; "
                "fwd+bwd 3.5x fwd), medians of " + (f"{ROUNDS} rounds of " if ROUNDS > 1 else "")
                + ("triton do_bench" if TIMING == "do_bench" else
                                                     "20 event-timed calls back to back, no L2 flush (--timing loop)")
                + ("; inputs uniform as the harnesses'" if INPUTS == "uniform" else "")
                + ({"own": f"; each timed after {PRECEDE_S:g} s of back-to-back calls",
                    "idle": f"; each timed after {PRECEDE_S:g} s with the GPU idle",
                    "gemm": f"; each timed after {PRECEDE_S:g} s of back-to-back 8192^3 bf16 matmuls",
                    "none": "; each timed right after the one before (--precede none)"}[PRECEDE]
                   if PRECEDE_S > 0 or PRECEDE == "none" else "")
                + ("; each round starting with the next implementation (--order rotate)" if ROTATE else "")
                + "; ratios > 1 mean fusedattn is faster"
                + (" (vs cuDNN: median over the rounds, in brackets the range of the per-round ratios)"
                   if ROUNDS > 1 else "") + ".",
                lines, opts.out)
    if SAMPLER is not None:
        SAMPLER.stop()
        write_table("SM clock and board power during the timed calls",
                    "nvidia-smi samples every 20 ms, mean per measurement (one per round, in round order): "
                    "SM clock, board power, GPU temperature, and the clock event reasons active in at least a "
                    "tenth of the samples.",
                    ["| d | s | causal | measurement | per round |", "|---|---|---|---|---|"] + clock_lines,
                    opts.out)


if __name__ == "__main__":
    main()
