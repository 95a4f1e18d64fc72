"""softargmax_jax with one parameter per row: a per-row α in ``normmax`` and ``normmax_loss``, a per-row budget in
``budget_sparsemax`` and ``budget_sparsemax_loss``, and a per-row α in ``vocab_parallel_fenchel_young_loss``
(``"entmax"``/``"alpha"``), against the PyTorch package's on the same float64 (1e-12, relative to the size of the
reference) and float32 (1e-6) inputs, values and vector-Jacobian products; each row against the function of that
row's single parameter (JAX and PyTorch); edge rows (flat, ``-inf`` entries, two finite entries, fully masked, a
large offset, NaN); central finite differences; ``jit`` with the parameter traced and ``vmap``; the parameter a
constant (zero derivative); bad shapes, dtypes and values."""

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
from test_jax_budget import scores  # noqa: E402  (flat, -inf, two finite, all -inf, offset 1e4)
from test_jax_normmax import fd_grad, rel_close, shifted  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

import softargmax as sa  # noqa: E402

#: one α per row of ``scores()``, mixing the argmax (1), 1.3, 1.5, 2 (closed form) and 3
ALPHAS = np.array([[1.0], [1.3], [1.5], [2.0], [3.0], [1.5], [1.0]])
#: one budget per row of ``scores()``: sparsemax (<= 1), 2, 3.5 (more than the two finite entries of row 3)
BUDGETS = np.array([[0.5], [2.0], [1.0], [3.5], [3.5], [2.0], [0.5]])

OPERATORS = {"normmax": (sj.normmax, sa.normmax, ALPHAS), "budget": (sj.budget_sparsemax, sa.budget_sparsemax, BUDGETS)}
LOSSES = {"normmax": (sj.normmax_loss, sa.normmax_loss, ALPHAS),
          "budget": (sj.budget_sparsemax_loss, sa.budget_sparsemax_loss, BUDGETS)}


def _vs_pytorch(fj, ft, x, a, tol):
    """Values and the vector-Jacobian product (with respect to the scores and the parameter) against the PyTorch
    package's on the same inputs (shifted: see ``test_jax_normmax.shifted``)."""
    v = np.random.default_rng(1).normal(size=x.shape).astype(x.dtype)
    p, back = jax.vjp(fj, jnp.asarray(x), jnp.asarray(a))
    gx, ga = back(jnp.asarray(v))
    t = torch.tensor(shifted(x), requires_grad=True)
    pt = ft(t, torch.tensor(a))
    (gt,) = torch.autograd.grad(pt, t, torch.tensor(v))
    assert p.dtype == x.dtype
    rel_close(np.asarray(p), pt.detach().numpy(), tol)
    rel_close(np.asarray(gx), gt.numpy(), tol)
    assert np.all(np.asarray(ga) == 0)  # the parameter is a constant: no derivative flows to it
    return np.asarray(p)


@pytest.mark.parametrize("name", ["normmax", "budget"])
def test_per_row_operator_matches_pytorch_and_each_row(x64, name):
    fj, ft, params = OPERATORS[name]
    _vs_pytorch(fj, ft, scores(dtype=np.float32), params.astype(np.float32), 1e-6)
    x, a, tol = scores(), params, 1e-12
    p = _vs_pytorch(fj, ft, x, a, tol)
    assert not np.any(np.isnan(p)) and np.all(p[4] == 0) and np.all(p[~np.isfinite(x)] == 0)
    for one in np.unique(a):  # each row: the function of that row's single parameter, JAX's and PyTorch's
        rows = a[:, 0] == one
        rel_close(p[rows], np.asarray(fj(jnp.asarray(x), float(one)))[rows], tol)
        rel_close(p[rows], ft(torch.tensor(shifted(x)), float(one)).numpy()[rows], tol)


@pytest.mark.parametrize("name", ["normmax", "budget"])
def test_per_row_axis_broadcasting_jit_vmap_and_finite_differences(x64, name):
    fj, ft, _ = OPERATORS[name]
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 3)) * 2
    # one per row along axis=1, shape (1, 3): broadcast over the leading dimension
    a = np.array([[1.0, 1.5, 3.0]]) if name == "normmax" else np.array([[0.5, 2.0, 3.0]])
    pj = jax.jit(lambda t, b: fj(t, b, axis=1))(jnp.asarray(x), jnp.asarray(a))  # the parameter traced
    assert_close(np.asarray(pj), ft(torch.tensor(x), torch.tensor(a), dim=1).numpy(), 1e-12)
    # vmap over rows with a scalar parameter per row
    x2, a2 = x.transpose(0, 2, 1).reshape(6, 5), np.tile(a.T, (2, 1))
    rows = jax.vmap(lambda r, b: fj(r, b))(jnp.asarray(x2), jnp.asarray(a2[:, 0]))
    assert_close(np.asarray(rows), np.asarray(pj).transpose(0, 2, 1).reshape(6, 5), 1e-15)
    # finite differences (rows with α = 1, piecewise constant, have the derivative 0 either way)
    w = rng.normal(size=x2.shape)
    f = jax.jit(lambda t: jnp.sum(fj(t, jnp.asarray(a2)) * w))
    assert_close(np.asarray(jax.grad(f)(jnp.asarray(x2))), fd_grad(f, x2), 1e-7)


def test_per_row_nan_rows_and_errors():
    x = jnp.array([[1.0, jnp.nan, 0.0], [1.0, 0.5, 0.0], [jnp.inf, 0.0, 0.0]])
    for f, a in ((sj.normmax, jnp.array([[1.0], [2.5], [1.5]])), (sj.budget_sparsemax, jnp.array([[2.0], [1.5], [0.5]]))):
        p, back = jax.vjp(lambda t: f(t, a), x)
        p, g = np.asarray(p), np.asarray(back(jnp.ones((3, 3)))[0])
        assert np.all(np.isnan(p[[0, 2]])) and not np.any(np.isnan(p[1]))
        assert np.all(np.isnan(g[[0, 2]])) and not np.any(np.isnan(g[1]))
    y = jnp.array([0, 1, 2])
    loss = np.asarray(sj.normmax_loss(x, y, jnp.array([[2.0], [1.0], [1.0]])))
    assert np.isnan(loss[0]) and np.isnan(loss[2]) and np.isfinite(loss[1])
    for f in (sj.normmax, lambda t, b: sj.normmax_loss(t, y, b)):
        with pytest.raises(ValueError, match=r"alpha must be finite and >= 1"):
            f(x, jnp.array([[2.0], [0.5], [1.0]]))
        with pytest.raises(ValueError, match=r"alpha must be finite"):
            f(x, jnp.array([[2.0], [jnp.nan], [1.0]]))
        with pytest.raises(ValueError, match=r"alpha of shape .* size 1 along axis=-1"):
            f(x, jnp.full((3, 3), 2.0))
        with pytest.raises(ValueError, match=r"alpha of shape .* size 1 along axis=-1"):
            f(x, jnp.full((2, 1), 2.0))
        with pytest.raises(ValueError, match=r"alpha of shape .* more dimensions"):
            f(x, jnp.full((1, 3, 1), 2.0))
        with pytest.raises(TypeError, match="alpha"):
            f(x, jnp.array([[2], [1], [1]]))
    for f in (sj.budget_sparsemax, lambda t, b: sj.budget_sparsemax_loss(t, y, b)):
        with pytest.raises(ValueError, match=r"budget must be finite and > 0"):
            f(x, jnp.array([[2.0], [0.0], [1.0]]))
        with pytest.raises(ValueError, match=r"budget must be finite and > 0"):
            f(x, jnp.array([[2.0], [jnp.inf], [1.0]]))
        with pytest.raises(ValueError, match=r"budget of shape .* size 1 along axis=-1"):
            f(x, jnp.full((3, 3), 2.0))
        with pytest.raises(TypeError, match="budget"):
            f(x, np.array([[2], [1], [1]]))


def _labels(x):
    rng = np.random.default_rng(5)
    y = rng.integers(0, 9, size=7)
    y[2], y[3], y[4] = 3, 8, -100  # on a masked entry (+inf), on a finite entry of the row with two, ignored
    soft = rng.random(size=x.shape) * np.isfinite(x) + np.isfinite(x)
    soft[4] = 1.0
    soft /= soft.sum(-1, keepdims=True)  # every entry <= 2/(n+1): within the caps 1/B of the finite rows
    multi = (rng.random(size=x.shape) < 0.4).astype(np.int64)
    multi[:, 5:] = 1
    return y, soft, multi


@pytest.mark.parametrize("name", ["normmax", "budget"])
def test_per_row_loss_matches_pytorch_each_row_and_p_minus_y(x64, name):
    fj, ft, params = LOSSES[name]
    x = scores(12)
    y, soft, multi = _labels(x)
    w = np.random.default_rng(8).random(size=9) + 0.5
    # class indices (with label smoothing and class weights) for both, probabilities for normmax, label sets for
    # budget sparsemax (whose finite targets they are)
    kinds = [(y, {"label_smoothing": 0.1, "weight": w}), (soft, {}) if name == "normmax" else (multi, {"multilabel": True})]
    for lab, kw in kinds:
        kw_t = {k: torch.tensor(v) if k == "weight" else v for k, v in kw.items()}
        l, back = jax.vjp(lambda t, b: fj(t, jnp.asarray(lab), b, **kw), jnp.asarray(x), jnp.asarray(params))
        gx, ga = back(jnp.ones(7))
        t = torch.tensor(x, requires_grad=True)
        lt = ft(t, torch.tensor(lab), torch.tensor(params), reduction="none", **kw_t)
        (gt,) = torch.autograd.grad(lt, t, torch.ones_like(lt))
        # label smoothing: over the classes that are not masked here, over all of them in PyTorch
        rows = np.isfinite(x).all(-1) if "label_smoothing" in kw else np.ones(7, bool)
        rel_close(np.asarray(l)[rows], lt.detach().numpy()[rows], 1e-12)
        rel_close(np.asarray(gx)[rows], gt.numpy()[rows], 1e-12)
        assert np.all(np.asarray(ga) == 0)  # the parameter is a constant
        for i in range(7):  # each row: PyTorch's loss of that row's single parameter
            one = ft(torch.tensor(x[i:i + 1]), torch.tensor(lab[i:i + 1]), float(params[i, 0]), reduction="none",
                     **kw_t)
            if rows[i]:
                rel_close(np.asarray(l)[i:i + 1], one.numpy(), 1e-12)
    # the gradient is p - y, with p the operator of the same per-row parameter; finite differences
    xs = np.random.default_rng(11).normal(size=(7, 5))
    ys = np.array([0, 3, 4, 1, 2, 0, 4])
    lab = np.eye(5)[ys] if name == "normmax" else np.ones((7, 5)) / 5
    a = params if name == "normmax" else np.minimum(params, 4.5)  # budgets the uniform target fits under
    f = jax.jit(lambda t: jnp.sum(fj(t, jnp.asarray(lab), jnp.asarray(a))))
    g = np.asarray(jax.grad(f)(jnp.asarray(xs)))
    assert_close(g, OPERATORS[name][1](torch.tensor(xs), torch.tensor(a)).numpy() - lab, 1e-14)
    assert_close(g, fd_grad(f, xs), 1e-7)


def test_per_row_loss_float32_and_axis(x64):
    x = scores(9, np.float32)
    y = np.random.default_rng(10).integers(0, 9, size=7)
    y[2], y[3] = 0, 8
    multi = np.ones(x.shape, np.int64)
    multi[:, :2] = 0
    for fj, ft, params, lab, kw in ((sj.normmax_loss, sa.normmax_loss, ALPHAS, y, {}),
                                    (sj.budget_sparsemax_loss, sa.budget_sparsemax_loss, BUDGETS, multi,
                                     {"multilabel": True})):
        a = params.astype(np.float32)
        labj = jnp.asarray(lab if lab.ndim == 1 else lab.T)
        lj = fj(jnp.asarray(x.T), labj, jnp.asarray(a.T), axis=0, **kw)
        assert lj.dtype == jnp.float32
        lt = ft(torch.tensor(x), torch.tensor(lab), torch.tensor(a), reduction="none", **kw)
        rel_close(np.asarray(lj), lt.numpy(), 1e-6)


# -- the vocabulary-parallel loss ---------------------------------------------------------------------------

def _vocab_inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 24)) * 2
    x[1] = 0.3                    # flat
    x[2, 3] = -np.inf
    x[3, :20] = -np.inf           # four finite entries, all on the last device
    x[5] += 1e3                   # a large offset
    x[7] = -np.inf                # fully masked (its label ignored)
    labels = np.array([0, 5, 7, 21, 3, 11, 20, -100])
    probs = rng.dirichlet(np.full(24, 0.5), size=8) * np.isfinite(x)
    probs[7] = 1.0
    probs /= probs.sum(-1, keepdims=True)
    return x, labels, probs


#: (mapping, one α per row, dtype, tolerance, labels): class indices, or probability rows sharded as the logits
VOCAB_CASES = [("entmax", [1.0, 1.3, 1.5, 2.0, 3.0, 1.5, 1.3, 2.0], "float64", 1e-12, "indices"),
               ("alpha", [0.7, 1.3, 1.5, 2.0, 3.0, 1.0, 2.5, 1.2], "float32", 1e-6, "probs")]

SHARD_MAP_ROW_ALPHA = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import softargmax_jax as sj
    sys.path.insert(0, sys.argv[1])
    from test_jax_row_params import VOCAB_CASES, _vocab_inputs
    assert jax.device_count() == 4, jax.devices()
    mesh = jax.make_mesh((4,), ("vocab",), axis_types=(jax.sharding.AxisType.Auto,))
    x, labels, probs = _vocab_inputs()
    out = {}
    for i, (name, alphas, dtype, _, kind) in enumerate(VOCAB_CASES):
        xd, a = x.astype(dtype), np.array(alphas, dtype)[:, None]
        lab, spec = (labels, P()) if kind == "indices" else (probs.astype(dtype), P(None, "vocab"))

        def sharded(t):
            return jax.shard_map(lambda tt, yy, aa: sj.vocab_parallel_fenchel_young_loss(
                tt, yy, name, axis_name="vocab", alpha=aa, temperature=0.8),
                mesh=mesh, in_specs=(P(None, "vocab"), spec, P()), out_specs=P())(t, jnp.asarray(lab), jnp.asarray(a))

        # the losses and their gradient in one compiled call (a vjp with the cotangent ones)
        l, g = jax.jit(lambda t: (lambda o, back: (o, back(jnp.ones_like(o))[0]))(*jax.vjp(sharded, t)))(jnp.asarray(xd))
        out[f"loss{i}"], out[f"grad{i}"] = np.asarray(l), np.asarray(g)
    np.savez(sys.argv[2], **out)
    print("ok")
""")


def test_vocab_parallel_loss_per_row_alpha_on_four_cpu_devices(x64, tmp_path):
    """On four CPU devices (a subprocess), against the PyTorch package's vocabulary-parallel loss on a group of one
    process, and each row against PyTorch's unsplit loss of its single α."""
    import torch.distributed as dist

    from softargmax.losses import distributed

    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"))
    path = tmp_path / "out.npz"
    out = subprocess.run([sys.executable, "-c", SHARD_MAP_ROW_ALPHA, os.path.dirname(__file__), str(path)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
    res = np.load(path)
    x, labels, probs = _vocab_inputs()
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for i, (name, alphas, dtype, tol, kind) in enumerate(VOCAB_CASES):
            xd, a = x.astype(dtype), np.array(alphas, dtype)[:, None]
            lab = labels if kind == "indices" else probs.astype(dtype)
            l, g = res[f"loss{i}"], res[f"grad{i}"]
            assert l.dtype == dtype and g.dtype == dtype
            # PyTorch on the rows less their maximum (exact for the row offset by 1e3; the loss is invariant to it):
            # in float32 its loss of the offset row itself is off by 4e-5 in its gradient (this package's by 5e-8)
            t = torch.tensor(shifted(xd), requires_grad=True)
            lt = distributed.fenchel_young_loss(t, torch.tensor(lab), name, alpha=torch.tensor(a), temperature=0.8,
                                                reduction="none")
            (gt,) = torch.autograd.grad(lt.sum(), t)
            rel_close(l, lt.detach().numpy(), tol)
            assert_close(g, gt.numpy(), tol)
            assert not np.isnan(g).any()
            if kind == "indices":  # an ignored row and the masked classes get no gradient
                assert np.all(g[7] == 0) and np.all(g[~np.isfinite(x)] == 0)
            # each row: PyTorch's unsplit loss of that row's single alpha
            rows = [sa.fenchel_young_loss(t[r:r + 1].detach(), torch.tensor(lab[r:r + 1]), name, alpha=float(a[r, 0]),
                                          temperature=0.8, reduction="none") for r in range(8)]
            rel_close(l, torch.cat(rows).numpy(), tol)
    finally:
        if own:
            dist.destroy_process_group()


def test_vocab_parallel_per_row_alpha_errors_and_the_losses_number_alpha():
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("vocab",), axis_types=(jax.sharding.AxisType.Auto,))
    x, y = jnp.array([[1.0, 0.5, -1.0], [0.0, 2.0, 1.0]]), jnp.array([0, 1])

    def call(alpha, name="entmax", **kw):  # the per-row alpha a constant of the jitted function
        return jax.jit(jax.shard_map(lambda t, l: sj.vocab_parallel_fenchel_young_loss(
            t, l, name, axis_name="vocab", alpha=alpha, **kw), mesh=mesh, in_specs=(P(None, "vocab"), P()),
            out_specs=P()))(x, y)

    assert_close(np.asarray(call(jnp.array([[1.5], [1.5]]))), np.asarray(sj.entmax15_loss(x, y)), 1e-6)
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        call(np.array([[1.5], [0.9]]))  # a constant (not traced): its values are checked
    with pytest.raises(ValueError, match="alpha must be finite and > 0"):
        call(np.array([[1.5], [0.0]]), "alpha")
    with pytest.raises(ValueError, match=r"alpha of shape .* size 1 along axis=-1"):
        call(jnp.ones((2, 3)) * 1.5)
    with pytest.raises(ValueError, match="unexpected parameters"):
        call(jnp.array([[1.5], [1.5]]), beta=2.0)
    with pytest.raises(TypeError, match="alpha"):
        call(np.array([[2], [2]]))
    # the other losses take alpha as a number, as the PyTorch package's do
    for f in (lambda: sj.entmax_loss(x, y, alpha=jnp.array([[1.5], [1.5]])),
              lambda: sj.fenchel_young_loss(x, y, "entmax", alpha=jnp.array([[1.5], [1.5]]))):
        with pytest.raises(TypeError, match="alpha"):
            f()
    with pytest.raises(TypeError, match="alpha"):
        sa.entmax_loss(torch.tensor(np.asarray(x)), torch.tensor(np.asarray(y)), alpha=torch.tensor([[1.5], [1.5]]))
