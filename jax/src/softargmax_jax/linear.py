r"""A linear layer and a Fenchel–Young loss in one call, that never builds the full logits.

For hidden states :math:`h \in \mathbb{R}^{N \times d}`, an output projection :math:`W \in \mathbb{R}^{d \times V}`
and integer labels, the loss of the logits :math:`\theta = h W` is computed over chunks of rows with
``lax.map``: one chunk's logits ``[chunk_size, V]`` exist at a time instead of ``[N, V]``.  The backward
(a ``jax.custom_vjp``) recomputes each chunk's logits, forms :math:`p - y` and accumulates
:math:`\partial h = (p - y) W^\top` and :math:`\partial W = h^\top (p - y)` chunk by chunk (``lax.scan``), so
nothing of size :math:`N \times V` is stored either.

References:

* Erik Wijmans, Brody Huval, Alexander Hertzberg, Vladlen Koltun and Philipp Krähenbühl, *Cut Your Losses
  in Large-Vocabulary Language Models*, ICLR 2025, https://arxiv.org/abs/2411.09009
* Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020,
  https://arxiv.org/abs/1901.02324
"""

from __future__ import annotations

import functools
from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_array, compute_dtype, concrete
from .divergences import Divergence
from .losses import LossSpec, resolve_loss, row_values

Array = jax.Array

__all__ = ["linear_fenchel_young_loss"]


def _chunk_targets(labels: Array, k: int, dtype: Any, smoothing: float) -> Array:
    y = jax.nn.one_hot(labels, k, dtype=dtype)
    return (1 - smoothing) * y + smoothing / k if smoothing else y


def _chunked(h: Array, labels: Array, chunk: int) -> tuple[Array, Array, int]:
    n = h.shape[0]
    pad = (-n) % chunk
    hp = jnp.pad(h, ((0, pad), (0, 0)))
    lp = jnp.pad(labels, (0, pad))
    return hp.reshape(-1, chunk, h.shape[1]), lp.reshape(-1, chunk), n


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _linear_loss(spec: LossSpec, chunk: int, smoothing: float, h: Array, w: Array, labels: Array) -> Array:
    hc, lc, n = _chunked(h, labels, chunk)

    def one(args: tuple[Array, Array]) -> Array:
        hh, ll = args
        theta = hh @ w
        return row_values(spec, theta, _chunk_targets(ll, w.shape[1], theta.dtype, smoothing), None)[0]

    return jax.lax.map(one, (hc, lc)).reshape(-1)[:n]


def _linear_loss_fwd(spec: LossSpec, chunk: int, smoothing: float, h: Array, w: Array,
                     labels: Array) -> tuple[Array, tuple[Array, Array, Array]]:
    return _linear_loss(spec, chunk, smoothing, h, w, labels), (h, w, labels)


def _linear_loss_bwd(spec: LossSpec, chunk: int, smoothing: float, res: tuple[Array, Array, Array],
                     g: Array) -> tuple[Array, Array, None]:
    h, w, labels = res
    hc, lc, n = _chunked(h, labels, chunk)
    gc = jnp.pad(g, (0, (-n) % chunk)).reshape(-1, chunk)

    def step(dw: Array, args: tuple[Array, Array, Array]) -> tuple[Array, Array]:
        hh, ll, gg = args
        theta = hh @ w
        y = _chunk_targets(ll, w.shape[1], theta.dtype, smoothing)
        _, p = row_values(spec, theta, y, None)
        d = (p - y) * gg[:, None]
        return dw + hh.T @ d, d @ w.T

    dw, dh = jax.lax.scan(step, jnp.zeros_like(w), (hc, lc, gc))
    return dh.reshape(-1, h.shape[1])[:n], dw, None


_linear_loss.defvjp(_linear_loss_fwd, _linear_loss_bwd)


def linear_fenchel_young_loss(hidden: Array, weight: Array, labels: Array,
                              mapping: Union[str, Divergence] = "entmax15", *, chunk_size: int = 1024,
                              temperature: float = 1.0, label_smoothing: float = 0.0, **params: Any) -> Array:
    r"""The Fenchel–Young loss of the logits ``hidden @ weight``, per example, without the full logits.

    .. math::

        \ell_i = \ell\big(h_i W, y_i\big), \qquad \nabla_{h_i} \ell_i = (p_i - y_i) W^\top, \qquad
        \nabla_W \textstyle\sum_i \ell_i = \sum_i h_i^\top (p_i - y_i),

    computed ``chunk_size`` rows at a time (module docstring); equal to
    ``fenchel_young_loss(hidden @ weight, labels, mapping)``.

    Args:
        hidden: ``[N, d]`` floating.
        weight: ``[d, V]``, the output projection (a Flax ``Dense`` kernel's layout).
        labels: ``[N]`` integer class indices in ``[0, V)``.
        mapping: as in :func:`~softargmax_jax.fenchel_young_loss`. Default: ``"entmax15"``.
        chunk_size: rows per chunk (a positive int). Default: ``1024``.
        temperature: :math:`\beta > 0`. Default: ``1.0``.
        label_smoothing: ε in :math:`[0, 1]` (uniform over the ``V`` classes). Default: ``0.0``.
        **params: the mapping's parameters.

    Returns:
        the losses ``[N]``, in ``hidden``'s dtype.

    Examples:
        >>> import numpy as np, jax, jax.numpy as jnp, softargmax_jax as sj
        >>> h = jax.random.normal(jax.random.key(0), (5, 4))
        >>> w = jax.random.normal(jax.random.key(1), (4, 7))
        >>> labels = jnp.array([0, 1, 2, 3, 6])
        >>> a = sj.linear_fenchel_young_loss(h, w, labels, "sparsemax", chunk_size=2)
        >>> bool(jnp.allclose(a, sj.sparsemax_loss(h @ w, labels), atol=1e-6))
        True

    References:
        Erik Wijmans, Brody Huval, Alexander Hertzberg, Vladlen Koltun and Philipp Krähenbühl, *Cut Your
        Losses in Large-Vocabulary Language Models*, ICLR 2025, https://arxiv.org/abs/2411.09009
    """
    hidden = check_array(hidden, "hidden")
    weight = check_array(weight, "weight")
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[0]:
        raise ValueError(f"hidden [N, d] and weight [d, V] do not match: {hidden.shape} and {weight.shape}")
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer) or labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels must be integer class indices of shape ({hidden.shape[0]},), got "
                         f"{labels.shape} {labels.dtype}")
    v = concrete(labels)
    if v is not None and v.size and not bool(np.all((v >= 0) & (v < weight.shape[1]))):
        raise ValueError(f"labels: class indices must be in [0, {weight.shape[1]})")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    spec = resolve_loss(mapping, temperature, **params)
    dtype = compute_dtype(hidden.dtype)
    chunk = min(chunk_size, max(hidden.shape[0], 1))
    out = _linear_loss(spec, chunk, float(label_smoothing), hidden.astype(dtype), weight.astype(dtype), labels)
    return out.astype(hidden.dtype)
