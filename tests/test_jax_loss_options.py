"""softargmax_jax's loss options ``ignore_index``, ``weight`` (class weights), ``multilabel`` and
``softcap`` against the PyTorch package's (``reduction="none"``) on the same inputs, values and
gradients, in float64 (1e-12) and float32 (1e-6); the soft-capped loss's gradient against central
finite differences; under ``jit`` and ``vmap``; masked (``-inf``) classes never NaN; bad options raise."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from test_jax_losses import loss_and_grad_jax, loss_and_grad_torch  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

import softargmax as sa  # noqa: E402

MAPPINGS = [("sparsemax", {}), ("entmax15", {}), ("softmax", {}), ("entmax", {"alpha": 1.3}),
            ("alpha_relu", {"alpha": 1.5, "tau": 0.2}), ("jensen_shannon", {})]


def data(seed=0, n=6, k=7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, k)) * 2.0
    labels = rng.integers(0, k, size=n)
    labels[1] = labels[4] = -100
    soft = rng.dirichlet(np.ones(k), size=n)
    sets = (rng.uniform(size=(n, k)) < 0.35).astype(np.float64)
    sets[np.arange(n), rng.integers(0, k, size=n)] = 1.0
    weight = rng.uniform(0.2, 2.0, size=k)
    return x, labels, soft, sets, weight


def both(x, target, name, params, jkw, tkw, dtype=np.float64):
    vj, gj = loss_and_grad_jax(lambda t: sj.fenchel_young_loss(t, jnp.asarray(target), name, **jkw, **params),
                               x.astype(dtype))
    vt, gt = loss_and_grad_torch(lambda t: sa.fenchel_young_loss(t, torch.tensor(target), name, reduction="none",
                                                                 **tkw, **params), x.astype(dtype))
    return vj, gj, vt, gt


@pytest.mark.parametrize("name,params", MAPPINGS)
def test_ignore_index_weight_softcap_match_pytorch(x64, name, params):
    x, labels, soft, _, weight = data()
    for opts in ({"ignore_index": -100, "softcap": 1.5}, {"weight": weight, "softcap": 2.0, "label_smoothing": 0.1}):
        jkw = {k: jnp.asarray(v) if k == "weight" else v for k, v in opts.items()}
        tkw = {k: torch.tensor(v) if k == "weight" else v for k, v in opts.items()}
        for target in ([labels, soft] if "weight" in opts else [labels]):
            vj, gj, vt, gt = both(x, target, name, params, jkw, tkw)
            assert np.all(np.isfinite(vj)) and np.all(np.isfinite(gj))
            assert_close(vj, vt, 1e-12)
            assert_close(gj, gt, 1e-12)
            if target is labels:  # ignored rows: loss 0 and no gradient
                assert np.all(vj[[1, 4]] == 0) and np.all(gj[[1, 4]] == 0)


@pytest.mark.parametrize("name,params", [("sparsemax", {}), ("entmax15", {}), ("softmax", {}),
                                         ("alpha_relu", {"alpha": 1.5, "tau": 0.2})])
def test_multilabel_matches_pytorch(x64, name, params):
    x, _, _, sets, weight = data(1)
    for opts in ({"weight": weight}, {"label_smoothing": 0.2, "softcap": 3.0}):
        jkw = {k: jnp.asarray(v) if k == "weight" else v for k, v in opts.items()}
        tkw = {k: torch.tensor(v) if k == "weight" else v for k, v in opts.items()}
        vj, gj = loss_and_grad_jax(lambda t: sj.fenchel_young_loss(t, jnp.asarray(sets), name, multilabel=True,
                                                                   **jkw, **params), x)
        vt, gt = loss_and_grad_torch(lambda t: sa.fenchel_young_loss(t, torch.tensor(sets), name, multilabel=True,
                                                                     reduction="none", **tkw, **params), x)
        assert_close(vj, vt, 1e-12)
        assert_close(gj, gt, 1e-12)
    # boolean sets, and the classes along axis 0
    a = sj.sparsemax_loss(jnp.asarray(x), jnp.asarray(sets > 0), multilabel=True)
    b = sj.sparsemax_loss(jnp.asarray(x.T), jnp.asarray(sets.T), multilabel=True, axis=0)
    assert_close(np.asarray(a), np.asarray(b), 1e-15)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "jensen_shannon"])
def test_options_match_pytorch_in_float32(name):
    x, labels, _, _, weight = data(2)
    opts = {"weight": weight.astype(np.float32), "softcap": 2.0}
    vj, gj, vt, gt = both(x, labels, name, {}, {k: jnp.asarray(v) if k == "weight" else v for k, v in opts.items()},
                          {k: torch.tensor(v) if k == "weight" else v for k, v in opts.items()}, np.float32)
    assert vj.dtype == np.float32
    assert_close(vj, vt, 1e-6)
    assert_close(gj, gt, 1e-6)


def test_softcap_gradient_against_finite_differences(x64):
    x, labels, _, _, weight = data(3)
    labels = np.where(labels < 0, 0, labels)

    def f(t):
        return jnp.sum(sj.entmax15_loss(t, jnp.asarray(labels), softcap=1.2, weight=jnp.asarray(weight)))

    g = np.asarray(jax.grad(f)(jnp.asarray(x)))
    eps, fd = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        fd[i] = (float(f(jnp.asarray(x + e))) - float(f(jnp.asarray(x - e)))) / (2 * eps)
    assert_close(g, fd, 1e-7)


def test_jit_vmap_and_masked_classes(x64):
    x, labels, _, sets, weight = data(4)
    w = jnp.asarray(weight)
    f = jax.jit(lambda t, y: sj.sparsemax_loss(t, y, weight=w, softcap=2.0))
    eager = sj.sparsemax_loss(jnp.asarray(x), jnp.asarray(labels), weight=w, softcap=2.0)
    assert_close(np.asarray(f(jnp.asarray(x), jnp.asarray(labels))), np.asarray(eager), 1e-15)
    per_row = jax.vmap(lambda t, y: sj.sparsemax_loss(t[None], y[None], weight=w, softcap=2.0)[0])
    assert_close(np.asarray(per_row(jnp.asarray(x), jnp.asarray(labels))), np.asarray(eager), 1e-15)
    g = jax.jit(jax.grad(lambda t: sj.entmax15_loss(t, jnp.asarray(sets), multilabel=True).sum()))(jnp.asarray(x))
    assert np.all(np.isfinite(np.asarray(g)))
    # -inf stays masked under softcap: no NaN, gradient 0 there, the same as the capped logits with -inf
    xm = x.copy()
    xm[:, 2] = -np.inf
    lab = np.where(labels == 2, 0, np.where(labels < 0, 0, labels))
    vj, gj = loss_and_grad_jax(lambda t: sj.entmax15_loss(t, jnp.asarray(lab), softcap=1.5), xm)
    capped = np.where(np.isinf(xm), -np.inf, 1.5 * np.tanh(xm / 1.5))
    vr, _ = loss_and_grad_jax(lambda t: sj.entmax15_loss(t, jnp.asarray(lab)), capped)
    assert not np.any(np.isnan(gj)) and np.all(gj[:, 2] == 0)
    assert_close(vj, vr, 1e-13)
    # a row fully ignored under jit (traced labels): zeros
    labels_all = jnp.full(labels.shape, -100)
    assert np.all(np.asarray(jax.jit(lambda t, y: sj.entmax15_loss(t, y))(jnp.asarray(x), labels_all)) == 0)


def test_bad_options():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="weight"):
        sj.sparsemax_loss(x, jnp.array([0, 1]), weight=jnp.ones(4))
    with pytest.raises(ValueError, match="weight"):
        sj.sparsemax_loss(x, jnp.array([0, 1]), weight=jnp.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="softcap"):
        sj.sparsemax_loss(x, jnp.array([0, 1]), softcap=0.0)
    with pytest.raises(TypeError, match="ignore_index"):
        sj.sparsemax_loss(x, jnp.array([0, 1]), ignore_index=1.5)
    with pytest.raises(ValueError, match="class indices"):
        sj.sparsemax_loss(x, jnp.array([0, -1]))
    with pytest.raises(ValueError, match="class indices"):
        sj.sparsemax_loss(x, jnp.array([0, -100]), ignore_index=None)
    with pytest.raises(ValueError, match="only 0 and 1"):
        sj.sparsemax_loss(x, jnp.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]), multilabel=True)
    with pytest.raises(ValueError, match="at least one active"):
        sj.sparsemax_loss(x, jnp.array([[0, 0, 0], [1, 0, 0]]), multilabel=True)
    with pytest.raises(ValueError, match="multilabel"):
        sj.sparsemax_loss(x, jnp.array([0, 1]), multilabel=True)


BINARY = [("kl", {}), ("chi_square", {}), ("jensen_shannon", {}),
          ("reverse_kl", {})]


@pytest.mark.parametrize("name,params", BINARY)
def test_binary_f_divergence_loss_matches_pytorch(x64, name, params):
    rng = np.random.default_rng(5)
    s = rng.normal(size=(4, 5)) * 2.5
    hard = (rng.uniform(size=s.shape) < 0.5).astype(np.float64)
    soft = rng.uniform(0.05, 0.95, size=s.shape)
    w = rng.uniform(0.1, 2.0, size=(5,))
    q0, q1 = rng.uniform(0.5, 2.0, size=(5,)), 0.7
    for y in ([soft] if name == "reverse_kl" else [hard, soft]):  # reverse KL: +inf for 0/1 targets
        for kw in ({}, {"temperature": 0.6, "weight": w, "q": (q0, q1)}):
            jkw = {k: (jnp.asarray(v[0]), v[1]) if k == "q" else (jnp.asarray(v) if k == "weight" else v)
                   for k, v in kw.items()}
            tkw = {k: (torch.tensor(v[0]), v[1]) if k == "q" else (torch.tensor(v) if k == "weight" else v)
                   for k, v in kw.items()}
            vj, gj = loss_and_grad_jax(lambda t: sj.binary_f_divergence_loss(t, jnp.asarray(y), name, **jkw,
                                                                             **params), s)
            vt, gt = loss_and_grad_torch(lambda t: sa.binary_f_divergence_loss(t, torch.tensor(y), name,
                                                                               reduction="none", **tkw, **params), s)
            assert np.all(np.isfinite(vj)) and np.all(vj >= -1e-12)
            assert_close(vj, vt, 1e-12)
            assert_close(gj, gt, 1e-12)
    # the gradient is f_sigmoid(s) - y (times the weight), against finite differences too
    y = soft
    f = jax.jit(lambda t: jnp.sum(sj.binary_f_divergence_loss(t, jnp.asarray(y), name, **params)))
    g = np.asarray(jax.grad(f)(jnp.asarray(s)))
    assert_close(g, np.asarray(sj.f_sigmoid(jnp.asarray(s), name, **params)) - y, 1e-12)
    eps = 1e-6
    fd = np.array([(float(f(jnp.asarray(s + eps * e))) - float(f(jnp.asarray(s - eps * e)))) / (2 * eps)
                   for e in np.eye(s.size).reshape(s.size, *s.shape)]).reshape(s.shape)
    assert_close(g, fd, 1e-6)


def test_binary_f_divergence_loss_float32_vmap_and_errors():
    import optax

    rng = np.random.default_rng(6)
    s = (rng.normal(size=(3, 4)) * 2).astype(np.float32)
    y = (rng.uniform(size=s.shape) < 0.5).astype(np.float32)
    vj, gj = loss_and_grad_jax(lambda t: sj.binary_f_divergence_loss(t, jnp.asarray(y), "jensen_shannon"), s)
    vt, gt = loss_and_grad_torch(lambda t: sa.binary_f_divergence_loss(t, torch.tensor(y), "jensen_shannon",
                                                                       reduction="none"), s)
    assert vj.dtype == np.float32
    assert_close(vj, vt, 1e-6)
    assert_close(gj, gt, 1e-6)
    kl = sj.binary_f_divergence_loss(jnp.asarray(s), jnp.asarray(y))
    assert_close(np.asarray(kl), np.asarray(optax.sigmoid_binary_cross_entropy(jnp.asarray(s), jnp.asarray(y))), 1e-6)
    rows = jax.vmap(lambda a, b: sj.binary_f_divergence_loss(a, b, "chi_square"))(jnp.asarray(s), jnp.asarray(y))
    assert_close(np.asarray(rows), np.asarray(sj.binary_f_divergence_loss(jnp.asarray(s), jnp.asarray(y),
                                                                          "chi_square")), 1e-7)
    with pytest.raises(ValueError, match="labels"):
        sj.binary_f_divergence_loss(jnp.asarray(s), jnp.asarray(y) * 2)
    with pytest.raises(ValueError, match="labels"):
        sj.binary_f_divergence_loss(jnp.asarray(s), jnp.asarray(y[0]))
    with pytest.raises(ValueError, match="weight"):
        sj.binary_f_divergence_loss(jnp.asarray(s), jnp.asarray(y), weight=jnp.ones(3))
    with pytest.raises(ValueError, match="temperature"):
        sj.binary_f_divergence_loss(jnp.asarray(s), jnp.asarray(y), temperature=0.0)


@pytest.mark.parametrize("name,params", [("entmax15", {}), ("jensen_shannon", {}), ("softmax", {})])
def test_linear_loss_with_q_ignore_index_class_weight_softcap(x64, name, params):
    rng = np.random.default_rng(7)
    h, w = rng.normal(size=(11, 5)), rng.normal(size=(5, 9)) * 0.8
    labels = rng.integers(0, 9, size=11)
    labels[[2, 7]] = -100
    cw = rng.uniform(0.2, 2.0, size=9)
    q = rng.uniform(0.5, 2.0, size=9) if name == "jensen_shannon" else None
    kw = dict(temperature=0.8, label_smoothing=0.1, softcap=2.5, **params)
    jq = None if q is None else jnp.asarray(q)

    def chunked(hh, ww):
        return sj.linear_fenchel_young_loss(hh, ww, jnp.asarray(labels), name, chunk_size=4, q=jq,
                                            class_weight=jnp.asarray(cw), **kw)

    def full(hh, ww):
        return sj.fenchel_young_loss(hh @ ww, jnp.asarray(labels), name, q=jq, weight=jnp.asarray(cw), **kw)

    ct = jnp.asarray(rng.normal(size=11))
    (a, ga), (b, gb) = (jax.vjp(f, jnp.asarray(h), jnp.asarray(w)) for f in (chunked, full))
    assert_close(np.asarray(a), np.asarray(b), 1e-12)
    for x, y in zip(ga(ct), gb(ct)):
        assert_close(np.asarray(x), np.asarray(y), 1e-12)
    assert np.all(np.asarray(a)[[2, 7]] == 0)
    # and the PyTorch core's fused loss (weight [V, d] there), per example
    tkw = dict(kw, q=None if q is None else torch.tensor(q))
    t = sa.linear_fenchel_young_loss(torch.tensor(h), torch.tensor(w.T), torch.tensor(labels), mapping=name,
                                     class_weight=torch.tensor(cw), reduction="none", **tkw)
    assert_close(np.asarray(a), t.numpy(), 1e-12)
    with pytest.raises(ValueError, match="class_weight"):
        sj.linear_fenchel_young_loss(jnp.asarray(h), jnp.asarray(w), jnp.asarray(labels), class_weight=jnp.ones(3))
    with pytest.raises(ValueError, match="q"):
        sj.linear_fenchel_young_loss(jnp.asarray(h), jnp.asarray(w), jnp.asarray(labels), "kl", q=jnp.ones(3))


SHARD_MAP_OPTIONS = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import softargmax_jax as sj
    assert jax.device_count() == 4, jax.devices()
    mesh = jax.make_mesh((4,), ("vocab",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(6, 24)) * 2)
    labels = rng.integers(0, 24, size=6)
    labels[3] = -100
    labels = jnp.asarray(labels)
    q = jnp.asarray(rng.uniform(0.5, 2.0, size=24))
    w = jnp.asarray(rng.uniform(0.2, 2.0, size=24))
    for name, kw in [("jensen_shannon", {"q": q}), ("kl", {"q": q}), ("entmax15", {"softcap": 2.0})]:
        def sharded(t):
            return jax.shard_map(lambda tt, yy, qq, ww: sj.vocab_parallel_fenchel_young_loss(
                tt, yy, name, axis_name="vocab", weight=ww, temperature=0.8, **dict(kw, q=qq)),
                mesh=mesh, in_specs=(P(None, "vocab"), P(), P("vocab"), P()), out_specs=P())(
                t, labels, kw.get("q", jnp.ones(24)), w)
        full = lambda t: sj.fenchel_young_loss(t, labels, name, weight=w, temperature=0.8, **kw)
        err = float(jnp.max(jnp.abs(jax.jit(sharded)(x) - full(x))))
        assert err < 1e-12, (name, err)
        g = jax.jit(jax.grad(lambda t: sharded(t).sum()))(x)
        gref = jax.grad(lambda t: full(t).sum())(x)
        gerr = float(jnp.max(jnp.abs(g - gref)))
        assert gerr < 1e-12 and bool(jnp.all(g[3] == 0)), (name, gerr)
    # probability rows and multi-hot label sets, sharded as the logits are
    probs = jnp.asarray(rng.dirichlet(np.full(24, 0.5), size=6))
    sets = rng.random((6, 24)) < 0.2
    sets[:, 5] = True
    for name, dense, ml in [("entmax15", probs, False), ("chi_square", probs, False), ("kl", jnp.asarray(sets), True),
                            ("sparsemax", jnp.asarray(sets), True)]:
        def sharded(t):
            return jax.shard_map(lambda tt, yy, ww: sj.vocab_parallel_fenchel_young_loss(
                tt, yy, name, axis_name="vocab", weight=ww, label_smoothing=0.1, multilabel=ml),
                mesh=mesh, in_specs=(P(None, "vocab"), P(None, "vocab"), P()), out_specs=P())(t, dense, w)
        full = lambda t: sj.fenchel_young_loss(t, dense, name, weight=w, label_smoothing=0.1, multilabel=ml)
        err = float(jnp.max(jnp.abs(jax.jit(sharded)(x) - full(x))))
        g = jax.jit(jax.grad(lambda t: sharded(t).sum()))(x)
        gerr = float(jnp.max(jnp.abs(g - jax.grad(lambda t: full(t).sum())(x))))
        assert err < 1e-12 and gerr < 1e-12, (name, ml, err, gerr)
    print("ok")
""")


def test_vocab_parallel_loss_options_under_shard_map_on_four_cpu_devices():
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"))
    out = subprocess.run([sys.executable, "-c", SHARD_MAP_OPTIONS], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


@pytest.mark.parametrize("kind", ["probabilities", "multilabel"])
@pytest.mark.parametrize("name", ["entmax15", "softmax", "chi_square"])
def test_linear_loss_with_probability_and_multi_hot_labels(x64, kind, name):
    """Probability rows and multi-hot label sets in the chunked loss: the unfused loss's values and gradients
    (class weights as ⟨w, y⟩, label smoothing, a padded last chunk), and the PyTorch core's fused loss."""
    rng = np.random.default_rng(11)
    h, w = rng.normal(size=(10, 5)), rng.normal(size=(5, 8)) * 0.8
    if kind == "probabilities":
        y = rng.dirichlet(np.full(8, 0.5), size=10)
        y[3] = np.eye(8)[2]  # a one-hot row: the class-index loss of that row
        multilabel, labels = False, jnp.asarray(y)
    else:
        y = rng.random((10, 8)) < 0.3
        y[:, 0] |= ~y.any(1)  # at least one label per row
        multilabel, labels = True, jnp.asarray(y)
    cw = rng.uniform(0.2, 2.0, size=8)
    kw = dict(temperature=0.9, label_smoothing=0.05, multilabel=multilabel)

    def chunked(hh, ww):
        return sj.linear_fenchel_young_loss(hh, ww, labels, name, chunk_size=4, class_weight=jnp.asarray(cw), **kw)

    def full(hh, ww):
        return sj.fenchel_young_loss(hh @ ww, labels, name, weight=jnp.asarray(cw), **kw)

    ct = jnp.asarray(rng.normal(size=10))
    (a, ga), (b, gb) = (jax.vjp(f, jnp.asarray(h), jnp.asarray(w)) for f in (chunked, full))
    assert_close(np.asarray(a), np.asarray(b), 1e-12)
    for x, z in zip(ga(ct), gb(ct)):
        assert_close(np.asarray(x), np.asarray(z), 1e-12)
    if kind == "probabilities":
        one = sj.linear_fenchel_young_loss(jnp.asarray(h), jnp.asarray(w), jnp.full(10, 2), name, chunk_size=4)
        dense = sj.linear_fenchel_young_loss(jnp.asarray(h), jnp.asarray(w), jnp.asarray(np.tile(np.eye(8)[2], (10, 1))),
                                             name, chunk_size=4)
        assert_close(np.asarray(dense), np.asarray(one), 1e-12)
    target = torch.tensor(y) if kind == "probabilities" else torch.tensor(y.astype(np.float64))
    t = sa.linear_fenchel_young_loss(torch.tensor(h), torch.tensor(w.T), target, mapping=name, class_weight=torch.tensor(cw),
                                     reduction="none", **kw)
    assert_close(np.asarray(a), t.numpy(), 1e-12)
    with pytest.raises(ValueError, match="labels"):
        sj.linear_fenchel_young_loss(jnp.asarray(h), jnp.asarray(w), jnp.asarray(np.full((10, 8), 0.5)), name)
    with pytest.raises(ValueError, match="labels"):
        sj.linear_fenchel_young_loss(jnp.asarray(h), jnp.asarray(w), jnp.asarray(y[:, :5]), name, multilabel=multilabel)
