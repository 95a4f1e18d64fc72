r"""Triton kernels of sparse decoding: a few new queries per sequence against a long key/value cache.

Imported only by :mod:`softargmax.backends.triton.decoding`.  A decode step of ``B`` sequences, ``H``
query heads over ``HKV`` key/value heads (a group of ``G = H / HKV`` query heads shares one), ``L``
new queries per sequence (one token, a few, or a block of a prefill's chunk: any number, packed
``BLOCK_M`` rows per program) and a cache of ``S`` positions runs in three steps; the first and
the last are these kernels, the middle one the row solver:

1. :func:`decode_scores` writes the float32 scores ``z = scale · q·k_j`` of every row
   ``(b, h, i)`` (row ``(b·H + h)·L + i`` of a ``[B·H·L, S]`` buffer), ``-inf`` outside the row's
   keys: sequence ``b`` holds the cache positions ``START[b] ≤ j < END[b]`` (left padding before,
   unused capacity after), and the new queries are its last ``L`` positions, causal among
   themselves with the mask aligned bottom-right: query ``i`` sees ``j ≤ END[b] - L + i``, the last
   one the whole valid cache; a sliding window also hides the keys ``j ≤ END[b] - L + i - window``
   (the tiles before the first query's window are not read);
2. the caller normalizes each row with the exact row solver (few long rows: ``B·H·L`` rows of
   ``S`` scores);
3. :func:`decode_pv` accumulates ``Σ_j p_j v_j`` over its share of the cache and writes one
   float32 partial output per split; the caller sums the splits (the weights already sum to one:
   no rescaling, unlike softmax's flash decoding).  A tile whose weights are all zero (outside the
   support) loads no values.

**Split-K** (Dao, Haziza, Massa and Sizov, *Flash-Decoding for long-context inference*, 2023,
https://crfm.stanford.edu/2023/10/12/flashdecoding.html): both kernels run on the grid
``(splits, B·HKV, chunks)``, each program walking ``split_len`` cache positions (a multiple of
``BLOCK_N``) of one key/value head.  **Grouped heads packed**: a program's ``BLOCK_M`` rows are the
``G·L`` query rows of its group (``chunks = ⌈G·L / BLOCK_M⌉``, one chunk up to 64 rows), so each key
or value tile is read once per group, not once per query head.  **Paged cache** (``PAGED``): the
keys and values are ``[pages, PAGE, HKV, D]`` (the layout of vLLM and FlashInfer) and
``TABLE[b, n]`` is the page holding sequence ``b``'s positions ``n·PAGE`` to ``(n+1)·PAGE - 1``;
``BLOCK_N`` divides ``PAGE``, so a tile lies in one page.  Cache positions outside
``[START[b], END[b])`` are never read (their keys and values may be anything, NaN included), nor
are the table entries of pages wholly outside; with a window, nor are the positions before the first query's
window.

Lengths, head counts and the split length are run-time values (one compilation per configuration).
"""

import triton
import triton.language as tl

from .attention_kernels import low, mm

#: integer arguments passed as run-time values (never specialized: one compilation whatever their values)
_RUNTIME = ("H", "HKV", "L", "R", "split_len", "window")


@triton.jit
def _rows(chunk, b, hk, H, HKV, L, BLOCK_M: tl.constexpr):
    """The program's rows: ``(row index, query head, query index, valid)`` of its ``BLOCK_M`` packed rows."""
    G = H // HKV
    gm = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = gm < G * L
    g = gm // L
    i = gm % L
    qh = hk * G + g
    rows = ((b * H + qh) * L + i).to(tl.int64)
    return rows, qh, i, ok


@triton.jit
def _kv_offsets(TABLE, b, hk, n0, offs_n, stride_b, stride_h, stride_n, stride_tb,
                PAGED: tl.constexpr, PAGE: tl.constexpr):
    """The element offsets of cache positions ``offs_n`` (one tile from ``n0``) of sequence ``b``, head ``hk``."""
    if PAGED:
        page = tl.load(TABLE + b.to(tl.int64) * stride_tb + n0 // PAGE).to(tl.int64)
        r = page * stride_b + hk * stride_h + (offs_n - n0 + n0 % PAGE).to(tl.int64) * stride_n
    else:
        r = b.to(tl.int64) * stride_b + hk * stride_h + offs_n.to(tl.int64) * stride_n
    return r


@triton.jit
def _first_key(start, end, L, window, WINDOWED: tl.constexpr):
    """The first cache position any new query of the sequence sees: its start, or with ``WINDOWED`` the first
    query's window start ``END - L + 1 - window`` if later."""
    first = start
    if WINDOWED:
        first = tl.maximum(start, end - L + 1 - window)
    return first


@triton.jit(do_not_specialize=_RUNTIME)
def decode_scores(Q, K, Z, END, START, TABLE, H, HKV, L, S, split_len, window, scale,
                  stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kn, stride_tb,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT: tl.constexpr,
                  PAGED: tl.constexpr, PAGE: tl.constexpr, WINDOWED: tl.constexpr):
    """The scores ``Z[(b·H + h)·L + i, j]`` of one split of the cache for one group's packed rows (module
    docstring): ``scale · q·k_j`` inside the row's keys (and, with ``WINDOWED``, its sliding ``window``:
    ``j > END[b] - L + i - window``), ``-inf`` elsewhere."""
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HKV
    hk = bh % HKV
    rows, qh, i, row_ok = _rows(tl.program_id(2), b, hk, H, HKV, L, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + qh[:, None] * stride_qh + i[:, None] * stride_ql + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    end = tl.load(END + b)
    start = tl.load(START + b)
    last = end - L + i  # the last key of each query: bottom-right causal
    first = _first_key(start, end, L, window, WINDOWED)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, S)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        z = tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32)
        if (n0 + BLOCK_N > first) & (n0 < end):  # a tile with a key of the sequence: read it
            kv = _kv_offsets(TABLE, b, hk, n0, offs_n, stride_kb, stride_kh, stride_kn, stride_tb, PAGED, PAGE)
            inside = (offs_n >= first) & (offs_n < end) & (offs_n < S)  # never read outside the sequence's window
            kt = tl.load(K + kv[None, :] + offs_d[:, None], mask=inside[None, :], other=0.0)
            keep = (offs_n[None, :] >= start) & (offs_n[None, :] <= last[:, None]) & (offs_n[None, :] < S)
            if WINDOWED:
                keep = keep & (offs_n[None, :] > last[:, None] - window)
            z = tl.where(keep, mm(q, kt, DOT) * scale, z)
        tl.store(Z + rows[:, None] * S + offs_n[None, :], z, mask=row_ok[:, None] & (offs_n[None, :] < S))


@triton.jit(do_not_specialize=_RUNTIME)
def decode_pv(P, V, PART, END, START, TABLE, H, HKV, L, S, R, split_len, window,
              stride_vb, stride_vh, stride_vn, stride_tb,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT: tl.constexpr,
              PAGED: tl.constexpr, PAGE: tl.constexpr, WINDOWED: tl.constexpr):
    """``PART[split, row] = Σ_j p_j v_j`` over one split of the cache (float32 ``[splits, R, HEAD_DIM]``),
    only over the sequence's positions (with ``WINDOWED``, from the first query's sliding ``window`` on), skipping
    the tiles where every weight is zero."""
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HKV
    hk = bh % HKV
    rows, _, _, row_ok = _rows(tl.program_id(2), b, hk, H, HKV, L, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    end = tl.load(END + b)
    start = tl.load(START + b)
    first = _first_key(start, end, L, window, WINDOWED)
    lo = tl.maximum(split * split_len, (first // BLOCK_N) * BLOCK_N)
    hi = tl.minimum(tl.minimum(split * split_len + split_len, end), S)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        p = tl.load(P + rows[:, None] * S + offs_n[None, :], mask=row_ok[:, None] & (offs_n[None, :] < S), other=0.0)
        if tl.max(tl.max(p, 1), 0) > 0:  # a tile inside some row's support
            kv = _kv_offsets(TABLE, b, hk, n0, offs_n, stride_vb, stride_vh, stride_vn, stride_tb, PAGED, PAGE)
            inside = (offs_n >= first) & (offs_n < end) & (offs_n < S)  # never read outside the sequence's window
            v = tl.load(V + kv[:, None] + offs_d[None, :], mask=inside[:, None], other=0.0)
            acc += mm(low(p, v, DOT), v, DOT)
    tl.store(PART + (split * R + rows[:, None]) * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
