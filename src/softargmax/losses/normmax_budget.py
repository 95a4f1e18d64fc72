r"""Fenchel–Young losses of normmax and budget sparsemax.

Both are regularized argmax maps :math:`p = \operatorname*{argmax}_{p \in D} \langle p, \theta\rangle - \Omega(p)`, so their
Fenchel–Young loss (Blondel, Martins & Niculae, *Learning with Fenchel-Young Losses*,
JMLR 2020, https://arxiv.org/abs/1901.02324) is

.. math::

    \ell(\theta, y) = \langle \theta, p - y\rangle + \Omega(y) - \Omega(p) \ge 0, \qquad \nabla_\theta \ell = p - y,

zero exactly when :math:`p = y`; the backward is :math:`p - y` from the forward's prediction.

* **normmax** (:func:`softargmax.normmax`): :math:`D` the simplex, :math:`\Omega(p) = \lVert p\rVert_\alpha`, so
  :math:`\ell = \langle \theta, p - y\rangle + \lVert y\rVert_\alpha - \lVert p\rVert_\alpha` (:math:`\Omega(e_c) = 1` for a class index).  This is the
  normmax loss of Santos, Niculae, McNamee & Martins, *Sparse and Structured Hopfield
  Networks*, ICML 2024 (https://arxiv.org/abs/2402.13725).
* **budget sparsemax** (:func:`softargmax.budget_sparsemax`): :math:`D` the capped simplex
  :math:`\{p \in \Delta : p \le 1/B\}`, :math:`\Omega(p) = \tfrac12\lVert p\rVert^2` there and :math:`+\infty` outside.  A target outside the
  capped simplex therefore has loss ``+∞``: with ``B > 1`` a class index (one-hot) always
  is, so use label sets (``multilabel=True`` with at least ``B`` active labels: the uniform
  distribution over them) or soft labels with every entry ``<= 1/B``.  The gradient
  :math:`p - y` stays finite and usable either way.  ``B <= 1`` is the sparsemax loss.

Targets, ``ignore_index``, ``reduction``, ``label_smoothing`` and ``weight`` follow
:func:`softargmax.losses.fenchel_young_loss` (and ``torch.nn.functional.cross_entropy``);
masked scores (``-inf``) are excluded classes and a target with mass on one gives ``+∞``.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_alpha, check_dim, check_tensor
from .._utils.rows import Rows, shift_by_row_max
from ..operators.budget import check_budget, solve_budget
from ..operators.normmax import argmax_rows, normmax_rows
from ._fenchel_young import row_loss
from ._options import LossOptions, LossOutput
from ._row_losses import dot_positive, theta_y
from ._rows import RowLoss
from ._targets import Target, check_reduction

__all__ = ["normmax_loss", "budget_sparsemax_loss"]


def _alpha_norm(p: Tensor, alpha: Union[float, Tensor]) -> Tensor:
    """``‖p‖_α`` per row (``[R]``) for ``p >= 0``, ``alpha`` a float or ``[R, 1]``."""
    if isinstance(alpha, float):
        return torch.linalg.vector_norm(p, ord=alpha, dim=-1)
    pos = p > 0
    logp = torch.log(torch.where(pos, p, torch.ones_like(p)))
    pa = torch.where(pos, torch.exp(alpha * logp), torch.zeros_like(p))
    return pa.sum(-1) ** (1.0 / alpha.squeeze(-1))


def _shifted(theta: Tensor, target: Target) -> Tensor:
    r"""``θ`` less its finite row maximum, where the whole target is in these rows (not a split over processes):
    :math:`\langle \theta, p - y\rangle` is unchanged since :math:`\sum p = \sum y = 1`, and the value no longer
    subtracts two large sums (a float32 row offset by 1e4 lost 1e-3 of the normmax loss and gave a budget
    sparsemax loss off by 10).  The mappings are invariant to the shift."""
    return theta if target.owned is not None else shift_by_row_max(theta)


class NormmaxRowLoss(RowLoss):
    """The normmax loss of α ``>= 1`` (a float, or a tensor broadcastable to the scores with size 1
    along the class dimension, ``[R, 1]`` once bound to the rows); rows with α = 1 take the argmax."""

    name = "normmax"
    sparse_gradient = True

    def __init__(self, alpha: Union[float, Tensor]) -> None:
        self.alpha = alpha

    def bind(self, q: Optional[Tensor], temperature: float, like: Tensor, rows: Rows) -> NormmaxRowLoss:
        super().bind(q, temperature, like, rows)
        alpha = self.alpha
        return NormmaxRowLoss(rows.row_param(alpha.detach(), "alpha") if isinstance(alpha, Tensor) else alpha)

    def values(self, theta: Tensor, target: Target) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        alpha = self.alpha
        theta = _shifted(theta, target)
        if isinstance(alpha, float) and alpha == 1.0:
            return _argmax_values(theta, target)
        if isinstance(alpha, Tensor) and bool((alpha == 1).any()):
            one = alpha == 1  # [R, 1]
            l1, p1, bad1 = _argmax_values(theta, target)
            loss, p, bad = _normmax_values(theta, target, torch.where(one, torch.full_like(alpha, 2.0), alpha))
            bad = bad1 if bad is None else bad | bad1  # both are the rows with NaN or +inf scores
            return torch.where(one.squeeze(1), l1, loss), torch.where(one, p1, p), bad
        return _normmax_values(theta, target, alpha)


def _argmax_values(theta: Tensor, target: Target) -> tuple[Tensor, Tensor, Tensor]:
    """α = 1: ``p`` the argmax (uniform over ties), ``‖·‖_1 = Σ``, so the loss is
    ``max θ - ⟨θ, y⟩`` for a distribution ``y`` (the multiclass perceptron loss)."""
    p, bad = argmax_rows(theta)
    m = theta.amax(-1)
    live = m > -math.inf  # ⟨θ, p⟩ = max θ and ‖p‖_1 = 1 exactly (0 and 0 for an all-masked row)
    omega_y = torch.ones_like(m) if target.dense is None else target.dense.sum(-1)
    loss = torch.where(live, m, torch.zeros_like(m)) - theta_y(theta, target) + omega_y - live.to(m.dtype)
    return loss, p, bad


def _normmax_values(theta: Tensor, target: Target,
                    alpha: Union[float, Tensor]) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    pc, _, sol = normmax_rows(theta, alpha)
    theta_p = dot_positive(sol.gather(theta), pc)
    omega_p = _alpha_norm(pc, alpha)
    if target.dense is None:
        omega_y = torch.ones_like(theta_p)
    else:
        omega_y = _alpha_norm(target.dense, alpha)
    loss = theta_p - theta_y(theta, target) + omega_y - omega_p
    p = sol.scatter(pc)  # (sol.dense_p() is the auxiliary α'-entmax output)
    if sol.bad_rows is not None:
        p = p.masked_fill(sol.bad_rows, math.nan)
    return loss, p, sol.bad_rows


class BudgetRowLoss(RowLoss):
    """The budget sparsemax loss of a budget ``B > 0`` (a float or a tensor broadcastable to the
    scores with size 1 along the class dimension), ``+∞`` for a target above the cap ``1/B``."""

    name = "budget_sparsemax"
    sparse_gradient = True

    def __init__(self, budget: Union[float, Tensor]) -> None:
        self.budget = budget

    def bind(self, q: Optional[Tensor], temperature: float, like: Tensor, rows: Rows) -> BudgetRowLoss:
        super().bind(q, temperature, like, rows)
        if isinstance(self.budget, Tensor):
            return BudgetRowLoss(rows.row_param(self.budget.detach(), "budget"))
        return BudgetRowLoss(torch.full((rows.R, 1), self.budget, dtype=rows.dtype, device=like.device))

    def values(self, theta: Tensor, target: Target) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        budget2d = self.budget
        assert isinstance(budget2d, Tensor)  # bound: [R, 1]
        theta = _shifted(theta, target)
        sol = solve_budget(theta, budget2d)
        pc = sol.p
        theta_p = dot_positive(sol.gather(theta), pc)
        omega_p = 0.5 * (pc * pc).sum(-1)
        cap = 1.0 / budget2d
        slack = 16 * torch.finfo(theta.dtype).eps
        if target.dense is None:
            omega_y = torch.where(cap.squeeze(1) >= 1 - slack, 0.5, math.inf).to(theta.dtype)
        else:
            y = target.dense
            inside = (y <= cap * (1 + slack)).all(-1)
            omega_y = torch.where(inside, 0.5 * (y * y).sum(-1), torch.full_like(theta_p, math.inf))
        loss = theta_p - theta_y(theta, target) + omega_y - omega_p
        return loss, sol.dense_p(), sol.bad_rows


def normmax_loss(
    x: Tensor,
    target: Tensor,
    alpha: Union[float, Tensor] = 2.0,
    *,
    dim: int = -1,
    multilabel: bool = False,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    return_prediction: bool = False,
) -> LossOutput:
    r"""The normmax loss: the Fenchel–Young loss of α-normmax, :math:`\alpha \ge 1`.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \lVert y\rVert_\alpha - \lVert p\rVert_\alpha,
        \qquad p = \operatorname{normmax}_\alpha(\theta), \qquad \nabla_\theta \ell = p - y

    (the module docstring).  α = 1 is the limit: :math:`p` the argmax, uniform over ties, and the loss
    :math:`\max_j \theta_j - \langle \theta, y\rangle` (the multiclass perceptron loss; gradient
    :math:`p - y`), as the ``entmax`` package's ``normmax_bisect_loss`` with ``alpha=1``.

    Args:
        x: scores :math:`\theta`, the classes along ``dim``.
        target: class indices, probability vectors, or (``multilabel=True``) 0/1 label sets.
        alpha: a float ``>= 1`` or a tensor broadcastable to ``x`` with size 1 along ``dim`` (a
            constant). Default: ``2.0``.
        dim, multilabel, ignore_index, reduction, label_smoothing: as in
            :func:`~softargmax.losses.fenchel_young_loss` (defaults ``-1``, ``False``, ``-100``,
            ``"mean"``, ``0.0``).
        weight, return_prediction: as in :func:`~softargmax.losses.fenchel_young_loss` (defaults
            ``None``, ``False``).

    Returns:
        the loss (a scalar, or ``x``'s shape without ``dim`` for ``reduction="none"``), and the
        prediction (detached, ``x``'s shape) if ``return_prediction``.

    Shape:
        - x: :math:`(*, k, *)`, the :math:`k` classes along ``dim`` (for example :math:`(N, k)`).
        - target: class indices of ``x``'s shape without ``dim``, or probabilities or label sets
          of ``x``'s shape.
        - Output: :math:`()` for ``"mean"`` and ``"sum"``; ``x``'s shape without ``dim`` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 9.0]])
        >>> sa.normmax_loss(x, torch.tensor([0, 2]), reduction="none")
        tensor([0.2000, 0.0000])
        >>> sa.normmax_loss(x, torch.tensor([0, 2]), alpha=1.0, reduction="none")  # the perceptron loss
        tensor([0., 0.])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324
    """
    options = LossOptions(dim=dim, multilabel=multilabel, ignore_index=ignore_index, reduction=reduction,
                          label_smoothing=label_smoothing, weight=weight, return_prediction=return_prediction)
    check_tensor(x)
    dim = check_dim(x, dim)
    check_reduction(reduction)
    return row_loss(x, target, dim, NormmaxRowLoss(check_alpha(alpha, "alpha", minimum=1.0)), options, "normmax_loss")


def budget_sparsemax_loss(
    x: Tensor,
    target: Tensor,
    budget: Union[float, Tensor] = 2.0,
    *,
    dim: int = -1,
    multilabel: bool = False,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    return_prediction: bool = False,
) -> LossOutput:
    r"""The budget sparsemax loss: the Fenchel–Young loss of sparsemax on the simplex capped at :math:`1/B`.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \tfrac12\lVert y\rVert^2 - \tfrac12\lVert p\rVert^2,
        \qquad p = \operatorname{budget\_sparsemax}(\theta), \qquad \nabla_\theta \ell = p - y,

    and :math:`+\infty` for a target :math:`y` above the cap :math:`1/B` (the gradient stays finite).
    With :math:`B > 1` the finite-valued targets are label sets (``multilabel=True``, at least
    :math:`B` labels) and soft labels within the cap; :math:`B \le 1` is the sparsemax loss.

    Args:
        x: scores :math:`\theta`, the classes along ``dim``.
        target: class indices, probability vectors, or (``multilabel=True``) 0/1 label sets.
        budget: :math:`B > 0`, a float or a tensor broadcastable to ``x`` with size 1 along ``dim``.
            Default: ``2.0``.
        dim, multilabel, ignore_index, reduction, label_smoothing: as in
            :func:`~softargmax.losses.fenchel_young_loss` (defaults ``-1``, ``False``, ``-100``,
            ``"mean"``, ``0.0``).
        weight, return_prediction: as in :func:`~softargmax.losses.fenchel_young_loss` (defaults
            ``None``, ``False``).

    Returns:
        the loss (a scalar, or ``x``'s shape without ``dim`` for ``reduction="none"``), and the
        prediction (detached, ``x``'s shape) if ``return_prediction``.

    Shape:
        - x: :math:`(*, k, *)`, the :math:`k` classes along ``dim`` (for example :math:`(N, k)`).
        - target: class indices of ``x``'s shape without ``dim``, or probabilities or label sets
          of ``x``'s shape.
        - Output: :math:`()` for ``"mean"`` and ``"sum"``; ``x``'s shape without ``dim`` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([[3.0, 1.0, 0.8, -1.0]])
        >>> sa.budget_sparsemax_loss(x, torch.tensor([[1.0, 1.0, 0.0, 0.0]]), multilabel=True)
        tensor(0.0225)
        >>> sa.budget_sparsemax_loss(x, torch.tensor([0]))  # a one-hot target is above the cap 1/2
        tensor(inf)

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324
    """
    options = LossOptions(dim=dim, multilabel=multilabel, ignore_index=ignore_index, reduction=reduction,
                          label_smoothing=label_smoothing, weight=weight, return_prediction=return_prediction)
    check_tensor(x)
    dim = check_dim(x, dim)
    check_reduction(reduction)
    return row_loss(x, target, dim, BudgetRowLoss(check_budget(budget)), options, "budget_sparsemax_loss")
