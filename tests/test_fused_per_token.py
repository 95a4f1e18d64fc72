"""linear_fenchel_young_loss with reduction="none" (per-token losses, any incoming per-token gradient) and
return_stats (support size and entropy of the prediction): against the unfused loss on the full logits."""

import pytest
import torch

import softargmax as sa
from softargmax.divergences import get_divergence
from softargmax.losses import _row_losses

F64 = torch.float64
V = 23

_Q = torch.rand(V, dtype=F64, generator=torch.Generator().manual_seed(5)) + 0.5

MAPPINGS = {
    "softmax": ("softmax", {}),
    "kl_q_temperature": ("kl", {"q": _Q, "temperature": 1.7}),
    "sparsemax": ("sparsemax", {}),
    "entmax15": ("entmax15", {}),
    "entmax_1.3": ("entmax", {"alpha": 1.3}),
    "entmax_2.5": ("entmax", {"alpha": 2.5}),
    "alpha_relu": ("alpha_relu", {"alpha": 1.5, "tau": 0.1}),
    "jensen_shannon_q": ("jensen_shannon", {"q": _Q}),
    "alpha_div_q_temperature": (get_divergence("alpha", alpha=1.7), {"q": _Q, "temperature": 0.6}),
}

TARGETS = ["index", "class_weight", "label_smoothing", "soft", "multilabel", "topk", "softcap"]


def _problem(seed=0, N=9, d=6, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(2, N, d, dtype=F64, generator=g) * 1.5).to(dtype).requires_grad_()
    W = torch.randn(V, d, dtype=F64, generator=g).to(dtype).requires_grad_()
    b = torch.randn(V, dtype=F64, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (2, N), generator=g)
    labels[0, 2] = labels[1, 5] = -100
    soft = torch.softmax(torch.randn(2, N, V, dtype=F64, generator=g) * 2, -1)
    multi = (torch.rand(2, N, V, generator=g) < 0.2).to(F64)
    multi[..., 0] = 1.0
    # incoming per-token gradients: of both signs, one zero
    v = torch.randn(2, N, dtype=F64, generator=g)
    v[1, 1] = 0.0
    return h, W, b, labels, soft, multi, v


def _cases(kind, labels, soft, multi):
    """``(fused target, fused options, unfused target, unfused options)`` of one target kind."""
    if kind == "index":
        return labels, {}, labels, {}
    if kind == "class_weight":
        w = torch.linspace(0.5, 2.0, V, dtype=F64)
        return labels, {"class_weight": w}, labels, {"weight": w}
    if kind == "label_smoothing":
        return labels, {"label_smoothing": 0.1}, labels, {"label_smoothing": 0.1}
    if kind == "soft":
        return soft, {}, soft, {}
    if kind == "multilabel":
        return multi, {"multilabel": True}, multi, {"multilabel": True}
    if kind == "topk":
        probs, idx = soft.topk(4)
        rest = (1 - probs.sum(-1, keepdim=True)) / (V - 4)
        dense = rest.expand(soft.shape).clone().scatter_(-1, idx, probs)
        return (probs, idx), {}, dense, {}
    if kind == "softcap":
        return labels, {"softcap": 2.0}, labels, {"softcap": 2.0}
    raise ValueError(kind)


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_per_token_losses_and_gradients_equal_the_unfused(name, kind):
    mapping, params = MAPPINGS[name]
    h, W, b, labels, soft, multi, v = _problem()
    target, opts, ref_target, ref_opts = _cases(kind, labels, soft, multi)
    for bias in (b, None):
        fused = sa.linear_fenchel_young_loss(h, W, target, bias, mapping, chunk_size=4, reduction="none", **opts,
                                             **params)
        logits = h @ W.T + (0 if bias is None else bias)
        ref = sa.fenchel_young_loss(logits, ref_target, mapping, reduction="none", **ref_opts, **params)
        assert fused.shape == ref.shape == (2, 9)
        torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-10)
        if kind in ("index", "class_weight", "label_smoothing", "softcap"):
            assert float(fused[0, 2].detach()) == 0.0 and float(fused[1, 5].detach()) == 0.0  # ignored tokens
        inputs = (h, W) if bias is None else (h, W, b)
        got = torch.autograd.grad((fused * v).sum(), inputs)
        want = torch.autograd.grad((ref * v).sum(), inputs)
        for a, c in zip(got, want):
            torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", sa.mappings.MAPPING_NAMES)
def test_every_mapping_name_per_token(name):
    """Every generator (reverse KL, Jeffrey, Hellinger, reverse chi-square, ...): soft targets, float64."""
    params = {"alpha": 1.4} if name in ("entmax", "alpha") else {}
    h, W, _, _, soft, _, v = _problem(seed=4)
    fused = sa.linear_fenchel_young_loss(h, W, soft, None, name, chunk_size=4, reduction="none", **params)
    ref = sa.fenchel_young_loss(h @ W.T, soft, name, reduction="none", **params)
    torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-10)
    for a, c in zip(torch.autograd.grad((fused * v).sum(), (h, W)), torch.autograd.grad((ref * v).sum(), (h, W))):
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax_2.5", "alpha_relu", "jensen_shannon_q",
                                  "alpha_div_q_temperature"])
@pytest.mark.parametrize("kind", ["index", "class_weight", "topk", "softcap"])
def test_per_token_gradcheck(name, kind):
    """Finite differences of the per-token losses (the whole Jacobian) on a tiny problem."""
    mapping, params = MAPPINGS[name]
    g = torch.Generator().manual_seed(3)
    h = torch.randn(3, 4, dtype=F64, generator=g).requires_grad_()
    W = torch.randn(V, 4, dtype=F64, generator=g).requires_grad_()
    b = torch.randn(V, dtype=F64, generator=g).requires_grad_()
    labels = torch.tensor([3, -100, 7])
    soft = torch.softmax(torch.randn(3, V, dtype=F64, generator=g) * 2, -1)
    target, opts, _, _ = _cases(kind, labels, soft, None)

    def f(h, W, b):
        return sa.linear_fenchel_young_loss(h, W, target, b, mapping, chunk_size=2, reduction="none", **opts,
                                            **params)

    assert torch.autograd.gradcheck(f, (h, W, b), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_backward_does_not_search_thresholds_again(monkeypatch):
    """The backward recomputes the logits and evaluates the prediction from the stored thresholds: no solve."""
    h, W, b, labels, *_ = _problem()
    calls = []
    solve = _row_losses.solve
    monkeypatch.setattr(_row_losses, "solve", lambda *a, **k: calls.append(1) or solve(*a, **k))
    loss = sa.linear_fenchel_young_loss(h, W, labels, b, "entmax15", chunk_size=4, reduction="none")
    assert len(calls) == 5  # one per chunk (18 tokens, 4 per chunk)
    loss.sum().backward()
    assert len(calls) == 5


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_per_token_lower_precision(dtype, tol):
    """float32 and bfloat16 inputs: losses (in float32) and gradients close to the float64 computation."""
    h, W, b, labels, _, _, v = _problem(dtype=dtype)
    fused = sa.linear_fenchel_young_loss(h, W, labels, b, "entmax15", chunk_size=5, reduction="none")
    assert fused.dtype == torch.float32
    h64, W64, b64 = (t.detach().double().requires_grad_() for t in (h, W, b))
    ref = sa.entmax15_loss(h64 @ W64.T + b64, labels, reduction="none")
    torch.testing.assert_close(fused.double(), ref, rtol=tol, atol=tol)
    got = torch.autograd.grad((fused * v.float()).sum(), (h, W, b))
    want = torch.autograd.grad((ref * v).sum(), (h64, W64, b64))
    for a, c in zip(got, want):
        torch.testing.assert_close(a.double(), c, rtol=tol, atol=tol * float(c.abs().max()))


def test_per_token_sum_is_the_sum_reduction_and_no_token_is_empty():
    h, W, b, labels, *_ = _problem()
    per = sa.linear_fenchel_young_loss(h, W, labels, b, "sparsemax", chunk_size=4, reduction="none")
    total = sa.linear_fenchel_young_loss(h, W, labels, b, "sparsemax", chunk_size=4, reduction="sum")
    torch.testing.assert_close(per.sum(), total)
    for a, c in zip(torch.autograd.grad(per.sum(), (h, W, b)), torch.autograd.grad(total, (h, W, b))):
        torch.testing.assert_close(a, c)
    empty = sa.linear_fenchel_young_loss(h[:, :0], W, labels[:, :0], b, reduction="none")
    assert empty.shape == (2, 0)
    empty.sum().backward()


def _reference_stats(p):
    return -torch.special.xlogy(p, p).sum(-1), (p > 0).sum(-1)


@pytest.mark.parametrize("name", list(MAPPINGS))
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_stats_equal_the_unfused_prediction(name, reduction):
    """Support size and Shannon entropy of the prediction, per token, from the unfused loss's prediction on the
    full logits; the loss and its gradients are those without statistics."""
    mapping, params = MAPPINGS[name]
    h, W, b, _labels, soft, *_ = _problem(seed=1)
    h = (h * 3).detach().requires_grad_()  # spread-out logits: sparse predictions
    loss, stats = sa.linear_fenchel_young_loss(h, W, soft, b, mapping, chunk_size=4, reduction=reduction,
                                               return_stats=True, **params)
    plain = sa.linear_fenchel_young_loss(h, W, soft, b, mapping, chunk_size=4, reduction=reduction, **params)
    torch.testing.assert_close(loss, plain, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(loss.sum(), h)[0], torch.autograd.grad(plain.sum(), h)[0])
    _, p = sa.fenchel_young_loss(h.detach() @ W.detach().T + b.detach(), soft, mapping, return_prediction=True,
                                 **params)
    entropy, support = _reference_stats(p)
    assert isinstance(stats, sa.losses.linear.PredictionStats)
    assert stats.support_size.dtype == torch.long and stats.support_size.shape == (2, 9)
    torch.testing.assert_close(stats.entropy, entropy, rtol=1e-10, atol=1e-12)
    assert torch.equal(stats.support_size, support)
    if name in ("softmax", "kl_q_temperature", "jensen_shannon_q"):
        assert bool((support == V).all())
    elif name in ("sparsemax", "entmax15"):
        assert int(support.min()) < V


def test_stats_of_entmax15_match_the_entmax_package():
    entmax = pytest.importorskip("entmax")
    h, W, b, labels, *_ = _problem(seed=2)
    _, stats = sa.linear_fenchel_young_loss(h * 3, W, labels, b, "entmax15", chunk_size=5, return_stats=True)
    p = entmax.entmax15((h * 3).detach() @ W.detach().T + b.detach(), dim=-1)
    entropy, support = _reference_stats(p)
    assert torch.equal(stats.support_size, support)
    torch.testing.assert_close(stats.entropy, entropy)
    assert 1 <= int(support.min()) and int(support.max()) < V


def test_stats_with_a_float32_model_and_the_default_chunks():
    g = torch.Generator().manual_seed(0)
    h, W = torch.randn(40, 16, generator=g) * 2, torch.randn(300, 16, generator=g)
    labels = torch.randint(0, 300, (40,), generator=g)
    _, stats = sa.linear_fenchel_young_loss(h, W, labels, mapping="sparsemax", return_stats=True)
    _, p = sa.sparsemax_loss(h @ W.T, labels, return_prediction=True)
    entropy, support = _reference_stats(p)
    torch.testing.assert_close(stats.entropy, entropy)
    assert torch.equal(stats.support_size, support)


def test_per_token_and_stats_bad_input():
    h, W, t = torch.randn(4, 8), torch.randn(10, 8), torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match="reduction"):
        sa.linear_fenchel_young_loss(h, W, t, reduction="batchmean")
    with pytest.raises(TypeError, match="return_stats"):
        sa.linear_fenchel_young_loss(h, W, t, return_stats="yes")
    group = object()  # refused before any communication
    with pytest.raises(ValueError, match="process_group"):
        sa.linear_fenchel_young_loss(h, W, t, reduction="none", process_group=group)
    with pytest.raises(ValueError, match="process_group"):
        sa.linear_fenchel_young_loss(h, W, t, return_stats=True, process_group=group)
