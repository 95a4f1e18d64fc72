"""Optional dependencies, checked up front with the ``pip install`` line that provides them.

The core needs PyTorch only.  The experiments, the Hugging Face integration and the docs
need the packages of an *extra* (``pyproject.toml``); a missing one is reported before any
work starts, as an ``ImportError`` that names the package and the extra to install.
:class:`LazyModule` imports an optional package (Triton) on first use, and tells the caller
to take the PyTorch path where it is missing or broken.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Callable, Literal, Optional, Union

#: the import names each extra provides (those the code imports)
EXTRAS = {
    "experiments": ("sentencepiece", "sacrebleu", "matplotlib"),
    "hf": ("transformers",),
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra provides it."""


def require(extra: str, what: str) -> None:
    """Import every package of ``extra``; raise :class:`MissingExtraError` naming the missing ones."""
    missing = []
    for name in EXTRAS[extra]:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtraError(
            f"{what} needs {', '.join(missing)} (the '{extra}' extra): "
            f'pip install "softargmax[{extra}]"  (from a checkout: pip install -e ".[{extra}]")'
        )


class LazyModule:
    """A module imported on first use by ``load()``: the module, or ``False`` where its import
    fails (Triton missing or broken: the caller then takes the PyTorch path)."""

    def __init__(self, load: Callable[[], ModuleType]) -> None:
        self._load = load
        self._module: Optional[Union[ModuleType, Literal[False]]] = None

    def __call__(self) -> Any:  # the module (its members are untyped: Triton's kernels) or False
        if self._module is None:
            try:
                self._module = self._load()
            except Exception:
                self._module = False
        return self._module
