"""The GPU benchmark script's plumbing, run on the CPU at smoke sizes (the GPU numbers need a GPU)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_benchmark_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run_gpu.py"), "--device", "cpu",
                           "--smoke", "--no-package", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["copy_gbps"] > 0 and result["device"]
    ops = {(c["op"], c["dtype"], tuple(c["shape"])) for c in result["cases"]}
    assert ("entmax_a1.3", "bfloat16", (8, 300)) in ops and ("alpha_relu", "float32", (64, 32)) in ops
    for c in result["cases"]:
        assert c["ratio"] > 0 and 0 < c["bw_fraction"] and c["target"] in (1.0, 1.25, 1.5)
    assert {c["op"] for c in result["loss_cases"]} == {"sparsemax_loss", "entmax15_loss", "entmax_loss_a1.3"}
    assert result["fused"]["time_ratio"] > 0
    (case,) = result["attention"]  # the attention section's plumbing (the fused kernels in the interpreter)
    impls = case["impls"]
    assert {"sdpa", "materialized_entmax15"} <= set(impls) and all(r["ms"] > 0 for r in impls.values())
    if "fused_entmax15" in impls:
        for name in ("fused_entmax15", "fused_learned_alpha"):
            assert impls[name]["max_abs_psum_minus_1"] < 1e-5 and impls[name]["psum_solver"] < 1e-5
            assert 0 <= impls[name]["block_sparsity"] < 1


def test_gpu_benchmark_refuses_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script runs instead of refusing")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run_gpu.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
