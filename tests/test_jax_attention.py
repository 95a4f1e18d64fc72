"""softargmax_jax's sparse attention against the PyTorch package's ``attention`` on the same float64 and
float32 inputs (outputs, weights and the gradients of query, key, value and a per-head α), with boolean,
additive and causal masks, fully masked query rows (zeros, never NaN), grouped-query heads, and under
``jit`` and ``vmap``; bad arguments raise."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

import softargmax as sa  # noqa: E402


def qkv(seed=0, B=2, H=3, L=4, S=5, E=6, Hkv=None, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(B, H, L, E)).astype(dtype), rng.normal(size=(B, Hkv or H, S, E)).astype(dtype),
            rng.normal(size=(B, Hkv or H, S, E)).astype(dtype))


def run_both(q, k, v, jkw, tkw, mapping, alpha=None, tol=1e-12):
    """Outputs, weights and the gradients of q, k, v (and α) of both packages, compared."""
    rng = np.random.default_rng(9)
    ct = rng.normal(size=q.shape[:-1] + (v.shape[-1],)).astype(q.dtype)
    args = [q, k, v] + ([] if alpha is None else [alpha])

    def fj(*a):
        out, w = sj.attention(*a[:3], mapping=mapping, alpha=None if alpha is None else a[3], return_weights=True,
                              **jkw)
        return out, w

    (oj, wj), back = jax.vjp(fj, *map(jnp.asarray, args))
    gj = back((jnp.asarray(ct), jnp.zeros_like(wj)))
    tt = [torch.tensor(a, requires_grad=True) for a in args]
    ot, wt = sa.attention(*tt[:3], mapping=mapping, alpha=None if alpha is None else tt[3], return_weights=True,
                          **tkw)
    gt = torch.autograd.grad(ot, tt, torch.tensor(ct))
    assert_close(np.asarray(oj), ot.detach().numpy(), tol)
    assert_close(np.asarray(wj), wt.detach().numpy(), tol)
    for a, b in zip(gj, gt):
        assert_close(np.asarray(a), b.numpy(), tol)
    assert not np.any(np.isnan(np.asarray(oj))) and all(not np.any(np.isnan(np.asarray(g))) for g in gj)
    return np.asarray(oj), np.asarray(wj)


@pytest.mark.parametrize("mapping", ["sparsemax", "entmax15", "softmax", "jensen_shannon"])
def test_attention_matches_pytorch_with_masks(x64, mapping):
    q, k, v = qkv()
    run_both(q, k, v, {}, {}, mapping)
    run_both(q, k, v, {"is_causal": True, "scale": 0.7}, {"is_causal": True, "scale": 0.7}, mapping)
    mask = np.random.default_rng(1).uniform(size=(1, 3, 4, 5)) < 0.6
    mask[0, 0, 1] = False  # a query row with every key masked: zero weights and output
    o, w = run_both(q, k, v, {"mask": jnp.asarray(mask)}, {"attn_mask": torch.tensor(mask)}, mapping)
    assert np.all(w[:, 0, 1] == 0) and np.all(o[:, 0, 1] == 0)
    bias = np.random.default_rng(2).normal(size=(4, 5))
    run_both(q, k, v, {"bias": jnp.asarray(bias)}, {"attn_mask": torch.tensor(bias)}, mapping)


def test_attention_per_head_alpha_gqa_and_float32(x64):
    q, k, v = qkv(3, Hkv=1)
    alpha = np.array([1.2, 1.5, 2.0])
    run_both(q, k, v, {}, {"enable_gqa": True}, "entmax", alpha=alpha)
    run_both(q, k, v, {"is_causal": True}, {"is_causal": True, "enable_gqa": True}, "entmax", alpha=np.array(1.7))
    q, k, v = qkv(5, H=4, Hkv=2)  # two groups of two query heads, each group's rows in one product
    mask = np.random.default_rng(6).uniform(size=(2, 1, 4, 5)) < 0.7
    mask[..., 0] = True
    run_both(q, k, v, {"mask": jnp.asarray(mask)}, {"attn_mask": torch.tensor(mask), "enable_gqa": True}, "entmax",
             alpha=np.array([1.2, 1.5, 1.8, 2.0]))
    run_both(q, k, v, {"is_causal": True}, {"is_causal": True, "enable_gqa": True}, "sparsemax")
    q, k, v = qkv(4, dtype=np.float32)
    o, _ = run_both(q, k, v, {"is_causal": True}, {"is_causal": True}, "entmax15", tol=1e-6)
    assert o.dtype == np.float32


def test_attention_jit_vmap_and_errors(x64):
    q, k, v = (jnp.asarray(a) for a in qkv(5))
    f = jax.jit(lambda a, b, c: sj.attention(a, b, c, is_causal=True, mapping="sparsemax"))
    ref = sj.attention(q, k, v, is_causal=True, mapping="sparsemax")
    assert_close(np.asarray(f(q, k, v)), np.asarray(ref), 1e-15)
    per_batch = jax.vmap(lambda a, b, c: sj.attention(a, b, c, is_causal=True, mapping="sparsemax"))(q, k, v)
    assert_close(np.asarray(per_batch), np.asarray(ref), 1e-15)
    w = sj.attention_weights(jnp.einsum("bhle,bhse->bhls", q, k), "sparsemax")
    assert_close(np.asarray(w.sum(-1)), np.ones(w.shape[:-1]), 1e-12)
    with pytest.raises(ValueError, match="mapping"):
        sj.attention(q, k, v, mapping="nope")
    with pytest.raises(TypeError, match="mask"):
        sj.attention(q, k, v, mask=jnp.ones((4, 5)))
    with pytest.raises(ValueError, match="mask"):
        sj.attention(q, k, v, mask=jnp.ones((4, 7), bool))
    with pytest.raises(ValueError, match="feature size"):
        sj.attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="heads"):
        sj.attention(q, k[:, :2], v[:, :2])
