r"""Tile flags of a loss gradient: which ``TILE_TOKENS × TILE_CLASSES`` tiles of ``G = ∂loss/∂logits`` hold a non-zero.

The gradient of a sparse Fenchel–Young loss with respect to the logits, :math:`G = p - y` (scaled
per row), is exactly zero outside the prediction's support and the target's classes.  The fused
output layer (:func:`softargmax.losses.linear.linear_fenchel_young_loss`) takes each chunk's ``G``
back through the projection with two products, ``G W`` and ``Gᵀ h``; a tile of ``G`` whose every
entry is zero adds nothing to either, so both can skip it.  The GPU loss kernels mark the tiles as
they write ``G`` (:mod:`softargmax.backends.triton.loss_kernels`), the products read the marks on
the device (:mod:`softargmax.backends.triton.tile_gemms`): nothing is read on the host.

:class:`TileFlags` is the buffer of one chunk's marks; :func:`tile_flags` the PyTorch reference
(the tests', the benchmarks' proxy, and the fallback where no kernel marked the tiles);
:func:`skipped_fraction` the share of tiles a product skips.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["TILE_TOKENS", "TILE_CLASSES", "TileFlags", "tile_flags", "skipped_fraction"]

#: tokens (rows of ``G``) per tile: the rows of ``G W``'s output tile and the reduction step of ``Gᵀ h``
TILE_TOKENS = 64
#: classes (columns of ``G``) per tile: the reduction step of ``G W`` and the rows of ``Gᵀ h``'s output tile
TILE_CLASSES = 64


class TileFlags:
    """The marks of one chunk's gradient ``G`` ``[n, V]``: ``flags`` ``[⌈n/TILE_TOKENS⌉, ⌈V/TILE_CLASSES⌉]``
    (``uint8``, non-zero where the tile holds a non-zero entry or a NaN), and ``written``, set on the host
    by the kernel launcher that marked them (a launch that did not leaves it ``False``: the caller then
    marks them from ``G`` with :func:`tile_flags`).

    One buffer serves every chunk of a call: :meth:`reset` clears the rows of a chunk of ``n`` tokens
    (a device memset, no synchronization) and returns the buffer."""

    def __init__(self, tokens: int, classes: int, device: torch.device) -> None:
        self.classes = classes
        self.buffer = torch.zeros(-(-tokens // TILE_TOKENS), -(-classes // TILE_CLASSES), dtype=torch.uint8,
                                  device=device)
        self.flags = self.buffer
        self.written = False

    def reset(self, tokens: int) -> TileFlags:
        """The marks of a chunk of ``tokens`` rows, all cleared (not yet ``written``)."""
        self.flags = self.buffer[: -(-tokens // TILE_TOKENS)]
        self.flags.zero_()
        self.written = False
        return self

    def mark_from(self, G: Tensor) -> None:
        """Marks the tiles from ``G`` itself (:func:`tile_flags`), where no kernel did."""
        tile_flags(G, out=self.flags)
        self.written = True


def tile_flags(G: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``[⌈n/TILE_TOKENS⌉, ⌈V/TILE_CLASSES⌉]`` ``uint8``: 1 where the tile of ``G`` ``[n, V]`` holds an
    entry that is not zero (NaN counts as not zero), else 0; into ``out`` where given.  On the device
    of ``G``, no synchronization, and no temporary of ``G``'s size: the largest and the smallest entry
    of each tile (two reductions over views of ``G``; a NaN makes both NaN).  The reference of the
    kernels' marks, and the marks of a ``G`` that no kernel marked."""
    if G.dim() != 2:
        raise ValueError(f"G must be [tokens, classes], got shape {tuple(G.shape)}")
    n, V = G.shape
    mt, kt = -(-n // TILE_TOKENS), -(-V // TILE_CLASSES)
    flags = torch.zeros(mt, kt, dtype=torch.uint8, device=G.device) if out is None else out
    nf, vf = n - n % TILE_TOKENS, V - V % TILE_CLASSES
    # the full tiles, then the last (shorter) token tile and class tile: each block viewed as its tiles
    for r0, r1, tm in ((0, nf, TILE_TOKENS), (nf, n, n - nf)):
        for c0, c1, tn in ((0, vf, TILE_CLASSES), (vf, V, V - vf)):
            block = G[r0:r1, c0:c1]
            if block.numel() == 0:
                continue
            tiles = block.reshape(block.shape[0] // tm, tm, block.shape[1] // tn, tn)
            nz = (tiles.amax(dim=(1, 3)) != 0) | (tiles.amin(dim=(1, 3)) != 0)
            m0, k0 = r0 // TILE_TOKENS, c0 // TILE_CLASSES
            flags[m0:m0 + nz.shape[0], k0:k0 + nz.shape[1]] = nz
    return flags


def skipped_fraction(flags: Tensor) -> float:
    """The share of tiles flagged all-zero (read on the host: for benchmarks and tests)."""
    return float((flags == 0).sum()) / max(1, flags.numel())
