"""Checks of the scalar settings the Python entry points take.

Each names the argument as the caller wrote it (``softmax_scale`` for DotProductAttention,
``scale`` for the SDPA function, ...), so a bad value is reported where it was given and not
as the operator's argument, or not at all (a setting the operator never sees, such as a
module's dropout in eval mode). The operator's core checks its own arguments again for direct
callers.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

_INT64_MAX = 2**63 - 1
_REAL = (int, float, torch.SymInt, torch.SymFloat)


def real(name: str, value) -> float:
    """A real number (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, _REAL):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return value


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def string(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {value!r}")
    return value


def dropout(name: str, p) -> float:
    """A dropout probability in [0, 1)."""
    real(name, p)
    if not 0.0 <= p < 1.0:  # NaN fails too
        raise ValueError(f"{name} must be in [0, 1); got {p!r}")
    return float(p)


def softcap(name: str, value) -> float:
    """Logit softcapping: 0 (off) or a finite positive cap (the operator also checks its range)."""
    real(name, value)
    if not 0.0 <= value < math.inf:  # NaN fails too
        raise ValueError(f"{name} must be 0 (off) or a finite positive number; got {value!r}")
    return float(value)


def window_size(value) -> Optional[Tuple[int, int]]:
    """None, or (left, right): two ints >= -1 (-1 = unbounded) that fit the operator's int64."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {value!r}")
    if len(value) != 2:
        raise ValueError(f"window_size must have 2 elements (left, right), got {len(value)}: {tuple(value)!r}")
    for w in value:
        if isinstance(w, bool) or not isinstance(w, (int, torch.SymInt)):
            raise TypeError(f"window_size must hold ints, got {tuple(value)!r}")
        if not -1 <= w <= _INT64_MAX:
            raise ValueError(f"window_size values must be -1 (unbounded) or in [0, 2**63), got {tuple(value)!r}")
    return int(value[0]), int(value[1])


def finite(name: str, value) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value!r}")
    return value
