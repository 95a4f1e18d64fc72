r"""User-defined generators: :class:`CustomDivergence` takes ``f``, ``f'``, ``f*`` and ``(f*)'``
as functions (``g'`` by automatic differentiation when not given).  (A subclass of
:class:`~softargmax.divergences.Divergence` with the four methods does the same.)"""

from __future__ import annotations

import math
from typing import Callable, Optional

from torch import Tensor

from .base import Divergence
from .hints import SolverHints

__all__ = ["CustomDivergence"]


class CustomDivergence(Divergence):
    """A generator given by functions, for users who bring their own ``f``.

    Args:
        f, f_prime, conj, conj_prime: elementwise tensor functions (see module docstring).
        f_prime_zero: ``f'(0)`` (``-math.inf`` for dense mappings).
        conj_prime2: ``g'``; if omitted it is obtained by automatic differentiation of
            ``conj_prime``.
        newton_power: ``ρ`` (default 0, i.e. Newton on ``log S``).  Any value is
            safe because the solver keeps a bisection bracket.
        name: a label for messages.
        hints: a :class:`~softargmax.divergences.SolverHints` (closed forms, ...) instead of
            ``newton_power`` alone.
    """

    def __init__(
        self,
        f: Callable[[Tensor], Tensor],
        f_prime: Callable[[Tensor], Tensor],
        conj: Callable[[Tensor], Tensor],
        conj_prime: Callable[[Tensor], Tensor],
        f_prime_zero: float = -math.inf,
        conj_prime2: Optional[Callable[[Tensor], Tensor]] = None,
        newton_power: float = 0.0,
        name: str = "custom",
        hints: Optional[SolverHints] = None,
    ):
        for arg, fn in (("f", f), ("f_prime", f_prime), ("conj", conj), ("conj_prime", conj_prime)):
            if not callable(fn):
                raise TypeError(f"CustomDivergence: `{arg}` must be callable, got {type(fn).__name__}")
        self._f, self._fp, self._conj, self._cp = f, f_prime, conj, conj_prime
        self._cp2 = conj_prime2
        self.f_prime_zero = float(f_prime_zero)
        if hints is not None and not isinstance(hints, SolverHints):
            raise TypeError(f"CustomDivergence: hints must be a SolverHints, got {type(hints).__name__}")
        if hints is not None and newton_power != 0.0:
            raise ValueError("CustomDivergence: give newton_power inside hints= (SolverHints(newton_power=...))")
        self.hints = SolverHints(newton_power=float(newton_power)) if hints is None else hints
        self.name = name

    def __repr__(self):
        return f"CustomDivergence(name={self.name!r})"

    def f(self, u):
        return self._f(u)

    def f_prime(self, u):
        return self._fp(u)

    def conj(self, v):
        return self._conj(v)

    def conj_prime(self, v):
        return self._cp(v)

    def conj_prime2(self, v):
        if self._cp2 is not None:
            return self._cp2(v)
        return super().conj_prime2(v)
