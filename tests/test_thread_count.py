"""Torch's thread count across calls and tests: ``softargmax bench`` run in-process (the CLI, a notebook) puts the
caller's count back (``bench.timing.restores_threads``), and each test starts with the suite's count (conftest's
``_keep_torch_threads``) whatever the tests before it set."""

import torch
from conftest import TORCH_THREADS

from softargmax.cli import main


def test_an_in_process_bench_leaves_the_callers_thread_count(tmp_path):
    assert torch.get_num_threads() == TORCH_THREADS
    assert main(["bench", "--quick", "--shapes", "4x30", "--ops", "sparsemax", "--threads", str(TORCH_THREADS + 1),
                 "--repeats", "1", "--json", str(tmp_path / "b.json")]) == 0
    assert torch.get_num_threads() == TORCH_THREADS
    torch.set_num_threads(TORCH_THREADS + 1)  # for the next test: the fixture must put it back


def test_the_next_test_has_the_suites_count_again():
    assert torch.get_num_threads() == TORCH_THREADS
