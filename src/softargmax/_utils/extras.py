"""Optional dependencies, checked up front with the ``pip install`` line that provides them.

The core needs PyTorch only.  The experiments, the Hugging Face integration and the docs
need the packages of an *extra* (``pyproject.toml``); a missing one is reported before any
work starts, as an ``ImportError`` that names the package and the extra to install.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable

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


def env_flag(name: str) -> bool:
    """Whether the on/off switch ``$name`` is on (the default; ``0``, ``off``, ``false``, ``no`` turn it off)."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "off", "false", "no")


class Switch:
    """A fast path's on/off switch: read from the environment variable ``env`` at import
    (:func:`env_flag`), changed by :meth:`set` (tests, comparisons with the PyTorch path)."""

    def __init__(self, env: str):
        self.on = env_flag(env)

    def set(self, flag: bool) -> bool:
        """Turn it on or off; returns the old setting."""
        old, self.on = self.on, bool(flag)
        return old


class LazyModule:
    """A module imported on first use by ``load()``: the module, or ``False`` where its import
    fails (Triton missing or broken: the caller then takes the PyTorch path)."""

    def __init__(self, load: Callable):
        self._load = load
        self._module = None

    def __call__(self):
        if self._module is None:
            try:
                self._module = self._load()
            except Exception:
                self._module = False
        return self._module
