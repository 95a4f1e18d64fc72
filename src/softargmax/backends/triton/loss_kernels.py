r"""Triton kernels of the Fenchel–Young loss epilogue (imported only by
:mod:`softargmax.backends.triton.losses`).

Both write the gradient of the loss with respect to the scores, ``G = (p - y) · s_i`` per row
``i`` (``s_i`` a row scale: the item weight over the mean's denominator in the fused loss, 1
elsewhere; 0 in ignored rows, whatever the scores hold), in the scores' dtype, in one pass over
memory, computing in float32:

* :func:`gradient_rows`: ``p`` from a solver (the row kernels), ``G`` written over it (or
  elsewhere): one read of ``p`` (and of a dense target), one write;
* :func:`softmax_gradient_rows`: the softmax of the scores itself (the ``"kl"`` loss): one
  program per row, an online pass for the maximum and the sum of exponentials, then a pass
  that writes ``G`` (over the scores, in the fused loss) and the row sums the loss value needs,
  :math:`\log\sum_j e^{z_j}` and :math:`\langle y, z\rangle`;

* :func:`alpha_relu_gradient_rows`: the α-ReLU loss (no threshold to search: ``p`` is elementwise),
  one program per row, one read of the scores that writes ``G`` and the row sums of the value,
  :math:`\sum_j p_j t_j`, :math:`\langle y, z - \tau/(\alpha-1)\rangle` and :math:`\sum_j y_j^\alpha`;

and the backward's :func:`scale_rows`: ``G · g_i`` per row (``g`` the incoming gradient of the
per-row losses), in place, read and written once in ``G``'s dtype.

The target is a class index per row (``y`` one-hot) or dense float32 rows.  The sparse losses'
kernels (:func:`gradient_rows`, :func:`alpha_relu_gradient_rows`) can also mark, as they write ``G``,
the ``TM × TN`` tiles of ``G`` that hold a non-zero entry (:mod:`softargmax.backends.tile_flags`), for
the fused output layer's products that skip the others.
"""

import triton
import triton.language as tl

from .row_kernels import relu_power


@triton.jit
def _row_scale(KEEP, SCALE, row, HAS_SCALE: tl.constexpr):
    """``s_i``: 0 in ignored rows, else the row's scale (1 without one)."""
    keep = tl.load(KEEP + row) != 0
    if HAS_SCALE:
        s = tl.load(SCALE + row).to(tl.float32)
    else:
        s = 1.0
    return keep, s


@triton.jit
def _mark_tiles(FLAGS, g, row, start, k, stride_f, BLOCK: tl.constexpr, TM: tl.constexpr, TN: tl.constexpr):
    """Marks (stores 1 in ``FLAGS[row // TM, c // TN]``) the ``TN``-column tiles of the columns
    ``start + [0, BLOCK)`` of one row of ``G`` where ``g`` holds an entry that is not zero (NaN included);
    ``start`` is a multiple of ``TN``.  Many rows mark a tile: every store writes the same 1."""
    nz = tl.max(tl.reshape((g != 0).to(tl.int32), [BLOCK // TN, TN]), 1)
    tiles = start // TN + tl.arange(0, BLOCK // TN)
    tl.store(FLAGS + (row // TM) * stride_f + tiles, nz.to(tl.uint8), mask=(nz > 0) & (tiles * TN < k))


@triton.jit
def gradient_rows(P, G, IDX, Y, KEEP, SCALE, FLAGS, k, stride_p, stride_g, stride_y, stride_f,
                  HAS_DENSE: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_TILES: tl.constexpr, TM: tl.constexpr,
                  TN: tl.constexpr, BLOCK: tl.constexpr):
    """``G = (p - y) · s_i`` (0 in rows not kept) for one ``BLOCK`` of one row; ``G`` may be ``P``.  With
    ``HAS_TILES``, the ``TM × TN`` tiles of ``G`` holding a non-zero are marked in ``FLAGS`` (:func:`_mark_tiles`)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < k
    p = tl.load(P + row * stride_p + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DENSE:
        y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        idx = tl.load(IDX + row).to(tl.int64)
        y = tl.where(cols == idx, 1.0, 0.0)
    keep, s = _row_scale(KEEP, SCALE, row, HAS_SCALE)
    g = tl.where(keep, (p - y) * s, 0.0)
    tl.store(G + row * stride_g + cols, g.to(G.dtype.element_ty), mask=mask)
    if HAS_TILES:
        _mark_tiles(FLAGS, g, row, tl.program_id(1).to(tl.int64) * BLOCK, k, stride_f, BLOCK, TM, TN)


@triton.jit
def softmax_gradient_rows(Z, G, IDX, Y, KEEP, SCALE, LSE, ZY, k, stride_z, stride_g, stride_y,
                          HAS_DENSE: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """One row: ``LSE = log Σ e^z`` (``-inf`` for an all-masked row, NaN with a NaN or ``+inf``),
    ``ZY = ⟨y, z⟩`` over ``y > 0`` (class index: ``z_y``), ``G = (softmax(z) - y) · s_i``; ``G`` may be ``Z``."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    zrow = Z + row * stride_z
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, k, BLOCK):
        cols = start + offs
        z = tl.load(zrow + cols, mask=cols < k, other=float("-inf")).to(tl.float32)
        # a NaN score makes its lane's maximum NaN for good (tl.maximum may drop NaN)
        m_new = tl.where((z == z) & (m == m), tl.maximum(m, z), float("nan"))
        # lanes whose maximum is still -inf hold 0 (exp(-inf - -inf) would be NaN)
        live = m_new > float("-inf")
        m_safe = tl.where(live, m_new, 0.0)
        acc = tl.where(live, acc * tl.exp(m - m_safe) + tl.exp(z - m_safe), 0.0)
        m = m_new
    nan_lanes = tl.sum(tl.where(m != m, 1, 0), 0)
    mx = tl.where(nan_lanes > 0, float("nan"), tl.max(m, 0))
    mx_safe = tl.where(mx == float("-inf"), 0.0, mx)  # (NaN stays NaN)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, acc * tl.exp(m - mx_safe)), 0)
    total = tl.where(mx == float("inf"), float("nan"), total)  # +inf scores: NaN, as log_softmax gives
    lse = mx_safe + tl.log(total)  # -inf for an all-masked row (log 0)
    shift = tl.where(lse == float("-inf"), 0.0, lse)  # all-masked: p = e^{-inf} = 0; NaN stays NaN
    keep, s = _row_scale(KEEP, SCALE, row, HAS_SCALE)
    if HAS_DENSE:
        zy = tl.zeros([BLOCK], tl.float32)
    else:
        idx = tl.load(IDX + row).to(tl.int64)
        zy_idx = tl.load(zrow + idx).to(tl.float32)  # read before G may overwrite it
    for start in range(0, k, BLOCK):
        cols = start + offs
        mask = cols < k
        z = tl.load(zrow + cols, mask=mask, other=float("-inf")).to(tl.float32)
        p = tl.exp(z - shift)
        if HAS_DENSE:
            y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
            zy += tl.where(y > 0, y * z, 0.0)
        else:
            y = tl.where(cols == idx, 1.0, 0.0)
        g = tl.where(keep, (p - y) * s, 0.0)
        tl.store(G + row * stride_g + cols, g.to(G.dtype.element_ty), mask=mask)
    tl.store(LSE + row, lse)
    if HAS_DENSE:
        tl.store(ZY + row, tl.sum(zy, 0))
    else:
        tl.store(ZY + row, zy_idx)


@triton.jit
def scale_rows(G, SCALE, OUT, k, stride_g, stride_s, stride_o, BLOCK: tl.constexpr):
    """``OUT = G · SCALE[row]`` for one ``BLOCK`` of one row, computed in float32 and rounded once to
    ``OUT``'s dtype; ``OUT`` may be ``G``; ``SCALE`` of any floating dtype and stride (0: one value)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < k
    s = tl.load(SCALE + row * stride_s).to(tl.float32)
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (g * s).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def alpha_relu_gradient_rows(Z, G, IDX, Y, KEEP, SCALE, SPT, ZY, YA, FLAGS, k, stride_z, stride_g, stride_y,
                             stride_f, a, tau, alpha, HAS_DENSE: tl.constexpr, HAS_SCALE: tl.constexpr,
                             EXACT: tl.constexpr, HAS_TILES: tl.constexpr, TM: tl.constexpr, TN: tl.constexpr,
                             BLOCK: tl.constexpr):
    """One row of the α-ReLU loss (``a = α - 1``): ``t = [a z - τ]_+``, ``p = t^{1/a}``,
    ``G = (p - y) · s_i`` (0 in rows not kept; ``G`` may be ``Z``), and the float32 row sums
    ``SPT = Σ p t``, ``ZY = ⟨y, z - τ/a⟩`` over ``y > 0`` (class index: ``z_y - τ/a``) and, with a
    dense target, ``YA = Σ y^α``.  NaN scores give NaN (``p``, ``G`` and ``SPT``); ``-inf`` ones ``p = 0``.
    With ``HAS_TILES``, the tiles of ``G`` holding a non-zero are marked in ``FLAGS`` (:func:`_mark_tiles`)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    zrow = Z + row * stride_z
    keep, s = _row_scale(KEEP, SCALE, row, HAS_SCALE)
    c = tau / a
    spt = tl.zeros([BLOCK], tl.float32)
    if HAS_DENSE:
        zy = tl.zeros([BLOCK], tl.float32)
        ya = tl.zeros([BLOCK], tl.float32)
    else:
        idx = tl.load(IDX + row).to(tl.int64)
        zy_idx = tl.load(zrow + idx).to(tl.float32) - c  # read before G may overwrite it
    for start in range(0, k, BLOCK):
        cols = start + offs
        mask = cols < k
        z = tl.load(zrow + cols, mask=mask, other=float("-inf")).to(tl.float32)
        u = a * z - tau
        t = tl.where(u > 0, u, tl.where(u == u, 0.0, u))  # [u]_+, NaN kept
        p = tl.where(t == t, relu_power(t, a, EXACT), t)
        spt += tl.where(t > 0, p * t, tl.where(t == t, 0.0, t))
        if HAS_DENSE:
            y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
            zy += tl.where(y > 0, y * (z - c), 0.0)
            ya += tl.where(y > 0, tl.exp2(alpha * tl.log2(tl.where(y > 0, y, 1.0))), 0.0)
        else:
            y = tl.where(cols == idx, 1.0, 0.0)
        g = tl.where(keep, (p - y) * s, 0.0)
        tl.store(G + row * stride_g + cols, g.to(G.dtype.element_ty), mask=mask)
        if HAS_TILES:
            _mark_tiles(FLAGS, g, row, start, k, stride_f, BLOCK, TM, TN)
    tl.store(SPT + row, tl.sum(spt, 0))
    if HAS_DENSE:
        tl.store(ZY + row, tl.sum(zy, 0))
        tl.store(YA + row, tl.sum(ya, 0))
    else:
        tl.store(ZY + row, zy_idx)
