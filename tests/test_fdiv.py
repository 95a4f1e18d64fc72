"""f_softargmax / f_softmax: special cases, brute-force optimizer, gradients w.r.t. x and q."""

import math

import numpy as np
import pytest
import torch
from conftest import ALL_DIVERGENCES, brute_force_fsoftargmax, div_id

import softargmax as sa
from softargmax.divergences import get_divergence

F64 = torch.float64

# every test runs on the fused CPU row solver and on the PyTorch path
pytestmark = pytest.mark.usefixtures("solver_path")


def test_kl_is_softmax_with_log_q():
    x = torch.randn(4, 9, dtype=F64)
    q = torch.rand(9, dtype=F64) + 0.1
    torch.testing.assert_close(sa.f_softargmax(x, "kl"), torch.softmax(x, -1))
    torch.testing.assert_close(sa.f_softargmax(x, "kl", q=q), torch.softmax(x + q.log(), -1))
    torch.testing.assert_close(sa.f_softmax(x, "kl", q=q, temperature=0.7), 0.7 * torch.logsumexp(x / 0.7 + q.log(), -1))


def test_chi_square_is_sparsemax_and_alpha_is_entmax():
    x = torch.randn(5, 300, dtype=F64) * 2
    torch.testing.assert_close(sa.f_softargmax(x, "chi_square"), sa.sparsemax(x))
    for a in [1.2, 1.5, 2.0]:
        torch.testing.assert_close(sa.f_softargmax(x, "alpha", alpha=a), sa.entmax(x, a))
    # alpha = 1 is softmax, through the generic solver too (tensor-free float path)
    torch.testing.assert_close(sa.f_softargmax(x, "alpha", alpha=1.0), torch.softmax(x, -1))


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_temperature_scaling(d):
    x = torch.randn(3, 7, dtype=F64) * 2
    p1 = sa.f_softargmax(x, d[0], temperature=2.5, **d[1])
    p2 = sa.f_softargmax(x / 2.5, d[0], **d[1])
    torch.testing.assert_close(p1, p2)
    v1 = sa.f_softmax(x, d[0], temperature=2.5, **d[1])
    v2 = 2.5 * sa.f_softmax(x / 2.5, d[0], **d[1])
    torch.testing.assert_close(v1, v2)


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
@pytest.mark.parametrize("seed", range(3))
def test_matches_brute_force_optimizer(d, seed):
    rng = np.random.default_rng(seed)
    div = get_divergence(d[0], **d[1])
    k = int(rng.integers(2, 7))
    x = rng.normal(size=k) * 1.5
    q = rng.uniform(0.3, 2.0, size=k)
    beta = float(rng.choice([0.5, 1.0, 2.0]))
    p_ref, v_ref = brute_force_fsoftargmax(div, x, q, beta)
    xt, qt = torch.tensor(x), torch.tensor(q)
    p = sa.f_softargmax(xt, d[0], q=qt, temperature=beta, **d[1]).numpy()
    v = sa.f_softmax(xt, d[0], q=qt, temperature=beta, **d[1]).item()
    np.testing.assert_allclose(p, p_ref, atol=2e-5)
    assert v == pytest.approx(v_ref, abs=1e-7, rel=1e-7)
    # the solver's value is never below the optimizer's (it is the exact maximum)
    assert v >= v_ref - 1e-9


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_sums_to_one_and_sparsity_pattern(d):
    div = get_divergence(d[0], **d[1])
    x = torch.randn(8, 2000, dtype=F64) * 3
    q = torch.rand(2000, dtype=F64) + 0.5
    for qq in (None, q):
        p = sa.f_softargmax(x, d[0], q=qq, **d[1])
        torch.testing.assert_close(p.sum(-1), torch.ones(8, dtype=F64), atol=1e-12, rtol=0)
        assert (p >= 0).all()
        if div.sparse:
            assert (p == 0).any()
        else:
            assert (p > 0).all()


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_gradcheck_x_and_q(d):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 5, dtype=F64, generator=g) * 1.3).requires_grad_()
    q = (torch.rand(5, dtype=F64, generator=g) + 0.5).requires_grad_()
    f = lambda a, b: sa.f_softargmax(a, d[0], q=b, temperature=0.8, **d[1])
    assert torch.autograd.gradcheck(f, (x, q), eps=1e-6, atol=1e-5)
    fv = lambda a, b: sa.f_softmax(a, d[0], q=b, temperature=0.8, **d[1])
    assert torch.autograd.gradcheck(fv, (x, q), eps=1e-6, atol=1e-5)


def test_gradcheck_per_row_q():
    x = torch.randn(2, 3, 4, dtype=F64).requires_grad_()
    q = (torch.rand(2, 1, 4, dtype=F64) + 0.5).requires_grad_()
    f = lambda a, b: sa.f_softargmax(a, "squared_hellinger", q=b)
    assert torch.autograd.gradcheck(f, (x, q), eps=1e-6, atol=1e-5)
    # q along a non-last dim
    x = torch.randn(4, 3, dtype=F64).requires_grad_()
    q = (torch.rand(4, 1, dtype=F64) + 0.5).requires_grad_()
    f = lambda a, b: sa.f_softargmax(a, "alpha", q=b, dim=0, alpha=1.5)
    assert torch.autograd.gradcheck(f, (x, q), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_f_softmax_gradient_is_f_softargmax(d):
    x = torch.randn(4, 6, dtype=F64).requires_grad_()
    v = sa.f_softmax(x, d[0], **d[1])
    (g,) = torch.autograd.grad(v.sum(), x)
    torch.testing.assert_close(g, sa.f_softargmax(x.detach(), d[0], **d[1]))


def test_masked_entries_are_excluded_from_f_softmax():
    x = torch.randn(3, 6, dtype=F64)
    xm = torch.cat([x, torch.full((3, 2), -math.inf, dtype=F64)], -1)
    for name, params in ALL_DIVERGENCES:
        torch.testing.assert_close(sa.f_softmax(xm, name, **params), sa.f_softmax(x, name, **params))
        p = sa.f_softargmax(xm, name, **params)
        torch.testing.assert_close(p[:, :6], sa.f_softargmax(x, name, **params))
        assert (p[:, 6:] == 0).all()
    allm = torch.full((2, 4), -math.inf, dtype=F64, requires_grad=True)
    v = sa.f_softmax(allm, "alpha", alpha=1.5)
    assert (v == -math.inf).all()
    (g,) = torch.autograd.grad(v.sum(), allm)
    assert (g == 0).all()


def test_argument_errors():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="unknown name"):
        sa.f_softargmax(x, "hellinger")
    with pytest.raises(ValueError, match="q must be finite and strictly positive"):
        sa.f_softargmax(x, "kl", q=torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"q of shape .* not broadcastable"):
        sa.f_softargmax(x, "kl", q=torch.ones(4))
    with pytest.raises(TypeError, match="q must be None or a positive tensor"):
        sa.f_softargmax(x, "kl", q=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        sa.f_softargmax(x, "kl", temperature=0.0)
    with pytest.raises(ValueError, match="alpha must be"):
        sa.f_softargmax(x, "alpha", alpha=0.0)
    with pytest.raises(ValueError, match="empty simplex"):
        sa.f_softmax(torch.randn(2, 0))
