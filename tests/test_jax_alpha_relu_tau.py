"""softargmax_jax.alpha_relu_tau against the PyTorch package's softargmax.operators.alpha_relu_tau on the same inputs:
``entmax_threshold`` (float64 1e-12 and float32 1e-6, relative to the size of the threshold, with flat rows, ``-inf``
entries, one finite entry, fully masked rows and a large offset; NaN rows), the property that α-ReLU with these
thresholds is α-entmax, ``from_logits`` (its mean, the masked rows left out, the error when every row is masked),
``gaussian`` (Lemma 2 and the quadrature, to 1e-12, and Table 3 of Tezekbayev et al.) and ``linear_logit_std``;
``jit``, ``vmap`` and bad arguments."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from softargmax_jax import alpha_relu_tau as J  # noqa: E402
from test_jax_normmax import rel_close  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

from softargmax.operators import alpha_relu_tau as T  # noqa: E402


def logits(dtype=np.float64):
    x = np.random.default_rng(0).normal(size=(6, 9)) * 2
    x[1] = 0.3                # flat
    x[2, 3] = -np.inf
    x[3, :8] = -np.inf        # one finite entry: tau = (alpha - 1) x - 1
    x[4] = -np.inf            # fully masked: -1
    x[5] += 1e3               # a large offset
    return x.astype(dtype)


def test_entmax_threshold_matches_pytorch_and_gives_entmax(x64):
    live = np.isfinite(logits()).any(-1)
    for alpha, dtype, tol in ((1.3, np.float64, 1e-12), (1.5, np.float64, 1e-12), (2.0, np.float64, 1e-12),
                              (3.0, np.float64, 1e-12), (3.0, np.float32, 1e-6)):
        x = logits(dtype)
        tau = J.entmax_threshold(jnp.asarray(x), alpha)
        assert tau.dtype == dtype and tau.shape == (6,)
        rel_close(np.asarray(tau), T.entmax_threshold(torch.tensor(x), alpha).numpy(), tol)
        t = np.asarray(tau, np.float64)
        assert t[4] == -1 and abs(t[3] - ((alpha - 1) * float(x[3, 8]) - 1)) <= tol * max(1.0, abs(t[3]))
        if alpha in (1.5, 3.0) and dtype == np.float64:  # alpha-ReLU with these thresholds is alpha-entmax, row by row
            p = sj.alpha_relu(jnp.asarray(x[live]), alpha, tau[live][:, None])
            assert_close(np.asarray(p), np.asarray(sj.entmax(jnp.asarray(x[live]), alpha)), 1e-12)


def test_entmax_threshold_axis_jit_vmap_nan_rows_and_errors(x64):
    x = logits()
    ref = np.asarray(J.entmax_threshold(jnp.asarray(x), 1.5))
    assert_close(np.asarray(J.entmax_threshold(jnp.asarray(x.T), 1.5, axis=0)), ref, 0)
    assert_close(np.asarray(jax.jit(lambda t: J.entmax_threshold(t, 1.5))(jnp.asarray(x))), ref, 0)
    assert_close(np.asarray(jax.vmap(lambda r: J.entmax_threshold(r, 1.5))(jnp.asarray(x))), ref, 0)
    # a constant: no derivative flows through it (as in PyTorch, where it is detached)
    assert np.all(np.asarray(jax.grad(lambda t: J.entmax_threshold(t, 1.5)[0])(jnp.asarray(x))) == 0)
    # NaN or +inf in a row: NaN in that row only (for every alpha)
    bad = jnp.array([[0.0, jnp.nan, 1.0], [jnp.inf, 0.0, 0.0], [1.0, 0.8, -1.0]])
    for alpha in (1.5, 3.0):
        t = np.asarray(J.entmax_threshold(bad, alpha))
        assert np.all(np.isnan(t[:2])) and np.isfinite(t[2])
    for a in (1.0, 0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            J.entmax_threshold(jnp.asarray(x), a)
    for a in (True, jnp.array([1.5])):
        with pytest.raises(TypeError, match="alpha"):
            J.entmax_threshold(jnp.asarray(x), a)
    with pytest.raises(TypeError, match="logits"):
        J.entmax_threshold(jnp.array([1, 2]))
    with pytest.raises(ValueError, match="axis"):
        J.entmax_threshold(jnp.asarray(x), axis=2)


def test_from_logits_matches_pytorch(x64):
    x = logits()
    x3 = np.stack([x, x[::-1] * 0.5])  # [2, 6, 9]: the mean over every row of a batch of sequences
    for alpha in (1.5, 2.0):
        m = J.from_logits(jnp.asarray(x3), alpha)
        assert m.shape == ()
        rel_close(float(m), float(T.from_logits(torch.tensor(x3), alpha)), 1e-12)
    t = np.asarray(J.entmax_threshold(jnp.asarray(x), 1.5))
    assert abs(float(J.from_logits(jnp.asarray(x))) - np.mean(t[[0, 1, 2, 3, 5]])) <= 1e-12 * 1e3  # masked row out
    assert_close(float(jax.jit(J.from_logits)(jnp.asarray(x))), float(J.from_logits(jnp.asarray(x))), 1e-12)
    masked = jnp.full((2, 3), -jnp.inf)
    with pytest.raises(ValueError, match="every row is masked"):
        J.from_logits(masked)
    with pytest.raises(ValueError, match="every row is masked"):
        T.from_logits(torch.tensor(np.asarray(masked)))
    assert math.isnan(float(jax.jit(J.from_logits)(masked)))  # traced: no error can be raised, NaN


@pytest.mark.parametrize("args", [(40000, None, 1.5, "auto"), (30, 2.0, 3.0, "auto")])
def test_gaussian_and_linear_logit_std_match_pytorch(args):
    d, std, alpha, method = args
    if std is None:
        std = J.linear_logit_std(512, d)
        assert std == T.linear_logit_std(512, d)
    tau, p = J.gaussian(d, std, alpha, method, return_support=True)
    tau_t, p_t = T.gaussian(d, std, alpha, method, return_support=True)
    assert abs(tau - tau_t) <= 1e-12 * max(1.0, abs(tau_t)) and abs(p - p_t) <= 1e-12, (tau, tau_t, p, p_t)
    assert J.gaussian(d, std, alpha, method) == tau
    if d == 40000:  # Table 3 of Tezekbayev et al. (2022): WMT'14 En-De, p* = 0.0171, tau = 0.17
        assert (round(tau, 2), round(p, 4)) == (0.17, 0.0171)


def test_gaussian_errors():
    for kw, match in (({"vocab_size": 1}, "vocab_size"), ({"std": 0.0}, "std"), ({"std": float("inf")}, "std"),
                      ({"alpha": 1.0}, "alpha"), ({"method": "x"}, "method"), ({"alpha": 2.0, "method": "paper"},
                                                                                "paper")):
        args = dict({"vocab_size": 100, "std": 1.0}, **kw)
        with pytest.raises(ValueError, match=match):
            J.gaussian(**args)
    for d in (0, True, 2.5):
        with pytest.raises(ValueError, match="d_model"):
            J.linear_logit_std(d, 10)
