"""linear_fenchel_young_loss: same values and gradients as the unfused loss."""

import pytest
import torch
from conftest import needs_cuda

import softargmax as sa

F64 = torch.float64


@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("softmax", {}), ("sparsemax", {}), ("entmax", {"alpha": 1.3}),
                                            ("jensen_shannon", {}), ("alpha_relu", {"alpha": 1.5, "tau": 0.1})])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_equals_unfused(mapping, params, reduction):
    g = torch.Generator().manual_seed(0)
    N, d, V = 29, 12, 40
    h = torch.randn(2, N, d, dtype=F64, generator=g).requires_grad_()
    W = (torch.randn(V, d, dtype=F64, generator=g) * 0.5).requires_grad_()
    b = torch.randn(V, dtype=F64, generator=g).requires_grad_()
    t = torch.randint(0, V, (2, N), generator=g)
    t[0, 3] = t[1, 7] = -100
    cw = torch.rand(V, dtype=F64, generator=g) + 0.5
    for bias in (b, None):
        for extra in ({}, {"class_weight": cw}, {"label_smoothing": 0.1}):
            if mapping == "alpha_relu" and "label_smoothing" in extra:
                continue
            fused = sa.linear_fenchel_young_loss(h, W, t, bias, mapping=mapping, chunk_size=7, reduction=reduction, **extra, **params)
            ref_extra = {("weight" if k == "class_weight" else k): v for k, v in extra.items()}
            logits = h @ W.T + (bias if bias is not None else 0)
            ref = sa.fenchel_young_loss(logits, t, mapping, reduction=reduction, **ref_extra, **params)
            torch.testing.assert_close(fused, ref)
            inputs = (h, W) if bias is None else (h, W, b)
            gf = torch.autograd.grad(fused * 1.7, inputs)
            gr = torch.autograd.grad(ref * 1.7, inputs)
            for a, c in zip(gf, gr):
                torch.testing.assert_close(a, c)


def test_fused_soft_labels_and_float32():
    N, d, V = 50, 8, 30
    h = torch.randn(N, d, requires_grad=True)
    W = torch.randn(V, d, requires_grad=True)
    y = torch.softmax(torch.randn(N, V), -1)
    fused = sa.linear_fenchel_young_loss(h, W, y, chunk_size=16)
    ref = sa.entmax15_loss(h @ W.T, y)
    torch.testing.assert_close(fused, ref)
    torch.testing.assert_close(torch.autograd.grad(fused, h)[0], torch.autograd.grad(ref, h)[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_takes_half_precision_soft_targets(dtype):
    # a teacher's softmax rounded to bfloat16 sums to 1 only within its rounding; the fused
    # loss accepts it as the unfused one does, with the gradient (p - y) W / N at the given y
    entmax = pytest.importorskip("entmax")
    g = torch.Generator().manual_seed(0)
    N, d, V = 40, 8, 50
    h = torch.randn(N, d, generator=g, requires_grad=True)
    W = torch.randn(V, d, generator=g)
    y = torch.softmax(torch.randn(N, V, generator=g) * 2, -1).to(dtype)
    fused = sa.linear_fenchel_young_loss(h, W, y, chunk_size=16)
    torch.testing.assert_close(fused, sa.entmax15_loss(h @ W.T, y))
    logits = h.detach().double() @ W.double().T
    want = (entmax.entmax15(logits, -1) - y.double()) @ W.double() / N
    torch.testing.assert_close(torch.autograd.grad(fused, h)[0].double(), want, rtol=0, atol=1e-6)


def test_fused_errors():
    h, W = torch.randn(4, 8), torch.randn(10, 8)
    t = torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match="'mean', 'sum' or 'none'"):
        sa.linear_fenchel_young_loss(h, W, t, reduction="batchmean")
    with pytest.raises(ValueError, match="last dimension"):
        sa.linear_fenchel_young_loss(torch.randn(4, 7), W, t)
    with pytest.raises(ValueError, match="out of range"):
        sa.linear_fenchel_young_loss(h, W, torch.tensor([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="chunk_size"):
        sa.linear_fenchel_young_loss(h, W, t, chunk_size=0)


def _explicit_softcap(x, c):
    return c * torch.tanh(x / c)


@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("softmax", {}), ("alpha_relu", {"alpha": 1.5, "tau": 0.1})])
def test_softcap_is_the_explicit_formula(mapping, params):
    """softcap=c equals the loss of c·tanh(x/c) computed by hand, values and gradients (autograd of the formula)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 20, dtype=F64, generator=g) * 30).requires_grad_()  # large: the cap matters
    t = torch.randint(0, 20, (7,), generator=g)
    got = sa.fenchel_young_loss(x, t, mapping, softcap=15.0, **params)
    want = sa.fenchel_young_loss(_explicit_softcap(x, 15.0), t, mapping, **params)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, x)[0], torch.autograd.grad(want, x)[0])
    assert not torch.allclose(got, sa.fenchel_young_loss(x, t, mapping, **params))  # the cap changed something
    with pytest.raises(ValueError, match="softcap"):
        sa.fenchel_young_loss(x, t, mapping, softcap=0.0, **params)


@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("sparsemax", {}), ("softmax", {}), ("jensen_shannon", {})])
def test_fused_softcap_equals_unfused(mapping, params):
    g = torch.Generator().manual_seed(1)
    N, d, V = 23, 10, 30
    h = (torch.randn(N, d, dtype=F64, generator=g) * 3).requires_grad_()
    W = torch.randn(V, d, dtype=F64, generator=g).requires_grad_()
    b = torch.randn(V, dtype=F64, generator=g).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    fused = sa.linear_fenchel_young_loss(h, W, t, b, mapping=mapping, chunk_size=6, softcap=5.0, **params)
    ref = sa.fenchel_young_loss(_explicit_softcap(h @ W.T + b, 5.0), t, mapping, **params)
    torch.testing.assert_close(fused, ref)
    for a, c in zip(torch.autograd.grad(fused, (h, W, b)), torch.autograd.grad(ref, (h, W, b))):
        torch.testing.assert_close(a, c)


def test_chunks_follow_the_memory_budget():
    from softargmax.losses._linear_chunks import chunk_tokens

    V = 1000
    assert chunk_tokens(V, torch.float32, 10**9) > chunk_tokens(V, torch.float32, 10**8) > 1
    assert chunk_tokens(V, torch.float32, 1) == 1
    # half inputs need their float32 copies too: fewer tokens per byte than 2-byte elements alone would allow
    assert chunk_tokens(V, torch.bfloat16, 10**8) < 10**8 // (2 * V)
    assert chunk_tokens(V, torch.float32, 10**8, softcap=True) < chunk_tokens(V, torch.float32, 10**8)
    g = torch.Generator().manual_seed(2)
    h = torch.randn(40, 6, dtype=F64, generator=g).requires_grad_()
    W = torch.randn(V, 6, dtype=F64, generator=g).requires_grad_()
    t = torch.randint(0, V, (40,), generator=g)
    small = sa.linear_fenchel_young_loss(h, W, t, memory_budget=5 * 8 * 3 * V)  # a few tokens per chunk
    ref = sa.entmax15_loss(h @ W.T, t)
    torch.testing.assert_close(small, ref)
    torch.testing.assert_close(torch.autograd.grad(small, W)[0], torch.autograd.grad(ref, W)[0])
    with pytest.raises(ValueError, match="memory_budget"):
        sa.linear_fenchel_young_loss(h, W, t, memory_budget=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_half_matches_the_unfused_half_loss(dtype):
    """Half inputs: half GEMMs, float32 solver and accumulation; close to the unfused loss on the same half logits."""
    g = torch.Generator().manual_seed(3)
    N, d, V = 64, 32, 50
    h = torch.randn(N, d, generator=g).to(dtype).requires_grad_()
    W = (torch.randn(V, d, generator=g) * 0.3).to(dtype).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    fused = sa.linear_fenchel_young_loss(h, W, t, chunk_size=16)
    ref = sa.entmax15_loss(h @ W.T, t)
    torch.testing.assert_close(fused.float(), ref.float(), rtol=2e-2, atol=2e-3)
    for a, c in zip(torch.autograd.grad(fused, (h, W)), torch.autograd.grad(ref, (h, W))):
        assert a.dtype == dtype
        torch.testing.assert_close(a.float(), c.float(), rtol=5e-2, atol=2e-3)


@needs_cuda
def test_gpu_weight_gradient_accumulated_in_bfloat16_without_a_float32_buffer():
    """On CUDA the bf16 chunks stay bf16 and the weight gradient is accumulated in bf16 (tensor-core
    GEMMs accumulating in float32 inside): no float32 ``[V, d]`` buffer is allocated (the peak stays
    below one), and the gradient is within bf16 rounding of the float64 one over 8 chunks."""
    g = torch.Generator(device="cuda").manual_seed(4)
    N, d, V = 512, 256, 4096
    h = torch.randn(N, d, device="cuda", generator=g).bfloat16().requires_grad_()
    W = (torch.randn(V, d, device="cuda", generator=g) * 0.05).bfloat16().requires_grad_()
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = sa.linear_fenchel_young_loss(h, W, t, chunk_size=64)
    (gw,) = torch.autograd.grad(loss, W)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    chunk = 64 * V * 2
    assert gw.dtype == torch.bfloat16
    assert extra < V * d * 2 + 3 * chunk + N * d * 2 + 2**20 < V * d * 4 + V * d * 2  # no float32 [V, d]
    hd, Wd = h.detach().double().requires_grad_(), W.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(sa.entmax15_loss(hd @ Wd.T, t), Wd)
    torch.testing.assert_close(gw.double(), ref, rtol=2e-2, atol=4 * 2**-8 * float(ref.abs().max()))


# the names of torch.nn.functional.linear_cross_entropy (PyTorch 2.13): linear_weight, linear_bias, weight as class
# weights (class_weight here), ignore_index=None for -100; mapping="kl" is its cross-entropy
TORCH_LINEAR_CE = getattr(torch.nn.functional, "linear_cross_entropy", None)


@pytest.mark.skipif(TORCH_LINEAR_CE is None, reason="torch.nn.functional.linear_cross_entropy needs PyTorch >= 2.13")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", [{}, {"class_weight": True}, {"label_smoothing": 0.2}, {"ignore_index": None},
                                     {"ignore_index": 3}])
def test_torch_linear_cross_entropy_call(reduction, options):
    g = torch.Generator().manual_seed(1)
    N, d, V = 13, 6, 9
    h = torch.randn(N, d, dtype=F64, generator=g).requires_grad_()
    W = torch.randn(V, d, dtype=F64, generator=g).requires_grad_()
    b = torch.randn(V, dtype=F64, generator=g).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    ignored = options.get("ignore_index", -100)
    t[2] = -100 if ignored is None else ignored   # None means -100, as in linear_cross_entropy
    t[5] = 3
    cw = torch.rand(V, dtype=F64, generator=g) + 0.5
    ours_options = {k: (cw if k == "class_weight" else v) for k, v in options.items()}
    torch_options = {("weight" if k == "class_weight" else k): v for k, v in ours_options.items()}
    ours = sa.linear_fenchel_young_loss(h, linear_weight=W, target=t, linear_bias=b, mapping="kl", chunk_size=4,
                                        reduction=reduction, **ours_options)
    ref = TORCH_LINEAR_CE(h, W, t, linear_bias=b, reduction=reduction, **torch_options)
    if "label_smoothing" in options:
        # the Fenchel-Young loss is KL(y || softmax): cross-entropy less the entropy of the smoothed target y, a
        # constant (the loss is 0 where the prediction equals y); the gradients are the same
        eps = options["label_smoothing"]
        y = torch.full((V,), eps / V, dtype=F64) + (1 - eps) * torch.eye(V, dtype=F64)[0]
        entropy = -(y * y.log()).sum() * (t != -100)
        ref = ref - {"none": entropy, "sum": entropy.sum(), "mean": entropy.sum() / (t != -100).sum()}[reduction]
    torch.testing.assert_close(ours, ref)
    upstream = torch.rand_like(ref) + 0.5
    for a, c in zip(torch.autograd.grad((ours * upstream).sum(), (h, W, b)),
                    torch.autograd.grad((ref * upstream).sum(), (h, W, b))):
        torch.testing.assert_close(a, c)
    # the earlier names give the same loss
    torch.testing.assert_close(sa.linear_fenchel_young_loss(h, W, t, b, "kl", 4, reduction=reduction, **ours_options),
                               ours)


def test_projection_names():
    g = torch.Generator().manual_seed(2)
    h, W, b = torch.randn(5, 4, generator=g), torch.randn(7, 4, generator=g), torch.randn(7, generator=g)
    t = torch.randint(0, 7, (5,), generator=g)
    expected = sa.entmax15_loss(h @ W.T + b, t)
    for call in ({"weight": W, "bias": b}, {"linear_weight": W, "linear_bias": b}, {"weight": W, "linear_bias": b},
                 {"linear_weight": W, "bias": b}):
        torch.testing.assert_close(sa.linear_fenchel_young_loss(h, target=t, **call), expected)
    # a call ported from linear_cross_entropy with class weights as weight=: the error says where they go
    with pytest.raises(TypeError, match="class_weight"):
        sa.linear_fenchel_young_loss(h, linear_weight=W, target=t, weight=torch.ones(7))
    with pytest.raises(TypeError, match="linear_bias and bias"):
        sa.linear_fenchel_young_loss(h, W, t, b, linear_bias=b)
    with pytest.raises(TypeError, match="linear_weight"):
        sa.linear_fenchel_young_loss(h, target=t)
    with pytest.raises(TypeError, match="target"):
        sa.linear_fenchel_young_loss(h, W)
