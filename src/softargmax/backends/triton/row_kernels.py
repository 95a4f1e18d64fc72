r"""Triton kernels of the GPU row solver (imported only by :mod:`softargmax.backends.triton.rows`).

Every kernel follows the CPU row solver (``_cpu_rows.c``): one threshold per row, found
by a monotone Newton iteration that starts below the root, in float32 whatever the input
type (float16/bfloat16 are read and written as they are, accumulated in float32).

Kinds (all with ``q = 1``), in the solver's own variable ``t``:

* ``KIND_POWER`` (α-entmax, ``a = α - 1 ∈ (0, 1]``): ``d = a (z - m)`` with ``m`` the row
  maximum, ``p = [d - t]_+^{1/a}``, ``s = [d - t]_+^{1/a - 1}``; Newton on ``S^a`` from
  ``t = -1``.  For ``a < NEAR_ONE`` the kernels hold ``t + 1`` instead of ``t`` and take
  ``log(1 + w)`` of the base ``1 + w`` without cancellation, so ``p`` keeps full float32
  precision as α → 1.  ``EXACT = 1`` (sparsemax): Michelot's step, exact once the support is
  stable.  ``EXACT = 2`` (1.5-entmax): the root of the support's quadratic when it keeps
  every candidate positive (then exact), else a Newton step.  Only ``z > m - 1/a`` can be
  in the support: the long-row kernel collects those candidates once and iterates on them.
* ``KIND_JS`` (Jensen–Shannon, dense): ``t = τ - m``, ``w = e^{z - m - t}``,
  ``p = w / (2 - w)``, ``s = p + p²``; Newton on ``log S`` from ``t = 0``.
* ``KIND_HELL`` (squared Hellinger, dense): ``t = τ - m``, ``r = 1/(1 + t + m - z)``,
  ``p = r²``, ``s = 2 r³``; Newton on ``S^{-1/2}`` from ``t = 0``.

Stopping: the iterates increase monotonically in exact arithmetic; in float32 a step may go
back by rounding, so a row stops when its residual ``|S - 1|`` is below ``tol``, stops
decreasing (checked from the third evaluation), the step vanishes, or after ``max_iter``.

Row layouts: :func:`solve_block_rows` holds ``ROWS × BLOCK`` scores in registers (rows up
to ``BLOCK`` long, several short rows per program) and reads them once;
:func:`solve_long_rows` is one program per row and streams the row in ``BLOCK`` chunks:
one pass for the maximum and the candidates (written to a per-row scratch of ``CAP``
slots; a row with more candidates iterates on the full row instead), the Newton passes
on the candidates, and one pass that writes ``p``.  The backward kernels recompute
``s`` from ``p`` (``s = p^{1-a}``, ``p + p²``, ``2 p^{3/2}``), so the forward writes only ``p``.

The solver kernels also write two row sums for the Fenchel–Young loss values, from the
pass that writes ``p``: ``⟨z, p⟩`` and the raw regularizer sum of :func:`_omega_terms`.

Status per row: 0 solved, 1 all ``-inf`` (``p = 0``), 2 NaN or ``+inf`` (``p = NaN``).
"""

import triton
import triton.language as tl

KIND_POWER = tl.constexpr(0)
KIND_JS = tl.constexpr(1)
KIND_HELL = tl.constexpr(2)


#: below this ``a = α - 1`` the power kind iterates on ``t + 1`` and takes ``log(1 + w)``
#: without cancellation (the base ``1 + w`` is within ``a`` of 1: ``p`` lost ``ε/a``)
NEAR_ONE = tl.constexpr(0.25)


@triton.jit
def _near_offset(a):
    """1.0 where the power kind's variable is ``t + 1`` (``a < NEAR_ONE``), else 0.0."""
    return tl.where(a < NEAR_ONE, 1.0, 0.0)


@triton.jit
def _evaluate(x, m, t, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """``(p, s)`` at scores ``x`` (``-inf`` masked) for row maximum ``m`` and threshold ``t``
    (power kind with ``a < NEAR_ONE``: ``t`` holds ``t + 1``, see :func:`_near_offset`)."""
    if KIND == KIND_POWER:
        if EXACT == 0:
            c = _near_offset(a)
            w = a * (x - m) - t
            u = w + c
        else:
            u = a * (x - m) - t
        pos = u > 0
        if EXACT == 1:
            p = tl.where(pos, u, 0.0)
            s = tl.where(pos, 1.0, 0.0)
        elif EXACT == 2:
            p = tl.where(pos, u * u, 0.0)
            s = tl.where(pos, u, 0.0)
        else:
            uu = tl.where(pos, u, 1.0)
            lu = tl.log2(uu)
            # log2(1 + w) with w exact (Kahan): log2(u) w / (u - 1), or w log2(e) when u rounds to 1
            near1p = tl.where(uu != 1.0, lu * (w / (uu - 1.0)), w * 1.4426950408889634)
            lu = tl.where(c > 0, near1p, lu)
            p = tl.where(pos, tl.exp2(lu / a), 0.0)
            s = tl.where(pos, tl.exp2(lu * (1.0 / a - 1.0)), 0.0)
    elif KIND == KIND_JS:
        w = tl.exp(x - m - t)  # in [0, 1]: t >= 0 throughout
        p = w / (2.0 - w)
        s = p + p * p
    else:
        r = 1.0 / (1.0 + t + (m - x))
        p = r * r
        s = 2.0 * p * r
    return p, s


@triton.jit
def _omega_terms(x, m, t, a, p, c, KIND: tl.constexpr):
    """Per entry, the raw term of the regularizer's row sum (0 where ``p = 0``):
    ``p^α - c p = p (d - t - c)`` (power), ``f(p) - f(0)`` (Jensen–Shannon:
    ``p log p - (p+1) log((p+1)/2) - log 2``; squared Hellinger: ``p - 2 √p``)."""
    pos = p > 0
    if KIND == KIND_POWER:
        w = p * (a * (x - m) - (t - _near_offset(a)) - c)
    elif KIND == KIND_JS:
        pp = tl.where(pos, p, 1.0)
        w = pp * tl.log(pp) - (pp + 1.0) * tl.log(0.5 * (pp + 1.0)) - 0.6931471805599453
    else:
        w = p - 2.0 * tl.sqrt(p)
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
        else:
            s = tl.where(pos, tl.exp2((1.0 - a) * tl.log2(tl.where(pos, p, 1.0))), 0.0)
    elif KIND == KIND_JS:
        s = p + p * p
    else:
        s = 2.0 * p * tl.sqrt(p)
    return tl.where(p == p, s, p)


@triton.jit
def _newton(t, S, Sp, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """One Newton step (``dS/dt = -Sp``): on ``S^a``, ``log S`` or ``S^{-1/2}``."""
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
    else:
        step = 2.0 * (S * tl.sqrt(S) - S) / Sp
    return t + step


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
def newton_step(t, S, Sp, n, umin, it, last, tol, max_iter, a, KIND: tl.constexpr, EXACT: tl.constexpr):
    """The stopping test at ``t`` (module docstring) and the next iterate: ``(tn, stop, last)``.
    ``n``, ``umin``: the support's size and smallest ``u`` (used by 1.5-entmax only)."""
    resid = tl.abs(S - 1.0)
    stop = (it >= max_iter) | ((it > 1) & ((resid <= tol) | (resid >= last)))
    if it > 1:
        last = resid
    tn = _newton(t, S, Sp, a, KIND, EXACT)
    if EXACT == 2:
        tn = _quadratic(t, tn, S, Sp, n, umin)
    stop = stop | (tn == t) | (tn != tn)  # (a step may go back by rounding)
    return tn, stop, last


@triton.jit
def _row_tile(R, k, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's rows, their mask, the ``[ROWS, BLOCK]`` mask and offsets into a ``[R, k]`` matrix."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < R
    mask = rmask[:, None] & (cols[None, :] < k)
    offs = rows.to(tl.int64)[:, None] * k + cols[None, :]
    return rows, rmask, mask, offs


@triton.jit
def solve_block_rows(Z, P, T, SSUM, STATUS, ZP, OMEGA, A, R, k, a_stride, tol, max_iter, omega_c,
                     KIND: tl.constexpr, EXACT: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Rows of at most ``BLOCK`` scores, ``ROWS`` of them per program, held in registers."""
    rows, rmask, mask, offs = _row_tile(R, k, ROWS, BLOCK)
    x = tl.load(Z + offs, mask=mask, other=float("-inf")).to(tl.float32)
    a = tl.load(A + rows * a_stride, mask=rmask, other=1.0).to(tl.float32)
    bad = tl.max(((x != x) | (x == float("inf"))).to(tl.int32), 1) > 0
    m = tl.max(tl.where(x == x, x, float("-inf")), 1)
    empty = bad | (m == float("-inf"))
    x = tl.where(empty[:, None], float("-inf"), x)
    m = tl.where(empty, 0.0, m)
    if KIND == KIND_POWER:
        t = tl.full([ROWS], -1.0, tl.float32) + _near_offset(a)
    else:
        t = tl.zeros([ROWS], tl.float32)
    go = rmask & (empty == 0)
    last = tl.full([ROWS], float("inf"), tl.float32)
    it = 0
    while tl.sum(go.to(tl.int32), 0) > 0:
        p, s = _evaluate(x, m[:, None], t[:, None], a[:, None], KIND, EXACT)
        S = tl.sum(p, 1)
        Sp = tl.sum(s, 1)
        n = S  # the support's size and smallest u: only 1.5-entmax's quadratic step uses them
        umin = S
        if EXACT == 2:
            n = tl.sum(tl.where(s > 0, 1.0, 0.0), 1)
            umin = tl.min(tl.where(s > 0, s, float("inf")), 1)
        tn, stop, last = newton_step(t, S, Sp, n, umin, it, last, tol, max_iter, a, KIND, EXACT)
        go = go & (stop == 0)
        t = tl.where(go, tn, t)
        it += 1
    p, s = _evaluate(x, m[:, None], t[:, None], a[:, None], KIND, EXACT)
    zp = tl.sum(tl.where(p > 0, x * p, 0.0), 1)
    omega = tl.sum(_omega_terms(x, m[:, None], t[:, None], a[:, None], p, omega_c, KIND), 1)
    tl.store(ZP + rows, tl.where(bad, float("nan"), zp), mask=rmask)
    tl.store(OMEGA + rows, tl.where(bad, float("nan"), omega), mask=rmask)
    p = tl.where(bad[:, None], float("nan"), p)
    tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
    if KIND == KIND_POWER:
        tau = (t - _near_offset(a)) + a * m
    else:
        tau = t + m
    tau = tl.where(bad, float("nan"), tau)
    tl.store(T + rows, tau.to(T.dtype.element_ty), mask=rmask)
    tl.store(SSUM + rows, tl.sum(s, 1).to(SSUM.dtype.element_ty), mask=rmask)
    status = tl.where(bad, 2, tl.where(empty, 1, 0))
    tl.store(STATUS + rows, status.to(tl.int8), mask=rmask)


@triton.jit
def solve_long_rows(Z, P, T, SSUM, STATUS, ZP, OMEGA, A, SCRATCH, k, a_stride, tol, max_iter, omega_c,
                    KIND: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr):
    """One row per program, streamed in ``BLOCK`` chunks (see the module docstring)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    zrow = Z + row * k
    crow = SCRATCH + row * CAP
    a = tl.load(A + row * a_stride).to(tl.float32)
    # -- pass 1: maximum, NaN/+inf, candidates above the running maximum's bound ---------
    m = float("-inf")
    nbad = 0
    n = 0
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        x = tl.load(zrow + idx, mask=idx < k, other=float("-inf")).to(tl.float32)
        nbad += tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 0)
        m = tl.maximum(m, tl.max(tl.where(x == x, x, float("-inf")), 0))
        if KIND == KIND_POWER:
            # m only grows, so this keeps a superset of the final candidates z > m - 1/a
            keep = a * (x - m) > -1.0
            slot = n + tl.cumsum(keep.to(tl.int32), 0) - 1
            tl.store(crow + slot, x, mask=keep & (slot < CAP))
            n += tl.sum(keep.to(tl.int32), 0)
    bad = nbad > 0
    empty = bad | (m == float("-inf"))
    m = tl.where(empty, 0.0, m)
    if KIND == KIND_POWER:
        # iterate on the scratch (n <= CAP candidates) or, after an overflow, on the whole row
        n_scratch = tl.where(n <= CAP, n, 0)
        n_row = tl.where(n <= CAP, 0, k)
        length = n_scratch + n_row
        t = -1.0 + _near_offset(a)
    else:
        length = k
        t = 0.0
    # -- Newton on the candidates (or the whole row) ------------------------------------------
    go = empty == 0
    last = float("inf")
    it = 0
    while go:
        S = 0.0
        Sp = 0.0
        cnt = 0.0
        umin = float("inf")
        for j0 in range(0, length, BLOCK):
            idx = j0 + cols
            inb = idx < length
            if KIND == KIND_POWER:
                xs = tl.load(crow + idx, mask=idx < n_scratch, other=float("-inf"))
                xz = tl.load(zrow + idx, mask=idx < n_row, other=float("-inf")).to(tl.float32)
                x = tl.maximum(xs, xz)
            else:
                x = tl.load(zrow + idx, mask=inb, other=float("-inf")).to(tl.float32)
            p, s = _evaluate(x, m, t, a, KIND, EXACT)
            S += tl.sum(p, 0)
            Sp += tl.sum(s, 0)
            if EXACT == 2:
                cnt += tl.sum(tl.where(s > 0, 1.0, 0.0), 0)
                umin = tl.minimum(umin, tl.min(tl.where(s > 0, s, float("inf")), 0))
        tn, stop, last = newton_step(t, S, Sp, cnt, umin, it, last, tol, max_iter, a, KIND, EXACT)
        go = stop == 0
        t = tl.where(go, tn, t)
        it += 1
    # -- pass 3: write p ----------------------------------------------------------------------
    Sp = 0.0
    zp = 0.0
    omega = 0.0
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        inb = idx < k
        x = tl.load(zrow + idx, mask=inb, other=float("-inf")).to(tl.float32)
        x = tl.where(empty, float("-inf"), x)
        p, s = _evaluate(x, m, t, a, KIND, EXACT)
        Sp += tl.sum(s, 0)
        zp += tl.sum(tl.where(p > 0, x * p, 0.0), 0)
        omega += tl.sum(_omega_terms(x, m, t, a, p, omega_c, KIND), 0)
        p = tl.where(bad, float("nan"), p)
        tl.store(P + row * k + idx, p.to(P.dtype.element_ty), mask=inb)
    if KIND == KIND_POWER:
        tau = (t - _near_offset(a)) + a * m
    else:
        tau = t + m
    tl.store(T + row, tl.where(bad, float("nan"), tau).to(T.dtype.element_ty))
    tl.store(SSUM + row, Sp.to(SSUM.dtype.element_ty))  # type: ignore[attr-defined]  # a Triton scalar after the loop
    tl.store(ZP + row, tl.where(bad, float("nan"), zp))
    tl.store(OMEGA + row, tl.where(bad, float("nan"), omega))
    tl.store(STATUS + row, tl.where(bad, 2, tl.where(empty, 1, 0)).to(tl.int8))


@triton.jit
def jvp_block_rows(P, V, G, A, R, k, a_stride, scale,
                   KIND: tl.constexpr, EXACT: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """``g = scale · s ⊙ (v - ⟨s, v⟩/Σs)`` for rows of at most ``BLOCK`` entries."""
    rows, rmask, mask, offs = _row_tile(R, k, ROWS, BLOCK)
    p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + rows * a_stride, mask=rmask, other=1.0).to(tl.float32)
    s = _s_from_p(p, a[:, None], KIND, EXACT)
    sv = tl.where(s != 0, s * v, tl.where(s == s, 0.0, s))  # 0 · inf must not become NaN
    ssum = tl.sum(s, 1)
    c = tl.sum(sv, 1) / tl.where(ssum > 0, ssum, 1.0)
    g = tl.where(s != 0, s * (v - c[:, None]), sv) * scale
    tl.store(G + offs, g.to(G.dtype.element_ty), mask=mask)


@triton.jit
def jvp_long_rows(P, V, G, A, k, a_stride, scale, KIND: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`jvp_block_rows` for one long row per program: a reduction pass, then a write pass."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    a = tl.load(A + row * a_stride).to(tl.float32)
    acc_sv = 0.0
    acc_s = 0.0
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        inb = idx < k
        p = tl.load(P + row * k + idx, mask=inb, other=0.0).to(tl.float32)
        v = tl.load(V + row * k + idx, mask=inb, other=0.0).to(tl.float32)
        s = _s_from_p(p, a, KIND, EXACT)
        acc_sv += tl.sum(tl.where(s != 0, s * v, tl.where(s == s, 0.0, s)), 0)
        acc_s += tl.sum(s, 0)
    c = acc_sv / tl.where(acc_s > 0, acc_s, 1.0)
    for j0 in range(0, k, BLOCK):
        idx = j0 + cols
        inb = idx < k
        p = tl.load(P + row * k + idx, mask=inb, other=0.0).to(tl.float32)
        v = tl.load(V + row * k + idx, mask=inb, other=0.0).to(tl.float32)
        s = _s_from_p(p, a, KIND, EXACT)
        g = tl.where(s != 0, s * (v - c), tl.where(s == s, 0.0, s)) * scale
        tl.store(G + row * k + idx, g.to(G.dtype.element_ty), mask=inb)


@triton.jit
def _relu_power(t, a, EXACT: tl.constexpr):
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
    y = tl.where(t == t, _relu_power(t, a, EXACT), t)
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
