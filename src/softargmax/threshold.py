r"""Threshold solvers: from scores to ``τ``, with no autograd graph.

For rows of scores ``z`` (already divided by the temperature), a reference measure
``q`` and a generator ``f``, find the unique ``τ`` with

    S(τ) = Σ_j q_j g(max(z_j - τ, f'(0))) = 1,        g = (f*)'

(``003_…`` Proposition 1).  ``τ`` lies in ``[τ_lo, τ_hi]`` with
``τ_lo = max_j (z_j - f'(1/q_j))`` (``S(τ_lo) >= 1``) and
``τ_hi = max_j z_j - f'(1/Σ_j q_j)`` (``S(τ_hi) <= 1``).

Method (DESIGN §3):

1. **Pruning** (sparse generators, ``q = None``): only coordinates with
   ``z_j > τ_lo + f'(0)`` can be in the support.  The row is cut into blocks, the
   block maxima are computed in one pass, and only the blocks that can hold a
   support coordinate are gathered into a small candidate matrix.
2. **Safeguarded Newton** on the candidates: Newton's method on
   ``(S^ρ - 1)/ρ`` (``log S`` for ``ρ = 0``), with ``ρ = divergence.newton_power``
   chosen to make it convex, started at ``τ_lo``; any step that leaves the current
   bisection bracket is replaced by bisection.  For sparsemax this is Michelot's
   algorithm.
3. **Exact polish** (sparsemax, 1.5-entmax, α = 2): once the support is known,
   ``τ`` has a closed form; it is accepted where the KKT conditions certify it
   (the support it implies is the one it was computed from).

The last evaluation of ``g`` at the final ``τ`` is the output itself, so a row that
converges after ``t`` Newton steps costs ``t + 1`` passes over its candidates.

Rows whose maximum is ``-inf`` (everything masked) give ``p = 0``; rows containing
NaN or ``+inf`` are reported in ``Solution.bad_rows`` and their output is NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .divergences import Divergence

__all__ = ["Solution", "solve", "solve_tau", "block_size"]

#: rows shorter than this are never pruned (the full row is the candidate set)
PRUNE_MIN_LENGTH = 256
#: most Newton/bisection steps; bisection alone needs ~60 in float64
MAX_ITER = 200


@dataclass
class Solution:
    """The threshold of every row and the mapping evaluated on the candidates.

    Attributes:
        tau: ``[R, 1]`` thresholds in the f-divergence parametrization (scores ``z``).
        p: ``[R, K]`` probabilities of the candidates.
        s: ``[R, K]`` Jacobian weights ``q_j g'(z_j - τ)`` of the candidates (0 off the support).
        block_index: ``None`` when the candidates are the full rows (``K = k``); otherwise
            ``[R, KB]`` indices of the gathered blocks of ``block`` columns each.
        block: the block width.
        k: the row length.
        bad_rows: ``[R, 1]`` boolean, rows with NaN or ``+inf`` scores (``None`` if none).
        iterations: Newton/bisection steps taken.
    """

    tau: Tensor
    p: Tensor
    s: Tensor
    block_index: Optional[Tensor]
    block: int
    k: int
    bad_rows: Optional[Tensor]
    iterations: int

    # -- moving between candidates and full rows -----------------------------------
    def gather(self, full: Tensor) -> Tensor:
        """``[R, k]`` -> ``[R, K]`` values at the candidates."""
        if self.block_index is None:
            return full
        R, KB = self.block_index.shape
        idx = self.block_index.unsqueeze(-1).expand(R, KB, self.block)
        return full.reshape(R, -1, self.block).gather(1, idx).reshape(R, KB * self.block)

    def scatter(self, cand: Tensor) -> Tensor:
        """``[R, K]`` -> ``[R, k]``, zeros outside the candidates."""
        if self.block_index is None:
            return cand
        R, KB = self.block_index.shape
        out = cand.new_zeros(R, self.k // self.block, self.block)
        idx = self.block_index.unsqueeze(-1).expand(R, KB, self.block)
        out.scatter_(1, idx, cand.reshape(R, KB, self.block))
        return out.reshape(R, self.k)

    def dense_p(self) -> Tensor:
        """The full ``[R, k]`` output, NaN in bad rows."""
        p = self.scatter(self.p)
        if self.bad_rows is not None:
            p = p.masked_fill(self.bad_rows, math.nan)
        return p

    def jvp_t(self, v_cand: Tensor) -> Tensor:
        r"""``J^T v`` on the candidates, for the Jacobian ``diag(s) - s s^T / Σ s`` (temperature excluded)."""
        s = self.s
        ssum = s.sum(-1, keepdim=True)
        c = (s * v_cand).sum(-1, keepdim=True) / torch.where(ssum > 0, ssum, torch.ones_like(ssum))
        return s * (v_cand - c)


def block_size(k: int) -> Optional[int]:
    """A divisor of ``k`` near ``2√k`` (clamped to [16, 128]) used to prune rows, or ``None``."""
    if k < PRUNE_MIN_LENGTH:
        return None
    target = min(128, max(16, int(2 * math.sqrt(k))))
    best = None
    for b in range(max(8, target // 2), min(k, 2 * target) + 1):
        if k % b == 0 and (best is None or abs(b - target) < abs(best - target)):
            best = b
    if best is None or k // best < 4:
        return None
    return best


def _newton_step(S: Tensor, Sp: Tensor, rho) -> Tensor:
    """Newton step on ``(S^ρ - 1)/ρ`` (``log S`` at ρ = 0) for ``dS/dτ = -Sp``."""
    if isinstance(rho, Tensor):
        r_safe = torch.where(rho == 0, torch.ones_like(rho), rho)
        gen = (S - S ** (1 - r_safe)) / (r_safe * Sp)
        return torch.where(rho == 0, S * torch.log(S) / Sp, gen)
    if rho == 0:
        return S * torch.log(S) / Sp
    if rho == 1:
        return (S - 1) / Sp
    return (S - S ** (1 - rho)) / (rho * Sp)


def _evaluate(div: Divergence, z: Tensor, tau: Tensor, q: Optional[Tensor]):
    g, gp = div.conj_prime_and_prime2(z - tau)
    if q is not None:
        g = g * q
        gp = gp * q
    return g, gp


def _bounds(div: Divergence, z: Tensor, q: Optional[Tensor], m: Tensor):
    """``τ_lo``, ``τ_hi`` of every row (``m``: row maxima, finite rows only meaningful)."""
    dtype = z.dtype
    if q is None:
        one = torch.ones((), dtype=dtype, device=z.device)
        lo = m - div.f_prime(one)
        hi = m - div.f_prime(one / z.shape[-1])
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
) -> Solution:
    """Solve every row of ``z`` (``[R, k]``, contiguous, float32/64).  See the module docstring.

    ``q``: ``None`` (all ones) or positive weights ``[R|1, k]``.
    """
    R, k = z.shape
    dtype = z.dtype
    eps = torch.finfo(dtype).eps
    div = divergence

    # -- row maxima, candidate blocks ---------------------------------------------
    B = block_size(k) if (prune and q is None and div.sparse) else None
    if B is not None:
        bmax = z.reshape(R, k // B, B).amax(-1)
        m = bmax.amax(-1, keepdim=True)
    else:
        m = z.amax(-1, keepdim=True)

    finite = torch.isfinite(m)
    bad_rows = None
    if not bool(finite.all()):
        bad = torch.isnan(m) | (m == math.inf)
        bad_rows = bad if bool(bad.any()) else None
    m_safe = torch.where(finite, m, torch.zeros_like(m))
    lo, hi = _bounds(div, z, q, m_safe)
    if q is not None:
        lo = torch.where(finite, lo, torch.zeros_like(lo))
    hi = torch.where(finite, hi, lo + 1)

    block_index = None
    cand, qc = z, q
    if B is not None:
        thr = lo + div.f_prime_zero
        nsel = (bmax > thr).sum(-1)
        KB = max(int(nsel.max()), 1)
        if 2 * KB <= k // B:
            block_index = bmax.topk(KB, -1, sorted=False).indices
            idx = block_index.unsqueeze(-1).expand(R, KB, B)
            cand = z.reshape(R, k // B, B).gather(1, idx).reshape(R, KB * B)
        else:
            B = None
    if not bool(finite.all()):
        # rows that are all -inf or contain NaN/+inf: make them harmless for the iteration
        cand = torch.where(finite, cand, torch.full_like(cand, -math.inf))

    # -- safeguarded Newton --------------------------------------------------------
    K = cand.shape[-1]
    rho = div.newton_power
    tol_S = 8 * eps * max(1.0, math.log2(K + 1))
    tau = lo.clone()
    it = 0
    done = ~finite
    while True:
        g, gp = _evaluate(div, cand, tau, qc)
        S = g.sum(-1, keepdim=True)
        if it >= max_iter:
            break
        resid = S - 1
        width = hi - lo
        done = done | (resid.abs() <= tol_S) | (width <= 4 * eps * (1 + tau.abs()))
        if bool(done.all()):
            break
        Sp = gp.sum(-1, keepdim=True)
        lo = torch.where(resid >= 0, tau, lo)
        hi = torch.where(resid < 0, tau, hi)
        new = tau + _newton_step(S, Sp, rho)
        inside = (new > lo) & (new < hi)
        new = torch.where(inside, new, 0.5 * (lo + hi))
        tau = torch.where(done, tau, new)
        it += 1

    # -- exact polish ---------------------------------------------------------------
    if div.sparse:
        support = cand - tau > div.f_prime_zero
        exact = div.exact_tau(cand, qc, support)
        if exact is not None:
            certified = ((cand - exact > div.f_prime_zero) == support).all(-1, keepdim=True) & finite
            certified = certified & support.any(-1, keepdim=True)
            if bool(certified.any()):
                tau = torch.where(certified, exact, tau)
                g, gp = _evaluate(div, cand, tau, qc)

    return Solution(
        tau=tau,
        p=g,
        s=gp,
        block_index=block_index,
        block=B or k,
        k=k,
        bad_rows=bad_rows,
        iterations=it,
    )


def solve_tau(z: Tensor, divergence: Divergence, q: Optional[Tensor] = None) -> Tensor:
    """Only the thresholds ``[R, 1]`` (f-divergence parametrization) of the rows of ``z``."""
    return solve(z, divergence, q).tau
