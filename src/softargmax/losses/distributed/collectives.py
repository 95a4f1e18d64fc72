"""The collectives of the vocabulary-parallel losses, counted by :func:`count_collectives`, and the process group."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch.distributed as dist
from torch import Tensor

__all__ = ["CommStats", "count_collectives", "record", "all_reduce", "group_info"]


@dataclass
class CommStats:
    """Collectives issued inside :func:`count_collectives`: one entry per round."""

    rounds: list = field(default_factory=list)  # (kind, numel, bytes)

    @property
    def count(self) -> int:
        return len(self.rounds)

    @property
    def bytes(self) -> int:
        return sum(b for _, _, b in self.rounds)

    def by_kind(self) -> dict:
        out: dict = {}
        for kind, _, b in self.rounds:
            c = out.setdefault(kind, [0, 0])
            c[0] += 1
            c[1] += b
        return {k: {"rounds": v[0], "bytes": v[1]} for k, v in out.items()}


_STATS: list = []


@contextlib.contextmanager
def count_collectives():
    """Count the collectives the vocabulary-parallel losses issue in the block: ``with count_collectives() as st: ...``."""
    st = CommStats()
    _STATS.append(st)
    try:
        yield st
    finally:
        _STATS.remove(st)


def record(kind: str, t: Tensor) -> None:
    """Count one round of ``kind`` carrying ``t`` in every open :func:`count_collectives` block."""
    for st in _STATS:
        st.rounds.append((kind, t.numel(), t.numel() * t.element_size()))


def all_reduce(t: Tensor, op, group, kind: str) -> Tensor:
    """``t`` all-reduced in place with ``op`` over ``group`` (counted as ``kind``)."""
    record(kind, t)
    dist.all_reduce(t, op=op, group=group)
    return t


def group_info(group):
    """``(group, rank, world size)``, or a ``ValueError`` naming ``process_group``."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("process_group: torch.distributed is not initialized (call init_process_group first)")
    try:
        return group, dist.get_rank(group), dist.get_world_size(group)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"process_group: not a process group this rank belongs to ({e})") from None
