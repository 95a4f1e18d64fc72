"""softargmax_jax.teacher_target and the teacher's top-k pair in the chunked linear loss, against the PyTorch
package's teacher_target and fused loss, and against the unfused JAX loss on the dense target built by hand."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from test_jax_operators import assert_close, vjp_jax  # noqa: E402

import softargmax as sa  # noqa: E402


@pytest.mark.parametrize("top_k", [None, 1, 5, 12])
def test_teacher_target_matches_the_pytorch_package(x64, top_k):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 3, 12)) * 2
    logits[0, 1, [2, 7]] = -np.inf  # masked classes
    a = sj.teacher_target(jnp.asarray(logits), temperature=1.7, top_k=top_k)
    b = sa.teacher_target(torch.tensor(logits), temperature=1.7, top_k=top_k)
    if top_k is None:
        assert_close(np.asarray(a), b.numpy(), 1e-12)
        assert_close(np.asarray(a).sum(-1), np.ones((4, 3)), 1e-12)
    else:
        assert_close(np.asarray(a[0]), b[0].numpy(), 1e-12)
        # the same classes: the order among tied logits (the masked ones here) is not specified
        da, db = np.full(logits.shape, -1.0), np.full(logits.shape, -1.0)
        np.put_along_axis(da, np.asarray(a[1]), np.asarray(a[0]), -1)
        np.put_along_axis(db, b[1].numpy(), b[0].numpy(), -1)
        assert_close(da, db, 1e-12)
    # half-precision logits: float32 probabilities, as in the PyTorch package
    half = sj.teacher_target(jnp.asarray(logits, jnp.bfloat16))
    assert half.dtype == jnp.float32
    assert_close(np.asarray(half), sa.teacher_target(torch.tensor(logits).bfloat16()).numpy(), 1e-6)
    # no derivative flows to the teacher
    g = jax.grad(lambda t: sj.teacher_target(t, 1.7).sum() + sj.teacher_target(t, top_k=3)[0].sum())(
        jnp.asarray(np.nan_to_num(logits, neginf=-5.0)))
    assert np.all(np.asarray(g) == 0)


def _dense(probs, indices, V):
    y = np.zeros((probs.shape[0], V))
    k = probs.shape[1]
    for r in range(probs.shape[0]):
        y[r] = (1 - probs[r].sum()) / (V - k) if V > k else 0.0
        y[r, indices[r]] = probs[r]
    return y


@pytest.mark.parametrize("name", ["entmax15", "softmax", "sparsemax", "jensen_shannon"])
@pytest.mark.parametrize("top_k", [3, 9])
def test_linear_loss_with_a_teacher_top_k_pair(x64, name, top_k):
    """The pair's dense target (probs at the indices, the rest spread evenly; k = V: nothing spread) in the chunked
    loss equals the unfused loss on that target by hand (values and gradients, a padded last chunk) and the
    PyTorch package's fused loss with the same pair."""
    rng = np.random.default_rng(5)
    V = 9
    h, w = rng.normal(size=(7, 4)), rng.normal(size=(4, V))
    probs, indices = sj.teacher_target(jnp.asarray(rng.normal(size=(7, V)) * 2), temperature=1.5, top_k=top_k)
    y = _dense(np.asarray(probs), np.asarray(indices), V)
    assert_close(y.sum(-1), np.ones(7), 1e-12)

    def chunked(hh, ww):
        return sj.linear_fenchel_young_loss(hh, ww, (probs, indices), name, chunk_size=3, temperature=1.5)

    def full(hh, ww):
        return sj.fenchel_young_loss(hh @ ww, jnp.asarray(y), name, temperature=1.5)

    ct = rng.normal(size=7)
    (a, ga), (b, gb) = (vjp_jax(f, jnp.asarray(h), jnp.asarray(w), v=ct) for f in (chunked, full))
    assert_close(a, b, 1e-12)
    for x, z in zip(ga, gb):
        assert_close(x, z, 1e-12)
    t = sa.linear_fenchel_young_loss(torch.tensor(h), torch.tensor(w.T),
                                     (torch.tensor(np.asarray(probs)), torch.tensor(np.asarray(indices))),
                                     mapping=name, temperature=1.5, reduction="none")
    assert_close(np.asarray(a), t.numpy(), 1e-12)
    jitted = jax.jit(lambda hh, ww, p, i: sj.linear_fenchel_young_loss(hh, ww, (p, i), name, chunk_size=3,
                                                                       temperature=1.5))
    assert_close(np.asarray(jitted(jnp.asarray(h), jnp.asarray(w), probs, indices)), np.asarray(a), 1e-12)


def test_teacher_and_top_k_pair_errors():
    h, w = jnp.ones((2, 3)), jnp.ones((3, 5))
    probs, indices = jnp.array([[0.5, 0.3], [0.6, 0.1]]), jnp.array([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="top_k"):
        sj.teacher_target(jnp.ones((2, 5)), top_k=6)
    with pytest.raises(TypeError, match="top_k"):
        sj.teacher_target(jnp.ones((2, 5)), top_k=2.0)
    with pytest.raises(ValueError, match="temperature"):
        sj.teacher_target(jnp.ones((2, 5)), temperature=0.0)
    with pytest.raises(ValueError, match="finite largest logit"):
        sj.teacher_target(jnp.array([[0.0, 1.0], [-jnp.inf, -jnp.inf]]))
    with pytest.raises(ValueError, match="label_smoothing"):
        sj.linear_fenchel_young_loss(h, w, (probs, indices), label_smoothing=0.1)
    with pytest.raises(ValueError, match="at most 1"):
        sj.linear_fenchel_young_loss(h, w, (probs * 2, indices))
    with pytest.raises(ValueError, match="distinct"):
        sj.linear_fenchel_young_loss(h, w, (probs, jnp.array([[0, 0], [2, 3]])))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        sj.linear_fenchel_young_loss(h, w, (probs, jnp.array([[0, 5], [2, 3]])))
    with pytest.raises(ValueError, match="shape"):
        sj.linear_fenchel_young_loss(h, w, (probs[:1], indices[:1]))
    with pytest.raises(TypeError, match="floating probs"):
        sj.linear_fenchel_young_loss(h, w, (indices, indices))
    with pytest.raises(ValueError, match="pair"):
        sj.linear_fenchel_young_loss(h, w, (probs, indices, indices))
