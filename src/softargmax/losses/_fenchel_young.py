"""The loss of scores whose classes are all on this process, for any :class:`~softargmax.losses._rows.RowLoss`:
the body of :func:`softargmax.losses.fenchel_young_loss` once soft-capping and the distributed
cases are dispatched, and of the normmax and budget sparsemax losses (the vocabulary-parallel
loss of :mod:`softargmax.losses.distributed` uses it for DTensors whose classes are replicated).
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import check_dim, check_positive_number, check_tensor
from .._utils.rows import Rows
from .._utils.tracing import use_custom_ops
from ..divergences import Divergence
from ._options import LossOptions
from ._row_losses import resolve_loss
from ._rows import RowLoss
from ._targets import check_reduction, parse_target, reduce_loss

__all__ = ["one_process_loss", "row_loss", "prepare", "reduce_rows", "SavedGradientLoss"]


def one_process_loss(x: Tensor, target: Tensor, mapping: Union[str, Divergence], params: dict,
                     options: LossOptions):
    """:func:`softargmax.losses.fenchel_young_loss` for scores that hold every class (soft-capped
    first with ``options.softcap``)."""
    check_tensor(x)
    if options.softcap is not None:
        c = check_positive_number(options.softcap, "softcap")
        x = c * torch.tanh(x / c)
    dim = check_dim(x, options.dim)
    check_reduction(options.reduction)
    loss = resolve_loss(mapping, params)
    if use_custom_ops() and not options.return_prediction:
        spec = loss.operator_spec()
        if spec is not None:  # one opaque operator for the compiler (softargmax.losses._library_ops)
            o = options
            return torch.ops.softargmax.fenchel_young_loss(
                x, target, o.q, o.weight, *spec, float(o.temperature), dim, o.multilabel, o.ignore_index, o.reduction,
                float(o.label_smoothing))[0]
    return row_loss(x, target, dim, loss, options)


def row_loss(x: Tensor, target: Tensor, dim: int, loss: RowLoss, options: LossOptions):
    """The reduced ``loss`` of scores ``x`` (checked, ``dim`` normalized) against ``target``, and the
    prediction if ``options.return_prediction``."""
    rows, tgt, compute = prepare(x, target, dim, loss, options)
    return reduce_rows(x, dim, rows, tgt, compute, options.reduction, options.return_prediction)


def prepare(x: Tensor, target: Tensor, dim: int, loss: RowLoss, options: LossOptions):
    """``(rows, parsed target, compute)``; ``compute(theta)`` gives ``(loss, p, p - y)`` per row."""
    rows = Rows(x, dim)
    tgt = parse_target(target, x, rows, multilabel=options.multilabel, ignore_index=options.ignore_index,
                       label_smoothing=options.label_smoothing, weight=options.weight)
    bound = loss.bind(options.q, options.temperature, x, rows)
    return rows, tgt, lambda theta: bound.rows(theta, tgt)


def reduce_rows(x: Tensor, dim: int, rows: Rows, tgt, compute, reduction: str, return_prediction: bool):
    """The reduced loss (and the prediction) from ``compute(theta) -> (loss, p, p - y)`` per row.

    The backward is ``p - y`` saved by the forward (:class:`SavedGradientLoss`); an empty batch
    gives what ``F.cross_entropy`` gives (0 for sum, NaN for mean, an empty tensor for none),
    with a graph.
    """
    if rows.R == 0 or rows.k == 0:
        per_row = x.sum(dim) * 0
        loss = reduce_loss(per_row.reshape(-1), tgt, reduction, tuple(rows.moved_shape[:-1]))
        return loss if not return_prediction else (loss, x.detach() * 0)
    kept = {}

    def compute_and_keep(theta):
        loss, p, G = compute(theta)
        kept["p"] = p
        return loss, p, G

    if x.requires_grad and torch.is_grad_enabled():
        per_row = SavedGradientLoss.apply(x, compute_and_keep, rows)
    else:
        per_row = compute_and_keep(rows.flat)[0].to(x.dtype)
    loss = reduce_loss(per_row, tgt, reduction, tuple(rows.moved_shape[:-1]))
    if not return_prediction:
        return loss
    return loss, rows.restore(kept["p"].detach())


class SavedGradientLoss(torch.autograd.Function):
    """Per-row loss values with the saved gradient ``G = p - y``: backward is ``G · grad``."""

    @staticmethod
    def forward(ctx, x: Tensor, compute, rows: Rows):
        loss, _, G = compute(rows.flat)
        ctx.save_for_backward(G)
        ctx.rows = rows
        return loss.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_rows: Tensor):
        (G,) = ctx.saved_tensors
        g = G * grad_rows.to(G.dtype).unsqueeze(1)
        return ctx.rows.restore(g), None, None
