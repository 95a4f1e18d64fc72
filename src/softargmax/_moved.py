"""The module paths of earlier releases, which keep working: ``softargmax.fdiv`` is
:mod:`softargmax.operators.fdiv`, ``softargmax.threshold`` is :mod:`softargmax.solvers.threshold`,
and so on.  Each old path names the very module object of the new one (``sys.modules``, and the package's
``__getattr__`` for the attribute), so ``from softargmax.fdiv import f_softargmax`` and
``softargmax.fdiv.f_softargmax is softargmax.f_softargmax`` hold; where a function of the package now has
the old name (``entmax``, ``alpha_relu``, ``normmax``, ``attention``), the attribute is the function.
Modules that importing the package has already loaded are aliased at once; the others (the Triton kernels,
``inspect``, now :mod:`softargmax.analysis`) on their first import, so that an old path never imports more
than the new one would.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Optional, Sequence

#: old module path (under ``softargmax.``) -> new one
MOVED = {
    "_checks": "_utils.checks",
    "_extras": "_utils.extras",
    "_dtensor": "operators._dtensor",
    "solution": "backends.solution",
    "_row_kinds": "backends.kinds",
    "_kernels": "backends",
    "_cpu_rows": "backends.cpu.rows",
    "_triton_rows": "backends.triton.rows",
    "_triton_kernels": "backends.triton.row_kernels",
    "_triton_attention": "backends.triton.attention_kernels",
    "_flash_attention": "backends.triton.flash_attention",
    "threshold": "solvers.threshold",
    "tau": "operators.alpha_relu_tau",
    "_autograd": "operators._autograd",
    "_custom_ops": "operators._library_ops",
    "entmax": "operators.entmax",
    "fdiv": "operators.fdiv",
    "alpha_relu": "operators.alpha_relu",
    "binary": "operators.binary",
    "normmax": "operators.normmax",
    "budget": "operators.budget",
    "mappings": "operators.mappings",
    "attention": "operators.attention",
    "_targets": "losses._targets",
    "_loss_rows": "losses._rows",
    "_fy_loss": "losses._fenchel_young",
    "norm_budget_losses": "losses.normmax_budget",
    "_linear_chunks": "losses._linear_chunks",
    "fused": "losses.linear",
    "_loss_ops": "losses._library_ops",
    "distributed": "losses.distributed",
    "inspect": "analysis",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``softargmax.<old>`` for a module not aliased yet, and returns the new module."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[ModuleSpec]:
        prefix, _, old = fullname.partition(".")
        if prefix == "softargmax" and old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module("softargmax." + MOVED[spec.name.partition(".")[2]])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system has just set module.__spec__ to the alias's spec: give back the module's own
        assert module.__spec__ is not None  # set by the import system
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Alias the modules loaded so far and let the finder resolve the others (called at the end of the package's import)."""
    for old, new in MOVED.items():
        if "softargmax." + new in sys.modules:
            sys.modules.setdefault("softargmax." + old, sys.modules["softargmax." + new])
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
