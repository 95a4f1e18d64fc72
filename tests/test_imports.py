"""The package's import graph, read from the source: no cycle, and imports run one way.

The folders are the layers: _utils -> divergences -> backends -> solvers -> operators -> losses
-> nn / compat / integrations -> tools; a module may import from its own folder or a lower
one, never from a higher one, and the graph of every import (module level and inside
functions) has no cycle.  The paths of earlier releases (``softargmax.fdiv``, ...) still
import, as the very same modules (``softargmax._moved``).
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "softargmax"

#: the folders are the layers, lowest first: a module's layer is the first component of its path under
#: src/softargmax (its folder, or its own name for the modules at the root); every one must be listed
LAYERS = [
    ("utilities", {"_utils"}),
    ("mathematics", {"divergences"}),
    ("fused backends", {"backends"}),
    ("reference solvers", {"solvers"}),
    ("operators", {"operators"}),
    ("losses", {"losses"}),
    ("modules", {"nn", "compat", "integrations"}),
    ("tools", {"analysis", "bench", "cli", "__main__", "experiments", "_moved", "__init__"}),
]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for i, (_, names) in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"softargmax.{module} is in no layer of tests/test_imports.py: add it to LAYERS")


def _imports(path: Path, module: str):
    """Intra-package modules imported by ``path`` (relative and absolute imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    if module == "__init__":
        package = []
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else list(package)
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "softargmax":
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:  # "from .pkg import submodule" imports the submodule, else a name of .pkg
                candidate = target + [alias.name]
                path = ROOT / Path(*candidate)
                if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
                    out.add(".".join(candidate))
                elif target:
                    out.add(".".join(target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "softargmax":
                    out.add(".".join(parts[1:]) or "__init__")
    return {m for m in out if m != module}


def _graph():
    graph = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = _module_name(path)
        graph[name] = _imports(path, name)
    return graph


def test_every_module_has_a_layer():
    for name in _graph():
        _layer(name)


def test_imports_run_one_way():
    bad = []
    for name, deps in _graph().items():
        for dep in deps:
            if _layer(dep) > _layer(name):
                bad.append(f"{name} ({LAYERS[_layer(name)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def _cycle(graph):
    """One import cycle as a list of modules, or ``None``."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle():
    graph = _graph()
    # the package root re-exports everything and subpackage roots their members: not edges of a cycle
    core = {n: {d for d in deps if d != "__init__"} for n, deps in graph.items() if n != "__init__"}
    cycle = _cycle(core)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_can_fail():
    """The checker finds a planted cycle and a planted upward import."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _layer("solvers.threshold") < _layer("losses.functional")
    with pytest.raises(AssertionError):
        _layer("not_a_module")


def _import_linter(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter")
    code = "import sys; from importlinter.cli import import_linter; sys.argv[0] = 'import-linter'; import_linter()"
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT.parents[1], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_import_linter_contract_is_kept():
    """The layers contract of pyproject.toml (``lint-imports``), an independent checker of the same rule."""
    proc = _import_linter("lint", "--no-cache")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_the_picture_in_the_docs_is_the_current_import_graph():
    """docs/_static/architecture.dot (drawn into architecture.svg) is what import-linter draws now."""
    proc = _import_linter("drawgraph", "softargmax", "--show-import-totals")
    assert proc.returncode == 0, proc.stderr[-2000:]
    committed = (ROOT.parents[1] / "docs" / "_static" / "architecture.dot").read_text()
    assert proc.stdout == committed, "redraw the picture: see docs/architecture.md"


def _private_names_imported():
    """``(module, name)`` for every private name (``_x``, not a module) imported from another module."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("softargmax"))):
                continue
            if node.level:
                folder = path.parent
                for _ in range(node.level - 1):
                    folder = folder.parent
            else:
                folder = ROOT.parent
            folder = folder.joinpath(*(node.module or "").split(".")) if node.module else folder
            for alias in node.names:
                is_module = (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir()
                if alias.name.startswith("_") and not alias.name.startswith("__") and not is_module:
                    found.append((module, alias.name))
    return found


def test_no_private_name_crosses_a_module():
    """The underscore means "this module only": a name another module needs is public (and documented).
    Private *modules* (``_autograd``, ``_library_ops``) are imported within their own layer."""
    assert _private_names_imported() == []
