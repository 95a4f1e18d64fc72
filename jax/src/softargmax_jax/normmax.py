r"""α-normmax for JAX, and the Fenchel–Young losses of normmax and budget sparsemax.

**Normmax.**  For :math:`\alpha > 1`,

.. math::

    \operatorname{normmax}_\alpha(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle - \lVert p\rVert_\alpha
    = \frac{r}{\sum_j r_j}, \qquad r = [x - \tau]_+^{1/(\alpha-1)},

with :math:`\tau` the root of :math:`\sum_j [x_j - \tau]_+^{\beta} = 1`, :math:`\beta = \alpha/(\alpha-1)`.  That is the
root equation of α'-entmax with :math:`\alpha' = 2 - 1/\alpha` of the scores :math:`\beta x`, whose output is
:math:`[x - \tau]_+^\beta`, so

.. math::

    \operatorname{normmax}_\alpha(x) = \operatorname{normalize}\Big( \operatorname{entmax}_{2 - 1/\alpha}
    \big(\tfrac{\alpha x}{\alpha-1}\big)^{1/\alpha} \Big),

one α'-entmax solve (the package's threshold solver) plus a power and a normalization.  The norm is
homogeneous of degree 1, so the scale of ``x`` matters.  α = 1 is the limit: the argmax, uniform over
tied maxima, with a zero derivative.

**Jacobian** (a ``jax.custom_jvp``; never through the solver's iterations): with
:math:`s_j = \lVert p\rVert_\alpha^{\alpha-1} p_j^{2-\alpha} / (\alpha-1)` on the support (0 elsewhere) and
:math:`c = \langle p, v\rangle`,

.. math::

    J v = s \odot (v - c) - p \langle s, v - c\rangle,

symmetric; α is a constant (the map is not differentiated in α).

**Losses.**  Both maps are regularized argmax maps, so their Fenchel–Young loss is
:math:`\ell(\theta, y) = \langle \theta, p - y\rangle + \Omega(y) - \Omega(p)`, with gradient :math:`p - y` from the
forward's prediction: :math:`\Omega(p) = \lVert p\rVert_\alpha` on the simplex for normmax (:math:`\alpha = 1`: the
multiclass perceptron loss :math:`\max_j \theta_j - \langle\theta, y\rangle`), and :math:`\Omega(p) = \tfrac12\lVert p\rVert^2`
on the capped simplex :math:`\{p \in \Delta: p \le 1/B\}` (``+inf`` outside) for budget sparsemax: a target
above the cap :math:`1/B` (a class index when :math:`B > 1`) has loss ``+inf``, with a finite gradient.

Conventions (as the PyTorch package's): any ``axis``; float64/float32 native, float16/bfloat16 computed
in float32; ``-inf`` scores get probability 0 and gradient 0; an all-``-inf`` row gives zeros; NaN or
``+inf`` in a row gives NaN in that row only.

References:

* Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured Hopfield
  Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
* Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020,
  https://arxiv.org/abs/1901.02324
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp

from ._checks import check_array, check_axis, check_row_param, compute_dtype
from ._solver import RowAlpha, solve
from .budget import _solve as _budget_solve
from .budget import check_budget
from .divergences import AlphaDivergence
from .losses import check_example_loss, example_rows, weighted

Array = jax.Array

__all__ = ["normmax", "normmax_loss", "budget_sparsemax_loss"]


def _check_alpha(alpha: Any, x: Array, axis: int) -> Union[float, Array]:
    """α as a float, or as an array of one α per row broadcast to ``x``'s shape with size 1 along ``axis``;
    a ``TypeError`` or ``ValueError`` naming it otherwise (values checked where not traced)."""
    if isinstance(alpha, bool):
        raise TypeError("alpha must be a number or a floating array, got a bool")
    if isinstance(alpha, (int, float)):
        if not 1 <= alpha < math.inf:
            raise ValueError(f"alpha must be a finite number >= 1, got {alpha!r}")
        return float(alpha)
    return check_row_param(alpha, x, axis, "alpha", minimum=1.0, strict=False)


def _argmax_rows(z: Array) -> Array:
    """1-normmax of the rows (last axis): uniform over the maxima; zeros if all ``-inf``, NaN if NaN/``+inf``."""
    m = jnp.max(z, -1, keepdims=True)
    ties = (z == m) & (m > -jnp.inf)
    p = ties.astype(z.dtype)
    p = p / jnp.maximum(jnp.sum(p, -1, keepdims=True), 1.0)
    bad = jnp.any(jnp.isnan(z) | (z == jnp.inf), -1, keepdims=True)
    return jnp.where(bad, jnp.nan, p)


def _normmax_solve(alpha: Union[float, Array], z: Array) -> tuple[Array, Array]:
    """``(p, ‖p‖_α)`` of the rows ``z`` (last axis) for α > 1, a number or one per row ``[..., 1]``
    (``[..., k]``, ``[..., 1]``)."""
    m = jnp.max(z, -1, keepdims=True)
    # shift-invariant: the exact differences to the row's maximum, before the division by α' - 1 (which would
    # round a large offset, 1e4 in float32 costing 1e-4 of p)
    z = z - jnp.where(jnp.isfinite(m), m, 0.0)
    a_prime = (alpha - 1.0) / alpha  # α' - 1 = 1/β
    div = AlphaDivergence(1.0 + a_prime) if isinstance(alpha, float) else RowAlpha(1.0 + a_prime, below_two=True)
    sol = solve(z / a_prime, div)
    g = jnp.where(sol.finite, sol.p, 0.0)  # [x - τ]_+^β
    r = jnp.sqrt(g) if isinstance(alpha, float) and alpha == 2.0 else g ** (1.0 / alpha)
    R = jnp.sum(r, -1, keepdims=True)
    tiny = jnp.finfo(r.dtype).tiny
    p = r / jnp.maximum(R, tiny)  # all-masked rows: r = 0, p = 0
    # ‖p‖_α = (Σ r^α)^{1/α} / R = (Σ g)^{1/α} / R
    norm = jnp.maximum(jnp.sum(g, -1, keepdims=True), 0.0) ** (1.0 / alpha) / jnp.maximum(R, tiny)
    bad = jnp.any(sol.bad, -1, keepdims=True)
    return jnp.where(bad, jnp.nan, p), norm


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _normmax_rows(alpha: float, z: Array) -> Array:
    return _normmax_solve(alpha, z)[0]


@_normmax_rows.defjvp
def _normmax_rows_jvp(alpha: float, primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    return _normmax_tangent(alpha, primals[0], tangents[0])


def _normmax_tangent(alpha: Union[float, Array], z: Array, dz: Array) -> tuple[Array, Array]:
    """``(p, J dz)`` of normmax for α > 1 (a number or ``[..., 1]``)."""
    p, norm = _normmax_solve(alpha, z)
    supp = p > 0
    base = jnp.where(supp, p, 1.0)
    w = jnp.ones_like(p) if isinstance(alpha, float) and alpha == 2.0 else base ** (2.0 - alpha)
    s = jnp.where(supp, w, 0.0) * (norm ** (alpha - 1.0) / (alpha - 1.0))
    v = jnp.where(supp, dz, 0.0)  # off the support the tangent plays no part (and never leaks a NaN)
    c = jnp.sum(p * v, -1, keepdims=True)
    vc = jnp.where(supp, v - c, 0.0)
    dp = s * vc - p * jnp.sum(s * vc, -1, keepdims=True)
    # NaN rows: NaN, by a term linear in dz (a constant NaN would vanish when reverse mode transposes it)
    return p, dp + dz * jnp.where(jnp.isnan(p), jnp.nan, 0.0)


@jax.custom_jvp
def _normmax_rows_array(z: Array, alpha: Array) -> Array:
    """One α >= 1 per row (``[..., 1]``, a constant); the rows with α = 1 take the argmax (α = 2 stands in
    for them in the solve)."""
    one = alpha == 1
    p, _ = _normmax_solve(jnp.where(one, 2.0, alpha), z)
    return jnp.where(one, _argmax_rows(z), p)


@functools.partial(_normmax_rows_array.defjvp, symbolic_zeros=True)
def _normmax_rows_array_jvp(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    (z, alpha), dz = primals, tangents[0]  # α is not differentiated
    one = alpha == 1
    if isinstance(dz, jax.custom_derivatives.SymbolicZero):
        return _normmax_rows_array(z, alpha), jnp.zeros_like(z)
    p, dp = _normmax_tangent(jnp.where(one, 2.0, alpha), z, dz)
    p1 = _argmax_rows(z)
    return jnp.where(one, p1, p), jnp.where(one, dz * jnp.where(jnp.isnan(p1), jnp.nan, 0.0), dp)


@jax.custom_jvp
def _argmax_diff(z: Array) -> Array:
    return _argmax_rows(z)


@_argmax_diff.defjvp
def _argmax_diff_jvp(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    p = _argmax_rows(primals[0])
    return p, tangents[0] * jnp.where(jnp.isnan(p), jnp.nan, 0.0)  # piecewise constant; NaN rows stay NaN


def normmax(x: Array, alpha: Union[float, Array] = 2.0, axis: int = -1) -> Array:
    r"""α-normmax along ``axis``: the regularized argmax of a norm, sparse, and sparser as the scores grow.

    .. math::

        \operatorname{normmax}_\alpha(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle - \lVert p\rVert_\alpha
        = \frac{r}{\sum_j r_j}, \qquad r = [x - \tau]_+^{1/(\alpha-1)},

    with :math:`\tau` such that :math:`\lVert[x - \tau]_+\rVert_{\alpha/(\alpha-1)} = 1`, computed by one
    :math:`(2 - 1/\alpha)`-entmax solve (the module docstring, with the Jacobian).  α = 1 is the argmax,
    uniform over ties, with a zero derivative.

    Args:
        x: scores, any shape; ``-inf`` entries are excluded (probability 0, gradient 0).
        alpha: a finite number ``>= 1``, or a floating array of finite α ``>= 1`` with size 1 along ``axis``
            and broadcastable to ``x`` (one α per row; rows with α = 1 take the argmax). A constant (no
            derivative). Default: ``2.0``.
        axis: the axis that sums to one. Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype; an all-``-inf`` row gives zeros.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, softargmax_jax as sj
        >>> x = jnp.array([1.0, 0.8, -1.0])
        >>> print(np.round(np.asarray(sj.normmax(x)), 4))
        [0.5714 0.4286 0.    ]
        >>> print(np.round(np.asarray(sj.normmax(10 * x)), 4))  # the scale matters
        [1. 0. 0.]
        >>> print(np.asarray(sj.normmax(jnp.array([2.0, 2.0, 1.0]), alpha=1.0)))  # the argmax, uniform over ties
        [0.5 0.5 0. ]
        >>> print(np.round(np.asarray(sj.normmax(jnp.stack([x, x]), jnp.array([[2.0], [1.0]]))), 4))  # one α per row
        [[0.5714 0.4286 0.    ]
         [1.     0.     0.    ]]

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured Hopfield
        Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    x = check_array(x, "x")
    axis = check_axis(x, axis)
    a = _check_alpha(alpha, x, axis)
    if isinstance(a, float):
        return _normmax_jit(a, x, axis)
    return _normmax_array_jit(x, a, axis)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _normmax_jit(alpha: float, x: Array, axis: int) -> Array:
    z = jnp.moveaxis(x.astype(compute_dtype(x.dtype)), axis, -1)
    p = _argmax_diff(z) if alpha == 1.0 else _normmax_rows(alpha, z)
    return jnp.moveaxis(p, -1, axis).astype(x.dtype)


@functools.partial(jax.jit, static_argnums=(2,))
def _normmax_array_jit(x: Array, alpha: Array, axis: int) -> Array:
    dtype = compute_dtype(x.dtype)
    z = jnp.moveaxis(x.astype(dtype), axis, -1)
    a = jnp.moveaxis(jax.lax.stop_gradient(alpha), axis, -1).astype(dtype)
    return jnp.moveaxis(_normmax_rows_array(z, a), -1, axis).astype(x.dtype)


# -- losses -------------------------------------------------------------------------------------------------


def _dot_positive(theta: Array, w: Array) -> Array:
    """``⟨θ, w⟩`` over the entries with ``w > 0`` (``0 · (-inf)`` is not NaN)."""
    return jnp.sum(jnp.where(w > 0, theta * w, 0.0), -1)


def _alpha_norm(p: Array, alpha: Union[float, Array]) -> Array:
    """``‖p‖_α`` of the rows of ``p >= 0`` (α a number or ``[..., 1]``)."""
    pos = p > 0
    total = jnp.sum(jnp.where(pos, jnp.where(pos, p, 1.0) ** alpha, 0.0), -1)
    return total ** (1.0 / (alpha if isinstance(alpha, float) else alpha[..., 0]))


def _argmax_values(theta: Array, theta_y: Array, y: Array) -> tuple[Array, Array]:
    """α = 1: ``(loss, p)`` with ``p`` the argmax (uniform over ties) and the loss ``max θ - ⟨θ, y⟩``."""
    p = _argmax_rows(theta)
    m = jnp.max(theta, -1)
    live = m > -jnp.inf  # ⟨θ, p⟩ = max θ and ‖p‖_1 = 1 (0 and 0 for an all-masked row)
    loss = jnp.where(live, m, 0.0) - theta_y + jnp.sum(y, -1) - live.astype(theta.dtype)
    return jnp.where(jnp.any(jnp.isnan(p), -1), jnp.nan, loss), p


def _row_values(kind: tuple[str, Optional[float]], theta: Array, y: Array,
                row_param: Optional[Array] = None) -> tuple[Array, Array]:
    """``(loss, p)`` of the rows ``theta`` (last axis) and dense targets ``y``; the parameter (α or the
    budget) is ``kind[1]``, or one per row ``row_param`` (``[..., 1]``) where ``kind[1]`` is ``None``."""
    name = kind[0]
    param: Union[float, Array] = row_param if kind[1] is None else kind[1]  # type: ignore[assignment]
    m = jnp.max(theta, -1, keepdims=True)
    # exact differences: the loss is shift-invariant where it is finite (Σ p = Σ y = 1 there), and a large
    # offset would otherwise cost its rounding in ⟨θ, p - y⟩
    theta = theta - jnp.where(jnp.isfinite(m), m, 0.0)
    theta_y = _dot_positive(theta, y)
    if name == "normmax" and isinstance(param, float) and param == 1.0:
        return _argmax_values(theta, theta_y, y)
    if name == "normmax" and not isinstance(param, float):
        one = param == 1  # these rows: the argmax; the others: normmax (α = 2 stands in for α = 1)
        alpha = jnp.where(one, 2.0, param)
        p, _ = _normmax_solve(alpha, theta)
        loss = _dot_positive(theta, p) - theta_y + _alpha_norm(y, alpha) - _alpha_norm(p, alpha)
        loss = jnp.where(jnp.any(jnp.isnan(p), -1), jnp.nan, loss)
        loss1, p1 = _argmax_values(theta, theta_y, y)
        return jnp.where(one[..., 0], loss1, loss), jnp.where(one, p1, p)
    if name == "normmax":
        p, _ = _normmax_solve(param, theta)
        omega_p, omega_y = _alpha_norm(p, param), _alpha_norm(y, param)
    else:
        cap = 1.0 / param
        p = _budget_solve(theta, cap)[0]
        slack = 16 * jnp.finfo(theta.dtype).eps
        omega_p = 0.5 * jnp.sum(jnp.where(p > 0, p * p, 0.0), -1)
        inside = jnp.all(y <= cap * (1 + slack), -1)
        omega_y = jnp.where(inside, 0.5 * jnp.sum(y * y, -1), jnp.inf)
    loss = _dot_positive(theta, p) - theta_y + omega_y - omega_p
    return jnp.where(jnp.any(jnp.isnan(p), -1), jnp.nan, loss), p  # NaN or +inf scores: NaN


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _loss_rows(kind: tuple[str, Optional[float]], theta: Array, y: Array, row_param: Optional[Array]) -> Array:
    return _row_values(kind, theta, y, row_param)[0]


@functools.partial(_loss_rows.defjvp, symbolic_zeros=True)
def _loss_rows_jvp(kind: tuple[str, Optional[float]], primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    theta, y, row_param = primals  # the labels and the parameter are constants
    dtheta = tangents[0]
    loss, p = _row_values(kind, theta, y, row_param)
    if isinstance(dtheta, jax.custom_derivatives.SymbolicZero):
        return loss, jnp.zeros_like(loss)
    grad = p - y
    return loss, jnp.sum(jnp.where(grad != 0, grad * dtheta, 0.0), -1)


def _loss(name: str, param: Any, logits: Any, labels: Any, axis: int, label_smoothing: float,
          where: Optional[Any], ignore_index: Optional[int], weight: Optional[Any], multilabel: bool) -> Array:
    logits, labels, axis, label_smoothing, where, weight = check_example_loss(
        logits, labels, axis, label_smoothing, where, ignore_index, weight, multilabel)
    p = _check_alpha(param, logits, axis) if name == "normmax" else check_budget(param, logits, axis)
    kind, row_param = ((name, p), None) if isinstance(p, float) else ((name, None), p)
    return _loss_jit(kind, logits, labels, where, weight, row_param, axis, label_smoothing, ignore_index,
                     multilabel)


@functools.partial(jax.jit, static_argnames=("kind", "axis", "label_smoothing", "ignore_index", "multilabel"))
def _loss_jit(kind: tuple[str, Optional[float]], logits: Array, labels: Array, where: Optional[Array],
              weight: Optional[Array], row_param: Optional[Array], axis: int, label_smoothing: float,
              ignore_index: Optional[int], multilabel: bool) -> Array:
    theta, y, labels, hard, keep = example_rows(logits, labels, where, axis, label_smoothing, ignore_index,
                                                multilabel)
    if row_param is not None:  # [..., 1] in the rows' layout, a constant
        row_param = jnp.moveaxis(jax.lax.stop_gradient(row_param), axis, -1).astype(theta.dtype)
    loss = _loss_rows(kind, theta, y, row_param)
    return weighted(loss, weight, labels, y, hard, keep).astype(logits.dtype)


def normmax_loss(logits: Array, labels: Array, alpha: Union[float, Array] = 2.0, *, axis: int = -1, label_smoothing: float = 0.0,
                 where: Optional[Array] = None, ignore_index: Optional[int] = -100, weight: Optional[Array] = None,
                 multilabel: bool = False) -> Array:
    r"""The normmax loss, per example: the Fenchel–Young loss of α-normmax, :math:`\alpha \ge 1`.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \lVert y\rVert_\alpha - \lVert p\rVert_\alpha,
        \qquad p = \operatorname{normmax}_\alpha(\theta), \qquad \nabla_\theta \ell = p - y.

    α = 1 is the limit: :math:`p` the argmax (uniform over ties) and the loss
    :math:`\max_j \theta_j - \langle \theta, y\rangle` (the multiclass perceptron loss).

    Args:
        logits: scores :math:`\theta`, any shape with the classes along ``axis``.
        labels: integer class indices (``logits``' shape without ``axis``), probability vectors
            (``logits``' shape), or 0/1 label sets with ``multilabel=True``.
        alpha: a finite number ``>= 1``, or a floating array of finite α ``>= 1`` with size 1 along ``axis``
            and broadcastable to ``logits`` (one α per example). A constant. Default: ``2.0``.
        axis, label_smoothing, where, ignore_index, weight, multilabel: as in
            :func:`~softargmax_jax.fenchel_young_loss` (defaults ``-1``, ``0.0``, ``None``, ``-100``,
            ``None``, ``False``).

    Returns:
        the losses, ``logits``' shape without ``axis``, in ``logits``' dtype.

    Examples:
        >>> import numpy as np, jax, jax.numpy as jnp, softargmax_jax as sj
        >>> logits = jnp.array([[1.0, 0.8, -1.0], [0.0, 0.0, 9.0]])
        >>> print(np.round(np.asarray(sj.normmax_loss(logits, jnp.array([0, 2]))), 4))
        [0.2 0. ]
        >>> print(np.round(np.asarray(jax.grad(lambda t: sj.normmax_loss(t, jnp.array([0, 2])).sum())(logits)), 4))
        [[-0.4286  0.4286  0.    ]
         [ 0.      0.      0.    ]]

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured Hopfield
        Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324
    """
    return _loss("normmax", alpha, logits, labels, axis, label_smoothing, where, ignore_index, weight, multilabel)


def budget_sparsemax_loss(logits: Array, labels: Array, budget: Union[float, Array] = 2.0, *, axis: int = -1,
                          label_smoothing: float = 0.0, where: Optional[Array] = None,
                          ignore_index: Optional[int] = -100, weight: Optional[Array] = None,
                          multilabel: bool = False) -> Array:
    r"""The budget sparsemax loss, per example: the Fenchel–Young loss of sparsemax on the simplex capped at :math:`1/B`.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \tfrac12\lVert y\rVert^2 - \tfrac12\lVert p\rVert^2,
        \qquad p = \operatorname{budget\_sparsemax}(\theta), \qquad \nabla_\theta \ell = p - y,

    and ``+inf`` for a target above the cap :math:`1/B` (the gradient stays finite).  With :math:`B > 1` the
    finite-valued targets are label sets (``multilabel=True``, at least :math:`B` labels) and soft labels
    within the cap; :math:`B \le 1` is the sparsemax loss.

    Args:
        logits: scores :math:`\theta`, any shape with the classes along ``axis``.
        labels: integer class indices, probability vectors, or 0/1 label sets with ``multilabel=True``.
        budget: :math:`B`, a finite number > 0, or a floating array of finite budgets > 0 with size 1 along
            ``axis`` and broadcastable to ``logits`` (one budget per example). A constant. Default: ``2.0``.
        axis, label_smoothing, where, ignore_index, weight, multilabel: as in
            :func:`~softargmax_jax.fenchel_young_loss` (defaults ``-1``, ``0.0``, ``None``, ``-100``,
            ``None``, ``False``).

    Returns:
        the losses, ``logits``' shape without ``axis``, in ``logits``' dtype.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, softargmax_jax as sj
        >>> logits = jnp.array([[3.0, 1.0, 0.8, -1.0]])
        >>> print(np.round(np.asarray(sj.budget_sparsemax_loss(logits, jnp.array([[1, 1, 0, 0]]),
        ...                                                     multilabel=True)), 4))
        [0.0225]
        >>> print(np.asarray(sj.budget_sparsemax_loss(logits, jnp.array([0]))))  # one-hot: above the cap 1/2
        [inf]

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured Hopfield
        Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324
    """
    return _loss("budget", budget, logits, labels, axis, label_smoothing, where, ignore_index, weight, multilabel)
