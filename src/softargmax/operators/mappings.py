"""Mapping names shared by the losses, attention and experiments: one table from a name to its generator.

``"softmax"`` is the KL generator, ``"sparsemax"`` chi-square, ``"entmax15"`` the
α-divergence with α = 1.5, ``"entmax"`` (and ``"alpha"``) the α-divergence with the given
α; every divergence name of :mod:`softargmax.divergences` and any
:class:`~softargmax.divergences.Divergence` object are accepted as well.
"""

from __future__ import annotations

from typing import Union

from torch import Tensor

from .._utils.checks import check_alpha
from ..divergences import DIVERGENCE_NAMES, Divergence, get_divergence
from .budget import budget_sparsemax
from .entmax import entmax
from .fdiv import f_softargmax
from .normmax import normmax

__all__ = ["MAPPING_NAMES", "EXTRA_MAPPING_NAMES", "check_mapping", "resolve", "normalize"]

MAPPING_NAMES = ("softmax", "sparsemax", "entmax15", "entmax") + DIVERGENCE_NAMES
#: mappings :func:`normalize` also accepts that are not f-softargmaxes (``alpha=`` is their parameter);
#: their losses are in :mod:`softargmax.losses.normmax_budget`
EXTRA_MAPPING_NAMES = ("normmax", "budget_sparsemax")


def check_mapping(mapping: object, name: str = "mapping") -> None:
    """``TypeError``/``ValueError`` naming the argument unless ``mapping`` is a name above or a :class:`Divergence`."""
    if isinstance(mapping, Divergence):
        return
    if not isinstance(mapping, str):
        raise TypeError(f"{name} must be a name or a Divergence, got {type(mapping).__name__}")
    if mapping not in MAPPING_NAMES and mapping != "alpha":
        raise ValueError(f"{name}: unknown name {mapping!r}; accepted: {', '.join(MAPPING_NAMES)} or a Divergence")


def resolve(mapping: Union[str, Divergence], alpha: Union[float, Tensor, None] = None) -> Divergence:
    """The generator of ``mapping`` (a name above or a :class:`Divergence`); ``alpha`` for ``"entmax"``/``"alpha"``
    (other mappings ignore it, once checked to be a valid α > 0)."""
    if isinstance(mapping, Divergence):
        return get_divergence(mapping) if alpha is None else get_divergence(mapping, alpha=alpha)
    check_mapping(mapping)
    if alpha is not None and mapping not in ("entmax", "alpha"):
        # not used by this mapping (a parametrized caller may pass one α for every mapping), but still a valid α
        check_alpha(alpha, "alpha", minimum=0.0, strict=True)
    if mapping == "softmax":
        return get_divergence("kl")
    if mapping == "sparsemax":
        return get_divergence("chi_square")
    if mapping == "entmax15":
        return get_divergence("alpha", alpha=1.5)
    if mapping in ("entmax", "alpha"):
        if alpha is None:
            raise ValueError(f"mapping={mapping!r} needs alpha= (a number)")
        if isinstance(alpha, Tensor):
            raise TypeError(f"mapping={mapping!r}: alpha must be a number here (a tensor alpha is for entmax)")
        if mapping == "entmax":
            check_alpha(alpha, "alpha", minimum=0.0, strict=True)
        return get_divergence("alpha", alpha=alpha)
    return get_divergence(mapping)


def normalize(x: Tensor, mapping: Union[str, Divergence] = "entmax15", alpha: Union[float, Tensor, None] = None,
              dim: int = -1) -> Tensor:
    """``mapping`` applied to ``x`` along ``dim``; ``"entmax"``/``"alpha"`` also take a per-row tensor ``alpha``
    (with unit reference measure the α-divergence softargmax *is* α-entmax).  ``"normmax"`` and
    ``"budget_sparsemax"`` take their α / budget as ``alpha`` (default 2)."""
    if mapping in ("entmax", "alpha") and isinstance(alpha, Tensor):
        return entmax(x, alpha, dim)
    if mapping in EXTRA_MAPPING_NAMES:  # their parameter: α of normmax, the budget of budget_sparsemax
        fn = normmax if mapping == "normmax" else budget_sparsemax
        return fn(x, 2.0 if alpha is None else alpha, dim)
    return f_softargmax(x, resolve(mapping, alpha), dim=dim)
