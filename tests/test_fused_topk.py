"""Fused distillation from a teacher's top-k: linear_fenchel_young_loss with target=(probs, indices)."""

import pytest
import torch

import softargmax as sa
from softargmax.divergences import get_divergence


def _problem(N=13, d=6, V=40, k=5, dtype=torch.float64, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(N, d, generator=g, dtype=torch.float64) * 2).to(dtype)
    weight = torch.randn(V, d, generator=g, dtype=torch.float64).to(dtype)
    b = torch.randn(V, generator=g, dtype=torch.float64).to(dtype) if bias else None
    teacher = torch.softmax(torch.randn(N, V, generator=g, dtype=torch.float64) * 3, -1)
    probs, idx = teacher.topk(k)
    return hidden, weight, b, probs, idx


def _spread(probs, idx, V):
    """The dense teacher, built independently: the top-k where they are, the rest spread evenly (float64)."""
    N, k = probs.shape
    y = torch.empty(N, V, dtype=torch.float64)
    for i in range(N):
        rest = (1 - float(probs[i].double().sum())) / (V - k)
        for j in range(V):
            y[i, j] = rest
        for c in range(k):
            y[i, int(idx[i, c])] = float(probs[i, c])
    return y


CASES = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}),
         ("jensen_shannon", {}), (get_divergence("alpha", alpha=2.5), {})]


@pytest.mark.parametrize("mapping,params", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_topk_equals_the_unfused_loss_on_the_spread_teacher(mapping, params, dtype):
    hidden, weight, b, probs, idx = _problem(dtype=dtype)
    V = weight.shape[0]
    y = _spread(probs, idx, V)
    # reference: unfused, float64, on the dense spread-out teacher
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (hidden, weight, b))
    ref = sa.fenchel_young_loss(h64 @ w64.T + b64, y, mapping, temperature=1.0, **params)
    ref.backward()
    h, w, bb = (t.detach().clone().requires_grad_() for t in (hidden, weight, b))
    out = sa.linear_fenchel_young_loss(h, w, (probs.to(dtype), idx), bb, mapping, chunk_size=4, **params)
    out.backward()
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(out.double(), ref, **tol)
    for got, want in ((h.grad, h64.grad), (w.grad, w64.grad), (bb.grad, b64.grad)):
        torch.testing.assert_close(got.double(), want, **tol)
    assert float(ref.detach()) > 0


def test_topk_accepts_torch_topk_and_batched_hidden_and_sum():
    hidden, weight, _, probs, idx = _problem(N=12, bias=False)
    V = weight.shape[0]
    y = _spread(probs, idx, V)
    top = torch.return_types.topk((probs.reshape(3, 4, -1), idx.reshape(3, 4, -1)))
    out = sa.linear_fenchel_young_loss(hidden.reshape(3, 4, -1), weight, top, reduction="sum")
    ref = sa.entmax15_loss(hidden @ weight.T, y, reduction="sum")
    torch.testing.assert_close(out, ref)
    # k = V: the full teacher, nothing spread
    full = torch.softmax(hidden @ weight.T * 0.3, -1)
    p_full, i_full = full.topk(V)
    torch.testing.assert_close(sa.linear_fenchel_young_loss(hidden, weight, (p_full, i_full), mapping="sparsemax"),
                               sa.sparsemax_loss(hidden @ weight.T, full))


def test_topk_bad_input():
    hidden, weight, _, probs, idx = _problem(bias=False)
    lf = sa.linear_fenchel_young_loss
    with pytest.raises(ValueError, match="distinct"):
        lf(hidden, weight, (probs, idx[:, [0, 0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="at most 1"):
        lf(hidden, weight, (probs * 2, idx))
    with pytest.raises(ValueError, match="out of range"):
        lf(hidden, weight, (probs, idx + 100))
    with pytest.raises(ValueError, match="non-negative"):
        lf(hidden, weight, (-probs, idx))
    with pytest.raises(ValueError, match="shape"):
        lf(hidden, weight, (probs[:-1], idx[:-1]))
    with pytest.raises(TypeError, match="indices"):
        lf(hidden, weight, (probs, idx.double()))
    with pytest.raises(ValueError, match="label_smoothing"):
        lf(hidden, weight, (probs, idx), label_smoothing=0.1)
    with pytest.raises(ValueError, match="pair"):
        lf(hidden, weight, (probs, idx, idx))
    before = probs.clone()
    lf(hidden, weight, (probs, idx))
    assert torch.equal(probs, before)
