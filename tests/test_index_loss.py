"""The class-index losses in one C call (softargmax.losses._index_loss) and the one-hot target's
Ω in closed form (softargmax.losses._omega): the same per-row values and gradients as the general
path, bit for bit, the same errors, and the general path wherever the call is not covered."""

import math

import pytest
import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.backends.cpu import rows as cpu_rows
from softargmax.backends.solution import sum_f_minus_f0
from softargmax.divergences import DIVERGENCE_NAMES, get_divergence
from softargmax.losses import _index_loss
from softargmax.losses._omega import f_at_zero, one_hot_omega
from softargmax.losses._options import LossOptions
from softargmax.losses.functional import fenchel_young

needs_c = pytest.mark.skipif(not cpu_rows.available(), reason="the C row solver does not build here")
#: the losses the C call covers, as (mapping, parameters)
COVERED = [("entmax15", {}), ("sparsemax", {}), ("entmax", {"alpha": 1.3}), ("chi_square", {}), ("alpha", {"alpha": 1.9}),
           ("jensen_shannon", {}), ("squared_hellinger", {}), ("reverse_kl", {}), ("jeffrey", {}),
           ("reverse_chi_square", {})]


def general(x, t, mapping, params, reduction="mean"):
    """The general path (target parsing, the row loss object, the PyTorch reduction)."""
    return fenchel_young(x, t, mapping, params, LossOptions(reduction=reduction))


@pytest.fixture
def taken(monkeypatch):
    """Counts the calls computed by the C call."""
    calls = []
    forward = _index_loss._forward
    monkeypatch.setattr(_index_loss, "_forward", lambda *a: calls.append(1) or forward(*a))
    return calls


def edge_rows(R, k, dtype, seed=0):
    """Scores with an ignored row, a NaN row, an all-masked row and a row whose target is masked."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, k, dtype=dtype, generator=g) * 3
    t = torch.randint(0, k, (R,), generator=g)
    t[1] = -100
    x[2, 0] = math.nan
    x[3, :] = -math.inf
    x[4, t[4]] = -math.inf
    return x, t


def same(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("name", DIVERGENCE_NAMES)
def test_one_hot_omega_is_the_closed_form(name):
    """Ω(e_c) - k f(0) = f(1) - f(0) for every generator with a finite f(0), against Σ_j [f(y_j) - f(0)]
    over a one-hot float64 row (the general path's sum) and against f evaluated directly."""
    div = get_divergence(name, alpha=1.5) if name == "alpha" else get_divergence(name)
    f0 = float(div.f(torch.zeros((), dtype=torch.float64)))
    assert f_at_zero(div) == f0 or (math.isinf(f0) and math.isinf(f_at_zero(div)))
    if not math.isfinite(f0):
        return
    k = 7
    y = torch.zeros(3, k, dtype=torch.float64)
    y[torch.arange(3), torch.tensor([0, 4, 6])] = 1.0
    dense = sum_f_minus_f0(div, y, None, f0)
    omega_y = div.f(y).sum(-1) - k * f0  # Ω(e_c) less the k f(0) terms, from the definition
    closed = one_hot_omega(div, torch.float64)
    torch.testing.assert_close(dense, torch.full((3,), closed, dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(omega_y, torch.full((3,), closed, dtype=torch.float64), rtol=0, atol=1e-12)
    assert one_hot_omega(div, torch.float32) == float(torch.tensor(closed, dtype=torch.float32))


def test_one_hot_omega_known_values():
    """α-divergence: f(1) - f(0) = -1/α; chi-square ((u² - 1)/2): 1/2."""
    for alpha in (1.3, 1.5, 2.0):
        assert one_hot_omega(get_divergence("alpha", alpha=alpha), torch.float64) == pytest.approx(-1 / alpha, abs=1e-15)
    assert one_hot_omega(get_divergence("chi_square"), torch.float64) == 0.5


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mapping,params", COVERED)
def test_matches_the_general_path_bit_for_bit(mapping, params, dtype, taken):
    """Per-row losses and gradients equal the general path's exactly (ignored, NaN, all-masked rows, a
    masked target class; an incoming gradient of 1 and of 0.7); the reduced value within its rounding."""
    x, t = edge_rows(10, 50, dtype)  # 9 kept rows: the mean's factor is no power of 2
    for reduction in ("none", "sum", "mean"):
        for g in (1.0, 0.7, 0.3):
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            la = sa.fenchel_young_loss(xa, t, mapping, reduction=reduction, **params)
            lb = general(xb, t, mapping, params, reduction)
            la.backward(torch.full_like(la, g))
            lb.backward(torch.full_like(lb, g))
            assert same(xa.grad, xb.grad), (reduction, g)
            if reduction == "none":
                assert same(la, lb)
            else:
                torch.testing.assert_close(la, lb, equal_nan=True)
    assert len(taken) == 9


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("sparsemax", {}), ("entmax", {"alpha": 1.3}),
                                            ("jensen_shannon", {}), ("squared_hellinger", {}), ("jeffrey", {})])
def test_label_smoothing_and_class_weights_match_the_general_path(mapping, params, dtype, taken):
    """Label smoothing (not for f(0) = inf, where the smoothed loss is finite: the general path), class weights
    (zero weights included: a NaN mean with a zero gradient) and both: values and gradients as the general path's,
    within the rounding of the smoothed ⟨θ, y⟩ and of the weights' sum."""
    x, t = edge_rows(10, 50, dtype)
    w = torch.rand(50, dtype=dtype, generator=torch.Generator().manual_seed(9)) + 0.2
    tol = {"rtol": 3e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    cases = [{"weight": w}, {"label_smoothing": 0.1}, {"label_smoothing": 1.0, "weight": w},
             {"weight": torch.zeros(50, dtype=dtype)}]
    for opts in cases:
        for reduction in ("none", "sum", "mean"):
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            la = sa.fenchel_young_loss(xa, t, mapping, reduction=reduction, **opts, **params)
            lb = fenchel_young(xb, t, mapping, params, LossOptions(reduction=reduction, **opts))
            la.backward(torch.full_like(la, 0.7))
            lb.backward(torch.full_like(lb, 0.7))
            torch.testing.assert_close(la, lb, equal_nan=True, **tol)
            torch.testing.assert_close(xa.grad, xb.grad, equal_nan=True, **tol)
    smoothed = 2 if mapping == "jeffrey" else 0  # f(0) = inf: smoothed targets take the general path
    assert len(taken) == 3 * (len(cases) - smoothed)


@needs_c
def test_bad_class_weights_raise_as_the_general_path(taken):
    """NaN, infinite or negative class weights are the general path's ValueError, never a loss of this call."""
    x, t = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    for bad in (math.nan, math.inf, -1.0):
        w = torch.ones(5)
        w[2] = bad
        with pytest.raises(ValueError, match="weight must be finite and non-negative"):
            sa.entmax15_loss(x, t, weight=w)
    assert not taken


@needs_c
def test_sparsemax_loss_closed_form(taken):
    """The sparsemax loss of a class index, -x_c + ½ Σ_{j∈S} (x_j² - τ²) + ½ (Martins & Astudillo, 2016,
    eq. 26), in float64 from a brute-force τ, and its gradient sparsemax(x) - e_c."""
    torch.manual_seed(1)
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 9, (6,))
    loss = sa.sparsemax_loss(x, t, reduction="none")
    loss.sum().backward()
    z = x.detach()
    zs = z.sort(-1, descending=True).values
    cums = zs.cumsum(-1) - 1
    ks = torch.arange(1, 10, dtype=torch.float64)
    support = (zs - cums / ks > 0).sum(-1, keepdim=True)
    tau = cums.gather(1, support - 1) / support
    p = (z - tau).clamp_min(0)
    ref = -z.gather(1, t[:, None]).squeeze(1) + 0.5 * torch.where(p > 0, z**2 - tau**2, 0).sum(-1) + 0.5
    torch.testing.assert_close(loss.detach(), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(x.grad, p - F.one_hot(t, 9).double(), rtol=0, atol=1e-12)
    assert taken


@needs_c
def test_batch_dimensions_and_dim(taken):
    """Scores (2, 3, k) with the classes last: the loss of the flattened rows, shaped like the target."""
    torch.manual_seed(2)
    x = torch.randn(2, 3, 11)
    t = torch.randint(0, 11, (2, 3))
    for dim in (-1, 2):
        loss = sa.entmax15_loss(x, t, dim=dim, reduction="none")
        assert loss.shape == (2, 3)
        assert torch.equal(loss.reshape(-1), general(x.reshape(6, 11), t.reshape(6), "entmax15", {}, "none"))
    assert len(taken) == 2


@needs_c
def test_the_general_path_where_not_covered(taken):
    """Options, layouts and mappings the C call does not take go to the general path (same results)."""
    torch.manual_seed(3)
    x = torch.randn(5, 8)
    t = torch.randint(0, 8, (5,))
    ref = sa.entmax15_loss(x, t)
    assert len(taken) == 1
    calls = [
        lambda: sa.entmax15_loss(x, t, weight=torch.ones(8, requires_grad=True)),  # the weights' gradient
        lambda: sa.f_divergence_loss(x, t, "reverse_kl", label_smoothing=0.1) * 0 + ref,  # f(0) = inf, smoothed
        lambda: sa.entmax15_loss(x, t, return_prediction=True)[0],
        lambda: sa.entmax15_loss(x.t(), t, dim=0),  # classes not last
        lambda: sa.entmax15_loss(x.t().contiguous().t(), t),  # not contiguous
        lambda: sa.fenchel_young_loss(x, t, "entmax15", temperature=2.0) * 0 + ref,
        lambda: sa.fenchel_young_loss(x, t, "entmax15", q=torch.ones(8)),
        lambda: sa.entmax_loss(x, t, alpha=1.0) * 0 + ref,  # softmax: not the power kind
        lambda: sa.entmax_loss(x, t, alpha=2.5) * 0 + ref,  # alpha > 2
        lambda: sa.f_divergence_loss(x, t, "kl") * 0 + ref,  # softmax
        lambda: sa.entmax15_loss(x.half(), t).float(),
    ]
    for call in calls:
        torch.testing.assert_close(call(), ref, atol=2e-3, rtol=0)
    assert len(taken) == 1
    old = cpu_rows.set_enabled(False)  # SOFTARGMAX_CPU_KERNELS=0: the PyTorch solver, the same values
    try:
        torch.testing.assert_close(sa.entmax15_loss(x, t), ref)
    finally:
        cpu_rows.set_enabled(old)
    assert len(taken) == 1


@needs_c
def test_bad_targets_raise_as_the_general_path(taken):
    x = torch.randn(4, 6)
    for bad in (torch.tensor([0, 6, 1, 2]), torch.tensor([0, 1, -3, 2])):
        with pytest.raises(ValueError) as fast:
            sa.entmax15_loss(x, bad)
        with pytest.raises(ValueError) as slow:
            general(x, bad, "entmax15", {})
        assert str(fast.value) == str(slow.value)
    with pytest.raises(ValueError, match="shape"):
        sa.entmax15_loss(x, torch.tensor([0, 1]))
    with pytest.raises(TypeError):
        sa.entmax15_loss(x, torch.tensor([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="reduction"):
        sa.entmax15_loss(x, torch.tensor([0, 1, 2, 3]), reduction="avg")


@needs_c
def test_all_ignored_mean_is_nan_with_zero_gradient(taken):
    """As F.cross_entropy: "mean" over no kept item is NaN, and its gradient is 0."""
    x = torch.randn(3, 5, requires_grad=True)
    t = torch.full((3,), -100)
    loss = sa.sparsemax_loss(x, t)
    assert math.isnan(float(loss.detach()))
    loss.backward()
    xc = x.detach().clone().requires_grad_()
    F.cross_entropy(xc, t).backward()
    assert torch.equal(x.grad, xc.grad) and torch.equal(x.grad, torch.zeros(3, 5))
    assert float(sa.sparsemax_loss(x, t, reduction="sum")) == 0.0
    assert taken


@needs_c
def test_autograd_semantics(taken):
    """retain_graph: a second backward gives the same gradient (G is not overwritten); no gradient without
    requires_grad; create_graph gives a gradient that is not differentiated again, as the general path."""
    torch.manual_seed(4)
    x = torch.randn(4, 7, requires_grad=True)
    t = torch.tensor([0, 3, 6, 2])
    loss = sa.entmax15_loss(x, t)
    loss.backward(retain_graph=True)
    g1 = x.grad.clone()
    loss.backward()
    assert torch.equal(x.grad, 2 * g1)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()  # the graph was freed, as autograd says for the general path
    (g,) = torch.autograd.grad(sa.entmax15_loss(x, t, reduction="sum"), x, create_graph=True)
    (gref,) = torch.autograd.grad(general(x, t, "entmax15", {}, "sum"), x, create_graph=True)
    assert torch.equal(g, gref) and g.requires_grad == gref.requires_grad
    with torch.no_grad():
        assert not sa.entmax15_loss(x, t).requires_grad
    assert len(taken) == 3


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_class_weights_bit_for_bit_and_against_the_weighted_mean(dtype, taken, monkeypatch):
    """Class weights, F.cross_entropy's convention: the weighted mean divides Σ_r w_{c_r} ℓ_r by the kept rows'
    Σ_r w_{c_r} (ignored rows count in neither).  With weights that are multiples of 1/8 (their sums exact in any
    order) the values and gradients equal the general path's bit for bit (reductions "sum", "mean" and "none", incoming
    gradients 1, 0.7 and 3), also with retain_graph (G kept); against the weighted mean formed here from the
    unweighted per-row losses, and its gradient; one C pass scales G (the backward's products in C)."""
    x, t = edge_rows(12, 40, dtype, seed=5)
    x[2, 0] = 0.5  # (no NaN row: the weighted mean is then finite)
    t[7] = -100
    w = (torch.randint(0, 24, (40,), generator=torch.Generator().manual_seed(6)) / 8).to(dtype)
    w[t[0]] = 0.0  # a kept row of weight 0
    scaled = []
    scale_rows = cpu_rows.scale_rows
    monkeypatch.setattr(cpu_rows, "scale_rows", lambda *a, **k: scaled.append(1) or scale_rows(*a, **k))
    for reduction in ("sum", "mean", "none"):
        for g in (1.0, 0.7, 3.0):
            for retain in (False, True):
                xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
                la = sa.entmax15_loss(xa, t, weight=w, reduction=reduction)
                lb = fenchel_young(xb, t, "entmax15", {}, LossOptions(reduction=reduction, weight=w))
                ga = torch.full_like(la, g) if reduction != "none" else torch.linspace(-2, g, 12, dtype=dtype)
                la.backward(ga, retain_graph=retain)
                lb.backward(ga)
                assert same(la.detach(), lb.detach()) and same(xa.grad, xb.grad), (reduction, g, retain)
    assert len(taken) == 18 and len(scaled) == 12  # ("none": one product with the incoming gradient's rows)
    # the weighted mean from the unweighted per-row losses (float64), and its gradient
    xc = x.clone().requires_grad_()
    loss = sa.entmax15_loss(xc, t, weight=w)
    loss.backward()
    x64 = x.double().requires_grad_()
    rows = general(x64, t, "entmax15", {}, "none")
    keep = t != -100
    wr = torch.where(keep, w.double()[t.clamp(min=0)], 0.0)
    ref = (wr * rows).sum() / wr.sum()
    ref.backward()
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(loss.double(), ref.detach(), **tol)
    torch.testing.assert_close(xc.grad.double(), x64.grad, **tol)


@needs_c
def test_class_weights_of_an_all_ignored_batch(taken):
    """As F.cross_entropy with weights: "mean" over no kept row is NaN with a zero gradient, "sum" is 0."""
    x = torch.randn(3, 5, requires_grad=True)
    t = torch.full((3,), -100)
    w = torch.rand(5) + 0.5
    loss = sa.entmax15_loss(x, t, weight=w)
    ref = F.cross_entropy(x.detach(), t, weight=w)
    assert math.isnan(float(loss.detach())) and math.isnan(float(ref))
    loss.backward()
    assert torch.equal(x.grad, torch.zeros(3, 5))
    x.grad = None
    total = sa.entmax15_loss(x, t, weight=w, reduction="sum")
    total.backward()
    assert float(total.detach()) == 0.0 and torch.equal(x.grad, torch.zeros(3, 5))
    assert len(taken) == 2


@needs_c
def test_a_weights_sum_past_float32_is_the_general_paths_mean(taken):
    """float32 weights whose kept rows' sum overflows float32 (6 x 1e38): the mean is the losses' sum over the
    weights' sum, each rounded to float32, as the general path and F.cross_entropy divide them: 0 where the
    losses' sum is finite, NaN where it overflows too; the gradient is 0 in both (grad / inf)."""
    t = torch.tensor([0, 1, 2, 3, 4, 1])
    small = torch.zeros(6, 5)
    small[torch.arange(6), t] = 1.2  # entmax15 loss 0.084 a row: Σ w ℓ = 5e37, finite
    for x, wv, expect in ((small, 1e38, 0.0), (torch.randn(6, 5, generator=torch.Generator().manual_seed(2)), 3e38,
                                               math.nan)):
        w = torch.full((5,), wv)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        la = sa.entmax15_loss(xa, t, weight=w)
        lb = fenchel_young(xb, t, "entmax15", {}, LossOptions(weight=w))
        la.backward()
        lb.backward()
        assert same(la.detach(), torch.tensor(expect)) and same(lb.detach(), torch.tensor(expect)), (la, lb)
        assert torch.equal(xa.grad, torch.zeros(6, 5)) and torch.equal(xb.grad, torch.zeros(6, 5))
        # F.cross_entropy's rule on the same weights: a finite Σ w ℓ over an infinite Σ w is 0, an infinite one NaN
        ce_x = torch.zeros(6, 5)
        ce_x[torch.arange(6), t] = 30.0 if expect == 0.0 else 0.0
        assert same(F.cross_entropy(ce_x, t, weight=w), torch.tensor(expect))
    assert len(taken) == 2


@needs_c
def test_class_weights_are_checked_in_c_without_a_host_read(taken, monkeypatch):
    """The weights' check (finite, non-negative) is one C pass: no aminmax, no tensor read on the host; a float64
    weight with float32 scores is converted first (a value past float32's range is then infinite: the general
    path takes the call and raises, with the C library on or off, where the loss was a silent NaN)."""
    monkeypatch.setattr(torch, "aminmax", None)
    x, t = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    ok = sa.entmax15_loss(x, t, weight=torch.full((5,), 0.5, dtype=torch.float64))
    torch.testing.assert_close(ok, sa.entmax15_loss(x, t))
    assert len(taken) == 2
    w = torch.ones(5, dtype=torch.float64)
    w[1] = 1e300
    for fused in (True, False):
        old = cpu_rows.set_enabled(fused)
        try:
            for reduction in ("mean", "sum", "none"):
                with pytest.raises(ValueError, match=r"weight must be finite in the scores' dtype \(torch.float32\)"):
                    sa.entmax15_loss(x, t, weight=w, reduction=reduction)
        finally:
            cpu_rows.set_enabled(old)
    assert len(taken) == 2
    x64 = x.double()  # (in float64 the weight is finite: taken by the C call)
    torch.testing.assert_close(sa.entmax15_loss(x64, t, weight=w, reduction="none"),
                               sa.entmax15_loss(x64, t, reduction="none") * w[t])
    assert len(taken) == 4
    with pytest.raises(ValueError, match="weight must be finite and non-negative"):
        sa.entmax15_loss(x, t, weight=-w)
    assert len(taken) == 4
    assert cpu_rows.weights_ok(torch.tensor([0.0, 1.0, 3e38])) and not cpu_rows.weights_ok(torch.tensor([-0.5, 1.0]))
    assert not cpu_rows.weights_ok(torch.tensor([1.0, math.nan])) and cpu_rows.weights_ok(torch.tensor([-0.0]))
