r"""Sparse decoding: a few new queries per sequence attend to a key/value cache.

:func:`decode_attention` is the serving step of a model trained with :func:`softargmax.attention`:
each sequence of a batch appends its new tokens to its cache, then its new queries attend to
the cache's valid positions, causally among themselves.  The cache is contiguous
(``[B, Hkv, S, D]``, as Hugging Face's caches and FlashAttention's ``flash_attn_with_kvcache``
hold it) or paged (a block table, as vLLM and FlashInfer hold it); the sequences' valid ranges
are device tensors, never read back.

On the CPU (and wherever the kernels do not cover a call) the scores are materialized and
normalized by the row operators: exact, the reference.  On CUDA the Triton path
(:mod:`softargmax.backends.triton.decoding`) computes the scores split over the cache with the
query heads of a group packed, solves each row's threshold exactly with the row solver, and
computes ``P·V`` split over the cache, skipping the tiles outside the support.  Either path holds
the float32 scores of at most :data:`SCORES_BUDGET` entries at once: many new queries (a chunked
prefill) are taken in consecutive blocks of queries, each block bottom-right aligned at its own end.
While ``torch.compile`` or ``torch.export`` traces, the kernel path is one opaque operator
(``softargmax::decode_attention``), which :func:`softargmax.export.decompositions` replaces by the materialized path;
``torch.onnx.export`` and ``torch.jit.trace`` record the materialized path.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_broadcastable, check_real, check_tensor, check_window
from .._utils.tracing import CUSTOM_OPS, EAGER, LIBRARY_OPS, graph_mode, values_checkable, without_autograd
from ..backends.triton import decoding as _decoding
from ..divergences import Divergence
from ._carried import PREFIX, carried_divergence
from ._library_ops import define, divergence_spec
from .attention import attention_weights, grouped_product, masked_scores
from .mappings import check_mapping

__all__ = ["decode_attention", "SCORES_BUDGET"]

#: the float32 scores one pass holds at most (``B·H·L'·S`` entries, 128 MiB): a call with more new queries takes
#: them in blocks of ``L'`` (a multiple of 16, at least 16) queries; shapes alone decide it (CUDA graphs, compile)
SCORES_BUDGET = 1 << 25


def decode_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cache_seqlens: Tensor,
    cache_starts: Optional[Tensor] = None,
    *,
    scale: Optional[float] = None,
    mapping: str = "entmax15",
    alpha: Union[float, Tensor, None] = None,
    block_table: Optional[Tensor] = None,
    num_splits: Optional[int] = None,
    window: Optional[int] = None,
    attn_mask: Optional[Tensor] = None,
) -> Tensor:
    r"""Attention of new queries over a key/value cache (a decoding step, or a chunk of a prefill).

    Sequence :math:`b` holds its keys at the cache positions :math:`s_b \le j < e_b`
    (``cache_starts[b]`` and ``cache_seqlens[b]``: left padding before, unused capacity after),
    the :math:`L` new tokens' keys already written at its last :math:`L` positions.  New query
    :math:`i` (:math:`0 \le i < L`) sits at position :math:`e_b - L + i` and attends causally,
    the mask aligned bottom-right (the last query sees the whole valid cache):

    .. math::

        o_{b h i} = \sum_j p_j\, v_{b, g(h), j}, \qquad
        p = \operatorname{mapping}(z), \qquad
        z_j = \begin{cases} s\, q_{b h i} \cdot k_{b, g(h), j} & s_b \le j \le e_b - L + i,\ j < S
        \text{ and } m_{b h i j} \\ -\infty & \text{otherwise,} \end{cases}

    with :math:`s = 1/\sqrt{D}` by default and :math:`g(h) = \lfloor h / (H / H_{kv}) \rfloor` the key/value
    head of query head :math:`h` (grouped-query attention; multi-query with :math:`H_{kv} = 1`).  This is
    :func:`softargmax.attention` of the new queries over the sequence's valid keys with the causal mask
    aligned bottom-right, and :math:`m` the boolean ``attn_mask`` (all true without one).  A query with no key
    gets a zero output.

    Any number :math:`L` of new queries: one token (:math:`L = 1`), a few (speculative decoding), or a chunk
    of a prompt appended to a non-empty cache (chunked prefill).  The float32 scores of one pass hold at most
    :data:`SCORES_BUDGET` entries: more queries are taken in consecutive blocks of :math:`L'` queries (a
    multiple of 16), block :math:`c` as a call of its own whose sequences end at :math:`e_b - L + (c + 1) L'`,
    so that the bottom-right alignment holds in each block; the result is the same.

    ``attn_mask`` (boolean, ``True`` = may attend) hides more keys: with a mask that already holds each row's
    keys, the ranges need only bound them (:math:`s_b` at most the first key any query of sequence :math:`b`
    sees, :math:`e_b - L + i` at least the last key query :math:`i` sees; :math:`e_b` may then pass :math:`S`),
    and the result is :func:`softargmax.attention` with that mask, whatever its pattern.  The kernels read the
    keys and values in :math:`[s_b, \min(e_b, S))` only, so the ranges should be tight; positions inside them
    that the mask hides must hold finite values (their weights are zero).

    A sliding window of :math:`w` keys (``window=w``) also hides the keys more than :math:`w - 1`
    positions before the query's own, aligned bottom-right like the causal mask (the query at cache
    position :math:`e_b - L + i` sees :math:`\max(s_b, e_b - L + i - w + 1) \le j \le e_b - L + i`):
    the convention of :func:`softargmax.attention`'s ``window`` and of Transformers' ``sliding_window``
    over a cache.  The kernels do not read the cache tiles before the first query's window.

    On CUDA (float16, bfloat16, float32; head dim a power of two in [16, 128]; no gradient asked) the
    Triton kernels run: the scores split over the cache across many programs (as flash decoding), the
    query heads of a group packed so that each key tile is read once per group, each row's exact
    threshold by the row solver, and ``P·V`` split over the cache, skipping the tiles that hold no
    support; the split count depends on the cache's capacity, not on the lengths (CUDA graphs).
    Elsewhere (the CPU, float64, a gradient, value heads of another size than the keys') the weights
    are materialized: the reference, with memory :math:`O(B H L S)`; grouped heads are not repeated (a
    paged cache is gathered into contiguous sequences there).

    Args:
        query: ``[B, H, L, D]`` the new queries (``L`` is typically 1, a few for speculative decoding, or a
            prompt's chunk).
        key: the key cache: ``[B, Hkv, S, D]``, or with ``block_table`` the pages ``[N, page_size, Hkv, D]``.
        value: the value cache, ``key``'s shape but the last size (``Dv``).
        cache_seqlens: int32/int64 ``[B]``, the end :math:`e_b` (exclusive) of each sequence's keys in
            the cache, new tokens included; trusted (never read back): a valid ``block_table`` is the
            caller's; positions from :math:`S` on hold no key.
        cache_starts: int32/int64 ``[B]``, the first position :math:`s_b` of each sequence's keys (left
            padding). Default: ``None`` (0).
        scale: the factor :math:`s` of the scores. Default: ``None`` (:math:`1/\sqrt{D}`).
        mapping: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``) or any
            f-divergence name, or a :class:`~softargmax.divergences.Divergence`, as :func:`softargmax.attention`
            (a user's generator too, under ``torch.compile``). Default: ``"entmax15"``.
        alpha: α of ``"entmax"``: a float or a per-head tensor ``(H,)`` (a learned α, at inference).
            Default: ``None``.
        block_table: int32/int64 ``[B, pages per sequence]``: page ``block_table[b, n]`` of ``key`` and
            ``value`` holds sequence :math:`b`'s positions :math:`n \cdot` ``page_size`` to
            :math:`(n+1) \cdot` ``page_size`` :math:`- 1` (the layout of vLLM and FlashInfer), so
            :math:`S` = pages per sequence × ``page_size``; entries of pages outside
            :math:`[s_b, e_b)` are not read. Default: ``None`` (a contiguous cache).
        num_splits: the number of splits of the cache on the kernel path (``None``: enough programs
            to fill the GPU); no effect on the reference path. Default: ``None``.
        window: a causal sliding window of this many keys (above), or ``None``. Default: ``None``.
        attn_mask: a boolean mask broadcastable to ``[B, H, L, S]`` (``True`` = may attend; e.g. Transformers'
            ``[B, 1, L, S]`` mask), combined with the ranges, or ``None``. Default: ``None``.

    Returns:
        the output ``[B, H, L, Dv]`` in ``query``'s dtype.

    Shape:
        - query: :math:`(B, H, L, D)`; key: :math:`(B, H_{kv}, S, D)`; value: :math:`(B, H_{kv}, S, D_v)`,
          or paged :math:`(N, P, H_{kv}, D)` and :math:`(N, P, H_{kv}, D_v)` with block_table :math:`(B, S/P)`.
        - cache_seqlens, cache_starts: :math:`(B)`; attn_mask: broadcastable to :math:`(B, H, L, S)`.
        - Output: :math:`(B, H, L, D_v)`.

    Examples:
        >>> import torch, softargmax as sa
        >>> B, H, Hkv, S, D = 2, 4, 2, 10, 8
        >>> q = torch.randn(B, H, 1, D)                         # one new token per sequence
        >>> k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
        >>> lengths = torch.tensor([10, 6])                     # the second sequence fills 6 positions
        >>> out = sa.decode_attention(q, k, v, lengths, mapping="entmax15")
        >>> out.shape
        torch.Size([2, 4, 1, 8])
        >>> full = sa.attention(q[1:], k[1:, :, :6], v[1:, :, :6], enable_gqa=True)
        >>> torch.allclose(out[1:], full, atol=1e-6)
        True

        Left padding: the first sequence's keys start at position 3.

        >>> out = sa.decode_attention(q, k, v, lengths, torch.tensor([3, 0]), mapping="sparsemax")
        >>> torch.allclose(out[:1], sa.attention(q[:1], k[:1, :, 3:], v[:1, :, 3:], mapping="sparsemax",
        ...                                      enable_gqa=True), atol=1e-6)
        True

        A sliding window of 4 keys: the new token of the first sequence (position 9) sees positions 6 to 9.

        >>> out = sa.decode_attention(q, k, v, lengths, window=4)
        >>> torch.allclose(out[:1], sa.attention(q[:1], k[:1, :, 6:], v[:1, :, 6:], enable_gqa=True), atol=1e-6)
        True

        A chunked prefill: 40 new queries appended to a cache of 24 positions (64 in all), each causal.

        >>> q, k, v = torch.randn(1, 4, 40, 8), torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)
        >>> out = sa.decode_attention(q, k, v, torch.tensor([64]))
        >>> causal = torch.ones(40, 64, dtype=torch.bool).tril(24)     # query i sees keys 0 .. 24 + i
        >>> torch.allclose(out, sa.attention(q, k, v, attn_mask=causal, enable_gqa=True), atol=1e-6)
        True

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        Tri Dao, Daniel Haziza, Francisco Massa and Grigory Sizov, *Flash-Decoding for long-context
        inference*, 2023, https://crfm.stanford.edu/2023/10/12/flashdecoding.html

        Woosuk Kwon et al., *Efficient Memory Management for Large Language Model Serving with
        PagedAttention*, SOSP 2023, https://arxiv.org/abs/2309.06180 (the paged cache)
    """
    _check_tensors(query, key, value, block_table is not None)
    B, H, L, _ = query.shape
    end = _lengths(cache_seqlens, "cache_seqlens", query)
    start = torch.zeros_like(end) if cache_starts is None else _lengths(cache_starts, "cache_starts", query)
    if block_table is not None:
        _check_table(block_table, query)
    scale = 1.0 / float(query.shape[-1]) ** 0.5 if scale is None else check_real(scale, "scale",
                                                                                   "None or a finite number")
    check_mapping(mapping)
    window = check_window(window)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int):
            raise TypeError(f"num_splits must be None or a positive int, got {type(num_splits).__name__}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be None or a positive int, got {num_splits}")
    if isinstance(alpha, Tensor):
        check_tensor(alpha, "alpha")
    S = block_table.shape[1] * key.shape[1] if block_table is not None else key.shape[2]
    mask = _mask(attn_mask, query, S)
    if B == 0 or H == 0 or S == 0:  # no row, or no key: zero outputs (α checked all the same)
        attention_weights(query.new_zeros(1, H, 1, 1), mapping, alpha)
        return query.new_zeros(*query.shape[:3], value.shape[-1])
    args = (scale, mapping, alpha, block_table, num_splits, window)
    step = query_block(B, H, L, S)
    if step >= L:
        return _one_pass(query, key, value, end, start, mask, *args)
    # a block of queries is a call of its own whose sequences end where its last query sits (bottom-right); a mask
    # of one query row (broadcast over the queries: a padding mask) holds for every block as it is
    outs = [_one_pass(query[:, :, c:c + step], key, value, end - (L - min(L, c + step)), start,
                      mask if mask is None or mask.shape[2] == 1 else mask[:, :, c:c + step], *args)
            for c in range(0, L, step)]
    return torch.cat(outs, 2)


def query_block(B: int, H: int, L: int, S: int) -> int:
    """The new queries one pass takes: all ``L`` when their float32 scores fit :data:`SCORES_BUDGET`, else the
    largest multiple of 16 that fits (at least 16)."""
    fit = SCORES_BUDGET // max(1, B * H * S)
    return L if fit >= L else max(16, fit // 16 * 16)


def _one_pass(query: Tensor, key: Tensor, value: Tensor, end: Tensor, start: Tensor, mask: Optional[Tensor],
              scale: float, mapping: str, alpha: Union[float, Tensor, None], block_table: Optional[Tensor],
              num_splits: Optional[int], window: Optional[int]) -> Tensor:
    """One pass over the cache: the kernels where they cover the call (an opaque operator while compiling), else
    the reference (which also records the graph for ``torch.onnx.export`` and ``torch.jit.trace``)."""
    if _decoding.covers(query, key, value, block_table, alpha):
        mode = graph_mode()
        if mode == EAGER:
            return _kernels(query, key, value, end, start, mask, scale, mapping, alpha, block_table, num_splits,
                            window)
        carried = _operator_mapping(mapping, alpha) if mode == LIBRARY_OPS else None
        if carried is not None:  # else (a Divergence with an alpha too) the reference, which the compiler traces
            return torch.ops.softargmax.decode_attention(
                query, key, value, end, start, mask, block_table, alpha if isinstance(alpha, Tensor) else None,
                carried[1], scale, carried[0], num_splits, window)
    return _reference(query, key, value, end, start, scale, mapping, alpha, block_table, window, mask)


def _operator_mapping(mapping: Any, alpha: Union[float, Tensor, None]) -> Optional[tuple[str, Optional[float]]]:
    """The mapping (checked: a name or a :class:`~softargmax.divergences.Divergence`) as the operator's ``(mapping,
    alpha_value)`` arguments (a name and a float α), or ``None`` where they cannot carry it (a divergence with an
    ``alpha`` too): a divergence crosses by the name and parameter from which the registry rebuilds it, a user's
    generator by its name in this process (:func:`divergence_spec`; :func:`_operator_mapping_back` reads both)."""
    if isinstance(mapping, str):
        return mapping, None if alpha is None or isinstance(alpha, Tensor) else float(alpha)
    if alpha is not None:
        return None
    spec = divergence_spec(mapping)
    return spec[0], spec[1] if spec[0] == "alpha" else None


def _operator_mapping_back(mapping: str) -> Union[str, Divergence]:
    """The operator's ``mapping`` argument as :func:`attention_weights` takes it: a mapping name as it is, a user's
    generator's name (:func:`~softargmax.operators._carried.carried_name`) as the object."""
    return carried_divergence(mapping) if mapping.startswith(PREFIX) else mapping


def _kernels(query: Tensor, key: Tensor, value: Tensor, end: Tensor, start: Tensor, mask: Optional[Tensor],
             scale: float, mapping: Union[str, Divergence], alpha: Union[float, Tensor, None],
             block_table: Optional[Tensor], num_splits: Optional[int], window: Optional[int]) -> Tensor:
    """The Triton path: the split-K scores, the row solver, the split-K ``P·V``."""
    lay = _decoding.layout(query, key, block_table, num_splits)
    # the kernels index the lengths and the table with unit strides
    end32, start32 = end.to(torch.int32).contiguous(), start.to(torch.int32).contiguous()
    table = None if block_table is None else block_table.to(torch.int32).contiguous()
    z = _decoding.scores(query, key, end32, start32, scale, lay, table, window)
    if mask is not None:
        z.masked_fill_(~mask, float("-inf"))  # the scores' own buffer
    p = attention_weights(z, mapping, alpha).contiguous()
    return _decoding.weighted_values(p, value, end32, start32, lay, table, window)


def _kernels_op(query: Tensor, key: Tensor, value: Tensor, end: Tensor, start: Tensor, mask: Optional[Tensor],
                block_table: Optional[Tensor], alpha: Optional[Tensor], alpha_value: Optional[float], scale: float,
                mapping: str, num_splits: Optional[int], window: Optional[int]) -> Tensor:
    return _kernels(query, key, value, end, start, mask, scale, _operator_mapping_back(mapping),
                    alpha if alpha is not None else alpha_value, block_table, num_splits, window)


def reference_op(query: Tensor, key: Tensor, value: Tensor, end: Tensor, start: Tensor, mask: Optional[Tensor],
                 block_table: Optional[Tensor], alpha: Optional[Tensor], alpha_value: Optional[float], scale: float,
                 mapping: str, num_splits: Optional[int], window: Optional[int]) -> Tensor:
    """``softargmax::decode_attention`` (its arguments) by the materialized path: what the operator computes, in
    PyTorch's own operators where the mapping records its graph form (:func:`softargmax.export.decompositions`)."""
    return _reference(query, key, value, end, start, scale, _operator_mapping_back(mapping),
                      alpha if alpha is not None else alpha_value, block_table, window, mask)


def _kernels_fake(query: Tensor, key: Tensor, value: Tensor, end: Tensor, start: Tensor, mask: Optional[Tensor],
                  block_table: Optional[Tensor], alpha: Optional[Tensor], alpha_value: Optional[float], scale: float,
                  mapping: str, num_splits: Optional[int], window: Optional[int]) -> Tensor:
    return query.new_empty(*query.shape[:3], value.shape[-1])


#: the kernel path as one operator for ``torch.compile`` (no gradient: the kernels run only without one)
_OPERATOR = define("softargmax::decode_attention", _kernels_op, _kernels_fake) if CUSTOM_OPS else None


def _reference(query: Tensor, key: Tensor, value: Tensor, end: Tensor, start: Tensor, scale: float,
               mapping: Union[str, Divergence], alpha: Union[float, Tensor, None], block_table: Optional[Tensor],
               window: Optional[int] = None, mask: Optional[Tensor] = None) -> Tensor:
    """The materialized path: the masked scores of the grouped rows, the row operators, ``P·V``.  The mask is applied
    by :func:`~softargmax.operators.attention.masked_scores`: in place in eager calls, out of place where a graph is
    recorded (the operator's decomposition, whose graph must be functional)."""
    if block_table is not None:
        key, value = _gathered(key, block_table), _gathered(value, block_table)
    B, H, L, _ = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    group = H // Hkv
    scores = grouped_product(query * scale, key.transpose(-2, -1), group)  # each group's query rows: one product
    pos = torch.arange(S, device=query.device)
    last = (end.view(B, 1, 1, 1) - L) + torch.arange(L, device=query.device).view(1, 1, L, 1)
    keep = (pos >= start.view(B, 1, 1, 1)) & (pos <= last)
    if window is not None:
        keep = keep & (pos > last - window)
    if mask is not None:
        keep = keep & mask
    weights = attention_weights(masked_scores(scores, ~keep), mapping, alpha)
    # positions outside a sequence (or before its window) may hold anything (an uninitialized or recycled cache,
    # NaN included): their weights are exactly 0, which zeroes every finite value, and 0 · NaN or 0 · inf would reach
    # the output.  On the CPU, where reading a value is free, a call without gradients takes the product as it is and
    # again with those values zeroed only where its output is not finite (a copy of the cache's values saved: 3 of
    # 10 ms in benchmarks/run_cpu_decode.py's step); with gradients (the weights' gradient there, dO · v, could
    # overflow), elsewhere, and while a graph is traced, the values are zeroed first
    if value.device.type == "cpu" and values_checkable(value) and without_autograd(weights, value):
        out = grouped_product(weights, value, group)
        if bool(torch.isfinite(out).all()):
            return out
    first = start if window is None else torch.maximum(start, end - L + 1 - window)
    valid = (pos >= first.view(B, 1)) & (pos < end.view(B, 1))
    value = torch.where(valid.view(B, 1, S, 1), value, 0.0)  # (masked_fill's broadcast mask: 1.5x the time on the CPU)
    return grouped_product(weights, value, group)


def _gathered(cache: Tensor, block_table: Tensor) -> Tensor:
    """A paged cache ``[N, P, Hkv, D]`` as the contiguous ``[B, Hkv, S, D]`` of the block table's sequences
    (entries outside ``[0, N)`` read page 0: they are outside the sequences' keys)."""
    N, _, Hkv, D = cache.shape
    if N == 0:
        raise ValueError("a paged key/value cache must hold at least one page, got 0 pages")
    table = torch.where((block_table >= 0) & (block_table < N), block_table, torch.zeros_like(block_table))
    pages = cache[table.long()]  # [B, pages per sequence, P, Hkv, D]
    return pages.reshape(table.shape[0], -1, Hkv, D).transpose(1, 2)


def _check_tensors(query: Tensor, key: Tensor, value: Tensor, paged: bool) -> None:
    """Floating ``[B, H, L, D]`` queries and a cache of query's dtype and device, heads grouped."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(t, name)
        if t.dim() != 4:
            what = "[pages, page_size, heads, features] (a paged cache)" if paged and name != "query" else \
                "[batch, heads, length, features]"
            raise ValueError(f"{name} must be 4-D {what}, got shape {tuple(t.shape)}")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(f"{name} must have query's dtype, got query {query.dtype} and {name} {t.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name} must be on query's device, got query on {query.device} and {name} on {t.device}")
    B, H, L, D = query.shape
    if D < 1:
        raise ValueError(f"query must have at least one feature (dimension 3), got shape {tuple(query.shape)}")
    if L < 1:
        raise ValueError(f"query must hold at least one new query (dimension 2), got shape {tuple(query.shape)}")
    Hkv = key.shape[2] if paged else key.shape[1]
    if key.shape[-1] != D:
        raise ValueError(f"query and key must share the feature size, got {D} and {key.shape[-1]}")
    if not paged and key.shape[0] != B:
        raise ValueError(f"key must hold query's batch ({B}) of caches, got shape {tuple(key.shape)}")
    if value.shape[:-1] != key.shape[:-1]:
        raise ValueError(f"value must have key's shape but the last size, got key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"the query heads ({H}) must be a multiple of the key/value heads ({Hkv})")


def _lengths(t: object, name: str, query: Tensor) -> Tensor:
    """Per-sequence cache positions: an integer ``[B]`` tensor on query's device (values trusted)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a tensor of one cache position per sequence, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 or int64 tensor, got {t.dtype}")
    if t.shape != (query.shape[0],):
        raise ValueError(f"{name} must have shape ({query.shape[0]},): one per sequence, got {tuple(t.shape)}")
    if t.device != query.device:
        raise ValueError(f"{name} must be on query's device, got {t.device} and {query.device}")
    return t


def _mask(attn_mask: object, query: Tensor, S: int) -> Optional[Tensor]:
    """A boolean mask broadcastable to ``[B, H, L, S]``, as a 4-D view (``None`` stays ``None``)."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be None or a boolean tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be a boolean tensor (True = may attend), got {attn_mask.dtype}")
    if attn_mask.device != query.device:
        raise ValueError(f"attn_mask must be on query's device, got {attn_mask.device} and {query.device}")
    shape = (*query.shape[:3], S)
    check_broadcastable(attn_mask, torch.empty(shape, device="meta"), "attn_mask", "the scores' shape [B, H, L, S] =")
    return attn_mask[(None,) * (4 - attn_mask.dim())]


def _check_table(block_table: object, query: Tensor) -> None:
    if not isinstance(block_table, Tensor):
        raise TypeError(f"block_table must be a tensor of page indices, got {type(block_table).__name__}")
    if block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_table must be an int32 or int64 tensor, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != query.shape[0]:
        raise ValueError(f"block_table must have shape ({query.shape[0]}, pages per sequence), got "
                         f"{tuple(block_table.shape)}")
    if block_table.device != query.device:
        raise ValueError(f"block_table must be on query's device, got {block_table.device} and {query.device}")
