r"""f-sigmoid and f-softplus: the two-class case ``θ = (0, s)`` (``003_…`` §3.4, Appendix C.3).

    f_softplus(s; q) = f_softmax((0, s); q),   f_sigmoid(s; q) = f_softargmax((0, s); q)[1]

with ``q = (q0, q1)`` the prior class weights.  Closed forms are used where
Appendix C.3 gives them, in their numerically stable versions:

* ``"kl"``: ``sigmoid(s + log q1 - log q0)`` and ``logaddexp(log q0, s + log q1)``;
* ``"reverse_kl"``: Proposition 10 (a quadratic in ``τ``);
* ``"jensen_shannon"``: Proposition 11 (a quadratic in ``exp τ``);
* ``"chi_square"``: ``clamp(q1 (q0 s + 1)/(q0 + q1), 0, 1)`` (the binary sparsemax;
  with ``q = 1`` it is ``clamp((s + 1)/2, 0, 1)``, ``004_…`` §3.3).

Every other divergence (squared Hellinger's quartic included) uses the generic
solver on ``(0, s)``; the closed forms are tested against it.  The f-sigmoid computes
the smaller of the two probabilities and returns ``1 -`` it for ``s > 0``
(``sigmoid(s; q0, q1) = 1 - sigmoid(-s; q1, q0)``), so it lies in ``[0, 1]`` with full
relative precision in its tails.

Infinite scores: ``s = +inf`` gives the limits ``f_sigmoid = 1`` and ``f_softplus = +inf``.
``s = -inf`` follows the library's rule that a ``-inf`` score is an *absent* class (as in
:func:`~softargmax.f_softmax`): ``f_sigmoid = 0`` and ``f_softplus = -β q0 f(1/q0)``, the
maximum over ``p = (1, 0)`` with the second class removed (0 for ``q0 = 1``).  This equals
the limit ``s → -inf`` for KL but not for generators with ``f(0) ≠ 0`` (chi-square's limit
is ``1/2``, reverse KL's ``-inf``).  Gradients at ``±inf`` are 0.  A temperature ``β``
gives ``sigmoid_{βf}(s) = sigmoid_f(s/β)`` and ``softplus_{βf}(s) = β softplus_f(s/β)``.
"""

from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor

from ._checks import check_positive_number, check_tensor, compute_dtype
from .divergences import ChiSquare, Divergence, JensenShannon, KL, ReverseKL, get_divergence
from .fdiv import f_softargmax, f_softmax

__all__ = ["f_sigmoid", "f_softplus"]

QPair = tuple


def _check_pair(q, s: Tensor):
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        raise TypeError("q must be a pair (q0, q1) of positive numbers or tensors")
    out = []
    for name, qi in zip(("q0", "q1"), q):
        if isinstance(qi, Tensor):
            if not qi.is_floating_point():
                raise TypeError(f"q: {name} must be a floating-point tensor, got {qi.dtype}")
            if bool((~(qi.detach() > 0) | ~torch.isfinite(qi.detach())).any()):
                raise ValueError(f"q: {name} must be finite and strictly positive")
            try:
                torch.broadcast_shapes(qi.shape, s.shape)
            except RuntimeError:
                raise ValueError(f"q: {name} of shape {tuple(qi.shape)} is not broadcastable to s {tuple(s.shape)}") from None
            out.append(qi.to(s.dtype))
        else:
            out.append(torch.tensor(check_positive_number(qi, f"q: {name}"), dtype=s.dtype, device=s.device))
    return out


def _reverse_kl_tau(s, q0, q1):
    """``τ`` and ``τ - s`` of Proposition 10 in the stable form."""
    g = q1 - q0 + s
    c = 4 * q0 * q1

    def h(t):
        root = torch.sqrt(t * t + c)
        return torch.where(t >= 0, 0.5 * (t + root), 0.5 * c / (root + t.abs()))

    return q0 + h(g), q1 + h(-g)


def _js_h(t, q0, q1):
    """``h(t)`` of Proposition 11 (stable form); ``τ = s/2 + h(s/2)``."""
    a0, a1, c = 1 + q0, 1 + q1, 1 + q0 + q1
    G = torch.logaddexp(-t + torch.log(a0), t + torch.log(a1))
    return G + torch.log1p(torch.sqrt(torch.clamp(1 - 4 * c * torch.exp(-2 * G), min=0))) - 2 * math.log(2)


def _generic_inputs(s, q0, q1):
    x = torch.stack([torch.zeros_like(s), s], -1)
    if not (q0.requires_grad or q1.requires_grad) and q0.dim() == 0 and q1.dim() == 0 \
            and float(q0) == 1.0 and float(q1) == 1.0:
        return x, None
    q0b, q1b = torch.broadcast_tensors(q0, q1)
    qs = torch.stack([q0b, q1b], -1)
    return x, qs


def _prologue(s, divergence, q, temperature, params):
    """Validate the common arguments; returns ``(divergence, β, q0, q1, s/β)`` in the compute dtype."""
    check_tensor(s, "s")
    div = get_divergence(divergence, **params)
    beta = check_positive_number(temperature, "temperature")
    s = s.to(compute_dtype(s.dtype))
    q0, q1 = _check_pair(q, s)
    return div, beta, q0, q1, (s / beta if beta != 1.0 else s)


def f_sigmoid(
    s: Tensor,
    divergence: Union[str, Divergence] = "kl",
    q: QPair = (1.0, 1.0),
    temperature: float = 1.0,
    **params,
) -> Tensor:
    """Probability of the positive class, ``f_softargmax((0, s); q)[1]``, elementwise over ``s``."""
    return _sigmoid(s, divergence, q, temperature, params).to(s.dtype)


def _infinite(t: Tensor):
    """``(t with ±inf replaced by 0, t == +inf, t == -inf)``: the closed forms and the solver
    then never see an infinite score (no NaN, in values or gradients)."""
    pos, neg = t == math.inf, t == -math.inf
    return torch.where(pos | neg, torch.zeros_like(t), t), pos, neg


def _sigmoid(s, divergence, q, temperature, params):
    div, beta, q0, q1, t = _prologue(s, divergence, q, temperature, params)
    if type(div) is KL:
        return torch.sigmoid(t + torch.log(q1) - torch.log(q0))
    if type(div) is ChiSquare:
        return torch.clamp(q1 * (q0 * t + 1) / (q0 + q1), 0, 1)
    t, pos, neg = _infinite(t)
    # The smaller of the two probabilities is computed (there it has full relative
    # precision), the larger one is 1 minus it: sigmoid(s; q0, q1) = 1 - sigmoid(-s; q1, q0).
    flip = t > 0
    u = -t.abs()
    r0, r1 = torch.where(flip, q1, q0), torch.where(flip, q0, q1)
    if type(div) is ReverseKL:
        _, tau_minus_s = _reverse_kl_tau(u, r0, r1)
        low = r1 / tau_minus_s
    elif type(div) is JensenShannon:
        low = r1 / (2 * torch.exp(-u / 2 + _js_h(u / 2, r0, r1)) - 1)
    else:
        x, qs = _generic_inputs(t, q0, q1)
        pr = f_softargmax(x, div, q=qs, dim=-1)
        low = torch.where(flip, pr[..., 0], pr[..., 1])
    out = torch.clamp(torch.where(flip, 1 - low, low), 0, 1)
    # ±inf scores: the limits 1 and 0 (-inf: the class is absent)
    out = torch.where(pos, torch.ones_like(out), out)
    return torch.where(neg, torch.zeros_like(out), out)


def f_softplus(
    s: Tensor,
    divergence: Union[str, Divergence] = "kl",
    q: QPair = (1.0, 1.0),
    temperature: float = 1.0,
    **params,
) -> Tensor:
    """``f_softmax((0, s); q)`` elementwise over ``s``; its derivative in ``s`` is :func:`f_sigmoid`."""
    return _softplus(s, divergence, q, temperature, params).to(s.dtype)


def _softplus(s, divergence, q, temperature, params):
    div, beta, q0, q1, t = _prologue(s, divergence, q, temperature, params)
    t, pos, neg = _infinite(t)
    if type(div) is KL:
        out = torch.logaddexp(torch.log(q0) + torch.zeros_like(t), t + torch.log(q1))
    elif type(div) is ChiSquare:
        tau = torch.maximum(torch.maximum((q1 * t - 1) / (q0 + q1), t - 1 / q1), -1 / q0 + torch.zeros_like(t))
        u0 = torch.clamp(-tau, min=0)
        u1 = torch.clamp(t - tau, min=0)
        out = tau + q0 * 0.5 * (u0 * u0 + 1) + q1 * 0.5 * (u1 * u1 + 1)
    elif type(div) is ReverseKL:
        tau, tau_minus_s = _reverse_kl_tau(t, q0, q1)
        out = tau - q0 * torch.log(tau) - q1 * torch.log(tau_minus_s) - (q0 + q1)
    elif type(div) is JensenShannon:
        h = _js_h(t / 2, q0, q1)
        tau = t / 2 + h
        out = tau - q0 * torch.log(2 - torch.exp(-tau)) - q1 * torch.log(2 - torch.exp(t - tau))
    else:
        x, qs = _generic_inputs(t, q0, q1)
        out = f_softmax(x, div, q=qs, dim=-1)
    # s = +inf: the limit +inf.  s = -inf: the class is absent (as in f_softmax), the
    # maximum over p = (1, 0) alone: -q0 f(1/q0), which is not the limit s -> -inf when
    # f(0) is finite and nonzero (chi-square: 1/2) or infinite (reverse KL: -inf).
    absent = -q0 * div.f(1.0 / q0) + 0.0
    out = torch.where(pos, torch.full_like(out, math.inf), out)
    out = torch.where(neg, absent.to(out.dtype).expand_as(out), out)
    return beta * out if beta != 1.0 else out
