"""softargmax_jax's operators against the PyTorch package on the same inputs (values and gradients, float64 to
1e-12 and float32 to 1e-6), against finite differences, and at the edges (masked rows, NaN, large offsets,
α near 1 and large α, half precision); under jit and vmap; and its argument errors."""

import math
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402

import softargmax as sa  # noqa: E402

DIVERGENCES = [
    ("kl", {}),
    ("reverse_kl", {}),
    ("jeffrey", {}),
    ("jensen_shannon", {}),
    ("squared_hellinger", {}),
    ("chi_square", {}),
    ("reverse_chi_square", {}),
    ("alpha", {"alpha": 1.5}),
    ("alpha", {"alpha": 1.1}),
    ("alpha", {"alpha": 2.5}),
    ("alpha", {"alpha": 0.5}),
]


def rows(seed=0, shape=(5, 7), dtype=np.float64):
    """Random rows with a tie, a flat row and a masked entry: the cases a solver can get wrong."""
    x = np.random.default_rng(seed).normal(size=shape) * 1.5
    x[1, :2] = x[1, 2]  # a tie
    x[2] = 0.25  # flat
    x[3, 4] = -np.inf  # masked
    return x.astype(dtype)


def to_torch(a):
    return torch.tensor(np.asarray(a), requires_grad=True)


def vjp_jax(f, *args, v):
    """``f(*args)`` and its vector-Jacobian product with ``v``, under ``jit`` (one compilation, where the eager
    calls compiled each primitive of the solver's loop and of its backward: a fifth of this file's time)."""
    def run(args, v):
        out, back = jax.vjp(f, *args)
        return out, back(v)
    return jax.jit(run)(args, jnp.asarray(v))


def vjp_torch(f, *args, v):
    ts = [to_torch(a) for a in args]
    out = f(*ts)
    grads = torch.autograd.grad(out, ts, torch.tensor(v))
    return out.detach().numpy(), [g.numpy() for g in grads]


def assert_close(a, b, tol):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.array_equal(np.isnan(a), np.isnan(b)), (a, b)
    fin = ~np.isnan(a) & (a != b)  # equal entries (infinities included) need no difference
    err = np.max(np.abs(a[fin] - b[fin])) if fin.any() else 0.0
    assert err <= tol, f"max |diff| = {err:.3g} > {tol:g}"


# -- against PyTorch, float64 and float32 ------------------------------------------------------------------


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-6)])
def test_sparsemax_entmax15_match_pytorch(x64, dtype, tol):
    x = rows(dtype=dtype)
    v = np.random.default_rng(1).normal(size=x.shape).astype(dtype)
    for fj, ft in [(sj.sparsemax, sa.sparsemax), (sj.entmax15, sa.entmax15)]:
        pj, (gj,) = vjp_jax(fj, jnp.asarray(x), v=v)
        pt, (gt,) = vjp_torch(ft, x, v=v)
        assert pj.dtype == dtype
        assert_close(pj, pt, tol)
        assert_close(gj, gt, tol)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 1.0 + 1e-6, 1.3, 2.0, 2.5, 4.0])
def test_entmax_float_alpha_matches_pytorch(x64, alpha):
    x = rows()
    v = np.random.default_rng(2).normal(size=x.shape)
    pj, (gj,) = vjp_jax(lambda t: sj.entmax(t, alpha), jnp.asarray(x), v=v)
    pt, (gt,) = vjp_torch(lambda t: sa.entmax(t, alpha), x, v=v)
    assert_close(pj, pt, 1e-12)
    assert_close(gj, gt, 1e-12)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-6)])
def test_entmax_per_row_alpha_and_its_gradient_match_pytorch(x64, dtype, tol):
    x = rows(dtype=dtype)
    alpha = np.array([[1.5], [1.0 + 1e-4], [2.0], [3.0], [0.7]], dtype=dtype)
    v = np.random.default_rng(3).normal(size=x.shape).astype(dtype)
    pj, (gxj, gaj) = vjp_jax(sj.entmax, jnp.asarray(x), jnp.asarray(alpha), v=v)
    pt, (gxt, gat) = vjp_torch(sa.entmax, x, alpha, v=v)
    assert_close(pj, pt, tol)
    assert_close(gxj, gxt, tol)
    # the α-gradient is computed in float64 by PyTorch whatever the input; in float32 here
    assert_close(gaj, gat, tol if dtype == np.float64 else 1e-5)


@pytest.mark.parametrize("name,params", DIVERGENCES)
def test_f_softargmax_with_q_and_temperature_matches_pytorch(x64, name, params):
    x = rows()
    q = np.random.default_rng(4).uniform(0.5, 2.0, size=x.shape[-1:])
    v = np.random.default_rng(5).normal(size=x.shape)
    fj = lambda t, qq: sj.f_softargmax(t, name, q=qq, temperature=0.7, **params)
    ft = lambda t, qq: sa.f_softargmax(t, name, q=qq, temperature=0.7, **params)
    pj, (gxj, gqj) = vjp_jax(fj, jnp.asarray(x), jnp.asarray(q), v=v)
    pt, (gxt, gqt) = vjp_torch(ft, x, q, v=v)
    assert_close(pj, pt, 1e-12)
    assert_close(gxj, gxt, 1e-12)
    assert_close(gqj, gqt, 1e-11)
    # float32 against PyTorch's float32
    p32 = sj.f_softargmax(jnp.asarray(x, jnp.float32), name, q=jnp.asarray(q, jnp.float32), temperature=0.7,
                          **params)
    assert p32.dtype == jnp.float32
    assert_close(p32, sa.f_softargmax(torch.tensor(x, dtype=torch.float32), name,
                                      q=torch.tensor(q, dtype=torch.float32), temperature=0.7, **params), 1e-6)


@pytest.mark.parametrize("name,params", DIVERGENCES)
def test_f_softmax_value_and_gradients_match_pytorch(x64, name, params):
    x = rows()
    q = np.random.default_rng(6).uniform(0.5, 2.0, size=x.shape[-1:])
    v = np.random.default_rng(7).normal(size=x.shape[:-1])
    pj, (gxj, gqj) = vjp_jax(lambda t, qq: sj.f_softmax(t, name, q=qq, temperature=1.3, **params),
                             jnp.asarray(x), jnp.asarray(q), v=v)
    pt, (gxt, gqt) = vjp_torch(lambda t, qq: sa.f_softmax(t, name, q=qq, temperature=1.3, **params), x, q, v=v)
    assert_close(pj, pt, 1e-12)
    assert_close(gxj, gxt, 1e-12)
    assert_close(gqj, gqt, 1e-11)


@pytest.mark.parametrize("name,params", [("kl", {}), ("chi_square", {}), ("reverse_kl", {}), ("jensen_shannon", {}),
                                         ("squared_hellinger", {}), ("alpha", {"alpha": 1.5})])
def test_f_sigmoid_f_softplus_match_pytorch(x64, name, params):
    h = 1e-6
    s = np.array([-30.0, -2.0, -0.3, 0.4, 3.0, 25.0, np.inf, -np.inf, 0.0, h, -h])
    q = (0.7, 1.6)
    v = np.ones_like(s)  # elementwise functions: the vector-Jacobian product is the derivative
    for fj, ft in [(sj.f_sigmoid, sa.f_sigmoid), (sj.f_softplus, sa.f_softplus)]:
        pj, (gj,) = vjp_jax(lambda t: fj(t, name, q=q, temperature=0.8, **params), jnp.asarray(s), v=v)
        pt, (gt,) = vjp_torch(lambda t: ft(t, name, q=q, temperature=0.8, **params), s, v=v)
        assert_close(pj, pt, 1e-12)
        # s = 0 exactly: PyTorch's f_sigmoid takes the derivative of |s| there as 0 (its gradient is 0 at
        # s = 0); the derivative there is checked against a central difference instead
        assert_close(np.asarray(gj)[:8], gt[:8], 1e-12)
        pj = np.asarray(pj)
        assert float(gj[8]) == pytest.approx((pj[9] - pj[10]) / (2 * h), rel=1e-6, abs=1e-9)


def test_alpha_relu_matches_pytorch_with_array_tau(x64):
    x = rows()
    x[3, 4] = -2.0
    tau = np.random.default_rng(9).normal(size=(5, 1)) * 0.3
    v = np.random.default_rng(10).normal(size=x.shape)
    for alpha in (1.5, 2.0, 3.0, 1.2):
        pj, (gxj, gtj) = vjp_jax(lambda t, u: sj.alpha_relu(t, alpha, u), jnp.asarray(x), jnp.asarray(tau), v=v)
        pt, (gxt, gtt) = vjp_torch(lambda t, u: sa.alpha_relu(t, alpha, u), x, tau, v=v)
        assert_close(pj, pt, 1e-12)
        assert_close(gxj, gxt, 1e-12)
        assert_close(gtj, gtt, 1e-12)


def test_long_rows_start_from_their_block_maxima_and_match_pytorch(x64):
    """Rows of at least 1024 entries start Newton's method from the threshold of their blocks' maxima."""
    x = np.random.default_rng(16).normal(size=(4, 2050)) * 2
    x[1] = 0.5  # flat
    x[2, ::3] = -np.inf
    x[3, :2049] = -np.inf  # one entry left
    v = np.random.default_rng(17).normal(size=x.shape)
    for fj, ft in [(sj.sparsemax, sa.sparsemax), (sj.entmax15, sa.entmax15),
                   (lambda t: sj.entmax(t, 1.3), lambda t: sa.entmax(t, 1.3)),
                   (lambda t: sj.f_softargmax(t, "jensen_shannon"), lambda t: sa.f_softargmax(t, "jensen_shannon"))]:
        pj, (gj,) = vjp_jax(fj, jnp.asarray(x), v=v)
        pt, (gt,) = vjp_torch(ft, x, v=v)
        assert_close(pj, pt, 1e-12)
        assert_close(gj, gt, 1e-12)


DENSE = ["reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "reverse_chi_square"]


@pytest.mark.parametrize("name", DENSE)
def test_dense_generators_start_from_jensens_bound_and_match_pytorch(x64, name):
    """With q = 1 the dense generators start Newton's method from Jensen's lower bound of the root (Jeffrey with
    Fritsch's Lambert W): short and long rows, masked entries, one finite entry, a large offset, a flat row,
    against PyTorch in float64 and float32."""
    from softargmax_jax import _solver
    from softargmax_jax.divergences import get_divergence

    rng = np.random.default_rng(18)
    for shape in [(6, 7), (6, 1100), (3, 1500), (3, 1501)]:
        x = rng.normal(size=shape) * 3
        if shape[0] == 6:
            x[1] = 0.5
            x[2, ::3] = -np.inf
            x[3, 1:] = -np.inf
            x[4] += 300
            x[5] *= 30
        elif shape[1] == 1500:
            x[1, :700] = -np.inf
            x[2] += 1e4
        else:  # long rows, every start at or above 999 (Jeffrey: every L = 1 + τ - c at least 1000)
            x[1] *= 0.01 / 3
            x[2] += 1e4
        v = rng.normal(size=shape)
        pj, (gj,) = vjp_jax(lambda t: sj.f_softargmax(t, name), jnp.asarray(x), v=v)
        pt, (gt,) = vjp_torch(lambda t: sa.f_softargmax(t, name), x, v=v)
        assert_close(pj, pt, 1e-12)
        assert_close(gj, gt, 1e-12)
        x32 = x.astype(np.float32)
        assert_close(sj.f_softargmax(jnp.asarray(x32), name), sa.f_softargmax(torch.tensor(x32), name), 2e-6)
        # the start is a lower bound of the root (within rounding)
        div = get_divergence(name)
        c, _, _, shift = _solver.shift_rows(jnp.asarray(x))
        lo, hi = _solver._bounds(div, c, None, shape[1], None)
        start = _solver._jensen_start(div, c, lo, hi, None)
        tau = _solver.solve(jnp.asarray(x), div).tau - shift
        assert np.all(np.asarray(start) <= np.asarray(tau) + 1e-12 * (1 + np.abs(np.asarray(tau))))


def test_jeffrey_lambert_w_against_a_50_digit_reference(x64):
    mpmath = pytest.importorskip("mpmath")
    from softargmax_jax.divergences import _inverse_lambertw_exp_above_one, _lambertw_exp_above_one, _lambertw_exp_fast

    L = np.concatenate([[-700.0, -40.0, -30.0, -29.9, -5.0, 0.0, 0.5, 0.999, 1.0, 1.5, 2.0, 1e3, 1e30, 1e300],
                        np.linspace(-10, 10, 41), np.geomspace(1, 1e8, 30)])

    known: dict = {}  # each value evaluated once at 50 digits

    def reference(values):
        with mpmath.workdps(50):
            for v in map(float, values):
                if v not in known:
                    known[v] = float(mpmath.lambertw(mpmath.exp(mpmath.mpf(v))))
        return np.array([known[float(v)] for v in values])

    w = np.asarray(_lambertw_exp_fast(jnp.asarray(L)))
    assert np.max(np.abs(w / reference(L) - 1)) <= 4.5e-16
    L32 = L[(L > -80) & (L < 1e30)].astype(np.float32)  # W(e^L) a normal float32 number
    w32 = np.asarray(_lambertw_exp_fast(jnp.asarray(L32)), np.float64)
    assert np.max(np.abs(w32 / reference(L32) - 1)) <= 2e-7
    edges = np.asarray(_lambertw_exp_fast(jnp.asarray([np.inf, -np.inf, np.nan])))
    assert edges[0] == np.inf and edges[1] == 0 and np.isnan(edges[2])
    # the solver's W for L >= 1 (no reference measure): its start switches at L = 4; one Fritsch step in float32
    L1 = np.concatenate([L[L >= 1], [1.0 + 1e-9, 3.99, 4.0, 4.01], np.linspace(1, 8, 57)])
    ref1 = reference(L1)
    assert np.max(np.abs(np.asarray(_lambertw_exp_above_one(jnp.asarray(L1))) / ref1 - 1)) <= 4.5e-16
    keep = L1 < 1e30
    w1 = np.asarray(_lambertw_exp_above_one(jnp.asarray(L1[keep].astype(np.float32))), np.float64)
    assert np.max(np.abs(w1 / reference(L1[keep].astype(np.float32)) - 1)) <= 1.2e-7
    assert float(_lambertw_exp_above_one(jnp.asarray(np.inf))) == np.inf
    # Jeffrey's g = 1/W(e^L) for L >= 1 as the solver evaluates it (one fraction, its own log), to float32's largest L
    g1 = np.asarray(_inverse_lambertw_exp_above_one(jnp.asarray(L1)))
    assert np.max(np.abs(g1 * ref1 - 1)) <= 4.5e-16
    L2 = np.concatenate([L1[keep], [1e37, 5e37]]).astype(np.float32)  # g a normal float32 number
    g2 = np.asarray(_inverse_lambertw_exp_above_one(jnp.asarray(L2)), np.float64)
    assert np.max(np.abs(g2 * reference(L2) - 1)) <= 2e-7
    assert 0 <= float(_inverse_lambertw_exp_above_one(jnp.asarray(np.float32(3e38)))) <= np.finfo(np.float32).tiny
    assert float(_inverse_lambertw_exp_above_one(jnp.asarray(np.float32(np.inf)))) == 0.0


def test_log_at_least_one_within_float32_rounding():
    """The solver's own log for x >= 1 (float32): within 1.2 units in the last place of the float64 log, as
    jnp.log, from 1 to float32's largest number."""
    from softargmax_jax.divergences import _log_at_least_one

    x = np.concatenate([np.linspace(1, 3, 200001), np.geomspace(3, 3.4e38, 100001)]).astype(np.float32)
    ref = np.log(x.astype(np.float64))
    ours = np.asarray(_log_at_least_one(jnp.asarray(x)), np.float64)
    assert ours[0] == 0.0
    ulp = np.spacing(ref[1:].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(ours[1:] - ref[1:]) / ulp) <= 1.2


# -- finite differences, jvp = vjp, jit and vmap -------------------------------------------------------------


@pytest.mark.parametrize("fn", [
    lambda x: sj.f_softargmax(x, "jeffrey", temperature=0.5, q=jnp.abs(x[0]) + 0.5),
    lambda x: sj.entmax(x[:, :3], jnp.abs(x[:, 3:4]) + 1.2),
])
def test_gradients_against_finite_differences(x64, fn):
    from jax.test_util import check_grads

    x = jnp.asarray(np.random.default_rng(11).normal(size=(3, 6)))
    check_grads(fn, (x,), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


def test_jit_vmap_and_axis(x64):
    x = jnp.asarray(np.random.default_rng(12).normal(size=(4, 3, 6)))
    f = jax.jit(lambda t: sj.entmax(t, 1.7, axis=1))
    ref = np.moveaxis(np.asarray(sj.entmax(jnp.moveaxis(x, 1, -1), 1.7)), -1, 1)
    assert_close(f(x), ref, 1e-14)
    assert_close(jax.vmap(lambda t: sj.entmax(t, 1.7, axis=0))(x), ref, 1e-14)
    g = jax.jit(jax.grad(lambda t: sj.sparsemax(t)[..., 0].sum()))(x)
    assert_close(g, jax.grad(lambda t: sj.sparsemax(t)[..., 0].sum())(x), 1e-14)


# -- properties ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,params", DIVERGENCES)
def test_properties_sum_shift_argmax(x64, name, params):
    x = jnp.asarray(np.random.default_rng(13).normal(size=(6, 9)) * 2)
    p = sj.f_softargmax(x, name, **params)
    assert_close(p.sum(-1), np.ones(6), 1e-13)
    assert bool(jnp.all(p >= 0))
    assert_close(sj.f_softargmax(x + 1e4, name, **params), p, 1e-10)
    assert np.array_equal(np.argmax(p, -1), np.argmax(x, -1))


# -- edges -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [sj.sparsemax, sj.entmax15, lambda t: sj.entmax(t, 1.25),
                                lambda t: sj.entmax(t, 3.0), lambda t: sj.f_softargmax(t, "jensen_shannon"),
                                lambda t: sj.f_softargmax(t, "kl", q=jnp.array([1.0, 2.0, 1.0, 1.0])),
                                lambda t: sj.f_softargmax(t, "jeffrey"),
                                lambda t: sj.f_softargmax(t, "jeffrey", q=jnp.array([1.0, 2.0, 1.0, 1.0]))])
def test_masked_rows_nan_rows_and_gradients(fn):
    x = jnp.array([[1.0, -jnp.inf, 0.5, 0.2], [-jnp.inf] * 4, [0.3, jnp.nan, 0.1, 0.0], [2.0, 1.0, 0.0, -1.0]])
    p = fn(x)
    assert bool(jnp.all(p[0, 1] == 0)) and bool(jnp.all(p[1] == 0))
    assert bool(jnp.all(jnp.isnan(p[2]))) and not bool(jnp.any(jnp.isnan(p[jnp.array([0, 1, 3])])))
    g = jax.grad(lambda t: (fn(t)[jnp.array([0, 1, 3])] * jnp.arange(4.0)).sum())(x)
    assert not bool(jnp.any(jnp.isnan(g[jnp.array([0, 1, 3])])))
    assert bool(jnp.all(g[1] == 0)) and float(g[0, 1]) == 0.0


@pytest.mark.parametrize("fn", [sj.sparsemax, sj.entmax15, lambda t: sj.entmax(t, 1.25)]
                         + [(lambda n: lambda t: sj.f_softargmax(t, n))(n) for n in
                            ("jensen_shannon", "jeffrey", "reverse_kl", "squared_hellinger", "reverse_chi_square")])
def test_nan_propagates_on_long_rows(fn):
    """A NaN anywhere in a long row (where XLA's CPU maximum can skip it) makes the row NaN, and only it: among
    finite scores, in a row of -inf and NaN (whose maximum XLA may then take as -inf) and in a row all NaN; a row
    all -inf gives zeros."""
    x = np.random.default_rng(21).normal(size=(7, 4100)).astype(np.float32)
    x[0, 0], x[1, 3], x[2, -1] = np.nan, np.nan, np.nan
    x[3], x[3, 100] = -np.inf, np.nan
    x[4] = np.nan
    x[5] = -np.inf
    p = np.asarray(fn(jnp.asarray(x)))
    assert np.isnan(p[:5]).all() and (p[5] == 0).all() and not np.isnan(p[6]).any()


def test_jeffrey_does_not_iterate_on_a_masked_or_nan_row(monkeypatch):
    """Jeffrey's loop carries its evaluations (g masked as the solver returns p): a row that is entirely -inf or
    NaN is done before the loop, instead of iterating to max_iter on the masked sum (which is 0 there): the rows
    take as many evaluations of W with those rows as without them."""
    from softargmax_jax import divergences

    calls = []
    evaluate = divergences._JeffreyAboveOne.g_and_gp_rows

    def counted(self, c, tau, state):
        jax.debug.callback(lambda: calls.append(1))
        return evaluate(self, c, tau, state)

    monkeypatch.setattr(divergences._JeffreyAboveOne, "g_and_gp_rows", counted)
    x = np.random.default_rng(3).normal(size=(4, 300)).astype(np.float32) * 3
    jeffrey = jax.jit(lambda t: sj.f_softargmax(t, "jeffrey"))
    jax.block_until_ready(jeffrey(jnp.asarray(x[[0, 3]])))
    finite_rows = len(calls)
    x[1], x[2, 7] = -np.inf, np.nan
    p = np.asarray(jeffrey(jnp.asarray(x)))
    assert 1 <= finite_rows <= 3 and len(calls) - finite_rows == finite_rows, (finite_rows, len(calls))
    assert np.allclose(p[[0, 3]].sum(-1), 1, atol=1e-6) and (p[1] == 0).all() and np.isnan(p[2]).all()


def test_f_softmax_of_masked_row_is_minus_inf():
    v = sj.f_softmax(jnp.array([[-jnp.inf, -jnp.inf], [0.0, -jnp.inf]]), "chi_square")
    assert float(v[0]) == -math.inf and float(v[1]) == 0.0  # one class left: max_p <p, x> - f(1) = 0


def test_large_offsets_alpha_near_one_and_large_alpha(x64):
    x = jnp.asarray(np.random.default_rng(14).normal(size=(3, 50)))
    assert_close(sj.entmax15(x + 1e6), sj.entmax15(x), 1e-9)
    assert_close(sj.entmax(x, 1.0 + 1e-7), jax.nn.softmax(x), 1e-6)
    x32 = x.astype(jnp.float32)
    assert_close(sj.entmax(x32, 1.0 + 1e-6), jax.nn.softmax(x32), 1e-5)
    # flat rows at large α: every entry 1/k exactly to rounding (the entmax variable)
    flat = jnp.zeros((2, 100))
    for alpha in (4.0, 16.0):
        assert_close(sj.entmax(flat, alpha), np.full((2, 100), 0.01), 1e-15)
        assert_close(sj.entmax(flat, jnp.full((2, 1), alpha)), np.full((2, 100), 0.01), 1e-15)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_computed_in_float32(dtype):
    x = jnp.asarray(np.random.default_rng(15).normal(size=(3, 8)), dtype)
    for fn in (sj.sparsemax, sj.entmax15, lambda t: sj.f_softargmax(t, "reverse_kl")):
        p = fn(x)
        assert p.dtype == dtype
        ref = fn(x.astype(jnp.float32))
        assert_close(p, ref.astype(dtype), 0.0)


# -- errors -----------------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="axis=2"):
        sj.sparsemax(x, axis=2)
    with pytest.raises(TypeError, match="floating"):
        sj.sparsemax(jnp.ones((2, 3), jnp.int32))
    with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
        sj.entmax(x, 0.0)
    with pytest.raises(ValueError, match="alpha must be finite and > 0"):
        sj.entmax(x, jnp.array([[1.5], [-1.0]]))
    with pytest.raises(ValueError, match="size 1 along axis"):
        sj.entmax(x, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="strictly positive"):
        sj.f_softargmax(x, "kl", q=jnp.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="not broadcastable"):
        sj.f_softargmax(x, "kl", q=jnp.ones(4))
    with pytest.raises(ValueError, match="unknown name"):
        sj.f_softargmax(x, "nope")
    with pytest.raises(ValueError, match="temperature"):
        sj.f_softargmax(x, "kl", temperature=0.0)
    with pytest.raises(ValueError, match="alpha must be > 1"):
        sj.alpha_relu(x, 1.0)


def test_import_does_not_import_torch():
    code = "import sys, softargmax_jax, jax.numpy as jnp; softargmax_jax.entmax15(jnp.ones(3)); " \
           "assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_user_divergence_temperature_gradient_and_alpha_one(x64):
    """A user's generator works like the built-in one; the gradients in an array temperature and in a per-row
    α exactly 1 match central differences."""
    from softargmax_jax.divergences import Divergence

    class Pearson(Divergence):
        f_prime_zero, newton_power, monotone = 0.0, 1.0, True

        def f(self, u):
            return (u * u - 1) / 2

        def f_prime(self, u):
            return u

        def conj(self, v):
            return (v * v + 1) / 2

        def g_and_gp(self, v):
            g = jnp.maximum(v, 0)
            return g, jnp.sign(g)

    x = jnp.asarray(rows())
    assert_close(sj.f_softargmax(x, Pearson()), sj.sparsemax(x), 1e-15)
    assert_close(sj.fenchel_young_loss(x, jnp.arange(5), Pearson()), sj.sparsemax_loss(x, jnp.arange(5)), 1e-15)
    h = 1e-6
    f = lambda t: sj.f_softargmax(x, "jensen_shannon", temperature=t)[0, 0]
    assert float(jax.grad(f)(jnp.float64(0.7))) == pytest.approx(float(f(0.7 + h) - f(0.7 - h)) / (2 * h), rel=1e-7)
    w = jnp.arange(7.0)
    g = lambda a: (sj.entmax(x, a) * w).sum()
    a = jnp.ones((5, 1))
    fd = [(float(g(a.at[i, 0].add(h))) - float(g(a.at[i, 0].add(-h)))) / (2 * h) for i in range(5)]
    assert_close(jax.grad(g)(a)[:, 0], fd, 1e-7)


def test_the_jax_distribution_depends_on_jax_and_numpy_only():
    import tomllib

    root = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    with open(f"{root}/jax/pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["name"] == "softargmax-jax"
    assert sorted(d.split(">")[0].split("=")[0] for d in project["dependencies"]) == ["jax", "numpy"]
    extras = " ".join(" ".join(v) for v in project.get("optional-dependencies", {}).values())
    assert "torch" not in extras and "cuda" not in extras
