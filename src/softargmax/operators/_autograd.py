r"""The autograd function behind every normalized mapping.

Forward: :func:`softargmax.solvers.threshold.solve` on ``z = x / β``.  Backward is a JVP, one pass over the candidates, never a ``k × k`` matrix:

* scores: ``∂L/∂x = s ⊙ (v - c) / β`` with ``s_j = q_j g'(z_j - τ)``,
  ``c = ⟨s, v⟩ / Σ s``;
* reference measure: ``∂L/∂q = g(z - τ) ⊙ (v - c)`` (from ``∂τ/∂q_i = g_i / Σ s``);
* α (α-entmax, Correia et al. (2019) eqs. 26–38): per row,
  ``⟨v, ∂p/∂α⟩ = (⟨v,p⟩ - ⟨v,p̃⟩)/(α-1)^2 - (⟨v, p log p⟩ + H(p) ⟨v,p̃⟩)/(α-1)``
  with ``p̃ ∝ p^{2-α}`` and ``H`` the Shannon entropy; on the band ``|α - 1| < 0.5`` an
  equivalent form without the cancellation of its two ``1/(α-1)`` terms is used
  (:func:`entmax_alpha_vjp`), equal to ``(-⟨v, p log² p⟩ + ⟨v,p⟩ ⟨p, log² p⟩)/2`` at α = 1.

The function is once differentiable (no double backward).

References:

* Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*, EMNLP 2019, https://arxiv.org/abs/1909.00015
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import backends as _kernels
from .._utils.rows import Rows, sum_to
from .._utils.tracing import function_apply
from ..backends.solution import Solution
from ..divergences import AlphaDivergence, Divergence, get_divergence
from ..solvers.threshold import solve


def grad_to_param(grad2d: Tensor, rows: Rows, param: Tensor) -> Tensor:
    """Map a ``[R|1, k]`` or ``[R, 1]`` gradient back to the shape of a broadcast parameter."""
    shape = list(rows.shape)
    if grad2d.shape[0] == 1 and rows.R != 1:
        full = [1] * len(shape)
        full[rows.dim] = grad2d.shape[-1]
        g = grad2d.reshape(full)
    else:
        moved = list(rows.moved_shape)
        moved[-1] = grad2d.shape[-1]
        g = grad2d.reshape(moved).movedim(-1, rows.dim)
    lead = [1] * (len(shape) - param.dim()) + list(param.shape)
    return sum_to(g, lead).reshape(param.shape).to(param.dtype)


#: below this ``|α - 1|`` the α-gradient uses the cancellation-free form (:func:`entmax_alpha_vjp`)
ALPHA_BAND = 0.5


def _expm1_minus_x_over_x2(x: Tensor) -> Tensor:
    """``φ(x) = (e^x - 1 - x)/x²`` without cancellation (a Taylor series for ``|x| < 0.1``)."""
    small = x.abs() < 0.1
    xs = torch.where(small, torch.ones_like(x), x)
    direct = (torch.expm1(xs) - xs) / (xs * xs)
    xt = torch.where(small, x, torch.zeros_like(x))
    series = 1 / 2 + xt * (1 / 6 + xt * (1 / 24 + xt * (1 / 120 + xt * (1 / 720 + xt * (1 / 5040 + xt / 40320)))))
    return torch.where(small, series, direct)


def entmax_alpha_vjp(p: Tensor, v: Tensor, alpha: Tensor) -> Tensor:
    r"""``⟨v, ∂p/∂α⟩`` per row for α-entmax; ``[R, 1]``, float64.

    (Correia, Niculae & Martins, *Adaptively Sparse Transformers*, EMNLP 2019,
    arXiv:1909.00015, supplementary material, eqs. 29–30 and 38.)

    With ``a = α - 1``, ``L = log p`` on the support, ``E`` and ``Cov`` taken under ``p``
    and ``p̃ ∝ p^{1-a}``, the published form is
    ``(⟨v,p⟩ - ⟨v,p̃⟩)/a² - (⟨v, p L⟩ + H(p) ⟨v,p̃⟩)/a``: two terms of size ``1/a`` that
    cancel (float32 gradients were off by a factor 55 at α = 1 + 1e-5).  Writing
    ``p^{1-a} = p (1 + e)`` with ``e = -aL + a² L² φ(-aL)``, ``φ(x) = (e^x - 1 - x)/x²``,
    ``Z = 1 + E[e]`` and ``M = L² φ(-aL)``, the ``1/a`` terms cancel exactly and

        ⟨v, ∂p/∂α⟩ = -[Cov(v, M) + a (E[M] Cov(v, L) - E[L] Cov(v, M))] / Z,

    which is ``-Cov(v, L²)/2`` at α = 1 and has no cancellation.  It is used for
    ``|a| < ALPHA_BAND``; the published form (well conditioned there) elsewhere.
    """
    p = p.double()
    v = v.double()
    a = alpha.double() - 1
    supp = p > 0
    logp = torch.where(supp, torch.log(torch.where(supp, p, torch.ones_like(p))), torch.zeros_like(p))
    plogp = p * logp
    H = -plogp.sum(-1, keepdim=True)
    pt = torch.where(supp, torch.exp((1 - a) * logp), torch.zeros_like(p))
    pt = pt / pt.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    vp = (v * p).sum(-1, keepdim=True)
    vpt = (v * pt).sum(-1, keepdim=True)
    vplogp = (v * plogp).sum(-1, keepdim=True)
    near = a.abs() < ALPHA_BAND
    a_safe = torch.where(near, torch.ones_like(a), a)
    general = (vp - vpt) / (a_safe * a_safe) - (vplogp + H * vpt) / a_safe
    # the band around α = 1: expectations under p normalized in float64
    a_near = torch.where(near, a, torch.zeros_like(a))
    pn = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    M = logp * logp * _expm1_minus_x_over_x2(-a_near * logp)
    e = -a_near * logp + a_near * a_near * M
    E = lambda t: (pn * t).sum(-1, keepdim=True)  # noqa: E731
    vc = v - E(v)
    cov_vL = E(vc * logp)
    cov_vM = E(vc * M)
    Z = 1 + E(e)
    band = -(cov_vM + a_near * (E(M) * cov_vL - E(logp) * cov_vM)) / Z
    return torch.where(near, band, general)


#: at most this many distinct α values are solved group by group with the fast float-α solver
MAX_ALPHA_GROUPS = 32


def solve_grouped(z: Tensor, alpha2d: Tensor) -> Solution:
    """α-entmax with one α per row: rows sharing an α (e.g. one α per attention head) are
    solved together by the float-α solver; many distinct values use the tensor-α solver."""
    fused = _kernels.solve_alpha_rows(z, alpha2d)  # None unless a fused solver covers it (every α in (1, 2])
    if fused is not None:
        return fused
    values = torch.unique(alpha2d)
    if values.numel() > MAX_ALPHA_GROUPS:
        return solve(z, AlphaDivergence(alpha2d))
    if values.numel() == 1:
        sol = solve(z, get_divergence("alpha", alpha=float(values[0])))
        if sol.block_index is None:
            return sol
        groups: list[tuple[Optional[Tensor], Solution]] = [(None, sol)]
    else:
        groups = []
        for a in values.tolist():
            idx = (alpha2d[:, 0] == a).nonzero().squeeze(1)
            groups.append((idx, _with_weights(solve(z.index_select(0, idx), get_divergence("alpha", alpha=a)), a)))
    p = torch.empty_like(z)
    s = torch.empty_like(z)
    s_sum = torch.empty_like(z[:, :1])
    tau = torch.empty_like(z[:, :1])
    bad = None
    for idx, g in groups:
        assert g.s is not None  # _with_weights
        gp, gs = g.scatter(g.p), g.scatter(g.s)
        if idx is None:
            p, s, s_sum, tau, bad = gp, gs, g.s_sum, g.tau, g.bad_rows
            break
        p.index_copy_(0, idx, gp)
        s.index_copy_(0, idx, gs)
        s_sum.index_copy_(0, idx, g.s_sum)
        tau.index_copy_(0, idx, g.tau)
        if g.bad_rows is not None:
            bad = torch.zeros_like(z[:, :1], dtype=torch.bool) if bad is None else bad
            bad.index_copy_(0, idx, g.bad_rows)
    return Solution(tau=tau, p=p, s=s, s_sum=s_sum, block_index=None, k=z.shape[1], bad_rows=bad,
                    iterations=max(g.iterations for _, g in groups))


def _with_weights(sol: Solution, alpha: float) -> Solution:
    """``sol`` with its Jacobian weights ``s = g'(z - τ) = p^{2-α}`` where the GPU kernels left them to
    their own JVP (``s`` is ``None``): the groups of :func:`solve_grouped` are combined through ``s``."""
    if sol.s is None:
        p = sol.p
        sol.s = torch.where(p > 0, p ** (2.0 - alpha), torch.zeros_like(p))
    return sol


def _rows_of(x: Tensor, q: Optional[Tensor], divergence: Optional[Divergence], temperature: float,
             dim: int) -> tuple[Rows, Tensor]:
    """``(rows, z)``: the row layout of ``x`` and the scores the solver reads (divided by the temperature)."""
    rows = None
    if x.dtype in (torch.float16, torch.bfloat16) and divergence is not None and temperature == 1.0:
        # a fast path that reads and writes half rows as they are (the GPU kernels, float32
        # inside) saves the conversion passes over the input and the output
        rows = Rows(x, dim, dtype=x.dtype)
        if _kernels.select(rows.flat, divergence, q=q) is None:
            rows = None
    if rows is None:
        rows = Rows(x, dim)
    z = rows.flat
    if temperature != 1.0:
        # shift before scaling: x / β would round large scores before the solver shifts them
        m = z.amax(-1, keepdim=True)
        z = (z - torch.where(torch.isfinite(m), m, torch.zeros_like(m))) / temperature
    return rows, z


def _solve(rows: Rows, z: Tensor, q: Optional[Tensor], alpha: Optional[Tensor],
           divergence: Optional[Divergence]) -> tuple[Solution, Optional[Tensor], Optional[Tensor]]:
    q2d = rows.class_param(q) if q is not None else None
    alpha2d = None
    if alpha is not None:
        alpha2d = rows.row_param(alpha.detach(), "alpha")
        sol = solve_grouped(z, alpha2d)
    else:
        assert divergence is not None  # alpha or divergence names the mapping
        sol = solve(z, divergence, q2d)
    return sol, q2d, alpha2d


def solve_rows(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: Optional[Divergence],
               temperature: float, dim: int) -> tuple[Rows, Solution, Optional[Tensor], Optional[Tensor]]:
    """The forward of :class:`NormalizedMapping`: ``(rows, solution, q2d, alpha2d)`` for ``x`` along ``dim``."""
    rows, z = _rows_of(x, q, divergence, temperature, dim)
    return (rows, *_solve(rows, z, q, alpha, divergence))


def normalized_forward(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: Optional[Divergence],
                       temperature: float, dim: int) -> Tensor:
    """``NormalizedMapping.apply``'s output computed without the autograd function, for calls that
    need no gradient (:func:`softargmax._utils.tracing.without_autograd`): the same solver and the
    same output, with no ``ctx`` kept; a fused solver writes the output alone
    (:func:`softargmax.backends.probabilities`)."""
    rows, z = _rows_of(x, q, divergence, temperature, dim)
    if alpha is None:
        assert divergence is not None  # alpha or divergence names the mapping
        p = _kernels.probabilities(z, divergence, None if q is None else rows.class_param(q))
        if p is not None:
            return rows.restore(p)
    sol = _solve(rows, z, q, alpha, divergence)[0]
    return rows.restore(sol.dense_p())


class NormalizedMapping(torch.autograd.Function):
    """``p = q ⊙ g(x/β - τ)`` with ``Σ p = 1`` along ``dim``; see the module docstring."""

    @classmethod
    def apply(cls, x: Tensor, *args: Any) -> Tensor:
        if type(x).__name__ == "DTensor":  # rows whole on every rank: run on the local shards
            from ._dtensor import dtensor_apply

            return dtensor_apply(super().apply, x, *args, dim=args[-1])
        return function_apply(cls, x, *args)  # (torch.compile's tracer follows this, not super())

    @staticmethod
    def forward(ctx: Any, x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: Optional[Divergence],
                temperature: float, dim: int) -> Tensor:
        rows, sol, q2d, alpha2d = solve_rows(x, q, alpha, divergence, temperature, dim)
        ctx.rows, ctx.sol, ctx.q2d, ctx.alpha2d = rows, sol, q2d, alpha2d
        ctx.temperature = temperature
        ctx.x_dtype = x.dtype
        ctx.q_param = q.detach() if q is not None else None
        ctx.alpha_param = alpha.detach() if alpha is not None else None
        return rows.restore(sol.dense_p())

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Optional[Tensor], ...]:
        rows: Rows = ctx.rows
        sol: Solution = ctx.sol
        v = rows.to_rows(grad_out)
        grad_x = grad_q = grad_alpha = None
        if ctx.needs_input_grad[0]:
            grad_x = rows.restore(sol.jvp(v, ctx.temperature), ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            # g(z - τ) = p / q on the (dense) candidates: q paths are never pruned
            _, c = sol.centered(v)
            gq = (sol.p / ctx.q2d) * (sol.gather(v) - c)
            if ctx.q2d.shape[0] == 1 and rows.R != 1:
                gq = gq.sum(0, keepdim=True)
            grad_q = grad_to_param(gq, rows, ctx.q_param)
        if ctx.needs_input_grad[2]:
            ga = entmax_alpha_vjp(sol.p, sol.gather(v), ctx.alpha2d).to(rows.dtype)
            grad_alpha = grad_to_param(ga, rows, ctx.alpha_param)
        return grad_x, grad_q, grad_alpha, None, None, None
