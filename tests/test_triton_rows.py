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
from conftest import FUSED_COVERED, edge_rows, entmax15_sort, sparsemax_sort

import softargmax as sa
from softargmax.backends.cpu import rows as _cpu_rows
from softargmax.backends.triton import rows as _triton_rows
from softargmax.divergences import get_divergence
from softargmax.solvers.threshold import solve

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
    streamed kernel with so few candidate slots that rows fall back to full-row passes."""
    if request.param != "registers" and not ON_GPU:
        monkeypatch.setattr(_triton_rows, "BLOCK_ROWS_MAX", 32)
        monkeypatch.setattr(_triton_rows, "LONG_BLOCK", 16)
    if request.param == "streamed-overflow":
        monkeypatch.setattr(_triton_rows, "CAP", 4)
    return request.param


def row_length(k: int, layout: str) -> int:
    """``k``, capped at 100 for the streamed kernels in the interpreter: 100 entries are already
    7 chunks of 16 and 25 times the 4 scratch slots, and every interpreted chunk costs Python time."""
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


@pytest.mark.parametrize("case", COVERED, ids=_ids)
@pytest.mark.parametrize("k", LENGTHS)
def test_solution_matches_reference(case, k, layout, triton_device):
    name, params = case
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
        fd = torch.zeros_like(x)
        for i in range(2):
            for j in range(9):
                e = torch.zeros_like(x)
                e[i, j] = eps
                fd[i, j] = ((fn(x + e) - fn(x - e)) * v).sum() / (2 * eps)
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
    for name, params in [("alpha", {"alpha": 2.5}), ("alpha", {"alpha": 0.5}), ("reverse_kl", {}), ("kl", {})]:
        assert _triton_rows.solve(z, get_divergence(name, **params)) is None
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
row = {"P": "*fp32", "T": "*fp32", "SSUM": "*fp32", "STATUS": "*i8", "ZP": "*fp32", "OMEGA": "*fp32", "A": "*fp32"}
scal = {"k": "i32", "a_stride": "i32", "tol": "fp32", "max_iter": "i32", "omega_c": "fp32"}
jobs = []
for kind, exact in [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)]:
    for k in (64, 512, T.BLOCK_ROWS_MAX):
        rows, block, warps = T._tile(k)
        sig = {"Z": "*bf16", **row, "R": "i32", **scal, "KIND": "constexpr", "EXACT": "constexpr", "ROWS": "constexpr", "BLOCK": "constexpr"}
        jobs.append((K.solve_block_rows, sig, dict(KIND=kind, EXACT=exact, ROWS=rows, BLOCK=block), warps))
    sig = {"Z": "*fp32", **row, "SCRATCH": "*fp32", **scal, "KIND": "constexpr", "EXACT": "constexpr", "BLOCK": "constexpr", "CAP": "constexpr"}
    jobs.append((K.solve_long_rows, sig, dict(KIND=kind, EXACT=exact, BLOCK=T.LONG_BLOCK, CAP=T.CAP), 16))
    rows, block, warps = T._tile(512)
    sig = {"P": "*fp32", "V": "*fp32", "G": "*fp32", "A": "*fp32", "R": "i32", "k": "i32", "a_stride": "i32", "scale": "fp32", "KIND": "constexpr", "EXACT": "constexpr", "ROWS": "constexpr", "BLOCK": "constexpr"}
    jobs.append((K.jvp_block_rows, sig, dict(KIND=kind, EXACT=exact, ROWS=rows, BLOCK=block), warps))
    sig = {"P": "*fp32", "V": "*fp32", "G": "*fp32", "A": "*fp32", "k": "i32", "a_stride": "i32", "scale": "fp32", "KIND": "constexpr", "EXACT": "constexpr", "BLOCK": "constexpr"}
    jobs.append((K.jvp_long_rows, sig, dict(KIND=kind, EXACT=exact, BLOCK=T.LONG_BLOCK), 16))
for exact in (0, 1, 2):
    jobs.append((K.alpha_relu_forward, {"X": "*bf16", "Y": "*bf16", "n": "i64", "a": "fp32", "tau": "fp32", "EXACT": "constexpr", "BLOCK": "constexpr"}, dict(EXACT=exact, BLOCK=T.ELEMENTWISE_BLOCK), 4))
    jobs.append((K.alpha_relu_backward, {"X": "*bf16", "GY": "*bf16", "GX": "*bf16", "n": "i64", "a": "fp32", "tau": "fp32", "EXACT": "constexpr", "BLOCK": "constexpr"}, dict(EXACT=exact, BLOCK=T.ELEMENTWISE_BLOCK), 4))
done = []
for fn, sig, consts, warps in jobs:
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target, options={"num_warps": warps})
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
    assert len(done) == 5 * 6 + 6


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
