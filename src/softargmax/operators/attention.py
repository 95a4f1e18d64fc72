r"""Sparse attention: ``scaled_dot_product_attention`` with any normalization of the library.

``attention(q, k, v, ...)`` computes :math:`\operatorname{mapping}(q k^\top \cdot \mathrm{scale} + \mathrm{mask})\, v` with the
conventions of ``torch.nn.functional.scaled_dot_product_attention``:

* ``query``, ``key`` and ``value`` share one floating dtype and device;
* ``attn_mask``: boolean (``True`` = may attend) or additive float mask (of any floating
  dtype: it is added in the scores' dtype), broadcastable to ``[..., L, S]``; ``is_causal``
  applies the lower-triangular mask (aligned top-left, as SDPA) and cannot be combined with
  ``attn_mask``;
* ``scale`` defaults to :math:`1/\sqrt{E}`; batch and head dimensions broadcast;
* ``dropout_p > 0`` applies dropout to the attention weights (pass 0 in evaluation, as
  modules do);
* ``enable_gqa=True``: ``key``/``value`` may have fewer heads (dimension -3) than ``query``,
  each shared by ``H / Hkv`` consecutive query heads (grouped-query attention, as SDPA);
* ``window=w`` (keyword only, no SDPA counterpart): a causal sliding window, query ``i``
  attending to keys ``i - w < j <= i`` (top-left aligned like ``is_causal``), combined with
  ``attn_mask`` when both are given.

On CUDA, ``return_weights=False`` calls with ``dropout_p = 0`` and ``mapping``
``"sparsemax"``, ``"entmax15"`` or ``"entmax"`` (float or per-head α) run the fused
FlashAttention-style Triton kernels (``O(L)`` memory, the weights never stored; grouped
key/value heads read in place, never repeated; the tiles outside a sliding window never read; coverage in
:mod:`softargmax.backends.triton.flash_attention`, switch: ``SOFTARGMAX_FLASH_ATTENTION=0``); the rest (and
``return_weights=True``, dropout, CPU) computes the weights, the reference path, which does not repeat grouped
key/value heads either (each one's group of query rows is one product), and computes causal and sliding-window
attention without weights (and, on the CPU, attention whose mask hides every later key, as Transformers' causal
masks with padding do) by blocks of query rows, each against the keys it can see.

``mapping`` is ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with
``alpha``: a float or a per-head tensor, e.g. shape ``(H,)`` or ``(H, 1, 1)``, which
can be learned), or any f-divergence name (f-softargmax).  Query rows whose keys are all
masked get zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .._utils.checks import check_broadcastable, check_real, check_tensor, check_window
from .._utils.tracing import eager, eager_autograd
from ..backends.triton import flash_attention as _flash_attention
from ..divergences import Divergence
from .mappings import MAPPING_NAMES as MAPPINGS
from .mappings import normalize

__all__ = ["attention", "attention_weights", "MAPPINGS"]


def _alpha_for_scores(alpha: Union[float, Tensor, None], scores: Tensor) -> Union[float, Tensor, None]:
    """A per-head α tensor of shape ``(H,)`` becomes ``(H, 1, 1)``; others must broadcast with size 1 last."""
    if not isinstance(alpha, Tensor):
        return alpha
    if alpha.dim() == 1 and scores.dim() >= 3 and alpha.shape[0] == scores.shape[-3]:
        return alpha.reshape(-1, 1, 1)
    return alpha


def attention_weights(scores: Tensor, mapping: Union[str, Divergence] = "entmax15",
                      alpha: Union[float, Tensor, None] = None) -> Tensor:
    r"""Attention weights: the scores normalized over the keys by a sparse mapping.

    .. math::

        W = \operatorname{mapping}(S) \quad \text{row by row over the keys}, \qquad \sum_s W_{ls} = 1,

    by :func:`softargmax.operators.mappings.normalize`; a per-head α of shape ``(H,)`` is applied to
    the head dimension (-3) of the scores.

    Args:
        scores: ``[..., L, S]`` attention scores (``-inf`` for masked keys).
        mapping: as in :func:`softargmax.operators.mappings.normalize`. Default: ``"entmax15"``.
        alpha: α of ``"entmax"``: a float, a per-head tensor ``(H,)`` or ``(H, 1, 1)``, or a tensor
            broadcastable to the scores with size 1 last. Default: ``None``.

    Returns:
        the weights, of the scores' shape and dtype.

    Shape:
        - scores: :math:`(*, L, S)`.
        - Output: :math:`(*, L, S)`.

    Examples:
        >>> import torch
        >>> from softargmax.operators.attention import attention_weights
        >>> scores = torch.tensor([[[1.0, 0.8, -1.0]], [[1.0, 0.8, -1.0]]])  # two heads, L = 1, S = 3
        >>> attention_weights(scores, "entmax", alpha=torch.tensor([1.5, 2.0]))
        tensor([[[0.5705, 0.4295, 0.0000]],
        <BLANKLINE>
                [[0.6000, 0.4000, 0.0000]]])

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """
    return normalize(scores, mapping, _alpha_for_scores(alpha, scores), dim=-1)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    mapping: str = "entmax15",
    alpha: Union[float, Tensor, None] = None,
    return_weights: bool = False,
    enable_gqa: bool = False,
    *,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    window: Optional[int] = None,
) -> Union[Tensor, Any]:  # or (output, weights): Tensor | Any as softargmax.losses' LossOutput
    r"""Sparse attention: ``scaled_dot_product_attention`` with sparsemax, entmax or any f-softargmax.

    .. math::

        \operatorname{attention}(Q, K, V) = \operatorname{mapping}\big(s\, Q K^\top + M\big)\, V,
        \qquad s = 1/\sqrt{E} \text{ by default},

    the mapping applied over the keys, with the conventions of
    ``torch.nn.functional.scaled_dot_product_attention`` (the module docstring lists them).  Query rows
    whose keys are all masked get zero weights and a zero output, never NaN.  On CUDA the sparse
    mappings run fused FlashAttention-style kernels when the weights are not returned.

    A sliding window of :math:`w` keys (``window=w``) masks every key outside the causal band

    .. math::

        M_{ij} = -\infty \quad \text{unless} \quad i - w < j \le i,

    so that query :math:`i` sees its own position and the :math:`w - 1` keys before it (aligned
    top-left as ``is_causal``: query :math:`i` sits at key position :math:`i`; Transformers'
    ``sliding_window`` convention, :math:`w` keys per query, where the Mistral 7B paper counts the
    positions :math:`i - W` to :math:`i`).  The fused kernels never read the key tiles
    outside the band: the work grows as :math:`L w`, not :math:`L^2 / 2`.

    Args:
        query: ``[..., L, E]`` queries.
        key: ``[..., S, E]`` keys.
        value: ``[..., S, Ev]`` values.
        attn_mask: a boolean mask (``True`` = may attend) or an additive float mask, broadcastable to
            ``[..., L, S]``, as in ``scaled_dot_product_attention``. Default: ``None``.
        dropout_p: dropout on the weights, as in ``scaled_dot_product_attention`` (pass 0 in
            evaluation). Default: ``0.0``.
        is_causal: the lower-triangular mask, as in ``scaled_dot_product_attention``. Default: ``False``.
        scale: the factor :math:`s` of the scores. Default: ``None`` (:math:`1/\sqrt{E}`).
        mapping: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``) or any
            f-divergence name. Default: ``"entmax15"``.
        alpha: α of ``"entmax"``: a float or a per-head tensor (``(H,)`` or ``(H, 1, 1)``), which can
            be learned. Default: ``None``.
        return_weights: also return the ``[..., L, S]`` attention weights. Default: ``False``.
        enable_gqa: allow fewer key/value heads (dimension -3) than query heads, each shared by
            consecutive query heads (grouped-query attention; the heads are read in place, never repeated).
            Default: ``False``.
        cu_seqlens_q: a *packed* batch of variable-length sequences, as FlashAttention's varlen
            API: ``query`` is ``[total_q, H, E]``, the rows of all sequences one after the other, and
            sequence :math:`b` is rows ``cu_seqlens_q[b]`` to ``cu_seqlens_q[b+1] - 1``; a 1-D
            int32/int64 tensor of :math:`B + 1` offsets from 0 to ``total_q`` on query's device.
            Each sequence attends to its own keys only (``is_causal``: top-left aligned within it,
            as above); ``attn_mask`` and ``return_weights`` are not allowed. Default: ``None``.
        cu_seqlens_k: the keys' offsets (``key``/``value`` ``[total_k, Hkv, E]``), needed with
            ``cu_seqlens_q``. Default: ``None``.
        max_seqlen_q: the longest query sequence (at least it: it sizes the launch grid). With
            both maxima given the offsets are trusted, as in FlashAttention, and no host
            synchronization happens; without them they are read back once and checked
            (increasing from 0 to the total). Default: ``None``.
        max_seqlen_k: the longest key sequence. Default: ``None``.
        window: a causal sliding window: query :math:`i` attends only to keys :math:`j` with
            :math:`i - w < j \le i` (``is_causal`` then changes nothing; with ``attn_mask`` a key
            must be allowed by both; in a packed batch, within each sequence).  A positive int, or
            ``None`` for no window. Default: ``None``.

    Returns:
        the output ``[..., L, Ev]``, and with ``return_weights`` the pair ``(output, weights)``;
        for a packed batch ``[total_q, H, Ev]``, sequence :math:`b`'s rows being
        ``attention(q_b, k_b, v_b)`` of its own queries and keys.

    Shape:
        - query: :math:`(*, L, E)`; key: :math:`(*, S, E)`; value: :math:`(*, S, E_v)`; the batch
          dimensions :math:`*` broadcast (for example :math:`(N, H)`).
        - attn_mask: broadcastable to :math:`(*, L, S)`.
        - Output: :math:`(*, L, E_v)`, and the weights :math:`(*, L, S)`.

    Examples:
        >>> import torch, softargmax as sa
        >>> query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])           # L = 2, E = 2
        >>> key = torch.tensor([[1.0, 0.0], [0.8, 0.0], [-1.0, 0.0]])  # S = 3
        >>> value = torch.eye(3)                                      # the output shows the weights
        >>> sa.attention(query, key, value, scale=1.0, mapping="sparsemax")
        tensor([[0.6000, 0.4000, 0.0000],
                [0.3333, 0.3333, 0.3333]])
        >>> out, weights = sa.attention(query, key, value, scale=1.0, mapping="sparsemax",
        ...                             is_causal=True, return_weights=True)
        >>> weights
        tensor([[1.0000, 0.0000, 0.0000],
                [0.5000, 0.5000, 0.0000]])

        Batched heads, one learnable α per head:

        >>> q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
        >>> alpha = torch.full((4,), 1.5, requires_grad=True)
        >>> sa.attention(q, k, v, mapping="entmax", alpha=alpha).shape
        torch.Size([2, 4, 5, 8])

        A packed batch of two sequences of 3 and 5 tokens (4 heads of 8 features):

        >>> cu = torch.tensor([0, 3, 8])
        >>> qp, kp, vp = torch.randn(8, 4, 8), torch.randn(8, 4, 8), torch.randn(8, 4, 8)
        >>> out = sa.attention(qp, kp, vp, is_causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
        >>> out.shape
        torch.Size([8, 4, 8])
        >>> second = sa.attention(qp[3:].transpose(0, 1), kp[3:].transpose(0, 1), vp[3:].transpose(0, 1),
        ...                       is_causal=True)
        >>> torch.allclose(out[3:], second.transpose(0, 1), atol=1e-6)
        True

        A sliding window of 2 keys: query :math:`i` sees keys :math:`i - 1` and :math:`i`:

        >>> q4 = torch.zeros(4, 2)  # equal scores: uniform weights over the keys each query sees
        >>> sa.attention(q4, q4, torch.eye(4), mapping="sparsemax", window=2)
        tensor([[1.0000, 0.0000, 0.0000, 0.0000],
                [0.5000, 0.5000, 0.0000, 0.0000],
                [0.0000, 0.5000, 0.5000, 0.0000],
                [0.0000, 0.0000, 0.5000, 0.5000]])

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        Tri Dao, *FlashAttention-2: Faster Attention with Better Parallelism and Work
        Partitioning*, ICLR 2024, https://arxiv.org/abs/2307.08691 (the packed variable-length layout)

        Albert Q. Jiang et al., *Mistral 7B*, 2023, https://arxiv.org/abs/2310.06825 (sliding-window
        attention; the band here counts :math:`w` keys, as Transformers' ``sliding_window`` does)
    """
    _check_tensors(query, key, value)
    dropout_p, scale = _check_options(query, attn_mask, dropout_p, is_causal, scale)
    window = check_window(window)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        return _packed_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, mapping, alpha,
                                 return_weights, enable_gqa, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 window)
    gqa, key_batch = _grouping(query, key, value, enable_gqa)
    _check_mask(attn_mask, query, key_batch, key.shape[-2])
    # the fused kernels read grouped key/value heads in place (query head h reads head h // group)
    fused = None if gqa is None else _flash_attention.maybe_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale, mapping, alpha, return_weights, window=window)
    if fused is not None:
        return fused
    # the materialized path: grouped key/value heads are not repeated, each takes its group's query rows
    group = query.shape[-3] // key.shape[-3] if gqa and key.shape[-3] != query.shape[-3] else 1
    # (a traced graph keeps one block, for any length: the length is not even compared there)
    if not return_weights and dropout_p == 0 and eager() and query.shape[-2] > CAUSAL_BLOCK \
            and (is_causal or window is not None or _hides_the_future(attn_mask, query.shape[-2], key.shape[-2])):
        return _causal_blocks(query, key, value, attn_mask, scale, window, group, mapping, alpha)
    weights = attention_weights(_attention_scores(query, key, attn_mask, is_causal, scale, window, group), mapping,
                                alpha)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    out = grouped_product(weights, value, group)
    return (out, weights) if return_weights else out


def _offsets(cu: object, name: str, query: Tensor) -> Tensor:
    """A packed batch's offsets checked for type, shape and device (their values: :func:`_lengths`)."""
    if not isinstance(cu, Tensor):
        raise TypeError(f"{name} must be a tensor of sequence offsets, got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 or int64 tensor, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 offsets (0 and the total), got shape {tuple(cu.shape)}")
    if cu.device != query.device:
        raise ValueError(f"{name} must be on query's device, got {cu.device} and {query.device}")
    return cu


def _lengths(cu: Tensor, name: str, total: int, rows: str) -> list[int]:
    """The sequence lengths of offsets ``cu`` (read back: one host synchronization), checked."""
    offs = cu.tolist()
    if offs[0] != 0 or offs[-1] != total or any(b < a for a, b in zip(offs, offs[1:])):
        raise ValueError(f"{name} must increase from 0 to {rows} ({total}), got {offs if len(offs) <= 12 else '...'}")
    return [b - a for a, b in zip(offs, offs[1:])]


def _max_length(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{name} must be a non-negative int, got {value!r}")
    return value


def _packed_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor], dropout_p: float,
                      is_causal: bool, scale: float, mapping: str, alpha: Union[float, Tensor, None],
                      return_weights: bool, enable_gqa: bool, cu_seqlens_q: Optional[Tensor],
                      cu_seqlens_k: Optional[Tensor], max_seqlen_q: Optional[int],
                      max_seqlen_k: Optional[int], window: Optional[int] = None) -> Tensor:
    """:func:`attention` of a packed batch (its ``cu_seqlens_q`` argument)."""
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("a packed batch needs both cu_seqlens_q and cu_seqlens_k")
    if attn_mask is not None:
        raise ValueError("attn_mask cannot be combined with cu_seqlens_q/cu_seqlens_k: each sequence attends to "
                         "its own keys (use is_causal, or pad the batch and pass a mask)")
    if return_weights:
        raise ValueError("return_weights is not available for a packed batch (cu_seqlens_q): the sequences' "
                         "weights have different shapes")
    if not (query.dim() == key.dim() == value.dim() == 3):
        raise ValueError("with cu_seqlens_q, query, key and value must be packed [total, heads, features], got "
                         f"{tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}")
    H, Hkv = query.shape[1], key.shape[1]
    if value.shape[1] != Hkv or Hkv == 0 or H % Hkv or (Hkv != H and not enable_gqa):
        raise ValueError(f"the key/value heads ({Hkv}, {value.shape[1]}) must equal the query heads ({H}), or "
                         "divide them with enable_gqa=True")
    cu_q = _offsets(cu_seqlens_q, "cu_seqlens_q", query)
    cu_k = _offsets(cu_seqlens_k, "cu_seqlens_k", query)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must hold as many offsets (one per sequence + 1), got "
                         f"{cu_q.numel()} and {cu_k.numel()}")
    lengths = None
    if max_seqlen_q is None or max_seqlen_k is None:
        lengths = (_lengths(cu_q, "cu_seqlens_q", query.shape[0], "query's rows"),
                   _lengths(cu_k, "cu_seqlens_k", key.shape[0], "key's rows"))
        max_seqlen_q, max_seqlen_k = max(lengths[0]), max(lengths[1])
    max_q = _max_length(max_seqlen_q, "max_seqlen_q")
    max_k = _max_length(max_seqlen_k, "max_seqlen_k")
    packed = _flash_attention.Packed(cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k)
    fused = _flash_attention.maybe_attention(query, key, value, None, dropout_p, is_causal, scale, mapping, alpha,
                                             False, packed, window)
    if fused is not None:
        return fused
    if lengths is None:
        lengths = (_lengths(cu_q, "cu_seqlens_q", query.shape[0], "query's rows"),
                   _lengths(cu_k, "cu_seqlens_k", key.shape[0], "key's rows"))
    outs, q0, k0 = [], 0, 0
    for Lb, Sb in zip(*lengths):  # the reference: one sequence at a time
        q, k, v = (t.transpose(0, 1) for t in (query[q0:q0 + Lb], key[k0:k0 + Sb], value[k0:k0 + Sb]))
        if Lb > 0:
            if Sb == 0:  # no key: zero rows, as for fully masked rows
                outs.append(query.new_zeros(Lb, H, value.shape[-1]))
            else:
                out = attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale, mapping=mapping,
                                alpha=alpha, enable_gqa=enable_gqa, window=window)
                outs.append(out.transpose(0, 1))
        q0, k0 = q0 + Lb, k0 + Sb
    return torch.cat(outs, 0) if outs else query.new_zeros(0, H, value.shape[-1])


def _check_tensors(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Floating tensors of one dtype and device, ``[..., length, features]`` with matching sizes."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(t, name)
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(f"{name} must have query's dtype, got query {query.dtype} and {name} {t.dtype} "
                            "(as in scaled_dot_product_attention)")
        if t.device != query.device:
            raise ValueError(f"{name} must be on query's device, got query on {query.device} and {name} on {t.device}")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError("query, key and value need at least 2 dimensions ([..., length, features])")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must share the feature size, got {query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length, got {key.shape[-2]} and {value.shape[-2]}")


def _check_options(query: Tensor, attn_mask: object, dropout_p: object, is_causal: bool,
                   scale: object) -> tuple[float, float]:
    """``(dropout_p, scale)`` checked (``scale`` defaults to ``1/√E``)."""
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal cannot both be set (as in scaled_dot_product_attention)")
    dropout_p = check_real(dropout_p, "dropout_p", "a number in [0, 1)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else check_real(scale, "scale", "None or a finite number")
    return dropout_p, scale


def _grouping(query: Tensor, key: Tensor, value: Tensor,
              enable_gqa: Optional[bool]) -> tuple[Optional[bool], tuple[int, ...]]:
    """``(enable_gqa, key's batch shape)``: ``enable_gqa`` checked (``None`` where the heads differ without
    it: plain broadcasting decides, which the fused kernels do not do), the key/value heads counted as
    query's under grouping, and the batch dimensions checked to broadcast."""
    if enable_gqa and query.dim() >= 3 and key.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        if key.shape[-3] == 0 or query.shape[-3] % key.shape[-3] or value.shape[-3] != key.shape[-3]:
            raise ValueError(f"enable_gqa: the query heads ({query.shape[-3]}) must be a multiple of the key/value "
                             f"heads ({key.shape[-3]}, {value.shape[-3]})")
    elif query.dim() >= 3 and key.dim() >= 3 and key.shape[-3] not in (1, query.shape[-3]):
        enable_gqa = None
    key_batch, value_batch = key.shape[:-2], value.shape[:-2]
    if enable_gqa and key.dim() >= 3 and query.dim() >= 3:
        key_batch, value_batch = key_batch[:-1] + (query.shape[-3],), value_batch[:-1] + (query.shape[-3],)
    batch = tuple(query.shape[:-2])
    for name, t, its_batch in (("key", key, key_batch), ("value", value, value_batch)):
        try:
            batch = torch.broadcast_shapes(batch, its_batch)
        except RuntimeError:
            raise ValueError(f"{name}: its batch dimensions {tuple(t.shape[:-2])} do not broadcast with "
                             f"{'query' if name == 'key' else 'query and key'}'s {tuple(batch)} "
                             "([..., length, features]; enable_gqa=True allows fewer key/value heads)") from None
    return enable_gqa, key_batch


def _check_mask(attn_mask: object, query: Tensor, key_batch: Sequence[int], S: int) -> None:
    """A boolean or floating ``attn_mask`` that broadcasts to the scores ``[..., L, S]`` (before either path runs)."""
    if attn_mask is None:
        return
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be a boolean or floating tensor, got {attn_mask.dtype}")
    score_shape = torch.broadcast_shapes(query.shape[:-2], key_batch) + (query.shape[-2], S)
    check_broadcastable(attn_mask, torch.empty(score_shape, device="meta"), "attn_mask",
                        "the attention scores' shape [..., L, S] =")


def grouped_product(x: Tensor, y: Tensor, group: int) -> Tensor:
    """``x @ y`` for ``x`` ``[..., H, L, M]`` and ``y`` ``[..., H / group, M, N]``: query head ``h`` takes ``y``'s head
    ``h // group``, whose group's rows are one product (``[..., H / group, group · L, M]``: neither ``y``
    repeated per query head nor its gradient summed afterwards; ``x`` is copied only where its heads and rows
    cannot be viewed as one dimension).  ``group = 1``: ``x @ y``.

    Example:
        >>> x, y = torch.randn(2, 4, 3, 5), torch.randn(2, 2, 5, 6)
        >>> torch.allclose(grouped_product(x, y, 2), x @ y.repeat_interleave(2, 1), atol=1e-6)
        True
    """
    if group == 1:
        return x @ y
    *batch, H, L, M = x.shape
    out = x.reshape(*batch, H // group, group * L, M) @ y
    shape = (*out.shape[:-3], H, L, out.shape[-1])
    # in eager calls not a view of the product but a tensor of its own on the same memory, as torch.matmul's own
    # reshapes are: the scores are masked in place (masked_scores), and on a view autograd would copy their gradient
    return torch.ops.aten._unsafe_view(out, shape) if eager_autograd() else out.view(shape)


def _causal_blocks(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor], scale: float,
                   window: Optional[int], group: int, mapping: Union[str, Divergence],
                   alpha: Union[float, Tensor, None]) -> Tensor:
    """The causal (or sliding-window) attention of the materialized path by blocks of :data:`CAUSAL_BLOCK` query rows,
    each against the keys its rows can see (up to its last row; under a window, from its first row's first key): the
    scores above the diagonal (and before the window) of the other blocks are never computed, in the forward nor in
    the backward (about ``(n + 1) / 2n`` of the products and of the mapping's entries for ``n`` blocks, 9/16 at
    2,048 queries), and the weights autograd keeps are those of the blocks.  Each row is normalized over the same
    keys as in one block: the same output."""
    L, S = query.shape[-2], key.shape[-2]
    outs = []
    for r0 in range(0, L, CAUSAL_BLOCK):
        r1 = min(r0 + CAUSAL_BLOCK, L)
        k1 = max(min(r1, S), 1)  # (rows past every key see them all: top-left aligned)
        k0 = min(max(r0 - window + 1, 0), k1 - 1) if window is not None else 0
        mask = _part(_part(attn_mask, -1, k0, k1), -2, r0, r1)  # the block's rows and keys
        scores = _attention_scores(query[..., r0:r1, :], key[..., k0:k1, :], mask, True, scale, window, group, r0 - k0)
        weights = attention_weights(scores, mapping, _part(alpha, -2, r0, r1))
        outs.append(grouped_product(weights, value[..., k0:k1, :], group))
    return torch.cat(outs, -2)


def _part(t: Any, dim: int, lo: int, hi: int) -> Any:
    """Entries ``lo:hi`` along ``dim`` (-1: keys, -2: query rows) of a mask or a per-row α broadcast to the scores,
    where it has that dimension unbroadcast (``None``, a float, a per-head α ``(H,)`` for ``dim = -2``, and sizes 1
    are kept)."""
    if isinstance(t, Tensor) and t.dim() >= -dim and t.shape[dim] != 1:
        return t.narrow(dim, lo, hi - lo)
    return t


#: query rows per block of the materialized causal attention (:func:`_causal_blocks`; longer queries only)
CAUSAL_BLOCK = 256


def _hides_the_future(attn_mask: Optional[Tensor], L: int, S: int) -> bool:
    """Whether ``attn_mask`` (``[..., L, S]``, not broadcast over the queries) hides every key after its query (top-left
    aligned: ``False``, or ``-inf`` for a float mask, wherever ``j > i``), as the causal masks with padding that
    Transformers builds do: the causal blocks then compute the same attention.  Read on the host: CPU masks only (no
    synchronization with a device), in eager calls; the first query's last key first (a mask that shows it, as a
    bidirectional padding mask does, costs no more), then one pass over the mask."""
    if attn_mask is None or attn_mask.device.type != "cpu" or attn_mask.dim() < 2 or attn_mask.shape[-2] != L \
            or attn_mask.shape[-1] != S:
        return False
    with torch.no_grad():
        if attn_mask.dtype == torch.bool:
            hidden = lambda m: ~m  # noqa: E731
        else:
            hidden = torch.isneginf
        if S > 1 and not bool(hidden(attn_mask[..., 0, S - 1]).all()):
            return False
        past = torch.ones(L, S, dtype=torch.bool, device=attn_mask.device).tril()
        return bool((hidden(attn_mask) | past).all())


def _attention_scores(query: Tensor, key: Tensor, attn_mask: Optional[Tensor], is_causal: bool, scale: float,
                      window: Optional[int] = None, group: int = 1, offset: int = 0) -> Tensor:
    """``scale · q kᵀ`` with the causal or given mask (a boolean mask as ``-inf``, a float one added in the
    scores' dtype, as the fused kernels read it) and the sliding window's band ``i - window < j <= i``; ``group``
    query heads share each key head (:func:`grouped_product`); ``offset``: the first query's index minus the first
    key's (a block of :func:`_causal_blocks`).  The scale multiplies the queries (as SDPA's math path does), and the
    masks are applied in place: the scores are a temporary of this function, and each full-size pass or copy of them
    costs as much as a product on the CPU."""
    scores = grouped_product(query * scale, key.transpose(-2, -1), group)
    if is_causal or window is not None:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril(offset)
        if window is not None:
            causal = causal.triu(offset + 1 - window)  # j - i > -window
        scores = masked_scores(scores, ~causal)
    if attn_mask is None:
        return scores
    if attn_mask.dtype == torch.bool:
        return masked_scores(scores, ~attn_mask)
    return scores.add_(attn_mask.to(scores.dtype))


def masked_scores(scores: Tensor, drop: Tensor) -> Tensor:
    """``scores`` (a temporary: changed in place) with ``-inf`` where ``drop`` (broadcast), whose backward passes the
    gradient as it is (:class:`_MaskedScores`), in eager calls; ``masked_fill`` where a graph is traced
    (``torch.jit.trace`` takes no in-place autograd function, and a traced graph is functionalized anyway), under
    ``torch.func`` transforms and with forward-mode AD (which the function does not define).

    Example:
        >>> masked_scores(torch.zeros(2, 2), torch.tensor([[False, True], [False, False]]))
        tensor([[0., -inf],
                [0., 0.]])
    """
    if eager_autograd():
        return _MaskedScores.apply(scores, drop)
    return scores.masked_fill(drop, float("-inf"))


class _MaskedScores(torch.autograd.Function):
    """``scores`` with ``-inf`` where ``drop`` (broadcast), in place: the scores are a temporary.  The gradient passes
    as it is: every mapping's weights are constant in a ``-inf`` score (its weight is 0 whatever its value), so the
    mapping's gradient there is 0 already, which ``masked_fill``'s backward would set again (a copy and a pass over
    the full-size gradient: a tenth of a causal forward and backward on the CPU)."""

    @staticmethod
    def forward(scores: Tensor, drop: Tensor) -> Tensor:
        scores.masked_fill_(drop, float("-inf"))
        return scores

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.mark_dirty(inputs[0])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None
