"""Budget sparsemax (the capped simplex projection): against a brute-force constrained
optimizer (SciPy SLSQP), an independent bisection, finite differences, and the conventions."""

import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

import softargmax as sa
from softargmax.operators.budget import budget_sparsemax, solve_budget

BUDGETS = [1.0, 1.5, 2.0, 3.0, 4.5]


def brute_force_budget(x, budget):
    """argmin ½||p - x||² over {p in simplex, p <= 1/budget}, by SLSQP."""
    from scipy.optimize import minimize

    x = np.asarray(x, dtype=np.float64)
    k = len(x)
    cap = min(1.0, 1.0 / budget)
    res = minimize(lambda p: (0.5 * np.sum((p - x) ** 2), p - x), np.full(k, 1.0 / k), jac=True, method="SLSQP",
                   bounds=[(0.0, cap)] * k,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1, "jac": lambda p: np.ones_like(p)}],
                   options={"ftol": 1e-15, "maxiter": 2000})
    return res.x


def bisection_budget(x, budget, iters=200):
    """Independent reference: bisection on sum(clip(x - tau, 0, 1/budget)) = 1."""
    x = np.asarray(x, dtype=np.float64)
    c = 1.0 / budget
    lo, hi = x.min() - c, x.max()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if np.clip(x - mid, 0, c).sum() >= 1:
            lo = mid
        else:
            hi = mid
    return np.clip(x - 0.5 * (lo + hi), 0, c)


@pytest.mark.parametrize("budget", BUDGETS)
def test_matches_brute_force(budget, rng):
    for _ in range(4):
        x = rng.normal(size=7)
        p = budget_sparsemax(torch.tensor(x), budget).numpy()
        np.testing.assert_allclose(p, brute_force_budget(x, budget), atol=1e-7)
        assert abs(p.sum() - 1) < 1e-13 and p.max() <= 1 / budget + 1e-15
        assert (p > 0).sum() >= budget


@pytest.mark.parametrize("budget", [1.0, 2.0, 3.5, 20.0, 150.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_long_rows_against_bisection(budget, dtype, rng):
    # long rows take the pruned candidate path; a few Newton steps suffice
    x = rng.normal(size=(6, 1000)) * 2
    x[1] *= 1e-3  # nearly tied scores: many capped and free entries
    p = budget_sparsemax(torch.tensor(x, dtype=dtype), budget).double().numpy()
    ref = np.stack([bisection_budget(r, budget) for r in x])
    np.testing.assert_allclose(p, ref, atol=1e-12 if dtype == torch.float64 else 2e-6)
    sol = solve_budget(torch.tensor(x, dtype=dtype), torch.full((6, 1), budget, dtype=dtype))
    assert sol.iterations <= 20


def test_special_cases():
    x = torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(budget_sparsemax(x, 1.0), sa.sparsemax(x), atol=1e-15, rtol=0)
    torch.testing.assert_close(budget_sparsemax(x, 0.3), sa.sparsemax(x), atol=1e-15, rtol=0)  # cap > 1 never binds
    torch.testing.assert_close(budget_sparsemax(x, 8.0), torch.full_like(x, 1 / 8), atol=1e-15, rtol=0)
    # per-row budgets and any dim
    b = torch.tensor([1.0, 2.0, 2.5, 4.0, 7.0], dtype=torch.float64).view(5, 1)
    pb = budget_sparsemax(x, b)
    for i in range(5):
        torch.testing.assert_close(pb[i], budget_sparsemax(x[i], float(b[i])), atol=1e-15, rtol=0)
    torch.testing.assert_close(budget_sparsemax(x.T, b.T, dim=0), pb.T)
    # the k-subsets map of the package is budget · budget_sparsemax(x / budget)
    z = torch.tensor([0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    torch.testing.assert_close(2 * budget_sparsemax(z / 2, 2.0), torch.tensor([0, 0.125, 0.375, 0.625, 0.875],
                                                                             dtype=torch.float64))


@pytest.mark.parametrize("budget", BUDGETS)
def test_gradcheck(budget):
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda t: budget_sparsemax(t, budget), (x,))
    assert gradcheck(lambda t: budget_sparsemax(t, budget, dim=0), (x,))


def test_masking_short_rows_and_dtypes():
    x = torch.randn(5, 7)
    x[0, :3] = -math.inf
    x[1] = -math.inf
    x[2, 2] = math.nan
    x[3, 2:] = -math.inf  # 2 unmasked entries < budget 2.5: c on each
    xr = x.clone().requires_grad_(True)
    p = budget_sparsemax(xr, 2.5)
    torch.testing.assert_close(p[0, 3:], budget_sparsemax(x[0, 3:], 2.5))
    assert (p[0, :3] == 0).all() and (p[1] == 0).all()
    assert torch.isnan(p[2]).all() and not torch.isnan(p[[0, 1, 3, 4]]).any()
    torch.testing.assert_close(p[3], torch.tensor([0.4, 0.4, 0, 0, 0, 0, 0]))
    (p[[0, 1, 3, 4]] * torch.randn(4, 7)).sum().backward()
    g = xr.grad
    assert (g[0, :3] == 0).all() and (g[1] == 0).all() and (g[3] == 0).all() and torch.isfinite(g[[0, 4]]).all()
    for dt in (torch.float16, torch.bfloat16):
        y = torch.randn(3, 300) * 3
        ph = budget_sparsemax(y.to(dt), 3.0)
        assert ph.dtype == dt and torch.isfinite(ph).all()
        torch.testing.assert_close(ph.float(), budget_sparsemax(y.to(dt).float(), 3.0), atol=2e-3, rtol=0)


def test_errors():
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="budget must be finite and > 0"):
        budget_sparsemax(x, 0.0)
    with pytest.raises(ValueError, match="budget must be finite and > 0"):
        budget_sparsemax(x, torch.tensor([[1.0], [-1.0]]))
    with pytest.raises(TypeError, match="budget must be a number"):
        budget_sparsemax(x, "2")
    with pytest.raises(ValueError, match="budget of shape"):
        budget_sparsemax(x, torch.ones(2, 4) * 2)


# ----------------------------------------------------------------------------------
# the budget sparsemax loss
# ----------------------------------------------------------------------------------


def test_loss_value_and_gradient(rng):
    budget = 2.0
    for _ in range(3):
        x = rng.normal(size=6)
        labels = np.zeros(6)
        labels[rng.choice(6, size=3, replace=False)] = 1
        y = labels / labels.sum()  # within the cap 1/2
        p = brute_force_budget(x, budget)
        expected = x @ p - 0.5 * p @ p + 0.5 * y @ y - x @ y  # Ω*(x) + Ω(y) - <x, y>
        got = sa.budget_sparsemax_loss(torch.tensor(x).view(1, -1), torch.tensor(labels).view(1, -1), budget,
                                       multilabel=True)
        assert abs(float(got) - expected) < 1e-7
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    t = (torch.rand(4, 6) < 0.5).double()
    t[:, :2] = 1
    assert gradcheck(lambda z: sa.budget_sparsemax_loss(z, t, 2.0, multilabel=True), (x,))
    # B = 1: the sparsemax loss
    idx = torch.tensor([0, 3, 5, 1])
    torch.testing.assert_close(sa.budget_sparsemax_loss(x, idx, 1.0, reduction="none"),
                               sa.sparsemax_loss(x, idx, reduction="none"))
    # a one-hot target lies outside the capped simplex for B > 1: value +inf, gradient p - y
    loss = sa.budget_sparsemax_loss(x, idx, 2.0, reduction="sum")
    assert loss == math.inf
    loss.backward()
    expected = budget_sparsemax(x.detach(), 2.0) - torch.nn.functional.one_hot(idx, 6).double()
    torch.testing.assert_close(x.grad, expected)
    # zero at the prediction
    p = budget_sparsemax(x.detach(), 3.0)
    assert float(sa.budget_sparsemax_loss(x.detach(), p, 3.0)) < 1e-12


def test_long_rows_mostly_masked(rng):
    # the pruning bound comes from the block maxima; rows with few unmasked entries (some in the
    # same block) take the exact path: feasible ones are solved on their entries, short ones get c
    k, budget = 1200, 5.0
    x = torch.tensor(rng.normal(size=(4, k)))
    keep = [np.arange(6) * 100, rng.choice(k, size=6, replace=False), rng.choice(k, size=4, replace=False),
            rng.choice(k, size=400, replace=False)]
    masked = torch.full_like(x, -math.inf)
    for i, cols in enumerate(keep):
        masked[i, cols] = x[i, cols]
    p = budget_sparsemax(masked, budget)
    for i, cols in enumerate(keep):
        assert (np.delete(p[i].numpy(), cols) == 0).all()
        if len(cols) >= budget:
            np.testing.assert_allclose(p[i, cols].numpy(), bisection_budget(x[i, cols].numpy(), budget), atol=1e-12)
        else:
            np.testing.assert_allclose(p[i, cols].numpy(), 1 / budget)
