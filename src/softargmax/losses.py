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

from typing import Optional, Union

import torch
from torch import Tensor

from ._checks import check_positive_number, check_tensor
from ._fy_loss import one_process_loss
from ._loss_rows import MAPPINGS
from ._targets import check_reduction
from .divergences import Divergence, get_divergence

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
    softcap: Optional[float] = None,
    process_group=None,
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
        softcap: ``c > 0`` replaces the scores by ``c · tanh(x / c)`` first (logit
            soft-capping, as in Gemma 2: Gemma Team, "Gemma 2: Improving Open Language Models
            at a Practical Size", 2024, https://arxiv.org/abs/2408.00118); differentiable.
        process_group: a ``torch.distributed`` process group over which the classes are
            split: ``x`` holds this rank's contiguous slice along ``dim`` (vocabulary
            parallelism, :mod:`softargmax.distributed`).  A ``DTensor`` ``x`` sharded on
            ``dim`` needs no group.

    Returns:
        the loss (a scalar, or ``x``'s shape without ``dim`` for ``reduction="none"``), and
        the prediction if ``return_prediction``.
    """
    if softcap is not None:  # elementwise, so it applies to each rank's slice as well
        check_tensor(x)
        c = check_positive_number(softcap, "softcap")
        x = c * torch.tanh(x / c)
    if process_group is not None or type(x).__name__ == "DTensor":  # classes split over ranks
        from . import distributed

        return distributed.fenchel_young_loss(
            x, target, mapping, process_group=process_group, dim=dim, q=q, temperature=temperature,
            multilabel=multilabel, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
            weight=weight, return_prediction=return_prediction, **mapping_params)
    return one_process_loss(x, target, mapping, dim=dim, q=q, temperature=temperature, multilabel=multilabel,
                            ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                            weight=weight, return_prediction=return_prediction, **mapping_params)


_OPTIONS_DOC = """
    Options (keyword-only, as in :func:`fenchel_young_loss`): ``dim`` (the class dimension,
    default ``-1``), ``multilabel``, ``ignore_index``, ``reduction``, ``label_smoothing``,
    ``weight``, ``return_prediction``, ``softcap``, ``process_group``."""


def sparsemax_loss(x: Tensor, target: Tensor, *, dim: int = -1, multilabel: bool = False, ignore_index: int = -100,
                   reduction: str = "mean", label_smoothing: float = 0.0, weight: Optional[Tensor] = None,
                   return_prediction: bool = False, softcap: Optional[float] = None, process_group=None):
    """The sparsemax loss (``004_…`` eq. 26; the chi-square f-divergence loss)."""
    return fenchel_young_loss(x, target, "sparsemax", dim=dim, multilabel=multilabel, ignore_index=ignore_index,
                              reduction=reduction, label_smoothing=label_smoothing, weight=weight,
                              return_prediction=return_prediction, softcap=softcap, process_group=process_group)


def entmax15_loss(x: Tensor, target: Tensor, *, dim: int = -1, multilabel: bool = False, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, weight: Optional[Tensor] = None,
                  return_prediction: bool = False, softcap: Optional[float] = None, process_group=None):
    """The 1.5-entmax loss."""
    return fenchel_young_loss(x, target, "entmax15", dim=dim, multilabel=multilabel, ignore_index=ignore_index,
                              reduction=reduction, label_smoothing=label_smoothing, weight=weight,
                              return_prediction=return_prediction, softcap=softcap, process_group=process_group)


def entmax_loss(x: Tensor, target: Tensor, alpha: float = 1.5, *, dim: int = -1, multilabel: bool = False,
                ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                weight: Optional[Tensor] = None, return_prediction: bool = False, softcap: Optional[float] = None,
                process_group=None):
    """The α-entmax loss for a float α > 0 (α = 1: cross-entropy)."""
    return fenchel_young_loss(x, target, "entmax", alpha=alpha, dim=dim, multilabel=multilabel,
                              ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                              weight=weight, return_prediction=return_prediction, softcap=softcap,
                              process_group=process_group)


def alpha_relu_loss(x: Tensor, target: Tensor, alpha: float = 1.5, tau: float = 0.0, *, dim: int = -1,
                    multilabel: bool = False, ignore_index: int = -100, reduction: str = "mean",
                    label_smoothing: float = 0.0, weight: Optional[Tensor] = None, return_prediction: bool = False,
                    softcap: Optional[float] = None, process_group=None):
    """The α-ReLU loss (DESIGN §2), ``τ`` in the entmax parametrization."""
    return fenchel_young_loss(x, target, "alpha_relu", alpha=alpha, tau=tau, dim=dim, multilabel=multilabel,
                              ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                              weight=weight, return_prediction=return_prediction, softcap=softcap,
                              process_group=process_group)


def f_divergence_loss(
    x: Tensor,
    target: Tensor,
    divergence: Union[str, Divergence] = "kl",
    q: Optional[Tensor] = None,
    temperature: float = 1.0,
    *,
    dim: int = -1,
    multilabel: bool = False,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    return_prediction: bool = False,
    softcap: Optional[float] = None,
    process_group=None,
    **params,
):
    """The loss generated by an f-divergence (``003_…`` §3); ``params``: the divergence's (``alpha=`` for ``"alpha"``)."""
    return fenchel_young_loss(x, target, divergence, q=q, temperature=temperature, dim=dim, multilabel=multilabel,
                              ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                              weight=weight, return_prediction=return_prediction, softcap=softcap,
                              process_group=process_group, **params)


for _loss in (sparsemax_loss, entmax15_loss, entmax_loss, alpha_relu_loss, f_divergence_loss):
    _loss.__doc__ += "\n" + _OPTIONS_DOC
del _loss


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
    check_reduction(reduction)
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
