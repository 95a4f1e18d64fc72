"""The Fenchel–Young loss of scores whose classes are all on this process: the body of
:func:`softargmax.losses.fenchel_young_loss` once soft-capping and the distributed cases are
dispatched (the vocabulary-parallel loss of :mod:`softargmax.losses.distributed` uses it for
DTensors whose classes are replicated).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_dim, check_positive_number, check_q, check_tensor
from .._utils.rows import Rows
from .._utils.tracing import use_custom_ops
from ..divergences import Divergence
from ..operators._library_ops import divergence_spec
from ._rows import RowLoss, alpha_relu_rows, fy_rows, resolve_loss
from ._targets import check_reduction, parse_target, reduce_loss


def one_process_loss(
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
    **mapping_params,
):
    """:func:`softargmax.losses.fenchel_young_loss` for scores that hold every class (its arguments)."""
    check_tensor(x)
    dim = check_dim(x, dim)
    check_reduction(reduction)
    kind = resolve_loss(mapping, dict(mapping_params))
    if use_custom_ops() and not return_prediction:
        spec = operator_spec(kind)
        if spec is not None:  # one opaque operator for the compiler (softargmax.losses._library_ops)
            return torch.ops.softargmax.fenchel_young_loss(
                x, target, q, weight, *spec, float(temperature), dim, multilabel, ignore_index, reduction,
                float(label_smoothing))[0]
    rows, tgt, compute = prepare(x, target, kind, dim, q, temperature, multilabel, ignore_index, label_smoothing,
                                  weight)
    return reduce_rows(x, dim, rows, tgt, compute, reduction, return_prediction)


def reduce_rows(x: Tensor, dim: int, rows: Rows, tgt, compute, reduction: str, return_prediction: bool):
    """The reduced loss (and the prediction) from ``compute(theta) -> (loss, p, p - y)`` per row.

    The backward is ``p - y`` saved by the forward (:class:`~softargmax.losses._rows.RowLoss`);
    an empty batch gives what ``F.cross_entropy`` gives (0 for sum, NaN for mean, an empty
    tensor for none), with a graph.
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
        per_row = RowLoss.apply(x, compute_and_keep, rows)
    else:
        per_row = compute_and_keep(rows.flat)[0].to(x.dtype)
    loss = reduce_loss(per_row, tgt, reduction, tuple(rows.moved_shape[:-1]))
    if not return_prediction:
        return loss
    return loss, rows.restore(kept["p"].detach())


def operator_spec(kind):
    """``(mapping, parameter, tau)`` naming a resolved mapping to the loss operator, or ``None`` (stays eager)."""
    if kind[0] == "fy":
        spec = divergence_spec(kind[1])
        return None if spec is None else (spec[0], spec[1], 0.0)
    _, alpha, tau = kind
    return None if isinstance(tau, Tensor) else ("alpha_relu", float(alpha), float(tau))


def prepare(x: Tensor, target: Tensor, kind, dim: int, q, temperature, multilabel, ignore_index, label_smoothing,
             weight):
    """``(rows, parsed target, compute)`` of :func:`fenchel_young_loss`; ``compute(theta)`` gives ``(loss, p, p - y)`` per row."""
    rows = Rows(x, dim)
    tgt = parse_target(target, x, rows, multilabel=multilabel, ignore_index=ignore_index,
                       label_smoothing=label_smoothing, weight=weight)
    if kind[0] == "fy":
        beta = check_positive_number(temperature, "temperature")
        check_q(q, x)
        q2d = rows.class_param(q.detach()) if q is not None else None
        div = kind[1]
        compute = lambda theta: fy_rows(theta, tgt, div, beta, q2d)  # noqa: E731
    else:
        if q is not None or temperature != 1.0:
            raise ValueError("alpha_relu_loss takes no q or temperature")
        _, alpha, tau = kind
        if isinstance(tau, Tensor):
            if tau.numel() != 1:
                raise ValueError("alpha_relu_loss: tau must be a number or a one-element tensor")
            tau = float(tau)
        compute = lambda theta: alpha_relu_rows(theta, tgt, alpha, tau)  # noqa: E731
    return rows, tgt, compute
