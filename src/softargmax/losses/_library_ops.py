r"""The Fenchel–Young losses as one ``torch.library`` custom operator, for ``torch.compile``.

While ``torch.compile`` traces, :func:`softargmax.losses.fenchel_young_loss` (and the named
losses built on it) calls ``softargmax::fenchel_young_loss`` instead of running its body:
the target checks and the solver read tensor values, which a tracer cannot follow.  The
operator returns the reduced loss and its gradient with respect to the scores, in the
compute dtype (``p - y`` scaled by the item weights and the reduction, from the same pass,
as in eager mode); its autograd formula multiplies that by the incoming gradient.  Values
equal eager's; gradients equal them up to the rounding of one multiplication (eager rounds
the per-row factor to the input dtype first).

A user's generator (a :class:`~softargmax.divergences.CustomDivergence`, a subclass of
:class:`~softargmax.divergences.Divergence`) crosses by its name in this process
(:mod:`softargmax.operators._carried`).  Not covered (these stay eager, so ``fullgraph=True`` fails on
them): ``return_prediction``, a tensor ``tau`` for α-ReLU, one α per row given inside the divergence.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from .._utils.checks import compute_dtype
from .._utils.tracing import CUSTOM_OPS
from ..operators._carried import PREFIX, carried_divergence
from ..operators._library_ops import define
from ._fenchel_young import prepare
from ._options import LossOptions
from ._row_losses import resolve_loss
from ._rows import RowLoss
from ._targets import mean_scale, reduce_loss

__all__: list[str] = []


def _row_loss(mapping: str, param: float, tau: float) -> RowLoss:
    """The loss that :meth:`~softargmax.losses._rows.RowLoss.operator_spec` named."""
    if mapping == "alpha_relu":
        return resolve_loss("alpha_relu", {"alpha": param, "tau": tau})
    if mapping.startswith(PREFIX):  # a user's generator (softargmax.operators._carried)
        return resolve_loss(carried_divergence(mapping), {})
    return resolve_loss(mapping, {"alpha": param} if mapping == "alpha" else {})


def _fenchel_young_loss(x: Tensor, target: Tensor, q: Optional[Tensor], weight: Optional[Tensor], mapping: str,
                        param: float, tau: float, temperature: float, dim: int, multilabel: bool, ignore_index: int,
                        reduction: str, label_smoothing: float) -> tuple[Tensor, Tensor]:
    options = LossOptions(q=q, temperature=temperature, multilabel=multilabel, ignore_index=ignore_index,
                          reduction=reduction, label_smoothing=label_smoothing, weight=weight)
    rows, tgt, compute = prepare(x, target, dim, _row_loss(mapping, param, tau), options, f"the {mapping!r} loss")
    per_row, _, G = compute(rows.flat)
    per_row = per_row.to(x.dtype)
    loss = reduce_loss(per_row, tgt, reduction, tuple(rows.moved_shape[:-1]))
    # d loss / d per_row, as eager's autograd forms it: 1/denominator ("mean"), times the item weights
    w = tgt.item_weight
    scale = torch.ones_like(per_row)
    if reduction == "mean":
        scale = scale * mean_scale(tgt, per_row.dtype)  # 0 where no item is kept, as reduce_loss's gradient
    if w is not None:
        scale = scale * w
    # in the compute dtype, as the fake says (eager's G is in the input's dtype where the GPU kernels solve
    # half-precision rows as they are: the product with the float32 scale is float32 then)
    cdt = compute_dtype(x.dtype)
    grad = rows.restore(G * scale.to(cdt).unsqueeze(1), cdt)
    return loss.clone() if loss is per_row else loss, grad.contiguous()


def _fenchel_young_loss_fake(x: Tensor, target: Tensor, q: Optional[Tensor], weight: Optional[Tensor], mapping: str,
                             param: float, tau: float, temperature: float, dim: int, multilabel: bool, ignore_index: int,
                             reduction: str, label_smoothing: float) -> tuple[Tensor, Tensor]:
    dtype = x.dtype if weight is None else torch.promote_types(x.dtype, compute_dtype(x.dtype))
    if reduction == "none":
        shape = list(x.shape)
        del shape[dim]
        loss = x.new_empty(shape, dtype=dtype)
    else:
        loss = x.new_empty((), dtype=dtype)
    return loss, x.new_empty(x.shape, dtype=compute_dtype(x.dtype))


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[1])
    ctx.x_dtype = inputs[0].dtype
    ctx.dim = inputs[8]
    ctx.none = inputs[11] == "none"


def _backward(ctx: Any, grad_loss: Tensor, grad_grad: Tensor) -> tuple[Optional[Tensor], ...]:
    (g,) = ctx.saved_tensors
    upstream = grad_loss.unsqueeze(ctx.dim) if ctx.none else grad_loss
    return ((g * upstream.to(g.dtype)).to(ctx.x_dtype),) + (None,) * 12


OPERATORS = {"fenchel_young_loss": define("softargmax::fenchel_young_loss", _fenchel_young_loss,
                                          _fenchel_young_loss_fake, _backward, _setup)} if CUSTOM_OPS else {}
