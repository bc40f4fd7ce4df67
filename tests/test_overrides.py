"""The FUSEDATTN_* environment variables (csrc/core/include/fusedattn/overrides.h): a malformed value of
any of them makes every operator call raise a ValueError naming the variable and its accepted values,
on any device (the variables are parsed once per process, so each case runs in a child process)."""

from __future__ import annotations

import os
import subprocess
import sys

BAD_VALUES = {
    "FUSEDATTN_CUDA_ENGINE": ("tc", "simt, sm80"),
    "FUSEDATTN_HOPPER_FWD": ("persistant", "three_consumer_persistent"),
    "FUSEDATTN_HOPPER_BWD": ("yes", "on, off"),
    "FUSEDATTN_HOPPER_CAUSAL_CHUNK": ("two", "an integer 0-65535"),
    "FUSEDATTN_DECODE_SPLITS": ("129", "an integer 0-128"),
    "FUSEDATTN_DECODE_PDL": ("on", "2, 1, 0"),
}

_CHILD = """
import sys, torch
from fusedattn._ops import FwdArgs, attention
q = torch.randn(1, 4, 2, 8)
try:
    attention(q, q, q, FwdArgs(scale=0.5, mask_type="causal"))
except ValueError as e:
    print(e)
    sys.exit(0)
print("no error")
sys.exit(1)
"""


def _run_child(env_updates):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEDATTN_") or k == "FUSEDATTN_TEST_DEVICE"}
    env.update(env_updates)
    return subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_bad_value_of_each_variable_raises():
    procs = {var: _run_child({var: value}) for var, (value, _) in BAD_VALUES.items()}
    for var, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        value, accepted = BAD_VALUES[var]
        assert proc.returncode == 0, f"{var}={value}: {out}{err[-2000:]}"
        assert f"{var}={value} is not valid" in out and accepted in out, out


def test_accepted_values_run():
    """Accepted values run (FUSEDATTN_HOPPER_BWD=on once parsed as 0, i.e. off; that it now means on,
    and every spelling of every variable, is checked by tests/cpp/test_overrides.cc)."""
    cases = [{"FUSEDATTN_HOPPER_BWD": "on"}]
    cases += [{"FUSEDATTN_CUDA_ENGINE": "auto", "FUSEDATTN_HOPPER_BWD": "", "FUSEDATTN_DECODE_SPLITS": "128", "FUSEDATTN_DECODE_PDL": "0",
               "FUSEDATTN_HOPPER_FWD": "three_consumer", "FUSEDATTN_HOPPER_CAUSAL_CHUNK": "auto"}]
    procs = [(env, _run_child(env)) for env in cases]
    for env, proc in procs:
        out, err = proc.communicate(timeout=300)
        assert "no error" in out, f"{env}: {out}{err[-2000:]}"
