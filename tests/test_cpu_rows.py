"""The fused CPU row solver (softargmax.backends.cpu.rows) against the PyTorch solver and the sort references.

Both paths are independent implementations of the same method; the PyTorch one
is checked against brute-force optimizers in test_fdiv and against sort-based references
in test_entmax, and those suites run on both paths (the ``solver_path`` fixture).  Here:
the Solution objects agree field by field on edge cases (masks, NaN/+inf rows, ties,
one-element rows, long rows, extreme scales), threads do not change results, and the
fallbacks work.
"""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import CPU_FUSED_COVERED, edge_rows, entmax15_sort, sparsemax_sort

import softargmax as sa
from softargmax.backends.cpu import rows as _cpu_rows
from softargmax.divergences import get_divergence
from softargmax.solvers.threshold import solve

pytestmark = pytest.mark.skipif(not _cpu_rows.available(), reason="no C compiler: the fused solver is not built")

COVERED = CPU_FUSED_COVERED


def _ids(case):
    name, params = case
    return name + "".join(f"-{v}" for v in params.values())


def _torch_solve(z, div):
    old = _cpu_rows.set_enabled(False)
    try:
        return solve(z, div)
    finally:
        _cpu_rows.set_enabled(old)


@pytest.mark.parametrize("case", COVERED, ids=_ids)
@pytest.mark.parametrize("k", [1, 2, 7, 64, 1000, 5003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_solution_matches_torch_solver(case, k, dtype):
    name, params = case
    div = get_divergence(name, **params)
    z = edge_rows(k, dtype, torch.Generator().manual_seed(k))
    fused = _cpu_rows.solve(z, div)
    assert fused is not None
    ref = _torch_solve(z, div)
    tol = dict(atol=1e-11, rtol=1e-9) if dtype == torch.float64 else dict(atol=3e-6, rtol=1e-4)
    torch.testing.assert_close(fused.dense_p(), ref.dense_p(), equal_nan=True, **tol)
    ok = torch.ones(9, dtype=torch.bool)
    ok[[2, 3, 4]] = False  # masked / bad rows: tau is a convention there, p and s are what count
    torch.testing.assert_close(fused.tau[ok], ref.tau[ok], **tol)
    s_ref = ref.scatter(ref.s)
    torch.testing.assert_close(fused.s[ok], s_ref[ok], **tol)
    torch.testing.assert_close(fused.s_sum[ok], ref.s_sum[ok], **tol)
    assert fused.bad_rows is not None and fused.bad_rows.squeeze(1).tolist() == [
        False, False, False, True, True, False, False, False, False]
    assert torch.all(fused.p[2] == 0) and torch.all(fused.s[2] == 0) and fused.s_sum[2, 0] == 0
    assert torch.isnan(fused.dense_p()[3]).all() and torch.isnan(fused.dense_p()[4]).all()
    good = fused.dense_p()[[0, 1, 5, 6, 7, 8]].double()
    torch.testing.assert_close(good.sum(-1), torch.ones(6, dtype=torch.float64),
                               atol=1e-12 if dtype == torch.float64 else 2e-6, rtol=0)


@pytest.mark.parametrize("k", [3, 50, 777, 20000])
def test_exact_sparsemax_and_entmax15_against_sort(k):
    gen = torch.Generator().manual_seed(k)
    z = torch.randn(16, k, dtype=torch.float64, generator=gen) * 2
    for fn, ref in [(sa.sparsemax, sparsemax_sort), (sa.entmax15, entmax15_sort)]:
        expect = torch.from_numpy(np.stack([ref(row) for row in z.numpy()]))
        torch.testing.assert_close(fn(z), expect, atol=1e-13, rtol=0)
        # exact: the support matches the sort reference's exactly
        assert torch.equal(fn(z) > 0, expect > 0)


def test_per_row_alpha_matches_torch_path_with_gradients():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 40, dtype=torch.float64, generator=gen) * 2
    x[0, 0, :5] = -math.inf
    alpha = (1.0 + torch.rand(4, 3, 1, dtype=torch.float64, generator=gen)).clamp(1.01, 2.0)
    alpha[1, 2] = 2.0
    alpha[2, 1] = 1.5
    v = torch.randn(4, 3, 40, dtype=torch.float64, generator=gen)
    results = []
    for enabled in (True, False):
        old = _cpu_rows.set_enabled(enabled)
        try:
            xx, aa = x.clone().requires_grad_(), alpha.clone().requires_grad_()
            p = sa.entmax(xx, aa)
            (p * v).sum().backward()
            results.append((p.detach(), xx.grad, aa.grad))
        finally:
            _cpu_rows.set_enabled(old)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_alpha_outside_covered_range_falls_back():
    z = torch.randn(4, 30, dtype=torch.float64)
    for name, params in [("alpha", {"alpha": 2.5}), ("alpha", {"alpha": 0.5}), ("kl", {})]:
        assert _cpu_rows.solve(z, get_divergence(name, **params)) is None
    assert _cpu_rows.solve_alpha_rows(z, torch.tensor([[1.5], [2.5], [1.5], [1.5]], dtype=torch.float64)) is None
    assert _cpu_rows.solve(z.t(), get_divergence("chi_square")) is None  # not contiguous
    assert _cpu_rows.solve(z.half(), get_divergence("chi_square")) is None  # computed in float32 upstream
    # α just above 1 (α - 1 below MIN_A of the dtype) goes to the PyTorch path, the rest stays here
    for dtype, near, ordinary in ((torch.float32, 1 + 1e-7, 1 + 1e-5), (torch.float64, 1 + 1e-5, 1 + 2e-4)):
        zd = z.to(dtype)
        assert _cpu_rows.solve(zd, get_divergence("alpha", alpha=near)) is None
        assert _cpu_rows.solve_alpha_rows(zd, torch.tensor([[1.5], [near], [1.5], [1.5]], dtype=dtype)) is None
        assert _cpu_rows.solve(zd, get_divergence("alpha", alpha=ordinary)) is not None
        assert _cpu_rows.solve_alpha_rows(zd, torch.full((4, 1), ordinary, dtype=torch.float64)) is not None
    # the public operators still answer (PyTorch path)
    p = sa.entmax(z, 2.5)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, dtype=torch.float64))


def test_threads_do_not_change_results():
    z = torch.randn(512, 300, generator=torch.Generator().manual_seed(0)) * 3  # above PARALLEL_MIN_ELEMENTS
    assert z.numel() >= _cpu_rows.PARALLEL_MIN_ELEMENTS
    old = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(sa.entmax(z, 1.3))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1])


def test_input_is_not_modified():
    z = torch.randn(8, 100) * 3
    z[0, :3] = -math.inf
    before = z.clone()
    for name, params in COVERED:
        _cpu_rows.solve(z, get_divergence(name, **params))
    assert torch.equal(z, before)


def _run_python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, env=full,
                          timeout=300)


def test_missing_compiler_falls_back_with_a_warning(tmp_path):
    code = ("import torch, softargmax as sa; from softargmax.backends.cpu import rows as _cpu_rows; "
            "x = torch.randn(3, 9, dtype=torch.float64); p = sa.sparsemax(x); "
            "print(_cpu_rows.available(), float(p.sum(-1).sub(1).abs().max()) < 1e-12)")
    proc = _run_python(code, CC="/nonexistent/cc", SOFTARGMAX_CACHE_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
    assert "fused CPU row solver is unavailable" in proc.stderr


def test_library_is_built_from_the_source_seen_at_import(tmp_path, monkeypatch):
    """The build is lazy: a process whose ``rows.c`` changed on disk after import (an editable install updated
    during a long run) must still build the code its ctypes signatures were written for, not the new file."""
    changed = tmp_path / "rows.c"
    changed.write_text("this is not C\n")
    monkeypatch.setattr(_cpu_rows, "SOURCE", changed)
    monkeypatch.setenv("SOFTARGMAX_CACHE_DIR", str(tmp_path / "cache"))
    built = _cpu_rows._build()
    assert built.exists() and built.parent == tmp_path / "cache"
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # the temporary source and library are gone


def test_environment_switch_disables_the_fused_path():
    proc = _run_python("from softargmax.backends.cpu import rows as _cpu_rows; print(_cpu_rows.enabled())", SOFTARGMAX_CPU_KERNELS="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def _bits(t):
    """A float tensor's bit pattern (NaN payloads and the sign of zero included)."""
    return t.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 7, 300])
def test_threshold_converted_in_c_equals_the_tensor_formula(dtype, k):
    """The C solver writes τ_f = (t + c)/a itself: bit for bit the two tensor operations it replaces."""
    from softargmax.backends.kinds import KIND_POWER, cpu_parameter

    z = edge_rows(k, dtype, torch.Generator().manual_seed(k))
    for a, c in [(1.0, 0.0), (1.0, 1.0), (0.5, 1.0), (0.3, 1.0), (0.7, 1.0), (0.05, 1.0), (1e-5, 1.0)]:
        raw = _cpu_rows._run(z, KIND_POWER, cpu_parameter(a), 0)
        converted = _cpu_rows._run(z, KIND_POWER, cpu_parameter(a), 0, c)
        assert torch.equal(_bits(converted.tau), _bits((raw.tau + c) / a)), (a, c)
        assert torch.equal(_bits(converted.p), _bits(raw.p))
    # one α per row: (t + 1) / a with a in z's dtype
    a_rows = torch.linspace(0.05, 1.0, z.shape[0], dtype=torch.float64)
    raw = _cpu_rows._run(z, KIND_POWER, a_rows, 1)
    converted = _cpu_rows._run(z, KIND_POWER, a_rows, 1, 1.0)
    assert torch.equal(_bits(converted.tau), _bits((raw.tau + 1) / a_rows.to(dtype).unsqueeze(1)))


@pytest.mark.parametrize("case", COVERED, ids=_ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_probabilities_alone_equal_the_solution(case, dtype):
    """``probabilities`` (p written alone, no weights, thresholds or statuses) is ``solve(...).dense_p()``
    bit for bit, on one thread and on two (rows above the parallel threshold), and the solution
    reports bad rows without a reduction over the statuses."""
    name, params = case
    div = get_divergence(name, **params)
    old = torch.get_num_threads()
    try:
        for k, threads in [(1, 1), (8, 1), (1000, 1), (5003, 2)]:
            torch.set_num_threads(threads)
            z = edge_rows(k, dtype, torch.Generator().manual_seed(k))
            if k == 5003:
                z = z.repeat(8, 1)  # 72 rows: above PARALLEL_MIN_ELEMENTS
            sol = _cpu_rows.solve(z, div)
            assert torch.equal(_bits(_cpu_rows.probabilities(z, div)), _bits(sol.dense_p()))
            assert sol.bad_rows is not None and torch.equal(sol.bad_rows.squeeze(1), torch.isnan(sol.p).all(1))
            good = z[[0, 1, 5, 6, 7, 8]]
            assert _cpu_rows.solve(good, div).bad_rows is None
            assert torch.equal(_bits(_cpu_rows.probabilities(good, div)), _bits(_cpu_rows.solve(good, div).dense_p()))
    finally:
        torch.set_num_threads(old)


def test_one_thread_and_two_report_the_same_iterations():
    z = torch.randn(512, 300, generator=torch.Generator().manual_seed(1)) * 3
    old = torch.get_num_threads()
    sols = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            sols.append(_cpu_rows.solve(z, get_divergence("alpha", alpha=1.3)))
    finally:
        torch.set_num_threads(old)
    assert sols[0].iterations == sols[1].iterations > 0
    for f in ("tau", "p", "s", "s_sum"):
        assert torch.equal(getattr(sols[0], f), getattr(sols[1], f))


POWER_COVERED = [c for c in COVERED if c[0] in ("chi_square", "alpha")]


@pytest.mark.parametrize("case", POWER_COVERED, ids=_ids)
@pytest.mark.parametrize("k", [7, 300, 2048])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loss_row_sums_against_float64_reference(case, k, dtype):
    """The C solver's ``zp = ⟨z, p⟩`` and ``omega = Σ_{p>0} f(p) - f(0)`` (the Fenchel–Young loss values' row sums)
    against the same sums in float64 from the PyTorch solver's float64 ``p`` and the divergence's own ``f``: NaN in
    rows with NaN or +inf, 0 in an all-masked row."""
    name, params = case
    div = get_divergence(name, **params)
    z = edge_rows(k, dtype, torch.Generator().manual_seed(k))
    fused = _cpu_rows.solve(z, div, row_sums=True)
    assert fused is not None and fused.zp is not None and fused.omega is not None
    p = _torch_solve(z.double(), div).dense_p()
    pos = p > 0
    zp = torch.where(pos, z.double() * p, torch.zeros_like(p)).sum(-1)
    f0 = float(div.f(torch.zeros((), dtype=torch.float64)))
    om = torch.where(pos, div.f(torch.where(pos, p, torch.ones_like(p))) - f0, torch.zeros_like(p)).sum(-1)
    good = [0, 1, 5, 6, 8] + ([7] if dtype == torch.float64 else [])  # row 7 (scores ~1e4): float32 rounds z·p
    tol = dict(atol=1e-9, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(fused.zp[good], zp[good], **tol)
    torch.testing.assert_close(fused.omega[good], om[good], **tol)
    assert fused.zp[2] == 0 and fused.omega[2] == 0
    assert torch.isnan(fused.zp[[3, 4]]).all() and torch.isnan(fused.omega[[3, 4]]).all()
    # without row_sums none are computed (the operators' call)
    assert _cpu_rows.solve(z, div, row_sums=False).zp is None


@pytest.mark.parametrize("scale", [0.02, 0.3, 1.0])
@pytest.mark.parametrize("k", [2048, 2003])
def test_exact_on_flat_rows_against_sort(scale, k):
    """Flat rows (a model early in training: most of the row is a candidate) are solved exactly: the start from the
    block maxima's own root must stay below the row's root, and the support match the sort reference's."""
    gen = torch.Generator().manual_seed(k)
    z = torch.randn(8, k, dtype=torch.float64, generator=gen) * scale
    z[1, ::16] += 1.0  # the block maxima alone are the support, or nearly
    z[2, :5] = 10.0  # a tied support of five, inside the first block
    for fn, ref in [(sa.sparsemax, sparsemax_sort), (sa.entmax15, entmax15_sort)]:
        expect = torch.from_numpy(np.stack([ref(row) for row in z.numpy()]))
        got = fn(z)
        torch.testing.assert_close(got, expect, atol=1e-13, rtol=0)
        assert torch.equal(got > 0, expect > 0)
        torch.testing.assert_close(fn(z.float()), expect.float(), atol=2e-6, rtol=0)


@pytest.mark.parametrize("mapping", ["entmax15", "sparsemax", "chi_square"])
def test_loss_through_c_row_sums_equals_torch_path(mapping):
    """The Fenchel–Young loss on CPU (the C solver's row sums) equals the PyTorch path's, value and gradient,
    with masked entries, and the fused linear loss too."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2048, generator=gen) * 0.3
    x[3, :100] = -math.inf
    y = torch.randint(100, 2048, (64,), generator=gen)
    values = []
    for enabled in (True, False):
        old = _cpu_rows.set_enabled(enabled)
        try:
            xx = x.clone().requires_grad_()
            loss = sa.fenchel_young_loss(xx, y, mapping, reduction="none")
            loss.sum().backward()
            values.append((loss.detach(), xx.grad))
        finally:
            _cpu_rows.set_enabled(old)
    torch.testing.assert_close(values[0][0], values[1][0], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(values[0][1], values[1][1], atol=2e-6, rtol=1e-5)
    ref = sa.fenchel_young_loss(x.double(), y, mapping, reduction="none")
    torch.testing.assert_close(values[0][0].double(), ref, atol=2e-5, rtol=1e-5)
    assert torch.isfinite(values[0][0]).all() and torch.isfinite(values[0][1]).all()


# -- a reference measure q (the power kind's weights) ---------------------------------------------

POWER_KINDS = [c for c in COVERED if c[0] == "chi_square" or (c[0] == "alpha" and 1 < c[1]["alpha"] <= 2)]


def _torch_solve_q(z, div, q):
    old = _cpu_rows.set_enabled(False)
    try:
        return solve(z, div, q)
    finally:
        _cpu_rows.set_enabled(old)


def _weights(rows, k, dtype, seed):
    """Positive weights over twelve orders of magnitude (a learned reference measure can be far from 1)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.exp(torch.empty(rows, k, dtype=torch.float64).uniform_(-6, 6, generator=gen) * math.log(10)).to(dtype)


@pytest.mark.parametrize("case", POWER_KINDS, ids=_ids)
@pytest.mark.parametrize("k", [1, 7, 300, 2048])
@pytest.mark.parametrize("shared", [True, False], ids=["q-shared", "q-per-row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_power_kind_matches_torch_solver(case, k, shared, dtype):
    """With a reference measure ``q`` (``[1, k]`` or ``[R, k]``) the C solver's weighted power kind,
    ``p_j = q_j [a z_j - t]_+^{1/a}``, agrees with the PyTorch solver field by field on the edge rows, and the
    backends' one decision sends it there."""
    name, params = case
    div = get_divergence(name, **params)
    z = edge_rows(k, dtype, torch.Generator().manual_seed(k))
    q = _weights(1 if shared else z.shape[0], k, dtype, k + shared)
    fused = solve(z, div, q)
    assert fused.backend == "cpu"
    # the reference: the PyTorch solver in float64 (in float32 its Newton sums over weights of 1e-6..1e6 round
    # more than the C solver's, which iterates in double: 2e-3 off in a one-entry row with q = 1e5)
    ref = _torch_solve_q(z.double(), div, q.double())
    assert ref.backend == "torch"
    # float64: the reference's own Newton sums round to 3e-9 relative on a flat row of 2048 weights over twelve
    # orders (the C solver is exact there: q_j / Σ q, checked below)
    tol = dict(atol=1e-10, rtol=1e-8) if dtype == torch.float64 else dict(atol=3e-6, rtol=1e-5)

    def close(a, b):
        torch.testing.assert_close(a.double(), b, equal_nan=True, **tol)

    close(fused.dense_p(), ref.dense_p())
    ok = torch.ones(9, dtype=torch.bool)
    ok[[2, 3, 4]] = False  # masked / bad rows: tau is a convention there
    ok[7] = dtype == torch.float64  # scores ~1e4: tau (and s at its ulp) carry float32's rounding of the scores
    close(fused.tau[ok], ref.tau[ok])
    s_ref = ref.scatter(ref.s)[ok]
    torch.testing.assert_close(fused.s[ok].double(), s_ref, atol=tol["atol"] * (1 + s_ref.abs().amax().item()),
                               rtol=tol["rtol"])
    close(fused.s_sum[ok], ref.s_sum[ok])
    assert torch.all(fused.p[2] == 0) and torch.all(fused.s[2] == 0)
    assert torch.isnan(fused.dense_p()[3]).all() and torch.isnan(fused.dense_p()[4]).all()
    # the constant row: p = q / Σ q whatever the generator, up to the rounding of the base raised to 1/a and the
    # solver's stopping test (|Σ p - 1| <= 8 ε₆₄ log2(k + 1) for a outside {1/2, 1})
    q5, a = q[0 if shared else 5].double(), params.get("alpha", 2.0) - 1
    rtol = 8 * torch.finfo(dtype).eps / a + 8 * torch.finfo(torch.float64).eps * math.log2(k + 1)
    torch.testing.assert_close(fused.dense_p()[5].double(), q5 / q5.sum(), atol=0, rtol=rtol)
    good = [0, 1, 5, 6, 7, 8]
    # Σ p - 1 within the rounding of the scores passed on by the Jacobian weights: Σ_j s_j |z_j| ε (with q up to
    # 1e6 and scores of 1e4 it is not 1e-12: p_j = q_j (z_j - τ) with τ within an ulp of z_j)
    zs = torch.where(fused.s > 0, fused.s.double() * (z.double().abs() + 1), torch.zeros_like(fused.s, dtype=torch.float64))
    bound = 8 * torch.finfo(dtype).eps * zs.sum(-1)[good] + (1e-12 if dtype == torch.float64 else 2e-6)
    assert ((fused.dense_p()[good].double().sum(-1) - 1).abs() <= bound).all()


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_weighted_power_kind_against_brute_force(alpha):
    """The weighted solution maximizes ``⟨p, x⟩ - Σ_j q_j f(p_j / q_j)`` over the simplex (an SLSQP optimizer in
    float64, independent of both solvers), with exact zeros where the optimizer's are zero."""
    pytest.importorskip("scipy")
    from conftest import brute_force_fsoftargmax

    div = get_divergence("alpha", alpha=alpha)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, dtype=torch.float64, generator=gen)
    q = torch.rand(4, 6, dtype=torch.float64, generator=gen) * 3 + 0.05
    got = solve(x, div, q)
    assert got.backend == "cpu"
    p = got.dense_p()
    for r in range(4):
        ref, _ = brute_force_fsoftargmax(div, x[r].numpy(), q[r].numpy(), 1.0)
        np.testing.assert_allclose(p[r].numpy(), ref, atol=2e-6)


def test_weighted_flat_rows_and_tiny_weights_against_float64():
    """Rows where most entries are candidates, and weights as small as 1e-30 or as large as 1e30 (the start, from the
    block maxima's own weights, stays below the root), against the PyTorch solver in float64."""
    div = get_divergence("alpha", alpha=1.5)
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(6, 4096, dtype=torch.float64, generator=gen) * 0.05
    q = torch.ones(6, 4096, dtype=torch.float64)
    q[1] = 1e-30
    q[2] = 1e30
    q[3, ::2] = 1e-8  # the row maximum's weight tiny in half the blocks
    q[4, :2048] = 1e6
    z[5, ::16] += 1.0  # the block maxima alone carry the support
    fused = solve(z, div, q)
    assert fused.backend == "cpu"
    ref = _torch_solve_q(z, div, q)
    rows = [0, 1, 3, 4, 5]
    torch.testing.assert_close(fused.dense_p()[rows], ref.dense_p()[rows], atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(fused.dense_p().sum(-1), torch.ones(6, dtype=torch.float64), atol=1e-12, rtol=0)
    # q = 1e30: the bases are 1e-15, below the gaps between the scores: the maximum alone, p = 1 (the PyTorch path,
    # which forms the base as a z - (a τ - 1) with τ near 2, rounds it to 0.9984 there)
    one_hot = torch.nn.functional.one_hot(z[2].argmax(), 4096).double()
    assert torch.equal(fused.dense_p()[2] > 0, one_hot > 0)
    torch.testing.assert_close(fused.dense_p()[2], one_hot, atol=1e-15, rtol=0)


@pytest.mark.parametrize("mapping", ["entmax15", "sparsemax", "chi_square"])
def test_weighted_operators_and_losses_equal_the_torch_path(mapping):
    """``f_softargmax``, ``f_softmax`` and the Fenchel–Young loss with ``q`` (through the C solver, the loss value from
    its weighted row sums) equal the PyTorch path's, values and gradients (also ``q``'s), with masked entries."""
    gen = torch.Generator().manual_seed(0)
    div = sa.mappings.resolve(mapping, None)
    x = torch.randn(16, 500, generator=gen, dtype=torch.float64) * 2
    x[3, :100] = -math.inf
    q0 = torch.rand(500, generator=gen, dtype=torch.float64) * 2 + 0.1
    y = torch.randint(100, 500, (16,), generator=gen)
    results = []
    for enabled in (True, False):
        old = _cpu_rows.set_enabled(enabled)
        try:
            xx, q = x.clone().requires_grad_(), q0.clone().requires_grad_()
            p = sa.f_softargmax(xx, div, q=q)
            v = sa.f_softmax(xx, div, q=q)
            loss = sa.f_divergence_loss(xx, y, div, q=q, reduction="none")
            w = torch.randn(16, 500, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            ((p * w).sum() + v.sum() + loss.sum()).backward()
            with torch.no_grad():  # the output alone (the C solver writes p and nothing else)
                p_alone = sa.f_softargmax(x, div, q=q0)
            torch.testing.assert_close(p_alone, p.detach(), atol=0, rtol=0)
            results.append([p.detach(), v.detach(), loss.detach(), xx.grad, q.grad])
        finally:
            _cpu_rows.set_enabled(old)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
