"""The installed operator library is the portable one (docs/design.md, "Binding"): it links torch only
through libtorch_cpu.so's stable C shim and no Python C API (one file for every torch >= 2.10 and every
Python 3), no code outside the CPU engine's per-ISA copies uses AVX instructions (it runs on any x86-64),
each copy computes attention correctly, and `import fusedattn` leaves torch._dynamo unloaded.

FUSEDATTN_EXPECT_CUDA_KERNELS=1 (scripts/run_tests.sh, testing the wheel built with nvcc) also asserts that
the CUDA kernels are registered, which they are under a CPU-only torch too."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

import fusedattn

LIB = Path(fusedattn.__file__).parent / "_C.so"
# What the library may need at load time: libtorch_cpu.so (already loaded by `import torch`) and the C/C++
# runtimes. Not libtorch_cuda / libc10 / libtorch_python / libpython / libcudart (CUDA runtime: static).
ALLOWED_NEEDED = re.compile(r"^(libtorch_cpu\.so|libstdc\+\+\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libc\.so\.6|"
                            r"libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2)$")


def _run(*cmd) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


needs_binutils = pytest.mark.skipif(shutil.which("readelf") is None or shutil.which("objdump") is None,
                                    reason="binutils (readelf, objdump) are not installed")


@needs_binutils
def test_links_torch_only_through_the_stable_c_shim():
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _run("readelf", "-d", str(LIB)))
    assert "libtorch_cpu.so" in needed and all(ALLOWED_NEEDED.match(n) for n in needed), needed
    undefined = re.findall(r"\*UND\*\s+\S+\s+(?:\S+\s+)?(\S+)$", _run("objdump", "-T", str(LIB)), flags=re.M)
    python_api = [s for s in undefined if s.startswith(("Py", "_Py"))]
    assert not python_api, python_api
    # torch's symbols are the C shim's (aoti_torch_* / torch_*): no C++ symbol of torch, c10 or at.
    cxx_torch = [s for s in undefined if re.match(r"_ZN?K?(3c10|2at|5torch)", s)]
    assert not cxx_torch, cxx_torch[:20]


@needs_binutils
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISA copies exist on x86-64 only")
def test_avx_only_inside_the_cpu_engine_copies():
    """An AVX (VEX/EVEX-encoded) instruction in a shared function outside fusedattn::cpu::avx2 / avx512
    would make the library fault on a CPU without it: the core is compiled for the baseline, and of an
    inline function that several objects emit (the standard library's) the linker keeps the baseline
    object's copy. Local functions (a copy's own clones) are called only from their own object."""
    local = {m.group(2) for m in re.finditer(r"^([0-9a-f]+) [tr] (.*)$", _run("nm", "-C", "--defined-only", str(LIB)),
                                              flags=re.M)}
    offenders, current = set(), None
    for line in _run("objdump", "-d", "--no-show-raw-insn", "-C", str(LIB)).splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            current = head.group(1)
            continue
        if current and re.match(r"^\s+[0-9a-f]+:\s+v\w+\s.*%[xyz]mm", line):
            if not re.search(r"fusedattn::cpu::(avx2|avx512)::", current) and current not in local:
                offenders.add(current)
    assert not offenders, sorted(offenders)[:20]


def test_wheel_tag_is_python_independent():
    dist = metadata.distribution("fusedattn")
    wheel = dist.read_text("WHEEL") or ""
    tags = re.findall(r"^Tag: (\S+)$", wheel, flags=re.M)
    assert tags and all(t.startswith("py3-none-") for t in tags), wheel


_ISA_CHILD = """
import torch
from fusedattn._ops import FwdArgs, attention

def grads(fn, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 37, 64).to(dtype).requires_grad_() for _ in range(3))
    out = fn(q, k, v)
    out.backward(torch.ones_like(out))
    return [t.double() for t in (out, q.grad, k.grad, v.grad)]

def ours(q, k, v):
    return attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                     FwdArgs(scale=0.125, mask_type="causal"))[0].transpose(1, 2)

def torchs(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)

ref = grads(torchs, torch.float64)
for name, x, t, r in zip(("out", "dq", "dk", "dv"), grads(ours, torch.float32), grads(torchs, torch.float32), ref):
    print(name, (x - r).abs().max().item(), (t - r).abs().max().item())
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISA copies exist on x86-64 only")
@pytest.mark.parametrize("isa", ["auto", "avx2", "base"])
def test_each_cpu_engine_copy_matches_float64(isa):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEDATTN_")}
    env["FUSEDATTN_CPU_ISA"] = isa
    out = subprocess.run([sys.executable, "-c", _ISA_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.strip().splitlines()[-4:]]
    assert [r[0] for r in rows] == ["out", "dq", "dk", "dv"], out.stdout
    for name, ours, torchs in rows:  # float64 reference; FlashAttention's rule: <= 2 x torch's float32 error + eps
        assert float(ours) <= 2 * float(torchs) + 1e-6, f"FUSEDATTN_CPU_ISA={isa} {name}: {ours} vs torch {torchs}"


def test_import_leaves_dynamo_unloaded():
    code = "import sys, fusedattn; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.skipif(os.environ.get("FUSEDATTN_EXPECT_CUDA_KERNELS") != "1",
                    reason="set by scripts/run_tests.sh for the wheel built with the CUDA engine")
def test_cuda_kernels_are_registered():
    for op in ("fwd", "bwd", "copy_to_kv_cache"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fusedattn::{op}", "CUDA"), op
