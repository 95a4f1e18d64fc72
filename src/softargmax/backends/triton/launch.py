r"""Launch settings of the Triton kernels, overridable in one place for tuning.

The row kernels (:mod:`softargmax.backends.triton.rows`) and the fused attention kernels
(:mod:`softargmax.backends.triton.flash_attention`) choose their tiles and warps from tables
read off sm_90 register reports (no spills), not from timings.  A tuning run replaces those
choices for the calls inside :func:`overridden` and times them; the results stay the same
up to float32 rounding (each row is solved on its own; the warps, the tiles and a streamed
row's chunk length change only the order in which a row's sums are reduced).

* :class:`RowLaunch`: ``rows_per_program`` and ``warps`` of the register kernels (rows of at
  most ``BLOCK_ROWS_MAX`` entries; the tile ``BLOCK`` is the row length rounded up to a power
  of two), ``long_block`` and ``long_warps`` of the streamed kernels (longer rows);
* :class:`AttentionLaunch`: ``block_m`` × ``block_n`` tiles (queries × keys) and ``warps``.

A field left ``None`` keeps the table's choice.  Overrides are process-wide (not thread-local):
a tuning tool, not a training option.  The row kernels read them at each launch, so a backward
run after the ``with`` block uses the settings in force then; the attention kernels keep the
forward's tiles for their backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

__all__ = ["RowLaunch", "AttentionLaunch", "overridden", "current_rows", "current_attention"]

_WARPS = (1, 2, 4, 8, 16, 32)


def _power_of_two(value: Optional[int], name: str, least: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {least}, got {value!r}")


def _warps(value: Optional[int], name: str) -> None:
    if value is not None and (isinstance(value, bool) or value not in _WARPS):
        raise ValueError(f"{name} must be one of {_WARPS}, got {value!r}")


@dataclass(frozen=True)
class RowLaunch:
    """Launch settings of the row kernels; ``None`` keeps the built-in choice.

    Args:
        rows_per_program: rows each program of the register kernels solves (a power of two).
            Default: ``None``.
        warps: warps per program of the register kernels (1 to 32). Default: ``None``.
        long_block: chunk length of the streamed kernels for long rows (a power of two >= 16).
            Default: ``None``.
        long_warps: warps per program of the streamed kernels (1 to 32). Default: ``None``.

    Examples:
        >>> from softargmax.backends.triton.launch import RowLaunch
        >>> RowLaunch(rows_per_program=4, warps=8)
        RowLaunch(rows_per_program=4, warps=8, long_block=None, long_warps=None)
        >>> RowLaunch(long_block=1000)
        Traceback (most recent call last):
        ...
        ValueError: long_block must be a power of two >= 16, got 1000
    """

    rows_per_program: Optional[int] = None
    warps: Optional[int] = None
    long_block: Optional[int] = None
    long_warps: Optional[int] = None

    def __post_init__(self) -> None:
        _power_of_two(self.rows_per_program, "rows_per_program", 1)
        _power_of_two(self.long_block, "long_block", 16)
        _warps(self.warps, "warps")
        _warps(self.long_warps, "long_warps")


@dataclass(frozen=True)
class AttentionLaunch:
    """Launch settings of the fused attention kernels; ``None`` keeps the built-in choice.

    Args:
        block_m: queries per tile (a power of two >= 16). Default: ``None``.
        block_n: keys per tile (a power of two >= 16). Default: ``None``.
        warps: warps per program (1 to 32). Default: ``None``.

    Examples:
        >>> from softargmax.backends.triton.launch import AttentionLaunch
        >>> AttentionLaunch(block_m=64, block_n=64, warps=4).block_n
        64
    """

    block_m: Optional[int] = None
    block_n: Optional[int] = None
    warps: Optional[int] = None

    def __post_init__(self) -> None:
        _power_of_two(self.block_m, "block_m", 16)
        _power_of_two(self.block_n, "block_n", 16)
        _warps(self.warps, "warps")


@dataclass
class _InForce:
    rows: RowLaunch = dataclasses.field(default_factory=RowLaunch)
    attention: AttentionLaunch = dataclasses.field(default_factory=AttentionLaunch)


_in_force = _InForce()


def current_rows() -> RowLaunch:
    """The row kernels' overrides in force (all ``None`` outside :func:`overridden`).

    Examples:
        >>> from softargmax.backends.triton.launch import current_rows
        >>> current_rows().warps is None
        True
    """
    return _in_force.rows


def current_attention() -> AttentionLaunch:
    """The attention kernels' overrides in force (all ``None`` outside :func:`overridden`).

    Examples:
        >>> from softargmax.backends.triton.launch import current_attention
        >>> current_attention().block_m is None
        True
    """
    return _in_force.attention


@contextlib.contextmanager
def overridden(rows: Optional[RowLaunch] = None, attention: Optional[AttentionLaunch] = None) -> Iterator[None]:
    """Replace the kernels' launch settings inside a ``with`` block (for tuning; see the module docstring).

    Args:
        rows: the row kernels' settings. Default: ``None`` (unchanged).
        attention: the attention kernels' settings. Default: ``None`` (unchanged).

    Examples:
        >>> import torch, softargmax as sa
        >>> from softargmax.backends.triton.launch import RowLaunch, current_rows, overridden
        >>> with overridden(rows=RowLaunch(rows_per_program=2, warps=4)):
        ...     p = sa.entmax15(torch.randn(8, 300))   # on CUDA: 2 rows per program, one warp each
        ...     current_rows().rows_per_program
        2
        >>> current_rows().rows_per_program is None
        True
    """
    if rows is not None and not isinstance(rows, RowLaunch):
        raise TypeError(f"rows must be a RowLaunch, got {type(rows).__name__}")
    if attention is not None and not isinstance(attention, AttentionLaunch):
        raise TypeError(f"attention must be an AttentionLaunch, got {type(attention).__name__}")
    old = dataclasses.replace(_in_force)
    _in_force.rows = rows if rows is not None else old.rows
    _in_force.attention = attention if attention is not None else old.attention
    try:
        yield
    finally:
        _in_force.rows, _in_force.attention = old.rows, old.attention


def merged(override: AttentionLaunch, chosen: tuple[int, int, int]) -> tuple[int, int, int]:
    """``(block_m, block_n, warps)``: ``chosen`` with the fields ``override`` sets replaced."""
    return (override.block_m or chosen[0], override.block_n or chosen[1], override.warps or chosen[2])
