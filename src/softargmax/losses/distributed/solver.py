r"""The threshold of rows whose classes are split over a process group.

A row's threshold ``τ`` solves ``S(τ) = Σ_r S_r(τ) = 1`` with ``S_r`` the sum over rank ``r``'s
classes, so each step of the Newton iteration of :mod:`softargmax.solvers.newton` (the one the
one-process solver runs) needs only the per-row partial sums ``S_r`` and ``S'_r``, which are
all-reduced: that all-reduce is the communication injected into the shared loop.  Before it, one
``MAX`` round gives the row maxima (the bracket) and each slice's own root (a lower bound to
start from).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ...backends.solution import Solution
from ...divergences import Divergence
from ...solvers.newton import MAX_ITER, bound_offsets, finite_maxima, neutralize_rows, newton_rows
from ...solvers.threshold import solve as solve_local
from .._row_losses import FenchelYoungRowLoss
from .._rows import SplitSolve
from .agreement import Split, agree, loss_fields
from .collectives import all_reduce, group_info

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["solve", "solve_rows", "threshold_solver", "TOL_FACTOR"]

#: the solver stops when ``|S - 1| <= TOL_FACTOR · ε · log2(K + 1)`` for every row (or when the
#: residual stops decreasing).  One rank uses 2; here 1: the split sums round differently, and
#: iterating to the rounding floor (usually one more Newton step, one more ``2R``-number
#: all-reduce) keeps the result at least as accurate as one rank's
TOL_FACTOR = 1.0

#: what the ``MAX`` round gives: ``(row maxima [R, 1], the second quantity [R, 1] or None, slice sizes)``
Maxima = tuple[Tensor, Optional[Tensor], list[int]]


def max_round(z: Tensor, split: Split, group: Optional[ProcessGroup], extra: Optional[Tensor] = None) -> Maxima:
    """One ``MAX`` all-reduce: the global row maxima of ``z`` ``[R, k]`` (``+inf`` where a row
    has NaN or ``+inf`` anywhere) and an optional second ``[R]`` quantity.  Returns
    ``(maxima [R, 1], the second quantity [R, 1] or None, slice sizes)``."""
    parts = []
    if z.shape[1] > 0:
        m = z.amax(-1)
        m = torch.where(torch.isnan(m), torch.full_like(m, math.inf), m)
    else:
        m = torch.full((z.shape[0],), -math.inf, dtype=z.dtype, device=z.device)
    parts.append(m)
    if extra is not None:
        parts.append(torch.where(torch.isnan(extra), torch.full_like(extra, math.inf), extra))
    buf = torch.cat(parts)
    all_reduce(buf, dist.ReduceOp.MAX, group, "max")
    R = z.shape[0]
    m = buf[:R].unsqueeze(1)
    lo = buf[R:2 * R].unsqueeze(1) if extra is not None else None
    return m, lo, split.sizes


def local_bound(z: Tensor, div: Divergence, q: Optional[Tensor]) -> Tensor:
    """``[R]``: what this rank contributes to the ``MAX`` round besides the row maxima.

    With ``q``: ``max_j (z_j - f'(1/q_j))`` over the slice (the lower end of the bracket).
    Without: the root ``τ_r`` of this slice alone, ``S_r(τ_r) = 1`` (one rank's solver, pruned
    and fused): since ``S >= S_r``, ``S(τ_r) >= 1``, so ``max_r τ_r <= τ`` is a lower bound,
    exact when one rank holds the whole support, and Newton starts there.
    """
    R, k = z.shape
    z = z.detach()
    if k == 0:
        return torch.full((R,), -math.inf, dtype=z.dtype, device=z.device)
    if q is not None:
        return (z - div.f_prime(1.0 / q)).amax(-1)
    tau = solve_local(z, div).tau.squeeze(1)
    # rows masked on this slice contribute nothing; NaN rows are caught by the maxima
    return torch.where(z.amax(-1) > -math.inf, tau, torch.full_like(tau, -math.inf))


def solve(
    z: Tensor,
    divergence: Divergence,
    process_group: Optional[ProcessGroup],
    q: Optional[Tensor] = None,
    *,
    max_iter: int = MAX_ITER,
    maxima: Optional[Maxima] = None,
) -> Solution:
    r"""The threshold :math:`\tau` of rows whose classes are split over the ranks of ``process_group``.

    .. math::

        \sum_r \sum_{j \in \text{slice } r} q_j\, g\big(\max(z_j - \tau, f'(0))\big) = 1,
        \qquad g = (f^*)',

    solved as :func:`softargmax.solvers.threshold.solve` solves it on one process (safeguarded
    Newton, Michelot's algorithm for sparsemax; :mod:`softargmax.solvers.newton`), without pruning
    and with the per-row sums all-reduced: one ``MAX`` round (the row maxima and the largest root
    of one slice, where Newton starts), then one ``SUM`` round of :math:`(S, S')` per Newton
    evaluation, stopped when :math:`|S - 1| \le \mathrm{TOL\_FACTOR} \cdot \varepsilon \log_2(K + 1)`
    (:math:`K` the global number of classes) or when the residual stops decreasing.

    Args:
        z: this rank's slice of the rows (contiguous, float32 or float64), already divided by the
            temperature.
        divergence: the :class:`~softargmax.divergences.Divergence` whose mapping is solved.
        process_group: the group over which the classes are split (``None``: the default group).
        q: this rank's slice of the reference measure, positive. Default: ``None`` (all ones).
        max_iter: the most Newton steps. Default: ``MAX_ITER`` of :mod:`softargmax.solvers.newton`.
        maxima: the result of this call's ``MAX`` round if the caller already made it. Default:
            ``None`` (made here, after the round that checks that the ranks agree).

    Returns:
        a dense :class:`~softargmax.backends.solution.Solution` of the local slice: ``p`` (the
        mapping's values :math:`g`), ``s`` (the Jacobian weights :math:`g'`), and ``tau`` and
        ``s_sum`` (global, identical on every rank).

    Shape:
        - z: :math:`(R, k_r)`; q: :math:`(R, k_r)` or :math:`(1, k_r)`.
        - Output: ``tau`` and ``s_sum`` :math:`(R, 1)`; ``p`` and ``s`` :math:`(R, k_r)`.

    Examples:
        The χ² divergence gives sparsemax, :math:`p = [z - \tau]_+`, whose threshold for
        :math:`z = (1, 0.8, -1)` is :math:`(1 + 0.8 - 1)/2 = 0.4`:

        >>> import torch, torch.distributed as dist
        >>> from softargmax.divergences import get_divergence
        >>> from softargmax.losses import distributed
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> sol = distributed.solve(torch.tensor([[1.0, 0.8, -1.0]]), get_divergence("chi_square"), None)
        >>> sol.tau, sol.p
        (tensor([[0.4000]]), tensor([[0.6000, 0.4000, 0.0000]]))
        >>> dist.destroy_process_group()

    References:
        Vincent Roulet, Tianlin Liu, Nino Vieillard, Michael E. Sander and Mathieu Blondel, *Loss
        Functions and Operators Generated by f-Divergences*, 2025, https://arxiv.org/abs/2501.18537

        Christian Michelot, *A finite algorithm for finding the projection of a point onto the
        canonical simplex of R^n*, Journal of Optimization Theory and Applications 50, 1986,
        https://doi.org/10.1007/BF00938486
    """
    return solve_rows(z, divergence, process_group, q, max_iter=max_iter, maxima=maxima)[0]


def threshold_solver(split: Split, group: Optional[ProcessGroup]) -> SplitSolve:
    """``(z, divergence, q) -> (Solution, S)``: the ``MAX`` round, then :func:`solve_rows` (what the
    losses' :meth:`~softargmax.losses._rows.RowLoss.split_values` is given)."""

    def solve_split(z: Tensor, divergence: Divergence, q: Optional[Tensor]) -> tuple[Solution, Tensor]:
        maxima = max_round(z.detach(), split, group, local_bound(z, divergence, q))
        return solve_rows(z, divergence, group, q, maxima=maxima)

    return solve_split


def solve_rows(z: Tensor, divergence: Divergence, process_group: Optional[ProcessGroup], q: Optional[Tensor] = None,
               *, max_iter: int = MAX_ITER, maxima: Optional[Maxima] = None) -> tuple[Solution, Tensor]:
    """:func:`solve`, and the global sums ``S`` ``[R, 1]`` at the returned ``τ`` (1 in non-finite rows)."""
    group, rank, world = group_info(process_group)
    R, k = z.shape
    div = divergence
    if maxima is None:
        fields, tensors = loss_fields(3, FenchelYoungRowLoss(div), R, k, z.dtype, q is not None)
        split = agree(group, rank, world, z.device, None, fields, tensors)
        maxima = max_round(z, split, group, local_bound(z, div, q))
    m, lo_q, sizes = maxima
    K = sum(sizes)
    m, finite, bad_rows = finite_maxima(m)
    # the rows shifted by their global maximum, as the one-process solvers shift them: τ is found where the
    # scores keep their digits (a float32 row offset by 1e3 otherwise lost 4.5e-6 of p), then moved back
    zs, zero = z - m, torch.zeros_like(m)
    lo, hi = _bracket(div, zs, q, zero, None if lo_q is None else lo_q - m, finite, K, group)
    # all -inf rows and NaN/+inf rows: iterate on a harmless row with a single score 0, held by
    # the first rank that has classes
    cand = neutralize_rows(zs, finite, holds_first=rank == next((r for r, s in enumerate(sizes) if s > 0), None))

    def reduce(S: Tensor, Sp: Tensor) -> tuple[Tensor, Tensor]:
        buf = all_reduce(torch.cat([S, Sp], 1), dist.ReduceOp.SUM, group, "sum")
        return buf[:, :1], buf[:, 1:]

    tol = TOL_FACTOR * torch.finfo(z.dtype).eps * max(1.0, math.log2(K + 1))
    # the sums are global after the all-reduce: the stop test runs from the first evaluation
    out = newton_rows(div, cand, q, zero, lo, hi, finite, tol=tol, max_iter=max_iter, first_check=0, reduce=reduce)
    sol = Solution(tau=out.tau + m, p=out.g, s=out.gp, s_sum=out.Sp, block_index=None, k=k, bad_rows=bad_rows,
                   iterations=out.iterations)
    return sol, out.S


def _bracket(div: Divergence, z: Tensor, q: Optional[Tensor], m: Tensor, lo_q: Optional[Tensor],
             finite: Optional[Tensor], K: int,
             group: Optional[ProcessGroup]) -> tuple[Tensor, Optional[Tensor]]:
    """``(τ_lo, τ_hi)`` from the global maxima ``m`` and the ``MAX`` round's second quantity ``lo_q``
    (``τ_hi`` is ``None`` where the monotone iteration does not read it)."""
    R = z.shape[0]
    if q is None:
        f1, fK = bound_offsets(div, K, z.dtype, z.device)
        lo, hi = m - f1, m - fK
        if lo_q is not None:  # the largest root of one slice: a tighter lower bound
            ok = lo_q > lo if finite is None else finite & (lo_q > lo)
            lo = torch.where(ok, lo_q, lo)
        return lo, hi
    assert lo_q is not None  # with q, the MAX round's second quantity
    lo = lo_q if finite is None else torch.where(finite, lo_q, torch.zeros_like(lo_q))
    if div.hints.monotone_newton:
        return lo, None
    qs = q.expand(R, z.shape[1]).sum(-1, keepdim=True) if z.shape[1] else torch.zeros(R, 1, dtype=z.dtype,
                                                                                      device=z.device)
    qs = all_reduce(qs.contiguous(), dist.ReduceOp.SUM, group, "sum")
    return lo, m - div.f_prime(1.0 / qs)
