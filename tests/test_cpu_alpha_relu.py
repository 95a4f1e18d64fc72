"""α-ReLU's C kernels on the CPU (softargmax.backends.cpu.rows.alpha_relu_forward / _backward).

Against the PyTorch path (the fused path switched off): bit for bit at α = 2 and 1.5 (the same
roundings; bfloat16 computed in float32 and rounded once, as there), within a rounding of the power
elsewhere; against float64 finite differences (gradcheck, x and a tensor τ); that the C path is taken
(a spy on its entries) where it covers the call, and not where it does not (τ per column, float16,
non-contiguous x).
"""

import math

import pytest
import torch

import softargmax as sa
from softargmax.backends.cpu import rows as _cpu_rows

pytestmark = pytest.mark.skipif(not _cpu_rows.available(), reason="no C compiler: the C kernels are not built")

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
EXACT = (1.5, 2.0)
ALPHAS = (1.5, 2.0, 3.0, 1.3, 1.7, 2.5, 5.0)
#: entries every row of the edge tensors holds somewhere: masks, overflow, NaN, signed zeros, the extremes
EDGES = [-math.inf, math.inf, math.nan, 0.0, -0.0, 1e30, -1e30, 1e-30, 3e38, 1e-40]


def _edge_x(rows, k, dtype, seed=0):
    x = torch.randn(rows, k, dtype=dtype, generator=torch.Generator().manual_seed(seed)) * 3
    x[0, : len(EDGES)] = torch.tensor(EDGES, dtype=dtype)
    x[1] = -math.inf  # a fully masked row
    return x


def _tau(kind, rows, dtype):
    return {"float": 0.3, "zero": 0.0, "scalar": torch.tensor(-0.2, dtype=dtype),
            "row": torch.linspace(-0.5, 0.7, rows, dtype=dtype).reshape(rows, 1)}[kind]


def _run(x, alpha, tau, w, fused):
    """p, dL/dx and (a tensor τ) dL/dτ of L = Σ p w, on the C path or the PyTorch path."""
    old = _cpu_rows.set_enabled(fused)
    try:
        xx = x.detach().requires_grad_(True)
        tt = tau.detach().requires_grad_(True) if isinstance(tau, torch.Tensor) else tau
        p = sa.alpha_relu(xx, alpha, tt)
        grads = torch.autograd.grad((p * w).sum(), [xx] + ([tt] if isinstance(tt, torch.Tensor) else []))
        return (p.detach(),) + tuple(grads)
    finally:
        _cpu_rows.set_enabled(old)


class _Spy:
    """Counts the calls of the C entries (forward, backward) by dtype."""

    def __init__(self, monkeypatch):
        self.fwd = self.bwd = 0
        for dtype, (fwd, bwd) in list(_cpu_rows.RELU_KERNELS.items()):
            def f(*args, _fn=fwd):
                self.fwd += 1
                return _fn(*args)

            def b(*args, _fn=bwd):
                self.bwd += 1
                return _fn(*args)

            monkeypatch.setitem(_cpu_rows.RELU_KERNELS, dtype, (f, b))


@pytest.mark.parametrize("tau_kind", ["float", "zero", "scalar", "row"])
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", [F32, F64, BF16])
def test_matches_the_pytorch_path_on_edge_rows(dtype, alpha, tau_kind, monkeypatch):
    x = _edge_x(6, 23, dtype)
    w = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    tau = _tau(tau_kind, 6, dtype)
    spy = _Spy(monkeypatch)
    fused = _run(x, alpha, tau, w, True)
    assert (spy.fwd, spy.bwd) == (1, 1)
    ref = _run(x, alpha, tau, w, False)
    assert (spy.fwd, spy.bwd) == (1, 1)
    for a, b in zip(fused, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
    p, gx = fused[:2]
    assert torch.equal(p.isnan(), ref[0].isnan()) and torch.equal(gx.isnan(), ref[1].isnan())
    assert (p[1] == 0).all() and (gx[1] == 0).all()  # a masked row: 0, never NaN
    if alpha in EXACT:  # the same roundings: bit for bit
        assert torch.equal(p.nan_to_num(), ref[0].nan_to_num())
        assert torch.equal(gx.nan_to_num(), ref[1].nan_to_num())
    else:  # the power in double (exp(e log t); libm's pow for float64), rounded once, against PyTorch's pow
        tol = {F32: dict(rtol=4e-6, atol=1e-30), F64: dict(rtol=1e-13, atol=1e-300),
               BF16: dict(rtol=8e-3, atol=1e-30)}[dtype]
        torch.testing.assert_close(p, ref[0], equal_nan=True, **tol)
        torch.testing.assert_close(gx, ref[1], equal_nan=True, **tol)
    if isinstance(tau, torch.Tensor):  # dL/dτ: summed in double here, in the compute dtype there
        tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused[2], ref[2], equal_nan=True, **tol)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 3.0, 1.3, 2.5])
@pytest.mark.parametrize("tau_kind", ["scalar", "row"])
def test_gradcheck_x_and_tau(alpha, tau_kind, monkeypatch):
    """Finite differences in float64; the entries stay away from the kink t = 0 (α = 2: a step there)."""
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(5, 9, dtype=F64, generator=g) * 4 - 2).requires_grad_()
    tau = (torch.tensor(0.15, dtype=F64) if tau_kind == "scalar"
           else torch.rand(5, 1, dtype=F64, generator=g) * 0.4 - 0.2).requires_grad_()
    t = (alpha - 1) * x.detach() - tau.detach()
    assert t.abs().min() > 1e-3
    spy = _Spy(monkeypatch)
    assert torch.autograd.gradcheck(lambda a, b: sa.alpha_relu(a, alpha, b), (x, tau), atol=1e-7, rtol=1e-6)
    assert spy.fwd > 0 and spy.bwd > 0


def test_the_power_against_float64():
    """α = 1.3, float32: the power and the derivative of the float32 base t = [0.3 x - 0.1]_+ (as both paths form
    it) against float64 powers (the C path rounds once)."""
    x = torch.randn(50, 40, generator=torch.Generator().manual_seed(4)) * 3
    xx = x.clone().requires_grad_()
    p = sa.alpha_relu(xx, 1.3, 0.1)
    p.backward(torch.ones_like(p))
    t = torch.clamp(x * 0.3 - 0.1, min=0).double()
    ref_p, ref_d = t ** (1 / 0.3), t ** (0.7 / 0.3)
    torch.testing.assert_close(p.double(), ref_p, rtol=1.2e-7, atol=0)
    torch.testing.assert_close(xx.grad.double(), ref_d, rtol=1.2e-7, atol=0)


@pytest.mark.parametrize("alpha", [1.5, 1.3])
@pytest.mark.parametrize("tau_kind", ["float", "scalar", "row"])
def test_threads_give_the_same_result(tau_kind, alpha, monkeypatch):
    """Above the parallel threshold the entries are split over threads (in blocks, the last one partial): the
    same values as one thread."""
    x = _edge_x(512, 81, F32, seed=5)
    x[0, 2] = 1.0  # (no NaN in dL/dτ)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(6))
    tau = _tau(tau_kind, 512, F32)
    assert x.numel() >= _cpu_rows.PARALLEL_MIN_ELEMENTS
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = _run(x, alpha, tau, w, True)
        monkeypatch.setattr(_cpu_rows, "PARALLEL_MIN_ELEMENTS", 10**9)
        one = _run(x, alpha, tau, w, True)
    finally:
        torch.set_num_threads(old)
    ref = _run(x, alpha, tau, w, False)
    for a, b, c in zip(two[:2], one[:2], ref[:2]):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
        torch.testing.assert_close(a, c, rtol=0 if alpha == 1.5 else 4e-6, atol=0, equal_nan=True)
    if tau_kind == "row":  # one sum per row: the same in any split
        assert torch.equal(two[2].nan_to_num(), one[2].nan_to_num())
    elif tau_kind == "scalar":  # the blocks' sums added in block order: the same for any split
        assert torch.equal(two[2].nan_to_num(), one[2].nan_to_num())
    if tau_kind != "float":
        torch.testing.assert_close(two[2], ref[2], rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("rows", [64, 8])
def test_tau_gradient_is_the_same_for_any_thread_count(rows, monkeypatch):
    """One τ over many blocks (64 x 16384 float64: 256 blocks, their sums in a buffer; 8 rows: 32 blocks, on the
    stack): at α = 2, ∂L/∂τ of Σ p is exactly minus the count of positive bases (integers in double: any lost
    update shows); at α = 1.3 the same bits with 1, 2 and 4 threads (and the same as the PyTorch path within its
    float64 sum's rounding)."""
    x = torch.randn(rows, 16384, dtype=F64, generator=torch.Generator().manual_seed(8))
    assert -(-x.numel() // _cpu_rows.RELU_BLOCK) == 4 * rows and x.numel() >= _cpu_rows.PARALLEL_MIN_ELEMENTS
    spy = _Spy(monkeypatch)
    old = torch.get_num_threads()
    grads = {}
    try:
        for alpha in (2.0, 1.3):
            for threads in (1, 2, 4, 4):
                torch.set_num_threads(threads)
                assert _cpu_rows._relu_threads(rows, 16384, False) == threads
                tau = torch.tensor(0.1, dtype=F64, requires_grad=True)
                sa.alpha_relu(x, alpha, tau).sum().backward()
                grads.setdefault(alpha, []).append(tau.grad)
    finally:
        torch.set_num_threads(old)
    assert spy.bwd == 8
    count = float(((x - 0.1) > 0).sum())
    assert all(float(g) == -count for g in grads[2.0])
    assert all(torch.equal(g, grads[1.3][0]) for g in grads[1.3])
    ref = _run(x, 1.3, torch.tensor(0.1, dtype=F64), torch.ones_like(x), False)[2]
    torch.testing.assert_close(grads[1.3][0], ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("alpha", [1.01, 1.3, 10.0])
def test_float64_powers_within_an_ulp(alpha):
    """float64 at large |e ln t| (t up to 1e3 at α = 1.01, where p = t^100 nears 1e300; 1e90 at 1.3; 1e300 at
    10): p = t^{1/a} and ∂p/∂x = t^{1/a - 1} within two ulps of the exact powers (mpmath, 80 digits) of the float64
    base t = (α - 1) x (libmvec's or libm's pow: about one; exp(e log t) in double was 600-700 off)."""
    mpmath = pytest.importorskip("mpmath")
    a = alpha - 1.0
    top = {1.01: 3.0, 1.3: 90.0, 10.0: 300.0}[alpha]
    x = (10.0 ** torch.linspace(-2.0, top, 120, dtype=F64)) / a
    xx = x.clone().requires_grad_()
    p = sa.alpha_relu(xx, alpha, 0.0)
    p.backward(torch.ones_like(p))
    t = x * a
    worst = 0.0
    with mpmath.workdps(80):
        for j in range(x.numel()):
            base = mpmath.mpf(float(t[j]))
            for got, e in ((float(p.detach()[j]), 1.0 / a), (float(xx.grad[j]), (1.0 - a) / a)):
                assert math.isfinite(got) and got > 0
                worst = max(worst, float(abs(mpmath.mpf(got) - base ** mpmath.mpf(e)) / math.ulp(got)))
    assert worst <= 2.0, worst


@pytest.mark.parametrize("tau_kind", ["float", "scalar", "row"])
def test_x_modified_in_place_before_the_backward(tau_kind, monkeypatch):
    """The C path saves x (no copy) and recomputes the base from it: x changed in place after the call raises
    PyTorch's in-place error at the backward (as documented), never a gradient of the changed x; the PyTorch
    path, which saves the base, gives the gradient of the x of the call."""
    w = torch.randn(4, 6, generator=torch.Generator().manual_seed(9))
    tau = _tau(tau_kind, 4, F32)
    ref = _run(w * 2, 1.3, tau, torch.ones(4, 6), False)[1]
    for fused in (True, False):
        old = _cpu_rows.set_enabled(fused)
        spy = _Spy(monkeypatch)
        try:
            ww = w.clone().requires_grad_()
            h = ww * 2  # a non-leaf activation, its buffer reused after the call
            p = sa.alpha_relu(h, 1.3, tau)
            h.mul_(0)
            if fused:
                with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                    p.sum().backward()
                assert spy.fwd == 1 and spy.bwd == 0
            else:
                p.sum().backward()
                torch.testing.assert_close(ww.grad, 2 * ref)
                assert spy.fwd == 0
        finally:
            _cpu_rows.set_enabled(old)


def test_no_gradient_calls_and_expanded_gradients(monkeypatch):
    spy = _Spy(monkeypatch)
    x = torch.randn(7, 12, dtype=F64)
    with torch.no_grad():
        p = sa.alpha_relu(x, 1.5, 0.1)
    assert (spy.fwd, spy.bwd) == (1, 0)
    assert torch.equal(p, torch.clamp(0.5 * x - 0.1, min=0) ** 2)
    xx = x.clone().requires_grad_()
    sa.alpha_relu(xx, 1.5, 0.1).sum().backward()  # the incoming gradient is an expanded scalar
    assert (spy.fwd, spy.bwd) == (2, 1)
    assert torch.equal(xx.grad, torch.clamp(0.5 * x - 0.1, min=0))
    tau = torch.zeros(7, 1, dtype=F64, requires_grad=True)  # τ alone needs a gradient
    sa.alpha_relu(x, 1.5, tau).sum().backward()
    torch.testing.assert_close(tau.grad, -torch.clamp(0.5 * x, min=0).sum(-1, keepdim=True) / 0.5)


def test_what_the_c_path_does_not_take(monkeypatch):
    """A τ per column, float16, a non-contiguous x and an empty x take the PyTorch path, with the same results."""
    spy = _Spy(monkeypatch)
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(7)) * 2
    col = torch.linspace(-0.3, 0.3, 10)
    torch.testing.assert_close(sa.alpha_relu(x, 1.5, col), torch.clamp(0.5 * x - col, min=0) ** 2)
    h = x.to(torch.float16)
    t = torch.clamp(h.float() * 0.5 - 0.1, min=0)  # computed in float32, rounded once
    assert torch.equal(sa.alpha_relu(h, 1.5, 0.1), (t * t).to(torch.float16))
    assert torch.equal(sa.alpha_relu(x.t(), 2.0, 0.1), torch.clamp(x.t() - 0.1, min=0))
    assert sa.alpha_relu(torch.empty(0, 4), 1.5).shape == (0, 4)
    assert (spy.fwd, spy.bwd) == (0, 0)
    old = _cpu_rows.set_enabled(False)
    try:
        sa.alpha_relu(x, 1.5, 0.1)
    finally:
        _cpu_rows.set_enabled(old)
    assert spy.fwd == 0
    sa.alpha_relu(x, 1.5, 0.1)  # and the same call with the path on takes it
    assert spy.fwd == 1


@pytest.mark.parametrize("fused", [True, False])
def test_create_graph_refuses_a_second_derivative(fused):
    """Both paths' backward is once differentiable: a gradient made with create_graph=True says so when
    differentiated again (not a silent zero)."""
    old = _cpu_rows.set_enabled(fused)
    try:
        x = torch.randn(3, 4, dtype=F64, requires_grad=True)
        v = torch.randn(3, 4, dtype=F64, requires_grad=True)  # an incoming gradient that needs one itself
        (g,) = torch.autograd.grad(sa.alpha_relu(x, 1.5, 0.1), x, v, create_graph=True)
        assert torch.equal(g.detach(), v.detach() * torch.clamp(0.5 * x.detach() - 0.1, min=0))
        with pytest.raises(RuntimeError, match="differentiate twice"):
            g.sum().backward()
    finally:
        _cpu_rows.set_enabled(old)


@pytest.mark.parametrize("alpha", [1.5, 1.3])
@pytest.mark.parametrize("tau_kind", ["float", "scalar", "row"])
def test_an_expanded_gradient_is_read_without_a_copy(alpha, tau_kind, monkeypatch):
    """An incoming gradient that is one value expanded (a sum's backward) is read as that value (no contiguous
    copy), with the same results as the PyTorch path; over threads and blocks, the last one partial."""
    x = _edge_x(300, 130, F32, seed=8)
    x[0, 2] = 1.0  # (no NaN in dL/dτ)
    tau = _tau(tau_kind, 300, F32)
    strides = []
    fwd, bwd = _cpu_rows.RELU_KERNELS[F32]
    monkeypatch.setitem(_cpu_rows.RELU_KERNELS, F32, (fwd, lambda *a: strides.append(a[2]) or bwd(*a)))
    out = []
    for fused in (True, False):
        old, threads = _cpu_rows.set_enabled(fused), torch.get_num_threads()
        try:
            torch.set_num_threads(2)
            xx = x.clone().requires_grad_()
            tt = tau.clone().requires_grad_() if isinstance(tau, torch.Tensor) else tau
            p = sa.alpha_relu(xx, alpha, tt)
            p.backward(torch.tensor(0.7).expand_as(p))
            out.append((xx.grad, tt.grad if isinstance(tt, torch.Tensor) else None))
        finally:
            _cpu_rows.set_enabled(old)
            torch.set_num_threads(threads)
    assert strides == [0]
    (ga, ta), (gb, tb) = out
    torch.testing.assert_close(ga, gb, rtol=0 if alpha == 1.5 else 4e-6, atol=0, equal_nan=True)
    if ta is not None:
        torch.testing.assert_close(ta, tb, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_ctypes_entries_compute_what_the_python_entries_compute(tmp_path, monkeypatch):
    """The library built without Python's headers (its ctypes entries, the fallback): α-ReLU's forward and
    backward and the class-index loss's weight check and row scaling write the same bits."""
    import ctypes

    python_relu, python_index = dict(_cpu_rows.RELU_KERNELS), dict(_cpu_rows.INDEX_KERNELS)
    monkeypatch.setattr(_cpu_rows, "PYTHON_ENTRIES", False)
    monkeypatch.setenv("SOFTARGMAX_CACHE_DIR", str(tmp_path))
    path = _cpu_rows._build()
    lib = ctypes.CDLL(str(path))
    assert _cpu_rows._python_entries(path, lib) is None
    monkeypatch.setattr(_cpu_rows, "RELU_KERNELS", {})
    monkeypatch.setattr(_cpu_rows, "INDEX_KERNELS", {})
    _cpu_rows._relu_signatures(lib)
    _cpu_rows._index_signatures(lib)
    x = _edge_x(9, 16, F32, seed=9)
    g = torch.randn(9, 16, generator=torch.Generator().manual_seed(10))
    taus = torch.linspace(-0.3, 0.3, 9)
    outs = []
    for relu, index in ((_cpu_rows.RELU_KERNELS[F32], _cpu_rows.INDEX_KERNELS[F32]), (python_relu[F32], python_index[F32])):
        p, gx, sums = torch.empty_like(x), torch.empty_like(x), torch.empty(9, dtype=F64)
        relu[0](x.data_ptr(), 9, 16, 0.3, 0.0, taus.data_ptr(), p.data_ptr(), 1)
        relu[1](x.data_ptr(), g.data_ptr(), 1, 9, 16, 0.3, 0.0, taus.data_ptr(), gx.data_ptr(), sums.data_ptr(), 1)
        scaled = torch.empty_like(g)
        index[1](g.data_ptr(), scaled.data_ptr(), 9, 16, taus.data_ptr(), 0.7, 1)
        ok = [bool(index[0](w.data_ptr(), 2)) for w in (torch.tensor([0.0, 1.0]), torch.tensor([1.0, -1.0]))]
        outs.append((p, gx, sums, scaled, torch.tensor(ok)))
    for a, b in zip(*outs):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())
    assert outs[0][4].tolist() == [True, False]


def test_threads_are_at_most_the_blocks_or_rows():
    """One thread below the parallel threshold; above it at most one per block of entries (one τ) or per row."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(16)
        assert _cpu_rows._relu_threads(1, 100, False) == 1
        assert _cpu_rows._relu_threads(1, 33000, False) == -(-33000 // _cpu_rows.RELU_BLOCK) == 9
        assert _cpu_rows._relu_threads(3, 20000, True) == 3
        assert _cpu_rows._relu_threads(1000, 1000, False) == _cpu_rows._relu_threads(1000, 1000, True) == 16
    finally:
        torch.set_num_threads(old)


def test_bfloat16_is_computed_in_float32_and_rounded_once(monkeypatch):
    """bfloat16 on the C path: p and the gradient are the float32 values (from the bfloat16 inputs) rounded to
    bfloat16 once, NaN included; dL/dτ is summed from the unrounded float32 products."""
    spy = _Spy(monkeypatch)
    x = _edge_x(40, 30, F32, seed=11).to(BF16)
    g = torch.randn(40, 30, generator=torch.Generator().manual_seed(12)).to(BF16)
    tau = torch.linspace(-0.4, 0.4, 40).reshape(40, 1).requires_grad_()
    xx = x.clone().requires_grad_()
    p = sa.alpha_relu(xx, 1.5, tau)
    p.backward(g)
    assert (spy.fwd, spy.bwd) == (1, 1) and p.dtype == xx.grad.dtype == BF16 and tau.grad.dtype == F32
    t = torch.clamp(x.float() * 0.5 - tau.detach(), min=0)
    assert torch.equal(p.float().nan_to_num(), (t * t).to(BF16).float().nan_to_num())
    assert torch.equal(p.isnan(), (t * t).isnan())
    prod = g.float() * t
    assert torch.equal(xx.grad.float().nan_to_num(), prod.to(BF16).float().nan_to_num())
    torch.testing.assert_close(tau.grad, -prod.sum(-1, keepdim=True).double().to(F32) / 0.5, equal_nan=True,
                               rtol=1e-6, atol=1e-6)
