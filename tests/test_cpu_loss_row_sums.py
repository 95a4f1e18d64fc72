"""The Jensen–Shannon and squared-Hellinger losses on the C row solver: the conjugate Ω*(z) of each row
(``Solution.omega_star``, softargmax.backends.cpu.rows) that gives their values.

Ω*(z) = τ + Σ_j [f*(z_j - τ) + f(0)] is checked against the direct sums ⟨z, p⟩ - Σ_j [f(p_j) - f(0)] of the
PyTorch solver's float64 solution on edge rows; the losses of float32 scores against the float64 answer of the
PyTorch path (within float32's rounding of the value), and float64 losses, gradients, every target kind and a
temperature against the PyTorch path; the autograd graph keeps ``G`` alone.
"""

import math

import numpy as np
import pytest
import torch
from test_cpu_rows import _torch_solve

import softargmax as sa
from softargmax.backends.cpu import rows as _cpu_rows
from softargmax.divergences import get_divergence
from softargmax.losses._options import LossOptions
from softargmax.losses.functional import fenchel_young
from softargmax.solvers.threshold import solve

pytestmark = pytest.mark.skipif(not _cpu_rows.available(), reason="no C compiler: the fused solver is not built")

NAMES = ["jensen_shannon", "squared_hellinger"]
F64 = torch.float64


def _rows(dtype=F64):
    """Random rows at three scales, masked entries, one finite entry, a large offset, a constant row, an
    all-masked row and a NaN row."""
    gen = torch.Generator().manual_seed(11)
    z = torch.randn(10, 300, dtype=F64, generator=gen)
    z[0] *= 3
    z[1] *= 0.01
    z[2] *= 30
    z[3, ::3] = -math.inf
    z[4, 1:] = -math.inf
    z[5] = z[5] * 2 + 3000
    z[6] = 0.5
    z[8] = -math.inf
    z[9, 7] = math.nan
    return z.to(dtype)


def _without_c(fn):
    old = _cpu_rows.set_enabled(False)
    try:
        return fn()
    finally:
        _cpu_rows.set_enabled(old)


@pytest.mark.parametrize("name", NAMES)
def test_conjugate_equals_the_direct_sums(name):
    div = get_divergence(name)
    z = _rows()
    sol = solve(z, div, candidates_only=True, row_sums=True)
    assert sol.backend == "cpu" and sol.omega_star is not None and sol.omega_star.dtype == F64
    ref = _torch_solve(z, div)
    p = ref.dense_p()
    f0 = float(div.f(torch.zeros((), dtype=F64)))
    pos = p > 0
    direct = torch.where(pos, z * p, 0).sum(-1) - torch.where(pos, div.f(torch.where(pos, p, 1)) - f0, 0).sum(-1)
    ok = torch.arange(10) < 8
    torch.testing.assert_close(sol.omega_star[ok], direct[ok], rtol=1e-13, atol=1e-13)
    assert sol.omega_star[8] == 0 and torch.isnan(sol.omega_star[9])


def _ulps(value, ref):
    """|value - ref| in units of float32's spacing at ref."""
    ref32 = ref.float()
    spacing = (torch.nextafter(ref32.abs(), torch.tensor(math.inf)) - ref32.abs()).double()
    return ((value.double() - ref) / spacing).abs()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("k", [7, 2000])
def test_float32_loss_within_float32_rounding_of_float64(name, k):
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(32, k, generator=gen) * 3
    x[3, : k // 2] = -math.inf
    x[5] += 500
    t = torch.randint(0, k, (32,), generator=gen)
    t[3] = k - 1
    t[7] = -100
    loss = sa.f_divergence_loss(x, t, name, reduction="none")
    ref = _without_c(lambda: sa.f_divergence_loss(x.double(), t, name, reduction="none"))
    assert loss.dtype == torch.float32 and loss[7] == 0
    assert float(_ulps(loss, ref).max()) <= 1.0  # the float64 value rounded once


@pytest.mark.parametrize("name", NAMES)
def test_float64_losses_and_gradients_equal_the_pytorch_path(name):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 9, dtype=F64, generator=gen) * 2
    x[1, 4:] = -math.inf
    x[2] = -math.inf
    x[4, 1] = math.nan
    t = torch.tensor([0, 8, 3, -100, 2, 5])
    t[1] = 2
    soft = torch.softmax(torch.randn(6, 9, dtype=F64, generator=gen), -1)
    soft[1, 4:] = 0
    soft[1] /= soft[1].sum()
    cases = [(t, {}), (t, {"label_smoothing": 0.1}), (t, {"weight": torch.rand(9, dtype=F64, generator=gen) + 0.5}),
             (soft, {}), (t, {"temperature": 0.7}), (soft, {"temperature": 1.6})]
    for target, opts in cases:
        outs = []
        for c_path in (True, False):
            old = _cpu_rows.set_enabled(c_path)
            try:
                xx = x.clone().requires_grad_()
                loss = sa.f_divergence_loss(xx, target, name, reduction="none", **opts)
                (g,) = torch.autograd.grad(loss[[0, 1, 5]].sum(), xx)
                outs.append((loss.detach(), g))
            finally:
                _cpu_rows.set_enabled(old)
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
    loss = sa.f_divergence_loss(x, t, name, reduction="none")
    assert loss[2] == math.inf and loss[3] == 0 and torch.isnan(loss[4])


@pytest.mark.parametrize("name", NAMES)
def test_the_graph_keeps_the_gradient_alone(name):
    """The general path's autograd graph saves one [R, k] tensor, G = p - y (the C solver's Jacobian weights and
    no float copy of the scores survive the forward)."""
    x = (torch.randn(8, 50, generator=torch.Generator().manual_seed(4)) * 3).requires_grad_()
    t = torch.arange(8)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s) or s, lambda s: s):
        loss = fenchel_young(x, t, name, {}, LossOptions())  # (sa.f_divergence_loss: one C call, G on its ctx)
    assert [tuple(s.shape) for s in saved if s.dim() == 2] == [(8, 50)]
    (g,) = torch.autograd.grad(loss, x)
    p = sa.f_softargmax(x.detach(), name)
    np.testing.assert_allclose(g.numpy(), ((p - torch.eye(8, 50)) / 8).numpy(), rtol=1e-5, atol=1e-8)
