"""Every ``python`` code block of the README and of ``docs/`` runs as written, and the
documentation builds without warnings (when Sphinx is installed: the ``docs`` extra)."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_FILES = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")
)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks():
    for path in DOC_FILES:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        for i, m in enumerate(BLOCK.finditer(text)):
            line = text[: m.start()].count("\n") + 1
            yield pytest.param(m.group(1), id=f"{path}:{line}")


BLOCKS = list(_blocks())


def test_the_readme_has_python_blocks():
    assert sum(1 for b in BLOCKS if b.id.startswith("README.md")) >= 4


# Runs the blocks given as JSON [seeds, [[id, code], ...]] on stdin, each in a fresh namespace as its
# own __main__, once per seed (Python's, NumPy's and torch's generators seeded before each run), in
# one interpreter (importing torch once instead of once per block); prints {id: the first failure's
# seed and traceback, or null} as JSON on the last line.
_RUNNER = r"""
import json, random, sys, traceback
import torch
seeds, blocks = json.load(sys.stdin)
results = {}
for name, code in blocks:
    results[name] = None
    for seed in seeds:
        if seed is not None:  # None: as pasted into a fresh interpreter, no seed set
            random.seed(seed)
            torch.manual_seed(seed)
            try:
                import numpy
                numpy.random.seed(seed)
            except ImportError:
                pass
        try:
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
        except BaseException:
            results[name] = f"with seed {seed}:\n" + traceback.format_exc()[-3000:]
            break
print()
print(json.dumps(results))
"""


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")


#: every example must be right whatever the random numbers: each block runs unseeded, then under these seeds
SEEDS = [None] + list(range(15))


def test_code_blocks_run():
    """Every block that needs no process group, as a reader would paste it: each in a fresh
    namespace, all in one interpreter (the hub is offline), unseeded and under 15 seeds, so that an
    example that fails for some random draws (a multi-hot row with no label, say) fails here."""
    blocks = [[b.id, b.values[0]] for b in BLOCKS if "init_process_group" not in b.values[0]]
    proc = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps([SEEDS, blocks]), cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(results) == sorted(name for name, _ in blocks)
    failed = {name: tb for name, tb in results.items() if tb is not None}
    assert not failed, "\n\n".join(f"{name}:\n{tb}" for name, tb in failed.items())


@pytest.mark.parametrize("code", [b for b in BLOCKS if "init_process_group" in b.values[0]])
def test_distributed_code_block_runs(code, tmp_path):
    """Blocks that start a process group run as the docs say: under torchrun, 2 processes on CPU.

    They are run once (a torchrun launch per seed would cost minutes), so they must draw their random
    numbers from seeded generators: every rank needs the same model, and one run then stands for all."""
    assert "manual_seed" in code, "a process-group example must seed its random numbers"
    script = tmp_path / "block.py"
    script.write_text(code)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(_env(), OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_quickstart_prints_what_it_says():
    """The numbers printed in the README's quickstart comments are the ones the code prints."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    quick = BLOCK.search(text[text.index("## Quickstart"):]).group(1)
    proc = subprocess.run([sys.executable, "-c", quick], cwd=ROOT, capture_output=True, text=True, timeout=300)
    printed = [line.strip() for line in proc.stdout.splitlines()]
    claimed = re.findall(r"print\(.*\)\s+# (tensor\(.*\))", quick)
    assert len(claimed) >= 3 and printed[: len(claimed)] == claimed


def test_the_readme_states_one_running_time_for_the_default_runs():
    """"Set up and run" and the Experiments section give the same estimate for the main job."""
    text = " ".join(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split())
    main_job = re.search(r"Main job — .*? output layers, ([^;]*);", text).group(1)
    default = re.search(r"`default` is sized for a CPU with two cores \(([^)]*)\)", text).group(1)
    assert main_job == default == "about 15–20 minutes on 2 CPU cores"


def test_docs_build_without_warnings(docs_build):
    """``sphinx-build -W`` (the ``docs_build`` fixture of conftest.py, shared with the browser test of
    test_docs_browser.py): no warning, and every script of the examples gallery runs."""
    html, returncode, stderr = docs_build
    assert returncode == 0, stderr
    assert (html / "index.html").exists()


def test_the_api_pages_render_every_public_object(docs_build):
    """Every public module, function and class (the list of test_doctests.py) has an entry in the built
    site's index (``objects.inv``), under its public name or the name of the module that defines it:
    the API pages render every docstring that test_doctests.py checks."""
    import posixpath
    import types

    from sphinx.util.inventory import InventoryFile
    from test_doctests import PUBLIC

    html, returncode, stderr = docs_build
    assert returncode == 0, stderr
    with open(html / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", posixpath.join)
    documented = {name for entries in inventory.values() for name in entries}
    missing = []
    for name, (obj, _) in PUBLIC.items():
        if obj is None:  # an optional dependency is missing
            continue
        names = {name} if isinstance(obj, types.ModuleType) else {name, f"{obj.__module__}.{obj.__qualname__}"}
        if not names & documented:
            missing.append(name)
    assert not missing, f"public objects not rendered by docs/api/*.rst: {missing}"
