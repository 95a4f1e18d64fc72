r"""α-normmax: the regularized argmax of a norm (Santos et al. 2024).

For α > 1,

.. math::

    \operatorname{normmax}_\alpha(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle - \lVert p\rVert_\alpha

(the "norm entropy" :math:`1 - \lVert p\rVert_\alpha` of Santos, Niculae, McNamee & Martins, *Sparse and
Structured Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725).
:math:`\lVert\cdot\rVert_\alpha` is homogeneous of degree 1, so the scale of ``x`` matters (there is no
temperature to absorb it): ``normmax(c x)`` becomes sparser as ``c`` grows.

**Solution.**  With :math:`N = \lVert p\rVert_\alpha` the stationarity condition on the support reads
:math:`(p_j / N)^{\alpha-1} = x_j - \tau`, so :math:`p_j = N u_j^{1/(\alpha-1)}` with :math:`u = [x - \tau]_+`.
Taking the α-norm of both sides gives the root equation of :math:`\tau`,

.. math::

    \sum_j [x_j - \tau]_+^{\beta} = 1, \qquad \beta = \frac{\alpha}{\alpha-1} \quad \text{(the Hölder conjugate of } \alpha\text{)},

i.e. :math:`\lVert[x - \tau]_+\rVert_\beta = 1`, and then :math:`p = r / \sum_j r_j` with :math:`r = u^{1/(\alpha-1)} = u^{\beta-1}`.

**Reduction to α-entmax.**  α'-entmax of scores :math:`z` solves :math:`\sum_j [(\alpha'-1) z_j - \tau']_+^{1/(\alpha'-1)} = 1`.
With :math:`\alpha' = 2 - 1/\alpha` (so :math:`1/(\alpha'-1) = \beta`) and :math:`z = \beta x` (so :math:`(\alpha'-1) z = x`) this is
the equation above with :math:`\tau' = \tau`, and the α'-entmax output is :math:`u^\beta`.  Hence

.. math::

    \operatorname{normmax}_\alpha(x) = \operatorname{normalize}\Big( \operatorname{entmax}_{2 - 1/\alpha}\big(\tfrac{\alpha x}{\alpha-1}\big)^{1/\alpha} \Big),

and α' ∈ (1, 2) for every α > 1.  The threshold is found by the library's α-entmax
solver (pruning, safeguarded Newton that is monotone for α' ∈ (1, 2], the fused CPU row
solver and the GPU kernels where they cover α'), so normmax costs one α-entmax solve
plus one power and one normalization on the candidates.  α = 2 uses the exact
1.5-entmax closed form; α → ∞ tends to sparsemax (up to normalization) and α → 1 to the
argmax.

**α = 1** is that limit, and accepted: :math:`\lVert p\rVert_1 = 1` on the simplex, so 1-normmax is
the argmax, and the limit of the α-normmax of tied maxima (symmetric for every α > 1) is the
uniform distribution over them: ``normmax(x, 1)`` is ``1/m`` on the ``m`` maximal scores of
a row (as the ``entmax`` package's ``normmax_bisect(x, alpha=1)``).  It is piecewise
constant, so its gradient is zero (where the package's is ``inf``/NaN); a per-row α may
mix rows with α = 1 and α > 1.

**Jacobian.**  Differentiating :math:`\sum_j u_j^\beta = 1` gives :math:`d\tau = \langle p, dx\rangle`; with
:math:`R = \sum_j r_j = 1/\lVert p\rVert_\alpha` and :math:`s_j = (\beta-1) u_j^{\beta-2} / R = \lVert p\rVert_\alpha^{\alpha-1} p_j^{2-\alpha} / (\alpha-1)`
on the support (0 elsewhere),

.. math::

    J = \operatorname{diag}(s) - s p^\top - p s^\top + \Big(\sum_j s_j\Big) p p^\top, \qquad
    J v = s \odot (v - c) - p \langle s, v - c\rangle, \quad c = \langle p, v\rangle,

symmetric, one pass over the row (never ``k × k``).  For α > 2 the weights grow without
bound as ``p_j → 0`` (as for α-entmax with α > 2).  The map is not differentiable in α
(as in the reference implementation); a tensor α is a constant here.

Conventions: any ``dim``; float64/float32 native, float16/bfloat16 computed in float32;
``-inf`` scores get probability 0 and gradient 0; an all-``-inf`` row gives zeros; NaN
or ``+inf`` in a row gives NaN in that row only.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import check_alpha, check_dim, check_tensor, compute_dtype
from .._utils.rows import Rows, shift_by_row_max
from .._utils.tracing import GRAPH, LIBRARY_OPS, graph_mode, values_checkable
from ..divergences import AlphaDivergence, get_divergence
from ..solvers.threshold import Solution, solve
from ..solvers.traceable import solve_rows
from ._autograd import solve_grouped
from ._traceable import to_last

__all__ = ["normmax", "normmax_rows", "argmax_rows", "normmax_eager", "normmax_graph"]


def argmax_rows(z: Tensor) -> tuple[Tensor, Tensor]:
    r"""1-normmax of the rows of ``z``: the argmax, uniform over each row's tied maxima.

    .. math::

        p_j = \frac{[z_j = \max_i z_i]}{\lvert \{i : z_i = \max_l z_l\}\rvert},

    the limit of :math:`\operatorname{normmax}_\alpha(z)` as :math:`\alpha \to 1` (the module docstring).
    Zeros for an all-``-inf`` row, NaN for a row with NaN or ``+inf``.

    Args:
        z: rows of scores.

    Returns:
        the pair ``(p, bad_rows)``: ``p`` of ``z``'s shape and dtype, and ``bad_rows`` the boolean
        mask of the rows with NaN or ``+inf`` (as the threshold solver's
        :class:`~softargmax.solvers.threshold.Solution`).

    Shape:
        - z: :math:`(R, k)`.
        - Output: :math:`(R, k)` and :math:`(R, 1)`.

    Examples:
        >>> import torch
        >>> from softargmax.operators.normmax import argmax_rows
        >>> z = torch.tensor([[1.0, 2.0, 2.0], [0.0, float("nan"), 1.0]])
        >>> p, bad = argmax_rows(z)
        >>> p
        tensor([[0.0000, 0.5000, 0.5000],
                [   nan,    nan,    nan]])
        >>> bad
        tensor([[False],
                [ True]])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    m = z.amax(-1, keepdim=True)
    ties = (z == m) & (m > -math.inf)
    p = ties.to(z.dtype)
    p = p / p.sum(-1, keepdim=True).clamp_min(1)
    bad = (torch.isnan(z) | (z == math.inf)).any(-1, keepdim=True)
    return p.masked_fill(bad, math.nan), bad


class _Argmax(torch.autograd.Function):
    """1-normmax along ``dim``; piecewise constant, so the backward is zero."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int) -> Tensor:
        rows = Rows(x, dim)
        ctx.rows = rows
        return rows.restore(argmax_rows(rows.flat)[0])

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        return torch.zeros_like(grad_out), None


def _normalize_candidates(sol: Solution, inv_alpha: Union[float, Tensor]) -> tuple[Tensor, Tensor]:
    """``(p, ‖p‖_α)`` on the candidates from the α'-entmax solution ``u^β`` (``[R, K]``, ``[R, 1]``)."""
    g = sol.p
    if isinstance(inv_alpha, float) and inv_alpha == 0.5:
        r = torch.sqrt(g)
    else:
        r = g.pow(inv_alpha)
    R = r.sum(-1, keepdim=True)
    tiny = torch.finfo(r.dtype).tiny
    p = r / R.clamp_min(tiny)  # all-masked rows: r = 0, p = 0
    # ‖p‖_α = (Σ r^α)^{1/α} / R = (Σ u^β)^{1/α} / R = 1/R at the root (Σ u^β = 1 to rounding)
    norm = (g.sum(-1, keepdim=True).clamp_min(0) ** inv_alpha) / R.clamp_min(tiny)
    return p, norm


def normmax_rows(z: Tensor, alpha: Union[float, Tensor]) -> tuple[Tensor, Tensor, Solution]:
    r"""Normmax of the rows of ``z``, on the candidates of its α'-entmax solve (no autograd).

    .. math::

        \operatorname{normmax}_\alpha(z) = \operatorname{normalize}\Big( \operatorname{entmax}_{2 - 1/\alpha}
        \big(\tfrac{\alpha z}{\alpha-1}\big)^{1/\alpha} \Big)

    (the module docstring derives it).  The kernel behind :func:`normmax`: the solution keeps only
    the candidate entries that may be in the support, and ``sol.scatter`` makes them a dense row.

    Args:
        z: rows of scores, contiguous, float32 or float64.
        alpha: a float > 1, or a tensor of one α > 1 per row.

    Returns:
        the triple ``(p, norm, sol)``: the candidates' probabilities, :math:`\lVert p\rVert_\alpha` of
        each row, and the α'-entmax :class:`~softargmax.solvers.threshold.Solution` (its ``scatter``
        and ``gather`` map between candidates and full rows).

    Shape:
        - z: :math:`(R, k)`.
        - alpha: a number or :math:`(R, 1)`.
        - Output: :math:`(R, K)` with :math:`K \le k` candidates, :math:`(R, 1)`, and the solution.

    Examples:
        >>> import torch, softargmax as sa
        >>> from softargmax.operators.normmax import normmax_rows
        >>> z = torch.tensor([[1.0, 0.8, -1.0]])
        >>> p, norm, sol = normmax_rows(z, 2.0)
        >>> sol.scatter(p)
        tensor([[0.5714, 0.4286, 0.0000]])
        >>> norm
        tensor([[0.7143]])
        >>> torch.allclose(sol.scatter(p), sa.normmax(z, 2.0))
        True

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    a_prime: Union[float, Tensor]
    inv_alpha: Union[float, Tensor]
    # each row shifted by its maximum first (normmax is invariant to it): a large offset divided by α' - 1
    # would otherwise lose the scores' digits (float32 rows offset by 1e4 lost up to 6e-4 of p)
    if isinstance(alpha, Tensor):
        a_prime = (alpha - 1) / alpha  # α' - 1 = 1/β, per row
        sol = solve_grouped(shift_by_row_max(z) / a_prime, 1 + a_prime)
        inv_alpha = 1.0 / alpha
    else:
        a_prime = (alpha - 1.0) / alpha
        # on CPU the pruned solution: the power and the normalization then cost only the
        # candidates (the fused CPU solver's dense rows would make them full-size, and
        # transcendental functions of the many zeros are slow); on GPU the Triton kernels
        sol = solve(shift_by_row_max(z, a_prime), get_divergence("alpha", alpha=1.0 + a_prime), candidates_only=True)
        inv_alpha = 1.0 / alpha
    p, norm = _normalize_candidates(sol, inv_alpha)
    return p, norm, sol


def _jvp(p: Tensor, v: Tensor, alpha: Union[float, Tensor], norm: Tensor) -> Tensor:
    """``J v`` of normmax for rows ``p``, ``v`` (module docstring)."""
    supp = p > 0
    am1 = alpha - 1
    base = torch.where(supp, p, torch.ones_like(p))
    if isinstance(alpha, float) and alpha == 2.0:
        w = torch.ones_like(p)
    else:
        w = base.pow(2 - alpha) if isinstance(alpha, float) else torch.exp((2 - alpha) * torch.log(base))
    s = torch.where(supp, w, torch.zeros_like(w)) * (norm ** am1 / am1)
    c = (p * v).sum(-1, keepdim=True)
    vc = v - c
    return s * vc - p * (s * vc).sum(-1, keepdim=True)


class _Normmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
        rows = Rows(x, dim)
        a = rows.row_param(alpha.detach(), "alpha") if isinstance(alpha, Tensor) else alpha
        pc, norm, sol = normmax_rows(rows.flat, a)
        p = sol.scatter(pc)
        if sol.bad_rows is not None:
            p = p.masked_fill(sol.bad_rows, math.nan)
        ctx.rows, ctx.alpha, ctx.sol = rows, a, sol
        ctx.save_for_backward(pc, norm)
        return rows.restore(p)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Optional[Tensor], None, None]:
        pc, norm = ctx.saved_tensors
        rows: Rows = ctx.rows
        sol: Solution = ctx.sol
        g = sol.scatter(_jvp(pc, sol.gather(rows.to_rows(grad_out)), ctx.alpha, norm))  # on the candidates
        if sol.bad_rows is not None:
            g = g.masked_fill(sol.bad_rows, math.nan)
        return rows.restore(g), None, None


def normmax(x: Tensor, alpha: Union[float, Tensor] = 2.0, dim: int = -1) -> Tensor:
    r"""α-normmax along ``dim``: the regularized argmax of a norm, sparse, and sparser as the scores grow.

    .. math::

        \operatorname{normmax}_\alpha(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle - \lVert p\rVert_\alpha
        = \frac{r}{\sum_j r_j}, \qquad r = [x - \tau]_+^{1/(\alpha-1)},

    with :math:`\tau` such that :math:`\lVert[x - \tau]_+\rVert_{\alpha/(\alpha-1)} = 1` (the module docstring
    derives it, with the Jacobian).  The norm is homogeneous of degree 1, so the scale of ``x``
    matters: :math:`\operatorname{normmax}(c x)` is sparser as :math:`c` grows.

    Args:
        x: scores, any shape; a ``-inf`` entry is excluded (probability 0, gradient 0).
        alpha: a float ``>= 1`` or a floating tensor ``>= 1`` broadcastable to ``x`` with size
            1 along ``dim`` (one α per row).  Not differentiated.  α = 1 is the argmax,
            uniform over ties, with a zero gradient (module docstring). Default: ``2.0``.
        dim: the dimension that sums to one. Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype (float16/bfloat16 computed in float32); a row
        that is entirely ``-inf`` gives zeros.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - alpha: a number, or a tensor broadcastable to the input with size 1 along ``dim``.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([1.0, 0.8, -1.0])
        >>> sa.normmax(x)
        tensor([0.5714, 0.4286, 0.0000])
        >>> sa.normmax(10 * x)  # the scale matters
        tensor([1., 0., 0.])
        >>> sa.normmax(torch.tensor([2.0, 2.0, 1.0]), alpha=1.0)  # the argmax, uniform over ties
        tensor([0.5000, 0.5000, 0.0000])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    check_tensor(x)
    dim = check_dim(x, dim)
    alpha = check_alpha(alpha, "alpha", minimum=1.0)
    if isinstance(alpha, Tensor) and alpha.dim() > x.dim():
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} has more dimensions than x {tuple(x.shape)}")
    if x.numel() == 0:
        return x * 0
    mode = graph_mode()
    if mode == GRAPH:  # recorded for ONNX or torch.jit.trace: PyTorch's operators only
        return normmax_graph(x, alpha, dim)
    if mode == LIBRARY_OPS:  # one opaque operator for torch.compile / torch.export (softargmax.operators._library_ops)
        tensor = isinstance(alpha, Tensor)
        return torch.ops.softargmax.normmax(x, alpha if tensor else None, 0.0 if tensor else alpha, dim)
    return normmax_eager(x, alpha, dim)


def normmax_eager(x: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    r""":func:`normmax` by its autograd functions: the eager path, with the fused solvers and the backward.

    .. math::

        \operatorname{normmax}_\alpha(x) = \operatorname{normalize}\Big(
        \operatorname{entmax}_{2 - 1/\alpha}\big(\tfrac{\alpha x}{\alpha-1}\big)^{1/\alpha} \Big)

    (the module docstring), the argmax, uniform over ties, where :math:`\alpha = 1`.
    :func:`normmax` calls it outside of graph recording, and the ``softargmax::normmax`` operator
    that ``torch.compile`` and ``torch.export`` record runs it.  The arguments are not checked
    (the caller has): ``x`` is non-empty and ``dim`` non-negative.

    Args:
        x: the scores, non-empty.
        alpha: :math:`\alpha \ge 1`, a float or a tensor broadcastable to ``x`` with size 1 along ``dim``.
        dim: the dimension normalized, non-negative.

    Returns:
        the prediction, ``x``'s shape and dtype.

    Shape:
        - x: :math:`(*)`; alpha: a float or broadcastable to :math:`(*)` with size 1 along ``dim``.
        - Output: :math:`(*)`.

    Examples:
        For :math:`\alpha = 2`, :math:`\sum_j [x_j - \tau]_+^2 = 1` gives :math:`\tau = 0.2` for
        :math:`x = (1, 0.8, -1)`, and :math:`p \propto [x - \tau]_+ = (0.8, 0.6, 0)`:

        >>> import torch
        >>> from softargmax.operators.normmax import normmax_eager
        >>> x = torch.tensor([[1.0, 0.8, -1.0], [2.0, 2.0, 0.0]])
        >>> torch.allclose(normmax_eager(x, 2.0, 1)[0], torch.tensor([4 / 7, 3 / 7, 0.0]))
        True
        >>> normmax_eager(x, 1.0, 1)  # the argmax, uniform over ties
        tensor([[1.0000, 0.0000, 0.0000],
                [0.5000, 0.5000, 0.0000]])

        The autograd function's backward agrees with finite differences:

        >>> x64 = torch.tensor([[1.0, 0.8, -1.0, 0.5]], dtype=torch.float64, requires_grad=True)
        >>> torch.autograd.gradcheck(lambda z: normmax_eager(z, 3.0, 1), (x64,))
        True

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    if isinstance(alpha, float) and alpha == 1.0:
        return _Argmax.apply(x, dim)
    if isinstance(alpha, Tensor) and values_checkable(alpha) and bool((alpha == 1).any()):
        one = alpha.detach() == 1  # those rows: the argmax; the others: normmax (α = 2 stands in)
        p = _Normmax.apply(x, torch.where(one, torch.full_like(alpha, 2.0), alpha), dim)
        return torch.where(one, _Argmax.apply(x, dim), p)
    return _Normmax.apply(x, alpha, dim)


def normmax_graph(x: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    r""":func:`normmax` as PyTorch's own operators, what exporters record.

    .. math::

        \operatorname{normmax}_\alpha(x) = \operatorname{normalize}\Big(
        \operatorname{entmax}_{2 - 1/\alpha}\big(\tfrac{\alpha x}{\alpha-1}\big)^{1/\alpha} \Big),

    the α'-entmax of the module docstring's reduction by the traceable solver
    (:func:`softargmax.solvers.traceable.solve_rows`), then the power and the normalization; the
    argmax, uniform over ties, where :math:`\alpha = 1`.  :func:`normmax` calls it while
    ``torch.onnx.export`` or ``torch.jit.trace`` records a model, and
    :func:`softargmax.operators.export.decompositions` replaces the ``softargmax::normmax``
    operator of an exported program by it.  No autograd function (for inference); the arguments
    are not checked (the caller has).

    Args:
        x: the scores.
        alpha: :math:`\alpha \ge 1`, a float or a tensor broadcastable to ``x`` with size 1 along ``dim``.
        dim: the dimension normalized, non-negative.

    Returns:
        the prediction, ``x``'s shape and dtype.

    Shape:
        - x: :math:`(*)`; alpha: a float or broadcastable to :math:`(*)` with size 1 along ``dim``.
        - Output: :math:`(*)`.

    Examples:
        The eager path's result (the same closed form as in :func:`normmax_eager`), and for one
        :math:`\alpha` per row:

        >>> import torch
        >>> from softargmax.operators.normmax import normmax_eager, normmax_graph
        >>> x = torch.tensor([[1.0, 0.8, -1.0], [2.0, 2.0, 0.0]])
        >>> torch.allclose(normmax_graph(x, 2.0, 1)[0], torch.tensor([4 / 7, 3 / 7, 0.0]))
        True
        >>> alpha = torch.tensor([[1.5], [3.0]])
        >>> torch.allclose(normmax_graph(x, alpha, 1), normmax_eager(x, alpha, 1), atol=1e-6)
        True

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    dtype = compute_dtype(x.dtype)
    z = to_last(x, x.dim(), dim).to(dtype)
    if isinstance(alpha, Tensor):
        a = to_last(alpha.detach(), x.dim(), dim).to(torch.float64)
        one = a == 1
        a = torch.where(one, torch.full_like(a, 2.0), a)  # rows with α = 1: the argmax, below
        a_primes = (a - 1) / a  # α' per row
        # the scaled scores rounded to z's dtype, as the eager path scales them
        g = solve_rows((shift_by_row_max(z) / a_primes.to(z.dtype)).to(torch.float64), AlphaDivergence(1 + a_primes))
        r = g.pow(1 / a)
    else:
        one = None
        if alpha == 1.0:
            r = argmax_rows(z)[0]
        else:
            a_prime = (alpha - 1.0) / alpha
            g = solve_rows(shift_by_row_max(z) / a_prime, get_divergence("alpha", alpha=1.0 + a_prime))
            r = torch.sqrt(g) if alpha == 2.0 else g.pow(1.0 / alpha)
    p = r / r.sum(-1, keepdim=True).clamp_min(torch.finfo(r.dtype).tiny)
    keep = (z > -math.inf).any(-1, keepdim=True) | (torch.isnan(z) | (z == math.inf)).any(-1, keepdim=True)
    p = torch.where(keep, p, torch.zeros_like(p))  # a row that is entirely -inf: zeros
    if one is not None:
        p = torch.where(one, argmax_rows(z)[0].to(p.dtype), p)
    p = p.to(x.dtype)
    return p if dim == x.dim() - 1 else p.movedim(-1, dim)
