"""α-normmax: against a brute-force constrained optimizer (SciPy SLSQP), an independent
bisection on its root equation, finite differences, and the library's conventions."""

import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

import softargmax as sa
from softargmax.operators.normmax import normmax

ALPHAS = [1.3, 2.0, 3.0, 7.0]


def brute_force_normmax(x, alpha):
    """(p, value) maximizing <p, x> - ||p||_alpha over the simplex, by SLSQP (primal only)."""
    from scipy.optimize import minimize

    x = np.asarray(x, dtype=np.float64)
    k = len(x)

    def fun(p):
        n = np.sum(np.abs(p) ** alpha) ** (1 / alpha)
        grad = x - (np.abs(p) / n) ** (alpha - 1)
        return -(p @ x - n), -grad

    best = None
    e = np.full(k, 0.05 / k)
    e[np.argmax(x)] += 0.95
    for p0 in (np.full(k, 1.0 / k), e / e.sum()):
        res = minimize(fun, p0, jac=True, method="SLSQP", bounds=[(0.0, 1.0)] * k,
                       constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1, "jac": lambda p: np.ones_like(p)}],
                       options={"ftol": 1e-15, "maxiter": 2000})
        if best is None or res.fun < best.fun:
            best = res
    return best.x, -best.fun


def bisection_normmax(x, alpha, iters=200):
    """Independent reference: bisection on ||[x - tau]_+||_beta = 1, then p ∝ [x - tau]_+^{1/(alpha-1)}."""
    x = np.asarray(x, dtype=np.float64)
    beta = alpha / (alpha - 1)
    lo, hi = x.max() - 1.0, x.max()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if np.sum(np.clip(x - mid, 0, None) ** beta) >= 1:
            lo = mid
        else:
            hi = mid
    r = np.clip(x - lo, 0, None) ** (1 / (alpha - 1))
    return r / r.sum()


@pytest.mark.parametrize("alpha", ALPHAS)
def test_matches_brute_force(alpha, rng):
    for _ in range(4):
        x = rng.normal(size=6) * 1.5
        p = normmax(torch.tensor(x), alpha).numpy()
        pb, vb = brute_force_normmax(x, alpha)
        value = p @ x - np.sum(p ** alpha) ** (1 / alpha)
        assert value >= vb - 1e-9  # ours is at least as good as the optimizer's point
        np.testing.assert_allclose(p, pb, atol=2e-5)
        np.testing.assert_allclose(p.sum(), 1.0, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.1, 1.5, 2.0, 4.0, 50.0])
def test_matches_bisection_reference_long_rows(alpha, rng, solver_path):
    # long rows exercise the pruned candidate sets and (alpha' in (1, 2)) the fused CPU solver
    x = rng.normal(size=(5, 700)) * 3
    p = normmax(torch.tensor(x), alpha).numpy()
    ref = np.stack([bisection_normmax(r, alpha) for r in x])
    np.testing.assert_allclose(p, ref, atol=1e-12)
    p32 = normmax(torch.tensor(x, dtype=torch.float32), alpha).numpy()
    # float32: an error δ in the threshold moves p by about δ/(α-1) relative
    np.testing.assert_allclose(p32, ref, atol=2e-6 * max(1.0, 1 / (alpha - 1)))


def test_per_row_alpha_and_any_dim(rng):
    x = torch.tensor(rng.normal(size=(3, 4, 5)))
    alpha = torch.tensor([1.5, 2.0, 4.0], dtype=torch.float64).view(3, 1, 1)
    p = normmax(x, alpha, dim=1)
    for i, a in enumerate((1.5, 2.0, 4.0)):
        torch.testing.assert_close(p[i], normmax(x[i], a, dim=0), atol=1e-14, rtol=0)
    torch.testing.assert_close(normmax(x, 3.0, dim=0), normmax(x.movedim(0, -1), 3.0).movedim(-1, 0))


@pytest.mark.parametrize("alpha", [1.3, 2.0, 3.0])
def test_gradcheck(alpha):
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda t: normmax(t, alpha), (x,))
    assert gradcheck(lambda t: normmax(t, alpha, dim=0), (x,))


def test_gradcheck_per_row_alpha():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([[1.2], [2.0], [3.5], [6.0]], dtype=torch.float64)
    assert gradcheck(lambda t: normmax(t, alpha), (x,))


def test_masking_dtypes_and_bad_rows():
    x = torch.randn(4, 7)
    x[0, :3] = -math.inf
    x[1] = -math.inf
    x[2, 1] = math.nan
    xr = x.clone().requires_grad_(True)
    p = normmax(xr, 2.5)
    torch.testing.assert_close(p[0, 3:], normmax(x[0, 3:], 2.5))
    assert (p[0, :3] == 0).all() and (p[1] == 0).all()
    assert torch.isnan(p[2]).all() and not torch.isnan(p[[0, 1, 3]]).any()
    p[[0, 1, 3]].sum().backward()
    g = xr.grad
    assert (g[0, :3] == 0).all() and (g[1] == 0).all() and torch.isfinite(g[[0, 1, 3]]).all()
    for dt in (torch.float16, torch.bfloat16):
        y = torch.randn(3, 9) * 4
        ph = normmax(y.to(dt), 2.0)
        assert ph.dtype == dt and torch.isfinite(ph).all()
        ref = normmax(y.to(dt).float(), 2.0)  # half inputs are computed in float32
        torch.testing.assert_close(ph.float(), ref, atol=4e-3, rtol=0)


def test_alpha_one_is_the_argmax_uniform_over_ties():
    # brute force: 1/m on the m maximal entries; the α -> 1 limit (normmax(x, 1.001)); zero gradient
    inf = math.inf
    x = torch.tensor([[1.0, 1.0, 0.5, -inf], [0.3, -2.0, 0.7, 0.1], [2.0, 2.0, 2.0, 2.0], [-inf] * 4],
                     dtype=torch.float64, requires_grad=True)
    want = torch.tensor([[0.5, 0.5, 0, 0], [0, 0, 1, 0], [0.25] * 4, [0] * 4], dtype=torch.float64)
    p = normmax(x, 1.0)
    torch.testing.assert_close(p.detach(), want, rtol=0, atol=0)
    torch.testing.assert_close(normmax(x[:3].detach(), 1.001), want[:3], rtol=0, atol=1e-12)
    (g,) = torch.autograd.grad((p * torch.randn(4, 4, dtype=torch.float64)).sum(), x)
    assert torch.equal(g, torch.zeros_like(g))
    # per-row α mixing α = 1 and α > 1, along another dim
    a = torch.tensor([1.0, 3.0, 1.0, 2.0], dtype=torch.float64).reshape(1, 4)
    z = torch.randn(5, 4, dtype=torch.float64)
    got = normmax(z, a, dim=0)
    torch.testing.assert_close(got[:, 1], normmax(z[:, 1], 3.0))
    torch.testing.assert_close(got[:, 3], normmax(z[:, 3], 2.0))
    torch.testing.assert_close(got[:, [0, 2]], torch.nn.functional.one_hot(z[:, [0, 2]].argmax(0), 5).T.double())
    # NaN or +inf in a row: NaN in that row only
    bad = normmax(torch.tensor([[0.0, math.nan], [0.0, inf], [0.0, 1.0]]), 1.0)
    assert torch.isnan(bad[:2]).all() and torch.equal(bad[2], torch.tensor([0.0, 1.0]))


def test_alpha_one_loss_is_the_perceptron_loss():
    # ⟨θ, p - y⟩ + ‖y‖_1 - ‖p‖_1 = max θ - ⟨θ, y⟩ on the simplex, gradient p - y
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, generator=g).round().requires_grad_()  # ties
    y = torch.randint(0, 5, (6,), generator=g)
    soft = torch.softmax(torch.randn(6, 5, dtype=torch.float64, generator=g), -1)
    for t, ty in ((y, x.gather(1, y[:, None]).squeeze(1)), (soft, (x * soft).sum(-1))):
        loss = sa.normmax_loss(x, t, 1.0, reduction="none")
        torch.testing.assert_close(loss, x.amax(-1) - ty)
        (gx,) = torch.autograd.grad(loss.sum(), x)
        p = (x == x.amax(-1, keepdim=True)).double()
        p = p / p.sum(-1, keepdim=True)
        yd = torch.nn.functional.one_hot(t, 5).double() if t is y else t
        torch.testing.assert_close(gx, p - yd)
    # per-row α: the α = 1 rows take the perceptron loss, the others the normmax loss
    a = torch.tensor([[1.0], [2.0], [1.0], [1.5], [1.0], [4.0]], dtype=torch.float64)
    mixed = sa.normmax_loss(x, y, a, reduction="none")
    for i, ai in enumerate(a.squeeze(1).tolist()):
        torch.testing.assert_close(mixed[i], sa.normmax_loss(x[i:i + 1], y[i:i + 1], ai, reduction="none")[0])


def test_limits_and_errors():
    x = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    # α -> ∞: β -> 1, so τ becomes sparsemax's threshold and r = u^{1/(α-1)} -> 1 on its
    # support: the uniform distribution over the support of sparsemax(x)
    for z in (x, torch.randn(20, dtype=torch.float64)):
        s = (sa.sparsemax(z) > 0).to(z.dtype)
        torch.testing.assert_close(normmax(z, 1e7), s / s.sum(), atol=1e-5, rtol=0)
    # scale: the norm is homogeneous, so larger scores are sparser
    assert (normmax(10 * x, 2.0) > 0).sum() <= (normmax(x, 2.0) > 0).sum()
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        normmax(x, 0.99)
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        normmax(x.view(1, -1), torch.tensor([[0.5]]))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        normmax([1.0, 2.0])


# ----------------------------------------------------------------------------------
# the normmax loss
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.5, 2.0, 4.0])
def test_loss_value_is_the_fenchel_young_loss(alpha, rng):
    for _ in range(3):
        x = rng.normal(size=5)
        y = rng.dirichlet(np.ones(5))
        _, vb = brute_force_normmax(x, alpha)  # Ω*(x) = max <p,x> - ||p||_α
        expected = vb + np.sum(y ** alpha) ** (1 / alpha) - x @ y
        got = sa.normmax_loss(torch.tensor(x).view(1, -1), torch.tensor(y).view(1, -1), alpha)
        assert abs(float(got) - expected) < 1e-7
        c = int(rng.integers(5))
        got_idx = sa.normmax_loss(torch.tensor(x).view(1, -1), torch.tensor([c]), alpha)
        assert abs(float(got_idx) - (vb + 1 - x[c])) < 1e-7


def test_loss_gradient_zero_and_options():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    y = torch.softmax(torch.randn(4, 6, dtype=torch.float64), -1)
    assert gradcheck(lambda t: sa.normmax_loss(t, y, 2.0), (x,))
    assert gradcheck(lambda t: sa.normmax_loss(t, torch.tensor([0, 3, 5, 1]), 3.0, reduction="sum"), (x,))
    p = normmax(x.detach(), 2.0)
    assert float(sa.normmax_loss(x.detach(), p, 2.0)) < 1e-12  # zero at the prediction
    t = torch.tensor([0, -100, 5, 1])
    per = sa.normmax_loss(x, t, 2.0, reduction="none")
    assert per[1] == 0 and (per >= 0).all()
    torch.testing.assert_close(sa.normmax_loss(x, t, 2.0), per.sum() / 3)
    _, pred = sa.normmax_loss(x, t, 2.0, return_prediction=True)
    torch.testing.assert_close(pred, p)
    xm = x.detach().clone()
    xm[0, 0] = -math.inf
    assert sa.normmax_loss(xm, torch.tensor([0, 1, 2, 3]), 2.0, reduction="none")[0] == math.inf


def test_normalize_names():
    x = torch.randn(3, 8)
    torch.testing.assert_close(sa.mappings.normalize(x, "normmax", 3.0), normmax(x, 3.0))
    torch.testing.assert_close(sa.mappings.normalize(x, "normmax"), normmax(x, 2.0))
    torch.testing.assert_close(sa.mappings.normalize(x, "budget_sparsemax", 3.0), sa.budget_sparsemax(x, 3.0))


def test_modules():
    import softargmax.nn as snn

    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(snn.Normmax(3.0, dim=0)(x), normmax(x, 3.0, dim=0))
    torch.testing.assert_close(snn.BudgetSparsemax(2.5)(x), sa.budget_sparsemax(x, 2.5))
    y = torch.tensor([0, 2, 7])
    torch.testing.assert_close(snn.NormmaxLoss(4.0, reduction="sum")(x, y), sa.normmax_loss(x, y, 4.0, reduction="sum"))
    t = torch.ones(3, 8)
    torch.testing.assert_close(snn.BudgetSparsemaxLoss(2.0, multilabel=True)(x, t),
                               sa.budget_sparsemax_loss(x, t, 2.0, multilabel=True))
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        snn.Normmax(0.5)


@pytest.mark.parametrize("loss", ["normmax1", "normmax1.5", "normmax2", "budget"])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_loss_value_of_offset_float32_rows_matches_float64(loss, offset):
    """The loss value on float32 rows far from 0 equals the float64 value of the same (rounded) rows: the value is
    taken on the rows less their maximum, so ⟨θ, p⟩ - ⟨θ, y⟩ subtracts no large sums (unshifted, a row offset by
    1e4 lost 1e-3 of the normmax loss and gave a budget sparsemax loss off by 10)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 9, generator=g) + offset).float()
    x[5, 4:] = -math.inf  # a masked row part
    soft = torch.full((6, 9), 1 / 9)
    soft[5] = torch.tensor([0.25] * 4 + [0.0] * 5)
    targets = [torch.tensor([1, 2, 3, 0, 8, 2]), soft]
    if loss == "budget":
        fn, targets = (lambda t, y: sa.budget_sparsemax_loss(t, y, budget=2.0, reduction="none")), targets[1:]
    else:
        alpha = float(loss[len("normmax"):])
        fn = lambda t, y: sa.normmax_loss(t, y, alpha=alpha, reduction="none")  # noqa: E731
    for y in targets:
        got = fn(x, y)
        want = fn(x.double(), y.double() if y.is_floating_point() else y)
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5), (got, want)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 3.0, "rows"])
def test_large_offsets_keep_their_digits(alpha):
    """normmax is invariant to shifting a row, and each row is shifted by its maximum before the division by
    α' - 1: float32 rows offset by 1e4 give the float64 normmax of the unshifted rows to float32 rounding
    (dividing first lost up to 6e-4 of p), on the eager and the traceable paths, a scalar α or one α per row."""
    from softargmax.operators.normmax import normmax_graph

    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 40, generator=g, dtype=torch.float64) * 2
    x[1, 3:7] = -math.inf
    a = torch.tensor([[1.5], [2.0], [3.0], [1.2], [2.5]], dtype=torch.float64) if alpha == "rows" else alpha
    big = (x + 1e4).float()
    ref = sa.normmax(big.double() - 1e4, a)  # the float32 rows' own values, shifted back exactly in float64
    a32 = a.float() if isinstance(a, torch.Tensor) else a
    for out in (sa.normmax(big, a32), normmax_graph(big, a32, 1)):
        torch.testing.assert_close(out.double(), ref, rtol=0.0, atol=3e-6)
