"""Host cost per call (benchmarks/host_cost.py): kernel launches and host synchronizations, against budgets.

On the CPU the Triton kernels run in Triton's interpreter through the GPU launchers; the counter
records each launch and each operation that would synchronize a CUDA device (``item()``/``bool()`` of
a tensor, data-dependent sizes, ``tolist()``, ``cpu()``).  The budgets are today's counts (2026-11-27):
a change that adds a launch or a synchronization fails here.  Lower them as the paths improve; every
synchronization count is 0 now, except the vocabulary-parallel losses' (their first round's table and
the split solver's tests).  On a GPU the same budgets are checked with
``torch.cuda.set_sync_debug_mode``.
"""

import sys
from pathlib import Path

import pytest
import torch
from conftest import needs_cuda

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import _counting  # noqa: E402
import host_cost as HC  # noqa: E402

N, H, V, CHUNK = HC.FUSED
CHUNKS = -(-N // CHUNK)

#: (launches, synchronizations) per call today.  Operators: one kernel, no synchronization.
#: Losses (forward + backward) with class indices: the solver's kernel, which writes the gradient
#: ``G = p - y`` in the input's dtype where ``p`` would go (α-ReLU's loss: its gradient kernel), and the
#: backward's kernel that scales ``G`` per row in place (``scale_rows``, which replaced PyTorch's
#: mixed-dtype ``G.mul_``, a GPU kernel too but not counted here); no synchronization: the range check of
#: the class indices runs on the device and its flag is read at a later call, once its asynchronous copy
#: to pinned memory has landed (softargmax.losses.index_check; until 2026-12-02 it was ``bool(bad.any())``,
#: one synchronization per call).  The fused linear loss: per chunk the solver and the gradient kernel (the
#: softmax gradient kernel alone on the KL path), and no synchronization either.  Before the losses wrote G
#: in the input dtype (2026-11-27, morning) the losses made 2 synchronizations and the fused loss 2 per call
#: plus 1 or 2 per chunk.
BUDGETS = {f"{op}.{p}": (1, 0) for op in ("sparsemax", "entmax15", "entmax_a1.3", "jensen_shannon",
                                           "squared_hellinger", "alpha_relu") for p in ("forward", "backward")}
BUDGETS.update({"sparsemax_loss": (2, 0), "entmax15_loss": (2, 0), "entmax_loss_a1.3": (2, 0),
                "jensen_shannon_loss": (2, 0), "alpha_relu_loss": (2, 0),
                "linear_loss_kl": (CHUNKS, 0), "linear_loss_entmax15": (2 * CHUNKS, 0)})
#: The vocabulary-parallel loss and fused loss over a group of one process (2026-12-02): the first round's table
#: read on the host (1; it also carries the range of the class indices and the sign of the class weights, which
#: cost 1 synchronization each before), then per solve (one per chunk for the fused loss) the split Newton
#: solver's stop test and its finite-maxima test (solvers/newton.py) and the sparse row terms' support count
#: (losses/_row_losses.py; with its nonzero in the unfused loss).  Before: 6 and 9 (the range check, and the
#: fused loss's mean denominator read as a float).
DISTRIBUTED_SITES = {"vocab_parallel_loss_entmax15": 1, "linear_vocab_parallel_loss_entmax15": CHUNKS}
#: On a GPU (NCCL, a group of one) the same budgets hold if the first round's buffer reaches the device without a
#: blocking copy (it is copied from pinned memory, non_blocking): not run on a GPU yet.
#: Launches: each rank's own root of its slice (the solver's kernel, the start of the split Newton solve), per
#: solve, and the unfused loss's backward scaling of G.
BUDGETS.update({"vocab_parallel_loss_entmax15": (2, 5),
                "linear_vocab_parallel_loss_entmax15": (CHUNKS, 1 + 3 * CHUNKS)})


def test_every_case_has_a_budget():
    assert set(BUDGETS) == set(HC.cases())
    assert CHUNKS >= 2  # the fused loss is counted over several chunks


def test_the_counter_sees_launches_and_synchronizations():
    """The counter itself: ``bool``, ``item``, ``tolist``, boolean indexing and ``nonzero`` of a device
    tensor (the input, and what is computed from it) count, views do not, and neither do the values of
    tensors made on the host inside the block."""
    x = torch.randn(5, 4)
    with _counting.counting() as c:
        bool((x > 0).any())
        x.sum().item()
        x[0].tolist()
        x[x > 0]
        torch.nonzero(x)
        x.t().reshape(-1)[:3]
        c0 = torch.zeros((), dtype=torch.float64)
        float(c0 + 1.0)  # a host scalar: no synchronization
        torch.zeros(3).tolist()
        y = torch.empty(4)
        y.copy_(x[0])  # written from the device: a device tensor now
        float(y[0])
    assert c.sync_count == 6 and c.launches == {}, dict(c.syncs)
    assert sum(c.host_reads.values()) == 2, dict(c.host_reads)
    assert c.torch_bytes["sum"] == 5 * 4 * 4 + 4


@pytest.fixture(scope="module")
def interpreter():
    from softargmax.backends.triton import rows

    old = rows._cpu_interpret
    if torch.cuda.is_available() or not _counting.interpreter_ready():
        pytest.skip("counts the interpreter's launches on the CPU (TRITON_INTERPRET=1, no CUDA)")
    yield
    rows.set_cpu_interpret(old)


@pytest.mark.parametrize("name", list(BUDGETS))
def test_launches_and_syncs_within_budget(name, interpreter):
    r = HC.count(name)
    launches, syncs = BUDGETS[name]
    print(f"{name}: {r['launches']} launches {r['kernels']}, {r['syncs']} synchronizations {r['sync_sites']}, "
          f"{r['torch_ops']} ATen calls")
    assert r["launches"] <= launches, r["kernels"]
    assert r["syncs"] <= syncs, r["sync_sites"]
    if HC.cases()[name][0] in ("forward", "backward") or name.startswith("linear_loss"):
        assert r["launches"] >= 1  # the kernel path was taken (else the count says nothing)
    if HC.cases()[name][0] in ("loss", "fused"):  # the class indices were checked on the device, the flag read
        assert any("losses/index_check.py" in site for site in r["host_reads"]), r["host_reads"]


@pytest.mark.parametrize("name", list(DISTRIBUTED_SITES))
def test_vocab_parallel_reads_its_checks_with_the_first_round(name, interpreter):
    """The vocabulary-parallel losses read no value on the host for their own checks beyond the first
    round's table (one ``tolist``): the range of the class indices comes with it (``bool(bad.any())`` in
    distributed/targets.py before), and so does the mean's denominator of the fused loss (a float before);
    what is left is the solver's and the row terms' (per solve)."""
    r = HC.count(name)
    sites = r["sync_sites"]
    mine = {s: n for s, n in sites.items() if "losses/distributed/" in s or "losses/_targets.py" in s}
    assert mine == {next(s for s in sites if s.startswith("tolist @ losses/distributed/agreement.py")): 1}, sites
    solver = sum(n for s, n in sites.items() if "solvers/newton.py" in s)
    assert solver == 2 * DISTRIBUTED_SITES[name], sites


@needs_cuda
@pytest.mark.parametrize("name", list(BUDGETS))
def test_gpu_syncs_within_budget(name):
    """The same budgets on a GPU, counted by ``torch.cuda.set_sync_debug_mode("warn")``."""
    sites = HC.cuda_sync_sites(name)
    print(f"{name}: {len(sites)} synchronizations on CUDA")
    assert len(sites) <= BUDGETS[name][1], sites
