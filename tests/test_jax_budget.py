"""softargmax_jax's budget sparsemax against the PyTorch package's on the same float64 (1e-12) and float32
(1e-6) inputs, values and vector-Jacobian products, with flat rows, ``-inf`` entries, rows with fewer
finite entries than the budget and all-``-inf`` rows; the properties (sums to 1, capped at 1/B, sparsemax
for B <= 1); central finite differences; ``jit``/``vmap``; NaN rows; bad budgets."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

import softargmax as sa  # noqa: E402


def scores(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(7, 9)) * 2
    x[1, :] = 0.3                # flat
    x[2, 3] = -np.inf
    x[3, :7] = -np.inf           # two finite entries: fewer than most budgets
    x[4] = -np.inf               # fully masked
    x[5] += 1e4                  # a large offset
    return x.astype(dtype)


@pytest.mark.parametrize("budget", [0.5, 1.0, 2.0, 3.5, 9.0])
def test_budget_sparsemax_matches_pytorch(x64, budget):
    x = scores()
    v = np.random.default_rng(1).normal(size=x.shape)
    p, back = jax.vjp(lambda t: sj.budget_sparsemax(t, budget), jnp.asarray(x))
    t = torch.tensor(x, requires_grad=True)
    pt = sa.budget_sparsemax(t, budget)
    (gt,) = torch.autograd.grad(pt, t, torch.tensor(v))
    assert_close(np.asarray(p), pt.detach().numpy(), 1e-12)
    assert_close(np.asarray(back(jnp.asarray(v))[0]), gt.numpy(), 1e-12)
    p = np.asarray(p)
    assert not np.any(np.isnan(p)) and np.all(p <= 1 / budget + 1e-15) and np.all(p[4] == 0)
    feasible = np.isfinite(x).sum(-1) >= budget
    assert_close(p[feasible].sum(-1), np.ones(feasible.sum()), 1e-12)
    if budget <= 1:
        assert_close(p, np.asarray(sj.sparsemax(jnp.asarray(x))), 1e-12)


def test_budget_sparsemax_float32_axis_and_finite_differences(x64):
    x = scores(2, np.float32)
    pj = np.asarray(sj.budget_sparsemax(jnp.asarray(x.T), 2.5, axis=0)).T
    assert pj.dtype == np.float32
    assert_close(pj, sa.budget_sparsemax(torch.tensor(x), 2.5).numpy(), 1e-6)
    x = np.random.default_rng(3).normal(size=(3, 6))
    w = np.random.default_rng(4).normal(size=(3, 6))
    f = jax.jit(lambda t: jnp.sum(sj.budget_sparsemax(t, 2.5) * w))
    g = np.asarray(jax.grad(f)(jnp.asarray(x)))
    eps = 1e-7
    fd = np.array([(float(f(jnp.asarray(x + eps * e))) - float(f(jnp.asarray(x - eps * e)))) / (2 * eps)
                   for e in np.eye(x.size).reshape(x.size, *x.shape)]).reshape(x.shape)
    assert_close(g, fd, 1e-7)
    rows = jax.vmap(lambda r: sj.budget_sparsemax(r, 2.5))(jnp.asarray(x))
    assert_close(np.asarray(rows), np.asarray(sj.budget_sparsemax(jnp.asarray(x), 2.5)), 1e-15)


def test_budget_sparsemax_nan_rows_and_errors():
    x = jnp.array([[1.0, jnp.nan, 0.0], [1.0, 0.5, 0.0]])
    p = np.asarray(sj.budget_sparsemax(x, 2.0))
    assert np.all(np.isnan(p[0])) and not np.any(np.isnan(p[1]))
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="budget"):
            sj.budget_sparsemax(x, bad)
    for bad in (True, "2"):  # as the PyTorch package: not a number
        with pytest.raises(TypeError, match="budget"):
            sj.budget_sparsemax(x, bad)
