"""Data parallelism for the translation experiments under ``torchrun --nproc_per_node N``.

``torchrun`` starts N processes and sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in
their environment.  :func:`setup` joins them into one process group (``nccl`` on CUDA,
``gloo`` on CPU) and gives each its device.  Training then splits every global batch
of sentences over the ranks (:func:`shard`: rank ``r`` takes sentences ``r, r + N, …``),
so the batch of one optimizer step is the batch a single process would use, and
``DistributedDataParallel`` averages the gradients.  Each rank scales its summed loss by
``N / (target tokens of the global batch)``, so the averaged gradient is the gradient of
the single-process per-token mean loss.  Only rank 0 writes files (:func:`is_main`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Context:
    """This process's place: ``rank`` of ``world`` processes, and its device."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"

    @property
    def main(self) -> bool:
        return self.rank == 0


def active() -> bool:
    """Whether a process group of more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if active() else (0, 1)


def is_main() -> bool:
    return rank_and_world()[0] == 0


def setup(device: str = "cpu") -> Context:
    """Join the process group that ``torchrun`` describes in the environment (``WORLD_SIZE > 1``).

    Without such an environment (a plain ``python`` run) nothing happens and the context is
    ``rank 0 of 1`` on ``device``.  On CUDA each rank takes the GPU ``LOCAL_RANK``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Context(0, 1, device)
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but torch.distributed is not available in this build of PyTorch")
    cuda = str(device).startswith("cuda")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Context(dist.get_rank(), dist.get_world_size(), device)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        # every rank reaches the teardown before any leaves: a gloo rank whose peer has already
        # exited can abort in its destructor ("terminate called without an active exception")
        dist.barrier()
        dist.destroy_process_group()


def shard(batch: list, rank: int, world: int) -> list:
    """This rank's sentences of a global batch: every ``world``-th, starting at ``rank``."""
    return batch[rank::world] if world > 1 else batch


def barrier() -> None:
    if active():
        dist.barrier()


def broadcast(obj):
    """Rank 0's ``obj`` on every rank (identity in a single process)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` in a single process)."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def sum_tensor(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the ranks (``t`` itself in a single process)."""
    if active():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
