r"""A linear layer and a Fenchel–Young loss in one call, that never builds the full logits.

For hidden states :math:`h \in \mathbb{R}^{N \times d}`, an output projection :math:`W \in \mathbb{R}^{d \times V}`
and labels (class indices, probability rows or multi-hot label sets), the loss of the logits :math:`\theta = h W` is computed over chunks of rows with
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
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_array, check_q, compute_dtype, concrete
from .divergences import Divergence
from .losses import LossSpec, check_class_weight, check_labels, check_softcap, dense_targets, resolve_loss, row_values

Array = jax.Array

__all__ = ["linear_fenchel_young_loss"]


def _top_k_rows(probs: Array, indices: Array, V: int, dtype: Any) -> Array:
    """Dense rows ``[n, V]`` of a top-k pair: ``probs`` at ``indices``, the rest of the mass spread evenly."""
    k = probs.shape[-1]
    rest = jnp.clip(1 - jnp.sum(probs, -1, keepdims=True), 0, None) / max(V - k, 1)
    y = jnp.broadcast_to(rest if V > k else jnp.zeros_like(rest), (probs.shape[0], V)).astype(dtype)
    return y.at[jnp.arange(probs.shape[0])[:, None], indices].set(probs.astype(dtype))


def _chunk_targets(labels: Array, theta: Array, smoothing: float, multilabel: bool, cw: Optional[Array],
                   ww: Array, top_k: Optional[Array] = None) -> tuple[Array, Array]:
    """A chunk's dense targets ``[chunk, V]`` and example weights: ``ww`` (already ``cw[c]`` for class indices), times
    ``⟨cw, y⟩`` for probability or multi-hot rows, as the unfused loss weighs them; ``top_k``: the indices of a
    teacher's top-k pair whose probabilities are ``labels``."""
    if top_k is not None:
        return _top_k_rows(labels, top_k, theta.shape[-1], theta.dtype), ww
    y = dense_targets(labels, theta, -1, smoothing, multilabel)
    if cw is not None and (multilabel or not jnp.issubdtype(labels.dtype, jnp.integer)):
        ww = ww * jnp.sum(jnp.where(y > 0, y * cw, 0.0), -1)
    return y, ww


def _pad_rows(x: Array, pad: int, chunk: int, row: Array) -> Array:
    """``x`` ``[n, ...]`` with ``pad`` copies of ``row`` appended, as chunks ``[-1, chunk, ...]``."""
    return jnp.concatenate([x, jnp.broadcast_to(row.astype(x.dtype), (pad,) + x.shape[1:])]).reshape(
        (-1, chunk) + x.shape[1:])


def _chunked(h: Array, labels: Array, iw: Array, chunk: int,
             top_k: Optional[Array] = None) -> tuple[Array, Array, Array, int, Optional[Array]]:
    """The rows in chunks; the padding rows (of the last chunk) weigh 0 and hold valid labels: class 0, a one-hot
    row, or a top-k pair on distinct classes."""
    n = h.shape[0]
    pad = (-n) % chunk
    hc = _pad_rows(h, pad, chunk, jnp.zeros(h.shape[1:]))
    lc = _pad_rows(labels, pad, chunk, jnp.zeros(()) if labels.ndim == 1 else jnp.arange(labels.shape[1]) == 0)
    tc = None if top_k is None else _pad_rows(top_k, pad, chunk, jnp.arange(top_k.shape[1]))
    return hc, lc, _pad_rows(iw, pad, chunk, jnp.zeros(())), n, tc


def _chunk_logits(hh: Array, w: Array, softcap: Optional[float]) -> tuple[Array, Optional[Array]]:
    """A chunk's logits (soft-capped), and ``tanh(z/c)`` for the backward with ``softcap``."""
    z = hh @ w
    if softcap is None:
        return z, None
    t = jnp.tanh(z / softcap)
    return softcap * t, t


def _chunk_q(q: Optional[Array], theta: Array) -> Optional[Array]:
    return None if q is None else jnp.broadcast_to(q, theta.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _linear_loss(spec: LossSpec, chunk: int, smoothing: float, softcap: Optional[float], multilabel: bool, h: Array,
                 w: Array, labels: Array, iw: Array, q: Optional[Array], cw: Optional[Array],
                 top_k: Optional[Array]) -> Array:
    hc, lc, wc, n, tc = _chunked(h, labels, iw, chunk, top_k)

    def one(args: tuple) -> Array:
        hh, ll, ww, tt = args
        theta, _ = _chunk_logits(hh, w, softcap)
        y, ww = _chunk_targets(ll, theta, smoothing, multilabel, cw, ww, tt)
        loss = row_values(spec, theta, y, _chunk_q(q, theta))[0]
        return jnp.where(ww != 0, loss * ww, 0.0)

    return jax.lax.map(one, (hc, lc, wc, tc)).reshape(-1)[:n]


def _linear_loss_fwd(spec: LossSpec, chunk: int, smoothing: float, softcap: Optional[float], multilabel: bool,
                     h: Array, w: Array, labels: Array, iw: Array, q: Optional[Array],
                     cw: Optional[Array], top_k: Optional[Array]) -> tuple[Array, tuple]:
    return (_linear_loss(spec, chunk, smoothing, softcap, multilabel, h, w, labels, iw, q, cw, top_k),
            (h, w, labels, iw, q, cw, top_k))


def _linear_loss_bwd(spec: LossSpec, chunk: int, smoothing: float, softcap: Optional[float], multilabel: bool,
                     res: tuple, g: Array) -> tuple:
    h, w, labels, iw, q, cw, top_k = res
    hc, lc, wc, n, tc = _chunked(h, labels, iw, chunk, top_k)
    gc = jnp.pad(g, (0, (-n) % chunk)).reshape(-1, chunk)

    def step(dw: Array, args: tuple) -> tuple[Array, Array]:
        hh, ll, ww, gg, tt = args
        theta, t = _chunk_logits(hh, w, softcap)
        y, ww = _chunk_targets(ll, theta, smoothing, multilabel, cw, ww, tt)
        _, p = row_values(spec, theta, y, _chunk_q(q, theta))
        d = jnp.where((ww != 0)[:, None], (p - y) * (gg * ww)[:, None], 0.0)
        if t is not None:
            d = d * (1 - t * t)
        return dw + hh.T @ d, d @ w.T

    dw, dh = jax.lax.scan(step, jnp.zeros_like(w), (hc, lc, wc, gc, tc))
    return dh.reshape(-1, h.shape[1])[:n], dw, None, None, None, None, None


_linear_loss.defvjp(_linear_loss_fwd, _linear_loss_bwd)


def _check_top_k(pair: tuple, n: int, V: int) -> tuple[Array, Array]:
    """A top-k pair ``(probs, indices)``: shapes ``[n, k]``, ``k <= V``, probabilities non-negative summing to at most
    1, indices in ``[0, V)`` and distinct in a row (values checked where they are not traced)."""
    if len(pair) != 2:
        raise ValueError(f"labels: a top-k teacher is a pair (probs, indices), got a tuple of {len(pair)}")
    probs, indices = jnp.asarray(pair[0]), jnp.asarray(pair[1])
    if probs.ndim != 2 or probs.shape != indices.shape or probs.shape[0] != n or not 1 <= probs.shape[1] <= V:
        raise ValueError(f"labels: a top-k pair needs probs and indices of one shape ({n}, k) with 1 <= k <= {V}, got "
                         f"{probs.shape} and {indices.shape}")
    if not jnp.issubdtype(probs.dtype, jnp.floating) or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"labels: a top-k pair is (floating probs, integer indices), got {probs.dtype} and "
                        f"{indices.dtype}")
    p, i = concrete(probs), concrete(indices)
    if p is not None and p.size:
        tol = max(1e-5 if p.dtype.itemsize <= 4 else 1e-10, 4 * p.shape[1] * float(np.finfo(p.dtype).eps))
        if not bool(np.all(p >= 0)) or not bool(np.all(np.sum(p, -1) <= 1 + tol)):
            raise ValueError("labels: top-k probabilities must be non-negative and sum to at most 1")
    if i is not None and i.size:
        if not bool(np.all((i >= 0) & (i < V))):
            raise ValueError(f"labels: top-k indices must be in [0, {V})")
        s = np.sort(i, -1)
        if not bool(np.all(s[:, 1:] != s[:, :-1])):
            raise ValueError("labels: the top-k indices of a row must be distinct")
    return jax.lax.stop_gradient(probs), indices


def linear_fenchel_young_loss(hidden: Array, weight: Array, labels: Array,
                              mapping: Union[str, Divergence] = "entmax15", *, chunk_size: int = 1024,
                              q: Optional[Array] = None, temperature: float = 1.0, label_smoothing: float = 0.0,
                              ignore_index: Optional[int] = -100, class_weight: Optional[Array] = None,
                              softcap: Optional[float] = None, multilabel: bool = False, **params: Any) -> Array:
    r"""The Fenchel–Young loss of the logits ``hidden @ weight``, per example, without the full logits.

    .. math::

        \ell_i = \ell\big(h_i W, y_i\big), \qquad \nabla_{h_i} \ell_i = (p_i - y_i) W^\top, \qquad
        \nabla_W \textstyle\sum_i \ell_i = \sum_i h_i^\top (p_i - y_i),

    computed ``chunk_size`` rows at a time (module docstring); equal to
    ``fenchel_young_loss(hidden @ weight, labels, mapping, q=q, weight=class_weight, ...)``.

    Args:
        hidden: ``[N, d]`` floating.
        weight: ``[d, V]``, the output projection (a Flax ``Dense`` kernel's layout).
        labels: ``[N]`` integer class indices in ``[0, V)`` (or ``ignore_index``), ``[N, V]`` floating probability
            rows (non-negative, summing to 1), or with ``multilabel`` ``[N, V]`` 0/1 label sets (the target is
            uniform over each row's labels); all constants, as in :func:`~softargmax_jax.fenchel_young_loss`.
            Or a teacher's top-k pair ``(probs, indices)``, each ``[N, k]`` (:func:`~softargmax_jax.teacher_target`):
            the target is ``probs`` at ``indices`` and the remaining mass :math:`1 - \sum_i \mathrm{probs}_i`
            spread evenly over the other :math:`V - k` classes (a point of the simplex); it takes no
            ``label_smoothing``, ``class_weight`` or ``multilabel``.
        mapping: as in :func:`~softargmax_jax.fenchel_young_loss`. Default: ``"entmax15"``.
        chunk_size: rows per chunk (a positive int). Default: ``1024``.
        q: the reference measure of f-divergence losses: ``[V]``, positive (a constant). Default: ``None``.
        temperature: :math:`\beta > 0`. Default: ``1.0``.
        label_smoothing: ε in :math:`[0, 1]` (uniform over the ``V`` classes). Default: ``0.0``.
        ignore_index: labels equal to it give the loss 0 and no gradient; ``None`` ignores none.
            Default: ``-100``.
        class_weight: ``None`` or ``[V]`` class weights, finite and non-negative: example :math:`i`'s loss
            is multiplied by ``class_weight[labels[i]]`` for class indices, by :math:`\langle w, y_i \rangle` for
            probability or multi-hot rows (a constant). Default: ``None``.
        softcap: ``None`` or :math:`c > 0`: the logits are :math:`c \tanh(hW/c)`. Default: ``None``.
        multilabel: the labels are 0/1 label sets ``[N, V]``. Default: ``False``.
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
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
        raise TypeError(f"ignore_index must be an int or None, got {ignore_index!r}")
    if not isinstance(multilabel, bool):
        raise TypeError(f"multilabel must be a bool, got {type(multilabel).__name__}")
    V = weight.shape[1]
    top_k = None
    if isinstance(labels, tuple):
        if label_smoothing or class_weight is not None or multilabel:
            raise ValueError("labels: a top-k teacher pair takes no label_smoothing, class_weight or multilabel")
        labels, top_k = _check_top_k(labels, hidden.shape[0], V)
    else:  # checked against a stand-in for the [N, V] logits, which are never built
        labels = check_labels(labels, jax.ShapeDtypeStruct((hidden.shape[0], V), hidden.dtype), 1, ignore_index,
                              multilabel)
    hard = top_k is None and not multilabel and jnp.issubdtype(labels.dtype, jnp.integer)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    spec = resolve_loss(mapping, temperature, **params)
    softcap = check_softcap(softcap)
    try:
        cw = check_class_weight(class_weight, V)
    except ValueError as e:
        raise ValueError(f"class_{e}") from None
    dtype = compute_dtype(hidden.dtype)
    if q is not None:
        if spec.relu is not None:
            raise ValueError("q: the alpha_relu loss takes no reference measure")
        q = jnp.asarray(q)
        if q.shape != (V,):
            raise ValueError(f"q must have shape ({V},) (one weight per class), got {q.shape}")
        q = check_q(q, jnp.zeros((1, V), dtype))
        q = jax.lax.stop_gradient(q).astype(dtype)
    cw = None if cw is None else jax.lax.stop_gradient(cw).astype(dtype)
    if hard:
        keep = jnp.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
        labels = jnp.where(keep, labels, 0)
        iw = keep.astype(dtype) if cw is None else jnp.where(keep, cw[labels], 0.0)
        cw = None  # applied through iw
    else:
        labels = jax.lax.stop_gradient(labels)
        iw = jnp.ones(hidden.shape[:1], dtype)
    chunk = min(chunk_size, max(hidden.shape[0], 1))
    out = _linear_loss(spec, chunk, float(label_smoothing), softcap, multilabel, hidden.astype(dtype),
                       weight.astype(dtype), labels, iw, q, cw, top_k)
    return out.astype(hidden.dtype)
