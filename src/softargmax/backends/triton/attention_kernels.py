r"""Triton kernels of the fused (FlashAttention-style) α-entmax attention.

Imported only by :mod:`softargmax.backends.triton.flash_attention`.  Notation per query row ``i`` of one
head: scores ``z_j = scale · q·k_j + mask_j`` (``-inf`` where masked or above the causal
diagonal), ``a = α - 1 ∈ (0, 1]``, row maximum ``m``, and the row solver's threshold
variable ``t`` (:mod:`softargmax.backends.triton.row_kernels`):

    u_j = a (z_j - m) - t,    p_j = [u_j]_+^{1/a},    s_j = ∂p_j/∂z_j = [u_j]_+^{1/a - 1}

(α-entmax, Peters, Niculae & Martins, *Sparse Sequence-to-Sequence Models*, ACL 2019,
arXiv:1905.05702; sparsemax is ``a = 1``, ``s = 1[p > 0]``).  ``Σ_j p_j = 1`` fixes
``t ∈ [-1, -n^{-a}]``: ``t = -1`` puts ``p = 1`` on the maximum alone.  ``S^a`` is convex and
decreasing in ``t``, so Newton's iterates from any ``t`` below the root stay below it and rise.

**Forward** (:func:`attention_fwd`, one program per (batch·head, query block of
``BLOCK_M`` rows); the ``[BLOCK_M, BLOCK_N]`` score tiles are recomputed from ``q`` and
``k`` in every pass and never stored):

1. a pass over the key blocks for the row maxima ``m``, listing the tiles where the bound
   ``a max_ij (z_ij - m_i') + 1 ≥ u_ij`` (``m_i'`` the running maximum, ``t ≥ -1``) is positive:
   a tile where it is ``≤ 0`` is skipped from the first Newton pass on.  The same pass bins the
   scores for the start (:func:`_hist_add`): ``HIST_BINS`` bins ``1/HIST_WIDTH`` wide in
   ``a (z - m)``, anchored to the running maximum, each score counted in the bin just below it;
2. passes from the start :func:`_hist_start` (Newton steps on the binned row, in registers: below
   the root, since lowered scores have a lower threshold), each accumulating per row over the key
   blocks ``Σp``, ``Σs`` and, for sparsemax and 1.5-entmax, the support's size and its two smallest
   ``u`` (the sums reduced over the tile's rows, the smallest ``u`` in tile-shaped registers, reduced once
   per pass).  Sparsemax and 1.5-entmax
   (:func:`_certified_step`): the root in closed form on the support, or on the support without its
   smallest score, ends the row when it is *certified* (the support it assumes is the one
   at that root), without a confirming pass; else a Newton step on ``S^a`` (below the root).  The
   general power: the row solver's step (:func:`softargmax.backends.triton.row_kernels.newton_step`),
   Newton on ``S^a`` until ``|Σp - 1| ≤ 2 ε_float32`` (from the first evaluation), or at its float32 rounding
   floor (:func:`_power_step`); from a residual of at most
   ``PREDICT_RESIDUAL`` the next step is taken without a pass at its iterate, the output pass evaluating the row
   there (step 4).  Either way a row
   also stops when its residual stops decreasing (rounding), when the step vanishes, or after
   ``max_iter`` passes.  The loop runs while a row of the block goes on: its length is set by the
   data, not fixed.  ``u`` is one FMA per score from the dot and the absolute threshold
   ``τ = a m + t`` (:func:`_u`; the general power: an FMA and a subtraction);
3. **block sparsity**: each pass walks a list of the kept tiles (``LIST``, in the order of the key
   blocks, rotated under a sliding window so that the mask-free tiles lead) and writes the list of the next one: the tiles that hold a ``u > 0`` at this ``t``
   (sparsemax and 1.5-entmax: from the tile's support counts, which count a ``u = +0`` too; the general power: from
   its sums of ``s``).  The iterates ``t`` only grow, so a dropped tile has ``p = 0`` for every
   later ``t``.  Walking a list rather than branching on a tile map leaves the loops without a
   data-dependent branch around their loads: Triton's software pipeliner issues the ``K`` and ``V``
   tiles as asynchronous copies (``cp.async``) one iteration ahead.  Two halves per query block
   alternate between the passes (no list is overwritten while it is read); the output pass writes the
   final list, which :func:`attention_bwd_dq` walks, and from it the tile map ``KEPT``: one bit per tile,
   ``KEPT[bh, query block, w]`` an int32 word whose bit ``b`` is set where the tile with key block ``32 w + b``
   is kept at the final ``t`` (it holds a ``u > 0``; :func:`_kept_words`), whose columns
   :func:`attention_bwd_dkdv` lists the same way (:func:`_list_kept`).  Each program owns its query block's row
   of words: it builds them in registers from its final list after the output pass and writes every word, with
   no atomics (32 bits in the 4 bytes a float32 maximum per tile took before: 0.5 MB instead of 16.8 MB at
   ``L = 16384``, ``B = 2``, ``H = 16`` in 64×32 tiles).  Every tile loop (the max pass, the Newton passes, the output pass, ``dQ``, and ``dK, dV`` on
   dense inputs without a window or mask) walks first the tiles that need no mask (whole key blocks at or before the block's first query, no
   ``attn_mask``: :func:`_free_blocks`, :func:`_free_query_blocks`; ``u`` straight from the FMA, ``τ = +inf``
   on the rows past the end), then the edge tiles (the causal diagonal's, the last partial one) with the mask;
4. the output pass: ``O = Σ_j p_j v_j`` and ``W = Σ_j s_j v_j / Σ_j s_j`` (both ``tl.dot``
   of the tile with ``V``), plus per row ``m``, ``t``, ``Σs``, ``Σp`` and (the general power,
   ``EXACT = 0``) ``Σ p log p``, from the power's own ``log2 u`` (``log p = ln 2 · log2(u) / a``).  ``Σp`` is summed
   for the general power, whose output pass applies the row solver's test to the rows whose last step it evaluates
   (a row it does not stop is marked in ``REDO``, and a second launch with ``REPAIR`` takes the step, the passes to
   the end and the output pass again: the thresholds of a pass at every iterate), and with ``STATS``
   (:func:`flash_attention.forward_stats <softargmax.backends.triton.flash_attention.forward_stats>`); sparsemax's
   and 1.5-entmax's training forward does not sum it (``PSUM`` is 0 there).

The general power takes ``log2`` from the GPU's ``lg2.approx.f32`` with ``FAST_LOG`` (the launcher sets it
when every head's α is at least ``flash_attention.ALPHA_FAST_LOG``; :func:`_log2` gives its error), else
from ``tl.log2``, a software logarithm of about 30 instructions per score and pass.

**Sliding window** (``WINDOWED``, with ``CAUSAL``): query ``i`` sees keys ``i - window < j ≤ i`` (one
unsigned comparison in :func:`_masked`; ``window`` a run-time value).  The first pass of a query block
starts at the key block of its first row's first key (:func:`_window_blocks`) and walks the blocks every
row sees whole first (:func:`_rotated`), so the lists keep the mask-free tiles in front; ``dK, dV``
stops at the last query block that sees its key block; ``dQ`` walks the forward's lists.  The tiles
outside the band are never read: ``O(L · window)`` work.

**Grouped heads**: query head ``h`` reads key/value head ``h // (H / HKV)`` in place (no copy).  One query
head per program in the forward and ``dQ``: a tile holds ``BLOCK_M`` query rows whichever heads they belong to, so
packing a group's heads into it (as :mod:`softargmax.backends.triton.decode_kernels` does, for ``L < BLOCK_M``)
would load each key and value tile as often per query row, and walk a tile wherever any head of the group keeps it.

**Packed sequences** (``VARLEN``): sequence ``b`` is query rows ``CU_Q[b] : CU_Q[b+1]`` and
key rows ``CU_K[b] : CU_K[b+1]`` of ``[1, H, total, D]`` views; each program reads its
sequence's offsets and does nothing past its end.  Lengths, head counts and mask strides are
run-time values (``do_not_specialize``): one compilation per configuration.

**Backward**: with ``g_j = dO·v_j`` the JVP of α-entmax is ``dz_j = s_j (g_j - c)``,
``c = Σ_j s_j g_j / Σ_j s_j = dO·W`` (one dot per row, like FlashAttention-2's
``D = rowsum(dO∘O)``; computed by the caller).  :func:`attention_bwd_dkdv` (one program
per (batch·kv head, key block), looping over the query heads of its group and the query
blocks) accumulates ``dV = Σ_i p_i dO_i`` and ``dK = scale Σ_i dz_i q_i``;
:func:`attention_bwd_dq` (one program per query block) accumulates
``dQ = scale Σ_j dz_j k_j`` and, for a learned α, ``Σ_j g_j p_j log p_j`` per row.  The α
gradient per row (Correia, Niculae & Martins, *Adaptively Sparse Transformers*, EMNLP 2019,
arXiv:1909.00015, supplementary eqs. 26–38):
``⟨g, ∂p/∂α⟩ = (⟨g,p⟩ - c)/a² - (⟨g, p log p⟩ + H(p) c)/a`` with ``⟨g,p⟩ = dO·O`` and
``H(p) = -Σ p log p``; the caller sums it per head.

Empty rows (every key masked: ``m = -inf``) get ``p = 0``, ``O = 0`` and zero gradients.
Rows, tiles and dots accumulate in float32; ``p`` and ``dz`` are cast to the input type for
the tensor-core dots (float32 inputs use IEEE float32 dots).

**Bytes moved and work** (per (batch, head): ``L`` queries, ``S`` keys, head dim ``D``, ``b``
bytes per element, ``n_q = ⌈L/BLOCK_M⌉`` query blocks, ``P`` Newton passes, ``ρ`` the
fraction of tiles kept).  The one-read-one-write floor of the forward is ``b (2LD + 2SD)``
(read ``q, k, v``, write ``O``); this forward reads ``q`` once, the key tiles
``n_q (1 + Pρ')`` times and the value tiles ``n_q ρ`` times (``ρ' ≥ ρ``: tiles still
evaluated while ``t`` rises; FlashAttention-2 reads both ``n_q`` times, mostly from L2), and
writes ``O`` and ``W`` (``2bLD``) plus 5 floats per row and ``n_q ⌈S/BLOCK_N⌉`` bits of the tile map.
Its matrix work is ``2LSD (1 + Pρ' + 2ρ)`` flops against FlashAttention-2's ``4LSD``: the
price of exact thresholds is the ``P`` score passes.  The backward's floor is
``b (3LD + 4SD)`` (read ``q, dO, k, v``, write ``dq, dk, dv``); it reads ``dO`` and ``W``
once more for ``c = dO·W`` (and ``O`` for a learned α), then :func:`attention_bwd_dkdv`
reads ``k, v`` once and the ``q, dO`` tiles ``n_k ρ`` times, :func:`attention_bwd_dq`
reads ``q, dO`` once and the ``k, v`` tiles ``n_q ρ`` times (the tile re-reads are those
of FlashAttention-2), with ``7 · 2LSDρ`` flops (FlashAttention-2: ``5 · 2LSD``: ``QKᵀ``
and ``dO Vᵀ`` are recomputed in both kernels).
"""

import triton
import triton.language as tl

from .interpreter import interpreting
from .row_kernels import KIND_POWER, fast_log2, newton_step, newton_update

#: integer arguments passed as run-time values, never specialized: Triton would otherwise compile
#: one variant per divisibility by 16 (and a constant for the value 1) of each, that is per
#: sequence length, head count and mask layout.  The strides of ``q``, ``k``, ``v`` and ``dO``
#: stay specialized (their divisibility by 16 gives 16-byte loads): with a unit last stride and
#: a head dim that is a power of two >= 16 they are multiples of 16 whatever the lengths.
_RUNTIME = ("H", "HKV", "L", "S", "NQB", "NKB", "max_iter", "window", "stride_mb", "stride_mh", "stride_mm",
            "stride_mn")

#: bins of the start's histogram, each ``1 / HIST_WIDTH`` wide in ``d = a (z - m)``: together they cover
#: ``d ∈ (-2/3, 0]``, where the support is on most rows (the scores below are left out: a lower start).
#: Counted per tile position (one counter per score of a tile, summed over the key blocks: no reduction
#: per tile), ``HIST_BINS + 1`` slots of ``HIST_BITS`` bits packed in one int64: the last slot takes the
#: scores below the bins (never read).  8 bins of 1/12 rather than 4 of 1/4: about 0.3 to 0.45 Newton passes
#: fewer on random rows (a float64 model of the passes at 512 and 2048 keys, 1.5-entmax)
HIST_BINS = tl.constexpr(8)
#: bins per unit of ``d``
HIST_WIDTH = tl.constexpr(12)
#: bits of a slot: a position's count grows by at most 1 per key block
HIST_BITS = tl.constexpr(7)
#: one slot's bits
HIST_SLOT = tl.constexpr(127)
#: key blocks counted in the tile-shaped counters before they are added to the rows' counts
#: (:func:`_hist_flush`): a slot holds up to ``HIST_SLOT``
HIST_CHUNK = tl.constexpr(127)
#: Newton steps on the histogram (in registers, no pass over the keys) that give the start
HIST_STEPS = tl.constexpr(4)
#: the start is taken this much below the histogram's threshold (float32 rounding of the bins) ...
HIST_MARGIN = tl.constexpr(1e-5)
#: ... plus this many times ``|a m|``: the roundings of the bins' ``d_k`` and of each score's bin at that scale
#: (about four float32 units, 2^-22; 5e-7 with room)
HIST_ROUNDING = tl.constexpr(5e-7)
#: the general power's residual ``|Σp - 1|`` from which a row's next Newton step is taken without a pass at it: the
#: output pass evaluates the row there and applies the row solver's test; a row it does not stop goes on with more
#: passes (each at its iterate) and the output pass again, so the thresholds are those of a pass at every iterate.
#: From ``1e-3`` quadratic convergence ends about every row at the next iterate (a float32 model of the passes on
#: random rows at α = 1.1, 1.5 and 1.9); with the rounding floor's stop (:func:`_power_step`) the proxies' input
#: (one head, L = 512, α = 1.5 as a tensor) takes 3.13 passes per query block instead of 4.63
PREDICT_RESIDUAL = tl.constexpr(1e-3)
#: the general power's rounding floor (:func:`_power_step`): a residual of at most this many tolerances (``2 ε``)
FLOOR_TOL = tl.constexpr(4.0)
#: float32's machine epsilon, ``2^-23``
FLOAT32_EPS = tl.constexpr(1.1920928955078125e-07)
#: inline PTX for a few instructions Triton's own lowering spends more on (:func:`_support_key`, :func:`_bin_bit`): off
#: under the interpreter (:func:`~softargmax.backends.triton.interpreter.interpreting`), which runs no inline
#: assembly, as :data:`row_kernels.HW_LOG2 <softargmax.backends.triton.row_kernels.HW_LOG2>`
INLINE_PTX = tl.constexpr(not interpreting())
#: ln 2: ``log p = ln 2 · log2(u) / a`` for ``p = u^{1/a}``
LN2 = tl.constexpr(0.6931471805599453)
#: entries of the tile map read per step when ``attention_bwd_dkdv`` lists its kept tiles, and of the final list
#: per step when the forward sets the map's bits (:func:`_kept_words`)
LIST_CHUNK = tl.constexpr(64)
#: tiles per word of the tile map ``KEPT`` (int32: one bit per tile)
WORD_BITS = tl.constexpr(32)
#: words of the tile map the forward builds per step (:func:`_kept_words`: ``LIST_CHUNK × KEPT_WORDS`` tile-shaped
#: comparisons per step, 8 per thread with 4 warps)
KEPT_WORDS = tl.constexpr(16)


@triton.jit
def _log2(x, HW: tl.constexpr):
    """``log2 x`` for ``x > 0`` (subnormals included), float32.  ``HW``: :func:`row_kernels.fast_log2
    <softargmax.backends.triton.row_kernels.fast_log2>`, the hardware approximation ``lg2.approx.f32`` (one MUFU
    instruction; ``tl.log2`` under the interpreter): absolute error at most about ``max(1, |log2 x|) 2^-22``
    (PTX ISA), against 1/2 ulp of a correctly rounded ``log2``.  In the powers ``u^e = 2^{e log2 u}``
    (``e = 1/a - 1 ≤ 99`` for ``α ≥ 1.01``; the ``exp2`` is already the hardware's ``ex2.approx``) this is a
    relative error of at most ``e · max(1, |log2 u|) · 2^-22 · ln 2`` (``2e-7`` at α = 1.5 and ``2e-5`` at
    α = 1.01 for ``u ≥ 1/2``), where float32 rounding of ``e log2 u`` alone costs ``e |log2 u| · 2^-24 · ln 2``.
    The thresholds and the outputs stay exact to the row solver's tolerance for the powers the kernels compute
    (every pass uses the same ones).  Without ``HW``: ``tl.log2``."""
    if HW:
        r = fast_log2(x)  # the hardware's, but under the interpreter
    else:
        r = tl.log2(x)
    return r


@triton.jit
def _powers(u, a, EXACT: tl.constexpr, HW: tl.constexpr):
    """``(u₊^{1/a}, u₊^{1/a - 1})``."""
    pos = u > 0
    if EXACT == 1:
        p = tl.where(pos, u, 0.0)
        s = tl.where(pos, 1.0, 0.0)
    elif EXACT == 2:
        s = tl.maximum(u, 0.0)  # (0 for NaN too)
        p = s * s
    else:
        p, s, _ = _powers_log(u, a, HW)
    return p, s


@triton.jit
def _powers_log(u, a, HW: tl.constexpr):
    """The general power (``EXACT = 0``): ``(u₊^{1/a}, u₊^{1/a - 1}, lg)`` with ``lg = log2 u`` where
    ``u > 0``, else 0 (one :func:`_log2` and one ``exp2`` per score; ``p log p = ln 2 · p lg / a``)."""
    pos = u > 0
    lg = _log2(tl.where(pos, u, 1.0), HW)
    s = tl.where(pos, tl.exp2(lg * (1.0 / a - 1.0)), 0.0)
    p = s * tl.where(pos, u, 0.0)
    return p, s, lg


@triton.jit
def _hist_add(hist, anchor, m, z, inv_w, inv_wz):
    """Histogram of a score tile for the start (:func:`_hist_start`): ``hist`` (tile-shaped int64, one
    counter per position, reduced over the row by :func:`_hist_flush`) packs ``HIST_BINS + 1`` slots of
    ``HIST_BITS`` bits; ``anchor`` (per row, in units of ``w = 1/inv_w``) is ``⌊m / w⌋``, an integer: bin
    ``k`` stands for the value ``(anchor - k) w``, and every score is counted in the bin just below it,
    ``k = ⌈anchor - z/w⌉`` (above the anchor: bin 0), so the binned values are lower bounds of the scores
    (``z``: the tile's values, ``inv_wz = inv_w`` times the factor :func:`_score_scale` from them to the scores).
    Scores more than ``HIST_BINS - 1`` bins down (and ``-inf``) go to the last slot.  ``m``: the running
    row maximum including this tile (``-inf``: no key yet, anchor ``-1e30``).  The anchor follows it by
    whole bins: the counts shift up by as many slots (the binned values stay the same; the ones pushed
    past the last slot are never read).  Per score: an FMA, a rounding, a clamp, a conversion, a
    multiplication, two shifts and an addition."""
    new = tl.where(m > float("-inf"), tl.floor(m * inv_w), -1e30)
    sh = tl.minimum(new - anchor, HIST_BINS + 1.0).to(tl.int32) * HIST_BITS  # (the first key: all slots out)
    hist = hist << sh.to(tl.int64)[:, None]
    hist += _bin_bit(new[:, None] - z * inv_wz)
    return hist, new


@triton.jit
def _bin_bit(v):
    """``1 << (HIST_BITS k)`` (int64) for the bin ``k = ⌈v⌉`` clamped to ``[0, HIST_BINS]`` (``+inf``: the last
    slot).  On a GPU four instructions: ``cvt.rpi.s32.f32`` (⌈v⌉, saturated), ``min.u32`` (a negative ``k``,
    ``v ≤ -1`` by rounding, goes to the last slot too: left out, which only lowers the start), a multiplication
    and the shift."""
    if INLINE_PTX:
        tl.static_assert((HIST_BINS == 8) & (HIST_BITS == 7), "the constants of _bin_bit's PTX")
        r = tl.inline_asm_elementwise(
            "{\n.reg .b32 k;\ncvt.rpi.s32.f32 k, $1;\nmin.u32 k, k, 8;\nmul.lo.u32 k, k, 7;\nshl.b64 $0, 1, k;\n}",
            "=l,r", [v], dtype=tl.int64, is_pure=True, pack=1)
    else:
        # as the PTX: v <= -1 (a negative ⌈v⌉, -inf) to the last slot, NaN to bin 0
        k = tl.where(v <= -1.0, HIST_BINS * 1.0, tl.minimum(tl.maximum(tl.ceil(v), 0.0), HIST_BINS * 1.0))
        k = k.to(tl.int32) * HIST_BITS
        r = tl.full(v.shape, 1, tl.int64) << k.to(tl.int64)
    return r


@triton.jit
def _hist_flush(hist, anchor, counts, c_anchor):
    """The rows' counts ``counts`` (``[rows, HIST_BINS]`` float32, taken at the anchor ``c_anchor``) plus the
    tile-shaped counters ``hist`` of :func:`_hist_add` (at ``anchor``), at ``anchor``: the old counts move
    down by the bins the anchor rose (those past the last bin are left out).  Returns
    ``(counts, anchor)``; the caller zeroes ``hist``."""
    kb = tl.arange(0, HIST_BINS)
    sh = tl.minimum(anchor - c_anchor, HIST_BINS * 1.0).to(tl.int32)
    out = tl.zeros(counts.shape, tl.float32)
    for j in tl.static_range(HIST_BINS):
        old = tl.sum(tl.where(kb[None, :] == j, counts, 0.0), 1)
        out = tl.where(kb[None, :] == (sh + j)[:, None], old[:, None], out)
        cj = tl.sum(((hist >> (HIST_BITS * j)) & HIST_SLOT).to(tl.int32), 1)  # bin j's counts summed over the row
        out += tl.where(kb[None, :] == j, cj.to(tl.float32)[:, None], 0.0)
    return out, anchor


@triton.jit
def _hist_start(c, anchor, m, a, use, EXACT: tl.constexpr, FAST_LOG: tl.constexpr):
    """The Newton start: ``HIST_STEPS`` Newton steps from ``t = -1`` on the binned row (the counts ``c`` of
    :func:`_hist_flush`; the maximum at ``d = 0``, the other counts at ``d_k = (anchor - k) / HIST_WIDTH -
    a m``: the anchor of :func:`_hist_add` is in bins of ``1 / (a HIST_WIDTH)``), minus ``HIST_MARGIN``, at
    least ``-1``; ``-1`` where not ``use``.  The maximum is counted in the first bin that holds a score (bin
    0; the bins decrease with the score).  Scores lowered to the binned values (or left out) lower the
    threshold, and Newton on the convex ``S^a`` from below stays below the root: the start is below the
    row's threshold (the iterates rise monotonically from it)."""
    kb = tl.arange(0, HIST_BINS)
    first = tl.min(tl.where(c > 0, kb[None, :], HIST_BINS), 1)
    c = tl.where(kb[None, :] == first[:, None], c - 1.0, c)  # the maximum itself, at d = 0
    d = (anchor[:, None] - kb[None, :].to(tl.float32)) * (1.0 / HIST_WIDTH) - (a * m)[:, None]
    d = tl.minimum(d, 0.0)
    t = tl.full(m.shape, -1.0, tl.float32)
    for _ in tl.static_range(HIST_STEPS):
        p, s = _powers(d - t[:, None], a, EXACT, FAST_LOG)
        p0, s0 = _powers(-t, a, EXACT, FAST_LOG)
        t = newton_update(t, tl.sum(c * p, 1) + p0, tl.sum(c * s, 1) + s0, a, KIND_POWER, EXACT)
    # the bins' d_k and the binning of each score round at the scale of |a m|: a few float32 units of it below
    # (a row far from 0, its scores on the bins' edges, was started above its threshold at |a m| >= 1e3)
    t = tl.maximum(t - HIST_MARGIN - tl.abs(a * m) * HIST_ROUNDING, -1.0)
    return tl.where(use & (t == t) & (tl.abs(anchor) < 4194304.0), t, -1.0)  # (2^22: the bins' integers exact)


@triton.jit
def _mm(x, y, DOT: tl.constexpr):
    """``x @ y`` accumulated in float32: tensor cores for half inputs (``DOT = 0``), IEEE
    float32 for float32 inputs (``DOT = 1``); ``DOT = 2``: half operands widened to float32
    first (Triton's interpreter multiplies bfloat16 as raw bits)."""
    if DOT == 1:
        r = tl.dot(x, y, input_precision="ieee")
    elif DOT == 2:
        r = tl.dot(x.to(tl.float32), y.to(tl.float32), input_precision="ieee")
    else:
        r = tl.dot(x, y)
    return r


@triton.jit
def _low(x, like, DOT: tl.constexpr):
    """``x`` cast to the input type for the tensor-core dots (kept in float32 for IEEE dots)."""
    if DOT == 1:
        r = x
    else:
        r = x.to(like.dtype)
    return r


#: the dots and the cast for them, shared with the decoding kernels (:mod:`softargmax.backends.triton.decode_kernels`)
mm, low = _mm, _low


@triton.jit
def _rows_tile(P, base, stride, start, offs, offs_d, n, EDGE: tl.constexpr, TRANS: tl.constexpr,
               HOIST: tl.constexpr):
    """The rows ``start + offs`` of a ``[n, D]`` operand at ``P + base`` (row stride ``stride``, unit column
    stride) as a ``[len(offs), D]`` tile, or ``[D, len(offs)]`` with ``TRANS``.  With ``EDGE`` the rows past
    ``n`` read as 0.  Without, every row is below ``n`` (a tile that needs no mask) and the load takes no mask:
    a comparison and two selections fewer per asynchronous copy.  ``HOIST``: each thread's offsets inside the
    tile (which do not depend on ``start``) are kept out of the loop by the compiler, and a tile's addresses cost
    one 64-bit addition per copy rather than a multiplication and a wide multiply-add, for two more registers
    per copy: the forward's loops take it for half inputs (float32's, twice the copies, spilled at head dimension
    128), the backward kernels (at 128 and 255 registers) do not."""
    if TRANS:
        rows = (start + offs)[None, :]
        inside = offs[None, :] * stride + offs_d[:, None]
        ptr = P + base + rows * stride + offs_d[:, None]
    else:
        rows = (start + offs)[:, None]
        inside = offs[:, None] * stride + offs_d[None, :]
        ptr = P + base + rows * stride + offs_d[None, :]
    if HOIST:
        ptr = P + (base + start * stride) + inside
    if EDGE:
        x = tl.load(ptr, mask=rows < n, other=0.0)
    else:
        x = tl.load(ptr)
    return x


@triton.jit
def _score_tile(q, K, k_base, stride_kn, offs_m, n0, offs_nb, offs_d, L, S, scale,
                MASK, mask_base, stride_mm, stride_mn, window,
                CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr, WINDOWED: tl.constexpr,
                POS_SCALE: tl.constexpr, EDGE: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]`` float32 scores ``scale · q kᵀ + mask`` with an additive mask (``HAS_MASK`` 1) or
    ``scale ≤ 0`` (not ``POS_SCALE``), else the dots ``q kᵀ`` (the caller scales per row what it needs:
    :func:`_score_scale`); with ``EDGE`` ``-inf``
    outside (as :func:`_u_tile`: without, a tile that needs no mask; rows past the end are then scored).  The keys
    ``n0 + offs_nb``."""
    offs_n = n0 + offs_nb
    kt = _rows_tile(K, k_base, stride_kn, n0, offs_nb, offs_d, S, EDGE, True, DOT != 1)
    z = _mm(q, kt, DOT)
    if (HAS_MASK == 1) or (not POS_SCALE):
        z = z * scale
    if EDGE:
        z = _masked(z, offs_m, offs_n, L, S, MASK, mask_base, stride_mm, stride_mn, 1.0, window, CAUSAL, HAS_MASK,
                    WINDOWED)
    return z


@triton.jit
def _score_scale(scale, HAS_MASK: tl.constexpr, POS_SCALE: tl.constexpr):
    """The factor from :func:`_score_tile`'s values to the scores: 1 where it scaled them (an additive mask, or
    ``scale ≤ 0``: not ``POS_SCALE``), else ``scale`` (``scale > 0``: the row maxima of the dots scale to those of
    the scores, and a score's bin is one FMA from its dot; one multiplication per score fewer)."""
    if (HAS_MASK == 1) or (not POS_SCALE):
        r = 1.0
    else:
        r = scale
    return r


@triton.jit
def _u_tile(q, kt, offs_m, offs_n, L, S, ascale, shift, t, a,
            MASK, mask_base, stride_mm, stride_mn, window,
            EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
            WINDOWED: tl.constexpr, EDGE: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]`` float32 ``u`` of a tile from the dot ``x = q kᵀ`` (:func:`_u`; ``kt``: the keys
    ``offs_n`` as a ``[D, BLOCK_N]`` tile, :func:`_rows_tile`); with ``EDGE`` ``-inf`` outside the matrix, where
    masked, above the diagonal and before the window (:func:`_masked`).  Without: a tile inside the matrix,
    below the diagonal and inside the window, with no mask (rows past the end: ``shift = +inf``)."""
    u = _u(_mm(q, kt, DOT), ascale, shift, t, EXACT)
    if EDGE:
        u = _masked(u, offs_m, offs_n, L, S, MASK, mask_base, stride_mm, stride_mn, a, window, CAUSAL, HAS_MASK,
                    WINDOWED)
    return u


@triton.jit
def _listed_u(q, K, ENTRY, k_base, stride_kn, offs_m, offs_nb, offs_d, L, S, ascale, shift, t, a,
              MASK, mask_base, stride_mm, stride_mn, window,
              EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
              WINDOWED: tl.constexpr, BLOCK_N: tl.constexpr, EDGE: tl.constexpr):
    """``(nb, u)`` for the forward's passes over a block's list of kept tiles: the key block ``nb`` of the list's
    entry at ``ENTRY`` and its tile's ``u`` (:func:`_u_tile`), the keys loaded by :func:`_rows_tile` (their
    offsets kept out of the loop for half inputs)."""
    nb = tl.load(ENTRY)
    kt = _rows_tile(K, k_base, stride_kn, nb * BLOCK_N, offs_nb, offs_d, S, EDGE, True, DOT != 1)
    u = _u_tile(q, kt, offs_m, nb * BLOCK_N + offs_nb, L, S, ascale, shift, t, a, MASK, mask_base, stride_mm,
                stride_mn, window, EXACT, CAUSAL, HAS_MASK, DOT, WINDOWED, EDGE)
    return nb, u


@triton.jit
def _free_blocks(pid_m, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_MASK: tl.constexpr):
    """The key blocks ``[0, n)`` whose tiles with query block ``pid_m`` need no mask: whole blocks of keys
    (``< S``), below the causal diagonal (every key at or before the block's first query), no ``attn_mask``.
    The lists walk them first, then the others (the edge tiles: the diagonal's, the last partial one)."""
    if HAS_MASK != 0:
        n = pid_m * 0
    elif CAUSAL:
        n = tl.minimum((pid_m * BLOCK_M + 1) // BLOCK_N, S // BLOCK_N)
    else:
        n = S // BLOCK_N + pid_m * 0
    return n


@triton.jit
def _window_blocks(pid_m, n_blocks, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr):
    """``(first, free0)`` for query block ``pid_m`` under a sliding window: the first key block a row of the
    block sees (its first row's first key ``pid_m · BLOCK_M - window + 1``) and the first one that every row
    sees whole (from its last row's first key on; the tiles without a mask are ``[free0, n)`` of
    :func:`_free_blocks`'s ``n``).  Without a window ``(0, 0)``."""
    first = n_blocks * 0
    free0 = first
    if WINDOWED:
        first = tl.maximum(pid_m * BLOCK_M - window + 1, 0) // BLOCK_N
        free0 = tl.maximum(tl.minimum(tl.cdiv(tl.maximum(pid_m * BLOCK_M + BLOCK_M - window, 0), BLOCK_N), n_blocks),
                           first)
    return first, free0


@triton.jit
def _rotated(kb, first, free0, n_blocks, WINDOWED: tl.constexpr):
    """The key block of the first pass's step ``kb`` (from ``first`` to ``n_blocks - 1``): under a window the
    blocks ``free0, ..., n_blocks - 1`` then ``first, ..., free0 - 1``, so that the tiles without a mask lead the
    lists (:func:`_window_blocks`); else ``kb``."""
    nb = kb
    if WINDOWED:
        nb = kb + (free0 - first)
        nb = tl.where(nb >= n_blocks, nb - (n_blocks - first), nb)
    return nb


@triton.jit
def _u(x, ascale, shift, t, EXACT: tl.constexpr):
    """``u = a (z - m) - t`` from the dots ``x`` (``z = scale · x``; ``ascale = a · scale``).  Sparsemax and
    1.5-entmax: one FMA per score from the absolute threshold ``shift = τ = a m + t``, ``u = ascale · x - τ``
    (the passes solve for ``τ``: its rounding is that of the threshold; an additive mask adds ``a`` times
    its value).  The general power: ``(ascale · x - a m) - t`` with ``shift = a m``, an FMA and a
    subtraction, whose rounding is that of ``u`` rather than of ``τ``: its stopping test is
    ``|Σp - 1| ≤ 2 ε``, which a threshold rounded at the scale of ``|τ|`` could miss."""
    u = x * ascale - shift[:, None]
    if EXACT == 0:
        u = u - t[:, None]
    return u


@triton.jit
def _shift(m, t, a, EXACT: tl.constexpr):
    """The per-row ``shift`` of :func:`_u`: ``τ = a m + t`` (sparsemax, 1.5-entmax) or ``a m``."""
    if EXACT == 0:
        r = a * m
    else:
        r = a * m + t
    return r


@triton.jit
def _masked(z, offs_m, offs_n, L, S, MASK, mask_base, stride_mm, stride_mn, weight, window,
            CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, WINDOWED: tl.constexpr):
    """``z`` with the mask applied (``HAS_MASK`` 1: additive float, times ``weight``, 2: boolean as bytes)
    and ``-inf`` outside the matrix, above the causal diagonal and, with ``WINDOWED`` (always with ``CAUSAL``),
    outside the sliding window (key ``j`` of query ``i`` is kept when ``i - window < j ≤ i``)."""
    valid = (offs_m[:, None] < L) & (offs_n[None, :] < S)
    if HAS_MASK != 0:
        # 64-bit offsets: a full [L, S] mask passes 2^31 entries at L = S = 46341
        moffs = mask_base + offs_m.to(tl.int64)[:, None] * stride_mm + offs_n[None, :] * stride_mn
        if HAS_MASK == 1:
            z = z + weight * tl.load(MASK + moffs, mask=valid, other=0.0).to(tl.float32)
        else:
            valid = valid & (tl.load(MASK + moffs, mask=valid, other=0) != 0)
    if WINDOWED:  # (the launcher sets CAUSAL too) 0 <= i - j < window in one unsigned comparison
        valid = valid & ((offs_m[:, None] - offs_n[None, :]).to(tl.uint32) < window.to(tl.uint32))
    elif CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    return tl.where(valid, z, float("-inf"))


@triton.jit
def _smallest2(a1, a2, b1, b2):
    """The two smallest of two sorted pairs, sorted."""
    return tl.minimum(a1, b1), tl.minimum(tl.maximum(a1, b1), tl.minimum(a2, b2))


@triton.jit
def _support_key(u):
    """``(key, c)`` of a tile's ``u`` for the support's accumulators (:func:`_support_add`): ``key``, the bits of
    ``u`` as ``uint32``, which order the scores with a clear sign bit (``u ≥ +0``) as ``u`` and put every other
    (``u ≤ -0``, ``-inf``) above them all, so that the support's smallest ``u`` are unsigned minima of the bits,
    with no selection; ``c`` 1.0 where the sign bit is clear, else 0.0: the support as the closed form
    (:func:`_certified_step`) counts it, from one instruction (PTX ``set``).  A score at ``u = +0`` is counted
    with ``p = s = 0``: then the smallest ``u`` is 0 and the step drops it (:func:`_drop`)."""
    bits = u.to(tl.int32, bitcast=True)
    if INLINE_PTX:
        c = tl.inline_asm_elementwise("set.ge.f32.s32 $0, $1, 0;", "=r,r", [bits], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        c = tl.where(bits >= 0, 1.0, 0.0)
    return bits.to(tl.uint32, bitcast=True), c


@triton.jit
def _no_key(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The smallest-``u`` trackers' start: every bit set, above every :func:`_support_key`."""
    return tl.full([BLOCK_M, BLOCK_N], -1, tl.int32).to(tl.uint32, bitcast=True)


@triton.jit
def _key_value(key):
    """A row's smallest ``u`` from its :func:`_support_key`: the float where it is one of ``u ≥ +0``, finite;
    ``+inf`` (none) else."""
    ki = key.to(tl.int32, bitcast=True)
    return tl.where((ki >= 0) & (ki < 0x7F800000), ki.to(tl.float32, bitcast=True), float("inf"))


@triton.jit
def _support_add(S, Sp, n, k1, k2, p, s, u, EXACT: tl.constexpr):
    """A tile's scores added to the running accumulators of a pass: per row ``Σp``, ``Σs`` and, for
    sparsemax and 1.5-entmax, the support's size (``S``, ``Sp``, ``n``: the tile's sums, reduced over its
    row); in tile-shaped registers (reduced once per pass, by :func:`_support_sums`) the keys
    (:func:`_support_key`) of the two smallest ``u`` of the support per position, sorted (where fewer, a key
    with the sign bit set, which :func:`_key_value` reads as none).  Also returns whether the tile holds a ``u ≥ 0`` (sparsemax and 1.5-entmax: from the tile's counts)
    or an ``s > 0`` (the general power: from its sums of ``s``, one reduction per row rather than one per score).
    Sparsemax: ``Σp = Σ u₊`` and ``Σs = n`` (kept in ``Sp``; ``p``, ``s`` and ``n`` are not read).  Per score of
    1.5-entmax: the count's ``set`` and addition, the two sums' FMA and addition, and an unsigned minimum, maximum
    and minimum for the keys."""
    if EXACT == 0:
        srow = tl.sum(s, 1)
        S += tl.sum(p, 1)
        Sp += srow
        keep = tl.max(srow, 0) > 0  # (s > 0 where u > 0 but for an underflow, where p = 0 too, for every later t)
    else:
        key, c = _support_key(u)
        cnt = tl.sum(c, 1)
        if EXACT == 1:
            S += tl.sum(tl.maximum(u, 0.0), 1)
            Sp += cnt
        else:
            S += tl.sum(p, 1)
            Sp += tl.sum(s, 1)
            n += cnt
        k2 = tl.minimum(k2, tl.maximum(k1, key))
        k1 = tl.minimum(k1, key)
        keep = tl.max(cnt, 0) > 0
    return S, Sp, n, k1, k2, keep


@triton.jit
def _support_sums(S, Sp, n, k1, k2, EXACT: tl.constexpr):
    """The accumulators of :func:`_support_add` per row: ``(Σp, Σs, n, k1 ≤ k2)`` (the smallest ``u``
    reduced over the row, as floats: :func:`_key_value`; the general power: ``Σp``, ``Σs`` and placeholders)."""
    if EXACT != 0:
        k1, k2 = tl.reduce((k1, k2), 1, _smallest2)
        k1 = _key_value(k1)
        k2 = _key_value(k2)
        if EXACT == 1:
            n = Sp
    else:
        n, k1, k2 = S, S, S
    return S, Sp, n, k1, k2


@triton.jit
def _closed_form(S, Sp, n, EXACT: tl.constexpr):
    """``(δ, ok)``: the step ``δ`` that solves ``Σ_j (u_j - δ)^{1/a} = 1`` over a fixed support of ``n``
    scores, from ``S = Σ u^{1/a}`` and ``Sp = Σ u^{1/a - 1}``: 1.5-entmax ``n δ² - 2 Sp δ + S - 1 = 0``,
    the smaller root in the stable form ``(S - 1) / (Sp + √(Sp² - n (S - 1)))``; sparsemax
    ``δ = (S - 1) / n``.  ``ok``: a root exists (a support of at least one score)."""
    if EXACT == 2:
        disc = Sp * Sp - n * (S - 1.0)
        den = Sp + tl.sqrt(tl.maximum(disc, 0.0))
        delta = (S - 1.0) / tl.where(den > 0, den, 1.0)
        ok = (disc >= 0) & (n > 0)
    else:
        delta = (S - 1.0) / tl.maximum(n, 1.0)
        ok = n > 0
    return delta, ok


@triton.jit
def _drop(S, Sp, n, k, EXACT: tl.constexpr):
    """The support's sums without the score ``k`` (``k = +inf``: none)."""
    there = k < float("inf")
    kk = tl.where(there, k, 0.0)
    if EXACT == 2:
        S = S - kk * kk
        Sp = Sp - kk
    else:
        S = S - kk
        Sp = Sp - tl.where(there, 1.0, 0.0)
    return S, Sp, n - tl.where(there, 1.0, 0.0)


@triton.jit
def _certified_step(t, S, Sp, n, k1, k2, it, last, tol, max_iter, a, EXACT: tl.constexpr):
    """The step after a pass at ``t`` (below the root) for sparsemax and 1.5-entmax: ``(t', done, last)``.

    The support at the root is the scores above it; the sums at ``t`` (``S``, ``Sp``, the support's size
    ``n`` and its two smallest ``u``, ``k1 ≤ k2``) give the root in closed form for the support, and for
    the support without its smallest score (``r = 1``).  A candidate ``δ`` is *certified* when the support
    it assumes is the one at ``t + δ``: ``k_r ≤ δ ≤ k_{r+1}`` (``k_0 = 0``): the scores it keeps stay
    positive and the ones it drops do not.  (Dropping a second score too certified few more rows: on
    random rows about 0.03 passes more without it, for two fewer instructions per score and pass.)  Then ``t' = t + δ`` is the threshold (up to the
    rounding of the sums) and the row is done without another pass.  Otherwise the Newton step on
    ``S^a`` (below the root) and another pass.  A row is also done when ``|S - 1| ≤ tol`` at ``t``, when
    the residual stops decreasing (from the third pass: rounding), when the step does not move ``t`` up,
    or after ``max_iter`` passes."""
    resid = tl.abs(S - 1.0)
    stop = (it >= max_iter) | (resid <= tol) | ((it > 1) & (resid >= last))
    if it > 1:
        last = resid
    d0, ok0 = _closed_form(S, Sp, n, EXACT)
    S1, Sp1, n1 = _drop(S, Sp, n, k1, EXACT)
    d1, ok1 = _closed_form(S1, Sp1, n1, EXACT)
    c0 = ok0 & (d0 >= 0) & (d0 <= k1)
    c1 = ok1 & (d1 >= k1) & (d1 <= k2)
    cert = c0 | c1
    delta = tl.where(c0, d0, d1)
    tn = tl.where(cert, t + delta, newton_update(t, S, Sp, a, KIND_POWER, EXACT))
    tn = tl.where(stop & (cert == 0), t, tn)
    tn = tl.where(tn >= t, tn, t)  # never down (rounding), NaN: stays
    done = stop | cert | (tn == t)
    return tn, done, last


@triton.jit
def _sequence(CU, b, n_dense, VARLEN: tl.constexpr):
    """``(start, length)`` of sequence ``b``: from the cumulative lengths ``CU`` of a packed
    batch (``VARLEN``), else ``(0, n_dense)``."""
    if VARLEN:
        start = tl.load(CU + b)
        n = tl.load(CU + b + 1) - start
    else:
        start = b * 0
        n = n_dense + b * 0
    return start, n


@triton.jit
def _max_pass(q, K, k_base, stride_kn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, MASK, mask_base,
              stride_mm, stride_mn, window, LIST, list_base, pid_m, n_blocks, CAUSAL: tl.constexpr,
              HAS_MASK: tl.constexpr, DOT: tl.constexpr, WINDOWED: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, POS_SCALE: tl.constexpr):
    """The forward's first pass (:func:`attention_fwd`, step 1): ``(m, counts, anchor, n_list, n_free)``, the row
    maxima, the histogram of :func:`_hist_flush` at its anchor, and the list of the tiles the Newton passes
    read (written at ``LIST + list_base``), its first ``n_free`` entries without a mask."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    anchor = tl.full([BLOCK_M], -1e30, tl.float32)
    hist = tl.zeros([BLOCK_M, BLOCK_N], tl.int64)
    counts = tl.zeros([BLOCK_M, HIST_BINS], tl.float32)
    c_anchor = anchor
    zs = _score_scale(scale, HAS_MASK, POS_SCALE)  # scores = zs · the tiles of _score_tile
    inv_w = a * HIST_WIDTH
    inv_wz = inv_w * zs
    n_list = 0
    n_free = 0
    n_counted = 0  # key blocks in hist since the last flush
    n_free_blocks = _free_blocks(pid_m, Sb, BLOCK_M, BLOCK_N, CAUSAL, HAS_MASK)
    first, free0 = _window_blocks(pid_m, n_blocks, window, BLOCK_M, BLOCK_N, WINDOWED)
    # the steps over the tiles without a mask (blocks free0, ..., n_free_blocks - 1 lead the rotated order)
    free_end = first + tl.minimum(tl.maximum(n_free_blocks - free0, 0), tl.maximum(n_blocks - first, 0))
    # with a mask every tile is an edge tile and the first loop (the tiles without one) never runs: float32's
    # IEEE-dot kernels leave it out (with it, at head dimension 128, they spilled 56-872 bytes), the half kernels
    # keep it (without it, in 64 x 32 tiles, they spilled 124); so do the Newton, output and dQ loops
    for part in tl.static_range(1 if (HAS_MASK != 0) and (DOT == 1) else 0, 2):
        lo_p = first if part == 0 else free_end
        hi_p = free_end if part == 0 else n_blocks
        for c0 in range(lo_p, hi_p, HIST_CHUNK):  # (one chunk up to 127 key blocks: 8128 keys in 64-key tiles)
            c1 = tl.minimum(c0 + HIST_CHUNK, hi_p)
            if n_counted + (c1 - c0) > HIST_CHUNK:  # a slot could overflow: the counts so far to the rows'
                counts, c_anchor = _hist_flush(hist, anchor, counts, c_anchor)
                hist = tl.zeros([BLOCK_M, BLOCK_N], tl.int64)
                n_counted = 0
            for kb in range(c0, c1):
                nb = _rotated(kb, first, free0, n_blocks, WINDOWED)
                z = _score_tile(q, K, k_base, stride_kn, offs_m, nb * BLOCK_N, offs_nb, offs_d, Lb, Sb, scale, MASK,
                                mask_base, stride_mm, stride_mn, window, CAUSAL, HAS_MASK, DOT, WINDOWED, POS_SCALE,
                                part == 1)
                zmax = tl.max(z, 1) * zs
                m = tl.maximum(m, zmax)
                # (rows past the end: not scored; -inf: no key yet)
                gap = tl.max(tl.where(rmask, zmax - tl.where(m == float("-inf"), 0.0, m), float("-inf")), 0)
                keep = a * gap + 1.0 > 0
                tl.store(LIST + list_base + n_list, nb, mask=keep)
                n_list += keep.to(tl.int32)
                hist, anchor = _hist_add(hist, anchor, m, z, inv_w, inv_wz)
            n_counted += c1 - c0
        if part == 0:
            n_free = n_list  # the list's entries without a mask (listed first)
    counts, anchor = _hist_flush(hist, anchor, counts, c_anchor)
    return m, counts, anchor, n_list, n_free


@triton.jit(do_not_specialize=_RUNTIME)
def attention_fwd(Q, K, V, O, Wv, MASK, A, MROW, TROW, SHIFT, SSUM, PSUM, PLOGP, REDO, KEPT, ITERS, LIST, CU_Q, CU_K,
                  H, HKV, L, S, NQB, NKB, scale, tol, max_iter, window,
                  stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn, stride_yb, stride_yh, stride_yl,
                  stride_mb, stride_mh, stride_mm, stride_mn,
                  EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
                  VARLEN: tl.constexpr, FAST_LOG: tl.constexpr, WINDOWED: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, STATS: tl.constexpr = False,
                  REPAIR: tl.constexpr = False, PREDICT: tl.constexpr = True, POS_SCALE: tl.constexpr = True):
    """One (batch·head, query block): threshold, output, and the rows the backward needs.

    Dense: ``L``, ``S`` the lengths.  Packed (``VARLEN``): ``L``, ``S`` the total lengths and
    sequence ``b`` the rows ``CU_Q[b] : CU_Q[b+1]`` (keys ``CU_K[b] : CU_K[b+1]``); the batch
    strides are unused.  ``NQB``/``NKB``: query/key blocks of the lists and of the tile map ``KEPT``
    (``[B·H, NQB, ⌈NKB / 32⌉]`` int32, one bit per tile, every word written here).  The per-row
    outputs (``Wv`` and the row statistics) are indexed ``(b·H + h)·L + i`` (dense) or
    ``h·L + CU_Q[b] + i`` (packed); ``O`` by its strides.  ``WINDOWED`` (with ``CAUSAL``): query ``i`` sees
    keys ``i - window < j ≤ i`` only, and the key blocks wholly before its block's window are never read."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    q0, Lb = _sequence(CU_Q, b, L, VARLEN)
    k0, Sb = _sequence(CU_K, b, S, VARLEN)
    if VARLEN:
        q_base = q0.to(tl.int64) * stride_ql + h * stride_qh
        k_base = k0.to(tl.int64) * stride_kn + hk * stride_kh
        v_base = k0.to(tl.int64) * stride_vn + hk * stride_vh
    else:
        q_base = b.to(tl.int64) * stride_qb + h * stride_qh
        k_base = b.to(tl.int64) * stride_kb + hk * stride_kh
        v_base = b.to(tl.int64) * stride_vb + hk * stride_vh
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_nb = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rmask = offs_m < Lb
    mask_base = b.to(tl.int64) * stride_mb + h * stride_mh
    a = tl.load(A + h).to(tl.float32)
    if CAUSAL:
        hi = tl.minimum(Sb, (pid_m + 1) * BLOCK_M)
    else:
        hi = Sb
    hi = tl.where(pid_m * BLOCK_M < Lb, hi, 0)  # a query block past this sequence's end: no work
    n_blocks = tl.cdiv(hi, BLOCK_N)
    n_words = tl.cdiv(NKB, WORD_BITS)
    # this block's lists of kept tiles: two halves [0, NKB) and [NKB, 2 NKB), then the final list's length, half
    # and entries without a mask
    list_base = (bh.to(tl.int64) * NQB + pid_m) * (2 * NKB + 3)
    if REPAIR:
        # the general power's second launch: the query blocks where the output pass's evaluation went on (REDO) take
        # the step from its sums, the passes to the end and the output pass again; the others return
        go = tl.load(REDO + _row_index(bh, h, q0, L, offs_m, VARLEN), mask=rmask, other=0.0) > 0
        work = tl.sum(go.to(tl.int32), 0) > 0
    else:
        go = rmask  # (set by the max pass below)
        work = True
    if work:
        q = tl.load(Q + q_base + offs_m[:, None] * stride_ql + offs_d[None, :], mask=rmask[:, None], other=0.0)
        if REPAIR:
            row = _row_index(bh, h, q0, L, offs_m, VARLEN)
            m = tl.load(MROW + row, mask=rmask, other=float("-inf"))
            empty = m == float("-inf")
            m = tl.where(empty, 0.0, m)
            t = tl.load(TROW + row, mask=rmask, other=0.0)
            Ssum = tl.load(PSUM + row, mask=rmask, other=1.0)
            Sp = tl.load(SSUM + row, mask=rmask, other=1.0)
            it = tl.load(ITERS + bh.to(tl.int64) * NQB + pid_m)
            n_list = tl.load(LIST + list_base + 2 * NKB)
            src = tl.load(LIST + list_base + 2 * NKB + 1)
            n_free = tl.load(LIST + list_base + 2 * NKB + 2)
            # newton_step at that evaluation: its residual is the next test's (from the third evaluation on)
            last = tl.where(it > 1, tl.abs(Ssum - 1.0), float("inf"))
            t = tl.where(go, newton_update(t, Ssum, Sp, a, KIND_POWER, EXACT), t)
            it += 1
        else:
            # -- pass 1: row maxima, and per tile a bound on u at every later t --------------------------
            # u_ij = a (z_ij - m_i) - t_i <= a max_ij (z_ij - m_i') + 1 with m_i' <= m_i the running
            # maximum and t_i >= -1: a tile where this bound is <= 0 has p = 0 from the first Newton pass on
            # the same pass bins the scores for the start (bins 1/HIST_WIDTH wide in d = a (z - m)); the tiles
            # without a mask first (in the order of the lists), then the edge tiles
            m, counts, anchor, n_list, n_free = _max_pass(q, K, k_base, stride_kn, offs_m, offs_nb, offs_d, rmask, Lb,
                                                          Sb, scale, a, MASK, mask_base, stride_mm, stride_mn, window,
                                                          LIST, list_base, pid_m, n_blocks, CAUSAL, HAS_MASK, DOT,
                                                          WINDOWED, BLOCK_M, BLOCK_N, POS_SCALE)
            empty = m == float("-inf")
            m = tl.where(empty, 0.0, m)
            # -- Newton passes from the histogram's start until every row of the block is solved ------
            t = _hist_start(counts, anchor, m, a, empty == 0, EXACT, FAST_LOG)
            go = rmask & (empty == 0)
            last = tl.full([BLOCK_M], float("inf"), tl.float32)
            it = 0
            src = 0  # the half of the list this pass reads (the other one receives the tiles still kept)
        pending = go & (go == 0)  # (none yet) rows whose last step awaits the output pass's check (EXACT 0)
        t, pending, last, it, src, n_list, n_free = _newton_passes(
            q, K, k_base, stride_kn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, m, t, go, pending, last, it,
            tol, max_iter, MASK, mask_base, stride_mm, stride_mn, window, LIST, list_base, src, n_list, n_free, NKB,
            EXACT, CAUSAL, HAS_MASK, DOT, FAST_LOG, WINDOWED, BLOCK_M, BLOCK_N, PREDICT and not REPAIR)
        # -- output pass ------------------------------------------------------------------------
        Ssum, Sp = _output_pass(
            q, K, V, k_base, v_base, stride_kn, stride_vn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, m, t,
            empty, MASK, mask_base, stride_mm, stride_mn, window, LIST, list_base, src, n_list, n_free, NKB, O, Wv,
            MROW, TROW, SHIFT, SSUM, PSUM, PLOGP, KEPT, n_words, bh, pid_m, NQB, L, stride_yb, stride_yh, stride_yl, b,
            h, q0, EXACT, CAUSAL, HAS_MASK, DOT, FAST_LOG, WINDOWED, VARLEN, STATS, BLOCK_M, BLOCK_N, HEAD_DIM)
        if (EXACT == 0) and PREDICT and (not REPAIR):
            # the rows whose last step awaited the output pass's evaluation and that the row solver's test does not stop
            # there: the second launch (REPAIR) goes on with them (PREDICT_RESIDUAL)
            _, stop, _ = _power_step(t, Ssum, Sp, it, last, tol, max_iter, a)
            tl.store(REDO + _row_index(bh, h, q0, L, offs_m, VARLEN), (pending & (stop == 0)).to(tl.float32),
                     mask=rmask)
        tl.store(ITERS + bh.to(tl.int64) * NQB + pid_m, it)


@triton.jit
def _power_step(t, S, Sp, it, last, tol, max_iter, a):
    """The general power's stopping test and next iterate after an evaluation at ``t`` (``S = Σp``, ``Sp = Σs``):
    ``(tn, stop, last)`` of the row solver's :func:`~softargmax.backends.triton.row_kernels.newton_step`, which also
    stops a row at its float32 rounding floor: a residual of at most ``FLOOR_TOL`` tolerances whose step moves ``t``
    by at most ``ε |t|`` (one or two units of its last place; the next evaluation, at about the same residual, would stop the row on
    the residual's stagnation; here the row stops a pass earlier).  On the attention proxies' input (one head,
    L = 512, α = 1.5 as a tensor) the query blocks take 3.13 passes instead of 4.13 and none needs the forward's
    second launch (4 of 8 did), every row ending within ``4.8e-7`` of ``Σp = 1`` (``2.4e-7`` before; 4 ε float32)."""
    tn, stop, last = newton_step(t, S, Sp, S, S, it, last, tol, max_iter, a, KIND_POWER, 0, True)
    floor = (tl.abs(S - 1.0) <= FLOOR_TOL * tol) & (tl.abs(tn - t) <= FLOAT32_EPS * tl.abs(t))
    return tn, stop | floor, last


@triton.jit
def _row_index(bh, h, q0, L, offs_m, VARLEN: tl.constexpr):
    """The indices of the per-row outputs of the query rows ``offs_m``: ``(b·H + h)·L + i`` (dense) or
    ``h·L + CU_Q[b] + i`` (packed)."""
    if VARLEN:
        row = h.to(tl.int64) * L + q0 + offs_m
    else:
        row = bh.to(tl.int64) * L + offs_m
    return row


@triton.jit
def _newton_passes(q, K, k_base, stride_kn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, m, t, go, pending,
                   last, it, tol, max_iter, MASK, mask_base, stride_mm, stride_mn, window, LIST, list_base, src, n_list,
                   n_free, NKB, EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
                   FAST_LOG: tl.constexpr, WINDOWED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   PREDICT: tl.constexpr = True):
    """The forward's Newton passes (:func:`attention_fwd`, step 2) while a row of ``go`` goes on, from ``t``: each
    walks the list of kept tiles at ``src`` (``n_list`` entries, the first ``n_free`` without a mask); the first
    writes the next one, the tiles that hold a ``u ≥ 0`` at its ``t``, which the later passes (at larger ``t``)
    walk too: a tile's test is a reduction over the block's rows, across its warps (two barriers), which they
    leave out (but with float32's IEEE dots, ``DOT = 1``, whose two different loops spilled at head dimension
    128).  Returns ``(t, pending, last, it, src, n_list, n_free)``.  Sparsemax and 1.5-entmax:
    :func:`_certified_step`.  The general power: the row solver's step; with ``PREDICT``, a row whose residual is at
    most ``PREDICT_RESIDUAL`` takes its next step with no pass of its own, joining ``pending``: the output pass
    evaluates it there."""
    if tl.sum(go.to(tl.int32), 0) > 0:
        t, go, pending, last, src, n_list, n_free = _newton_pass(
            q, K, k_base, stride_kn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, m, t, go, pending, last, it,
            tol, max_iter, MASK, mask_base, stride_mm, stride_mn, window, LIST, list_base, src, n_list, n_free, NKB,
            EXACT, CAUSAL, HAS_MASK, DOT, FAST_LOG, WINDOWED, BLOCK_M, BLOCK_N, PREDICT, True)
        it += 1
    while tl.sum(go.to(tl.int32), 0) > 0:
        t, go, pending, last, src, n_list, n_free = _newton_pass(
            q, K, k_base, stride_kn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, m, t, go, pending, last, it,
            tol, max_iter, MASK, mask_base, stride_mm, stride_mn, window, LIST, list_base, src, n_list, n_free, NKB,
            EXACT, CAUSAL, HAS_MASK, DOT, FAST_LOG, WINDOWED, BLOCK_M, BLOCK_N, PREDICT, DOT == 1)
        it += 1
    return t, pending, last, it, src, n_list, n_free


@triton.jit
def _newton_pass(q, K, k_base, stride_kn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, m, t, go, pending, last,
                 it, tol, max_iter, MASK, mask_base, stride_mm, stride_mn, window, LIST, list_base, src, n_list,
                 n_free, NKB, EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
                 FAST_LOG: tl.constexpr, WINDOWED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 PREDICT: tl.constexpr, COMPACT: tl.constexpr):
    """One pass of :func:`_newton_passes` (the ``it``-th) at ``t`` and the step after it: ``(t, go, pending, last,
    src, n_list, n_free)``.  With ``COMPACT`` it writes the tiles that hold a ``u ≥ 0`` (the general power: an
    ``s > 0``) to the other half of the block's lists, which becomes the list."""
    tl.debug_barrier()  # the list written by the last pass, complete for every thread
    dst = NKB - src
    n_next = 0
    shift = tl.where(rmask, _shift(m, t, a, EXACT), float("inf"))
    ascale = a * scale
    S2 = tl.zeros([BLOCK_M], tl.float32)
    Sp2 = tl.zeros([BLOCK_M], tl.float32)
    n2 = tl.zeros([BLOCK_M], tl.float32)
    q1 = _no_key(BLOCK_M, BLOCK_N)
    q2 = _no_key(BLOCK_M, BLOCK_N)
    n_next_free = 0
    for part in tl.static_range(1 if (HAS_MASK != 0) and (DOT == 1) else 0, 2):  # unmasked tiles, then the edge
        for i in range(0 if part == 0 else n_free, n_free if part == 0 else n_list):
            nb, u = _listed_u(q, K, LIST + list_base + src + i, k_base, stride_kn, offs_m, offs_nb, offs_d, Lb, Sb,
                              ascale, shift, t, a, MASK, mask_base, stride_mm, stride_mn, window, EXACT, CAUSAL,
                              HAS_MASK, DOT, WINDOWED, BLOCK_N, part == 1)
            p, s = _powers(u, a, EXACT, FAST_LOG)
            S2, Sp2, n2, q1, q2, keep = _support_add(S2, Sp2, n2, q1, q2, p, s, u, EXACT)
            if COMPACT:  # (else keep's reduction over the rows is dead code)
                tl.store(LIST + list_base + dst + n_next, nb, mask=keep)
                n_next += keep.to(tl.int32)
        if part == 0:
            n_next_free = n_next
    if COMPACT:
        n_list = n_next
        n_free = n_next_free
        src = dst
    Ssum, Sp, cnt, k1, k2 = _support_sums(S2, Sp2, n2, q1, q2, EXACT)
    if EXACT == 0:
        tn, stop, last = _power_step(t, Ssum, Sp, it, last, tol, max_iter, a)
        go = (go | pending) & (stop == 0)  # (a pending row at its iterate: this pass evaluates it)
        t = tl.where(go, tn, t)
        if PREDICT:
            pending = go & (tl.abs(Ssum - 1.0) <= PREDICT_RESIDUAL)
            go = go & (pending == 0)
    else:
        tn, stop, last = _certified_step(t, Ssum, Sp, cnt, k1, k2, it, last, tol, max_iter, a, EXACT)
        t = tl.where(go, tn, t)
        go = go & (stop == 0)
    return t, go, pending, last, src, n_list, n_free


@triton.jit
def _output_pass(q, K, V, k_base, v_base, stride_kn, stride_vn, offs_m, offs_nb, offs_d, rmask, Lb, Sb, scale, a, m,
                 t, empty, MASK, mask_base, stride_mm, stride_mn, window, LIST, list_base, src, n_list, n_free, NKB, O,
                 Wv, MROW, TROW, SHIFT, SSUM, PSUM, PLOGP, KEPT, n_words, bh, pid_m, NQB, L, stride_yb, stride_yh,
                 stride_yl, b, h, q0, EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                 DOT: tl.constexpr, FAST_LOG: tl.constexpr, WINDOWED: tl.constexpr, VARLEN: tl.constexpr,
                 STATS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The forward's output pass (:func:`attention_fwd`, step 4) at ``t`` over the list at ``src``, and its stores: the
    output, ``W``, the rows the backward needs, the final list and the tile map.
    Returns ``(Σp, Σs)`` per row (``Σp`` is summed for the general power, whose output pass is also an evaluation of
    the Newton passes, and with ``STATS``: 0 else)."""
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    accw = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    Sp = tl.zeros([BLOCK_M], tl.float32)
    Ssum = tl.zeros([BLOCK_M], tl.float32)
    plogp = tl.zeros([BLOCK_M], tl.float32)
    tl.debug_barrier()
    dst = NKB - src
    n_next = 0
    shift = tl.where(rmask, _shift(m, t, a, EXACT), float("inf"))
    ascale = a * scale
    n_next_free = 0
    for part in tl.static_range(1 if (HAS_MASK != 0) and (DOT == 1) else 0, 2):  # unmasked tiles, then the edge
        for i in range(0 if part == 0 else n_free, n_free if part == 0 else n_list):
            nb, u = _listed_u(q, K, LIST + list_base + src + i, k_base, stride_kn, offs_m, offs_nb, offs_d, Lb, Sb,
                              ascale, shift, t, a, MASK, mask_base, stride_mm, stride_mn, window, EXACT, CAUSAL,
                              HAS_MASK, DOT, WINDOWED, BLOCK_N, part == 1)
            if EXACT == 0:  # Σ p log p too (the α gradient's): log p = ln 2 · log2(u) / a from the power's log2
                p, s, lg = _powers_log(u, a, FAST_LOG)
                plogp += tl.sum(p * lg, 1)
            else:
                p, s = _powers(u, a, EXACT, FAST_LOG)
            srow = tl.sum(s, 1)
            if EXACT == 0:  # (from s, the general power's forward took 60 more registers and spilled)
                smax = tl.max(tl.max(u, 1), 0)
            else:  # > 0 where a u > 0 (s = u₊ or 1[u > 0]): one reduction per row instead of one per score
                smax = tl.max(srow, 0)
            keep = smax > 0
            tl.store(LIST + list_base + dst + n_next, nb, mask=keep)
            n_next += keep.to(tl.int32)
            v = _rows_tile(V, v_base, stride_vn, nb * BLOCK_N, offs_nb, offs_d, Sb, part == 1, False, DOT != 1)
            acc += _mm(_low(p, v, DOT), v, DOT)
            accw += _mm(_low(s, v, DOT), v, DOT)
            if EXACT == 0:
                Ssum += tl.sum(p, 1)
            elif STATS:
                Ssum += tl.sum(p, 1)
            Sp += srow
        if part == 0:
            n_next_free = n_next
    plogp = plogp * (LN2 / a)
    w = accw / tl.where(Sp > 0, Sp, 1.0)[:, None]
    # the output offsets, computed here rather than kept live through the passes (registers)
    if VARLEN:
        y_base = q0.to(tl.int64) * stride_yl + h * stride_yh
    else:
        y_base = b.to(tl.int64) * stride_yb + h * stride_yh
    row = _row_index(bh, h, q0, L, offs_m, VARLEN)
    tl.store(O + y_base + offs_m[:, None] * stride_yl + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=rmask[:, None])
    tl.store(Wv + row[:, None] * HEAD_DIM + offs_d[None, :], w.to(Wv.dtype.element_ty), mask=rmask[:, None])
    tl.store(MROW + row, tl.where(empty, float("-inf"), m), mask=rmask)
    tl.store(TROW + row, t, mask=rmask)
    tl.store(SHIFT + row, tl.where(empty, float("inf"), shift), mask=rmask)  # (+inf: u = -inf on an empty row)
    tl.store(SSUM + row, Sp, mask=rmask)
    tl.store(PSUM + row, Ssum, mask=rmask)
    tl.store(PLOGP + row, plogp, mask=rmask)
    tl.store(LIST + list_base + 2 * NKB, n_next)  # the kept tiles, for attention_bwd_dq
    tl.store(LIST + list_base + 2 * NKB + 1, dst)
    tl.store(LIST + list_base + 2 * NKB + 2, n_next_free)
    tl.debug_barrier()  # the final list, complete for every thread
    _kept_words(LIST + list_base + dst, n_next, KEPT + (bh.to(tl.int64) * NQB + pid_m) * n_words, n_words,
                LIST_CHUNK, KEPT_WORDS)
    return Ssum, Sp


@triton.jit
def _saved_shift(MROW, TROW, SHIFT, row, rmask, a, EXACT: tl.constexpr):
    """The forward's ``(shift, t)`` of :func:`_u` for the rows ``row``: its saved ``τ`` (``+inf`` on an empty
    row or past the end: ``u = -inf``), or for the general power ``a m`` (``m = 0`` on an empty row) and ``t``."""
    if EXACT == 0:
        m = tl.load(MROW + row, mask=rmask, other=0.0)
        shift = a * tl.where(m == float("-inf"), 0.0, m)
        t = tl.load(TROW + row, mask=rmask, other=0.0)
    else:
        shift = tl.load(SHIFT + row, mask=rmask, other=float("inf"))
        t = shift
    return shift, t


@triton.jit
def _or(x, y):
    return x | y


@triton.jit
def _kept_words(TILES, n, WORDS, n_words, CHUNK: tl.constexpr, BLOCK_W: tl.constexpr):
    """Writes the words ``WORDS[0 : n_words]`` (int32) of one row of the tile map: bit ``b`` of word ``w`` is set
    where key block ``32 w + b`` is one of the ``n`` entries of ``TILES`` (distinct, below ``32 n_words``, in
    any order), every other bit 0.  Built in registers, ``BLOCK_W`` words and ``CHUNK`` entries per step (each
    entry's bit ``1 << (nb mod 32)`` where ``nb // 32`` is the word's index, or-ed into tile-shaped registers and
    reduced over the entries once per ``BLOCK_W`` words), and stored once: no atomics, no read of the map.
    Every thread reads ``TILES``: the caller puts a barrier after writing it."""
    for w0 in range(0, n_words, BLOCK_W):
        widx = w0 + tl.arange(0, BLOCK_W)
        acc = tl.zeros([CHUNK, BLOCK_W], tl.int32)
        for c0 in range(0, n, CHUNK):
            idx = c0 + tl.arange(0, CHUNK)
            nb = tl.load(TILES + idx, mask=idx < n, other=0)
            bit = tl.where(idx < n, tl.full([CHUNK], 1, tl.int32) << (nb % WORD_BITS), 0)
            acc |= tl.where((nb // WORD_BITS)[:, None] == widx[None, :], bit[:, None], 0)
        tl.store(WORDS + widx, tl.reduce(acc, 0, _or), mask=widx < n_words)


@triton.jit
def _list_kept(KMAP, stride, bit, OUT, lo, hi, CHUNK: tl.constexpr):
    """Writes to ``OUT`` the indices ``i`` in ``[lo, hi)`` where bit ``bit`` of the word ``KMAP[i · stride]`` is
    set (the kept tiles of a column of the tile map: :func:`_kept_words`), in order, and returns their number;
    ``CHUNK`` of them per step (a prefix sum places them).  A barrier follows: every thread of the program
    reads the whole list."""
    n = 0
    for c0 in range(lo, hi, CHUNK):
        idx = c0 + tl.arange(0, CHUNK)
        keep = (tl.load(KMAP + idx.to(tl.int64) * stride, mask=idx < hi, other=0) >> bit) & 1
        tl.store(OUT + n + tl.cumsum(keep, 0) - 1, idx, mask=keep != 0)
        n += tl.sum(keep, 0)
    tl.debug_barrier()
    return n


@triton.jit
def _free_query_blocks(pid_n, lo, nq, S, window, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                       WINDOWED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(free_lo, free_hi)``: the query blocks ``[free_lo, free_hi)`` of ``[lo, nq)`` whose tiles with key block
    ``pid_n`` need no mask (:func:`attention_bwd_dkdv`'s, as :func:`_free_blocks` for the forward): a whole key
    block (``< S``), no ``attn_mask``, every query at or after every key (``CAUSAL``) and within the window of
    every key (``WINDOWED``: ``i - j < window``).  Query rows past the end need none: their ``q`` and ``dO`` are
    0 and their saved shift gives ``u ≤ 0``."""
    free_lo = lo
    free_hi = lo
    if HAS_MASK == 0:
        if CAUSAL:  # the block's first query at or after the key block's last key
            free_lo = tl.maximum(lo, tl.minimum((pid_n * BLOCK_N + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M, nq))
        hi = nq
        if WINDOWED:  # the block's last query less than window after the key block's first key
            hi = tl.minimum(hi, (pid_n * BLOCK_N + window) // BLOCK_M)
        free_hi = tl.where((pid_n + 1) * BLOCK_N <= S, tl.maximum(hi, free_lo), free_lo)
    # (lo < nq: lo <= free_lo <= free_hi <= nq; else every range is empty)
    return free_lo, free_hi


@triton.jit(do_not_specialize=_RUNTIME)
def attention_bwd_dkdv(Q, K, V, DO, DK, DV, MASK, A, MROW, TROW, SHIFT, CROW, KEPT, LIST, CU_Q, CU_K,
                       H, HKV, L, S, NQB, NKB, scale, window,
                       stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kn,
                       stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_ol,
                       stride_mb, stride_mh, stride_mm, stride_mn,
                       EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
                       VARLEN: tl.constexpr, FAST_LOG: tl.constexpr, WINDOWED: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One (batch·kv head, key block): ``dK`` and ``dV`` summed over the query heads of its group (each
    key and value tile loaded once for the whole group), written at rows ``(b·HKV + hk)·S + j`` (dense)
    or ``hk·S + CU_K[b] + j`` (packed).  ``WINDOWED``: only the query blocks that see the key block."""
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    b = bhk // HKV
    hk = bhk % HKV
    group = H // HKV
    q0, Lb = _sequence(CU_Q, b, L, VARLEN)
    k0, Sb = _sequence(CU_K, b, S, VARLEN)
    if VARLEN:
        k_base = k0.to(tl.int64) * stride_kn + hk * stride_kh
        v_base = k0.to(tl.int64) * stride_vn + hk * stride_vh
        q_b = q0.to(tl.int64) * stride_ql
        o_b = q0.to(tl.int64) * stride_ol
        krow0 = hk.to(tl.int64) * S + k0
    else:
        k_base = b.to(tl.int64) * stride_kb + hk * stride_kh
        v_base = b.to(tl.int64) * stride_vb + hk * stride_vh
        q_b = b.to(tl.int64) * stride_qb
        o_b = b.to(tl.int64) * stride_ob
        krow0 = bhk.to(tl.int64) * S
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_mb = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    nmask = offs_n < Sb
    k = tl.load(K + k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=nmask[:, None], other=0.0)
    v = tl.load(V + v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=nmask[:, None], other=0.0)
    kt = tl.trans(k)
    vt = tl.trans(v)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    nq = tl.where(pid_n * BLOCK_N < Sb, tl.cdiv(Lb, BLOCK_M), 0)  # a key block past the sequence: no work
    if WINDOWED:  # query i sees key j when i < j + window: the last query that sees this block's last key
        nq = tl.minimum(nq, (pid_n * BLOCK_N + BLOCK_N - 2 + window) // BLOCK_M + 1)
    if CAUSAL:
        lo = (pid_n * BLOCK_N) // BLOCK_M
    else:
        lo = 0
    # a loop over the tiles without a mask, then one over the edge tiles (dense half inputs without a mask or
    # window only: with VARLEN or WINDOWED the two copies spill 8-56 bytes at 255 registers in 64x64 tiles, with
    # float32's IEEE dots 1.2-1.4 KB, so one loop masks all)
    SPLIT: tl.constexpr = (HAS_MASK == 0) & (VARLEN == 0) & (WINDOWED == 0) & (DOT != 1)
    free_lo, free_hi = _free_query_blocks(pid_n, lo, nq, Sb, window, CAUSAL, HAS_MASK, WINDOWED, BLOCK_M, BLOCK_N)
    n_words = tl.cdiv(NKB, WORD_BITS)  # the tile map's words per query block
    word = pid_n // WORD_BITS
    bit = pid_n % WORD_BITS
    if not SPLIT:
        free_hi = free_lo
    for g in range(group):
        h = hk * group + g
        bh = b * H + h
        a = tl.load(A + h).to(tl.float32)
        q_base = q_b + h * stride_qh
        o_base = o_b + h * stride_oh
        if VARLEN:
            row0 = h.to(tl.int64) * L + q0
        else:
            row0 = bh.to(tl.int64) * L
        mask_base = b.to(tl.int64) * stride_mb + h * stride_mh
        # the query blocks whose tile with this key block is kept, listed from the forward's tile map
        list_base = (bh.to(tl.int64) * NKB + pid_n) * NQB
        # (those that need no mask first: _free_query_blocks)
        # (one word per query block: bit pid_n mod 32 of word pid_n // 32 of each row of words)
        kmap = KEPT + bh.to(tl.int64) * NQB * n_words + word
        n_free = _list_kept(kmap, n_words, bit, LIST + list_base, free_lo, free_hi, LIST_CHUNK)
        n_list = n_free + _list_kept(kmap, n_words, bit, LIST + list_base + n_free, lo, free_lo, LIST_CHUNK)
        n_list += _list_kept(kmap, n_words, bit, LIST + list_base + n_list, free_hi, nq, LIST_CHUNK)
        for part in tl.static_range(0 if SPLIT else 1, 2):  # the tiles without a mask, then the edge tiles
            for i in range(0 if part == 0 else n_free, n_free if part == 0 else n_list):
                mb = tl.load(LIST + list_base + i)
                offs_m = mb * BLOCK_M + offs_mb
                rmask = offs_m < Lb
                # (masked in both loops: without the mask the kernel, at 255 registers, spills)
                q = _rows_tile(Q, q_base, stride_ql, mb * BLOCK_M, offs_mb, offs_d, Lb, True, False, False)
                do = _rows_tile(DO, o_base, stride_ol, mb * BLOCK_M, offs_mb, offs_d, Lb, True, False, False)
                row = row0 + offs_m
                shift, t = _saved_shift(MROW, TROW, SHIFT, row, rmask, a, EXACT)
                c = tl.load(CROW + row, mask=rmask, other=0.0)
                u = _u(_mm(q, kt, DOT), a * scale, shift, t, EXACT)
                dp = _mm(do, vt, DOT)
                if part == 1:
                    u = _masked(u, offs_m, offs_n, Lb, Sb, MASK, mask_base, stride_mm, stride_mn, a, window, CAUSAL,
                                HAS_MASK, WINDOWED)
                p, s = _powers(u, a, EXACT, FAST_LOG)
                dz = s * (dp - c[:, None])
                dv += _mm(tl.trans(_low(p, do, DOT)), do, DOT)
                dk += _mm(tl.trans(_low(dz, q, DOT)), q, DOT)
    out = (krow0 + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=nmask[:, None])
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=nmask[:, None])


@triton.jit(do_not_specialize=_RUNTIME)
def attention_bwd_dq(Q, K, V, DO, DQ, MASK, A, MROW, TROW, SHIFT, CROW, PLG, LIST, CU_Q, CU_K,
                     H, HKV, L, S, NQB, NKB, scale, window,
                     stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_ol,
                     stride_mb, stride_mh, stride_mm, stride_mn,
                     EXACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr,
                     VARLEN: tl.constexpr, ALPHA_GRAD: tl.constexpr, FAST_LOG: tl.constexpr, WINDOWED: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One (batch·head, query block): ``dQ`` (at the rows of the forward's per-row outputs) and,
    with ``ALPHA_GRAD``, ``Σ_j g_j p_j log p_j`` per row."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    q0, Lb = _sequence(CU_Q, b, L, VARLEN)
    k0, Sb = _sequence(CU_K, b, S, VARLEN)
    if VARLEN:
        q_base = q0.to(tl.int64) * stride_ql + h * stride_qh
        o_base = q0.to(tl.int64) * stride_ol + h * stride_oh
        k_base = k0.to(tl.int64) * stride_kn + hk * stride_kh
        v_base = k0.to(tl.int64) * stride_vn + hk * stride_vh
        row0 = h.to(tl.int64) * L + q0
    else:
        q_base = b.to(tl.int64) * stride_qb + h * stride_qh
        o_base = b.to(tl.int64) * stride_ob + h * stride_oh
        k_base = b.to(tl.int64) * stride_kb + hk * stride_kh
        v_base = b.to(tl.int64) * stride_vb + hk * stride_vh
        row0 = bh.to(tl.int64) * L
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_nb = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rmask = offs_m < Lb
    q = tl.load(Q + q_base + offs_m[:, None] * stride_ql + offs_d[None, :], mask=rmask[:, None], other=0.0)
    do = tl.load(DO + o_base + offs_m[:, None] * stride_ol + offs_d[None, :], mask=rmask[:, None], other=0.0)
    mask_base = b.to(tl.int64) * stride_mb + h * stride_mh
    a = tl.load(A + h).to(tl.float32)
    row = row0 + offs_m
    shift, t = _saved_shift(MROW, TROW, SHIFT, row, rmask, a, EXACT)
    ascale = a * scale
    c = tl.load(CROW + row, mask=rmask, other=0.0)
    list_base = (bh.to(tl.int64) * NQB + pid_m) * (2 * NKB + 3)  # the forward's list of this block's kept tiles
    n_list = tl.load(LIST + list_base + 2 * NKB)
    n_free = tl.load(LIST + list_base + 2 * NKB + 2)
    list_base += tl.load(LIST + list_base + 2 * NKB + 1)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    plg = tl.zeros([BLOCK_M], tl.float32)
    for part in tl.static_range(1 if (HAS_MASK != 0) and (DOT == 1) else 0, 2):  # unmasked tiles, then the edge
        for i in range(0 if part == 0 else n_free, n_free if part == 0 else n_list):
            nb = tl.load(LIST + list_base + i)
            # the key tile loaded once, for the scores (transposed) and for dQ
            k = _rows_tile(K, k_base, stride_kn, nb * BLOCK_N, offs_nb, offs_d, Sb, part == 1, False, False)
            vt = _rows_tile(V, v_base, stride_vn, nb * BLOCK_N, offs_nb, offs_d, Sb, part == 1, True, False)
            u = _u_tile(q, tl.trans(k), offs_m, nb * BLOCK_N + offs_nb, Lb, Sb, ascale, shift, t, a, MASK, mask_base,
                        stride_mm, stride_mn, window, EXACT, CAUSAL, HAS_MASK, DOT, WINDOWED, part == 1)
            dp = _mm(do, vt, DOT)
            if ALPHA_GRAD:  # (EXACT = 0) Σ_j g_j p_j log p_j, log p = ln 2 · log2(u) / a from the power's log2
                p, s, lg = _powers_log(u, a, FAST_LOG)
                plg += tl.sum(p * lg * dp, 1)
            else:
                p, s = _powers(u, a, EXACT, FAST_LOG)
            dz = s * (dp - c[:, None])
            dq += _mm(_low(dz, k, DOT), k, DOT)
    plg = plg * (LN2 / a)
    tl.store(DQ + row[:, None] * HEAD_DIM + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=rmask[:, None])
    if ALPHA_GRAD:
        tl.store(PLG + row, plg, mask=rmask)


@triton.jit(do_not_specialize=("R", "H", "L"))
def row_dot(X, Y, OUT, R, H, L, stride_xb, stride_xh, stride_xl, stride_yb, stride_yh, stride_yl,
            BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``OUT[r] = Σ_d X[r, d] Y[r, d]`` in float32 for the ``R = B·H·L`` rows ``r = (b·H + h)·L + i``
    of two strided ``[B, H, L, D]`` tensors (the backward's ``c = dO·W`` and ``dO·O``)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, HEAD_DIM)
    rmask = rows < R
    r64 = rows.to(tl.int64)
    b = r64 // (H * L)
    h = (r64 // L) % H
    i = r64 % L
    xo = b * stride_xb + h * stride_xh + i * stride_xl
    yo = b * stride_yb + h * stride_yh + i * stride_yl
    x = tl.load(X + xo[:, None] + offs_d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    y = tl.load(Y + yo[:, None] + offs_d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(OUT + rows, tl.sum(x * y, 1), mask=rmask)
