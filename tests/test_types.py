"""The type checker passes on ``src/softargmax`` as ``pyproject.toml`` configures it (mypy is in the test extra).

mypy runs as CI runs it: from the repository root, and with no cache (CI starts from a fresh clone),
so the result does not depend on an earlier run on this machine.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "softargmax"


def _mypy(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is not installed (it is in the test extra)")
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", os.devnull, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def test_mypy_reports_no_error():
    proc = _mypy()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout, proc.stdout[-2000:]


def test_the_configuration_asks_for_annotations(tmp_path):
    # the strictness is the configuration's, not a default: an unannotated function is an error
    bad = tmp_path / "unannotated.py"
    bad.write_text("def double(x):\n    return 2 * x\n", encoding="utf-8")
    proc = _mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[no-untyped-def]" in proc.stdout, proc.stdout


def test_every_type_ignore_names_its_error_code_and_says_why():
    ignore = re.compile(r"#\s*type:\s*ignore(.*)$")
    explained = re.compile(r"\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\S")
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found = ignore.search(line)
            if found and not explained.match(found.group(1)):
                bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bad, "a `# type: ignore[code]` needs a comment after it that says why:\n" + "\n".join(bad)


def test_the_package_ships_its_py_typed_marker():
    assert (SRC / "py.typed").is_file()
    package_data = re.search(r"^\[tool\.setuptools\.package-data\]\n(?:#.*\n)*softargmax = \[([^\]]*)\]",
                             (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.MULTILINE)
    assert package_data is not None and '"py.typed"' in package_data.group(1)
