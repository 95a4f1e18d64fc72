"""The Triton kernels (softargmax.backends.triton.rows) against the PyTorch reference path.

Without a GPU (CI) the kernels run in Triton's interpreter on CPU tensors at small sizes
(``TRITON_INTERPRET=1``, set in conftest); the long-row kernels are reached by shrinking
the register-row limit, and the candidate-overflow fallback by shrinking the scratch.  On
a GPU the same tests run on CUDA tensors and add full-size rows.  The reference is the
PyTorch solver on the same device with every fused path switched off; it is itself
checked against sort-based and brute-force references in test_entmax and test_fdiv.
"""

import contextlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import FUSED_COVERED, INFINITE_F0_COVERED, edge_rows, entmax15_sort, sparsemax_sort

import softargmax as sa
from softargmax.backends.cpu import rows as _cpu_rows
from softargmax.backends.triton import rows as _triton_rows
from softargmax.divergences import get_divergence
from softargmax.solvers.threshold import solve

try:
    from softargmax.backends.triton import row_kernels as _row_kernels
except ImportError:  # no Triton: the tests that need it skip (the triton_device fixture)
    _row_kernels = None

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, in the interpreter

COVERED = FUSED_COVERED
ON_GPU = torch.cuda.is_available()
LENGTHS = [1, 2, 7, 64, 300] + ([5003, 40000, 262144] if ON_GPU else [])


def _ids(case):
    name, params = case
    return name + "".join(f"-{v}" for v in params.values())


@contextlib.contextmanager
def reference_path():
    """The PyTorch solver: every fused path off."""
    old_gpu, old_cpu = _triton_rows.set_enabled(False), _cpu_rows.set_enabled(False)
    try:
        yield
    finally:
        _triton_rows.set_enabled(old_gpu)
        _cpu_rows.set_enabled(old_cpu)


@pytest.fixture(params=["registers", "streamed", "streamed-overflow"])
def layout(request, monkeypatch):
    """Which kernel solves the rows: the register kernel, the streamed long-row kernel, or the
    streamed kernel with one register slot per lane, so that rows overflow and go on over the full row."""
    if request.param != "registers" and not ON_GPU:
        monkeypatch.setattr(_triton_rows, "BLOCK_ROWS_MAX", 32)
        monkeypatch.setattr(_triton_rows, "LONG_BLOCK", 16)
    if request.param == "streamed-overflow":
        monkeypatch.setattr(_triton_rows, "LONG_SLOTS", 1)
    return request.param


def row_length(k: int, layout: str) -> int:
    """``k``, capped at 100 for the streamed kernels in the interpreter: 100 entries are already
    7 chunks of 16 and more than the 64 register slots, and every interpreted chunk costs Python time."""
    return k if ON_GPU or layout == "registers" else min(k, 100)


EPS32 = torch.finfo(torch.float32).eps


def s_sum_error_bound(z: torch.Tensor, a: float, tau64: torch.Tensor, kappa: float = 4.0) -> torch.Tensor:
    r"""A bound ``[R, 1]`` on the error of ``Σ s`` computed by a float32 solver, for the power kind.

    With ``u_j = 1 + a (z_j - τ_f)`` (``a = α - 1``, ``τ_f`` exact), ``p_j = [u_j]_+^{1/a}`` and
    ``s_j = [u_j]_+^{(1-a)/a}``.  A float32 solver evaluates ``u_j`` with an absolute error
    ``δ_j <= κ ε (|a z_j| + a |τ_f| + 1)`` (rounding of the products and of the threshold,
    whichever of the two parametrizations it uses), so
    ``|ΔΣs| <= Σ_j max_{|d| <= δ_j} |s(u_j + d) - s(u_j)|``.  For ``α > 1.5`` the exponent
    ``(1-a)/a`` is below 1 and ``s`` has an unbounded slope at the edge of the support (a
    jump at α = 2: an entry within ``δ_j`` of the threshold may be in or out); rows with
    many entries there (long rows, ties, tiny scales) make ``Σ s`` ill-conditioned in float32
    whatever the summation: the PyTorch float32 path itself is off by up to 5e-4 relative at
    rows of 40000 and 262144 (α = 1.7, 2.0) against float64, within this bound.
    """
    z = z.double()
    u = 1 + a * (z - tau64)
    delta = kappa * EPS32 * ((a * z).abs() + a * tau64.abs() + 1)
    e = (1 - a) / a

    def s(v):
        pos = v > 0
        return torch.where(pos, torch.where(pos, v, torch.ones_like(v)) ** e, torch.zeros_like(v))

    s0 = s(u)
    dev = torch.maximum((s(u + delta) - s0).abs(), (s(u - delta) - s0).abs())
    return torch.where(torch.isfinite(z), dev, torch.zeros_like(dev)).sum(-1, keepdim=True)


def _assert_s_sum_close(fast, ref, z, div, ok, tol):
    """``Σ s`` of two float32 solvers: the usual tolerance, widened for the power kind by the
    conditioning bound of :func:`s_sum_error_bound` (twice: each solver may be off by it) plus
    the float32 summation error of the blocked sums (``(log2 k + k/4096 + 2) ε Σ s``)."""
    a = None
    if div.name == "chi_square":
        a = 1.0
    elif div.name == "alpha":
        a = float(div.alpha) - 1.0
    if a is None:
        torch.testing.assert_close(fast.s_sum[ok], ref.s_sum[ok], **tol)
        return
    with reference_path():
        exact = solve(z.double(), div)
    k = z.shape[1]
    bound = 2 * s_sum_error_bound(z, a, exact.tau) + (math.log2(k + 1) + k / 4096 + 2) * EPS32 * exact.s_sum.abs()
    allowed = torch.maximum(tol["atol"] + tol["rtol"] * ref.s_sum.double().abs(), bound)
    err = (fast.s_sum.double() - ref.s_sum.double()).abs()
    assert bool((err[ok] <= allowed[ok]).all()), (err[ok] / allowed[ok]).squeeze(1).tolist()


def _skip_overflow_of_one_slot_kinds(case, layout):
    """The kinds with f(0) = +inf keep one score per lane (rows.long_slots): for them the streamed layout with
    overflowing lanes is the streamed one, run already."""
    if layout == "streamed-overflow" and case in INFINITE_F0_COVERED:
        pytest.skip("one slot per lane: the streamed case")


@pytest.mark.parametrize("case", COVERED, ids=_ids)
@pytest.mark.parametrize("k", LENGTHS)
def test_solution_matches_reference(case, k, layout, triton_device):
    name, params = case
    _skip_overflow_of_one_slot_kinds(case, layout)
    div = get_divergence(name, **params)
    k = row_length(k, layout)
    z = edge_rows(k, torch.float32, torch.Generator().manual_seed(k), triton_device)
    fast = solve(z, div)
    assert fast.backend == "triton", "the Triton path was not taken"
    with reference_path():
        ref = solve(z, div)
    tol = dict(atol=3e-6, rtol=1e-4)
    torch.testing.assert_close(fast.dense_p(), ref.dense_p(), equal_nan=True, **tol)
    ok = torch.ones(9, dtype=torch.bool, device=z.device)
    ok[[2, 3, 4]] = False  # masked / bad rows: tau is a convention there, p is what counts
    torch.testing.assert_close(fast.tau[ok], ref.tau[ok], **tol)
    _assert_s_sum_close(fast, ref, z, div, ok, tol)
    assert fast.bad_rows.squeeze(1).tolist() == [False, False, False, True, True, False, False, False, False]
    assert torch.all(fast.p[2] == 0) and fast.s_sum[2, 0] == 0
    assert torch.isnan(fast.p[3]).all() and torch.isnan(fast.p[4]).all()
    good = fast.dense_p()[[0, 1, 5, 6, 7, 8]].double()
    torch.testing.assert_close(good.sum(-1), torch.ones(6, dtype=torch.float64, device=z.device), atol=3e-6, rtol=0)


@pytest.mark.parametrize("k", [3, 50, 300] + ([20000, 131072] if ON_GPU else []))
def test_sparsemax_and_entmax15_against_sort(k, layout, triton_device):
    k = row_length(k, layout)
    gen = torch.Generator().manual_seed(k)
    z = torch.randn(6, k, generator=gen) * 2
    for fn, ref in [(sa.sparsemax, sparsemax_sort), (sa.entmax15, entmax15_sort)]:
        expect = torch.from_numpy(np.stack([ref(row) for row in z.double().numpy()])).float()
        torch.testing.assert_close(fn(z.to(triton_device)).cpu(), expect, atol=2e-6, rtol=0)


OPERATORS = [
    ("sparsemax", lambda x, d: sa.sparsemax(x, dim=d)),
    ("entmax15", lambda x, d: sa.entmax15(x, dim=d)),
    ("entmax-1.3", lambda x, d: sa.entmax(x, 1.3, dim=d)),
    ("js-temp", lambda x, d: sa.f_softargmax(x, "jensen_shannon", temperature=0.7, dim=d)),
    ("hellinger", lambda x, d: sa.f_softargmax(x, "squared_hellinger", dim=d)),
]


def _value_and_grad(fn, x, v, dim):
    xx = x.clone().requires_grad_()
    p = fn(xx, dim)
    (p * v).sum().backward()
    return p.detach(), xx.grad


@pytest.mark.parametrize("name,fn", OPERATORS, ids=[o[0] for o in OPERATORS])
@pytest.mark.parametrize("k", [5, 70])
def test_values_and_gradients_match_reference(name, fn, k, layout, triton_device):
    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(3, k, 4, generator=gen) * 2).to(triton_device)  # rows along dim=1
    x[0, : k // 2, 1] = -math.inf  # partly masked row
    x[1, :, 2] = -math.inf  # all-masked row: zeros, zero gradient
    x[2, 1, 3] = math.nan  # NaN row: NaN in that row only
    v = torch.randn(3, k, 4, generator=gen).to(triton_device)
    p, g = _value_and_grad(fn, x, v, 1)
    with reference_path():
        p_ref, g_ref = _value_and_grad(fn, x, v, 1)
    torch.testing.assert_close(p, p_ref, atol=3e-6, rtol=1e-4, equal_nan=True)
    torch.testing.assert_close(g, g_ref, atol=3e-5, rtol=1e-4, equal_nan=True)
    assert torch.all(p[1, :, 2] == 0) and torch.all(g[1, :, 2] == 0)
    assert torch.isnan(g[2, :, 3]).all()
    finite = torch.ones(3, 4, dtype=torch.bool)
    finite[2, 3] = False
    assert not torch.isnan(g.permute(0, 2, 1)[finite]).any()


def test_gradient_matches_finite_differences(triton_device):
    """The JVP kernel, which recomputes s from p, against central differences of the forward."""
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 9, generator=gen) * 1.5).to(triton_device)
    v = torch.randn(2, 9, generator=gen).to(triton_device)
    for fn in (lambda t: sa.entmax(t, 1.3), lambda t: sa.f_softargmax(t, "jensen_shannon")):
        xx = x.clone().requires_grad_()
        (fn(xx) * v).sum().backward()
        eps = 1e-2
        # every perturbation at once: 18 copies of x, copy (i, j) moved by ±eps at [i, j] (the rows are independent)
        e = torch.eye(18, device=x.device).reshape(18, 2, 9) * eps
        diff = fn((x + e).reshape(36, 9)) - fn((x - e).reshape(36, 9))
        fd = (diff.reshape(18, 2, 9) * v).sum((1, 2)).reshape(2, 9) / (2 * eps)
        torch.testing.assert_close(xx.grad, fd, atol=2e-3, rtol=2e-2)


def test_per_row_alpha_values_and_gradients(layout, triton_device):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 3, 40, generator=gen) * 2).to(triton_device)
    x[0, 0, :5] = -math.inf
    alpha = (1.0 + torch.rand(4, 3, 1, generator=gen)).clamp(1.05, 2.0).to(triton_device)
    alpha[1, 2] = 2.0
    alpha[2, 1] = 1.5
    v = torch.randn(4, 3, 40, generator=gen).to(triton_device)
    results = []
    for ctx in (contextlib.nullcontext(), reference_path()):
        with ctx:
            xx, aa = x.clone().requires_grad_(), alpha.clone().requires_grad_()
            p = sa.entmax(xx, aa)
            (p * v).sum().backward()
            results.append((p.detach(), xx.grad, aa.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-3)


def test_per_row_alpha_partly_outside_the_kernels(triton_device):
    """One α per row with some α > 2: the rows are solved group by group, some groups by the kernels
    (which keep no Jacobian weights) and the others by the PyTorch solver, then combined."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(6, 9, generator=gen) * 2).to(triton_device)
    alpha = torch.tensor([1.5, 2.5, 1.5, 2.5, 2.0, 1.3]).unsqueeze(1).to(triton_device)
    v = torch.randn(6, 9, generator=gen).to(triton_device)
    results = []
    for ctx in (contextlib.nullcontext(), reference_path()):
        with ctx:
            xx, aa = x.clone().requires_grad_(), alpha.clone().requires_grad_()
            p = sa.entmax(xx, aa)
            (p * v).sum().backward()
            results.append((p.detach(), xx.grad, aa.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-3)


def far_power_rows(k: int, gen: torch.Generator) -> torch.Tensor:
    """Rows for the general power kind's evaluation: random, flat, half masked, one finite entry, a large offset
    (``z + 3e4``: ``z - m`` must be taken before the scale), a large and a tiny scale, and a near tie."""
    z = torch.randn(8, k, dtype=torch.float64, generator=gen) * 3
    z[1] = 0.75
    z[2, : k // 2] = -math.inf
    z[3] = -math.inf
    z[3, k // 2] = 2.0
    z[4] += 3e4
    z[5] *= 1e3
    z[6] *= 1e-3
    z[7, : max(1, k // 3)] = z[7].max() + 1e-6
    return z


@pytest.mark.parametrize("alpha", [1.25, 1.3, 1.8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_far_power_against_float64(alpha, dtype, layout, triton_device):
    """α >= 1.25 for every row takes the kernels' general power with one log2 per score (``EXACT_FAR``: ``p = s u``,
    the hardware log2 on a GPU, no ``t + 1`` variable): ``p`` and ``τ`` within float32 rounding of the PyTorch
    path in float64 on the same (rounded) scores, ``Σ p = 1``, masked entries 0, in every layout, from float32 and
    bfloat16 rows (``p`` written in bfloat16: its rounding)."""
    div = get_divergence("alpha", alpha=alpha)
    assert _triton_rows.operator_kind(div) == (_triton_rows.KIND_POWER, _triton_rows.EXACT_FAR)
    k = row_length(300, layout)
    z = far_power_rows(k, torch.Generator().manual_seed(int(alpha * 100))).to(dtype)
    fast = solve(z.to(triton_device), div)
    assert fast.backend == "triton", "the Triton path was not taken"
    with reference_path():
        exact = solve(z.double(), div)
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2.0 ** -9, rtol=2.0 ** -8)
    p = fast.dense_p().cpu().double()
    torch.testing.assert_close(p, exact.dense_p(), **tol)
    torch.testing.assert_close(fast.tau.cpu().double(), exact.tau, atol=1e-5, rtol=1e-6)
    if dtype == torch.float32:
        torch.testing.assert_close(p.sum(-1), torch.ones(8, dtype=torch.float64), atol=3e-6, rtol=0)
    assert bool((p[torch.isinf(z)] == 0).all())


def test_row_exact_constants():
    """The launcher's ``EXACT_FAR`` and ``NEAR_ONE`` are the kernels' (rows.py does not import Triton); α >= 1.25
    takes ``EXACT_FAR``, α near 1, 1.5 and 2 keep theirs; ``EXACT_FAR`` holds as many scores per thread as sparsemax
    (it does not spill at 16), ``EXACT = 0`` half as many."""
    if _row_kernels is None:
        pytest.skip("Triton is not installed")
    assert _triton_rows.EXACT_FAR == _row_kernels.EXACT_FAR.value
    assert _triton_rows.NEAR_ONE == _row_kernels.NEAR_ONE.value
    assert [_triton_rows.row_exact(a) for a in (1.0, 0.5, 0.3, 0.25, 0.2499, 0.05)] == [1, 2, 3, 3, 0, 0]
    power = _triton_rows.KIND_POWER
    assert [_triton_rows.heavy_kind(power, e) for e in (0, 1, 2, _triton_rows.EXACT_FAR)] == [True, False, False, False]


def test_operators_launch_the_exact_of_operator_kind(triton_device, monkeypatch):
    """The operators launch the ``(kind, exact)`` that :func:`rows.operator_kind` gives (the one choice): α = 1.3 for
    every row takes ``EXACT_FAR`` (the hardware log2), its loss too, Jensen–Shannon ``EXACT = 0``; one α per row
    (``solve_alpha_rows``) keeps ``EXACT = 0`` (the software log2 and the ``t + 1`` variable) even at α = 1.3."""
    launched = []
    run = _triton_rows._run

    def spy(z, kind, exact, *args, **kwargs):
        launched.append((kind, exact))
        return run(z, kind, exact, *args, **kwargs)

    monkeypatch.setattr(_triton_rows, "_run", spy)
    z = torch.randn(3, 40, generator=torch.Generator().manual_seed(5)).to(triton_device)
    far = (_triton_rows.KIND_POWER, _triton_rows.EXACT_FAR)
    div = get_divergence("alpha", alpha=1.3)
    assert _triton_rows.operator_kind(div) == far
    p = sa.entmax(z, 1.3)
    assert launched == [far]
    assert _triton_rows.solve(z, div).backend == "triton" and launched[-1] == far
    js = get_divergence("jensen_shannon")
    _triton_rows.solve(z, js, row_sums=False)
    assert launched[-1] == _triton_rows.operator_kind(js) == (_triton_rows.KIND_JS, 0)
    launched.clear()
    q = sa.entmax(z, torch.full((3, 1), 1.3, device=z.device))
    assert launched == [(_triton_rows.KIND_POWER, 0)]
    torch.testing.assert_close(q, p, atol=2e-6, rtol=1e-5)  # the same operator, by the two variants


INTERPRET_TRUE_SCRIPT = r"""
import json
import torch, triton, triton.language as tl
from softargmax.backends.triton import attention_kernels as A, row_kernels as K
from softargmax.backends.triton.interpreter import interpreting

@triton.jit
def logs(X, Y, Z, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n, other=1.0)
    tl.store(Y + i, K.fast_log2(x), mask=i < n)
    tl.store(Z + i, A._log2(x, True), mask=i < n)

x = torch.tensor([0.5, 2.0, 3.0, 1e-30])
y, z = torch.empty_like(x), torch.empty_like(x)
logs[(1,)](x, y, z, 4, BLOCK=4)
print(json.dumps([interpreting(), bool(K.HW_LOG2.value), y.tolist(), z.tolist()]))
"""


def test_interpreter_setting_read_as_triton_reads_it(monkeypatch):
    """``TRITON_INTERPRET=true`` (or ``on``, ``yes``) runs Triton's interpreter as ``1`` does: the kernel modules
    then leave out the inline PTX of ``fast_log2`` (the interpreter runs none: it raised), in the row kernels and
    in the attention's ``_log2`` alike, and the logarithms are ``tl.log2``'s; ``0`` is the GPU."""
    if _row_kernels is None:
        pytest.skip("Triton is not installed")
    from softargmax.backends.triton.interpreter import interpreting

    for value, expected in (("true", True), ("On", True), ("1", True), ("0", False), ("false", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert interpreting() is expected, value
    env = dict(os.environ, TRITON_INTERPRET="true")
    proc = subprocess.run([sys.executable, "-c", INTERPRET_TRUE_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    flag, hw, y, z = json.loads(proc.stdout.strip().splitlines()[-1])
    assert flag is True and hw is False
    expected = [-1.0, 1.0, math.log2(3.0), math.log2(1e-30)]
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    np.testing.assert_allclose(z, expected, rtol=1e-6)


def test_streamed_half_rows_move_16_bytes_per_thread(monkeypatch):
    """The streamed kernels give every thread ``BLOCK / (32 · warps)`` contiguous scores: 16 bytes for float32,
    float16 and bfloat16 alike (half as many warps for the 2-byte types, the same chunk), so that Triton emits
    ``ld.global.v4.b32`` (benchmarks/row_proxies.py reads it in the PTX), but in the heaviest solvers
    (``solver``: the one-program solve with the loss sums, the split rows' solve), which keep 8 warps (they spill on
    4 with Triton 3.9); a tuning run's warps win."""
    from softargmax.backends.triton.launch import RowLaunch, overridden

    for elem_bytes in (4, 2):
        block, warps = _triton_rows._long_launch(elem_bytes)
        assert block == _triton_rows.LONG_BLOCK and block // (32 * warps) * elem_bytes == 16
        assert _triton_rows._long_launch(elem_bytes, solver=True) == (block, _triton_rows.LONG_WARPS)
    assert _triton_rows.LONG_BLOCK // (32 * _triton_rows.LONG_WARPS) * 4 == 16  # split_solve's float32 candidates
    with overridden(rows=RowLaunch(long_warps=8)):
        assert _triton_rows._long_launch(2)[1] == 8
    with overridden(rows=RowLaunch(long_warps=2)):
        assert _triton_rows._long_launch(2, solver=True)[1] == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype, triton_device):
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 50, generator=gen) * 2).to(triton_device, dtype)
    v = torch.randn(4, 50, generator=gen).to(triton_device, dtype)
    for name, fn in OPERATORS:
        p, g = _value_and_grad(fn, x, v, -1)
        with reference_path():
            p_ref, g_ref = _value_and_grad(fn, x, v, -1)
        assert p.dtype == dtype and g.dtype == dtype
        torch.testing.assert_close(p, p_ref, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(g, g_ref, atol=1e-2, rtol=1e-2)
    # the kernels also read and write half rows directly, accumulating in float32
    z = x.contiguous()
    fast = _triton_rows.solve(z, get_divergence("alpha", alpha=1.5))
    with reference_path():
        ref = solve(z.float(), get_divergence("alpha", alpha=1.5))
    assert fast.p.dtype == dtype
    torch.testing.assert_close(fast.p.float(), ref.dense_p(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("alpha", [1.3, 1.5, 1.8, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alpha_relu_matches_reference(alpha, dtype, triton_device):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(5, 33, generator=gen) * 2).to(triton_device, dtype)
    x[0, :4] = -math.inf
    x[1, 3] = math.nan
    v = torch.randn(5, 33, generator=gen).to(triton_device, dtype)
    fn = lambda t, d: sa.alpha_relu(t, alpha=alpha, tau=0.3)  # noqa: E731
    p, g = _value_and_grad(fn, x, v, -1)
    with reference_path():
        p_ref, g_ref = _value_and_grad(fn, x, v, -1)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(p, p_ref, equal_nan=True, **tol)
    torch.testing.assert_close(g, g_ref, equal_nan=True, **tol)
    assert torch.all(p[0, :4] == 0) and torch.all(g[0, :4] == 0)


LOSSES = [
    ("sparsemax", lambda x, y, **kw: sa.sparsemax_loss(x, y, **kw)),
    ("entmax15", lambda x, y, **kw: sa.entmax15_loss(x, y, **kw)),
    ("entmax-1.3", lambda x, y, **kw: sa.entmax_loss(x, y, alpha=1.3, **kw)),
    ("js", lambda x, y, **kw: sa.f_divergence_loss(x, y, "jensen_shannon", **kw)),
    ("hellinger", lambda x, y, **kw: sa.f_divergence_loss(x, y, "squared_hellinger", **kw)),
]


@pytest.mark.parametrize("name,loss_fn", LOSSES, ids=[o[0] for o in LOSSES])
def test_losses_match_reference(name, loss_fn, triton_device):
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(6, 40, generator=gen) * 2).to(triton_device)
    x[0, 5:9] = -math.inf
    idx = torch.randint(0, 40, (6,), generator=gen).to(triton_device)
    idx[0] = 0
    idx[3] = -100
    soft = torch.softmax(torch.randn(6, 40, generator=gen), -1).to(triton_device)
    soft[0, 5:9] = 0
    soft = soft / soft.sum(-1, keepdim=True)
    for target, kw in [(idx, dict(ignore_index=-100, label_smoothing=0.1)), (soft, {})]:
        out = []
        for ctx in (contextlib.nullcontext(), reference_path()):
            with ctx:
                xx = x.clone().requires_grad_()
                loss = loss_fn(xx, target, reduction="sum", **kw)
                loss.backward()
                out.append((loss.detach(), xx.grad))
        torch.testing.assert_close(out[0][0], out[1][0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out[0][1], out[1][1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,loss_fn", LOSSES[:4], ids=[o[0] for o in LOSSES[:4]])  # (hellinger: js's kind)
def test_loss_gradient_written_by_the_solver(name, loss_fn, dtype, layout, triton_device, monkeypatch):
    """Class indices, no prediction: the row solver writes ``G = p - y`` itself (no epilogue kernel), with
    the values and gradients of the two-kernel path (solver, then ``G`` from ``p``: the same in float32,
    within one bfloat16 rounding, as ``p`` is no longer rounded before ``y`` is subtracted) and of the
    PyTorch path; masked entries (one the target's), an all-masked row, NaN and +inf rows (kept: NaN,
    ignored: 0) and an ignored row."""
    from softargmax.backends.triton import losses as _triton_losses

    gen = torch.Generator().manual_seed(17)
    R, k = 8, row_length(40, layout)
    x = torch.randn(R, k, generator=gen) * 2
    x[0, 5:9] = -math.inf
    x[1] = -math.inf
    x[2, 3], x[3, 4], x[6, 1] = math.nan, math.inf, math.nan
    x = x.to(dtype)
    idx = torch.randint(0, k, (R,), generator=gen)
    idx[0], idx[5], idx[6] = 6, -100, -100  # 6: a masked entry (loss +inf); 6: an ignored NaN row
    weights = torch.arange(1.0, R + 1)
    calls = {"solver": 0, "epilogue": 0}

    def counted(module, attr, key):
        real = getattr(module, attr)

        def call(*args, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(module, attr, call)

    counted(_triton_rows, "solve_gradient", "solver")
    counted(_triton_losses, "gradient", "epilogue")

    def run(device):
        xx = x.to(device).clone().requires_grad_()  # (a new leaf each time: x.to("cpu") is x itself)
        loss = loss_fn(xx, idx.to(device), reduction="none")
        (loss.float() * weights.to(device)).sum().backward()
        return loss.detach().float().cpu(), xx.grad.float().cpu()

    fused = run(triton_device)
    assert calls == {"solver": 1, "epilogue": 0}
    with monkeypatch.context() as m:
        m.setattr(_triton_rows, "solve_gradient", lambda *args: None)
        two_kernels = run(triton_device)
    assert calls["epilogue"] == 1
    with reference_path():
        ref = run("cpu")
    assert torch.isinf(fused[0][0]) and torch.isnan(fused[0][[2, 3]]).all() and (fused[0][[5, 6]] == 0).all()
    assert torch.isnan(fused[1][[2, 3]]).all() and (fused[1][[5, 6]] == 0).all()
    exact = dict(rtol=0.0, atol=0.0) if dtype == torch.float32 else dict(rtol=2.0 ** -7, atol=2.0 ** -8 * R)
    torch.testing.assert_close(fused[0], two_kernels[0], equal_nan=True, rtol=0.0, atol=0.0)
    torch.testing.assert_close(fused[1], two_kernels[1], equal_nan=True, **exact)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2 * R, rtol=2e-2)
    with reference_path():  # the PyTorch path on the rows as the kernels read them
        torch.testing.assert_close(fused[0], ref[0], equal_nan=True, **tol)
        torch.testing.assert_close(fused[1], ref[1], equal_nan=True, **tol)


def test_fused_linear_loss_matches_reference(triton_device):
    gen = torch.Generator().manual_seed(13)
    h = torch.randn(12, 16, generator=gen).to(triton_device)
    w = (torch.randn(50, 16, generator=gen) * 0.3).to(triton_device)
    y = torch.randint(0, 50, (12,), generator=gen).to(triton_device)
    out = []
    for ctx in (contextlib.nullcontext(), reference_path()):
        with ctx:
            hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
            loss = sa.linear_fenchel_young_loss(hh, ww, y, mapping="entmax15", chunk_size=5)
            loss.backward()
            out.append((loss.detach(), hh.grad, ww.grad))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_uncovered_inputs_fall_back(triton_device):
    z = torch.randn(4, 30, device=triton_device)
    for name, params in [("alpha", {"alpha": 2.5}), ("alpha", {"alpha": 0.5}), ("kl", {})]:
        assert _triton_rows.solve(z, get_divergence(name, **params)) is None
    assert _triton_rows.solve(z.double(), get_divergence("reverse_kl")) is None  # a covered kind, in float64
    assert _triton_rows.solve(z.double(), get_divergence("chi_square")) is None  # float64: the reference path
    assert _triton_rows.solve(z.t(), get_divergence("chi_square")) is None  # not contiguous
    assert _triton_rows.solve_alpha_rows(z, torch.tensor([[1.5], [2.5], [1.5], [1.5]], device=triton_device)) is None
    assert _triton_rows.alpha_relu_forward(z, 3.5, 0.0) is None  # 1/(α-1) < 1: the PyTorch path
    # the public operators still answer, with q too (never on the kernels)
    q = torch.rand(30, device=triton_device) + 0.5
    p = sa.f_softargmax(z.double(), "jensen_shannon", q=q.double())
    torch.testing.assert_close(p.sum(-1), torch.ones(4, dtype=torch.float64, device=triton_device))


def test_switch_off_takes_reference_path(triton_device):
    z = torch.randn(3, 20, device=triton_device)
    old = _triton_rows.set_enabled(False)
    try:
        sol = solve(z, get_divergence("alpha", alpha=1.5))
    finally:
        _triton_rows.set_enabled(old)
    assert sol.backend != "triton"


COMPILE_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from softargmax.backends.triton import row_kernels as K
from softargmax.backends.triton import rows as T

target = GPUTarget("cuda", 90, 32)
out = {"P": "*{dt}", "AUX": "*fp32", "BAD": "*i1", "SUMS_OUT": "*fp32", "ALPHA": "*fp32", "R": "i32", "k": "i32"}
scal = {"a_value": "fp32", "tau_c": "fp32", "tol": "fp32", "max_iter": "i32", "omega_c": "fp32", "omega_scale": "fp32",
        "IDX": "*i64", "KEEP": "*u8"}
flags = {"KIND": "constexpr", "EXACT": "constexpr", "PER_ROW": "constexpr", "SUMS": "constexpr", "GRAD": "constexpr"}
aligned = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (7,): [["tt.divisibility", 16]]}
jobs = []
jvp_sig = {"P": "*{dt}", "V": "*{dt}", "G": "*{dt}", "ALPHA": "*fp32"}
jvp_scal = {"a_value": "fp32", "scale": "fp32", "KIND": "constexpr", "EXACT": "constexpr", "PER_ROW": "constexpr"}
tile = {"ROWS": "constexpr", "CH": "constexpr", "LINE": "constexpr", "SPLIT": "constexpr"}
for kind, exact in [(0, 0), (0, 1), (0, 2), (0, T.EXACT_FAR), (1, 0), (2, 0), (4, 0)]:  # (Jeffrey: f(0) = +inf)
    # one warp per row (512), rows split over warps (the longest register rows of the kind), the streamed kernels;
    # bfloat16 and float32, with the tiles and warps the dispatcher (rows._run, rows._jvp) launches
    for dt, size, k in (("bf16", 2, 512), ("fp32", 4, T.register_limit(kind, exact))):
        rows, ch, line, warps, split = T._tile(k, size, T.heavy_kind(kind, exact))
        o = {n: v.format(dt=dt) for n, v in out.items()}
        sig = {"Z": f"*{dt}", **o, **scal, **flags, **tile}
        c = dict(KIND=kind, EXACT=exact, PER_ROW=False, SUMS=k == 512, GRAD=k == 512, ROWS=rows, CH=ch, LINE=line, SPLIT=split)
        jobs.append((K.solve_block_rows, sig, c, warps))
        if k == 512:  # (the backward's tile is the same for every kind)
            rows, ch, line, warps, split = T._tile(k, size)
            sig = {**{n: v.format(dt=dt) for n, v in jvp_sig.items()}, "R": "i32", "k": "i32", **jvp_scal, **tile}
            jobs.append((K.jvp_block_rows, sig, dict(KIND=kind, EXACT=exact, PER_ROW=False, ROWS=rows, CH=ch, LINE=line, SPLIT=split), warps))
    o = {n: v.format(dt="bf16") for n, v in out.items()}
    sig = {"Z": "*bf16", **o, **scal, **flags, "BLOCK": "constexpr", "SLOTS": "constexpr"}
    block, warps = T._long_launch(2, solver=True)  # (with the sums)
    jobs.append((K.solve_long_rows, sig, dict(KIND=kind, EXACT=exact, PER_ROW=kind == 0 and exact == 0, SUMS=True, GRAD=kind != 0 or exact != 0, BLOCK=block, SLOTS=T.long_slots(kind)), warps))
    sig = {**{n: v.format(dt="bf16") for n, v in jvp_sig.items()}, "k": "i32", **jvp_scal, "BLOCK": "constexpr"}
    block, warps = T._long_launch(2)
    jobs.append((K.jvp_long_rows, sig, dict(KIND=kind, EXACT=exact, PER_ROW=False, BLOCK=block), warps))
for exact in (0, 1, 2):
    jobs.append((K.alpha_relu_forward, {"X": "*bf16", "Y": "*bf16", "n": "i64", "a": "fp32", "tau": "fp32", "EXACT": "constexpr", "BLOCK": "constexpr"}, dict(EXACT=exact, BLOCK=T.ELEMENTWISE_BLOCK), 4))
    jobs.append((K.alpha_relu_backward, {"X": "*bf16", "GY": "*bf16", "GX": "*bf16", "n": "i64", "a": "fp32", "tau": "fp32", "EXACT": "constexpr", "BLOCK": "constexpr"}, dict(EXACT=exact, BLOCK=T.ELEMENTWISE_BLOCK), 4))
done = []
for fn, sig, consts, warps in jobs:
    attrs = aligned if fn in (K.solve_block_rows, K.solve_long_rows) else {}
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=target, options={"num_warps": warps})
    assert c.asm.get("cubin"), fn.__name__
    done.append(fn.__name__)
print(json.dumps(done))
"""


def test_kernels_compile_for_sm90():
    """Every kernel variant the dispatcher launches compiles to an sm_90 (H100/H200) binary:
    the interpreter does not check types or layouts the way the compiler does."""
    if not _triton_rows.available():
        pytest.skip("Triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(done) == 7 * 5 + 6


@pytest.mark.parametrize("k", [300, 40000])
@pytest.mark.parametrize("alpha", [1.5, 1.7, 2.0])
def test_s_sum_bound_covers_the_float32_reference(k, alpha):
    """The bound used for ``Σ s`` holds for the PyTorch float32 solver against float64 (the case
    that fails a plain 1e-4 tolerance at long rows), yet stays tight on well-conditioned rows."""
    div = get_divergence("alpha", alpha=alpha)
    z = edge_rows(k, torch.float32, torch.Generator().manual_seed(k))
    with reference_path():
        s32, s64 = solve(z, div), solve(z.double(), div)
    ok = [0, 1, 5, 6, 7, 8]
    bound = s_sum_error_bound(z, alpha - 1, s64.tau)[ok] + (math.log2(k + 1) + 2) * EPS32 * s64.s_sum[ok]
    err = (s32.s_sum.double() - s64.s_sum).abs()[ok]
    assert bool((err <= bound).all())
    assert float((bound / s64.s_sum[ok])[0]) < 1e-4  # a random row: the bound is not vacuous


EXACTNESS = [("chi_square", {}), ("alpha", {"alpha": 1.5}), ("alpha", {"alpha": 1.3}), ("alpha", {"alpha": 1.01}),
             ("alpha", {"alpha": 1.99}), ("jensen_shannon", {}), ("squared_hellinger", {})]


def _hard_rows(k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Random rows with masked entries, ties at the maximum, a large offset and a fully masked row."""
    gen = torch.Generator().manual_seed(k + 17)
    z = torch.randn(6, k, generator=gen) * 2
    z[0, ::3] = -math.inf
    z[1, : max(1, k // 4)] = z[1].max()  # ties at the maximum
    z[2] += 1000.0  # a large offset: the answer depends on z - max z only
    z[3] = -math.inf
    z[4, k // 2] = 8.0  # one clear winner
    return z.to(device, dtype)


@pytest.mark.parametrize("case", EXACTNESS, ids=_ids)
@pytest.mark.parametrize("k", [5, 300, 700])
def test_float32_within_1e6_of_float64(case, k, layout, triton_device):
    """The float32 kernels against the float64 PyTorch solver on the same (float32) scores: every
    layout (one warp per row, rows split over warps at 700, streamed, streamed with overflowing
    lanes) within 1e-6, α near 1 and near 2 included."""
    name, params = case
    div = get_divergence(name, **params)
    k = row_length(k, layout)
    z = _hard_rows(k, torch.float32, triton_device)
    fast = solve(z, div)
    assert fast.backend == "triton"
    with reference_path():
        ref = solve(z.double(), div)
    torch.testing.assert_close(fast.dense_p().double(), ref.dense_p(), atol=1e-6, rtol=0)
    assert torch.all(fast.dense_p()[3] == 0) and not fast.bad_rows.any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", EXACTNESS[:3] + EXACTNESS[5:] + INFINITE_F0_COVERED, ids=_ids)
def test_half_outputs_within_their_rounding(case, dtype, layout, triton_device):
    """Half rows read and written as they are: ``p`` is the float64 answer on the same scores
    rounded once (half an ulp, plus float32's error), and NaN rows stay NaN."""
    name, params = case
    _skip_overflow_of_one_slot_kinds(case, layout)
    div = get_divergence(name, **params)
    k = row_length(300, layout)
    z = _hard_rows(k, dtype, triton_device)
    z[5, 1] = math.nan
    fast = solve(z, div)
    assert fast.backend == "triton" and fast.p.dtype == dtype
    with reference_path():
        ref = solve(z.double(), div).dense_p()
    p = fast.dense_p().double()
    ok = [0, 1, 2, 3, 4]
    # half an ulp (round to nearest even, as the GPU converts); Triton's interpreter truncates float32 to
    # bfloat16 instead, so there a whole ulp
    ulp = torch.finfo(dtype).eps * (1.0 if dtype == torch.bfloat16 and not ON_GPU else 0.5)
    torch.testing.assert_close(p[ok], ref[ok], atol=1e-6, rtol=ulp * 1.01 + 1e-6)
    assert torch.isnan(p[5]).all() and fast.bad_rows.squeeze(1).tolist() == [False] * 5 + [True]


def _top_in_one_lane(k: int, lanes: int, tops: int, device) -> torch.Tensor:
    """A row whose ``tops`` largest scores (equal) all fall in lane 5 of ``lanes`` (columns ``≡ 5`` modulo
    ``lanes``), far above the rest: with ``tops`` one more than a lane keeps, the score it drops carries
    ``p = 1/tops``, which the first pass's power sums of Jensen–Shannon leave partly out."""
    z = torch.randn(k, generator=torch.Generator().manual_seed(tops)) * 0.3 - 30.0
    z[5::lanes][:tops] = 0.0
    return z.to(device)


@pytest.mark.parametrize("case", [("jensen_shannon", {}), ("squared_hellinger", {})], ids=_ids)
@pytest.mark.parametrize("layout", ["streamed", "streamed-overflow"], indirect=True)
def test_dense_streamed_rows_from_the_first_pass_statistics(case, layout, triton_device):
    """Jensen–Shannon solves a streamed row from its first pass (the kept scores and the power sums of the rest)
    when what the sums leave out is below the tolerance, and goes on over the full row where it is not (a lane
    that dropped a score with ``p`` of 1/5, or 1/2 with one slot per lane); squared Hellinger starts its
    full-row steps from the kept scores and a Taylor estimate of the rest.  Against the float64 solver: ``p``
    within 1e-6, ``τ``, and ``Σ p`` within 1e-6 of 1 (taking the registers' root on the last row leaves it
    4e-6 off with 4 slots, 7e-4 with one)."""
    name, params = case
    div = get_divergence(name, **params)
    k = row_length(100, layout)
    gen = torch.Generator().manual_seed(11)
    z = torch.randn(5, k, generator=gen)
    z[0] *= 3.0
    z[1] *= 0.3  # nearly flat: every score counts
    z[2] = z[2] * 2.0 + 1000.0
    z[3, ::3] = -math.inf
    z[4] = _top_in_one_lane(k, _triton_rows.LONG_BLOCK, _triton_rows.LONG_SLOTS + 1, "cpu")
    z = z.to(triton_device)
    fast = solve(z, div)
    assert fast.backend == "triton"
    with reference_path():
        ref = solve(z.double(), div)
    p = fast.dense_p().double()
    torch.testing.assert_close(p, ref.dense_p(), atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.tau.double(), ref.tau, atol=1e-5, rtol=2e-6)
    torch.testing.assert_close(fast.s_sum.double(), ref.s_sum, atol=1e-6, rtol=1e-5)
    assert float((p.sum(-1) - 1).abs().max()) <= 1e-6


@pytest.mark.parametrize("layout", ["streamed"], indirect=True)
def test_jensen_shannon_power_sums_on_rising_rows(layout, triton_device):
    """A row that rises steadily (a running maximum that grows at every chunk of each lane) rescales the first
    pass's power sums at every chunk if they follow the maximum: each rescale rounds, and 250 chunks per lane
    (4000 entries in lanes of 16, as 262,144 entries in lanes of 1024 on a GPU) put ``Σ p`` 6e-6 off after the
    registers' root was taken from them.  Rescaled only past ``REST_RESCALE``, it stays at float32's rounding
    (``Σ p`` within 1e-6 of 1, ``p`` against the float64 solver)."""
    div = get_divergence("jensen_shannon")
    k = 4000 if not ON_GPU else 262_144
    z = torch.stack([torch.linspace(-1.0, 0.0, k), torch.linspace(-3.0, 0.0, k)]).to(triton_device)
    fast = solve(z, div)
    assert fast.backend == "triton"
    with reference_path():
        ref = solve(z.double(), div)
    p = fast.dense_p().double()
    torch.testing.assert_close(p, ref.dense_p(), atol=1e-9, rtol=1e-5)
    assert float((p.sum(-1) - 1).abs().max()) <= 1e-6


#: the dense kinds with f(0) = +inf: reverse KL, Jeffrey (Lambert W), reverse chi-square
INFINITE_F0 = INFINITE_F0_COVERED


def _infinite_f0_rows(k: int, device) -> torch.Tensor:
    """:func:`conftest.edge_rows` (random, partly masked, all-masked, NaN, ``+inf``, flat, tied, extreme and tiny
    scales) and three more: a large offset, one finite entry, a row of scale 30 (Jeffrey's W of ``e^L`` with ``L``
    in the hundreds)."""
    gen = torch.Generator().manual_seed(k + 3)
    z = edge_rows(k, torch.float32, gen)
    more = torch.randn(3, k, generator=gen)
    more[0] = more[0] * 2 + 1000.0
    more[1] = -math.inf
    more[1, k // 2] = -7.0
    more[2] *= 30.0
    return torch.cat([z, more]).to(device)


@pytest.mark.parametrize("case", INFINITE_F0, ids=_ids)
def test_infinite_f0_kinds_within_float32_of_float64(case, layout, triton_device):
    """Reverse KL, Jeffrey and reverse χ² in the kernels (registers, streamed):
    ``p``, ``τ`` and ``Σ s`` against the float64 PyTorch solver on the same float32 scores, the edge rows'
    conventions (zeros, NaN and the bad rows; the uniform row, the one-hot of a single finite entry)."""
    if layout == "streamed-overflow":
        pytest.skip("these kinds keep one score per lane (rows.long_slots): the streamed case is this one")
    name, params = case
    div = get_divergence(name, **params)
    k = row_length(70, layout)
    z = _infinite_f0_rows(k, triton_device)
    fast = solve(z, div)
    assert fast.backend == "triton", "the Triton path was not taken"
    with reference_path():
        ref = solve(z.double(), div)
    ok = [0, 1, 5, 6, 7, 8, 9, 10, 11]
    p = fast.dense_p().double()
    torch.testing.assert_close(p[ok], ref.dense_p()[ok], atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.tau.double()[ok], ref.tau[ok], atol=1e-5, rtol=2e-6)
    torch.testing.assert_close(fast.s_sum.double()[ok], ref.s_sum[ok], atol=1e-6, rtol=1e-5)
    assert fast.bad_rows.squeeze(1).tolist() == [i in (3, 4) for i in range(12)]
    assert torch.all(p[2] == 0) and float(fast.s_sum[2, 0]) == 0
    assert torch.isnan(p[3]).all() and torch.isnan(p[4]).all()
    torch.testing.assert_close(p[5], torch.full((k,), 1.0 / k, dtype=torch.float64, device=p.device), atol=0, rtol=1e-6)
    assert float(p[10, k // 2]) == 1.0 and float(p[10].sum()) == 1.0
    torch.testing.assert_close(p[ok].sum(-1), torch.ones(len(ok), dtype=torch.float64, device=p.device), atol=2e-6,
                               rtol=0)


@pytest.mark.parametrize("layout", ["registers", "streamed"], indirect=True)
def test_infinite_f0_kinds_values_gradients_and_losses(layout, triton_device):
    """The three kinds' operators (the JVP kernels recompute ``s`` from ``p``: ``p²``, ``p²/(1 + p)``, ``p³``)
    and Fenchel–Young losses (probability targets: ``⟨z, p⟩`` from the kernel's row sums) against the PyTorch
    path: values and gradients, a partly masked and an all-masked row (zeros), a NaN row (NaN in that row)."""
    gen = torch.Generator().manual_seed(8)
    k = row_length(40, layout)
    x = (torch.randn(4, k, generator=gen) * 2).to(triton_device)
    x[0, : k // 2] = -math.inf
    x[1] = -math.inf
    x[2, 3] = math.nan
    v = torch.randn(4, k, generator=gen).to(triton_device)
    y = torch.softmax(torch.randn(2, k, generator=gen), -1).to(triton_device)
    for name, _ in INFINITE_F0:
        p, g = _value_and_grad(lambda t, d: sa.f_softargmax(t, name, dim=d), x, v, -1)
        with reference_path():
            p_ref, g_ref = _value_and_grad(lambda t, d: sa.f_softargmax(t, name, dim=d), x, v, -1)
        torch.testing.assert_close(p, p_ref, atol=2e-6, rtol=1e-5, equal_nan=True)
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4, equal_nan=True)
        assert torch.all(p[1] == 0) and torch.all(g[1] == 0) and torch.isnan(g[2]).all()
        assert torch.all(g[0, : k // 2] == 0) and not torch.isnan(g[[0, 3]]).any()
        out = []
        for ctx in (contextlib.nullcontext(), reference_path()):
            with ctx:
                xx = x[[3, 0]].clone().requires_grad_()
                yy = torch.where(xx.detach() > -math.inf, y, torch.zeros_like(y))
                loss = sa.f_divergence_loss(xx, yy / yy.sum(-1, keepdim=True), name, reduction="sum")
                loss.backward()
                out.append((loss.detach(), xx.grad))
        torch.testing.assert_close(out[0][0], out[1][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[0][1], out[1][1], atol=1e-6, rtol=1e-5)


def test_infinite_f0_losses_of_half_rows_against_float64(triton_device):
    """bfloat16 scores with probability targets: the loss value of reverse KL, Jeffrey and reverse χ² (which sums
    ``f(p)`` outside the kernel) within 0.5% of float64's (from ``p`` rounded to bfloat16 it was 3.7% off)."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 4000, generator=gen) * 2
    y = torch.softmax(torch.randn(2, 4000, generator=gen), -1)
    for name, _ in INFINITE_F0:
        got = sa.f_divergence_loss(x.bfloat16().to(triton_device), y.to(triton_device), name, reduction="none")
        with reference_path():
            ref = sa.f_divergence_loss(x.bfloat16().double(), y.double(), name, reduction="none")
        assert float(((got.double().cpu() - ref) / ref).abs().max()) <= 5e-3, name


def test_lambert_w_of_exp_to_float32_rounding(triton_device):
    """Jeffrey's ``W(e^L)`` (one Fritsch step from a Taylor or asymptotic start, no branch) against a float64
    Newton iteration on ``w + log w = L`` run to convergence, over ``L`` from 1 to ``1e30`` (around the start's
    switch at 4 too) and ``+∞``: within float32's epsilon relative (from the asymptotic start alone, one
    step is 2.8e-7 off)."""
    import triton
    import triton.language as tl

    @triton.jit
    def w_kernel(L_ptr, W_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        L = tl.load(L_ptr + offs, mask=offs < n, other=1.0)
        tl.store(W_ptr + offs, _row_kernels._lambert_w_exp(L), mask=offs < n)

    L64 = torch.cat([torch.tensor([1.0, 1.0 + 1e-6, 1.5, 2.0, 3.99, 4.0, 4.01, 7.0, 999.0, 1000.5]),
                     torch.logspace(0, 30, 200, dtype=torch.float64)]).float().double()
    w = L64.clone()  # Newton on w + log w = L from w = L (above the root): decreasing to it
    for _ in range(100):
        w = w - (w + torch.log(w) - L64) * w / (w + 1)
    L = torch.cat([L64.float(), torch.tensor([math.inf])]).to(triton_device)
    out = torch.empty_like(L)
    w_kernel[(1,)](L, out, L.numel(), BLOCK=256)
    out = out.cpu().double()
    assert float(((out[:-1] - w) / w).abs().max()) <= EPS32
    assert out[-1] == math.inf and float(out[0]) == 1.0


def test_row_sums_are_optional(triton_device):
    """The operators ask for no loss row sums (``zp``, ``omega`` stay ``None``, the rest is the
    same); asked for, they equal the sums computed from ``p`` (NaN in bad rows)."""
    z = edge_rows(40, torch.float32, torch.Generator().manual_seed(2), triton_device)
    for name, params in [("alpha", {"alpha": 1.5}), ("chi_square", {}), ("jensen_shannon", {})]:
        div = get_divergence(name, **params)
        with_sums = _triton_rows.solve(z, div)
        without = _triton_rows.solve(z, div, row_sums=False)
        assert without.zp is None and without.omega is None
        for a, b in [(with_sums.p, without.p), (with_sums.tau, without.tau), (with_sums.s_sum, without.s_sum),
                     (with_sums.bad_rows, without.bad_rows)]:
            torch.testing.assert_close(a, b, equal_nan=True, atol=0, rtol=0)
        ok = [0, 1, 2, 5, 6, 7, 8]
        inner = without.inner(z, use_row_sums=False)
        f_sum = without.f_sum(div, None, float(div.f(torch.zeros((), dtype=torch.float64))), torch.float32)
        torch.testing.assert_close(with_sums.zp[ok], inner[ok], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(with_sums.omega[ok], f_sum[ok], atol=1e-5, rtol=1e-5)
        assert torch.isnan(with_sums.zp[[3, 4]]).all() and torch.isnan(with_sums.omega[[3, 4]]).all()


class _Launches:
    """Counts the row kernels' launches and the other device work (aten operators that would be
    CUDA launches, host synchronizations) of a call."""

    def __init__(self, monkeypatch):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self
        self.launches, self.ops, self.inside = [], [], False
        kernels = _triton_rows._module()

        class Wrapped:
            def __init__(self, name):
                self.name = name

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    counter.launches.append(self.name)
                    counter.inside = True
                    try:
                        return getattr(kernels, self.name)[grid](*args, **kwargs)
                    finally:
                        counter.inside = False
                return launch

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: PLW3201
                if not counter.inside:
                    counter.ops.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        names = ["solve_block_rows", "solve_long_rows", "jvp_block_rows", "jvp_long_rows", "split_scan", "split_solve",
                 "split_write", "split_finish", "jvp_split_sums", "jvp_split_write"]
        monkeypatch.setattr(_triton_rows, "_module", lambda: type("K", (), {n: Wrapped(n) for n in names})())
        self.mode = Mode()

    def device_work(self):
        """The aten operators other than allocations and views."""
        free = {"empty", "empty_like", "empty_strided", "view", "reshape", "_unsafe_view", "slice", "select",
                "unsqueeze", "squeeze", "detach", "alias", "as_strided", "t", "expand", "lift_fresh"}
        return [o for o in self.ops if o not in free]


@pytest.mark.parametrize("k", [300, 100])
def test_one_launch_per_call_and_no_host_sync(k, layout, triton_device, monkeypatch):
    """The solve and its JVP are one kernel launch each, with no other device work (no conversion
    of α, no status tensor, no τ conversion) and no host synchronization."""
    k = row_length(k, layout)
    z = torch.randn(4, k, device=triton_device)
    v = torch.randn(4, k, device=triton_device)
    count = _Launches(monkeypatch)
    for div in (get_divergence("alpha", alpha=1.5), get_divergence("squared_hellinger")):
        count.launches.clear()
        count.ops.clear()
        with count.mode:
            sol = _triton_rows.solve(z, div, row_sums=False)
            sol.jvp(v)
        assert len(count.launches) == 2, count.launches
        assert count.device_work() == [], count.device_work()


# -- the dense kinds' streamed steps: the second-order step and the register start (interpreter only) --------------

def _dense_sums64(z, m, t, kind):
    """``(S, Σ s, Σ p'')`` of a float64 row at ``t`` (the kernels' parametrization, module docstring of row_kernels)."""
    if kind == 1:
        w = np.exp(z - m - t)
        p = w / (2 - w)
        s = p + p * p
        return p.sum(), s.sum(), ((1 + 2 * p) * s).sum()
    r = 1 / (1 + t + (m - z))
    p = r * r
    return p.sum(), (2 * p * r).sum(), (6 * p * p).sum()


def _dense_root64(z, m, kind):
    lo, hi = 0.0, 100.0  # S decreases in t; S(0) >= 1 (the maximum's entry alone is 1)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _dense_sums64(z, m, mid, kind)[0] > 1 else (lo, mid)
    return lo


try:  # kernels that run the row kernels' helpers alone (Triton's interpreter, at module level: jit reads globals)
    import triton
    import triton.language as tl

    from softargmax.backends.triton import row_kernels as K
except ImportError:  # without Triton the tests below are skipped
    triton = None

if triton is not None:
    @triton.jit
    def _second_order_kernel(IN, OUT, KIND: tl.constexpr):
        t = tl.load(IN)
        tl.store(OUT, K._second_order(t, tl.load(IN + 1), tl.load(IN + 2), tl.load(IN + 3), KIND))

    @triton.jit
    def _rest_kernel(Z, OUT, k, BLOCK: tl.constexpr, SLOTS: tl.constexpr, REST: tl.constexpr):
        c0, _c1, _c2, _c3, r1, r2, r3, r4, r5, r6 = K.scan_lanes(Z, 0, k, k, BLOCK, SLOTS, REST)
        m = tl.max(c0, 0)
        M1, M2, M3, M4, M5, M6 = K._rest_row(c0, r1, r2, r3, r4, r5, r6, m, REST)
        tl.store(OUT, M1)
        tl.store(OUT + 1, M2)
        tl.store(OUT + 2, M3)
        tl.store(OUT + 3, M4)
        tl.store(OUT + 4, M5)
        tl.store(OUT + 5, M6)


@pytest.fixture(scope="module")
def row_kernels():
    if ON_GPU or triton is None or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs kernel helpers in Triton's interpreter")
    return _second_order_kernel, _rest_kernel


@pytest.mark.parametrize("kind", [1, 2], ids=["jensen_shannon", "squared_hellinger"])
def test_second_order_step_leaves_an_error_of_the_residual_cube(kind, row_kernels):
    """From a point whose residual |S - 1| is at most DENSE_ACCEPT (where the streamed kernel takes the step
    unconfirmed), the kernels' Chebyshev step lands within about the residual's cube of the float64 root
    (a Newton step, or the correction's sign flipped, leaves one of its square: 1e3 times more here)."""
    second_order, _ = row_kernels
    z = np.random.default_rng(kind).standard_normal(3000) * 3
    m = z.max()
    root = _dense_root64(z, m, kind)
    for shift in (-3e-3, -1e-3, -2e-4):  # below the root, as the monotone iterates are
        t = root + shift
        S, Sp, Q = _dense_sums64(z, m, t, kind)
        resid = abs(S - 1)
        assert resid <= 4e-3  # (the kernels' DENSE_ACCEPT)
        out = torch.empty(1)
        second_order[(1,)](torch.tensor([t, S, Sp, Q], dtype=torch.float32), out, KIND=kind)
        after = abs(_dense_sums64(z, m, float(out), kind)[0] - 1)
        assert after <= 1e-2 * resid**3 + 4e-7, (shift, resid, after)  # + float32's rounding of t
        newton = t + (S * np.log(S) / Sp if kind == 1 else 2 * (S**1.5 - S) / Sp)
        assert abs(_dense_sums64(z, m, newton, kind)[0] - 1) > 10 * after or resid < 2e-3  # the order shows


@pytest.mark.parametrize("rest", [1, 2], ids=["jensen_shannon", "squared_hellinger"])
@pytest.mark.parametrize("slots", [1, 2, 4])
def test_rest_statistics_are_those_of_the_scores_not_kept(rest, slots, row_kernels):
    """The first pass's statistics of the scores no lane kept, relative to the row maximum ``m``, against a
    brute-force float64 sum over the same scores (masked entries and a lane with no finite score included):
    Jensen–Shannon's power sums ``Σ e^{n(z - m)}``, ``n = 1..6``; squared Hellinger's count, ``Σ (m - z)`` and
    ``Σ (m - z)²``."""
    _, rest_kernel = row_kernels
    BLOCK, k = 16, 150
    z = torch.randn(k, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2
    z[::7] = -math.inf
    z[5::BLOCK] = -math.inf  # lane 5 holds no finite score
    out = torch.empty(6)
    rest_kernel[(1,)](z.float(), out, k, BLOCK=BLOCK, SLOTS=slots, REST=rest)
    zz = torch.cat([z.float().double(), torch.full((-k % BLOCK,), -math.inf, dtype=torch.float64)]).view(-1, BLOCK)
    dropped = zz.sort(0, descending=True).values[slots:]
    dropped = dropped[torch.isfinite(dropped)]
    m = zz.max()
    if rest == 1:
        want = torch.stack([torch.exp(n * (dropped - m)).sum() for n in range(1, 7)])
        got = out.double()
    else:
        y = m - dropped
        want = torch.stack([torch.tensor(float(y.numel()), dtype=torch.float64), y.sum(), (y * y).sum()])
        got = out.double()[:3]
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-9)
    assert float(want[0]) > (0.01 if rest == 1 else 10.0)  # the rest is not negligible here
