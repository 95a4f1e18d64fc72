"""The bench command: runs, prints a table, writes the documented JSON schema."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from softargmax.cli import main


def test_bench_quick_writes_schema(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--shapes", "4x300", "--ops", "sparsemax", "alpha_relu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sparsemax" in printed and "ratio" in printed
    data = json.loads(out.read_text())
    assert {"device", "torch", "threads", "cases"} <= set(data)
    assert len(data["cases"]) == 4
    for case in data["cases"]:
        assert {"op", "shape", "dtype", "pass", "ms", "softmax_ms", "ratio"} <= set(case)
        assert case["pass"] in ("fwd", "fwd+bwd") and case["shape"] == [4, 300]
        assert case["ms"] > 0 and abs(case["ratio"] - case["ms"] / case["softmax_ms"]) <= 0.05 * case["ratio"] + 0.01


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "softargmax", "bench", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--quick" in r.stdout


def test_bad_arguments(capsys):
    import pytest

    from softargmax.bench import OPERATORS

    with pytest.raises(SystemExit):
        main(["bench", "--shapes", "64by32"])
    # an unknown operator: one error line that lists the names, exit status 2, before the table's header
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--quick", "--ops", "sparsemax", "nope"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "", out
    assert err.count("\n") == 1 and err.startswith("error: argument --ops: unknown operator 'nope'"), err
    assert ", ".join(OPERATORS) in err and "sparsemax" in OPERATORS and "f_jeffrey" in OPERATORS


def test_attention_bench_quick_schema(tmp_path):
    out = tmp_path / "attn.json"
    assert main(["bench", "--attention", "--quick", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {c["op"] for c in data["cases"]} >= {"attention[entmax15]", "attention[sparsemax]"}
    assert all(c["ms"] > 0 and c["baseline"] == "F.scaled_dot_product_attention" for c in data["cases"])


def _run_without(modules, code):
    """Run ``code`` in a fresh interpreter where ``modules`` cannot be imported."""
    import subprocess
    import sys

    block = "; ".join(f"sys.modules[{m!r}] = None" for m in modules)
    return subprocess.run([sys.executable, "-c", f"import sys; {block}; {code}"], capture_output=True, text=True,
                          timeout=120)


def test_reproduce_names_the_missing_extra_up_front():
    proc = _run_without(["sentencepiece"], "from softargmax.cli import main; sys.exit(main(['reproduce', 'translation', "
                                           "'--preset', 'smoke', '--out', '/nonexistent/never-written']))")
    assert proc.returncode == 2
    assert "sentencepiece" in proc.stderr and 'pip install "softargmax[experiments]"' in proc.stderr
    assert "Traceback" not in proc.stderr


def test_huggingface_integration_names_the_missing_extra():
    proc = _run_without(["transformers"], "import softargmax.integrations.huggingface")
    assert proc.returncode != 0
    assert "MissingExtraError" in proc.stderr and 'pip install "softargmax[hf]"' in proc.stderr


def test_checkpoints_found_are_continued_from_unless_fresh(tmp_path, capsys):
    out = tmp_path / "bisection"
    ckpt = out / "runs" / "softmax" / "checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    args = ["reproduce", "bisection", "--preset", "smoke", "--out", str(out)]
    # the same command twice works: the second call continues (a note says so), no --resume needed
    assert main(args) == 0 and ckpt.exists()
    assert main(args + ["--resume"]) == 0 and ckpt.exists()
    # every run writes its own log next to the report
    log = (out / "log.txt").read_text()
    assert "wrote" in log and "report.md" in log
    capsys.readouterr()
    # --fresh moves the checkpoints and the log aside, into a dated folder, and says so in one line
    assert main(args + ["--fresh"]) == 0 and not (out / "runs").exists()
    aside = [p for p in out.iterdir() if p.name.startswith("previous-")]
    assert len(aside) == 1 and (aside[0] / "runs" / "softmax" / "checkpoint.pt").is_file()
    assert (aside[0] / "log.txt").read_text() == log
    printed = [line for line in capsys.readouterr().out.splitlines() if "--fresh" in line]
    assert printed == [f"--fresh: moved runs, log.txt of the earlier runs to {aside[0]}/ (delete it when no longer "
                       "needed); starting over"]
    assert printed[0] in (out / "log.txt").read_text()  # the new log says it too
    with pytest.raises(SystemExit):
        main(args + ["--resume", "--fresh"])


def test_fresh_moves_everything_derived_aside_atomically_and_never_overwrites(tmp_path):
    import time

    from softargmax.experiments._common import set_aside_derived

    out = tmp_path / "out"
    assert set_aside_derived(out, ("runs",)) == (None, []) and not out.exists()  # nothing there: no folder made
    (out / "runs" / "a").mkdir(parents=True)
    (out / "runs" / "a" / "checkpoint.pt").write_bytes(b"x")
    (out / "spm.model").write_text("tok")
    (out / "results.json").write_text("{}")
    (out / ".report.md.abcd1234.tmp").write_text("half")  # a killed writer's temporary file: deleted
    when = time.localtime(0)
    folder, moved = set_aside_derived(out, ("runs", "records", "spm.model"), when=when)
    assert folder == out / f"previous-{time.strftime('%Y%m%d-%H%M%S', when)}" and moved == ["runs", "spm.model"]
    assert (folder / "runs" / "a" / "checkpoint.pt").read_bytes() == b"x" and (folder / "spm.model").is_file()
    assert sorted(p.name for p in out.iterdir()) == [folder.name, "results.json"]
    (out / "runs").mkdir()
    again, _ = set_aside_derived(out, ("runs",), when=when)  # the same second: a new folder, nothing overwritten
    assert again == out / f"{folder.name}-2" and (folder / "runs" / "a").is_dir()


def test_the_default_output_folder_is_ignored_by_git_and_not_the_committed_report(tmp_path, monkeypatch):
    """A user's run never writes into the committed reports: ``--out`` defaults to runs/<experiment>, which
    .gitignore lists."""
    from softargmax.cli import build_parser

    root = Path(__file__).resolve().parents[1]
    args = build_parser().parse_args(["reproduce", "bisection", "--preset", "smoke"])
    assert args.out is None
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "bisection", "--preset", "smoke"]) == 0
    assert (tmp_path / "runs" / "bisection" / "report.md").is_file() and not (tmp_path / "reports").exists()
    assert "/runs/" in (root / ".gitignore").read_text().split()


def test_render_only_rewrites_the_report_from_results_json_without_running(tmp_path, capsys):
    import shutil

    from softargmax.experiments import translation
    from softargmax.experiments._common import render_existing

    reports = Path(__file__).resolve().parents[1] / "reports"
    out = tmp_path / "translation"
    shutil.copytree(reports / "translation", out)
    results_before, log_before = (out / "results.json").read_bytes(), (out / "log.txt").read_bytes()
    (out / "report.md").write_text("stale\n\n![curves_loss.png](curves_loss.png)\n![gone.png](gone.png)\n")
    assert main(["reproduce", "translation", "--render-only", "--out", str(out)]) == 0
    assert "report.md" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    results = json.loads(results_before)
    # the figures are the ones the old report showed that exist, in its order; nothing else is touched
    assert report == translation.render_report(results, ["curves_loss.png"])
    assert (out / "results.json").read_bytes() == results_before and (out / "log.txt").read_bytes() == log_before
    assert "## Reproducibility" in report and f"| {results['systems']['alpha_relu']['bleu']:.2f} |" in report
    # an experiment whose figures come from results.json alone has them drawn again
    multilabel = tmp_path / "multilabel"
    shutil.copytree(reports / "multilabel", multilabel)
    (multilabel / "f1.png").unlink()
    assert main(["reproduce", "multilabel", "--render-only", "--out", str(multilabel)]) == 0
    assert (multilabel / "f1.png").stat().st_size > 10_000 and "![" in (multilabel / "report.md").read_text()
    # no results.json: a clear error, no report written
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["reproduce", "bisection", "--render-only", "--out", str(empty)]) == 2
    assert "no results.json" in capsys.readouterr().err and not (empty / "report.md").exists()
    with pytest.raises(FileNotFoundError, match=r"out: no results.json"):
        render_existing(str(empty), translation.render_report)


def test_committed_reports_are_what_their_results_render_to(tmp_path):
    """Every committed report.md is its results.json rendered by today's code (so each carries its
    Reproducibility section); `softargmax reproduce NAME --render-only` brings one back in line."""
    import importlib
    import shutil

    from softargmax.experiments import EXPERIMENTS
    from softargmax.experiments._common import render_existing

    reports = Path(__file__).resolve().parents[1] / "reports"
    # each experiment's report, and the other reports of an experiment beside them (`reports/NAME-gpu/`,
    # `reports/NAME-gpu-pilot/`, ...) where committed with their results.json
    folders = [(name, name, module) for name, module in EXPERIMENTS.items()]
    for d in sorted(reports.iterdir()):
        owner = max((n for n in EXPERIMENTS if d.name.startswith(f"{n}-")), key=len, default=None)
        if owner is not None and (d / "results.json").is_file():
            folders.append((d.name, owner, EXPERIMENTS[owner]))
    assert len(folders) > len(EXPERIMENTS)
    for folder, name, module in folders:
        committed = (reports / folder / "report.md").read_text()
        assert "\n## Reproducibility\n" in committed, folder
        copy = tmp_path / folder
        shutil.copytree(reports / folder, copy)
        rendered = render_existing(str(copy), importlib.import_module(module).render_report).read_text()
        assert rendered == committed, f"{folder}: rerun `softargmax reproduce {name} --render-only --out reports/{folder}`"


def test_version_prints_softargmax_and_torch_versions():
    import re

    import torch

    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    r = subprocess.run([sys.executable, "-m", "softargmax", "--version"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"softargmax {version} (torch {torch.__version__})"


def test_reproduce_help_states_each_experiments_presets_the_default_and_device_and_seed(capsys):
    import importlib

    from softargmax.experiments import EXPERIMENTS, PRESET_NAMES

    for name, module in EXPERIMENTS.items():  # the help's table is what the modules accept
        assert tuple(importlib.import_module(module).PRESETS) == PRESET_NAMES[name], name
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "every experiment takes smoke and default" in text and "translation also full, gpu" in text
    assert "lm also full, gpu" in text and "(default: default" in text
    assert "--device DEVICE where the models run" in text and "--seed SEED the random seed" in text
    # a preset the experiment does not take: one line, error: prefix, argparse's exit status
    assert main(["reproduce", "tau-table", "--preset", "full", "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err
    assert err == "error: tau-table takes --preset default or smoke, not 'full'\n"


#: a bad value of each option: (arguments, the option the one-line message names); every experiment is tried with
#: each (an option the experiment does not take is an error as well, naming it)
BAD_OPTIONS = {
    "bad int": (["--threads", "two"], "--threads"),
    "zero threads": (["--threads", "0"], "--threads"),
    "negative seed": (["--seed", "-1"], "--seed"),
    "bad seeds": (["--seeds", "1", "x"], "--seeds"),
    "bad choice": (["--preset", "huge"], "--preset"),
    "unknown system": (["--systems", "softmax", "sparsemx"], "--systems"),
    "cuda on CPU torch": (["--device", "cuda"], "--device"),
    "not a device": (["--device", "gpu"], "--device"),
    "missing data folder": (["--data-dir", "/nonexistent/data"], "--data-dir"),
    "zero checkpoint interval": (["--checkpoint-every", "0"], "--checkpoint-every"),
    "negative jobs": (["--jobs", "-1"], "--jobs"),
    "bad run": (["--runs", "softmax"], "--runs"),
    "unknown run": (["--runs", "nope:1"], "--runs"),
    "render-only with a run option": (["--render-only", "--threads", "2"], "--render-only"),
}


def _error_of(argv, capsys):
    """``(exit status, stderr)`` of ``softargmax argv`` run in this process."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
@pytest.mark.parametrize("experiment", ["translation", "tau-table", "bisection", "adaptive-attention",
                                        "nli-attention", "label-proportions", "multilabel", "classification",
                                        "distillation", "lm"])
def test_a_bad_option_is_one_error_line_with_exit_status_2_before_any_work(experiment, case, tmp_path, capsys,
                                                                          monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU-only PyTorch, even on a GPU machine
    options, option = BAD_OPTIONS[case]
    out = tmp_path / "out"
    code, err = _error_of(["reproduce", experiment, "--preset", "smoke", "--out", str(out), *options], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and option in err, err
    assert "Traceback" not in err and not out.exists()  # no lock, no log, no --fresh, no vocabulary, no training


def test_the_issue_examples_name_the_option_and_the_fix(tmp_path, capsys, monkeypatch):
    import torch

    from softargmax.experiments._options import UsageError, check_device

    base = ["reproduce", "translation", "--preset", "smoke", "--out", str(tmp_path / "out")]
    assert _error_of(base + ["--systems", "softmax", "sparsemx"], capsys) == (2, (
        "error: --systems: unknown system 'sparsemx' (did you mean sparsemax?); translation takes softmax, sparsemax, "
        "entmax15, alpha_relu, f:kl, f:reverse_kl, f:jeffrey, f:jensen_shannon, f:squared_hellinger, f:chi_square, "
        "f:reverse_chi_square\n"))
    assert _error_of(base + ["--threads", "0"], capsys) == (2, (
        "error: argument --threads: give a positive number of CPU threads (e.g. 2), got 0 (see softargmax reproduce "
        "--help)\n"))
    monkeypatch.setattr(torch.version, "cuda", None)
    code, err = _error_of(base + ["--device", "cuda"], capsys)
    assert code == 2 and "built without CUDA; install a CUDA build" in err and "or use --device cpu" in err
    # a CUDA build that sees no GPU, or fewer than named
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda:0") == "cuda:0"
    with pytest.raises(UsageError, match=r"shows 1 GPU \(cuda:0\)"):
        check_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="sees no GPU; check the driver"):
        check_device("cuda")


def test_the_library_refuses_bad_arguments_with_the_same_messages(tmp_path):
    from softargmax.experiments import bisection, classification
    from softargmax.experiments._options import UsageError

    with pytest.raises(UsageError, match=r"^systems: unknown system 'chi_sqare' \(did you mean chi_square\?\)"):
        classification.run("smoke", out=str(tmp_path / "c"), systems=["chi_sqare"])
    with pytest.raises(ValueError, match=r"^threads: give a positive number"):
        classification.run("smoke", out=str(tmp_path / "c"), threads=0)
    with pytest.raises(ValueError, match=r"^preset: give one of default, smoke, got 'huge'"):
        bisection.run("huge", out=str(tmp_path / "b"))
    assert not (tmp_path / "c").exists() and not (tmp_path / "b").exists()


def test_the_command_after_ctrl_c_is_the_same_without_fresh():
    import argparse

    from softargmax.cli import _resume_hint

    argv = ["reproduce", "translation", "--preset", "default", "--fresh", "--out", "my runs"]
    hint = _resume_hint(argparse.Namespace(experiment="translation"), argv)
    assert hint == "to continue from its checkpoints, run: softargmax reproduce translation --preset default --out 'my runs'"
    hint = _resume_hint(argparse.Namespace(experiment="bisection"), ["reproduce", "bisection", "--fre"])
    assert hint == "to run it again (it starts over), run: softargmax reproduce bisection"
