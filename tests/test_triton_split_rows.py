"""Long rows split over several programs (the ``split_*`` and ``jvp_split_*`` kernels of
softargmax.backends.triton.row_kernels) against the one-program streamed kernel and the PyTorch reference.

Without a GPU the kernels run in Triton's interpreter on CPU tensors, where every program instance
costs Python time: the rows here are tiny (100 entries in chunks of 16, streamed because the
register rows are made to end at 32 entries) and few, and ``rows.SPLIT_SLICES`` forces the split
(3 slices of 48, 48 and 4 entries; the rule that chooses it on a GPU is checked on its own).  On a
GPU the same tests run on CUDA tensors.
"""

import math

import pytest
import torch
from test_triton_rows import _Launches, reference_path

import softargmax as sa
from softargmax.backends.triton import rows as _triton_rows
from softargmax.divergences import get_divergence
from softargmax.solvers.threshold import solve

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",  # numpy, in the interpreter
                                        "ignore:divide by zero:RuntimeWarning")

K = 100
SLICES = 3


@pytest.fixture
def split(monkeypatch, triton_device):
    """Streamed rows of :data:`K` entries split into :data:`SLICES` slices; returns the device."""
    monkeypatch.setattr(_triton_rows, "BLOCK_ROWS_MAX", 32)
    monkeypatch.setattr(_triton_rows, "LONG_BLOCK", 16)
    monkeypatch.setattr(_triton_rows, "SPLIT_SLICES", SLICES)
    assert _triton_rows._slices(2, K, torch.device(triton_device), 16) == (SLICES, 48)
    return triton_device


def _one_program(fn, monkeypatch):
    """``fn()`` with the split off (one program per streamed row)."""
    with monkeypatch.context() as m:
        m.setattr(_triton_rows, "SPLIT_SLICES", 1)
        return fn()


def _rows(device, dtype=torch.float32, offset=1000.0):
    """Three rows whose features sit in different slices: masked entries and ties at the maximum
    across slices 0 and 1; a large ``offset`` with the maximum in the short last slice; a peaked row."""
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(3, K, generator=gen) * 2
    z[0, 40:60] = -math.inf
    z[0, [3, 30, 70]] = z[0].max() + 1.0  # ties at the maximum in slices 0 and 1
    z[1] += offset
    z[1, 98] = z[1].max() + 0.5
    z[2] *= 6.0
    return z.to(device, dtype)


def test_slice_plan_follows_the_rule(monkeypatch):
    """Split only below ``SPLIT_ROWS_PER_SM`` rows per multiprocessor, into about ``SPLIT_PROGRAMS_PER_SM``
    programs per multiprocessor, slices no shorter than ``SPLIT_MIN_SLICE`` and a multiple of the chunk,
    covering the row; ``SPLIT_SLICES`` overrides the rule."""
    plan = _triton_rows.slice_plan
    assert plan(256, 262144, 132, 1024) == (3, 88064)  # the benchmark's 256 x 262,144 on an H100
    assert plan(264, 262144, 132, 1024) == (1, 262144)  # two rows per multiprocessor: one program each
    assert plan(8, 131072, 132, 1024) == (8, 16384)  # decoding's few rows: slices of SPLIT_MIN_SLICE
    assert plan(8, 20000, 132, 1024) == (1, 20000)  # too short for two slices of SPLIT_MIN_SLICE
    for R, k in [(1, 40000), (3, 262144), (100, 100003), (7, 16385)]:
        ns, length = plan(R, k, 132, 1024)
        assert (ns, length) == (1, k) or (length % 1024 == 0 and length >= _triton_rows.SPLIT_MIN_SLICE
                                          and (ns - 1) * length < k <= ns * length)
    monkeypatch.setattr(_triton_rows, "SPLIT_SLICES", 4)
    assert plan(10**6, 100, 132, 16) == (4, 32)  # forced, whatever the rows
    monkeypatch.setattr(_triton_rows, "SPLIT_SLICES", None)
    monkeypatch.setattr(_triton_rows, "SPLIT_MIN_SLICE", 8192)
    assert plan(8, 131072, 132, 1024) == (16, 8192)
    for args, name in [((0, 100, 132, 16), "R"), ((4, 100, 0, 16), "multiprocessors"), ((4, 100, 132, 0), "block"),
                       ((4, 0, 132, 16), "k")]:
        with pytest.raises(ValueError, match=f"^{name} must be a positive int"):
            plan(*args)
    assert _triton_rows.forward_slices(4, 300, torch.device("cpu")) == 0  # short rows: held in registers


def test_forward_slices_follow_the_operator_kind():
    """``rows.forward_slices`` takes ``(kind, exact)`` and decides the register limit where ``rows._run`` does: at
    12,000 columns α = 1.3 (``EXACT_FAR``), sparsemax and Jensen–Shannon stay in registers, α = 1.05 (``EXACT = 0``)
    and Jeffrey are streamed.  ``benchmarks/run_gpu.py`` asks ``rows.operator_kind`` of each operator's divergence
    (no list of operator names), and each divergence it names is the one its operator solves (the same ``p``)."""
    import importlib.util
    import os

    cpu = torch.device("cpu")
    for name, params, expect in [("alpha", {"alpha": 1.3}, 0), ("chi_square", {}, 0), ("jensen_shannon", {}, 0),
                                 ("alpha", {"alpha": 1.05}, 1), ("jeffrey", {}, 1)]:
        kind = _triton_rows.operator_kind(get_divergence(name, **params))
        assert _triton_rows.forward_slices(4, 12000, cpu, *kind) == expect, name
    assert _triton_rows.operator_kind(get_divergence("kl")) is None
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "run_gpu.py")
    spec = importlib.util.spec_from_file_location("run_gpu_for_test", path)
    run_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_gpu)
    assert set(run_gpu.OPERATOR_DIVERGENCES) == set(run_gpu.OPERATORS) - {"alpha_relu"}
    assert run_gpu.row_slices((4, 12000), cpu, "entmax_a1.3") == 0
    assert run_gpu.row_slices((4, 12000), cpu, "f_jeffrey") == run_gpu.row_slices((4, 20000), cpu, "sparsemax") == 1
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    with reference_path():
        for op, (name, params) in run_gpu.OPERATOR_DIVERGENCES.items():
            torch.testing.assert_close(run_gpu.OPERATORS[op](x), solve(x, get_divergence(name, **params)).dense_p(),
                                       atol=1e-9, rtol=1e-7, msg=op)


#: sparsemax, α near 1 (the kernels' ``t + 1`` variable), the dense kinds (full-row steps in the row's
#: program, ``Σ s`` added up from the slices; reverse KL, Jeffrey and reverse χ² also read the row once for
#: Jensen's start); 1.5-entmax and α = 1.3 are in the gradient and loss tests
CASES = [("chi_square", {}), ("alpha", {"alpha": 1.05}), ("jensen_shannon", {}), ("squared_hellinger", {}),
         ("reverse_kl", {}), ("jeffrey", {}), ("reverse_chi_square", {})]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] + "".join(f"-{v}" for v in c[1].values()))
def test_split_matches_one_program_and_reference(case, split, monkeypatch):
    """``p``, ``τ`` and ``Σ s`` of the split rows: the one-program kernel's (the same candidates and
    iterations: equal up to the order of a few sums) and the PyTorch solver's in float64."""
    div = get_divergence(case[0], **case[1])
    z = _rows(split)
    fast = solve(z, div)
    assert fast.backend == "triton"
    one = _one_program(lambda: solve(z, div), monkeypatch)
    with reference_path():
        ref = solve(z.double(), div)
    torch.testing.assert_close(fast.p, one.p, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(fast.tau, one.tau, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fast.s_sum, one.s_sum, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast.dense_p().double(), ref.dense_p(), atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.tau.double(), ref.tau, atol=1e-5, rtol=1e-6)
    assert not fast.bad_rows.any()


@pytest.mark.parametrize("case", [("chi_square", {}), ("jensen_shannon", {}), ("jeffrey", {})],
                         ids=["sparsemax", "js", "jeffrey"])
def test_split_edge_rows(case, split):
    """All-masked, NaN and ``+inf`` rows, one finite entry (in the short last slice), a flat row:
    what the one-program kernel gives (zeros, NaN rows flagged bad, a one-hot, the uniform row)."""
    div = get_divergence(case[0], **case[1])
    z = torch.full((5, K), -math.inf)
    z[1] = 0.5
    z[1, 60] = math.nan
    z[2] = 0.0
    z[2, 10] = math.inf
    z[3, 97] = 3.0
    z[4] = 1.25
    sol = solve(z.to(split), div)
    assert sol.backend == "triton"
    p = sol.dense_p().cpu()
    assert sol.bad_rows.squeeze(1).tolist() == [False, True, True, False, False]
    assert torch.all(p[0] == 0) and float(sol.s_sum[0, 0]) == 0
    assert torch.isnan(p[1]).all() and torch.isnan(p[2]).all() and torch.isnan(sol.tau[[1, 2]]).all()
    onehot = torch.zeros(K)
    onehot[97] = 1.0
    torch.testing.assert_close(p[3], onehot, atol=1e-7, rtol=0)
    torch.testing.assert_close(p[4], torch.full((K,), 1.0 / K), atol=1e-7, rtol=1e-5)


OPERATORS = [
    ("entmax15", lambda x: sa.entmax15(x)),
    ("entmax-1.3", lambda x: sa.entmax(x, 1.3)),
    ("hellinger", lambda x: sa.f_softargmax(x, "squared_hellinger")),
]


def _value_and_grad(fn, x, v):
    xx = x.clone().requires_grad_()
    p = fn(xx)
    (p * v).sum().backward()
    return p.detach(), xx.grad


@pytest.mark.parametrize("name,fn", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_split_values_and_gradients(name, fn, split):
    """Forward and backward (the backward split too: per-slice ``Σ s`` and ``⟨s, v⟩``, then ``g``) against
    the PyTorch path; masked entries get a zero gradient."""
    x = _rows(split)[:2]
    v = torch.randn(2, K, generator=torch.Generator().manual_seed(9)).to(split)
    p, g = _value_and_grad(fn, x, v)
    with reference_path():
        p_ref, g_ref = _value_and_grad(fn, x, v)
    torch.testing.assert_close(p, p_ref, atol=3e-6, rtol=1e-4)
    torch.testing.assert_close(g, g_ref, atol=3e-5, rtol=1e-4)
    assert torch.all(g[0, 40:60][x[0, 40:60] == -math.inf] == 0)


@pytest.mark.parametrize("dtype,loss_fn", [
    (torch.float32, sa.entmax15_loss),
    (torch.bfloat16, lambda a, b, **kw: sa.f_divergence_loss(a, b, "jensen_shannon", **kw)),
], ids=["entmax15-float32", "js-bfloat16"])
def test_split_loss_writes_gradient_and_row_sums(dtype, loss_fn, split, monkeypatch):
    """1.5-entmax's and Jensen–Shannon's losses with class indices (the write pass puts ``G = p - y`` where
    ``p`` would go; the loss values come from the slices' partial row sums, added up by ``split_finish``),
    kept and ignored rows: the one-program kernels' values and gradients, and the PyTorch path's."""
    x = _rows(split, dtype, offset=0.0)  # (loss values: differences of row sums, rounded to the scores' size)
    idx = torch.tensor([3, 98, -100]).to(split)  # a tie at the maximum, the short slice, an ignored row

    def run(loss_fn):
        xx = x.clone().requires_grad_()
        loss = loss_fn(xx, idx, reduction="none", ignore_index=-100)
        (loss.float() * torch.tensor([1.0, 2.0, 3.0], device=x.device)).sum().backward()
        return loss.detach().float(), xx.grad.float()

    fast = run(loss_fn)
    one = _one_program(lambda: run(loss_fn), monkeypatch)
    with reference_path():
        ref = run(loss_fn)
    torch.testing.assert_close(fast[0], one[0], atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(fast[1], one[1], atol=1e-6, rtol=1e-5)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(fast[0], ref[0], **tol)
    torch.testing.assert_close(fast[1], ref[1], **tol)
    assert fast[0][2] == 0 and torch.all(fast[1][2] == 0)


def test_split_per_row_alpha(split):
    """One α per row (read by the kernels from a tensor), values and gradients of α and of the scores,
    against the PyTorch path."""
    x = _rows(split)[:2]
    alpha = torch.tensor([[1.2], [1.9]]).to(split)
    v = torch.randn(2, K, generator=torch.Generator().manual_seed(3)).to(split)

    def run():
        xx, aa = x.clone().requires_grad_(), alpha.clone().requires_grad_()
        p = sa.entmax(xx, aa)
        (p * v).sum().backward()
        return p.detach(), xx.grad, aa.grad

    fast = run()
    with reference_path():
        ref = run()
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-3)


def test_split_overflowing_lanes(split, monkeypatch):
    """One slot per lane and slice: the lanes' kept scores miss part of the support, and the row's
    program iterates over the full row from their root (exact, as the one-program kernel)."""
    monkeypatch.setattr(_triton_rows, "LONG_SLOTS", 1)
    z = _rows(split)
    z[2] /= 20.0  # a flat row: most entries in the support, several per lane
    div = get_divergence("alpha", alpha=1.5)
    fast = solve(z, div)
    with reference_path():
        ref = solve(z.double(), div)
    torch.testing.assert_close(fast.dense_p().double(), ref.dense_p(), atol=1e-6, rtol=0)


def test_split_launches_and_no_host_sync(split, monkeypatch):
    """A split forward is 3 launches (4 where a dense kind's ``Σ s`` or the loss row sums are added up: here;
    the power kind's count is in test_bytes_moved), its backward 2, with no other device work and no host
    synchronization."""
    z = _rows(split)[:2]
    v = torch.randn(2, K, device=z.device)
    count = _Launches(monkeypatch)
    with count.mode:
        sol = _triton_rows.solve(z, get_divergence("squared_hellinger"), row_sums=False)
        sol.jvp(v)
    assert count.launches == ["split_scan", "split_solve", "split_write", "split_finish", "jvp_split_sums",
                              "jvp_split_write"], count.launches
    assert count.device_work() == [], count.device_work()
