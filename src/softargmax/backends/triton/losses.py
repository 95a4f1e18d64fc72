r"""The launchers of the Fenchel–Young loss epilogue kernels (:mod:`softargmax.backends.triton.loss_kernels`).

Where the row kernels run (CUDA, or CPU tensors under Triton's interpreter:
:func:`softargmax.backends.triton.rows.set_cpu_interpret`), the losses write their gradient
``G = (p - y) · s_i`` in one pass, in the scores' dtype, with no device synchronization:

* :func:`gradient`: from a solver's ``p`` (the sparse and f-divergence mappings);
* :func:`softmax_gradient`: the ``"kl"`` loss (softmax) from the scores, with the row sums
  ``log Σ e^z`` and ``⟨y, z⟩`` of its value;
* :func:`alpha_relu_gradient`: the α-ReLU loss from the scores (``p`` elementwise, never stored),
  with the row sums of its value;
* :func:`gradient` and :func:`alpha_relu_gradient` also mark, given a
  :class:`~softargmax.backends.tile_flags.TileFlags`, the tiles of ``G`` that hold a non-zero entry
  (the fused output layer's products skip the others: :mod:`softargmax.backends.triton.tile_gemms`);
* :func:`scale_rows`: the backward, ``G · g_i`` per row in place (one read and one write of ``G``
  in its dtype, where PyTorch's multiplication of half ``G`` by float32 row factors takes its
  slower mixed-dtype, broadcast path).

Each returns ``None`` where the kernels do not apply (the caller takes the PyTorch path).
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional

import torch
from torch import Tensor

from ..._utils.extras import LazyModule
from ..tile_flags import TILE_CLASSES, TILE_TOKENS, TileFlags
from .rows import usable_device

__all__ = ["covers", "gradient", "softmax_gradient", "alpha_relu_gradient", "scale_rows", "BLOCK", "SOFTMAX_BLOCK"]

#: columns per program of :func:`gradient` (an elementwise pass)
BLOCK = 1024
#: columns per step of the streamed softmax kernel (one program per row)
SOFTMAX_BLOCK = 1024


def _load() -> ModuleType:
    from . import loss_kernels

    return loss_kernels


_module = LazyModule(_load)


def _rows_covered(rows: Tensor) -> bool:
    """Whether the kernels take rows ``[R, k]``: non-empty, row-contiguous, float32/float16/bfloat16, where they run."""
    if rows.dim() != 2 or rows.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    return rows.shape[0] > 0 and rows.shape[1] > 0 and rows.stride(1) == 1 and usable_device(rows) and bool(_module())


def covers(rows: Tensor, target_index: Optional[Tensor], target_dense: Optional[Tensor]) -> bool:
    """Whether the kernels take rows ``[R, k]`` (row-contiguous, float32/float16/bfloat16, where the
    kernels run) with a target of ``[R]`` class indices or dense ``[R, k]`` rows."""
    if not _rows_covered(rows):
        return False
    if target_dense is not None:
        return target_dense.dim() == 2 and target_dense.stride(1) == 1 and target_dense.shape == rows.shape
    return target_index is not None


def _args(rows: Tensor, index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor,
          scale: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    dummy = rows  # a pointer the kernel never reads (its constexpr branch is off)
    idx = index if index is not None else dummy
    y = dense if dense is not None else dummy
    sc = scale.to(torch.float32).contiguous() if scale is not None else dummy  # (an expanded scalar: made [R])
    return idx, y, keep.view(torch.uint8) if keep.dtype == torch.bool else keep, sc, y.stride(0) if dense is not None else 0


def _tile_args(rows: Tensor, tiles: Optional[TileFlags]) -> tuple[Tensor, int, bool]:
    """``(FLAGS, stride_f, HAS_TILES)`` of a launch that marks ``tiles`` (checked to tile ``rows``), or does not."""
    if tiles is None:
        return rows, 0, False
    R, k = rows.shape
    flags = tiles.flags
    if tuple(flags.shape) != (-(-R // TILE_TOKENS), -(-k // TILE_CLASSES)) or flags.stride(1) != 1:
        raise ValueError(f"tiles: marks of shape {tuple(flags.shape)} do not tile rows of shape {(R, k)}")
    tiles.written = True
    return flags, flags.stride(0), True


def gradient(p: Tensor, index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor,
             scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
             tiles: Optional[TileFlags] = None) -> Optional[Tensor]:
    """``G = (p - y) · scale`` per row (0 where ``keep`` is false) in ``p``'s dtype, into ``out``
    (``p`` itself for in place; default a new tensor), or ``None`` where not covered.  ``tiles``:
    cleared marks, set where a tile of ``G`` holds a non-zero entry (and ``tiles.written``)."""
    if not covers(p, index, dense):
        return None
    R, k = p.shape
    G = torch.empty_like(p) if out is None else out
    idx, y, keep8, sc, sy = _args(p, index, dense, keep, scale)
    flags, sf, has_tiles = _tile_args(p, tiles)
    grid = (R, -(-k // BLOCK))
    _module().gradient_rows[grid](p, G, idx, y, keep8, sc, flags, k, p.stride(0), G.stride(0), sy, sf,
                                  HAS_DENSE=dense is not None, HAS_SCALE=scale is not None, HAS_TILES=has_tiles,
                                  TM=TILE_TOKENS, TN=TILE_CLASSES, BLOCK=BLOCK)
    return G


def softmax_gradient(z: Tensor, index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor,
                     scale: Optional[Tensor] = None,
                     out: Optional[Tensor] = None) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """``(G, lse, zy)``: ``G = (softmax(z) - y) · scale`` per row (0 where ``keep`` is false) in
    ``z``'s dtype into ``out`` (``z`` itself for in place; default a new tensor), ``lse = log Σ_j e^{z_j}``
    and ``zy = ⟨y, z⟩`` over ``y > 0`` (float32 ``[R]``); or ``None`` where not covered."""
    if not covers(z, index, dense):
        return None
    R, k = z.shape
    G = torch.empty_like(z) if out is None else out
    lse = torch.empty(R, dtype=torch.float32, device=z.device)
    zy = torch.empty(R, dtype=torch.float32, device=z.device)
    idx, y, keep8, sc, sy = _args(z, index, dense, keep, scale)
    _module().softmax_gradient_rows[(R,)](z, G, idx, y, keep8, sc, lse, zy, k, z.stride(0), G.stride(0), sy,
                                          HAS_DENSE=dense is not None, HAS_SCALE=scale is not None,
                                          BLOCK=SOFTMAX_BLOCK, num_warps=8)
    return G, lse, zy


def alpha_relu_gradient(z: Tensor, index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor, alpha: float,
                        tau: float, scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
                        tiles: Optional[TileFlags] = None) -> Optional[tuple[Tensor, Tensor, Tensor, Optional[Tensor]]]:
    """``(G, Σ p t, ⟨y, z - τ/a⟩, Σ y^α)`` of the α-ReLU loss (``a = α - 1``, ``t = [a z - τ]_+``,
    ``p = t^{1/a}``): ``G = (p - y) · scale`` per row (0 where ``keep`` is false) in ``z``'s dtype into
    ``out`` (``z`` itself for in place; default a new tensor), the float32 ``[R]`` row sums (``Σ y^α``
    with a dense target only, else ``None``: 1 for class indices); or ``None`` where not covered
    (``1 < α <= 2``, as the elementwise α-ReLU kernels).  ``tiles``: as in :func:`gradient`."""
    from .rows import relu_exact

    if not covers(z, index, dense) or not 0.0 < alpha - 1.0 <= 1.0:
        return None
    R, k = z.shape
    G = torch.empty_like(z) if out is None else out
    spt, zy = (torch.empty(R, dtype=torch.float32, device=z.device) for _ in range(2))
    ya = torch.empty(R, dtype=torch.float32, device=z.device) if dense is not None else spt  # (not written without)
    idx, y, keep8, sc, sy = _args(z, index, dense, keep, scale)
    a = alpha - 1.0
    flags, sf, has_tiles = _tile_args(z, tiles)
    _module().alpha_relu_gradient_rows[(R,)](z, G, idx, y, keep8, sc, spt, zy, ya, flags, k, z.stride(0), G.stride(0),
                                             sy, sf, a, tau, alpha, HAS_DENSE=dense is not None,
                                             HAS_SCALE=scale is not None, EXACT=relu_exact(a), HAS_TILES=has_tiles,
                                             TM=TILE_TOKENS, TN=TILE_CLASSES, BLOCK=SOFTMAX_BLOCK, num_warps=8)
    return G, spt, zy, ya if dense is not None else None


def scale_rows(G: Tensor, scale: Tensor, out: Optional[Tensor] = None) -> Optional[Tensor]:
    """``G · scale`` per row (``scale`` ``[R]``, any floating dtype and stride: an expanded scalar
    is read as it is), computed in float32 and rounded once to ``G``'s dtype, into ``out`` (``G``
    itself for in place; default a new tensor); or ``None`` where not covered."""
    if not _rows_covered(G) or scale.shape != G.shape[:1] or not scale.is_floating_point() or scale.device != G.device:
        return None
    R, k = G.shape
    dest = torch.empty_like(G, memory_format=torch.contiguous_format) if out is None else out
    _module().scale_rows[(R, -(-k // BLOCK))](G, scale, dest, k, G.stride(0), scale.stride(0), dest.stride(0),
                                              BLOCK=BLOCK)
    return dest
