"""The JAX solver's Newton steps for Jensen–Shannon and squared Hellinger: Jensen–Shannon's step on ``1/S`` in
``u = e^τ`` (monotone from below, exact for one entry), both generators' bounds of the residual after a step
(``Divergence.step_error``) against the residual computed in float64 at the step's end, the loop ending on that
bound without evaluating the step's end (the number of passes), the separately fused row sums
(``Divergence.row_sums``) and Jensen's sums without the masked-entry selects (``_JensenStart.jensen_sums``) against
the plain sums; every row against a float64 root found by bisection.  And every built-in dense generator's g' from
g (``Divergence.gp_from_g``, ``gp_rowsum_from_g``: the loop that carries its values) against ``g_and_gp``."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
from jax import lax  # noqa: E402
from softargmax_jax import _solver  # noqa: E402
from softargmax_jax.divergences import get_divergence  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

NAMES = ["jensen_shannon", "squared_hellinger"]


def g_rows(name, c, tau):
    """``(g, g')`` of ``c - τ`` in float64 numpy, straight from the formulas (``-inf`` entries give 0)."""
    v = c - tau
    if name == "jensen_shannon":
        g = 1.0 / (2 * np.exp(-v) - 1)
        return g, g + g * g
    r = 1.0 / (1 - v)
    return r * r, 2 * r ** 3


def S_rows(name, c, tau):
    g, gp = g_rows(name, c, tau)
    return g.sum(-1, keepdims=True), gp.sum(-1, keepdims=True)


def roots(name, c):
    """Each row's threshold in float64 by bisection (200 halvings of a bracket that holds it)."""
    lo = np.zeros((c.shape[0], 1))
    hi = np.full_like(lo, 1.0)
    while np.any(S_rows(name, c, hi)[0] > 1):
        hi = np.where(S_rows(name, c, hi)[0] > 1, 2 * hi + 1, hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        big = S_rows(name, c, mid)[0] > 1
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    return 0.5 * (lo + hi)


def edge_rows(seed=0, k=400):
    """Shifted rows (maximum 0): Gaussian of scales 0.3 to 30, masked entries, one finite entry, a flat row, a
    large offset (shifted away), a few large scores over many small ones."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(size=(5, k)) * s for s in (0.3, 1.0, 3.0, 10.0, 30.0)])
    x[1, ::3] = -np.inf
    x[2, 1:] = -np.inf
    x[3] = 0.5
    x[4] += 1e4
    x[6, :5] += 40.0
    return x - x.max(-1, keepdims=True)


def test_jensen_shannon_step_is_monotone_from_below_and_exact_for_one_entry(x64):
    """From Jensen's start every step stays at or below the float64 root and rises to it; on a row of one finite
    entry one step lands on the root."""
    div = get_divergence("jensen_shannon")
    c = edge_rows(1)
    root = roots("jensen_shannon", c)
    lo, hi = _solver._bounds(div, jnp.asarray(c), None, c.shape[1], None)
    tau = np.asarray(_solver._jensen_start(div, jnp.asarray(c), lo, hi, None))
    for _ in range(4):
        assert np.all(tau <= root + 1e-12 * (1 + np.abs(root)))
        S, Sp = S_rows("jensen_shannon", c, tau)
        new = np.asarray(div.newton_step(jnp.asarray(tau), jnp.asarray(S), jnp.asarray(Sp)))
        assert np.all(new >= tau - 1e-15 * (1 + np.abs(tau)))
        tau = new
    np.testing.assert_allclose(tau, root, rtol=0, atol=1e-12 * (1 + np.abs(root)).max())
    one = np.array([[0.0] + [-np.inf] * 9])  # the root: g(-τ) = 1, τ = 0
    S, Sp = S_rows("jensen_shannon", one, np.array([[-0.5]]))
    step = div.newton_step(jnp.asarray([[-0.5]]), jnp.asarray(S), jnp.asarray(Sp))
    assert abs(float(step[0, 0])) <= 1e-15


@pytest.mark.parametrize("name", NAMES)
def test_step_error_bounds_the_residual_after_the_step(x64, name):
    """At Jensen's start and after each of three steps (every row below its root), the bound of ``|S - 1|`` at the
    step's end is at least that residual computed in float64, and it falls from step to step."""
    div = get_divergence(name)
    c = edge_rows(2)
    lo, hi = _solver._bounds(div, jnp.asarray(c), None, c.shape[1], None)
    tau = np.asarray(_solver._jensen_start(div, jnp.asarray(c), lo, hi, None))
    tight = []
    for _ in range(3):
        S, Sp = S_rows(name, c, tau)
        step = div.newton_step(jnp.asarray(tau), jnp.asarray(S), jnp.asarray(Sp))
        new = np.asarray(_solver.newton_update(jnp.asarray(tau), jnp.asarray(S), jnp.asarray(Sp), div.newton_power)
                         if step is None else step)
        bound = np.asarray(div.step_error(jnp.asarray(tau), jnp.asarray(S), jnp.asarray(Sp), jnp.asarray(new)))
        after = np.abs(S_rows(name, c, new)[0] - 1)
        assert np.all(after <= bound * (1 + 1e-9) + 1e-15), (after.ravel(), bound.ravel())
        tight.append(float(np.max(bound)))
        tau = new
    assert tight[2] < tight[1] < tight[0], tight


def passes(name, x, values=True):
    """The Newton loop's iterations for ``f_softargmax(x, name)`` (one pass over the rows each; with ``values``
    false, the generator without ``values_in_loop``: the loop that certifies its last step)."""
    counts = []
    orig = lax.while_loop

    def record(cond, body, state):
        out = orig(cond, body, state)
        counts.append(int(out[0]))
        return out

    div = get_divergence(name)
    if not values:
        div = type("Uncarried", (type(div),), {"values_in_loop": False})()
    _solver.lax.while_loop = record
    try:
        p = _solver.solve(jnp.asarray(x), div).p
    finally:
        _solver.lax.while_loop = orig
    return counts, np.asarray(p)


@pytest.mark.parametrize("name,most", [("jensen_shannon", 2), ("squared_hellinger", 2)])
def test_certified_step_ends_the_loop_one_pass_early(name, most):
    """On 16 float32 rows of 4000 Gaussian scores of scale 3 the loop without ``values_in_loop`` ends on the
    certified step: Jensen–Shannon in two passes and squared Hellinger in two on these rows (the benchmark's
    64 x 32000: two and one); the rows still sum to 1 and match the float64 roots' mapping to float32's rounding.
    The loop that carries its values (the built-in generators' choice) evaluates at the certified step's end
    instead, where the other makes its pass that writes ``p``: at most one evaluation more, no more passes."""
    x = (np.random.default_rng(3).normal(size=(16, 4000)) * 3).astype(np.float32)
    counts, p = passes(name, x, values=False)
    assert counts == [most], counts
    carried, p_carried = passes(name, x)
    assert len(carried) == 1 and most <= carried[0] <= most + 1, carried
    np.testing.assert_allclose(p_carried, p, rtol=0, atol=2e-7)
    c = x.astype(np.float64) - x.max(-1, keepdims=True)
    ref = g_rows(name, c, roots(name, c))[0]
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=4e-6)
    assert_close(p, ref, 2e-6)


@pytest.mark.parametrize("name", NAMES)
def test_row_sums_equal_the_sums_of_g_and_gp(x64, name):
    """``row_sums`` (two separately fused sums) against the sums of ``g_and_gp_rows``, masked entries included."""
    div = get_divergence(name)
    c = jnp.asarray(edge_rows(4))
    tau = jnp.asarray(roots(name, np.asarray(c))) + 0.01
    state = div.rows_state(c)
    S, Sp = div.row_sums(c, tau, state)
    g, gp = div.g_and_gp_rows(c, tau, state)
    assert_close(S, jnp.sum(g, -1, keepdims=True), 1e-12)
    assert_close(Sp, jnp.sum(gp, -1, keepdims=True), 1e-12)


def test_jensen_sums_without_selects_equal_the_masked_terms(x64):
    """``_JensenStart.jensen_sums``: the row sum of ``-c`` and the row length where no entry is masked, the masked
    terms' sums where one is (``lax.cond``), both against numpy."""
    div = get_divergence("squared_hellinger")
    rowsum = lambda t: jnp.sum(t, -1, keepdims=True)
    for c in [edge_rows(5)[[0, 3, 4, 6]], edge_rows(5)]:
        a1, a2 = div.jensen_sums(jnp.asarray(c), None, rowsum)
        fin = np.isfinite(c)
        assert_close(a1, np.where(fin, -c, 0).sum(-1, keepdims=True), 1e-9)
        assert_close(a2, fin.sum(-1, keepdims=True).astype(float), 0)


@pytest.mark.parametrize("name", NAMES)
def test_float32_and_float64_against_the_float64_roots(x64, name):
    """``f_softargmax`` on the edge rows (and a large offset) in float64 (1e-12) and float32 (2e-6) against the
    mapping at the float64 roots."""
    x = edge_rows(6) + 300.0
    c = x - x.max(-1, keepdims=True)
    ref = g_rows(name, c, roots(name, c))[0]
    assert_close(sj.f_softargmax(jnp.asarray(x), name), ref, 1e-12)
    assert_close(sj.f_softargmax(jnp.asarray(x.astype(np.float32)), name), ref, 2e-6)


@pytest.mark.parametrize("name", ["reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger",
                                  "reverse_chi_square"])
def test_gp_from_g_and_its_row_sum_equal_g_and_gp(x64, name):
    """The loop that carries its values takes g' from g (``Divergence.gp_from_g``) and the row sum of g' from g and
    its sum (``gp_rowsum_from_g``): both against ``g_and_gp``'s g' at thresholds above the root and at a random
    reference measure ``q`` (times q), masked entries included (g = g' = 0)."""
    div = get_divergence(name)
    assert div.values_in_loop
    c = jnp.asarray(edge_rows(5))
    q = jnp.asarray(np.random.default_rng(6).uniform(0.3, 3.0, c.shape))
    rowsum = _solver._rowsum_or_dot(None)
    for tau in (jnp.full((c.shape[0], 1), 1.5), jnp.full((c.shape[0], 1), 40.0)):
        g, gp = div.g_and_gp(jnp.where(c > -jnp.inf, c - tau, -jnp.inf))
        for qq in (None, q):
            G, GP = (g, gp) if qq is None else (g * qq, gp * qq)
            assert_close(div.gp_from_g(G, qq), GP, 1e-13)
            S = jnp.sum(G, -1, keepdims=True)
            assert_close(div.gp_rowsum_from_g(G, S, qq, rowsum), jnp.sum(GP, -1, keepdims=True), 1e-13)


def test_a_subclass_that_redefines_g_takes_the_loop_that_reads_g_and_gp():
    """``values_in_loop`` is inherited, ``gp_from_g`` too: a subclass of a built-in generator that redefines
    ``g_and_gp`` and not ``gp_from_g`` must not take g' from its parent's formula: it takes the other loop, which
    reads g' from ``g_and_gp``; the built-ins (their rows variants included) take the loop that carries g."""
    from softargmax_jax.divergences import ReverseKL

    class Tempered(ReverseKL):  # another g, for which the parent's g' = g^2 would be wrong (here g' = g^2 / 2)
        def g_and_gp(self, v):
            g = -2.0 / v
            return g, 0.5 * g * g

    for name in ["reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "reverse_chi_square"]:
        assert _solver._carries_values(get_divergence(name).rows_variant()), name
    assert not _solver._carries_values(Tempered())
