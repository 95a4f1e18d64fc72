r"""Choosing α-ReLU's threshold :math:`\tau` (Tezekbayev et al., 2022).

α-ReLU reproduces α-entmax when its fixed :math:`\tau` equals the threshold α-entmax would
compute, so the papers set :math:`\tau` from the model itself before training:

* :func:`from_logits` — the mean α-entmax threshold over a batch of (untrained) logits,
  the way Tezekbayev et al. (2022) §3 picks :math:`\tau` from the first batch;
* :func:`gaussian` — the data-free estimate for i.i.d. :math:`N(0, \sigma^2)` logits:
  Tezekbayev et al. (2022) Lemma 2 (α = 1.5, ``method="paper"``) and, for any α > 1, the same
  asymptotic argument evaluated by quadrature (``method="integral"``);
* :func:`linear_logit_std` — Tezekbayev et al. (2022) Lemma 3: the logit standard deviation of a
  Xavier-uniform output projection applied to layer-normalized features,
  :math:`\sqrt{2 d_{\text{model}} / (d_{\text{model}} + d_{\text{vocab}})}`; with it ``gaussian`` gives eq. (4).

Every :math:`\tau` here is in the entmax parametrization :math:`p = [(\alpha-1) z - \tau]_+^{1/(\alpha-1)}`, the one :func:`softargmax.alpha_relu` takes.

References:

* Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
"""

from __future__ import annotations

import math
from typing import Callable, Union

import torch
from torch import Tensor

from .._utils.checks import check_alpha, check_dim, check_tensor
from .._utils.rows import Rows
from ..divergences import get_divergence
from ..solvers.threshold import solve

__all__ = ["from_logits", "gaussian", "linear_logit_std", "entmax_threshold"]


def entmax_threshold(logits: Tensor, alpha: float = 1.5, dim: int = -1) -> Tensor:
    r"""The α-entmax threshold of every row, in the entmax parametrization that α-ReLU takes.

    .. math::

        \sum_j [(\alpha - 1) z_j - \tau]_+^{1/(\alpha-1)} = 1,

    so that :func:`softargmax.alpha_relu` with this :math:`\tau` equals :func:`softargmax.entmax` on the
    row.  No autograd.

    Args:
        logits: scores, any shape.
        alpha: a float > 1. Default: ``1.5``.
        dim: the dimension of the classes. Default: ``-1``.

    Returns:
        the thresholds, of ``logits``' shape without ``dim``: NaN for a row with a NaN or ``+inf``
        score, -1 for a row that is entirely ``-inf``.

    Shape:
        - logits: :math:`(*, k, *)` with :math:`k` along ``dim``.
        - Output: the input's shape without ``dim``.

    Examples:
        >>> import torch, softargmax as sa
        >>> from softargmax.operators.alpha_relu_tau import entmax_threshold
        >>> logits = torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 0.0]])
        >>> tau = entmax_threshold(logits)
        >>> tau
        tensor([-0.2553, -0.5774])
        >>> sa.alpha_relu(logits, 1.5, tau[:, None])  # equals 1.5-entmax row by row
        tensor([[0.5705, 0.4295, 0.0000],
                [0.3333, 0.3333, 0.3333]])

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding
        Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    check_tensor(logits, "logits")
    dim = check_dim(logits, dim)
    checked = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
    if isinstance(checked, Tensor):
        raise TypeError("alpha must be a float > 1")
    alpha = checked
    rows = Rows(logits.detach(), dim)
    sol = solve(rows.flat, get_divergence("alpha", alpha=alpha))
    tau_e = (alpha - 1) * sol.tau - 1  # τ_e = (α-1) τ_f - 1
    bad = (torch.isnan(rows.flat) | (rows.flat == math.inf)).any(-1, keepdim=True)  # NaN, as every solver's rows
    tau_e = torch.where(bad, torch.full_like(tau_e, math.nan), tau_e)
    return tau_e.reshape(rows.moved_shape[:-1])


def from_logits(logits: Tensor, alpha: float = 1.5, dim: int = -1) -> Tensor:
    r"""The mean α-entmax threshold over all rows of a batch of logits: α-ReLU's τ from an untrained model.

    .. math::

        \tau = \frac{1}{R} \sum_{r=1}^{R} \tau_r, \qquad
        \sum_j [(\alpha - 1) z_{rj} - \tau_r]_+^{1/(\alpha-1)} = 1,

    the way Tezekbayev et al. (2022, §3) choose :math:`\tau` from the first batch before training.
    Rows that are entirely masked (``-inf``) are left out of the mean.

    Args:
        logits: scores, any shape (for example ``[batch, length, vocab]``).
        alpha: a float > 1. Default: ``1.5``.
        dim: the dimension of the classes. Default: ``-1``.

    Returns:
        a 0-d tensor, the mean threshold (entmax parametrization).

    Raises:
        ValueError: every row is masked.

    Shape:
        - logits: :math:`(*, k, *)` with :math:`k` along ``dim``.
        - Output: :math:`()`.

    Examples:
        >>> import torch
        >>> from softargmax.operators.alpha_relu_tau import from_logits
        >>> from_logits(torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 0.0]]))
        tensor(-0.4163)

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding
        Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    tau = entmax_threshold(logits, alpha, dim)
    rows_ok = torch.isfinite(logits.detach().amax(dim))
    if not bool(rows_ok.any()):
        raise ValueError("logits: every row is masked; no threshold to average")
    return tau[rows_ok].mean()


def linear_logit_std(d_model: int, vocab_size: int) -> float:
    r"""The standard deviation of the logits of a freshly initialized output layer (Lemma 3).

    .. math::

        \sigma = \sqrt{\frac{2\, d_{\text{model}}}{d_{\text{model}} + d_{\text{vocab}}}},

    for a Xavier-uniform output projection applied to layer-normalized features (Tezekbayev et
    al., 2022, Lemma 3); :func:`gaussian` with it gives their eq. (4).

    Args:
        d_model: the size of the features, a positive int.
        vocab_size: the number of classes, a positive int.

    Returns:
        :math:`\sigma`, a float.

    Examples:
        >>> from softargmax.operators.alpha_relu_tau import linear_logit_std
        >>> round(linear_logit_std(512, 40000), 4)
        0.159

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding
        Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    for name, v in (("d_model", d_model), ("vocab_size", vocab_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return math.sqrt(2.0 * d_model / (d_model + vocab_size))


# ----------------------------------------------------------------------------------
# data-free estimate
# ----------------------------------------------------------------------------------

_SQRT2PI = math.sqrt(2 * math.pi)


def _phi(t: Tensor) -> Tensor:
    return torch.exp(-0.5 * t * t) / _SQRT2PI


def _probit(x: Tensor) -> Tensor:
    return torch.special.ndtri(x)


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
    t64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731

    def m(p: float) -> float:
        a, b = _phi(_probit(t64(eps))), _phi(_probit(t64(p)))
        return float((b - a) / (p - eps))

    def s(p: float) -> float:
        def F(x: float) -> Tensor:
            u = _probit(t64(x))
            return -_phi(u) * u + x
        return float((F(p) - F(eps)) / (p - eps)) - m(p) ** 2

    def eq12(p: float) -> float:
        inside = 4 / sigma**2 * eps / p - s(p)
        if inside < 0:
            return math.inf
        return float(_probit(t64(1 - p))) - (m(p) - math.sqrt(inside))

    # eq12 > 0 for p just above ε (the top entry alone), < 0 once too many entries are included
    lo, hi = eps * (1 + 1e-9), 1 - 1e-9
    grid = torch.logspace(math.log10(lo), math.log10(hi), 400, dtype=torch.float64).tolist()
    prev = grid[0]
    for p in grid[1:]:
        if eq12(prev) > 0 >= eq12(p):
            p_star = _bisect(eq12, prev, p)
            return sigma / 2 * float(_probit(t64(1 - p_star))), p_star
        prev = p
    raise ValueError("gaussian: Lemma 2's equation has no root for these sizes")


def _integral_estimate(d: int, sigma: float, alpha: float, points: int = 4001) -> tuple[float, float]:
    """Solve ``d ∫_{t0}^{t_ε} ((α-1) σ t - τ)^{1/(α-1)} φ(t) dt = 1`` for ``τ`` (see :func:`gaussian`)."""
    a = alpha - 1
    r = 1.0 / a
    t_eps = float(_probit(torch.tensor(1 - 1.0 / d, dtype=torch.float64)))

    def mass(tau: float) -> float:
        t0 = tau / (a * sigma)
        if t0 >= t_eps:
            return 0.0
        lo = max(t0, -12.0)
        t = torch.linspace(lo, t_eps, points, dtype=torch.float64)
        f = torch.clamp(a * sigma * t - tau, min=0) ** r * _phi(t)
        return d * float(torch.trapezoid(f, t))

    # τ between "everything below the top quantile" and "the top quantile alone carries mass 1"
    hi = a * sigma * t_eps
    lo = hi - 1.0
    while mass(lo) < 1:
        lo -= 1.0
    tau = _bisect(lambda t: mass(t) - 1, lo, hi, iters=100)
    p = 1 - float(torch.special.ndtr(torch.tensor(tau / (a * sigma), dtype=torch.float64)))
    return tau, p


def gaussian(
    vocab_size: int,
    std: float,
    alpha: float = 1.5,
    method: str = "auto",
    return_support: bool = False,
) -> Union[float, tuple[float, float]]:
    r"""Data-free estimate of the α-entmax threshold of ``vocab_size`` i.i.d. :math:`N(0, \sigma^2)` logits.

    Following Tezekbayev et al. (2022) Appendix B.2, the sorted logits are replaced by their asymptotic
    means :math:`\sigma \Phi^{-1}(1 - i/d)` and sums by integrals over :math:`x = i/d \in [\varepsilon, p]`,
    :math:`\varepsilon = 1/d`.

    * ``method="paper"`` (α = 1.5 only): Lemma 2 verbatim — solve eq. (12) for the support
      fraction :math:`p^*`, then :math:`\tau = (\sigma/2) \Phi^{-1}(1 - p^*)`.  With
      ``std = linear_logit_std(512, V)`` this is eq. (4) and reproduces Table 3.
    * ``method="integral"`` (any α > 1): solve the normalization directly,
      :math:`d \int_\varepsilon^1 [(\alpha-1) \sigma \Phi^{-1}(1-x) - \tau]_+^{1/(\alpha-1)}\, dx = 1`, by quadrature; the support
      fraction is :math:`p = 1 - \Phi(\tau / ((\alpha-1) \sigma))`.
    * ``"auto"``: ``"paper"`` at α = 1.5, else ``"integral"``.

    Args:
        vocab_size: the number of logits :math:`d \ge 2`.
        std: their standard deviation :math:`\sigma > 0` (for example :func:`linear_logit_std`).
        alpha: a float > 1 (``method="paper"``: 1.5 only). Default: ``1.5``.
        method: ``"paper"``, ``"integral"`` or ``"auto"`` (above). Default: ``"auto"``.
        return_support: also return the support fraction :math:`p`. Default: ``False``.

    Returns:
        :math:`\tau` (entmax parametrization), a float, or the pair :math:`(\tau, p)` with
        ``return_support=True``.

    Examples:
        Table 3 of Tezekbayev et al. (2022), WMT'14 En→De (:math:`d_{\text{model}} = 512`,
        40,000 classes): :math:`p^* = 0.0171` and :math:`\hat\tau = 0.17`.

        >>> from softargmax.operators.alpha_relu_tau import gaussian, linear_logit_std
        >>> tau, p = gaussian(40000, linear_logit_std(512, 40000), return_support=True)
        >>> round(tau, 2), round(p, 4)
        (0.17, 0.0171)

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding
        Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not (std > 0 and math.isfinite(std)):
        raise ValueError(f"std must be a finite number > 0, got {std!r}")
    checked = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
    if isinstance(checked, Tensor):
        raise TypeError("alpha must be a float > 1")
    alpha = checked
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
