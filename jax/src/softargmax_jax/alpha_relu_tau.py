r"""Choosing α-ReLU's threshold :math:`\tau` (Tezekbayev et al., 2022), for JAX.

α-ReLU reproduces α-entmax when its fixed :math:`\tau` equals the threshold α-entmax would compute, so
:math:`\tau` is set from the model itself before training:

* :func:`entmax_threshold` — the α-entmax threshold of every row;
* :func:`from_logits` — their mean over a batch of (untrained) logits, the way Tezekbayev et al. (2022)
  §3 pick :math:`\tau` from the first batch;
* :func:`gaussian` — the data-free estimate for i.i.d. :math:`N(0, \sigma^2)` logits: Tezekbayev et al.
  (2022) Lemma 2 (α = 1.5, ``method="paper"``) and, for any α > 1, the same asymptotic argument
  evaluated by quadrature (``method="integral"``), in float64 NumPy (a number, computed once);
* :func:`linear_logit_std` — Tezekbayev et al. (2022) Lemma 3: the logit standard deviation of a
  Xavier-uniform output projection applied to layer-normalized features,
  :math:`\sqrt{2 d_{\text{model}} / (d_{\text{model}} + d_{\text{vocab}})}`.

Every :math:`\tau` here is in the entmax parametrization :math:`p = [(\alpha-1) z - \tau]_+^{1/(\alpha-1)}`, the
one :func:`softargmax_jax.alpha_relu` takes.  The thresholds are constants (no derivative flows through
them, as in the PyTorch package).

References:

* Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up Entmax*,
  Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist
from typing import Any, Callable, Union

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_array, check_axis, compute_dtype, concrete
from ._solver import solve
from .divergences import AlphaDivergence

Array = jax.Array

__all__ = ["entmax_threshold", "from_logits", "gaussian", "linear_logit_std"]


def _check_alpha(alpha: Any) -> float:
    """α, a finite number > 1 (an array is a ``TypeError``: one α for the whole call)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a float > 1, got {type(alpha).__name__}")
    if not (math.isfinite(alpha) and alpha > 1):
        raise ValueError(f"alpha must be finite and > 1, got {alpha!r}")
    return float(alpha)


def entmax_threshold(logits: Array, alpha: float = 1.5, axis: int = -1) -> Array:
    r"""The α-entmax threshold of every row, in the entmax parametrization that α-ReLU takes.

    .. math::

        \sum_j [(\alpha - 1) z_j - \tau]_+^{1/(\alpha-1)} = 1,

    so that :func:`softargmax_jax.alpha_relu` with this :math:`\tau` equals :func:`softargmax_jax.entmax` on
    the row.  The package's threshold search (exact closed forms for α = 1.5 and 2), then
    :math:`\tau = (\alpha - 1)\tau_f - 1` from its f-divergence threshold :math:`\tau_f`.  A constant (no
    derivative); a row that is entirely ``-inf`` gives :math:`-1`, a row with NaN or ``+inf`` gives NaN.

    Args:
        logits: scores, any shape, the classes along ``axis``.
        alpha: a finite number > 1. Default: ``1.5``.
        axis: the axis of the classes. Default: ``-1``.

    Returns:
        the thresholds, ``logits``' shape without ``axis``, in ``logits``' dtype.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, softargmax_jax as sj
        >>> from softargmax_jax.alpha_relu_tau import entmax_threshold
        >>> logits = jnp.array([[1.0, 0.8, -1.0], [0.0, 0.0, 0.0]])
        >>> tau = entmax_threshold(logits)
        >>> print(np.round(np.asarray(tau), 4))
        [-0.2553 -0.5774]
        >>> bool(jnp.allclose(sj.alpha_relu(logits, 1.5, tau[:, None]), sj.entmax15(logits), atol=1e-6))
        True

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up
        Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    logits = check_array(logits, "logits")
    axis = check_axis(logits, axis)
    return _threshold_jit(_check_alpha(alpha), logits, axis)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _threshold_jit(alpha: float, logits: Array, axis: int) -> Array:
    z = jnp.moveaxis(jax.lax.stop_gradient(logits), axis, -1).astype(compute_dtype(logits.dtype))
    sol = solve(z, AlphaDivergence(alpha))
    tau = (alpha - 1.0) * sol.tau - 1.0  # τ_e = (α-1) τ_f - 1
    tau = jnp.where(sol.finite, tau, jnp.where(sol.bad, jnp.nan, -1.0))
    return tau[..., 0].astype(logits.dtype)


def from_logits(logits: Array, alpha: float = 1.5, axis: int = -1) -> Array:
    r"""The mean α-entmax threshold over all rows of a batch of logits: α-ReLU's τ from an untrained model.

    .. math::

        \tau = \frac{1}{R} \sum_{r=1}^{R} \tau_r, \qquad
        \sum_j [(\alpha - 1) z_{rj} - \tau_r]_+^{1/(\alpha-1)} = 1,

    the way Tezekbayev et al. (2022, §3) choose :math:`\tau` from the first batch before training.  Rows whose
    maximum is not finite (entirely ``-inf``, or with NaN or ``+inf``) are left out of the mean.

    Args:
        logits: scores, any shape (for example ``[batch, length, vocab]``).
        alpha: a finite number > 1. Default: ``1.5``.
        axis: the axis of the classes. Default: ``-1``.

    Returns:
        a 0-d array, the mean threshold (entmax parametrization), in ``logits``' dtype.

    Raises:
        ValueError: every row is masked (where the logits are not traced; under ``jit`` the result is NaN).

    Examples:
        >>> import numpy as np, jax.numpy as jnp
        >>> from softargmax_jax.alpha_relu_tau import from_logits
        >>> print(np.round(float(from_logits(jnp.array([[1.0, 0.8, -1.0], [0.0, 0.0, 0.0]]))), 4))
        -0.4163

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up
        Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    logits = check_array(logits, "logits")
    axis = check_axis(logits, axis)
    alpha = _check_alpha(alpha)
    v = concrete(logits)
    if v is not None and not bool(np.any(np.isfinite(np.max(v, axis=axis)))):
        raise ValueError("logits: every row is masked; no threshold to average")
    return _from_logits_jit(alpha, logits, axis)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _from_logits_jit(alpha: float, logits: Array, axis: int) -> Array:
    tau = _threshold_jit(alpha, logits, axis)
    ok = jnp.isfinite(jnp.max(jax.lax.stop_gradient(logits), axis))
    n = jnp.sum(ok)
    total = jnp.sum(jnp.where(ok, tau, 0.0).astype(compute_dtype(logits.dtype)))
    return jnp.where(n > 0, total / jnp.maximum(n, 1), jnp.nan).astype(logits.dtype)


def linear_logit_std(d_model: int, vocab_size: int) -> float:
    r"""The standard deviation of the logits of a freshly initialized output layer (Lemma 3).

    .. math::

        \sigma = \sqrt{\frac{2\, d_{\text{model}}}{d_{\text{model}} + d_{\text{vocab}}}},

    for a Xavier-uniform output projection applied to layer-normalized features (Tezekbayev et al., 2022,
    Lemma 3); :func:`gaussian` with it gives their eq. (4).

    Args:
        d_model: the size of the features, a positive int.
        vocab_size: the number of classes, a positive int.

    Returns:
        :math:`\sigma`, a float.

    Examples:
        >>> from softargmax_jax.alpha_relu_tau import linear_logit_std
        >>> round(linear_logit_std(512, 40000), 4)
        0.159

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up
        Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    for name, v in (("d_model", d_model), ("vocab_size", vocab_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return math.sqrt(2.0 * d_model / (d_model + vocab_size))


# -- the data-free estimate (float64 NumPy and the standard library) ----------------------------------------

_NORMAL = NormalDist()
_SQRT2PI = math.sqrt(2 * math.pi)


def _phi(t: float) -> float:
    return math.exp(-0.5 * t * t) / _SQRT2PI


def _probit(x: float) -> float:
    return _NORMAL.inv_cdf(x)


def _bisect(fn: Callable[[float], float], lo: float, hi: float, iters: int = 200) -> float:
    """Root of a function that changes sign on ``[lo, hi]`` (float64 bisection)."""
    flo = fn(lo)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = fn(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _paper_lemma2(d: int, sigma: float) -> tuple[float, float]:
    """Tezekbayev et al. (2022) Lemma 2 for 1.5-entmax: ``(τ, p*)`` with eqs. (8), (9), (12)."""
    eps = 1.0 / d
    phi_eps = _phi(_probit(eps))

    def m(p: float) -> float:
        return (_phi(_probit(p)) - phi_eps) / (p - eps)

    def F(x: float) -> float:
        u = _probit(x)
        return -_phi(u) * u + x

    def s(p: float) -> float:
        return (F(p) - F(eps)) / (p - eps) - m(p) ** 2

    def eq12(p: float) -> float:
        inside = 4 / sigma**2 * eps / p - s(p)
        if inside < 0:
            return math.inf
        return _probit(1 - p) - (m(p) - math.sqrt(inside))

    # eq12 > 0 for p just above ε (the top entry alone), < 0 once too many entries are included
    lo, hi = eps * (1 + 1e-9), 1 - 1e-9
    grid = np.logspace(math.log10(lo), math.log10(hi), 400).tolist()
    prev = grid[0]
    for p in grid[1:]:
        if eq12(prev) > 0 >= eq12(p):
            p_star = _bisect(eq12, prev, p)
            return sigma / 2 * _probit(1 - p_star), p_star
        prev = p
    raise ValueError("gaussian: Lemma 2's equation has no root for these sizes")


def _integral_estimate(d: int, sigma: float, alpha: float, points: int = 4001) -> tuple[float, float]:
    """Solve ``d ∫_{t0}^{t_ε} ((α-1) σ t - τ)^{1/(α-1)} φ(t) dt = 1`` for ``τ`` (see :func:`gaussian`)."""
    a = alpha - 1
    r = 1.0 / a
    t_eps = _probit(1 - 1.0 / d)

    def mass(tau: float) -> float:
        t0 = tau / (a * sigma)
        if t0 >= t_eps:
            return 0.0
        t = np.linspace(max(t0, -12.0), t_eps, points)
        f = np.maximum(a * sigma * t - tau, 0) ** r * np.exp(-0.5 * t * t) / _SQRT2PI
        return d * float(np.sum((f[1:] + f[:-1]) * np.diff(t)) / 2)  # the trapezoidal rule

    # τ between "everything below the top quantile" and "the top quantile alone carries mass 1"
    hi = a * sigma * t_eps
    lo = hi - 1.0
    while mass(lo) < 1:
        lo -= 1.0
    tau = _bisect(lambda t: mass(t) - 1, lo, hi, iters=100)
    return tau, 1 - _NORMAL.cdf(tau / (a * sigma))


def gaussian(vocab_size: int, std: float, alpha: float = 1.5, method: str = "auto",
             return_support: bool = False) -> Union[float, tuple[float, float]]:
    r"""Data-free estimate of the α-entmax threshold of ``vocab_size`` i.i.d. :math:`N(0, \sigma^2)` logits.

    Following Tezekbayev et al. (2022) Appendix B.2, the sorted logits are replaced by their asymptotic means
    :math:`\sigma \Phi^{-1}(1 - i/d)` and sums by integrals over :math:`x = i/d \in [\varepsilon, p]`,
    :math:`\varepsilon = 1/d`:

    * ``method="paper"`` (α = 1.5 only): Lemma 2 verbatim — solve eq. (12) for the support fraction
      :math:`p^*`, then :math:`\tau = (\sigma/2) \Phi^{-1}(1 - p^*)`.  With ``std = linear_logit_std(512, V)``
      this is eq. (4) and reproduces Table 3.
    * ``method="integral"`` (any α > 1): solve the normalization directly,
      :math:`d \int_\varepsilon^1 [(\alpha-1) \sigma \Phi^{-1}(1-x) - \tau]_+^{1/(\alpha-1)}\, dx = 1`, by quadrature; the
      support fraction is :math:`p = 1 - \Phi(\tau / ((\alpha-1) \sigma))`.
    * ``"auto"``: ``"paper"`` at α = 1.5, else ``"integral"``.

    Computed once in float64 (NumPy and :class:`statistics.NormalDist`), not traced: a number to pass to
    :func:`softargmax_jax.alpha_relu`.

    Args:
        vocab_size: the number of logits :math:`d \ge 2`.
        std: their standard deviation :math:`\sigma > 0` (for example :func:`linear_logit_std`).
        alpha: a finite number > 1 (``method="paper"``: 1.5 only). Default: ``1.5``.
        method: ``"paper"``, ``"integral"`` or ``"auto"`` (above). Default: ``"auto"``.
        return_support: also return the support fraction :math:`p`. Default: ``False``.

    Returns:
        :math:`\tau` (entmax parametrization), a float, or the pair :math:`(\tau, p)` with ``return_support=True``.

    Examples:
        Table 3 of Tezekbayev et al. (2022), WMT'14 En→De (:math:`d_{\text{model}} = 512`, 40,000 classes):
        :math:`p^* = 0.0171` and :math:`\hat\tau = 0.17`.

        >>> from softargmax_jax.alpha_relu_tau import gaussian, linear_logit_std
        >>> tau, p = gaussian(40000, linear_logit_std(512, 40000), return_support=True)
        >>> round(tau, 2), round(p, 4)
        (0.17, 0.0171)

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up
        Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not (std > 0 and math.isfinite(std)):
        raise ValueError(f"std must be a finite number > 0, got {std!r}")
    alpha = _check_alpha(alpha)
    if method not in ("auto", "paper", "integral"):
        raise ValueError(f"method must be 'auto', 'paper' or 'integral', got {method!r}")
    if method == "auto":
        method = "paper" if alpha == 1.5 else "integral"
    if method == "paper":
        if alpha != 1.5:
            raise ValueError("method='paper' (Lemma 2) exists for alpha=1.5 only; use method='integral'")
        tau, p = _paper_lemma2(vocab_size, float(std))
    else:
        tau, p = _integral_estimate(vocab_size, float(std), alpha)
    return (tau, p) if return_support else tau
