"""The GPU benchmark script's plumbing, run on the CPU at smoke sizes (the GPU numbers need a GPU)."""

import json
import os
import signal
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
    assert result["complete"] is True and result["errors"] == {}
    assert result["sections_done"] == ["operators", "losses", "fused", "attention", "decode"]
    env = result["environment"]
    assert env["torch"] and env["python"] and set(env["peers"]) == {"entmax", "adasplash", "liger-kernel",
                                                                    "cut-cross-entropy"}
    assert result["config"]["vocab_shapes"] == [[8, 300]] and result["config"]["fused_shape"] == [64, 16, 300]
    ops = {(c["op"], c["dtype"], tuple(c["shape"])) for c in result["cases"]}
    assert ("entmax_a1.3", "bfloat16", (8, 300)) in ops and ("alpha_relu", "float32", (64, 32)) in ops
    assert all(c["row_slices"] == 0 for c in result["cases"])  # smoke rows are held in registers
    for c in result["cases"]:
        assert c["ratio"] > 0 and 0 < c["bw_fraction"] and c["target"] in (1.0, 1.25, 1.5)
        assert c["first_call_ms"] > 0 and c["softmax_first_call_ms"] > 0  # the first call, apart from the steady state
    assert all(c["first_call_ms"] > 0 and c["cross_entropy_first_call_ms"] > 0 for c in result["loss_cases"])
    assert result["fused"]["fused"]["first_call_ms"] > 0 and result["fused"]["unfused"]["first_call_ms"] > 0
    assert {c["op"] for c in result["loss_cases"]} == {"sparsemax_loss", "entmax15_loss", "entmax_loss_a1.3",
                                                       "alpha_relu_loss", "entmax15_loss_ls0.1", "f_reverse_kl_loss",
                                                       "f_jeffrey_loss", "f_reverse_chi_square_loss"}
    assert {"f_reverse_kl", "f_jeffrey", "f_reverse_chi_square"} <= {c["op"] for c in result["cases"]}
    assert {c["baseline"] for c in result["loss_cases"] if c["op"].endswith("_ls0.1")} == {"cross_entropy_ls0.1"}
    assert result["fused"]["time_ratio"] > 0
    # the attention section's plumbing (the fused kernels in the interpreter): a random case and a structured one
    random_case, structured_case = result["attention"]
    assert random_case["inputs"] == "random" and structured_case["inputs"] == "structured"
    assert structured_case["shape"] == [1, 1, 64, 16] and structured_case["locality"] == 20.0
    assert structured_case["sinks"] == 4 and structured_case["kv_heads"] == 1
    assert result["config"]["attention"]["structured"] == [
        {"head_dim": 16, "length": 64, "heads": 1, "kv_heads": 1, "target": None, "locality": 20.0,
         "cpu_block_sparsity": None}]
    for case in result["attention"]:
        impls = case["impls"]
        assert {"sdpa", "materialized_entmax15"} <= set(impls) and all(r["ms"] > 0 for r in impls.values())
        assert all(r["first_call_s"] > 0 and r["psum_dtype"] == "bfloat16" for r in impls.values())
        if "fused_entmax15" in impls:
            for name in ("fused_entmax15", "fused_learned_alpha"):
                # Σp read off the bfloat16 output (within its rounding and that of p), and the solver's float32 sum
                assert impls[name]["max_abs_psum_minus_1"] <= 2 * impls[name]["psum_resolution"]
                assert impls[name]["psum_solver"] < 1e-5
                assert 0 <= impls[name]["block_sparsity"] < 1
    (case,) = result["decode"]  # the decode section's plumbing (the reference path on the CPU)
    assert case["cache_len"] == 64 and set(case["impls"]) == {"sdpa", "decode_entmax15", "decode_sparsemax",
                                                              "attention_entmax15"}
    for r in case["impls"].values():
        assert r["ms"] > 0 and r["first_call_ms"] > 0 and r["max_abs_error"] < 0.05, r


def test_gpu_benchmark_refuses_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script runs instead of refusing")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run_gpu.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr


def test_a_killed_run_keeps_the_cases_it_finished(tmp_path):
    """The JSON is rewritten atomically after every case: a run killed (SIGKILL) right after its first
    case is saved keeps that case, marked ``"complete": false``, and nothing of the sections after it."""
    out = tmp_path / "gpu.json"
    code = f"""
import os, signal, sys
sys.path.insert(0, {os.path.join(ROOT, "benchmarks")!r})
import run_gpu
real = run_gpu.operator_cases
def killed_after_the_first_case(*args, emit=None, **kwargs):
    def emit_then_die(case):
        emit(case)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, emit=emit_then_die, **kwargs)
run_gpu.operator_cases = killed_after_the_first_case
sys.exit(run_gpu.main(["--device", "cpu", "--smoke", "--no-package", "--only", "operators", "losses",
                       "--json", {str(out)!r}]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["complete"] is False and result["sections_done"] == [] and result["loss_cases"] == []
    assert len(result["cases"]) == 1 and result["cases"][0]["ratio"] > 0
    assert result["environment"]["torch"] and result["config"]["sections"] == ["losses", "operators"]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]  # no temporary file left


def test_the_peer_comparison_records_what_it_could_not_run(monkeypatch):
    """On a torch without ``F.linear_cross_entropy`` (2.11, the GPU machines' build) and without the
    peers installed, the fused peer comparison says what it left out instead of failing."""
    import importlib

    import torch
    import torch.nn.functional as F

    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    run_gpu = importlib.import_module("run_gpu")
    monkeypatch.delattr(F, "linear_cross_entropy", raising=False)
    for module in ("liger_kernel", "liger_kernel.ops.fused_linear_cross_entropy", "cut_cross_entropy"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    emitted = []
    cases = run_gpu.peer_fused_cases([(16, 8, 50)], torch.device("cpu"), 1, log=lambda *a: None, emit=emitted.append)
    assert cases == emitted
    # the first shape runs on both kinds of logits, each case says which
    timed = [c for c in cases if "skipped" not in c]
    assert {c["logits"] for c in timed} == {"benchmark", "realistic"}
    for kind in ("benchmark", "realistic"):
        ours = next(c for c in timed if c["op"] == "ours_entmax15" and c["logits"] == kind)
        assert 0 <= ours["tiles_skipped"] <= 1 and ours["ms"] > 0
        dense = next(c for c in timed if c["op"] == "ours_entmax15_dense_gemms" and c["logits"] == kind)
        assert dense["loss"] == ours["loss"] and "tiles_skipped" not in dense
    by_op = {c["op"]: c for c in cases if c.get("logits", "benchmark") == "benchmark"}
    assert by_op["torch_linear_cross_entropy"]["skipped"].startswith(
        "torch.nn.functional.linear_cross_entropy is absent in torch")
    assert by_op["liger_flce"]["skipped"].startswith("liger_kernel:") and by_op["cce"]["skipped"].startswith(
        "cut_cross_entropy:")
    assert by_op["ours_entmax15"]["ms"] > 0 and by_op["torch_linear_ce"]["loss_error_vs_ours_kl"] < 1e-2
    assert by_op["ours_entmax15"]["first_call_ms"] > 0


def test_peer_operators_record_first_calls_and_failures(monkeypatch):
    """A peer's first call (compilation, autotuning) is timed apart from its steady state; a peer that
    fails is recorded with its error and not timed."""
    import importlib

    import torch

    import softargmax as sa

    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    run_gpu = importlib.import_module("run_gpu")

    def broken(x):
        raise RuntimeError("unsupported shape")

    monkeypatch.setattr(run_gpu, "peer_operators", lambda: {"sparsemax": {"fake": lambda x: sa.sparsemax(x + 0.0),
                                                                          "broken": broken}})
    cases = run_gpu.peer_operator_cases([(4, 50)], [torch.float32], torch.device("cpu"), 1, log=lambda *a: None)
    by_peer = {c["peer"]: c for c in cases}
    assert by_peer["fake"]["peer_first_call_ms"] > 0 and by_peer["fake"]["ours_first_call_ms"] > 0
    assert by_peer["fake"]["peer_ms"] > 0 and by_peer["fake"]["peer_max_abs_error"] < 1e-6
    assert by_peer["broken"]["peer_ms"] is None and by_peer["broken"]["peer_first_call_ms"] is None
    assert by_peer["broken"]["peer_max_abs_error"].startswith("error: RuntimeError: unsupported shape")
