"""The one eager-fallback gate of fusedattn's Python entry points.

Like TransformerEngine's ``no_torch_dynamo(when=...)``: a predicate looks at a
call's arguments and returns the reason the call cannot be traced, or None.
Only while torch.compile traces, and only for a reason, the call goes through a
``torch.compiler.disable``-d runner: Dynamo graph-breaks there (with
``fullgraph=True`` compilation fails and the error names the reason) and the
runner warns and runs the function eagerly.

Every reason a predicate can return is declared up front and gets its own
disabled runner, which is what lets the ``fullgraph=True`` error carry the
reason. The runners are made on the first call that needs one, not at import:
``torch.compiler.disable`` imports torch._dynamo, which would add seconds to
``import fusedattn``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, Dict, Iterable, Optional

import torch

from . import config

__all__ = ["eager_fallback_gate", "FORCE_EAGER_REASON", "GATED_REASONS", "needs_eager"]

FORCE_EAGER_REASON = "fusedattn.config.force_eager is set"

#: Every reason the predicates below can return. docs/api.md lists them.
GATED_REASONS = (FORCE_EAGER_REASON,)

WARNING_PREFIX = "fusedattn: falling back to eager execution under torch.compile: "


def needs_eager(call: Dict[str, Any]) -> Optional[str]:
    """Why a DotProductAttention / SDPA call must run outside the graph, or None.

    Today the only reason is the documented switch; every attention
    configuration the operators accept traces.
    """
    del call  # no argument-dependent reason yet
    if config.force_eager:
        return FORCE_EAGER_REASON
    return None


def _disable(fn, reason: str):
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:  # torch without disable(reason=...): the warning still names it
        return torch.compiler.disable(fn)


def _graph_break(msg: str) -> None:
    import torch._dynamo  # loaded already: only called while Dynamo traces

    try:
        torch._dynamo.graph_break(msg=msg)
    except TypeError:  # torch without graph_break(msg=...)
        torch._dynamo.graph_break()


def eager_fallback_gate(when: Callable[[Dict[str, Any]], Optional[str]],
                        reasons: Iterable[str] = GATED_REASONS):
    """Decorate ``fn`` so that calls for which ``when`` gives a reason run eagerly.

    ``when`` receives ``{parameter name: argument}`` for the arguments the call
    passed (positional and keyword; parameters left out are absent, so read
    them with ``.get()``). ``fn`` must not take ``*args``, since positional
    arguments are matched to names by position.
    """

    def decorator(fn):
        params = inspect.signature(fn).parameters
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
            raise TypeError(f"eager_fallback_gate does not support *args, which {fn.__name__} takes")
        names = list(params)

        def make_runner(reason: str):
            # The warning lives inside the disabled function: warnings.warn is
            # itself something Dynamo may not trace, which would hide the real break.
            def report_and_run(*args, **kwargs):
                warnings.warn(WARNING_PREFIX + reason, stacklevel=3)
                return fn(*args, **kwargs)

            report_and_run.__name__ = f"{fn.__name__}_eager_fallback"
            report_and_run.__qualname__ = f"{fn.__qualname__}_eager_fallback"
            return _disable(report_and_run, WARNING_PREFIX + reason)

        declared = frozenset(reasons)
        runners: Dict[Optional[str], Callable] = {}  # reason (None: undeclared) -> disabled runner

        def report_unknown_and_run(reason, *args, **kwargs):
            warnings.warn(WARNING_PREFIX + reason, stacklevel=3)
            return fn(*args, **kwargs)

        def runner_for(reason):
            key = reason if reason in declared else None
            runner = runners.get(key)
            if runner is None:
                if torch.compiler.is_compiling():
                    # Dynamo cannot trace torch.compiler.disable itself: break the graph here, naming
                    # the reason (with fullgraph=True compilation fails with it); the runner is then
                    # made outside the graph.
                    _graph_break(WARNING_PREFIX + reason)
                runner = runners[key] = (make_runner(reason) if key is not None else
                                         _disable(report_unknown_and_run, WARNING_PREFIX + "(undeclared reason)"))
            return runner

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not torch.compiler.is_compiling():
                return fn(*args, **kwargs)
            call = dict(zip(names, args))
            call.update(kwargs)
            reason = when(call)
            if reason is None:
                return fn(*args, **kwargs)
            if reason not in declared:
                return runner_for(reason)(reason, *args, **kwargs)
            return runner_for(reason)(*args, **kwargs)

        return wrapper

    return decorator
