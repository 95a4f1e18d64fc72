"""The loss fast paths: half-precision rows computed in their dtype by the GPU kernels (here in
Triton's interpreter), the loss epilogue kernels against the PyTorch path, no host
synchronization per call, and the in-place backward's autograd semantics."""

import math

import pytest
import torch
from conftest import needs_cuda
from torch.overrides import TorchFunctionMode

import softargmax as sa
from softargmax.backends.triton import rows as _triton_rows

F64 = torch.float64
BF16_U = 2.0 ** -8  # unit roundoff of bfloat16

#: the tensor methods that read a value on the host (a device synchronization on a GPU), and the
#: data-dependent shapes (nonzero, boolean indexing) that need one
SYNCS = {"__bool__", "item", "tolist", "cpu", "numpy", "__int__", "__float__", "__index__", "__array__", "nonzero",
         "masked_select", "unique", "argwhere"}


class SyncCount(TorchFunctionMode):
    """Counts the host reads of tensor values during a call (``names``).  A 0-d float64 tensor is a
    host constant (``f(0)`` of a generator), never a device value, and is not counted."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: PLW3201 (TorchFunctionMode's hook)
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        constant = isinstance(first, torch.Tensor) and first.dim() == 0 and first.dtype == F64
        if name in SYNCS and not constant:
            self.names.append(name)
        if name == "__getitem__" and len(args) > 1:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx):
                self.names.append("boolean index")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def kernels(triton_device):
    """The GPU kernels' route: CUDA, or CPU tensors in Triton's interpreter."""
    return triton_device


def _case(kind, R=6, k=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(R, k, generator=g) * 3).bfloat16().float()  # exactly representable in bfloat16
    x[1, 5] = -math.inf
    t = torch.randint(0, k, (R,), generator=g)
    t[2] = -100
    opts = {}
    if kind == "dense":
        t = torch.softmax(torch.randn(R, k, generator=g), -1)
    elif kind == "smooth":
        opts = {"label_smoothing": 0.1}
    elif kind == "weight":
        opts = {"weight": (torch.rand(k, generator=g) + 0.5).bfloat16().float()}
    return x, t, opts


def _loss_and_grad(x, t, mapping, dtype, opts, params, device):
    xx = x.to(device=device, dtype=dtype).requires_grad_()
    tt = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    o = {k: (v.to(device=device, dtype=dtype) if isinstance(v, torch.Tensor) else v) for k, v in opts.items()}
    loss = sa.fenchel_young_loss(xx, tt, mapping, reduction="none", **o, **params)
    weights = torch.arange(1, x.shape[0] + 1, device=device, dtype=F64)
    (loss.to(F64) * weights).sum().backward()
    return loss.detach().cpu().to(F64), xx.grad.cpu().to(F64), loss.dtype, xx.grad.dtype


@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("sparsemax", {}), ("entmax", {"alpha": 1.3}),
                                            ("softmax", {}), ("alpha_relu", {"alpha": 1.5, "tau": 0.5}),
                                            ("alpha_relu", {"alpha": 1.25, "tau": -0.25})])
@pytest.mark.parametrize("kind", ["index", "dense", "smooth", "weight"])
def test_half_rows_stay_half_and_match_float64(kernels, mapping, params, kind):
    """bfloat16 scores on the kernels' route: the value within bfloat16's rounding of the float64
    loss (its per-row value is rounded once, from float32 row sums), the gradient within three
    roundings (p, p - y, the incoming gradient) of each row's largest entry; losses >= 0."""
    x, t, opts = _case(kind)
    l16, g16, ldt, gdt = _loss_and_grad(x, t, mapping, torch.bfloat16, opts, params, kernels)
    l64, g64, _, _ = _loss_and_grad(x, t, mapping, F64, opts, params, "cpu")
    assert gdt == torch.bfloat16 and ldt == (torch.float32 if kind == "weight" else torch.bfloat16)  # as before
    assert torch.equal(torch.isinf(l16), torch.isinf(l64)) and not torch.isnan(l16).any()
    fin = torch.isfinite(l64)
    assert (l16[fin] >= 0).all()
    assert ((l16 - l64)[fin].abs() <= BF16_U * l64[fin].abs() + 1e-6).all()
    row_max = g64.abs().amax(-1, keepdim=True)
    assert ((g16 - g64).abs() <= 3 * BF16_U * row_max + 1e-7).all()
    if kind != "dense":
        assert (g16[2] == 0).all()  # the ignored row


@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("softmax", {}), ("alpha_relu", {"alpha": 1.5, "tau": 0.5})])
def test_half_rows_save_half_gradient_only(kernels, mapping, params, monkeypatch):
    """The autograd graph keeps one bfloat16 tensor, G, and no float32 copy of the scores."""
    x, t, _ = _case("index")
    xx = x.to(device=kernels, dtype=torch.bfloat16).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s) or s, lambda s: s):
        loss = sa.fenchel_young_loss(xx, t.to(kernels), mapping, **params)
    rows = [s for s in saved if s.dim() == 2]  # (the mean's denominator is a saved scalar)
    assert [(s.dtype, tuple(s.shape)) for s in rows] == [(torch.bfloat16, tuple(x.shape))]
    assert rows[0].data_ptr() != xx.data_ptr()
    loss.backward()


@pytest.mark.parametrize("mapping,dtype", [("entmax15", torch.bfloat16), ("sparsemax", torch.float32),
                                           ("softmax", torch.bfloat16), ("softmax", torch.float32)])
def test_no_host_sync_per_call(kernels, mapping, dtype, monkeypatch):
    """Forward + backward read no value on the host beyond the target's validation: none with the
    checks off (as under CUDA-graph capture), one with them on (the class-index range check)."""
    from softargmax.losses import _targets

    x, t, _ = _case("index", R=16, k=64)
    xx = x.to(device=kernels, dtype=dtype).requires_grad_()
    tt = t.to(kernels)
    with SyncCount() as checked:
        sa.fenchel_young_loss(xx, tt, mapping).backward()
    monkeypatch.setattr(_targets, "values_checkable", lambda t: False)
    with SyncCount() as hot:
        sa.fenchel_young_loss(xx, tt, mapping).backward()
        sa.fenchel_young_loss(xx, torch.softmax(x, -1).to(kernels, dtype), mapping).backward()
    assert hot.names == []
    assert checked.names == ["__bool__"]


def test_sync_counter_sees_a_sync():
    """The counter itself: a host read of a device value is counted."""
    with SyncCount() as c:
        bool(torch.ones(3).all())
        torch.arange(4)[torch.arange(4) > 1]
    assert c.names == ["__bool__", "boolean index"]


@pytest.mark.parametrize("mapping", ["entmax15", "softmax", "alpha_relu"])
def test_backward_twice_with_retained_graph(mapping):
    """The backward scales the saved gradient in place only when the graph is freed: with
    ``retain_graph=True`` a second backward gives the same gradient again."""
    x, t, _ = _case("index")
    x = x.clone().requires_grad_()
    loss = sa.fenchel_young_loss(x, t, mapping)
    (g1,) = torch.autograd.grad(loss * 2.0, x, retain_graph=True)
    (g2,) = torch.autograd.grad(loss * 2.0, x)
    torch.testing.assert_close(g1, g2)
    ref = x.detach().clone().requires_grad_()
    torch.testing.assert_close(g1, torch.autograd.grad(sa.fenchel_young_loss(ref, t, mapping) * 2.0, ref)[0])


def test_gradient_aliases_nothing_the_caller_holds():
    """The gradient handed to autograd is the loss's own buffer, not the scores or the prediction."""
    x, t, _ = _case("index")
    x = x.clone().requires_grad_()
    loss, p = sa.entmax15_loss(x, t, return_prediction=True)
    p_before = p.clone()
    loss.backward()
    assert torch.equal(p, p_before) and x.grad.data_ptr() not in (x.data_ptr(), p.data_ptr())


def test_softmax_without_sync_keeps_masked_rows():
    """The softmax loss (no host test of the masked rows): an all-masked row gives loss +inf and
    p = 0, +inf scores give NaN, as log_softmax's form did."""
    x = torch.randn(3, 5, dtype=F64)
    x[0] = -math.inf
    x[1, 2] = math.inf
    t = torch.tensor([1, 0, 2])
    loss, p = sa.fenchel_young_loss(x, t, "softmax", reduction="none", return_prediction=True)
    assert loss[0] == math.inf and (p[0] == 0).all()
    assert torch.isnan(loss[1]) and torch.isnan(p[1]).all()
    torch.testing.assert_close(loss[2], torch.nn.functional.cross_entropy(x[2:], t[2:]))


def _kernel_rows(seed, dense, plus_inf):
    """``(generator, z, idx, keep, scale, y)`` for the loss kernels' tests: 7 rows of 37 scores, an all -inf row, a
    -inf entry, a NaN row, (``plus_inf``) a +inf entry, a NaN in row 5, which is ignored; class indices, row
    scales and the targets (one-hot, or softmax rows with ``dense``)."""
    g = torch.Generator().manual_seed(seed)
    R, k = 7, 37
    z = torch.randn(R, k, generator=g) * 3
    z[1] = -math.inf
    z[2, 3] = -math.inf
    z[3, 4] = math.nan
    if plus_inf:
        z[4, 5] = math.inf
    z[5, 6] = math.nan  # in an ignored row: G = 0 there all the same
    idx = torch.randint(0, k, (R,), generator=g)
    keep = torch.ones(R, dtype=torch.bool)
    keep[5] = False
    scale = torch.rand(R, generator=g)
    y = torch.softmax(torch.randn(R, k, generator=g), -1) if dense else torch.nn.functional.one_hot(idx, k).float()
    return g, z, idx, keep, scale, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dense", [False, True])
def test_loss_kernels_match_pytorch(kernels, dtype, dense, monkeypatch):
    """The epilogue kernels against PyTorch: ``G = (p - y) · s`` (0 in ignored rows, NaN rows included)
    and the softmax kernel's ``log Σ e^z``, ``⟨y, z⟩`` and ``G``, streamed in blocks of 16.  Half results
    within two units of bfloat16's rounding: Triton's interpreter converts float32 to bfloat16 by
    truncation (a GPU rounds to nearest)."""
    from softargmax.backends.triton import losses as L

    monkeypatch.setattr(L, "SOFTMAX_BLOCK", 16)
    monkeypatch.setattr(L, "BLOCK", 16)
    g, z, idx, keep, scale, y = _kernel_rows(3, dense, plus_inf=True)
    R, k = z.shape
    zz = z.to(dtype)
    dev = lambda a: a.to(kernels)  # noqa: E731
    G, lse, zy = L.softmax_gradient(dev(zz), None if dense else dev(idx), dev(y) if dense else None, dev(keep),
                                    dev(scale))
    zf = zz.float()
    lse_ref = torch.logsumexp(zf, -1)
    lse_ref = torch.where(lse_ref == math.inf, math.nan, lse_ref)
    p = torch.exp(zf - torch.where(lse_ref == -math.inf, 0.0, lse_ref)[:, None])
    G_ref = torch.where(keep[:, None], (p - y) * scale[:, None], 0.0)
    torch.testing.assert_close(lse.cpu(), lse_ref, equal_nan=True)
    torch.testing.assert_close(G.cpu().float(), G_ref, equal_nan=True, rtol=2 * BF16_U if dtype != torch.float32 else 1e-6,
                               atol=1e-6)
    zy_ref = torch.where(y > 0, y * zf, 0.0).sum(-1)
    ok = [0, 2, 6]  # the finite rows
    torch.testing.assert_close(zy.cpu()[ok], zy_ref[ok])
    pp = torch.rand(R, k, generator=g).to(dtype)
    pp[3, 1] = math.nan
    G2 = L.gradient(dev(pp.clone()), None if dense else dev(idx), dev(y) if dense else None, dev(keep), dev(scale))
    G2_ref = torch.where(keep[:, None], (pp.float() - y) * scale[:, None], 0.0)
    torch.testing.assert_close(G2.cpu().float(), G2_ref, equal_nan=True,
                               rtol=2 * BF16_U if dtype != torch.float32 else 1e-6, atol=1e-6)
    # in place: G over p
    inplace = dev(pp.clone())
    out = L.gradient(inplace, None if dense else dev(idx), dev(y) if dense else None, dev(keep), out=inplace)
    assert out is inplace
    torch.testing.assert_close(out.cpu().float(), torch.where(keep[:, None], pp.float() - y, 0.0), equal_nan=True,
                               rtol=2 * BF16_U if dtype != torch.float32 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("alpha,tau", [(1.5, 0.5), (2.0, 0.0), (1.25, -0.25)])
def test_alpha_relu_loss_kernel_matches_pytorch(kernels, dtype, dense, alpha, tau, monkeypatch):
    """The α-ReLU loss kernel against PyTorch's formulas (``t = [a z - τ]_+``, ``p = t^{1/a}``): ``G = (p - y) · s``
    (0 in the ignored row, NaN in kept NaN rows), ``Σ p t``, ``⟨y, z - τ/a⟩`` over ``y > 0`` and ``Σ y^α``, streamed
    in blocks of 16; in place (``G`` over ``z``: the class score is read first); α with a closed-form power
    (1.5, 2) and the general one.  Half results within two units of bfloat16's rounding (the interpreter
    truncates)."""
    from softargmax.backends.triton import losses as L

    monkeypatch.setattr(L, "SOFTMAX_BLOCK", 16)
    _, z, idx, keep, scale, y = _kernel_rows(8, dense, plus_inf=False)
    zz = z.to(dtype)
    dev = lambda a: a.to(kernels)  # noqa: E731
    a = alpha - 1.0
    zf = zz.double()
    t = (zf * a - tau).clamp(min=0)
    p = t ** (1.0 / a)
    G_ref = torch.where(keep[:, None], (p - y.double()) * scale.double()[:, None], 0.0)
    spt_ref = (p * t).sum(-1)
    zy_ref = torch.where(y > 0, y.double() * (zf - tau / a), 0.0).sum(-1)
    half = dtype != torch.float32
    for inplace in (False, True):
        zd = dev(zz.clone())
        G, spt, zy, ya = L.alpha_relu_gradient(zd, None if dense else dev(idx), dev(y) if dense else None, dev(keep),
                                               alpha, tau, dev(scale), out=zd if inplace else None)
        assert (G.data_ptr() == zd.data_ptr()) == inplace and G.dtype == dtype
        torch.testing.assert_close(G.cpu().double(), G_ref, equal_nan=True, rtol=2 * BF16_U if half else 1e-6,
                                   atol=1e-6)
        torch.testing.assert_close(spt.cpu().double(), spt_ref, equal_nan=True, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(zy.cpu().double(), zy_ref, rtol=1e-5, atol=1e-5, equal_nan=True)
        if dense:
            torch.testing.assert_close(ya.cpu().double(), (y.double() ** alpha).sum(-1), rtol=1e-5, atol=1e-6)
        else:
            assert ya is None
    assert L.alpha_relu_gradient(dev(zz), dev(idx), None, dev(keep), 2.5, 0.0) is None  # (a > 1: PyTorch's path)


@pytest.mark.parametrize("kind", ["index", "dense", "smooth", "weight"])
def test_alpha_relu_loss_takes_the_kernel(kernels, kind, monkeypatch):
    """``alpha_relu_loss`` on the kernels' route runs the one loss kernel (forward) and the backward's scaling, and
    equals the PyTorch path in float32 (values and gradients; a masked entry and an ignored row)."""
    from softargmax.backends.triton import losses as L

    calls = []
    real = L.alpha_relu_gradient
    monkeypatch.setattr(L, "alpha_relu_gradient", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x, t, opts = _case(kind)
    fused = _loss_and_grad(x.clone(), t, "alpha_relu", torch.float32, opts, {"alpha": 1.5, "tau": 0.5}, kernels)
    assert calls == [1]
    ref = _loss_and_grad(x, t, "alpha_relu", F64, opts, {"alpha": 1.5, "tau": 0.5}, "cpu")
    torch.testing.assert_close(fused[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[1], ref[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scale_rows_kernel_matches_pytorch(kernels, dtype, monkeypatch):
    """The backward's kernel ``G · g_i`` per row against PyTorch's float32 product: exact in float32, within
    one unit of bfloat16's rounding (the interpreter truncates); in place and out of place (``G`` kept),
    an expanded scalar ``g`` (the mean's gradient) and a bfloat16 ``g``; NaN and -0 rows pass through."""
    from softargmax.backends.triton import losses as L

    monkeypatch.setattr(L, "BLOCK", 16)
    g = torch.Generator().manual_seed(5)
    R, k = 5, 37
    G = (torch.randn(R, k, generator=g) * 3).to(dtype)
    G[1, 2] = math.nan
    G[3] = 0.0
    scale = torch.randn(R, generator=g)
    dev = lambda a: a.to(kernels)  # noqa: E731
    tol = {"rtol": 0.0, "atol": 0.0} if dtype == torch.float32 else {"rtol": 2 * BF16_U, "atol": 0.0}
    for s in (scale, scale[:1].expand(R), scale.bfloat16()):
        ref = G.float() * s.float()[:, None]
        Gd = dev(G.clone())
        out = L.scale_rows(Gd, dev(s))
        assert out is not None and out.dtype == dtype and out.data_ptr() != Gd.data_ptr()
        torch.testing.assert_close(Gd.cpu(), G, equal_nan=True, rtol=0.0, atol=0.0)  # out of place: G untouched
        torch.testing.assert_close(out.cpu().float(), ref, equal_nan=True, **tol)
        same = L.scale_rows(Gd, dev(s), out=Gd)
        assert same is Gd
        torch.testing.assert_close(Gd.cpu().float(), ref, equal_nan=True, **tol)
    assert L.scale_rows(dev(G), dev(scale[:2])) is None  # not one factor per row
    assert L.scale_rows(dev(G.double()), dev(scale)) is None  # float64 stays on the PyTorch path


@pytest.mark.parametrize("mapping", ["softmax", "alpha_relu"])
def test_no_host_sync_on_the_pytorch_path(mapping, monkeypatch):
    """The PyTorch path of the losses that need no threshold search reads no value on the host
    either (the ignored rows are masked without testing whether there are any)."""
    from softargmax.losses import _targets

    monkeypatch.setattr(_triton_rows, "_cpu_interpret", False)
    monkeypatch.setattr(_targets, "values_checkable", lambda t: False)
    x, t, _ = _case("index", R=16, k=64)
    xx = x.requires_grad_()
    with SyncCount() as c:
        sa.fenchel_young_loss(xx, t, mapping).backward()
        sa.fenchel_young_loss(xx, t, mapping, label_smoothing=0.1).backward()
    assert c.names == []


@needs_cuda
@pytest.mark.parametrize("mapping", ["entmax15", "sparsemax", "softmax"])
def test_gpu_losses_without_synchronization(mapping, monkeypatch):
    """On CUDA, forward + backward of the loss and of the fused loss (bfloat16) under
    ``torch.cuda.set_sync_debug_mode("error")``, with the target checks off (as under capture)."""
    from softargmax.losses import _targets

    monkeypatch.setattr(_targets, "values_checkable", lambda t: False)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 40000, device="cuda", generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, 40000, (64,), device="cuda", generator=g)
    h = torch.randn(256, 64, device="cuda", generator=g).bfloat16().requires_grad_()
    W = torch.randn(40000, 64, device="cuda", generator=g).bfloat16().requires_grad_()
    th = torch.randint(0, 40000, (256,), device="cuda", generator=g)
    for _ in range(2):  # the first call compiles
        torch.cuda.set_sync_debug_mode("error")
        try:
            sa.fenchel_young_loss(x, t, mapping).backward()
            sa.linear_fenchel_young_loss(h, W, th, mapping=mapping, chunk_size=64).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
