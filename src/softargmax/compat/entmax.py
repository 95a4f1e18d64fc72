r"""The public API of the ``entmax`` package, on softargmax's solvers.

Switch with one changed import::

    import entmax                                 ->  import softargmax.compat.entmax as entmax
    from entmax import entmax15, EntmaxBisectLoss ->  from softargmax.compat.entmax import entmax15, EntmaxBisectLoss

Same names, signatures and defaults as deep-spin/entmax (1.3, plus ``return_support_size``
of its 1.4 development branch):

* functions :func:`sparsemax`, :func:`entmax15`, :func:`sparsemax_bisect`,
  :func:`entmax_bisect`, :func:`normmax_bisect`, :func:`budget_bisect`;
* per-sample losses :func:`sparsemax_loss`, :func:`entmax15_loss`,
  :func:`sparsemax_bisect_loss`, :func:`entmax_bisect_loss`, :func:`normmax_bisect_loss`;
* modules :class:`Sparsemax`, :class:`Entmax15`, :class:`SparsemaxBisect`,
  :class:`EntmaxBisect`, :class:`NormmaxBisect`, :class:`BudgetBisect`;
* loss modules :class:`SparsemaxLoss`, :class:`Entmax15Loss`, :class:`SparsemaxBisectLoss`,
  :class:`EntmaxBisectLoss`, :class:`NormmaxBisectLoss` (``ignore_index`` and
  ``reduction="elementwise_mean" | "sum" | "none"`` as in the package: the mean divides by
  the number of targets not equal to a non-negative ``ignore_index``).

What differs, on purpose:

* **Exact thresholds.**  Sparsemax and 1.5-entmax are exact (as the package's sorting
  versions); α-entmax, normmax and budget use a pruned, safeguarded Newton solver that
  converges to rounding error instead of 50 bisection steps.  Arguments that only tune the
  package's algorithms (``k``, ``n_iter``, ``ensure_sum_one``) are accepted and ignored;
  the output always sums to one (to ``budget`` for :func:`budget_bisect`).
* **Masking.**  ``-inf`` scores get probability 0 and gradient 0; a row that is entirely
  ``-inf`` gives zeros (the package returns NaN or fails).
* **float16/bfloat16** are computed in float32 and returned in the input dtype (the
  package's bisection and sorting overflow to NaN there).
* **Any α > 0** for :func:`entmax_bisect` (α = 1 is softmax, where the package divides by
  zero; α < 1 is dense), float or per-row tensor, differentiable in α.  A learnable α
  passed here is used as it is; to keep it in a range, use
  :class:`softargmax.nn.Entmax` with ``learn_alpha=True, alpha_min=..., alpha_max=...``.
* Results are deterministic and monotone in the scores for every α.
* The losses accept any input shape with the classes on the last dimension (the package:
  2-D only) and ignore targets equal to ``ignore_index`` even when it is negative (the
  package fails on them), counting them as the package does for ``"elementwise_mean"``.
* :func:`normmax_bisect` with ``alpha=1`` (the argmax, uniform over ties, as the package
  gives it) has a zero gradient where the package's is ``inf``/NaN.
* :func:`normmax_bisect` and :func:`budget_bisect` are not differentiated with respect to
  ``alpha`` / ``budget`` (neither are the package's).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union, overload

import torch
from torch import Tensor, nn

from .._utils.checks import check_broadcastable, check_tensor
from ..losses import functional as _losses
from ..losses.normmax_budget import normmax_loss as _normmax_loss
from ..operators.budget import budget_sparsemax
from ..operators.entmax import entmax as _entmax
from ..operators.entmax import entmax15 as _entmax15
from ..operators.entmax import sparsemax as _sparsemax
from ..operators.normmax import normmax as _normmax

__all__ = [
    "sparsemax",
    "entmax15",
    "sparsemax_bisect",
    "entmax_bisect",
    "normmax_bisect",
    "budget_bisect",
    "sparsemax_loss",
    "entmax15_loss",
    "sparsemax_bisect_loss",
    "entmax_bisect_loss",
    "normmax_bisect_loss",
    "Sparsemax",
    "Entmax15",
    "SparsemaxBisect",
    "EntmaxBisect",
    "NormmaxBisect",
    "BudgetBisect",
    "SparsemaxLoss",
    "Entmax15Loss",
    "SparsemaxBisectLoss",
    "EntmaxBisectLoss",
    "NormmaxBisectLoss",
]

__version__ = "1.4.dev0"  # the API level mirrored

#: the output, or ``(output, support sizes)`` with ``return_support_size``: ``Tensor | Any`` so that the
#: common case needs no test (as :data:`softargmax.losses._options.LossOutput`)
WithSupport = Union[Tensor, Any]


def _support_size(p: Tensor, dim: int) -> Tensor:
    """Non-zeros along ``dim`` (kept as size 1), ``torch.long``, like the package's."""
    return (p > 0).sum(dim=dim, keepdim=True)


@overload
def _as_alpha(alpha: Tensor, x: Tensor) -> Tensor: ...
@overload
def _as_alpha(alpha: Union[float, Tensor], x: Tensor) -> Union[float, Tensor]: ...
def _as_alpha(alpha: Union[float, Tensor], x: Tensor) -> Union[float, Tensor]:
    """The package accepts a float or a tensor that expands to ``x`` with size 1 along ``dim``."""
    if isinstance(alpha, Tensor) and alpha.dim() == 0:
        return alpha.reshape([1] * x.dim())
    return alpha


# ----------------------------------------------------------------------------------
# mappings
# ----------------------------------------------------------------------------------


def sparsemax(X: Tensor, dim: int = -1, k: Optional[int] = None, return_support_size: bool = False) -> WithSupport:
    """sparsemax: the Euclidean projection onto the simplex along ``dim`` (exact; ``k`` is ignored).

    With ``return_support_size`` also returns the number of non-zeros along ``dim``.
    """
    check_tensor(X, "X")
    P = _sparsemax(X, dim)
    return (P, _support_size(P, dim)) if return_support_size else P


def entmax15(X: Tensor, dim: int = -1, k: Optional[int] = None, return_support_size: bool = False) -> WithSupport:
    """1.5-entmax along ``dim`` (exact; ``k`` is ignored).  ``return_support_size`` as :func:`sparsemax`."""
    check_tensor(X, "X")
    P = _entmax15(X, dim)
    return (P, _support_size(P, dim)) if return_support_size else P


def sparsemax_bisect(X: Tensor, dim: int = -1, n_iter: Optional[int] = 50, ensure_sum_one: bool = True) -> Tensor:
    """sparsemax along ``dim`` (exact; ``n_iter`` and ``ensure_sum_one`` are ignored)."""
    check_tensor(X, "X")
    return _sparsemax(X, dim)


def entmax_bisect(X: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1, n_iter: Optional[int] = 50,
                  ensure_sum_one: bool = True) -> Tensor:
    """α-entmax along ``dim`` for any α > 0: a float or a tensor expandable to ``X`` with size 1
    along ``dim``, differentiable.  ``n_iter`` and ``ensure_sum_one`` are ignored."""
    check_tensor(X, "X")
    return _entmax(X, _as_alpha(alpha, X), dim)


def normmax_bisect(X: Tensor, alpha: Union[float, Tensor] = 2, dim: int = -1, n_iter: Optional[int] = 50) -> Tensor:
    """α-normmax ``argmax_{p ∈ Δ} ⟨p, X⟩ - ‖p‖_α`` along ``dim``, α >= 1 (:func:`softargmax.normmax`);
    α = 1 is the argmax, uniform over ties, as in the package (with a zero gradient)."""
    check_tensor(X, "X")
    return _normmax(X, _as_alpha(alpha, X), dim)


def budget_bisect(X: Tensor, budget: Union[float, Tensor] = 2, dim: int = -1, n_iter: Optional[int] = 50) -> Tensor:
    """The k-subsets map ``argmax_{0 <= p <= 1, Σp = budget} ⟨p, X⟩ - ½‖p‖²`` along ``dim``.

    Computed as ``budget · budget_sparsemax(X / budget, budget)`` (:mod:`softargmax.operators.budget`).
    ``budget = 0`` gives zeros, as in the package; a row with at most ``budget`` unmasked
    entries gets 1 on each of them.
    """
    check_tensor(X, "X")
    if isinstance(budget, Tensor):
        if not budget.is_floating_point():
            budget = budget.to(X.dtype if X.is_floating_point() else torch.get_default_dtype())
        b = _as_alpha(budget.detach(), X)
        check_broadcastable(b, X, "budget", "X's shape")
        if bool((b < 0).any()):
            raise ValueError("budget must be >= 0")
        zero = b == 0
        if bool(zero.any()):
            b_safe = torch.where(zero, torch.ones_like(b), b)
            return torch.where(zero, torch.zeros_like(X), b_safe * budget_sparsemax(X / b_safe, b_safe, dim))
        return b * budget_sparsemax(X / b, b, dim)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"budget must be a number or a tensor, got {type(budget).__name__}")
    if budget == 0:
        return X * 0
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    return budget * budget_sparsemax(X / budget, budget, dim)


# ----------------------------------------------------------------------------------
# per-sample losses
# ----------------------------------------------------------------------------------


def _fy(X: Tensor, target: Tensor, mapping: str, **params: Any) -> Tensor:
    return _losses.fenchel_young_loss(X, target, mapping, reduction="none", **params)


def _with_support(loss: Tensor, X: Tensor, target: Tensor, mapping: str, return_support_size: bool) -> WithSupport:
    if not return_support_size:
        return loss
    with torch.no_grad():
        P = _sparsemax(X, -1) if mapping == "sparsemax" else _entmax15(X, -1)
    return loss, _support_size(P, -1)


def sparsemax_loss(X: Tensor, target: Tensor, k: Optional[int] = None, return_support_size: bool = False) -> WithSupport:
    """Per-sample sparsemax loss (``k`` ignored); with ``return_support_size`` also the support sizes."""
    check_tensor(X, "X")
    return _with_support(_fy(X, target, "sparsemax"), X, target, "sparsemax", return_support_size)


def entmax15_loss(X: Tensor, target: Tensor, k: Optional[int] = None, return_support_size: bool = False) -> WithSupport:
    """Per-sample 1.5-entmax loss (``k`` ignored); with ``return_support_size`` also the support sizes."""
    check_tensor(X, "X")
    return _with_support(_fy(X, target, "entmax15"), X, target, "entmax15", return_support_size)


def sparsemax_bisect_loss(X: Tensor, target: Tensor, n_iter: Optional[int] = 50) -> Tensor:
    """Per-sample sparsemax loss (``n_iter`` ignored)."""
    check_tensor(X, "X")
    return _fy(X, target, "sparsemax")


def _per_row_alpha(X: Tensor, target: Tensor, alpha: Tensor, one: Callable[[Tensor, Tensor, float], Tensor]) -> Tensor:
    """A loss with one α per sample, computed group by group of equal α."""
    a = alpha.detach().reshape(-1)
    if a.numel() != X.shape[0]:
        raise ValueError(f"alpha: one value per sample expected ({X.shape[0]}), got shape {tuple(alpha.shape)}")
    out = X.new_zeros(X.shape[:-1])
    for v in torch.unique(a).tolist():
        idx = (a == v).nonzero().squeeze(1)
        out = out.index_put((idx,), one(X.index_select(0, idx), target.index_select(0, idx), v))
    return out


def entmax_bisect_loss(X: Tensor, target: Tensor, alpha: Union[float, Tensor] = 1.5, n_iter: Optional[int] = 50) -> Tensor:
    """Per-sample α-entmax loss, any α > 0 (α = 1: cross-entropy); a tensor α is one value or
    one per sample (a constant: the losses do not differentiate α).  ``n_iter`` ignored."""
    check_tensor(X, "X")
    if isinstance(alpha, Tensor):
        if alpha.numel() != 1:
            return _per_row_alpha(X, target, alpha, lambda x, t, v: _fy(x, t, "entmax", alpha=v))
        alpha = float(alpha)
    return _fy(X, target, "entmax", alpha=alpha)


def normmax_bisect_loss(X: Tensor, target: Tensor, alpha: Union[float, Tensor] = 2, n_iter: Optional[int] = 50) -> Tensor:
    """Per-sample normmax loss ``⟨X, p - e_y⟩ + 1 - ‖p‖_α`` (:mod:`softargmax.losses.normmax_budget`);
    α = 1 gives ``max X - X_y``, as in the package."""
    check_tensor(X, "X")
    if isinstance(alpha, Tensor) and alpha.numel() == 1:
        alpha = float(alpha)
    return _normmax_loss(X, target, alpha, reduction="none")


# ----------------------------------------------------------------------------------
# modules
# ----------------------------------------------------------------------------------


class Sparsemax(nn.Module):
    """:func:`sparsemax` as a module."""

    def __init__(self, dim: int = -1, k: Optional[int] = None, return_support_size: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.k = k
        self.return_support_size = return_support_size

    def forward(self, X: Tensor) -> WithSupport:
        return sparsemax(X, dim=self.dim, k=self.k, return_support_size=self.return_support_size)


class Entmax15(nn.Module):
    """:func:`entmax15` as a module."""

    def __init__(self, dim: int = -1, k: Optional[int] = None, return_support_size: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.k = k
        self.return_support_size = return_support_size

    def forward(self, X: Tensor) -> WithSupport:
        return entmax15(X, dim=self.dim, k=self.k, return_support_size=self.return_support_size)


class SparsemaxBisect(nn.Module):
    """:func:`sparsemax_bisect` as a module."""

    def __init__(self, dim: int = -1, n_iter: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter

    def forward(self, X: Tensor) -> Tensor:
        return sparsemax_bisect(X, dim=self.dim, n_iter=self.n_iter)


class EntmaxBisect(nn.Module):
    """:func:`entmax_bisect` as a module; an ``nn.Parameter`` α is registered (and learned as given)."""

    def __init__(self, alpha: Union[float, Tensor] = 1.5, dim: int = -1, n_iter: Optional[int] = 50) -> None:
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.alpha = alpha

    def forward(self, X: Tensor) -> Tensor:
        return entmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class NormmaxBisect(nn.Module):
    """:func:`normmax_bisect` as a module."""

    def __init__(self, alpha: Union[float, Tensor] = 2, dim: int = -1, n_iter: Optional[int] = 50) -> None:
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.alpha = alpha

    def forward(self, X: Tensor) -> Tensor:
        return normmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class BudgetBisect(nn.Module):
    """:func:`budget_bisect` as a module."""

    def __init__(self, budget: Union[float, Tensor] = 2, dim: int = -1, n_iter: Optional[int] = 50) -> None:
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.budget = budget

    def forward(self, X: Tensor) -> Tensor:
        return budget_bisect(X, budget=self.budget, dim=self.dim, n_iter=self.n_iter)


_PACKAGE_REDUCTIONS = ("elementwise_mean", "sum", "none")


class _GenericLoss(nn.Module):
    """The package's reduction: ``"elementwise_mean"`` divides by the number of samples whose
    target differs from a non-negative ``ignore_index`` (all samples otherwise)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 return_support_size: bool = False) -> None:
        if reduction not in _PACKAGE_REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(map(repr, _PACKAGE_REDUCTIONS))}, got {reduction!r}")
        super().__init__()
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.return_support_size = return_support_size

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:  # pragma: no cover - overridden
        raise NotImplementedError

    def forward(self, X: Tensor, target: Tensor) -> WithSupport:
        check_tensor(X, "X")
        loss = self.loss(X, target)
        support = None
        if isinstance(loss, tuple):
            loss, support = loss
        if self.ignore_index >= 0:
            ignored = target == self.ignore_index
            size = float(target.size(0) - int(ignored.sum()))
            loss = loss.masked_fill(ignored, 0.0)
        else:
            size = float(target.size(0))
        if self.reduction == "sum":
            loss = loss.sum()
        elif self.reduction == "elementwise_mean":
            loss = loss.sum() / size
        if self.return_support_size:
            return loss, support
        return loss


class SparsemaxLoss(_GenericLoss):
    """:func:`sparsemax_loss` with the package's reduction."""

    def __init__(self, k: Optional[int] = None, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 return_support_size: bool = False) -> None:
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        loss = _losses.fenchel_young_loss(X, target, "sparsemax", reduction="none", ignore_index=self.ignore_index)
        return _with_support(loss, X, target, "sparsemax", self.return_support_size)


class Entmax15Loss(_GenericLoss):
    """:func:`entmax15_loss` with the package's reduction."""

    def __init__(self, k: Optional[int] = 100, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 return_support_size: bool = False) -> None:
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        loss = _losses.fenchel_young_loss(X, target, "entmax15", reduction="none", ignore_index=self.ignore_index)
        return _with_support(loss, X, target, "entmax15", self.return_support_size)


class SparsemaxBisectLoss(_GenericLoss):
    """:func:`sparsemax_bisect_loss` with the package's reduction."""

    def __init__(self, n_iter: Optional[int] = 50, ignore_index: int = -100, reduction: str = "elementwise_mean") -> None:
        super().__init__(ignore_index, reduction)
        self.n_iter = n_iter

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        return _losses.fenchel_young_loss(X, target, "sparsemax", reduction="none", ignore_index=self.ignore_index)


class EntmaxBisectLoss(_GenericLoss):
    """:func:`entmax_bisect_loss` with the package's reduction."""

    def __init__(self, alpha: Union[float, Tensor] = 1.5, n_iter: Optional[int] = 50, ignore_index: int = -100,
                 reduction: str = "elementwise_mean") -> None:
        super().__init__(ignore_index, reduction)
        self.alpha = alpha
        self.n_iter = n_iter

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        alpha = self.alpha
        if isinstance(alpha, Tensor) and alpha.numel() != 1:
            return _per_row_alpha(X, target, alpha, lambda x, t, v: _losses.fenchel_young_loss(
                x, t, "entmax", alpha=v, reduction="none", ignore_index=self.ignore_index))
        if isinstance(alpha, Tensor):
            alpha = float(alpha)
        return _losses.fenchel_young_loss(X, target, "entmax", alpha=alpha, reduction="none",
                                          ignore_index=self.ignore_index)


class NormmaxBisectLoss(_GenericLoss):
    """:func:`normmax_bisect_loss` with the package's reduction."""

    def __init__(self, alpha: Union[float, Tensor] = 2, n_iter: Optional[int] = 50, ignore_index: int = -100,
                 reduction: str = "elementwise_mean") -> None:
        super().__init__(ignore_index, reduction)
        self.alpha = alpha
        self.n_iter = n_iter

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        alpha = self.alpha
        if isinstance(alpha, Tensor) and alpha.numel() == 1:
            alpha = float(alpha)
        return _normmax_loss(X, target, alpha, reduction="none", ignore_index=self.ignore_index)
