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
    of ``G``, no synchronization: the reference of the kernels' marks."""
    if G.dim() != 2:
        raise ValueError(f"G must be [tokens, classes], got shape {tuple(G.shape)}")
    n, V = G.shape
    mt, kt = -(-n // TILE_TOKENS), -(-V // TILE_CLASSES)
    nz = G != 0
    padded = torch.zeros(mt * TILE_TOKENS, kt * TILE_CLASSES, dtype=torch.bool, device=G.device)
    padded[:n, :V] = nz
    flags = padded.view(mt, TILE_TOKENS, kt, TILE_CLASSES).any(3).any(1).to(torch.uint8)
    if out is None:
        return flags
    return out.copy_(flags)


def skipped_fraction(flags: Tensor) -> float:
    """The share of tiles flagged all-zero (read on the host: for benchmarks and tests)."""
    return float((flags == 0).sum()) / max(1, flags.numel())
