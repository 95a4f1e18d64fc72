r"""The losses as ``torch.nn`` modules: :class:`FenchelYoungLoss` and the named :class:`SparsemaxLoss`,
:class:`Entmax15Loss`, :class:`EntmaxLoss`, :class:`AlphaReLULoss`, :class:`FDivergenceLoss` (options of
:func:`softargmax.losses.fenchel_young_loss`), :class:`NormmaxLoss` and :class:`BudgetSparsemaxLoss`."""

from __future__ import annotations

from typing import Any, Union

from torch import Tensor, nn

from .._utils.checks import check_alpha
from ..divergences import Divergence
from ..losses._options import LossOutput
from ..losses._row_losses import resolve_loss
from ..losses.functional import fenchel_young_loss
from ..losses.normmax_budget import budget_sparsemax_loss, normmax_loss
from ..operators.budget import check_budget
from ..operators.mappings import check_mapping

__all__ = ["FenchelYoungLoss", "SparsemaxLoss", "Entmax15Loss", "EntmaxLoss", "AlphaReLULoss", "FDivergenceLoss",
           "NormmaxLoss", "BudgetSparsemaxLoss"]


class FenchelYoungLoss(nn.Module):
    r"""The Fenchel–Young loss of a mapping, as a module: the sparse analogue of ``nn.CrossEntropyLoss``.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \Omega(y) - \Omega(p) \ge 0,
        \qquad p = \operatorname{mapping}(\theta), \qquad \nabla_\theta \ell = p - y,

    :func:`softargmax.losses.fenchel_young_loss` with the mapping and options given here.

    Args:
        mapping: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha=``),
            ``"alpha_relu"`` (with ``alpha=``, ``tau=``), any divergence name, or a
            :class:`~softargmax.divergences.Divergence`. Default: ``"entmax15"``.
        **options: the keyword options of :func:`softargmax.losses.fenchel_young_loss`, stored, and
            the mapping's parameters (``alpha=``, ``tau=``, a divergence's): ``dim``, ``q``,
            ``temperature``, ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``,
            ``weight``, ``return_prediction``, ``softcap``, ``process_group`` (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> criterion = sa.nn.FenchelYoungLoss("entmax", alpha=1.3, ignore_index=-100, label_smoothing=0.1)
        >>> criterion
        FenchelYoungLoss(mapping='entmax', alpha=1.3, ignore_index=-100, label_smoothing=0.1)
        >>> x = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]], requires_grad=True)
        >>> loss = criterion(x, torch.tensor([0, -100]))  # the second item is ignored
        >>> loss.backward()
        >>> x.grad[1]
        tensor([0., 0., 0.])

    References:
        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324
    """

    def __init__(self, mapping: Union[str, Divergence] = "entmax15", **options: Any) -> None:
        super().__init__()
        resolve_loss(mapping, {k: v for k, v in options.items() if k in ("alpha", "tau")})  # validate early
        self.mapping = mapping
        self.options = options

    def forward(self, x: Tensor, target: Tensor) -> LossOutput:
        return fenchel_young_loss(x, target, self.mapping, **self.options)

    def extra_repr(self) -> str:
        return ", ".join([f"mapping={self.mapping!r}"] + [f"{k}={v!r}" for k, v in self.options.items()])


class SparsemaxLoss(FenchelYoungLoss):
    r"""The sparsemax loss, as a module.

    .. math::

        \ell(x, y) = \langle x, p - y\rangle + \tfrac12 \lVert y\rVert^2 - \tfrac12 \lVert p\rVert^2,
        \qquad p = \operatorname{sparsemax}(x),

    :func:`softargmax.sparsemax_loss` with the options given here.

    Args:
        **options: the keyword options of :func:`softargmax.losses.fenchel_young_loss`, stored:
            ``dim``, ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``, ``weight``,
            ``return_prediction``, ``softcap``, ``process_group`` (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> criterion = sa.nn.SparsemaxLoss(reduction="none")
        >>> criterion(torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]]), torch.tensor([0, 2]))
        tensor([0.1600, 0.0000])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
    """

    def __init__(self, **options: Any) -> None:
        super().__init__("sparsemax", **options)


class Entmax15Loss(FenchelYoungLoss):
    r"""The 1.5-entmax loss, as a module.

    .. math::

        \ell(x, y) = \langle x, p - y\rangle + H^T_{1.5}(p) - H^T_{1.5}(y), \qquad p = \operatorname{entmax}_{1.5}(x),

    :func:`softargmax.entmax15_loss` with the options given here.

    Args:
        **options: the keyword options of :func:`softargmax.losses.fenchel_young_loss`, stored:
            ``dim``, ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``, ``weight``,
            ``return_prediction``, ``softcap``, ``process_group`` (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> criterion = sa.nn.Entmax15Loss(reduction="none")
        >>> criterion(torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]]), torch.tensor([0, 2]))
        tensor([0.2976, 0.0000])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702
    """

    def __init__(self, **options: Any) -> None:
        super().__init__("entmax15", **options)


class EntmaxLoss(FenchelYoungLoss):
    r"""The α-entmax loss (a float α > 0), as a module.

    .. math::

        \ell(x, y) = \langle x, p - y\rangle + H^T_\alpha(p) - H^T_\alpha(y), \qquad p = \operatorname{entmax}_\alpha(x),

    :func:`softargmax.entmax_loss` with the options given here; α = 1 is ``nn.CrossEntropyLoss``.

    Args:
        alpha: a float > 0. Default: ``1.5``.
        **options: the keyword options of :func:`softargmax.losses.fenchel_young_loss`, stored:
            ``dim``, ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``, ``weight``,
            ``return_prediction``, ``softcap``, ``process_group`` (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> x, y = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]]), torch.tensor([0, 2])
        >>> sa.nn.EntmaxLoss(alpha=2.0, reduction="none")(x, y)
        tensor([0.1600, 0.0000])
        >>> torch.allclose(sa.nn.EntmaxLoss(alpha=1.0)(x, y), torch.nn.CrossEntropyLoss()(x, y))
        True

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702
    """

    def __init__(self, alpha: float = 1.5, **options: Any) -> None:
        super().__init__("entmax", alpha=alpha, **options)


class AlphaReLULoss(FenchelYoungLoss):
    r"""The α-ReLU loss, as a module.

    .. math::

        \ell(x, y) = \Big\langle p - y,\ x - \frac{\tau}{\alpha - 1}\Big\rangle
        + \frac{\sum_j y_j^\alpha - \sum_j p_j^\alpha}{\alpha(\alpha - 1)}, \qquad p = \operatorname{alpha\_relu}(x),

    :func:`softargmax.alpha_relu_loss` with the options given here; its gradient is :math:`p - y`.

    Args:
        alpha: a float > 1. Default: ``1.5``.
        tau: the threshold, entmax parametrization. Default: ``0.0``.
        **options: the keyword options of :func:`softargmax.losses.fenchel_young_loss`, stored:
            ``dim``, ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``, ``weight``,
            ``return_prediction``, ``softcap``, ``process_group`` (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> criterion = sa.nn.AlphaReLULoss(alpha=1.5, tau=-0.25)
        >>> x = torch.tensor([[1.0, 0.5, -1.0]], requires_grad=True)
        >>> criterion(x, torch.tensor([0])).backward()
        >>> x.grad
        tensor([[-0.4375,  0.2500,  0.0000]])

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding
        Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """

    def __init__(self, alpha: float = 1.5, tau: float = 0.0, **options: Any) -> None:
        super().__init__("alpha_relu", alpha=alpha, tau=tau, **options)


class FDivergenceLoss(FenchelYoungLoss):
    r"""The loss generated by an f-divergence, as a module, with ``q`` and ``temperature`` among the options.

    .. math::

        \ell(x, y) = \operatorname{f\_softmax}(x) + \beta \sum_j q_j f(y_j / q_j) - \langle x, y\rangle,

    :func:`softargmax.f_divergence_loss` with the options given here; its gradient is
    :math:`\operatorname{f\_softargmax}(x) - y`.

    Args:
        divergence: a name or a :class:`~softargmax.divergences.Divergence`. Default: ``"kl"``.
        **options: ``q``, ``temperature``, the divergence's parameters (``alpha=``), and the keyword
            options of :func:`softargmax.losses.fenchel_young_loss`, stored (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> x, y = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]]), torch.tensor([0, 2])
        >>> torch.allclose(sa.nn.FDivergenceLoss("kl")(x, y), torch.nn.CrossEntropyLoss()(x, y))
        True
        >>> sa.nn.FDivergenceLoss("alpha", alpha=2.0, reduction="none")(x, y)  # the sparsemax loss
        tensor([0.1600, 0.0000])

    References:
        Vincent Roulet, Tianlin Liu, Nino Vieillard, Michael E. Sander and Mathieu Blondel, *Loss
        Functions and Operators Generated by f-Divergences*, 2025, https://arxiv.org/abs/2501.18537
    """

    def __init__(self, divergence: Union[str, Divergence] = "kl", **options: Any) -> None:
        check_mapping(divergence, "divergence")
        super().__init__(divergence, **options)


class NormmaxLoss(nn.Module):
    r"""The normmax loss (:math:`\alpha \ge 1`), as a module.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \lVert y\rVert_\alpha - \lVert p\rVert_\alpha,
        \qquad p = \operatorname{normmax}_\alpha(\theta),

    :func:`softargmax.normmax_loss` with the options given here.

    Args:
        alpha: a float ``>= 1`` or a tensor broadcastable to the input with size 1 along ``dim``.
            Default: ``2.0``.
        **options: the keyword options of :func:`softargmax.normmax_loss`, stored: ``dim``,
            ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``, ``weight``,
            ``return_prediction`` (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> sa.nn.NormmaxLoss(reduction="none")(torch.tensor([[1.0, 0.8, -1.0]]), torch.tensor([0]))
        tensor([0.2000])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """

    def __init__(self, alpha: Union[float, Tensor] = 2.0, **options: Any) -> None:
        super().__init__()
        self.alpha = check_alpha(alpha, "alpha", minimum=1.0)
        self.options = options

    def forward(self, x: Tensor, target: Tensor) -> LossOutput:
        return normmax_loss(x, target, self.alpha, **self.options)


class BudgetSparsemaxLoss(nn.Module):
    r"""The budget sparsemax loss, as a module: the sparsemax loss on the simplex capped at :math:`1/B`.

    .. math::

        \ell(\theta, y) = \langle \theta, p - y\rangle + \tfrac12\lVert y\rVert^2 - \tfrac12\lVert p\rVert^2,
        \qquad p = \operatorname{budget\_sparsemax}(\theta),

    and :math:`+\infty` for a target above the cap; :func:`softargmax.budget_sparsemax_loss` with the
    options given here.

    Args:
        budget: :math:`B > 0`, a float or a tensor broadcastable to the input with size 1 along ``dim``.
            Default: ``2.0``.
        **options: the keyword options of :func:`softargmax.budget_sparsemax_loss`, stored: ``dim``,
            ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``, ``weight``,
            ``return_prediction`` (their defaults there).

    Shape:
        - Input: :math:`(N, k)` or :math:`(*, k, *)`, the :math:`k` classes along the ``dim`` option
          (default ``-1``).
        - Target: class indices :math:`(N)` (the input's shape without the class dimension), or
          probabilities or label sets of the input's shape.
        - Output: :math:`()` for ``reduction="mean"`` (default) and ``"sum"``; :math:`(N)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> criterion = sa.nn.BudgetSparsemaxLoss(budget=2.0, multilabel=True)
        >>> criterion(torch.tensor([[3.0, 1.0, 0.8, -1.0]]), torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
        tensor(0.0225)

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """

    def __init__(self, budget: Union[float, Tensor] = 2.0, **options: Any) -> None:
        super().__init__()
        self.budget = check_budget(budget)
        self.options = options

    def forward(self, x: Tensor, target: Tensor) -> LossOutput:
        return budget_sparsemax_loss(x, target, self.budget, **self.options)
