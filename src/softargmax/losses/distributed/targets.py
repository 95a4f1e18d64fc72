"""This rank's part of the targets of a vocabulary-parallel loss: checked against its own arguments
first (:func:`local_target`, before the first round), then, once the slices are known, the
:class:`Plan` (global class indices, this rank's slice of soft targets and class weights)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .._targets import Target, sum_tolerance
from .agreement import Split, checksum, float_bits
from .collectives import all_reduce

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["Plan", "LocalTarget", "local_target", "target_fields", "make_plan", "item_weight_partial"]


@dataclass
class Plan:
    """What a rank knows about the split and its targets (rows ``[R, k_r]``)."""

    group: Optional[ProcessGroup]
    rank: int
    world: int
    sizes: list[int]
    offset: int
    K: int
    index: Optional[Tensor]  # [R] global class indices (ignored rows: 0) or None
    dense: Optional[Tensor]  # [R, k_r] this rank's slice of the target distributions
    keep: Tensor  # [R]
    weight: Optional[Tensor]  # [k_r] this rank's class weights
    check_sums: bool  # soft targets: validate Σ y = 1 after the final round
    smoothed_index: Optional[Tensor] = None  # hard labels before label smoothing (they weigh by weight[c])
    sum_tol: float = 0.0  # soft targets: how far from 1 a row sum may be (follows the target's dtype)

    def local_index(self, index: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
        """``(local index clamped into the slice, owned)`` for global indices ``index``."""
        loc = index - self.offset
        owned = keep & (loc >= 0) & (loc < self.sizes[self.rank])
        return torch.where(owned, loc, torch.zeros_like(loc)), owned

    def rows(self, rows: slice) -> Target:
        """The target of the rows ``rows`` as this rank sees it: its slice of the distributions, or the
        class indices in its own columns with ``owned`` (whether it holds the class)."""
        keep = self.keep[rows]
        if self.dense is not None:
            return Target(None, self.dense[rows], keep, None)
        assert self.index is not None  # hard labels
        loc, owned = self.local_index(self.index[rows], keep)
        return Target(loc, None, keep, None, owned=owned)


@dataclass
class LocalTarget:
    """A target checked against this rank's shapes (before the global number of classes is known)."""

    kind: int  # index into agreement.TARGET_KINDS
    index: Optional[Tensor]  # [R] class indices (int64), as given
    dense: Optional[Tensor]  # [R, k_r] rows: probability vectors or 0/1 label sets
    weight: Optional[Tensor]  # [k_r] or [K] class weights (detached, in the compute dtype)
    target_dtype: Optional[torch.dtype] = None  # soft targets: the dtype their row-sum tolerance follows


def local_target(target: object, local_shape: Sequence[int], rows_to: Callable[[Tensor], Tensor], R: int,
                 dtype: torch.dtype, *, multilabel: bool, label_smoothing: object, weight: object,
                 batch_shape: Sequence[int]) -> LocalTarget:
    """The checks of the target and the class weights that need only this rank's arguments."""
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if weight is not None:
        if not isinstance(weight, Tensor) or not weight.is_floating_point() or weight.dim() != 1:
            raise ValueError(f"weight must be a floating tensor of shape (k,) (this rank's classes) or (K,) (all classes), "
                             f"got {type(weight).__name__ if not isinstance(weight, Tensor) else tuple(weight.shape)}")
        weight = weight.detach().to(dtype)  # (its sign is checked in the first round: target_fields)
    if multilabel:
        if tuple(target.shape) != tuple(local_shape):
            raise ValueError(f"target: with multilabel=True it must have the local input's shape {tuple(local_shape)}, got {tuple(target.shape)}")
        t = rows_to(target.to(dtype))
        if bool(((t != 0) & (t != 1)).any()):
            raise ValueError("target: a multi-hot label set must contain only 0 and 1")
        return LocalTarget(3, None, t, weight)  # divided by the global counts in make_plan
    if not target.is_floating_point():
        if target.dtype == torch.bool or target.is_complex():
            raise TypeError(f"target: class indices must be an integer tensor, got {target.dtype}")
        if tuple(target.shape) != tuple(batch_shape):
            raise ValueError(f"target: class indices must have the input's shape without dim, {tuple(batch_shape)}, got {tuple(target.shape)}")
        return LocalTarget(1, target.reshape(R).to(torch.long), None, weight)
    if tuple(target.shape) != tuple(local_shape):
        raise ValueError(f"target: probability vectors must have the local input's shape {tuple(local_shape)} "
                         f"(this rank's slice of the classes), got {tuple(target.shape)}")
    y = rows_to(target)
    if bool((y < 0).any()):
        raise ValueError("target: probability vectors must be non-negative")
    return LocalTarget(2, None, y, weight, target.dtype)


def target_fields(local: LocalTarget, ignore_index: int,
                  label_smoothing: float) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """What :func:`~.agreement.agree` compares and checks of the target: ``(fields, tensors)``; the tensors are
    computed on the device and read with the round's table (no synchronization of their own): the checksum of the
    class indices, their smallest and largest kept entry (``0`` and ``-1`` with none kept), and whether a class
    weight is negative, infinite or NaN."""
    fields = {"target": local.kind, "ignore_index": int(ignore_index), "label_smoothing": float_bits(label_smoothing),
              "weight": local.weight is not None, "weight_len": 0 if local.weight is None else local.weight.shape[0]}
    tensors: dict[str, Tensor] = {}
    if local.weight is not None and local.weight.numel():
        w = local.weight
        tensors["weight_bad"] = ~((w >= 0) & torch.isfinite(w)).all()  # as the one-process losses refuse
    if local.index is not None:
        idx = local.index
        tensors["indices"] = checksum(idx)
        if idx.numel():
            keep = idx != ignore_index
            tensors["index_low"] = torch.where(keep, idx, 0).amin()
            tensors["index_high"] = torch.where(keep, idx, -1).amax()
        else:
            fields["index_high"] = -1
    return fields, tensors


def make_plan(local: LocalTarget, R: int, k: int, dtype: torch.dtype, device: torch.device, split: Split,
              group: Optional[ProcessGroup], rank: int, world: int, *, ignore_index: int, label_smoothing: float) -> Plan:
    """This rank's part of the target, once the slices are known (:func:`~.agreement.agree` checked them)."""
    sizes, K, offset = split.sizes, split.K, split.offsets[rank]
    weight = local.weight
    if weight is not None and weight.shape[0] != k:
        weight = weight[offset:offset + k]
    index = None
    dense = local.dense
    keep = torch.ones(R, dtype=torch.bool, device=device)
    if local.index is not None:
        idx = local.index
        keep = idx != ignore_index
        # the smallest and largest kept index came with the first round's table (target_fields): checked on the
        # host without a synchronization of its own, the same on every rank, before any other collective
        assert split.index_range is not None  # agree() reads it for class-index targets
        low, high = split.index_range
        if low < 0 or high >= K:
            raise ValueError(f"target: class index {low if low < 0 else high} is out of range [0, {K}) "
                             f"(ignore_index={ignore_index})")
        index = torch.where(keep, idx, torch.zeros_like(idx))
    plan = Plan(group, rank, world, sizes, offset, K, index, dense, keep, weight, local.kind == 2)
    if local.kind == 2:
        assert local.target_dtype is not None  # soft targets keep their dtype
        plan.sum_tol = sum_tolerance(K, local.target_dtype)
    if local.kind == 3:
        assert dense is not None  # label sets
        counts = all_reduce(dense.sum(-1).contiguous(), dist.ReduceOp.SUM, group, "sum")
        if bool((counts == 0).any()):
            raise ValueError("target: every multi-hot row needs at least one active label (found a row with none)")
        plan.dense = dense / counts.unsqueeze(1)
    if label_smoothing > 0:
        eps_ = float(label_smoothing)
        if plan.dense is not None:
            base = plan.dense
        else:
            base = torch.zeros(R, k, dtype=dtype, device=device)
            assert index is not None  # hard labels
            loc, owned = plan.local_index(index, keep)
            base.scatter_(1, loc.unsqueeze(1), owned.to(dtype).unsqueeze(1))
        d = (1 - eps_) * base + eps_ / K
        plan.dense = torch.where(keep.unsqueeze(1), d, torch.zeros_like(d))
        plan.index = None
        plan.check_sums = False
        plan.smoothed_index = index
    return plan


def item_weight_partial(plan: Plan, rows: slice) -> Optional[Tensor]:
    """This rank's part of ``⟨weight, y⟩`` (``weight[c]`` for hard labels, smoothed or not)."""
    if plan.weight is None:
        return None
    hard = plan.index if plan.index is not None else plan.smoothed_index
    if hard is not None:
        keep = plan.keep[rows]
        loc, owned = plan.local_index(hard[rows], keep)
        if plan.weight.shape[0] == 0:
            return torch.zeros(loc.shape[0], dtype=plan.weight.dtype, device=loc.device)
        return torch.where(owned, plan.weight[loc], torch.zeros_like(loc, dtype=plan.weight.dtype))
    assert plan.dense is not None  # soft targets
    return plan.dense[rows] @ plan.weight
