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
    """Whether ``x`` is a ``torch.distributed.tensor.DTensor`` (without importing it needlessly).

    Args:
        x: any object.

    Returns:
        ``True`` for a ``DTensor``, ``False`` for anything else (a plain tensor included).

    Examples:
        >>> import torch, torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from torch.distributed.tensor import Shard, distribute_tensor
        >>> from softargmax.losses.distributed import is_dtensor
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> x = torch.ones(2, 3)
        >>> is_dtensor(x), is_dtensor(distribute_tensor(x, init_device_mesh("cpu", (1,)), [Shard(0)]))
        (False, True)
        >>> dist.destroy_process_group()
    """
    if type(x).__name__ != "DTensor":
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, DTensor)


def dtensor_apply(apply: Callable[..., Tensor], x: Any, *args: Any, dim: Optional[int] = None,
                  drops_dim: bool = False) -> Tensor:
    r"""``apply(x_local, *args_local)`` for a ``DTensor`` ``x``, returned with ``x``'s placements.

    The hook of the mappings.  A normalized mapping is independent row by row,

    .. math::

        \operatorname{map}(x)_{i,:} = \operatorname{map}(x_{i,:}),

    so when ``dim`` is whole on every rank it runs on the local shards with no communication; an
    elementwise map (α-ReLU) accepts any sharding.  A ``DTensor`` sharded on ``dim`` (or
    ``Partial``) raises a ``ValueError``: the losses take class-sharded logits
    (:func:`softargmax.losses.distributed.fenchel_young_loss`), the mappings do not.
    ``DTensor`` arguments (a per-row α, ``q``) are used through their local shards and must be
    placed like ``x``.

    Args:
        apply: the function of the local tensors, ``apply(x_local, *args_local)``.
        x: a ``DTensor``.
        \*args: further arguments of ``apply``; a ``DTensor`` among them is passed as its local shard.
        dim: the dimension ``apply`` normalizes, which must not be sharded. Default: ``None`` (an
            elementwise map).
        drops_dim: the result has one value per row (the f-softmax), so ``dim`` is gone from its
            shape and placements. Default: ``False``.

    Returns:
        a ``DTensor`` on ``x``'s mesh, placed as ``x`` (``drops_dim``: with ``dim`` removed).

    Shape:
        - x: any; ``dim`` not sharded.
        - Output: ``x``'s shape, or without ``dim`` if ``drops_dim``.

    Examples:
        >>> import torch, torch.distributed as dist, softargmax as sa
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from torch.distributed.tensor import Shard, distribute_tensor
        >>> from softargmax.losses.distributed import dtensor_apply
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> x = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]])
        >>> xd = distribute_tensor(x, init_device_mesh("cpu", (1,)), [Shard(0)])  # rows sharded
        >>> p = dtensor_apply(sa.sparsemax, xd, dim=-1)
        >>> p.placements, torch.equal(p.full_tensor(), sa.sparsemax(x))
        ((Shard(dim=0),), True)
        >>> dist.destroy_process_group()
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
    r"""A row-wise function of yours on a ``DTensor`` not sharded on ``dim``, run on the local shards.

    For any ``fn`` whose rows along ``dim`` are independent,
    :math:`\operatorname{fn}(x)_{i,:} = \operatorname{fn}(x_{i,:})`, the local shards hold whole
    rows and need no communication (:func:`dtensor_apply`).  The library's mappings do this by
    themselves; this helper is for functions built on them.

    Args:
        fn: called as ``fn(x_local, *args, dim=dim, **kwargs)``.
        x: a ``DTensor`` not sharded on ``dim``.
        \*args, \*\*kwargs: further arguments of ``fn``; ``DTensor`` values are passed as their
            local shards.
        dim: the dimension of the rows. Default: ``-1``.

    Returns:
        ``fn``'s result, a ``DTensor`` placed as ``x``.

    Shape:
        - x: any; ``dim`` not sharded.
        - Output: ``x``'s shape.

    Examples:
        >>> import torch, torch.distributed as dist, softargmax as sa
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from torch.distributed.tensor import Shard, distribute_tensor
        >>> from softargmax.losses.distributed import local_map_rows
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> x = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 3.0]])
        >>> xd = distribute_tensor(x, init_device_mesh("cpu", (1,)), [Shard(0)])
        >>> sharp = lambda z, dim: sa.sparsemax(2 * z, dim=dim)  # a function of yours
        >>> torch.equal(local_map_rows(sharp, xd).full_tensor(), sharp(x, dim=-1))
        True
        >>> dist.destroy_process_group()
    """
    kwargs = {k: (v.to_local() if is_dtensor(v) else v) for k, v in kwargs.items()}
    return dtensor_apply(lambda xl, *a: fn(xl, *a, dim=dim, **kwargs), x, *args, dim=dim)
