"""fusedattn: fused multi-head attention for PyTorch, as real torch operators.

``DotProductAttention`` is a drop-in for TransformerEngine's module of that name;
``scaled_dot_product_attention`` follows ``torch.nn.functional``'s contract;
``InferenceParams`` (KV caching for decoding) TransformerEngine's, see docs/kv-cache.md;
``flash_attn_func`` and its siblings flash-attn's API, ``varlen_attn`` torch's;
``fusedattn.integrations`` plugs fusedattn into Hugging Face transformers and into torch's
SDPA (see docs/integrations.md).
All of them trace under ``torch.compile(fullgraph=True)``; ``config.force_eager``
makes them run eagerly instead (see docs/api.md).
"""

__version__ = "0.1.0"

from . import config
from ._ops import FwdArgs
from .attention import DotProductAttention
from . import flash_attn_interface
from .flash_attn_interface import *  # noqa: F401,F403  (flash-attn's names and varlen_attn: its __all__)
from .functional import dot_product_attention, scaled_dot_product_attention
from .inference import InferenceParams

__all__ = [
    "DotProductAttention",
    "FwdArgs",
    "InferenceParams",
    "config",
    "dot_product_attention",
    "scaled_dot_product_attention",
    *flash_attn_interface.__all__,
    "__version__",
]
