"""The ruff configuration of ``pyproject.toml`` holds for the whole tree (when ruff is installed)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_check_passes():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the test extra)")
    proc = subprocess.run([ruff, "check", "src", "tests", "benchmarks", "docs", "examples", "jax"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
