"""Every module path of the release before the folders became the layers still imports, as the very
module object of its new place, and every public name it had is still there (``softargmax._moved``)."""

import importlib
import subprocess
import sys

import pytest

import softargmax

#: the public module paths and the names they exported, as they were (module -> names)
PUBLIC_BEFORE = {
    "softargmax.alpha_relu": ["alpha_relu"],
    "softargmax.attention": ["attention", "attention_weights"],
    "softargmax.binary": ["f_sigmoid", "f_softplus"],
    "softargmax.budget": ["budget_sparsemax"],
    "softargmax.distributed": [],
    "softargmax.entmax": ["sparsemax", "entmax15", "entmax"],
    "softargmax.fdiv": ["f_softargmax", "f_softmax"],
    "softargmax.fused": ["linear_fenchel_young_loss"],
    "softargmax.inspect": ["alphas", "collect_attention", "head_density", "head_js_divergence"],
    "softargmax.losses": ["fenchel_young_loss", "sparsemax_loss", "entmax15_loss", "entmax_loss",
                          "alpha_relu_loss", "f_divergence_loss", "binary_f_divergence_loss"],
    "softargmax.mappings": ["normalize"],
    "softargmax.norm_budget_losses": ["normmax_loss", "budget_sparsemax_loss"],
    "softargmax.normmax": ["normmax"],
    "softargmax.solution": ["Solution"],
    "softargmax.tau": ["from_logits", "gaussian", "linear_logit_std"],
    "softargmax.threshold": ["solve"],
    "softargmax.nn": ["Sparsemax", "Entmax15", "Entmax", "AlphaReLU", "FSoftargmax", "SparseMultiheadAttention",
                      "convert_attention", "FenchelYoungLoss", "EntmaxLoss"],
    "softargmax.divergences": ["Divergence", "CustomDivergence", "get_divergence"],
    "softargmax.compat.entmax": ["entmax_bisect", "sparsemax", "entmax15", "normmax_bisect", "budget_bisect"],
    "softargmax.integrations.huggingface": ["register"],
    "softargmax.experiments.datasets": ["find", "DATASETS"],
}

#: the private module paths, which tests and users' monkeypatches reached into
PRIVATE_BEFORE = ["_autograd", "_checks", "_cpu_rows", "_custom_ops", "_dtensor", "_extras", "_flash_attention",
                  "_fy_loss", "_kernels", "_linear_chunks", "_loss_ops", "_loss_rows", "_row_kinds", "_targets",
                  "_triton_attention", "_triton_kernels", "_triton_rows"]


@pytest.mark.parametrize("path", sorted(PUBLIC_BEFORE))
def test_public_paths_of_the_last_release_import(path):
    module = importlib.import_module(path)
    for name in PUBLIC_BEFORE[path]:
        assert hasattr(module, name), f"{path}.{name} is gone"
    top = [n for n in PUBLIC_BEFORE[path] if n in softargmax.__all__ and not path.startswith("softargmax.compat")]
    for name in top:  # the root's function is the module's function
        assert getattr(module, name) is getattr(softargmax, name)


@pytest.mark.parametrize("old", PRIVATE_BEFORE)
def test_private_paths_are_the_new_modules(old):
    module = importlib.import_module(f"softargmax.{old}")
    new = sys.modules[module.__name__]
    assert module is new and module.__name__ != f"softargmax.{old}"
    assert module.__spec__.name == module.__name__  # the alias did not replace the module's own spec


def test_old_paths_first_imported_in_a_fresh_process():
    """Paths the package does not load at import (the Triton kernels, ``inspect``) resolve on first import,
    and ``import softargmax.attention`` (a module path and a function's name) leaves ``softargmax.attention``
    the function."""
    code = ("import softargmax.inspect as I, softargmax._triton_kernels as K, softargmax; "
            "import softargmax.attention, softargmax.entmax, softargmax.alpha_relu, softargmax.normmax; "
            "import softargmax.analysis as A, softargmax.backends.triton.row_kernels as R; assert I is A and K is R; "
            "assert all(callable(getattr(softargmax, n)) for n in ('attention', 'entmax', 'alpha_relu', 'normmax')); "
            "from softargmax.fdiv import f_softargmax; assert f_softargmax is softargmax.f_softargmax; "
            # the attribute after a plain import (the alias is in sys.modules: the import sets no attribute)
            "import softargmax.fdiv, softargmax.fused; assert softargmax.fdiv.f_softargmax is softargmax.f_softargmax; "
            "assert softargmax.fused.linear_fenchel_young_loss is softargmax.linear_fenchel_young_loss")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_module_of_the_last_release_is_listed():
    """The table of moved paths covers every module that left its place."""
    from softargmax._moved import MOVED

    assert set(PRIVATE_BEFORE) <= set(MOVED)
    for path in PUBLIC_BEFORE:
        old = path.removeprefix("softargmax.")
        assert old in MOVED or importlib.util.find_spec(path).origin is not None


def test_the_root_exports_only_documented_modules_and_keeps_its_old_attributes():
    """Every module in ``softargmax.__all__`` has an API page (an ``automodule`` in docs/api of it or, for a
    package, of its modules); the module attributes of earlier releases that are no longer exported (``tau``,
    ``threshold``) and every old module path (``softargmax.fdiv``) still resolve."""
    import types
    from pathlib import Path

    api = "".join(p.read_text() for p in (Path(__file__).resolve().parents[1] / "docs" / "api").glob("*.rst"))
    documented = {line.split("::", 1)[1].strip() for line in api.splitlines() if line.startswith(".. automodule::")}
    modules = {n: getattr(softargmax, n) for n in softargmax.__all__ if isinstance(getattr(softargmax, n), types.ModuleType)}
    assert modules, "softargmax.__all__ lists no module"
    for name, module in modules.items():
        pages = [d for d in documented if d == module.__name__ or d.startswith(module.__name__ + ".")]
        assert pages, f"softargmax.{name} ({module.__name__}) is exported but has no API page"
    assert "tau" not in softargmax.__all__ and "threshold" not in softargmax.__all__
    assert softargmax.tau is softargmax.alpha_relu_tau is importlib.import_module("softargmax.operators.alpha_relu_tau")
    assert softargmax.threshold is importlib.import_module("softargmax.solvers.threshold")
    from softargmax import tau, threshold  # noqa: F401  (the old form of the import)

    # every old path is an attribute naming its new module, but where a function of the root now has the name
    from softargmax._moved import MOVED

    for old, new in MOVED.items():
        value = getattr(softargmax, old)
        if old in ("entmax", "alpha_relu", "normmax", "attention"):
            assert callable(value) and not isinstance(value, types.ModuleType), old
        else:
            assert value is importlib.import_module(f"softargmax.{new}"), old
    with pytest.raises(AttributeError, match="no attribute 'fdivv'"):
        softargmax.fdivv  # noqa: B018
