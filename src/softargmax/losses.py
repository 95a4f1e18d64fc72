r"""Fenchel–Young losses of every operator (DESIGN §2).

For a regularizer ``Ω`` with prediction map ``p = ∇Ω*(θ)``:

    ℓ(θ, y) = Ω*(θ) + Ω(y) - ⟨θ, y⟩ = ⟨θ, p - y⟩ + Ω(y) - Ω(p)   >= 0,

zero exactly when ``p = y``, convex in ``θ``, with gradient ``p - y``.  The backward is
``p - y`` from the forward's prediction; it never differentiates through the solver.

* f-divergence losses (``Ω(p) = β Σ_j q_j f(p_j/q_j)`` on the simplex):
  ``divergence="kl"`` is the cross-entropy / KL(y‖softmax(θ)), ``"chi_square"`` the
  sparsemax loss, ``"alpha"`` the α-entmax loss; every generator of
  :mod:`softargmax.divergences` works, with a reference measure ``q`` and a
  temperature ``β``.
* the α-ReLU loss (``000_…``/``001_…``; DESIGN §2):
  ``ℓ = ⟨p - y, θ - τ/(α-1)⟩ + (Σ y^α - Σ p^α)/(α(α-1))`` with ``p = alpha_relu(θ)``,
  the Fenchel–Young loss of ``Ω(p) = Σ_j [p_j^α/(α(α-1)) + τ p_j/(α-1)] - 1/(α(α-1))``
  on ``p >= 0``; its gradient is exactly ``p - y``.

Targets (the shape conventions of ``torch.nn.functional.cross_entropy``):

* class indices: an integer tensor of ``x``'s shape without ``dim``; entries equal to
  ``ignore_index`` are skipped (loss 0, no gradient, not counted by ``"mean"``);
* probability vectors: a floating tensor of ``x``'s shape, non-negative, summing to 1
  along ``dim`` (distillation, label proportions);
* label sets with ``multilabel=True``: a 0/1 tensor of ``x``'s shape; the target is the
  uniform distribution over the active labels (``004_…`` §3.4).

``label_smoothing`` ε mixes the target with the uniform distribution,
``(1 - ε) y + ε/k``.  ``weight`` (per class, like ``cross_entropy``) scales each item
by ``⟨weight, y⟩`` (``weight[c]`` for a class index) and ``"mean"`` divides by the sum
of those item weights, so hard labels match ``cross_entropy`` exactly.

Masked scores (``-inf``) are excluded classes.  A target with mass on a masked class
has loss ``+inf`` (not NaN) and the finite gradient ``p - y``.  Generators with
``f(0) = +inf`` (reverse KL, Jeffrey, reverse chi-square) have ``Ω(y) = +inf`` for
any target with a zero entry, so their loss *value* is ``+inf`` for hard labels
(``003_…`` §3.5: they need strictly positive soft labels); the gradient ``p - y`` is
still finite and can be used for training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _kernels
from ._checks import Rows, check_alpha, check_dim, check_positive_number, check_q, check_tensor
from .divergences import KL, AlphaDivergence, Divergence, get_divergence
from .mappings import MAPPING_NAMES, resolve
from .threshold import solve

__all__ = [
    "fenchel_young_loss",
    "sparsemax_loss",
    "entmax15_loss",
    "entmax_loss",
    "alpha_relu_loss",
    "f_divergence_loss",
    "binary_f_divergence_loss",
    "MAPPINGS",
]

#: mapping names accepted by :func:`fenchel_young_loss`: those of :mod:`softargmax.mappings` and ``"alpha_relu"``
MAPPINGS = MAPPING_NAMES + ("alpha_relu",)

_REDUCTIONS = ("mean", "sum", "none")


# ----------------------------------------------------------------------------------
# targets
# ----------------------------------------------------------------------------------


@dataclass
class Target:
    """A parsed target, as rows ``[R, k]``.

    ``index``: ``[R]`` class indices (ignored rows hold 0) or ``None``;
    ``dense``: ``[R, k]`` target distributions or ``None``; ``keep``: ``[R]`` rows
    that count (not ignored); ``item_weight``: ``[R]`` or ``None``.
    """

    index: Optional[Tensor]
    dense: Optional[Tensor]
    keep: Tensor
    item_weight: Optional[Tensor]

    def as_dense(self, k: int, dtype) -> Tensor:
        if self.dense is not None:
            return self.dense
        y = torch.zeros(self.index.shape[0], k, dtype=dtype, device=self.index.device)
        y.scatter_(1, self.index.unsqueeze(1), self.keep.to(dtype).unsqueeze(1))
        return y


def parse_target(
    target: Tensor,
    x: Tensor,
    rows: Rows,
    *,
    multilabel: bool = False,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
) -> Target:
    """Validate ``target`` against ``x`` and bring it to rows (see the module docstring)."""
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    k, R, dtype = rows.k, rows.R, rows.dtype
    batch_shape = tuple(rows.moved_shape[:-1])
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if weight is not None:
        if not isinstance(weight, Tensor) or not weight.is_floating_point() or weight.shape != (k,):
            raise ValueError(f"weight must be a floating tensor of shape ({k},) (one weight per class), got "
                             f"{type(weight).__name__ if not isinstance(weight, Tensor) else tuple(weight.shape)}")
        if bool((weight.detach() < 0).any()):
            raise ValueError("weight must be non-negative")
        weight = weight.to(dtype)

    index = dense = None
    if multilabel:
        if target.shape != x.shape:
            raise ValueError(f"target: with multilabel=True it must have the input's shape {tuple(x.shape)}, got {tuple(target.shape)}")
        t = rows.to_rows(target.to(dtype))
        if bool(((t != 0) & (t != 1)).any()):
            raise ValueError("target: a multi-hot label set must contain only 0 and 1")
        counts = t.sum(-1, keepdim=True)
        if bool((counts == 0).any()):
            raise ValueError("target: every multi-hot row needs at least one active label (found a row with none)")
        dense = t / counts
        keep = torch.ones(R, dtype=torch.bool, device=target.device)
    elif not target.is_floating_point():
        if target.dtype == torch.bool or target.is_complex():
            raise TypeError(f"target: class indices must be an integer tensor, got {target.dtype}")
        if tuple(target.shape) != batch_shape:
            raise ValueError(f"target: class indices must have the input's shape without dim, {batch_shape}, got {tuple(target.shape)}")
        idx = target.reshape(R).to(torch.long)
        keep = idx != ignore_index
        bad = keep & ((idx < 0) | (idx >= k))
        if bool(bad.any()):
            raise ValueError(f"target: class index {int(idx[bad][0])} is out of range [0, {k}) (ignore_index={ignore_index})")
        index = torch.where(keep, idx, torch.zeros_like(idx))
    else:
        if target.shape != x.shape:
            raise ValueError(f"target: probability vectors must have the input's shape {tuple(x.shape)}, got {tuple(target.shape)}")
        y = rows.to_rows(target)
        if bool((y < 0).any()):
            raise ValueError("target: probability vectors must be non-negative")
        s = y.sum(-1)
        tol = 1e-4 if dtype != torch.float64 else 1e-8
        if bool(((s - 1).abs() > tol * k ** 0.5 + tol).any()):
            raise ValueError(f"target: probability vectors must sum to 1 along dim (sums range over [{float(s.min()):.6g}, {float(s.max()):.6g}])")
        dense = y
        keep = torch.ones(R, dtype=torch.bool, device=target.device)

    if label_smoothing > 0:
        base = dense if dense is not None else Target(index, None, keep, None).as_dense(k, dtype)
        dense = (1 - label_smoothing) * base + label_smoothing / k
        dense = torch.where(keep.unsqueeze(1), dense, torch.zeros_like(dense))

    item_weight = None
    if weight is not None:
        # hard labels (even smoothed) weigh like cross_entropy: weight[c]; distributions: ⟨weight, y⟩
        item_weight = weight[index] * keep if index is not None else dense @ weight
    return Target(index=index, dense=dense, keep=keep, item_weight=item_weight)


def reduce_loss(per_row: Tensor, target: Target, reduction: str, batch_shape) -> Tensor:
    """Apply item weights and the reduction (``mean`` over kept items, weighted)."""
    w = target.item_weight
    loss = per_row if w is None else per_row * w
    if reduction == "none":
        return loss.reshape(batch_shape)
    if reduction == "sum":
        return loss.sum()
    denom = target.keep.sum().to(loss.dtype) if w is None else w.sum()
    return loss.sum() / denom


# ----------------------------------------------------------------------------------
# values
# ----------------------------------------------------------------------------------


def fy_rows(theta: Tensor, target: Target, div: Divergence, beta: float, q: Optional[Tensor], inplace: bool = False):
    """Per-row Fenchel–Young loss, the prediction and ``p - y`` for rows ``theta`` ``[R, k]``.

    Returns ``(loss [R], p [R, k], G [R, k])``; ignored rows have loss 0 and ``G = 0``.
    With ``inplace`` ``G`` is written over ``p`` (the returned ``p`` is then ``G``).
    """
    R, k = theta.shape
    z = theta / beta if beta != 1.0 else theta
    if isinstance(div, KL) or (isinstance(div, AlphaDivergence) and div.alpha == 1.0 and not isinstance(div.alpha, Tensor)):
        return _kl_rows(z, target, beta, q, inplace)
    # on CPU the pruned solution: Ω(p) and ⟨θ, p⟩ below then cost only the candidates (the
    # fused CPU solver's dense rows would make them full-size); on GPU the Triton kernels
    sol = solve(z, div, q, fused=_kernels.on_gpu_kernels(z))
    p = sol.dense_p()
    # ⟨θ, p⟩ on the candidates (p = 0 elsewhere; 0 · (-inf) must not become NaN)
    pc = sol.p
    if sol.zp is not None:  # the GPU kernels' row sums, from the pass that wrote p
        theta_p = (beta * sol.zp).to(theta.dtype)
    else:
        th_c = sol.gather(theta)
        theta_p = torch.where(pc > 0, th_c * pc, torch.zeros_like(pc)).sum(-1)
    f0 = float(div.f(torch.zeros((), dtype=torch.float64)))
    if math.isfinite(f0):
        # Ω(y) - Ω(p) with the f(0) terms of the zero entries cancelled
        if sol.omega is not None:
            omega_p = sol.omega.to(theta.dtype)
        else:
            q_c = None if q is None else sol.gather(q.expand(R, k))
            omega_p = _sum_f_minus_f0(div, pc, q_c, f0)
        if target.dense is None:
            qt = None if q is None else q.expand(R, k).gather(1, target.index.unsqueeze(1)).squeeze(1)
            one = torch.ones(R, dtype=theta.dtype, device=theta.device)
            omega_y = (div.f(one) - f0) if qt is None else qt * (div.f(1.0 / qt) - f0)
            theta_y = theta.gather(1, target.index.unsqueeze(1)).squeeze(1)
        else:
            y = target.dense
            omega_y = _sum_f_minus_f0(div, y, None if q is None else q.expand(R, k), f0)
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
    G = _p_minus_y(p, target, inplace)
    if sol.bad_rows is not None:
        loss = loss.masked_fill(sol.bad_rows.squeeze(1), math.nan)
    loss = torch.where(target.keep, loss, torch.zeros_like(loss))
    return loss, p, G


def _sum_f_minus_f0(div: Divergence, p: Tensor, q: Optional[Tensor], f0: float) -> Tensor:
    """``Σ_j q_j [f(p_j/q_j) - f(0)]`` over the entries with ``p_j > 0``."""
    pos = p > 0
    ratio = p if q is None else p / q
    vals = div.f(torch.where(pos, ratio, torch.ones_like(ratio))) - f0
    if q is not None:
        vals = vals * q
    return torch.where(pos, vals, torch.zeros_like(vals)).sum(-1)


def _kl_rows(z: Tensor, target: Target, beta: float, q: Optional[Tensor], inplace: bool = False):
    """KL generator: ``β [-Σ y log p + Σ y log y]`` with ``p = softmax(z + log q)``."""
    zz = z if q is None else z + torch.log(q)
    all_masked = zz.amax(-1, keepdim=True) == -math.inf
    if bool(all_masked.any()):
        zz = torch.where(all_masked, torch.zeros_like(zz), zz)
    logp = torch.log_softmax(zz, -1)
    if bool(all_masked.any()):
        logp = torch.where(all_masked, torch.full_like(logp, -math.inf), logp)
    p = torch.exp(logp)
    if target.dense is None:
        nll = -logp.gather(1, target.index.unsqueeze(1)).squeeze(1)
        loss = beta * nll
    else:
        y = target.dense
        cross = torch.where(y > 0, -y * logp, torch.zeros_like(y)).sum(-1)
        loss = beta * (cross + torch.special.xlogy(y, y).sum(-1))
    G = _p_minus_y(p, target, inplace)
    loss = torch.where(target.keep, loss, torch.zeros_like(loss))
    return loss, p, G


def _p_minus_y(p: Tensor, target: Target, inplace: bool = False) -> Tensor:
    if target.dense is not None:
        G = p.sub_(target.dense) if inplace else p - target.dense
    else:
        G = p if inplace else p.clone()
        G.scatter_add_(1, target.index.unsqueeze(1), -torch.ones_like(G[:, :1]))
    if not bool(target.keep.all()):
        G = G.masked_fill(~target.keep.unsqueeze(1), 0.0)
    return G


def alpha_relu_rows(theta: Tensor, target: Target, alpha: float, tau: float, inplace: bool = False):
    """Per-row α-ReLU loss, prediction and ``p - y`` (DESIGN §2), with one product ``p·t``.

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
    loss = torch.where(target.keep, loss, torch.zeros_like(loss))
    return loss, p, _p_minus_y(p, target, inplace)


def rows_of(target: Target, start: int, end: int) -> Target:
    """The rows ``start:end`` of a parsed target."""
    cut = lambda t: None if t is None else t[start:end]  # noqa: E731
    return Target(cut(target.index), cut(target.dense), target.keep[start:end], cut(target.item_weight))


class _RowLoss(torch.autograd.Function):
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


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, _REDUCTIONS))}, got {reduction!r}")


def _resolve(mapping: Union[str, Divergence], params: dict):
    """``("fy", divergence)`` or ``("alpha_relu", alpha, tau)`` from a mapping name and its parameters."""
    if mapping == "alpha_relu":
        alpha = check_alpha(params.pop("alpha", 1.5), "alpha", minimum=1.0, strict=True)
        if isinstance(alpha, Tensor):
            raise TypeError("alpha_relu_loss: alpha must be a float > 1")
        tau = params.pop("tau", 0.0)
        if params:
            raise ValueError(f"alpha_relu_loss: unexpected parameters {sorted(params)}")
        return "alpha_relu", alpha, tau
    alpha = params.pop("alpha", 1.5 if mapping == "entmax" else None)
    if isinstance(alpha, Tensor):
        raise TypeError("entmax_loss: alpha must be a float (the losses do not learn alpha)")
    if params:
        raise ValueError(f"mapping={mapping!r}: unexpected parameters {sorted(params)}")
    return "fy", resolve(mapping, alpha)


def fenchel_young_loss(
    x: Tensor,
    target: Tensor,
    mapping: Union[str, Divergence] = "entmax15",
    *,
    dim: int = -1,
    q: Optional[Tensor] = None,
    temperature: float = 1.0,
    multilabel: bool = False,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    return_prediction: bool = False,
    **mapping_params,
):
    r"""The Fenchel–Young loss of ``mapping`` between scores ``x`` and ``target`` (module docstring).

    Args:
        x: scores.
        target: class indices, probability vectors, or (``multilabel=True``) 0/1 label sets.
        mapping: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with
            ``alpha=``), ``"alpha_relu"`` (with ``alpha=``, ``tau=``), any divergence
            name (with its parameters), or a :class:`~softargmax.divergences.Divergence`.
        dim: the class dimension.
        q, temperature: reference measure and temperature of f-divergence losses
            (``q`` is a constant here: losses do not differentiate it).
        multilabel, ignore_index, reduction, label_smoothing, weight: as in the module docstring.
        return_prediction: also return the prediction (detached, ``x``'s shape), computed
            in the same call.

    Returns:
        the loss (a scalar, or ``x``'s shape without ``dim`` for ``reduction="none"``), and
        the prediction if ``return_prediction``.
    """
    check_tensor(x)
    dim = check_dim(x, dim)
    _check_reduction(reduction)
    kind = _resolve(mapping, dict(mapping_params))
    rows = Rows(x, dim)
    tgt = parse_target(target, x, rows, multilabel=multilabel, ignore_index=ignore_index,
                       label_smoothing=label_smoothing, weight=weight)
    if kind[0] == "fy":
        beta = check_positive_number(temperature, "temperature")
        check_q(q, x)
        q2d = rows.class_param(q.detach()) if q is not None else None
        div = kind[1]
        compute = lambda theta: fy_rows(theta, tgt, div, beta, q2d)  # noqa: E731
    else:
        if q is not None or temperature != 1.0:
            raise ValueError("alpha_relu_loss takes no q or temperature")
        _, alpha, tau = kind
        if isinstance(tau, Tensor):
            if tau.numel() != 1:
                raise ValueError("alpha_relu_loss: tau must be a number or a one-element tensor")
            tau = float(tau)
        compute = lambda theta: alpha_relu_rows(theta, tgt, alpha, tau)  # noqa: E731
    kept = {}

    def compute_and_keep(theta):
        loss, p, G = compute(theta)
        kept["p"] = p
        return loss, p, G

    if x.requires_grad and torch.is_grad_enabled():
        per_row = _RowLoss.apply(x, compute_and_keep, rows)
    else:
        per_row = compute_and_keep(rows.flat)[0].to(x.dtype)
    loss = reduce_loss(per_row, tgt, reduction, tuple(rows.moved_shape[:-1]))
    if not return_prediction:
        return loss
    return loss, rows.restore(kept["p"].detach())


def sparsemax_loss(x: Tensor, target: Tensor, **kwargs):
    """The sparsemax loss (``004_…`` eq. 26; chi-square f-divergence).  Options: :func:`fenchel_young_loss`."""
    return fenchel_young_loss(x, target, "sparsemax", **kwargs)


def entmax15_loss(x: Tensor, target: Tensor, **kwargs):
    """The 1.5-entmax loss.  Options: :func:`fenchel_young_loss`."""
    return fenchel_young_loss(x, target, "entmax15", **kwargs)


def entmax_loss(x: Tensor, target: Tensor, alpha: float = 1.5, **kwargs):
    """The α-entmax loss for a float α > 0 (α = 1: cross-entropy).  Options: :func:`fenchel_young_loss`."""
    return fenchel_young_loss(x, target, "entmax", alpha=alpha, **kwargs)


def alpha_relu_loss(x: Tensor, target: Tensor, alpha: float = 1.5, tau: float = 0.0, **kwargs):
    """The α-ReLU loss (DESIGN §2), ``τ`` in the entmax parametrization.  Options: :func:`fenchel_young_loss`."""
    return fenchel_young_loss(x, target, "alpha_relu", alpha=alpha, tau=tau, **kwargs)


def f_divergence_loss(
    x: Tensor,
    target: Tensor,
    divergence: Union[str, Divergence] = "kl",
    q: Optional[Tensor] = None,
    temperature: float = 1.0,
    **kwargs,
):
    """The loss generated by an f-divergence (``003_…`` §3; ``alpha=`` for ``"alpha"``).  Options: :func:`fenchel_young_loss`."""
    return fenchel_young_loss(x, target, divergence, q=q, temperature=temperature, **kwargs)


def binary_f_divergence_loss(
    s: Tensor,
    target: Tensor,
    divergence: Union[str, Divergence] = "kl",
    q=(1.0, 1.0),
    temperature: float = 1.0,
    reduction: str = "mean",
    weight: Optional[Tensor] = None,
    **params,
) -> Tensor:
    r"""Binary Fenchel–Young loss of the f-sigmoid (``003_…`` §3.4), elementwise over ``s``.

    ``ℓ(s, y) = f_softplus(s) + β [q0 f((1-y)/q0) + q1 f(y/q1)] - s y`` for ``y ∈ [0, 1]``
    (the probability of the positive class): zero iff ``f_sigmoid(s) = y``, gradient
    ``f_sigmoid(s) - y``.  ``"kl"`` is ``binary_cross_entropy_with_logits`` (minus the
    target's entropy for soft targets); ``"chi_square"`` with ``q = (1, 1)`` is the
    modified Huber loss (``004_…`` §3.3).  For one-vs-all multi-label classification pass
    the 0/1 label matrix as ``target``.  ``weight`` multiplies each element (broadcast).
    """
    from .binary import _check_pair, f_softplus

    check_tensor(s, "s")
    _check_reduction(reduction)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.shape != s.shape:
        raise ValueError(f"target must have the shape of s {tuple(s.shape)}, got {tuple(target.shape)}")
    y = target.to(s.dtype)
    if bool(((y < 0) | (y > 1)).any()):
        raise ValueError("target: binary targets must lie in [0, 1]")
    div = get_divergence(divergence, **params)
    beta = check_positive_number(temperature, "temperature")
    q0, q1 = _check_pair(q, s)
    omega_y = q0 * div.f((1 - y) / q0) + q1 * div.f(y / q1)
    loss = f_softplus(s, div, q=(q0, q1), temperature=beta) + beta * omega_y - s * y
    if weight is not None:
        loss = loss * weight
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()
