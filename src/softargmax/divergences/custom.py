r"""User-defined generators: :class:`CustomDivergence` takes ``f``, ``f'``, ``f*`` and ``(f*)'``
as functions (``g'`` by automatic differentiation when not given)."""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor

from .base import Divergence

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
    ):
        for arg, fn in (("f", f), ("f_prime", f_prime), ("conj", conj), ("conj_prime", conj_prime)):
            if not callable(fn):
                raise TypeError(f"CustomDivergence: `{arg}` must be callable, got {type(fn).__name__}")
        self._f, self._fp, self._conj, self._cp = f, f_prime, conj, conj_prime
        self._cp2 = conj_prime2
        self.f_prime_zero = float(f_prime_zero)
        self.newton_power = float(newton_power)
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
        with torch.enable_grad():
            vv = v.detach().requires_grad_(True)
            g = self._cp(vv)
            (gp,) = torch.autograd.grad(g.sum(), vv)
        return torch.where(torch.isfinite(v), gp, torch.zeros_like(gp))
