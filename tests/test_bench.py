"""The benchmarks' measuring tools (softargmax.bench.timing, .memory) against known answers, and their
targets read from the data file."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import needs_cuda  # noqa: E402

from softargmax import bench
from softargmax.bench import timing


def test_targets_come_from_the_data_file(monkeypatch):
    """Change the file's numbers and the benchmark's targets change with them: none is written in code."""
    data = json.loads(json.dumps(timing.targets()))
    assert bench.target_ratio("sparsemax", bench.LONG[0], "fwd+bwd") == data["operators"]["sparsemax"]["long"]
    data["operators"]["sparsemax"]["long"] = 1.01
    monkeypatch.setattr(timing, "targets", lambda: data)
    from softargmax.bench import operators

    monkeypatch.setattr(operators, "targets", lambda: data)
    assert bench.target_ratio("sparsemax", bench.LONG[0], "fwd+bwd") == 1.01
    assert bench.target_ratio("sparsemax", bench.LONG[0], "fwd") is None
    assert bench.target_ratio("sparsemax", (3, 3), "fwd+bwd") is None


def test_peak_growth_sees_a_known_allocation():
    """A fresh process that allocates and touches 256 MiB inside the measured call reports about that much,
    also when its parent holds more than that (``ru_maxrss`` alone inherits the parent's peak through exec)."""
    parent_holds = torch.ones(160, 2**20)  # 640 MiB resident here, more than the child ever holds
    code = ("import torch; from softargmax.bench.timing import peak_growth_mb; "
            "print(peak_growth_mb(lambda: torch.ones(64, 2**20).sum()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    grown = float(out.stdout.strip().splitlines()[-1])
    assert 230 < grown < 330, grown
    del parent_holds


def test_median_times_are_interleaved_and_ordered():
    """A callable that sleeps 3 ms is timed at about 3 ms, and above one that does nothing."""
    import time

    ms = timing.time_thunks({"sleep": lambda: time.sleep(0.003), "nothing": lambda: None}, repeats=5, warmup=1)
    assert ms["nothing"] < ms["sleep"] and 2.5 < ms["sleep"] < 50


@pytest.mark.parametrize("case", [("attention", "entmax15", 64, 2, 1), ("fused", "fused", 64, 16, 500, 1, 1),
                                  ("fused", "unfused", 64, 16, 500, 1, 0, "softmax", 0, "cpu"),
                                  pytest.param(("fused", "torch", 64, 16, 500, 1, 1, "kl"), marks=pytest.mark.skipif(
                                      not hasattr(torch.nn.functional, "linear_cross_entropy"),
                                      reason="F.linear_cross_entropy: PyTorch >= 2.13"))])
def test_memory_cases_run_in_a_fresh_process(case):
    from softargmax.bench.memory import measure

    result = measure(*case)
    assert result["peak_mb"] >= 0 and torch.isfinite(torch.tensor(result["peak_mb"]))
    if case[0] == "fused":
        assert result["memory"] == "resident set peak"


@needs_cuda
def test_memory_on_cuda_is_the_allocator_peak():
    from softargmax.bench.memory import measure

    result = measure("fused", "fused", 64, 16, 500, 1, 1, "entmax15", 32, "cuda")
    assert result["memory"] == "cuda allocator peak" and result["peak_mb"] > 0


def test_save_is_atomic(tmp_path, monkeypatch):
    """``bench.save`` writes a temporary file and renames it over the JSON: a write that fails (a
    kill, a full disk) leaves the previous complete file and no temporary."""
    import os

    from softargmax.bench import save

    path = tmp_path / "result.json"
    save({"cases": [1]}, path)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)  # the disk fills while the new version is flushed
    with pytest.raises(OSError):
        save({"cases": [1, 2]}, path)
    assert json.loads(path.read_text()) == {"cases": [1]} and [p.name for p in tmp_path.iterdir()] == ["result.json"]


@pytest.mark.skipif(not hasattr(torch.nn.functional, "linear_cross_entropy"),
                    reason="F.linear_cross_entropy: PyTorch >= 2.13")
def test_torch_fused_case_compares_with_pytorchs_chunked_loss():
    from softargmax.bench.losses import torch_fused_case

    lines = []
    case = torch_fused_case((32, 8, 200), threads=1, repeats=1, log=lines.append)
    assert case["baseline"].startswith("F.linear_cross_entropy (chunked")
    assert case["ms"] > 0 and case["baseline_ms"] > 0 and case["torch_reference_ms"] > 0
    assert case["ratio"] > 0 and case["memory_ratio"] > 0
    assert lines and "F.linear_cross_entropy chunked" in lines[0]
