"""The row layout every solver works in: ``x`` seen as ``[R, k]`` rows along ``dim`` (:class:`Rows`),
and :func:`sum_to`, which reduces a broadcast gradient back to its argument's shape."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .checks import compute_dtype

__all__ = ["Rows", "MetaRows", "sum_to", "shift_by_row_max"]


class Rows:
    """A view of ``x`` as ``[R, k]`` rows along ``dim``, and the way back.

    ``z = rows.flat`` is contiguous, in the compute dtype; ``rows.restore(t)`` maps a
    ``[R, k]`` result back to ``x``'s layout and dtype.
    """

    def __init__(self, x: Tensor, dim: int, dtype: Optional[torch.dtype] = None) -> None:
        self.shape = x.shape
        self.dim = dim
        self.in_dtype = x.dtype
        self.dtype = dtype or compute_dtype(x.dtype)
        self.k = x.shape[dim]
        self.last = dim == x.dim() - 1
        if self.last and x.dim() == 2 and x.dtype == self.dtype and x.is_contiguous():
            # already the rows (the common small call): no reshape, no copy
            self.moved_shape = x.shape
            self.R = x.shape[0] if self.k else 0
            self.flat = x
            return
        moved = x if self.last else x.movedim(dim, -1)
        self.moved_shape = moved.shape
        self.R = moved.numel() // self.k if self.k else 0
        flat = moved.reshape(self.R, self.k)
        if flat.dtype != self.dtype:
            flat = flat.to(self.dtype)
        self.flat = flat if flat.is_contiguous() else flat.contiguous()

    def to_rows(self, t: Tensor) -> Tensor:
        """A tensor of ``x``'s shape (e.g. an incoming gradient) as ``[R, k]`` in the compute dtype."""
        flat = (t if self.last else t.movedim(self.dim, -1)).reshape(self.R, self.k)
        if flat.dtype != self.dtype:
            flat = flat.to(self.dtype)
        return flat if flat.is_contiguous() else flat.contiguous()

    def restore(self, t: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
        out = t if t.shape == self.moved_shape else t.reshape(self.moved_shape)
        if not self.last:
            out = out.movedim(-1, self.dim)
        dtype = dtype or self.in_dtype
        return out if out.dtype == dtype else out.to(dtype)

    def row_param(self, p: Tensor, name: str) -> Tensor:
        """A per-row parameter broadcastable to ``x`` with size 1 along ``dim``, as ``[R, 1]``."""
        shape = list(self.shape)
        shape[self.dim] = 1
        try:
            expanded = p.to(self.dtype).expand(shape) if p.dim() <= len(shape) else None
        except RuntimeError:
            expanded = None
        if expanded is None:
            raise ValueError(
                f"{name} of shape {tuple(p.shape)} must be broadcastable to the input's shape {tuple(self.shape)} "
                f"with size 1 along dim={self.dim - len(self.shape)}"
            )
        return expanded.movedim(self.dim, -1).reshape(self.R, 1).contiguous()

    def class_param(self, q: Tensor, name: str = "q") -> Tensor:
        """A tensor broadcastable to ``x`` (e.g. ``q``) as ``[R, k]`` or ``[1, k]`` (shared by all rows)."""
        if q.dim() > len(self.shape):
            raise ValueError(f"{name} of shape {tuple(q.shape)} has more dimensions than the input {tuple(self.shape)}")
        qs = [1] * (len(self.shape) - q.dim()) + list(q.shape)
        for i, (a, b) in enumerate(zip(qs, self.shape)):
            if a not in (1, b):
                raise ValueError(f"{name} of shape {tuple(q.shape)} is not broadcastable to the input's shape {tuple(self.shape)}")
        q = q.reshape(qs).to(self.dtype)
        if all(s == 1 for i, s in enumerate(qs) if i != self.dim):
            return q.reshape(1, -1).expand(1, self.k).contiguous()
        return q.expand(self.shape).movedim(self.dim, -1).reshape(self.R, self.k).contiguous()


class MetaRows(Rows):
    """The row layout of an ``[N, V]`` matrix that is never materialized (the fused loss's logits)."""

    def __init__(self, N: int, V: int, dtype: torch.dtype) -> None:
        self.shape = torch.Size([N, V])
        self.dim = 1
        self.last = True
        self.in_dtype = self.dtype = dtype
        self.moved_shape = self.shape
        self.k, self.R = V, N

    def to_rows(self, t: Tensor) -> Tensor:
        return t.reshape(self.R, self.k).to(self.dtype)


def sum_to(t: Tensor, shape: Sequence[int]) -> Tensor:
    """Reduce a broadcast gradient back to ``shape``."""
    if tuple(t.shape) == tuple(shape):
        return t
    lead = t.dim() - len(shape)
    if lead > 0:
        t = t.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and t.shape[i] != 1)
    if dims:
        t = t.sum(dim=dims, keepdim=True)
    return t.reshape(shape)


def shift_by_row_max(theta: Tensor, beta: float = 1.0, out: Optional[Tensor] = None) -> Tensor:
    """``(θ - max θ) / β`` per row (the last dimension; a row without a finite maximum, all ``-inf`` or with NaN or
    ``+inf``, is not shifted), into ``out`` if given."""
    m = theta.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z = torch.sub(theta, m, out=out) if out is not None else theta - m
    return z.div_(beta) if beta != 1.0 else z
