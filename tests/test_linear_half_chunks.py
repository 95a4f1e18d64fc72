"""The fused linear loss with ``reduction="none"`` on half-precision chunks (the GPU kernels' route, here
Triton's interpreter): the chunks stay in bfloat16 as the reduced loss's do, the per-token values and
gradients match float64 and the reduced loss, and the ``[tokens, V]`` buffers are at most half the
bytes of the float32 chunks."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import softargmax as sa
from softargmax.losses import _linear_recompute, linear

F64 = torch.float64
BF16_U = 2.0 ** -8
MAPPINGS = ["entmax15", "softmax", "sparsemax", "alpha_relu"]


@pytest.fixture
def native_flags(monkeypatch):
    """The ``native`` flag of every per-token forward in the test."""
    seen = []
    forward = _linear_recompute.LinearFYPerToken.forward

    def spy(ctx, *args):
        seen.append(args[10] if len(args) > 10 else False)
        return forward(ctx, *args)

    monkeypatch.setattr(_linear_recompute.LinearFYPerToken, "forward", staticmethod(spy))
    return seen


def _problem(N=15, d=16, V=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=g).bfloat16()
    W = (torch.randn(V, d, generator=g) * 0.5).bfloat16()
    b = torch.randn(V, generator=g).bfloat16()
    t = torch.randint(0, V, (N,), generator=g)
    t[3] = -100
    return h, W, b, t, torch.randn(N, generator=g)


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("extra", [{}, {"label_smoothing": 0.1}, {"softcap": 3.0}, {"class_weight": True}])
def test_per_token_half_chunks_match_float64(triton_device, native_flags, mapping, extra):
    """bfloat16 per-token losses on the kernels' route keep their chunks in bfloat16 (``native``); each token's
    loss is within two bfloat16 units of the float64 loss of the same bfloat16 logits (exact to float32
    without the soft-cap, which rounds in bfloat16 as the reduced loss's does), and the gradients of a random
    per-token gradient within eight units of their largest entry, the reduced path's tolerance.  15 tokens in
    chunks of 7, an ignored token."""
    h, W, b, t, gout = _problem()
    opts = dict(extra)
    if opts.get("class_weight"):
        opts["class_weight"] = (torch.rand(W.shape[0], generator=torch.Generator().manual_seed(1)) + 0.5).bfloat16()
    dev = triton_device
    hh, WW, bb = (a.to(dev).requires_grad_() for a in (h, W, b))
    loss = sa.linear_fenchel_young_loss(hh, WW, t.to(dev), bb, mapping=mapping, chunk_size=7, reduction="none",
                                        **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in opts.items()})
    grads = torch.autograd.grad(loss, (hh, WW, bb), gout.to(dev))
    assert native_flags == [True] and loss.dtype == torch.float32
    hd, Wd, bd = (a.to(F64).requires_grad_() for a in (h, W, b))
    logits = torch.addmm(b, h, W.T).to(F64)  # the bfloat16 logits the fused loss computes, rounded once
    logits = logits + (torch.addmm(bd, hd, Wd.T) - torch.addmm(bd, hd, Wd.T).detach())  # the float64 graph
    if "softcap" in opts:
        c = opts.pop("softcap")
        logits = c * torch.tanh(logits / c)
    ref_opts = {("weight" if k == "class_weight" else k): (v.to(F64) if isinstance(v, torch.Tensor) else v)
                for k, v in opts.items()}
    ref = sa.fenchel_young_loss(logits, t, mapping, reduction="none", **ref_opts)
    ref_grads = torch.autograd.grad(ref, (hd, Wd, bd), gout.to(F64))
    err = (loss.detach().cpu().to(F64) - ref).abs()
    assert (err <= 2 * BF16_U * ref.abs() + 1e-6).all(), (err, ref)
    if "softcap" not in extra:
        assert (err <= 1e-5 * ref.abs() + 1e-6).all(), (err, ref)
    for a, c in zip(grads, ref_grads):
        assert float((a.cpu().to(F64) - c).abs().max()) <= 8 * BF16_U * float(c.abs().max())


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_per_token_half_chunks_equal_the_sum_reduction(triton_device, mapping):
    """With a gradient of ones the per-token loss is the ``"sum"`` loss: the values sum to its value, and the
    gradient of ``hidden`` is the same bits (the same kernel writes the same ``G`` per chunk; the weight's is
    accumulated in float32 here, in bfloat16 there)."""
    h, W, b, t, _ = _problem()
    dev = triton_device
    out = {}
    for reduction in ("none", "sum"):
        hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
        loss = sa.linear_fenchel_young_loss(hh, WW, t.to(dev), b.to(dev), mapping=mapping, chunk_size=7,
                                            reduction=reduction)
        grads = torch.autograd.grad(loss.sum(), (hh, WW))
        out[reduction] = (loss.detach(), grads)
    (per, (gh, gw)), (total, (gh_sum, gw_sum)) = out["none"], out["sum"]
    assert torch.allclose(per.sum(), total, rtol=1e-6, atol=1e-6)
    assert torch.equal(gh, gh_sum)
    assert float((gw.float() - gw_sum.float()).abs().max()) <= 4 * BF16_U * float(gw_sum.float().abs().max())


def test_per_token_half_statistics(triton_device, native_flags):
    """``return_stats`` with per-token losses in bfloat16: native chunks for entmax (its solver writes ``p``), and
    the support sizes of the float64 prediction of the same bfloat16 logits."""
    h, W, b, t, _ = _problem()
    dev = triton_device
    loss, stats = sa.linear_fenchel_young_loss(h.to(dev).requires_grad_(), W.to(dev), t.to(dev), b.to(dev),
                                               mapping="entmax15", chunk_size=7, reduction="none", return_stats=True)
    loss.sum().backward()
    assert native_flags == [True]
    p = sa.entmax15(torch.addmm(b, h, W.T).to(F64))
    assert torch.equal(stats.support_size.cpu(), (p > 0).sum(-1))


class ChunkBuffers(TorchDispatchMode):
    """The bytes of every new ``[rows, V]`` tensor made inside the block, by dtype (views, in-place results and
    meta tensors not counted): the chunk buffers of the fused loss."""

    def __init__(self, V):
        super().__init__()
        self.V, self.bytes = V, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: PLW3201  (PyTorch's hook)
        out = func(*args, **(kwargs or {}))
        given = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs))
                 if isinstance(a, torch.Tensor) and a.device.type != "meta"}
        for o in tree_leaves(out):
            if (isinstance(o, torch.Tensor) and o.device.type != "meta" and o.dim() == 2 and o.shape[1] == self.V
                    and o.shape[0] < self.V and o.untyped_storage().data_ptr() not in given
                    and not func.__name__.startswith("set_")):  # (the interpreter's own copies)
                self.bytes[o.dtype] = self.bytes.get(o.dtype, 0) + o.numel() * o.element_size()
        return out


@pytest.mark.parametrize("mapping", ["entmax15", "softmax"])
def test_per_token_half_chunk_buffers_are_half_the_bytes(triton_device, monkeypatch, mapping):
    """The ``[tokens, V]`` buffers of a bfloat16 per-token call (forward and backward, 2 chunks) are all bfloat16
    and at most half the bytes of the same call on float32 chunks (the route before: the chunks converted, the
    backward's prediction formed from the thresholds in PyTorch); measured 6144 against 29184 bytes for entmax
    (the logits and ``p``/``G`` per pass), 3072 against 26112 for softmax (``G`` written over the logits)."""
    N, V = 16, 48
    h, W, _, t, _ = _problem(N=N, V=V)
    dev = triton_device
    counts = {}
    for route in ("native", "float32"):
        if route == "float32":
            monkeypatch.setattr(linear, "kernel_device", lambda x: False)  # the chunks converted, as before
        hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
        with ChunkBuffers(V) as c:
            sa.linear_fenchel_young_loss(hh, WW, t.to(dev), mapping=mapping, chunk_size=8,
                                         reduction="none").backward(torch.ones(N, device=dev))
        counts[route] = c.bytes
    native, wide = sum(counts["native"].values()), sum(counts["float32"].values())
    assert set(counts["native"]) == {torch.bfloat16}, counts
    assert torch.float32 in counts["float32"]
    assert 2 * native <= wide, counts
    # the GEMMs' logits alone, 2 chunks x 2 passes x 8 tokens x V in bfloat16, are in both
    assert native >= 4 * 8 * V * 2


def test_per_token_half_chunks_hold_as_many_tokens_as_the_reduced_ones(triton_device, monkeypatch):
    """The default chunk of a bfloat16 per-token call counts the buffers it makes: as many tokens as the reduced
    loss's chunk at the same budget (logits and ``p``/``G``, 4 bytes per class: 5 tokens of V = 48 in 960 bytes),
    not the float32 route's extra buffer (2 tokens)."""
    chunks = {}
    for cls, key in ((_linear_recompute.LinearFYPerToken, "none"), (linear.LinearFY, "sum")):
        forward = cls.forward

        def spy(ctx, *args, forward=forward, key=key):
            chunks[key] = args[6]
            return forward(ctx, *args)

        monkeypatch.setattr(cls, "forward", staticmethod(spy))
    h, W, _, t, _ = _problem()
    dev = triton_device
    for reduction in ("none", "sum"):
        sa.linear_fenchel_young_loss(h.to(dev).requires_grad_(), W.to(dev), t.to(dev), mapping="entmax15",
                                     reduction=reduction, memory_budget=5 * 48 * 4)
    assert chunks == {"none": 5, "sum": 5}


@pytest.mark.parametrize("kind", ["probabilities", "top-k", "label sets"])
def test_per_token_half_chunks_with_dense_targets(triton_device, native_flags, kind):
    """Probability vectors, a teacher's top-k (dense per chunk) and label sets on bfloat16 per-token chunks:
    values exact to float32 and gradients within eight bfloat16 units, against float64."""
    h, W, _, _, gout = _problem()
    N, V = h.shape[0], W.shape[0]
    g = torch.Generator().manual_seed(2)
    soft = torch.softmax(torch.randn(N, V, generator=g) * 2, -1)
    top = soft.topk(5)
    labels = (torch.rand(N, V, generator=g) < 0.1).float()
    labels[:, 0] = 1.0
    if kind == "top-k":
        rest = (1 - top.values.sum(-1, keepdim=True)) / (V - 5)
        target, ref_target, opts = (top.values, top.indices), rest.expand(N, V).scatter(1, top.indices, top.values), {}
    else:
        target = soft if kind == "probabilities" else labels
        ref_target, opts = target, ({"multilabel": True} if kind == "label sets" else {})
    dev = triton_device
    hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
    dev_target = tuple(a.to(dev) for a in target) if isinstance(target, tuple) else target.to(dev)
    loss = sa.linear_fenchel_young_loss(hh, WW, dev_target, mapping="entmax15", chunk_size=7, reduction="none", **opts)
    grads = torch.autograd.grad(loss, (hh, WW), gout.to(dev))
    assert native_flags == [True]
    hd, Wd = h.to(F64).requires_grad_(), W.to(F64).requires_grad_()
    logits = (h @ W.T).to(F64) + (hd @ Wd.T - (hd @ Wd.T).detach())
    ref = sa.fenchel_young_loss(logits, ref_target.to(F64), "entmax15", reduction="none", **opts)
    ref_grads = torch.autograd.grad(ref, (hd, Wd), gout.to(F64))
    torch.testing.assert_close(loss.detach().cpu().to(F64), ref.detach(), rtol=1e-5, atol=1e-6)
    for a, c in zip(grads, ref_grads):
        assert float((a.cpu().to(F64) - c).abs().max()) <= 8 * BF16_U * float(c.abs().max())
