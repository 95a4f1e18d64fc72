"""Regression tests for numerics at the edges (one test per reported case).

References are independent of the library's solvers: the ``entmax`` package's bisection
(200 iterations, float64), a float64 bisection for α-entmax written here with ``log1p``
(so that it stays exact near α = 1 and extends to α < 1 for central differences), sort-based
sparsemax / 1.5-entmax, and float64 evaluations of the same float32 input.
"""

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import entmax15_sort, entmax_ref64, sparsemax_sort

import softargmax as sa
from softargmax.backends.cpu import rows as _cpu_rows
from softargmax.backends.triton import rows as _triton_rows

entmax_pkg = pytest.importorskip("entmax")


@pytest.fixture(params=["torch", "fused-cpu", "triton"])
def any_path(request):
    """Every solver path: the PyTorch reference, the C row solver, the Triton kernels (interpreter on CPU)."""
    old_cpu = _cpu_rows.set_enabled(request.param == "fused-cpu")
    old_gpu = _triton_rows.set_enabled(request.param == "triton")
    old_interp = None
    if request.param == "fused-cpu" and not _cpu_rows.available():
        pytest.skip("no C compiler")
    if request.param == "triton":
        if not _triton_rows.available():
            pytest.skip("Triton is not installed")
        old_interp = _triton_rows.set_cpu_interpret(True)
    yield request.param
    _cpu_rows.set_enabled(old_cpu)
    _triton_rows.set_enabled(old_gpu)
    if old_interp is not None:
        _triton_rows.set_cpu_interpret(old_interp)


# -- 1. α > 2 on flat or nearly flat rows ------------------------------------------------


@pytest.mark.parametrize("alpha,k,scale", [(4.0, 100, 0.0), (3.0, 100, 0.0), (2.5, 100, 0.0), (3.0, 1000, 0.0),
                                           (3.0, 100, 1e-3), (6.0, 300, 1e-4), (2.2, 50, 1e-6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_steep_alpha_on_flat_rows(alpha, k, scale, dtype, solver_path):
    torch.manual_seed(1)
    x = (torch.randn(2, k, dtype=torch.float64) * scale).to(dtype)
    p = sa.entmax(x, alpha)
    ref = entmax_pkg.entmax_bisect(x.double(), alpha, n_iter=200)
    ref2 = entmax_ref64(x, alpha)
    assert torch.allclose(ref, ref2, atol=1e-12)  # the two references agree
    sum_tol = 2e-6 if dtype == torch.float32 else 1e-12
    assert (p.sum(-1) - 1).abs().max() <= sum_tol
    # float64: p = base^{1/(α-1)} is only Hölder continuous at the edge of the support, and
    # the references themselves differ by that much (α = 6 on rows of size 1e-4)
    tol = 1e-6 if dtype == torch.float32 else 1e-10
    assert (p.double() - ref).abs().max() <= tol


def test_steep_alpha_per_row_tensor_and_q(torch_solver):
    """α > 2 as a per-row tensor (many distinct values) and with a reference measure q."""
    torch.manual_seed(2)
    x = torch.randn(40, 60) * 1e-3
    alpha = torch.linspace(2.2, 5.0, 40).unsqueeze(1)
    p = sa.entmax(x, alpha)
    for i in (0, 17, 39):
        ref = entmax_ref64(x[i], float(alpha[i]))
        assert (p[i].double() - ref).abs().max() <= 1e-6
    assert (p.sum(-1) - 1).abs().max() <= 2e-6
    q = torch.rand(60) + 0.5
    pq = sa.f_softargmax(torch.zeros(3, 60), "alpha", q=q, alpha=4.0)
    # flat scores: p_j = q_j [y - t]^{1/a} with the same base: p ∝ q
    assert (pq.double() - (q / q.sum()).double()).abs().max() <= 1e-6


def test_steep_alpha_f_softmax_value_on_flat_rows(solver_path):
    """f_softmax at α = 5, β = 0.5 on nearly flat rows (7 classes, ``-3 ± 2e-4``): the value is
    exact, and its central differences match those of an exact value.  Those differ from
    ``⟨p, v⟩`` by 6.9e-5 at h = 1e-6: ``p = [y - t]_+^{1/(α-1)}`` is only Hölder continuous
    at the edge of the support (the entry at -3.0001628 sits there), so the central
    difference's error is ``O(h^{1/(α-1)})``, not ``O(h²)``; it lies between ``⟨p(x ± h v), v⟩``
    (f_softmax is convex)."""
    from softargmax.divergences import get_divergence

    alpha, beta, h = 5.0, 0.5, 1e-6
    x = torch.tensor([[-3.000242, -3.0003586, -2.9999222, -3.0002647, -3.0001628, -2.9996874, -3.0001137]],
                     dtype=torch.float64)
    x = x - x.amax(-1, keepdim=True)
    v = torch.tensor([[1.5060, 0.1456, -0.1797, -0.9702, -0.0543, -0.1206, 0.6122]], dtype=torch.float64)
    f = get_divergence("alpha", alpha=alpha).f

    def value_ref(z):
        # max_p ⟨p, z⟩ - β Σ f(p_j) at the float64 bisection's p: stationary in p, so the
        # value's error is second order in p's
        p = entmax_ref64(z / beta, alpha)
        return ((p * z).sum(-1) - beta * f(p).sum(-1)).squeeze()

    def value(z):
        return sa.f_softmax(z, "alpha", alpha=alpha, temperature=beta).squeeze()

    for z in (x, x + h * v, x - h * v):
        assert abs(float(value(z) - value_ref(z))) <= 1e-14
    fd = float(value(x + h * v) - value(x - h * v)) / (2 * h)
    fd_ref = float(value_ref(x + h * v) - value_ref(x - h * v)) / (2 * h)
    assert abs(fd - fd_ref) <= 1e-8
    slope = lambda z: float((sa.f_softargmax(z, "alpha", alpha=alpha, temperature=beta) * v).sum())  # noqa: E731
    assert abs(fd_ref - slope(x)) > 5e-5  # the exact central difference is that far from ⟨p, v⟩ ...
    assert slope(x - h * v) <= fd <= slope(x + h * v)  # ... and inside the convexity bracket


# -- 2. large logits on every path ----------------------------------------------------------

LARGE = [
    ("sparsemax", lambda x: sa.sparsemax(x)),
    ("entmax15", lambda x: sa.entmax15(x)),
    ("entmax-1.3", lambda x: sa.entmax(x, 1.3)),
    ("entmax-1.05", lambda x: sa.entmax(x, 1.05)),
    ("entmax-1.0001", lambda x: sa.entmax(x, 1.0001)),
    ("squared_hellinger", lambda x: sa.f_softargmax(x, "squared_hellinger")),
    ("jensen_shannon", lambda x: sa.f_softargmax(x, "jensen_shannon")),
    ("reverse_kl", lambda x: sa.f_softargmax(x, "reverse_kl")),
    ("jeffrey", lambda x: sa.f_softargmax(x, "jeffrey")),
    ("reverse_chi_square", lambda x: sa.f_softargmax(x, "reverse_chi_square")),
    ("alpha-0.5", lambda x: sa.f_softargmax(x, "alpha", alpha=0.5)),
]
Q12 = torch.linspace(0.5, 1.5, 12)
LARGE_Q = [
    ("jensen_shannon-q", lambda x: sa.f_softargmax(x, "jensen_shannon", q=Q12.to(x.dtype))),
    ("kl-q", lambda x: sa.f_softargmax(x, "kl", q=Q12.to(x.dtype))),
    ("chi_square-q", lambda x: sa.f_softargmax(x, "chi_square", q=Q12.to(x.dtype))),
    ("alpha-1.5-q", lambda x: sa.f_softargmax(x, "alpha", q=Q12.to(x.dtype), alpha=1.5)),
]


@pytest.mark.parametrize("offset", [1e4, 1e6])
@pytest.mark.parametrize("name,fn", LARGE + LARGE_Q, ids=[n for n, _ in LARGE + LARGE_Q])
def test_large_logits_match_float64(name, fn, offset, any_path):
    torch.manual_seed(3)
    x = torch.randn(4, 12) + offset
    p32 = fn(x)
    p64 = fn(x.double())  # the same input values in float64
    assert (p32.double() - p64).abs().max() <= 1e-6
    if name == "sparsemax":
        assert torch.allclose(p64, torch.as_tensor(sparsemax_sort(x.double().numpy())), atol=1e-12)
    if name == "entmax15":
        assert torch.allclose(p64, torch.as_tensor(entmax15_sort(x.double().numpy())), atol=1e-12)


def test_large_logits_pruned_rows(torch_solver):
    """Long rows take the pruned (candidate-block) path: it is shifted as well."""
    torch.manual_seed(4)
    x = torch.randn(3, 4096) * 3 + 1e6
    for fn in (sa.sparsemax, sa.entmax15, lambda t: sa.f_softargmax(t, "squared_hellinger")):
        assert (fn(x).double() - fn(x.double())).abs().max() <= 1e-6


# -- 3. the gradient with respect to α near α = 1 ---------------------------------------------

BAND = [1.0, 1 + 1e-7, 1 + 1e-6, 1 + 1e-5, 1 + 3e-5, 1 + 1e-4, 1 + 3e-4, 1 + 1e-3, 1.003, 1.006, 1.01]


def _alpha_fd(x, v, alpha, h=1e-4):
    """``d/dα ⟨v, entmax_α(x)⟩`` by float64 central differences of the independent bisection."""
    fp = (entmax_ref64(x, alpha + h) * v).sum()
    fm = (entmax_ref64(x, alpha - h) * v).sum()
    return float((fp - fm) / (2 * h))


@pytest.mark.parametrize("alpha", BAND)
def test_alpha_gradient_near_one(alpha, solver_path):
    torch.manual_seed(5)
    x = torch.randn(8, 20, dtype=torch.float64)
    v = torch.randn(8, 20, dtype=torch.float64)
    ref = torch.tensor([_alpha_fd(x[i], v[i], alpha) for i in range(8)], dtype=torch.float64)
    for dtype, tol in ((torch.float32, 1e-3), (torch.float64, 1e-6)):
        a = torch.full((8, 1), alpha, dtype=dtype, requires_grad=True)
        (sa.entmax(x.to(dtype), a) * v.to(dtype)).sum().backward()
        g = a.grad.squeeze(1).double()
        rel = ((g - ref).abs() / ref.abs().clamp_min(1e-3)).max()
        assert rel <= tol, (dtype, float(rel))


def test_alpha_near_one_forward_float32(solver_path):
    """The forward at α within 1e-6 of 1 (float32 p was off by 1e-2 before the log1p form)."""
    torch.manual_seed(6)
    x = torch.randn(8, 20)
    for alpha in (1 + 1e-6, 1 + 1e-4, 1.01, 1.2):
        ref = entmax_ref64(x, alpha)
        assert (sa.entmax(x, alpha).double() - ref).abs().max() <= 2e-7
        assert (sa.entmax(x, torch.tensor(alpha)).double() - ref).abs().max() <= 2e-7


#: α just above 1, down to the float next to 1, where ``1/(α - 1)`` is 4.5e15
JUST_ABOVE_ONE = [1 + 1e-10, 1 + 1e-12, 1 + 1e-15, 1.0000000000000002]


@functools.lru_cache(maxsize=None)
def _just_above_one_case(alpha, dtype):
    """Scores ``[32, 30]``, a direction and the float64 bisection (computed once per α and dtype)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 30, generator=g).to(dtype)
    v = torch.randn(32, 30, generator=g, dtype=torch.float64)
    ref = entmax_ref64(x, alpha)
    assert (ref - torch.softmax(x.double(), -1)).abs().max() <= 1e-9  # the reference: softmax to O(α - 1)
    return x, v, ref


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")  # numpy, in the interpreter
@pytest.mark.parametrize("alpha", JUST_ABOVE_ONE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_alpha_just_above_one_every_path(alpha, dtype, any_path):
    """α-entmax tends to softmax as α → 1 on every path, the gradient included.  The C row
    solver formed the base ``1 + w`` of ``p = (1 + w)^{1/(α-1)}`` in double, a relative error
    ``ε₆₄/(α - 1)``: float32 rows were off by 4e-6 at α = 1 + 1e-12 and summed to 1.29 at the
    float next to 1 (two zeros gave 0.6065 each)."""
    x, v, ref = _just_above_one_case(alpha, dtype)
    xr = x.clone().requires_grad_(True)
    p = sa.entmax(xr, alpha)
    (p * v.to(dtype)).sum().backward()
    tol = 2e-7 if dtype == torch.float32 else 1e-12
    assert (p.double() - ref).abs().max() <= tol
    assert (p.double().sum(-1) - 1).abs().max() <= 2 * tol
    # the Jacobian-vector product of α-entmax: s ⊙ (v - ⟨s, v⟩/Σs) with s = p^{2-α}
    s = torch.exp((2 - alpha) * ref.log())
    grad_ref = s * (v - (s * v).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))
    assert (xr.grad.double() - grad_ref).abs().max() <= 10 * tol
    two = sa.entmax(torch.zeros(1, 2, dtype=dtype), alpha)
    assert (two.double() - 0.5).abs().max() <= tol


# -- 4. binary f-sigmoid and f-softplus ---------------------------------------------------------

BINARY = ["kl", "reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "chi_square",
          "reverse_chi_square", ("alpha", 1.5), ("alpha", 3.0), ("alpha", 0.5)]


def _args(d):
    return (d, {}) if isinstance(d, str) else (d[0], {"alpha": d[1]})


@pytest.mark.parametrize("d", BINARY, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_binary_infinite_scores(d, dtype):
    name, params = _args(d)
    s = torch.tensor([math.inf, -math.inf, 0.0], dtype=dtype, requires_grad=True)
    sig = sa.f_sigmoid(s, name, **params)
    assert sig[0] == 1 and sig[1] == 0
    sp = sa.f_softplus(s, name, **params)
    assert sp[0] == math.inf
    # -inf: the class is absent, as in f_softmax (one rule for every function)
    absent = sa.f_softmax(torch.tensor([[0.0, -math.inf]], dtype=dtype), name, **params)
    assert float(sp[1]) == float(absent[0]) == 0.0
    (sig.sum() + sp[1:].sum()).backward()
    assert torch.isfinite(s.grad).all() and s.grad[0] == 0 and s.grad[1] == 0
    # with q0 != 1: -q0 f(1/q0), the f_softmax of the remaining class
    sp_q = sa.f_softplus(torch.tensor([-math.inf], dtype=dtype), name, q=(0.5, 2.0), **params)
    ref = sa.f_softmax(torch.tensor([[0.0, -math.inf]], dtype=torch.float64), name,
                       q=torch.tensor([0.5, 2.0], dtype=torch.float64), **params)
    assert torch.allclose(sp_q.double(), ref, atol=1e-6)


@pytest.mark.parametrize("d", BINARY, ids=str)
def test_binary_agrees_with_softargmax_float64(d):
    name, params = _args(d)
    s = torch.cat([torch.linspace(-40, 40, 401), torch.tensor([-7e4, 7e4, -1e3, 1e3, 300.0, -300.0])])
    sig = sa.f_sigmoid(s, name, **params)
    assert sig.min() >= 0 and sig.max() <= 1
    x64 = torch.stack([torch.zeros_like(s), s], -1).double()
    ref = sa.f_softargmax(x64, name, **params)[..., 1]
    assert (sig.double() - ref).abs().max() <= 1e-6
    for q in ((0.5, 2.0), (3.0, 0.25)):
        sig_q = sa.f_sigmoid(s, name, q=q, **params)
        ref_q = sa.f_softargmax(x64, name, q=torch.tensor(q, dtype=torch.float64), **params)[..., 1]
        assert (sig_q.double() - ref_q).abs().max() <= 1e-6
        assert sig_q.min() >= 0 and sig_q.max() <= 1


def test_js_sigmoid_in_range_float32():
    assert float(sa.f_sigmoid(torch.tensor(7e4), "jensen_shannon")) <= 1.0
    assert not torch.isnan(sa.f_softplus(torch.tensor(-math.inf), "jensen_shannon"))


# -- 5. losses at the edges ----------------------------------------------------------------------

LOSSES = [
    ("sparsemax_loss", lambda x, y, **kw: sa.sparsemax_loss(x, y, **kw)),
    ("entmax15_loss", lambda x, y, **kw: sa.entmax15_loss(x, y, **kw)),
    ("entmax_loss", lambda x, y, **kw: sa.entmax_loss(x, y, alpha=1.3, **kw)),
    ("fenchel_young_loss", lambda x, y, **kw: sa.fenchel_young_loss(x, y, "entmax15", **kw)),
    ("f_divergence_loss", lambda x, y, **kw: sa.f_divergence_loss(x, y, "squared_hellinger", **kw)),
    ("kl", lambda x, y, **kw: sa.f_divergence_loss(x, y, "kl", **kw)),
    ("alpha_relu_loss", lambda x, y, **kw: sa.alpha_relu_loss(x, y, **kw)),
]


@pytest.mark.parametrize("name,fn", LOSSES, ids=[n for n, _ in LOSSES])
@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("target_kind", ["index", "prob"])
def test_empty_batch_like_cross_entropy(name, fn, reduction, target_kind):
    x = torch.zeros(0, 5, requires_grad=True)
    y = torch.zeros(0, dtype=torch.long) if target_kind == "index" else torch.zeros(0, 5)
    loss = fn(x, y, reduction=reduction)
    ref = F.cross_entropy(torch.zeros(0, 5), y, reduction=reduction)
    assert loss.shape == ref.shape
    assert torch.equal(loss.isnan(), ref.isnan()) and torch.allclose(loss.nan_to_num(), ref.nan_to_num())
    loss.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("name,fn", LOSSES, ids=[n for n, _ in LOSSES])
def test_nan_probability_target_gives_nan(name, fn):
    x = torch.randn(3, 4, requires_grad=True)
    y = torch.full((3, 4), 0.25)
    y[1, 2] = math.nan
    loss = fn(x, y, reduction="none")
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2]]).all()
    assert torch.isnan(fn(x, y, reduction="mean")) and torch.isnan(fn(x, y, reduction="sum"))


@pytest.mark.parametrize("mapping", ["entmax15", "softmax", "alpha_relu", "jensen_shannon"])
def test_nan_probability_target_gives_nan_in_the_fused_linear_loss(mapping):
    """The fused linear loss (which has no "none" reduction) is NaN too, as the unfused one."""
    h, w = torch.randn(3, 6, requires_grad=True), torch.randn(4, 6)
    y = torch.full((3, 4), 0.25)
    y[1, 2] = math.nan
    for reduction in ("sum", "mean"):
        assert torch.isnan(sa.linear_fenchel_young_loss(h, w, y, mapping=mapping, reduction=reduction))
    y[1, 2] = 0.25
    assert torch.isfinite(sa.linear_fenchel_young_loss(h, w, y, mapping=mapping))


def test_ignored_arguments_are_refused():
    x = torch.randn(2, 5)
    y = torch.tensor([0, 3])
    with pytest.raises(ValueError, match="alpha"):
        sa.fenchel_young_loss(x, y, "sparsemax", alpha=1.7)
    with pytest.raises(ValueError, match="alpha"):
        sa.f_divergence_loss(x, y, "kl", alpha=1.7)
    with pytest.raises(TypeError, match="ignore_index"):
        sa.sparsemax_loss(x, y, ignore_index=1.5)
    with pytest.raises(TypeError, match="ignore_index"):
        sa.sparsemax_loss(x, y, ignore_index=True)
    h, w = torch.randn(2, 3), torch.randn(5, 3)
    with pytest.raises(ValueError, match="q"):
        sa.linear_fenchel_young_loss(h, w, y, mapping="alpha_relu", q=torch.ones(5))
    with pytest.raises(ValueError, match="temperature"):
        sa.linear_fenchel_young_loss(h, w, y, mapping="alpha_relu", temperature=2.0)
    # the accepted forms still work
    sa.fenchel_young_loss(x, y, "entmax", alpha=1.7)
    sa.fenchel_young_loss(x, y, "alpha", alpha=1.7)
    sa.sparsemax_loss(x, y, ignore_index=3)
