"""softargmax_jax's normmax, normmax_loss and budget_sparsemax_loss against the PyTorch package's on the same
float64 (1e-12, relative to the size of the reference) and float32 (1e-6) inputs, values and vector-Jacobian
products, with flat rows, ``-inf`` entries, a row with two finite entries, an all-``-inf`` row and a large
offset; the properties (sums to 1, the norm's scale, the argmax at α = 1, sparsemax loss for B <= 1, loss >= 0);
central finite differences; ``jit``/``vmap``; NaN rows; bad arguments."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from test_jax_budget import scores  # noqa: E402  (the same edge rows)
from test_jax_operators import assert_close  # noqa: E402

import softargmax as sa  # noqa: E402


def rel_close(a, b, tol):
    """``assert_close`` with the tolerance scaled by the reference's largest finite magnitude (>= 1)."""
    b = np.asarray(b, dtype=np.float64)
    fin = np.isfinite(b)
    scale = max(1.0, float(np.max(np.abs(b[fin]))) if fin.any() else 1.0)
    assert_close(a, b, tol * scale)


def shifted(x):
    """The rows of ``x`` (last axis) less their finite maximum: exact for a row offset by 1e4 (its entries are within a
    factor 2 of each other), and every map here is invariant to it.  The PyTorch package's normmax divides the scores
    by α' - 1 before it shifts them, which rounds the offset (2.8e-12 of the derivative at α = 1.1 in float64, 2e-4
    of p in float32, on ``scores()``' row offset by 1e4); this package shifts first."""
    m = np.max(x, -1, keepdims=True)
    return x - np.where(np.isfinite(m), m, 0)


def fd_grad(f, x, eps=1e-6):
    return np.array([(float(f(jnp.asarray(x + eps * e))) - float(f(jnp.asarray(x - eps * e)))) / (2 * eps)
                     for e in np.eye(x.size).reshape(x.size, *x.shape)]).reshape(x.shape)


# -- normmax --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.0, 1.1, 2.0, 3.0])
def test_normmax_matches_pytorch(x64, alpha):
    x = scores()
    v = np.random.default_rng(1).normal(size=x.shape)
    p, back = jax.vjp(lambda t: sj.normmax(t, alpha), jnp.asarray(x))
    t = torch.tensor(shifted(x), requires_grad=True)
    pt = sa.normmax(t, alpha)
    (gt,) = torch.autograd.grad(pt, t, torch.tensor(v))
    rel_close(np.asarray(p), pt.detach().numpy(), 1e-12)
    rel_close(np.asarray(back(jnp.asarray(v))[0]), gt.numpy(), 1e-12)
    p = np.asarray(p)
    assert not np.any(np.isnan(p)) and np.all(p >= 0) and np.all(p[4] == 0) and np.all(p[~np.isfinite(x)] == 0)
    live = np.isfinite(x).any(-1)
    assert_close(p[live].sum(-1), np.ones(live.sum()), 1e-12)
    assert_close(p[1], np.full(9, 1 / 9), 1e-15)  # a flat row: uniform


def test_normmax_float32_axis_and_scale(x64):
    x = scores(2, np.float32)
    pj = np.asarray(sj.normmax(jnp.asarray(x.T), 1.7, axis=0)).T
    assert pj.dtype == np.float32
    assert_close(pj, sa.normmax(torch.tensor(shifted(x)), 1.7).numpy(), 1e-6)
    # the norm is homogeneous: normmax(c x) gets sparser as c grows, and is the argmax at alpha = 1
    z = jnp.array([1.0, 0.8, -1.0, 0.5])
    nnz = [int(np.sum(np.asarray(sj.normmax(c * z, 2.0)) > 0)) for c in (0.1, 1.0, 10.0)]
    assert nnz == sorted(nnz, reverse=True) and nnz[0] > nnz[-1] == 1
    assert_close(np.asarray(sj.normmax(jnp.array([[2.0, 2.0, 1.0, 2.0]]), 1.0)), np.array([[1, 1, 0, 1]]) / 3, 0)


def test_normmax_closed_form_alpha2(x64):
    # alpha = 2, support {1, 2}: u = x - tau with u1^2 + u2^2 = 1 (the 2-norm), p = u / sum u
    x = np.array([1.0, 0.8, -1.0])
    tau = ((x[0] + x[1]) - np.sqrt(2 - (x[0] - x[1]) ** 2)) / 2
    u = np.maximum(x - tau, 0)
    assert_close(np.asarray(sj.normmax(jnp.asarray(x), 2.0)), u / u.sum(), 1e-15)


@pytest.mark.parametrize("alpha", [2.5])
def test_normmax_finite_differences_jit_vmap(x64, alpha):
    x = np.random.default_rng(3).normal(size=(3, 6))
    w = np.random.default_rng(4).normal(size=(3, 6))
    f = jax.jit(lambda t: jnp.sum(sj.normmax(t, alpha) * w))
    assert_close(np.asarray(jax.grad(f)(jnp.asarray(x))), fd_grad(f, x), 1e-7)
    rows = jax.vmap(lambda r: sj.normmax(r, alpha))(jnp.asarray(x))
    assert_close(np.asarray(rows), np.asarray(sj.normmax(jnp.asarray(x), alpha)), 1e-15)
    # forward mode equals reverse mode (the Jacobian is symmetric)
    J = np.asarray(jax.jacfwd(lambda r: sj.normmax(r, alpha))(jnp.asarray(x[0])))
    assert_close(J, np.asarray(jax.jacrev(lambda r: sj.normmax(r, alpha))(jnp.asarray(x[0]))), 1e-14)
    assert_close(J, J.T, 1e-14)


def test_normmax_nan_rows_and_errors():
    x = jnp.array([[1.0, jnp.nan, 0.0], [1.0, 0.5, 0.0], [jnp.inf, 0.0, 0.0]])
    for alpha in (1.0, 2.0):
        p = np.asarray(sj.normmax(x, alpha))
        g = np.asarray(jax.grad(lambda t: sj.normmax(t, alpha)[:, 0].sum())(x))
        assert np.all(np.isnan(p[0])) and np.all(np.isnan(p[2])) and not np.any(np.isnan(p[1]))
        assert np.all(np.isnan(g[0])) and np.all(np.isnan(g[2])) and not np.any(np.isnan(g[1]))
    # budget_sparsemax's reverse mode too (its NaN rows had a zero gradient)
    g = np.asarray(jax.grad(lambda t: sj.budget_sparsemax(t, 2.0)[:, 0].sum())(x))
    assert np.all(np.isnan(g[0])) and np.all(np.isnan(g[2])) and not np.any(np.isnan(g[1]))
    for bad in (0.5, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            sj.normmax(x, bad)
    for bad in (True, "2"):  # as the PyTorch package: not a number
        with pytest.raises(TypeError, match="alpha"):
            sj.normmax(x, bad)
    with pytest.raises(TypeError, match="x"):
        sj.normmax(jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match="axis"):
        sj.normmax(x, 2.0, axis=2)


# -- normmax loss ---------------------------------------------------------------------------------------------


def labels_int():
    y = np.random.default_rng(5).integers(0, 9, size=7)
    y[3] = 8        # on a finite entry of the row with two
    y[4] = -100     # ignored (the fully masked row)
    y[2] = 3        # on a masked entry: +inf
    return y


@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_normmax_loss_matches_pytorch(x64, alpha):
    x = scores()
    y = labels_int()
    soft = np.random.default_rng(6).random(size=x.shape) * np.isfinite(x)
    soft[4] = 1.0
    soft /= soft.sum(-1, keepdims=True)
    multi = (np.random.default_rng(7).random(size=x.shape) < 0.4).astype(np.int64)
    multi[:, 7:] = 1
    w = np.random.default_rng(8).random(size=9) + 0.5
    for lab, kw in ((y, {"label_smoothing": 0.1, "weight": w}), (soft, {}), (multi, {"multilabel": True})):
        kw_t = {k: torch.tensor(v) if k == "weight" else v for k, v in kw.items()}
        l, back = jax.vjp(lambda t: sj.normmax_loss(t, jnp.asarray(lab), alpha, **kw), jnp.asarray(x))
        t = torch.tensor(x, requires_grad=True)
        lt = sa.normmax_loss(t, torch.tensor(lab), alpha, reduction="none", **kw_t)
        (gt,) = torch.autograd.grad(lt, t, torch.ones_like(lt))
        # label smoothing: over the classes that are not masked here, over all of them in PyTorch
        rows = np.isfinite(x).all(-1) if "label_smoothing" in kw else np.ones(7, bool)
        rel_close(np.asarray(l)[rows], lt.detach().numpy()[rows], 1e-12)
        rel_close(np.asarray(back(jnp.ones(7))[0])[rows], gt.numpy()[rows], 1e-12)
    l = np.asarray(sj.normmax_loss(jnp.asarray(x), jnp.asarray(y), alpha))
    assert l[2] == np.inf and l[4] == 0 and np.all(l[np.isfinite(l)] >= -1e-12)


def test_normmax_loss_float32_axis_and_zero(x64):
    x = scores(9, np.float32)
    y = np.random.default_rng(10).integers(0, 9, size=7)
    y[2], y[3] = 0, 8
    lj = sj.normmax_loss(jnp.asarray(x.T), jnp.asarray(y), 1.5, axis=0)
    assert lj.dtype == jnp.float32
    lt = sa.normmax_loss(torch.tensor(x), torch.tensor(y), 1.5, reduction="none")
    rel_close(np.asarray(lj), lt.numpy(), 1e-6)
    # zero exactly when the prediction is the target, e.g. a clear winner
    assert float(sj.normmax_loss(jnp.array([0.0, 9.0, 0.0]), jnp.array(1))) == 0.0


@pytest.mark.parametrize("alpha", [3.0])
def test_normmax_loss_gradient_is_p_minus_y_and_finite_differences(x64, alpha):
    x = np.random.default_rng(11).normal(size=(3, 5))
    y = jnp.array([0, 3, 4])
    f = jax.jit(lambda t: jnp.sum(sj.normmax_loss(t, y, alpha)))
    g = np.asarray(jax.grad(f)(jnp.asarray(x)))
    assert_close(g, fd_grad(f, x), 1e-7)
    assert_close(g, np.asarray(sj.normmax(jnp.asarray(x), alpha)) - np.eye(5)[np.asarray(y)], 1e-14)
    per_row = jax.vmap(lambda r, c: sj.normmax_loss(r, c, alpha))(jnp.asarray(x), y)
    assert_close(np.asarray(per_row), np.asarray(sj.normmax_loss(jnp.asarray(x), y, alpha)), 1e-15)


# -- budget sparsemax loss ------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0.5, 3.5])
def test_budget_sparsemax_loss_matches_pytorch(x64, budget):
    x = scores(12)
    multi = (np.random.default_rng(13).random(size=x.shape) < 0.5).astype(np.int64)
    multi[:, 5:] = 1            # at least 4 labels, the finite ones of row 3 among them
    soft = np.isfinite(x) * (1.0 + 0.2 * np.random.default_rng(14).random(size=x.shape))
    soft[4] = 1.0
    soft /= soft.sum(-1, keepdims=True)  # every entry <= 1/5 where at least 5 entries are finite
    y = np.random.default_rng(15).integers(0, 9, size=7)
    y[4] = -100
    for lab, kw in ((multi, {"multilabel": True}), (soft, {}), (y, {"label_smoothing": 0.3})):
        l, back = jax.vjp(lambda t: sj.budget_sparsemax_loss(t, jnp.asarray(lab), budget, **kw), jnp.asarray(x))
        t = torch.tensor(x, requires_grad=True)
        lt = sa.budget_sparsemax_loss(t, torch.tensor(lab), budget, reduction="none", **kw)
        (gt,) = torch.autograd.grad(lt, t, torch.ones_like(lt))
        rows = np.isfinite(x).all(-1) if "label_smoothing" in kw else np.ones(7, bool)  # as above
        rel_close(np.asarray(l)[rows], lt.detach().numpy()[rows], 1e-12)
        rel_close(np.asarray(back(jnp.ones(7))[0])[rows], gt.numpy()[rows], 1e-12)
    l = np.asarray(sj.budget_sparsemax_loss(jnp.asarray(x), jnp.asarray(y), budget))
    assert np.all(np.isinf(l[[0, 1, 2, 5, 6]])) == (budget > 1)  # a class index is above the cap 1/B > 1
    if budget <= 1:
        assert_close(l, np.asarray(sj.sparsemax_loss(jnp.asarray(x), jnp.asarray(y))), 1e-10)


def test_budget_sparsemax_loss_float32_gradient_and_finite_differences(x64):
    x = scores(16, np.float32)
    multi = np.ones(x.shape, np.int64)
    multi[:, :3] = 0
    lj = sj.budget_sparsemax_loss(jnp.asarray(x.T), jnp.asarray(multi.T), 2.5, axis=0, multilabel=True)
    assert lj.dtype == jnp.float32
    lt = sa.budget_sparsemax_loss(torch.tensor(x), torch.tensor(multi), 2.5, multilabel=True,
                                  reduction="none")
    rel_close(np.asarray(lj), lt.numpy(), 1e-6)
    x = np.random.default_rng(17).normal(size=(3, 6))
    lab = jnp.array([[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1], [1, 0, 1, 0, 1, 0]])
    f = jax.jit(lambda t: jnp.sum(sj.budget_sparsemax_loss(t, lab, 2.5, multilabel=True)))
    g = np.asarray(jax.grad(f)(jnp.asarray(x)))
    assert_close(g, fd_grad(f, x), 1e-7)
    y = np.asarray(lab) / np.asarray(lab).sum(-1, keepdims=True)
    assert_close(g, np.asarray(sj.budget_sparsemax(jnp.asarray(x), 2.5)) - y, 1e-14)
    per_row = jax.vmap(lambda r, c: sj.budget_sparsemax_loss(r, c, 2.5, multilabel=True))(jnp.asarray(x), lab)
    assert_close(np.asarray(per_row),
                 np.asarray(sj.budget_sparsemax_loss(jnp.asarray(x), lab, 2.5, multilabel=True)), 1e-15)


def test_losses_nan_rows_and_errors():
    x = jnp.array([[1.0, jnp.nan, 0.0], [1.0, 0.5, 0.0]])
    lab = jnp.array([[1, 1, 0], [1, 1, 0]])
    for loss in (sj.normmax_loss(x, jnp.array([0, 0]), 2.0), sj.normmax_loss(x, jnp.array([0, 0]), 1.0),
                 sj.budget_sparsemax_loss(x, lab, 2.0, multilabel=True)):
        loss = np.asarray(loss)
        assert np.isnan(loss[0]) and np.isfinite(loss[1])
    for bad in (0.5, float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            sj.normmax_loss(x, jnp.array([0, 0]), bad)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="budget"):
            sj.budget_sparsemax_loss(x, lab, bad, multilabel=True)
    with pytest.raises(TypeError, match="alpha"):
        sj.normmax_loss(x, jnp.array([0, 0]), True)
    with pytest.raises(TypeError, match="budget"):
        sj.budget_sparsemax_loss(x, lab, True, multilabel=True)
    with pytest.raises(ValueError, match="labels"):
        sj.normmax_loss(x, jnp.array([0, 3]))
    with pytest.raises(ValueError, match="labels"):
        sj.budget_sparsemax_loss(x, jnp.array([[0.5, 0.6, 0.0], [1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="label_smoothing"):
        sj.normmax_loss(x, jnp.array([0, 0]), label_smoothing=2.0)
    with pytest.raises(TypeError, match="logits"):
        sj.budget_sparsemax_loss(jnp.array([[1, 2]]), jnp.array([0]))


def test_where_masks_as_minus_inf_and_half_precision():
    x = jnp.array([[1.0, 0.8, -1.0, 0.3], [0.0, 2.0, 0.5, 0.1]])
    w = jnp.array([[True, True, False, True], [True, False, True, True]])
    xm = jnp.where(w, x, -jnp.inf)
    lab = jnp.array([[1, 1, 0, 1], [1, 0, 1, 1]])
    for f in (lambda t, **k: sj.normmax_loss(t, jnp.array([0, 2]), 1.5, **k),
              lambda t, **k: sj.budget_sparsemax_loss(t, lab, 2.0, multilabel=True, **k)):
        assert_close(np.asarray(f(x, where=w)), np.asarray(f(xm)), 0)
        assert_close(np.asarray(jax.grad(lambda t: f(t, where=w).sum())(x)),
                     np.asarray(jax.grad(lambda t: f(t).sum())(xm)), 0)
    p = sj.normmax(x.astype(jnp.float16), 1.5)
    assert p.dtype == jnp.float16
    assert_close(np.asarray(p), np.asarray(sj.normmax(x, 1.5)), 1e-3)
