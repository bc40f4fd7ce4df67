"""KV caching for inference: ``InferenceParams``, a drop-in for TransformerEngine's.

Workflow (as in TransformerEngine)::

    params = InferenceParams(max_batch_size, max_sequence_length, num_heads_kv, head_dim_k, dtype,
                             is_paged=True, page_size=16)
    for layer in range(1, num_layers + 1):
        params.allocate_memory(layer)
    for step in ...:
        params.pre_step(OrderedDict(seq_id -> step_len))   # host bookkeeping, outside the compiled step
        out = model(x, inference_params=params)            # every DotProductAttention(layer_number=n)
                                                           # appends its k/v and attends over the cache

``pre_step`` is the only place that touches the host: it validates the step,
updates the bookkeeping (sequences of different lengths; sequences missing
from ``step_dict`` leave and free their pages, new ids join; pages come from a
free list) and copies the per-step metadata (cache lengths, cu_seqlens, page
table) into device buffers that are allocated once, with ``copy_``: the
addresses never change, so a compiled, CUDA-graphed decode step reads the new
values on replay. Caches and buffers are ``torch._dynamo.mark_static_address``-ed.

``DotProductAttention`` hands each layer's step to the ``fwd_kvcache`` operator
(``kv_step`` gives it the layer's caches and the step's buffers): one operator
that appends the new keys/values to the caches in place, inside the compiled
graph, and attends over them (on the GPU's decode engine, in one launch).
``step`` (TransformerEngine's: ``copy_to_kv_cache``, then attention separately)
remains for cache managers of the caller's own. Neither reads host bookkeeping
that changes from one decode step to the next, so a compiled decode step does
not recompile.

Both cache kinds are one page pool read through a page table: a non-paged
cache ``[max_batch_size, max_sequence_length, h_kv, d]`` is the pool whose
pages are whole sequences (page_size = max_sequence_length) and whose page
table is each sequence's row ``[b, 1]``, so sequences leaving and joining move
no cache data. Bad use raises before anything is mutated (see docs/kv-cache.md).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Hashable, List, Mapping, NamedTuple, Optional, Tuple

import torch

from . import _checks, _ops

__all__ = [
    "InferenceParams",
    "KVStep",
    "KVCacheFullError",
    "KVCacheManager",
    "NonPagedKVCacheManager",
    "PagedKVCacheManager",
]

QKV_FORMATS = ("bshd", "sbhd", "thd")


class KVStep(NamedTuple):
    """A layer's step for ``fusedattn::fwd_kvcache`` (``InferenceParams.kv_step``): the layer's caches
    (page pools), the batch's page table and cache lengths before the step, and the step's
    cumulative token counts (the queries' and the new keys'), all views of fixed buffers."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_table: torch.Tensor
    cache_seqlens: torch.Tensor
    cu_seqlens_q: torch.Tensor


def _same_tokens(query_layer: torch.Tensor, key_layer: torch.Tensor, value_layer: torch.Tensor, fmt: str) -> bool:
    """Whether the new keys/values sit at the queries' tokens (fwd_kvcache's contract)."""
    n = 1 if fmt == "thd" else 2
    return (query_layer.dim() == key_layer.dim() == value_layer.dim()
            and query_layer.shape[:n] == key_layer.shape[:n] == value_layer.shape[:n])


class KVCacheFullError(RuntimeError):
    """The page pool has too few free pages for a step (TransformerEngine raises
    RuntimeError("KV cache is full!") in the same place)."""


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _static_buffer(shape, device) -> torch.Tensor:
    t = torch.zeros(shape, dtype=torch.int32, device=device)
    torch._dynamo.mark_static_address(t)
    return t


def _to_device(buf: torch.Tensor, values: List[int]) -> None:
    """``buf[:] = values`` (padded with zeros) through copy_: same address every step."""
    host = torch.zeros(buf.numel(), dtype=torch.int32)
    if values:
        host[: len(values)] = torch.tensor(values, dtype=torch.int32)
    buf.view(-1).copy_(host)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Base class of the cache managers (TransformerEngine's interface).

    A manager keeps ``cache[layer_number] = (k_cache, v_cache)`` and
    ``sequences`` (seq_id -> cache length after the current step). ``pre_step``
    updates the bookkeeping, ``step`` writes one layer's new tokens.
    """

    def __init__(self):
        self.cache: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.sequences: "OrderedDict[Hashable, int]" = OrderedDict()

    def reset(self):
        self.sequences = OrderedDict()

    def allocate_memory(self, layer_number: int):
        self.cache[layer_number] = (None, None)

    def pre_step(self, step_dict: "OrderedDict[Hashable, int]"):
        return self.sequences

    def step(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor,
             cu_new_seqlens: torch.Tensor, cu_cached_seqlens: torch.Tensor, qkv_format: str):
        return self.cache[layer_number]


class _PagePoolManager(KVCacheManager):
    """A page pool ``[num_pages, page_size, h_kv, d]`` per layer, read through a page table.

    Host state: ``sequences`` (in batch order), ``pages`` (seq_id -> page ids)
    and ``free_pages``. Device state, allocated once: ``page_table`` int32
    ``[max_batch_size, max_pages_per_seq]`` and ``cache_seqlens`` int32
    ``[max_batch_size]`` (lengths before the step), rows in batch order.
    """

    def __init__(self, *, num_pages: int, page_size: int, max_batch_size: int, max_seqlen: int,
                 num_heads: int, head_dim_k: int, head_dim_v: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.total_num_pages = num_pages
        self.page_size = page_size
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.max_pages_per_seq = _cdiv(max_seqlen, page_size)
        self.num_heads = num_heads
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_v
        self.dtype = dtype
        self.device = torch.device(device)
        self.pages: Dict[Hashable, List[int]] = {}
        self.free_pages: List[int] = list(range(num_pages))
        self.batch_size = 0
        self.page_table = _static_buffer((max_batch_size, self.max_pages_per_seq), self.device)
        self.cache_seqlens = _static_buffer((max_batch_size,), self.device)

    # -- memory ---------------------------------------------------------------

    def allocate_memory(self, layer_number: int):
        shape = (self.total_num_pages, self.page_size, self.num_heads)
        k_cache = torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=self.device)
        v_cache = torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=self.device)
        # Mutated in place by the compiled step: CUDA graphs need fixed addresses.
        torch._dynamo.mark_static_address(k_cache)
        torch._dynamo.mark_static_address(v_cache)
        self.cache[layer_number] = (k_cache, v_cache)

    def reset(self):
        self.sequences = OrderedDict()
        self.pages = {}
        self.free_pages = list(range(self.total_num_pages))
        self.batch_size = 0
        self.page_table.zero_()
        self.cache_seqlens.zero_()

    # -- bookkeeping ----------------------------------------------------------

    def plan(self, step_dict: "OrderedDict[Hashable, int]"):
        """The bookkeeping after ``step_dict``, computed without mutating anything.

        Raises ValueError for a step past max_sequence_length and
        KVCacheFullError when the free pages (after the leaving sequences
        return theirs) do not cover the step.
        """
        free = list(self.free_pages)
        for seq in self.sequences:
            if seq not in step_dict:  # finished: its pages go back to the pool
                free.extend(self.pages[seq])
        sequences: "OrderedDict[Hashable, int]" = OrderedDict()
        pre: List[int] = []
        need: Dict[Hashable, int] = {}
        for seq, n in step_dict.items():
            old = self.sequences.get(seq, 0)
            new = old + n
            if new > self.max_seqlen:
                what = f"sequence {seq!r} (cached {old} tokens)" if old else f"new sequence {seq!r}"
                raise ValueError(
                    f"{what} would reach {new} tokens with a step of {n}, past max_sequence_length="
                    f"{self.max_seqlen}")
            sequences[seq] = new
            pre.append(old)
            need[seq] = _cdiv(new, self.page_size) - len(self.pages.get(seq, ()))
        wanted = sum(need.values())
        if wanted > len(free):
            raise KVCacheFullError(
                f"KV cache is full: the step needs {wanted} new page(s) of {self.page_size} tokens but only "
                f"{len(free)} of {self.total_num_pages} are free (after releasing finished sequences)")
        pages = {seq: list(self.pages.get(seq, ())) for seq in step_dict}
        for seq in step_dict:
            for _ in range(need[seq]):
                pages[seq].append(free.pop(0))
        return sequences, pages, free, pre

    def pre_step(self, step_dict: "OrderedDict[Hashable, int]"):
        sequences, pages, free, pre = self.plan(step_dict)
        # Everything validated: commit host state, then the device buffers.
        self.sequences, self.pages, self.free_pages = sequences, pages, free
        self.batch_size = len(sequences)
        rows = [pages[seq] + [0] * (self.max_pages_per_seq - len(pages[seq])) for seq in sequences]
        _to_device(self.page_table, [p for row in rows for p in row])
        _to_device(self.cache_seqlens, pre)
        return self.sequences

    def state(self):
        """The bookkeeping (host and device) that ``restore`` puts back: InferenceParams
        takes it before ``pre_step`` so that a failed step can be undone."""
        return (OrderedDict(self.sequences), {s: list(p) for s, p in self.pages.items()}, list(self.free_pages),
                self.batch_size, self.page_table.clone(), self.cache_seqlens.clone())

    def restore(self, state):
        sequences, pages, free, batch, page_table, cache_seqlens = state
        self.sequences, self.pages, self.free_pages, self.batch_size = sequences, pages, free, batch
        self.page_table.copy_(page_table)
        self.cache_seqlens.copy_(cache_seqlens)

    def release(self, seq_id: Hashable):
        """Drop one sequence now (its pages return to the pool); KeyError if unknown."""
        if seq_id not in self.sequences:
            raise KeyError(f"unknown seq_id {seq_id!r}: the cache holds {list(self.sequences)}")
        self.free_pages.extend(self.pages.pop(seq_id))
        del self.sequences[seq_id]

    # -- the step (traced) ----------------------------------------------------

    def step(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor,
             cu_new_seqlens: torch.Tensor, cu_cached_seqlens: torch.Tensor, qkv_format: str):
        k_cache, v_cache = self.cache[layer_number]
        b = self.batch_size
        _ops.copy_to_kv_cache(new_k, new_v, k_cache, v_cache, self.page_table[:b], cu_new_seqlens[: b + 1],
                              self.cache_seqlens[:b], qkv_format)
        return k_cache, v_cache

    def get_page_table(self) -> torch.Tensor:
        """int32 ``[batch_size, max_pages_per_seq]``: the current batch's rows (a view)."""
        return self.page_table[: self.batch_size]


class NonPagedKVCacheManager(_PagePoolManager):
    """``[max_batch_size, max_seqlen, h_kv, d]`` caches; each sequence owns one row.

    The row is a page of max_seqlen slots, so the page table is ``[b, 1]``: the
    row of each sequence of the batch. Rows of finished sequences are reused
    by joining ones; nothing is moved (TransformerEngine re-indexes instead).
    """

    def __init__(self, max_batch_size: int, max_seqlen: int, num_heads: int, head_dim_k: int,
                 dtype: torch.dtype, head_dim_v: Optional[int] = None, device=None):
        super().__init__(num_pages=max_batch_size, page_size=max_seqlen, max_batch_size=max_batch_size,
                         max_seqlen=max_seqlen, num_heads=num_heads, head_dim_k=head_dim_k,
                         head_dim_v=head_dim_k if head_dim_v is None else head_dim_v, dtype=dtype,
                         device=_default_device() if device is None else device)


class PagedKVCacheManager(_PagePoolManager):
    """``[total_num_pages, page_size, h_kv, d]`` caches shared by all sequences."""

    def __init__(self, total_num_pages: int, page_size: int, num_heads: int, head_dim_k: int,
                 dtype: torch.dtype, max_batch_size: int, max_seqlen: int, head_dim_v: Optional[int] = None,
                 device=None):
        super().__init__(num_pages=total_num_pages, page_size=page_size, max_batch_size=max_batch_size,
                         max_seqlen=max_seqlen, num_heads=num_heads, head_dim_k=head_dim_k,
                         head_dim_v=head_dim_k if head_dim_v is None else head_dim_v, dtype=dtype,
                         device=_default_device() if device is None else device)


class InferenceParams:
    """KV caching for inference; TransformerEngine's ``InferenceParams`` contract.

    Parameters as in TransformerEngine (``num_heads_kv``, ``head_dim_k`` and
    ``dtype`` required). Differences: ``total_num_pages`` may be anything
    >= 1 (default ``max_batch_size * ceil(max_sequence_length / page_size)``;
    fewer pages oversubscribe the pool and ``pre_step`` raises
    ``KVCacheFullError`` when a step does not fit); ``max_sequence_length``
    need not be a multiple of ``page_size``; ``device`` (default: the current
    CUDA device, else CPU) places caches and buffers. ``custom_cache_manager``
    is a class constructed with TransformerEngine's keyword arguments (plus
    ``device``) and must provide ``get_page_table()`` as the managers here do.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_sequence_length: int,
        num_heads_kv: Optional[int] = None,
        head_dim_k: Optional[int] = None,
        dtype: Optional[torch.dtype] = None,
        head_dim_v: Optional[int] = None,
        is_paged: bool = False,
        total_num_pages: Optional[int] = None,
        page_size: Optional[int] = None,
        max_ctx_len: Optional[int] = None,
        qkv_format: str = "bshd",
        custom_cache_manager=None,
        device=None,
    ):
        if num_heads_kv is None or head_dim_k is None or dtype is None:
            raise ValueError("num_heads_kv, head_dim_k and dtype are required for InferenceParams "
                             "(as since TransformerEngine 2.2)")
        self.max_batch_size = _checks.positive_int("max_batch_size", max_batch_size)
        self.max_sequence_length = _checks.positive_int("max_sequence_length", max_sequence_length)
        self.num_heads_kv = _checks.positive_int("num_heads_kv", num_heads_kv)
        self.head_dim_k = _checks.positive_int("head_dim_k", head_dim_k)
        self.head_dim_v = self.head_dim_k if head_dim_v is None else _checks.positive_int("head_dim_v", head_dim_v)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.dtype = dtype
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
        self.device = _default_device() if device is None else torch.device(device)
        self.is_paged = bool(is_paged)
        common = dict(num_heads=self.num_heads_kv, head_dim_k=self.head_dim_k, dtype=self.dtype,
                      head_dim_v=self.head_dim_v, device=self.device)
        if self.is_paged:
            if page_size is None:
                raise ValueError("a paged KV cache (is_paged=True) requires page_size")
            self.page_size = _checks.positive_int("page_size", page_size)
            max_pages_per_seq = _cdiv(self.max_sequence_length, self.page_size)
            if total_num_pages is None:
                total_num_pages = self.max_batch_size * max_pages_per_seq
            self.total_num_pages = _checks.positive_int("total_num_pages", total_num_pages)
            manager = custom_cache_manager or PagedKVCacheManager
            self.cache_manager = manager(total_num_pages=self.total_num_pages, page_size=self.page_size,
                                         max_batch_size=self.max_batch_size,
                                         max_seqlen=self.max_sequence_length, **common)
        else:
            manager = custom_cache_manager or NonPagedKVCacheManager
            self.cache_manager = manager(max_batch_size=self.max_batch_size,
                                         max_seqlen=self.max_sequence_length, **common)
        if qkv_format == "thd" and max_ctx_len is None:
            raise ValueError("max_ctx_len is required when qkv_format='thd' (as in TransformerEngine)")
        if max_ctx_len is not None:
            _checks.positive_int("max_ctx_len", max_ctx_len)
            if max_ctx_len > self.max_sequence_length:
                raise ValueError(f"max_ctx_len ({max_ctx_len}) must be <= max_sequence_length "
                                 f"({self.max_sequence_length})")
        self.max_ctx_len = max_ctx_len

        self.cache_qkv_format = "bshd"
        self.input_qkv_format = qkv_format
        self.output_qkv_format = self._output_format(qkv_format)

        self.sequences_pre_step: "OrderedDict[Hashable, int]" = OrderedDict()
        self.sequences: "OrderedDict[Hashable, int]" = OrderedDict()
        self.batch_size = 0
        # The state before the last pre_step, for abort_step (None once used, or after reset),
        # and whether a step is open (pre_step done, not aborted): step() needs one.
        self._before_step = None
        self._step_open = False
        # Per-step shape facts that step() checks (ints; constant across decode steps).
        self._max_step_len = 0
        self._step_tokens = 0
        # Fixed device buffers, refilled by pre_step with copy_ (CUDA-graph safe).
        self.cu_seqlens_q = _static_buffer((self.max_batch_size + 1,), self.device)
        self.cu_seqlens_kv = _static_buffer((self.max_batch_size + 1,), self.device)
        self.pre_step_seqlens = _static_buffer((self.max_batch_size,), self.device)

    def _output_format(self, qkv_format: str) -> str:
        if qkv_format == self.cache_qkv_format:
            return qkv_format
        return f"{qkv_format}_2{self.cache_qkv_format}"

    def __repr__(self) -> str:
        if self.is_paged:
            return (f"InferenceParams(dtype={self.dtype}, is_paged=True, total_pages={self.total_num_pages}, "
                    f"page_size={self.page_size}, num_heads={self.num_heads_kv}, head_dim_k={self.head_dim_k}, "
                    f"head_dim_v={self.head_dim_v})")
        return (f"InferenceParams(dtype={self.dtype}, is_paged=False, max_batch_size={self.max_batch_size}, "
                f"max_seqlen={self.max_sequence_length}, num_heads={self.num_heads_kv}, "
                f"head_dim_k={self.head_dim_k}, head_dim_v={self.head_dim_v})")

    # -- host side ------------------------------------------------------------

    def reset(self):
        """Forget every sequence (the cache contents are left; they are unreachable)."""
        self.sequences = OrderedDict()
        self.sequences_pre_step = OrderedDict()
        self.batch_size = 0
        self._max_step_len = self._step_tokens = 0
        self._before_step = None
        self._step_open = False
        self.cache_manager.reset()
        for buf in (self.cu_seqlens_q, self.cu_seqlens_kv, self.pre_step_seqlens):
            buf.zero_()

    def allocate_memory(self, layer_number: int):
        """Allocate layer ``layer_number``'s K/V cache (non-paged:
        ``[max_batch_size, max_sequence_length, h_kv, d]``, paged:
        ``[total_num_pages, page_size, h_kv, d]``)."""
        self.cache_manager.allocate_memory(layer_number)

    def _normalise_step(self, step_dict) -> "OrderedDict[Hashable, int]":
        items = list(step_dict.items()) if isinstance(step_dict, Mapping) else list(step_dict)
        out: "OrderedDict[Hashable, int]" = OrderedDict()
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(f"pre_step takes an OrderedDict(seq_id -> step_len) or (seq_id, step_len) pairs; "
                                f"got the entry {item!r}")
            seq, n = item
            try:
                hash(seq)
            except TypeError:
                raise TypeError(f"seq_id must be hashable, got {seq!r}") from None
            if seq in out:
                raise ValueError(f"duplicate seq_id {seq!r} in the step")
            if isinstance(n, torch.Tensor) and n.numel() == 1:
                n = int(n.item())
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"step length of seq_id {seq!r} must be a positive int, got {n!r}")
            if self.max_ctx_len is not None and n > self.max_ctx_len:
                raise ValueError(f"step length {n} of seq_id {seq!r} exceeds max_ctx_len={self.max_ctx_len}")
            out[seq] = n
        if not out:
            raise ValueError("pre_step needs at least one sequence")
        if len(out) > self.max_batch_size:
            raise ValueError(f"the step has {len(out)} sequences, more than max_batch_size={self.max_batch_size}")
        return out

    def pre_step(self, step_dict):
        """Start a step: ``step_dict`` maps every sequence of the batch, in batch
        order, to its number of new tokens. Sequences of the previous step that are
        missing have finished (their pages are freed); unknown ids join with
        ``step_len`` prompt tokens. Validates the whole step before changing
        anything, then copies the step's metadata into the fixed device buffers."""
        steps = self._normalise_step(step_dict)
        before = self._state()
        sequences = self.cache_manager.pre_step(steps)  # validates before it mutates
        self._before_step = before
        self._step_open = True
        self.sequences = OrderedDict(sequences)
        self.batch_size = len(steps)
        self.sequences_pre_step = OrderedDict((s, self.sequences[s] - steps[s]) for s in steps)
        lens_q = list(steps.values())
        lens_kv = [self.sequences[s] for s in steps]
        self._max_step_len = max(lens_q)
        self._step_tokens = sum(lens_q)

        def cumulative(lens):
            cu = [0]
            for n in lens:
                cu.append(cu[-1] + n)
            return cu + [cu[-1]] * (self.max_batch_size - len(lens))  # padded as TransformerEngine does

        _to_device(self.cu_seqlens_q, cumulative(lens_q))
        _to_device(self.cu_seqlens_kv, cumulative(lens_kv))
        _to_device(self.pre_step_seqlens, list(self.sequences_pre_step.values()))
        return self.sequences

    def _state(self):
        manager_state = getattr(self.cache_manager, "state", None)
        return (OrderedDict(self.sequences), OrderedDict(self.sequences_pre_step), self.batch_size,
                self._max_step_len, self._step_tokens,
                [b.clone() for b in (self.cu_seqlens_q, self.cu_seqlens_kv, self.pre_step_seqlens)],
                manager_state() if manager_state is not None else None)

    def abort_step(self):
        """Undo the last ``pre_step`` after a step that failed: the bookkeeping and the device
        buffers are as they were before it, and ``step`` raises until the next ``pre_step``, so
        calling ``pre_step`` with the same sequences retries the step. The cache contents past
        the restored lengths (what layers appended before the failure) are unreachable.

        DotProductAttention calls it when an eager step raises. Under torch.compile an error
        surfaces from the compiled call, outside the module: call it then before retrying.
        Nothing happens without a step to undo. A custom cache manager is restored only if it
        provides ``state()`` and ``restore(state)``, as the managers here do."""
        before, self._before_step = self._before_step, None
        if before is None:
            return
        (self.sequences, self.sequences_pre_step, self.batch_size, self._max_step_len, self._step_tokens,
         buffers, manager_state) = before
        for buf, saved in zip((self.cu_seqlens_q, self.cu_seqlens_kv, self.pre_step_seqlens), buffers):
            buf.copy_(saved)
        if manager_state is not None:
            self.cache_manager.restore(manager_state)
        self._step_open = False

    def release(self, seq_id: Hashable):
        """Drop a sequence before the next ``pre_step`` (frees its pages now).
        KeyError for an id the cache does not hold; nothing changes then."""
        release = getattr(self.cache_manager, "release", None)
        if release is None:
            raise NotImplementedError(f"{type(self.cache_manager).__name__} has no release()")
        release(seq_id)
        self.sequences.pop(seq_id, None)

    def check_query(self, query_layer: torch.Tensor, qkv_format: str) -> None:
        """The step's query against what ``pre_step`` set up (DotProductAttention calls it before
        the layer's cache append, so a mismatch writes nothing)."""
        if not self._step_open:
            return  # step() reports it
        if qkv_format == "thd":
            if query_layer.shape[0] < self._step_tokens:
                raise ValueError(f"query_layer holds {query_layer.shape[0]} tokens but the step has "
                                 f"{self._step_tokens} new tokens")
            return
        b_dim, s_dim = (1, 0) if qkv_format == "sbhd" else (0, 1)
        if query_layer.dim() != 4 or query_layer.shape[b_dim] != self.batch_size:
            raise ValueError(f"query_layer has batch {query_layer.shape[b_dim] if query_layer.dim() == 4 else '?'} "
                             f"but pre_step set up {self.batch_size} sequences (shape {tuple(query_layer.shape)}, "
                             f"qkv_format {qkv_format!r})")
        if query_layer.shape[s_dim] < self._max_step_len:
            raise ValueError(f"query_layer holds {query_layer.shape[s_dim]} positions per sequence but the step's "
                             f"longest sequence adds {self._max_step_len}")

    def get_seqlens_pre_step(self) -> torch.Tensor:
        """int32 ``[max_batch_size]``: cache lengths before the step (first batch_size valid)."""
        return self.pre_step_seqlens

    def get_page_table(self) -> torch.Tensor:
        """int32 ``[batch_size, max_pages_per_seq]``: the page table attention reads."""
        get = getattr(self.cache_manager, "get_page_table", None)
        if get is not None:
            return get()
        return self.cache_manager.page_table[: self.batch_size]  # TransformerEngine-style managers

    def convert_paged_to_nonpaged(self, layer_number: int):
        """The layer's caches gathered per sequence: ``[batch_size, max_pages_per_seq * page_size, h, d]``."""
        k_cache, v_cache = self.cache_manager.cache[layer_number]
        table = self.get_page_table()
        b, m = table.shape

        def gather(c):
            return c[table.flatten().long()].reshape(b, m * c.shape[1], *c.shape[2:]).contiguous()

        return gather(k_cache), gather(v_cache)

    # -- the step (runs inside the compiled graph) ----------------------------

    def _check_layer_inputs(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor,
                            qkv_format: str) -> None:
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
        if not self._step_open:
            raise RuntimeError("InferenceParams.step before pre_step: call pre_step(OrderedDict(seq_id -> "
                               "step_len)) at the start of every step")
        if layer_number not in self.cache_manager.cache:
            if torch.compiler.is_compiling():
                raise RuntimeError(f"no KV cache for layer {layer_number}: call "
                                   f"inference_params.allocate_memory({layer_number}) before compiling")
            self.allocate_memory(layer_number)
        k_cache, v_cache = self.cache_manager.cache[layer_number]
        if new_k.dtype != k_cache.dtype or new_v.dtype != v_cache.dtype:
            raise ValueError(f"layer {layer_number}: key/value dtype {new_k.dtype}/{new_v.dtype} does not match "
                             f"the KV cache dtype {k_cache.dtype}")
        if new_k.device != k_cache.device or new_v.device != v_cache.device:
            raise ValueError(f"layer {layer_number}: keys/values on {new_k.device}, KV cache on {k_cache.device}")
        rank = 3 if qkv_format == "thd" else 4
        if new_k.dim() != rank or new_v.dim() != rank:
            raise ValueError(f"layer {layer_number}: keys/values must be {rank}-D in qkv_format {qkv_format!r}; "
                             f"got {tuple(new_k.shape)} and {tuple(new_v.shape)}")
        if new_k.shape[-2] != k_cache.shape[2] or new_v.shape[-2] != v_cache.shape[2]:
            raise ValueError(f"layer {layer_number}: keys/values have {new_k.shape[-2]}/{new_v.shape[-2]} heads, "
                             f"the KV cache {k_cache.shape[2]} (num_heads_kv)")
        if new_k.shape[-1] != k_cache.shape[3] or new_v.shape[-1] != v_cache.shape[3]:
            raise ValueError(f"layer {layer_number}: key/value head dims {new_k.shape[-1]}/{new_v.shape[-1]} do "
                             f"not match the KV cache's head_dim_k={k_cache.shape[3]}, "
                             f"head_dim_v={v_cache.shape[3]}")
        if qkv_format == "thd":
            if new_k.shape[0] < self._step_tokens or new_v.shape[0] < self._step_tokens:
                raise ValueError(f"layer {layer_number}: the step has {self._step_tokens} new tokens but keys/values "
                                 f"hold {new_k.shape[0]}/{new_v.shape[0]}")
            return
        b_dim, s_dim = (0, 1) if qkv_format == "bshd" else (1, 0)
        for t in (new_k, new_v):
            if t.shape[b_dim] != self.batch_size:
                raise ValueError(f"layer {layer_number}: keys/values have batch {t.shape[b_dim]} but pre_step "
                                 f"set up {self.batch_size} sequences")
            if t.shape[s_dim] < self._max_step_len:
                raise ValueError(f"layer {layer_number}: keys/values hold {t.shape[s_dim]} positions per sequence "
                                 f"but the step's longest sequence adds {self._max_step_len}")

    def kv_step(self, layer_number: int, query_layer: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor,
                qkv_format: str) -> Optional[KVStep]:
        """What ``fusedattn::fwd_kvcache`` needs for layer ``layer_number``'s step (DotProductAttention
        calls it): the op then appends new_k / new_v to the layer's cache and attends query_layer over
        it. Validates like ``step`` and appends nothing itself. None when the op cannot take the step (a
        cache manager of the caller's own, whose ``step`` appends; keys/values whose tokens are not the
        queries'): then ``step`` and attention run separately."""
        if not isinstance(self.cache_manager, _PagePoolManager) or not _same_tokens(query_layer, new_k, new_v,
                                                                                      qkv_format):
            return None
        self._check_layer_inputs(layer_number, new_k, new_v, qkv_format)
        manager = self.cache_manager
        k_cache, v_cache = manager.cache[layer_number]
        b = self.batch_size
        return KVStep(k_cache, v_cache, manager.page_table[:b], manager.cache_seqlens[:b], self.cu_seqlens_q[: b + 1])

    def step(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str):
        """Append layer ``layer_number``'s new keys/values to its cache (in place,
        through ``fusedattn::copy_to_kv_cache``) and return, as TransformerEngine
        does, ``(k_cache, v_cache, cu_seqlens_q, cu_seqlens_kv, max_sequence_length,
        output_qkv_format)``. The caches are the layer's page pools, read through
        ``get_page_table()``; cu_seqlens are ``[batch_size + 1]`` views of the
        fixed buffers."""
        self._check_layer_inputs(layer_number, new_k, new_v, qkv_format)
        b = self.batch_size
        cu_q = self.cu_seqlens_q[: b + 1]
        cu_kv = self.cu_seqlens_kv[: b + 1]
        k_cache, v_cache = self.cache_manager.step(layer_number, new_k, new_v, cu_q, cu_kv, qkv_format)
        return k_cache, v_cache, cu_q, cu_kv, self.max_sequence_length, self._output_format(qkv_format)
