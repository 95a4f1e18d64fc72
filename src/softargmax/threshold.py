r"""Threshold solvers: from scores to ``τ``, with no autograd graph.

For rows of scores ``z`` (already divided by the temperature), a reference measure
``q`` and a generator ``f``, find the unique ``τ`` with

    S(τ) = Σ_j q_j g(max(z_j - τ, f'(0))) = 1,        g = (f*)'

(``003_…`` Proposition 1).  ``τ`` lies in ``[τ_lo, τ_hi]`` with
``τ_lo = max_j (z_j - f'(1/q_j))`` (``S(τ_lo) >= 1``) and
``τ_hi = max_j z_j - f'(1/Σ_j q_j)`` (``S(τ_hi) <= 1``).

Method (DESIGN §3):

1. **Pruning** (sparse generators, ``q = None``, rows of at least
   :data:`PRUNE_MIN_LENGTH`): only coordinates with ``z_j > τ_lo + f'(0)`` can be in
   the support.  Each row is split into ``nb`` strided blocks
   (``z.view(R, B, nb)``: block ``b`` holds columns ``b, b + nb, …``); one pass
   computes the block maxima, and only blocks whose maximum passes the bound are
   gathered into a small candidate matrix ``[R, B·KB]`` (``KB`` = the most blocks
   any row needs).  Rows needing fewer blocks pad with masked (``-inf``) slots.
   Before selecting (rows of at least :data:`PRUNE_MIN_LENGTH`, any monotone
   divergence), :data:`PRE_STEPS` monotone Newton steps on the block maxima
   alone raise ``τ_lo`` (a subset's root is below the full root), which tightens the
   bound and gives the main iteration a better start.
2. **Newton** on ``(S^ρ - 1)/ρ`` (``log S`` at ``ρ = 0``), ``ρ =
   divergence.newton_power``, started at ``τ_lo``.  Where the divergence proves this
   transform convex (``divergence.monotone_newton``) the iterates increase
   monotonically to the root and no safeguard is needed; otherwise every step
   that leaves the current bisection bracket is replaced by bisection.  For
   sparsemax Newton is Michelot's algorithm: once the support is stable the step
   is exactly ``τ = (Σ_S z - 1)/|S|``.
3. Stop when ``|S - 1|`` is at rounding level for every row.  The last evaluation
   of ``g`` is the output itself, so ``t`` Newton steps cost ``t + 1`` passes over
   the candidates.

The operators the fused row solvers cover (α-entmax with α ∈ (1, 2], Jensen–Shannon,
squared Hellinger; ``q = None``; :mod:`softargmax._row_kinds`) go, through
:mod:`softargmax._kernels`, to the C row solver on CPU (:mod:`softargmax._cpu_rows`) and
to the Triton kernels on CUDA (:mod:`softargmax._triton_rows`); both follow the same
method row by row and return the same :class:`~softargmax.solution.Solution`.

Rows whose maximum is ``-inf`` (everything masked) give ``p = 0``; rows containing
NaN or ``+inf`` are reported in ``Solution.bad_rows`` and their output is NaN.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from . import _kernels
from .divergences import Divergence
from .solution import Solution

__all__ = ["Solution", "solve", "solve_tau", "block_layout"]

#: rows shorter than this are never pruned (the full row is the candidate set)
PRUNE_MIN_LENGTH = 128
#: most Newton/bisection steps (bisection alone needs ~60 in float64)
MAX_ITER = 200
#: Newton steps on the block maxima that tighten the pruning bound
PRE_STEPS = 2


def block_layout(k: int, min_length: int = PRUNE_MIN_LENGTH) -> Optional[tuple[int, int]]:
    """``(B, nb)`` with ``B · nb = k`` for splitting a row of length ``k`` into ``nb`` blocks, or ``None``.

    ``B`` (elements per block) is a divisor of ``k`` near ``√k / 4`` (at least 4), so
    the candidate matrix stays small and the block maxima cost one strided pass.
    """
    if k < min_length:
        return None
    target = max(4.0, math.sqrt(k) / 4)
    best = None
    for b in range(2, int(4 * target) + 1):
        if k % b == 0 and (best is None or abs(math.log(b / target)) < abs(math.log(best / target))):
            best = b
    if best is None or k // best < 4:
        return None
    return best, k // best


def _select_blocks(bmax: Tensor, thr: Tensor):
    """Indices ``[R, KB]`` of the blocks with ``bmax > thr`` (padded) and the valid-slot mask."""
    R, nb = bmax.shape
    sel = torch.sign(torch.clamp(bmax - thr, min=0))  # 1.0 where selected (float ops are fast on CPU)
    sel = torch.nan_to_num(sel, nan=0.0)
    count = sel.sum(-1, keepdim=True)
    KB = max(int(count.max()), 1)
    if 4 * KB > 3 * nb:  # gathering most of the row would not pay for itself
        return None, None
    rank = sel.cumsum(-1)
    # selected block -> its rank - 1; the others -> the dump column KB
    slot = (sel * (rank - 1 - KB) + KB).long()
    table = torch.zeros(R, KB + 1, dtype=torch.long, device=bmax.device)
    table.scatter_(1, slot, torch.arange(nb, device=bmax.device).expand(R, nb))
    valid = torch.arange(KB, device=bmax.device) < count
    return table[:, :KB], valid


def _newton_update(tau: Tensor, S: Tensor, Sp: Tensor, rho) -> Tensor:
    """``τ`` after one Newton step on ``(S^ρ - 1)/ρ`` (``log S`` at ρ = 0), ``dS/dτ = -Sp``.

    The step is ``(S - S^{1-ρ}) / (ρ Sp)`` (``S log S / Sp`` at ρ = 0).
    """
    if isinstance(rho, Tensor):
        r_safe = torch.where(rho == 0, torch.ones_like(rho), rho)
        gen = (S - S ** (1 - r_safe)) / (r_safe * Sp)
        return tau + torch.where(rho == 0, S * torch.log(S) / Sp, gen)
    if rho == 0:
        return torch.addcdiv(tau, S * torch.log(S), Sp)
    if rho == 1:
        return torch.addcdiv(tau, S - 1, Sp)
    if rho == 0.5:
        return torch.addcdiv(tau, S - torch.sqrt(S), Sp, value=2.0)
    return torch.addcdiv(tau, S - S ** (1 - rho), Sp, value=1.0 / rho)


def _bounds(div: Divergence, z: Tensor, q: Optional[Tensor], m: Tensor):
    """``τ_lo``, ``τ_hi`` of every row (``m``: row maxima)."""
    if q is None:
        if isinstance(getattr(div, "alpha", None), Tensor):
            one = torch.ones((), dtype=z.dtype, device=z.device)
            return m - div.f_prime(one), m - div.f_prime(one / z.shape[-1])
        f1, fk = div.bound_offsets(z.shape[-1])
        return m - f1, m - fk
    else:
        lo = (z - div.f_prime(1.0 / q)).amax(-1, keepdim=True)
        hi = m - div.f_prime(1.0 / q.sum(-1, keepdim=True))
    return lo, hi


def solve(
    z: Tensor,
    divergence: Divergence,
    q: Optional[Tensor] = None,
    *,
    prune: bool = True,
    max_iter: int = MAX_ITER,
    trace: Optional[list] = None,
    fused: bool = True,
    for_loss: bool = False,
) -> Solution:
    """Solve every row of ``z`` (``[R, k]``, contiguous, float32/64).  See the module docstring.

    ``q``: ``None`` (all ones) or positive weights ``[R|1, k]``.  ``trace``: if a list is
    given, the thresholds ``[R, 1]`` after the pre-steps and after every Newton step are
    appended to it (for convergence studies).  ``fused``: allow the fused CPU row solver,
    whose solution is dense (``block_index`` None).  ``for_loss``: the caller needs the
    Fenchel–Young loss values; :func:`softargmax._kernels.select` then keeps the pruned,
    candidate-sized PyTorch solution on CPU (cheaper for those).  Whichever solver runs,
    the :class:`~softargmax.solution.Solution` has the same contract.
    """
    if fused and prune and trace is None and max_iter == MAX_ITER:  # the fast paths use the default options
        backend = _kernels.select(z, divergence, q=q, for_loss=for_loss)
        if backend is not None:
            return backend.solve(z, divergence)
    R, k = z.shape
    eps = torch.finfo(z.dtype).eps
    div = divergence

    # -- row maxima and candidate blocks ---------------------------------------------
    layout = block_layout(k) if (q is None and (div.monotone_newton or div.sparse)) else None
    if layout is not None:
        B, nb = layout
        zb = z.reshape(R, B, nb)
        bmax = zb.amax(1)
        m = bmax.amax(-1, keepdim=True)
    else:
        m = z.amax(-1, keepdim=True)

    # one reduction decides the common case (a finite sum means every maximum is finite)
    all_finite = math.isfinite(float(m.sum()))
    finite = torch.isfinite(m) if not all_finite else None
    if finite is not None and bool(finite.all()):
        all_finite, finite = True, None
    bad_rows = None
    if not all_finite:
        bad = torch.isnan(m) | (m == math.inf)
        bad_rows = bad if bool(bad.any()) else None
        m = torch.where(finite, m, torch.zeros_like(m))
    lo, hi = _bounds(div, z, q, m)
    if q is not None and not all_finite:
        lo = torch.where(finite, lo, torch.zeros_like(lo))

    block_index = None
    cand, qc = z, q
    rho = div.newton_power
    if layout is not None:
        if div.monotone_newton and all_finite:
            # The block maxima are a subset of the coordinates, so Newton on them from τ_lo
            # stays below their root, itself below τ: a tighter bound, fewer candidates.
            bprep = div.prepare(bmax, m)
            bout = (torch.empty_like(bmax), torch.empty_like(bmax))
            for _ in range(PRE_STEPS):
                S, Sp, _ = div.newton_sums(bmax, lo, bprep, bout)
                lo = torch.where(S > 1, _newton_update(lo, S, Sp, rho), lo)
    if layout is not None and prune and div.sparse:
        thr = lo + div.f_prime_zero
        table, valid = _select_blocks(bmax, thr)
        if table is not None:
            KB = table.shape[1]
            block_index = table.unsqueeze(1).expand(R, B, KB)
            cand = zb.gather(2, block_index)
            cand = torch.where(valid.unsqueeze(1), cand, torch.full_like(cand, -math.inf)).reshape(R, B * KB)
    if not all_finite:
        # all -inf rows and NaN/+inf rows: iterate on a harmless all-masked row instead
        cand = torch.where(finite, cand, torch.full_like(cand, -math.inf))
        cand[~finite.squeeze(-1), 0] = 0.0

    # -- Newton ----------------------------------------------------------------------
    K = cand.shape[-1]
    tol = 8 * eps * max(1.0, math.log2(K + 1))
    prep = div.prepare(cand, m)
    tau = lo
    it = 0
    if trace is not None:
        trace.append(tau.clone())

    out = (torch.empty_like(cand), torch.empty_like(cand))

    def sums(t):
        if qc is None:
            return div.newton_sums(cand, t, prep, out)
        g, gp = div.evaluate(cand, t, prep)
        g, gp = g * qc, gp * qc
        return g.sum(-1, keepdim=True), gp.sum(-1, keepdim=True), (g, gp)

    if div.monotone_newton:
        last = math.inf
        while True:
            S, Sp, state = sums(tau)
            # The first two iterates are not checked (a step from the root is a no-op, and
            # a check is a synchronizing reduction).  Monotone convergence makes the largest
            # residual decrease until rounding: stop at tolerance or when it stalls.
            if it >= max_iter:
                break
            if it > 1:
                resid = float((S - 1).abs().amax())
                if resid <= tol or resid >= last:
                    break
                last = resid
            tau = _newton_update(tau, S, Sp, rho)
            it += 1
            if trace is not None:
                trace.append(tau.clone())
    else:
        hi = torch.where(torch.isfinite(hi), hi, lo + 1)
        done = torch.zeros_like(m, dtype=torch.bool) if finite is None else ~finite
        while True:
            S, Sp, state = sums(tau)
            resid = S - 1
            done = done | (resid.abs() <= tol) | (hi - lo <= 4 * eps * (1 + tau.abs()))
            if it >= max_iter or bool(done.all()):
                break
            lo = torch.where(resid >= 0, tau, lo)
            hi = torch.where(resid < 0, tau, hi)
            new = _newton_update(tau, S, Sp, rho)
            inside = (new > lo) & (new < hi)
            new = torch.where(inside, new, 0.5 * (lo + hi))
            tau = torch.where(done, tau, new)
            it += 1
            if trace is not None:
                trace.append(tau.clone())
    g, gp = state if qc is not None else div.finish(cand, tau, prep, state)

    if not all_finite:
        g = g.masked_fill(~finite, 0.0)
        gp = gp.masked_fill(~finite, 0.0)
        Sp = Sp.masked_fill(~finite, 0.0)
    return Solution(tau=tau, p=g, s=gp, s_sum=Sp, block_index=block_index, k=k, bad_rows=bad_rows, iterations=it)


def solve_tau(z: Tensor, divergence: Divergence, q: Optional[Tensor] = None) -> Tensor:
    """Only the thresholds ``[R, 1]`` (f-divergence parametrization) of the rows of ``z``."""
    return solve(z, divergence, q).tau
