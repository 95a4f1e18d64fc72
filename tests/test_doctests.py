"""The docstrings of the public surface: their examples run, and they share one layout.

The public surface is listed from the code, not by hand (:func:`public_objects`): the modules
``softargmax``, ``softargmax.nn``, ``softargmax.losses``, ``softargmax.losses.distributed``,
``softargmax.divergences``, every public module of ``softargmax.operators`` (``softargmax.sampling``,
``softargmax.alpha_relu_tau`` and ``softargmax.export`` among them),
``softargmax.integrations.huggingface``, ``softargmax.compat.entmax`` and ``softargmax.analysis``,
and every module, function and class named in their ``__all__`` (constants such as ``MAPPINGS`` are
described in their module's docstring and are not listed); and every function and class that the
API pages ``docs/api/*.rst`` render (:func:`api_page_names`: ``softargmax.solvers.threshold.solve``,
the whole ``__all__`` of a module rendered with a bare ``:members:``), so that whatever the docs
show is held to the layout.

* ``test_examples_run``: the ``>>>`` examples of each object (of a class, its methods' too) run with
  :mod:`doctest` (``NORMALIZE_WHITESPACE | ELLIPSIS``), each object in a fresh namespace (the
  examples import what they use), with torch's random state, print options, default dtype and
  grad mode restored afterwards.  A failure names the object and shows the failing example.  The
  examples of the distributed losses start a process group of one (``gloo``, an in-memory store)
  and must destroy it: one left behind is destroyed and fails the test.
* ``test_layout``: every public function and class has a one-line summary, ``Args:`` naming each
  parameter (with its default, or "as in" another function's; a dataclass may describe its fields
  under ``Attributes:``), ``Returns:`` (or ``Yields:``) when it returns a
  value, ``Shape:`` when tensors go in or out (an ``nn.Module``, or a function with a ``Tensor`` annotation),
  ``Examples:`` with ``>>>`` lines, the math (``:math:`` or ``.. math::``) and ``References:``
  with a link (the few plumbing functions without mathematics or a paper are listed in
  :data:`NO_MATH` and :data:`NO_REFERENCES`, each with the reason).
* ``test_module_summary``: every public module's docstring opens with a one-line summary.
* ``test_no_formula_in_inline_code``: formulas are ``:math:``, never ``inline code`` (the docs'
  browser test fails on those; this finds them without building the docs).

Optional dependencies: the objects of a module listed in :data:`OPTIONAL` (the Hugging Face
integration needs ``transformers``) are skipped, with the reason, when the package is missing;
the ``test`` extra installs them, so CI runs every example.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import importlib
import importlib.util
import inspect
import io
import pathlib
import pkgutil
import re
import textwrap
import types

import pytest
import torch

#: the modules whose ``__all__`` is the public surface (the public modules of softargmax.operators are added)
PUBLIC_MODULES = ("softargmax", "softargmax.nn", "softargmax.losses", "softargmax.losses.distributed",
                  "softargmax.divergences", "softargmax.integrations.huggingface", "softargmax.compat.entmax",
                  "softargmax.analysis")
#: the API pages: a function or class they render (``autofunction``, ``autoclass``, an ``automodule``'s
#: ``:members:``) is public too (``softargmax.solvers.threshold.solve``), whatever its layer
API_PAGES = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api"
#: modules that need an optional dependency: their objects are skipped when it is not installed
OPTIONAL = {"softargmax.integrations.huggingface": "transformers"}

#: plumbing with no formula to state (the reason is given)
NO_MATH = {
    "softargmax.losses.check_class_indices": "reads a validation flag",
    "softargmax.integrations.huggingface.revert": "undoes apply(): restores a model's forward",
    "softargmax.integrations.huggingface.register": "registers attention functions with Transformers",
    "softargmax.operators.mappings.check_mapping": "validates a mapping name",
    "softargmax.operators.budget.check_budget": "validates an argument",
    "softargmax.analysis.collect_attention": "records attention weights with hooks",
    "softargmax.divergences.evaluator_of": "returns the evaluator object of a divergence",
    "softargmax.divergences.spec_of": "returns the picklable description of a divergence",
    "softargmax.losses.distributed.is_dtensor": "a type test",
}
#: plumbing that implements no paper (the reason is given)
NO_REFERENCES = {
    "softargmax.losses.check_class_indices": "reads a validation flag",
    "softargmax.integrations.huggingface.revert": "undoes apply(): restores a model's forward",
    "softargmax.integrations.huggingface.register": "registers attention functions with Transformers",
    "softargmax.operators.mappings.check_mapping": "validates a mapping name",
    "softargmax.operators.budget.check_budget": "validates an argument",
    "softargmax.divergences.evaluator_of": "returns the evaluator object of a divergence",
    "softargmax.divergences.spec_of": "returns the picklable description of a divergence",
    "softargmax.losses.distributed.is_dtensor": "a type test",
    "softargmax.losses.distributed.dtensor_apply": "runs a function on a DTensor's local shards",
    "softargmax.losses.distributed.local_map_rows": "runs a function on a DTensor's local shards",
    "softargmax.losses.distributed.CommStats": "a record of the collectives counted",
    "softargmax.nn.activations.not_scriptable": "builds an error message",
}

FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def _public_modules():
    import softargmax.operators

    names = list(PUBLIC_MODULES)
    names += [f"softargmax.operators.{m.name}" for m in pkgutil.iter_modules(softargmax.operators.__path__)
              if not m.name.startswith("_")]
    return ["softargmax.operators"] + names


DIRECTIVE = re.compile(r"^\.\. (automodule|autofunction|autoclass):: (\S+)")


def api_page_names():
    """``[(module, name or None)]`` of what ``docs/api/*.rst`` renders: a function or class named by
    ``autofunction``/``autoclass`` or in an ``automodule``'s ``:members:`` list, and ``(module, None)``
    for an ``automodule`` whose bare ``:members:`` renders its whole ``__all__`` (an ``automodule``
    without the option renders its docstring only: docs/conf.py sets no default)."""
    names = []
    for page in sorted(API_PAGES.glob("*.rst")):
        module, options = None, []
        for line in page.read_text(encoding="utf-8").splitlines() + [""]:
            m = DIRECTIVE.match(line)
            if m or not line.strip():  # a directive ends at the next one or at a blank line
                if module is not None:
                    members = [o[len(":members:"):].split(",") for o in options if o.startswith(":members:")]
                    for listed in members:
                        listed = [n.strip() for n in listed if n.strip()]
                        names += [(module, n) for n in listed] if listed else [(module, None)]
                module, options = None, []
            if m:
                kind, target = m.groups()
                if kind == "automodule":
                    module = target
                else:
                    names.append(tuple(target.rsplit(".", 1)))
            elif module is not None and line.strip():
                options.append(line.strip())
    return names


def public_objects():
    """``{public name: (object, the module it is listed in)}`` of every public module, function and
    class, each under the first name found (``softargmax.sparsemax``, not its defining module's
    ``softargmax.operators.entmax.sparsemax``).  A module whose optional dependency is missing gives
    ``{name: (None, the dependency)}``."""
    objects, seen = {}, set()

    def add(name, obj, module):
        if id(obj) not in seen:
            seen.add(id(obj))
            objects[name] = (obj, module)

    queue = _public_modules()
    while queue:
        modname = queue.pop(0)
        try:
            module = importlib.import_module(modname)
        except ImportError:
            dependency = OPTIONAL.get(modname)
            if dependency is None or importlib.util.find_spec(dependency) is not None:
                raise
            objects[modname] = (None, dependency)
            continue
        add(modname, module, modname)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if isinstance(obj, types.ModuleType):
                if obj.__name__.startswith("softargmax.") and obj.__name__ not in queue:
                    queue.append(obj.__name__)
            elif inspect.isfunction(obj) or inspect.isclass(obj):
                add(f"{modname}.{attr}", obj, modname)
    for modname, listed in api_page_names():
        try:
            module = importlib.import_module(modname)
        except ImportError:
            if not any(modname.startswith(m) and importlib.util.find_spec(d) is None for m, d in OPTIONAL.items()):
                raise
            continue  # its optional dependency is missing (the module is listed above, to be skipped)
        for attr in getattr(module, "__all__", ()) if listed is None else [listed]:
            obj = getattr(module, attr)
            if inspect.isfunction(obj) or inspect.isclass(obj):  # not the constants (ITERATIONS)
                add(f"{modname}.{attr}", obj, modname)
    return objects


PUBLIC = public_objects()
NAMES = sorted(PUBLIC)
CALLABLES = [n for n in NAMES if PUBLIC[n][0] is not None and not isinstance(PUBLIC[n][0], types.ModuleType)]


def _object(name):
    obj, extra = PUBLIC[name]
    if obj is None:
        pytest.skip(f"{name} needs the optional dependency {extra!r}, which is not installed")
    return obj


def test_the_public_surface_is_listed():
    """The listing finds the surface (an empty or truncated list would let every other test pass)."""
    for name in ["softargmax.sparsemax", "softargmax.entmax_loss", "softargmax.nn.EntmaxLoss",
                 "softargmax.nn.SparseMultiheadAttention", "softargmax.divergences.AlphaDivergence",
                 "softargmax.operators.sampling", "softargmax.operators.alpha_relu_tau.gaussian",
                 "softargmax.compat.entmax.EntmaxBisectLoss", "softargmax.analysis.head_density",
                 "softargmax.integrations.huggingface", "softargmax.losses.distributed.fenchel_young_loss",
                 "softargmax.solvers.threshold.solve", "softargmax.nn.activations.not_scriptable"]:
        assert name in PUBLIC, name
    assert len(CALLABLES) >= 90


# ------------------------------------------------------------------------------------------------
# the examples run


def _doctests(name, obj):
    module = obj if isinstance(obj, types.ModuleType) else inspect.getmodule(obj)
    finder = doctest.DocTestFinder(exclude_empty=True, recurse=inspect.isclass(obj))
    return finder.find(obj, name, module=module, globs={"__name__": "__main__"})


@pytest.mark.parametrize("name", NAMES)
def test_examples_run(name):
    obj = _object(name)
    tests = _doctests(name, obj)
    if not tests:
        assert isinstance(obj, types.ModuleType), f"{name}: no >>> example (test_layout says which sections)"
        return
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    torch.set_printoptions(profile="default")
    try:
        with torch.random.fork_rng(devices=[]):
            for test in tests:
                runner.run(test, out=out.write, clear_globs=True)
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.set_printoptions(profile="default")
        left_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        if left_group:  # an example of the distributed losses started a group and did not end it
            torch.distributed.destroy_process_group()
    result = runner.summarize(verbose=False)
    if result.failed:
        pytest.fail(f"{name}: {result.failed} of {result.attempted} examples failed\n{out.getvalue()}", pytrace=False)
    assert not left_group, f"{name}: the examples start a process group and do not destroy it"


# ------------------------------------------------------------------------------------------------
# one layout

SECTION = re.compile(r"^(Args|Arguments|Returns|Yields|Raises|Shape|Examples|References|Note|Notes|Attributes|"
                     r"Warning|See Also|Example):\s*$")


def _sections(doc):
    """``{section title: its text}`` of a cleaned (``inspect.cleandoc``) Google-style docstring;
    the text before the first section is under ``""``."""
    sections, title = {"": []}, ""
    for line in doc.splitlines():
        m = SECTION.match(line)
        if m:
            title = m.group(1)
            sections[title] = []
        else:
            sections[title].append(line)
    return {k: textwrap.dedent("\n".join(v)).strip("\n") for k, v in sections.items()}


ENTRY = re.compile(r"^([\\*\w][\\*\w, ]*?)(\s*\([^)]*\))?:(\s|$)")


def _arg_entries(args_text):
    """``{parameter name: the text of its entry}`` of an ``Args:`` section; an entry may name several
    parameters (``q, temperature: as in ...``)."""
    entries, current = {}, None
    for line in args_text.splitlines():
        m = ENTRY.match(line) if line and not line[0].isspace() else None
        if m:
            current = [line]
            for part in m.group(1).split(","):
                entries[part.strip().replace("\\", "").lstrip("*")] = current
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in entries.items()}


def _gives_default(entry, default):
    """An entry states its parameter's default ("Default: ``-1``"), refers to another function's ("as in
    :func:`...`"), or calls an argument whose default is ``None`` optional."""
    return bool(re.search(r"default|as in", entry, re.IGNORECASE) or (default is None and re.search(r"optional", entry, re.IGNORECASE)))


def _parameters(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values() if p.name not in ("self", "cls")]


def _returns_value(func):
    """Whether a function returns something other than None: its annotation, else its code."""
    func = inspect.unwrap(func)
    ann = inspect.signature(func).return_annotation
    if ann is not inspect.Signature.empty:
        return ann not in (None, "None")
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, (ast.Yield, ast.YieldFrom)):
                return True
            if isinstance(child, ast.Return) and child.value is not None and not (
                    isinstance(child.value, ast.Constant) and child.value.value is None):
                return True
            if walk(child):
                return True
        return False

    return walk(tree.body[0])


def _takes_tensors(obj, params):
    """Tensors go in or out: a module, or a function with a parameter or result annotated as a tensor
    (a function of tensors passed as an argument, ``Callable[[Tensor], Tensor]``, does not count)."""
    if inspect.isclass(obj):
        return issubclass(obj, torch.nn.Module)
    annotations = [p.annotation for p in params] + [inspect.signature(obj).return_annotation]
    texts = [re.sub(r"Callable\[.*\]", "", a if isinstance(a, str) else repr(a)) for a in annotations
             if a is not inspect.Parameter.empty]
    return any("Tensor" in t for t in texts)


def _layout_problems(name, obj):
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and obj.__doc__ is None:
        doc = ""  # not the base class's docstring
    problems = []
    lines = doc.splitlines()
    if not lines or not lines[0].strip():
        return ["no docstring"]
    if len(lines) > 1 and lines[1].strip():
        problems.append("the summary is not one line followed by a blank line")
    sections = _sections(doc)
    examples = sections.get("Examples", "")
    if ">>>" not in examples:
        problems.append("no 'Examples:' section with >>> lines")
    params = _parameters(obj)
    # a dataclass's constructor takes its fields: they may be described under "Attributes:"
    args = "Attributes" if dataclasses.is_dataclass(obj) and "Args" not in sections else "Args"
    if params:
        if args not in sections:
            problems.append("no 'Args:' section")
        else:
            entries = _arg_entries(sections[args])
            for p in params:
                entry = entries.get(p.name)
                if entry is None:
                    problems.append(f"'{args}:' does not describe {p.name!r}")
                elif p.default is not inspect.Parameter.empty and not _gives_default(entry, p.default):
                    problems.append(f"'{args}:' does not give the default of {p.name!r}")
    if not inspect.isclass(obj) and _returns_value(obj) and not ({"Returns", "Yields"} & set(sections)):
        problems.append("no 'Returns:' section")
    if _takes_tensors(obj, params) and "Shape" not in sections:
        problems.append("no 'Shape:' section")
    if name not in NO_MATH and ":math:" not in doc and ".. math::" not in doc:
        problems.append("no formula (:math: or .. math::)")
    if name not in NO_REFERENCES and "https://" not in sections.get("References", ""):
        problems.append("no 'References:' section with a link")
    return problems


MODULES = [n for n in NAMES if isinstance(PUBLIC[n][0], types.ModuleType)]


@pytest.mark.parametrize("name", MODULES)
def test_module_summary(name):
    """A public module's docstring opens with a one-line summary (its math, algorithm and references
    follow in prose; its functions and classes carry the sections)."""
    lines = (inspect.getdoc(_object(name)) or "").splitlines()
    assert lines and lines[0].strip() and (len(lines) == 1 or not lines[1].strip()), \
        f"{name}: the module docstring does not open with a one-line summary"


@pytest.mark.parametrize("name", CALLABLES)
def test_layout(name):
    problems = _layout_problems(name, _object(name))
    if problems:
        pytest.fail(f"{name}: " + "; ".join(problems), pytrace=False)


def test_the_exemptions_are_public_names():
    for name in set(NO_MATH) | set(NO_REFERENCES):
        assert name in PUBLIC, f"{name} is exempted but is not a public name"


#: inline code, ``...``, taken in pairs from the left
INLINE_CODE = re.compile(r"``([^`]+?)``")
#: a formula written as inline code: ``[x - τ]_+``, ``Σ_j p_j``, ``⟨p, x⟩``, ``‖x‖``, ``x^{1/2}``
CODE_MATH = re.compile(r"\]_\+|\^\{|⟨|Σ|‖")


@pytest.mark.parametrize("name", NAMES)
def test_no_formula_in_inline_code(name):
    obj = _object(name)
    docs = [inspect.getdoc(obj) or ""]
    if inspect.isclass(obj):
        docs += [inspect.getdoc(m) or "" for k, m in vars(obj).items() if inspect.isfunction(m) and not k.startswith("_")]
    found = [m.group(0) for d in docs for m in INLINE_CODE.finditer(d) if CODE_MATH.search(m.group(1))]
    assert not found, f"{name}: formulas in inline code (write them as :math:): {found}"
