r"""Loss targets, parsed once into rows, and the reductions (the conventions of ``torch.nn.functional.cross_entropy``).

Targets:

* class indices: an integer tensor of the scores' shape without ``dim``; entries equal to
  ``ignore_index`` are skipped (loss 0, no gradient, not counted by ``"mean"``);
* probability vectors: a floating tensor of the scores' shape, non-negative, summing to 1
  along ``dim`` (distillation, label proportions) within the rounding of the target's dtype
  (:func:`sum_tolerance`: bfloat16 and float16 targets are accepted as they come, and used as
  given); a NaN entry gives a NaN loss in its row;
* label sets with ``multilabel=True``: a 0/1 tensor of the scores' shape; the target is the
  uniform distribution over the active labels (Martins & Astudillo, 2016, §3.4).

``label_smoothing`` ε mixes the target with the uniform distribution,
``(1 - ε) y + ε/k``.  ``weight`` (per class, like ``cross_entropy``) scales each item
by ``⟨weight, y⟩`` (``weight[c]`` for a class index) and ``"mean"`` divides by the sum
of those item weights, so hard labels match ``cross_entropy`` exactly.  The weights must be
finite and non-negative; where no item is kept (every target is ``ignore_index``) or the kept
items' weights sum to zero, ``"mean"`` is NaN (0/0), as in ``cross_entropy``, and its gradient
is zero, also as in ``cross_entropy`` (a micro-batch of padding leaves the parameters finite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .._utils.rows import Rows
from .._utils.tracing import values_checkable
from .index_check import check_on_device, deferred

#: the reductions every loss accepts
REDUCTIONS = ("mean", "sum", "none")


@dataclass
class Target:
    """A parsed target, as rows ``[R, k]``.

    ``index``: ``[R]`` class indices (ignored rows hold 0) or ``None``;
    ``dense``: ``[R, k]`` target distributions or ``None``; ``keep``: ``[R]`` rows
    that count (not ignored); ``item_weight``: ``[R]`` or ``None``.
    """

    index: Optional[Tensor]
    dense: Optional[Tensor]
    keep: Tensor
    item_weight: Optional[Tensor]
    #: a teacher's top-k, kept sparse (:func:`top_k_target`): ``[R, k]`` indices and probabilities,
    #: ``[R]`` mass of each other class, and the number of classes
    topk_index: Optional[Tensor] = None
    topk_value: Optional[Tensor] = None
    rest: Optional[Tensor] = None
    classes: int = 0
    #: ``label_smoothing`` ε of class indices (``dense`` is then ``(1 - ε)`` one-hot ``+ ε/k`` in the kept rows):
    #: what lets the losses take ``Σ f(y_j)`` in closed form instead of over ``dense``
    smoothing: float = 0.0
    #: with the classes split over processes: ``[R]``, whether this process holds the row's class
    #: (``index`` is then its column here); ``None``: every class is here
    owned: Optional[Tensor] = None
    #: ``keep`` is known to be all true without reading it (distributions, label sets, a teacher's
    #: top-k): the loss paths then skip the masking pass of the ignored rows, with no device sync
    all_kept: bool = False

    def as_dense(self, k: int, dtype: torch.dtype) -> Tensor:
        """The target as rows ``[R, k]`` (class indices one-hot in the kept, owned rows)."""
        if self.dense is not None:
            return self.dense
        assert self.index is not None  # a target holds class indices or distributions
        y = torch.zeros(self.index.shape[0], k, dtype=dtype, device=self.index.device)
        if k:
            hot = self.keep if self.owned is None else self.owned
            y.scatter_(1, self.index.unsqueeze(1), hot.to(dtype).unsqueeze(1))
        return y


def sum_tolerance(k: int, target_dtype: torch.dtype) -> float:
    r"""How far from 1 the row sums of a probability target of ``k`` classes may be.

    ``c (√k + 1) + 2 ε + k η / 2`` with ``ε`` the machine epsilon of ``target_dtype`` and ``η``
    the spacing of its subnormal numbers (``torch.finfo(dtype).smallest_normal · ε``):

    * rounding a non-negative ``y_i`` to the target's dtype moves it by at most ``(ε/2) y_i``,
      or by ``η/2`` below the normal range, so a distribution rounded once to that dtype sums
      to 1 within ``ε/2 + k η/2``; ``2 ε`` allows that rounding and up to three more
      elementwise operations in the dtype (a temperature, a mixture), each adding at most
      ``(ε/2) y_i`` per entry.  A softmax rounded to bfloat16 (``ε = 2^-7``) thus passes with
      row sums off by up to ``2^-6 ≈ 0.016``, float16 (``ε = 2^-10``) by ``0.002`` (plus
      ``k η / 2 ≈ 3e-8 k`` for its subnormals);
    * ``c (√k + 1)``, ``c = 1e-4``, allows the error of computing the distribution itself in
      float32.  It applies to float64 targets too: a float64 target is often a float32
      distribution cast up (``y.double()``), whose row sums are off by the float32 rounding of
      the computation, not float64's.  The check is there to catch a wrong argument (scores,
      counts, an unnormalized row), which such a tolerance still does.

    The losses use such a target as given, as ``torch.nn.functional.cross_entropy`` does: no
    renormalization, which the vocabulary-parallel losses could not do without one more
    communication round (they check the sums in their last round), and no copy of the
    target.  The loss is its formula at the given ``y`` (``Ω(y) = Σ_i f(y_i) - f(0)`` with the
    divergence's generator ``f``; for ``"kl"``, ``cross_entropy(θ, y) + Σ y log y``) and the
    gradient is ``p - y``; both differ from those at ``y / Σ y`` by ``O(|Σ y - 1|)``.  Pass
    ``y.float() / y.float().sum(dim, keepdim=True)`` for the loss of the exact distribution.
    """
    fi = torch.finfo(target_dtype)
    c = 1e-4
    return c * (k ** 0.5 + 1) + 2 * fi.eps + k * fi.smallest_normal * fi.eps / 2


def check_ignore_index(ignore_index: object) -> int:
    """``ignore_index`` as an int: a Python int or a 0-d integer tensor (as ``F.cross_entropy``
    and the ``entmax`` package accept); a bool, a float or anything else is a ``TypeError``."""
    if isinstance(ignore_index, Tensor):
        if ignore_index.dim() == 0 and not ignore_index.is_floating_point() and not ignore_index.is_complex() \
                and ignore_index.dtype != torch.bool:
            return int(ignore_index)
    elif isinstance(ignore_index, int) and not isinstance(ignore_index, bool):
        return ignore_index
    raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")


def _dim_hint(target_shape: Sequence[int], x_shape: Sequence[int], dim: int) -> str:
    """A hint naming the ``dim`` that would make class indices of ``target_shape`` fit ``x_shape``."""
    fits = [d for d in range(len(x_shape)) if d != dim and tuple(target_shape) == tuple(x_shape[:d]) + tuple(x_shape[d + 1:])]
    if not fits:
        return ""
    return (f"; the classes seem to be along dim={fits[0]}: pass dim={fits[0]} (the losses take the class "
            f"dimension as dim, default -1, where F.cross_entropy uses dimension 1)")


def parse_target(
    target: Tensor,
    x: Tensor,
    rows: Rows,
    *,
    multilabel: bool = False,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    weight_name: str = "weight",
    caller: str = "a loss",
) -> Target:
    """Validate ``target`` against ``x`` and bring it to rows (see the module docstring);
    ``weight_name``: how the caller's signature names ``weight``, for the messages; ``caller``: the public
    call, as the deferred range check of class indices on a GPU names it (``"entmax15_loss"``)."""
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    k, dtype = rows.k, rows.dtype
    ignore_index = check_ignore_index(ignore_index)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if weight is not None:
        weight = _class_weight(weight, k, dtype, weight_name)
    if k == 0 and all(n > 0 for n in rows.moved_shape[:-1]):
        raise ValueError(f"x: the class dimension (dim={rows.dim - len(rows.shape)}) has size 0; a loss needs at least one class")
    if multilabel:
        index, dense, keep = None, _label_set_rows(target, x, rows), torch.ones(rows.R, dtype=torch.bool, device=target.device)
    elif not target.is_floating_point():
        index, keep = _index_rows(target, x, rows, ignore_index, caller)
        dense = None
    else:
        index, dense, keep = None, _probability_rows(target, x, rows), torch.ones(rows.R, dtype=torch.bool, device=target.device)

    if label_smoothing > 0:
        dense = _smoothed(index, dense, keep, k, dtype, float(label_smoothing))

    item_weight = None
    if weight is not None:
        # hard labels (even smoothed) weigh like cross_entropy: weight[c]; distributions: ⟨weight, y⟩
        if index is not None:
            item_weight = weight[index] * keep
        else:
            assert dense is not None  # probability rows or label sets
            item_weight = dense @ weight
    return Target(index=index, dense=dense, keep=keep, item_weight=item_weight, all_kept=index is None,
                  smoothing=float(label_smoothing) if index is not None else 0.0)


def _smoothed(index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor, k: int, dtype: torch.dtype,
              eps: float) -> Tensor:
    """``(1 - ε) y + ε/k`` in the kept rows, 0 in the others: class indices ``index`` ``[R]`` (ignored rows
    hold 0) in two passes (a fill and the masking; the class entries by one scatter), or rows ``dense``."""
    if dense is not None:
        mixed = (1 - eps) * dense + eps / k
        return torch.where(keep.unsqueeze(1), mixed, torch.zeros_like(mixed))
    assert index is not None  # a target holds class indices or distributions
    out = torch.full((index.shape[0], k), eps / k, dtype=dtype, device=index.device)
    if k:
        out.scatter_(1, index.unsqueeze(1), 1.0 - eps + eps / k)
    return out.mul_(keep.to(dtype).unsqueeze(1))  # (no NaN here: a product, several times faster than masked_fill_)


def _class_weight(weight: object, k: int, dtype: torch.dtype, weight_name: str) -> Tensor:
    """Class weights checked (``[k]``, finite, non-negative, and still finite in the compute dtype: a float64
    weight past float32's range would make the loss NaN) and in the compute dtype."""
    if not isinstance(weight, Tensor) or not weight.is_floating_point() or weight.shape != (k,):
        raise ValueError(f"{weight_name} must be a floating tensor of shape ({k},) (one weight per class), got "
                         f"{type(weight).__name__ if not isinstance(weight, Tensor) else (tuple(weight.shape), weight.dtype)}")
    wd = weight.detach()
    if values_checkable(wd) and not bool(((wd >= 0) & torch.isfinite(wd)).all()):
        raise ValueError(f"{weight_name} must be finite and non-negative")
    w = weight.to(dtype)
    if w.dtype != weight.dtype and values_checkable(wd) and not bool(torch.isfinite(w.detach()).all()):
        raise ValueError(f"{weight_name} must be finite in the scores' dtype ({dtype}): a weight overflows it "
                         f"(largest {float(wd.max()):g})")
    return w


def _label_set_rows(target: Tensor, x: Tensor, rows: Rows) -> Tensor:
    """Multi-hot label sets as rows: the uniform distribution over each row's active labels."""
    if target.shape != x.shape:
        raise ValueError(f"target: with multilabel=True it must have the input's shape {tuple(x.shape)}, got {tuple(target.shape)}")
    t = rows.to_rows(target.to(rows.dtype))
    if values_checkable(t) and bool(((t != 0) & (t != 1)).any()):
        raise ValueError("target: a multi-hot label set must contain only 0 and 1")
    counts = t.sum(-1, keepdim=True)
    if values_checkable(t) and bool((counts == 0).any()):
        raise ValueError("target: every multi-hot row needs at least one active label (found a row with none)")
    return t / counts


def _index_rows(target: Tensor, x: Tensor, rows: Rows, ignore_index: int, caller: str) -> tuple[Tensor, Tensor]:
    """Class indices as ``(index [R] with ignored rows at 0, kept rows [R])``; an index outside ``[0, k)`` raises
    at once on the CPU, at a later call on a GPU (:mod:`softargmax.losses.index_check`, naming ``caller``)."""
    if target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"target: class indices must be an integer tensor, got {target.dtype}")
    batch_shape = tuple(rows.moved_shape[:-1])
    if tuple(target.shape) != batch_shape:
        raise ValueError(f"target: class indices must have the input's shape without dim, {batch_shape}, got "
                         f"{tuple(target.shape)}{_dim_hint(target.shape, x.shape, rows.dim)}")
    idx = target.reshape(rows.R).to(torch.long)
    keep = idx != ignore_index
    bad = keep & ((idx < 0) | (idx >= rows.k))
    if deferred(idx) and check_on_device(idx, bad, caller, rows.k, ignore_index, tuple(x.shape)):
        # on a GPU: checked on the device, raised at a later call (no host synchronization); a bad index reads
        # class 0 (no access outside the row).  Where the check cannot run (tracing, CUDA-graph capture), the
        # index is kept as it is, and the kernel that reads it fails as PyTorch's own gather does
        return torch.where(keep & ~bad, idx, 0), keep
    if values_checkable(bad) and bool(bad.any()):
        raise ValueError(f"target: class index {int(idx[bad][0])} is out of range [0, {rows.k}) (ignore_index={ignore_index})")
    return torch.where(keep, idx, torch.zeros_like(idx)), keep


def _probability_rows(target: Tensor, x: Tensor, rows: Rows) -> Tensor:
    """Probability vectors as rows, checked: non-negative, summing to 1 within :func:`sum_tolerance`."""
    if target.shape != x.shape:
        batch_shape = tuple(rows.moved_shape[:-1])
        if tuple(target.shape) == batch_shape:
            raise TypeError(f"target: a floating tensor of the input's shape without dim, {batch_shape}, looks like "
                            "class indices: pass them as an integer tensor (target.long()); probability vectors "
                            f"must have the input's shape {tuple(x.shape)}")
        raise ValueError(f"target: probability vectors must have the input's shape {tuple(x.shape)}, got "
                         f"{tuple(target.shape)}{_dim_hint(target.shape, x.shape, rows.dim)}")
    y = rows.to_rows(target)
    if values_checkable(y) and bool((y < 0).any()):
        raise ValueError("target: probability vectors must be non-negative")
    s = y.sum(-1)  # in the compute dtype (float32 at least)
    if values_checkable(s) and bool(((s - 1).abs() > sum_tolerance(rows.k, target.dtype)).any()):
        raise ValueError(f"target: probability vectors must sum to 1 along dim (sums range over [{float(s.min()):.6g}, {float(s.max()):.6g}])")
    return y


def reduce_loss(per_row: Tensor, target: Target, reduction: str, batch_shape: Sequence[int]) -> Tensor:
    """Apply item weights and the reduction (``mean`` over kept items, weighted).

    A mean over no kept item (every target ignored, or the kept items' weights summing to 0) is NaN,
    as ``F.cross_entropy``'s, and its gradient with respect to every item's loss is 0, also as
    ``F.cross_entropy``'s: one such micro-batch must not turn a model's parameters into NaN."""
    w = target.item_weight
    loss = per_row if w is None else per_row * w
    if reduction == "none":
        return loss.reshape(batch_shape)
    if reduction == "sum":
        return loss.sum()
    denom = target.keep.sum().to(loss.dtype) if w is None else w.sum()
    empty, safe = _empty_and_safe(denom)
    return torch.where(empty, math.nan, loss.sum() / safe)


def mean_scale(target: Target, dtype: torch.dtype) -> Tensor:
    """``d mean / d item loss`` as a 0-d tensor: ``1 / denominator`` (the kept items' count or weight),
    0 where that is zero (every item ignored: the mean is NaN, as ``F.cross_entropy``'s, and no item
    moves it)."""
    w = target.item_weight
    denom = target.keep.sum().to(dtype) if w is None else w.sum()
    empty, safe = _empty_and_safe(denom)
    return torch.where(empty, 0.0, 1.0 / safe)


def _empty_and_safe(denom: Tensor) -> tuple[Tensor, Tensor]:
    """``(denom == 0, denom with 1 where it is 0)``: the mean of no kept item is NaN with a zero gradient
    (``F.cross_entropy``'s), not ``0 · (1/0) = NaN`` in every row's gradient."""
    empty = denom == 0
    return empty, torch.where(empty, 1.0, denom)


def mean_denominator_tensor(target: Target, reduction: str, dtype: torch.dtype) -> Union[float, Tensor]:
    """What a reduced sum of item losses is divided by, left on the device so that no value is read on the
    host: for ``"mean"`` a 0-d tensor of the kept items' count or weight (NaN when it is zero, as
    ``F.cross_entropy``); ``1.0`` for the other reductions."""
    if reduction != "mean":
        return 1.0
    denom = (target.keep.sum() if target.item_weight is None else target.item_weight.sum()).to(dtype)
    return torch.where(denom == 0, torch.full_like(denom, math.nan), denom)


def rows_of(target: Target, start: int, end: int) -> Target:
    """The rows ``start:end`` of a parsed target; a top-k target becomes dense for these rows only."""
    cut = lambda t: None if t is None else t[start:end]  # noqa: E731
    dense = cut(target.dense)
    if target.topk_index is not None:
        assert target.rest is not None and target.topk_value is not None  # set with topk_index
        rest = target.rest[start:end]
        dense = rest.unsqueeze(1).expand(end - start, target.classes).clone()
        dense.scatter_(1, target.topk_index[start:end], target.topk_value[start:end])
    return Target(cut(target.index), dense, target.keep[start:end], cut(target.item_weight), all_kept=target.all_kept,
                  smoothing=target.smoothing)


def top_k_target(values: Tensor, indices: Tensor, batch: tuple[int, ...], classes: int, dtype: torch.dtype) -> Target:
    """A teacher's top-k probabilities ``values`` at ``indices`` (both ``batch + (k,)``) as a :class:`Target` whose
    remaining mass ``1 - Σ values`` is spread evenly over the ``classes - k`` other classes (dense per chunk only)."""
    if not isinstance(values, Tensor) or not isinstance(indices, Tensor):
        raise TypeError("target: a top-k teacher is a pair of tensors (probabilities, indices), as torch.topk returns")
    if not values.is_floating_point():
        raise TypeError(f"target: the top-k probabilities (first of the pair) must be floating, got {values.dtype}")
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise TypeError(f"target: the top-k indices (second of the pair) must be an integer tensor, got {indices.dtype}")
    if values.shape != indices.shape or tuple(values.shape[:-1]) != tuple(batch) or values.dim() != len(batch) + 1:
        raise ValueError(f"target: top-k probabilities and indices must both have shape {tuple(batch)} + (k,), got "
                         f"{tuple(values.shape)} and {tuple(indices.shape)}")
    k = values.shape[-1]
    if not 1 <= k <= classes:
        raise ValueError(f"target: top-k needs 1 <= k <= {classes} classes, got k={k}")
    v = values.detach().reshape(-1, k).to(dtype)
    idx = indices.reshape(-1, k).to(torch.long)
    tol = 1e-4 if dtype != torch.float64 else 1e-8
    if values_checkable(v):
        if bool(((v < 0) | ~torch.isfinite(v)).any()):
            raise ValueError("target: top-k probabilities must be finite and non-negative")
        if bool(((idx < 0) | (idx >= classes)).any()):
            raise ValueError(f"target: a top-k index is out of range [0, {classes})")
        srt = idx.sort(-1).values
        if bool((srt[:, 1:] == srt[:, :-1]).any()):
            raise ValueError("target: the top-k indices of a row must be distinct")
        s = v.sum(-1)
        if bool((s > 1 + tol).any()) or (k == classes and bool(((s - 1).abs() > tol).any())):
            raise ValueError(f"target: top-k probabilities must sum to at most 1 per row (to 1 when k = {classes}); "
                             f"sums range over [{float(s.min()):.6g}, {float(s.max()):.6g}]")
    rest = (1 - v.sum(-1)).clamp(min=0) / (classes - k) if k < classes else v.new_zeros(v.shape[0])
    keep = torch.ones(v.shape[0], dtype=torch.bool, device=v.device)
    return Target(None, None, keep, None, topk_index=idx, topk_value=v, rest=rest, classes=classes, all_kept=True)


def check_reduction(reduction: object) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
