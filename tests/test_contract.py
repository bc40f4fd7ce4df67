"""The operators' contract cannot drift: csrc/binding/op_spec.h writes the argument lists once (the
schemas, the C++ signatures and their unpacking come from it); these tests hold the Python side to the
registered schemas: FwdArgs.op_args() puts every setting at its schema position, the fakes take exactly
the schema's arguments, and the C++ side reads each setting as the one the schema names. The mask types
and their aliases Python routes by are the core's table."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch

from fusedattn import _ops
from fusedattn._ops import BWD_ARGUMENTS, FWD_ARGUMENTS, OPTIONAL_INPUTS, SETTINGS, FwdArgs
from fusedattn.attention import MASK_ALIASES, MASK_TYPES

# Every setting with a value no default has, and its value as the op takes it.
DISTINCT = dict(q_format="sbhd", kv_format="thd", mask_type="padding_causal", window_left=7, window_right=0,
                bottom_right_diagonal=True, softmax_type="off-by-one", scale=0.125, softcap=30.0, dropout_p=0.25,
                max_seqlen_q=11, max_seqlen_kv=13)
AS_OP = dict(DISTINCT, bottom_right_diagonal=1)
SCHEMA_PY_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def _schema_args(op):
    return {a.name: a for a in op.default._schema.arguments}


def test_argument_lists():
    assert FWD_ARGUMENTS == ("q", "k", "v", *OPTIONAL_INPUTS, "rng_state", *SETTINGS, "return_max_logit",
                             "page_table")
    assert BWD_ARGUMENTS == ("dout", "q", "k", "v", "out", "softmax_lse", "rng_state", *OPTIONAL_INPUTS, *SETTINGS,
                             "need_dbias", "deterministic")
    # Every FwdArgs field is a setting of the schema (return_max_logit is the forward's own flag).
    fields = [f.name for f in FwdArgs.__dataclass_fields__.values()]
    assert sorted(fields) == sorted((*SETTINGS, "return_max_logit"))


def test_op_args_follow_the_schema():
    args = FwdArgs(**DISTINCT)
    values = args.op_args()
    assert len(values) == len(SETTINGS)
    assert dict(zip(SETTINGS, values)) == AS_OP
    schema = _schema_args(torch.ops.fusedattn.fwd)
    for name, value in zip(SETTINGS, values):
        want = SCHEMA_PY_TYPES.get(str(schema[name].type), int)  # SymInt: int
        assert type(value) is want, (name, value, schema[name].type)
    # The inverse, as autograd's setup_context uses it.
    assert FwdArgs.from_op_values(dict(zip(SETTINGS, values)), return_max_logit=True) == args.replace(
        return_max_logit=True)


@pytest.mark.parametrize("fake,op", [(_ops._fwd_fake, torch.ops.fusedattn.fwd),
                                     (_ops._bwd_fake, torch.ops.fusedattn.bwd)], ids=["fwd", "bwd"])
def test_fakes_take_the_schema_arguments(fake, op):
    params = inspect.signature(fake).parameters
    assert tuple(params) == tuple(a.name for a in op.default._schema.arguments)
    for a in op.default._schema.arguments:
        has_default = params[a.name].default is not inspect.Parameter.empty
        assert has_default == a.has_default_value(), a.name


# One bad setting at a time: the error names the setting the schema puts there, so the C++
# unpacking reads each position as the schema names it.
BAD_SETTINGS = [
    ("q_format", "bshdx", "qkv_format"),
    ("mask_type", "causal_top", "attn_mask_type"),
    ("window_left", -3, "got (-3, -1)"),
    ("window_right", -3, "got (-1, -3)"),
    ("softmax_type", "softer", "softmax_type"),
    ("scale", math.inf, "softmax_scale"),
    ("softcap", -1.0, "softcap"),
    ("softcap", math.nan, "softcap"),
    ("dropout_p", 1.5, "attention_dropout"),
    ("max_seqlen_q", 0, "max_seqlen_q/max_seqlen_kv must be positive; got 0"),
]


@pytest.mark.parametrize("name,value,message", BAD_SETTINGS, ids=[f"{n}={v}" for n, v, _ in BAD_SETTINGS])
def test_cpp_reads_each_setting_by_its_schema_name(name, value, message):
    q = torch.randn(1, 4, 2, 8)
    values = dict(zip(SETTINGS, FwdArgs(scale=0.5).op_args()))
    values[name] = value
    # The raw operators raise RuntimeError (a stable-ABI kernel's exception); the message's prefix is
    # the kind the Python wrappers raise (test_errors.py checks the translation).
    with pytest.raises(RuntimeError) as e:
        torch.ops.fusedattn.fwd(q, q, q, *([None] * len(OPTIONAL_INPUTS)), None, *values.values(), False)
    assert str(e.value).startswith("fusedattn: invalid argument: ") and message in str(e.value)
    rng = torch.zeros(2, dtype=torch.int64)
    lse = torch.zeros(1, 2, 4)
    with pytest.raises(RuntimeError) as e:
        torch.ops.fusedattn.bwd(q, q, q, q, q, lse, rng, *([None] * len(OPTIONAL_INPUTS)), *values.values(), False, 0)
    assert str(e.value).startswith("fusedattn: invalid argument: ") and message in str(e.value)


def test_mask_types_are_the_cores():
    """attention.MASK_TYPES and MASK_ALIASES are csrc/core/src/types.cc's table: the names the core
    lists when it rejects one, in its order, and each alias computing what the name it stands for
    computes (on a problem where every mask type gives another output)."""
    q = torch.randn(2, 5, 2, 8, dtype=torch.float64)
    kv = torch.randn(2, 7, 2, 8, dtype=torch.float64)  # s_q != s_kv: the two diagonals differ
    lengths = dict(cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int32),
                   cu_seqlens_kv=torch.tensor([0, 6, 10], dtype=torch.int32))
    with pytest.raises(ValueError) as e:
        _ops.attention(q, kv, kv, FwdArgs(scale=0.3, mask_type="not_a_mask"))
    listed = re.search(r"attn_mask_type must be one of (.*); got 'not_a_mask'", str(e.value))
    assert listed is not None, str(e.value)
    assert tuple(re.findall(r"'([^']*)'", listed.group(1))) == MASK_TYPES + tuple(MASK_ALIASES)

    def out(mask_type):
        kw = lengths if "padding" in MASK_ALIASES.get(mask_type, mask_type) else {}
        if mask_type == "arbitrary":
            kw = dict(attn_mask=torch.rand(2, 1, 5, 7) < 0.3)
        return _ops.attention(q, kv, kv, FwdArgs(scale=0.3, mask_type=mask_type), **kw)[0]

    outs = {m: out(m) for m in MASK_TYPES}
    for a in MASK_TYPES:
        for b in MASK_TYPES:
            assert a == b or not torch.equal(outs[a], outs[b]), (a, b)
    for alias, name in MASK_ALIASES.items():
        assert torch.equal(out(alias), outs[name]), alias
