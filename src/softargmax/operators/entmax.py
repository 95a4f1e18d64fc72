r"""Sparsemax, 1.5-entmax and α-entmax.

α-entmax (Correia et al., 2019, eq. 13) is

.. math::

    \operatorname{entmax}_\alpha(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle + H^T_\alpha(p)
    = [(\alpha - 1) x - \tau]_+^{1/(\alpha-1)},

with :math:`\tau` (the entmax parametrization of the library's conventions) chosen so that the output sums
to one.  α = 1 is softmax, α = 2 is sparsemax (the Euclidean projection of ``x`` on
the simplex, Martins & Astudillo (2016)), α = 1.5 is 1.5-entmax.  All three are the α-divergence
f-softargmax with ``q = 1`` and are computed by the same pruned, safeguarded-Newton
solver (:mod:`softargmax.solvers.threshold`); sparsemax and 1.5-entmax finish with their exact
closed form on the support found, so they are exact up to rounding.

Conventions: any ``dim``; float64/float32 native, float16/bfloat16
computed in float32 and returned in the input dtype; ``-inf`` entries get
probability 0 and gradient 0; a row that is entirely ``-inf`` returns zeros (and zero
gradient); NaN or ``+inf`` in a row gives NaN in that row only.

References:

* André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
* Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*, EMNLP 2019, https://arxiv.org/abs/1909.00015
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_alpha, check_broadcastable, check_dim, check_tensor, compute_dtype
from .._utils.tracing import values_checkable
from ..divergences import get_divergence
from ._library_ops import normalized
from ._small import Mapping, mapping

__all__ = ["sparsemax", "entmax15", "entmax", "safe_softmax"]


def safe_softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""``torch.softmax`` computed in at least float32, with all-``-inf`` rows giving zeros instead of NaN.

    .. math::

        \operatorname{softmax}(x)_j = \frac{e^{x_j}}{\sum_i e^{x_i}},

    with the entries of a row that is entirely :math:`-\infty` set to 0 (attention padding) instead of
    the NaN of ``torch.softmax``.  float16/bfloat16 are computed in float32 and returned in the input
    dtype.

    Args:
        x: scores, any shape.
        dim: the dimension that sums to one (or to zero for an all-``-inf`` row). Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch
        >>> from softargmax.operators.entmax import safe_softmax
        >>> x = torch.tensor([[0.0, 0.0], [-float("inf"), -float("inf")]])
        >>> safe_softmax(x)
        tensor([[0.5000, 0.5000],
                [0.0000, 0.0000]])
        >>> torch.softmax(x, -1)[1]
        tensor([nan, nan])

    References:
        John S. Bridle, *Probabilistic Interpretation of Feedforward Classification Network Outputs,
        with Relationships to Statistical Pattern Recognition*, Neurocomputing (NATO ASI Series F68),
        1990, https://doi.org/10.1007/978-3-642-76153-9_28
    """
    xc = x.to(compute_dtype(x.dtype))
    m = xc.amax(dim, keepdim=True)
    masked = m == float("-inf")
    if not values_checkable(m) or bool(masked.any()):  # unknown (compiling, capturing): the masked-safe form
        xc = torch.where(masked, torch.zeros_like(xc), xc)
        p = torch.where(masked, torch.zeros_like(xc), torch.softmax(xc, dim))
    else:
        p = torch.softmax(xc, dim)
    return p.to(x.dtype)


def empty_like_input(x: Tensor) -> Tensor:
    return x * 0  # keeps the autograd graph for empty inputs


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Sparsemax: the Euclidean projection of ``x`` onto the probability simplex along ``dim``.

    .. math::

        \operatorname{sparsemax}(x) = \operatorname*{argmin}_{p \in \Delta} \lVert p - x \rVert_2^2 = [x - \tau]_+,

    with :math:`\tau` such that :math:`\sum_j p_j = 1` (Martins & Astudillo, 2016, eq. 2).  Exact (the
    support :math:`S` is found by Michelot's iteration on pruned candidates, then
    :math:`\tau = (\sum_{j \in S} x_j - 1)/\lvert S\rvert`).  The Jacobian is
    :math:`\operatorname{diag}(s) - s s^\top/\lvert S\rvert` with :math:`s` the support indicator.  It is
    :func:`entmax` with :math:`\alpha = 2` and the chi-square :func:`~softargmax.f_softargmax`.

    Args:
        x: scores, any shape; a ``-inf`` entry is excluded (probability 0, gradient 0).
        dim: the dimension that sums to one. Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype (float16/bfloat16 computed in float32); a row
        that is entirely ``-inf`` gives zeros.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 0.0]])
        >>> sa.sparsemax(x)
        tensor([[0.6000, 0.4000, 0.0000],
                [0.3333, 0.3333, 0.3333]])
        >>> sa.sparsemax(torch.tensor([2.0, -float("inf"), 1.5]))
        tensor([0.7500, 0.0000, 0.2500])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
    """
    p = mapping(x, dim, _SPARSEMAX)  # the small calls' fast path, or None
    if p is not None:
        return p
    check_tensor(x)
    dim = check_dim(x, dim)
    if x.numel() == 0:
        return empty_like_input(x)
    return normalized(x, None, None, get_divergence("chi_square"), 1.0, dim)


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    r"""1.5-entmax: α-entmax with :math:`\alpha = 1.5`, sparse and smoother than sparsemax.

    .. math::

        \operatorname{entmax}_{1.5}(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle + H^T_{1.5}(p)
        = [x/2 - \tau]_+^2,

    with :math:`\tau` such that :math:`\sum_j p_j = 1` along ``dim`` and :math:`H^T_\alpha` the Tsallis
    entropy.  Exact: the support's quadratic in :math:`\tau` is solved in closed form.  Jacobian weights
    :math:`s = \sqrt{p}` (Peters et al., 2019; Correia et al., 2019).

    Args:
        x: scores, any shape; a ``-inf`` entry is excluded (probability 0, gradient 0).
        dim: the dimension that sums to one. Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype (float16/bfloat16 computed in float32); a row
        that is entirely ``-inf`` gives zeros.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([1.0, 0.8, -1.0])
        >>> sa.entmax15(x)
        tensor([0.5705, 0.4295, 0.0000])
        >>> torch.allclose(sa.entmax15(x), sa.entmax(x, alpha=1.5))
        True

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """
    p = mapping(x, dim, _ENTMAX15)  # the small calls' fast path, or None
    if p is not None:
        return p
    check_tensor(x)
    dim = check_dim(x, dim)
    if x.numel() == 0:
        return empty_like_input(x)
    return normalized(x, None, None, get_divergence("alpha", alpha=1.5), 1.0, dim)


def entmax(x: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1) -> Tensor:
    r"""α-entmax along ``dim`` for any :math:`\alpha > 0`: softmax at 1, sparsemax at 2, sparse for :math:`\alpha > 1`.

    .. math::

        \operatorname{entmax}_\alpha(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle + H^T_\alpha(p)
        = [(\alpha - 1) x - \tau]_+^{1/(\alpha-1)},
        \qquad H^T_\alpha(p) = \frac{1 - \sum_j p_j^\alpha}{\alpha(\alpha - 1)},

    with :math:`\tau` such that :math:`\sum_j p_j = 1` (Peters et al., 2019; Correia et al., 2019, eq. 13).

    α = 1 is softmax, α = 2 sparsemax.  Rows with α close to 1 are dense in practice
    (the support is everything within :math:`1/(\alpha-1)` of the maximum).  α ∈ (0, 1) gives
    dense outputs: the same maximizer of :math:`\langle p, x\rangle + H^T_\alpha(p)` over the simplex (the
    Tsallis entropy is strictly concave for every α > 0), now
    :math:`p_j = [(\alpha - 1) x_j - \tau]^{1/(\alpha-1)}` with a negative exponent and
    :math:`\tau > (\alpha - 1) \max_j x_j`; it is the α-divergence f-softargmax with ``q = 1``, solved
    by the same safeguarded Newton iteration (:math:`S^{\alpha-1}` is a power mean with a negative
    exponent, so Newton from the lower bracket end is monotone).  The α-gradient formula
    holds for every α > 0.

    Args:
        x: scores, any shape; a ``-inf`` entry is excluded (probability 0, gradient 0).
        alpha: a float ``> 0`` or a floating tensor broadcastable to ``x`` with size 1
            along ``dim`` (one α per row, e.g. per attention head), on ``x``'s device (a
            0-d CPU tensor is moved there; any other tensor on another device is a
            ``ValueError``).  A tensor α is differentiable (Correia et al., 2019, eqs. 26–39,
            including the α → 1 limit). Default: ``1.5``.
        dim: the dimension that sums to one. Default: ``-1``.

    Returns:
        the probabilities, of ``x``'s shape and dtype (float16/bfloat16 computed in float32); a row
        that is entirely ``-inf`` gives zeros.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - alpha: a number, or a tensor broadcastable to the input with size 1 along ``dim``.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([1.0, 0.8, -1.0])
        >>> sa.entmax(x, alpha=2.0)  # sparsemax
        tensor([0.6000, 0.4000, 0.0000])
        >>> sa.entmax(x, alpha=1.0)  # softmax
        tensor([0.5118, 0.4190, 0.0693])

        One learnable α per row (per attention head), differentiable:

        >>> scores = torch.tensor([[1.0, 0.8, -1.0], [1.0, 0.8, -1.0]])
        >>> alpha = torch.tensor([[1.5], [2.0]], requires_grad=True)
        >>> p = sa.entmax(scores, alpha)
        >>> p.detach()
        tensor([[0.5705, 0.4295, 0.0000],
                [0.6000, 0.4000, 0.0000]])
        >>> p[:, 0].sum().backward()
        >>> alpha.grad.shape
        torch.Size([2, 1])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702

        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """
    if type(alpha) is float:  # the small calls' fast path (a float α), or None
        op = _ENTMAX_BY_ALPHA.get(alpha)
        if op is None:
            op = _entmax_mapping(alpha)
        p = mapping(x, dim, op) if op is not None else None
        if p is not None:
            return p
    check_tensor(x)
    dim = check_dim(x, dim)
    alpha = check_alpha(alpha, "alpha", minimum=0.0, strict=True, x=x)
    if x.numel() == 0:
        if not isinstance(alpha, Tensor):
            return empty_like_input(x)
        rows = list(x.shape)
        rows[dim] = 1  # the shape check the solver's row layout makes (Rows.row_param), for no rows
        check_broadcastable(alpha, torch.empty(rows, device="meta"), "alpha", f"x's shape with size 1 along dim={dim}:")
        return empty_like_input(x) + 0 * alpha.sum()
    if isinstance(alpha, Tensor):
        if alpha.dim() > x.dim():
            raise ValueError(f"alpha of shape {tuple(alpha.shape)} has more dimensions than x {tuple(x.shape)}")
        return normalized(x, None, alpha, None, 1.0, dim)
    if alpha == 1.0:
        return safe_softmax(x, dim)
    if alpha == 2.0:
        return normalized(x, None, None, get_divergence("chi_square"), 1.0, dim)
    return normalized(x, None, None, get_divergence("alpha", alpha=alpha), 1.0, dim)


_SPARSEMAX = Mapping(get_divergence("chi_square"))
_ENTMAX15 = Mapping(get_divergence("alpha", alpha=1.5))
#: the small calls' :class:`~softargmax.operators._small.Mapping` of :func:`entmax` by float α (bounded)
_ENTMAX_BY_ALPHA: dict[float, Mapping] = {1.5: _ENTMAX15, 2.0: _SPARSEMAX}


def _entmax_mapping(alpha: float) -> Optional[Mapping]:
    """The fast path's :class:`~softargmax.operators._small.Mapping` of α-entmax, kept per α; ``None`` for α
    outside (1, 2) (α = 1 is softmax; the fast path covers α in (1, 2]; an invalid α is the general path's error)."""
    if not 1.0 < alpha < 2.0:
        return None
    if len(_ENTMAX_BY_ALPHA) >= 64:  # many distinct α (one per step of a schedule): stay bounded
        for key in [a for a in _ENTMAX_BY_ALPHA if a not in (1.5, 2.0)]:
            del _ENTMAX_BY_ALPHA[key]
    op = _ENTMAX_BY_ALPHA[alpha] = Mapping(get_divergence("alpha", alpha=alpha))
    return op
