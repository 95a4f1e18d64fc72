r"""Generators of f-divergences, as data.

Every operator of the library is a regularized argmax over a per-coordinate
regularizer ``q_j f(p_j / q_j)`` (``003_…`` §3).  A :class:`Divergence` holds the
generator ``f`` and what the threshold solvers need from it:

===================  =====================================================
``f(u)``             the generator, convex on ``u >= 0``, ``f(1) = 0``
``f_prime(u)``       ``f'(u)``
``f_prime_zero``     ``f'(0) = lim_{u -> 0+} f'(u)``; finite means sparse outputs
``conj(v)``          ``f*(v)``, valid for ``v >= f'(0)``
``conj_prime(v)``    ``g(v) = (f*)'(v)``; the mapping is ``p_j = q_j g(θ_j - τ)``
``conj_prime2(v)``   ``g'(v)``; the Jacobian weights ``s_j = q_j g'(θ_j - τ)``
``newton_power``     ``ρ``: Newton's method is run on ``(S(τ)^ρ - 1)/ρ``
                     (``log S`` for ``ρ = 0``) with ``S(τ) = Σ_j q_j g(θ_j - τ)``
===================  =====================================================

The conjugate functions are only ever called with ``v >= f'(0)`` (the solvers
clamp) and below the pole of ``g`` where there is one.  ``v = -inf`` (a masked
score) must give ``g = g' = 0`` and never NaN.

The power ``ρ`` is chosen so that ``(S^ρ - 1)/ρ`` is convex and decreasing in ``τ``
(for the α family: the ``1/(α-1)``-norm of an affine map; for the pole-type
generators: a power mean with negative exponent; for KL and Jensen–Shannon:
log-convexity of ``g``).  Newton's method started at the lower end of the bracket
then increases monotonically to the root without overshoot, and is exact in one
step when a single coordinate carries all the mass.  The solvers still keep a
bisection bracket as a safeguard, so a user-defined generator with a poor ``ρ``
is only slower, never wrong.

Built-in generators (``003_…`` Appendix B) are registered by name:
``"kl"``, ``"reverse_kl"``, ``"jeffrey"``, ``"jensen_shannon"``,
``"squared_hellinger"``, ``"chi_square"``, ``"reverse_chi_square"`` and
``"alpha"`` (with ``alpha=``).  Users can pass their own :class:`Divergence`.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor

__all__ = [
    "Divergence",
    "CustomDivergence",
    "KL",
    "ReverseKL",
    "Jeffrey",
    "JensenShannon",
    "SquaredHellinger",
    "ChiSquare",
    "ReverseChiSquare",
    "AlphaDivergence",
    "get_divergence",
    "DIVERGENCE_NAMES",
]

Number = Union[float, int]


class Divergence:
    """Base class of a generator ``f``.  Subclasses implement the elementwise functions.

    Attributes:
        name: short name used in messages.
        f_prime_zero: ``f'(0)`` as a float; ``-inf`` for generators whose mapping is dense.
        newton_power: ``ρ`` of the transformed root equation (see module docstring).
    """

    name: str = "custom"
    f_prime_zero: float = -math.inf
    newton_power: float = 0.0

    # -- the generator -------------------------------------------------------------
    def f(self, u: Tensor) -> Tensor:
        raise NotImplementedError

    def f_prime(self, u: Tensor) -> Tensor:
        raise NotImplementedError

    def conj(self, v: Tensor) -> Tensor:
        raise NotImplementedError

    def conj_prime(self, v: Tensor) -> Tensor:
        raise NotImplementedError

    def conj_prime2(self, v: Tensor) -> Tensor:
        raise NotImplementedError

    def conj_prime_and_prime2(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(g(v), g'(v))``; subclasses override this to share work between the two."""
        return self.conj_prime(v), self.conj_prime2(v)

    #: whether Newton on ``(S^ρ - 1)/ρ`` from ``τ_lo`` is proven monotone (convex transform);
    #: if not, the solver keeps a bisection bracket around every step
    monotone_newton: bool = False

    def prepare(self, z: Tensor, m: Tensor):
        """Per-call precomputation for :meth:`evaluate` (``z``: candidates, ``m``: row maxima)."""
        return None

    def evaluate(self, z: Tensor, tau: Tensor, prep) -> tuple[Tensor, Tensor]:
        """``(g(z - τ), g'(z - τ))`` for candidates ``z`` ``[R, K]`` and thresholds ``τ`` ``[R, 1]``.

        Subclasses override this with cheaper formulas that reuse :meth:`prepare`
        (e.g. ``exp(z - m)`` computed once), so a Newton step has no transcendental call.
        """
        return self.conj_prime_and_prime2(z - tau)

    def newton_sums(self, z: Tensor, tau: Tensor, prep, out: tuple):
        """``(S, S', state)`` with ``S = Σ g(z - τ)``, ``S' = Σ g'(z - τ)`` per row (``[R, 1]``).

        Only the sums are needed by a Newton step; :meth:`finish` turns ``state`` into
        ``(g, g')`` once, at the final ``τ``.  ``out`` holds two work buffers shaped like
        ``z`` that subclasses write into (fresh full-size allocations page-fault on every
        Newton step on CPU); the buffers may become the returned ``(g, g')``.  Subclasses
        also skip full-size writes where they can (``Σ g^2`` as a squared norm).
        """
        g, gp = self.evaluate(z, tau, prep)
        return g.sum(-1, keepdim=True), gp.sum(-1, keepdim=True), (g, gp)

    def finish(self, z: Tensor, tau: Tensor, prep, state) -> tuple[Tensor, Tensor]:
        """``(g, g')`` at the ``τ`` of the last :meth:`newton_sums` call."""
        return state

    def bound_offsets(self, k: int) -> tuple:
        """``(f'(1), f'(1/k))``: ``τ_lo = max - f'(1)``, ``τ_hi = max - f'(1/k)`` for ``q = 1`` (cached)."""
        cache = self.__dict__.setdefault("_bound_cache", {})
        if k not in cache:
            u = torch.tensor([1.0, 1.0 / k], dtype=torch.float64)
            v = self.f_prime(u)
            cache[k] = (float(v[0]), float(v[1]))
        return cache[k]

    # -- derived -------------------------------------------------------------------
    @property
    def sparse(self) -> bool:
        """Whether the mapping can give exact zeros (``f'(0)`` finite)."""
        return math.isfinite(self.f_prime_zero)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ----------------------------------------------------------------------------------
# Built-in generators
# ----------------------------------------------------------------------------------


class KL(Divergence):
    """Kullback–Leibler, ``f(u) = u log u``: f-softargmax is ``softmax(θ + log q)``."""

    name = "kl"
    newton_power = 0.0
    monotone_newton = True

    def prepare(self, z, m):
        return torch.exp(z - m), m

    def evaluate(self, z, tau, prep):
        e, m = prep
        g = e * torch.exp(m - tau - 1)
        return g, g

    def newton_sums(self, z, tau, prep, out):
        e, m = prep
        g = torch.mul(e, torch.exp(m - tau - 1), out=out[0])
        S = g.sum(-1, keepdim=True)
        return S, S, g

    def finish(self, z, tau, prep, state):
        return state, state

    def f(self, u):
        return torch.special.xlogy(u, u)

    def f_prime(self, u):
        return torch.log(u) + 1

    def conj(self, v):
        return torch.exp(v - 1)

    def conj_prime(self, v):
        return torch.exp(v - 1)

    def conj_prime2(self, v):
        return torch.exp(v - 1)

    def conj_prime_and_prime2(self, v):
        g = torch.exp(v - 1)
        return g, g


class ReverseKL(Divergence):
    """Reverse KL, ``f(u) = -log u``: ``p_j = q_j / (τ - θ_j)``."""

    name = "reverse_kl"
    newton_power = -1.0
    monotone_newton = True

    def evaluate(self, z, tau, prep):
        g = torch.sub(tau, z).reciprocal_()
        return g, g * g

    def newton_sums(self, z, tau, prep, out):
        g = torch.sub(tau, z, out=out[0]).reciprocal_()
        return g.sum(-1, keepdim=True), torch.linalg.vector_norm(g, 2, -1, keepdim=True) ** 2, (g, out[1])

    def finish(self, z, tau, prep, state):
        g, buf = state
        return g, torch.mul(g, g, out=buf)

    def f(self, u):
        return -torch.log(u)

    def f_prime(self, u):
        return -1.0 / u

    def conj(self, v):
        return -1.0 - torch.log(-v)

    def conj_prime(self, v):
        return -1.0 / v

    def conj_prime2(self, v):
        return 1.0 / (v * v)

    def conj_prime_and_prime2(self, v):
        g = -1.0 / v
        return g, g * g


def lambertw_exp(L: Tensor, iterations: int = 6) -> Tensor:
    """``W(exp(L))`` for the principal branch of Lambert's W, elementwise, for any real ``L``.

    Solves ``w + log w = L`` by Newton's method in ``l = log w`` (``e^l + l = L``,
    convex and increasing in ``l``, so the iteration converges from the start below).
    ``L = +inf`` gives ``inf``; ``L = -inf`` gives ``0``.
    """
    big = L > 1
    Ls = torch.where(big, L, torch.ones_like(L))
    l0_big = torch.log(Ls - torch.log(Ls))
    l0_small = L - torch.nn.functional.softplus(L)
    l = torch.where(big, l0_big, l0_small)
    l = torch.where(torch.isfinite(L), l, torch.zeros_like(L))
    Lf = torch.where(torch.isfinite(L), L, torch.ones_like(L))
    for _ in range(iterations):
        e = torch.exp(l)
        l = l - (e + l - Lf) / (e + 1)
    w = torch.exp(l)
    w = torch.where(L == math.inf, torch.full_like(L, math.inf), w)
    w = torch.where(L == -math.inf, torch.zeros_like(L), w)
    return w


class Jeffrey(Divergence):
    """Jeffrey, ``f(u) = (u - 1) log u``: ``g(v) = 1 / W(exp(1 - v))`` (Lambert W)."""

    name = "jeffrey"
    newton_power = 0.0

    def f(self, u):
        return (u - 1) * torch.log(u)

    def f_prime(self, u):
        return torch.log(u) + 1 - 1.0 / u

    def conj(self, v):
        g = self.conj_prime(v)
        return g + torch.log(g) - 1

    def conj_prime(self, v):
        return 1.0 / lambertw_exp(1 - v)

    def conj_prime2(self, v):
        return self.conj_prime_and_prime2(v)[1]

    def conj_prime_and_prime2(self, v):
        w = lambertw_exp(1 - v)
        g = 1.0 / w
        # dg/dv = 1 / (w (1 + w)) = g^2 / (1 + g)
        return g, g * g / (1 + g)


class JensenShannon(Divergence):
    """Jensen–Shannon, ``f(u) = u log u - (u + 1) log((u + 1)/2)``: ``g(v) = 1/(2e^{-v} - 1)``."""

    name = "jensen_shannon"
    newton_power = 0.0
    monotone_newton = True

    def prepare(self, z, m):
        # exp(m - z) >= 1 (inf far below the maximum, where g = 0)
        return torch.exp(m - z), m

    def evaluate(self, z, tau, prep):
        e, m = prep
        # g = 1/(2 exp(τ - z) - 1) = 1/(2 exp(τ - m) exp(m - z) - 1);  τ >= m on the path
        g = torch.mul(e, 2 * torch.exp(tau - m)).sub_(1).reciprocal_()
        return g, torch.addcmul(g, g, g)

    def newton_sums(self, z, tau, prep, out):
        e, m = prep
        g = torch.mul(e, 2 * torch.exp(tau - m), out=out[0]).sub_(1).reciprocal_()
        S = g.sum(-1, keepdim=True)
        return S, S + torch.linalg.vector_norm(g, 2, -1, keepdim=True) ** 2, (g, out[1])

    def finish(self, z, tau, prep, state):
        g, buf = state
        return g, torch.addcmul(g, g, g, out=buf)

    def f(self, u):
        return torch.special.xlogy(u, u) - (u + 1) * torch.log((u + 1) / 2)

    def f_prime(self, u):
        return torch.log(2 * u / (u + 1))

    def conj(self, v):
        return -torch.log1p(-torch.expm1(v))

    def conj_prime(self, v):
        return 1.0 / (2 * torch.exp(-v) - 1)

    def conj_prime2(self, v):
        g = self.conj_prime(v)
        return g + g * g

    def conj_prime_and_prime2(self, v):
        g = 1.0 / (2 * torch.exp(-v) - 1)
        return g, g + g * g


class SquaredHellinger(Divergence):
    """Squared Hellinger, ``f(u) = (√u - 1)^2``: ``g(v) = 1/(1 - v)^2``."""

    name = "squared_hellinger"
    newton_power = -0.5
    monotone_newton = True

    def evaluate(self, z, tau, prep):
        r = torch.sub(tau + 1, z).reciprocal_()
        g = r * r
        return g, 2 * g * r

    def newton_sums(self, z, tau, prep, out):
        r = torch.sub(tau + 1, z, out=out[0]).reciprocal_()
        g = torch.mul(r, r, out=out[1])
        r3 = r.mul_(g)  # r is not needed afterwards: r^3 in place
        return g.sum(-1, keepdim=True), 2 * r3.sum(-1, keepdim=True), (g, r3)

    def finish(self, z, tau, prep, state):
        g, r3 = state
        return g, r3.mul_(2)

    def f(self, u):
        return (torch.sqrt(u) - 1) ** 2

    def f_prime(self, u):
        return 1 - 1.0 / torch.sqrt(u)

    def conj(self, v):
        return v / (1 - v)

    def conj_prime(self, v):
        r = 1.0 / (1 - v)
        return r * r

    def conj_prime2(self, v):
        r = 1.0 / (1 - v)
        return 2 * r * r * r

    def conj_prime_and_prime2(self, v):
        r = 1.0 / (1 - v)
        g = r * r
        return g, 2 * g * r


class ChiSquare(Divergence):
    """Chi-square (Pearson), ``f(u) = (u^2 - 1)/2``: sparsemax, ``p_j = q_j [θ_j - τ]_+``."""

    name = "chi_square"
    f_prime_zero = 0.0
    newton_power = 1.0
    monotone_newton = True

    def evaluate(self, z, tau, prep):
        g = torch.sub(z, tau).clamp_(min=0)
        return g, torch.sign(g)

    def newton_sums(self, z, tau, prep, out):
        g = torch.sub(z, tau, out=out[0]).clamp_(min=0)
        s = torch.sign(g, out=out[1])
        return g.sum(-1, keepdim=True), s.sum(-1, keepdim=True), (g, s)

    def f(self, u):
        return 0.5 * (u * u - 1)

    def f_prime(self, u):
        return u

    def conj(self, v):
        return 0.5 * (v * v + 1)

    def conj_prime(self, v):
        return torch.clamp(v, min=0)

    def conj_prime2(self, v):
        return (v > 0).to(v.dtype)

    def conj_prime_and_prime2(self, v):
        g = torch.clamp(v, min=0)
        return g, torch.sign(g)



class ReverseChiSquare(Divergence):
    """Reverse chi-square (Neyman), ``f(u) = (1/u - 1)/2``: ``g(v) = (-2v)^{-1/2}``."""

    name = "reverse_chi_square"
    newton_power = -2.0
    monotone_newton = True

    def f(self, u):
        return 0.5 * (1.0 / u - 1)

    def f_prime(self, u):
        return -0.5 / (u * u)

    def conj(self, v):
        return 0.5 - torch.sqrt(-2 * v)

    def conj_prime(self, v):
        return torch.rsqrt(-2 * v)

    def conj_prime2(self, v):
        r = torch.rsqrt(-2 * v)
        return r * r * r

    def conj_prime_and_prime2(self, v):
        r = torch.rsqrt(-2 * v)
        return r, r * r * r


class AlphaDivergence(Divergence):
    r"""α-divergence, ``f(u) = (u^α - 1 - α(u - 1)) / (α(α - 1))`` (``u log u - u + 1`` at α = 1).

    ``g(v) = exp_α(v) = [1 + (α - 1) v]_+^{1/(α-1)}``; with ``q = 1`` the mapping is
    α-entmax in the f-divergence parametrization ``τ_f`` (DESIGN §1:
    ``τ_entmax = (α - 1) τ_f - 1``).  α > 1 gives sparse outputs, α = 2 sparsemax,
    α = 1 softmax, α ∈ (0, 1) dense outputs.

    ``alpha`` is a float or a tensor broadcastable against the scores with size 1
    along the normalized dimension (one α per row).  Tensor α is evaluated with
    ``log1p``/``exp`` so that α → 1 is continuous.
    """

    name = "alpha"

    def __init__(self, alpha: Union[Number, Tensor]):
        self.alpha = alpha
        if isinstance(alpha, Tensor):
            self._a = alpha - 1
        else:
            self._a = float(alpha) - 1.0

    def __repr__(self):
        return f"AlphaDivergence(alpha={self.alpha!r})"

    @property
    def f_prime_zero(self):  # type: ignore[override]
        if isinstance(self.alpha, Tensor):
            # per-row α: only used for the candidate bound, the widest one is safe
            a = float(self._a.min()) if self._a.numel() else 1.0
        else:
            a = self._a
        return -1.0 / a if a > 0 else -math.inf

    @property
    def newton_power(self):  # type: ignore[override]
        return self._a

    @property
    def monotone_newton(self):  # type: ignore[override]
        # S^{α-1} is a 1/(α-1)-norm (α in (1, 2]) or a power mean with negative
        # exponent (α < 1): convex transform.  α > 2 is not covered.
        if isinstance(self._a, Tensor):
            return bool((self._a <= 1).all())
        return self._a <= 1.0

    #: below this ``|α - 1|`` (float α) ``g(v) = exp(log1p((α-1) v)/(α-1))``: the base
    #: ``1 + (α-1) v`` rounds away ``v`` near α = 1 (float32 ``p`` was off by 1e-2 at α = 1 + 1e-6)
    NEAR_ONE = 0.25

    def _near_one(self) -> bool:
        a = self._a
        return isinstance(a, float) and a != 0.0 and abs(a) < self.NEAR_ONE

    def _near_one_eval(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(g(v), g'(v))`` by ``log1p`` for float α near 1 (``v = -inf`` gives 0)."""
        a = self._a
        u = torch.clamp(v * a, min=-1.0)
        E = torch.log1p(u) / a
        g = torch.exp(E)
        gp = torch.exp(E * (1.0 - a))
        if a > 0:
            gp = torch.where(u > -1.0, gp, torch.zeros_like(gp))
        return g, gp

    def prepare(self, z, m):
        a = self._a
        if isinstance(a, float) and a == 0.0:
            return torch.exp(z - m), m
        if self._near_one():
            return None
        if isinstance(a, float) and a > 0 and a != 1.0:
            # 1 + a (z - τ) = a z - (a τ - 1): scale the candidates once
            return z * a
        return None

    def evaluate(self, z, tau, prep):
        a = self._a
        if not isinstance(a, float):
            return self.conj_prime_and_prime2(z - tau)
        if self._near_one():
            return self._near_one_eval(z - tau)
        if a == 0.0:
            e, m = prep
            g = e * torch.exp(m - tau)
            return g, g
        if a == 1.0:
            g = torch.sub(z, tau - 1).clamp_(min=0)
            return g, torch.sign(g)
        if a > 0:
            base = torch.sub(prep, a * tau - 1).clamp_(min=0)
            if a == 0.5:
                return base * base, base
            gp = base ** ((1.0 - a) / a)
            if a > 1:
                gp = torch.where(base > 0, gp, torch.zeros_like(gp))
            return gp * base, gp
        return self.conj_prime_and_prime2(z - tau)

    def f(self, u):
        a = self._a
        al = a + 1
        if isinstance(a, float):
            if a == 0.0:
                return torch.special.xlogy(u, u) - u + 1
            if self._near_one():
                # (u^α - 1 - α(u - 1)) / (α a) = (u expm1(a log u)/a - (u - 1)) / α, no cancellation
                pos = u > 0
                us = torch.where(pos, u, torch.ones_like(u))
                val = (us * torch.expm1(a * torch.log(us)) / a - (us - 1)) / al
                return torch.where(pos, val, torch.full_like(u, 1.0 / al))
            return (u ** al - 1 - al * (u - 1)) / (al * a)
        a_safe = torch.where(a == 0, torch.ones_like(a), a)
        gen = (u ** (a_safe + 1) - 1 - (a_safe + 1) * (u - 1)) / ((a_safe + 1) * a_safe)
        return torch.where(a == 0, torch.special.xlogy(u, u) - u + 1, gen)

    def f_prime(self, u):
        a = self._a
        if isinstance(a, float):
            if self._near_one():
                return torch.expm1(a * torch.log(u)) / a
            return torch.log(u) if a == 0.0 else (u ** a - 1) / a
        a_safe = torch.where(a == 0, torch.ones_like(a), a)
        return torch.where(a == 0, torch.log(u), (u ** a_safe - 1) / a_safe)

    def _exponent(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """``E = log g(v) = log1p((α-1)v)/(α-1)`` and ``t = (α-1) v`` for tensor α."""
        a = self._a
        t = torch.clamp(a * v, min=-1.0)
        t = torch.where(torch.isnan(v), v, t)
        a_safe = torch.where(a == 0, torch.ones_like(a), a)
        E = torch.where(a == 0, v, torch.log1p(t) / a_safe)
        return E, t

    def conj(self, v):
        a = self._a
        al = a + 1
        if isinstance(a, float):
            if a == 0.0:
                return torch.exp(v) - 1
            if self._near_one():
                # f*(v) = (g(v)(1 + a v) - 1)/α = expm1(α E)/α with E = log g(v) = log1p(a v)/a
                E = torch.log1p(torch.clamp(v * a, min=-1.0)) / a
                return torch.expm1(al * E) / al
            base = torch.clamp(1 + a * v, min=0)
            return (base ** (al / a) - 1) / al
        E, t = self._exponent(v)
        # f*(v) = (g(v) (1 + t) - 1) / α = expm1(α E) / α (log(1 + t) = (α - 1) E)
        return torch.expm1(al * E) / al

    def conj_prime(self, v):
        return self.conj_prime_and_prime2(v)[0]

    def conj_prime2(self, v):
        return self.conj_prime_and_prime2(v)[1]

    def conj_prime_and_prime2(self, v):
        a = self._a
        if isinstance(a, float):
            if a == 0.0:
                g = torch.exp(v)
                return g, g
            if a == 1.0:  # α = 2: sparsemax
                t = torch.clamp(v + 1, min=0)
                return t, (t > 0).to(v.dtype)
            if a == 0.5:  # α = 1.5
                t = torch.clamp(0.5 * v + 1, min=0)
                return t * t, t
            if self._near_one():
                return self._near_one_eval(v)
            base = 1 + a * v
            if a > 0:
                base = torch.clamp(base, min=0)
                g = base ** (1.0 / a)
                gp = base ** ((1.0 - a) / a)
                if a > 1:  # α > 2: negative exponent, zero it outside the support
                    gp = torch.where(base > 0, gp, torch.zeros_like(gp))
                return g, gp
            # α < 1: dense, pole at v = 1/(1-α); -inf gives base = +inf -> g = 0
            g = base ** (1.0 / a)
            return g, g / base
        E, t = self._exponent(v)
        g = torch.exp(E)
        gp = torch.where(g > 0, torch.exp((1 - a) * E), torch.zeros_like(g))
        return g, gp

    def newton_sums(self, z, tau, prep, out):
        a = self._a
        if not isinstance(a, float) or a < 0 or self._near_one():
            return super().newton_sums(z, tau, prep, out)
        if a == 0.0:
            e, m = prep
            g = torch.mul(e, torch.exp(m - tau), out=out[0])
            S = g.sum(-1, keepdim=True)
            return S, S, (g, g)
        if a == 1.0:
            g = torch.sub(z, tau - 1, out=out[0]).clamp_(min=0)
            s = torch.sign(g, out=out[1])
            return g.sum(-1, keepdim=True), s.sum(-1, keepdim=True), (g, s)
        base = torch.sub(prep, a * tau - 1, out=out[0]).clamp_(min=0)
        if a == 0.5:
            S = torch.linalg.vector_norm(base, 2, -1, keepdim=True) ** 2
            return S, base.sum(-1, keepdim=True), (base, out[1])
        gp = torch.pow(base, (1.0 - a) / a, out=out[1])
        if a > 1:
            gp.masked_fill_(base == 0, 0.0)
        g = base.mul_(gp)  # g = base^{1/a} = base * base^{(1-a)/a}
        return g.sum(-1, keepdim=True), gp.sum(-1, keepdim=True), (g, gp)

    def finish(self, z, tau, prep, state):
        a = self._a
        if isinstance(a, float) and a == 0.5:
            base, buf = state
            return torch.mul(base, base, out=buf), base
        return state


# ----------------------------------------------------------------------------------
# User-defined generators
# ----------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Divergence]] = {
    "kl": KL,
    "reverse_kl": ReverseKL,
    "jeffrey": Jeffrey,
    "jensen_shannon": JensenShannon,
    "squared_hellinger": SquaredHellinger,
    "chi_square": ChiSquare,
    "reverse_chi_square": ReverseChiSquare,
    "alpha": AlphaDivergence,
}

DIVERGENCE_NAMES = tuple(_REGISTRY)


@functools.lru_cache(maxsize=64)
def _cached(name: str, alpha: Optional[float]) -> Divergence:
    """One instance per generator, so per-instance caches (bounds) are reused across calls."""
    return AlphaDivergence(alpha) if name == "alpha" else _REGISTRY[name]()


def _instance(name: str, alpha: Optional[float]) -> Divergence:
    """The cached instance; built afresh while ``torch.compile`` traces (its tracer does not follow caches)."""
    query = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if query is not None and query():
        return _cached.__wrapped__(name, alpha)
    return _cached(name, alpha)


def get_divergence(divergence: Union[str, Divergence], **params) -> Divergence:
    """Resolve a divergence name (with its parameters) or pass a :class:`Divergence` through.

    Raises:
        ValueError: unknown name, missing/unexpected parameters, or α out of range.
        TypeError: neither a string nor a :class:`Divergence`.
    """
    if isinstance(divergence, Divergence):
        if params:
            raise ValueError(
                f"divergence: parameters {sorted(params)} given with a Divergence object; "
                "put them in the object instead"
            )
        return divergence
    if not isinstance(divergence, str):
        raise TypeError(
            f"divergence must be a name or a softargmax.divergences.Divergence, got {type(divergence).__name__}"
        )
    if divergence not in _REGISTRY:
        raise ValueError(f"divergence: unknown name {divergence!r}; accepted: {', '.join(DIVERGENCE_NAMES)}")
    if divergence == "alpha":
        if "alpha" not in params:
            raise ValueError("divergence='alpha' needs the parameter alpha=, a number > 0")
        extra = set(params) - {"alpha"}
        if extra:
            raise ValueError(f"divergence='alpha': unexpected parameters {sorted(extra)}; accepted: alpha")
        alpha = params["alpha"]
        if isinstance(alpha, Tensor):
            raise TypeError("divergence='alpha': alpha must be a number here; use softargmax.entmax for tensor α")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise TypeError(f"alpha must be a number, got {type(alpha).__name__}")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a finite number > 0 for the alpha divergence, got {alpha}")
        return _instance("alpha", float(alpha))
    if params:
        raise ValueError(f"divergence={divergence!r} takes no parameters, got {sorted(params)}")
    return _instance(divergence, None)
