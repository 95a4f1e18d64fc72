r"""α-entmax with α > 2 on the rows of one process: the threshold in the entmax variable ``t``.

The α-divergence's hint ``power_exponent`` ``a = α - 1`` names the family; for ``a > 1`` the
transform ``S^a`` is not convex in ``τ_f`` and ``τ_f`` itself loses the small root to
cancellation, so :func:`softargmax.solvers.threshold.solve` hands such rows to
:func:`solve_steep_power` (a bracketed Newton iteration in ``t = a τ_f - 1``).

References:

* Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*, ACL 2019, https://arxiv.org/abs/1905.05702
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..divergences import Divergence

__all__ = ["steep_power", "solve_steep_power"]


def steep_power(div: Divergence):
    """``a = α - 1`` (a float or a ``[R, 1]`` tensor) for the α-divergence with every α > 2, else ``None``."""
    a = div.hints.power_exponent
    if a is None:
        return None
    if isinstance(a, Tensor):
        return a if a.numel() and bool((a > 1).all()) else None
    return a if a > 1 else None


def solve_steep_power(cand: Tensor, q: Optional[Tensor], a, k: int, eps: float, tol: float, max_iter: int,
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
