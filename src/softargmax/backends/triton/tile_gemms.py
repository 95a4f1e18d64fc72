r"""The launchers of the fused output layer's backward products that skip ``G``'s all-zero tiles
(:mod:`softargmax.backends.triton.tile_gemm_kernels`).

:func:`backprop` takes one chunk's gradient ``G`` ``[n, V]`` back through the projection with the marks
of its tiles (:class:`~softargmax.backends.tile_flags.TileFlags`, written by the loss kernel):
``gh = G W`` and ``gw += Gᵀ h``, each program walking only the tiles that hold a non-zero entry.
The marks become two compacted lists on the device (per token tile, its non-zero class tiles; per
class tile, its non-zero token tiles: a stable sort and a count of the ``[⌈n/64⌉, ⌈V/64⌉]`` marks),
so no value is read on the host.  It returns ``False`` where the kernels do not take the tensors
(the caller then runs the dense GEMMs).

Where few tiles are all zero, the Triton GEMMs do the dense products' work and may be slower than
cuBLAS: :func:`set_enabled` (or ``SOFTARGMAX_TILE_GEMMS=0`` in the environment) turns them off, so the
fused loss runs the dense GEMMs for every mapping (for comparisons and for such workloads).
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional

import torch
from torch import Tensor

from ..._utils.extras import LazyModule
from ..switch import Switch
from ..tile_flags import TILE_CLASSES, TILE_TOKENS, TileFlags
from .rows import usable_device

__all__ = ["covers", "tile_lists", "backprop", "feature_block", "set_enabled", "enabled"]

_switch = Switch("SOFTARGMAX_TILE_GEMMS")


def set_enabled(flag: bool) -> bool:
    """Turn the tile-skipping products on or off (off: the fused loss runs the dense GEMMs); returns the old setting."""
    return _switch.set(flag)


def enabled() -> bool:
    """Whether the tile-skipping products are on (:func:`set_enabled`, ``SOFTARGMAX_TILE_GEMMS``)."""
    return _switch.on


def _load() -> ModuleType:
    from . import tile_gemm_kernels

    return tile_gemm_kernels


_module = LazyModule(_load)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def feature_block(dtype: torch.dtype) -> int:
    """Features (columns of the products' outputs) per program: 128 for half precision, 64 for float32
    (whose IEEE dot keeps its operands in registers)."""
    return 64 if dtype == torch.float32 else 128


def _dot_mode(x: Tensor) -> int:
    """0: tensor-core dots of half inputs, 1: IEEE float32, 2: the interpreter's widened bfloat16."""
    if x.dtype == torch.float32:
        return 1
    return 2 if (x.dtype == torch.bfloat16 and x.device.type == "cpu") else 0


def _rows(t: Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1 and t.dtype in _DTYPES


def _aligned(*ts: Tensor) -> bool:
    """Row strides multiples of 16 elements and 16-byte aligned data: the specialization the kernels are
    compiled with at the usual shapes (without it their sm_90a builds spill: ``compile_report.py --unaligned``)."""
    return all(t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in ts)


def covers(G: Tensor, weight: Tensor, h: Tensor) -> bool:
    """Whether the kernels take ``G`` ``[n, V]``, ``weight`` ``[V, d]`` and ``h`` ``[n, d]``: row-contiguous, one
    dtype (float32, float16 or bfloat16), non-empty, ``V`` and ``d`` and the row strides multiples of 16 (a
    vocabulary of 50257 keeps the dense GEMMs), where the kernels run."""
    if not (_rows(G) and _rows(weight) and _rows(h)) or not G.dtype == weight.dtype == h.dtype:
        return False
    if G.shape[1] % 16 or weight.shape[1] % 16 or not _aligned(G, weight, h):
        return False
    n, V = G.shape
    return (_switch.on and n > 0 and V > 0 and weight.shape[0] == V and h.shape[0] == n
            and weight.shape[1] == h.shape[1] and usable_device(G) and bool(_module()))


def tile_lists(flags: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(row_list [MT, KT], row_count [MT], col_list [KT, MT], col_count [KT])`` (int32) of the marks ``flags``
    ``[MT, KT]``: row ``m`` of ``row_list`` starts with the ``row_count[m]`` class tiles marked in token tile
    ``m``, in increasing order (a stable sort of the unmarked after the marked), ``col_list`` the same per
    class tile.  On the device, no synchronization."""
    unmarked = (flags == 0).to(torch.uint8)
    # the kernels read a list's entries as adjacent: argsort keeps its input's strides (those of the
    # transposed view for col_list), so both lists are made row-contiguous
    row_list = torch.argsort(unmarked, dim=1, stable=True).to(torch.int32).contiguous()
    col_list = torch.argsort(unmarked.T, dim=1, stable=True).to(torch.int32).contiguous()
    marked = flags != 0
    return row_list, marked.sum(1, dtype=torch.int32), col_list, marked.sum(0, dtype=torch.int32)


def backprop(G: Tensor, weight: Tensor, h: Tensor, gh: Optional[Tensor], gw: Optional[Tensor],
             tiles: TileFlags) -> bool:
    """``gh = G W`` (written) and ``gw += Gᵀ h`` (``gw`` in any of the three dtypes, summed in float32 and
    rounded once), each ``None`` to skip it, over the tiles marked in ``tiles.flags`` only; ``False`` (nothing
    done) where the kernels do not take the tensors (:func:`covers`).  ``G`` is not modified."""
    for out in (gh, gw):
        if out is not None and not (_rows(out) and _aligned(out)):
            return False
    if not covers(G, weight, h):
        return False
    n, V = G.shape
    d = weight.shape[1]
    flags = tiles.flags
    if tuple(flags.shape) != (-(-n // TILE_TOKENS), -(-V // TILE_CLASSES)):
        raise ValueError(f"tiles: marks of shape {tuple(flags.shape)} do not tile G of shape {(n, V)}")
    row_list, row_count, col_list, col_count = tile_lists(flags)
    K = _module()
    bd = feature_block(G.dtype)
    consts = dict(DOT=_dot_mode(G), TM=TILE_TOKENS, TN=TILE_CLASSES, BD=bd)
    if gh is not None:
        K.grad_hidden_tiles[(flags.shape[0], -(-d // bd))](
            G, weight, gh, row_list, row_count, n, V, d, G.stride(0), weight.stride(0), gh.stride(0),
            row_list.stride(0), **consts)
    if gw is not None:
        K.grad_weight_tiles[(flags.shape[1], -(-d // bd))](
            G, h, gw, col_list, col_count, n, V, d, G.stride(0), h.stride(0), gw.stride(0), col_list.stride(0),
            **consts)
    return True
