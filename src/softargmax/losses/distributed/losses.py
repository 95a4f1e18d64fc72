"""The vocabulary-parallel losses themselves: the first round, the target plan, the threshold solve
and the last round around any :class:`~softargmax.losses._rows.RowLoss` (its
:meth:`~softargmax.losses._rows.RowLoss.split_rows`), unfused and fused with the output layer."""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..._utils.checks import check_dim, check_positive_number, check_tensor, compute_dtype
from ..._utils.rows import MetaRows, Rows
from ...divergences import Divergence
from ...operators._dtensor import is_dtensor
from .._fenchel_young import SavedGradientLoss
from .._linear_chunks import LinearFY, check_chunking, check_linear_arguments, chunk_tokens, target_rows
from .._options import LossOptions
from .._row_losses import resolve_loss
from .._targets import Target, check_reduction, mean_denominator, reduce_loss
from .agreement import agree, call_fields, float_bits
from .collectives import all_reduce, group_info
from .dtensor import dtensor_loss
from .solver import threshold_solver
from .targets import Plan, item_weight_partial, local_target, make_plan, target_fields

__all__ = ["fenchel_young_loss", "linear_fenchel_young_loss", "vocab_parallel_loss", "linear_vocab_parallel_loss"]


def fenchel_young_loss(
    x: Tensor,
    target: Tensor,
    mapping: Union[str, Divergence] = "entmax15",
    *,
    process_group=None,
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
    class_offset: Optional[int] = None,
    **mapping_params,
):
    r""":func:`softargmax.losses.fenchel_young_loss` with the classes split over ``process_group``.

    ``x`` holds this rank's contiguous slice of the classes along ``dim`` (rank order); it
    may also be a ``DTensor`` sharded on ``dim`` (then ``process_group`` is taken from its
    mesh and the result is a replicated ``DTensor``).  The value, identical on every rank,
    and the gradient (this rank's slice of ``p - y``) equal those of the unsplit loss.
    ``return_prediction`` returns this rank's slice of the prediction.  ``softcap`` caps the
    local scores first, as in the unsplit loss.  ``class_offset``: the global index of this
    rank's first class, if the caller wants it checked (then on every rank): the slices must
    be contiguous in rank order and cover ``[0, K)``.  The first round checks that the ranks
    agree on the call (module docstring) and raises the same ``ValueError`` on every rank
    where they do not.  See the module docstring for targets, weights and the communication.
    """
    return vocab_parallel_loss(x, target, mapping, mapping_params, LossOptions.of(locals()))


def vocab_parallel_loss(x: Tensor, target: Tensor, mapping: Union[str, Divergence], params: dict,
                        options: LossOptions):
    """:func:`fenchel_young_loss` with its options gathered."""
    if is_dtensor(x):
        if options.class_offset is not None:
            raise ValueError("class_offset: not accepted with a DTensor x (the slices are the mesh's)")
        return dtensor_loss(x, target, mapping, params, options, vocab_parallel_loss)
    group, rank, world = group_info(options.process_group)
    fields, tensors, error = {}, {}, None
    try:  # this rank's own checks: their failure is reported to the others in the first round
        x, rows, loss, local = _checked(x, target, mapping, params, options, fields, tensors)
    except (ValueError, TypeError) as e:
        error = e
    split = agree(group, rank, world, x.device if isinstance(x, Tensor) else torch.device("cpu"), error, fields,
                  tensors)
    R = rows.R
    plan = make_plan(local, R, rows.k, rows.dtype, x.device, split, group, rank, world,
                     ignore_index=options.ignore_index, label_smoothing=options.label_smoothing)
    solve = threshold_solver(split, group)
    everything = slice(0, R)
    kept: dict = {}

    def compute(theta):
        partial, p, G, bad, correction = loss.split_rows(theta, plan.rows(everything), solve)
        per_row, item_w = finish_rows(partial, plan, everything, bad, correction)
        kept["p"], kept["w"] = p, (None if item_w is None else item_w.to(rows.dtype))
        return per_row, p, G

    if x.requires_grad and torch.is_grad_enabled():
        per_row = SavedGradientLoss.apply(x, compute, rows)
    else:
        per_row = compute(rows.flat)[0].to(x.dtype)
    tgt = Target(index=None, dense=None, keep=plan.keep, item_weight=kept["w"])
    value = reduce_loss(per_row, tgt, options.reduction, tuple(rows.moved_shape[:-1]))
    if not options.return_prediction:
        return value
    return value, rows.restore(kept["p"].detach())


def _checked(x, target, mapping, params, options: LossOptions, fields: dict, tensors: dict):
    """This rank's own checks of a :func:`fenchel_young_loss` call; fills the first round's ``fields``
    and ``tensors``.  Returns ``(x soft-capped, rows, the loss, the local target)``."""
    check_tensor(x)
    if options.softcap is not None:
        c = check_positive_number(options.softcap, "softcap")
        x = c * torch.tanh(x / c)
        fields["softcap"] = float_bits(c)
    dim = check_dim(x, options.dim)
    check_reduction(options.reduction)
    rows = Rows(x, dim)
    loss = resolve_loss(mapping, params, rows.row_param).bind(options.q, options.temperature, x, rows)
    local = local_target(target, x.shape, rows.to_rows, rows.R, rows.dtype, multilabel=options.multilabel,
                         label_smoothing=options.label_smoothing, weight=options.weight,
                         batch_shape=rows.moved_shape[:-1])
    _fill(fields, tensors, call_fields(1, loss, options, rows.R, rows.k, rows.dtype),
          target_fields(local, options.ignore_index, options.label_smoothing))
    return x, rows, loss, local


def _fill(fields: dict, tensors: dict, *parts) -> None:
    for f, t in parts:
        fields.update(f)
        tensors.update(t)


def finish_rows(partial: Tensor, plan: Plan, rows: slice, bad_rows: Optional[Tensor],
                correction: Optional[Tensor] = None):
    """The last round: the global row losses (less ``correction``), the item weights and (soft
    targets) the target sums, which must be 1."""
    parts = [partial]
    w = item_weight_partial(plan, rows)
    if w is not None:
        parts.append(w)
    check = plan.check_sums
    if check:
        parts.append(plan.dense[rows].sum(-1))
    buf = all_reduce(torch.stack([t.to(partial.dtype) for t in parts]).contiguous(), dist.ReduceOp.SUM, plan.group,
                     "sum")
    loss = buf[0]
    if check:
        s = buf[-1]
        if bool(((s - 1).abs() > plan.sum_tol).any()):
            raise ValueError(f"target: probability vectors must sum to 1 along dim over all ranks "
                             f"(sums range over [{float(s.min()):.6g}, {float(s.max()):.6g}])")
    if bad_rows is not None:
        loss = loss.masked_fill(bad_rows.squeeze(1), math.nan)
    keep = plan.keep[rows]
    loss = torch.where(keep, loss, torch.zeros_like(loss))
    if correction is not None:
        loss = loss - correction
    return loss, (None if w is None else buf[1] * keep)


class _CopyToParallel(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over the group (a column-parallel layer's input)."""

    @staticmethod
    def forward(ctx, h, group):
        ctx.group = group
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        all_reduce(grad, dist.ReduceOp.SUM, ctx.group, "sum")
        return grad, None


def linear_fenchel_young_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor] = None,
    mapping: Union[str, Divergence] = "entmax15",
    chunk_size: Optional[int] = None,
    *,
    process_group=None,
    q: Optional[Tensor] = None,
    temperature: float = 1.0,
    multilabel: bool = False,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    class_weight: Optional[Tensor] = None,
    softcap: Optional[float] = None,
    memory_budget: Optional[int] = None,
    class_offset: Optional[int] = None,
    **mapping_params,
) -> Tensor:
    r""":func:`softargmax.losses.linear.linear_fenchel_young_loss` with ``weight`` ``[k_r, d]`` (and ``bias``
    ``[k_r]``) holding this rank's rows of the output projection.

    The chunks are those of one rank with the full vocabulary (default: as many tokens as
    ``memory_budget`` allows for ``K`` columns, ``K`` the global vocabulary), so no rank ever holds more
    than ``chunk × k_r`` logits.  The gradient of ``hidden`` is summed over the group in the
    backward (``hidden`` is replicated, as the input of a column-parallel linear layer); the
    gradients of ``weight`` and ``bias`` are this rank's rows.  Soft targets are this rank's
    slice ``[..., k_r]``; ``class_weight`` is ``[k_r]`` or ``[K]``.  ``class_offset`` and the
    first round's checks: as in :func:`fenchel_young_loss` (the ranks must also agree on
    ``chunk_size`` and ``memory_budget``, which set the chunks).
    """
    options = LossOptions.of(locals(), weight=class_weight)
    return linear_vocab_parallel_loss(hidden, weight, target, bias, mapping, mapping_params, options)


def linear_vocab_parallel_loss(hidden: Tensor, weight: Tensor, target, bias: Optional[Tensor],
                               mapping: Union[str, Divergence], params: dict, options: LossOptions) -> Tensor:
    """:func:`linear_fenchel_young_loss` with its options gathered (``options.weight``: the class weights)."""
    group, rank, world = group_info(options.process_group)
    fields, tensors, error = {}, {}, None
    try:  # this rank's own checks: their failure is reported to the others in the first round
        hidden2d, loss, local, budget = _checked_linear(hidden, weight, target, bias, mapping, params, options,
                                                        fields, tensors)
    except (ValueError, TypeError) as e:
        error = e
    device = hidden.device if isinstance(hidden, Tensor) else torch.device("cpu")
    split = agree(group, rank, world, device, error, fields, tensors)
    N, k = hidden2d.shape[0], weight.shape[0]
    cdt = compute_dtype(hidden.dtype)
    chunk_size = options.chunk_size  # default: the chunks of one rank with the whole vocabulary (K columns)
    if chunk_size is None:
        chunk_size = chunk_tokens(max(split.K, 1), hidden.dtype, budget, options.softcap is not None)
    plan = make_plan(local, N, k, cdt, hidden.device, split, group, rank, world, ignore_index=options.ignore_index,
                     label_smoothing=options.label_smoothing)
    tgt = Target(index=None, dense=None, keep=plan.keep, item_weight=_item_weights(plan, N))
    plan.weight = None  # item weights are known: the chunks' final rounds carry only the losses
    solve = threshold_solver(split, group)
    cursor = [0]  # the fused loop of softargmax.losses.linear visits the chunks in order

    def compute(logits, part):
        rows = slice(cursor[0], cursor[0] + logits.shape[0])
        cursor[0] = rows.stop
        partial, _, G, bad, correction = loss.split_rows(logits, plan.rows(rows), solve)
        return finish_rows(partial, plan, rows, bad, correction)[0].to(cdt), None, G

    h = _CopyToParallel.apply(hidden2d, group) if hidden2d.requires_grad else hidden2d
    softcap = None if options.softcap is None else float(options.softcap)
    return LinearFY.apply(h, weight, bias, compute, tgt, mean_denominator(tgt, options.reduction), chunk_size, softcap)


def _checked_linear(hidden, weight, target, bias, mapping, params, options: LossOptions, fields: dict, tensors: dict):
    """This rank's own checks of a :func:`linear_fenchel_young_loss` call; fills the first round's
    ``fields`` and ``tensors``.  Returns ``(hidden as [N, d], the loss, the local target, the memory budget)``."""
    check_linear_arguments(hidden, weight, bias, options.reduction, "vocab slice")
    k, d = weight.shape
    cdt = compute_dtype(hidden.dtype)
    hidden2d = hidden.reshape(-1, d)
    N = hidden2d.shape[0]
    if options.softcap is not None:
        fields["softcap"] = float_bits(check_positive_number(options.softcap, "softcap"))
    budget = check_chunking(options.chunk_size, options.memory_budget)
    local = local_target(target_rows(target, hidden, k, options.multilabel), (N, k),
                         lambda t: t.reshape(N, k).to(cdt), N, cdt, multilabel=options.multilabel,
                         label_smoothing=options.label_smoothing, weight=options.weight, batch_shape=(N,))
    like = torch.empty(N, k, device="meta")
    loss = resolve_loss(mapping, params).bind(options.q, options.temperature, like, MetaRows(N, k, cdt))
    _fill(fields, tensors, call_fields(2, loss, options, N, k, hidden.dtype),
          target_fields(local, options.ignore_index, options.label_smoothing),
          ({"chunk_size": options.chunk_size or 0, "memory_budget": budget}, {}))
    return hidden2d, loss, local, budget


def _item_weights(plan: Plan, N: int) -> Optional[Tensor]:
    """The item weights and the soft-target check over all rows: one ``SUM`` round before the chunks."""
    every = slice(0, N)
    parts = []
    w = item_weight_partial(plan, every)
    if w is not None:
        parts.append(w)
    if plan.check_sums:
        parts.append(plan.dense.sum(-1))
    if not parts:
        return None
    buf = all_reduce(torch.stack(parts).contiguous(), dist.ReduceOp.SUM, plan.group, "sum")
    if plan.check_sums:
        if bool(((buf[-1] - 1).abs() > plan.sum_tol).any()):
            raise ValueError("target: probability vectors must sum to 1 along dim over all ranks")
        plan.check_sums = False
    return None if w is None else buf[0] * plan.keep
