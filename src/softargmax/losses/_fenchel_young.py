"""The loss of scores whose classes are all on this process, for any :class:`~softargmax.losses._rows.RowLoss`:
the body of :func:`softargmax.losses.fenchel_young_loss` once soft-capping and the distributed
cases are dispatched, and of the normmax and budget sparsemax losses (the vocabulary-parallel
loss of :mod:`softargmax.losses.distributed` uses it for DTensors whose classes are replicated).
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import check_dim, check_positive_number, check_tensor, compute_dtype
from .._utils.rows import Rows
from .._utils.tracing import use_custom_ops
from ..backends import kernel_device, scale_loss_gradient
from ..divergences import Divergence
from ._options import LossOptions, LossOutput
from ._row_losses import resolve_loss
from ._rows import RowLoss, RowsCompute
from ._targets import Target, check_reduction, parse_target, reduce_loss

__all__ = ["one_process_loss", "row_loss", "prepare", "reduce_rows", "SavedGradientLoss"]


def one_process_loss(x: Tensor, target: Tensor, mapping: Union[str, Divergence], params: dict[str, Any],
                     options: LossOptions) -> LossOutput:
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
    return row_loss(x, target, dim, loss, options, call_name(mapping, params))


def call_name(mapping: Union[str, Divergence], params: dict[str, Any]) -> str:
    """The public call of the loss of ``mapping`` with ``params``, as the messages name it: ``"entmax15_loss"``,
    ``"entmax_loss(alpha=1.3)"``, ``"the 'jensen_shannon' loss"``."""
    if mapping in ("sparsemax", "entmax15"):
        return f"{mapping}_loss"
    shown = ", ".join(f"{k}={v}" for k, v in params.items() if type(v) in (float, int))  # (no tensor formatted)
    if mapping in ("entmax", "alpha_relu"):
        return f"{mapping}_loss({shown})"
    name = mapping if isinstance(mapping, str) else type(mapping).__name__
    return f"the {name!r} loss{' (' + shown + ')' if shown else ''}"


def row_loss(x: Tensor, target: Tensor, dim: int, loss: RowLoss, options: LossOptions,
             caller: Optional[str] = None) -> LossOutput:
    """The reduced ``loss`` of scores ``x`` (checked, ``dim`` normalized) against ``target``, and the
    prediction if ``options.return_prediction``; ``caller`` names the public call in the messages."""
    rows, tgt, compute = prepare(x, target, dim, loss, options, caller)
    return reduce_rows(x, dim, rows, tgt, compute, options.reduction, options.return_prediction)


def prepare(x: Tensor, target: Tensor, dim: int, loss: RowLoss, options: LossOptions,
            caller: Optional[str] = None) -> tuple[Rows, Target, RowsCompute]:
    """``(rows, parsed target, compute)``; ``compute(theta, inplace=False)`` gives ``(loss, p, p - y)``
    per row (with ``inplace``, ``p - y`` is written over ``p``).  ``caller`` names the public call in the
    messages (default: the loss's name).

    Half-precision scores that the GPU kernels solve as they are (:meth:`RowLoss.solves_in_dtype`)
    stay in their dtype: ``p`` and ``p - y`` are then half-precision tensors and only the per-row
    values are float32.  Otherwise the rows are computed in the compute dtype (float32 for half
    inputs), as the PyTorch and CPU solvers need.  The target is parsed in the compute dtype either way.
    """
    native = x.dtype != compute_dtype(x.dtype) and kernel_device(x)
    rows = Rows(x, dim, dtype=x.dtype) if native else Rows(x, dim)
    layout = _in_compute_dtype(rows)
    tgt = parse_target(target, x, layout, multilabel=options.multilabel, ignore_index=options.ignore_index,
                       label_smoothing=options.label_smoothing, weight=options.weight,
                       caller=caller if caller is not None else f"the {loss.name!r} loss")
    bound = loss.bind(options.q, options.temperature, x, layout)
    if native and not (rows.R and rows.k and bound.solves_in_dtype(rows.flat, options.return_prediction)):
        rows = Rows(x, dim)  # the PyTorch path: float32 rows
    return rows, tgt, lambda theta, inplace=False: bound.rows(theta, tgt, inplace=inplace)


def _in_compute_dtype(rows: Rows) -> Rows:
    """``rows``'s layout with the compute dtype (for the target and the class parameters; ``flat`` unchanged)."""
    cdt = compute_dtype(rows.in_dtype)
    if rows.dtype == cdt:
        return rows
    layout = copy.copy(rows)
    layout.dtype = cdt
    return layout


def reduce_rows(x: Tensor, dim: int, rows: Rows, tgt: Target, compute: RowsCompute, reduction: str,
                return_prediction: bool) -> LossOutput:
    """The reduced loss (and the prediction) from ``compute(theta, inplace) -> (loss, p, p - y)`` per row.

    The backward is ``p - y`` saved by the forward (:class:`SavedGradientLoss`), written over ``p``
    unless the prediction is returned; an empty batch gives what ``F.cross_entropy`` gives (0 for
    sum, NaN for mean, an empty tensor for none), with a graph.
    """
    if rows.R == 0 or rows.k == 0:
        per_row = x.sum(dim) * 0
        loss = reduce_loss(per_row.reshape(-1), tgt, reduction, tuple(rows.moved_shape[:-1]))
        return loss if not return_prediction else (loss, x.detach() * 0)
    kept: dict[str, Tensor] = {}

    def compute_and_keep(theta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        loss, p, G = compute(theta, inplace=not return_prediction)
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


def _keeps_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``): then saved tensors must not be
    overwritten.  ``True`` where torch cannot tell."""
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if query is None else bool(query())


class SavedGradientLoss(torch.autograd.Function):
    """Per-row loss values with the saved gradient ``G = p - y``: backward is ``G · grad``.

    ``G`` is the forward's own buffer (in the solver's dtype: the input's on the half-precision GPU
    path), never a tensor the caller holds, so the backward scales it in place and hands it on
    (one pass, no allocation) unless the graph is kept for another backward (``retain_graph=True``),
    where it multiplies out of place.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, compute: RowsCompute, rows: Rows) -> Tensor:
        loss, _, G = compute(rows.flat)
        ctx.save_for_backward(G)
        ctx.rows = rows
        return loss.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_rows: Tensor) -> tuple[Tensor, None, None]:
        (G,) = ctx.saved_tensors
        in_place = not _keeps_graph()
        # the GPU kernel: one pass over G, whatever grad_rows's dtype and stride (the mean's gradient is
        # an expanded scalar); PyTorch would take its mixed-dtype broadcast path for half G
        g = scale_loss_gradient(G, grad_rows, out=G if in_place else None)
        if g is None:
            scale = grad_rows.to(compute_dtype(G.dtype)).unsqueeze(1)  # float32 for half G: one rounding
            g = G.mul_(scale) if in_place else torch.mul(G, scale, out=torch.empty_like(G))
        return ctx.rows.restore(g), None, None
