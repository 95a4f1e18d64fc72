r"""Sparse attention for JAX: scaled dot-product attention with sparsemax, entmax or any f-softargmax.

:func:`attention` computes :math:`\operatorname{mapping}(s\, Q K^\top + M)\, V` with plain ``jnp.einsum``
(XLA fuses it; there is no hand-written kernel), the mapping applied over the keys with the package's
closed-form derivatives, so it works under ``jit``, ``vmap``, ``grad`` and ``jvp`` and α can be learned
per head.  Query rows whose keys are all masked get zero weights and a zero output, never NaN.

References:

* Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*, EMNLP 2019,
  https://arxiv.org/abs/1909.00015
* André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of Attention and
  Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp

from ._checks import check_array
from .divergences import DIVERGENCE_NAMES
from .operators import entmax, entmax15, f_softargmax, sparsemax

Array = jax.Array

__all__ = ["attention", "attention_weights", "MAPPINGS"]

#: the mappings :func:`attention` takes
MAPPINGS = ("softmax", "sparsemax", "entmax15", "entmax") + tuple(DIVERGENCE_NAMES)


def _check_mapping(mapping: Any) -> str:
    if not isinstance(mapping, str) or mapping not in MAPPINGS:
        raise ValueError(f"mapping must be one of {MAPPINGS}, got {mapping!r}")
    return mapping


def attention_weights(scores: Array, mapping: str = "entmax15", alpha: Union[float, Array, None] = None) -> Array:
    r"""Attention weights: the scores normalized over the keys (the last axis) by a sparse mapping.

    .. math::

        W = \operatorname{mapping}(S) \quad \text{row by row over the keys}, \qquad \sum_s W_{ls} = 1
        \text{ (or } 0 \text{ for a row whose keys are all masked)}.

    Args:
        scores: ``[..., L, S]`` attention scores (``-inf`` for masked keys).
        mapping: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``, default
            1.5) or a divergence name of :mod:`softargmax_jax.divergences` (``alpha`` for ``"alpha"``).
            Default: ``"entmax15"``.
        alpha: α of ``"entmax"`` / ``"alpha"``: a number, a per-head array ``(H,)`` applied to the head
            axis (-3) of the scores, or an array broadcastable to the scores with size 1 last (it can
            be learned: its gradient is in closed form). Default: ``None``.

    Returns:
        the weights, of the scores' shape and dtype.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, softargmax_jax as sj
        >>> scores = jnp.array([[[1.0, 0.8, -1.0]], [[1.0, 0.8, -1.0]]])  # two heads, L = 1, S = 3
        >>> print(np.round(np.asarray(sj.attention_weights(scores, "entmax", alpha=jnp.array([1.5, 2.0]))), 4))
        [[[0.5705 0.4295 0.    ]]
        <BLANKLINE>
         [[0.6    0.4    0.    ]]]

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """
    scores = check_array(scores, "scores")
    mapping = _check_mapping(mapping)
    if mapping in ("entmax", "alpha") and alpha is not None and not isinstance(alpha, (int, float)):
        a = jnp.asarray(alpha)
        if a.ndim == 1 and scores.ndim >= 3 and a.shape[0] == scores.shape[-3] and a.shape[0] != 1:
            a = a.reshape(-1, 1, 1)
        return entmax(scores, a, axis=-1)
    if mapping == "sparsemax":
        return sparsemax(scores)
    if mapping == "entmax15":
        return entmax15(scores)
    if mapping == "entmax":
        return entmax(scores, 1.5 if alpha is None else alpha)
    if mapping == "softmax":
        return f_softargmax(scores, "kl")
    if mapping == "alpha":
        return f_softargmax(scores, "alpha", alpha=1.5 if alpha is None else alpha)
    if alpha is not None:
        raise ValueError(f"alpha is a parameter of 'entmax' and 'alpha' only, not of {mapping!r}")
    return f_softargmax(scores, mapping)


def attention(query: Array, key: Array, value: Array, mask: Optional[Array] = None, *,
              bias: Optional[Array] = None, is_causal: bool = False, scale: Optional[float] = None,
              mapping: str = "entmax15", alpha: Union[float, Array, None] = None,
              return_weights: bool = False) -> Union[Array, tuple[Array, Array]]:
    r"""Sparse attention: scaled dot-product attention with sparsemax, entmax or any f-softargmax.

    .. math::

        \operatorname{attention}(Q, K, V) = \operatorname{mapping}\big(s\, Q K^\top + B + M\big)\, V,
        \qquad s = 1/\sqrt{E} \text{ by default},

    the mapping applied over the keys (:func:`attention_weights`), with :math:`M` the mask
    (:math:`-\infty` where a query may not attend).  The layout is ``[..., L, E]`` (heads before the
    sequence, as ``torch.nn.functional.scaled_dot_product_attention``; from Flax's ``[B, L, H, E]``
    swap the axes -2 and -3); the batch axes broadcast; ``key``/``value`` may have fewer heads
    (axis -3) than ``query``, each shared by consecutive query heads (grouped-query attention; each key/value
    head's group of query rows is one product, with no copy of the keys or values per query head).
    Query rows whose keys are all masked get zero weights and a zero output, never NaN.  For
    dropout on the weights, take ``return_weights=True`` and apply it before ``weights @ value``.

    Args:
        query: ``[..., L, E]`` queries.
        key: ``[..., S, E]`` keys.
        value: ``[..., S, Ev]`` values.
        mask: ``None`` or a boolean array broadcastable to ``[..., L, S]``, ``True`` where a query may
            attend (as ``jax.nn.dot_product_attention``'s ``mask``). Default: ``None``.
        bias: ``None`` or an additive float array broadcastable to ``[..., L, S]``. Default: ``None``.
        is_causal: the lower-triangular mask, aligned top-left (query :math:`l` sees keys
            :math:`s \le l`). Default: ``False``.
        scale: the factor :math:`s` of the scores. Default: ``None`` (:math:`1/\sqrt{E}`).
        mapping: as in :func:`attention_weights`. Default: ``"entmax15"``.
        alpha: as in :func:`attention_weights` (a number or one per head, learnable). Default: ``None``.
        return_weights: also return the ``[..., L, S]`` weights. Default: ``False``.

    Returns:
        the output ``[..., L, Ev]`` in the inputs' dtype, and with ``return_weights`` the pair
        ``(output, weights)``.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, softargmax_jax as sj
        >>> query = jnp.array([[1.0, 0.0], [0.0, 1.0]])             # L = 2, E = 2
        >>> key = jnp.array([[1.0, 0.0], [0.8, 0.0], [-1.0, 0.0]])  # S = 3
        >>> value = jnp.eye(3)                                      # the output shows the weights
        >>> print(np.round(np.asarray(sj.attention(query, key, value, scale=1.0, mapping="sparsemax")), 4))
        [[0.6    0.4    0.    ]
         [0.3333 0.3333 0.3333]]
        >>> out, weights = sj.attention(query, key, value, scale=1.0, mapping="sparsemax", is_causal=True,
        ...                             return_weights=True)
        >>> print(np.round(np.asarray(weights), 4))
        [[1.  0.  0. ]
         [0.5 0.5 0. ]]

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
    """
    query, key, value = check_array(query, "query"), check_array(key, "key"), check_array(value, "value")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise ValueError(f"query, key and value need at least 2 axes ([..., L, E]), got {query.shape}, {key.shape}, "
                         f"{value.shape}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same feature size E, got {query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length S, got {key.shape[-2]} and {value.shape[-2]}")
    group = 1
    if key.ndim >= 3 and query.ndim >= 3 and key.shape[-3] != query.shape[-3] and key.shape[-3] != 1:
        hq, hk = query.shape[-3], key.shape[-3]
        if hk == 0 or hq % hk or value.shape[-3] != hk:
            raise ValueError(f"the key/value heads ({hk}, {value.shape[-3]}) must equal or divide the query heads "
                             f"({hq})")
        group = hq // hk
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be None or a finite number, got {scale!r}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    _check_mapping(mapping)
    scores = _grouped_einsum("...le,...se->...ls", query * jnp.asarray(scale, query.dtype), key, group)
    L, S = query.shape[-2], key.shape[-2]
    if bias is not None:
        bias = jnp.asarray(bias)
        if not jnp.issubdtype(bias.dtype, jnp.floating):
            raise TypeError(f"bias must be a floating array, got {bias.dtype}")
        _check_broadcast(bias, scores, "bias")
        scores = scores + bias.astype(scores.dtype)
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise TypeError(f"mask must be a boolean array (True = may attend; use bias= for an additive mask), got "
                            f"{mask.dtype}")
        _check_broadcast(mask, scores, "mask")
        scores = jnp.where(mask, scores, -jnp.inf)
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones((L, S), dtype=bool)), scores, -jnp.inf)
    weights = attention_weights(scores, mapping, alpha)
    out = _grouped_einsum("...ls,...sv->...lv", weights, value, group)
    return (out, weights) if return_weights else out


def _grouped_einsum(spec: str, x: Array, y: Array, group: int) -> Array:
    """``einsum(spec, x, y)`` of ``x`` ``[..., H, L, M]`` and ``y`` ``[..., H / group, M', N]``, query head ``h`` taking
    ``y``'s head ``h // group``: ``x`` reshaped to ``[..., H / group, group · L, M]``, each group's rows one product, so
    ``y`` is never repeated per query head."""
    if group == 1:
        return jnp.einsum(spec, x, y)
    *batch, h, length, m = x.shape
    out = jnp.einsum(spec, x.reshape(*batch, h // group, group * length, m), y)
    return out.reshape(*out.shape[:-3], h, length, out.shape[-1])


def _check_broadcast(a: Array, scores: Array, name: str) -> None:
    try:
        shape = jnp.broadcast_shapes(a.shape, scores.shape)
    except ValueError:
        shape = None
    if shape is None or shape[-2:] != scores.shape[-2:]:
        raise ValueError(f"{name} of shape {a.shape} is not broadcastable to the scores [..., L, S] {scores.shape}")
