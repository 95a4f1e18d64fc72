"""benchmarks/tune_gpu.py's plumbing on the CPU, the kernels in Triton's interpreter (the timings need a GPU)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "tune_gpu.py")


def test_tuning_sweep_runs_checks_answers_and_saves(tmp_path):
    out = tmp_path / "tune.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-W", "ignore", SCRIPT, "--device", "cpu", "--smoke", "--repeats", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] and result["torch"] and not result["stopped_by_deadline"]
    assert [(c["section"], c["op"]) for c in result["cases"]] == [("rows", "entmax15"), ("attention", "entmax15")]
    for case in result["cases"]:
        assert case["complete"] and case["default_ms"] > 0 and case["baseline_ms"] > 0
        # every setting gives the built-in setting's answer (rows: the same bits; attention: rounding)
        assert case["tried"] and all(t["same_answer"] for t in case["tried"]), case["tried"]
        assert case["best"] in case["tried"]
    assert "built-in" in proc.stdout


def test_a_spent_budget_keeps_what_was_measured(tmp_path):
    out = tmp_path / "tune.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-W", "ignore", SCRIPT, "--device", "cpu", "--smoke", "--only", "rows",
                           "--budget", "0", "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["stopped_by_deadline"] and result["cases"] == []


def test_refuses_cuda_without_a_gpu_and_cpu_without_the_interpreter(tmp_path):
    import torch

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--smoke", "--json", str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "TRITON_INTERPRET=1" in proc.stderr
    if not torch.cuda.is_available():
        proc = subprocess.run([sys.executable, SCRIPT, "--json", str(tmp_path / "t.json")], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and "no CUDA device" in proc.stderr
