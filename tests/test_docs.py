"""Every ``python`` code block of the README and of ``docs/`` runs as written, and the
documentation builds without warnings (when Sphinx is installed: the ``docs`` extra)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_FILES = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")
)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for path in DOC_FILES:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        for i, m in enumerate(BLOCK.finditer(text)):
            line = text[: m.start()].count("\n") + 1
            yield pytest.param(m.group(1), id=f"{path}:{line}")


BLOCKS = list(_blocks())


def test_the_readme_has_python_blocks():
    assert sum(1 for b in BLOCKS if b.id.startswith("README.md")) >= 4


@pytest.mark.parametrize("code", BLOCKS)
def test_code_block_runs(code, tmp_path):
    # a fresh interpreter per block, as a reader would paste it; hub access is off.  Blocks
    # that start a process group run as the docs say: under torchrun, 2 processes on CPU
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    script = tmp_path / "block.py"
    script.write_text(code)
    cmd = [sys.executable, str(script)]
    if "init_process_group" in code:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
        env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_quickstart_prints_what_it_says():
    """The numbers printed in the README's quickstart comments are the ones the code prints."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    quick = BLOCK.search(text[text.index("## Quickstart"):]).group(1)
    proc = subprocess.run([sys.executable, "-c", quick], cwd=ROOT, capture_output=True, text=True, timeout=300)
    printed = [line.strip() for line in proc.stdout.splitlines()]
    claimed = re.findall(r"print\(.*\)\s+# (tensor\(.*\))", quick)
    assert len(claimed) >= 3 and printed[: len(claimed)] == claimed


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           os.path.join(ROOT, "docs"), str(tmp_path / "html")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
