"""sparsemax, entmax15, entmax: exact against sort-based references, the entmax package, gradients."""

import math

import numpy as np
import pytest
import torch
from conftest import entmax15_sort, sparsemax_sort

import softargmax as sa
from softargmax.operators._autograd import entmax_alpha_vjp

entmax_pkg = pytest.importorskip("entmax")
F64 = torch.float64

SHAPES = [(1, 2), (7, 5), (4, 130), (3, 1000), (2, 4096), (64, 512)]

# every test runs on the fused CPU row solver and on the PyTorch path
pytestmark = pytest.mark.usefixtures("solver_path")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
def test_sparsemax_and_entmax15_match_sort_reference(shape, scale):
    g = torch.Generator().manual_seed(hash((shape, scale)) % 2**31)
    x = torch.randn(*shape, dtype=F64, generator=g) * scale
    np.testing.assert_allclose(sa.sparsemax(x).numpy(), sparsemax_sort(x.numpy()), atol=1e-12, rtol=1e-10)
    np.testing.assert_allclose(sa.entmax15(x).numpy(), entmax15_sort(x.numpy()), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_matches_reference_to_rounding(shape):
    x = torch.randn(*shape) * 3
    np.testing.assert_allclose(sa.sparsemax(x).numpy(), sparsemax_sort(x.double().numpy()), atol=3e-6)
    np.testing.assert_allclose(sa.entmax15(x).numpy(), entmax15_sort(x.double().numpy()), atol=3e-6)


def test_ties_and_constant_rows():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 0.0, 0.0], [0.0] * 4], dtype=F64)
    for f, ref in [(sa.sparsemax, sparsemax_sort), (sa.entmax15, entmax15_sort)]:
        np.testing.assert_allclose(f(x).numpy(), ref(x.numpy()), atol=1e-12)
    # a long constant row is uniform (no pruning possible)
    x = torch.zeros(3, 2048)
    torch.testing.assert_close(sa.entmax15(x), torch.full_like(x, 1 / 2048))


@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.5, 1.7, 2.0, 2.5, 4.0])
def test_entmax_matches_package_bisect(alpha):
    x = torch.randn(6, 300, dtype=F64) * 2
    ref = entmax_pkg.entmax_bisect(x, alpha, n_iter=200)
    torch.testing.assert_close(sa.entmax(x, alpha), ref, atol=1e-10, rtol=1e-8)


def test_entmax_special_cases():
    x = torch.randn(5, 40, dtype=F64) * 3
    torch.testing.assert_close(sa.entmax(x, 1.0), torch.softmax(x, -1))
    torch.testing.assert_close(sa.entmax(x, 2.0), sa.sparsemax(x))
    torch.testing.assert_close(sa.entmax(x, 1.5), sa.entmax15(x))
    # tensor alpha uses the log1p/exp path; it agrees with the float path, and at alpha=1 with softmax
    for a in [1.0, 1.5, 2.0, 1.3]:
        torch.testing.assert_close(sa.entmax(x, torch.tensor(a, dtype=F64).reshape(1, 1)), sa.entmax(x, a), atol=1e-12, rtol=1e-9)


def test_values_and_gradients_match_package():
    x = torch.randn(8, 50, dtype=F64) * 2
    gout = torch.randn_like(x)
    for ours, ref in [(sa.sparsemax, entmax_pkg.sparsemax), (sa.entmax15, entmax_pkg.entmax15),
                      (lambda t: sa.entmax(t, 1.3), lambda t: entmax_pkg.entmax_bisect(t, 1.3, n_iter=200))]:
        a = x.clone().requires_grad_()
        b = x.clone().requires_grad_()
        pa, pb = ours(a), ref(b)
        torch.testing.assert_close(pa, pb, atol=1e-10, rtol=1e-8)
        (ga,) = torch.autograd.grad(pa, a, gout)
        (gb,) = torch.autograd.grad(pb, b, gout)
        torch.testing.assert_close(ga, gb, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("fn", [sa.sparsemax, sa.entmax15, lambda t: sa.entmax(t, 1.3), lambda t: sa.entmax(t, 2.7)])
@pytest.mark.parametrize("k", [6, 300])
def test_gradcheck_x(fn, k):
    # well-separated values keep finite differences away from support changes; the long rows are checked in
    # gradcheck's fast mode (random directions: 900 inputs would take 1800 forward calls)
    x = (torch.randperm(3 * k).reshape(3, k).to(F64) / k * 4 / math.pi).requires_grad_()  # no ties with tau
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-6, fast_mode=k > 32)


def test_gradcheck_alpha_per_row():
    g = torch.Generator().manual_seed(0)
    x = (torch.randperm(12, generator=g).reshape(3, 4).to(F64) / 3 / math.pi).requires_grad_()  # no ties with tau
    alpha = torch.tensor([[1.2], [1.5], [1.9]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: sa.entmax(a, b), (x, alpha), eps=1e-6, atol=1e-6)
    # per-head alpha broadcast over several rows
    x = (torch.randperm(2 * 3 * 4 * 5, generator=g).reshape(2, 3, 4, 5).to(F64) / 40 / math.pi).requires_grad_()
    alpha = torch.tensor([1.3, 1.6, 1.8], dtype=F64).reshape(3, 1, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: sa.entmax(a, b), (x, alpha), eps=1e-6, atol=1e-6)


def test_alpha_gradient_matches_package():
    x = torch.randn(5, 30, dtype=F64)
    alpha = torch.tensor([[1.1], [1.3], [1.5], [1.8], [2.4]], dtype=F64)
    gout = torch.randn_like(x)
    a1 = alpha.clone().requires_grad_()
    a2 = alpha.clone().requires_grad_()
    (g1,) = torch.autograd.grad(sa.entmax(x, a1), a1, gout)
    (g2,) = torch.autograd.grad(entmax_pkg.entmax_bisect(x, a2, n_iter=200), a2, gout)
    torch.testing.assert_close(g1, g2, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("a", [1.0, 1.0 + 1e-7, 1.0 + 1e-4, 1.01])
def test_alpha_gradient_near_one_matches_finite_differences(a):
    """The alpha -> 1 limit (Correia et al., 2019, eq. 38) and the general formula join continuously."""
    x = torch.randn(4, 12, dtype=F64)
    v = torch.randn_like(x)
    h = 1e-4

    def f(al):
        return (sa.entmax(x, torch.full((4, 1), al, dtype=F64)) * v).sum(-1)

    fd = (f(a + h) - f(max(a - h, 1.0))) / (a + h - max(a - h, 1.0))
    alpha = torch.full((4, 1), a, dtype=F64)
    p = sa.entmax(x, alpha)
    ours = entmax_alpha_vjp(p, v, alpha).squeeze(-1)
    torch.testing.assert_close(ours, fd, atol=2e-4, rtol=2e-3)


def test_support_is_sparse_and_sums_to_one():
    x = torch.randn(16, 32000) * 3
    for f in [sa.sparsemax, sa.entmax15, lambda t: sa.entmax(t, 1.3)]:
        p = f(x)
        torch.testing.assert_close(p.sum(-1), torch.ones(16), atol=2e-5, rtol=0)
        assert (p == 0).float().mean() > 0.99
        assert (p >= 0).all()


def test_pruned_and_unpruned_solutions_agree(torch_solver):
    from softargmax.divergences import AlphaDivergence, ChiSquare
    from softargmax.solvers.threshold import solve

    z = torch.randn(32, 4096, dtype=F64, generator=torch.Generator().manual_seed(1)) * 3
    for div in [ChiSquare(), AlphaDivergence(1.5), AlphaDivergence(1.2), AlphaDivergence(3.0)]:
        a, b = solve(z, div, prune=True), solve(z, div, prune=False)
        assert b.block_index is None
        if not isinstance(div, AlphaDivergence) or div.alpha >= 1.5:
            assert a.block_index is not None  # few candidates: pruned
        torch.testing.assert_close(a.dense_p(), b.dense_p(), atol=1e-11, rtol=0)
        torch.testing.assert_close(a.tau, b.tau)
        # alpha > 2 has no convex transform: safeguarded Newton degrades towards bisection
        limit = 80 if isinstance(div, AlphaDivergence) and div.alpha > 2 else 12
        assert a.iterations < limit
