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


def test_bad_arguments():
    import pytest

    with pytest.raises(SystemExit):
        main(["bench", "--shapes", "64by32"])
    with pytest.raises(ValueError, match="ops: unknown"):
        main(["bench", "--quick", "--ops", "nope"])


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
    assert main(args) == 0
    assert "continuing from the training checkpoints" in capsys.readouterr().out and ckpt.exists()
    assert main(args + ["--resume"]) == 0 and ckpt.exists()
    # every run writes its own log next to the report
    log = (out / "log.txt").read_text()
    assert "wrote" in log and "report.md" in log
    assert main(args + ["--fresh"]) == 0 and not (out / "runs").exists()
    with pytest.raises(SystemExit):
        main(args + ["--resume", "--fresh"])


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
