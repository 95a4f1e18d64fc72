r"""The Fenchel–Young loss of every f-divergence and the α-ReLU loss as :class:`~softargmax.losses._rows.RowLoss`
objects, and :func:`resolve_loss`, which makes one from a mapping name and its parameters (and
validates them, once, for the one-process, fused and vocabulary-parallel losses).

* :class:`FenchelYoungRowLoss`: :math:`\Omega(p) = \beta \sum_j q_j f(p_j/q_j)` on the simplex;
  :math:`\ell = \langle\theta, p - y\rangle + \beta\,[\Omega(y) - \Omega(p)]` from one threshold solve.
* :class:`AlphaReLURowLoss`: :math:`\Omega(p) = \sum_j \big[p_j^\alpha/(\alpha(\alpha-1)) + \tau p_j/(\alpha-1)\big]` on
  :math:`p \ge 0` (no normalization, a fixed :math:`\tau`).

References:

* Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020, https://arxiv.org/abs/1901.02324
* Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_alpha, check_positive_number, check_q, check_tau, compute_dtype
from .._utils.rows import Rows, shift_by_row_max
from ..backends import (
    TileFlags,
    alpha_relu_loss_gradient,
    kernel_device,
    softmax_loss_gradient,
    solve_loss_gradient,
    solves_half_rows,
)
from ..backends.solution import sum_f_minus_f0
from ..divergences import AlphaDivergence, Divergence, spec_of
from ..operators._carried import carried_name
from ..operators.mappings import MAPPING_NAMES, resolve
from ..solvers.threshold import solve
from ._omega import f_at_zero, one_hot_omega
from ._rows import RowLoss, SplitSolve, SplitValues, kept_rows
from ._targets import Target

__all__ = ["FenchelYoungRowLoss", "AlphaReLURowLoss", "resolve_loss", "theta_y", "dot_positive", "omega_y", "MAPPINGS"]

#: mapping names the losses accept: those of :mod:`softargmax.operators.mappings` and ``"alpha_relu"``
MAPPINGS = MAPPING_NAMES + ("alpha_relu",)


def dot_positive(theta: Tensor, w: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """``⟨θ, w⟩`` per row ``[R]`` over the entries with ``w > 0`` (``0 · (-inf)`` is not NaN), summed in ``dtype``."""
    return torch.where(w > 0, theta * w, torch.zeros_like(w)).sum(-1, dtype=dtype)


def theta_y(theta: Tensor, target: Target, dtype: Optional[torch.dtype] = None) -> Tensor:
    r"""``⟨θ, y⟩`` per row ``[R]`` (:func:`dot_positive`; a class index held elsewhere counts 0; smoothed class
    indices in closed form, :math:`(1 - ε) θ_c + ε/k \sum_j θ_j`: one pass over ``θ`` instead of three)."""
    if target.dense is not None and target.smoothing > 0 and target.index is not None and target.owned is None:
        eps, k = target.smoothing, theta.shape[1]
        vals = theta.sum(-1, dtype=dtype) * (eps / k)
        if eps < 1.0:  # (at ε = 1 the class entry's weight is 0: no 0 · (-inf))
            vals = vals + theta.gather(1, target.index.unsqueeze(1)).squeeze(1).to(vals.dtype) * (1.0 - eps)
        return torch.where(target.keep, vals, torch.zeros_like(vals))
    if target.dense is not None:
        return dot_positive(theta, target.dense, dtype)
    if theta.shape[1] == 0:
        return torch.zeros(theta.shape[0], dtype=dtype or theta.dtype, device=theta.device)
    assert target.index is not None  # a target holds class indices or distributions
    th = theta.gather(1, target.index.unsqueeze(1)).squeeze(1).to(dtype or theta.dtype)
    return th if target.owned is None else torch.where(target.owned, th, torch.zeros_like(th))


class FenchelYoungRowLoss(RowLoss):
    """The Fenchel–Young loss of the f-softargmax of ``divergence``, with a reference measure ``q``
    (``None`` or rows ``[R|1, k]``) and a temperature ``beta``."""

    def __init__(self, divergence: Divergence, q: Optional[Tensor] = None, beta: float = 1.0) -> None:
        self.divergence, self.q, self.beta = divergence, q, beta
        self.name = divergence.name
        self.sparse_gradient = divergence.sparse

    def __repr__(self) -> str:
        return f"FenchelYoungRowLoss({self.divergence!r})"

    def bind(self, q: Optional[Tensor], temperature: float, like: Tensor, rows: Rows) -> FenchelYoungRowLoss:
        beta = check_positive_number(temperature, "temperature")
        check_q(q, like)
        return FenchelYoungRowLoss(self.divergence, None if q is None else rows.class_param(q.detach()), beta)

    def values(self, theta: Tensor, target: Target) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        beta, div = self.beta, self.divergence
        # shift before scaling: theta / β would round large scores
        z = shift_by_row_max(theta, beta) if beta != 1.0 else theta
        if div.hints.softmax:
            return self._softmax_values(z, target)
        # on CPU the C solver's row sums (α-entmax, and the conjugate Ω* of Jensen–Shannon and Hellinger) or
        # the pruned solution, so Ω(p) and ⟨θ, p⟩ below cost only the candidates; half-precision
        # rows (the GPU kernels, :meth:`solves_in_place_dtype`) give p in their dtype and float32 row sums
        sol = solve(z, div, self.q, candidates_only=True, row_sums=True)
        p = sol.dense_p()
        vdt = compute_dtype(theta.dtype)  # the loss values: float32 for half-precision rows
        f0 = f_at_zero(div)
        if not math.isfinite(f0) and self.q is None and target.dense is None and target.owned is None:
            return _infinite_f0_index_loss(theta, target, vdt, sol.bad_rows), p, sol.bad_rows
        if sol.omega_star is not None and self.q is None:
            return _conjugate_loss(div, theta, target, sol.omega_star, beta, f0, vdt), p, sol.bad_rows
        # ⟨θ, p⟩ (p = 0 off the candidates); with β != 1, z was shifted, so a backend's ⟨z, p⟩ is not ⟨θ, p⟩/β
        theta_p = sol.inner(theta, beta, use_row_sums=beta == 1.0, dtype=vdt)
        q = None if self.q is None else self.q.expand(theta.shape)
        if math.isfinite(f0):  # Ω(y) - Ω(p) with the f(0) terms of the zero entries cancelled
            D = omega_y(div, target, q, f0, vdt) - sol.f_sum(div, self.q, f0, vdt)
        else:
            D = _omega_difference(div, theta, target.as_dense(theta.shape[1], theta.dtype), p, q)
        # a Fenchel–Young loss is >= 0 (zero iff p = y): the row sums' rounding may leave -1 ulp where p = y
        loss = (theta_p - theta_y(theta, target, vdt) + beta * D).clamp_min(0.0)
        return loss, p, sol.bad_rows

    def solves_in_dtype(self, rows: Tensor, prediction: bool = False) -> bool:
        """Whether half-precision rows ``rows`` ``[R, k]`` are computed as they are, with no float32
        copy: the GPU kernels write ``p`` (or, for the softmax loss without ``prediction``, the
        gradient) in their dtype and the float32 row sums that give the value.  ``β = 1`` and
        ``q = 1`` only (a temperature or a reference measure would round the scores in half
        precision first)."""
        if self.beta != 1.0 or self.q is not None:
            return False
        if self.divergence.hints.softmax:
            return not prediction and kernel_device(rows)
        return solves_half_rows(rows, self.divergence)

    def fused_rows(self, theta: Tensor, target: Target, inplace: bool, scale: Optional[Tensor],
                   overwrite: bool, tiles: Optional[TileFlags] = None) -> Optional[tuple[Tensor, Tensor, Tensor]]:
        """The rows by one GPU kernel that writes ``G`` itself, ``p`` never formed: only where the caller
        keeps no prediction (``inplace``), with ``β = 1`` and ``q = 1``.

        * the softmax loss (:func:`softargmax.backends.softmax_loss_gradient`): ``G = (softmax(θ) - y) · scale``
          over ``θ`` with ``overwrite`` (else a new tensor), and the value ``log Σ e^θ - ⟨y, θ⟩ + Σ y log y``
          from its float32 row sums;
        * the other mappings with class indices and no ``scale`` (:meth:`_solved_gradient_rows`): the row
          solver writes ``G = p - y`` in the pass that would write ``p``.
        """
        if not (inplace and self.beta == 1.0 and self.q is None and target.owned is None):
            return None
        if not self.divergence.hints.softmax:
            return self._solved_gradient_rows(theta, target, scale)
        out = softmax_loss_gradient(theta, target.index, target.dense, target.keep, scale,
                                    out=theta if overwrite else None)
        if out is None:
            return None
        G, lse, zy = out
        if target.dense is None:
            loss = lse - zy
        else:
            y = target.dense
            loss = lse * y.sum(-1) - zy + torch.special.xlogy(y, y).sum(-1)
        # an all-masked row: log p = -inf everywhere, so the loss is +inf (as log_softmax's form gives)
        loss = torch.where(lse == -math.inf, torch.full_like(loss, math.inf), loss)
        return kept_rows(loss, target), G, G

    def _solved_gradient_rows(self, theta: Tensor, target: Target,
                              scale: Optional[Tensor]) -> Optional[tuple[Tensor, Tensor, Tensor]]:
        """``(loss, G, G)`` of class indices by the GPU row solver alone
        (:func:`softargmax.backends.solve_loss_gradient`: ``G = p - y``, 0 in ignored rows, written where
        ``p`` would be, with the row sums ``⟨θ, p⟩`` and ``Σ f(p) - f(0)``), the value as :meth:`values`
        computes it from the same row sums; ``None`` where that path does not apply (a scale, dense
        targets, ``f(0) = ∞``, rows the kernels do not take)."""
        div = self.divergence
        if scale is not None or target.index is None or target.dense is not None:
            return None
        f0 = f_at_zero(div)
        if not math.isfinite(f0):
            return None
        out = solve_loss_gradient(theta, div, target.index, target.keep)
        if out is None:
            return None
        G, zp, omega, bad = out
        vdt = compute_dtype(theta.dtype)  # the loss values: float32 for half-precision rows
        D = omega_y(div, target, None, f0, vdt) - omega.to(vdt)
        loss = (zp.to(vdt) - theta_y(theta, target, vdt) + D).clamp_min(0.0)  # >= 0, as in values()
        return kept_rows(loss.masked_fill(bad.squeeze(1), math.nan), target), G, G

    def _softmax_values(self, z: Tensor, target: Target) -> tuple[Tensor, Tensor, None]:
        """KL generator: ``β [-Σ y log p + Σ y log y]`` with ``p = softmax(z + log q)``."""
        if self.q is None:
            zz = z
        else:  # shift first: z + log q would round log q away at large scores
            m = z.amax(-1, keepdim=True)
            zz = (z - torch.where(torch.isfinite(m), m, torch.zeros_like(m))) + torch.log(self.q)
        # log-softmax as zz - logsumexp, with the logsumexp of an all-masked row (-inf) replaced by 0:
        # such a row gets log p = -inf and p = 0 (log_softmax would give NaN), and no row is tested
        # on the host (no device synchronization)
        # (+inf scores make the row NaN, as log_softmax does)
        lse = torch.logsumexp(zz, -1, keepdim=True)
        lse = torch.where(lse == math.inf, torch.full_like(lse, math.nan), lse)
        logp = zz - torch.where(lse == -math.inf, torch.zeros_like(lse), lse)
        if target.dense is None:
            assert target.index is not None  # a target holds class indices or distributions
            loss = self.beta * -logp.gather(1, target.index.unsqueeze(1)).squeeze(1)
        else:
            y = target.dense
            cross = torch.where(y > 0, -y * logp, torch.zeros_like(y)).sum(-1)
            loss = self.beta * (cross + torch.special.xlogy(y, y).sum(-1))
        return loss, torch.exp(logp), None

    def split_values(self, theta: Tensor, target: Target, solve: SplitSolve) -> SplitValues:
        """This process's terms of ``⟨θ, p - y⟩ + β (Ω(y) - Ω(p))`` per row.

        The per-class terms are accumulated in float64 (for float32 rows: ``Ω(y) - Ω(p)`` sums
        terms ``f(u) - f(0)`` that cancel, and the split sums should not round worse than one
        process's).  ``⟨θ, p⟩`` and ``Ω(p)`` are taken over the support of ``p`` only when it is
        small (sparse mappings), as one process does on its candidates.  The correction
        ``β τ (S - 1)`` makes the value stationary in ``τ``: with ``f'(p_j/q_j) = z_j - τ`` on the
        support, ``d/dτ [⟨θ, p⟩ - β Ω(p) - β τ (S - 1)] = -β (S - 1)``, zero at the root, so the
        solver's residual ``|S - 1|`` enters the value at second order instead of multiplied by ``|τ|``.
        """
        div, beta = self.divergence, self.beta
        sol, S = solve(theta / beta if beta != 1.0 else theta, div, self.q)
        vdt = torch.float64 if theta.dtype == torch.float32 else theta.dtype
        q = None if self.q is None else self.q.expand(theta.shape)
        per_row_alpha = self.row_parameters() is not None
        f0: Union[float, Tensor]
        if per_row_alpha:  # f(0) per row, [R, 1]
            f0 = div.f(torch.zeros((), dtype=vdt, device=theta.device))
            f0_finite = bool(torch.isfinite(f0).all())
        else:
            f0 = f_at_zero(div)
            f0_finite = math.isfinite(f0)
        if f0_finite:
            theta_p, omega_p = _p_terms(div, theta, sol.p, q, f0, vdt, sparse=not per_row_alpha)
            D = omega_y(div, target, q, f0, vdt) - omega_p
            partial = theta_p - theta_y(theta, target, vdt) + beta * D
        else:
            p, y, th = sol.p.to(vdt), target.as_dense(theta.shape[1], vdt), theta.to(vdt)
            D = _omega_difference(div, theta, y, p, None if q is None else q.to(vdt))
            partial = dot_positive(th, p) - dot_positive(th, y) + beta * D
        c = beta * (sol.tau * (S - 1)).squeeze(1)
        c = torch.where(torch.isfinite(c) & target.keep, c, torch.zeros_like(c)).to(S.dtype)
        return partial, sol.p, sol.bad_rows, c

    def describe(self) -> str:
        if self.row_parameters() is not None:
            return f"{type(self.divergence).__name__}(alpha=<per-row tensor>)"
        return repr(self.divergence)

    def row_parameters(self) -> Optional[Tensor]:
        alpha = getattr(self.divergence, "alpha", None)
        return alpha if isinstance(alpha, Tensor) else None

    def operator_spec(self) -> Optional[tuple[str, float, float]]:
        spec = spec_of(self.divergence)
        if spec is not None:
            return spec[0], spec[1], 0.0
        if self.row_parameters() is not None:  # one α per row: a tensor the operator cannot carry
            return None
        return carried_name(self.divergence), 0.0, 0.0  # a user's generator, by its name in this process


def omega_y(div: Divergence, target: Target, q: Optional[Tensor], f0: Union[float, Tensor],
             dtype: torch.dtype) -> Tensor:
    """``Σ_j q_j [f(y_j/q_j) - f(0)]`` per row over the entries with ``y_j > 0`` (this process's
    classes: a class index elsewhere counts 0); ``q``: ``None`` or ``[R, k]``."""
    keep = target.keep
    R = keep.shape[0]
    if target.dense is not None and target.smoothing > 0 and q is None and target.owned is None:
        # smoothed class indices: y_c = 1 - ε + ε/k and ε/k for the k - 1 others (0 in ignored rows), so the sum
        # over the k entries is two evaluations of f per row instead of k
        k, eps = target.dense.shape[1], target.smoothing
        top = torch.full((R, 1), 1.0 - eps + eps / k, dtype=dtype, device=keep.device)
        rest = torch.full((R, 1), eps / k, dtype=dtype, device=keep.device)
        vals = ((div.f(top) - f0) + (k - 1) * (div.f(rest) - f0)).reshape(R)
        return torch.where(keep, vals, torch.zeros_like(vals))
    if target.dense is not None:
        return sum_f_minus_f0(div, target.dense.to(dtype), None if q is None else q.to(dtype), f0)
    if q is None and isinstance(f0, float):  # Ω(e_c) less the f(0) terms: a constant (losses._omega)
        vals = torch.full((R,), one_hot_omega(div, dtype), dtype=dtype, device=keep.device)
    elif q is None:  # f(0) per row (one α per row)
        vals = (div.f(torch.ones(R, 1, dtype=dtype, device=keep.device)) - f0).reshape(R)
    else:
        assert target.index is not None  # a target holds class indices or distributions
        qt = q.gather(1, target.index.unsqueeze(1)).to(dtype) if q.shape[1] else \
            torch.ones(R, 1, dtype=dtype, device=keep.device)
        vals = (qt * (div.f(1.0 / qt) - f0)).squeeze(1)
    return vals if target.owned is None else torch.where(target.owned, vals, torch.zeros_like(vals))


def _conjugate_loss(div: Divergence, theta: Tensor, target: Target, omega_star: Tensor, beta: float, f0: float,
                    dtype: torch.dtype) -> Tensor:
    r"""The loss values ``[R]`` in ``dtype`` from the solver's conjugate ``omega_star`` ``[R]`` (float64) of the rows
    ``z = (θ - max θ)/β`` (``z = θ`` at ``β = 1``; ``q = 1``, finite :math:`f(0)`):
    :math:`\beta\,[\Omega^*(z) + \Omega(y)] + \max\theta - \langle\theta, y\rangle`, summed in float64 and rounded once
    (``Ω*`` is stationary in ``τ``, so the value is as accurate as float64 allows, with no ``[R, k]`` temporary for
    class indices); ``≥ 0``, as :meth:`FenchelYoungRowLoss.values` clamps it."""
    f64 = torch.float64
    # Ω(y) of distributions in the values' dtype (a float64 copy of [R, k] targets would cost more than the loss)
    ody = f64 if target.dense is None or target.smoothing > 0 else dtype
    vals = omega_star + omega_y(div, target, None, f0, ody).to(f64)
    if beta != 1.0:
        m = theta.amax(-1).to(f64)  # the shift of z (a row with no finite maximum is not shifted)
        vals = beta * vals + torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return (vals - theta_y(theta, target, f64)).to(dtype).clamp_min(0.0)


def _infinite_f0_index_loss(theta: Tensor, target: Target, dtype: torch.dtype, bad_rows: Optional[Tensor]) -> Tensor:
    r"""The loss values ``[R]`` of class indices for a generator with :math:`f(0) = +\infty` (reverse KL, Jeffrey,
    reverse χ², ``q = 1``), in closed form: :math:`\Omega(e_c) = f(1) + (n - 1) f(0)` over the row's ``n`` unmasked
    classes is :math:`+\infty` unless ``n = 1``, where ``p = e_c`` and the loss is 0 (``+∞`` if ``c`` is the masked
    one: :math:`\langle\theta, y\rangle = -\infty`); 0 in rows not kept, NaN in rows with NaN or ``+∞``.  No
    ``[R, k]`` temporary and no host synchronization: ``n <= 1`` where the row's second largest score is ``-∞``
    (:func:`torch.topk` of two per row)."""
    assert target.index is not None  # class indices (the caller checked that the target is not dense)
    if theta.shape[1] > 1:
        one = theta.topk(2, -1).values[:, 1] == -math.inf
    else:
        one = torch.ones(theta.shape[0], dtype=torch.bool, device=theta.device)
    hit = theta.gather(1, target.index.unsqueeze(1)).squeeze(1) > -math.inf
    loss = torch.where(one & hit, 0.0, math.inf).to(dtype)
    loss = torch.where(target.keep, loss, torch.zeros_like(loss))
    if bad_rows is not None:
        loss = loss.masked_fill(bad_rows.reshape(-1), math.nan)
    return loss


def _omega_difference(div: Divergence, theta: Tensor, y: Tensor, p: Tensor, q: Optional[Tensor]) -> Tensor:
    """``Σ_j q_j [f(y_j/q_j) - f(p_j/q_j)]`` over the unmasked classes, for generators with ``f(0) = ∞``."""
    qd = torch.ones_like(p) if q is None else q
    terms = qd * (div.f(y / qd) - div.f(p / qd))
    return torch.where(theta > -math.inf, terms, torch.zeros_like(terms)).sum(-1)


def _p_terms(div: Divergence, theta: Tensor, p: Tensor, q: Optional[Tensor], f0: Union[float, Tensor],
             dtype: torch.dtype, sparse: bool) -> tuple[Tensor, Tensor]:
    """``(⟨θ, p⟩, Σ_j q_j [f(p_j/q_j) - f(0)])`` per row in ``dtype``, over the nonzero entries of ``p``
    alone when they are few (``sparse``)."""
    R = p.shape[0]
    pos = p > 0
    if sparse and 4 * int(pos.sum()) < p.numel():
        r_idx, c_idx = pos.nonzero(as_tuple=True)
        pv, thv = p[r_idx, c_idx].to(dtype), theta[r_idx, c_idx].to(dtype)
        if q is None:
            fv = div.f(pv) - f0
        else:
            qv = q[r_idx, c_idx].to(dtype)
            fv = qv * (div.f(pv / qv) - f0)
        zero = torch.zeros(R, dtype=dtype, device=p.device)
        return zero.index_add(0, r_idx, thv * pv), zero.index_add(0, r_idx, fv)
    pd = p.to(dtype)
    theta_p = torch.where(pos, theta.to(dtype) * pd, torch.zeros_like(pd)).sum(-1)
    return theta_p, sum_f_minus_f0(div, pd, None if q is None else q.to(dtype), f0)


class AlphaReLURowLoss(RowLoss):
    """The α-ReLU loss, ``τ`` in the entmax parametrization (α > 1 a float, ``τ`` a finite number or a
    one-element tensor).

    With ``t = [(α-1)θ - τ]_+`` and ``p = t^{1/(α-1)}``: ``p^α = p t`` and, on the support,
    ``θ - τ/(α-1) = t/(α-1)``, so ``⟨p, θ - τ/(α-1)⟩ = Σ p t / (α-1)`` and ``Σ p^α = Σ p t``
    (masked scores have ``t = 0`` and never meet ``-inf · 0``): one product ``p·t`` per row.
    """

    name = "alpha_relu"
    sparse_gradient = True

    def __init__(self, alpha: object = 1.5, tau: object = 0.0) -> None:
        alpha = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
        if isinstance(alpha, Tensor):
            raise TypeError("alpha_relu_loss: alpha must be a float > 1")
        tau = check_tau(tau)
        if isinstance(tau, Tensor) and tau.numel() != 1:
            raise ValueError(f"tau: the alpha_relu loss takes a number or a one-element tensor, got shape "
                             f"{tuple(tau.shape)}")
        self.alpha, self.tau = alpha, tau

    def __repr__(self) -> str:
        tau = float(self.tau) if isinstance(self.tau, Tensor) else self.tau
        return f"alpha_relu(alpha={float(self.alpha)!r}, tau={tau!r})"

    def values(self, theta: Tensor, target: Target) -> tuple[Tensor, Tensor, None]:
        loss, p = self._terms(theta, target)
        return loss, p, None

    def solves_in_dtype(self, rows: Tensor, prediction: bool = False) -> bool:
        """Half-precision rows stay in their dtype where the GPU kernel :meth:`fused_rows` takes them: no
        prediction kept, a number τ and ``1 < α <= 2``."""
        return (not prediction and not isinstance(self.tau, Tensor) and 0.0 < self.alpha - 1.0 <= 1.0
                and kernel_device(rows))

    def fused_rows(self, theta: Tensor, target: Target, inplace: bool, scale: Optional[Tensor],
                   overwrite: bool, tiles: Optional[TileFlags] = None) -> Optional[tuple[Tensor, Tensor, Tensor]]:
        """The rows by one GPU kernel (:func:`softargmax.backends.alpha_relu_loss_gradient`), ``p`` never
        stored: ``G = (p - y) · scale`` over ``θ`` with ``overwrite`` (else a new tensor) and the value
        from its float32 row sums, as :meth:`_terms` forms it; only where the caller keeps no prediction
        (``inplace``) and τ is a number.  The kernel marks ``tiles`` (:meth:`RowLoss.rows`)."""
        if not inplace or isinstance(self.tau, Tensor) or target.owned is not None:
            return None
        out = alpha_relu_loss_gradient(theta, target.index, target.dense, target.keep, float(self.alpha),
                                       float(self.tau), scale, out=theta if overwrite else None, tiles=tiles)
        if out is None:
            return None
        G, spt, zy, ya = out
        alpha, a = float(self.alpha), float(self.alpha) - 1.0
        loss = spt / a - zy + ((1.0 if ya is None else ya) - spt) / (alpha * a)
        return kept_rows(loss, target), G, G

    def split_values(self, theta: Tensor, target: Target, solve: SplitSolve) -> SplitValues:
        partial, p = self._terms(theta, target)  # a fixed τ: nothing to solve, every term is a class's
        return partial, p, None, None

    def _terms(self, theta: Tensor, target: Target) -> tuple[Tensor, Tensor]:
        alpha, tau = self.alpha, float(self.tau)
        a = alpha - 1.0
        theta = theta.to(compute_dtype(theta.dtype))  # (half rows that no kernel took: in float32)
        t = torch.mul(theta, a).sub_(tau).clamp_(min=0)
        p = t * t if a == 0.5 else (t.clone() if a == 1.0 else t.pow(1.0 / a))
        spt = (p * t).sum(-1)
        c = tau / a
        if target.dense is None:
            own = 1.0 if target.owned is None else target.owned.to(theta.dtype)
            lin = spt / a - own * (theta_y(theta, target) - c)
            ya = own
        else:
            y = target.dense
            lin = spt / a - torch.where(y > 0, y * (theta - c), torch.zeros_like(y)).sum(-1)
            ya = y.pow(alpha).sum(-1)
        return lin + (ya - spt) / (alpha * a), p

    def operator_spec(self) -> Optional[tuple[str, float, float]]:
        return None if isinstance(self.tau, Tensor) else ("alpha_relu", float(self.alpha), float(self.tau))


def resolve_loss(mapping: Union[str, Divergence], params: dict[str, Any],
                 row_param: Optional[Callable[[Tensor, str], Tensor]] = None) -> RowLoss:
    """The :class:`~softargmax.losses._rows.RowLoss` of a mapping name (or a
    :class:`~softargmax.divergences.Divergence`) and its parameters (``alpha``, ``tau``), validated.

    ``row_param``: with it, ``"entmax"``/``"alpha"`` also take a per-row tensor ``alpha``
    (:meth:`~softargmax._utils.rows.Rows.row_param` makes it ``[R, 1]``; the vocabulary-parallel
    losses); without, a tensor ``alpha`` is a ``TypeError`` (the losses do not learn α).
    """
    params = dict(params)
    if mapping == "alpha_relu":
        alpha, tau = params.pop("alpha", 1.5), params.pop("tau", 0.0)
        loss = AlphaReLURowLoss(alpha, tau)
        if params:
            raise ValueError(f"alpha_relu_loss: unexpected parameters {sorted(params)}")
        return loss
    alpha = params.get("alpha")
    if row_param is not None and mapping in ("entmax", "alpha") and isinstance(alpha, Tensor):
        if set(params) - {"alpha"}:
            raise ValueError(f"mapping={mapping!r}: unexpected parameters {sorted(set(params) - {'alpha'})}")
        check_alpha(alpha, "alpha", minimum=1.0 if mapping == "entmax" else 0.0, strict=mapping != "entmax")
        return FenchelYoungRowLoss(AlphaDivergence(row_param(alpha.detach(), "alpha")))
    return FenchelYoungRowLoss(_divergence(mapping, params))


def _divergence(mapping: Union[str, Divergence], params: dict[str, Any]) -> Divergence:
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
    return resolve(mapping, alpha)
