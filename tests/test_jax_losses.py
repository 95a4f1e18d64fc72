"""softargmax_jax's Fenchel–Young losses against the PyTorch package (values and gradients), optax's
sparsemax_loss / softmax cross-entropy / projection_simplex, with label smoothing and masked classes; the
chunked linear loss against the full logits; the vocabulary-parallel loss under shard_map on four CPU
devices (in a subprocess: the device count is fixed when JAX starts)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

import softargmax as sa  # noqa: E402

LOSSES = [
    ("sparsemax", {}),
    ("entmax15", {}),
    ("softmax", {}),
    ("entmax", {"alpha": 1.3}),
    ("entmax", {"alpha": 3.0}),
    ("alpha_relu", {"alpha": 1.5, "tau": 0.2}),
    ("kl", {}),
    ("reverse_kl", {}),
    ("jeffrey", {}),
    ("jensen_shannon", {}),
    ("squared_hellinger", {}),
    ("chi_square", {}),
    ("reverse_chi_square", {}),
    ("alpha", {"alpha": 1.5}),
]


def data(seed=0, n=5, k=6):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, k)) * 1.5
    labels = rng.integers(0, k, size=n)
    soft = rng.dirichlet(np.ones(k), size=n)
    return x, labels, soft


def loss_and_grad_jax(fn, x):
    value, back = jax.vjp(fn, jnp.asarray(x))
    return np.asarray(value), np.asarray(back(jnp.ones_like(value))[0])


def loss_and_grad_torch(fn, x):
    t = torch.tensor(x, requires_grad=True)
    value = fn(t)
    (g,) = torch.autograd.grad(value.sum(), t)
    return value.detach().numpy(), g.numpy()


def torch_mapping(name):
    return {"softmax": "softmax"}.get(name, name)


@pytest.mark.parametrize("name,params", LOSSES)
def test_losses_match_pytorch_with_hard_and_soft_labels(x64, name, params):
    x, labels, soft = data()
    kw = {} if name in ("sparsemax", "entmax15", "softmax", "entmax", "alpha_relu") else \
        {"temperature": 0.8, "q": np.random.default_rng(1).uniform(0.5, 2.0, size=x.shape[-1])}
    for target in (labels, soft):
        jkw = {k: jnp.asarray(v) if k == "q" else v for k, v in kw.items()}
        tkw = {k: torch.tensor(v) if k == "q" else v for k, v in kw.items()}
        vj, gj = loss_and_grad_jax(lambda t: sj.fenchel_young_loss(t, jnp.asarray(target), name, **jkw, **params), x)
        vt, gt = loss_and_grad_torch(lambda t: sa.fenchel_young_loss(t, torch.tensor(target), torch_mapping(name),
                                                                     reduction="none", **tkw, **params), x)
        assert_close(vj, vt, 1e-12)
        assert_close(gj, gt, 1e-12)


@pytest.mark.parametrize("name,params", [("sparsemax", {}), ("entmax15", {}), ("jensen_shannon", {})])
def test_losses_match_pytorch_in_float32(name, params):
    x, labels, _ = data(2)
    vj, gj = loss_and_grad_jax(lambda t: sj.fenchel_young_loss(t, jnp.asarray(labels), name, **params),
                               x.astype(np.float32))
    vt, gt = loss_and_grad_torch(lambda t: sa.fenchel_young_loss(t, torch.tensor(labels), name, reduction="none",
                                                                 **params), x.astype(np.float32))
    assert vj.dtype == np.float32
    assert_close(vj, vt, 1e-6)
    assert_close(gj, gt, 1e-6)


def test_label_smoothing_and_masks_match_pytorch(x64):
    x, labels, _ = data(3)
    # smoothing over every class, as PyTorch's label_smoothing
    vj, gj = loss_and_grad_jax(lambda t: sj.entmax15_loss(t, jnp.asarray(labels), label_smoothing=0.1), x)
    vt, gt = loss_and_grad_torch(lambda t: sa.entmax15_loss(t, torch.tensor(labels), reduction="none",
                                                            label_smoothing=0.1), x)
    assert_close(vj, vt, 1e-12)
    assert_close(gj, gt, 1e-12)
    # a `where` mask is the same as -inf logits; smoothing spreads over the classes that are left
    where = np.ones_like(x, dtype=bool)
    where[:, 1] = False
    labels = np.where(labels == 1, 0, labels)
    allowed = where.astype(float)
    target = 0.9 * np.eye(x.shape[1])[labels] + 0.1 * allowed / allowed.sum(-1, keepdims=True)
    xm = np.where(where, x, -np.inf)
    vj, gj = loss_and_grad_jax(lambda t: sj.sparsemax_loss(t, jnp.asarray(labels), label_smoothing=0.1,
                                                           where=jnp.asarray(where)), x)
    vt, gt = loss_and_grad_torch(lambda t: sa.sparsemax_loss(t, torch.tensor(target), reduction="none"), xm)
    assert_close(vj, vt, 1e-12)
    assert_close(gj, gt, 1e-12)
    assert not np.any(np.isnan(gj)) and np.all(gj[:, 1] == 0)
    vj2, _ = loss_and_grad_jax(lambda t: sj.sparsemax_loss(t, jnp.asarray(labels), label_smoothing=0.1), xm)
    assert_close(vj2, vj, 1e-15)


def test_masked_target_class_gives_inf_and_full_mask_no_nan():
    x = jnp.array([[0.5, -jnp.inf, 0.2], [-jnp.inf, -jnp.inf, -jnp.inf]])
    v = sj.entmax15_loss(x, jnp.array([1, 0]))
    assert float(v[0]) == np.inf and float(v[1]) == np.inf
    g = jax.grad(lambda t: sj.entmax15_loss(t, jnp.array([0, 0]), where=jnp.array([True, True, True])).sum())(x)
    assert not bool(jnp.any(jnp.isnan(g)))


def test_against_optax(x64):
    x, labels, soft = data(4, n=8, k=5)
    xj, lj = jnp.asarray(x), jnp.asarray(labels)
    # the multiclass sparsemax loss, values and gradients
    assert_close(sj.sparsemax_loss(xj, lj), optax.losses.multiclass_sparsemax_loss(xj, lj), 1e-12)
    assert_close(jax.grad(lambda t: sj.sparsemax_loss(t, lj).sum())(xj),
                 jax.grad(lambda t: optax.losses.multiclass_sparsemax_loss(t, lj).sum())(xj), 1e-12)
    # optax's sparsemax_loss is the binary one: the two-class loss on scores (0, s)
    s = jnp.asarray(np.linspace(-3, 3, 13))
    y01 = jnp.asarray(np.arange(13) % 2)
    two = jnp.stack([jnp.zeros_like(s), s], -1)
    assert_close(sj.sparsemax_loss(two, y01), optax.losses.sparsemax_loss(s, y01), 1e-12)
    assert_close(jax.grad(lambda t: sj.sparsemax_loss(jnp.stack([jnp.zeros_like(t), t], -1), y01).sum())(s),
                 jax.grad(lambda t: optax.losses.sparsemax_loss(t, y01).sum())(s), 1e-12)
    assert_close(sj.sparsemax(xj), jax.vmap(optax.projections.projection_simplex)(xj), 1e-12)
    # optax's generic Fenchel–Young loss with our f-softmax as the conjugate
    fy = optax.losses.make_fenchel_young_loss(lambda t: sj.f_softmax(t, "jensen_shannon"))
    # (optax's value leaves out Ω(y): the two differ by a constant in the scores)
    yj = jnp.asarray(soft)
    gap = jax.vmap(fy)(xj, yj) - sj.f_divergence_loss(xj, yj, "jensen_shannon")
    assert_close(jax.vmap(fy)(2 * xj, yj) - sj.f_divergence_loss(2 * xj, yj, "jensen_shannon"), gap, 1e-12)
    assert_close(jax.grad(lambda t: jax.vmap(fy)(t, jnp.asarray(soft)).sum())(xj),
                 jax.grad(lambda t: sj.f_divergence_loss(t, jnp.asarray(soft), "jensen_shannon").sum())(xj), 1e-12)
    # cross-entropy, with soft labels and with a where mask
    assert_close(sj.fenchel_young_loss(xj, jnp.asarray(soft), "softmax"),
                 optax.softmax_cross_entropy(xj, jnp.asarray(soft)) + (soft * np.log(soft)).sum(-1), 1e-12)
    where = jnp.asarray(np.arange(5) != 3)[None, :].repeat(8, 0)
    lm = jnp.where(lj == 3, 0, lj)
    assert_close(sj.fenchel_young_loss(xj, lm, "softmax", where=where),
                 optax.softmax_cross_entropy(xj, jax.nn.one_hot(lm, 5), where=where), 1e-12)


def test_gradient_is_prediction_minus_target_under_jit_and_vmap(x64):
    x, labels, soft = data(5)
    xj = jnp.asarray(x)
    for name, params, predict in [("jeffrey", {}, lambda t: sj.f_softargmax(t, "jeffrey")),
                                  ("entmax", {"alpha": 4.0}, lambda t: sj.entmax(t, 4.0))]:
        g = jax.jit(jax.grad(lambda t: sj.fenchel_young_loss(t, jnp.asarray(soft), name, **params).sum()))(xj)
        assert_close(g, predict(xj) - soft, 1e-12)
        per_row = jax.vmap(lambda t, y: sj.fenchel_young_loss(t[None], y[None], name, **params)[0])(xj, jnp.asarray(soft))
        assert_close(per_row, sj.fenchel_young_loss(xj, jnp.asarray(soft), name, **params), 1e-13)
    # zero exactly when the prediction is the target, nonnegative otherwise
    p = sj.entmax15(xj)
    assert_close(sj.entmax15_loss(xj, p), np.zeros(5), 1e-12)
    assert bool(jnp.all(sj.entmax15_loss(xj, jnp.asarray(labels)) >= 0))


def test_loss_bad_inputs():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="sum to 1"):
        sj.sparsemax_loss(x, jnp.array([[0.5, 0.2, 0.2], [1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="sum to 1"):
        sj.sparsemax_loss(x, jnp.array([[1.5, -0.5, 0.0], [1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        sj.sparsemax_loss(x, jnp.array([0, 3]))
    with pytest.raises(ValueError, match="shape"):
        sj.sparsemax_loss(x, jnp.array([0, 1, 2]))
    with pytest.raises(ValueError, match="label_smoothing"):
        sj.sparsemax_loss(x, jnp.array([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="alpha must be a number > 1"):
        sj.alpha_relu_loss(x, jnp.array([0, 1]), alpha=0.5)
    with pytest.raises(TypeError, match="do not learn"):
        sj.entmax_loss(x, jnp.array([0, 1]), alpha=jnp.array(1.5))
    # PyTorch's reduction=, which the per-example losses do not take, is named as such (not as a divergence's
    # parameter), by every loss
    for loss in (sj.entmax15_loss, sj.sparsemax_loss, sj.f_divergence_loss, sj.alpha_relu_loss):
        with pytest.raises(ValueError, match="reduction: the JAX losses return one value per example"):
            loss(x, jnp.array([0, 1]), reduction="mean")
    with pytest.raises(ValueError, match="reduction: the JAX losses"):
        sj.linear_fenchel_young_loss(x, jnp.ones((3, 4)), jnp.array([0, 1]), "entmax15", reduction="sum")
    # traced labels are not checked (no error under jit)
    jax.jit(lambda y: sj.sparsemax_loss(x, y))(jnp.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))


def test_linear_loss_matches_the_full_logits(x64):
    rng = np.random.default_rng(6)
    h = jnp.asarray(rng.normal(size=(11, 4)))
    w = jnp.asarray(rng.normal(size=(4, 9)))
    labels = jnp.asarray(rng.integers(0, 9, size=11))
    for name, params in [("entmax15", {})]:
        full = lambda hh, ww: sj.fenchel_young_loss(hh @ ww, labels, name, label_smoothing=0.05, **params)
        chunked = lambda hh, ww: sj.linear_fenchel_young_loss(hh, ww, labels, name, chunk_size=4, label_smoothing=0.05,
                                                              **params)
        assert_close(chunked(h, w), full(h, w), 1e-12)
        weights = jnp.asarray(rng.uniform(size=11))
        gc = jax.grad(lambda hh, ww: (chunked(hh, ww) * weights).sum(), argnums=(0, 1))(h, w)
        gf = jax.grad(lambda hh, ww: (full(hh, ww) * weights).sum(), argnums=(0, 1))(h, w)
        assert_close(gc[0], gf[0], 1e-12)
        assert_close(gc[1], gf[1], 1e-12)


def test_linear_loss_never_builds_the_full_logits():
    h = jnp.ones((64, 8))
    w = jnp.ones((8, 32))
    labels = jnp.zeros(64, jnp.int32)
    f = jax.grad(lambda hh, ww: sj.linear_fenchel_young_loss(hh, ww, labels, chunk_size=8).sum(), argnums=(0, 1))
    jaxpr = str(jax.make_jaxpr(f)(h, w))
    assert "f32[64,32]" not in jaxpr and "f32[8,32]" in jaxpr


SHARD_MAP_SCRIPT = textwrap.dedent("""
    import os
    assert "--xla_force_host_platform_device_count=4" in os.environ["XLA_FLAGS"]
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import softargmax_jax as sj
    assert jax.device_count() == 4, jax.devices()
    mesh = jax.make_mesh((4,), ("vocab",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(6, 24)) * 2)
    x = x.at[2, 5].set(-jnp.inf)
    labels = jnp.asarray(rng.integers(0, 24, size=6))
    for name, params in [("entmax15", {}), ("entmax", {"alpha": 3.0})]:
        def sharded(t):
            return jax.shard_map(lambda tt, yy: sj.vocab_parallel_fenchel_young_loss(
                tt, yy, name, axis_name="vocab", label_smoothing=0.1, **params),
                mesh=mesh, in_specs=(P(None, "vocab"), P()), out_specs=P())(t, labels)
        ref = sj.fenchel_young_loss(x, labels, name, label_smoothing=0.1, **params)
        got = jax.jit(sharded)(x)
        err = float(jnp.max(jnp.abs(got - ref)))
        assert err < 1e-12, (name, err)
        g = jax.jit(jax.grad(lambda t: sharded(t).sum()))(x)
        gref = jax.grad(lambda t: sj.fenchel_young_loss(t, labels, name, label_smoothing=0.1, **params).sum())(x)
        gerr = float(jnp.max(jnp.abs(g - gref)))
        assert gerr < 1e-12, (name, gerr)
    print("ok")
""")


MESH_2D_SCRIPT = textwrap.dedent("""
    import os
    assert "--xla_force_host_platform_device_count=4" in os.environ["XLA_FLAGS"]
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import softargmax_jax as sj
    mesh = jax.make_mesh((2, 2), ("rows", "vocab"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(6, 24)) * 2)
    x = x.at[4, 3].set(-jnp.inf)
    labels = jnp.asarray(rng.integers(0, 24, size=6)).at[4].set(5)
    # one mapping per path of the solver: 1.5-entmax's and sparsemax's closed forms, alpha > 2 (its own loop and
    # conditional), Newton with the bracket, the dense generators' start (a conditional on masked rows), Jeffrey's
    # loop that carries its evaluations
    cases = [("entmax15", {}), ("sparsemax", {}), ("entmax", {"alpha": 3.0}), ("entmax", {"alpha": 1.3}),
             ("jensen_shannon", {}), ("jeffrey", {})]
    for name, params in cases:
        kw = dict(label_smoothing=0.1, **params)  # (finite for the generators with f(0) = +inf too)
        def sharded(t):
            return jax.shard_map(lambda tt, yy: sj.vocab_parallel_fenchel_young_loss(tt, yy, name, axis_name="vocab", **kw),
                                 mesh=mesh, in_specs=(P("rows", "vocab"), P("rows")), out_specs=P("rows"))(t, labels)
        ref = sj.fenchel_young_loss(x, labels, name, **kw)
        got = jax.jit(sharded)(x)
        assert bool(jnp.all(jnp.isfinite(ref))), name
        err = float(jnp.max(jnp.abs(got - ref)))
        assert err < 1e-12, (name, params, err)
        g = jax.jit(jax.grad(lambda t: sharded(t).sum()))(x)
        gref = jax.grad(lambda t: sj.fenchel_young_loss(t, labels, name, **kw).sum())(x)
        gerr = float(jnp.max(jnp.abs(g - gref)))
        assert gerr < 1e-12, (name, params, gerr)
    print("ok")
""")


def test_vocab_parallel_loss_on_a_mesh_of_rows_and_classes():
    """A 2 × 2 mesh, the rows split over one axis and the classes over the other: the solver's loop carries and
    branches start as constants and vary over the rows' axis (shard_map's types), and every generator's loss and
    gradient equal the unsharded ones (they raised a type error in lax.while_loop before)."""
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"))
    out = subprocess.run([sys.executable, "-c", MESH_2D_SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr[-3000:]


def test_vocab_parallel_loss_under_shard_map_on_four_cpu_devices():
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"))
    out = subprocess.run([sys.executable, "-c", SHARD_MAP_SCRIPT], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
