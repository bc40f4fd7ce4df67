"""fusedattn: fused multi-head attention for PyTorch, as real torch operators.

``DotProductAttention`` is a drop-in for TransformerEngine's module of that name;
``scaled_dot_product_attention`` follows ``torch.nn.functional``'s contract.
Both trace under ``torch.compile(fullgraph=True)``; ``config.force_eager``
makes them run eagerly instead (see docs/api.md).
"""

__version__ = "0.1.0"

from . import config
from ._ops import FwdArgs
from .attention import DotProductAttention
from .functional import dot_product_attention, scaled_dot_product_attention

__all__ = [
    "DotProductAttention",
    "FwdArgs",
    "config",
    "dot_product_attention",
    "scaled_dot_product_attention",
    "__version__",
]
