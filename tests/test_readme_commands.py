"""Every shell command that README.md and docs/install.md show is accounted for, as a new user would run it
in a fresh virtual environment on a fresh clone.  Each one is

* ``ci``: run as written by CI (``.ci/run``, whose text the test reads: the fresh environments, the installs,
  the wheels, the test command, the documentation's environment);
* ``test``: run, or run in its quick form, by a named test of this suite;
* ``here``: checked in a cheap form by a named test of this file (the extras it names exist, the versions agree);
* ``skip``: not run, for the reason given (a GPU, a download, a placeholder path, minutes of work).

A command that none of the entries of ``ACCOUNTED`` matches fails the test (a new command in the README is run or
named), and so does an entry that matches no command (a command removed from the README leaves no stale entry).
The ``python`` blocks are run by test_docs.py, and the documentation is built by its ``docs_build`` fixture (in
CI, in the fresh environment that the README's documentation command installs).
"""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md", os.path.join("docs", "install.md")]
#: what a command line starts with, in a fenced shell block or in inline code
COMMAND_WORDS = {"pip", "python", "python3", "sphinx-build", "softargmax", "apt-get", "pytest", "bash", "torchrun",
                 "."}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
SHELL_FENCES = {"bash", "sh", "shell", "console", "text"}  # text: the install lines shown with a comment each
EXPERIMENT_TABLE_ROW = r"softargmax reproduce [\w-]+ --preset \{smoke(,\w+)+\}"

#: (the command, as a regular expression matched in full; how it is accounted for; the evidence: for ``ci`` the
#: text of .ci/run that runs it (None: the command itself), for ``test`` the test as ``file::function``, for
#: ``here`` the test of this file; why)
ACCOUNTED = [
    # the fresh environments of "Set up and run" and docs/install.md
    (r"python3 -m venv \.venv", "ci", None, "CI starts from a fresh environment"),
    (r"\. \.venv/bin/activate", "ci", None, "CI starts from a fresh environment"),
    (r"pip install torch==2\.13\.0", "ci", None, "the local CPU build"),
    (r'pip install -c requirements/constraints\.txt -e "\.\[test\]" -e "\./jax\[test\]"', "ci", None,
     "the test environment"),
    (r"python -m pytest tests -q -n 2", "ci", None, "the test command"),
    (r'pip install -c requirements/constraints\.txt -e "\.\[docs\]"', "ci", None,
     "the documentation's own fresh environment, in which the test suite builds the documentation"),
    (r"sphinx-build -W -b html docs docs/_build/html", "test", "tests/test_docs.py::test_docs_build_without_warnings",
     "the docs_build fixture runs it (python -m sphinx -W, into a temporary folder; in CI with the documentation's "
     "fresh environment)"),
    (r'pip install -c requirements/constraints\.txt -e "\.\[experiments\]"', "here",
     "test_the_fresh_setups_keep_the_pinned_torch", "the extra exists and the install keeps torch 2.13.0"),
    (r"softargmax reproduce translation --preset default", "skip", None,
     "the main job (15-20 minutes); the smoke preset runs the same path (tests/test_translation.py)"),
    # installs into the reader's own environment
    (r"pip install /path/to/softargmax", "ci", '"$clean/bin/pip" install -q -c requirements/constraints.txt '
     '"$wheel_dir"/softargmax-*.whl', "a placeholder path: CI installs the wheel built from the checkout in a "
     "clean environment"),
    (r"pip install /path/to/softargmax/jax", "ci", '"$jax_wheel_dir"/softargmax_jax-*.whl',
     "a placeholder path: CI installs the JAX package's wheel in a clean environment"),
    (r"pip install softargmax-0\.1\.0-py3-none-any\.whl", "ci", '"$wheel_dir"/softargmax-*.whl',
     "CI builds this wheel and installs it (test_the_wheel_file_name_is_the_version checks the name)"),
    (r"pip wheel --no-deps \. -w dist", "ci", "pip wheel -q --no-deps --no-build-isolation . -w",
     "CI builds the wheel so (without build isolation: the build requirements are the environment's)"),
    (r'pip install "softargmax @ git\+<repository URL>"', "skip", None, "a placeholder URL, and a download"),
    (r"pip install torch --index-url https://download\.pytorch\.org/whl/cpu", "skip", None,
     "a download from PyTorch's index (CI installs the local build of the same version)"),
    (r"pip install torch", "skip", None, "a CUDA build of PyTorch, several GB from PyPI"),
    (r'pip install -e "\.\[(hf|gpu)\]"|pip install "/path/to/softargmax\[hf\]"|pip install "softargmax\[NAME\]"',
     "here", "test_the_extras_named_exist", "an extra added to the reader's own environment: it exists (pip only "
     "warns about an unknown extra); the test environment has these packages"),
    (r"apt-get install chromium", "ci", "apt-get install -y -qq chromium", "for tests/test_docs_browser.py"),
    # the tools
    (EXPERIMENT_TABLE_ROW, "here", "test_every_experiment_of_the_table_has_a_smoke_test",
     "each experiment's smoke preset runs in the tests; the others take minutes to hours (or a GPU)"),
    (r"torchrun --nproc_per_node N( -m softargmax reproduce translation …)?", "test",
     "tests/test_translation_ddp.py::test_reproduce_translation_under_torchrun", "with N = 2, the smoke preset"),
    (r"softargmax bench", "test", "tests/test_cli.py::test_bench_quick_writes_schema",
     "its --quick form (the full benchmark takes minutes)"),
    (r"python benchmarks/run_cpu_operators\.py", "skip", None,
     "the CPU benchmark behind the README's speed table: minutes on a quiet machine, its results are committed"),
    (r"pytest -m gpu", "skip", None, "needs a CUDA GPU (CI has none)"),
    (r"bash benchmarks/gpu_all\.sh OUT", "skip", None, "needs a CUDA GPU; its dry run is tested (tests/test_gpu_all.py)"),
    (r"softargmax reproduce( …)?|pip install", "skip", None, "a command's name in a sentence, not a command line"),
]


def _commands():
    """``(file:line, command)`` for each command of a fenced shell block (a line, split at ``&&``, its comment
    dropped) and each inline code span that starts with a command word."""
    found = []
    for path in FILES:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        for m in FENCE.finditer(text):
            if m.group(1) not in SHELL_FENCES:
                continue
            first = text[: m.start(2)].count("\n") + 1
            for i, line in enumerate(m.group(2).splitlines()):
                for part in re.split(r"\s{2,}#", line)[0].split(" && "):
                    if part.strip():
                        found.append((f"{path}:{first + i}", part.strip()))
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # the blocks out, the line numbers kept
        for m in re.finditer(r"`([^`]+)`", prose):
            words = m.group(1).split()  # a span may run over a line break
            if len(words) > 1 and words[0] in COMMAND_WORDS:
                found.append((f"{path}:{prose[: m.start()].count(chr(10)) + 1}", " ".join(words)))
    return found


COMMANDS = _commands()


def _fenced_lines():
    """Each line of the fenced shell blocks: the fresh setups are one line each."""
    for path in FILES:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        for m in FENCE.finditer(text):
            if m.group(1) in SHELL_FENCES:
                yield from m.group(2).splitlines()


def _plain(command):
    """A command without what .ci/run adds to the documented form: pip's ``-q`` and ``--no-compile`` (the wheels'
    clean environments skip byte-compiling), the lock that keeps two builds in the source tree apart, and the path
    of a clean environment's pip (the documentation's, the wheels' checks')."""
    command = re.sub(r'flock "\$\w+" ', "", command)
    command = re.sub(r'"\$\w+/bin/pip" ', "pip ", command)
    return re.sub(r" (-q|--no-compile)\b", "", command)


def _ci_text():
    return _plain(open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read())


def _extras(pyproject):
    """The extras of a pyproject.toml."""
    import tomllib

    with open(os.path.join(ROOT, pyproject), "rb") as f:
        return set(tomllib.load(f)["project"]["optional-dependencies"])


def test_the_documents_have_commands():
    assert len(COMMANDS) >= 30
    assert any(c.startswith("sphinx-build") for _, c in COMMANDS)  # the documentation's command, in a block
    assert any(w.startswith("docs/install.md") for w, _ in COMMANDS)


def test_every_command_is_run_covered_or_skipped():
    unaccounted, ambiguous = [], []
    used = set()
    for where, command in COMMANDS:
        entries = [i for i, (pattern, *_) in enumerate(ACCOUNTED) if re.fullmatch(pattern, command)]
        if not entries:
            unaccounted.append(f"{where}: {command}")
        elif len(entries) > 1:
            ambiguous.append(f"{where}: {command} ({entries})")
        used.update(entries)
    assert not unaccounted, "commands that nothing runs, covers or skips (add them to ACCOUNTED):\n" + "\n".join(
        unaccounted)
    assert not ambiguous, ambiguous
    stale = [ACCOUNTED[i][0] for i in range(len(ACCOUNTED)) if i not in used]
    assert not stale, f"entries that match no command of {FILES}: {stale}"


@pytest.mark.parametrize("pattern, how, evidence, why", ACCOUNTED, ids=[e[0][:40] for e in ACCOUNTED])
def test_the_evidence_exists(pattern, how, evidence, why):
    """Each ``ci`` command is in .ci/run, each ``test`` names an existing test, each ``here`` a test of this file,
    and a ``skip`` gives its reason."""
    assert how in {"ci", "test", "here", "skip"} and why
    if how == "ci":
        documented = [c for _, c in COMMANDS if re.fullmatch(pattern, c)]
        for command in documented:
            wanted = _plain(evidence or command)
            assert wanted in _ci_text(), f".ci/run does not run {wanted!r} (for {command!r})"
    elif how == "test":
        path, name = evidence.split("::")
        source = open(os.path.join(ROOT, path), encoding="utf-8").read()
        assert re.search(rf"^def {name}\(", source, re.MULTILINE), evidence
    elif how == "here":
        assert callable(getattr(sys.modules[__name__], evidence, None)), evidence
    else:
        assert evidence is None


def test_the_fresh_setups_keep_the_pinned_torch():
    """A fresh setup (one line: a new environment, ``pip install torch==2.13.0``, then the project) installs
    everything after PyTorch through requirements/constraints.txt, which pins that version, so that no extra
    pulls another PyTorch (a CUDA build from PyPI); the extras it names exist."""
    setups = [line for line in _fenced_lines() if "pip install torch==2.13.0" in line]
    assert len(setups) >= 3  # the README's two (the main job, the tests) and the documentation's (docs/install.md)
    pins = open(os.path.join(ROOT, "requirements", "constraints.txt"), encoding="utf-8").read()
    assert re.search(r"^torch==2\.13\.0$", pins, re.MULTILINE)
    for line in setups:
        assert line.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "), line
        later = line.split("pip install torch==2.13.0", 1)[1].split(" && ")
        for command in (c for c in later if c.startswith("pip install")):
            assert command.startswith("pip install -c requirements/constraints.txt "), command
    test_the_extras_named_exist()


def test_the_extras_named_exist():
    """Every extra the two documents name (``.[x]``, ``softargmax[x, y]``, ``/path/to/softargmax[x]``,
    ``./jax[x]``, the install guide's table) is an extra of pyproject.toml or jax/pyproject.toml: pip only warns
    about an unknown one and installs without it.  The guide's table lists them all."""
    ours, jax = _extras("pyproject.toml"), _extras(os.path.join("jax", "pyproject.toml"))
    assert {"experiments", "hf", "docs", "test"} <= ours and "test" in jax
    named = []
    for path in FILES:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        for package, extras in re.findall(r"([\w./-]*)\[([\w, -]+)\]", text):
            if package in {".", "softargmax", "/path/to/softargmax", "./jax", "/path/to/softargmax/jax"}:
                for extra in (e.strip() for e in extras.split(",")):
                    if extra != "NAME":
                        named.append((path, package, extra))
    assert len(named) >= 6
    unknown = [n for n in named if n[2] not in (jax if n[1].endswith("jax") else ours)]
    assert not unknown, unknown
    guide = open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8").read()
    assert set(re.findall(r"^\| `([\w-]+)` \|", guide, re.MULTILINE)) == ours


def test_the_wheel_file_name_is_the_version():
    """The install guide's wheel is named for the version that pyproject.toml builds."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    names = [c for _, c in COMMANDS if re.search(r"softargmax-[\w.]+-py3-none-any\.whl", c)]
    assert names and all(f"softargmax-{version}-py3-none-any.whl" in c for c in names), (version, names)


def test_every_experiment_of_the_table_has_a_smoke_test():
    """Each ``softargmax reproduce NAME --preset {smoke,...}`` of the README's table is an experiment of the
    command line, and a test runs its smoke preset."""
    from softargmax.cli import build_parser

    rows = [c for _, c in COMMANDS if re.fullmatch(EXPERIMENT_TABLE_ROW, c)]
    assert len(rows) >= 10
    tests = "\n".join(open(os.path.join(ROOT, "tests", f), encoding="utf-8").read()
                      for f in sorted(os.listdir(os.path.join(ROOT, "tests"))) if f.endswith(".py"))
    parser = build_parser()
    missing = []
    for row in rows:
        name = row.split()[2]
        parser.parse_args(["reproduce", name, "--preset", "smoke"])  # an experiment with a smoke preset
        runs = (rf'smoke_run\("{re.escape(name)}"', rf'"reproduce", "{re.escape(name)}", "--preset", "smoke"')
        if not any(re.search(r, tests) for r in runs):
            missing.append(name)
    assert not missing, f"experiments whose smoke preset no test runs: {missing}"


def test_the_readme_has_two_fresh_machine_commands():
    """The README keeps exactly two copy-paste commands for a fresh machine: the main job and the tests (the
    documentation's own fresh setup is in docs/install.md)."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    setups = [line for m in FENCE.finditer(text) if m.group(1) in SHELL_FENCES for line in m.group(2).splitlines()
              if line.startswith("python3 -m venv")]
    assert len(setups) == 2, setups
    assert setups[0].endswith("softargmax reproduce translation --preset default")
    assert setups[1].endswith("python -m pytest tests -q -n 2")
