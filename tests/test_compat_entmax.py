"""softargmax.compat.entmax against the installed ``entmax`` package (values, gradients
including α, losses, modules, random inputs over every public name), and, where the package
is wrong (masked rows, low precision, α = 1), against independent references."""

import inspect
import math

import pytest
import torch
from torch.autograd import gradcheck

import softargmax as sa
import softargmax.compat.entmax as ours
import softargmax.nn as snn

entmax = pytest.importorskip("entmax")

FUNCTIONS = ["sparsemax", "entmax15", "sparsemax_bisect", "entmax_bisect", "normmax_bisect", "budget_bisect"]
FUNCTION_LOSSES = ["sparsemax_loss", "entmax15_loss", "sparsemax_bisect_loss", "entmax_bisect_loss",
                   "normmax_bisect_loss"]
MODULES = ["Sparsemax", "Entmax15", "SparsemaxBisect", "EntmaxBisect", "NormmaxBisect", "BudgetBisect"]
LOSS_MODULES = ["SparsemaxLoss", "Entmax15Loss", "SparsemaxBisectLoss", "EntmaxBisectLoss", "NormmaxBisectLoss"]
ALL_NAMES = FUNCTIONS + FUNCTION_LOSSES + MODULES + LOSS_MODULES


def _package_public_names():
    return sorted(n for n in dir(entmax) if not n.startswith("_") and callable(getattr(entmax, n)))


def test_every_public_name_is_covered():
    assert set(_package_public_names()) <= set(ALL_NAMES)
    assert set(ALL_NAMES) <= set(ours.__all__)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_same_signature_and_defaults(name):
    theirs, mine = getattr(entmax, name), getattr(ours, name)
    sig_t = inspect.signature(theirs.__init__ if inspect.isclass(theirs) else theirs)
    sig_m = inspect.signature(mine.__init__ if inspect.isclass(mine) else mine)
    pt, pm = list(sig_t.parameters.values()), list(sig_m.parameters.values())
    assert [p.name for p in pm[: len(pt)]] == [p.name for p in pt]
    for a, b in zip(pt, pm):
        assert a.default == b.default and a.kind == b.kind, name
    # the only additions are the 1.4 development branch's return_support_size
    assert all(p.name == "return_support_size" and p.default is False for p in pm[len(pt):])


# ----------------------------------------------------------------------------------
# values and gradients against the package (float64, random inputs)
# ----------------------------------------------------------------------------------

CASES = [
    ("sparsemax", {}), ("sparsemax", {"k": 3}), ("entmax15", {}), ("entmax15", {"k": 3}),
    ("sparsemax_bisect", {}),
    *[("entmax_bisect", {"alpha": a}) for a in (0.25, 0.5, 0.75, 1.25, 1.5, 2.0, 2.5, 4.0)],
    *[("normmax_bisect", {"alpha": a}) for a in (1.2, 2, 5.0)],
    *[("budget_bisect", {"budget": b}) for b in (0, 1, 2, 3.5, 6)],
]


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{kw}" for n, kw in CASES])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_values_and_input_gradients(name, kw, dim):
    x = torch.randn(5, 6, 4, dtype=torch.float64) * 1.5
    v = torch.randn_like(x)
    xt = x.clone().requires_grad_(True)
    xm = x.clone().requires_grad_(True)
    pt = getattr(entmax, name)(xt, dim=dim, **kw)
    pm = getattr(ours, name)(xm, dim=dim, **kw)
    torch.testing.assert_close(pm, pt, atol=1e-9, rtol=0)  # the package's bisection error is ~1e-12
    (pt * v).sum().backward()
    (pm * v).sum().backward()
    torch.testing.assert_close(xm.grad, xt.grad, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("shape", [(), (4, 1)])
def test_entmax_bisect_alpha_gradient(shape):
    x = torch.randn(4, 7, dtype=torch.float64)
    alpha = (0.3 + 2.2 * torch.rand(shape, dtype=torch.float64))
    at = alpha.clone().requires_grad_(True)
    am = alpha.clone().requires_grad_(True)
    v = torch.randn_like(x)
    (entmax.entmax_bisect(x, at) * v).sum().backward()
    (ours.entmax_bisect(x, am) * v).sum().backward()
    assert am.grad.shape == alpha.shape
    torch.testing.assert_close(am.grad, at.grad, atol=1e-7, rtol=1e-6)
    xg = x.clone().requires_grad_(True)
    ag = alpha.clone().requires_grad_(True)
    assert gradcheck(ours.entmax_bisect, (xg, ag))


@pytest.mark.parametrize("name,kw", [("sparsemax_loss", {}), ("entmax15_loss", {}), ("sparsemax_bisect_loss", {}),
                                     ("entmax_bisect_loss", {"alpha": 1.25}), ("entmax_bisect_loss", {"alpha": 0.5}),
                                     ("entmax_bisect_loss", {"alpha": 2.5}), ("normmax_bisect_loss", {}),
                                     ("normmax_bisect_loss", {"alpha": 4.0})])
def test_function_losses(name, kw):
    x = torch.randn(8, 10, dtype=torch.float64)
    y = torch.randint(0, 10, (8,))
    xt = x.clone().requires_grad_(True)
    xm = x.clone().requires_grad_(True)
    lt = getattr(entmax, name)(xt, y, **kw)
    lm = getattr(ours, name)(xm, y, **kw)
    assert lm.shape == lt.shape == (8,)
    torch.testing.assert_close(lm, lt, atol=1e-9, rtol=0)
    w = torch.rand(8, dtype=torch.float64)
    (lt * w).sum().backward()
    (lm * w).sum().backward()
    torch.testing.assert_close(xm.grad, xt.grad, atol=1e-9, rtol=0)


def test_loss_with_per_sample_alpha():
    # the package's loss mis-broadcasts a per-sample α ((n, 1) against (n,)): compare row by row
    x = torch.randn(6, 5, dtype=torch.float64)
    y = torch.randint(0, 5, (6,))
    alpha = torch.tensor([1.2, 1.5, 1.5, 2.0, 3.0, 1.2], dtype=torch.float64).view(6, 1)
    got = ours.entmax_bisect_loss(x, y, alpha)
    ref = torch.stack([entmax.entmax_bisect_loss(x[i:i + 1], y[i:i + 1], float(alpha[i]))[0] for i in range(6)])
    torch.testing.assert_close(got, ref, atol=1e-9, rtol=0)
    got = ours.normmax_bisect_loss(x, y, alpha + 0.5)
    ref = torch.stack([entmax.normmax_bisect_loss(x[i:i + 1], y[i:i + 1], float(alpha[i]) + 0.5)[0] for i in range(6)])
    torch.testing.assert_close(got, ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", LOSS_MODULES)
@pytest.mark.parametrize("reduction", ["elementwise_mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [False, True])
def test_loss_modules(name, reduction, ignore):
    x = torch.randn(12, 7, dtype=torch.float64)
    y = torch.randint(0, 7, (12,))
    ii = int(y[0]) if ignore else -100
    xt = x.clone().requires_grad_(True)
    xm = x.clone().requires_grad_(True)
    lt = getattr(entmax, name)(ignore_index=ii, reduction=reduction)(xt, y)
    lm = getattr(ours, name)(ignore_index=ii, reduction=reduction)(xm, y)
    torch.testing.assert_close(lm, lt, atol=1e-9, rtol=0)
    lt.sum().backward()
    lm.sum().backward()
    torch.testing.assert_close(xm.grad, xt.grad, atol=1e-9, rtol=0)


@pytest.mark.parametrize("name,kw", [("Sparsemax", {"dim": 0}), ("Entmax15", {"k": 2}), ("SparsemaxBisect", {}),
                                     ("EntmaxBisect", {"alpha": 1.7, "dim": 0}), ("NormmaxBisect", {"alpha": 3}),
                                     ("BudgetBisect", {"budget": 3})])
def test_modules(name, kw):
    x = torch.randn(5, 6, dtype=torch.float64)
    mt, mm = getattr(entmax, name)(**kw), getattr(ours, name)(**kw)
    for attr in kw:
        assert getattr(mm, attr) == getattr(mt, attr)
    torch.testing.assert_close(mm(x), mt(x), atol=1e-9, rtol=0)


def test_return_support_size():
    x = torch.randn(4, 9, dtype=torch.float64)
    for fn, ref in ((ours.sparsemax, entmax.sparsemax), (ours.entmax15, entmax.entmax15)):
        p, supp = fn(x, dim=1, return_support_size=True)
        assert supp.dtype == torch.long and supp.shape == (4, 1)
        assert torch.equal(supp, (ref(x, dim=1) > 0).sum(1, keepdim=True))
        assert torch.equal(p, fn(x, dim=1))
    y = torch.randint(0, 9, (4,))
    loss, supp = ours.sparsemax_loss(x, y, return_support_size=True)
    torch.testing.assert_close(loss, entmax.sparsemax_loss(x, y))
    assert torch.equal(supp, (entmax.sparsemax(x) > 0).sum(-1, keepdim=True))
    loss, supp = ours.Entmax15Loss(reduction="sum", return_support_size=True)(x, y)
    torch.testing.assert_close(loss, entmax.Entmax15Loss(reduction="sum")(x, y))
    p, supp = ours.Sparsemax(return_support_size=True)(x)
    assert supp.shape == (4, 1)


# ----------------------------------------------------------------------------------
# where the package fails: our behaviour against independent references
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", [("sparsemax", {}), ("entmax15", {}), ("sparsemax_bisect", {}),
                                     ("entmax_bisect", {"alpha": 1.3}), ("entmax_bisect", {"alpha": 0.6}),
                                     ("normmax_bisect", {}), ("budget_bisect", {"budget": 2})])
def test_masked_rows(name, kw):
    """The package fails on all -inf rows (index error for sparsemax/entmax15, NaN for the
    bisections, NaN rows for budget).  Ours: zeros; partly masked rows equal the package on the
    unmasked entries alone."""
    x = torch.randn(3, 6, dtype=torch.float64)
    x[1] = -math.inf
    x[2, :3] = -math.inf
    xr = x.clone().requires_grad_(True)
    p = getattr(ours, name)(xr, **kw)
    assert torch.equal(p[1], torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(p[2, 3:], getattr(entmax, name)(x[2:3, 3:], **kw)[0], atol=1e-9, rtol=0)
    torch.testing.assert_close(p[0], getattr(entmax, name)(x[:1], **kw)[0], atol=1e-9, rtol=0)
    assert (p[2, :3] == 0).all()
    (p * torch.randn_like(p)).sum().backward()
    assert torch.isfinite(xr.grad).all() and (xr.grad[1] == 0).all() and (xr.grad[2, :3] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,kw", [("sparsemax", {}), ("entmax15", {}), ("sparsemax_bisect", {}),
                                     ("entmax_bisect", {"alpha": 1.3}), ("normmax_bisect", {}),
                                     ("budget_bisect", {"budget": 2})])
def test_low_precision(name, kw, dtype):
    """Half inputs are computed in float32: compared with the package in float64 on the same
    (rounded) inputs.  The package itself can overflow there (e.g. sparsemax_bisect on
    bfloat16 scores of size ~200 returns NaN)."""
    x = (torch.randn(4, 100) * 200).to(dtype)
    p = getattr(ours, name)(x, **kw)
    assert p.dtype == dtype and torch.isfinite(p).all()
    ref = getattr(entmax, name)(x.double(), **kw)
    torch.testing.assert_close(p.double(), ref, atol=1e-2 if dtype == torch.bfloat16 else 2e-3, rtol=0)


def test_alpha_one_is_softmax_and_any_alpha_is_monotone_and_optimal():
    """The package returns the uniform distribution at α = 1 (it divides by α - 1)."""
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(ours.entmax_bisect(x, 1.0), torch.softmax(x, -1))
    torch.testing.assert_close(ours.entmax_bisect(x, torch.ones(3, 1, dtype=torch.float64)), torch.softmax(x, -1))
    # monotone in the scores and optimal (KKT: p_j^{α-1} + τ' = (α-1) x_j on the support, one τ')
    z = torch.sort(torch.randn(2, 40, dtype=torch.float64) * 3, dim=-1).values
    for a in (0.3, 0.8, 1.5, 3.0, 8.0, 16.0):
        p = ours.entmax_bisect(z, a)
        assert (p.diff(dim=-1) >= 0).all()
        supp = p > 0
        tau = (a - 1) * z - p.clamp_min(1e-300) ** (a - 1)
        spread = torch.where(supp, tau, torch.nan).nan_to_num(0)
        for r in range(2):
            t = spread[r][supp[r]]
            assert (t.max() - t.min()).abs() < 1e-9 * max(1.0, float(t.abs().max()))


def test_deterministic_and_alpha_below_one_learnable():
    x = torch.randn(16, 300)
    assert torch.equal(ours.entmax_bisect(x, 1.3), ours.entmax_bisect(x, 1.3))
    assert torch.equal(ours.normmax_bisect(x, 3.0), ours.normmax_bisect(x, 3.0))
    # a learned α below 1 stays valid (dense outputs); a range is kept by softargmax.nn.Entmax
    m = snn.Entmax(alpha=0.6, learn_alpha=True, alpha_min=0.5, alpha_max=1.5)
    opt = torch.optim.SGD(m.parameters(), lr=1e4)
    x = torch.randn(8, 20)
    start = float(m.alpha.detach())
    for _ in range(5):
        opt.zero_grad()
        ((m(x) ** 2).sum()).backward()  # pushes towards denser outputs: smaller α, down to the bound
        opt.step()
        assert 0.5 <= float(m.alpha.detach()) < 1.5
    assert float(m.alpha.detach()) < start - 0.05
    alpha = torch.tensor(0.7, requires_grad=True)
    ours.EntmaxBisect(alpha=torch.nn.Parameter(torch.tensor(0.7)))(x).sum().backward()
    p = ours.entmax_bisect(x, alpha)
    assert (p > 0).all()
    torch.testing.assert_close(p, sa.f_softargmax(x, "alpha", alpha=0.7))


def test_normmax_alpha_one_is_the_packages_argmax():
    # 1-normmax on purpose (deep-spin/HFYN's margins.py): the package's argmax one-hot, uniform
    # over ties, and its loss; our gradient of the map is 0 (the package's: inf/NaN)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, dtype=torch.float64, generator=g).round()  # many ties
    x[0] = 0.0
    y = torch.randint(0, 6, (8,), generator=g)
    want = entmax.normmax_bisect(x, alpha=1.0)
    for a in (1.0, 1, torch.tensor(1.0, dtype=torch.float64)):
        torch.testing.assert_close(ours.normmax_bisect(x, alpha=a), want, rtol=0, atol=1e-15)
        torch.testing.assert_close(ours.NormmaxBisect(alpha=a)(x), entmax.NormmaxBisect(alpha=a)(x), rtol=0, atol=1e-15)
    torch.testing.assert_close(ours.normmax_bisect(torch.zeros(1, 2), alpha=1.0), torch.tensor([[0.5, 0.5]]))
    xg = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad((ours.normmax_bisect(xg, 1.0) * torch.randn(8, 6, dtype=torch.float64, generator=g)).sum(), xg)
    assert torch.equal(grad, torch.zeros_like(grad))
    # the losses: values and (sub)gradient p - e_y as the package's
    xl, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, ref = ours.normmax_bisect_loss(xl, y, alpha=1.0), entmax.normmax_bisect_loss(xr, y, alpha=1.0)
    torch.testing.assert_close(got, ref)
    got.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(xl.grad, xr.grad)
    for reduction in ("elementwise_mean", "sum", "none"):
        torch.testing.assert_close(ours.NormmaxBisectLoss(alpha=1.0, reduction=reduction)(x, y),
                                   entmax.NormmaxBisectLoss(alpha=1.0, reduction=reduction)(x, y))
    # a row of ties: loss 0 (the package: 0 to rounding, 1 - Σ 1/6)
    assert float(ours.NormmaxBisectLoss(alpha=1.0)(x[:1], y[:1])) == 0.0
    assert abs(float(entmax.NormmaxBisectLoss(alpha=1.0)(x[:1], y[:1]))) < 1e-15


def test_argument_errors():
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="alpha must be finite and > 0"):
        ours.entmax_bisect(x, 0.0)
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        ours.normmax_bisect(x, 0.5)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        ours.budget_bisect(x, -1.0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        ours.SparsemaxLoss(reduction="mean")
