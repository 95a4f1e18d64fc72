r"""The autograd function behind every normalized mapping.

Forward: :func:`softargmax.threshold.solve` on ``z = x / β``.  Backward is a JVP
(DESIGN §2), one pass over the candidates, never a ``k × k`` matrix:

* scores: ``∂L/∂x = s ⊙ (v - c) / β`` with ``s_j = q_j g'(z_j - τ)``,
  ``c = ⟨s, v⟩ / Σ s``;
* reference measure: ``∂L/∂q = g(z - τ) ⊙ (v - c)`` (from ``∂τ/∂q_i = g_i / Σ s``);
* α (α-entmax, ``002_…`` eqs. 26–38): per row,
  ``⟨v, ∂p/∂α⟩ = (⟨v,p⟩ - ⟨v,p̃⟩)/(α-1)^2 - (⟨v, p log p⟩ + H(p) ⟨v,p̃⟩)/(α-1)``
  with ``p̃ ∝ p^{2-α}`` and ``H`` the Shannon entropy; at ``|α - 1| < 1e-5`` the limit
  ``(-⟨v, p log² p⟩ + ⟨v,p⟩ ⟨p, log² p⟩)/2`` is used (both have error ≈ 1e-5 there;
  the α terms are computed in float64 because of the cancellation).

The function is once differentiable (no double backward).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _kernels
from ._checks import Rows, sum_to
from .divergences import AlphaDivergence, Divergence, get_divergence
from .solution import Solution
from .threshold import solve

ALPHA_LIMIT = 1e-5


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


def entmax_alpha_vjp(p: Tensor, v: Tensor, alpha: Tensor) -> Tensor:
    """``⟨v, ∂p/∂α⟩`` per row for α-entmax (``002_…`` eqs. 29–30 and 38); ``[R, 1]``, float64."""
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
    a_safe = torch.where(a.abs() < ALPHA_LIMIT, torch.ones_like(a), a)
    general = (vp - vpt) / (a_safe * a_safe) - (vplogp + H * vpt) / a_safe
    log2 = logp * logp
    limit = 0.5 * (-(v * p * log2).sum(-1, keepdim=True) + vp * (p * log2).sum(-1, keepdim=True))
    return torch.where(a.abs() < ALPHA_LIMIT, limit, general)


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
        groups = [(None, sol)]
    else:
        groups = []
        for a in values.tolist():
            idx = (alpha2d[:, 0] == a).nonzero().squeeze(1)
            groups.append((idx, solve(z.index_select(0, idx), get_divergence("alpha", alpha=a))))
    p = torch.empty_like(z)
    s = torch.empty_like(z)
    s_sum = torch.empty_like(z[:, :1])
    tau = torch.empty_like(z[:, :1])
    bad = None
    for idx, g in groups:
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


class NormalizedMapping(torch.autograd.Function):
    """``p = q ⊙ g(x/β - τ)`` with ``Σ p = 1`` along ``dim``; see the module docstring."""

    @classmethod
    def apply(cls, x, *args):
        if type(x).__name__ == "DTensor":  # rows whole on every rank: run on the local shards
            from .distributed import dtensor_apply

            return dtensor_apply(super().apply, x, *args, dim=args[-1])
        return super().apply(x, *args)

    @staticmethod
    def forward(ctx, x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: Optional[Divergence],
                temperature: float, dim: int):
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
            z = z / temperature
        q2d = rows.class_param(q) if q is not None else None
        alpha2d = None
        if alpha is not None:
            alpha2d = rows.row_param(alpha.detach(), "alpha")
            sol = solve_grouped(z, alpha2d)
        else:
            sol = solve(z, divergence, q2d)
        ctx.rows, ctx.sol, ctx.q2d, ctx.alpha2d = rows, sol, q2d, alpha2d
        ctx.temperature = temperature
        ctx.x_dtype = x.dtype
        ctx.q_param = q.detach() if q is not None else None
        ctx.alpha_param = alpha.detach() if alpha is not None else None
        return rows.restore(sol.dense_p())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
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
