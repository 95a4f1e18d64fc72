"""The vocabulary-parallel loss of a ``DTensor``: its classes sharded over one mesh dimension (the
mesh's group is the process group) or replicated (the one-process loss on the local copy)."""

from __future__ import annotations

from typing import Callable, Union

from ..._utils.checks import check_dim
from ...divergences import Divergence
from ...operators._dtensor import is_dtensor
from .._fenchel_young import one_process_loss
from .._options import LossOptions

__all__ = ["dtensor_loss"]


def dtensor_loss(x, target, mapping: Union[str, Divergence], params: dict, options: LossOptions,
                 sharded_loss: Callable):
    """The loss of a ``DTensor`` ``x`` as a replicated ``DTensor``; ``sharded_loss(local, target, mapping,
    params, options)`` computes it where the classes are sharded (the prediction keeps ``x``'s placements)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    dim = check_dim(x, options.dim)
    mesh = x.device_mesh
    class_mesh_dims = [i for i, pl in enumerate(x.placements) if isinstance(pl, Shard) and pl.dim == dim]
    others = [pl for i, pl in enumerate(x.placements) if i not in class_mesh_dims]
    if len(class_mesh_dims) > 1 or any(not isinstance(pl, Replicate) for pl in others):
        raise ValueError(f"x: a DTensor must be sharded on the class dimension (dim={dim}) over at most one mesh "
                         f"dimension and replicated over the others, got placements {x.placements}")
    local = x.to_local()
    target = _local(target)
    options = options.replace(weight=_local(options.weight), q=_local(options.q))
    if options.process_group is not None:
        raise ValueError("process_group: not accepted with a DTensor x (the group is the mesh's)")
    if not class_mesh_dims:  # replicated classes: the ordinary loss on the local copy
        out = one_process_loss(local, target, mapping, params, options)
    else:
        group = mesh.get_group(class_mesh_dims[0])
        out = sharded_loss(local, target, mapping, params, options.replace(process_group=group))
    replicate = [Replicate()] * mesh.ndim
    if options.return_prediction:
        loss, p = out
        return (DTensor.from_local(loss, mesh, replicate, run_check=False),
                DTensor.from_local(p, mesh, x.placements, run_check=False))
    return DTensor.from_local(out, mesh, replicate, run_check=False)


def _local(t):
    return t.to_local() if is_dtensor(t) else t
