r"""Budget sparsemax: sparsemax with every probability capped at ``1/budget``.

For a budget :math:`B > 0` and the cap :math:`c = 1/B`,

.. math::

    \operatorname{budget\_sparsemax}(x) = \operatorname*{argmax}_{p \in \Delta,\ p \le c} \langle p, x\rangle - \tfrac12 \lVert p\rVert^2,

the Euclidean projection of :math:`x` onto the capped simplex,

so at least ``B`` entries are non-zero.  ``B`` times it is the "k-subsets" map of
Santos, Niculae, McNamee & Martins, *Sparse and Structured Hopfield Networks*, ICML 2024
(https://arxiv.org/abs/2402.13725): the SparseMAP projection onto the marginal polytope of
the subsets of size :math:`k = B`, :math:`\{\mu \in [0, 1]^n : \sum_j \mu_j = B\}`, since
:math:`\operatorname*{argmin}_{0 \le \mu \le 1,\ \sum_j \mu_j = B} \lVert \mu - x\rVert^2 = B \cdot \operatorname{budget\_sparsemax}(x / B)`.  ``B <= 1`` is
sparsemax (the cap ``c >= 1`` never binds); ``B`` equal to the number of entries gives the
uniform distribution.

**Solution.**  The KKT conditions give :math:`p_j = \operatorname{clip}(x_j - \tau, 0, c)` with :math:`\tau` the root of
the decreasing, piecewise-linear

.. math::

    S(\tau) = \sum_j \operatorname{clip}(x_j - \tau, 0, c) = 1.

Bracket: :math:`S(\tau_{hi}) \le 1` at :math:`\tau_{hi} = \max_j x_j - 1/k` (every term is at most :math:`1/k`) and
:math:`S(\tau_{lo}) \ge 1` at :math:`\tau_{lo} = x_{(\lceil B\rceil)} - \min(c, 1)` with :math:`x_{(i)}` the :math:`i`-th largest
score (the :math:`\lceil B\rceil` largest entries are capped, :math:`\lceil B\rceil c \ge 1`; for :math:`B \le 1` the largest
alone gives 1).  Since :math:`\tau \ge \tau_{lo}`, only scores above :math:`\tau_{lo}` can be non-zero: long
rows are **pruned** to the blocks holding such scores (the block scheme of
:mod:`softargmax.solvers.threshold`).  On the candidates, **Newton's method** with the free set
:math:`F = \{j : 0 < x_j - \tau < c\}` and capped set :math:`C = \{j : x_j - \tau \ge c\}` steps to

.. math::

    \tau \leftarrow \Big(\sum_{j \in F} x_j + \lvert C\rvert c - 1\Big) \Big/ \lvert F\rvert,

the root of the linear piece :math:`\tau` lies on; a step that leaves the current bracket (or an
empty :math:`F`) is replaced by bisection.  On a piecewise-linear function Newton lands on the
exact root as soon as it reaches the right piece, so the result is exact up to rounding
(the closed form on the final free and capped sets), typically after a few passes.

**Jacobian.**  With :math:`s` the indicator of the free set, :math:`d\tau = \sum_{j \in F} dx_j / \lvert F\rvert` and

.. math::

    J = \operatorname{diag}(s) - s s^\top / \lvert F\rvert \qquad (0 \text{ if } F \text{ is empty}),

the sparsemax Jacobian restricted to the free entries: capped and zero entries do not move.
The map is not differentiated with respect to the budget.

**Rows that cannot meet the budget.**  A row with fewer than ``B`` unmasked (finite)
entries has no point of the capped simplex; it gets ``c`` on every unmasked entry (the
limit :math:`\tau \to -\infty`; it sums to less than 1) and zero gradient.  An all-``-inf`` row gives
zeros.  A NaN or ``+inf`` in a row gives NaN in that row only.

Conventions: any ``dim``; float64/float32 native, float16/bfloat16 computed in float32.
The fused CPU and GPU row solvers do not cover this map: they are specialised to
:math:`\sum_j g(x_j - \tau) = 1` with one smooth ``g`` per operator, and the two breakpoints per entry
would need a second set of kernels; the PyTorch path here is already a few passes over
the pruned candidates.
"""

from __future__ import annotations

import math
from typing import Any, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import check_dim, check_tensor
from .._utils.rows import Rows
from ..solvers.threshold import MAX_ITER, Solution, block_layout, select_blocks

__all__ = ["budget_sparsemax", "solve_budget", "check_budget"]


def check_budget(budget: object, name: str = "budget") -> Union[float, Tensor]:
    """Validate a budget: a number or a floating tensor of finite values ``> 0``.

    Args:
        budget: the value to check.
        name: the argument's name, for the error messages. Default: ``"budget"``.

    Returns:
        ``budget`` as a float, or the tensor itself.

    Shape:
        - budget: a number, or a tensor of any shape (returned as it is).

    Raises:
        TypeError: not a number or a floating-point tensor.
        ValueError: a value that is not finite and ``> 0``.

    Examples:
        >>> from softargmax.operators.budget import check_budget
        >>> check_budget(2)
        2.0
        >>> check_budget(0.0)
        Traceback (most recent call last):
            ...
        ValueError: budget must be finite and > 0, got 0.0
    """
    if isinstance(budget, Tensor):
        if not budget.is_floating_point():
            raise TypeError(f"{name} must be a number or a floating-point tensor, got dtype {budget.dtype}")
        b = budget.detach()
        if bool((~(b > 0) | ~torch.isfinite(b)).any()):
            raise ValueError(f"{name} must be finite and > 0, got values in [{b.min().item()}, {b.max().item()}]")
        return budget
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"{name} must be a number or a tensor, got {type(budget).__name__}")
    budget = float(budget)
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"{name} must be finite and > 0, got {budget}")
    return budget


def _evaluate(cand: Tensor, tau: Tensor, cap: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``p = clip(cand - τ, 0, c)``, the free-set indicator ``s`` (float), ``S = Σ p`` and ``|F| = Σ s``."""
    p = torch.sub(cand, tau).clamp_(min=0)
    p = torch.minimum(p, cap)
    s = torch.sign(p * (cap - p))  # 1 on 0 < p < c, float (no bool -> int conversions)
    return p, s, p.sum(-1, keepdim=True), s.sum(-1, keepdim=True)


#: up to this budget the ⌈B⌉-th largest score is found by repeated maxima (``topk`` is slow on
#: many short rows); above it by ``topk``
REPEATED_MAX_UP_TO = 16


def _kth_largest_lower(src: Tensor, nb: Tensor, K0: int, m: Tensor) -> Tensor:
    """A lower bound on the ``nb``-th largest entry of every row (``[R, 1]``), exact without ties.

    Repeated maxima remove every entry tied with the current maximum at once, so with ties
    the value returned is lower (still a valid bound for ``τ_lo``); ``-inf`` when the row runs
    out of distinct finite values (the caller then computes it exactly).
    """
    if K0 == 1:
        return m
    if K0 > REPEATED_MAX_UP_TO:
        return src.topk(K0, dim=-1, sorted=True).values.gather(1, nb - 1)
    cur = src.amax(-1, keepdim=True)
    out = cur
    vals = src
    for j in range(2, K0 + 1):
        vals = torch.where(vals >= cur, torch.full_like(vals, -math.inf), vals)
        cur = vals.amax(-1, keepdim=True)
        out = torch.where(nb == j, cur, out)
    return out


def solve_budget(z: Tensor, budget: Tensor, prune: bool = True, max_iter: int = MAX_ITER) -> Solution:
    r"""Budget sparsemax of the rows of ``z``: the threshold search behind :func:`budget_sparsemax`.

    .. math::

        p_j = \operatorname{clip}(z_j - \tau, 0, 1/B), \qquad \sum_j p_j = 1,

    found by pruning and Newton steps on the piecewise-linear :math:`\sum_j p_j(\tau)` (the module
    docstring).  No autograd.

    Args:
        z: rows of scores, contiguous, float32 or float64.
        budget: one budget :math:`B > 0` per row.
        prune: solve on the blocks that may hold non-zero entries only (long rows). Default: ``True``.
        max_iter: the most Newton (or bisection) steps. Default: :data:`~softargmax.solvers.threshold.MAX_ITER`.

    Returns:
        a :class:`~softargmax.solvers.threshold.Solution` in the sparsemax parametrization: ``p``
        and ``s`` (the free-set indicator) on the candidates, ``s_sum`` the size :math:`\lvert F\rvert`
        of the free set, ``tau`` the thresholds.

    Shape:
        - z: :math:`(R, k)`.
        - budget: :math:`(R, 1)`.
        - Output: a solution with ``p`` of shape :math:`(R, K)`, :math:`K \le k` candidates.

    Examples:
        >>> import torch
        >>> from softargmax.operators.budget import solve_budget
        >>> sol = solve_budget(torch.tensor([[3.0, 1.0, 0.8, -1.0]]), torch.tensor([[2.0]]))
        >>> sol.scatter(sol.p), sol.tau, sol.s_sum
        (tensor([[0.5000, 0.3500, 0.1500, 0.0000]]), tensor([[0.6500]]), tensor([[2.]]))

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    R, k = z.shape
    dtype = z.dtype
    eps = torch.finfo(dtype).eps
    budget = budget.to(dtype)
    cap = 1.0 / budget

    layout = block_layout(k) if prune else None
    if layout is not None:
        B, nbk = layout
        zb = z.reshape(R, B, nbk)
        bmax = zb.amax(1)  # one strided pass: the block maxima
        m = bmax.amax(-1, keepdim=True)
    else:
        m = z.amax(-1, keepdim=True)
    bad = torch.isnan(m) | (m == math.inf)
    bad_rows = bad if bool(bad.any()) else None

    # τ_lo = z_(⌈B⌉) - min(c, 1).  The ⌈B⌉-th largest block maximum is at most z_(⌈B⌉) and
    # already has ⌈B⌉ entries at or above it, so it gives a valid (slightly lower) bound
    # from a short top-k; rows where it is not finite are checked exactly below.
    nb = torch.ceil(budget).clamp(1, k).long()
    K0 = int(nb.max())
    src = bmax if layout is not None and K0 <= bmax.shape[-1] else z
    zB = _kth_largest_lower(src, nb, K0, m)
    short = torch.zeros_like(bad)
    unsure = ~torch.isfinite(zB) & ~bad
    if bool(unsure.any()):
        # masked entries (all-masked rows included): count the unmasked ones and take the
        # exact ⌈B⌉-th largest; fewer unmasked entries than the budget make the row short
        idx = unsure.squeeze(1).nonzero().squeeze(1)
        zr = z.index_select(0, idx)
        count = (zr > -math.inf).sum(-1, keepdim=True).to(dtype)
        short.index_copy_(0, idx, count < budget.index_select(0, idx))
        exact = zr.topk(K0, dim=-1, sorted=True).values.gather(1, nb.index_select(0, idx) - 1)
        zB = zB.index_copy(0, idx, exact)
    special = bad | short
    any_special = bool(special.any())
    lo = zB - cap.clamp(max=1.0)
    hi = m - 1.0 / k
    # pruning keeps every unmasked entry of the special rows (short rows need them all)
    thr = torch.where(special, torch.full_like(lo, -math.inf), lo) if any_special else lo
    if any_special:
        # the special rows iterate on a harmless row (0.5, -inf, ...) with c = 1, solved at τ = -0.5
        lo = torch.where(special, torch.full_like(lo, -0.5), lo)
        hi = torch.where(special, torch.ones_like(hi), hi)

    block_index = None
    cand = z
    if layout is not None:
        table, valid = select_blocks(bmax, thr)
        if table is not None and valid is not None:  # both or neither
            KB = table.shape[1]
            block_index = table.unsqueeze(1).expand(R, B, KB)
            cand = zb.gather(2, block_index)
            cand = torch.where(valid.unsqueeze(1), cand, torch.full_like(cand, -math.inf)).reshape(R, B * KB)
    if any_special:
        cand = torch.where(special, torch.full_like(cand, -math.inf), cand)
        cand[special.squeeze(-1), 0] = 0.5
        cap_it = torch.where(special, torch.ones_like(cap), cap)
    else:
        cap_it = cap

    K = cand.shape[-1]
    tol = 8 * eps * max(1.0, math.log2(K + 1))
    tau = lo
    it = 0
    done = torch.zeros_like(m, dtype=torch.bool)
    while True:
        p, s, S, nF = _evaluate(cand, tau, cap_it)
        resid = S - 1
        done = done | (resid.abs() <= tol) | (hi - lo <= 4 * eps * (1 + tau.abs()))
        if it >= max_iter or bool(done.all()):
            break
        lo = torch.where(resid >= 0, tau, lo)
        hi = torch.where(resid < 0, tau, hi)
        new = tau + resid / nF.clamp_min(1)
        inside = (nF > 0) & (new > lo) & (new < hi)
        new = torch.where(inside, new, 0.5 * (lo + hi))
        tau = torch.where(done, tau, new)
        it += 1
    # polish: the closed form on the final free and capped sets (a residual within the
    # tolerance, e.g. after a bisection step, becomes rounding error)
    tau = torch.where(nF > 0, tau + resid / nF.clamp_min(1), tau)
    p, s, _, nF = _evaluate(cand, tau, cap_it)
    if any_special:
        # short rows: c on every unmasked candidate (pruning never drops them: lo is -inf there
        # unless the row is all masked); bad rows are masked by dense_p
        fill = torch.where(short, cap, torch.zeros_like(cap))
        orig = z if block_index is None else zb.gather(2, block_index).reshape(R, -1)
        p = torch.where(special, torch.where(orig > -math.inf, fill, torch.zeros_like(p)), p)
        s = s.masked_fill(special, 0.0)
        nF = nF.masked_fill(special, 0.0)
    return Solution(tau=tau, p=p, s=s, s_sum=nF, block_index=block_index, k=k, bad_rows=bad_rows, iterations=it)


class _BudgetSparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, budget2d: Tensor, dim: int, rows: Rows) -> Tensor:
        sol = solve_budget(rows.flat, budget2d)
        ctx.rows, ctx.sol = rows, sol
        return rows.restore(sol.dense_p())

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        rows: Rows = ctx.rows
        sol: Solution = ctx.sol
        vc = sol.gather(rows.to_rows(grad_out))
        s = sol.s
        assert s is not None  # solve_budget keeps the Jacobian weights
        sv = s * vc
        c = sv.sum(-1, keepdim=True) / sol.s_sum.clamp_min(1)
        g = sol.scatter(torch.addcmul(sv, s, c, value=-1.0))
        if sol.bad_rows is not None:
            g = g.masked_fill(sol.bad_rows, math.nan)
        return rows.restore(g), None, None, None


def budget_sparsemax(x: Tensor, budget: Union[float, Tensor] = 2.0, dim: int = -1) -> Tensor:
    r"""Budget sparsemax: sparsemax with every probability at most :math:`1/B`, along ``dim``.

    .. math::

        \operatorname{budget\_sparsemax}(x) = \operatorname*{argmax}_{p \in \Delta,\ p \le 1/B}
        \langle p, x\rangle - \tfrac12 \lVert p\rVert^2 = \operatorname{clip}(x - \tau, 0, 1/B),

    the Euclidean projection onto the capped simplex, so at least :math:`B` entries are non-zero;
    :math:`B` times it is the k-subsets map of Santos et al. (2024) with :math:`k = B`.  Exact up to
    rounding; the Jacobian is sparsemax's restricted to the entries strictly between the bounds
    (the module docstring).  A row with fewer than :math:`B` finite entries gets :math:`1/B` on each
    (summing to less than 1) and zero gradient.

    Args:
        x: scores, any shape; a ``-inf`` entry is excluded (probability 0, gradient 0).
        budget: :math:`B > 0`, a float or a floating tensor broadcastable to ``x`` with size 1
            along ``dim`` (one budget per row; not differentiated).  At least :math:`B` entries
            of the output are non-zero; :math:`B \le 1` is sparsemax. Default: ``2.0``.
        dim: the dimension that sums to one. Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype (float16/bfloat16 computed in float32).

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - budget: a number, or a tensor broadcastable to the input with size 1 along ``dim``.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([3.0, 1.0, 0.8, -1.0])
        >>> sa.sparsemax(x)
        tensor([1., 0., 0., 0.])
        >>> sa.budget_sparsemax(x, budget=2.0)  # capped at 1/2
        tensor([0.5000, 0.3500, 0.1500, 0.0000])
        >>> 2 * sa.budget_sparsemax(x / 2, budget=2.0)  # the k-subsets map, k = 2: a fractional pair
        tensor([1.0000, 0.6000, 0.4000, 0.0000])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """
    check_tensor(x)
    dim = check_dim(x, dim)
    budget = check_budget(budget)
    if isinstance(budget, Tensor) and budget.dim() > x.dim():
        raise ValueError(f"budget of shape {tuple(budget.shape)} has more dimensions than x {tuple(x.shape)}")
    if x.numel() == 0:
        return x * 0
    rows = Rows(x, dim)
    if isinstance(budget, Tensor):
        b2d = rows.row_param(budget.detach(), "budget")
    else:
        b2d = torch.full((rows.R, 1), budget, dtype=rows.dtype, device=x.device)
    return _BudgetSparsemax.apply(x, b2d, dim, rows)
