"""The fused linear + loss in half precision: chunks computed in the input's dtype on the GPU
kernels' route (here Triton's interpreter), the weight gradient accumulated in bfloat16 over
many chunks within a bound of the float64 one, and no host synchronization per call."""

import pytest
import torch
from test_loss_fast_paths import SyncCount

import softargmax as sa
from softargmax.losses import _linear_chunks

F64 = torch.float64
BF16_U = 2.0 ** -8


@pytest.fixture
def modes(monkeypatch):
    """The ``mode`` of every :class:`LinearFY` forward in the test."""
    seen = []
    forward = _linear_chunks.LinearFY.forward

    def spy(ctx, *args):
        seen.append(args[8] if len(args) > 8 else None)
        return forward(ctx, *args)

    monkeypatch.setattr(_linear_chunks.LinearFY, "forward", staticmethod(spy))
    return seen


def _problem(N=24, d=16, V=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=g).bfloat16()
    W = (torch.randn(V, d, generator=g) * 0.5).bfloat16()
    b = torch.randn(V, generator=g).bfloat16()
    t = torch.randint(0, V, (N,), generator=g)
    t[3] = -100
    return h, W, b, t


@pytest.mark.parametrize("mapping", ["entmax15", "softmax", "sparsemax", "alpha_relu"])
@pytest.mark.parametrize("extra", [{}, {"label_smoothing": 0.1}, {"softcap": 3.0}, {"class_weight": True},
                                   {"reduction": "sum"}])
def test_fused_half_chunks_stay_half(triton_device, modes, mapping, extra):
    """bfloat16 on the kernels' route: the chunks are not converted (mode ``"native"``), the loss is
    within two bfloat16 units of the float64 loss of the same bfloat16 logits, each gradient within
    eight units of its largest entry (``G`` is rounded to bfloat16 once, by truncation in Triton's
    interpreter, and the GEMMs that take it back round their bfloat16 results).  15 tokens in chunks of 7:
    two full chunks and a ragged one."""
    h, W, b, t = _problem(N=15)
    g = torch.Generator().manual_seed(1)
    opts = dict(extra)
    if opts.get("class_weight"):
        opts["class_weight"] = (torch.rand(W.shape[0], generator=g) + 0.5).bfloat16()
    dev = triton_device
    hh, WW, bb = (a.to(dev).requires_grad_() for a in (h, W, b))
    loss = sa.linear_fenchel_young_loss(hh, WW, t.to(dev), bb, mapping=mapping, chunk_size=7,
                                        **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in opts.items()})
    grads = torch.autograd.grad(loss * 1.5, (hh, WW, bb))
    assert modes == ["native"] and all(gr.dtype == torch.bfloat16 for gr in grads)
    hd, Wd, bd = (a.to(F64).requires_grad_() for a in (h, W, b))
    logits = (h @ W.T + b).to(F64)  # the bfloat16 logits the fused loss computes
    logits = logits + (hd @ Wd.T + bd - (hd @ Wd.T + bd).detach())  # with the float64 graph
    if "softcap" in opts:
        c = opts.pop("softcap")
        logits = c * torch.tanh(logits / c)
    ref_opts = {("weight" if k == "class_weight" else k): (v.to(F64) if isinstance(v, torch.Tensor) else v)
                for k, v in opts.items()}
    ref = sa.fenchel_young_loss(logits, t, mapping, **ref_opts)
    ref_grads = torch.autograd.grad(ref * 1.5, (hd, Wd, bd))
    assert abs(float(loss) - float(ref)) <= 2 * BF16_U * abs(float(ref)) + 1e-6
    for a, c in zip(grads, ref_grads):
        assert float((a.cpu().to(F64) - c).abs().max()) <= 8 * BF16_U * float(c.abs().max())


@pytest.mark.parametrize("mapping", ["entmax15", "sparsemax", "softmax", "alpha_relu"])
def test_fused_half_statistics(triton_device, modes, monkeypatch, mapping):
    """``return_stats`` in bfloat16 on the kernels' route: the threshold mappings keep their chunks in
    bfloat16 (mode ``"native"``; the softmax and α-ReLU kernels never form ``p``: ``"compute"``), and the
    statistics are those of the float64 prediction of the same bfloat16 logits: the support sizes
    (a bfloat16 ``p`` rounds no positive entry to 0) and the entropy within 1e-2, computed 4 rows at a
    time (``STATS_ROWS``, lowered here to cross slices within a chunk)."""
    from softargmax.losses import _prediction_stats

    monkeypatch.setattr(_prediction_stats, "STATS_ROWS", 4)
    h, W, b, t = _problem(N=15)
    dev = triton_device
    hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
    loss, stats = sa.linear_fenchel_young_loss(hh, WW, t.to(dev), b.to(dev), mapping=mapping, chunk_size=7,
                                               return_stats=True)
    loss.backward()
    assert modes == (["native"] if mapping in ("entmax15", "sparsemax") else ["compute"])
    logits = torch.addmm(b, h, W.T).to(F64)  # the bfloat16 logits of the fused loss, rounded once
    p = {"entmax15": sa.entmax15, "sparsemax": sa.sparsemax, "softmax": lambda x: torch.softmax(x, -1),
         "alpha_relu": lambda x: sa.alpha_relu(x, alpha=1.5)}[mapping](logits)
    assert stats.entropy.dtype == torch.float32
    assert torch.equal(stats.support_size.cpu(), (p > 0).sum(-1))
    # p rounded to bfloat16 (a relative error of at most 2 u, u = 2^-8: the interpreter truncates) moves
    # H = -Σ p log p by at most 2 u Σ p |log p + 1|
    H = -torch.special.xlogy(p, p).sum(-1)
    bound = 2 * BF16_U * torch.where(p > 0, p * (torch.log(p) + 1).abs(), torch.zeros_like(p)).sum(-1)
    err = (stats.entropy.cpu().to(F64) - H).abs()
    assert (err <= bound + 1e-6).all(), (err, bound)


def test_fused_half_on_the_cpu_converts_the_chunks(modes):
    """Without the kernels (the CPU's C and PyTorch solvers need float32) the chunks are converted."""
    h, W, b, t = _problem()
    sa.linear_fenchel_young_loss(h.requires_grad_(), W, t, b, chunk_size=7)
    assert modes == ["compute"]


def test_weight_gradient_accumulated_in_bfloat16_over_many_chunks():
    """The weight's gradient summed over 32 chunks in bfloat16 (each chunk's GEMM accumulates in
    float32 and rounds the running sum once): within ``(n + 2) u · |G|ᵀ|h|`` of the float64 sum
    (``n`` roundings of the running sum, one of ``G``, one of the result), and in practice within a
    few units of bfloat16's rounding of the result (measured: the error of a float32 accumulator
    plus at most about 2 units)."""
    g = torch.Generator().manual_seed(5)
    N, d, V, chunks = 1024, 32, 256, 32
    h = torch.randn(N, d, generator=g).bfloat16()
    W = (torch.randn(V, d, generator=g) * 0.3).bfloat16().requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    loss = sa.linear_fenchel_young_loss(h, W, t, mapping="softmax", chunk_size=N // chunks, reduction="sum")
    (gw,) = torch.autograd.grad(loss, W)
    assert gw.dtype == torch.bfloat16
    logits = (h.to(F64) @ W.detach().to(F64).T)
    G = torch.softmax(logits, -1) - torch.nn.functional.one_hot(t, V).to(F64)
    ref = G.T @ h.to(F64)
    bound = (chunks + 2) * BF16_U * (G.abs().T @ h.to(F64).abs())
    err = (gw.to(F64) - ref).abs()
    assert (err <= bound).all()
    # typical: a few units of the result's own rounding
    assert float(err.max()) <= 8 * BF16_U * float(ref.abs().max())


@pytest.mark.parametrize("mapping", ["entmax15", "softmax"])
def test_fused_no_host_sync_per_call(triton_device, mapping, monkeypatch):
    """The fused loss, forward + backward over 4 chunks, reads no value on the host beyond the
    target's validation (none with the checks off, as under CUDA-graph capture)."""
    from softargmax.losses import _targets

    monkeypatch.setattr(_targets, "values_checkable", lambda t: False)
    h, W, b, t = _problem()
    dev = triton_device
    hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
    with SyncCount() as c:
        sa.linear_fenchel_young_loss(hh, WW, t.to(dev), b.to(dev), mapping=mapping, chunk_size=7).backward()
        sa.linear_fenchel_young_loss(hh.float(), WW.float(), t.to(dev), mapping=mapping, chunk_size=7).backward()
    assert c.names == []


def test_default_chunks_hold_more_tokens_in_bfloat16():
    """The memory budget holds 2 bytes per class for the softmax loss's in-place kernel and 4 for the
    solver's prediction, against 16 for a chunk converted to float32."""
    V, budget = 131072, 2**30
    ct = _linear_chunks.chunk_tokens
    assert ct(V, torch.bfloat16, budget, native=True, in_place=True) == budget // (2 * V) == 4096
    assert ct(V, torch.bfloat16, budget, native=True) == budget // (4 * V) == 2048
    assert ct(V, torch.bfloat16, budget) == budget // (16 * V) == 512


def test_fused_mean_with_every_token_ignored_is_nan_with_zero_gradients():
    """As ``F.cross_entropy``: the mean over no token is NaN (0/0, the denominator kept on the device)
    and the gradients are 0."""
    g = torch.Generator().manual_seed(6)
    h = torch.randn(5, 4, dtype=F64, generator=g).requires_grad_()
    W = torch.randn(7, 4, dtype=F64, generator=g).requires_grad_()
    t = torch.full((5,), -100)
    for mapping in ("softmax", "entmax15"):
        loss = sa.linear_fenchel_young_loss(h, W, t, mapping=mapping, chunk_size=2)
        assert torch.isnan(loss)
        assert all((gr == 0).all() for gr in torch.autograd.grad(loss, (h, W)))
    ce = torch.nn.functional.cross_entropy(h @ W.T, t)
    assert torch.isnan(ce) and all((gr == 0).all() for gr in torch.autograd.grad(ce, (h, W)))
