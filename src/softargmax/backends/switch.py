"""The fast paths' on/off switches: each backend has one :class:`Switch`, read from its environment
variable at import (``SOFTARGMAX_CPU_KERNELS``, ...; on by default) and changed by
:meth:`Switch.set` (tests, comparisons with the PyTorch path)."""

from __future__ import annotations

import os

__all__ = ["Switch", "env_flag"]


def env_flag(name: str) -> bool:
    """Whether the on/off switch ``$name`` is on (the default; ``0``, ``off``, ``false``, ``no`` turn it off)."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "off", "false", "no")


class Switch:
    """A fast path's on/off switch: read from the environment variable ``env`` at import
    (:func:`env_flag`), changed by :meth:`set` (tests, comparisons with the PyTorch path)."""

    def __init__(self, env: str) -> None:
        self.on = env_flag(env)

    def set(self, flag: bool) -> bool:
        """Turn it on or off; returns the old setting."""
        old, self.on = self.on, bool(flag)
        return old
