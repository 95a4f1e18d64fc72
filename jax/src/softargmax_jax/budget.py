r"""Budget sparsemax for JAX: sparsemax with every probability capped at ``1/budget``.

For a budget :math:`B > 0` and the cap :math:`c = 1/B`,

.. math::

    \operatorname{budget\_sparsemax}(x) = \operatorname*{argmax}_{p \in \Delta,\ p \le c} \langle p, x\rangle
    - \tfrac12 \lVert p\rVert^2 = \operatorname{clip}(x - \tau, 0, c),

the Euclidean projection onto the capped simplex, with :math:`\tau` the root of the decreasing, piecewise
linear :math:`S(\tau) = \sum_j \operatorname{clip}(x_j - \tau, 0, c) = 1`.  Here :math:`\tau` is bracketed by
bisection (``lax.fori_loop``, a fixed number of halvings) until the free set
:math:`F = \{j : 0 < x_j - \tau < c\}` and the capped set :math:`C = \{j : x_j - \tau \ge c\}` are those of the root's
linear piece, then computed exactly there: :math:`\tau = (\sum_{j \in F} x_j + |C| c - 1)/|F|`.  The Jacobian
(a ``jax.custom_jvp``) is sparsemax's restricted to the free entries,
:math:`J = \operatorname{diag}(s) - s s^\top/|F|` with :math:`s` the indicator of :math:`F`.  A row with fewer than
:math:`B` finite entries gets :math:`c` on each (summing to less than 1) and zero gradient; an all-``-inf`` row
gives zeros; NaN or ``+inf`` in a row gives NaN in that row only.

References:

* Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured Hopfield
  Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
* André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of Attention and
  Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
"""

from __future__ import annotations

import functools
import math
from typing import Any, Union

import jax
import jax.numpy as jnp

from ._checks import check_array, check_axis, check_row_param, compute_dtype

Array = jax.Array

__all__ = ["budget_sparsemax", "check_budget"]

#: bisection halvings: enough to separate the breakpoints of float64 rows (the closed form then finishes)
_HALVINGS = 110


def _solve(x: Array, c: float) -> tuple[Array, Array]:
    """``(p, free)`` for rows ``x`` ``[..., k]`` (last axis)."""
    finite = jnp.isfinite(x)
    bad = jnp.any(jnp.isnan(x) | (x == jnp.inf), -1, keepdims=True)
    n = jnp.sum(finite, -1, keepdims=True)
    xs = jnp.where(finite, x, 0.0)
    hi = jnp.max(jnp.where(finite, x, -jnp.inf), -1, keepdims=True)
    lo = jnp.min(jnp.where(finite, x, jnp.inf), -1, keepdims=True) - c - 1.0
    hi = jnp.where(n > 0, hi, 0.0)
    lo = jnp.where(n > 0, lo, -1.0)

    def S(tau: Array) -> Array:
        return jnp.sum(jnp.where(finite, jnp.clip(xs - tau, 0.0, c), 0.0), -1, keepdims=True)

    def step(_: int, bounds: tuple[Array, Array]) -> tuple[Array, Array]:
        a, b = bounds
        mid = 0.5 * (a + b)
        above = S(mid) >= 1  # the root is at or above mid
        return jnp.where(above, mid, a), jnp.where(above, b, mid)

    a, b = jax.lax.fori_loop(0, _HALVINGS, step, (lo, hi))
    mid = 0.5 * (a + b)
    d = xs - mid
    free = finite & (d > 0) & (d < c)
    capped = finite & (d >= c)
    nf = jnp.sum(free, -1, keepdims=True)
    tau = (jnp.sum(jnp.where(free, xs, 0.0), -1, keepdims=True) + jnp.sum(capped, -1, keepdims=True) * c - 1) \
        / jnp.where(nf > 0, nf, 1)
    tau = jnp.where(nf > 0, tau, mid)
    p = jnp.where(finite, jnp.clip(xs - tau, 0.0, c), 0.0)
    feasible = n >= 1.0 / c * (1 - 1e-12)
    p = jnp.where(feasible, p, jnp.where(finite, c, 0.0))
    free = free & feasible & (nf > 0)
    p = jnp.where(bad, jnp.nan, p)
    return p, free


def _jvp_terms(x: Array, c: Any, dx: Any) -> tuple[Array, Array]:
    """``(p, J dx)`` of the rows ``x`` with the cap ``c`` (a number or ``[..., 1]``)."""
    p, free = _solve(x, c)
    if isinstance(dx, jax.custom_derivatives.SymbolicZero):
        return p, jnp.zeros_like(p)
    s = free.astype(x.dtype)
    nf = jnp.sum(s, -1, keepdims=True)
    sv = jnp.where(free, dx, 0.0)
    dp = sv - s * jnp.sum(sv, -1, keepdims=True) / jnp.where(nf > 0, nf, 1.0)
    # NaN rows: NaN, by a term linear in dx (a constant NaN would vanish when reverse mode transposes it)
    return p, dp + dx * jnp.where(jnp.isnan(p), jnp.nan, 0.0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _budget_rows(c: float, x: Array) -> Array:
    return _solve(x, c)[0]


@_budget_rows.defjvp
def _budget_rows_jvp(c: float, primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    return _jvp_terms(primals[0], c, tangents[0])


@jax.custom_jvp
def _budget_rows_array(x: Array, c: Array) -> Array:
    """One cap ``c`` per row (``[..., 1]``), a constant: its tangent is not used (not differentiated)."""
    return _solve(x, c)[0]


@functools.partial(_budget_rows_array.defjvp, symbolic_zeros=True)
def _budget_rows_array_jvp(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    return _jvp_terms(primals[0], primals[1], tangents[0])


def check_budget(budget: Any, x: Array, axis: int) -> Union[float, Array]:
    """A budget as a float, or as an array of one budget per row broadcast to ``x``'s shape with size 1
    along ``axis``; a ``TypeError`` or ``ValueError`` naming it otherwise (values checked where not traced)."""
    if isinstance(budget, bool):
        raise TypeError("budget must be a number or a floating array, got a bool")
    if isinstance(budget, (int, float)):
        if not 0 < budget < math.inf:
            raise ValueError(f"budget must be finite and > 0, got {budget!r}")
        return float(budget)
    return check_row_param(budget, x, axis, "budget")


def budget_sparsemax(x: Array, budget: Union[float, Array] = 2.0, axis: int = -1) -> Array:
    r"""Budget sparsemax: sparsemax with every probability at most :math:`1/B`, along ``axis``.

    .. math::

        \operatorname{budget\_sparsemax}(x) = \operatorname*{argmax}_{p \in \Delta,\ p \le 1/B}
        \langle p, x\rangle - \tfrac12 \lVert p\rVert^2 = \operatorname{clip}(x - \tau, 0, 1/B),

    the Euclidean projection onto the capped simplex, so at least :math:`B` entries are non-zero; :math:`B`
    times it is the k-subsets map of Santos et al. (2024) with :math:`k = B`, and :math:`B \le 1` is sparsemax.
    Exact up to rounding (the module docstring); the Jacobian is sparsemax's restricted to the entries
    strictly between the bounds.  A row with fewer than :math:`B` finite entries gets :math:`1/B` on each
    (summing to less than 1) and zero gradient.

    Args:
        x: scores, any shape; ``-inf`` entries are excluded.
        budget: :math:`B`, a finite number > 0, or a floating array of finite budgets > 0 with size 1
            along ``axis`` and broadcastable to ``x`` (one budget per row). A constant (no derivative).
            Default: ``2.0``.
        axis: the axis that sums to one. Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, softargmax_jax as sj
        >>> x = jnp.array([3.0, 1.0, 0.5, -1.0])
        >>> print(np.round(np.asarray(sj.budget_sparsemax(x, 2.0)), 4))  # sparsemax would be [1, 0, 0, 0]
        [0.5  0.5  0.   0. ]
        >>> print(np.round(np.asarray(sj.budget_sparsemax(x, 3.0)), 4))
        [0.3333 0.3333 0.3333 0.    ]
        >>> budgets = jnp.array([[2.0], [3.0]])  # one budget per row
        >>> print(np.round(np.asarray(sj.budget_sparsemax(jnp.stack([x, x]), budgets)), 4))
        [[0.5    0.5    0.     0.    ]
         [0.3333 0.3333 0.3333 0.    ]]

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured Hopfield
        Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    x = check_array(x, "x")
    axis = check_axis(x, axis)
    b = check_budget(budget, x, axis)
    if isinstance(b, float):
        return _budget_jit(b, x, axis)
    return _budget_array_jit(x, b, axis)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _budget_jit(budget: float, x: Array, axis: int) -> Array:
    z = jnp.moveaxis(x.astype(compute_dtype(x.dtype)), axis, -1)
    return jnp.moveaxis(_budget_rows(1.0 / budget, z), -1, axis).astype(x.dtype)


@functools.partial(jax.jit, static_argnums=(2,))
def _budget_array_jit(x: Array, budget: Array, axis: int) -> Array:
    dtype = compute_dtype(x.dtype)
    z = jnp.moveaxis(x.astype(dtype), axis, -1)
    c = 1.0 / jnp.moveaxis(jax.lax.stop_gradient(budget), axis, -1).astype(dtype)
    return jnp.moveaxis(_budget_rows_array(z, c), -1, axis).astype(x.dtype)
