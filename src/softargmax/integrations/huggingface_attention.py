r"""Hugging Face Transformers: the library's normalizations as attention implementations.

After :func:`register` (called for you by ``import softargmax.integrations.huggingface``
or ``softargmax.integrations.huggingface_attention``),
models that use Transformers' attention-interface registry accept
``attn_implementation="sparsemax"`` / ``"entmax15"`` (and any name registered with
:func:`register`), in ``from_pretrained``, ``from_config`` or
``model.set_attn_implementation``.

The function mirrors Transformers' eager attention: grouped key/value heads are
shared (read in place by the fused kernels, repeated on the materialized path), ``scaling``
is the model's, dropout is applied in training only, a layer's ``sliding_window`` is honoured,
and the returned output is ``[batch, length, heads, head_dim]`` with the per-head weights.
Masks arrive either as booleans (``True`` = may attend, SDPA style) or as additive
floats; both are handled.  Transformers is an optional dependency (``pip install
transformers``); nothing is downloaded.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_window
from .._utils.extras import require
from .._utils.tracing import compiling
from ..operators.attention import attention
from ..operators.decoding import decode_attention

require("hf", "softargmax.integrations.huggingface_attention")

__all__ = ["register", "attention_function", "DEFAULT_IMPLEMENTATIONS"]

DEFAULT_IMPLEMENTATIONS = {"sparsemax": ("sparsemax", None), "entmax15": ("entmax15", None)}


def attention_function(mapping: str, alpha: Union[float, Tensor, None] = None) -> Callable[..., tuple[Tensor, Any]]:
    r"""An attention function with Transformers' signature that normalizes the scores with a sparse mapping.

    .. math::

        \operatorname{forward}(Q, K, V, M) = \operatorname{mapping}(s\, Q K^\top + M)\, V,

    by :func:`softargmax.attention`, as Transformers' eager attention computes it with softmax:
    grouped key/value heads, the module's ``scaling``, dropout in training only, causal masking
    when no mask is given.

    Args:
        mapping: ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``), ``"softmax"`` or a
            divergence name.
        alpha: α of ``"entmax"``: a float or a per-head tensor. Default: ``None``.

    Returns:
        ``forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs)``,
        returning the output ``[batch, length, heads, head_dim]`` and the weights (or ``None`` when
        Transformers does not ask for them).  A packed batch (one row of several sequences, with
        the flash-attention keywords ``cu_seq_lens_q``/``cu_seq_lens_k`` and ``max_length_q``/
        ``max_length_k`` of ``DataCollatorWithFlattening``) attends within each sequence (causal
        unless the module says otherwise), through ``softargmax.attention``'s ``cu_seqlens_q``;
        its weights are not returned.  A step over a cache (new queries against more keys: a decoding step, a
        few speculative tokens or a chunk of a prefill; no weights asked, in evaluation) with a boolean mask goes
        through :func:`softargmax.decode_attention` with that mask and ranges read off it that bound it (each
        sequence's first key, and its end such that every query's causal band holds its keys): the result is
        attention with the mask, and the kernels read only the ranges; no host synchronization, so
        ``torch.compile`` traces the step whole (``fullgraph=True``, a static cache).  Other calls (additive
        masks, several queries without a mask) keep :func:`softargmax.attention`.

        The keyword ``sliding_window`` that Transformers passes to attention functions per layer (an
        int on the sliding layers, ``None`` on the full ones: models such as Gemma 2 or Qwen 2 with
        ``layer_types`` alternate them; the config's own setting is not read) becomes
        :func:`softargmax.attention`'s ``window`` (query :math:`i` sees keys :math:`i - w < j \le i`,
        Transformers' convention) on causal calls without a mask: a packed batch, which has no mask,
        gets its band from it alone. A call with a mask keeps the mask alone (Transformers builds it
        with the band, and a bidirectional sliding layer or a block of image tokens allows keys that a
        causal band would not), on a step over the cache too (the mask goes to
        :func:`softargmax.decode_attention`, whose ranges start at the first query's window). A non-causal call
        without a mask and with a window is refused (``ValueError``).

    Shape:
        - query: :math:`(B, H, L, D)`; key, value: :math:`(B, H_{kv}, S, D)`.
        - attention_mask: boolean or additive, broadcastable to :math:`(B, H, L, S)`.
        - Output: :math:`(B, L, H, D)` and the weights :math:`(B, H, L, S)`.

    Examples:
        >>> import torch
        >>> from softargmax.integrations.huggingface import attention_function
        >>> forward = attention_function("sparsemax")
        >>> q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])                  # B = 1, H = 1, L = 2, D = 2
        >>> k = torch.tensor([[[[1.0, 0.0], [0.8, 0.0], [-1.0, 0.0]]]])     # S = 3
        >>> out, weights = forward(torch.nn.Module(), q, k, torch.randn(1, 1, 3, 2), None, scaling=1.0)
        >>> out.shape, weights
        (torch.Size([1, 2, 1, 2]), tensor([[[[0.6000, 0.4000, 0.0000],
                  [0.3333, 0.3333, 0.3333]]]]))

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """

    def forward(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                scaling: Optional[float] = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Any]:
        groups = getattr(module, "num_key_value_groups", 1)
        window = check_window(kwargs.get("sliding_window"), "sliding_window")
        # the weights only when Transformers asks for them: without them CUDA inputs take the
        # fused kernels (O(L) memory; grouped key/value heads are read as they are)
        want = kwargs.get("output_attentions")
        if want is None:
            want = getattr(getattr(module, "config", None), "output_attentions", True)
        packed = _packed_kwargs(query, kwargs)
        if packed is not None:  # a packed batch (DataCollatorWithFlattening): each sequence on its own
            packed_causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
            _causal_window(window, packed_causal)
            q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [total, heads, head_dim]
            out = attention(q, k, v, is_causal=packed_causal,
                            scale=scaling, dropout_p=dropout if module.training else 0.0, mapping=mapping,
                            alpha=alpha, enable_gqa=groups > 1, window=window, **packed)
            return out.unsqueeze(0), None
        is_causal = False
        mask = attention_mask
        if mask is not None:
            mask = mask[..., : key.shape[-2]]
        ranges = None if want or module.training else _decode_ranges(query, key, mask, window)
        if ranges is not None:  # a step over the cache: softargmax.decode_attention
            ends, starts, step_mask, step_window = ranges
            out = decode_attention(query, key, value, ends, starts, scale=scaling, mapping=mapping, alpha=alpha,
                                   window=step_window, attn_mask=step_mask)
            return out.transpose(1, 2).contiguous(), None
        if mask is None and query.shape[2] > 1 and kwargs.get("is_causal", getattr(module, "is_causal", False)):
            is_causal = True
        if mask is None and window is not None:
            _causal_window(window, is_causal or query.shape[2] == 1)
        res = attention(
            query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling,
            dropout_p=dropout if module.training else 0.0, mapping=mapping, alpha=alpha, return_weights=bool(want),
            enable_gqa=groups > 1,
            # a mask holds the band already (Transformers builds it with the window), and it may allow keys a
            # causal band would not (bidirectional sliding layers, blocks of image tokens): the mask alone
            # then says which keys each query sees; without a mask the causal band comes from the window
            window=window if mask is None and is_causal else None,
        )
        out, weights = res if want else (res, None)
        return out.transpose(1, 2).contiguous(), weights

    forward.__name__ = f"softargmax_{mapping}_attention"
    return forward


def _causal_window(window: Optional[int], causal: bool) -> None:
    """Refuses a sliding ``window`` on a call with no mask that is not causal: its band (symmetric, as in
    ModernBERT's local layers, or with bidirectional blocks) is not the causal band that
    :func:`softargmax.attention`'s ``window`` gives, and without a mask nothing else says which keys each
    query sees."""
    if window is not None and not causal:
        raise ValueError(f"sliding_window={window} on a non-causal attention call without a mask (a packed batch, "
                         "or no attention_mask): softargmax's window is the causal band i - w < j <= i; pass the "
                         "layer's mask (Transformers builds it with the band) or use a causal layer")


def _decode_ranges(query: Tensor, key: Tensor, mask: Optional[Tensor], window: Optional[int] = None
                   ) -> Optional[tuple[Tensor, Tensor, Optional[Tensor], Optional[int]]]:
    """``(cache_seqlens, cache_starts, attn_mask, window)`` of :func:`softargmax.decode_attention` when the call is a
    step over a cache (new queries against more keys: a decoding step or a chunk of a prefill, any number of
    queries), else ``None`` (additive masks, masks per head, several queries without a mask).

    A boolean mask goes with the call, and the ranges only bound it (:func:`_bounding_ranges`): the result is
    attention with that mask whatever its pattern (left padding, a sliding window, which the mask holds, holes,
    bidirectional blocks), computed from tensors alone (no host synchronization: ``torch.compile`` traces it whole,
    and a CUDA graph can hold it).  Without a mask a single query sees every key, with the ``window`` if given."""
    B, H, L, _ = query.shape
    S = key.shape[2]
    if not (1 <= L < S and key.dim() == 4 and key.shape[1] and H % key.shape[1] == 0):
        return None
    if mask is None:
        if L != 1:  # several queries without a mask: Transformers' causal case, kept as it was
            return None
        full = torch.full((B,), S, dtype=torch.int32, device=query.device)
        return full, torch.zeros_like(full), None, window
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-2:] != (L, S):
        return None
    if mask.shape[0] not in (1, B):
        return None
    ends, starts = _step_ranges(mask, B, L, S)
    return ends, starts, mask, None


#: eager calls: the last masks whose ranges :func:`_step_ranges` read (two: a model whose sliding and full layers
#: alternate passes two masks a step), each with its version and view, and the ranges; the latest last
_LAST_RANGES: list = []
_KEPT_MASKS = 2
#: the most bytes a kept mask of several query rows may hold (a static cache's prompt mask [B, 1, L, capacity] is
#: not kept alive after the call); a mask of one query row (a decoding step) is kept whatever its size
_KEPT_BYTES = 1 << 20


def _step_ranges(mask: Tensor, B: int, L: int, S: int) -> tuple[Tensor, Tensor]:
    """:func:`_bounding_ranges`, read once per mask in eager calls (the layers of a step share one mask, sliced to
    their keys: about 0.1 ms a layer on a CPU at 2,048 keys); while ``torch.compile`` traces, or a CUDA graph or
    ``torch.jit.trace`` records, always computed (a Python cache would be baked into the graph), and for masks that
    are inference tensors (``torch.inference_mode``: they keep no version counter) or that hold several query rows
    and more than :data:`_KEPT_BYTES` (the cache would keep them alive).  A kept mask is known again by its version
    counter: a change in place is seen, a change through ``.data`` (which does not count) is not."""
    if compiling() or torch.jit.is_tracing() or (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _bounding_ranges(mask, B, L, S)
    base = mask if mask._base is None else mask._base
    if base.is_inference() or (L > 1 and base.numel() * base.element_size() > _KEPT_BYTES):
        return _bounding_ranges(mask, B, L, S)
    key = (base._version, tuple(mask.shape), mask.stride(), mask.storage_offset(), B, mask.device)
    for kept, kept_key, ranges in _LAST_RANGES:
        if kept is base and kept_key == key:
            return ranges
    ranges = _bounding_ranges(mask, B, L, S)
    # the masks themselves are held (not their addresses): a later mask cannot be taken for one of them
    _LAST_RANGES[:] = _LAST_RANGES[1 - _KEPT_MASKS:] + [(base, key, ranges)]
    return ranges


def _bounding_ranges(mask: Tensor, B: int, L: int, S: int) -> tuple[Tensor, Tensor]:
    """Ranges whose bottom-right causal band holds every key a boolean ``[B or 1, 1, L, S]`` mask allows: the start
    of sequence ``b`` is the first key any of its queries sees, its end the least ``e`` with ``e - L + i`` at least
    the last key query ``i`` sees (the exact range for a causal mask; past ``S`` when a query sees later keys)."""
    m = mask[:, 0]  # [B or 1, L, S]
    cols = m.any(1)  # the keys some query sees
    starts = torch.where(cols.any(-1), cols.to(torch.uint8).argmax(-1), 0)
    last = (S - 1) - m.flip(-1).to(torch.uint8).argmax(-1)  # each query's last key (where it sees one)
    rows = torch.arange(L, device=mask.device)
    ends = torch.where(m.any(-1), last + (L - rows), 0).amax(-1)
    return ends.to(torch.int32).expand(B), starts.to(torch.int32).expand(B)


def _packed_kwargs(query: Tensor, kwargs: dict) -> Optional[dict]:
    """The packed-batch arguments of :func:`softargmax.attention` from Transformers' flash-attention
    keywords (``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``, passed by
    ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``), or ``None``: a batch of one
    row holding several sequences, the attention mask then unused."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None or cu_k is None or query.shape[0] != 1:
        return None
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    return dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=None if max_q is None else int(max_q),
                max_seqlen_k=None if max_k is None else int(max_k))


def register(name: Optional[str] = None, mapping: Optional[str] = None, alpha: Union[float, Tensor, None] = None) -> None:
    """Register attention implementations (default: ``"sparsemax"`` and ``"entmax15"``) with Transformers.

    After it, ``attn_implementation=name`` selects :func:`attention_function` of the mapping in
    ``from_pretrained``, ``from_config`` or ``model.set_attn_implementation``.  The mask format for
    a registered name is the SDPA one (boolean).  Importing the module registers the defaults.

    Args:
        name: the implementation's name. Default: ``None`` (the names of :data:`DEFAULT_IMPLEMENTATIONS`).
        mapping: its mapping. Default: ``None`` (``name`` itself).
        alpha: α of ``mapping="entmax"``. Default: ``None``.

    Shape:
        - alpha: a number, or a per-head tensor :math:`(H)`.

    Examples:
        >>> from transformers import AutoModelForCausalLM, LlamaConfig
        >>> from softargmax.integrations.huggingface import register
        >>> register("entmax13", mapping="entmax", alpha=1.3)
        >>> config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=2)
        >>> model = AutoModelForCausalLM.from_config(config, attn_implementation="entmax13")
        >>> model.config._attn_implementation
        'entmax13'
    """
    from transformers import AttentionInterface

    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    except ImportError:  # older Transformers: masks are always additive floats
        ALL_MASK_ATTENTION_FUNCTIONS = sdpa_mask = None
    items = DEFAULT_IMPLEMENTATIONS.items() if name is None else [(name, (mapping or name, alpha))]
    for impl, (m, a) in items:
        AttentionInterface.register(impl, attention_function(m, a))
        if ALL_MASK_ATTENTION_FUNCTIONS is not None:
            ALL_MASK_ATTENTION_FUNCTIONS.register(impl, sdpa_mask)


register()
