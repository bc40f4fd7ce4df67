"""Shared pieces of fusedattn's pytest suite.

* ``Config`` describes one attention problem (layout, mask, window, bias,
  softmax, dropout, heads, dims, lengths, dtype); ``MATRIX`` is the pairwise
  covering set of configs plus hand-picked edge cases, the one source that
  feeds test_numerics, test_opcheck and test_compile (``sample_inputs``).
* ``build_case`` turns a config into tensors (leaves that require grad, the
  q/k/v views made from them, the optional op inputs, FwdArgs and dout).
* ``assert_matches_reference`` is the tolerance rule, FlashAttention's:
  err(fusedattn in dtype vs float64 reference) <= 2 * err(the reference run in
  that dtype vs the float64 reference) + eps; NaN fails.
* ``DEVICE`` (environment variable FUSEDATTN_TEST_DEVICE: "cpu", the default,
  or "cuda") is where the engine runs. Cases are built on the CPU and the
  reference always runs there in float64; ``to_device`` copies a case to the
  device for the engine run (``device_run``) and ``to_host`` brings the results
  back for the comparison. With DEVICE = "cpu" both are the identity, so the
  CPU suite runs exactly as it did before the variable existed. When "cuda" is
  asked for but cannot be had, the session stops at once (``pytest.exit``)
  instead of quietly testing the CPU.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import random
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Optional

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("fusedattn") is None:  # not installed: use the source tree
    sys.path.insert(0, str(REPO / "python"))

import reference as R  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}

# eps of the tolerance rule, scaled by max(1, max|ref|): about one ulp at 1.0
# for the 16-bit types (fp16 2^-10, bf16 2^-7) and 1e-5 for fp32.
EPS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float64: 1e-10}


# ---------------------------------------------------------------------------
# The device the engine runs on

DEVICE = os.environ.get("FUSEDATTN_TEST_DEVICE", "cpu")
DEVICE_TYPE = DEVICE.split(":")[0]  # "cpu" | "cuda" ("cuda:1" selects a GPU)
ON_CUDA = DEVICE_TYPE == "cuda"
# The CUDA engine selector (fusedattn/overrides.h; read once per process): scripts/gpu_check.sh repeats
# the GPU tests with simt, where tests of which kernel runs do not apply.
CUDA_ENGINE = os.environ.get("FUSEDATTN_CUDA_ENGINE", "")
# What strict determinism raises on the SIMT engine, whose dQ is summed with atomics.
SIMT_NOT_DETERMINISTIC = "SIMT engine.*does not have a deterministic implementation"


def run_tests_in_child(test_file, env: Dict[str, str], k_expr: str, timeout: int = 1200):
    """pytest on `test_file`, selected by `k_expr`, in a child process whose environment adds `env`:
    for the library's switches that are read once per process. Returns the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(test_file),
                           "-k", k_expr], cwd=str(Path(__file__).resolve().parents[1]), env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=timeout)


def _device_problem() -> Optional[str]:
    """Why the suite cannot run on DEVICE, or None."""
    try:
        dev = torch.device(DEVICE)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        return f"FUSEDATTN_TEST_DEVICE={DEVICE!r}: expected 'cpu' or 'cuda' (or 'cuda:N')"
    if dev.type == "cpu":
        return None
    if not torch.cuda.is_available():
        return (f"FUSEDATTN_TEST_DEVICE={DEVICE} but CUDA is not available to torch {torch.__version__} "
                f"(built for CUDA {torch.version.cuda}); not falling back to the CPU")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        return f"FUSEDATTN_TEST_DEVICE={DEVICE} but only {torch.cuda.device_count()} CUDA device(s) are visible"
    import fusedattn._ops  # noqa: F401  (loads the extension)

    if not torch._C._dispatch_has_kernel_for_dispatch_key("fusedattn::fwd", "CUDA"):
        return f"FUSEDATTN_TEST_DEVICE={DEVICE} but this fusedattn was built without the CUDA engine"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (deselect with -m 'not slow')")
    problem = _device_problem()
    if problem is not None:
        pytest.exit(problem, returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_report_header(config):
    return f"fusedattn test device: {DEVICE} (FUSEDATTN_TEST_DEVICE)"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    random.seed(0)
    yield


# ---------------------------------------------------------------------------
# Configs

CAUSAL_MASKS = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")
PADDING_MASKS = ("padding", "padding_causal", "padding_causal_bottom_right")
MASKS = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
         "arbitrary")

# layout -> (q format, kv format, how q/k/v are made)
LAYOUTS = {
    "bshd": ("bshd", "bshd", "separate"),
    "sbhd": ("sbhd", "sbhd", "separate"),
    "thd": ("thd", "thd", "separate"),
    "thd_gaps": ("thd", "thd", "separate"),
    "bhsd_views": ("bshd", "bshd", "bhsd"),  # bshd views of [b, h, s, d] memory (SDPA's layout)
    "bs3hd": ("bshd", "bshd", "qkv"),
    "bsh3d": ("bshd", "bshd", "qkv"),
    "sb3hd": ("sbhd", "sbhd", "qkv"),
    "sbh3d": ("sbhd", "sbhd", "qkv"),
    "t3hd": ("thd", "thd", "qkv"),
    "th3d": ("thd", "thd", "qkv"),
    "bshd_bs2hd": ("bshd", "bshd", "kv"),
    "bshd_bsh2d": ("bshd", "bshd", "kv"),
    "sbhd_sb2hd": ("sbhd", "sbhd", "kv"),
    "sbhd_sbh2d": ("sbhd", "sbhd", "kv"),
    "thd_t2hd": ("thd", "thd", "kv"),
    "thd_th2d": ("thd", "thd", "kv"),
    "thd_bshd": ("thd", "bshd", "separate"),
    "sbhd_bshd": ("sbhd", "bshd", "separate"),
}
GAPPED = ("thd_gaps", "th3d", "thd_th2d")  # thd layouts given cu_seqlens_*_padded with gaps

# name -> (b, s_q, s_kv)
SHAPES = {
    "self17": (2, 17, 17),
    "self32": (2, 32, 32),
    "cross_short_q": (2, 9, 23),
    "cross_long_q": (2, 23, 9),
    "decode": (3, 1, 21),
    "long": (2, 67, 131),
}
WINDOWS = {  # category -> (non-causal window, causal window)
    "none": ((-1, -1), (-1, 0)),
    "a": ((3, 2), (3, 0)),
    "zero": ((0, 0), (0, 0)),
    "b": ((8, 5), (8, 0)),
}
BIASES = ("none", "bhss", "1hss", "b1ss", "11ss", "111s", "b11s", "alibi_h", "alibi_bh")
ATTN_MASK_SHAPES = ("bhss", "b1ss", "11ss", "1hss", "b11s")


@dataclass(frozen=True)
class Config:
    layout: str = "bshd"
    mask: str = "no_mask"
    window: str = "none"
    brd: Optional[bool] = None  # bottom_right_diagonal
    bias: str = "none"
    softmax: str = "vanilla"
    dropout: float = 0.0
    heads: tuple = (4, 4)  # (h_q, h_kv)
    dims: tuple = (32, 32)  # (d_qk, d_v)
    shape: str = "self17"
    dtype: str = "fp32"
    max_logit: bool = False
    attn_mask_shape: Optional[str] = None  # arbitrary mask only
    max_seqlen: Optional[str] = None  # thd only: "given" | "rounded" | "none"
    seqlens: Optional[str] = None  # variable lengths only: "random" | "empty" | "full"
    scale: Optional[float] = None  # None: 1/sqrt(d_qk)

    @property
    def q_format(self):
        return LAYOUTS[self.layout][0]

    @property
    def kv_format(self):
        return LAYOUTS[self.layout][1]

    @property
    def has_thd(self):
        return "thd" in (self.q_format, self.kv_format)

    @property
    def variable_lengths(self):
        return self.has_thd or self.mask in PADDING_MASKS

    @property
    def window_size(self):
        return WINDOWS[self.window][1 if self.mask in CAUSAL_MASKS else 0]

    def __str__(self):
        parts = [self.layout, self.mask]
        if self.window != "none":
            parts.append("w%d_%d" % self.window_size)
        if self.brd is not None:
            parts.append(f"brd{int(self.brd)}")
        if self.bias != "none":
            parts.append(self.bias)
        if self.attn_mask_shape:
            parts.append("m" + self.attn_mask_shape)
        if self.softmax != "vanilla":
            parts.append(self.softmax)
        if self.dropout:
            parts.append(f"p{self.dropout}")
        parts.append("h%d_%d" % self.heads)
        parts.append("d%d_%d" % self.dims)
        parts.append(self.shape)
        if self.max_seqlen:
            parts.append("ms_" + self.max_seqlen)
        if self.seqlens:
            parts.append("len_" + self.seqlens)
        if self.scale is not None:
            parts.append(f"sc{self.scale}")
        if self.max_logit:
            parts.append("maxlogit")
        parts.append(self.dtype)
        return "-".join(parts)


def is_valid(c: Config) -> bool:
    kind = LAYOUTS[c.layout][2]
    b, s_q, s_kv = SHAPES[c.shape]
    h_q, h_kv = c.heads
    d_qk, d_v = c.dims
    if h_q % h_kv:
        return False
    if kind == "qkv" and (h_q != h_kv or d_qk != d_v or s_q != s_kv):
        return False
    if kind == "kv" and d_qk != d_v:
        return False
    if c.has_thd and c.max_seqlen == "none" and (c.bias not in ("none", "alibi_h", "alibi_bh") or
                                                  c.mask == "arbitrary"):
        return False  # bias / boolean mask in thd are indexed up to max_seqlen, which must be given
    if max(d_qk, d_v) > 128 and c.shape == "long":
        return False  # keep the CPU matrix fast; d=256 has its own cases
    return True


def normalise(c: Config) -> Config:
    """Blank out settings that do not apply to the config."""
    return replace(
        c,
        attn_mask_shape=c.attn_mask_shape if c.mask == "arbitrary" else None,
        max_seqlen=c.max_seqlen if c.has_thd else None,
        seqlens=c.seqlens if c.variable_lengths else None,
    )


PAIRWISE_DIMS = {
    "layout": tuple(LAYOUTS),
    "mask": MASKS,
    "window": tuple(WINDOWS),
    "brd": (None, False, True),
    "bias": BIASES,
    "softmax": ("vanilla", "off-by-one", "learnable"),
    "dropout": (0.0, 0.25),
    "heads": ((4, 4), (4, 2), (4, 1), (2, 2)),
    "dims": ((32, 32), (64, 32), (16, 64), (8, 8), (128, 128)),
    "shape": tuple(SHAPES),
    "dtype": ("fp32", "fp16", "bf16"),
    "max_logit": (False, True),
    "attn_mask_shape": ATTN_MASK_SHAPES,
    "max_seqlen": ("given", "rounded", "none"),
    "seqlens": ("random", "empty", "full"),
}


# Settings that apply to some configs only are paired with a few settings, so
# that they do not multiply the configs they apply to.
PAIR_SCOPE = {
    "attn_mask_shape": ("shape", "heads", "dtype", "window"),
    "max_seqlen": ("layout", "mask", "bias", "shape", "dtype"),
    "seqlens": ("layout", "mask", "shape", "dropout", "softmax", "bias", "window"),
}


def _pair_wanted(a: str, b: str) -> bool:
    return (a not in PAIR_SCOPE or b in PAIR_SCOPE[a]) and (b not in PAIR_SCOPE or a in PAIR_SCOPE[b])


def _pairs(c: Config):
    vals = [(k, getattr(c, k)) for k in PAIRWISE_DIMS]
    vals = [(k, v) for k, v in vals if v is not None or k == "brd"]
    return {(a, b) for a, b in itertools.combinations(vals, 2) if _pair_wanted(a[0], b[0])}


def _random_config(rng: random.Random, fixed: Dict[str, object]) -> Config:
    kw = {k: fixed.get(k, rng.choice(vs)) for k, vs in PAIRWISE_DIMS.items()}
    return normalise(Config(**kw))


def pairwise_configs(seed: int = 2024) -> list:
    """A covering set of valid configs: every valid pair of settings appears at least once (AETG-style greedy)."""
    rng = random.Random(seed)
    pool_pairs = set()
    for _ in range(8000):
        c = _random_config(rng, {})
        if is_valid(c):
            pool_pairs |= _pairs(c)
    uncovered = set(pool_pairs)
    out = []
    while uncovered:
        target = sorted(uncovered, key=repr)[rng.randrange(len(uncovered))]
        best, best_gain = None, 0
        for _ in range(60):
            c = _random_config(rng, dict(target))
            if not is_valid(c):
                continue
            gain = len(_pairs(c) & uncovered)
            if gain > best_gain:
                best, best_gain = c, gain
        if best is None:  # the target pair was only seen with other constraints: drop it from the goal
            uncovered.discard(target)
            continue
        out.append(best)
        uncovered -= _pairs(best)
    return out


# Hand-picked cases the pairwise set may not hit in combination.
EDGE_CASES = [
    # d up to 256, d_qk != d_v
    Config(layout="bshd", mask="causal", dims=(256, 256), shape="self32", dtype="fp16"),
    Config(layout="sbhd", mask="no_mask", dims=(256, 128), shape="cross_short_q", dtype="bf16", bias="1hss"),
    Config(layout="thd", mask="padding_causal", dims=(128, 256), shape="self32", dtype="fp32", max_seqlen="given",
           seqlens="random", softmax="learnable"),
    Config(layout="bshd", mask="no_mask", dims=(192, 128), heads=(4, 1), shape="self17", dtype="bf16"),
    # rows with no visible key (s_q > s_kv with bottom-right causal; zero-width windows; masked rows)
    Config(layout="bshd", mask="causal_bottom_right", shape="cross_long_q", softmax="off-by-one", dtype="fp32"),
    Config(layout="bshd", mask="causal_bottom_right", shape="cross_long_q", softmax="learnable", dtype="fp16",
           bias="bhss", max_logit=True),
    Config(layout="sbhd", mask="no_mask", window="zero", brd=True, shape="cross_long_q", dtype="fp32"),
    Config(layout="bshd", mask="arbitrary", attn_mask_shape="bhss", softmax="vanilla", dtype="bf16"),
    # zero-length sequences
    Config(layout="thd_gaps", mask="padding", seqlens="empty", max_seqlen="none", dtype="fp32"),
    Config(layout="thd", mask="padding_causal_bottom_right", seqlens="empty", max_seqlen="given", dtype="fp16",
           softmax="learnable", dropout=0.25),
    Config(layout="bshd", mask="padding_causal", seqlens="empty", dtype="fp32", bias="b1ss"),
    # long rows, multiple tiles, every feature at once
    Config(layout="bshd", mask="padding_causal_bottom_right", window="b", shape="long", bias="bhss",
           softmax="learnable", dropout=0.25, heads=(4, 2), dims=(64, 64), seqlens="random", dtype="fp32",
           max_logit=True),
    Config(layout="thd_gaps", mask="padding_causal", window="a", shape="long", bias="alibi_bh",
           softmax="off-by-one", dropout=0.25, heads=(4, 1), dims=(64, 32), seqlens="random",
           max_seqlen="rounded", dtype="bf16", max_logit=True),
    # causal types ignore bottom_right_diagonal
    Config(layout="bshd", mask="causal", brd=True, shape="cross_short_q", bias="alibi_h", dtype="fp32"),
    Config(layout="bshd", mask="causal_bottom_right", brd=False, shape="cross_short_q", bias="alibi_h",
           dtype="fp32"),
    # a non-default scale
    Config(layout="bshd", mask="no_mask", scale=0.9, dtype="fp32", bias="11ss"),
]


def _build_matrix():
    seen, out = set(), []
    for c in pairwise_configs() + [normalise(c) for c in EDGE_CASES]:
        if str(c) not in seen and is_valid(c):
            seen.add(str(c))
            out.append(c)
    return out


MATRIX = _build_matrix()


def sample_inputs(features=("layout", "mask", "window", "bias", "softmax", "dropout", "heads", "dims", "shape",
                            "dtype", "max_logit", "attn_mask_shape", "max_seqlen", "seqlens"), pool=None):
    """A small subset of MATRIX (or of ``pool``) in which every value of every listed setting appears."""
    pool = MATRIX if pool is None else list(pool)
    need = {(f, getattr(c, f)) for c in pool for f in features if getattr(c, f) is not None}
    out = []
    while need:
        best = max(pool, key=lambda c: (len({(f, getattr(c, f)) for f in features} & need), -pool.index(c)))
        out.append(best)
        need -= {(f, getattr(best, f)) for f in features}
    return out


# ---------------------------------------------------------------------------
# Building tensors


@dataclass
class Side:
    """Where one side's (q or kv) sequences live."""

    fmt: str
    b: int
    s: int  # bshd/sbhd sequence dim; thd max length
    lens: list
    offsets: Optional[list] = None  # thd
    t: int = 0  # thd token count
    cu: Optional[torch.Tensor] = None
    cu_padded: Optional[torch.Tensor] = None

    def token_shape(self):
        if self.fmt == "thd":
            return (self.t,)
        return (self.b, self.s) if self.fmt == "bshd" else (self.s, self.b)

    def valid(self) -> torch.Tensor:
        """Bool over the token dims: positions that belong to a sequence."""
        m = torch.zeros(self.token_shape(), dtype=torch.bool)
        for bi, n in enumerate(self.lens):
            if self.fmt == "thd":
                m[self.offsets[bi]:self.offsets[bi] + n] = True
            elif self.fmt == "bshd":
                m[bi, :n] = True
            else:
                m[:n, bi] = True
        return m


@dataclass
class Case:
    cfg: Config
    dtype: torch.dtype
    args: object  # fusedattn FwdArgs
    leaves: Dict[str, torch.Tensor]  # tensors gradients are taken for
    make_qkv: Callable  # leaves -> (q, k, v)
    extra: Dict[str, Optional[torch.Tensor]]  # non-differentiable op inputs
    dout: torch.Tensor
    q_side: Side
    kv_side: Side

    def op_tensors(self, leaves=None):
        """(q, k, v, bias, softmax_offset, attn_mask, alibi, cu_q, cu_kv, cu_q_pad, cu_kv_pad, rng_state)."""
        leaves = self.leaves if leaves is None else leaves
        q, k, v = self.make_qkv(leaves)
        e = self.extra
        return (q, k, v, leaves.get("bias"), leaves.get("softmax_offset"), e["attn_mask"], e["alibi_slopes"],
                e["cu_seqlens_q"], e["cu_seqlens_kv"], e["cu_seqlens_q_padded"], e["cu_seqlens_kv_padded"],
                e["rng_state"])

    def op_args(self):
        """Every positional argument of torch.ops.fusedattn.fwd."""
        return self.op_tensors() + tuple(self.args.op_args()) + (self.args.return_max_logit,)

    def ref_kwargs(self, leaves):
        e = self.extra
        return dict(bias=leaves.get("bias"), softmax_offset=leaves.get("softmax_offset"), attn_mask=e["attn_mask"],
                    alibi_slopes=e["alibi_slopes"], cu_seqlens_q=e["cu_seqlens_q"], cu_seqlens_kv=e["cu_seqlens_kv"],
                    cu_seqlens_q_padded=e["cu_seqlens_q_padded"], cu_seqlens_kv_padded=e["cu_seqlens_kv_padded"],
                    rng_state=e["rng_state"])

    def clone_leaves(self, dtype=None):
        """Fresh leaves with the same values: cast to ``dtype`` when given (float64 for the ground
        truth), else in their own dtypes (softmax_offset stays fp32, as the op takes it)."""
        return {n: t.detach().clone().to(dtype or t.dtype).requires_grad_(t.requires_grad)
                for n, t in self.leaves.items()}


def _cfg_seed(cfg) -> int:
    return zlib.crc32(str(cfg).encode())


def _make_side(fmt, b, s, lens, gaps, rng, cu_shared=None) -> Side:
    if fmt != "thd":
        return Side(fmt, b, s, lens)
    if cu_shared is not None:
        return cu_shared
    offsets, cu, cu_pad = [], [0], [0]
    for n in lens:
        offsets.append(cu_pad[-1])
        cu.append(cu[-1] + n)
        cu_pad.append(cu_pad[-1] + n + (rng.randint(0, 3) if gaps else 0))
    trailing = 2  # unused tokens after the last sequence
    t = cu_pad[-1] + trailing
    side = Side(fmt, b, s, lens, offsets=offsets if gaps else cu[:-1], t=t,
                cu=torch.tensor(cu, dtype=torch.int32),
                cu_padded=torch.tensor(cu_pad, dtype=torch.int32) if gaps else None)
    return side


def _lengths(cfg, b, s_q, s_kv, rng):
    kind = cfg.seqlens or "full"
    if kind == "full":
        return [s_q] * b, [s_kv] * b
    lq = [rng.randint(1, s_q) for _ in range(b)]
    lk = [rng.randint(1, s_kv) for _ in range(b)]
    lq[0], lk[-1] = s_q, s_kv  # the longest sequences reach the full size
    if kind == "empty":
        lk[0] = 0  # a sequence without keys
        if b > 2:
            lq[1] = 0  # and one without queries
    return lq, lk


def build_case(cfg: Config, device="cpu", dtype=None) -> Case:
    from fusedattn._ops import FwdArgs

    dtype = dtype or DTYPES[cfg.dtype]
    rng = random.Random(_cfg_seed(cfg))
    gen = torch.Generator().manual_seed(_cfg_seed(cfg))

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    b, s_q, s_kv = SHAPES[cfg.shape]
    if cfg.has_thd:
        b = max(b, 3)
    h_q, h_kv = cfg.heads
    d_qk, d_v = cfg.dims
    q_fmt, kv_fmt, kind = LAYOUTS[cfg.layout]
    gaps = cfg.layout in GAPPED
    lq, lk = _lengths(cfg, b, s_q, s_kv, rng)
    if kind == "qkv":
        lk = list(lq)
    if cfg.mask not in PADDING_MASKS:  # bshd/sbhd sides have full lengths without a padding mask
        if q_fmt != "thd":
            lq = [s_q] * b
        if kv_fmt != "thd":
            lk = [s_kv] * b
    q_side = _make_side(q_fmt, b, s_q, lq, gaps, rng)
    kv_side = q_side if (kind == "qkv" and q_fmt == "thd") else _make_side(kv_fmt, b, s_kv, lk, gaps, rng)

    # Maximum lengths seen by bias / mask / max_seqlen.
    def max_len(side, s):
        if side.fmt != "thd":
            return side.s
        m = max(max(side.lens), 1)
        if cfg.max_seqlen == "rounded":
            return (m + 15) // 16 * 16
        return m

    ms_q, ms_kv = max_len(q_side, s_q), max_len(kv_side, s_kv)

    def seq_shape(side, h, d):
        return side.token_shape() + (h, d)

    leaves: Dict[str, torch.Tensor] = {}
    if kind == "separate":
        leaves["q"] = randn(*seq_shape(q_side, h_q, d_qk))
        leaves["k"] = randn(*seq_shape(kv_side, h_kv, d_qk))
        leaves["v"] = randn(*seq_shape(kv_side, h_kv, d_v))

        def make_qkv(lv):
            return lv["q"], lv["k"], lv["v"]
    elif kind == "bhsd":
        leaves["q"] = randn(b, h_q, s_q, d_qk)
        leaves["k"] = randn(b, h_kv, s_kv, d_qk)
        leaves["v"] = randn(b, h_kv, s_kv, d_v)

        def make_qkv(lv):
            return lv["q"].transpose(1, 2), lv["k"].transpose(1, 2), lv["v"].transpose(1, 2)
    elif kind == "qkv":
        tok = q_side.token_shape()
        interleave = cfg.layout[-3:]  # "3hd" or "h3d"
        if interleave == "3hd":
            leaves["qkv"] = randn(*tok, 3, h_q, d_qk)
            dim = len(tok)
        else:
            leaves["qkv"] = randn(*tok, h_q, 3, d_qk)
            dim = len(tok) + 1

        def make_qkv(lv):
            return lv["qkv"].unbind(dim)
    else:  # packed kv
        leaves["q"] = randn(*seq_shape(q_side, h_q, d_qk))
        tok = kv_side.token_shape()
        if cfg.layout.endswith("2hd"):
            leaves["kv"] = randn(*tok, 2, h_kv, d_qk)
            dim = len(tok)
        else:
            leaves["kv"] = randn(*tok, h_kv, 2, d_qk)
            dim = len(tok) + 1

        def make_qkv(lv):
            k, v = lv["kv"].unbind(dim)
            return lv["q"], k, v

    extra: Dict[str, Optional[torch.Tensor]] = dict(
        attn_mask=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None, rng_state=None)

    def cu_of(lens):
        return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)

    if q_side.fmt == "thd":
        extra["cu_seqlens_q"] = q_side.cu
        extra["cu_seqlens_q_padded"] = q_side.cu_padded
    elif cfg.mask in PADDING_MASKS:
        extra["cu_seqlens_q"] = cu_of(lq)
    if kv_side.fmt == "thd":
        extra["cu_seqlens_kv"] = kv_side.cu  # the same tensor object as cu_seqlens_q for t3hd/th3d
        extra["cu_seqlens_kv_padded"] = kv_side.cu_padded
    elif cfg.mask in PADDING_MASKS:
        extra["cu_seqlens_kv"] = cu_of(lk)

    def pair_shape(code):
        return [b if code[0] == "b" else 1, h_q if code[1] == "h" else 1, ms_q if code[2] == "s" else 1,
                ms_kv if code[3] == "s" else 1]

    if cfg.bias.startswith("alibi"):
        shape = (h_q,) if cfg.bias == "alibi_h" else (b, h_q)
        extra["alibi_slopes"] = torch.rand(*shape, generator=gen, dtype=torch.float32) * 0.5 + 0.05
    elif cfg.bias != "none":
        leaves["bias"] = randn(*pair_shape(cfg.bias))
    if cfg.mask == "arbitrary":
        m = torch.rand(*pair_shape(cfg.attn_mask_shape), generator=gen) < 0.25
        if m.shape[2] > 1:
            m[:, :, min(1, m.shape[2] - 1), :] = True  # a row with no visible key
        extra["attn_mask"] = m
    if cfg.softmax == "learnable":
        leaves["softmax_offset"] = torch.randn(h_q, generator=gen, dtype=torch.float32)
    if cfg.dropout > 0:
        extra["rng_state"] = torch.tensor([rng.randrange(2**63), rng.randrange(2**63)], dtype=torch.int64)

    for t in leaves.values():
        t.requires_grad_(True)

    max_seqlen_q = max_seqlen_kv = None
    if cfg.max_seqlen in ("given", "rounded"):
        if q_side.fmt == "thd":
            max_seqlen_q = ms_q
        if kv_side.fmt == "thd":
            max_seqlen_kv = ms_kv
    wl, wr = cfg.window_size
    args = FwdArgs(scale=cfg.scale if cfg.scale is not None else 1.0 / math.sqrt(d_qk), q_format=q_fmt,
                   kv_format=kv_fmt, mask_type=cfg.mask, window_left=wl, window_right=wr,
                   bottom_right_diagonal=cfg.brd, softmax_type=cfg.softmax, dropout_p=cfg.dropout,
                   max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, return_max_logit=cfg.max_logit)
    if kind == "bhsd":  # the gradient too, as SDPA's callers hand it (the engines take its strides)
        dout = randn(b, h_q, s_q, d_v).transpose(1, 2)
    else:
        dout = randn(*seq_shape(q_side, h_q, d_v))
    leaves = {n: t.to(device).detach().requires_grad_() for n, t in leaves.items()}
    extra = {n: (t.to(device) if t is not None else None) for n, t in extra.items()}
    if kv_side is q_side and q_side.fmt == "thd":
        extra["cu_seqlens_kv"] = extra["cu_seqlens_q"]
        extra["cu_seqlens_kv_padded"] = extra["cu_seqlens_q_padded"]
    return Case(cfg=cfg, dtype=dtype, args=args, leaves=leaves, make_qkv=make_qkv, extra=extra,
                dout=dout.to(device), q_side=q_side, kv_side=kv_side)


# ---------------------------------------------------------------------------
# Moving cases and results between the host and the device


def _device_of(device) -> torch.device:
    return torch.device(DEVICE if device is None else device)


def _is_on(t: torch.Tensor, dev: torch.device) -> bool:
    return t.device.type == dev.type and (dev.index is None or t.device.index == dev.index)


def on_device(x, device=None):
    """Tensors (alone or in tuples, lists and dicts; None passes) on ``device`` (default DEVICE).
    A tensor already there is returned as it is, so on the CPU suite this is the identity."""
    dev = _device_of(device)
    if isinstance(x, dict):
        return {n: on_device(t, dev) for n, t in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(on_device(t, dev) for t in x)
    if isinstance(x, torch.Tensor) and not _is_on(x, dev):
        return x.to(dev)
    return x


def module_on_device(mod: torch.nn.Module, device=None) -> torch.nn.Module:
    """The module moved to ``device`` (default DEVICE); left alone on the CPU."""
    dev = _device_of(device)
    return mod if dev.type == "cpu" else mod.to(dev)


def to_host(x):
    """Results back on the CPU for the comparison with the reference: device tensors (alone or in
    tuples, lists and dicts) as detached CPU copies; CPU tensors and anything else as they are."""
    if isinstance(x, dict):
        return {n: to_host(t) for n, t in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(to_host(t) for t in x)
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        return x.detach().cpu()
    return x


def to_device(case: Case, device=None) -> Case:
    """The case with its leaves (still leaves, same requires_grad), op inputs (cu_seqlens, mask,
    ALiBi slopes, rng_state) and dout on ``device`` (default DEVICE); the case itself when they
    are there already. cfg, args and the host-side sequence bookkeeping (q_side / kv_side) are
    shared, so the reference keeps running on the CPU case."""
    dev = _device_of(device)
    tensors = list(case.leaves.values()) + [t for t in case.extra.values() if t is not None] + [case.dout]
    if all(_is_on(t, dev) for t in tensors):
        return case
    leaves = {n: t.detach().to(dev).requires_grad_(t.requires_grad) for n, t in case.leaves.items()}
    extra = {n: (t.to(dev) if t is not None else None) for n, t in case.extra.items()}
    if case.extra["cu_seqlens_kv"] is case.extra["cu_seqlens_q"] and case.extra["cu_seqlens_q"] is not None:
        extra["cu_seqlens_kv"] = extra["cu_seqlens_q"]  # t3hd / th3d share one tensor, as the API does
        extra["cu_seqlens_kv_padded"] = extra["cu_seqlens_q_padded"]
    return replace(case, leaves=leaves, extra=extra, dout=case.dout.to(dev))


# Gradients the CUDA engines accumulate with atomics (docs/design.md, "Determinism"): dq (and so
# a packed qkv's gradient), a dbias reduced over broadcast dims and the tensor-core engine's
# d_softmax_offset. Two runs of one backward may differ there in the last bits on CUDA; every
# other result is bitwise reproducible there, and every result is on the CPU.
ATOMIC_GRADS = ("q", "qkv", "bias", "softmax_offset")


def rerun_tol(name: str, device=None) -> dict:
    """assert_close tolerances for one result compared between two runs of the same computation
    (eager vs compiled, packed vs separate inputs, twice the same call): exact, except for the
    gradients in ATOMIC_GRADS on CUDA, which get assert_close's defaults for their dtype (a few
    ulps; fp32: rtol 1.3e-6, atol 1e-5)."""
    if _device_of(device).type == "cuda" and name in ATOMIC_GRADS:
        return {}
    return dict(rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Running and comparing


def run_op(case: Case, leaves=None):
    """torch.ops.fusedattn.fwd on the case's inputs: (out, lse, rng_state_out, max_logit)."""
    t = case.op_tensors(leaves)
    return torch.ops.fusedattn.fwd(*t, *case.args.op_args(), case.args.return_max_logit)


def run_ref(case: Case, leaves, compute_dtype):
    q, k, v = case.make_qkv(leaves)
    return R.attention_ref(q, k, v, case.args, compute_dtype=compute_dtype, **case.ref_kwargs(leaves))


def tol_check(name, got, ref64, ref_lp, dtype, where=None, algo_term=None):
    """FlashAttention's rule. Returns an error message or None.

    ``algo_term`` (float64, like ref64) is the exact first-order effect of a
    documented algorithmic choice that the math reference does not make (see
    ``reference_run``); its max is added to the tolerance."""
    got64 = got.detach().cpu().to(torch.float64)  # compared on the CPU, wherever the run was
    r64 = ref64.detach().cpu().to(torch.float64)
    rlp = ref_lp.detach().cpu().to(torch.float64)
    if got64.shape != r64.shape:
        return f"{name}: shape {tuple(got64.shape)} != reference {tuple(r64.shape)}"
    if where is not None:
        where = where.cpu()
        got64, r64, rlp = got64[where], r64[where], rlp[where]
    if not torch.isfinite(got64).all():
        return f"{name}: {int((~torch.isfinite(got64)).sum())} non-finite values"
    if got64.numel() == 0:
        return None
    err = (got64 - r64).abs().max().item()
    err_lp = (rlp - r64).abs().nan_to_num(0.0).max().item()
    eps = EPS[dtype] * max(1.0, r64.abs().max().item())
    if algo_term is not None:
        a = algo_term.detach().cpu().to(torch.float64)
        eps += (a[where] if where is not None else a).abs().max().item()
    if not err <= 2 * err_lp + eps:
        return (f"{name}: max error {err:.3e} vs float64 reference exceeds 2 * {err_lp:.3e} (torch in {dtype}) "
                f"+ {eps:.1e}; max|ref| = {r64.abs().max().item():.3e}")
    return None


def assert_matches_reference(checks):
    msgs = [m for m in checks if m]
    assert not msgs, "\n".join(msgs)


def nan_problem(where, mask_kind, dtype, d=16):
    """bhsd q, k, v, a mask (None, "causal": none, "bool", "float") and a float64 dout with one NaN
    at ``where``: "q", "k" (the last key, which a causal mask hides from most rows), "k_visible"
    (key 0), "v", "mask" (float) or "dout". Returns ({"q", "k", "v"}, mask, dout)."""
    gen = torch.Generator().manual_seed(3)
    b, h, s_q, s_kv = 2, 2, 70, 67  # more than one tile of rows and keys on every engine
    t = {n: torch.randn(b, h, s, d, generator=gen, dtype=torch.float64).to(dtype)
         for n, s in (("q", s_q), ("k", s_kv), ("v", s_kv))}
    mask = None
    if mask_kind == "float":
        mask = torch.randn(b, h, s_q, s_kv, generator=gen, dtype=torch.float64).to(dtype)
    elif mask_kind == "bool":
        mask = torch.rand(b, 1, s_q, s_kv, generator=gen) < 0.8
        mask[0, 0, 5] = False  # a row that sees nothing
    dout = torch.randn(b, h, s_q, d, generator=gen, dtype=torch.float64)
    target = {"q": (t["q"], (0, 1, 3, 7)), "k": (t["k"], (1, 0, 66, 2)), "k_visible": (t["k"], (1, 0, 0, 2)),
              "v": (t["v"], (0, 1, 40, 0)), "mask": (mask, (1, 1, 2, 9)), "dout": (dout, (1, 0, 20, 5))}[where]
    target[0][target[1]] = float("nan")
    return t, mask, dout


def math_sdpa(q, k, v, **kw):
    """torch.nn.functional.scaled_dot_product_attention under its math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


def sdpa_nan_sets(q, k, v, attn_mask=None, is_causal=False, dout=None):
    """float64 torch math attention of bhsd q, k, v (a float attn_mask is differentiated too) and the
    NaN positions that nan_rule_check takes: {name: (torch_nan, seen_nan)} for "out" and, with
    ``dout``, "dq", "dk", "dv" (and "dmask"). Returns (torch's output, that dict)."""
    named = {"q": q, "k": k, "v": v}
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        named["mask"] = attn_mask
    sets, want = {}, None
    for fn in (math_sdpa, R.sdpa_seen_only):
        leaves = {n: t.detach().cpu().double().requires_grad_(dout is not None) for n, t in named.items()}
        mask = leaves.get("mask", attn_mask.cpu() if attn_mask is not None else None)
        out = fn(leaves["q"], leaves["k"], leaves["v"], attn_mask=mask, is_causal=is_causal)
        found = {"out": torch.isnan(out.detach())}
        if dout is not None:
            out.backward(dout.detach().cpu().double())
            found.update({f"d{n}": torch.isnan(t.grad) for n, t in leaves.items()})
        if fn is math_sdpa:
            want = out.detach()
            sets = {n: (x, None) for n, x in found.items()}
        else:
            sets = {n: (sets[n][0], x) for n, x in found.items()}
    return want, sets


def nan_rule_check(name, got, torch_nan, seen_nan, device=None):
    """Where an engine's result is NaN (docs/robustness.md, NaN). The CPU engine: exactly where
    torch's math attention is (``torch_nan``). The CUDA engines: at least where a NaN reaches a row
    through what it sees (``seen_nan``, reference.sdpa_seen_only), at most where torch's is. Returns
    an error message or None."""
    got_nan = torch.isnan(got.detach().cpu())
    if _device_of(device).type != "cuda":
        if not torch.equal(got_nan, torch_nan):
            return (f"{name}: NaN at {int((got_nan & ~torch_nan).sum())} positions where torch's math attention is "
                    f"finite, finite at {int((torch_nan & ~got_nan).sum())} where it is NaN")
        return None
    missing = seen_nan & ~got_nan
    extra = got_nan & ~torch_nan
    if missing.any() or extra.any():
        return (f"{name}: finite at {int(missing.sum())} positions a NaN reaches through what their rows see, "
                f"NaN at {int(extra.sum())} where torch's math attention is finite")
    return None


def engine_run(case: Case, leaves=None, dout=None):
    """Forward through the op (with its registered autograd) and backward with dout.

    Returns (out, lse, rng_state_out, max_logit, grads by leaf name)."""
    leaves = case.leaves if leaves is None else leaves
    for t in leaves.values():
        t.grad = None
    out, lse, rng_out, ml = run_op(case, leaves)
    out.backward(case.dout if dout is None else dout)
    return out, lse, rng_out, ml, {n: t.grad for n, t in leaves.items()}


def device_run(case: Case, device=None):
    """``engine_run`` of the case on ``device`` (default DEVICE): on a device copy of a CPU case,
    with the results (out, lse, rng_state_out, max_logit, grads) brought back to the CPU. On the
    device the case is on already it is ``engine_run(case)`` itself."""
    dcase = to_device(case, device)
    if dcase is case:
        return engine_run(case)
    res = engine_run(dcase)
    if dcase.dout.is_cuda:
        torch.cuda.synchronize(dcase.dout.device)  # an asynchronous error shows up in this test
    return to_host(res)


def _rows_to_lse_layout(x, q_format):
    """Per-row values in q's format without the head dim ([b,s,h], [s,b,h], [t,h]) -> lse layout."""
    if q_format == "thd":
        return x.transpose(0, 1)
    if q_format == "sbhd":
        return x.permute(1, 2, 0)
    return x.permute(0, 2, 1)


def output_rounding_term(case: Case, ref, leaves, dout, dtype):
    """The gradient change caused by backward's D = rowsum(dO * O) reading O rounded to ``dtype``.

    Flash backward (ours, FlashAttention's, cuDNN's) computes D from the stored,
    rounded output instead of the exact one. With D + delta in place of D,
    dS_ij changes by -P_ij * delta_i = d(-delta_i * lse_i)/ds_ij, so the exact
    effect on every gradient is the gradient of -sum(delta * lse) with delta
    held constant, computed here in float64. PyTorch's math attention has no
    such term; in rows that see a single key (P = 1) its own error is zero, so
    without this term the rule would demand an exactness no flash backward has.
    """
    o = ref.out.detach()
    delta = (dout.to(o.dtype) * (o.to(dtype).to(o.dtype) - o)).sum(-1)
    delta = _rows_to_lse_layout(delta, case.args.q_format)
    names = list(leaves)
    grads = torch.autograd.grad(-(delta * ref.lse_graph).sum(), [leaves[n] for n in names],
                                retain_graph=True, allow_unused=True)
    return {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(names, grads)}


def reference_run(case: Case, compute_dtype, dout=None, rounding_dtype=None):
    """The reference on fresh leaves: float64 leaves for the ground truth, the case's own dtypes otherwise.

    With ``rounding_dtype`` it also returns ``output_rounding_term`` for that dtype (else None)."""
    leaves = case.clone_leaves(torch.float64 if compute_dtype == torch.float64 else None)
    ref = run_ref(case, leaves, compute_dtype)
    d = case.dout if dout is None else dout
    term = output_rounding_term(case, ref, leaves, d, rounding_dtype) if rounding_dtype is not None else None
    ref.out.backward(d.to(ref.out.dtype))
    grads = {n: t.grad for n, t in leaves.items()}
    return (ref, grads, term) if rounding_dtype is not None else (ref, grads)


def check_case(case: Case, device=None):
    """The whole comparison of one case: forward outputs and every gradient, plus the zero/NaN rules.

    The engine runs on ``device`` (default DEVICE, see ``device_run``), the reference on the CPU."""
    out, lse, rng_out, ml, grads = device_run(case, device)
    dt = case.dtype
    r64, g64, rounding = reference_run(case, torch.float64, rounding_dtype=dt)
    rlp, glp = reference_run(case, case.dtype)
    msgs = []
    # softmax_lse, max_logit and d_softmax_offset are fp32 by contract: for fp64 inputs, fp32's rule.
    fp32_dt = torch.float32 if dt == torch.float64 else dt
    msgs.append(tol_check("out", out, r64.out, rlp.out, dt))
    # lse: fp32, defined on valid rows that see at least one key (sink included in the normaliser).
    if tuple(lse.shape) != tuple(r64.lse.shape) or lse.dtype != torch.float32:
        msgs.append(f"softmax_lse: got {lse.dtype} {tuple(lse.shape)}, want float32 {tuple(r64.lse.shape)}")
    else:
        msgs.append(tol_check("softmax_lse", lse, r64.lse.nan_to_num(0.0), rlp.lse.nan_to_num(0.0), fp32_dt,
                              where=r64.lse_valid))
    if case.args.return_max_logit:
        # A head may see no logit at all (every sequence empty for it): its max_logit is not defined.
        msgs.append(tol_check("max_logit", ml, r64.max_logit, rlp.max_logit, fp32_dt,
                              where=torch.isfinite(r64.max_logit)))
    elif ml.numel() != 0:
        msgs.append(f"max_logit: expected an empty tensor without return_max_logit, got {tuple(ml.shape)}")
    want_rng = case.extra["rng_state"] if case.args.dropout_p > 0 else torch.zeros(2, dtype=torch.int64)
    if rng_out.dtype != torch.int64 or not torch.equal(rng_out.cpu(), want_rng.cpu()):
        msgs.append(f"rng_state_out: got {rng_out.tolist()}, want {want_rng.tolist()}")
    for name in case.leaves:
        g = grads[name]
        if g is None:
            msgs.append(f"d{name}: no gradient")
            continue
        msgs.append(tol_check(f"d{name}", g, g64[name], glp[name], fp32_dt if name == "softmax_offset" else dt,
                              algo_term=rounding[name]))
    # Padded query rows / gaps: exact zeros in out and dq; padded keys: exact zeros in dk, dv.
    q_pad = ~case.q_side.valid()
    kv_pad = ~case.kv_side.valid()
    dq, dk, dv = case.make_qkv(grads) if all(grads[n] is not None for n in case.leaves) else (None,) * 3
    for name, t, pad in (("out", out, q_pad), ("dq", dq, q_pad), ("dk", dk, kv_pad), ("dv", dv, kv_pad)):
        if t is not None and pad.any() and not torch.equal(t.detach()[pad], torch.zeros_like(t.detach()[pad])):
            msgs.append(f"{name}: padded positions are not exactly zero "
                        f"(max |value| {t.detach()[pad].abs().max().item():.3e})")
    assert_matches_reference(msgs)


# ---------------------------------------------------------------------------
# The same configs through DotProductAttention (TransformerEngine's API)

DPA_LAYOUTS = tuple(l for l in LAYOUTS if LAYOUTS[l][0] == LAYOUTS[l][1])  # DPA takes one qkv_format


def dpa_module(case: Case):
    """A DotProductAttention built for the case (learnable offset set to the case's values), on the
    case's device."""
    from fusedattn import DotProductAttention

    cfg, a = case.cfg, case.args
    mod = DotProductAttention(
        cfg.heads[0], cfg.dims if cfg.dims[0] != cfg.dims[1] else cfg.dims[0], num_gqa_groups=cfg.heads[1],
        attention_dropout=cfg.dropout, qkv_format=a.q_format, attn_mask_type=cfg.mask,
        window_size=(a.window_left, a.window_right), bottom_right_diagonal=cfg.brd, softmax_scale=a.scale,
        softmax_type=cfg.softmax, return_max_logit=cfg.max_logit)
    mod = module_on_device(mod, case.dout.device)
    if cfg.softmax == "learnable":
        with torch.no_grad():
            mod.softmax_offset.copy_(case.leaves["softmax_offset"])
    return mod


def dpa_kwargs(case: Case, leaves=None):
    """forward() keyword arguments of DotProductAttention for the case, from ``leaves``."""
    assert case.cfg.layout in DPA_LAYOUTS, case.cfg.layout
    leaves = case.leaves if leaves is None else leaves
    cfg, e = case.cfg, case.extra
    kind = LAYOUTS[cfg.layout][2]
    kw = {}
    if kind == "qkv":
        kw["qkv_layer"] = leaves["qkv"]
        kw["qkv_interleave_dim"] = -3 if cfg.layout.endswith("3hd") else -2
    elif kind == "kv":
        kw["query_layer"] = leaves["q"]
        kw["kv_layer"] = leaves["kv"]
        kw["qkv_interleave_dim"] = -3 if cfg.layout.endswith("2hd") else -2
    else:
        q, k, v = case.make_qkv(leaves)
        kw.update(query_layer=q, key_layer=k, value_layer=v)
    if e["attn_mask"] is not None:
        kw["attention_mask"] = e["attn_mask"]
    for n in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        if e[n] is not None:
            kw[n] = e[n]
    if case.args.max_seqlen_q is not None:
        kw["max_seqlen_q"] = case.args.max_seqlen_q
        kw["max_seqlen_kv"] = case.args.max_seqlen_kv
    if "bias" in leaves:
        kw["core_attention_bias_type"] = "post_scale_bias"
        kw["core_attention_bias"] = leaves["bias"]
    elif e["alibi_slopes"] is not None:
        kw["core_attention_bias_type"] = "alibi"
        kw["alibi_slopes"] = e["alibi_slopes"]
    return kw


@pytest.fixture(scope="module")
def require_cuda_kernel():
    """For tests/gpu: skip a module when fusedattn was built without the CUDA engine."""
    import fusedattn._ops  # noqa: F401  (loads the extension)

    if not (torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key("fusedattn::fwd", "CUDA")):
        pytest.skip("fusedattn was built without the CUDA engine")


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck_tests(dtype, device=None) -> tuple:
    """opcheck's test_utils for a forward of this dtype. Its AOTAutograd test compares two backward
    runs at dtype tolerance with atol 1e-5, so it needs bitwise-stable gradients: the CPU engine and
    the CUDA tensor-core backward under deterministic_algorithms give them; the CUDA SIMT engine
    (float32/float64) sums dQ and dbias with atomics in any order and has no deterministic mode, so
    there the test is left out (tests/test_compile.py still compares compiled and eager gradients)."""
    if _device_of(device).type == "cuda" and dtype in (torch.float32, torch.float64):
        return OPCHECK_TESTS[:3]
    return OPCHECK_TESTS


@pytest.fixture
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True, warn_only=True) for one test, restored after.

    opcheck's AOTAutograd test runs the backward twice and compares the gradients at dtype
    tolerance with atol 1e-5: the CUDA tensor-core backward sums dQ with atomics in
    arbitrary order unless asked to be deterministic (the CPU engine always is).
    warn_only keeps configurations without a deterministic CUDA path (the SIMT engine)
    running; tests/gpu/test_cuda_contract.py checks that strict mode raises for them."""
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
