"""benchmarks/gpu_all.sh, the one command a GPU session runs, checked on the CPU (``--dry-run``).

A step that hangs is simulated with a ``PYTHON`` that sleeps for the commands named (the
script runs every Python step through ``$PYTHON``); everything else is the real script.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_all.sh"


def _hanging_python(tmp_path, *patterns):
    """A ``python`` that sleeps (recording its PID) when its arguments contain one of ``patterns``."""
    pids = tmp_path / "hung.pids"
    cases = "|".join(f'*"{p}"*' for p in patterns)
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\ncase "$*" in\n  {cases}) echo $$ >> "{pids}"; exec sleep 1000 ;;\nesac\n'
                      f'exec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return script, pids


def _env(python, **extra):
    env = dict(os.environ, PYTHON=str(python), **extra)
    env.pop("PYTEST_XDIST_WORKER", None)  # the script's own pytest runs are not workers of this one
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    return env


def _summary(out):
    """``{step: (status, rc)}`` of OUT/summary.txt."""
    rows = {}
    for line in (out / "summary.txt").read_text().splitlines():
        m = re.match(r"(\S+)\s+(ok|failed|killed \(\w+\)|skipped \([\w ]+\))\s+(\S+)", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def _assert_gone(pids_file):
    for pid in map(int, pids_file.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _archive_names(out):
    with tarfile.open(out / "gpu-all.tar.gz") as tar:
        return set(tar.getnames())


def test_bad_arguments_are_refused_by_name(tmp_path):
    for args, message in [(["--budget", "5"], "--budget must be a whole number of seconds >= 10, got '5'"),
                          (["--budget", "1e3"], "--budget must be a whole number"),
                          (["--steps", "env,benchmark"], "--steps: unknown step 'benchmark'"),
                          (["--cap", "test=10"], "--cap: unknown step 'test'"),
                          (["--cap", "tests=ten"], "--cap tests: seconds must be a positive whole number"),
                          (["--frobnicate"], "unknown option: --frobnicate"),
                          (["--steps", "translation-gpu"], "the translation-gpu step needs --translation-runs")]:
        proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), *args], capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


def test_deadline_and_cap_kills_are_recorded_and_everything_is_packed(tmp_path):
    """bench-losses hangs past its cap, bench-fused until the deadline; bench-attention gets no time."""
    python, pids = _hanging_python(tmp_path, "--only losses", "--only fused")
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "--dry-run", "--budget", "16", "--cap", "bench-losses=2",
                           "--steps", "bench-losses,bench-fused,bench-attention"],
                          capture_output=True, text=True, timeout=60, env=_env(python))
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert elapsed < 16 + 3, f"the run took {elapsed:.0f} s for a 16 s budget"
    rows = _summary(out)
    assert rows == {"bench-losses": ("killed (cap)", "124"), "bench-fused": ("killed (deadline)", "124"),
                    "bench-attention": ("skipped (deadline)", "-")}, rows
    assert sorted(p.name for p in out.iterdir()) == ["gpu-all.tar.gz", "summary.txt"]  # what comes back
    assert (out / "gpu-all.tar.gz").stat().st_size < 16 * 2**20
    names = _archive_names(out)
    assert {"gpu-all/summary.txt", "gpu-all/logs/bench-losses.log", "gpu-all/logs/bench-fused.log"} <= names
    _assert_gone(pids)  # the hung commands were killed with their steps


def test_a_signal_stops_the_running_step_and_packs(tmp_path):
    python, pids = _hanging_python(tmp_path, "--only fused")
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(SCRIPT), str(out), "--dry-run", "--budget", "300", "--steps", "env,bench-fused"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(python))
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "bench-fused never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output
    rows = _summary(out)
    assert rows["env"][0] == "ok" and rows["bench-fused"][0] == "killed (TERM)", rows
    assert {"gpu-all/env.txt", "gpu-all/logs/bench-fused.log"} <= _archive_names(out)
    _assert_gone(pids)


def test_dry_run_of_the_test_steps_selects_the_gpu_tests(tmp_path):
    """The pytest command lines the GPU machine runs, with the dry run's few tests: each of the
    three ways a test is marked ``gpu`` (the ``triton_device`` fixture, test_flash_attention's
    ``device``, ``needs_cuda``) selects its test, and junit XML and the skip reasons come back."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "--dry-run", "--keep", "--steps", "sanity,tests,tests-compile"],
                          capture_output=True, text=True, timeout=240, env=_env(sys.executable, GPU_ALL_WORKERS="0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert {k: v[0] for k, v in _summary(out).items()} == {"sanity": "ok", "tests": "ok", "tests-compile": "ok"}
    work = out / "gpu-all"
    ran = {}
    for xml in ("junit-gpu.xml", "junit-compile.xml"):
        ran[xml] = set(re.findall(r'<testcase classname="tests\.(\w+)" name="(\w+)', (work / "tests" / xml).read_text()))
    assert {name for _, name in ran["junit-gpu.xml"]} == {
        "test_switch_off_takes_reference_path", "test_uncovered_arguments", "test_learned_alpha_attention_on_cuda"}
    assert {name for _, name in ran["junit-compile.xml"]} == {"test_gpu_compile_fullgraph"}
    assert "needs CUDA" in (work / "logs" / "tests.log").read_text()  # -rs lists why a test was skipped
    assert '"status": 0' in (work / "sanity.json").read_text()


def test_dry_run_compile_report_comes_back_in_the_archive(tmp_path):
    """The compile report step (no GPU needed: it runs where CUDA is missing too) writes its JSON into the archive;
    so does the JAX benchmark step (at smoke sizes in the dry run), with the device JAX used."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "--dry-run", "--steps", "sanity,compile-report,bench-jax"],
                          capture_output=True, text=True, timeout=240, env=_env(sys.executable))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _summary(out) == {"sanity": ("ok", "0"), "compile-report": ("ok", "0"), "bench-jax": ("ok", "0")}
    assert {"gpu-all/compile-report.json", "gpu-all/bench/gpu-jax.json"} <= _archive_names(out)
    with tarfile.open(out / "gpu-all.tar.gz") as tar:
        jax_bench = json.load(tar.extractfile("gpu-all/bench/gpu-jax.json"))
    assert jax_bench["info"]["device"] and jax_bench["results"]
    with tarfile.open(out / "gpu-all.tar.gz") as tar:
        report = json.load(tar.extractfile("gpu-all/compile-report.json"))
    assert report["target"]["arch"] == 90 and report["failures"] == []
    assert {r["kernel"] for r in report["variants"]} == {"row_kernels.alpha_relu_forward", "row_kernels.alpha_relu_backward"}
    assert all(r["regs"] > 0 and r["ctas_per_sm"] >= 1 for r in report["variants"])


def test_cuda_only_tests_use_needs_cuda():
    """A CUDA-only test is written ``@needs_cuda`` (conftest), which also marks it ``gpu``; a bare
    skip condition on ``torch.cuda.is_available()`` alone would leave it out of the GPU machine's ``-m gpu`` run."""
    offenders = [p.name for p in (ROOT / "tests").glob("test_*.py")
                 if re.search(r"skipif\(\s*not torch\.cuda\.is_available\(\)", p.read_text(encoding="utf-8"))]
    assert not offenders, f"use conftest.needs_cuda in {offenders}"


def test_translation_runs_bring_back_their_new_records_only(tmp_path):
    """The translation step trains the runs named, into a folder that already holds a record (an earlier
    session's), and brings back the records this call wrote and the log; a stand-in for the training writes them."""
    folder = tmp_path / "translation-gpu"
    (folder / "records").mkdir(parents=True)
    (folder / "records" / "softmax-seed1.json").write_text("{}")  # committed earlier
    time.sleep(1.1)  # find -newer compares modification times
    python = tmp_path / "python"
    python.write_text(f'''#!/bin/sh
case "$*" in
  *"reproduce translation"*)
    echo "$@" > "{tmp_path}/args"
    echo '{{"run": "sparsemax:1"}}' > "{folder}/records/sparsemax-seed1.json"
    echo "trained" > "{folder}/log.txt"; exit 0 ;;
esac
exec "{sys.executable}" "$@"
''')
    python.chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "--dry-run", "--budget", "60", "--steps", "translation-gpu",
                           "--translation-runs", "sparsemax:1,entmax15:1"],
                          capture_output=True, text=True, timeout=90, env=_env(python, TRANSLATION_OUT=str(folder)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _summary(out) == {"translation-gpu": ("ok", "0")}
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("--runs") + 1:args.index("--runs") + 3] == ["sparsemax:1", "entmax15:1"]
    assert args[args.index("--out") + 1] == str(folder) and args[args.index("--preset") + 1] == "smoke"  # dry run
    assert "--resume" in args  # a second call on the same machine finds the first one's checkpoints
    names = _archive_names(out)
    assert "gpu-all/translation-gpu/records/sparsemax-seed1.json" in names
    assert "gpu-all/translation-gpu/log.txt" in names
    assert "gpu-all/translation-gpu/records/softmax-seed1.json" not in names  # not new: it stays home


def test_translation_one_call_preset_brings_back_what_it_finished_when_the_deadline_stops_it(tmp_path):
    """``--translation-preset gpu-1call``: the runs of the one-call preset are trained into their own folder; the
    deadline stops the step during the interleaved timing, and the records of the runs that finished (beside the
    committed one: only the new ones) come back in their places under records/, with the report written so far.
    A stand-in for the training writes them and then hangs.  The dry run trains the smoke preset into a folder of
    its own under OUT unless $TRANSLATION_OUT names one."""
    folder = tmp_path / "translation-gpu-1call"
    (folder / "records").mkdir(parents=True)
    (folder / "records" / "softmax-seed2.json").write_text("{}")  # committed earlier
    time.sleep(1.1)  # find -newer compares modification times
    python = tmp_path / "python"
    python.write_text(f'''#!/bin/sh
case "$*" in
  *"reproduce translation"*)
    echo "$@" >> "{tmp_path}/args"
    out=$(echo "$@" | sed 's/.*--out \\([^ ]*\\).*/\\1/')
    mkdir -p "$out/records/speed"
    for s in softmax sparsemax entmax15 alpha_relu; do echo '{{}}' > "$out/records/$s-seed1.json"; done
    echo '{{"timing": {{}}}}' > "$out/records/speed/interleaved.json"
    echo "# report" > "$out/report.md"; echo "{{}}" > "$out/results.json"; echo "trained" > "$out/log.txt"
    case "$*" in *"--preset gpu-1call"*) exec sleep 1000 ;; esac
    exit 0 ;;
esac
exec "{sys.executable}" "$@"
''')
    python.chmod(0o755)
    runs = "softmax:1 sparsemax:1 entmax15:1 alpha_relu:1"
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "--budget", "15", "--steps", "translation-gpu",
                           "--translation-preset", "gpu-1call", "--translation-runs", runs],
                          capture_output=True, text=True, timeout=60, env=_env(python, TRANSLATION_OUT=str(folder)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _summary(out) == {"translation-gpu": ("killed (deadline)", "124")}
    args = (tmp_path / "args").read_text().splitlines()[-1].split()
    assert args[args.index("--preset") + 1] == "gpu-1call" and args[args.index("--out") + 1] == str(folder)
    assert args[args.index("--runs") + 1:args.index("--runs") + 5] == runs.split() and "--resume" in args
    assert args[args.index("--device") + 1] == "cuda"
    names = _archive_names(out)
    for f in [f"records/{s}-seed1.json" for s in ("softmax", "sparsemax", "entmax15", "alpha_relu")] + [
            "records/speed/interleaved.json", "report.md", "results.json", "log.txt"]:
        assert f"gpu-all/translation-gpu/{f}" in names, f
    assert "gpu-all/translation-gpu/records/softmax-seed2.json" not in names  # not new: it stays home

    dry = tmp_path / "dry"
    proc = subprocess.run(["bash", str(SCRIPT), str(dry), "--dry-run", "--budget", "30", "--steps", "translation-gpu",
                           "--translation-preset", "gpu-1call", "--translation-runs", runs],
                          capture_output=True, text=True, timeout=60, env=_env(python))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = (tmp_path / "args").read_text().splitlines()[-1].split()
    assert args[args.index("--preset") + 1] == "smoke" and args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--out") + 1] == str(dry / "translation-dry-run")
    assert "gpu-all/translation-gpu/records/speed/interleaved.json" in _archive_names(dry)
    refused = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "x"), "--translation-preset", "full"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "--translation-preset must be gpu or gpu-1call, got 'full'" in refused.stderr


def test_lm_runs_train_into_the_lm_folder_and_bring_back_what_they_wrote(tmp_path):
    """The lm-gpu step trains the runs named (or all of them) into a folder that holds earlier records, with
    --resume, and brings back the records, results and report this call wrote; a stand-in for the training writes
    them. Without --lm-runs the step is refused by name."""
    folder = tmp_path / "lm-gpu"
    (folder / "records").mkdir(parents=True)
    (folder / "records" / "kl-seed0.json").write_text("{}")  # committed earlier
    time.sleep(1.1)  # find -newer compares modification times
    python = tmp_path / "python"
    python.write_text(f'''#!/bin/sh
case "$*" in
  *"reproduce lm"*)
    echo "$@" >> "{tmp_path}/args"
    echo '{{"run": "alpha1.5+q:1"}}' > "{folder}/records/alpha1.5+q-seed1.json"
    echo "# report" > "{folder}/report.md"; echo "{{}}" > "{folder}/results.json"
    echo "trained" > "{folder}/log.txt"; exit 0 ;;
esac
exec "{sys.executable}" "$@"
''')
    python.chmod(0o755)
    for runs, selected in (("kl:1,alpha1.5+q:1", ["--runs", "kl:1", "alpha1.5+q:1"]), ("all", [])):
        out = tmp_path / f"out-{runs.replace(':', '_').replace(',', '_')}"
        proc = subprocess.run(["bash", str(SCRIPT), str(out), "--dry-run", "--budget", "60", "--lm-runs", runs,
                               "--steps", "lm-gpu"],
                              capture_output=True, text=True, timeout=90, env=_env(python, LM_OUT=str(folder)))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _summary(out) == {"lm-gpu": ("ok", "0")}
        args = (tmp_path / "args").read_text().splitlines()[-1].split()
        assert args[args.index("--out") + 1] == str(folder) and args[args.index("--preset") + 1] == "smoke"  # dry run
        assert "--resume" in args and args[args.index("--device") + 1] == "cpu"
        assert [a for a in args if a == "--runs" or ":" in a] == selected
        names = _archive_names(out)
        for f in ("records/alpha1.5+q-seed1.json", "report.md", "results.json", "log.txt"):
            assert f"gpu-all/lm-gpu/{f}" in names
        assert "gpu-all/lm-gpu/records/kl-seed0.json" not in names  # not new: it stays home
    refused = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "x"), "--dry-run", "--steps", "lm-gpu"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "the lm-gpu step needs --lm-runs" in refused.stderr
