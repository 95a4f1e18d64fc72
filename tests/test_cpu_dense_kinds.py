"""The C row solver's reverse-KL, Jeffrey and reverse-χ² kinds (softargmax.backends.cpu.rows).

test_cpu_rows runs them beside the other kinds against the PyTorch solver on the edge rows; here:
Jeffrey's Lambert W in each of the solver's modes against a 50-digit reference over the whole range
the solver uses, float32 rows against the float64 answer of the PyTorch path, gradcheck through the
public operator, threads, and the fallbacks (a reference measure q, the Triton kernels' kinds).
"""

import ctypes
import math

import mpmath
import numpy as np
import pytest
import torch
from test_cpu_rows import _torch_solve

import softargmax as sa
from softargmax import backends
from softargmax.backends.cpu import rows as _cpu_rows
from softargmax.backends.kinds import CPU_KINDS, KINDS, kind_of
from softargmax.divergences import get_divergence

pytestmark = pytest.mark.skipif(not _cpu_rows.available(), reason="no C compiler: the fused solver is not built")

NEW = ["reverse_kl", "jeffrey", "reverse_chi_square"]
#: the modes of rows.c's Jeffrey pass (JEFF_COLD, JEFF_WARM, JEFF_SERIES, and the series from a float log)
COLD, WARM, SERIES, SERIES_FLOAT = 0, 1, 2, 3


def _jeffrey_w(L, mode, prev=None, dt=0.0):
    """W(e^L) as the C pass computes it in ``mode`` (``prev``: W(e^(L - dt)) for the warm start)."""
    fn = _cpu_rows._load().sa_jeffrey_w
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_int, ctypes.c_void_p, ctypes.c_long]
    L = np.ascontiguousarray(L, dtype=np.float64)
    prev = None if prev is None else np.ascontiguousarray(prev, dtype=np.float64)
    out = np.empty_like(L)
    fn(L.ctypes.data, None if prev is None else prev.ctypes.data, dt, mode, out.ctypes.data, len(L))
    return out


def _w_reference(L):
    """W(e^L) to 50 digits, rounded to double."""
    with mpmath.workdps(50):
        return np.array([float(mpmath.lambertw(mpmath.exp(mpmath.mpf(float(x))))) for x in L])


# the range the solver uses: L = 1 + t + e >= 1, up to the clamp 1e300
_L = np.unique(np.concatenate([[1.0, 1 + 1e-12, 1.45, 1.5, 2.0, 999.0, 1000.0, 3e4, 1e30, 1e150, 1e300],
                               1 + np.geomspace(1e-6, 1e3, 60), np.geomspace(1e3, 1e300, 40)]))


def test_jeffrey_lambert_w_cold_and_series_are_exact_to_rounding():
    ref = _w_reference(_L)
    cold = _jeffrey_w(_L, COLD)
    assert np.abs(cold / ref - 1).max() <= 4.5e-16
    big = _L >= 1000  # the series mode's range (JEFF_SERIES_MIN)
    assert np.abs(_jeffrey_w(_L[big], SERIES) / ref[big] - 1).max() <= 4.5e-16
    # float rows: W - L in float, L < 1e30; documented 3e-9 of W (float32's rounding is 6e-8)
    narrow = big & (_L < 1e30)
    assert np.abs(_jeffrey_w(_L[narrow], SERIES_FLOAT) / ref[narrow] - 1).max() <= 3e-9
    assert cold[0] == 1.0  # W(e) = 1: one finite entry in a row is exactly 1


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_jeffrey_lambert_w_warm_start_at_the_limit_of_its_rule(sign):
    """The warm start (a Taylor step from the previous pass's W and one Fritsch step) is taken when
    |dt|^3 <= 5e-4 max(1, 1 + t - log(1 + t)), every L >= 1 + t: exact to rounding at that limit."""
    L = _L[(_L < 1000) & (_L > 1.2)]
    t = L - 1  # the worst case: the row's maximum, whose L is 1 + t
    dt = sign * (5e-4 * np.maximum(1.0, 1 + t - np.log1p(t))) ** (1 / 3)
    prev = _w_reference(L - dt)
    out = np.array([_jeffrey_w(np.array([l]), WARM, np.array([p]), d)[0] for l, p, d in zip(L, prev, dt)])
    assert np.abs(out / _w_reference(L) - 1).max() <= 4.5e-16


def _rows(dtype):
    """Rows for the three kinds: random at three scales, masked entries, one finite entry, a large offset, a
    constant row, a long flat row (the series mode and the float log) and a long peaked one."""
    gen = torch.Generator().manual_seed(5)
    k = 2000
    z = torch.randn(9, k, dtype=torch.float64, generator=gen)
    z[0] *= 3
    z[1] *= 0.01
    z[2] *= 30
    z[3, ::3] = -math.inf
    z[4, 1:] = -math.inf
    z[5] = z[5] * 2 + 3000  # large offset (exact in float32: the float32 row is the reference's input)
    z[6] = 0.5
    z[8] *= 300
    return z.to(dtype)


@pytest.mark.parametrize("name", NEW)
def test_float32_rows_against_the_float64_answer(name):
    div = get_divergence(name)
    z = _rows(torch.float32)
    fused = _cpu_rows.solve(z, div)
    assert fused is not None and fused.backend == "cpu"
    ref = _torch_solve(z.double(), div)
    # float32's rounding of p (and of the rows' sums at the solver's tolerance), nothing more
    torch.testing.assert_close(fused.dense_p().double(), ref.dense_p(), rtol=5e-7, atol=1e-12)
    torch.testing.assert_close(fused.s.double(), ref.scatter(ref.s), rtol=2e-6, atol=1e-12)
    assert torch.all(fused.p[3, ::3] == 0) and torch.all(fused.p[4, 1:] == 0) and fused.p[4, 0] == 1
    torch.testing.assert_close(fused.p[6], torch.full((2000,), 1 / 2000), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", NEW)
def test_float64_rows_against_the_pytorch_path(name):
    div = get_divergence(name)
    z = _rows(torch.float64)
    fused = _cpu_rows.solve(z, div)
    assert fused is not None
    ref = _torch_solve(z, div)
    torch.testing.assert_close(fused.dense_p(), ref.dense_p(), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(fused.tau, ref.tau, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused.dense_p().sum(-1), torch.ones(9, dtype=torch.float64), rtol=0, atol=1e-13)


def test_jeffrey_far_entries_and_masked_rows_give_zero_not_nan():
    """Jeffrey clamps e = m - z at 1e300: masked entries and entries more than ~1e154 below the maximum give 0."""
    z = torch.tensor([[0.0, -1.0, -math.inf, -1e200, -1e160], [-math.inf] * 5], dtype=torch.float64)
    p = sa.f_softargmax(z, "jeffrey")
    ref = _torch_solve(z[:1], get_divergence("jeffrey")).dense_p()
    assert not torch.isnan(p).any() and torch.all(p[0, 2:] == 0) and torch.all(p[1] == 0)
    torch.testing.assert_close(p[:1, :2], ref[:, :2], rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", NEW)
def test_gradcheck_through_the_public_operator(name):
    x = (torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2).requires_grad_()
    assert backends.select(x.detach(), get_divergence(name)) is _cpu_rows  # the C solver runs
    assert torch.autograd.gradcheck(lambda t: sa.f_softargmax(t, name), (x,), atol=1e-8)


@pytest.mark.parametrize("name", NEW)
def test_forward_and_backward_equal_the_pytorch_path(name):
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(2)) * 3
    x[0, :100] = -math.inf
    v = torch.randn(4, 300, generator=torch.Generator().manual_seed(3))
    outs = []
    for enabled in (True, False):
        old = _cpu_rows.set_enabled(enabled)
        try:
            xx = x.clone().requires_grad_()
            p = sa.f_softargmax(xx, name, temperature=0.7)
            (p * v).sum().backward()
            outs.append((p.detach(), xx.grad))
        finally:
            _cpu_rows.set_enabled(old)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("name", NEW)
def test_threads_do_not_change_results(name):
    z = torch.randn(160, 300, generator=torch.Generator().manual_seed(4)) * 3  # above PARALLEL_MIN_ELEMENTS
    old = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(sa.f_softargmax(z, name))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("name", NEW)
def test_reference_measure_falls_back(name):
    """A reference measure q is not on a fast path (the one decision, backends.select); both row solvers have
    these kinds (the Triton kernels' tests: test_triton_rows)."""
    div = get_divergence(name)
    assert kind_of(div)[0] is not None and kind_of(div)[0] == kind_of(div, CPU_KINDS)[0]
    assert KINDS == CPU_KINDS
    x = torch.randn(3, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    q = torch.rand(40, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) + 0.5
    assert backends.select(x, div, q=q) is None
    p = sa.f_softargmax(x, name, q=q)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)
