"""Fenchel-Young losses against independent references (cross_entropy, KL, entmax package, finite differences)."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import ALL_DIVERGENCES, div_id

import softargmax as sa
from softargmax.divergences import get_divergence
from softargmax.solvers import threshold

entmax_pkg = pytest.importorskip("entmax")
F64 = torch.float64
FINITE_F0 = [d for d in ALL_DIVERGENCES if math.isfinite(float(get_divergence(d[0], **d[1]).f(torch.zeros((), dtype=F64))))]


def _xt(n=6, k=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, k, dtype=F64, generator=g) * 2).requires_grad_()
    t = torch.randint(0, k, (n,), generator=g)
    return x, t


def test_kl_equals_cross_entropy_hard_labels_ignore_index_and_weight():
    x, t = _xt()
    t[2] = -100
    w = torch.rand(9, dtype=F64) + 0.2
    for kwargs in [{}, {"weight": w}, {"reduction": "sum"}, {"reduction": "none"}]:
        ours = sa.fenchel_young_loss(x, t, "softmax", **kwargs)
        ref = F.cross_entropy(x, t, **kwargs)
        torch.testing.assert_close(ours, ref)
        (g1,) = torch.autograd.grad(ours.sum(), x)
        (g2,) = torch.autograd.grad(ref.sum(), x)
        torch.testing.assert_close(g1, g2)
    # temperature: beta * KL(y || softmax(x / beta)) for one-hot y
    torch.testing.assert_close(sa.f_divergence_loss(x, t, "kl", temperature=2.0, ignore_index=-100),
                               2.0 * F.cross_entropy(x / 2.0, t))


def test_kl_soft_labels_is_kl_divergence_and_label_smoothing_gradients():
    x, t = _xt()
    y = torch.softmax(torch.randn(6, 9, dtype=F64), -1)
    ours = sa.fenchel_young_loss(x, y, "softmax", reduction="none")
    ref = F.kl_div(torch.log_softmax(x, -1), y, reduction="none").sum(-1)
    torch.testing.assert_close(ours, ref)
    for eps in [0.1, 0.3]:
        ours = sa.fenchel_young_loss(x, t, "softmax", label_smoothing=eps)
        ref = F.cross_entropy(x, t, label_smoothing=eps)
        (g1,) = torch.autograd.grad(ours, x)
        (g2,) = torch.autograd.grad(ref, x)
        torch.testing.assert_close(g1, g2)
        # values differ by the (constant) entropy of the smoothed target
        ys = (1 - eps) * F.one_hot(t, 9).to(F64) + eps / 9
        torch.testing.assert_close(ours, ref + torch.special.xlogy(ys, ys).sum(-1).mean())


@pytest.mark.parametrize("name,pkg", [("sparsemax", "sparsemax_loss"), ("entmax15", "entmax15_loss")])
def test_matches_entmax_package(name, pkg):
    x, t = _xt(n=12, k=30, seed=1)
    ours = sa.fenchel_young_loss(x, t, name, reduction="none")
    ref = getattr(entmax_pkg, pkg)(x, t)
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=1e-8)
    (g1,) = torch.autograd.grad(ours.sum(), x)
    (g2,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g1, g2, atol=1e-10, rtol=1e-8)
    ours = sa.entmax_loss(x, t, alpha=1.3, reduction="none")
    ref = entmax_pkg.entmax_bisect_loss(x, t, alpha=1.3, n_iter=200)
    torch.testing.assert_close(ours, ref, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_nonnegative_and_zero_at_target_with_soft_labels_and_q(d):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 7, dtype=F64, generator=g) * 2
    q = torch.rand(7, dtype=F64, generator=g) + 0.5
    beta = 0.7
    y = torch.softmax(torch.randn(8, 7, dtype=F64, generator=g), -1)  # strictly positive soft labels
    loss = sa.f_divergence_loss(x, y, d[0], q=q, temperature=beta, reduction="none", **d[1])
    assert (loss >= -1e-10).all()
    # zero exactly at the target: use the prediction itself as the target
    p = sa.f_softargmax(x, d[0], q=q, temperature=beta, **d[1])
    at = sa.f_divergence_loss(x, p, d[0], q=q, temperature=beta, reduction="none", **d[1])
    assert at.abs().max() < 1e-9
    # and positive away from it
    assert (loss > 1e-6).all()


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_gradient_is_prediction_minus_target_by_finite_differences(d):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, dtype=F64, generator=g) * 1.5
    y = torch.softmax(torch.randn(4, 6, dtype=F64, generator=g), -1)
    q = torch.rand(6, dtype=F64, generator=g) + 0.5
    f = lambda a: sa.f_divergence_loss(a, y, d[0], q=q, temperature=0.8, reduction="sum", **d[1])
    xr = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(f(xr), xr)
    torch.testing.assert_close(grad, sa.f_softargmax(x, d[0], q=q, temperature=0.8, **d[1]) - y)
    # finite differences of the *value* (so the value and the gradient are consistent)
    h = 1e-6
    fd = torch.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            e = torch.zeros_like(x)
            e[i, j] = h
            fd[i, j] = (f(x + e) - f(x - e)) / (2 * h)
    torch.testing.assert_close(fd, grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("alpha,tau", [(1.5, 0.0), (1.5, 0.4), (1.3, -0.2), (2.0, 0.3)])
def test_alpha_relu_loss_gradient_value_consistency(alpha, tau):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 8, dtype=F64, generator=g) * 2
    t = torch.randint(0, 8, (5,), generator=g)
    f = lambda a: sa.alpha_relu_loss(a, t, alpha=alpha, tau=tau, reduction="sum")
    xr = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(f(xr), xr)
    torch.testing.assert_close(grad, sa.alpha_relu(x, alpha, tau) - F.one_hot(t, 8).to(F64))
    h = 1e-6
    fd = torch.zeros_like(x)
    for i in range(5):
        for j in range(8):
            e = torch.zeros_like(x)
            e[i, j] = h
            fd[i, j] = (f(x + e) - f(x - e)) / (2 * h)
    torch.testing.assert_close(fd, grad, atol=1e-6, rtol=1e-5)
    assert (sa.alpha_relu_loss(x, t, alpha=alpha, tau=tau, reduction="none") >= -1e-12).all()


def test_alpha_relu_loss_zero_at_its_prediction_for_unnormalized_targets():
    # alpha-ReLU predictions need not sum to 1; the loss accepts them only as probability
    # vectors, so check zero-at-target on a row where alpha-ReLU happens to be normalized
    x = torch.randn(3, 40, dtype=F64) * 2
    tau_f = threshold.solve(x, get_divergence("alpha", alpha=1.5)).tau
    tau_e = 0.5 * tau_f - 1  # per-row entmax threshold -> alpha-ReLU reproduces entmax
    for i in range(3):
        p = sa.alpha_relu(x[i:i + 1], 1.5, float(tau_e[i]))
        loss = sa.alpha_relu_loss(x[i:i + 1], p, alpha=1.5, tau=float(tau_e[i]))
        assert abs(float(loss)) < 1e-10


def test_multilabel_target_is_uniform_over_active_labels():
    x, _ = _xt()
    labels = (torch.rand(6, 9) > 0.6).to(F64)
    labels[:, 0] = 1
    a = sa.sparsemax_loss(x, labels, multilabel=True, reduction="none")
    b = sa.sparsemax_loss(x, labels / labels.sum(-1, keepdim=True), reduction="none")
    torch.testing.assert_close(a, b)


def test_class_weight_with_soft_labels_and_mean_denominator():
    x, t = _xt()
    w = torch.rand(9, dtype=F64) + 0.5
    per = sa.entmax15_loss(x, t, reduction="none")
    torch.testing.assert_close(sa.entmax15_loss(x, t, weight=w), (per * w[t]).sum() / w[t].sum())


def test_return_prediction_any_dim_and_dtypes():
    x = torch.randn(3, 9, 5, requires_grad=True)
    t = torch.randint(0, 9, (3, 5))
    loss, p = sa.entmax15_loss(x, t, dim=1, return_prediction=True)
    torch.testing.assert_close(p, sa.entmax15(x.detach(), dim=1))
    ref = sa.entmax15_loss(x.movedim(1, -1), t)
    torch.testing.assert_close(loss, ref)
    xb = x.detach().to(torch.bfloat16).requires_grad_()
    lb = sa.entmax15_loss(xb, t, dim=1)
    lb.backward()
    assert xb.grad.dtype == torch.bfloat16 and torch.isfinite(xb.grad).all()


def test_masked_target_gives_inf_not_nan():
    x = torch.randn(2, 5, dtype=F64)
    x[0, 3] = -math.inf
    x = x.requires_grad_()
    t = torch.tensor([3, 1])
    for mapping in ["softmax", "sparsemax", "entmax15", "jensen_shannon", "alpha_relu"]:
        loss = sa.fenchel_young_loss(x, t, mapping, reduction="none")
        assert loss[0].item() == math.inf and math.isfinite(loss[1].item()), mapping
        (g,) = torch.autograd.grad(loss.sum(), x)
        assert torch.isfinite(g).all(), mapping
    # masked non-target classes are excluded: same loss as without them
    x2 = torch.randn(2, 5, dtype=F64)
    xm = torch.cat([x2, torch.full((2, 3), -math.inf, dtype=F64)], -1)
    for name, params in FINITE_F0:
        torch.testing.assert_close(sa.f_divergence_loss(xm, t, name, reduction="none", **params),
                                   sa.f_divergence_loss(x2, t, name, reduction="none", **params))


def test_reverse_kl_hard_label_value_is_inf_but_gradient_finite():
    x, t = _xt()
    loss = sa.f_divergence_loss(x, t, "reverse_kl")
    assert loss == math.inf
    (g,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("name", ["reverse_kl", "jeffrey", "reverse_chi_square"])
def test_infinite_f0_class_index_loss_in_closed_form(name):
    """f(0) = +inf: the loss of class indices is +inf unless the row's only unmasked class is the target (0),
    as the one-hot target's general formula gives; ignored rows 0, NaN rows NaN, the gradient p - y."""
    x = torch.randn(7, 5, dtype=F64, generator=torch.Generator().manual_seed(0))
    x[1, 1:] = -math.inf  # one unmasked class, the target's
    x[2, :4] = -math.inf  # one unmasked class, not the target's
    x[3, 2] = -math.inf
    x[4, 0] = math.nan
    x[6] = -math.inf  # every class masked
    t = torch.tensor([2, 0, 1, 2, 3, -100, 4])
    x = x.requires_grad_()
    loss = sa.f_divergence_loss(x, t, name, reduction="none")
    assert loss[[0, 2, 3, 6]].tolist() == [math.inf] * 4 and loss[1] == 0 and loss[5] == 0 and torch.isnan(loss[4])
    kept = [0, 1, 2, 3, 6]
    dense = torch.nn.functional.one_hot(t[kept], 5).to(F64)
    torch.testing.assert_close(loss[kept], sa.f_divergence_loss(x[kept], dense, name, reduction="none"))
    (g,) = torch.autograd.grad(loss[[0, 1, 3]].sum(), x)
    p = sa.f_softargmax(x.detach()[[0, 1, 3]], name)
    torch.testing.assert_close(g[[0, 1, 3]], p - torch.nn.functional.one_hot(t[[0, 1, 3]], 5).to(F64))


@pytest.mark.parametrize("name", ["reverse_kl", "jeffrey"])
def test_infinite_f0_class_index_loss_reads_nothing_on_the_host(name, monkeypatch):
    """The closed form finds the rows with one unmasked class without reading a value on the host (no
    synchronization on a GPU), with or without masked entries."""
    from test_loss_fast_paths import SyncCount

    from softargmax._utils.rows import Rows
    from softargmax.losses import _targets
    from softargmax.losses._row_losses import _infinite_f0_index_loss

    monkeypatch.setattr(_targets, "values_checkable", lambda t: False)
    x = torch.randn(5, 6, dtype=F64, generator=torch.Generator().manual_seed(1))
    x[1, 1:] = -math.inf
    x[2, :5] = -math.inf
    t = torch.tensor([0, 0, 1, 2, -100])
    tgt = _targets.parse_target(t, x, Rows(x, 1), multilabel=False, ignore_index=-100, label_smoothing=0.0,
                                weight=None)
    with SyncCount() as c:
        loss = _infinite_f0_index_loss(x, tgt, F64, None)
    assert c.names == []
    assert loss.tolist() == [math.inf, 0.0, math.inf, math.inf, 0.0]
    assert sa.f_divergence_loss(x[:1, :1], t[:1], name) == 0  # one class


def test_bad_targets():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="class index 7 is out of range"):
        sa.entmax15_loss(x, torch.tensor([0, 7, 1]))
    with pytest.raises(ValueError, match="shape without dim"):
        sa.entmax15_loss(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="non-negative"):
        sa.entmax15_loss(x, torch.tensor([[1.2, -0.2, 0, 0]] * 3))
    with pytest.raises(ValueError, match="sum to 1"):
        sa.entmax15_loss(x, torch.full((3, 4), 0.3))
    with pytest.raises(ValueError, match="at least one active label"):
        sa.entmax15_loss(x, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]]), multilabel=True)
    with pytest.raises(ValueError, match="only 0 and 1"):
        sa.entmax15_loss(x, torch.full((3, 4), 0.5), multilabel=True)
    with pytest.raises(ValueError, match="reduction must be"):
        sa.entmax15_loss(x, torch.tensor([0, 1, 2]), reduction="avg")
    with pytest.raises(ValueError, match="mapping: unknown name"):
        sa.fenchel_young_loss(x, torch.tensor([0, 1, 2]), "entmax17")
    with pytest.raises(ValueError, match="weight must be"):
        sa.entmax15_loss(x, torch.tensor([0, 1, 2]), weight=torch.ones(5))
    with pytest.raises(ValueError, match="label_smoothing"):
        sa.entmax15_loss(x, torch.tensor([0, 1, 2]), label_smoothing=1.5)
    with pytest.raises(TypeError, match="class indices must be an integer"):
        sa.entmax15_loss(x, torch.tensor([True, False, True]))


def test_binary_losses():
    s = torch.linspace(-3, 3, 25, dtype=F64)
    ones = torch.ones_like(s)
    huber = torch.where(s >= 1, 0 * s, torch.where(s <= -1, -s, (s - 1) ** 2 / 4))
    torch.testing.assert_close(sa.binary_f_divergence_loss(s, ones, "chi_square", reduction="none"), huber)
    y = (torch.rand(25) > 0.5).to(F64)
    torch.testing.assert_close(sa.binary_f_divergence_loss(s, y, "kl", reduction="none"),
                               F.binary_cross_entropy_with_logits(s, y, reduction="none"))
    for name in ["jensen_shannon", "squared_hellinger", "chi_square", "alpha"]:
        params = {"alpha": 1.5} if name == "alpha" else {}
        ys = torch.rand(25, dtype=F64) * 0.8 + 0.1
        sr = s.clone().requires_grad_()
        loss = sa.binary_f_divergence_loss(sr, ys, name, q=(0.7, 1.4), reduction="sum", **params)
        (g,) = torch.autograd.grad(loss, sr)
        torch.testing.assert_close(g, sa.f_sigmoid(s, name, q=(0.7, 1.4), **params) - ys, atol=1e-9, rtol=1e-7)
        assert (sa.binary_f_divergence_loss(s, ys, name, q=(0.7, 1.4), reduction="none", **params) >= -1e-10).all()


def test_modules():
    x, t = _xt()
    torch.testing.assert_close(sa.nn.SparsemaxLoss()(x, t), sa.sparsemax_loss(x, t))
    torch.testing.assert_close(sa.nn.EntmaxLoss(alpha=1.3, reduction="sum")(x, t), sa.entmax_loss(x, t, alpha=1.3, reduction="sum"))
    torch.testing.assert_close(sa.nn.AlphaReLULoss(1.5, 0.2)(x, t), sa.alpha_relu_loss(x, t, alpha=1.5, tau=0.2))
    torch.testing.assert_close(sa.nn.FDivergenceLoss("jensen_shannon", temperature=2.0)(x, t),
                               sa.f_divergence_loss(x, t, "jensen_shannon", temperature=2.0))
    torch.testing.assert_close(sa.nn.Entmax15Loss(ignore_index=0)(x, t), sa.entmax15_loss(x, t, ignore_index=0))
    with pytest.raises(ValueError, match="unknown"):
        sa.nn.FenchelYoungLoss("nope")


@pytest.mark.parametrize("dtype,n,k", [(torch.bfloat16, 64, 50), (torch.float16, 64, 50)])
def test_half_precision_soft_targets_are_accepted_and_used_as_given(dtype, n, k):
    # a softmax rounded to bfloat16/float16 sums to 1 only within the dtype's rounding (bfloat16:
    # 0.9992..1.0008 for these rows); the losses take it as F.cross_entropy does, as given:
    # gradient p - y, values within O(|Σy - 1|) of the loss at y / Σy
    g = torch.Generator().manual_seed(0)
    x64 = torch.randn(n, k, dtype=F64, generator=g) * 2
    y = torch.softmax(torch.randn(n, k, generator=g) * 2, -1).to(dtype)
    y64 = y.double()
    s = y64.sum(-1)
    assert float((s - 1).abs().max()) > 1e-4 * (k ** 0.5 + 1) or dtype != torch.bfloat16  # beyond float32's allowance
    yhat = y64 / s.unsqueeze(1)

    def tsallis(v, alpha):
        return ((v ** alpha).sum(-1) - 1) / (alpha * (alpha - 1))

    def fy(p, alpha):  # Blondel, Martins & Niculae (2020): <θ, p - y> + Ω(y) - Ω(p) at the exact distribution
        return (x64 * (p - yhat)).sum(-1) + tsallis(yhat, alpha) - tsallis(p, alpha)

    cases = [
        (sa.sparsemax_loss, {}, entmax_pkg.sparsemax(x64, -1), fy(entmax_pkg.sparsemax(x64, -1), 2.0)),
        (sa.entmax15_loss, {}, entmax_pkg.entmax15(x64, -1), fy(entmax_pkg.entmax15(x64, -1), 1.5)),
        (sa.f_divergence_loss, {"divergence": "kl"}, torch.softmax(x64, -1),
         F.cross_entropy(x64, yhat, reduction="none") + torch.special.xlogy(yhat, yhat).sum(-1)),
    ]
    for fn, kw, p, exact in cases:
        x = x64.float().requires_grad_()
        loss = fn(x, y, reduction="none", **kw)
        assert loss.dtype == torch.float32
        # y = s ŷ moves <θ, y> by (s - 1)<θ, ŷ>, Ω(y) by (s - 1) times at most log k + 1 (KL) or 1/(α - 1),
        # and cross_entropy's convention scales its loss by s
        bound = (s - 1).abs() * (exact.abs() + 2 * x64.abs().amax(-1) + math.log(k) + 3) + 1e-5
        assert bool(((loss.double() - exact).abs() <= bound).all())
        loss.sum().backward()
        torch.testing.assert_close(x.grad.double(), p - y64, rtol=0, atol=2e-6)
    # "kl" is cross_entropy's convention exactly: cross_entropy(θ, y) + Σ y log y at the given y
    kl = sa.f_divergence_loss(x64.float(), y, "kl", reduction="none").double()
    torch.testing.assert_close(kl, F.cross_entropy(x64, y64, reduction="none") + torch.special.xlogy(y64, y64).sum(-1),
                               rtol=1e-5, atol=1e-5)


def test_soft_target_sum_tolerance_follows_the_target_dtype():
    x = torch.randn(8, 50)
    y = torch.softmax(torch.randn(8, 50), -1)
    off = y * 1.005  # sums 1.005: within bfloat16's rounding, not float32's
    sa.sparsemax_loss(x, off.bfloat16())
    for bad in (off, off.double(), (y * 1.05).bfloat16(), (y * 1.005).half()):
        with pytest.raises(ValueError, match="sum to 1"):
            sa.sparsemax_loss(x, bad)


@pytest.mark.parametrize("div", ALL_DIVERGENCES + [("entmax15", {}), ("sparsemax", {})], ids=div_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("eps", [0.15, 1.0])
def test_smoothed_class_indices_equal_the_smoothed_distribution(div, dtype, eps):
    """Label smoothing of class indices takes Σ f(y_j) and ⟨x, y⟩ in closed form (two values of f per row, not k;
    one sum over the row): the loss and its gradient equal those of the smoothed distribution given as a dense
    target, ignored rows included, a masked (``-inf``) entry (the loss ``+inf``) and a NaN (the row NaN)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(9, 13, generator=g, dtype=F64) * 2).to(dtype)
    t = torch.randint(0, 13, (9,), generator=g)
    t[[2, 5]] = -100
    x[1, (int(t[1]) + 1) % 13] = -math.inf
    x[4, 0] = math.nan
    x[5, 0] = math.nan  # an ignored row: 0
    name, params = div
    y = F.one_hot(t.clamp(min=0), 13).to(dtype) * (1 - eps) + eps / 13
    for xa, target in ((x.clone().requires_grad_(), t), (x.clone().requires_grad_(), y)):
        kw = {"label_smoothing": eps} if target is t else {}
        loss = sa.fenchel_young_loss(xa, target, name, reduction="none", **kw, **params)
        if target is t:
            a, ga = loss, torch.autograd.grad(loss.sum(), xa)[0]
        else:
            loss = torch.where(t >= 0, loss, torch.zeros_like(loss))
            b, gb = loss, torch.autograd.grad(loss.sum(), xa)[0]
    tol = 1e-12 if dtype == F64 else 2e-5
    torch.testing.assert_close(a, b, atol=tol, rtol=tol, equal_nan=True)
    rows = [r for r in range(9) if r != 5]  # (the dense reference keeps row 5: NaN · 0 in its backward)
    torch.testing.assert_close(ga[rows], gb[rows], atol=tol, rtol=tol, equal_nan=True)
    assert torch.all(a[[2, 5]] == 0) and torch.all(ga[[2, 5]] == 0)
    assert a[1] == math.inf and torch.isnan(a[4])
