r"""Triton kernels of the GPU row solver (imported only by :mod:`softargmax.backends.triton.rows`).

Every kernel follows the CPU row solver (``_cpu_rows.c``): one threshold per row, found
by a monotone Newton iteration that starts below the root, in float32 whatever the input
type (float16/bfloat16 are read and written as they are, accumulated in float32).

Kinds (all with ``q = 1``), in the solver's own variable ``t``:

* ``KIND_POWER`` (α-entmax, ``a = α - 1 ∈ (0, 1]``): ``d = a (z - m)`` with ``m`` the row
  maximum, ``p = [d - t]_+^{1/a}``, ``s = [d - t]_+^{1/a - 1}``; Newton on ``S^a`` from
  ``t = -1``.  For ``a < NEAR_ONE`` the kernels hold ``t + 1`` instead of ``t`` and take
  ``log(1 + w)`` of the base ``1 + w`` without cancellation, so ``p`` keeps full float32
  precision as α → 1.  The general power costs one ``log2`` and one ``exp2`` per score
  (:func:`_general_power`: ``p = s u``); with one ``a >= NEAR_ONE`` for every row (:data:`EXACT_FAR`)
  the ``log2`` is the GPU's ``lg2.approx.f32`` and the ``t + 1`` variable is left out.
  ``EXACT = 1`` (sparsemax): Michelot's step, exact once the support is
  stable.  ``EXACT = 2`` (1.5-entmax): the root of the support's quadratic when it keeps
  every candidate positive (then exact), else a Newton step.  Only ``z > m - 1/a`` can be
  in the support: the long-row kernel collects those candidates once and iterates on them.
* ``KIND_JS`` (Jensen–Shannon, dense): ``t = τ - m``, ``w = e^{z - m - t}``,
  ``p = w / (2 - w)``, ``s = p + p²``; Newton on ``log S`` from ``t = 0``.
* ``KIND_HELL`` (squared Hellinger, dense): ``t = τ - m``, ``r = 1/(1 + t + m - z)``,
  ``p = r²``, ``s = 2 r³``; Newton on ``S^{-1/2}`` from ``t = 0``.
* ``KIND_RKL`` (reverse KL, dense): ``t = τ - m``, ``p = 1/(t + m - z)``, ``s = p²``; Newton on
  ``S^{-1}``.
* ``KIND_JEFF`` (Jeffrey, dense): ``t = τ - m``, ``p = 1/W`` with ``W = W(e^L)`` the Lambert W of
  ``e^L``, ``L = 1 + t + m - z``, ``s = 1/(W (1 + W))``; Newton on ``S^{-1/2}``.  ``W`` is the root of
  ``w + log w = L`` (``L >= 1``), branch-free: one step of Fritsch's iteration from a start within 1.2%
  (a Taylor polynomial below ``L = 4``, the asymptotic ``L - log L + log L / L`` above;
  :func:`_lambert_w_exp`).
* ``KIND_RCHI`` (reverse χ², dense): ``t = τ - m``, ``p = (2 (t + m - z))^{-1/2}``, ``s = p³``;
  Newton on ``S^{-2}``.

These last three start from Jensen's lower bound of the root (:func:`_jensen_start`: ``g`` is
convex, so ``S(t) >= n g(-t - ē)`` over the ``n`` finite entries with mean ``ē`` of ``m - z``),
raised to ``-f'(1)`` (:func:`_t_lo`, where the row maximum's own term is 1), as the C row solver
does; their transforms are convex in ``t``, so the steps increase to the root, and a start above it
by rounding is followed by one step down, never below ``-f'(1)``.  Their ``f(0)`` is ``+∞``: the
losses never use the regularizer row sum, which is 0 for them.

References (Jeffrey's Lambert W): Robert M. Corless, Gaston H. Gonnet, David E. G. Hare, David J.
Jeffrey and Donald E. Knuth, *On the Lambert W Function*, Advances in Computational Mathematics 5,
1996, https://doi.org/10.1007/BF02124750 (the asymptotic start); F. N. Fritsch, R. E. Shafer and
W. P. Crowley, *Algorithm 443: Solution of the transcendental equation w e^w = x*, Communications
of the ACM 16, 1973, https://doi.org/10.1145/361952.361970 (the iteration).

Stopping: the iterates increase monotonically in exact arithmetic; in float32 a step may go
back by rounding, so a row stops when its residual ``|S - 1|`` is below ``tol``, stops
decreasing (checked from the third evaluation), the step vanishes, or after ``max_iter``.
The streamed kernel's full-row steps of the dense kinds also stop once the residual is at
most :data:`DENSE_ACCEPT`, taking that last step unconfirmed as a second-order (Chebyshev) step
from the same pass's ``Σ p''`` (its error is of the residual's cube): one read of the row less.

Row layouts:

* :func:`solve_block_rows` holds a ``[CH, ROWS, LINE]`` tile in registers (``ROWS`` rows of at
  most ``CH·LINE`` scores, ``LINE`` = 32 lanes of 16 bytes) and reads it once.  A row of at
  most ``32 · 16`` scores is one warp's, so its sums are warp shuffles: rows of one line
  (``CH = 1``) share a program, the warps along the rows (only the loop's "any row left?" test
  crosses warps); a row of several lines has a program of one warp (``ROWS = 1``), since
  where Triton puts the warps of a ``[CH, ROWS, LINE]`` tile depends on its version.  Longer
  rows are split over the warps of one program (``SPLIT``).  Each Newton step reduces
  ``(Σp, Σs)`` as one tuple, one exchange per axis rather than one per sum.
* :func:`solve_long_rows` is one program per row streamed in ``BLOCK`` chunks with per-lane
  (vector) accumulators, reduced once per pass, so no barrier inside a pass.  Pass 1 keeps,
  per lane, its ``SLOTS`` largest scores in registers (no prefix sum, no scratch memory); the
  Newton steps run on those registers, exactly for the power kind when no lane overflowed,
  otherwise as a lower bound from which the full-row Newton passes continue; the last pass
  writes ``p``.  Forward: 2 reads and 1 write of the row (power kind), plus one read per
  full-row Newton step (the dense kinds, overflowing rows).  The dense kinds with ``f(0)`` finite
  also keep, per lane, statistics of the scores the lane drops from its slots (:func:`_rest_add`,
  relative to the lane's running maximum ``c0`` and re-expressed as it grows, as an online softmax's
  sum, :func:`_rest_shift`).  Jensen–Shannon: the power sums ``M_n = Σ e^{n(z - m)}``, ``n = 1..6``:
  since ``p = w/(2 - w) = Σ_n (w/2)^n``, the register Newton adds ``Σ_{n<=6} (e^{-t}/2)^n M_n`` for those
  scores (:func:`_rest_terms`), short of their sum by at most :func:`_rest_tail` (every dropped score is
  at most its lane's smallest kept one); when that is below half the tolerance the registers' root is
  the row's and the forward is 2 reads and 1 write, as the power kind's, else the full-row steps
  follow (a lane that dropped a score of large ``p``: a row's few largest scores in one lane).
  Squared Hellinger: the count, ``Σ (c0 - z)`` and ``Σ (c0 - z)²``, for a second-order Taylor
  estimate of the rest about its mean (not a bound: it starts the full-row steps, whose transform is
  concave, so a start above the root steps below it), within :data:`DENSE_ACCEPT_HELLINGER` on the
  rows measured: one full-row step (a second-order one) ends the solve.
* Split rows (few long rows: too few programs to fill the GPU with one per row) take the same
  passes over several programs per row, each on a slice of ``L`` entries, in three or four
  launches with no host synchronization between them: :func:`split_scan` (per slice, the
  lanes' largest scores into a small candidate buffer: ``SLOTS · BLOCK`` float32 per slice,
  :data:`REST_STATS` more rows of ``BLOCK`` for the statistics of the scores not kept of Jensen–Shannon and
  squared Hellinger),
  :func:`split_solve` (one program per row: it merges them into the one-program kernel's
  registers and iterates as it does: for the dense kinds or an overflowing lane, its full-row
  steps read the row in that one program), :func:`split_write` (per slice, ``p`` and partial row sums)
  and :func:`split_finish` (the row sums, only where asked or for the dense kinds' ``Σ s``).
  The threshold is the one-program kernel's (the same candidates and iterations; the dense
  kinds' ``Σ s`` and the loss row sums are added up in another order).  The backward takes
  :func:`jvp_split_sums` then :func:`jvp_split_write`, which adds up the ``ns`` partial sums.

The backward kernels recompute ``s`` from ``p`` (``s = p^{1-a}``, ``p + p²``, ``2 p^{3/2}``),
so the forward writes only ``p``; the streamed one reads ``v`` only where ``s ≠ 0`` for the
power kind.  Gradients are written in the input's dtype; nothing float32 goes through memory.

Per row the solvers write ``τ_f`` (the f-divergence parametrization) and ``Σ s`` into one
``[R, 2]`` buffer and a boolean "bad row" (NaN or ``+inf``: ``p = NaN``; an all ``-inf`` row
gives ``p = 0``); with ``SUMS`` also the two row sums of the Fenchel–Young loss values, from
the pass that writes ``p``: ``⟨z, p⟩`` and the raw regularizer sum of :func:`_omega_terms`
times ``omega_scale``.  With ``GRAD`` (the losses with class-index targets, no prediction
returned) that pass writes the loss's gradient ``G = p - y`` instead of ``p`` (``y`` one-hot at
``IDX[r]``, ``G = 0`` in rows where ``KEEP[r]`` is 0, NaN in bad rows kept): the same one write,
with no separate epilogue pass.  One launch per call, no host synchronization.
"""

import triton
import triton.language as tl

from .interpreter import interpreting

KIND_POWER = tl.constexpr(0)
KIND_JS = tl.constexpr(1)
KIND_HELL = tl.constexpr(2)
KIND_RKL = tl.constexpr(3)
KIND_JEFF = tl.constexpr(4)
KIND_RCHI = tl.constexpr(5)


#: the streamed dense kinds take a full-row step without confirming it from this residual
#: ``|S - 1|`` on: a second-order (Chebyshev) step, from the same pass's ``Σ p''``, whose error is
#: of the residual's cube.  Jensen–Shannon's constant is small on every row tried (from 4e-3, a
#: residual of 1.3e-9 at most); squared Hellinger's grows as ``(1 - p₁)(2.5 - 2p₁)/(4p₁²)`` where one
#: score stands over a flat tail of ``p₁`` small (from 4e-3 a float64 model of such rows left 1.4e-6
#: at 20,000 entries and 2.3e-5 at a million), so it accepts from 1e-3 (64 times less: 3.6e-7 at a
#: million)
DENSE_ACCEPT = tl.constexpr(4e-3)
DENSE_ACCEPT_HELLINGER = tl.constexpr(1e-3)

#: the statistics per lane of the scores the streamed kernels do not keep (Jensen–Shannon: the power sums
#: ``Σ e^{n(z - c)}``, ``n = 1..6``; squared Hellinger: the count, ``Σ (c - z)`` and ``Σ (c - z)²``, ``c`` the lane's
#: maximum: :func:`_rest_add`): rows of the split kernels' candidate buffer (``rows.REST_STATS``)
REST_STATS = tl.constexpr(6)
#: Jensen–Shannon's power sums in :func:`scan_lanes` move their reference to a lane's running maximum only once the
#: maximum passed it by more than this (``e^{6·8}`` stays far inside float32): a rescale rounds every sum, and
#: rescaling at each rise of a steadily rising row added that rounding up (Σp off by 6e-6 at 4000 chunks per
#: lane); this way the sums rescaled ``k`` times weigh at most ``e^{-8k}`` of the row
REST_RESCALE = tl.constexpr(8.0)

#: below this ``a = α - 1`` the power kind iterates on ``t + 1`` and takes ``log(1 + w)``
#: without cancellation (the base ``1 + w`` is within ``a`` of 1: ``p`` lost ``ε/a``)
NEAR_ONE = tl.constexpr(0.25)

#: ``EXACT`` of the general power kind for one ``a >= NEAR_ONE`` (α >= 1.25) for every row (``rows.row_exact``):
#: no ``t + 1`` variable and no ``log(1 + w)`` correction, and ``log2`` by the GPU's ``lg2.approx.f32``
#: (:func:`fast_log2`); ``EXACT = 0`` (one α per row, or α < 1.25) keeps both and the software ``tl.log2``
EXACT_FAR = tl.constexpr(3)

#: ``log2`` by ``lg2.approx.f32`` (inline PTX) rather than ``tl.log2`` (a software logarithm of about 25
#: instructions): off under Triton's interpreter, which runs no inline assembly (decided by Triton's own
#: setting, :func:`~softargmax.backends.triton.interpreter.interpreting`, when this module is imported)
HW_LOG2 = tl.constexpr(not interpreting())


@triton.jit
def fast_log2(x):
    """``log2 x`` for ``x > 0`` (subnormals included), float32: on a GPU the hardware's ``lg2.approx.f32``
    (one MUFU instruction; absolute error at most about ``2^-22`` for ``x`` in ``[1/2, 2]``, relative error
    about ``2^-22`` elsewhere, PTX ISA: an absolute error of at most ``max(1, |log2 x|) 2^-22``), under the
    interpreter ``tl.log2``.  In the power ``s = u^{1/a - 1} = 2^{(1/a - 1) log2 u}`` (and ``p = s u``) that is a
    relative error of at most ``(1/a - 1) max(1, |log2 u|) 2^-22 ln 2``: ``(1/a - 1) 2^-22 ln 2 <= 5e-7`` for
    ``u`` in ``[1/2, 1]`` and ``a >= NEAR_ONE``, growing with ``|log2 u| = a |log2 p|`` below (``1.7e-6`` at
    ``p = 1e-4``; a float32 emulation of the kernel's power gave at most ``4.6e-6`` relative in ``p`` for
    ``p > 1e-4``, the same support), where float32's rounding of the product ``(1/a - 1) log2 u`` alone costs
    ``|(1/a - 1) log2 u| 2^-24 ln 2``; every pass evaluates the same powers, so the threshold solves the row for
    them to the solver's tolerance."""
    if HW_LOG2:
        r = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        r = tl.log2(x)
    return r


@triton.jit
def _general_power(u, w, a, EXACT: tl.constexpr):
    """``(p, s) = (u₊^{1/a}, u₊^{1/a - 1})`` of the general power kind from one ``log2`` and one ``exp2`` per
    score: ``s = 2^{(1/a - 1) log2 u}`` and ``p = s u`` (``1/a - 1`` is per row, not per score).  ``EXACT = 0``:
    ``u = 1 + w`` near α = 1 (:func:`_near_offset`), whose ``log2`` is taken from ``w`` without cancellation
    (Kahan: ``log2(u) w / (u - 1)``, or ``w log2 e`` where ``u`` rounds to 1), and the software ``tl.log2``;
    :data:`EXACT_FAR`: :func:`fast_log2` of ``u`` itself (``w`` unused)."""
    pos = u > 0
    uu = tl.where(pos, u, 1.0)
    if EXACT == EXACT_FAR:
        lu = fast_log2(uu)
    else:
        lu = tl.log2(uu)
        near1p = tl.where(uu != 1.0, lu * (w / (uu - 1.0)), w * 1.4426950408889634)
        lu = tl.where(_near_offset(a) > 0, near1p, lu)
    s = tl.where(pos, tl.exp2(lu * (1.0 / a - 1.0)), 0.0)
    return s * uu, s


@triton.jit
def _near_offset(a):
    """1.0 where the power kind's variable is ``t + 1`` (``a < NEAR_ONE``), else 0.0."""
    return tl.where(a < NEAR_ONE, 1.0, 0.0)


@triton.jit
def _t_lo(KIND: tl.constexpr):
    """The dense kinds' lowest ``t = τ - m``, ``-f'(1)``: the row maximum's own term is 1 there, so ``S >= 1``."""
    if KIND == KIND_RKL:
        t = 1.0
    elif KIND == KIND_RCHI:
        t = 0.5
    else:
        t = 0.0
    return t


@triton.jit
def _jensen_start(a1, a2, KIND: tl.constexpr):
    """Jensen's lower bound of ``t`` (reverse KL, Jeffrey, reverse χ²) from ``a1 = Σ (m - z)`` and ``a2 = n``
    over the ``n`` finite entries (module docstring), raised to :func:`_t_lo` (also where ``n = 0``)."""
    n = tl.where(a2 > 0, a2, 1.0)
    mean = a1 / n
    if KIND == KIND_RKL:
        start = n - mean
    elif KIND == KIND_RCHI:
        start = 0.5 * n * n - mean
    else:
        start = n + tl.log(n) - 1.0 - mean
    return tl.where(start > _t_lo(KIND), start, _t_lo(KIND))


@triton.jit
def _fritsch_step(w, L):
    """One step of Fritsch's iteration for ``w + log w = L`` (relative error ``e`` to about ``e⁴/100``), in
    the form scaled by ``1/(1 + w)`` that does not overflow (the C row solver's)."""
    r = 1.0 / (1.0 + w)
    a = (L - tl.log(w) - w) * r
    b = a * r
    q = 2.0 + 1.3333333333333333 * a
    return w + w * a * (q - b) / (q - 2.0 * b)


@triton.jit
def _lambert_w_exp(L):
    """``W(e^L)`` for ``L >= 1`` (``+∞`` at ``L = +∞``), branch-free: one Fritsch step from a start within
    1.2% (below ``L = 4`` the Taylor polynomial ``1 + d/2 + d²/16 - d³/192`` at ``d = L - 1``, above it the
    asymptotic ``L - log L + log L / L``), 3e-11 off in exact arithmetic, so float32's rounding alone
    (the asymptotic start alone is 8% off near ``L = 1.5``: one step left 2.8e-7, two logs more)."""
    fin = L < float("inf")
    Lf = tl.where(fin, L, 1.0)
    lL = tl.log(Lf)
    d = Lf - 1.0
    w = tl.where(Lf < 4.0, 1.0 + d * (0.5 + d * (0.0625 - d * 0.005208333333333333)), Lf - lL + lL / Lf)
    w = _fritsch_step(w, Lf)
    return tl.where(fin, w, float("inf"))


@triton.jit
def _evaluate(x, m, t, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """``(p, s)`` at scores ``x`` (``-inf`` masked) for row maximum ``m`` and threshold ``t``
    (power kind with ``a < NEAR_ONE``: ``t`` holds ``t + 1``, see :func:`_near_offset`)."""
    if KIND == KIND_POWER:
        if EXACT == 0:
            w = a * (x - m) - t
            u = w + _near_offset(a)
        else:
            u = a * (x - m) - t
            w = u
        pos = u > 0
        if EXACT == 1:
            p = tl.where(pos, u, 0.0)
            s = tl.where(pos, 1.0, 0.0)
        elif EXACT == 2:
            p = tl.where(pos, u * u, 0.0)
            s = tl.where(pos, u, 0.0)
        else:
            p, s = _general_power(u, w, a, EXACT)
    elif KIND == KIND_JS:
        w = tl.exp(x - m - t)  # in [0, 1]: t >= 0 throughout
        p = w / (2.0 - w)
        s = p + p * p
    elif KIND == KIND_HELL:
        r = 1.0 / (1.0 + t + (m - x))
        p = r * r
        s = 2.0 * p * r
    elif KIND == KIND_RKL:
        p = 1.0 / (t + (m - x))  # 0 where masked (m - x = +inf)
        s = p * p
    elif KIND == KIND_RCHI:
        p = 1.0 / tl.sqrt(2.0 * (t + (m - x)))
        s = p * p * p
    else:
        w = _lambert_w_exp(1.0 + t + (m - x))
        p = 1.0 / w
        s = p / (1.0 + w)  # 1/(W (1 + W)): 0 where W overflows or is +inf
    return p, s


@triton.jit
def _omega_terms(x, m, t, a, p, c, KIND: tl.constexpr):
    """Per entry, the raw term of the regularizer's row sum (0 where ``p = 0``):
    ``p^α - c p = p (d - t - c)`` (power), ``f(p) - f(0)`` (Jensen–Shannon:
    ``p log p - (p+1) log((p+1)/2) - log 2``; squared Hellinger: ``p - 2 √p``); 0 for the kinds
    with ``f(0) = +∞`` (reverse KL, Jeffrey, reverse χ²: the losses never use it)."""
    pos = p > 0
    if KIND == KIND_POWER:
        w = p * (a * (x - m) - (t - _near_offset(a)) - c)
    elif KIND == KIND_JS:
        pp = tl.where(pos, p, 1.0)
        w = pp * tl.log(pp) - (pp + 1.0) * tl.log(0.5 * (pp + 1.0)) - 0.6931471805599453
    elif KIND == KIND_HELL:
        w = p - 2.0 * tl.sqrt(p)
    else:
        w = tl.zeros_like(p)
    return tl.where(pos, w, 0.0)


@triton.jit
def _s_from_p(p, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """The Jacobian weights ``s = g'`` from the output ``p`` (NaN stays NaN)."""
    if KIND == KIND_POWER:
        pos = p > 0
        if EXACT == 1:
            s = tl.where(pos, 1.0, 0.0)
        elif EXACT == 2:
            s = tl.sqrt(tl.where(pos, p, 0.0))
        elif EXACT == EXACT_FAR:
            s = tl.where(pos, tl.exp2((1.0 - a) * fast_log2(tl.where(pos, p, 1.0))), 0.0)
        else:
            s = tl.where(pos, tl.exp2((1.0 - a) * tl.log2(tl.where(pos, p, 1.0))), 0.0)
    elif KIND == KIND_JS:
        s = p + p * p
    elif KIND == KIND_HELL:
        s = 2.0 * p * tl.sqrt(p)
    elif KIND == KIND_RKL:
        s = p * p
    elif KIND == KIND_RCHI:
        s = p * p * p
    else:
        s = p * p / (1.0 + p)  # Jeffrey: p = 1/W, s = 1/(W (1 + W))
    return tl.where(p == p, s, p)


@triton.jit
def newton_update(t, S, Sp, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """One Newton step (``dS/dt = -Sp``): on ``S^a``, ``log S``, ``S^{-1/2}``, ``S^{-1}`` or ``S^{-2}``; the
    kinds of :func:`_jensen_start` never step below :func:`_t_lo` (from a start above the root by rounding)."""
    Sp = tl.where(Sp > 0, Sp, 1.0)
    S = tl.where(S > 0, S, 1.0)
    if KIND == KIND_POWER:
        if EXACT == 1:
            step = (S - 1.0) / Sp
        elif EXACT == 2:
            step = (S - tl.sqrt(S)) / Sp
        else:
            # S - S^{1-a} = -S expm1(-a log S), without the cancellation at small a
            y = -a * tl.log(S)
            em1 = tl.where(tl.abs(y) < 1e-2, y * (1.0 + y * (0.5 + y * (1.0 / 6.0 + y * (1.0 / 24.0)))), tl.exp(y) - 1.0)
            step = -S * em1 / Sp
    elif KIND == KIND_JS:
        step = S * tl.log(S) / Sp
    elif KIND == KIND_RKL:
        step = (S * S - S) / Sp
    elif KIND == KIND_RCHI:
        step = (S * S * S - S) / (2.0 * Sp)
    else:  # Hellinger, Jeffrey
        step = 2.0 * (S * tl.sqrt(S) - S) / Sp
    tn = t + step
    if KIND >= KIND_RKL:
        tn = tl.where(tn < _t_lo(KIND), _t_lo(KIND), tn)  # (NaN stays NaN)
    return tn


@triton.jit
def _second_order(t, S, Sp, Q, KIND: tl.constexpr):
    """The dense kinds' Chebyshev step on ``F = log S`` (Jensen–Shannon) or ``F = S^{-1/2} - 1`` (squared
    Hellinger) from ``S``, ``dS/dt = -Sp`` and ``d²S/dt² = Q`` (:func:`_row_sums`): ``t + d - F'' d² / (2 F')``
    with the Newton step ``d = -F/F'``; its error is of the residual's cube."""
    Sp = tl.where(Sp > 0, Sp, 1.0)
    S = tl.where(S > 0, S, 1.0)
    if KIND == KIND_JS:
        d = S * tl.log(S) / Sp
        tn = t + d + d * d * (Q - Sp * Sp / S) / (2.0 * Sp)
    else:
        d = 2.0 * (S * tl.sqrt(S) - S) / Sp
        tn = t + d - d * d * (0.75 * Sp * Sp / S - 0.5 * Q) / Sp
    return tn


@triton.jit
def _quadratic(t, tn, S, Sp, n, umin):
    """1.5-entmax: ``t + δ`` with ``Σ (u - δ)² = 1`` on the current support when that root
    keeps every candidate positive (``δ <= min u``): then it is the exact threshold."""
    nn = tl.where(n > 0, n, 1.0)
    disc = Sp * Sp - nn * (S - 1.0)
    delta = (Sp - tl.sqrt(tl.where(disc > 0, disc, 0.0))) / nn
    ok = (disc >= 0) & (delta >= 0) & (delta <= umin) & (n > 0)
    return tl.where(ok, t + delta, tn)


@triton.jit
def newton_step(t, S, Sp, n, umin, it, last, tol, max_iter, a, KIND: tl.constexpr, EXACT: tl.constexpr,
                TOL_FIRST: tl.constexpr):
    """The stopping test at ``t`` (module docstring) and the next iterate: ``(tn, stop, last)``.
    ``n``, ``umin``: the support's size and smallest ``u`` (used by 1.5-entmax only).  The tolerance is
    tested from the third evaluation, or with ``TOL_FIRST`` from the first (a start that may already solve
    the row: the fused attention's); the residual's growth from the third."""
    resid = tl.abs(S - 1.0)
    if TOL_FIRST:
        stop = (it >= max_iter) | (resid <= tol) | ((it > 1) & (resid >= last))
    else:
        stop = (it >= max_iter) | ((it > 1) & ((resid <= tol) | (resid >= last)))
    if it > 1:
        last = resid
    tn = newton_update(t, S, Sp, a, KIND, EXACT)
    if EXACT == 2:
        tn = _quadratic(t, tn, S, Sp, n, umin)
    stop = stop | (tn == t) | (tn != tn)  # (a step may go back by rounding)
    return tn, stop, last


@triton.jit
def _sums2(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _sums4(a0, b0, c0, d0, a1, b1, c1, d1):
    return a0 + a1, b0 + b1, c0 + c1, tl.minimum(d0, d1)


@triton.jit
def _newton_sums(p, s, EXACT: tl.constexpr, FIRST: tl.constexpr, SECOND: tl.constexpr):
    """``(Σp, Σs, n, umin)`` over the axes ``FIRST`` then ``SECOND`` (``SECOND < 0``: one axis) as one
    tuple reduction per axis (one exchange between warps, not one per sum); ``n`` and ``umin``
    (the support's size and smallest ``u``) only for 1.5-entmax, else ``Σp``."""
    if EXACT == 2:
        pos = s > 0
        S, Sp, n, umin = tl.reduce((p, s, tl.where(pos, 1.0, 0.0), tl.where(pos, s, float("inf"))), FIRST, _sums4)
        if SECOND >= 0:
            S, Sp, n, umin = tl.reduce((S, Sp, n, umin), SECOND, _sums4)
    else:
        S, Sp = tl.reduce((p, s), FIRST, _sums2)
        if SECOND >= 0:
            S, Sp = tl.reduce((S, Sp), SECOND, _sums2)
        n = S
        umin = S
    return S, Sp, n, umin


@triton.jit
def _row_tile(R, k, ROWS: tl.constexpr, CH: tl.constexpr, LINE: tl.constexpr):
    """This program's ``ROWS`` rows, their mask, and the mask and offsets of its ``[CH, ROWS, LINE]``
    tile of a ``[R, k]`` matrix (entry ``(c, r, j)`` is column ``c·LINE + j`` of row ``r``): the
    warps are laid along the rows, so the row sums stay inside a warp (no shared memory, no
    barrier) unless one row needs several warps (``ROWS = 1``)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    col = tl.arange(0, CH)[:, None, None] * LINE + tl.arange(0, LINE)[None, None, :]
    rmask = rows < R
    mask = rmask[None, :, None] & (col < k)
    offs = rows.to(tl.int64)[None, :, None] * k + col
    return rows, rmask, mask, offs


@triton.jit
def _row_a(ALPHA, rows, rmask, a_value, PER_ROW: tl.constexpr):
    """``a = α - 1`` per row: read from ``ALPHA`` (``PER_ROW``) or the scalar ``a_value``."""
    if PER_ROW:
        a = tl.load(ALPHA + rows, mask=rmask, other=2.0).to(tl.float32) - 1.0
    else:
        a = tl.zeros(rows.shape, tl.float32) + a_value
    return a


@triton.jit
def _tau_f(t, m, a, tau_c, KIND: tl.constexpr):
    """The threshold in the f-divergence parametrization: ``(t_y + c)/a`` with ``t_y = t + a m`` the
    threshold of ``y = a z`` (power kind; ``c = tau_c``, and ``t`` held as ``t + 1`` near α = 1
    gives ``t_y + 1`` without cancellation), ``t + m`` otherwise."""
    if KIND == KIND_POWER:
        tau = (t + (tau_c - _near_offset(a)) + a * m) / a
    else:
        tau = t + m
    return tau


@triton.jit
def _minus_target(p, at, hot, keep):
    """The Fenchel–Young loss's gradient ``p - y`` with ``y`` one-hot where ``at == hot``, 0 where not ``keep``
    (an ignored row, whatever ``p`` holds there: NaN included)."""
    return tl.where(keep, p - tl.where(at == hot, 1.0, 0.0), 0.0)


@triton.jit
def _row_target(IDX, KEEP, row, GRAD: tl.constexpr):
    """``(class index, kept)`` of one row with ``GRAD`` (else placeholders, never used)."""
    if GRAD:
        target = tl.load(IDX + row).to(tl.int64)
        keep = tl.load(KEEP + row) != 0
    else:
        target = tl.zeros([], tl.int64)
        keep = tl.zeros([], tl.int1)
    return target, keep


@triton.jit
def _written(p, at, hot, keep, GRAD: tl.constexpr):
    """What the last pass stores: ``p``, or with ``GRAD`` the gradient :func:`_minus_target`."""
    if GRAD:
        p = _minus_target(p, at, hot, keep)
    return p


@triton.jit
def solve_block_rows(Z, P, AUX, BAD, SUMS_OUT, ALPHA, R, k, a_value, tau_c, tol, max_iter, omega_c, omega_scale,
                     IDX, KEEP, KIND: tl.constexpr, EXACT: tl.constexpr, PER_ROW: tl.constexpr, SUMS: tl.constexpr,
                     GRAD: tl.constexpr, ROWS: tl.constexpr, CH: tl.constexpr, LINE: tl.constexpr, SPLIT: tl.constexpr):
    """Rows of at most ``CH·LINE`` scores, ``ROWS`` of them per program, held in registers and read once.

    Writes ``p``, ``AUX[r] = (τ_f, Σs)``, ``BAD[r]`` (NaN or ``+inf`` in the row) and, with
    ``SUMS``, ``SUMS_OUT[0, r] = ⟨z, p⟩`` and ``SUMS_OUT[1, r] = omega_scale · Σ`` of
    :func:`_omega_terms`.  ``a = α - 1`` is ``a_value``, or ``ALPHA[r] - 1`` with ``PER_ROW``.
    ``GRAD``: ``P`` receives ``G = p - y`` (:func:`_minus_target`) instead of ``p``."""
    rows, rmask, mask, offs = _row_tile(R, k, ROWS, CH, LINE)
    # the reduction axes, the in-thread one first: CH then LINE (one warp per row), or LINE then CH (SPLIT)
    FIRST: tl.constexpr = 2 * SPLIT
    SECOND: tl.constexpr = 1 - SPLIT
    x = tl.load(Z + offs, mask=mask, other=float("-inf")).to(tl.float32)
    a = _row_a(ALPHA, rows, rmask, a_value, PER_ROW)
    # one reduction for the maximum and the bad rows: NaN counts as +inf
    m = tl.max(tl.max(tl.where(x == x, x, float("inf")), FIRST), SECOND)
    bad = m == float("inf")
    empty = bad | (m == float("-inf"))
    x = tl.where(empty[None, :, None], float("-inf"), x)
    m = tl.where(empty, 0.0, m)
    if KIND == KIND_POWER:
        t = _near_offset(a) - 1.0
    elif KIND >= KIND_RKL:
        fin = x > float("-inf")
        a1, a2 = tl.reduce((tl.where(fin, m[None, :, None] - x, 0.0), tl.where(fin, 1.0, 0.0)), FIRST, _sums2)
        a1, a2 = tl.reduce((a1, a2), SECOND, _sums2)
        t = _jensen_start(a1, a2, KIND)
    else:
        t = tl.zeros([ROWS], tl.float32)
    go = rmask & (empty == 0)
    last = tl.full([ROWS], float("inf"), tl.float32)
    Sp = tl.zeros([ROWS], tl.float32)
    it = 0
    while tl.max(go.to(tl.int32), 0) > 0:
        p, s = _evaluate(x, m[None, :, None], t[None, :, None], a[None, :, None], KIND, EXACT)
        S, Sp, n, umin = _newton_sums(p, s, EXACT, FIRST, SECOND)
        tn, stop, last = newton_step(t, S, Sp, n, umin, it, last, tol, max_iter, a, KIND, EXACT, False)
        go = go & (stop == 0)
        t = tl.where(go, tn, t)
        it += 1
    # a row's last evaluation was at its final t (t changes only while the row goes on): Sp is Σ s there
    p, _ = _evaluate(x, m[None, :, None], t[None, :, None], a[None, :, None], KIND, EXACT)
    if SUMS:
        if KIND >= KIND_RKL:  # f(0) = +inf: the regularizer sum is 0 (never used), <z, p> alone
            zp = tl.sum(tl.sum(tl.where(p > 0, x * p, 0.0), FIRST), SECOND)
            omega = tl.zeros_like(zp)
        else:
            zp, omega = tl.reduce((tl.where(p > 0, x * p, 0.0),
                                   _omega_terms(x, m[None, :, None], t[None, :, None], a[None, :, None], p, omega_c,
                                                KIND)),
                                  FIRST, _sums2)
            zp, omega = tl.reduce((zp, omega), SECOND, _sums2)
        tl.store(SUMS_OUT + rows, tl.where(bad, float("nan"), zp), mask=rmask)
        tl.store(SUMS_OUT + R + rows, tl.where(bad, float("nan"), omega * omega_scale), mask=rmask)
    p = tl.where(bad[None, :, None], float("nan"), p)
    if GRAD:
        target = tl.load(IDX + rows, mask=rmask, other=0).to(tl.int64)
        keep = tl.load(KEEP + rows, mask=rmask, other=0) != 0
        p = _minus_target(p, offs, (rows.to(tl.int64) * k + target)[None, :, None], keep[None, :, None])
    tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
    tau = tl.where(bad, float("nan"), _tau_f(t, m, a, tau_c, KIND))
    tl.store(AUX + 2 * rows, tau, mask=rmask)
    tl.store(AUX + 2 * rows + 1, Sp, mask=rmask)
    tl.store(BAD + rows, bad, mask=rmask)


@triton.jit
def _insert(x, c0, c1, c2, c3, SLOTS: tl.constexpr):
    """Insert ``x`` into every lane's descending list ``c0 >= c1 >= c2 >= c3`` (the first ``SLOTS``
    of them are used): a lane keeps the ``SLOTS`` largest scores it has seen, in registers."""
    if SLOTS >= 4:
        c3 = tl.maximum(c3, tl.minimum(c2, x))
    if SLOTS >= 3:
        c2 = tl.maximum(c2, tl.minimum(c1, x))
    if SLOTS >= 2:
        c1 = tl.maximum(c1, tl.minimum(c0, x))
    c0 = tl.maximum(c0, x)
    return c0, c1, c2, c3


@triton.jit
def _add_slot(c, p, s, n, umin, m, t, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """Add one slot of kept scores ``c`` to the running ``(Σp, Σs, support size, smallest s > 0)`` (the last two
    for 1.5-entmax's closed-form step only)."""
    pc, sc = _evaluate(c, m, t, a, KIND, EXACT)
    p += pc
    s += sc
    if EXACT == 2:
        n += tl.where(sc > 0, 1.0, 0.0)
        umin = tl.minimum(umin, tl.where(sc > 0, sc, float("inf")))
    return p, s, n, umin


@triton.jit
def _slot_sums(c0, c1, c2, c3, m, t, a, KIND: tl.constexpr, EXACT: tl.constexpr, SLOTS: tl.constexpr):
    """:func:`_newton_sums` over the lanes' kept scores (``-inf`` in unused slots adds nothing)."""
    zero = tl.zeros_like(c0)
    p, s, n, umin = _add_slot(c0, zero, zero, zero, zero + float("inf"), m, t, a, KIND, EXACT)
    if SLOTS >= 2:
        p, s, n, umin = _add_slot(c1, p, s, n, umin, m, t, a, KIND, EXACT)
    if SLOTS >= 3:
        p, s, n, umin = _add_slot(c2, p, s, n, umin, m, t, a, KIND, EXACT)
    if SLOTS >= 4:
        p, s, n, umin = _add_slot(c3, p, s, n, umin, m, t, a, KIND, EXACT)
    if EXACT == 2:
        S, Sp, n, umin = tl.reduce((p, s, n, umin), 0, _sums4)
    else:
        S, Sp = tl.reduce((p, s), 0, _sums2)
        n = S
        umin = S
    return S, Sp, n, umin


@triton.jit
def _rest_shift(r1, r2, r3, r4, r5, r6, ref, new, REST: tl.constexpr):
    """The statistics of a lane's scores not kept (:func:`_rest_add`), taken relative to ``ref``, re-expressed
    relative to ``new >= ref`` (a running maximum that grew, or the row maximum): Jensen–Shannon's power sums
    ``Σ u^n`` (``u = e^{z - ref}``) times ``e^{n (ref - new)}``, squared Hellinger's ``(count, Σ y, Σ y²)``
    (``y = ref - z``) shifted by ``new - ref``.  0 where no finite reference is known (nothing was counted)."""
    if REST == 1:
        fin = (new > float("-inf")) & (new < float("inf"))
        s = tl.where(fin, tl.exp(ref - new), 0.0)
        s2 = s * s
        s3 = s2 * s
        r1 = r1 * s
        r2 = r2 * s2
        r3 = r3 * s3
        r4 = r4 * (s2 * s2)
        r5 = r5 * (s3 * s2)
        r6 = r6 * (s3 * s3)
    else:
        d = tl.where((ref > float("-inf")) & (new < float("inf")), new - ref, 0.0)
        r3 = r3 + d * (2.0 * r2 + d * r1)
        r2 = r2 + d * r1
    return r1, r2, r3, r4, r5, r6


@triton.jit
def _rest_add(v, ref, r1, r2, r3, r4, r5, r6, REST: tl.constexpr):
    """Add one score ``v <= ref`` (Jensen–Shannon: ``v <= ref + REST_RESCALE``) that a lane does not keep (``-inf``
    adds nothing) to its statistics relative to ``ref``: ``REST = 1`` (Jensen–Shannon) the power sums ``Σ u^n``,
    ``n = 1..6``, of ``u = e^{v - ref}``; ``REST = 2`` (squared Hellinger) the count, ``Σ y`` and ``Σ y²`` of
    ``y = ref - v`` (``r4..r6`` unused)."""
    fin = (v > float("-inf")) & (ref < float("inf"))
    if REST == 1:
        u = tl.where(fin, tl.exp(v - ref), 0.0)
        u2 = u * u
        u3 = u2 * u
        r1 += u
        r2 += u2
        r3 += u3
        r4 += u2 * u2
        r5 += u3 * u2
        r6 += u3 * u3
    else:
        y = tl.where(fin, ref - v, 0.0)
        r1 += tl.where(fin, 1.0, 0.0)
        r2 += y
        r3 += y * y
    return r1, r2, r3, r4, r5, r6


@triton.jit
def _empty_lanes(BLOCK: tl.constexpr):
    """Every lane's slots ``c0..c3`` empty (``-inf``) and the statistics ``r1..r6`` of the scores it dropped 0."""
    c0 = tl.full([BLOCK], float("-inf"), tl.float32)
    r1 = tl.zeros([BLOCK], tl.float32)
    return c0, c0, c0, c0, r1, r1, r1, r1, r1, r1


@triton.jit
def scan_lanes(zrow, start, L, k, BLOCK: tl.constexpr, SLOTS: tl.constexpr, REST: tl.constexpr):
    """Pass 1 of a streamed row over its entries ``[start, start + L)`` (``< k``) in ``BLOCK`` chunks, lane ``j``
    seeing the columns ``≡ j`` modulo ``BLOCK``: every lane's ``SLOTS`` largest scores ``c0 >= c1 >= c2 >= c3``
    (:func:`_insert`; NaN counts as ``+inf``, ``-inf`` in unused slots) and, with ``REST`` (1 Jensen–Shannon,
    2 squared Hellinger), the statistics ``r1..r6`` of the scores the lane dropped (:func:`_rest_add`, relative to
    the lane's running maximum ``c0``, :func:`_rest_shift`; else 0).  Returns ``(c0, c1, c2, c3, r1, ..., r6)``:
    the one first pass of :func:`solve_long_rows` (the whole row) and :func:`split_scan` (a slice)."""
    cols = tl.arange(0, BLOCK)
    c0, c1, c2, c3, r1, r2, r3, r4, r5, r6 = _empty_lanes(BLOCK)
    ref = c0  # the reference of the statistics: the running maximum (Jensen–Shannon: within REST_RESCALE of it)
    for j0 in range(0, L, BLOCK):
        idx = start + j0 + cols
        x = tl.load(zrow + idx, mask=idx < k, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("inf"))
        if REST:
            new = tl.maximum(c0, x)
            if REST == 1:  # rescaled only when the maximum passed the reference by REST_RESCALE (its rounding)
                new = tl.where(new > ref + REST_RESCALE, new, ref)
            r1, r2, r3, r4, r5, r6 = _rest_shift(r1, r2, r3, r4, r5, r6, ref, new, REST)
            dropped = tl.minimum(_last_slot(c0, c1, c2, c3, SLOTS), x)
            r1, r2, r3, r4, r5, r6 = _rest_add(dropped, new, r1, r2, r3, r4, r5, r6, REST)
            ref = new
        c0, c1, c2, c3 = _insert(x, c0, c1, c2, c3, SLOTS)
    if REST == 1:  # relative to the lane's maximum c0 >= ref at last: one rounding
        r1, r2, r3, r4, r5, r6 = _rest_shift(r1, r2, r3, r4, r5, r6, ref, c0, REST)
    return c0, c1, c2, c3, r1, r2, r3, r4, r5, r6


@triton.jit
def _sums6(a0, b0, c0, d0, e0, f0, a1, b1, c1, d1, e1, f1):
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1, e0 + e1, f0 + f1


@triton.jit
def _rest_row(c0, r1, r2, r3, r4, r5, r6, m, REST: tl.constexpr):
    """The row's statistics of the scores no lane kept: every lane's (:func:`scan_lanes`, relative to its maximum
    ``c0``) re-expressed relative to the row maximum ``m`` (:func:`_rest_shift`) and added up."""
    r1, r2, r3, r4, r5, r6 = _rest_shift(r1, r2, r3, r4, r5, r6, c0, tl.zeros_like(c0) + m, REST)
    return tl.reduce((r1, r2, r3, r4, r5, r6), 0, _sums6)


@triton.jit
def _rest_terms(t, M1, M2, M3, M4, M5, M6, REST: tl.constexpr):
    """``(S, Σ s)`` of the scores no lane kept at ``t``, from their row statistics (:func:`_rest_row`).

    Jensen–Shannon (``REST = 1``): ``p = w/(2 - w) = Σ_n (w/2)^n`` and ``s = Σ_n n (w/2)^n`` with
    ``w = u e^{-t}``, so with the power sums ``M_n = Σ u^n`` of those scores the first six terms are
    ``Σ_n x^n M_n`` and ``Σ_n n x^n M_n``, ``x = e^{-t}/2``: lower bounds, short of the rest by at most
    :func:`_rest_tail`.  Squared Hellinger (``REST = 2``, ``p = 1/(1 + t + y)²``, ``y = m - z``): the
    second-order Taylor sum about the mean ``ȳ`` of the ``n`` scores, ``n/A² + 3V/A⁴`` (``A = 1 + t + ȳ``,
    ``V = Σ (y - ȳ)²``, its share held to a quarter of the first term): an estimate, not a bound (Jensen's
    ``n/A²`` alone is a lower bound), which only starts the full-row steps."""
    if REST == 1:
        x = 0.5 * tl.exp(-t)
        S = x * (M1 + x * (M2 + x * (M3 + x * (M4 + x * (M5 + x * M6)))))
        Sp = x * (M1 + x * (2.0 * M2 + x * (3.0 * M3 + x * (4.0 * M4 + x * (5.0 * M5 + x * (6.0 * M6))))))
    else:
        n = tl.where(M1 > 0, M1, 1.0)
        A = 1.0 + t + M2 / n
        A2 = A * A
        V = tl.maximum(M3 - M2 * (M2 / n), 0.0)
        V = tl.minimum(V, n * A2 / 12.0)
        S = (M1 + 3.0 * V / A2) / A2
        Sp = (2.0 * M1 + 12.0 * V / A2) / (A2 * A)
    return S, Sp


@triton.jit
def _rest_tail(t, M6, U):
    """Jensen–Shannon: what :func:`_rest_terms` leaves out at ``t``, at most: every score not kept has
    ``u <= U``, so ``Σ_{n>6} x^n M_n <= x^6 M_6 · xU/(1 - xU)`` (``x = e^{-t}/2``, ``xU <= 1/2``)."""
    x = 0.5 * tl.exp(-t)
    x2 = x * x
    x6 = x2 * x2 * x2
    xu = x * U
    return x6 * M6 * xu / (1.0 - xu)


@triton.jit
def _last_slot(c0, c1, c2, c3, SLOTS: tl.constexpr):
    """Every lane's smallest kept score: all it dropped is at most this."""
    if SLOTS == 1:
        low = c0
    elif SLOTS == 2:
        low = c1
    elif SLOTS == 3:
        low = c2
    else:
        low = c3
    return low


@triton.jit
def _sums3(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _row_sums(zrow, k, m, t, a, KIND: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`_newton_sums` over a full streamed row: per-lane accumulators, one reduction at the end.  For
    Jensen–Shannon and Hellinger ``n`` is ``Q = Σ d²p/dt²`` instead (``(1 + 2p) s``, ``6 p²``), for :func:`_second_order`."""
    cols = tl.arange(0, BLOCK)
    acc_p = tl.zeros([BLOCK], tl.float32)
    acc_s = tl.zeros([BLOCK], tl.float32)
    acc_n = tl.zeros([BLOCK], tl.float32)
    acc_u = tl.full([BLOCK], float("inf"), tl.float32)
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        x = tl.load(zrow + idx, mask=idx < k, other=float("-inf")).to(tl.float32)
        p, s = _evaluate(x, m, t, a, KIND, EXACT)
        acc_p += p
        acc_s += s
        if EXACT == 2:
            acc_n += tl.where(s > 0, 1.0, 0.0)
            acc_u = tl.minimum(acc_u, tl.where(s > 0, s, float("inf")))
        elif KIND == KIND_JS:
            acc_n += (1.0 + 2.0 * p) * s
        elif KIND == KIND_HELL:
            acc_n += 6.0 * p * p
    if EXACT == 2:
        S, Sp, n, umin = tl.reduce((acc_p, acc_s, acc_n, acc_u), 0, _sums4)
    elif KIND == KIND_JS or KIND == KIND_HELL:
        S, Sp, n = tl.reduce((acc_p, acc_s, acc_n), 0, _sums3)
        umin = S
    else:
        S, Sp = tl.reduce((acc_p, acc_s), 0, _sums2)
        n = S
        umin = S
    return S, Sp, n, umin


@triton.jit
def _jensen_sums(zrow, k, m, BLOCK: tl.constexpr):
    """``(Σ (m - z), n)`` over the ``n`` finite entries of a streamed row (:func:`_jensen_start`'s sums)."""
    cols = tl.arange(0, BLOCK)
    acc_e = tl.zeros([BLOCK], tl.float32)
    acc_n = tl.zeros([BLOCK], tl.float32)
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        x = tl.load(zrow + idx, mask=idx < k, other=float("-inf")).to(tl.float32)
        fin = x > float("-inf")
        acc_e += tl.where(fin, m - x, 0.0)
        acc_n += tl.where(fin, 1.0, 0.0)
    return tl.reduce((acc_e, acc_n), 0, _sums2)


@triton.jit
def _slots_threshold(zrow, k, c0, c1, c2, c3, r1, r2, r3, r4, r5, r6, a, tol, max_iter, KIND: tl.constexpr,
                     EXACT: tl.constexpr, BLOCK: tl.constexpr, SLOTS: tl.constexpr, REST: tl.constexpr):
    """The threshold of a streamed row from every lane's ``SLOTS`` largest scores ``c0 >= c1 >= ...``
    (NaN counted as ``+inf``): Newton on those registers, then over the full row ``zrow`` where they
    may not hold every candidate (see :func:`solve_long_rows`), adding with ``REST`` the scores no lane
    kept from their statistics ``r1..r6`` (:func:`_rest_terms`; Jensen–Shannon skips the full-row steps
    where :func:`_rest_tail` is below half the tolerance); the kinds of :func:`_jensen_start` take
    the row's maximum alone from them and start the full-row steps from Jensen's bound (one more read of
    the row).  Returns ``(m, t, Σ s, bad, empty)`` (``m`` is 0 in empty and bad rows; ``Σ s`` at the
    final ``t`` for the power kind)."""
    m = tl.max(c0, 0)
    bad = m == float("inf")
    empty = bad | (m == float("-inf"))
    m = tl.where(empty, 0.0, m)
    if KIND == KIND_POWER:
        low = _last_slot(c0, c1, c2, c3, SLOTS)
        full = tl.max(tl.where(a * (low - m) > -1.0, 1, 0), 0) > 0  # a lane may have dropped a candidate
        t = -1.0 + _near_offset(a)
    else:
        full = True
        t = _t_lo(KIND)
    Sp = 0.0
    if KIND >= KIND_RKL:
        # Jensen's bound over the full row (one read) instead of the registers' root, which stays far
        # below the row's where the tail is heavy (reverse KL's g = 1/(t + m - z) decays slowly)
        a1, a2 = _jensen_sums(zrow, k, m, BLOCK)
        t = _jensen_start(a1, a2, KIND)
    else:
        # -- Newton on the registers ----------------------------------------------------------
        go = empty == 0
        last = float("inf")
        it = 0
        if REST:  # the scores no lane kept, from the statistics of pass 1 (_rest_terms)
            M1, M2, M3, M4, M5, M6 = _rest_row(c0, r1, r2, r3, r4, r5, r6, m, REST)
        while go:
            S, Sp, n, umin = _slot_sums(c0, c1, c2, c3, m, t, a, KIND, EXACT, SLOTS)
            if REST:
                S_rest, Sp_rest = _rest_terms(t, M1, M2, M3, M4, M5, M6, REST)
                S += S_rest
                Sp += Sp_rest
            tn, stop, last = newton_step(t, S, Sp, n, umin, it, last, tol, max_iter, a, KIND, EXACT, False)
            go = stop == 0
            t = tl.where(go, tn, t)
            it += 1
        if REST == 1:
            # Jensen–Shannon: the registers' root solves the row when what the six power sums leave out is
            # below half the tolerance (every score not kept is at most its lane's smallest kept one)
            low = _last_slot(c0, c1, c2, c3, SLOTS)
            U = tl.max(tl.where(low > float("-inf"), tl.exp(low - m), 0.0), 0)
            full = (it > max_iter) | (_rest_tail(t, M6, U) > 0.5 * tol)
    # -- Newton over the full row, from the registers' root or Jensen's bound (lower bounds) --
    go = (empty == 0) & full
    last = float("inf")
    it = 2  # the stopping tests apply from the first full evaluation
    while go:
        S, Sp, n, umin = _row_sums(zrow, k, m, t, a, KIND, EXACT, BLOCK)
        tn, stop, last = newton_step(t, S, Sp, n, umin, it, last, tol, max_iter, a, KIND, EXACT, False)
        go = stop == 0
        if KIND == KIND_JS or KIND == KIND_HELL:
            # the dense kinds' transformed S is smooth with bounded curvature: from a residual of
            # DENSE_ACCEPT the second-order step (n holds Σ p'') leaves an error of its cube (below
            # the tolerance), so take it without another pass to confirm it (the write pass
            # recomputes Σ s there)
            if KIND == KIND_JS:
                close = tl.abs(S - 1.0) <= DENSE_ACCEPT
            else:
                close = tl.abs(S - 1.0) <= DENSE_ACCEPT_HELLINGER
            t2 = _second_order(t, S, Sp, n, KIND)
            tn = tl.where(close & (t2 == t2), t2, tn)
            stop = stop | (tn == t) | (tn != tn)
            go = stop == 0
            t = tl.where(go, tn, t)
            go = go & (close == 0)
        else:
            t = tl.where(go, tn, t)
        it += 1
    return m, t, Sp, bad, empty


@triton.jit
def _write_span(zrow, prow, start, L, k, m, t, a, bad, empty, omega_c, target, keep, KIND: tl.constexpr,
                EXACT: tl.constexpr, SUMS: tl.constexpr, GRAD: tl.constexpr, BLOCK: tl.constexpr):
    """The last pass over entries ``[start, start + L)`` of a row (``< k``), in ``BLOCK`` chunks: writes ``p`` (``GRAD``:
    ``G = p - y``; NaN in a bad row) at the threshold ``(m, t)``, and returns the span's ``(Σ s, ⟨z, p⟩,
    raw regularizer sum)``: the first for the dense kinds, the other two with ``SUMS`` (0.0 where unused).
    The one write loop of :func:`solve_long_rows` (the whole row) and :func:`split_write` (a slice)."""
    cols = tl.arange(0, BLOCK)
    if SUMS:
        acc_zp = tl.zeros([BLOCK], tl.float32)
        acc_om = tl.zeros([BLOCK], tl.float32)
    if KIND != KIND_POWER:
        acc_s = tl.zeros([BLOCK], tl.float32)
    for j0 in range(0, L, BLOCK):
        idx = start + j0 + cols
        inb = idx < k
        x = tl.load(zrow + idx, mask=inb, other=float("-inf")).to(tl.float32)
        x = tl.where(empty, float("-inf"), x)
        p, s = _evaluate(x, m, t, a, KIND, EXACT)
        if KIND != KIND_POWER:
            acc_s += s
        if SUMS:
            acc_zp += tl.where(p > 0, x * p, 0.0)
            if KIND < KIND_RKL:  # (f(0) = +inf: the regularizer sum stays 0)
                acc_om += _omega_terms(x, m, t, a, p, omega_c, KIND)
        p = tl.where(bad, float("nan"), p)
        p = _written(p, idx, target, keep, GRAD)
        tl.store(prow + idx, p.to(prow.dtype.element_ty), mask=inb)
    s_sum = 0.0
    zp = 0.0
    omega = 0.0
    if KIND != KIND_POWER:
        s_sum = tl.sum(acc_s, 0)
    if SUMS:
        zp, omega = tl.reduce((acc_zp, acc_om), 0, _sums2)
    return s_sum, zp, omega


@triton.jit
def solve_long_rows(Z, P, AUX, BAD, SUMS_OUT, ALPHA, R, k, a_value, tau_c, tol, max_iter, omega_c, omega_scale,
                    IDX, KEEP, KIND: tl.constexpr, EXACT: tl.constexpr, PER_ROW: tl.constexpr, SUMS: tl.constexpr,
                    GRAD: tl.constexpr, BLOCK: tl.constexpr, SLOTS: tl.constexpr):
    """One row per program, streamed in ``BLOCK`` chunks with per-lane accumulators (one
    reduction per pass, no barrier inside a pass); outputs as :func:`solve_block_rows`.

    Pass 1 reads the row once: every lane keeps its ``SLOTS`` largest scores in registers (NaN
    counts as ``+inf``), which gives the maximum ``m`` and the candidates.  Newton then runs on
    those registers.  For the power kind only ``z > m - 1/a`` can be in the support (the
    iterates start at ``t = -1`` and increase), so when no lane dropped such a score (its
    smallest kept score is at most ``m - 1/a``) the registers hold every candidate and the
    threshold is exact without another read.  Otherwise (a lane overflowed, or a dense kind,
    where every entry counts) the registers' root is a lower bound of the row's (the sum over
    a subset is smaller), and Newton goes on over the full row from there.  The last pass
    reads the row and writes ``p`` (``GRAD``: ``G = p - y``)."""
    row = tl.program_id(0)
    zrow = Z + row.to(tl.int64) * k
    prow = P + row.to(tl.int64) * k
    if PER_ROW:
        a = tl.load(ALPHA + row).to(tl.float32) - 1.0
    else:
        a = a_value
    # -- pass 1: every lane's largest scores ------------------------------------------------
    REST: tl.constexpr = 1 if KIND == KIND_JS else 2 if KIND == KIND_HELL else 0
    c0, c1, c2, c3, r1, r2, r3, r4, r5, r6 = scan_lanes(zrow, 0, k, k, BLOCK, SLOTS, REST)
    m, t, Sp, bad, empty = _slots_threshold(zrow, k, c0, c1, c2, c3, r1, r2, r3, r4, r5, r6, a, tol, max_iter, KIND,
                                            EXACT, BLOCK, SLOTS, REST)
    # -- the last pass: write p (power kind: Sp is Σ s at the final t, the last evaluation was there)
    target, keep = _row_target(IDX, KEEP, row, GRAD)
    s_sum, zp, omega = _write_span(zrow, prow, 0, k, k, m, t, a, bad, empty, omega_c, target, keep, KIND, EXACT,
                                   SUMS, GRAD, BLOCK)
    if KIND != KIND_POWER:
        Sp = s_sum
    if SUMS:
        tl.store(SUMS_OUT + row, tl.where(bad, float("nan"), zp))
        tl.store(SUMS_OUT + R + row, tl.where(bad, float("nan"), omega * omega_scale))
    tl.store(AUX + 2 * row, tl.where(bad, float("nan"), _tau_f(t, m, a, tau_c, KIND)))
    tl.store(AUX + 2 * row + 1, Sp)
    tl.store(BAD + row, bad)


@triton.jit
def _jvp_terms(p, v, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """``(s, s ⊙ v)`` with ``s`` from ``p``; ``0 · inf`` does not become NaN, NaN ``p`` gives NaN."""
    s = _s_from_p(p, a, KIND, EXACT)
    sv = tl.where(s != 0, s * v, tl.where(s == s, 0.0, s))
    return s, sv


@triton.jit
def jvp_block_rows(P, V, G, ALPHA, R, k, a_value, scale, KIND: tl.constexpr, EXACT: tl.constexpr,
                   PER_ROW: tl.constexpr, ROWS: tl.constexpr, CH: tl.constexpr, LINE: tl.constexpr,
                   SPLIT: tl.constexpr):
    """``g = scale · s ⊙ (v - ⟨s, v⟩/Σs)`` for rows of at most ``CH·LINE`` entries (tiles of :func:`solve_block_rows`)."""
    rows, rmask, mask, offs = _row_tile(R, k, ROWS, CH, LINE)
    # the reduction axes, the in-thread one first: CH then LINE (one warp per row), or LINE then CH (SPLIT)
    FIRST: tl.constexpr = 2 * SPLIT
    SECOND: tl.constexpr = 1 - SPLIT
    p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    a = _row_a(ALPHA, rows, rmask, a_value, PER_ROW)
    s, sv = _jvp_terms(p, v, a[None, :, None], KIND, EXACT)
    ssum, svsum = tl.reduce((s, sv), FIRST, _sums2)
    ssum, svsum = tl.reduce((ssum, svsum), SECOND, _sums2)
    c = svsum / tl.where(ssum > 0, ssum, 1.0)
    g = tl.where(s != 0, s * (v - c[None, :, None]), sv) * scale
    tl.store(G + offs, g.to(G.dtype.element_ty), mask=mask)


@triton.jit
def jvp_long_rows(P, V, G, ALPHA, k, a_value, scale, KIND: tl.constexpr, EXACT: tl.constexpr,
                  PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`jvp_block_rows` for one long row per program: a pass for ``⟨s, v⟩`` and ``Σs``
    (per-lane accumulators, one reduction), then a pass that writes ``g``.  For the power kind
    ``v`` is read only where ``s ≠ 0`` (the support: masked lanes fetch nothing)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if PER_ROW:
        a = tl.load(ALPHA + row).to(tl.float32) - 1.0
    else:
        a = a_value
    acc_s = tl.zeros([BLOCK], tl.float32)
    acc_sv = tl.zeros([BLOCK], tl.float32)
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        inb = idx < k
        p = tl.load(P + row * k + idx, mask=inb, other=0.0).to(tl.float32)
        if KIND == KIND_POWER:
            inb = inb & (p != 0)
        v = tl.load(V + row * k + idx, mask=inb, other=0.0).to(tl.float32)
        s, sv = _jvp_terms(p, v, a, KIND, EXACT)
        acc_s += s
        acc_sv += sv
    ssum, svsum = tl.reduce((acc_s, acc_sv), 0, _sums2)
    c = svsum / tl.where(ssum > 0, ssum, 1.0)
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        inb = idx < k
        p = tl.load(P + row * k + idx, mask=inb, other=0.0).to(tl.float32)
        vmask = inb
        if KIND == KIND_POWER:
            vmask = inb & (p != 0)
        v = tl.load(V + row * k + idx, mask=vmask, other=0.0).to(tl.float32)
        s, sv = _jvp_terms(p, v, a, KIND, EXACT)
        g = tl.where(s != 0, s * (v - c), sv) * scale
        tl.store(G + row * k + idx, g.to(G.dtype.element_ty), mask=inb)


@triton.jit
def _slice_program(ns):
    """``(row, slice)`` of a split launch's program: ``ns`` programs per row, row by row."""
    pid = tl.program_id(0)
    row = pid // ns
    return row, pid - row * ns


@triton.jit
def split_scan(Z, CAND, k, L, ns, BLOCK: tl.constexpr, SLOTS: tl.constexpr, REST: tl.constexpr):
    """Pass 1 of a split row (one program per slice of ``L`` entries, ``ns`` per row, ``L`` a multiple of
    ``BLOCK``): every lane's ``SLOTS`` largest scores of the slice (NaN counts as ``+inf``), as
    :func:`solve_long_rows` keeps them, into ``CAND[row, slice]`` (``[SLOTS, BLOCK]`` float32, ``-inf``
    in unused slots; with ``REST`` (Jensen–Shannon, squared Hellinger) :data:`REST_STATS` more rows, the
    statistics of the scores the slice's lane dropped, relative to its maximum: :func:`scan_lanes`).  Lane ``j``
    of every slice sees the columns ``≡ j`` modulo ``BLOCK``, as in the one-program kernel."""
    WIDTH: tl.constexpr = SLOTS + REST_STATS * (REST > 0)
    row, j = _slice_program(ns)
    cols = tl.arange(0, BLOCK)
    c0, c1, c2, c3, r1, r2, r3, r4, r5, r6 = scan_lanes(Z + row.to(tl.int64) * k, j.to(tl.int64) * L, L, k, BLOCK,
                                                        SLOTS, REST)
    out = CAND + (row.to(tl.int64) * ns + j) * (WIDTH * BLOCK) + cols
    if REST:
        rest = out + SLOTS * BLOCK
        tl.store(rest, r1)
        tl.store(rest + BLOCK, r2)
        tl.store(rest + 2 * BLOCK, r3)
        if REST == 1:
            tl.store(rest + 3 * BLOCK, r4)
            tl.store(rest + 4 * BLOCK, r5)
            tl.store(rest + 5 * BLOCK, r6)
    tl.store(out, c0)
    if SLOTS >= 2:
        tl.store(out + BLOCK, c1)
    if SLOTS >= 3:
        tl.store(out + 2 * BLOCK, c2)
    if SLOTS >= 4:
        tl.store(out + 3 * BLOCK, c3)


@triton.jit
def split_solve(Z, CAND, STATE, AUX, BAD, ALPHA, k, ns, a_value, tau_c, tol, max_iter,
                KIND: tl.constexpr, EXACT: tl.constexpr, PER_ROW: tl.constexpr, BLOCK: tl.constexpr,
                SLOTS: tl.constexpr, REST: tl.constexpr):
    """The threshold of a split row (one program per row), after :func:`split_scan`: every lane merges
    its slices' kept scores into its ``SLOTS`` largest of the whole row (one read of the small
    candidate buffer), which are exactly :func:`solve_long_rows`'s after its first pass (with ``REST``,
    the statistics of the scores not kept too: the slices', re-expressed relative to the lane's maximum, and
    the kept scores the merge drops), and the
    same iterations follow (:func:`_slots_threshold`: Newton on the registers, then, for the dense
    kinds or a lane that overflowed, full-row steps in this program).  Writes
    ``STATE[row] = (m, t)`` (``m = +inf`` marks a bad row, ``-inf`` an all-masked one), ``τ_f`` and
    ``Σ s`` (final for the power kind; the dense kinds' comes from :func:`split_finish`) into ``AUX``,
    and ``BAD``."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    zrow = Z + row.to(tl.int64) * k
    if PER_ROW:
        a = tl.load(ALPHA + row).to(tl.float32) - 1.0
    else:
        a = a_value
    c0, c1, c2, c3, r1, r2, r3, r4, r5, r6 = _empty_lanes(BLOCK)
    WIDTH: tl.constexpr = SLOTS + REST_STATS * (REST > 0)
    crow = CAND + row.to(tl.int64) * ns * (WIDTH * BLOCK)
    for j in range(ns):
        sl = crow + j * (WIDTH * BLOCK) + cols
        if REST:
            # the lane's statistics and the slice's (relative to its lane maximum, its first slot) onto the
            # larger of the two maxima; then every kept score of the slice goes in, and what the merge drops
            # joins the statistics
            top = tl.load(sl)
            new = tl.maximum(c0, top)
            r1, r2, r3, r4, r5, r6 = _rest_shift(r1, r2, r3, r4, r5, r6, c0, new, REST)
            rest = sl + SLOTS * BLOCK
            q1 = tl.load(rest)
            q2 = tl.load(rest + BLOCK)
            q3 = tl.load(rest + 2 * BLOCK)
            q4 = q1
            q5 = q1
            q6 = q1
            if REST == 1:
                q4 = tl.load(rest + 3 * BLOCK)
                q5 = tl.load(rest + 4 * BLOCK)
                q6 = tl.load(rest + 5 * BLOCK)
            q1, q2, q3, q4, q5, q6 = _rest_shift(q1, q2, q3, q4, q5, q6, top, new, REST)
            r1, r2, r3, r4, r5, r6 = _sums6(r1, r2, r3, r4, r5, r6, q1, q2, q3, q4, q5, q6)
            for c in range(SLOTS):
                x = tl.load(sl + c * BLOCK)
                dropped = tl.minimum(_last_slot(c0, c1, c2, c3, SLOTS), x)
                r1, r2, r3, r4, r5, r6 = _rest_add(dropped, new, r1, r2, r3, r4, r5, r6, REST)
                c0, c1, c2, c3 = _insert(x, c0, c1, c2, c3, SLOTS)
        else:
            for c in range(SLOTS):
                c0, c1, c2, c3 = _insert(tl.load(sl + c * BLOCK), c0, c1, c2, c3, SLOTS)
    m, t, Sp, bad, empty = _slots_threshold(zrow, k, c0, c1, c2, c3, r1, r2, r3, r4, r5, r6, a, tol, max_iter, KIND,
                                            EXACT, BLOCK, SLOTS, REST)
    tl.store(STATE + 2 * row, tl.where(bad, float("inf"), tl.where(empty, float("-inf"), m)))
    tl.store(STATE + 2 * row + 1, t)
    tl.store(AUX + 2 * row, tl.where(bad, float("nan"), _tau_f(t, m, a, tau_c, KIND)))
    tl.store(AUX + 2 * row + 1, Sp)
    tl.store(BAD + row, bad)


@triton.jit
def split_write(Z, P, STATE, PART, ALPHA, IDX, KEEP, k, L, ns, a_value, omega_c, KIND: tl.constexpr,
                EXACT: tl.constexpr, PER_ROW: tl.constexpr, SUMS: tl.constexpr, GRAD: tl.constexpr,
                BLOCK: tl.constexpr):
    """The last pass of a split row, one program per slice: ``p`` (``GRAD``: ``G = p - y``) at the
    threshold of ``STATE``, as :func:`solve_long_rows` writes it, and the slice's partial sums
    ``PART[row, slice] = (Σ s, ⟨z, p⟩, raw regularizer sum)`` (the first for the dense kinds, the
    other two with ``SUMS``), which :func:`split_finish` adds up."""
    row, j = _slice_program(ns)
    start = j.to(tl.int64) * L
    zrow = Z + row.to(tl.int64) * k
    prow = P + row.to(tl.int64) * k
    m = tl.load(STATE + 2 * row)
    t = tl.load(STATE + 2 * row + 1)
    bad = m == float("inf")
    empty = bad | (m == float("-inf"))
    m = tl.where(empty, 0.0, m)
    if PER_ROW:
        a = tl.load(ALPHA + row).to(tl.float32) - 1.0
    else:
        a = a_value
    target, keep = _row_target(IDX, KEEP, row, GRAD)
    s_sum, zp, omega = _write_span(zrow, prow, start, L, k, m, t, a, bad, empty, omega_c, target, keep, KIND,
                                   EXACT, SUMS, GRAD, BLOCK)
    part = PART + 3 * (row * ns + j)
    if KIND != KIND_POWER:
        tl.store(part, s_sum)
    if SUMS:
        tl.store(part + 1, zp)
        tl.store(part + 2, omega)


@triton.jit
def split_finish(PART, STATE, AUX, SUMS_OUT, R, ns, omega_scale, KIND: tl.constexpr, SUMS: tl.constexpr,
                 NSP: tl.constexpr):
    """The row sums of a split row from its slices' partial sums (one program per row): ``Σ s`` into
    ``AUX`` (the dense kinds) and, with ``SUMS``, the loss row sums into ``SUMS_OUT`` (NaN in bad rows)."""
    row = tl.program_id(0)
    js = tl.arange(0, NSP)
    part = PART + 3 * (row * ns + js)
    inb = js < ns
    if KIND != KIND_POWER:
        tl.store(AUX + 2 * row + 1, tl.sum(tl.load(part, mask=inb, other=0.0), 0))
    if SUMS:
        bad = tl.load(STATE + 2 * row) == float("inf")
        zp = tl.sum(tl.load(part + 1, mask=inb, other=0.0), 0)
        omega = tl.sum(tl.load(part + 2, mask=inb, other=0.0), 0)
        tl.store(SUMS_OUT + row, tl.where(bad, float("nan"), zp))
        tl.store(SUMS_OUT + R + row, tl.where(bad, float("nan"), omega * omega_scale))


@triton.jit
def jvp_split_sums(P, V, PART, ALPHA, k, L, ns, a_value, KIND: tl.constexpr, EXACT: tl.constexpr,
                   PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """The backward of a split row, first pass (one program per slice): the slice's ``(Σ s, ⟨s, v⟩)``
    into ``PART[row, slice]`` (``v`` read only where ``s ≠ 0`` for the power kind)."""
    row, j = _slice_program(ns)
    cols = tl.arange(0, BLOCK)
    start = j.to(tl.int64) * L
    base = row.to(tl.int64) * k
    if PER_ROW:
        a = tl.load(ALPHA + row).to(tl.float32) - 1.0
    else:
        a = a_value
    acc_s = tl.zeros([BLOCK], tl.float32)
    acc_sv = tl.zeros([BLOCK], tl.float32)
    for j0 in range(0, L, BLOCK):
        idx = start + j0 + cols
        inb = idx < k
        p = tl.load(P + base + idx, mask=inb, other=0.0).to(tl.float32)
        if KIND == KIND_POWER:
            inb = inb & (p != 0)
        v = tl.load(V + base + idx, mask=inb, other=0.0).to(tl.float32)
        s, sv = _jvp_terms(p, v, a, KIND, EXACT)
        acc_s += s
        acc_sv += sv
    ssum, svsum = tl.reduce((acc_s, acc_sv), 0, _sums2)
    part = PART + 2 * (row * ns + j)
    tl.store(part, ssum)
    tl.store(part + 1, svsum)


@triton.jit
def jvp_split_write(P, V, G, PART, ALPHA, k, L, ns, a_value, scale, KIND: tl.constexpr, EXACT: tl.constexpr,
                    PER_ROW: tl.constexpr, BLOCK: tl.constexpr, NSP: tl.constexpr):
    """The backward of a split row, second pass (one program per slice): the row's ``⟨s, v⟩/Σs`` from the
    ``ns`` partial sums of :func:`jvp_split_sums` (every program of the row adds them up the same way),
    then ``g`` over the slice as :func:`jvp_long_rows` writes it."""
    row, j = _slice_program(ns)
    cols = tl.arange(0, BLOCK)
    start = j.to(tl.int64) * L
    base = row.to(tl.int64) * k
    if PER_ROW:
        a = tl.load(ALPHA + row).to(tl.float32) - 1.0
    else:
        a = a_value
    js = tl.arange(0, NSP)
    part = PART + 2 * (row * ns + js)
    ssum = tl.sum(tl.load(part, mask=js < ns, other=0.0), 0)
    svsum = tl.sum(tl.load(part + 1, mask=js < ns, other=0.0), 0)
    c = svsum / tl.where(ssum > 0, ssum, 1.0)
    for j0 in range(0, L, BLOCK):
        idx = start + j0 + cols
        inb = idx < k
        p = tl.load(P + base + idx, mask=inb, other=0.0).to(tl.float32)
        vmask = inb
        if KIND == KIND_POWER:
            vmask = inb & (p != 0)
        v = tl.load(V + base + idx, mask=vmask, other=0.0).to(tl.float32)
        s, sv = _jvp_terms(p, v, a, KIND, EXACT)
        g = tl.where(s != 0, s * (v - c), sv) * scale
        tl.store(G + base + idx, g.to(G.dtype.element_ty), mask=inb)


@triton.jit
def relu_power(t, a, EXACT: tl.constexpr):
    """``t^{1/a}`` for ``t >= 0``."""
    if EXACT == 1:
        y = t
    elif EXACT == 2:
        y = t * t
    else:
        y = tl.where(t > 0, tl.exp2(tl.log2(tl.where(t > 0, t, 1.0)) / a), 0.0)
    return y


@triton.jit
def alpha_relu_forward(X, Y, n, a, tau, EXACT: tl.constexpr, BLOCK: tl.constexpr):
    """``y = [a x - τ]_+^{1/a}`` elementwise (NaN stays NaN)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    u = a * x - tau
    t = tl.where(u > 0, u, tl.where(u == u, 0.0, u))
    y = tl.where(t == t, relu_power(t, a, EXACT), t)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def alpha_relu_backward(X, GY, GX, n, a, tau, EXACT: tl.constexpr, BLOCK: tl.constexpr):
    """``∂L/∂x = ∂L/∂y · [a x - τ]_+^{1/a - 1}`` elementwise (``= y^{2-α}``)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    gy = tl.load(GY + offs, mask=mask, other=0.0).to(tl.float32)
    u = a * x - tau
    pos = u > 0
    if EXACT == 1:
        d = tl.where(pos, 1.0, 0.0)
    elif EXACT == 2:
        d = tl.where(pos, u, 0.0)
    else:
        d = tl.where(pos, tl.exp2(tl.log2(tl.where(pos, u, 1.0)) * (1.0 / a - 1.0)), 0.0)
    d = tl.where(u == u, d, u)
    tl.store(GX + offs, (gy * d).to(GX.dtype.element_ty), mask=mask)
