r"""Per-row Fenchel–Young loss values, predictions and gradients ``p - y``, and the loss resolver.

For a regularizer ``Ω`` with prediction map ``p = ∇Ω*(θ)``:

    ℓ(θ, y) = Ω*(θ) + Ω(y) - ⟨θ, y⟩ = ⟨θ, p - y⟩ + Ω(y) - Ω(p)   >= 0,

so one solve gives the value, the prediction and the gradient ``p - y`` of a row
(Blondel, Martins & Niculae, 2020).  :func:`resolve_loss` turns a mapping name and its
parameters into what these functions take; the unfused, fused and distributed losses all
use it.

References:

* Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020, https://arxiv.org/abs/1901.02324
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import check_alpha, check_tau
from .._utils.rows import Rows
from .._utils.tracing import values_checkable
from ..backends.solution import sum_f_minus_f0
from ..divergences import Divergence
from ..operators.mappings import MAPPING_NAMES, resolve
from ..solvers.threshold import solve
from ._targets import Target

#: mapping names the losses accept: those of :mod:`softargmax.operators.mappings` and ``"alpha_relu"``
MAPPINGS = MAPPING_NAMES + ("alpha_relu",)


def fy_rows(theta: Tensor, target: Target, div: Divergence, beta: float, q: Optional[Tensor], inplace: bool = False):
    """Per-row Fenchel–Young loss, the prediction and ``p - y`` for rows ``theta`` ``[R, k]``.

    Returns ``(loss [R], p [R, k], G [R, k])``; ignored rows have loss 0 and ``G = 0``.
    With ``inplace`` ``G`` is written over ``p`` (the returned ``p`` is then ``G``).
    """
    R, k = theta.shape
    if beta != 1.0:  # shift before scaling: theta / β would round large scores
        m = theta.amax(-1, keepdim=True)
        z = (theta - torch.where(torch.isfinite(m), m, torch.zeros_like(m))) / beta
    else:
        z = theta
    if div.is_softmax:
        return _kl_rows(z, target, beta, q, inplace)
    # on CPU the pruned solution, so Ω(p) and ⟨θ, p⟩ below cost only the candidates
    sol = solve(z, div, q, candidates_only=True)
    p = sol.dense_p()
    # ⟨θ, p⟩ (p = 0 off the candidates); with β != 1, z was shifted, so a backend's ⟨z, p⟩ is not ⟨θ, p⟩/β
    theta_p = sol.inner(theta, beta, use_row_sums=beta == 1.0)
    f0 = float(div.f(torch.zeros((), dtype=torch.float64)))
    if math.isfinite(f0):
        # Ω(y) - Ω(p) with the f(0) terms of the zero entries cancelled
        omega_p = sol.f_sum(div, q, f0, theta.dtype)
        if target.dense is None:
            qt = None if q is None else q.expand(R, k).gather(1, target.index.unsqueeze(1)).squeeze(1)
            one = torch.ones(R, dtype=theta.dtype, device=theta.device)
            omega_y = (div.f(one) - f0) if qt is None else qt * (div.f(1.0 / qt) - f0)
            theta_y = theta.gather(1, target.index.unsqueeze(1)).squeeze(1)
        else:
            y = target.dense
            omega_y = sum_f_minus_f0(div, y, None if q is None else q.expand(R, k), f0)
            theta_y = torch.where(y > 0, theta * y, torch.zeros_like(y)).sum(-1)
        D = omega_y - omega_p
    else:
        y = target.as_dense(k, theta.dtype)
        qq = torch.ones_like(p) if q is None else q.expand(R, k)
        valid = theta > -math.inf
        terms = qq * (div.f(y / qq) - div.f(p / qq))
        D = torch.where(valid, terms, torch.zeros_like(terms)).sum(-1)
        theta_y = torch.where(y > 0, theta * y, torch.zeros_like(y)).sum(-1)
    loss = theta_p - theta_y + beta * D
    G = p_minus_y(p, target, inplace)
    if sol.bad_rows is not None:
        loss = loss.masked_fill(sol.bad_rows.squeeze(1), math.nan)
    return _kept(loss, target), p, G


def _kl_rows(z: Tensor, target: Target, beta: float, q: Optional[Tensor], inplace: bool = False):
    """KL generator: ``β [-Σ y log p + Σ y log y]`` with ``p = softmax(z + log q)``."""
    if q is None:
        zz = z
    else:  # shift first: z + log q would round log q away at large scores
        m = z.amax(-1, keepdim=True)
        zz = (z - torch.where(torch.isfinite(m), m, torch.zeros_like(m))) + torch.log(q)
    all_masked = zz.amax(-1, keepdim=True) == -math.inf
    masked = not values_checkable(zz) or bool(all_masked.any())  # unknown: take the masked-safe form
    if masked:
        zz = torch.where(all_masked, torch.zeros_like(zz), zz)
    logp = torch.log_softmax(zz, -1)
    if masked:
        logp = torch.where(all_masked, torch.full_like(logp, -math.inf), logp)
    p = torch.exp(logp)
    if target.dense is None:
        nll = -logp.gather(1, target.index.unsqueeze(1)).squeeze(1)
        loss = beta * nll
    else:
        y = target.dense
        cross = torch.where(y > 0, -y * logp, torch.zeros_like(y)).sum(-1)
        loss = beta * (cross + torch.special.xlogy(y, y).sum(-1))
    G = p_minus_y(p, target, inplace)
    return _kept(loss, target), p, G


def _kept(loss: Tensor, target: Target) -> Tensor:
    """The rows' losses as every row loss returns them: a probability target with NaN gives NaN
    in its row (as ``F.cross_entropy``), never a finite number (the formulas skip the entries
    where ``y > 0`` is false, NaN included); ignored rows give 0."""
    if target.dense is not None:
        loss = loss.masked_fill(torch.isnan(target.dense).any(-1), math.nan)
    return torch.where(target.keep, loss, torch.zeros_like(loss))


def p_minus_y(p: Tensor, target: Target, inplace: bool = False) -> Tensor:
    if target.dense is not None:
        G = p.sub_(target.dense) if inplace else p - target.dense
    else:
        G = p if inplace else p.clone()
        G.scatter_add_(1, target.index.unsqueeze(1), -torch.ones_like(G[:, :1]))
    if not values_checkable(G) or not bool(target.keep.all()):
        G = G.masked_fill(~target.keep.unsqueeze(1), 0.0)
    return G


def alpha_relu_rows(theta: Tensor, target: Target, alpha: float, tau: float, inplace: bool = False):
    """Per-row α-ReLU loss, prediction and ``p - y``, with one product ``p·t``.

    With ``t = [(α-1)θ - τ]_+`` and ``p = t^{1/(α-1)}``: ``p^α = p t`` and, on the support,
    ``θ - τ/(α-1) = t/(α-1)``, so ``⟨p, θ - τ/(α-1)⟩ = Σ p t / (α-1)`` and
    ``Σ p^α = Σ p t`` (masked scores have ``t = 0`` and never meet ``-inf · 0``).
    """
    a = alpha - 1.0
    t = torch.mul(theta, a).sub_(tau).clamp_(min=0)
    if a == 0.5:
        p = t * t
    elif a == 1.0:
        p = t.clone()
    else:
        p = t.pow(1.0 / a)
    spt = (p * t).sum(-1)
    c = tau / a
    if target.dense is None:
        ty = theta.gather(1, target.index.unsqueeze(1)).squeeze(1)
        lin = spt / a - (ty - c)
        ya = 1.0
    else:
        y = target.dense
        lin = spt / a - torch.where(y > 0, y * (theta - c), torch.zeros_like(y)).sum(-1)
        ya = y.pow(alpha).sum(-1)
    loss = lin + (ya - spt) / (alpha * a)
    return _kept(loss, target), p, p_minus_y(p, target, inplace)


class RowLoss(torch.autograd.Function):
    """Per-row loss values with the saved gradient ``G = p - y``: backward is ``G · grad``."""

    @staticmethod
    def forward(ctx, x: Tensor, compute, rows: Rows):
        loss, p, G = compute(rows.flat)
        ctx.save_for_backward(G)
        ctx.rows = rows
        return loss.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_rows: Tensor):
        (G,) = ctx.saved_tensors
        g = G * grad_rows.to(G.dtype).unsqueeze(1)
        return ctx.rows.restore(g), None, None


def resolve_loss(mapping: Union[str, Divergence], params: dict):
    """``("fy", divergence)`` or ``("alpha_relu", alpha, tau)`` from a mapping name and its parameters."""
    if mapping == "alpha_relu":
        alpha = check_alpha(params.pop("alpha", 1.5), "alpha", minimum=1.0, strict=True)
        if isinstance(alpha, Tensor):
            raise TypeError("alpha_relu_loss: alpha must be a float > 1")
        tau = check_tau(params.pop("tau", 0.0))
        if params:
            raise ValueError(f"alpha_relu_loss: unexpected parameters {sorted(params)}")
        return "alpha_relu", alpha, tau
    takes_alpha = mapping in ("entmax", "alpha") or isinstance(mapping, Divergence)
    if params.get("alpha") is not None and not takes_alpha:
        raise ValueError(f"alpha: mapping={mapping!r} takes no alpha (got alpha={params['alpha']!r}); "
                         "use mapping='entmax' for alpha-entmax")
    if not takes_alpha:
        params.pop("alpha", None)  # alpha=None: nothing was asked
    alpha = params.pop("alpha", 1.5 if mapping == "entmax" else None)
    if isinstance(alpha, Tensor):
        raise TypeError("entmax_loss: alpha must be a float (the losses do not learn alpha)")
    if params:
        raise ValueError(f"mapping={mapping!r}: unexpected parameters {sorted(params)}")
    return "fy", resolve(mapping, alpha)
