r"""Triton kernels of the fused output layer's backward products that skip the all-zero tiles of ``G``
(imported only by :mod:`softargmax.backends.triton.tile_gemms`).

``G`` ``[n, k]`` is one chunk's gradient of the loss with respect to the logits, in tiles of
``TM`` tokens × ``TN`` classes; ``LIST``/``COUNT`` name, for each tile row (or column), the tiles
that hold a non-zero entry, in increasing order (built on the device from the loss kernel's marks,
:mod:`softargmax.backends.tile_flags`).  Each program walks its list only:

* :func:`grad_hidden_tiles`: ``OUT = G W`` (``W`` ``[k, d]``): one program per ``TM`` tokens × ``BD``
  features, the sum over the class tiles of its token tile's list;
* :func:`grad_weight_tiles`: ``GW += Gᵀ h`` (``h`` = ``HID`` ``[n, d]``): one program per ``TN`` classes × ``BD``
  features, the sum over the token tiles of its class tile's list, added to ``GW`` (read and written
  in its own dtype, the sum in float32, rounded once); a class tile with an empty list neither reads
  nor writes ``GW``.

A skipped tile's products are exact zeros, so the results equal the dense products up to the order of
the float32 sums (for finite ``W`` and ``h``: ``0 · ∞`` would be NaN in the dense product).
"""

import triton
import triton.language as tl


@triton.jit
def _dot(x, y, acc, DOT: tl.constexpr):
    """``acc + x @ y`` in float32: tensor cores for half inputs (``DOT = 0``), IEEE float32 (``DOT = 1``);
    ``DOT = 2``: half operands widened to float32 first (Triton's interpreter multiplies bfloat16 as raw bits)."""
    if DOT == 1:
        r = tl.dot(x, y, acc, input_precision="ieee")
    elif DOT == 2:
        r = tl.dot(x.to(tl.float32), y.to(tl.float32), acc, input_precision="ieee")
    else:
        r = tl.dot(x, y, acc)
    return r


@triton.jit
def grad_hidden_tiles(G, W, OUT, LIST, COUNT, n, k, d, stride_g, stride_w, stride_o, stride_l,
                      DOT: tl.constexpr, TM: tl.constexpr, TN: tl.constexpr, BD: tl.constexpr):
    """``OUT[rows, cols] = Σ_k G[rows, k-tile] W[k-tile, cols]`` over the listed class tiles of one token tile
    (rows without a listed tile get 0)."""
    mt = tl.program_id(0).to(tl.int64)
    rows = mt * TM + tl.arange(0, TM)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    rmask = rows < n
    cmask = cols < d
    offs = tl.arange(0, TN)
    acc = tl.zeros([TM, BD], tl.float32)
    count = tl.load(COUNT + mt)
    for i in range(count):
        kt = tl.load(LIST + mt * stride_l + i).to(tl.int64)
        ks = kt * TN + offs
        kmask = ks < k
        g = tl.load(G + rows[:, None] * stride_g + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(W + ks[:, None] * stride_w + cols[None, :], mask=kmask[:, None] & cmask[None, :], other=0.0)
        acc = _dot(g, w, acc, DOT)
    tl.store(OUT + rows[:, None] * stride_o + cols[None, :], acc.to(OUT.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])


@triton.jit
def grad_weight_tiles(G, HID, GW, LIST, COUNT, n, k, d, stride_g, stride_h, stride_gw, stride_l,
                      DOT: tl.constexpr, TM: tl.constexpr, TN: tl.constexpr, BD: tl.constexpr):
    """``GW[k-tile, cols] += Σ_m G[m-tile, k-tile]ᵀ HID[m-tile, cols]`` over the listed token tiles of one class
    tile, the sum in float32 and ``GW`` rounded once; untouched where the list is empty."""
    kt = tl.program_id(0).to(tl.int64)
    ks = kt * TN + tl.arange(0, TN)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    kmask = ks < k
    cmask = cols < d
    offs = tl.arange(0, TM)
    acc = tl.zeros([TN, BD], tl.float32)
    count = tl.load(COUNT + kt)
    for i in range(count):
        mt = tl.load(LIST + kt * stride_l + i).to(tl.int64)
        rows = mt * TM + offs
        rmask = rows < n
        g = tl.load(G + rows[:, None] * stride_g + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        h = tl.load(HID + rows[:, None] * stride_h + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
        acc = _dot(tl.trans(g), h, acc, DOT)
    live = kmask & (tl.zeros([TN], tl.int32) < count)  # (a vector: the interpreter takes no scalar in a mask)
    mask = live[:, None] & cmask[None, :]
    ptr = GW + ks[:, None] * stride_gw + cols[None, :]
    old = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr, (old + acc).to(GW.dtype.element_ty), mask=mask)
