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

from typing import Union

import torch
from torch import Tensor

from .._utils.checks import check_alpha, check_broadcastable, check_dim, check_tensor, compute_dtype
from .._utils.tracing import values_checkable
from ..divergences import get_divergence
from ._library_ops import normalized

__all__ = ["sparsemax", "entmax15", "entmax", "safe_softmax"]


def safe_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``torch.softmax`` computed in at least float32, with all-``-inf`` rows giving zeros instead of NaN."""
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

    :math:`\operatorname{sparsemax}(x) = [x - \tau]_+` with :math:`\sum_j p_j = 1` (Martins & Astudillo, 2016, eq. 2).  Exact (the support is
    found by Michelot's iteration on pruned candidates, then :math:`\tau = (\sum_{j \in S} x_j - 1)/\lvert S\rvert`).
    The Jacobian is :math:`\operatorname{diag}(s) - s s^\top/\lvert S\rvert` with ``s`` the support indicator.
    """
    check_tensor(x)
    dim = check_dim(x, dim)
    if x.numel() == 0:
        return empty_like_input(x)
    return normalized(x, None, None, get_divergence("chi_square"), 1.0, dim)


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    r"""1.5-entmax: :math:`[x/2 - \tau]_+^2` with :math:`\sum_j p_j = 1` along ``dim`` (exact: the support's quadratic is solved in closed form).

    Jacobian weights :math:`s = \sqrt{p}` (Correia et al., 2019; Peters et al. 2019).
    """
    check_tensor(x)
    dim = check_dim(x, dim)
    if x.numel() == 0:
        return empty_like_input(x)
    return normalized(x, None, None, get_divergence("alpha", alpha=1.5), 1.0, dim)


def entmax(x: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1) -> Tensor:
    r"""α-entmax :math:`[(\alpha - 1) x - \tau]_+^{1/(\alpha-1)}` along ``dim`` for any :math:`\alpha > 0`.

    Args:
        x: scores.
        alpha: a float ``> 0`` or a floating tensor broadcastable to ``x`` with size 1
            along ``dim`` (one α per row, e.g. per attention head), on ``x``'s device (a
            0-d CPU tensor is moved there; any other tensor on another device is a
            ``ValueError``).  A tensor α is differentiable (Correia et al., 2019, eqs. 26–39, including the α → 1 limit).
        dim: the dimension that sums to one.

    α = 1 is softmax, α = 2 sparsemax.  Rows with α close to 1 are dense in practice
    (the support is everything within :math:`1/(\alpha-1)` of the maximum).  α ∈ (0, 1) gives
    dense outputs: the same maximizer of :math:`\langle p, x\rangle + H^T_\alpha(p)` over the simplex (the
    Tsallis entropy is strictly concave for every α > 0), now
    :math:`p_j = [(\alpha - 1) x_j - \tau]^{1/(\alpha-1)}` with a negative exponent and
    :math:`\tau > (\alpha - 1) \max_j x_j`; it is the α-divergence f-softargmax with ``q = 1``, solved
    by the same safeguarded Newton iteration (:math:`S^{\alpha-1}` is a power mean with a negative
    exponent, so Newton from the lower bracket end is monotone).  The α-gradient formula
    holds for every α > 0.
    """
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
