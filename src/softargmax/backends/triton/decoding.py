r"""Sparse decoding on the GPU: the launchers of :mod:`softargmax.backends.triton.decode_kernels`.

:func:`softargmax.decode_attention` chooses this path (:func:`covers`) and runs its three steps:
:func:`scores` (the split-K scores kernel, grouped query heads packed), the row solver on those
scores (through :func:`softargmax.normalize`: the Triton row solver where it covers the mapping),
and :func:`weighted_values` (``P·V`` split over the cache, the splits summed).  Covered:

* CUDA tensors (CPU tensors under Triton's interpreter when
  :func:`softargmax.backends.triton.rows.set_cpu_interpret` is on, for tests);
* ``query [B, H, L, D]``, a contiguous cache ``key``/``value`` ``[B, HKV, S, D]`` or a paged one
  ``[pages, page_size, HKV, D]`` with a block table (``page_size`` a power of two of at least 16),
  ``H`` a multiple of ``HKV``, ``D`` a power of two in [16, 128], float16, bfloat16 or float32 (the
  same for all three), any strides with a unit last stride;
* no gradient (the kernels have no backward: a call that needs one takes the reference path).

The number of splits depends on the cache's capacity ``S``, the batch and the heads only, never on the
lengths (device tensors, never read back): one launch configuration per static cache, as CUDA graphs
need.  ``SOFTARGMAX_DECODE_KERNELS=0`` (or :func:`set_enabled`) turns the automatic choice off.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ..._utils.extras import LazyModule
from ..._utils.tracing import without_autograd
from ..switch import Switch

__all__ = ["available", "set_enabled", "covers", "Layout", "layout", "scores", "weighted_values"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: query rows of one group packed in one program at most (``BLOCK_M``); more rows take several chunks
MAX_BLOCK_M = 64
#: programs per multiprocessor the split count aims at on a GPU
PROGRAMS_PER_SM = 2

_switch = Switch("SOFTARGMAX_DECODE_KERNELS")


def _load() -> ModuleType:
    from . import decode_kernels

    return decode_kernels


_module = LazyModule(_load)  # the kernel module, or False where Triton is unavailable


def available() -> bool:
    """Whether Triton imports and the decoding kernels compile to Python objects."""
    return bool(_module())


def set_enabled(flag: bool) -> bool:
    """Turn the automatic choice of the kernels on or off; returns the old setting."""
    return _switch.set(flag)


def covers(query: Tensor, key: Tensor, value: Tensor, block_table: Optional[Tensor],
           alpha: object = None) -> bool:
    """Whether the kernels take the call (module docstring); the shapes are already checked."""
    from . import rows as _triton_rows

    where = query.device.type == "cuda" or (query.device.type == "cpu" and _triton_rows.interprets_cpu())
    if not (_switch.on and where and available()):  # (the row solver's own switch chooses step 2's solver)
        return False
    if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    if not without_autograd(query, key, value, alpha if isinstance(alpha, Tensor) else None):
        return False  # a gradient (a learned α's too), a torch.func transform, forward-mode AD or a subclass
    D = query.shape[-1]
    if not (16 <= D <= 128 and D & (D - 1) == 0 and value.shape[-1] == D):
        return False
    if block_table is not None:
        page = key.shape[1]
        if page < 16 or page & (page - 1):
            return False
    return True


class Layout(NamedTuple):
    """A launch: the tiles, the grid and the strides of the cache (``kb, kh, kn``: per sequence or page,
    per head, per position) shared by both kernels."""

    block_m: int
    block_n: int
    warps: int
    split_len: int
    splits: int
    chunks: int
    paged: bool
    page: int


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def blocks(head_dim: int, device: torch.device, dtype: torch.dtype, block_m: int = 16) -> tuple[int, int]:
    """``(BLOCK_N, num_warps)`` for ``block_m`` packed rows: on a GPU 64 cache positions per tile (float32: 32, and
    16 for 64 rows of ``D = 128``), 4 warps for 16 rows and 8 for 32 or 64.  Chosen from the compile report
    (sm_90a, Triton 3.6), not from timings (GPU timings are owed): with 4 warps, 64 rows and ``D = 128``,
    ``decode_pv`` spills 332 bytes (19 KB in float32); with 8 warps and float32 tiles of 32 positions, 1.2 KB;
    none of the chosen variants spills.  Under the interpreter 32 positions."""
    warps = 4 if block_m <= 16 else 8
    if device.type != "cuda":
        return 32, warps
    if dtype == torch.float32:
        return (16 if block_m * head_dim > 4096 else 32), warps
    return 64, warps


def layout(query: Tensor, key: Tensor, block_table: Optional[Tensor], num_splits: Optional[int] = None) -> Layout:
    """The launch of a call: ``BLOCK_M`` the packed rows of a group (16 to :data:`MAX_BLOCK_M`), the split
    length (a multiple of ``BLOCK_N``) from ``num_splits`` or, by default, enough programs to fill the GPU
    (:data:`PROGRAMS_PER_SM` per multiprocessor; 4 programs under the interpreter)."""
    B, H, L, D = query.shape
    paged = block_table is not None
    HKV = key.shape[2] if paged else key.shape[1]
    S = block_table.shape[1] * key.shape[1] if block_table is not None else key.shape[2]
    page = key.shape[1] if paged else 1
    rows = (H // HKV) * L
    block_m = min(MAX_BLOCK_M, max(16, _pow2(rows)))
    chunks = -(-rows // block_m)
    block_n, warps = blocks(D, query.device, query.dtype, block_m)
    if paged:
        block_n = min(block_n, page)
    tiles = max(1, -(-S // block_n))
    if num_splits is None:
        from . import rows as _triton_rows

        target = PROGRAMS_PER_SM * _triton_rows.multiprocessors(query.device) if query.device.type == "cuda" else 4
        num_splits = -(-target // (B * HKV * chunks))
    splits = max(1, min(int(num_splits), tiles))
    split_len = -(-tiles // splits) * block_n
    return Layout(block_m, block_n, warps, split_len, -(-S // split_len) if S else 1, chunks, paged, page)


def _dot_mode(q: Tensor) -> int:
    """As the training kernels: 0 tensor-core dots, 1 IEEE float32, 2 the interpreter's widened bfloat16."""
    if q.dtype == torch.float32:
        return 1
    return 2 if (q.dtype == torch.bfloat16 and q.device.type == "cpu") else 0


def _cache_strides(t: Tensor, paged: bool) -> tuple[int, int, int]:
    """``(per sequence or page, per head, per position)`` of a cache tensor."""
    if paged:  # [pages, page_size, HKV, D]
        return t.stride(0), t.stride(2), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def _table(block_table: Optional[Tensor], like: Tensor) -> tuple[Tensor, int]:
    if block_table is None:
        return torch.empty(1, dtype=torch.int32, device=like.device), 0
    return block_table, block_table.stride(0)


def _unit(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _window(window: Optional[int]) -> int:
    """The kernels' ``window`` (``WINDOWED`` when positive): 0 for none.  A window is kept however wide: the ends
    may pass ``S`` (ranges that bound a mask), and whether it cuts a row depends on them (device values)."""
    return 0 if window is None else int(window)


def scores(query: Tensor, key: Tensor, end: Tensor, start: Tensor, scale: float, lay: Layout,
           block_table: Optional[Tensor] = None, window: Optional[int] = None) -> Tensor:
    """The float32 scores ``[B, H, L, S]`` (``-inf`` outside each row's keys) by :func:`decode_scores`
    (``end``, ``start``: int32 ``[B]``; ``block_table``: int32 ``[B, pages per sequence]``; ``window``: the
    sliding window of :func:`softargmax.decode_attention`)."""
    K = _module()
    q, k = _unit(query), _unit(key)
    B, H, L, D = q.shape
    HKV = k.shape[2] if lay.paged else k.shape[1]
    S = lay.page * block_table.shape[1] if block_table is not None else k.shape[2]
    z = torch.empty(B, H, L, S, dtype=torch.float32, device=q.device)
    table, stride_tb = _table(block_table, q)
    win = _window(window)
    K.decode_scores[(lay.splits, B * HKV, lay.chunks)](
        q, k, z, end, start, table, H, HKV, L, S, lay.split_len, win, float(scale),
        q.stride(0), q.stride(1), q.stride(2), *_cache_strides(k, lay.paged), stride_tb,
        BLOCK_M=lay.block_m, BLOCK_N=lay.block_n, HEAD_DIM=D, DOT=_dot_mode(q), PAGED=lay.paged,
        PAGE=lay.page, WINDOWED=win > 0, num_warps=lay.warps)
    return z


def weighted_values(p: Tensor, value: Tensor, end: Tensor, start: Tensor, lay: Layout,
                    block_table: Optional[Tensor] = None, window: Optional[int] = None) -> Tensor:
    """``p @ v`` ``[B, H, L, D]`` in ``value``'s dtype from the weights ``p`` (float32 ``[B, H, L, S]``,
    contiguous) by :func:`decode_pv`: one float32 partial output per split, summed."""
    K = _module()
    v = _unit(value)
    B, H, L, S = p.shape
    HKV = v.shape[2] if lay.paged else v.shape[1]
    D = v.shape[-1]
    R = B * H * L
    part = torch.empty(lay.splits, R, D, dtype=torch.float32, device=p.device)
    table, stride_tb = _table(block_table, p)
    win = _window(window)
    K.decode_pv[(lay.splits, B * HKV, lay.chunks)](
        p, v, part, end, start, table, H, HKV, L, S, R, lay.split_len, win,
        *_cache_strides(v, lay.paged), stride_tb,
        BLOCK_M=lay.block_m, BLOCK_N=lay.block_n, HEAD_DIM=D, DOT=_dot_mode(v), PAGED=lay.paged,
        PAGE=lay.page, WINDOWED=win > 0, num_warps=lay.warps)
    out = part[0] if lay.splits == 1 else part.sum(0)
    return out.view(B, H, L, D).to(value.dtype)
