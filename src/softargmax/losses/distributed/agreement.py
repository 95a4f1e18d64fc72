"""The first round of every vocabulary-parallel call: the ranks check that they agree on the call
(one small all-gather), and learn each other's class slices.

Every rank must call with consistent arguments: the collectives are matched call by call, and
a collective whose sizes differ between ranks aborts a process (gloo) or hangs.  So this round,
whose size depends on nothing a rank may get wrong, comes first: each rank contributes
``len(SLOTS)`` int64 numbers (its row count, dtype, a fingerprint of the loss and its
parameters, the options, checksums of the class-index targets and of a per-row α, its slice
size and offset, and whether its own argument checks failed), and every rank makes the same
checks on the same table, so every rank raises the same ``ValueError`` naming the first
disagreement.

The table is read on the host (the one synchronization of the round), so the value checks that need
only a few numbers ride on it: the smallest and the largest kept class index (checked against the
global number of classes once the slices are known, :func:`~.targets.make_plan`) and whether a rank's
class weights hold a negative, infinite or NaN entry are computed on the device and written into the table, instead
of being read on the host each by a synchronization of its own; every rank then raises the same
``ValueError`` at the call itself, before any other collective.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .._options import LossOptions
from .._rows import RowLoss
from .collectives import group_info, record

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["FUNCTIONS", "REDUCTIONS", "Split", "agree", "loss_fields", "call_fields", "checksum", "float_bits",
           "class_slices", "offset_fields"]

FUNCTIONS = ("-", "fenchel_young_loss", "linear_fenchel_young_loss", "solve", "class_slices")
TARGET_KINDS = ("none", "class indices", "probability vectors", "multi-hot label sets")
REDUCTIONS = ("-", "mean", "sum", "none")
_DTYPES = (None, torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: the checksums of index tensors are sums of terms reduced modulo this prime: exact in int64
_PRIME = 2_147_483_647


def _as_int(v: int) -> str:
    return str(v)


def _as_float(v: int) -> str:
    return repr(struct.unpack("<d", struct.pack("<q", v))[0])


def _as_optional(fmt: Callable[[int], str]) -> Callable[[int], str]:
    return lambda v: "None" if v == 0 else fmt(v)


def _as_name(names: tuple[str, ...]) -> Callable[[int], str]:
    return lambda v: repr(names[v]) if 0 <= v < len(names) else str(v)


def _as_hex(v: int) -> str:
    return f"fingerprint {v & (2 ** 64 - 1):016x}"


def _given(v: int) -> str:
    return "given" if v else "not given"


#: what each rank contributes to the first round (int64 numbers), in the order they are
#: compared, with how a disagreement is named (``None``: checked apart)
SLOTS = (
    ("error", None, None),
    ("function", "the function called", _as_name(FUNCTIONS)),
    ("rows", "the number of rows", _as_int),
    ("dtype", "the dtype", lambda v: str(_DTYPES[v]) if 0 < v < len(_DTYPES) else "another dtype"),
    ("mapping", "the mapping or its parameters", _as_hex),
    ("alpha", "the per-row alpha", lambda v: f"checksum {v}"),
    ("target", "the kind of target", _as_name(TARGET_KINDS)),
    ("indices", "the class-index targets", lambda v: f"checksum {v}"),
    ("reduction", "reduction", _as_name(REDUCTIONS)),
    ("ignore_index", "ignore_index", _as_int),
    ("label_smoothing", "label_smoothing", _as_float),
    ("temperature", "temperature", _as_float),
    ("softcap", "softcap", _as_optional(_as_float)),
    ("q", "whether q is given", _given),
    ("weight", "whether class weights are given", _given),
    ("chunk_size", "chunk_size", _as_optional(_as_int)),
    ("memory_budget", "memory_budget", _as_optional(_as_int)),
    ("offset_given", "whether class_offset is given", _given),
    ("classes", None, None),
    ("offset", None, None),
    ("weight_len", None, None),
    ("weight_bad", None, None),
    ("index_low", None, None),
    ("index_high", None, None),
)
_SLOT = {name: i for i, (name, _, _) in enumerate(SLOTS)}


@dataclass
class Split:
    """The class slices every rank holds: ``sizes[r]`` classes from ``offsets[r]`` on (``K`` in all), and for
    class-index targets the smallest and the largest kept index, ``(low, high)`` (``(0, -1)`` for none),
    read from the first round's table: the range check of :func:`~.targets.make_plan` needs no other
    host synchronization."""

    sizes: list[int]
    offsets: list[int]
    K: int
    index_range: Optional[tuple[int, int]] = None


def float_bits(v: float) -> int:
    """``v``'s float64 bits as an int64 (exact, unlike any rounding of ``v``)."""
    return struct.unpack("<q", struct.pack("<d", float(v)))[0]


def _fingerprint(text: str) -> int:
    """A 64-bit hash of ``text`` (as an int64), the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def checksum(t: Tensor) -> Tensor:
    r"""``Σ_i ((v_i mod P)(i + 1 mod P) mod P)`` (``v_i``: the entries, or their float64 bits), an
    int64 scalar on ``t``'s device: exact (below ``2^63`` for up to ``2^32`` entries), so equal on
    ranks that hold equal tensors, and changed by any change of one entry or swap of two."""
    v = t.detach().reshape(-1)
    if v.is_floating_point():
        v = v.to(torch.float64).contiguous().view(torch.int64)
    v = v.to(torch.int64).remainder(_PRIME)
    w = torch.arange(1, v.numel() + 1, dtype=torch.int64, device=v.device).remainder(_PRIME)
    return (v * w).remainder(_PRIME).sum()


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else 0


def offset_fields(class_offset: object) -> dict[str, int]:
    """The first round's fields of ``class_offset`` (``{}`` when not given)."""
    if class_offset is None:
        return {}
    if isinstance(class_offset, bool) or not isinstance(class_offset, int):
        raise TypeError(f"class_offset must be an int (this rank's first class), got {type(class_offset).__name__}")
    return {"offset_given": 1, "offset": class_offset}


def loss_fields(function: int, loss: RowLoss, rows: int, classes: int, dtype: torch.dtype,
                q_given: bool) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(fields, tensors)`` that the first round compares of a call's loss and rows."""
    fields = {"function": function, "rows": rows, "classes": classes, "dtype": dtype_code(dtype),
              "mapping": _fingerprint(loss.describe()), "q": q_given}
    per_row = loss.row_parameters()
    return fields, ({} if per_row is None else {"alpha": checksum(per_row)})


def call_fields(function: int, loss: RowLoss, options: LossOptions, rows: int, classes: int,
                dtype: torch.dtype) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(fields, tensors)`` that the first round compares of a loss call (the target's apart)."""
    fields, tensors = loss_fields(function, loss, rows, classes, dtype, options.q is not None)
    fields.update(reduction=REDUCTIONS.index(options.reduction), temperature=float_bits(options.temperature),
                  **offset_fields(options.class_offset))
    return fields, tensors


def _ranks(rs: list[int]) -> str:
    """``"rank 3"``, ``"ranks 0, 2"``, ``"ranks 0-5, 7"``."""
    runs: list[str] = []
    start: Optional[int] = rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(runs)


def _disagreement(what: str, column: list[int], fmt: Callable[[int], str]) -> str:
    groups: dict[int, list[int]] = {}
    for r, v in enumerate(column):
        groups.setdefault(v, []).append(r)
    parts = [f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {fmt(v)}" for v, rs in groups.items()]
    return f"process_group: ranks disagree on {what}: " + ", ".join(parts)


def agree(group: Optional[ProcessGroup], rank: int, world: int, device: torch.device, error: Optional[Exception],
          fields: dict[str, Any], tensors: Optional[dict[str, Tensor]] = None) -> Split:
    """The first round of every call: one all-gather of ``len(SLOTS)`` int64 numbers per rank (module docstring).

    The rank whose own arguments were rejected (``error``) re-raises its error, the others a
    ``ValueError`` naming it.  Returns the slices.
    """
    host = [0] * len(SLOTS)
    for name, v in fields.items():
        host[_SLOT[name]] = int(v)
    host[_SLOT["error"]] = int(error is not None)
    buf = torch.tensor(host, dtype=torch.int64)
    # to a GPU from pinned memory, without waiting (a blocking copy from the host would synchronize: the one
    # synchronization of the round is the reading of its table below)
    buf = buf.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else buf.to(device)
    for name, t in (tensors or {}).items():
        buf[_SLOT[name]] = t
    out = [torch.empty_like(buf) for _ in range(world)]
    record("all_gather", torch.empty(world * len(SLOTS), dtype=torch.int64, device="meta"))
    dist.all_gather(out, buf, group=group)
    table = torch.stack(out).tolist()  # the one host synchronization of the check
    if error is not None:
        raise error
    column = [row[_SLOT["error"]] for row in table]
    if any(column):
        raise ValueError(f"process_group: {_ranks([r for r, v in enumerate(column) if v])} rejected its arguments "
                         f"(the error is raised there); rank {rank} accepted its own")
    for j, (_, what, fmt) in enumerate(SLOTS):
        column = [row[j] for row in table]
        if what is not None and fmt is not None and len(set(column)) > 1:  # (both or neither)
            raise ValueError(_disagreement(what, column, fmt))
    sizes = [row[_SLOT["classes"]] for row in table]
    index_range = None
    if table[0][_SLOT["target"]] == TARGET_KINDS.index("class indices"):  # (the ranks agreed on the indices)
        index_range = (min(row[_SLOT["index_low"]] for row in table), max(row[_SLOT["index_high"]] for row in table))
    split = Split(sizes, [sum(sizes[:r]) for r in range(world)], sum(sizes), index_range)
    if table[0][_SLOT["offset_given"]]:
        _check_offsets([row[_SLOT["offset"]] for row in table], split)
    for r, row in enumerate(table):
        n = row[_SLOT["weight_len"]]
        if row[_SLOT["weight"]] and n not in (sizes[r], split.K):
            raise ValueError(f"weight must have shape ({sizes[r]},) (rank {r}'s classes) or ({split.K},) (all classes); "
                             f"rank {r}'s has shape ({n},)")
    bad = [r for r, row in enumerate(table) if row[_SLOT["weight_bad"]]]
    if bad:
        raise ValueError(f"weight must be finite and non-negative ({_ranks(bad)}: a negative, infinite or NaN class weight)")
    return split


def _check_offsets(given: list[int], split: Split) -> None:
    """The ranks' ``class_offset`` values must be the offsets of contiguous slices in rank order."""
    sizes, offsets = split.sizes, split.offsets
    for r in range(len(sizes)):
        if given[r] == offsets[r]:
            continue
        if given[r] < 0:
            raise ValueError(f"class_offset must be >= 0: rank {r} has {given[r]}")
        prev = next((s for s in range(r - 1, -1, -1) if sizes[s] > 0), None)
        span = f"[{given[r]}, {given[r] + sizes[r]})"
        if given[r] < offsets[r]:
            held = f"rank {prev}'s [{offsets[prev]}, {offsets[r]})" if prev is not None else "no class"
            raise ValueError(f"class_offset: the class slices overlap: rank {r} holds {span}, which overlaps "
                             f"{held} (slices are contiguous in rank order and cover [0, K))")
        raise ValueError(f"class_offset: no rank holds the classes [{offsets[r]}, {given[r]}) "
                         f"(rank {r} holds {span}; slices are contiguous in rank order and cover [0, K))")


def class_slices(k: int, process_group: Optional[ProcessGroup]) -> list[int]:
    r"""The number of classes every rank holds, by one small all-gather.

    Rank :math:`r` holds the classes :math:`[o_r, o_r + k_r)`, :math:`o_r = \sum_{s < r} k_s`, of
    :math:`K = \sum_r k_r`: what a rank needs to turn global class indices into its own (the losses
    learn the sizes in their first round and need no call of this).

    Args:
        k: the number of classes this rank holds, :math:`k_r \ge 0`.
        process_group: the group over which the classes are split (``None``: the default group).

    Returns:
        ``[k_0, ..., k_{W-1}]``, a list of ints, the same on every rank.

    Examples:
        >>> import itertools, torch.distributed as dist
        >>> from softargmax.losses import distributed
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> sizes = distributed.class_slices(5, None)
        >>> sizes, [0, *itertools.accumulate(sizes)]  # the sizes and the offsets o_r, then K
        ([5], [0, 5])
        >>> dist.destroy_process_group()

    References:
        Mohammad Shoeybi, Mostofa Patwary, Raul Puri, Patrick LeGresley, Jared Casper and Bryan
        Catanzaro, *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
        Parallelism*, 2019, https://arxiv.org/abs/1909.08053
    """
    group, rank, world = group_info(process_group)
    return agree(group, rank, world, torch.device("cpu"), None, {"function": 4, "classes": k}).sizes
