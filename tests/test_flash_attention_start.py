"""The start of the fused attention forward's Newton iteration: a threshold from a histogram of the
scores taken during the max pass.

The start must lie below every row's threshold (the iterates then rise monotonically and the
skipped tiles stay skipped).  A small kernel runs the forward's own histogram and start on rows
of scores, tile by tile as the forward does, against the threshold found by bisection in float64;
the rows are chosen so that the running maximum rises at every tile (the histogram's anchor moves
each time), falls, or is random.  The forward's pass counts on a fixed seeded input stay below the
count measured with the start ``t = -1`` (deterministic in the interpreter), and its output
matches the materialized path.
"""

import math
import os

import pytest
import torch

from softargmax.backends.triton import flash_attention as FA

triton = pytest.importorskip("triton")
tl = triton.language
from softargmax.backends.triton import attention_kernels as AK  # noqa: E402


@pytest.fixture
def device(gpu_when_present):
    if not FA.available():
        pytest.skip("Triton is not installed")
    if gpu_when_present:
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    return "cpu"


@triton.jit
def _start(Z, T0, n, a, scale, EXACT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
           FLUSH: tl.constexpr):
    """The forward's start for ``ROWS`` rows of ``n`` scores ``scale · Z`` (``Z`` as the dots the forward bins),
    binned in tiles of ``BLOCK_N`` keys (the tile-shaped counts added to the rows' every ``FLUSH`` tiles)."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    anchor = tl.full([ROWS], -1e30, tl.float32)
    hist = tl.zeros([ROWS, BLOCK_N], tl.int64)
    counts = tl.zeros([ROWS, AK.HIST_BINS], tl.float32)
    c_anchor = anchor
    for nb in range(tl.cdiv(n, BLOCK_N)):
        offs = nb * BLOCK_N + cols
        z = tl.load(Z + rows[:, None] * n + offs[None, :], mask=offs[None, :] < n, other=float("-inf"))
        m = tl.maximum(m, tl.max(z, 1) * scale)
        hist, anchor = AK._hist_add(hist, anchor, m, z, a * AK.HIST_WIDTH, a * AK.HIST_WIDTH * scale)
        if nb % FLUSH == FLUSH - 1:  # the tile-shaped counts to the rows' (the forward: every HIST_CHUNK blocks)
            counts, c_anchor = AK._hist_flush(hist, anchor, counts, c_anchor)
            hist = tl.zeros([ROWS, BLOCK_N], tl.int64)
    counts, anchor = AK._hist_flush(hist, anchor, counts, c_anchor)
    empty = m == float("-inf")
    m = tl.where(empty, 0.0, m)
    tl.store(T0 + rows, AK._hist_start(counts, anchor, m, a, empty == 0, EXACT, False))


def _threshold(z, a):
    """The root ``t`` of ``Σ_j [a (z_j - m) - t]_+^{1/a} = 1`` per row, by bisection in float64."""
    d = a * (z.double() - z.double().max(1, keepdim=True).values)
    lo = torch.full((z.shape[0],), -1.0, dtype=torch.float64)
    hi = torch.zeros_like(lo)
    for _ in range(80):
        mid = (lo + hi) / 2
        S = ((d - mid[:, None]).clamp(min=0) ** (1 / a)).sum(1)
        lo, hi = torch.where(S >= 1, mid, lo), torch.where(S >= 1, hi, mid)
    return lo


def _rows(n):
    gen = torch.Generator().manual_seed(11)
    noise = torch.randn(16, n, generator=gen)
    ramp = torch.linspace(0, 4, n)
    return torch.cat([noise,                           # random
                      ramp + 0.3 * noise,               # the maximum rises at every tile: the anchor moves
                      ramp.flip(0) + 0.3 * noise,       # the maximum comes first
                      3 * noise[:8],                    # sharp: small supports
                      0.2 * noise[8:]])                 # flat: large supports


@pytest.mark.parametrize("alpha,flush", [(2.0, 1000), (1.5, 1000), (1.5, 2), (1.3, 3), (1.7, 1000), (1.05, 1000)])
def test_start_is_below_the_threshold(device, alpha, flush):
    a = alpha - 1
    exact = 1 if alpha == 2.0 else 2 if alpha == 1.5 else 0
    scale = 0.1443  # the dots are binned, the scores are scale times them (not a power of two: rounded)
    x = (_rows(200) / scale).float()
    x[3, 150:] = float("-inf")  # a row with masked keys (partly masked tiles, a fully masked one)
    z = x.double() * scale
    want = _threshold(torch.where(torch.isinf(z), torch.tensor(-1e30, dtype=torch.float64), z), a)
    t0 = torch.empty(z.shape[0], dtype=torch.float32, device=device)
    _start[(1,)](x.to(device).contiguous(), t0, z.shape[1], a, scale, EXACT=exact, ROWS=z.shape[0], BLOCK_N=32,
                 FLUSH=flush)
    t0 = t0.cpu().double()
    assert (t0 <= want).all(), (t0 - want).max()
    assert (t0 >= -1).all()
    # and close to it: within one bin where the threshold is inside the bins (d > -2/3; measured: at most 0.056),
    # within 1/3 elsewhere (the start is at least -1; measured: at most 0.25)
    inside = want > -2 / 3
    assert ((want - t0)[inside] <= 1 / AK.HIST_WIDTH.value).all() and (want - t0).max() <= 1 / 3


@pytest.mark.parametrize("alpha", [2.0, 1.5])
def test_start_is_below_the_threshold_far_from_zero(device, alpha):
    """Rows whose scores sit on the bins' edges, their maximum far from 0: the bins' ``d_k`` round at the scale
    of ``|a m|``, and the start must stay below the threshold there too (it was above it from 1e3 on)."""
    a = alpha - 1
    exact = 1 if alpha == 2.0 else 2
    w = 1.0 / (AK.HIST_WIDTH.value * a)
    gen = torch.Generator().manual_seed(3)
    for off, scale in ((1e3, 1.0), (1e4, 1.0), (-1e4, 1.0), (1e3, 0.1443), (-1e4, 0.1443)):
        k = torch.randint(0, 6, (16, 64), generator=gen).double()
        k[:, 0] = 0
        x = (((off // w) * w - k * w) / scale).float()  # the dots: their scores are on the edges, up to rounding
        z = x.double() * scale
        t0 = torch.empty(16, dtype=torch.float32, device=device)
        _start[(1,)](x.to(device).contiguous(), t0, 64, a, scale, EXACT=exact, ROWS=16, BLOCK_N=32, FLUSH=1000)
        t0 = t0.cpu().double()
        assert (t0 <= _threshold(z, a)).all(), (off, scale, (t0 - _threshold(z, a)).max())


def _random_qkv(L, D, H=4, seed=128):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, L, D, generator=gen) for _ in range(3)]


#: Newton passes per query block (max, sum over the 8 blocks) of the forward on ``_random_qkv(128, 64)``
#: in 64x32 tiles (not causal) when it started from ``t = -1``, as the interpreter counted them
BASELINE = {("sparsemax", None): (6, 46), ("entmax15", None): (6, 41), ("entmax", 1.3): (6, 45),
            ("entmax", 1.7): (7, 50)}


@pytest.mark.parametrize("mapping,alpha", list(BASELINE))
def test_fewer_passes_and_exact(device, mapping, alpha):
    """On a fixed seeded input the histogram start saves a pass on the slowest block and half a
    pass per block on average against the start ``t = -1`` (measured: 14, 9, 6 and 10 of the 8
    blocks' passes), and the forward stays exact."""
    q, k, v = (t.to(device) for t in _random_qkv(128, 64))
    stats = FA.forward_stats(q, k, v, mapping=mapping, alpha=alpha, block_m=64, block_n=32)
    passes = stats["newton_passes"]
    most, total = BASELINE[(mapping, alpha)]
    assert int(passes.max()) <= most - 1 and int(passes.sum()) <= total - passes.numel() // 2
    # float32 rounding of u = a z - τ at the scores' scale: sparsemax's worst row has 7 keys in its support and
    # |τ| = 2.7 (up to 7 · 2^-24 · (|z| + |τ|) = 2.4e-6; measured 1.4e-6)
    assert (stats["psum"] - 1).abs().max() <= 3e-6
    out = FA.flash_attention(q, k, v, mapping=mapping, alpha=alpha, block_m=64, block_n=32)
    import softargmax as sa

    want, _ = sa.attention(q.double(), k.double(), v.double(), mapping=mapping, alpha=alpha, return_weights=True)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    assert math.isfinite(float(out.abs().max()))


@triton.jit
def _solve(D, T0, T, P, n, max_iter, EXACT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The forward's passes on ``ROWS`` rows of ``n`` values ``d = a (z - m)`` from the starts ``T0``: per pass
    the support's sums over tiles of ``BLOCK_N`` (:func:`AK._support_add`, :func:`AK._support_sums`), then
    :func:`AK._certified_step`;
    writes the thresholds and each row's passes."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    t = tl.load(T0 + rows)
    a = 1.0 if EXACT == 1 else 0.5
    go = rows >= 0
    passes = tl.zeros([ROWS], tl.int32)
    last = tl.full([ROWS], float("inf"), tl.float32)
    it = 0
    while tl.sum(go.to(tl.int32), 0) > 0:
        S = tl.zeros([ROWS], tl.float32)
        Sp = tl.zeros([ROWS], tl.float32)
        cnt = tl.zeros([ROWS], tl.float32)
        k1 = AK._no_key(ROWS, BLOCK_N)
        k2 = AK._no_key(ROWS, BLOCK_N)
        for nb in range(tl.cdiv(n, BLOCK_N)):
            offs = nb * BLOCK_N + cols
            u = tl.load(D + rows[:, None] * n + offs[None, :], mask=offs[None, :] < n, other=float("-inf")) - t[:, None]
            p, s = AK._powers(u, a, EXACT, False)
            S, Sp, cnt, k1, k2, _ = AK._support_add(S, Sp, cnt, k1, k2, p, s, u, EXACT)
        S, Sp, cnt, k1, k2 = AK._support_sums(S, Sp, cnt, k1, k2, EXACT)
        tn, done, last = AK._certified_step(t, S, Sp, cnt, k1, k2, it, last, 2 * 1.1920929e-07, max_iter, a, EXACT)
        t = tl.where(go, tn, t)
        passes = tl.where(go, passes + 1, passes)
        go = go & (done == 0)
        it += 1
    tl.store(T + rows, t)
    tl.store(P + rows, passes)


@pytest.mark.parametrize("alpha", [2.0, 1.5])
def test_certified_step_drops_the_smallest_scores(device, alpha):
    """The closed-form step certifies the support and ends a row's passes.  From a start ``t0`` below the
    threshold with ``r`` scores in ``(t0, t*]`` (they leave the support), one pass solves the row exactly
    for ``r`` = 0 and 1 (the candidates that drop the support's ``r`` smallest scores); with ``r`` = 2 and 3
    the pass takes a Newton step and a later one certifies.  Against float64 bisection: the threshold to
    float32 rounding and ``Σp = 1``."""
    a = alpha - 1
    exact = 1 if alpha == 2.0 else 2
    z = _rows(96)[::2]  # 16 rows of each kind r = 0..3 below
    z = torch.cat([z[i::4] for i in range(4)])
    d = a * (z - z.max(1, keepdim=True).values)
    want = _threshold(z, a).double()
    below = torch.where(d.double() <= want[:, None], d.double(), -math.inf).sort(1, descending=True).values
    r = torch.arange(4).repeat_interleave(z.shape[0] // 4)
    upper = torch.where(r == 0, want, below.gather(1, (r - 1).clamp(min=0)[:, None])[:, 0])
    t0 = ((upper + below.gather(1, r[:, None])[:, 0]) / 2).float()
    leaving = ((d > t0[:, None]) & (d.double() <= want[:, None])).sum(1)
    assert (leaving == r).all()
    t = torch.empty(d.shape[0], dtype=torch.float32, device=device)
    passes = torch.empty(d.shape[0], dtype=torch.int32, device=device)
    _solve[(1,)](d.float().to(device).contiguous(), t0.to(device), t, passes, d.shape[1], 100, EXACT=exact,
                 ROWS=d.shape[0], BLOCK_N=32)
    t, passes = t.cpu().double(), passes.cpu()
    assert (t - want).abs().max() <= 1e-6
    S = ((d.double() - t[:, None]).clamp(min=0) ** (1 / a)).sum(1)
    assert (S - 1).abs().max() <= 1e-5
    assert (passes[r <= 1] == 1).all() and (passes[r >= 2] >= 2).all(), passes


@pytest.mark.parametrize("alpha", [1.3, 1.7])
def test_a_predicted_last_step_is_checked_by_the_output_pass(device, alpha, monkeypatch):
    """The general power takes a row's last Newton step without a pass at its iterate when the residual is small
    (``AK.PREDICT_RESIDUAL``): the output pass evaluates the row there, and a second launch goes on with the rows
    that evaluation does not stop.  Whatever that residual (0: never; the default; 1: from the first pass, so that
    the second launch takes over nearly every row), the thresholds are those of a pass at every iterate, bit for
    bit, and so are the outputs.  The default saves passes on this input."""
    if device != "cpu":
        pytest.skip("the residual is a constexpr of the compiled kernels: changed here under the interpreter only")
    q, k, v = _random_qkv(192, 64, H=2)
    alpha_h = torch.full((2,), alpha)  # a per-head alpha: the general power (EXACT 0)
    scale = 1 / 8
    A = FA._kernel_a(q, alpha_h, alpha - 1)
    fast = FA._fast_log(alpha - 1, 0)
    marked = []  # per second launch, the rows the first one marked for it (the kernel's REDO argument)
    module = FA._module()

    class _Recording:
        def __getattr__(self, name):
            kernel = getattr(module, name)
            if name != "attention_fwd":
                return kernel

            class _Launch:
                def __getitem__(self, grid):
                    def launch(*args, **kw):
                        if kw.get("REPAIR"):
                            marked.append(int(args[13].sum()))
                        return kernel[grid](*args, **kw)
                    return launch
            return _Launch()

    monkeypatch.setattr(FA, "_module", lambda: _Recording())
    runs, default = {}, AK.PREDICT_RESIDUAL
    for residual in (0.0, None, 1.0):
        monkeypatch.setattr(AK, "PREDICT_RESIDUAL", default if residual is None else tl.constexpr(residual))
        marked.clear()
        o, _, rows, _, iters, _ = FA._forward(q, k, v, A, 0, None, True, scale, (64, 32, 4, 4), None, fast, 0)
        runs[residual] = o, rows[1].clone(), sum(marked), iters.clone()
        assert len(marked) == 1  # the second launch of the general power
    o0, t0, redo0, iters0 = runs[0.0]
    for residual in (None, 1.0):
        o, t, _, _ = runs[residual]
        assert torch.equal(t, t0), (residual, (t - t0).abs().max())
        assert torch.equal(o, o0), residual
    assert redo0 == 0 and runs[1.0][2] > 0.5 * t0.numel()  # the rows the second launch went on with
    assert int(runs[None][3].sum()) < int(iters0.sum()), (runs[None][3], iters0)


def test_a_row_at_its_rounding_floor_stops_a_pass_earlier(device, monkeypatch):
    """The general power stops a row whose residual is within ``AK.FLOOR_TOL`` tolerances and whose next step
    moves ``t`` by at most one unit of its last place: its float32 rounding floor, where the next evaluation
    would end the row on the residual's stagnation.  Against the forward without that test (``FLOOR_TOL`` 0):
    fewer passes, and every row still within ``FLOOR_TOL · 2 ε`` of ``Σp = 1``."""
    if device != "cpu":
        pytest.skip("the floor is a constexpr of the compiled kernels: changed here under the interpreter only")
    q, k, v = _random_qkv(256, 64, H=2, seed=5)
    alpha = torch.full((2,), 1.5)  # a tensor: the general power
    runs = {}
    for floor in (0.0, None):
        if floor is not None:
            monkeypatch.setattr(AK, "FLOOR_TOL", tl.constexpr(floor))
        else:
            monkeypatch.undo()
        runs[floor] = FA.forward_stats(q, k, v, is_causal=True, mapping="entmax", alpha=alpha, block_m=64, block_n=64)
    eps = torch.finfo(torch.float32).eps
    assert int(runs[None]["newton_passes"].sum()) < int(runs[0.0]["newton_passes"].sum())
    assert (runs[None]["psum"] - 1).abs().max() <= AK.FLOOR_TOL.value * 2 * eps
