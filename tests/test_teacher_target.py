"""teacher_target: a teacher's logits as the dense or top-k target of the fused loss."""

import math

import pytest
import torch

import softargmax as sa
from softargmax.losses import teacher

F64 = torch.float64


def _logits(shape=(3, 7, 40), dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=F64) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_dense_and_top_k_are_the_tempered_softmax(dtype, temperature, monkeypatch):
    monkeypatch.setattr(teacher, "_CHUNK_BYTES", 5 * 40 * 8)  # chunks of 5 (float64) or 10 rows: 21 rows in all
    logits = _logits(dtype=dtype)
    before = logits.clone()
    want = torch.softmax(logits.double() / temperature, -1)
    cdt = F64 if dtype == F64 else torch.float32
    dense = sa.teacher_target(logits, temperature)
    assert dense.dtype == cdt and dense.shape == logits.shape
    tol = dict(rtol=1e-12, atol=1e-15) if dtype == F64 else dict(rtol=2e-6, atol=1e-8)
    torch.testing.assert_close(dense.double(), want, **tol)
    probs, idx = sa.teacher_target(logits, temperature, top_k=6)
    assert probs.shape == idx.shape == (3, 7, 6) and probs.dtype == cdt
    assert torch.equal(idx, logits.double().topk(6).indices)
    torch.testing.assert_close(probs.double(), want.gather(-1, idx), **tol)
    assert bool((probs.sum(-1) < 1).all())  # not renormalized: the rest is the loss's to spread
    assert torch.equal(logits, before)


def test_the_fused_loss_on_teacher_targets_equals_the_unfused_loss():
    """Dense: fenchel_young_loss against softmax(teacher / T); top-k: against the spread-out dense teacher."""
    g = torch.Generator().manual_seed(1)
    T, k, V = 2.0, 5, 40
    teacher_logits = _logits((2, 6, V), seed=2)
    h = torch.randn(2, 6, 8, dtype=F64, generator=g).requires_grad_()
    W = torch.randn(V, 8, dtype=F64, generator=g).requires_grad_()
    y = torch.softmax(teacher_logits / T, -1)
    probs, idx = y.topk(k)
    spread = ((1 - probs.sum(-1, keepdim=True)) / (V - k)).expand_as(y).clone().scatter_(-1, idx, probs)
    for target, dense in ((sa.teacher_target(teacher_logits, T), y),
                          (sa.teacher_target(teacher_logits, T, top_k=k), spread)):
        fused = sa.linear_fenchel_young_loss(h, W, target, mapping="entmax15", temperature=T, chunk_size=5)
        ref = sa.fenchel_young_loss(h @ W.T, dense, "entmax15", temperature=T)
        torch.testing.assert_close(fused, ref)
        for a, c in zip(torch.autograd.grad(fused, (h, W)), torch.autograd.grad(ref, (h, W))):
            torch.testing.assert_close(a, c)


def test_masked_classes_and_half_precision_teachers():
    logits = _logits((4, 30), dtype=torch.bfloat16, seed=3)
    logits[:, :5] = -math.inf  # classes the teacher rules out
    y = sa.teacher_target(logits)
    assert y.dtype == torch.float32 and bool((y[:, :5] == 0).all())
    probs, idx = sa.teacher_target(logits, top_k=30)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
    h, W = torch.randn(4, 6), torch.randn(30, 6)
    assert torch.isfinite(sa.linear_fenchel_young_loss(h, W, (probs, idx)))  # k = V: the pair sums to 1


def test_teacher_target_bad_input():
    logits = _logits((2, 10))
    with pytest.raises(ValueError, match="temperature"):
        sa.teacher_target(logits, 0.0)
    with pytest.raises(ValueError, match="top_k"):
        sa.teacher_target(logits, top_k=11)
    with pytest.raises(ValueError, match="top_k"):
        sa.teacher_target(logits, top_k=0)
    with pytest.raises(TypeError, match="top_k"):
        sa.teacher_target(logits, top_k=2.0)
    with pytest.raises(TypeError, match="logits"):
        sa.teacher_target(logits.long())
    with pytest.raises(ValueError, match="logits"):
        sa.teacher_target(torch.empty(3, 0))
    bad = logits.clone()
    bad[1] = -math.inf
    with pytest.raises(ValueError, match="logits"):
        sa.teacher_target(bad, top_k=2)
    bad[1, 3] = math.nan
    with pytest.raises(ValueError, match="logits"):
        sa.teacher_target(bad)
