r"""The target of a teacher given as logits, for distillation: its softmax at a temperature, dense or as its top-k.

References:

* Geoffrey Hinton, Oriol Vinyals and Jeff Dean, *Distilling the Knowledge in a Neural Network*, NIPS 2014 Deep
  Learning Workshop, https://arxiv.org/abs/1503.02531
"""

from __future__ import annotations

from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_array, check_positive, compute_dtype, concrete

Array = jax.Array

__all__ = ["teacher_target"]


def teacher_target(logits: Array, temperature: float = 1.0,
                   top_k: Optional[int] = None) -> Union[Array, tuple[Array, Array]]:
    r"""The teacher's softmax at a temperature, dense or as its top-k pair.

    .. math::

        y = \operatorname{softmax}(\ell / T), \qquad
        \text{top-}k:\ (y_{i_1}, \dots, y_{i_k}),\ i_1, \dots, i_k \text{ the } k \text{ largest logits}.

    The top-k probabilities are those of the full softmax (not renormalized over the k classes), so they sum to
    at most 1; :func:`~softargmax_jax.linear_fenchel_young_loss` takes the pair as its labels and spreads the
    remaining mass :math:`1 - \sum_i y_{i}` evenly over the other classes, which keeps the target a point of the
    simplex and the loss a Fenchel–Young loss.  With the same ``T`` as the loss's ``temperature``, the loss is
    :math:`T\,\ell(\theta / T, y)` with gradient :math:`p - y` (Hinton et al. scale by :math:`T^2`: multiply by
    ``T`` to match).  The result carries no derivative (``stop_gradient``).

    Args:
        logits: ``[..., V]`` teacher logits (floating; ``-inf`` masks a class).
        temperature: :math:`T > 0`. Default: ``1.0``.
        top_k: ``None`` for the dense target, or an int ``1 <= k <= V``. Default: ``None``.

    Returns:
        ``[..., V]`` probabilities, or the pair ``(probs, indices)``, each ``[..., k]``, largest first (as
        ``jax.lax.top_k``); probabilities in the compute dtype (float32 for half-precision logits).

    Raises:
        ValueError: a row without a finite largest logit (all ``-inf``, or NaN/``+inf``), where the logits'
            values can be read (not traced).

    Examples:
        >>> import jax, jax.numpy as jnp, softargmax_jax as sj
        >>> teacher = jax.random.normal(jax.random.key(0), (6, 50))
        >>> probs, indices = sj.teacher_target(teacher, temperature=2.0, top_k=8)
        >>> probs.shape, indices.shape, bool(jnp.all(probs.sum(-1) <= 1))
        ((6, 8), (6, 8), True)
        >>> hidden, weight = jax.random.normal(jax.random.key(1), (6, 16)), jax.random.normal(jax.random.key(2), (16, 50))
        >>> loss = sj.linear_fenchel_young_loss(hidden, weight, (probs, indices), temperature=2.0)
        >>> sj.teacher_target(jnp.array([0.0, 0.0, 2.0 * 0.6931]), temperature=2.0).round(4)
        Array([0.25, 0.25, 0.5 ], dtype=float32)

    References:
        Geoffrey Hinton, Oriol Vinyals and Jeff Dean, *Distilling the Knowledge in a Neural Network*, NIPS 2014
        Deep Learning Workshop, https://arxiv.org/abs/1503.02531
    """
    logits = check_array(logits, "logits")
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with V >= 1 classes, got shape {logits.shape}")
    T = check_positive(temperature, "temperature")
    V = logits.shape[-1]
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise TypeError(f"top_k must be None or an int, got {top_k!r}")
        if not 1 <= top_k <= V:
            raise ValueError(f"top_k must be in [1, {V}] (the number of classes), got {top_k}")
    v = concrete(logits)
    if v is not None and v.size and not bool(np.all(np.isfinite(np.max(np.where(np.isnan(v), np.inf, v), -1)))):
        raise ValueError("logits: every row needs a finite largest logit (found a row that is all -inf, or holds "
                         "NaN or +inf)")
    z = jax.lax.stop_gradient(logits).astype(compute_dtype(logits.dtype)) / T
    lse = jax.nn.logsumexp(z, -1, keepdims=True)
    if top_k is None:
        return jnp.exp(z - lse)
    values, indices = jax.lax.top_k(z, top_k)
    return jnp.exp(values - lse), indices
