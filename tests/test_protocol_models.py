"""The CPU models of the Hopper kernels' protocols and schedules (tools/hopper/*_model.py), on
fewer seeds and shapes than their standalone runs: the barrier / ring protocols of the forward
kernels under random interleavings (each must also catch its seeded bugs, so a model that checks
nothing fails here), the d = 256 backward's index math against float64, the deterministic
backward's turn order, the causal backward's block order and the lazy-max softmax's error."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

MODELS = Path(__file__).resolve().parents[1] / "tools" / "hopper"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, MODELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


v2 = load("v2_protocol_model")
v3 = load("v3_protocol_model")
w3 = load("w3_protocol_model")
d256 = load("bwd_d256_model")
det = load("bwd_det_model")
order = load("bwd_order_model")
lazy = load("lazy_max_model")


def test_v2_protocol():
    assert v2.randomised_runs(seeds=4) == 3 * 2 * 8 * 4
    assert v2.seeded_bug_caught() is not None, "k_release_before_redo not caught"


def test_v3_schedule_and_protocol():
    assert v3.check_schedule() > 0
    runs, _, multi = v3.randomised_runs(seeds=1)
    assert runs == 3 * 2 * 2 * 2 * len(v3.tile_sets()) and multi > 0


@pytest.mark.parametrize("bug", sorted(v3.SEEDED_BUGS))
def test_v3_catches_seeded_bug(bug):
    assert v3.seeded_bug(bug) is not None, v3.SEEDED_BUGS[bug]


def test_w3_protocol():
    assert w3.one_tile_runs(seeds=1) > 0
    assert w3.persistent_runs(seeds=4) == 3 * 2 * 3 * 4


@pytest.mark.parametrize("bug,pp", w3.SEEDED_BUGS)
def test_w3_catches_seeded_bug(bug, pp):
    assert w3.seeded_bug(bug, pp) is not None


@pytest.mark.parametrize("tma", [True, False], ids=["tma_reduce", "atomic"])
def test_d256_backward_index_math(tma):
    for i in (0, 2, 5, 6):  # s = 1, 63 (GQA 2/2), 65 (GQA 2/1), 130 (two batches); all causal but s = 1
        assert d256.check(*d256.CASES[i], seed=100 + i, tma=tma), d256.CASES[i]


@pytest.mark.parametrize("mutation", sorted(d256.MUTATIONS))
def test_d256_catches_wrong_index(mutation):
    assert d256.mutation_caught(mutation), d256.MUTATIONS[mutation]


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_backward_turns_wait_only_on_earlier_ctas(d, causal):
    # simulate() asserts that no CTA's turn waits on a CTA dispatched after it (a deadlock).
    for s in (512, 2048):
        for dq_order in (None, "desc") + (("asc",) if causal else ()):
            t, wait = det.simulate(d, s, causal, dq_order, noise=0.03, seed=0)
            assert math.isfinite(t) and t > 0 and wait >= 0


@pytest.mark.parametrize("chunk", [1, 2, 4, 8])
def test_causal_backward_block_order_is_a_permutation(chunk):
    for n_kt, groups in ((1, 1), (4, 3), (8, 16), (16, 13), (128, 8)):
        blocks = order.order(n_kt, groups, chunk)
        assert sorted(blocks) == [(n, g) for n in range(n_kt) for g in range(groups)], (n_kt, groups)


@pytest.mark.parametrize("profile,s,causal", [("rise_fast", 1024, False), ("rise_fast", 1024, True),
                                               ("jump", 2048, True)])
def test_lazy_max_softmax_error(profile, s, causal):
    o_err, lse_frac, slow, tiles = lazy.errors(profile, s, 128, torch.bfloat16, causal, bn=128)
    assert o_err <= 1e-2 and lse_frac <= 1.0
    assert slow > 0  # the slow path (kept-max softmax) ran
    if profile == "jump":
        assert slow < tiles  # and so did the steady one
