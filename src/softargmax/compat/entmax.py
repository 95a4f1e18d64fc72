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
    r"""The package's ``sparsemax``: the Euclidean projection onto the simplex along ``dim``, exact.

    .. math::

        \operatorname{sparsemax}(X) = \operatorname*{argmin}_{p \in \Delta} \lVert p - X\rVert^2 = [X - \tau]_+,

    :func:`softargmax.sparsemax`.

    Args:
        X: scores, any shape.
        dim: the dimension that sums to one. Default: ``-1``.
        k: the package's partial-sort size; ignored (the result is exact). Default: ``None``.
        return_support_size: also return the number of non-zeros along ``dim``. Default: ``False``.

    Returns:
        the probabilities, and with ``return_support_size`` the support sizes (``torch.long``, size 1
        along ``dim``).

    Shape:
        - X: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input (and the support sizes with size 1 along ``dim``).

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.sparsemax(X, return_support_size=True)
        (tensor([[0.6000, 0.4000, 0.0000]]), tensor([[2]]))

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    P = _sparsemax(X, dim)
    return (P, _support_size(P, dim)) if return_support_size else P


def entmax15(X: Tensor, dim: int = -1, k: Optional[int] = None, return_support_size: bool = False) -> WithSupport:
    r"""The package's ``entmax15``: 1.5-entmax along ``dim``, exact.

    .. math::

        \operatorname{entmax}_{1.5}(X) = [X/2 - \tau]_+^2, \qquad \sum_j p_j = 1,

    :func:`softargmax.entmax15`.

    Args:
        X: scores, any shape.
        dim: the dimension that sums to one. Default: ``-1``.
        k: the package's partial-sort size; ignored (the result is exact). Default: ``None``.
        return_support_size: also return the number of non-zeros along ``dim``. Default: ``False``.

    Returns:
        the probabilities, and with ``return_support_size`` the support sizes.

    Shape:
        - X: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input (and the support sizes with size 1 along ``dim``).

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.entmax15(X)
        tensor([[0.5705, 0.4295, 0.0000]])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    P = _entmax15(X, dim)
    return (P, _support_size(P, dim)) if return_support_size else P


def sparsemax_bisect(X: Tensor, dim: int = -1, n_iter: Optional[int] = 50, ensure_sum_one: bool = True) -> Tensor:
    r"""The package's ``sparsemax_bisect``: sparsemax along ``dim``, exact (no bisection).

    .. math::

        \operatorname{sparsemax}(X) = [X - \tau]_+, \qquad \sum_j p_j = 1.

    Args:
        X: scores, any shape.
        dim: the dimension that sums to one. Default: ``-1``.
        n_iter: the package's bisection steps; ignored. Default: ``50``.
        ensure_sum_one: the package's renormalization; ignored (the output sums to one). Default: ``True``.

    Returns:
        the probabilities.

    Shape:
        - X: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input (and the support sizes with size 1 along ``dim``).

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.sparsemax_bisect(X)
        tensor([[0.6000, 0.4000, 0.0000]])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    return _sparsemax(X, dim)


def entmax_bisect(X: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1, n_iter: Optional[int] = 50,
                  ensure_sum_one: bool = True) -> Tensor:
    r"""The package's ``entmax_bisect``: α-entmax along ``dim`` for any α > 0, differentiable in α.

    .. math::

        \operatorname{entmax}_\alpha(X) = [(\alpha - 1) X - \tau]_+^{1/(\alpha-1)}, \qquad \sum_j p_j = 1,

    :func:`softargmax.entmax`, solved to rounding error (no fixed bisection count).

    Args:
        X: scores, any shape.
        alpha: a float > 0 or a tensor expandable to ``X`` with size 1 along ``dim``, differentiable.
            Default: ``1.5``.
        dim: the dimension that sums to one. Default: ``-1``.
        n_iter: the package's bisection steps; ignored. Default: ``50``.
        ensure_sum_one: the package's renormalization; ignored. Default: ``True``.

    Returns:
        the probabilities.

    Shape:
        - X: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input (and the support sizes with size 1 along ``dim``).

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.entmax_bisect(X, alpha=2.0)
        tensor([[0.6000, 0.4000, 0.0000]])
        >>> entmax.entmax_bisect(X, alpha=torch.tensor([[1.5]]))
        tensor([[0.5705, 0.4295, 0.0000]])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    return _entmax(X, _as_alpha(alpha, X), dim)


def normmax_bisect(X: Tensor, alpha: Union[float, Tensor] = 2, dim: int = -1, n_iter: Optional[int] = 50) -> Tensor:
    r"""The package's ``normmax_bisect``: α-normmax along ``dim``, :math:`\alpha \ge 1`.

    .. math::

        \operatorname{normmax}_\alpha(X) = \operatorname*{argmax}_{p \in \Delta} \langle p, X\rangle - \lVert p\rVert_\alpha,

    :func:`softargmax.normmax`; α = 1 is the argmax, uniform over ties, as in the package (with a
    zero gradient).

    Args:
        X: scores, any shape.
        alpha: a float ``>= 1`` or a tensor expandable to ``X`` with size 1 along ``dim``. Default: ``2``.
        dim: the dimension that sums to one. Default: ``-1``.
        n_iter: the package's bisection steps; ignored. Default: ``50``.

    Returns:
        the probabilities.

    Shape:
        - X: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input (and the support sizes with size 1 along ``dim``).

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.normmax_bisect(X)
        tensor([[0.5714, 0.4286, 0.0000]])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    return _normmax(X, _as_alpha(alpha, X), dim)


def budget_bisect(X: Tensor, budget: Union[float, Tensor] = 2, dim: int = -1, n_iter: Optional[int] = 50) -> Tensor:
    r"""The package's ``budget_bisect``: the k-subsets map along ``dim``, summing to the budget.

    .. math::

        \operatorname*{argmax}_{0 \le p \le 1,\ \sum_j p_j = B} \langle p, X\rangle - \tfrac12 \lVert p\rVert^2
        = B \cdot \operatorname{budget\_sparsemax}(X / B;\ B),

    computed by :func:`softargmax.budget_sparsemax`.  :math:`B = 0` gives zeros, as in the package; a
    row with at most :math:`B` unmasked entries gets 1 on each of them.

    Args:
        X: scores, any shape.
        budget: :math:`B \ge 0`, a number or a tensor expandable to ``X`` with size 1 along ``dim``.
            Default: ``2``.
        dim: the dimension that sums to the budget. Default: ``-1``.
        n_iter: the package's bisection steps; ignored. Default: ``50``.

    Returns:
        the marginals in :math:`[0, 1]`, summing to :math:`B` along ``dim``.

    Shape:
        - X: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input (and the support sizes with size 1 along ``dim``).

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> entmax.budget_bisect(torch.tensor([[3.0, 1.0, 0.8, -1.0]]), budget=2)
        tensor([[1.0000, 0.6000, 0.4000, 0.0000]])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        The ``entmax`` package, https://github.com/deep-spin/entmax
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
    r"""The package's ``sparsemax_loss``: the sparsemax loss of every sample.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + \tfrac12 - \tfrac12 \lVert p\rVert^2, \qquad p = \operatorname{sparsemax}(X).

    Args:
        X: scores ``[..., k]``.
        target: class indices ``[...]``.
        k: the package's partial-sort size; ignored. Default: ``None``.
        return_support_size: also return the prediction's support sizes. Default: ``False``.

    Returns:
        the per-sample losses, and with ``return_support_size`` the support sizes.

    Shape:
        - X: :math:`(*, k)`, the classes on the last dimension (for example :math:`(N, k)`).
        - target: class indices :math:`(*)`.
        - Output: the per-sample losses :math:`(*)`.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.sparsemax_loss(X, torch.tensor([0]))
        tensor([0.1600])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    return _with_support(_fy(X, target, "sparsemax"), X, target, "sparsemax", return_support_size)


def entmax15_loss(X: Tensor, target: Tensor, k: Optional[int] = None, return_support_size: bool = False) -> WithSupport:
    r"""The package's ``entmax15_loss``: the 1.5-entmax loss of every sample.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + H^T_{1.5}(p), \qquad p = \operatorname{entmax}_{1.5}(X).

    Args:
        X: scores ``[..., k]``.
        target: class indices ``[...]``.
        k: the package's partial-sort size; ignored. Default: ``None``.
        return_support_size: also return the prediction's support sizes. Default: ``False``.

    Returns:
        the per-sample losses, and with ``return_support_size`` the support sizes.

    Shape:
        - X: :math:`(*, k)`, the classes on the last dimension (for example :math:`(N, k)`).
        - target: class indices :math:`(*)`.
        - Output: the per-sample losses :math:`(*)`.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.entmax15_loss(X, torch.tensor([0]))
        tensor([0.2976])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    return _with_support(_fy(X, target, "entmax15"), X, target, "entmax15", return_support_size)


def sparsemax_bisect_loss(X: Tensor, target: Tensor, n_iter: Optional[int] = 50) -> Tensor:
    r"""The package's ``sparsemax_bisect_loss``: the sparsemax loss of every sample (exact).

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + \tfrac12 - \tfrac12 \lVert p\rVert^2, \qquad p = \operatorname{sparsemax}(X).

    Args:
        X: scores ``[..., k]``.
        target: class indices ``[...]``.
        n_iter: the package's bisection steps; ignored. Default: ``50``.

    Returns:
        the per-sample losses.

    Shape:
        - X: :math:`(*, k)`, the classes on the last dimension (for example :math:`(N, k)`).
        - target: class indices :math:`(*)`.
        - Output: the per-sample losses :math:`(*)`.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.sparsemax_bisect_loss(X, torch.tensor([0]))
        tensor([0.1600])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
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
    r"""The package's ``entmax_bisect_loss``: the α-entmax loss of every sample, any α > 0.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + H^T_\alpha(p), \qquad p = \operatorname{entmax}_\alpha(X),

    cross-entropy at α = 1.

    Args:
        X: scores ``[..., k]``.
        target: class indices ``[...]``.
        alpha: a float > 0, or a tensor of one value or one per sample (a constant: the losses do
            not differentiate α). Default: ``1.5``.
        n_iter: the package's bisection steps; ignored. Default: ``50``.

    Returns:
        the per-sample losses.

    Shape:
        - X: :math:`(*, k)`, the classes on the last dimension (for example :math:`(N, k)`).
        - target: class indices :math:`(*)`.
        - Output: the per-sample losses :math:`(*)`.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.entmax_bisect_loss(X, torch.tensor([0]), alpha=2.0)
        tensor([0.1600])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    if isinstance(alpha, Tensor):
        if alpha.numel() != 1:
            return _per_row_alpha(X, target, alpha, lambda x, t, v: _fy(x, t, "entmax", alpha=v))
        alpha = float(alpha)
    return _fy(X, target, "entmax", alpha=alpha)


def normmax_bisect_loss(X: Tensor, target: Tensor, alpha: Union[float, Tensor] = 2, n_iter: Optional[int] = 50) -> Tensor:
    r"""The package's ``normmax_bisect_loss``: the normmax loss of every sample, :math:`\alpha \ge 1`.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + 1 - \lVert p\rVert_\alpha, \qquad p = \operatorname{normmax}_\alpha(X),

    (:func:`softargmax.normmax_loss`); α = 1 gives :math:`\max_j X_j - X_y`, as in the package.

    Args:
        X: scores ``[..., k]``.
        target: class indices ``[...]``.
        alpha: a float ``>= 1``, or a one-element tensor. Default: ``2``.
        n_iter: the package's bisection steps; ignored. Default: ``50``.

    Returns:
        the per-sample losses.

    Shape:
        - X: :math:`(*, k)`, the classes on the last dimension (for example :math:`(N, k)`).
        - target: class indices :math:`(*)`.
        - Output: the per-sample losses :math:`(*)`.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0]])
        >>> entmax.normmax_bisect_loss(X, torch.tensor([0]))
        tensor([0.2000])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """
    check_tensor(X, "X")
    if isinstance(alpha, Tensor) and alpha.numel() == 1:
        alpha = float(alpha)
    return _normmax_loss(X, target, alpha, reduction="none")


# ----------------------------------------------------------------------------------
# modules
# ----------------------------------------------------------------------------------


class Sparsemax(nn.Module):
    r"""The package's ``Sparsemax`` module: :func:`sparsemax` along ``dim``.

    .. math::

        \operatorname{Sparsemax}(X) = [X - \tau]_+, \qquad \sum_j p_j = 1.

    Args:
        dim: the dimension that sums to one. Default: ``-1``.
        k: ignored. Default: ``None``.
        return_support_size: also return the support sizes. Default: ``False``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> entmax.Sparsemax(dim=-1)(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.6000, 0.4000, 0.0000]])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, dim: int = -1, k: Optional[int] = None, return_support_size: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.k = k
        self.return_support_size = return_support_size

    def forward(self, X: Tensor) -> WithSupport:
        return sparsemax(X, dim=self.dim, k=self.k, return_support_size=self.return_support_size)


class Entmax15(nn.Module):
    r"""The package's ``Entmax15`` module: :func:`entmax15` along ``dim``.

    .. math::

        \operatorname{Entmax}_{1.5}(X) = [X/2 - \tau]_+^2, \qquad \sum_j p_j = 1.

    Args:
        dim: the dimension that sums to one. Default: ``-1``.
        k: ignored. Default: ``None``.
        return_support_size: also return the support sizes. Default: ``False``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> entmax.Entmax15()(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.5705, 0.4295, 0.0000]])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, dim: int = -1, k: Optional[int] = None, return_support_size: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.k = k
        self.return_support_size = return_support_size

    def forward(self, X: Tensor) -> WithSupport:
        return entmax15(X, dim=self.dim, k=self.k, return_support_size=self.return_support_size)


class SparsemaxBisect(nn.Module):
    r"""The package's ``SparsemaxBisect`` module: :func:`sparsemax_bisect` along ``dim``.

    .. math::

        \operatorname{SparsemaxBisect}(X) = [X - \tau]_+, \qquad \sum_j p_j = 1.

    Args:
        dim: the dimension that sums to one. Default: ``-1``.
        n_iter: ignored. Default: ``None``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> entmax.SparsemaxBisect()(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.6000, 0.4000, 0.0000]])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, dim: int = -1, n_iter: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter

    def forward(self, X: Tensor) -> Tensor:
        return sparsemax_bisect(X, dim=self.dim, n_iter=self.n_iter)


class EntmaxBisect(nn.Module):
    r"""The package's ``EntmaxBisect`` module: :func:`entmax_bisect` along ``dim``.

    .. math::

        \operatorname{EntmaxBisect}(X) = [(\alpha - 1) X - \tau]_+^{1/(\alpha-1)}, \qquad \sum_j p_j = 1;

    Args:
        alpha: a float > 0 or a tensor expandable to the input with size 1 along ``dim``; an
            ``nn.Parameter`` is registered (and learned as given, without a range). Default: ``1.5``.
        dim: the dimension that sums to one. Default: ``-1``.
        n_iter: ignored. Default: ``50``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> m = entmax.EntmaxBisect(alpha=torch.nn.Parameter(torch.tensor(1.5)))
        >>> [name for name, _ in m.named_parameters()]
        ['alpha']
        >>> m(torch.tensor([[1.0, 0.8, -1.0]])).detach()
        tensor([[0.5705, 0.4295, 0.0000]])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, alpha: Union[float, Tensor] = 1.5, dim: int = -1, n_iter: Optional[int] = 50) -> None:
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.alpha = alpha

    def forward(self, X: Tensor) -> Tensor:
        return entmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class NormmaxBisect(nn.Module):
    r"""The package's ``NormmaxBisect`` module: :func:`normmax_bisect` along ``dim``.

    .. math::

        \operatorname{NormmaxBisect}(X) = \operatorname*{argmax}_{p \in \Delta} \langle p, X\rangle - \lVert p\rVert_\alpha.

    Args:
        alpha: a float ``>= 1`` or a tensor expandable to the input with size 1 along ``dim``. Default: ``2``.
        dim: the dimension that sums to one. Default: ``-1``.
        n_iter: ignored. Default: ``50``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> entmax.NormmaxBisect()(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.5714, 0.4286, 0.0000]])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, alpha: Union[float, Tensor] = 2, dim: int = -1, n_iter: Optional[int] = 50) -> None:
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.alpha = alpha

    def forward(self, X: Tensor) -> Tensor:
        return normmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class BudgetBisect(nn.Module):
    r"""The package's ``BudgetBisect`` module: :func:`budget_bisect` along ``dim``.

    .. math::

        \operatorname{BudgetBisect}(X) = \operatorname*{argmax}_{0 \le p \le 1,\ \sum_j p_j = B} \langle p, X\rangle - \tfrac12 \lVert p\rVert^2.

    Args:
        budget: :math:`B \ge 0`, a number or a tensor expandable to the input with size 1 along ``dim``.
            Default: ``2``.
        dim: the dimension that sums to the budget. Default: ``-1``.
        n_iter: ignored. Default: ``50``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> entmax.BudgetBisect(budget=2)(torch.tensor([[3.0, 1.0, 0.8, -1.0]]))
        tensor([[1.0000, 0.6000, 0.4000, 0.0000]])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

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
    r"""The package's ``SparsemaxLoss`` module: :func:`sparsemax_loss` with the package's reduction.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + \tfrac12 - \tfrac12 \lVert p\rVert^2, \qquad p = \operatorname{sparsemax}(X),

    ``"elementwise_mean"`` divides the sum by the number of samples whose target differs from a
    non-negative ``ignore_index`` (by all samples otherwise), as the package does.

    Args:
        k: ignored. Default: ``None``.
        ignore_index: samples whose target equals it are skipped (loss 0); a non-negative one is also
            left out of the mean's count, as in the package. Default: ``-100``.
        reduction: ``"elementwise_mean"``, ``"sum"`` or ``"none"``. Default: ``"elementwise_mean"``.
        return_support_size: also return the support sizes. Default: ``False``.

    Shape:
        - X: :math:`(N, k)` (any :math:`(*, k)`).
        - target: class indices :math:`(N)`.
        - Output: :math:`()`, or :math:`(N)` for ``reduction="none"``.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]])
        >>> entmax.SparsemaxLoss(reduction="none")(X, torch.tensor([0, 2]))
        tensor([0.1600, 0.0000])
        >>> entmax.SparsemaxLoss(ignore_index=2)(X, torch.tensor([0, 2]))  # one sample counted
        tensor(0.1600)

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, k: Optional[int] = None, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 return_support_size: bool = False) -> None:
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        loss = _losses.fenchel_young_loss(X, target, "sparsemax", reduction="none", ignore_index=self.ignore_index)
        return _with_support(loss, X, target, "sparsemax", self.return_support_size)


class Entmax15Loss(_GenericLoss):
    r"""The package's ``Entmax15Loss`` module: :func:`entmax15_loss` with the package's reduction.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + H^T_{1.5}(p), \qquad p = \operatorname{entmax}_{1.5}(X),

    ``"elementwise_mean"`` divides the sum by the number of samples whose target differs from a
    non-negative ``ignore_index`` (by all samples otherwise), as the package does.

    Args:
        k: ignored. Default: ``100``.
        ignore_index: samples whose target equals it are skipped (loss 0); a non-negative one is also
            left out of the mean's count, as in the package. Default: ``-100``.
        reduction: ``"elementwise_mean"``, ``"sum"`` or ``"none"``. Default: ``"elementwise_mean"``.
        return_support_size: also return the support sizes. Default: ``False``.

    Shape:
        - X: :math:`(N, k)` (any :math:`(*, k)`).
        - target: class indices :math:`(N)`.
        - Output: :math:`()`, or :math:`(N)` for ``reduction="none"``.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]])
        >>> entmax.Entmax15Loss(reduction="none")(X, torch.tensor([0, 2]))
        tensor([0.2976, 0.0000])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, k: Optional[int] = 100, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 return_support_size: bool = False) -> None:
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        loss = _losses.fenchel_young_loss(X, target, "entmax15", reduction="none", ignore_index=self.ignore_index)
        return _with_support(loss, X, target, "entmax15", self.return_support_size)


class SparsemaxBisectLoss(_GenericLoss):
    r"""The package's ``SparsemaxBisectLoss`` module: :func:`sparsemax_bisect_loss` with the package's reduction.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + \tfrac12 - \tfrac12 \lVert p\rVert^2, \qquad p = \operatorname{sparsemax}(X),

    ``"elementwise_mean"`` divides the sum by the number of samples whose target differs from a
    non-negative ``ignore_index`` (by all samples otherwise), as the package does.

    Args:
        n_iter: ignored. Default: ``50``.
        ignore_index: samples whose target equals it are skipped (loss 0); a non-negative one is also
            left out of the mean's count, as in the package. Default: ``-100``.
        reduction: ``"elementwise_mean"``, ``"sum"`` or ``"none"``. Default: ``"elementwise_mean"``.

    Shape:
        - X: :math:`(N, k)` (any :math:`(*, k)`).
        - target: class indices :math:`(N)`.
        - Output: :math:`()`, or :math:`(N)` for ``reduction="none"``.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]])
        >>> entmax.SparsemaxBisectLoss()(X, torch.tensor([0, 2]))
        tensor(0.0800)

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

    def __init__(self, n_iter: Optional[int] = 50, ignore_index: int = -100, reduction: str = "elementwise_mean") -> None:
        super().__init__(ignore_index, reduction)
        self.n_iter = n_iter

    def loss(self, X: Tensor, target: Tensor) -> WithSupport:
        return _losses.fenchel_young_loss(X, target, "sparsemax", reduction="none", ignore_index=self.ignore_index)


class EntmaxBisectLoss(_GenericLoss):
    r"""The package's ``EntmaxBisectLoss`` module: :func:`entmax_bisect_loss` with the package's reduction.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + H^T_\alpha(p), \qquad p = \operatorname{entmax}_\alpha(X),

    ``"elementwise_mean"`` divides the sum by the number of samples whose target differs from a
    non-negative ``ignore_index`` (by all samples otherwise), as the package does.

    Args:
        alpha: a float > 0, or a tensor of one value or one per sample (a constant). Default: ``1.5``.
        n_iter: ignored. Default: ``50``.
        ignore_index: samples whose target equals it are skipped (loss 0); a non-negative one is also
            left out of the mean's count, as in the package. Default: ``-100``.
        reduction: ``"elementwise_mean"``, ``"sum"`` or ``"none"``. Default: ``"elementwise_mean"``.

    Shape:
        - X: :math:`(N, k)` (any :math:`(*, k)`).
        - target: class indices :math:`(N)`.
        - Output: :math:`()`, or :math:`(N)` for ``reduction="none"``.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]])
        >>> entmax.EntmaxBisectLoss(alpha=torch.tensor([2.0, 1.5]), reduction="none")(X, torch.tensor([0, 2]))
        tensor([0.1600, 0.0000])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

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
    r"""The package's ``NormmaxBisectLoss`` module: :func:`normmax_bisect_loss` with the package's reduction.

    .. math::

        \ell(X, y) = \langle X, p - e_y\rangle + 1 - \lVert p\rVert_\alpha, \qquad p = \operatorname{normmax}_\alpha(X),

    ``"elementwise_mean"`` divides the sum by the number of samples whose target differs from a
    non-negative ``ignore_index`` (by all samples otherwise), as the package does.

    Args:
        alpha: a float ``>= 1``, or a one-element tensor. Default: ``2``.
        n_iter: ignored. Default: ``50``.
        ignore_index: samples whose target equals it are skipped (loss 0); a non-negative one is also
            left out of the mean's count, as in the package. Default: ``-100``.
        reduction: ``"elementwise_mean"``, ``"sum"`` or ``"none"``. Default: ``"elementwise_mean"``.

    Shape:
        - X: :math:`(N, k)` (any :math:`(*, k)`).
        - target: class indices :math:`(N)`.
        - Output: :math:`()`, or :math:`(N)` for ``reduction="none"``.

    Examples:
        >>> import torch
        >>> import softargmax.compat.entmax as entmax
        >>> X = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]])
        >>> entmax.NormmaxBisectLoss(reduction="none")(X, torch.tensor([0, 2]))
        tensor([0.2000, 0.0000])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725

        The ``entmax`` package, https://github.com/deep-spin/entmax
    """

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
