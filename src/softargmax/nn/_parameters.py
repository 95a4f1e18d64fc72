"""How the modules hold their parameters: a learnable α kept in ``(lo, hi)`` through
``α = lo + (hi − lo) · sigmoid(w)`` (:func:`bounded`, and :func:`bounded_logit` its inverse),
initial values as tensors (:func:`initial_value`) and buffers placed on a device (:func:`placed`)."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

__all__ = ["bounded", "bounded_logit", "initial_value", "placed"]


def bounded_logit(a: Tensor, lo: float, hi: float) -> Tensor:
    """``w`` with ``lo + (hi - lo) sigmoid(w) = a`` (the inverse of :func:`bounded`)."""
    frac = (a - lo) / (hi - lo)
    return torch.log(frac) - torch.log1p(-frac)


def bounded(w: Tensor, lo: float, hi: float) -> Tensor:
    """The smooth reparametrization of a learnable α kept in ``(lo, hi)``."""
    return lo + (hi - lo) * torch.sigmoid(w)


def initial_value(value: Union[float, Tensor]) -> Tensor:
    """A detached copy of ``value`` (a number or tensor) as the module's initial parameter or buffer.

    Values are validated by the caller on this copy *before* :func:`placed` moves it: a
    ``device="meta"`` tensor has no values to check.  Without ``dtype`` a tensor keeps its
    floating dtype and a number takes the default dtype.
    """
    if isinstance(value, Tensor):
        t = value.detach().clone()
        return t if t.is_floating_point() else t.to(torch.get_default_dtype())
    return torch.tensor(float(value), dtype=torch.get_default_dtype())


def placed(t: Tensor, device: Union[str, torch.device, None] = None, dtype: Optional[torch.dtype] = None) -> Tensor:
    """``t`` on the module's ``device``/``dtype`` (the factory keywords of ``torch.nn`` modules), where given."""
    return t.to(device=device if device is not None else t.device, dtype=dtype if dtype is not None else t.dtype)
