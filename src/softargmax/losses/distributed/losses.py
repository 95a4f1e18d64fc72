"""The vocabulary-parallel losses themselves: the first round, the target plan, the threshold solve
and the last round around any :class:`~softargmax.losses._rows.RowLoss` (its
:meth:`~softargmax.losses._rows.RowLoss.split_rows`), unfused and fused with the output layer."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..._utils.checks import check_dim, check_positive_number, check_tensor, compute_dtype
from ..._utils.rows import MetaRows, Rows
from ...divergences import Divergence
from ...operators._dtensor import is_dtensor
from .._fenchel_young import SavedGradientLoss
from .._linear_chunks import (
    LinearFY,
    check_chunking,
    check_linear_arguments,
    chunk_tokens,
    projection_arguments,
    skips_zero_tiles,
    target_rows,
)
from .._options import LossOptions, LossOutput
from .._row_losses import resolve_loss
from .._rows import RowLoss
from .._targets import Target, check_reduction, mean_denominator_tensor, reduce_loss
from .agreement import agree, call_fields, float_bits
from .collectives import all_reduce, group_info
from .dtensor import dtensor_loss
from .solver import threshold_solver
from .targets import LocalTarget, Plan, item_weight_partial, local_target, make_plan, target_fields

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["fenchel_young_loss", "linear_fenchel_young_loss", "vocab_parallel_loss", "linear_vocab_parallel_loss"]


def fenchel_young_loss(
    x: Tensor,
    target: Tensor,
    mapping: Union[str, Divergence] = "entmax15",
    *,
    process_group: Optional[ProcessGroup] = None,
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
    **mapping_params: Any,
) -> LossOutput:
    r""":func:`softargmax.losses.fenchel_young_loss` with the classes split over the ranks of ``process_group``.

    .. math::

        \ell(\theta, y) = \sum_r \Big(\langle \theta_r, p_r - y_r\rangle
        + \beta \sum_{j \in \text{slice } r} q_j \big[f(y_j / q_j) - f(p_j / q_j)\big]\Big),
        \qquad \nabla_{\theta_r} \ell = p_r - y_r,

    with :math:`\theta_r, p_r, y_r` rank :math:`r`'s slices of the scores, the prediction and the
    target, and the prediction's threshold :math:`\tau` found from all-reduced partial sums (module
    docstring): the value, identical on every rank, and the gradient (this rank's slice of
    :math:`p - y`) equal those of the unsplit loss, and the logits are never gathered.  The first
    round checks that the ranks agree on the call and raises the same ``ValueError`` on every rank
    where they do not.

    Args:
        x: this rank's contiguous slice of the classes along ``dim`` (in rank order), or a
            ``DTensor`` sharded on ``dim`` (then its mesh gives the group and the result is a
            replicated ``DTensor``).
        target: global class indices (the same on every rank), this rank's slice of probability
            vectors, or (``multilabel=True``) this rank's slice of 0/1 label sets.
        mapping: as in :func:`softargmax.losses.fenchel_young_loss` (with ``"entmax"``, ``alpha=``
            may also be a per-row tensor, a constant here). Default: ``"entmax15"``.
        process_group: the ``torch.distributed`` group over which the classes are split.
            Default: ``None`` (the default group).
        dim, q, temperature, multilabel, ignore_index, reduction, label_smoothing, \*\*mapping_params:
            as in :func:`softargmax.losses.fenchel_young_loss` (``q``: this rank's slice).
        weight: per-class weights, this rank's slice :math:`(k_r)` or all :math:`(K)`. Default: ``None``.
        return_prediction: also return this rank's slice of the prediction (detached). Default: ``False``.
        softcap: :math:`c > 0` caps the local scores as :math:`c \tanh(x / c)` first, as in the
            unsplit loss. Default: ``None``.
        class_offset: the global index of this rank's first class, checked (give it on every rank
            or on none): the slices must be contiguous in rank order and cover :math:`[0, K)`.
            Default: ``None``.

    Returns:
        the loss, identical on every rank (a scalar, or the rows' shape for ``reduction="none"``),
        and with ``return_prediction`` this rank's slice of the prediction.

    Shape:
        - x: :math:`(*, k_r, *)`, this rank's :math:`k_r` classes along ``dim``.
        - target: class indices of ``x``'s shape without ``dim``, or this rank's slice of
          probabilities or label sets (``x``'s shape).
        - Output: :math:`()` for ``"mean"`` and ``"sum"``; ``x``'s shape without ``dim`` for ``"none"``.

    Examples:
        One process is a group of one (under ``torchrun``, every rank runs the same lines with its
        own slice; the distributed guide has a two-process example):

        >>> import torch, torch.distributed as dist, softargmax as sa
        >>> from softargmax.losses import distributed
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> x = torch.tensor([[1.0, 0.5, -1.0], [0.2, 0.1, 3.0]], requires_grad=True)
        >>> y = torch.tensor([0, 2])
        >>> loss = distributed.fenchel_young_loss(x, y, "entmax15")
        >>> torch.allclose(loss, sa.entmax15_loss(x, y))  # the unsplit loss
        True
        >>> loss.backward()
        >>> torch.allclose(x.grad, (sa.entmax15(x) - torch.eye(3)[y]) / 2)  # (p - y) / rows
        True
        >>> dist.destroy_process_group()

    References:
        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324

        Mohammad Shoeybi, Mostofa Patwary, Raul Puri, Patrick LeGresley, Jared Casper and Bryan
        Catanzaro, *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
        Parallelism*, 2019, https://arxiv.org/abs/1909.08053
    """
    options = LossOptions(dim=dim, q=q, temperature=temperature, multilabel=multilabel, ignore_index=ignore_index,
                          reduction=reduction, label_smoothing=label_smoothing, weight=weight,
                          return_prediction=return_prediction, softcap=softcap, process_group=process_group,
                          class_offset=class_offset)
    return vocab_parallel_loss(x, target, mapping, mapping_params, options)


def vocab_parallel_loss(x: Tensor, target: Tensor, mapping: Union[str, Divergence], params: dict[str, Any],
                        options: LossOptions) -> LossOutput:
    """:func:`fenchel_young_loss` with its options gathered."""
    if is_dtensor(x):
        if options.class_offset is not None:
            raise ValueError("class_offset: not accepted with a DTensor x (the slices are the mesh's)")
        return dtensor_loss(x, target, mapping, params, options, vocab_parallel_loss)
    group, rank, world = group_info(options.process_group)
    fields: dict[str, Any] = {}
    tensors: dict[str, Tensor] = {}
    error: Optional[Exception] = None
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
    kept: dict[str, Any] = {}

    def compute(theta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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


def _checked(x: Tensor, target: Tensor, mapping: Union[str, Divergence], params: dict[str, Any], options: LossOptions,
             fields: dict[str, Any], tensors: dict[str, Tensor]) -> tuple[Tensor, Rows, RowLoss, LocalTarget]:
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


def _fill(fields: dict[str, Any], tensors: dict[str, Tensor], *parts: tuple[dict[str, Any], dict[str, Tensor]]) -> None:
    for f, t in parts:
        fields.update(f)
        tensors.update(t)


def finish_rows(partial: Tensor, plan: Plan, rows: slice, bad_rows: Optional[Tensor],
                correction: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """The last round: the global row losses (less ``correction``), the item weights and (soft
    targets) the target sums, which must be 1."""
    parts = [partial]
    w = item_weight_partial(plan, rows)
    if w is not None:
        parts.append(w)
    check = plan.check_sums
    if check:
        assert plan.dense is not None  # soft targets
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
    def forward(ctx: Any, h: Tensor, group: Optional[ProcessGroup]) -> Tensor:
        ctx.group = group
        return h.view_as(h)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous().clone()
        all_reduce(grad, dist.ReduceOp.SUM, ctx.group, "sum")
        return grad, None


def linear_fenchel_young_loss(
    hidden: Tensor,
    weight: Optional[Tensor] = None,
    target: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    mapping: Union[str, Divergence] = "entmax15",
    chunk_size: Optional[int] = None,
    *,
    linear_weight: Optional[Tensor] = None,
    linear_bias: Optional[Tensor] = None,
    process_group: Optional[ProcessGroup] = None,
    q: Optional[Tensor] = None,
    temperature: float = 1.0,
    multilabel: bool = False,
    ignore_index: Optional[int] = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    class_weight: Optional[Tensor] = None,
    softcap: Optional[float] = None,
    memory_budget: Optional[int] = None,
    class_offset: Optional[int] = None,
    **mapping_params: Any,
) -> Tensor:
    r"""The fused linear loss (:func:`softargmax.linear_fenchel_young_loss`) with the projection split by rank.

    .. math::

        \theta_r = W_r h + b_r, \qquad \nabla_{W_r} \ell = (p_r - y_r)\, h^\top, \qquad
        \nabla_h \ell = \sum_r W_r^\top (p_r - y_r),

    with :math:`W_r, b_r` this rank's :math:`k_r` rows of the projection: the loss of
    :func:`fenchel_young_loss` over the logits :math:`\theta_r`, computed chunk by chunk as the
    one-process fused loss does, so that no rank holds more than chunk :math:`\times k_r` logits.
    The gradient of ``hidden`` is summed over the group in the backward (``hidden`` is replicated,
    as the input of a column-parallel linear layer); those of ``weight`` and ``bias`` are this
    rank's rows.

    Args:
        hidden: the features, the same on every rank.
        weight: this rank's rows :math:`(k_r, d)` of the output projection; or give them as
            ``linear_weight``. Required under one of the two names (the default ``None`` is
            there for ``linear_weight``).
        target: global class indices, or this rank's slice of probability vectors or label sets.
            Required (its default ``None`` is there for the keyword call of ``linear_cross_entropy``).
        bias: this rank's :math:`(k_r)` entries of the bias, optional; or give them as ``linear_bias``.
            Default: ``None``.
        linear_weight, linear_bias: ``weight`` and ``bias`` under the names of
            ``torch.nn.functional.linear_cross_entropy``, as in
            :func:`softargmax.losses.linear.linear_fenchel_young_loss`. Default: ``None``.
        mapping: as in :func:`softargmax.losses.fenchel_young_loss`. Default: ``"entmax15"``.
        chunk_size: tokens per chunk. Default: ``None``, as many as ``memory_budget`` allows for
            :math:`K` columns (the chunks of one rank with the whole vocabulary).
        process_group: the group over which the rows are split. Default: ``None`` (the default group).
        q, temperature, multilabel, ignore_index, label_smoothing, memory_budget, \*\*mapping_params:
            as in :func:`softargmax.losses.linear.linear_fenchel_young_loss`.
        reduction: ``"mean"`` or ``"sum"`` (per-token losses need every class on one process).
            Default: ``"mean"``.
        class_weight: per-class weights, this rank's slice :math:`(k_r)` or all :math:`(K)`.
            Default: ``None``.
        softcap: as in :func:`fenchel_young_loss`. Default: ``None``.
        class_offset: as in :func:`fenchel_young_loss` (the ranks must also agree on
            ``chunk_size`` and ``memory_budget``, which set the chunks). Default: ``None``.

    Returns:
        the loss, a scalar identical on every rank.

    Shape:
        - hidden: :math:`(*, d)`.
        - weight: :math:`(k_r, d)`; bias: :math:`(k_r)`.
        - target: class indices :math:`(*)`, or this rank's slice of probabilities :math:`(*, k_r)`.
        - Output: :math:`()`.

    Examples:
        >>> import torch, torch.distributed as dist, softargmax as sa
        >>> from softargmax.losses import distributed
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> _ = torch.manual_seed(0)
        >>> hidden, weight = torch.randn(6, 4), torch.randn(10, 4)
        >>> y = torch.randint(0, 10, (6,))
        >>> loss = distributed.linear_fenchel_young_loss(hidden, weight, y, chunk_size=4)
        >>> torch.allclose(loss, sa.entmax15_loss(hidden @ weight.T, y))  # the materialized logits
        True
        >>> torch.equal(loss, distributed.linear_fenchel_young_loss(hidden, linear_weight=weight, target=y, chunk_size=4))
        True
        >>> dist.destroy_process_group()

    References:
        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324

        Mohammad Shoeybi, Mostofa Patwary, Raul Puri, Patrick LeGresley, Jared Casper and Bryan
        Catanzaro, *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
        Parallelism*, 2019, https://arxiv.org/abs/1909.08053
    """
    weight, bias, ignore_index = projection_arguments(weight, linear_weight, bias, linear_bias, ignore_index)
    if target is None:
        raise TypeError("target is required")
    options = LossOptions(q=q, temperature=temperature, multilabel=multilabel, ignore_index=ignore_index,
                          reduction=reduction, label_smoothing=label_smoothing, weight=class_weight, softcap=softcap,
                          process_group=process_group, class_offset=class_offset, chunk_size=chunk_size,
                          memory_budget=memory_budget)
    return linear_vocab_parallel_loss(hidden, weight, target, bias, mapping, mapping_params, options)


def linear_vocab_parallel_loss(hidden: Tensor, weight: Tensor, target: object, bias: Optional[Tensor],
                               mapping: Union[str, Divergence], params: dict[str, Any], options: LossOptions) -> Tensor:
    """:func:`linear_fenchel_young_loss` with its options gathered (``options.weight``: the class weights)."""
    group, rank, world = group_info(options.process_group)
    fields: dict[str, Any] = {}
    tensors: dict[str, Tensor] = {}
    error: Optional[Exception] = None
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

    def compute(logits: Tensor, part: Target) -> tuple[Tensor, None, Tensor]:
        rows = slice(cursor[0], cursor[0] + logits.shape[0])
        cursor[0] = rows.stop
        partial, _, G, bad, correction = loss.split_rows(logits, plan.rows(rows), solve)
        return finish_rows(partial, plan, rows, bad, correction)[0].to(cdt), None, G

    h = _CopyToParallel.apply(hidden2d, group) if hidden2d.requires_grad else hidden2d
    softcap = None if options.softcap is None else float(options.softcap)
    # the mean's denominator stays on the device (NaN where no item is kept), as in the one-process fused loss
    return LinearFY.apply(h, weight, bias, compute, tgt, mean_denominator_tensor(tgt, options.reduction, cdt),
                          chunk_size, softcap,
                          None, skips_zero_tiles(loss, hidden2d, weight, tgt) and not options.label_smoothing)


def _checked_linear(hidden: Tensor, weight: Tensor, target: object, bias: Optional[Tensor],
                    mapping: Union[str, Divergence], params: dict[str, Any], options: LossOptions,
                    fields: dict[str, Any], tensors: dict[str, Tensor]) -> tuple[Tensor, RowLoss, LocalTarget, int]:
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
        assert plan.dense is not None  # soft targets
        parts.append(plan.dense.sum(-1))
    if not parts:
        return None
    buf = all_reduce(torch.stack(parts).contiguous(), dist.ReduceOp.SUM, plan.group, "sum")
    if plan.check_sums:
        if bool(((buf[-1] - 1).abs() > plan.sum_tol).any()):
            raise ValueError("target: probability vectors must sum to 1 along dim over all ranks")
        plan.check_sums = False
    return None if w is None else buf[0] * plan.keep
