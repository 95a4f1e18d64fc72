"""Mappings on ``torch.distributed.tensor.DTensor`` inputs: rows that are whole on every rank
are normalized on the local shards, with no communication.  (Losses over class-sharded
logits need communication: :mod:`softargmax.losses.distributed`.)
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

__all__ = ["is_dtensor", "dtensor_apply", "local_map_rows"]


def is_dtensor(x: object) -> bool:
    """Whether ``x`` is a ``torch.distributed.tensor.DTensor`` (without importing it needlessly)."""
    if type(x).__name__ != "DTensor":
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, DTensor)


def dtensor_apply(apply: Callable[..., Tensor], x: Any, *args: Any, dim: Optional[int] = None,
                  drops_dim: bool = False) -> Tensor:
    """``apply(x_local, *args_local)`` for a ``DTensor`` ``x``, returned with ``x``'s placements.

    The hook of the mappings: a normalized mapping (``dim`` given) is independent row by
    row, so when ``dim`` is whole on every rank it runs on the local shards with no
    communication; an elementwise map (``dim=None``, α-ReLU) accepts any sharding;
    ``drops_dim``: the result has one value per row (the f-softmax).  Sharded
    on ``dim`` (or ``Partial``): ``ValueError`` (the losses accept class-sharded logits).
    ``DTensor`` arguments (a per-row α, ``q``) are used through their local shards and
    must be placed like ``x``.
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard

    d = None if dim is None else dim % x.dim()
    for pl in x.placements:
        if not (isinstance(pl, Replicate) or (isinstance(pl, Shard) and pl.dim != d)):
            where = "partial" if dim is None else f"sharded on the normalized dimension (dim={dim}) or partial"
            raise ValueError(f"x: a DTensor passed to a mapping must not be {where}; got placements {x.placements}. "
                             "Losses over sharded classes take class-sharded DTensors or process_group=")
    local_args = [a.to_local() if is_dtensor(a) else a for a in args]
    out = apply(x.to_local(), *local_args)
    if not drops_dim:
        return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())
    # a value per row (the f-softmax): ``dim`` is gone, later dimensions shift down
    assert d is not None  # a mapping that drops dim names it
    placements = [Shard(pl.dim - (pl.dim > d)) if isinstance(pl, Shard) else pl for pl in x.placements]
    shape = torch.Size([n for i, n in enumerate(x.shape) if i != d])
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(out, x.device_mesh, placements, run_check=False, shape=shape, stride=stride)


def local_map_rows(fn: Callable[..., Tensor], x: Any, *args: Any, dim: int = -1, **kwargs: Any) -> Tensor:
    """``fn(x, *args, dim=dim, **kwargs)`` for any row-wise ``fn`` on a ``DTensor`` not sharded on ``dim``,
    run on the local shards (see :func:`dtensor_apply`).  The library's mappings do this by
    themselves; this helper is for user functions built on them."""
    kwargs = {k: (v.to_local() if is_dtensor(v) else v) for k, v in kwargs.items()}
    return dtensor_apply(lambda xl, *a: fn(xl, *a, dim=dim, **kwargs), x, *args, dim=dim)
