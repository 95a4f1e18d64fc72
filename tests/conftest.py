"""Independent references shared by the tests.

* sort-based exact sparsemax and 1.5-entmax (Martins & Astudillo 2016; Peters et al. 2019),
  written here in NumPy, independent of the library's solver;
* a brute-force constrained optimizer (SciPy SLSQP) for the f-softargmax / f-softmax
  variational problem  max_{p in simplex} <p, x> - beta * sum_j q_j f(p_j / q_j),
  which only uses the primal generator f and f' (never the conjugates the solver uses).

The ``smoke_run`` fixture runs an experiment's ``smoke`` preset once per session, for its smoke
test and for the test that reruns it with the same seed and expects identical numbers.
"""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

# two threads in one process; under pytest-xdist (the README runs `-n 2`) the cores are shared
# among the workers: OpenMP threads beyond the cores spin against each other
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 2) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))
#: the thread count the tests start with (each gets back the count it started with: ``_keep_torch_threads``)
TORCH_THREADS = torch.get_num_threads()

# Property-based tests (tests/test_properties.py): a fixed, derandomized example budget in CI;
# HYPOTHESIS_PROFILE=thorough runs many more examples locally.
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("thorough", max_examples=1500, deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a test dependency; without it the property tests are skipped
    pass
# JAX (the tests of softargmax_jax, tests/test_jax_*.py): XLA's CPU backend without its expensive LLVM
# passes compiles the many small test functions in about 40% less time (the same IEEE arithmetic)
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

#: the heaviest test files first, split between the pytest-xdist workers (tests/xdist_order.py)
pytest_plugins = ["xdist_order"]

if not torch.cuda.is_available():
    # the Triton kernels run in Triton's interpreter on CPU tensors (must be set before
    # Triton is imported; softargmax imports it only when a kernel is first needed)
    os.environ.setdefault("TRITON_INTERPRET", "1")

ALL_DIVERGENCES = [
    ("kl", {}),
    ("reverse_kl", {}),
    ("jeffrey", {}),
    ("jensen_shannon", {}),
    ("squared_hellinger", {}),
    ("chi_square", {}),
    ("reverse_chi_square", {}),
    ("alpha", {"alpha": 1.5}),
    ("alpha", {"alpha": 1.25}),
    ("alpha", {"alpha": 2.5}),
    ("alpha", {"alpha": 0.5}),
]

#: the dense kinds with f(0) = +inf (reverse KL, Jeffrey, reverse chi-square), which both row solvers have
INFINITE_F0_COVERED = [
    ("reverse_kl", {}),
    ("jeffrey", {}),
    ("reverse_chi_square", {}),
]

#: the divergences the fused row solvers cover (softargmax.backends.kinds), with q = 1, that test_triton_rows runs
#: at every length and layout (the kinds with f(0) = +inf keep one score per lane: the streamed layout with
#: overflowing lanes is the streamed one for them, and test_triton_rows skips it)
FUSED_COVERED = [
    ("chi_square", {}),
    ("alpha", {"alpha": 2.0}),
    ("alpha", {"alpha": 1.5}),
    ("alpha", {"alpha": 1.3}),
    ("alpha", {"alpha": 1.7}),
    ("alpha", {"alpha": 1.05}),
    ("jensen_shannon", {}),
    ("squared_hellinger", {}),
] + INFINITE_F0_COVERED

#: the operators of the C row solver (and of the Triton one): every kind
CPU_FUSED_COVERED = FUSED_COVERED


def div_id(d):
    name, params = d
    return name + "".join(f"-{k}{v}" for k, v in params.items())


def sparsemax_sort(x: np.ndarray) -> np.ndarray:
    """Exact sparsemax of the last axis by sorting (Martins & Astudillo, 2016, Algorithm 1)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        z = x[idx]
        zs = np.sort(z)[::-1]
        cs = np.cumsum(zs)
        ks = np.arange(1, len(z) + 1)
        support = 1 + ks * zs > cs
        kz = ks[support][-1]
        tau = (cs[kz - 1] - 1) / kz
        out[idx] = np.maximum(z - tau, 0)
    return out


def entmax15_sort(x: np.ndarray) -> np.ndarray:
    """Exact 1.5-entmax of the last axis by sorting (Peters et al. 2019, Algorithm 2)."""
    x = np.asarray(x, dtype=np.float64) / 2
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        z = x[idx] - x[idx].max()
        zs = np.sort(z)[::-1]
        ks = np.arange(1, len(z) + 1)
        mean = np.cumsum(zs) / ks
        mean_sq = np.cumsum(zs**2) / ks
        ss = ks * (mean_sq - mean**2)
        delta = np.clip((1 - ss) / ks, 0, None)
        tau = mean - np.sqrt(delta)
        kz = (tau <= zs).sum()
        out[idx] = np.maximum(z - tau[kz - 1], 0) ** 2
    return out


def entmax_ref64(x: torch.Tensor, alpha: float, iters: int = 200) -> torch.Tensor:
    """α-entmax of the last axis by float64 bisection, any α (α < 1 included), in the
    f-divergence form ``p = exp(log1p(a (x - τ)) / a)``, ``a = α - 1`` (``exp(x - τ)`` at a = 0)."""
    x = x.double()
    a = alpha - 1.0
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all-masked rows give zeros
    x = x - m  # the answer is shift invariant; large scores would round x - τ
    k = x.shape[-1]
    lo = torch.zeros_like(m)  # the maximum alone has g = 1: S >= 1
    hi = lo + (math.log(k) if a == 0 else (1 - k ** (-a)) / a)  # every g <= 1/k: S <= 1

    def g(tau):
        v = x - tau
        if a == 0:
            return torch.exp(v)
        u = torch.clamp(a * v, min=-1.0)
        return torch.exp(torch.log1p(u) / a)

    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        big = g(mid).sum(-1, keepdim=True) >= 1
        lo = torch.where(big, mid, lo)
        hi = torch.where(big, hi, mid)
    p = g(0.5 * (lo + hi))
    S = p.sum(-1, keepdim=True)
    return torch.where(S > 0, p / torch.where(S > 0, S, torch.ones_like(S)), torch.zeros_like(p))


def edge_rows(k, dtype, gen, device="cpu"):
    """Random rows plus masked entries, an all-masked row, a NaN row, a +inf row, ties."""
    z = torch.randn(9, k, dtype=dtype, generator=gen) * 3
    z[1, : k // 2] = -math.inf
    z[2] = -math.inf
    z[3, 0] = math.nan
    z[4, -1] = math.inf
    z[5] = 1.25  # constant row: uniform answer
    z[6, : max(1, k // 3)] = z[6].max() + 2  # tied maxima
    z[7] *= 1e4  # extreme scale: one winner
    z[8] *= 1e-4  # tiny scale: dense for every mapping
    return z.to(device)


def brute_force_fsoftargmax(div, x: np.ndarray, q: np.ndarray, beta: float):
    """(p, value) maximizing <p, x> - beta * sum q f(p/q) over the simplex, by SLSQP."""
    from scipy.optimize import minimize

    x = np.asarray(x, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    k = len(x)
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)

    def fun(p):
        r = t(p / q)
        val = float((p * x).sum() - beta * (t(q) * div.f(r)).sum())
        grad = x - beta * div.f_prime(r).numpy()
        return -val, -grad

    lo = 0.0 if np.isfinite(div.f_prime_zero) else 1e-14
    best = None
    starts = [np.full(k, 1.0 / k)]
    e = np.full(k, 0.05 / k)
    e[np.argmax(x)] += 0.95
    starts.append(e / e.sum())
    for p0 in starts:
        res = minimize(
            fun, p0, jac=True, method="SLSQP", bounds=[(lo, 1.0)] * k,
            constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1, "jac": lambda p: np.ones_like(p)}],
            options={"ftol": 1e-15, "maxiter": 2000},
        )
        if best is None or res.fun < best.fun:
            best = res
    return best.x, -best.fun


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _seed_every_test():
    """Tests draw random inputs; a fixed seed per test keeps every run identical."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A test that changes torch's thread count gives it back: an in-process ``softargmax bench`` sets 2 threads and
    keeps them, and every later test of that pytest-xdist worker ran with 2 threads; with two workers on the two cores
    of CI, OpenMP's threads spun against each other (the translation smoke test took 8x its time)."""
    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@pytest.fixture(params=["fused", "torch"])
def solver_path(request):
    """Run a test on both CPU solvers: the fused C row solver (:mod:`softargmax.backends.cpu.rows`,
    the default where it covers the operator) and the PyTorch reference path."""
    from softargmax.backends.cpu import rows as _cpu_rows

    if request.param == "fused" and not _cpu_rows.available():
        pytest.skip("the fused CPU row solver could not be built here")
    old = _cpu_rows.set_enabled(request.param == "fused")
    yield request.param
    _cpu_rows.set_enabled(old)


@pytest.fixture
def torch_solver():
    """The PyTorch solver only (for tests of its pruning and tracing)."""
    from softargmax.backends.cpu import rows as _cpu_rows

    old = _cpu_rows.set_enabled(False)
    yield
    _cpu_rows.set_enabled(old)


def needs_cuda(test):
    """Decorator for a test that runs only on CUDA: marked ``gpu`` (what ``pytest -m gpu`` selects on
    a GPU machine, benchmarks/gpu_all.sh) and skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


@pytest.fixture
def gpu_when_present():
    """Requested by every fixture that puts its tests on CUDA when CUDA is present (``triton_device``,
    test_flash_attention's ``device``): the tests that use such a fixture are marked ``gpu``
    (``pytest_collection_modifyitems`` below).  Returns whether CUDA is present."""
    return torch.cuda.is_available()


@pytest.fixture
def triton_device(gpu_when_present):
    """Where the Triton kernels run: ``"cuda"`` on a GPU, else ``"cpu"`` under Triton's
    interpreter (CPU tensors are routed to the kernels); skips without Triton."""
    from softargmax.backends.triton import rows as _triton_rows

    if not _triton_rows.available():
        pytest.skip("Triton is not installed")
    if gpu_when_present:
        yield "cuda"
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    old = _triton_rows.set_cpu_interpret(True)
    yield "cpu"
    _triton_rows.set_cpu_interpret(old)


#: test files whose kernels run in Triton's interpreter without a GPU (most of the suite's time):
#: marked ``slow`` there, so ``pytest -m "not slow"`` gives a quick local run; CI runs everything
INTERPRETED_FILES = ("test_triton_rows.py", "test_triton_split_rows.py", "test_flash_attention.py",
                     "test_triton_decoding.py", "test_triton_tile_gemms.py", "test_flash_attention_window.py")


#: the folder holding the experiments' datasets (multi30k, snli, ...): pytest's ``--data-dir``, else
#: ``$SOFTARGMAX_DATA``, else ``../shared/data`` next to the checkout (set in ``pytest_configure``, before the
#: test modules are imported); tests whose data are not there are skipped with a reason that starts with
#: ``DATA_SKIP`` and counted in one line at the end of the run
DATA = Path(os.environ.get("SOFTARGMAX_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
DATA_SKIP = "data not present"


def pytest_addoption(parser):
    parser.addoption("--data-dir", default=None, metavar="DIR",
                     help="folder holding the experiments' datasets (multi30k, snli, ...) for the tests that use them "
                     "(default: $SOFTARGMAX_DATA, else ../shared/data); without them those tests are skipped")


def pytest_configure(config):
    global DATA  # noqa: PLW0603 -- the test modules import it after this hook
    given = config.getoption("--data-dir", default=None)
    if given:
        DATA = Path(given).expanduser().resolve()


def pytest_terminal_summary(terminalreporter):
    """One line: how many tests were skipped for want of their data, and how to run them."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if DATA_SKIP in str(getattr(r, "longrepr", ""))]
    if skipped:
        terminalreporter.write_line(
            f"{len(skipped)} test{'s' * (len(skipped) > 1)} skipped: {DATA_SKIP} in {DATA} (run them with "
            "pytest --data-dir DIR or SOFTARGMAX_DATA=DIR, a folder holding multi30k, snli, tinyshakespeare, "
            "fashion-mnist, mulan, ptb)", yellow=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu_when_present" in item.fixturenames:  # the fixture's dependents included
            item.add_marker(pytest.mark.gpu)
    if torch.cuda.is_available():
        return
    for item in items:
        if item.path.name in INTERPRETED_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler (``KeyboardInterrupt``) for the test, and SIGINT's default disposition for the
    processes it starts, whatever the test run was started with: a job started in the background by a script
    (``bash -c 'pytest ... & wait'``, as some CI runners do) inherits SIGINT ignored, and so would the runs it starts
    (a Python handler is reset to the default at exec, an ignored signal stays ignored)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def check_progress_log(out, runs, first_row=None):
    """The log of a finished call, ``out/log.txt``: ``== run i of n: NAME`` before each of its ``runs`` runs, with
    the whole job's ETA from the second on (the first has timed nothing yet), then the line that says what was written
    and the closing summary (a title, then the table's header; ``first_row``, where given, the words that open its
    first row).  Returns the log's lines after the summary's title."""
    lines = (Path(out) / "log.txt").read_text(encoding="utf-8").splitlines()
    heads = [line for line in lines if line.startswith("== run ")]
    assert [h.split(":")[0] for h in heads] == [f"== run {i} of {runs}" for i in range(1, runs + 1)], heads
    assert " ETA " not in heads[0]
    for h in heads[1:]:
        assert ", ETA " in h and " for the whole job (" in h, h
    summary = max(i for i, line in enumerate(lines) if line.startswith("summary ("))
    assert lines[summary - 1].startswith("wrote ") and summary < len(lines) - 2
    if first_row is not None:
        assert lines[summary + 2].split()[: len(first_row)] == list(first_row), lines[summary:]
    return lines[summary + 1:]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """``smoke_run(name, *options, again=False)``: ``(folder, results)`` of ``softargmax reproduce name
    --preset smoke *options``, run once per session (``again=True``: a new run in a new folder)."""
    from softargmax.cli import main

    done = {}

    def run(name, *options, again=False):
        key = (name, options)
        if again or key not in done:
            out = tmp_path_factory.mktemp(name)
            assert main(["reproduce", name, "--preset", "smoke", *options, "--out", str(out)]) == 0
            result = (out, json.loads((out / "results.json").read_text()))
            if again:
                return result
            done[key] = result
        return done[key]

    return run


@pytest.fixture
def rerun_is_identical(smoke_run):
    """``rerun_is_identical(name, *options)``: rerun the smoke preset (same seed, threads, machine) and
    assert that everything but the timings is identical, compared as JSON (so that NaN equals NaN)."""
    from softargmax.experiments._common import measurements

    def check(name, *options):
        _, first = smoke_run(name, *options)
        _, again = smoke_run(name, *options, again=True)
        a, b = (json.dumps(measurements(r), sort_keys=True) for r in (first, again))
        assert a == b, f"{name}: a rerun with the same seed gave different numbers"
        assert '"seed' in a  # the comparison covers the settings, seeds included

    return check


@pytest.fixture(scope="session")
def docs_build(tmp_path_factory):
    """``(html folder, return code, stderr)`` of ``sphinx-build -W`` on ``docs/``, built once per test
    run: the pytest-xdist workers share one build through a lock file in their common temporary
    folder.  The build runs every script of the examples gallery (``examples/``).  It runs in this
    interpreter, or in the one that ``$SOFTARGMAX_DOCS_PYTHON`` names: CI (``.ci/run``) installs a fresh
    environment as the README's documentation command does (PyTorch, then the ``docs`` extra alone), so
    that a module the API reference imports and the extra lacks fails here."""
    import fcntl
    import subprocess
    import sys

    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    html, result = root / "docs-build" / "html", root / "docs-build" / "result.json"
    with open(root / "docs-build.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            python = os.environ.get("SOFTARGMAX_DOCS_PYTHON") or sys.executable
            proc = subprocess.run([python, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                                   os.path.join(repo, "docs"), str(html)], cwd=repo, capture_output=True, text=True,
                                  timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="agg"))
            result.write_text(json.dumps([proc.returncode, proc.stderr[-5000:]]))
    returncode, stderr = json.loads(result.read_text())
    return html, returncode, stderr


@pytest.fixture
def x64():
    """JAX in float64 for the test (``jax.enable_x64``); the JAX test modules skip where JAX is missing."""
    import jax

    with jax.enable_x64(True):
        yield
