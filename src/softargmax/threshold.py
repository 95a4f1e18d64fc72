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
from .divergences import AlphaDivergence, Divergence
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

    The step is ``(S - S^{1-ρ}) / (ρ Sp)`` (``S log S / Sp`` at ρ = 0), written
    ``-S expm1(-ρ log S) / (ρ Sp)`` for general ``ρ``: the difference ``S - S^{1-ρ}``
    cancels when ``ρ`` is small (α-entmax near α = 1).
    """
    if isinstance(rho, Tensor):
        r_safe = torch.where(rho == 0, torch.ones_like(rho), rho)
        logS = torch.log(S)
        gen = -S * torch.expm1(-r_safe * logS) / (r_safe * Sp)
        return tau + torch.where(rho == 0, S * logS / Sp, gen)
    if rho == 0:
        return torch.addcdiv(tau, S * torch.log(S), Sp)
    if rho == 1:
        return torch.addcdiv(tau, S - 1, Sp)
    if rho == 0.5:
        return torch.addcdiv(tau, S - torch.sqrt(S), Sp, value=2.0)
    return torch.addcdiv(tau, -S * torch.expm1(-rho * torch.log(S)), Sp, value=1.0 / rho)


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


def _steep_power(div: Divergence):
    """``a = α - 1`` (a float or a ``[R, 1]`` tensor) for the α-divergence with every α > 2, else ``None``."""
    if type(div) is not AlphaDivergence:
        return None
    a = div._a
    if isinstance(a, Tensor):
        return a if a.numel() and bool((a > 1).all()) else None
    return a if a > 1 else None


def _solve_steep_power(cand: Tensor, q: Optional[Tensor], a, k: int, eps: float, tol: float, max_iter: int,
                       finite: Optional[Tensor], trace: Optional[list]):
    r"""α-entmax with α > 2 (``a = α - 1 > 1``) on shifted candidates (row maximum 0).

    With ``y = a z`` the output is ``p_j = q_j [y_j - t]_+^{1/a}`` and ``t = a τ_f - 1`` is the
    entmax threshold.  On flat or nearly flat rows the root is ``t ≈ -(Σq)^{-a}``, tiny
    next to ``τ_f ≈ 1/a``: written through ``τ_f``, the base ``1 + a (z - τ_f)`` is a
    difference of two numbers close to 1 and ``p = base^{1/a}`` inherits a relative error
    ``ε / (a |t|)`` (a sum of 1.27 for 100 zeros at α = 4).  In ``t`` the base ``y_j - t``
    has no cancellation (``y_j = 0`` at the maximum), so ``t`` and ``p`` are exact to
    rounding.  Newton's method on ``S^a`` (linear in ``t`` while the support does not
    change, so exact in one step on flat rows) is kept inside the bracket
    ``[max_j (y_j - q_j^{-a}), max_j y_j - (Σ q)^{-a}]`` (``S >= 1`` and ``S <= 1`` at its
    ends); steps that leave it are replaced by bisection of ``|t|`` on a log scale.

    The solve runs in float64 whatever the input type: ``p = base^{1/a}`` is only Hölder
    continuous (exponent ``1/a < 1``) at the edge of the support, so float32 rounding of a
    base near zero (``1e-11`` next to a ``t`` of ``1e-4``) would cost ``1e-4`` in ``Σ p``.

    Returns ``(τ_f, p, s, Σ s, steps)`` in the shifted coordinates, in ``cand``'s dtype.
    """
    out_dtype = cand.dtype
    if out_dtype != torch.float64:
        cand = cand.double()
        q = None if q is None else q.double()
        a = a.double() if isinstance(a, Tensor) else a
        eps = torch.finfo(torch.float64).eps
        tol = 2 * eps * max(1.0, math.log2(cand.shape[-1] + 1))
    y = cand * a
    ymax = y.amax(-1, keepdim=True)
    if q is None:
        t_lo = ymax - 1
        t_hi = ymax - float(k) ** (-a) if not isinstance(a, Tensor) else ymax - torch.pow(float(k), -a)
    else:
        t_lo = (y - q ** (-a)).amax(-1, keepdim=True)
        t_hi = ymax - q.sum(-1, keepdim=True) ** (-a)
    t = t_lo
    done = torch.zeros_like(t, dtype=torch.bool) if finite is None else ~finite
    inv = 1.0 / a
    it = 0
    if trace is not None:  # the start
        trace.append(((t + 1) / a).to(out_dtype))
    while True:
        base = torch.sub(y, t).clamp_(min=0)
        g = base ** inv
        gp = torch.where(base > 0, g / torch.where(base > 0, base, torch.ones_like(base)), torch.zeros_like(g))
        if q is not None:
            g, gp = g * q, gp * q
        S = g.sum(-1, keepdim=True)
        Sp = gp.sum(-1, keepdim=True)
        resid = S - 1
        done = done | (resid.abs() <= tol) | (t_hi - t_lo <= 4 * eps * t.abs())
        if it >= max_iter or bool(done.all()):
            break
        t_lo = torch.where(resid >= 0, t, t_lo)
        t_hi = torch.where(resid < 0, t, t_hi)
        # Newton on S^a: dS/dt = -Σ gp / a
        new = t + (S - S ** (1 - a)) / Sp
        inside = (new > t_lo) & (new < t_hi)
        mid = torch.where((t_hi < 0) & (t_lo < 0), -torch.sqrt(t_lo * t_hi), 0.5 * (t_lo + t_hi))
        new = torch.where(inside, new, mid)
        t = torch.where(done, t, new)
        it += 1
        if trace is not None:
            trace.append(((t + 1) / a).to(out_dtype))
    # The last base of the root can be below the resolution of t (α = 6, t = -1e-4: a float64
    # ulp of t moves Σ p by 1e-12).  p / S is exactly the α-entmax of the scores divided by
    # S^a (a relative change of the scores by a |S - 1|, at rounding level): rows sum to 1.
    g = g / S
    cast = lambda u: u.to(out_dtype)  # noqa: E731
    return cast((t + 1) / a), cast(g), cast(gp), cast(Sp), it


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
    # Solve in shifted coordinates z - m (every operator is invariant to adding a constant
    # to a row): thresholds of rows with large scores are then resolved to the precision of
    # the scores' differences, not of their magnitude.  τ is shifted back at the end.
    shift = m
    zero = torch.zeros_like(m)
    if layout is not None:
        bmax = bmax - m
        zs = None
    else:
        zs = z - m
    lo, hi = _bounds(div, z if zs is None else zs, q, zero)
    if q is not None and not all_finite:
        lo = torch.where(finite, lo, torch.zeros_like(lo))
    m = zero

    block_index = None
    cand, qc = (z, q) if zs is None else (zs, q)
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
            cand = zb.gather(2, block_index) - shift.unsqueeze(1)
            cand = torch.where(valid.unsqueeze(1), cand, torch.full_like(cand, -math.inf)).reshape(R, B * KB)
    if cand is z:  # a layout without pruning: the full row, shifted
        cand = z - shift
    if not all_finite:
        # all -inf rows and NaN/+inf rows: iterate on a harmless all-masked row instead
        cand = torch.where(finite, cand, torch.full_like(cand, -math.inf))
        cand[~finite.squeeze(-1), 0] = 0.0

    # -- Newton ----------------------------------------------------------------------
    K = cand.shape[-1]
    # at rounding level: a looser tolerance left float32 rows 2.7e-6 from Σ p = 1 (reverse KL,
    # k = 6); the monotone iteration stops anyway when its residual stalls
    tol = 2 * eps * max(1.0, math.log2(K + 1))
    a_pow = _steep_power(div)
    prep = div.prepare(cand, m) if a_pow is None else None
    tau = lo
    it = 0
    if trace is not None and a_pow is None:
        trace.append(tau.clone())

    out = (torch.empty_like(cand), torch.empty_like(cand))

    def sums(t):
        if qc is None:
            return div.newton_sums(cand, t, prep, out)
        g, gp = div.evaluate(cand, t, prep)
        g, gp = g * qc, gp * qc
        return g.sum(-1, keepdim=True), gp.sum(-1, keepdim=True), (g, gp)

    if a_pow is not None:
        tau, g, gp, Sp, it = _solve_steep_power(cand, qc, a_pow, k, eps, tol, max_iter, finite, trace)
    elif div.monotone_newton:
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
    if a_pow is None:
        g, gp = state if qc is not None else div.finish(cand, tau, prep, state)
    tau = tau + shift
    if trace is not None:
        trace[:] = [t + shift for t in trace]

    if not all_finite:
        g = g.masked_fill(~finite, 0.0)
        gp = gp.masked_fill(~finite, 0.0)
        Sp = Sp.masked_fill(~finite, 0.0)
    return Solution(tau=tau, p=g, s=gp, s_sum=Sp, block_index=block_index, k=k, bad_rows=bad_rows, iterations=it)


def solve_tau(z: Tensor, divergence: Divergence, q: Optional[Tensor] = None) -> Tensor:
    """Only the thresholds ``[R, 1]`` (f-divergence parametrization) of the rows of ``z``."""
    return solve(z, divergence, q).tau
