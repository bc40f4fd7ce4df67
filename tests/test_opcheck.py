"""torch.library.opcheck on fusedattn's operators.

opcheck verifies the schema (no undeclared mutation or aliasing), the autograd
registration, that the fake implementation agrees with the real one (shapes,
strides, dtypes) and that the op works under AOTAutograd with dynamic shapes.
The configs are conftest.sample_inputs(): a subset of the numerics matrix in
which every value of every setting appears at least once, built on the CPU and
run on conftest.DEVICE (FUSEDATTN_TEST_DEVICE).
"""

from __future__ import annotations

import pytest
import torch

import fusedattn._ops  # noqa: F401  (loads the operators)
from conftest import MATRIX, build_case, opcheck_tests, run_op, sample_inputs, to_device

CONFIGS = sample_inputs()


def _fwd_args(case):
    return case.op_args()


@pytest.mark.usefixtures("deterministic_algorithms")
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_opcheck_fwd(cfg):
    case = to_device(build_case(cfg))
    torch.library.opcheck(torch.ops.fusedattn.fwd.default, _fwd_args(case), test_utils=opcheck_tests(case.dtype))


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_opcheck_fwd_without_grad(cfg):
    case = to_device(build_case(cfg))
    for t in case.leaves.values():
        t.requires_grad_(False)
    torch.library.opcheck(torch.ops.fusedattn.fwd.default, _fwd_args(case),
                          test_utils=("test_schema", "test_faketensor"))


def _bwd_args(case, need_dbias):
    out, lse, rng_out, _ = run_op(case)
    q, k, v = (t.detach() for t in case.make_qkv(case.leaves))
    opt = [t.detach() if t is not None else None for t in case.op_tensors()[3:11]]
    return (case.dout, q, k, v, out.detach(), lse, rng_out, *opt, *case.args.op_args(), need_dbias)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_opcheck_bwd(cfg):
    case = to_device(build_case(cfg))
    need_dbias = "bias" in case.leaves
    torch.library.opcheck(torch.ops.fusedattn.bwd.default, _bwd_args(case, need_dbias))


def test_opcheck_bwd_bias_without_dbias():
    cfg = next(c for c in MATRIX if c.bias in ("bhss", "1hss") and c.layout == "bshd")
    case = to_device(build_case(cfg))
    torch.library.opcheck(torch.ops.fusedattn.bwd.default, _bwd_args(case, False))


def test_fake_matches_real_strides_for_packed_and_strided_inputs():
    """dq/dk/dv come back contiguous in the inputs' formats even for packed and transposed inputs, on the
    real op and its fake alike (what a compiled backward relies on)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for layout in ("bsh3d", "sbhd_sb2hd", "bhsd_views", "th3d"):
        cfg = next(c for c in MATRIX if c.layout == layout)
        case = to_device(build_case(cfg))
        args = _bwd_args(case, False)
        real = torch.ops.fusedattn.bwd(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = torch.ops.fusedattn.bwd(*fake_args)
        for r, f in zip(real, fake):
            assert tuple(r.shape) == tuple(f.shape) and r.stride() == f.stride() and r.dtype == f.dtype
        for r in real[:3]:
            assert r.is_contiguous()


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c.layout in ("bshd", "thd_gaps")][:3], ids=str)
def test_opcheck_softcap(cfg):
    """The softcap setting through the schema, the fakes and autograd (forward and backward)."""
    case = to_device(build_case(cfg))
    case.args = case.args.replace(softcap=2.5)
    torch.library.opcheck(torch.ops.fusedattn.fwd.default, _fwd_args(case), test_utils=opcheck_tests(case.dtype))
    torch.library.opcheck(torch.ops.fusedattn.bwd.default, _bwd_args(case, "bias" in case.leaves))
