r"""The Fenchel–Young loss with the classes split over devices: for ``jax.shard_map`` over a vocabulary axis.

Each device holds a contiguous slice of every row's classes (``logits`` ``[..., V / D]``).  The
threshold search reduces its row maxima with ``lax.pmax`` and its Newton sums
:math:`(S, S')` with ``lax.psum`` over the named axis, so every device takes the same steps and
finds the same :math:`\tau`; the loss terms are summed the same way.  The derivative of the loss with
respect to a device's logits is its slice of :math:`p - y`.  This is the communication of the PyTorch
package's vocabulary-parallel loss (two scalars per row per Newton step).

References:

* Mohammad Shoeybi, Mostofa Patwary, Raul Puri, Patrick LeGresley, Jared Casper and Bryan Catanzaro,
  *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism*, 2019,
  https://arxiv.org/abs/1909.08053
* Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020,
  https://arxiv.org/abs/1901.02324
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp

from ._checks import check_array, check_q, check_row_param, compute_dtype
from .divergences import Divergence
from .losses import LossSpec, apply_softcap, check_class_weight, check_softcap, resolve_loss, row_values

Array = jax.Array

__all__ = ["vocab_parallel_fenchel_young_loss"]


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _parallel_rows(spec: LossSpec, axis_name: str, theta: Array, y: Array, q: Optional[Array],
                   row_alpha: Optional[Array]) -> Array:
    return row_values(spec, theta, y, q, axis_name, row_alpha)[0]


@_parallel_rows.defjvp
def _parallel_rows_jvp(spec: LossSpec, axis_name: str, primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    theta, y, q, row_alpha = primals  # y, q and α are constants
    dtheta = tangents[0]
    loss, p = row_values(spec, theta, y, q, axis_name, row_alpha)
    grad = p - y
    local = jnp.sum(jnp.where(grad != 0, grad * dtheta, 0.0), -1)
    return loss, jax.lax.psum(local, axis_name)


def _resolve(mapping: Union[str, Divergence], temperature: Any, logits: Array,
             params: dict[str, Any]) -> tuple[LossSpec, Optional[Array]]:
    """The loss's :class:`LossSpec`, and the per-row α (``logits``' shape with size 1 along the last axis) where
    ``"entmax"`` or ``"alpha"`` is given an array ``alpha`` (as the PyTorch package's vocabulary-parallel loss
    takes it, a constant), else ``None``."""
    alpha = params.get("alpha")
    if mapping not in ("entmax", "alpha") or alpha is None or isinstance(alpha, (bool, int, float)):
        return resolve_loss(mapping, temperature, **params), None
    if set(params) - {"alpha"}:
        raise ValueError(f"mapping={mapping!r}: unexpected parameters {sorted(set(params) - {'alpha'})}")
    if logits.ndim == 0:
        raise ValueError("logits must have at least one dimension (the classes, last)")
    row_alpha = check_row_param(alpha, logits, logits.ndim - 1, "alpha", minimum=1.0 if mapping == "entmax" else 0.0,
                                strict=mapping != "entmax")
    return resolve_loss(mapping, temperature, alpha=1.5), row_alpha  # the temperature checked; α per row


def vocab_parallel_fenchel_young_loss(logits: Array, labels: Array, mapping: Union[str, Divergence] = "entmax15",
                                      *, axis_name: str, q: Optional[Array] = None, temperature: float = 1.0,
                                      label_smoothing: float = 0.0, ignore_index: Optional[int] = -100,
                                      weight: Optional[Array] = None, softcap: Optional[float] = None,
                                      multilabel: bool = False, **params: Any) -> Array:
    r"""The per-example Fenchel–Young loss of rows whose classes are split over the devices of ``axis_name``.

    Call it inside ``jax.shard_map`` with the logits sharded along their last axis over ``axis_name``
    (each device a contiguous slice, device :math:`r` holding classes :math:`[r V_r, (r + 1) V_r)`) and
    the labels replicated over it.  The value equals ``fenchel_young_loss(full_logits, labels, mapping)``
    on every device, and its derivative with respect to each device's slice is that slice of :math:`p - y`.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \Omega(y) - \Omega(p), \qquad
        \sum_j = \operatorname{psum}_{\text{devices}} \sum_{j \in \text{slice}} .

    Args:
        logits: this device's slice ``[..., V_r]``.
        labels: global integer class indices, ``logits``' shape without the last axis (replicated); or this
            device's slice ``[..., V_r]`` of probability rows (non-negative, each row summing to 1 over all the
            devices), or with ``multilabel`` of 0/1 label sets (the target uniform over a row's labels on every
            device); sharded as the logits are. Constants; their values are not checked (they are traced inside
            ``shard_map``).
        mapping: as in :func:`~softargmax_jax.fenchel_young_loss`; with ``"entmax"`` (α ``>= 1``) or ``"alpha"``
            (α ``> 0``), ``alpha=`` may also be a floating array of one α per row, ``logits``' shape with size 1
            along the last axis or broadcastable to it (a constant, as the PyTorch package's vocabulary-parallel
            loss takes it). Default: ``"entmax15"``.
        axis_name: the mapped axis the classes are split over.
        q: this device's slice of the reference measure, positive, broadcastable to ``logits`` (a
            constant). Default: ``None``.
        temperature: :math:`\beta > 0`. Default: ``1.0``.
        label_smoothing: ε in :math:`[0, 1]` (uniform over the classes that are not masked). Default: ``0.0``.
        ignore_index: labels equal to it give the loss 0 and no gradient; ``None`` ignores none.
            Default: ``-100``.
        weight: ``None`` or the *global* class weights ``[V]`` (replicated over ``axis_name``): each
            example's loss is multiplied by ``weight[label]``, or :math:`\langle w, y \rangle` for probability or
            multi-hot rows. Default: ``None``.
        softcap: ``None`` or :math:`c > 0`: the logits are :math:`c \tanh(\theta/c)` (``-inf`` stays).
            Default: ``None``.
        multilabel: the labels are slices of 0/1 label sets. Default: ``False``.
        **params: the mapping's parameters.

    Returns:
        the losses, ``logits``' shape without the last axis (the same on every device).

    Examples:
        On the devices there are (the test suite runs it on four CPU devices):

        >>> import jax, jax.numpy as jnp, softargmax_jax as sj
        >>> from jax.sharding import AxisType, PartitionSpec as P
        >>> mesh = jax.make_mesh((jax.device_count(),), ("vocab",), axis_types=(AxisType.Auto,))
        >>> logits, labels = jnp.array([[1.0, 0.8, -1.0, 0.2]]), jnp.array([0])
        >>> loss = jax.shard_map(
        ...     lambda t, y: sj.vocab_parallel_fenchel_young_loss(t, y, "sparsemax", axis_name="vocab"),
        ...     mesh=mesh, in_specs=(P(None, "vocab"), P()), out_specs=P())
        >>> bool(jnp.allclose(loss(logits, labels), sj.sparsemax_loss(logits, labels)))
        True

    References:
        Mohammad Shoeybi, Mostofa Patwary, Raul Puri, Patrick LeGresley, Jared Casper and Bryan Catanzaro,
        *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism*, 2019,
        https://arxiv.org/abs/1909.08053
    """
    logits = check_array(logits, "logits")
    labels = jnp.asarray(labels)
    if not isinstance(multilabel, bool):
        raise TypeError(f"multilabel must be a bool, got {type(multilabel).__name__}")
    hard = not multilabel and jnp.issubdtype(labels.dtype, jnp.integer)
    if hard and labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels must be integer class indices of the logits' shape without the last axis "
                         f"{logits.shape[:-1]}, got {labels.shape} {labels.dtype}")
    if not hard and (labels.shape != logits.shape or not (
            jnp.issubdtype(labels.dtype, jnp.floating) or (multilabel and (labels.dtype == jnp.bool_ or jnp.issubdtype(
                labels.dtype, jnp.integer))))):
        raise ValueError(f"labels: probability rows (floating) or, with multilabel=True, 0/1 label sets must be this "
                         f"device's slice of the logits' shape {logits.shape}, got {labels.shape} {labels.dtype}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
        raise TypeError(f"ignore_index must be an int or None, got {ignore_index!r}")
    spec, row_alpha = _resolve(mapping, temperature, logits, params)
    softcap = check_softcap(softcap)
    q = check_q(q, logits)
    if q is not None and spec.relu is not None:
        raise ValueError("q: the alpha_relu loss takes no reference measure")
    theta = apply_softcap(logits.astype(compute_dtype(logits.dtype)), softcap)
    k = theta.shape[-1]
    if weight is not None:
        weight = check_class_weight(weight, k * jax.lax.axis_size(axis_name))
    keep = None
    offset = jax.lax.axis_index(axis_name) * k
    if hard:
        if ignore_index is not None:
            keep = labels != ignore_index
            labels = jnp.where(keep, labels, 0)
        y = jax.nn.one_hot(labels - offset, k, dtype=theta.dtype)  # zero where the class is on another device
    elif multilabel:
        t = (jax.lax.stop_gradient(labels) != 0).astype(theta.dtype)
        y = t / jnp.maximum(jax.lax.psum(jnp.sum(t, -1, keepdims=True), axis_name), 1)
    else:
        y = jax.lax.stop_gradient(labels).astype(theta.dtype)
    if label_smoothing:  # uniform over the classes that are not masked, on every device
        allowed = (theta > -jnp.inf).astype(theta.dtype)
        n = jax.lax.psum(jnp.sum(allowed, -1, keepdims=True), axis_name)
        y = (1 - label_smoothing) * y + label_smoothing * allowed / jnp.where(n > 0, n, 1.0)
    qt = None if q is None else jax.lax.stop_gradient(jnp.broadcast_to(q, theta.shape).astype(theta.dtype))
    ra = None if row_alpha is None else jax.lax.stop_gradient(row_alpha).astype(theta.dtype)
    loss = _parallel_rows(spec, axis_name, theta, y, qt, ra)
    if weight is not None:
        w = jax.lax.stop_gradient(weight).astype(theta.dtype)
        if hard:
            loss = loss * w[labels]
        else:  # ⟨w, y⟩ over every device's slice
            w_local = jax.lax.dynamic_slice_in_dim(w, offset, k)
            loss = loss * jax.lax.psum(jnp.sum(jnp.where(y > 0, y * w_local, 0.0), -1), axis_name)
    if keep is not None:
        loss = jnp.where(keep, loss, 0.0)
    return loss.astype(logits.dtype)
