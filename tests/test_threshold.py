"""The PyTorch threshold solver's pieces: the block layout, the block selection, tracing,
and the :class:`~softargmax.backends.solution.Solution` contract shared by every backend."""

import math

import pytest
import torch
from conftest import CPU_FUSED_COVERED, div_id, sparsemax_sort

import softargmax as sa
from softargmax import backends as _kernels
from softargmax.backends.solution import Solution
from softargmax.divergences import Divergence, SolverHints, get_divergence
from softargmax.solvers import threshold
from softargmax.solvers.threshold import PRUNE_MIN_LENGTH, block_layout, select_blocks, solve


@pytest.mark.parametrize("k", [PRUNE_MIN_LENGTH, 130, 256, 1000, 1024, 4096, 30000, 2**17])
def test_block_layout_splits_the_row(k):
    B, nb = block_layout(k)
    assert B * nb == k and B >= 2 and nb >= 4
    # B is the divisor of k nearest to sqrt(k)/4 (at least 4) on a log scale, among 2..4·target
    target = max(4.0, math.sqrt(k) / 4)
    divisors = [b for b in range(2, int(4 * target) + 1) if k % b == 0 and k // b >= 4]
    best = min(abs(math.log(b / target)) for b in divisors)
    assert abs(math.log(B / target)) == pytest.approx(best)


def test_block_layout_declines():
    assert block_layout(PRUNE_MIN_LENGTH - 1) is None  # short rows: never pruned
    assert block_layout(10, min_length=1) is None  # no divisor leaves 4 blocks
    assert block_layout(131) is None  # a prime: no divisor
    assert block_layout(2 * 131, min_length=1) == (2, 131)  # only 2 divides below 4·target


def _brute_select(bmax, thr):
    return [[j for j in range(bmax.shape[1]) if bmax[r, j] > thr[r, 0]] for r in range(bmax.shape[0])]


def test_select_blocks_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    R, nb = 6, 40
    bmax = torch.randn(R, nb, generator=gen, dtype=torch.float64)
    thr = torch.quantile(bmax, 0.8, dim=1, keepdim=True)  # about 8 blocks per row
    thr[2] = bmax[2].max() + 1  # a row that selects nothing
    bmax[3, 5] = math.nan  # NaN blocks are never selected
    table, valid = select_blocks(bmax, thr)
    want = _brute_select(bmax, thr)
    KB = max(len(w) for w in want)
    assert table.shape == (R, KB) and valid.shape == (R, KB)
    for r in range(R):
        got = table[r][valid[r]].tolist()
        assert got == want[r], r  # in increasing order, exactly the selected blocks
        assert valid[r].sum().item() == len(want[r])
        assert bool(valid[r, : len(want[r])].all()) and not bool(valid[r, len(want[r]):].any())


def test_select_blocks_declines_when_most_blocks_pass():
    bmax = torch.arange(8.0).reshape(1, 8)
    assert select_blocks(bmax, torch.tensor([[0.5]])) == (None, None)  # 7 of 8 blocks
    table, valid = select_blocks(bmax, torch.tensor([[5.5]]))  # 2 of 8
    assert table[valid].tolist() == [6, 7]


@pytest.fixture
def reference():
    old = _kernels._cpu_rows.set_enabled(False)
    yield
    _kernels._cpu_rows.set_enabled(old)


def test_pruned_solution_is_exact(reference):
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(5, 4096, generator=gen, dtype=torch.float64) * 4
    sol = solve(z, get_divergence("chi_square"))
    assert sol.block_index is not None and sol.p.shape[1] < z.shape[1] // 2, "pruning did not happen"
    torch.testing.assert_close(sol.dense_p(), torch.from_numpy(sparsemax_sort(z.numpy())), atol=1e-12, rtol=0)
    # gather and scatter are inverse on the candidates
    torch.testing.assert_close(sol.scatter(sol.gather(sol.dense_p())), sol.dense_p())


@pytest.mark.parametrize("name,params", [("alpha", {"alpha": 1.5}), ("alpha", {"alpha": 1.3}),
                                         ("chi_square", {}), ("jensen_shannon", {}), ("alpha", {"alpha": 3.0})])
def test_trace_records_every_iterate(name, params, reference):
    div = get_divergence(name, **params)
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(4, 300, generator=gen, dtype=torch.float64) * 3
    trace = []
    sol = solve(z, div, trace=trace)
    assert sol.backend == "torch"  # tracing never takes a fast path
    assert len(trace) == sol.iterations + 1  # the start, then one per step
    assert all(t.shape == (4, 1) for t in trace)
    torch.testing.assert_close(trace[-1], sol.tau)
    ref = solve(z, div)  # the same solver without a trace
    torch.testing.assert_close(sol.tau, ref.tau)
    if div.hints.monotone_newton:  # iterates increase to the root
        steps = torch.cat(trace, 1)
        assert bool((steps[:, 1:] >= steps[:, :-1] - 1e-12).all())


def test_max_iter_and_no_prune_keep_the_reference(reference):
    z = torch.randn(3, 500, dtype=torch.float64)
    div = get_divergence("alpha", alpha=1.5)
    full = solve(z, div, prune=False)
    assert full.block_index is None
    torch.testing.assert_close(full.dense_p(), solve(z, div).dense_p())
    capped = solve(z, div, max_iter=1)
    assert capped.iterations <= 1


# -- the contract every backend honours ------------------------------------------------


def _backends():
    out = ["torch"]
    if _kernels._cpu_rows.available():
        out.append("cpu")
    return out


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("case", CPU_FUSED_COVERED, ids=div_id)
def test_solution_contract(case, backend):
    """jvp, inner and f_sum agree with their definitions whichever solver ran."""
    name, params = case
    div = get_divergence(name, **params)
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(6, 200, generator=gen, dtype=torch.float64) * 2
    z[1, :50] = -math.inf
    old = _kernels._cpu_rows.set_enabled(backend == "cpu")
    try:
        sol = solve(z, div)
    finally:
        _kernels._cpu_rows.set_enabled(old)
    assert isinstance(sol, Solution) and sol.backend == backend
    p = sol.dense_p()
    # jvp against autograd of the mapping's reference formula: p = g(z - τ(z)); the JVP
    # is the Jacobian-vector product of the implicit function, here checked as
    # s ⊙ (v - ⟨s,v⟩/Σs) with s recomputed independently from p (s = 1/f''(p) on the support)
    v = torch.randn(6, 200, generator=gen, dtype=torch.float64)
    g = sol.jvp(v, temperature=2.0)
    pp = p.clone().requires_grad_(True)
    fp = torch.autograd.grad(div.f(pp.clamp_min(1e-300)).sum(), pp, create_graph=True)[0]
    fpp = torch.autograd.grad(fp.sum(), pp)[0]
    s = torch.where(p > 0, 1 / fpp, torch.zeros_like(p))
    c = (s * v).sum(-1, keepdim=True) / s.sum(-1, keepdim=True)
    torch.testing.assert_close(g, s * (v - c) / 2.0, atol=1e-9, rtol=1e-6)
    torch.testing.assert_close(g.sum(-1), torch.zeros(6, dtype=torch.float64), atol=1e-12, rtol=0)
    # ⟨θ, p⟩ and Σ f(p) - f(0)
    theta = 3.0 * z
    want = torch.where(p > 0, theta * p, torch.zeros_like(p)).sum(-1)
    torch.testing.assert_close(sol.inner(theta, 3.0), want)
    f0 = float(div.f(torch.zeros((), dtype=torch.float64)))
    if math.isfinite(f0):
        ones = torch.ones_like(p)
        want = torch.where(p > 0, div.f(torch.where(p > 0, p, ones)) - f0, torch.zeros_like(p)).sum(-1)
        torch.testing.assert_close(sol.f_sum(div, None, f0, torch.float64), want)


def test_solution_without_weights_points_to_jvp():
    sol = Solution(tau=torch.zeros(1, 1), p=torch.ones(1, 1), s=None, s_sum=torch.ones(1, 1), block_index=None,
                   k=1, bad_rows=None, iterations=0)
    with pytest.raises(RuntimeError, match="jvp"):
        sol.jvp(torch.ones(1, 1))


def test_one_decision_for_the_fast_paths():
    """select() is the one place: a q outside the C solver's power kind, loss values on CPU, uncovered
    divergences -> the PyTorch path."""
    z = torch.randn(4, 64)
    covered = get_divergence("alpha", alpha=1.5)
    cpu = _kernels._cpu_rows
    if not cpu.available():
        pytest.skip("the fused CPU row solver could not be built here")
    assert _kernels.select(z, covered) is cpu
    # a reference measure: the C solver's power kind alone ([1, k] or [R, k]; also for the candidates, which the
    # PyTorch path does not prune with a q), never a dense kind, a traced call or one α per row
    assert _kernels.select(z, covered, q=torch.ones(1, 64)) is cpu
    assert _kernels.select(z, covered, q=torch.ones(4, 64), candidates_only=True) is cpu
    assert _kernels.select(z, get_divergence("chi_square"), q=torch.ones(1, 64)) is cpu
    assert _kernels.select(z, covered, q=torch.ones(64)) is None  # not [R|1, k]: the solver's caller reshapes q
    assert _kernels.select(z, get_divergence("jensen_shannon"), q=torch.ones(1, 64)) is None
    assert _kernels.select(z, get_divergence("kl"), q=torch.ones(1, 64)) is None
    assert _kernels.select(z, alpha_rows=torch.full((4, 1), 1.7), q=torch.ones(1, 64)) is None
    assert threshold.solve(z, covered, torch.ones(1, 64)).backend == "cpu"
    assert _kernels.select(z, covered, candidates_only=True) is None
    assert _kernels.select(z, get_divergence("kl")) is None
    assert _kernels.select(z, get_divergence("alpha", alpha=2.5)) is None
    assert _kernels.select(z.half(), covered) is None  # the C solver reads float32/64 only
    assert _kernels.select(z, alpha_rows=torch.full((4, 1), 1.7)) is cpu
    assert _kernels.select(z, alpha_rows=torch.tensor([[1.5], [2.5], [1.5], [1.5]])) is None
    assert _kernels.select(z, alpha_relu=1.5) is cpu  # the C α-ReLU: one τ, or one per row
    assert _kernels.select(z, alpha_relu=1.5, relu_tau=torch.zeros(4, 1)) is cpu
    assert _kernels.select(z, alpha_relu=1.5, relu_tau=torch.zeros(64)) is None  # τ per column: PyTorch
    assert threshold.solve(z, covered).backend == "cpu"
    assert threshold.solve(z, covered, candidates_only=True).backend == "torch"
    # the loss values: the C solver computes their row sums for α-entmax; the dense generators that it alone
    # has take it (nothing to prune: their candidates are the full rows on either path), row sums or not;
    # Jensen–Shannon and Hellinger take it for the row sums (the conjugate Ω*, in double), not for the candidates
    assert _kernels.select(z, covered, candidates_only=True, row_sums=True) is cpu
    assert _kernels.select(z, get_divergence("chi_square"), candidates_only=True, row_sums=True) is cpu
    for dense in ("reverse_kl", "jeffrey", "reverse_chi_square"):
        assert _kernels.select(z, get_divergence(dense), candidates_only=True, row_sums=True) is cpu
        assert _kernels.select(z, get_divergence(dense), candidates_only=True) is cpu
        assert _kernels.select(z, get_divergence(dense), q=torch.ones(1, 64), candidates_only=True) is None
    for dense in ("jensen_shannon", "squared_hellinger"):
        assert _kernels.select(z, get_divergence(dense), candidates_only=True, row_sums=True) is cpu
        assert _kernels.select(z, get_divergence(dense), candidates_only=True) is None
        sol = threshold.solve(z, get_divergence(dense), candidates_only=True, row_sums=True)
        assert sol.backend == "cpu" and sol.omega_star is not None and sol.zp is None
    assert _kernels.select(z, covered, q=torch.ones(1, 64), candidates_only=True, row_sums=True) is cpu
    sol = threshold.solve(z, covered, candidates_only=True, row_sums=True)
    assert sol.backend == "cpu" and sol.zp is not None and sol.omega is not None
    sol = threshold.solve(z, covered, torch.ones(1, 64), candidates_only=True, row_sums=True)
    assert sol.backend == "cpu" and sol.zp is not None and sol.omega is not None
    # τ itself (f_softmax's value): the fused τ = (t + 1)/(α - 1) cancels near α = 1
    near_one = get_divergence("alpha", alpha=1.1)
    assert not near_one.hints.fused_tau_exact and covered.hints.fused_tau_exact
    assert _kernels.select(z, near_one) is cpu
    assert _kernels.select(z, near_one, exact_tau=True) is None
    assert _kernels.select(z, covered, exact_tau=True) is cpu
    assert _kernels.select(z, near_one, q=torch.ones(1, 64), exact_tau=True) is None  # (with q too)


class _Tsallis15(Divergence):
    """A toy generator written from scratch: the 1.5-Tsallis entropy, ``f(u) = (u^1.5 - 1 - 1.5(u - 1))/0.75``,
    whose ``g(v) = [1 + v/2]_+^2`` is the power kind with ``a = 1/2``.  It declares that, and
    nothing else in the library changes: it takes the C row solver."""

    name = "toy_tsallis15"
    f_prime_zero = -2.0
    hints = SolverHints(newton_power=0.5, monotone_newton=True, fused_kind=("power", 0.5))

    def f(self, u):
        return (u**1.5 - 1 - 1.5 * (u - 1)) / 0.75

    def f_prime(self, u):
        return (torch.sqrt(u) - 1) / 0.5

    def conj(self, v):
        return (torch.clamp(1 + 0.5 * v, min=0) ** 3 - 1) / 1.5

    def conj_prime(self, v):
        return torch.clamp(1 + 0.5 * v, min=0) ** 2

    def conj_prime2(self, v):
        return torch.clamp(1 + 0.5 * v, min=0)


def test_a_new_divergence_takes_the_fast_path_by_declaring_its_kind():
    from softargmax.backends.cpu import rows as _cpu_rows

    toy = _Tsallis15()
    x = torch.randn(6, 300, dtype=torch.float64) * 3
    x[0, :100] = -math.inf
    assert _kernels.select(x, toy) is _cpu_rows
    sol = solve(x, toy)
    assert sol.backend == "cpu"
    fast = sa.f_softargmax(x, toy)
    old = _cpu_rows.set_enabled(False)
    try:
        reference = sa.f_softargmax(x, toy)
        assert solve(x, toy).backend == "torch"
    finally:
        _cpu_rows.set_enabled(old)
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-12)
    torch.testing.assert_close(fast, sa.entmax15(x), rtol=0, atol=1e-12)  # it is 1.5-entmax
    # the gradient too (the backend's JVP)
    xr = x.clone().requires_grad_(True)
    v = torch.randn_like(x)
    (sa.f_softargmax(xr, toy) * v).sum().backward()
    xe = x.clone().requires_grad_(True)
    (sa.entmax15(xe) * v).sum().backward()
    torch.testing.assert_close(xr.grad, xe.grad, rtol=0, atol=1e-10)
