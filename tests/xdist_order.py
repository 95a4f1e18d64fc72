"""The order in which pytest-xdist hands out the suite: the heaviest test files first, split between the workers.

pytest-xdist's default (``--dist load``, version 3) sends each worker a first batch of consecutive tests, a quarter
of its share (``len(items) // workers // 4``), then refills the worker that runs low from the front of what is
left.  In collection (alphabetical) order the heaviest files came last: the run ended with one worker busy on them
and the other idle.  Here the files of :data:`HEAVY` are spread over the workers by their cost (the longest first,
each to the least loaded worker) and each worker's files open its first batch; the other tests keep their order.
A file stays in one piece, so its module-scoped fixtures (one ONNX export, one smoke run) are built once.

Only the order changes: the same tests run, with the same fixtures.  Without xdist (or with one worker) the order
is pytest's.  The costs only need to rank the files and balance the workers roughly: the tests left out of
:data:`HEAVY` (about a quarter of the time) are handed out as the workers free up and even out the rest.
"""

from __future__ import annotations

import os
from typing import Any

#: seconds per test file (calls, setup and teardown of its tests of at least 0.5 s), from one run of the suite with
#: ``-n 2 --durations`` on the shared two-core machine at a load of 2 to 17 (2026-12-02): every file above 45 s.
#: test_translation's smoke test (548 s there, with the two threads an earlier test had left; 21 s with one) and
#: test_lm's whole rerun (66 s, removed since) are taken out
HEAVY: dict[str, float] = {
    "test_translation.py": 190, "test_jax_operators.py": 621, "test_lm.py": 468, "test_run_faults.py": 436,
    "test_jax_loss_options.py": 367, "test_jax_docs.py": 270, "test_jax_losses.py": 262, "test_gpu_all.py": 240,
    "test_docs.py": 204, "test_jax_row_params.py": 139, "test_jax_normmax.py": 129, "test_export.py": 127,
    "test_triton_rows.py": 125, "test_flash_attention.py": 112, "test_gpu_benchmark.py": 108,
    "test_jax_teacher.py": 104, "test_huggingface_lm.py": 100, "test_translation_ddp.py": 98,
    "test_compile_report.py": 77, "test_flash_attention_window.py": 65, "test_tune_gpu.py": 57,
    "test_flash_attention_start.py": 54, "test_attention_experiments.py": 52, "test_flash_attention_varlen.py": 48,
}


def plan(names: list[str], workers: int, costs: dict[str, float]) -> list[int]:
    """The new order of the items, as indices into ``names`` (each item's file name).

    The files of ``costs`` are assigned to ``workers`` bins (longest first, each to the least loaded bin that still
    has room for its tests); bin ``j`` opens the ``j``-th first batch that xdist sends (``len(names) // workers // 4``
    items each), the other items fill the batches in their order and follow them."""
    members: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        members.setdefault(n, []).append(i)
    batch = max(len(names) // workers // 4, 2)
    bins: list[list[str]] = [[] for _ in range(workers)]
    load, size = [0.0] * workers, [0] * workers
    for name in sorted((n for n in members if n in costs), key=lambda n: (-costs[n], n)):
        fit = [b for b in range(workers) if size[b] + len(members[name]) <= batch]
        if fit:  # (a file that fits in no first batch keeps its place among the others)
            j = min(fit, key=lambda b: (load[b], b))
            bins[j].append(name)
            load[j] += costs[name]
            size[j] += len(members[name])
    placed = {name for b in bins for name in b}
    light = [i for i, n in enumerate(names) if n not in placed]
    order: list[int] = []
    for j in range(workers):
        own = [i for name in bins[j] for i in members[name]]
        fill = max(0, batch - len(own))
        order += own + light[:fill]
        light = light[fill:]
    return order + light


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or not any(item.path.name in HEAVY for item in items):
        return
    order = plan([item.path.name for item in items], workers, HEAVY)
    items[:] = [items[i] for i in order]
