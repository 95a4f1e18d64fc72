"""The collectives of the vocabulary-parallel losses, counted by :func:`count_collectives`, and the process group."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch.distributed as dist
from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["CommStats", "count_collectives", "record", "all_reduce", "group_info"]


@dataclass
class CommStats:
    r"""The collectives that the vocabulary-parallel losses issued inside :func:`count_collectives`.

    One entry per round, with the bytes this rank sent into it: a round of :math:`n` numbers of
    :math:`b` bytes each counts :math:`n b` bytes, and :attr:`bytes` is the sum over the rounds.

    Attributes:
        rounds: ``[(kind, numbers, bytes)]``, one tuple per round, in the order issued; ``kind`` is
            ``"all_gather"`` (the first round, where the ranks check that they agree), ``"max"`` or
            ``"sum"`` (all-reduces). Default: an empty list.

    Examples:
        >>> from softargmax.losses.distributed import CommStats
        >>> st = CommStats([("max", 4, 16), ("sum", 4, 16), ("sum", 2, 8)])
        >>> st.count, st.bytes
        (3, 40)
        >>> st.by_kind()
        {'max': {'rounds': 1, 'bytes': 16}, 'sum': {'rounds': 2, 'bytes': 24}}
    """

    rounds: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, numel, bytes)

    @property
    def count(self) -> int:
        """The number of rounds."""
        return len(self.rounds)

    @property
    def bytes(self) -> int:
        """The bytes sent, summed over the rounds."""
        return sum(b for _, _, b in self.rounds)

    def by_kind(self) -> dict[str, dict[str, int]]:
        """``{kind: {"rounds": count, "bytes": bytes}}``, the rounds and bytes of each kind."""
        out: dict[str, list[int]] = {}
        for kind, _, b in self.rounds:
            c = out.setdefault(kind, [0, 0])
            c[0] += 1
            c[1] += b
        return {k: {"rounds": v[0], "bytes": v[1]} for k, v in out.items()}


_STATS: list[CommStats] = []


@contextlib.contextmanager
def count_collectives() -> Iterator[CommStats]:
    r"""Count the collectives that the vocabulary-parallel losses issue inside a ``with`` block.

    A loss over :math:`R` rows costs one all-gather (the ranks check that they agree), one ``MAX``
    all-reduce of :math:`2R` numbers, one ``SUM`` all-reduce of :math:`2R` numbers per Newton
    evaluation and a last ``SUM`` all-reduce of :math:`R` to :math:`3R` numbers (the package
    docstring); blocks may nest, and each counts what was issued inside it.

    Yields:
        a :class:`CommStats` that fills as the collectives are issued.

    Examples:
        On a group of one process (the threshold of one slice is exact: a single Newton evaluation
        confirms it), 2 rows in float32:

        >>> import torch, torch.distributed as dist, softargmax as sa
        >>> from softargmax.losses import distributed
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> x, y = torch.tensor([[1.0, 0.5, -1.0], [0.2, 0.1, 3.0]]), torch.tensor([0, 2])
        >>> with distributed.count_collectives() as st:
        ...     _ = distributed.fenchel_young_loss(x, y, "entmax15")
        >>> [(kind, n) for kind, n, _ in st.rounds]  # (kind, numbers): 2R, 2R, then R
        [('all_gather', 24), ('max', 4), ('sum', 4), ('sum', 2)]
        >>> dist.destroy_process_group()

    References:
        Mohammad Shoeybi, Mostofa Patwary, Raul Puri, Patrick LeGresley, Jared Casper and Bryan
        Catanzaro, *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
        Parallelism*, 2019, https://arxiv.org/abs/1909.08053
    """
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


def all_reduce(t: Tensor, op: Any, group: Optional[ProcessGroup], kind: str) -> Tensor:
    """``t`` all-reduced in place with ``op`` over ``group`` (counted as ``kind``)."""
    record(kind, t)
    dist.all_reduce(t, op=op, group=group)
    return t


def group_info(group: Optional[ProcessGroup]) -> tuple[Optional[ProcessGroup], int, int]:
    """``(group, rank, world size)``, or a ``ValueError`` naming ``process_group``."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("process_group: torch.distributed is not initialized (call init_process_group first)")
    try:
        return group, dist.get_rank(group), dist.get_world_size(group)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"process_group: not a process group this rank belongs to ({e})") from None
