r"""What every threshold solver returns: one :class:`Solution`, whichever backend ran.

The PyTorch solver (:mod:`softargmax.solvers.threshold`), the fused CPU row solver and the GPU
kernels all return this class, and its consumers (the autograd functions, the losses)
use only its fields and methods below, never the backend's name:

* ``tau``, ``p``, ``s_sum``, ``block_index``, ``k``, ``bad_rows``: always set;
* :meth:`jvp`: the backward of the mapping, for every backend (the PyTorch and C
  solvers keep the Jacobian weights ``s``; the GPU kernels recompute them from ``p``
  in their own JVP kernel and leave ``s`` as ``None``);
* :meth:`inner` and :meth:`f_sum`: the two row sums of the Fenchel–Young loss value,
  :math:`\langle \theta, p\rangle` and :math:`\sum_j q_j [f(p_j/q_j) - f(0)]`; a backend that computed them in the
  pass that wrote ``p`` (the GPU kernels) hands them over in ``zp`` and ``omega``, and
  otherwise they are computed here from the candidates.

This module imports nothing from the solvers, so the solvers and the backends import it
without a cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ..divergences import Divergence

__all__ = ["Solution", "sum_f_minus_f0"]


@dataclass
class Solution:
    r"""The threshold of every row and the mapping evaluated on the candidates.

    For rows :math:`z` and a generator :math:`f`, the threshold :math:`\tau` of each row, the mapping
    :math:`p_j = q_j\, g(z_j - \tau)` and the Jacobian weights :math:`s_j = q_j\, g'(z_j - \tau)`,
    :math:`g = (f^*)'`, which give the backward in one pass (:meth:`jvp`):

    .. math::

        \frac{\partial p}{\partial z} = \operatorname{diag}(s) - \frac{s s^\top}{\sum_j s_j}.

    Every threshold solver returns one (the PyTorch solver, the fused CPU row solver, the GPU
    kernels), and its consumers use only its fields and methods.

    Attributes:
        tau: ``[R, 1]`` thresholds in the f-divergence parametrization of ``z``.
        p: ``[R, K]`` probabilities of the candidates.
        s: ``[R, K]`` Jacobian weights :math:`q_j g'(z_j - \tau)` (0 off the support), or ``None``
            where the backend's :attr:`jvp_kernel` recomputes them (the GPU kernels).  Use
            :meth:`jvp` rather than ``s``.
        s_sum: ``[R, 1]`` their row sums (from the last Newton evaluation).
        block_index: ``None`` when the candidates are the full rows; otherwise
            ``[R, B, KB]`` indices into ``z.view(R, B, nb)`` along the last axis.
        k: the row length.
        bad_rows: ``[R, 1]`` boolean, rows with NaN or ``+inf``, or ``None`` (no bad row, or
            not checked on the host: a backend that avoids device synchronization always
            returns the tensor, possibly all ``False``).
        iterations: Newton (or bisection) steps taken (``-1``: not counted, GPU kernels).
        jvp_kernel: the backend's ``jvp_kernel(v, scale)`` returning the dense
            :math:`\mathrm{scale} \cdot s \odot (v - \langle s, v\rangle/\sum_j s_j)` (used by
            :meth:`jvp`). Default: ``None`` (:meth:`jvp` computes it from ``s``).
        zp, omega: ``[R]`` row sums :math:`\langle z, p\rangle` and :math:`\sum_{p_j > 0} q_j [f(p_j/q_j) - f(0)]`
            (with the ``q`` the backend solved with, 1 for most) computed by the backend (used by :meth:`inner`
            and :meth:`f_sum`).
            Default: ``None`` (computed from the candidates).
        omega_star: ``[R]`` float64, the conjugate of every row,
            :math:`\Omega^*(z) = \tau + \sum_j [f^*(z_j - \tau) + f(0)]`, which equals
            :math:`\langle z, p\rangle - \sum_j [f(p_j) - f(0)]` at the root and is stationary in :math:`\tau`
            (its derivative is :math:`1 - \sum_j p_j`), so the solver's residual enters it at second order
            (``q = 1``, finite :math:`f(0)`; the C solver's Jensen–Shannon and squared Hellinger, and
            :mod:`softargmax.solvers.row_blocks` for a generator no backend covers, for the loss values).
            Default: ``None``.
        backend: which solver ran (``"torch"``, ``"cpu"``, ``"triton"``), for tests and
            diagnostics only. Default: ``"torch"``.
        nan_written: the backend already wrote NaN into ``p`` in the bad rows (then
            :meth:`dense_p` needs no masking pass). Default: ``False``.

    Examples:
        Sparsemax (the χ² generator, :math:`g(u) = \max(u, 0)`, so :math:`s` is the support's
        indicator): the backward of :meth:`jvp` is autograd's:

        >>> import torch, softargmax as sa
        >>> from softargmax.divergences import get_divergence
        >>> from softargmax.solvers.threshold import solve
        >>> z = torch.tensor([[1.0, 0.8, -1.0]], requires_grad=True)
        >>> sol = solve(z.detach(), get_divergence("chi_square"))
        >>> sol.tau, sol.dense_p()
        (tensor([[0.4000]]), tensor([[0.6000, 0.4000, 0.0000]]))
        >>> v = torch.tensor([[1.0, 0.0, 2.0]])
        >>> sol.jvp(v), torch.autograd.grad(sa.sparsemax(z), z, v)[0]
        (tensor([[ 0.5000, -0.5000,  0.0000]]), tensor([[ 0.5000, -0.5000,  0.0000]]))

    References:
        Vincent Roulet, Tianlin Liu, Nino Vieillard, Michael E. Sander and Mathieu Blondel, *Loss
        Functions and Operators Generated by f-Divergences*, 2025, https://arxiv.org/abs/2501.18537

        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
    """

    tau: Tensor
    p: Tensor
    s: Optional[Tensor]
    s_sum: Tensor
    block_index: Optional[Tensor]
    k: int
    bad_rows: Optional[Tensor]
    iterations: int
    jvp_kernel: Optional[Callable[[Tensor, float], Tensor]] = None
    zp: Optional[Tensor] = None
    omega: Optional[Tensor] = None
    omega_star: Optional[Tensor] = None
    backend: str = "torch"
    nan_written: bool = False

    def gather(self, full: Tensor) -> Tensor:
        """``[R, k]`` -> ``[R, K]``: values at the candidates."""
        idx = self.block_index
        if idx is None:
            return full
        R, B, KB = idx.shape
        return full.reshape(R, B, self.k // B).gather(2, idx).reshape(R, B * KB)

    def scatter(self, cand: Tensor) -> Tensor:
        """``[R, K]`` -> ``[R, k]``, zeros outside the candidates (padding slots hold zeros)."""
        idx = self.block_index
        if idx is None:
            return cand
        R, B, KB = idx.shape
        out = cand.new_zeros(R, B, self.k // B)
        out.scatter_add_(2, idx, cand.reshape(R, B, KB))
        return out.reshape(R, self.k)

    def dense_p(self) -> Tensor:
        """The full ``[R, k]`` output, NaN in bad rows."""
        p = self.scatter(self.p)
        if self.bad_rows is not None and not self.nan_written:
            p = p.masked_fill(self.bad_rows, math.nan)
        return p

    # -- the backward ------------------------------------------------------------------

    def centered(self, v: Tensor) -> tuple[Tensor, Tensor]:
        r"""``(s ⊙ v, c)`` on the candidates, :math:`c = \langle s, v\rangle / \sum_j s_j` per row (``v``: ``[R, k]``).

        Needs :attr:`s` (the PyTorch and C solvers); :math:`\sum_j s_j = 0` only in all-masked rows,
        where ``s ⊙ v = 0`` too, so ``c = 0`` there.
        """
        if self.s is None:
            raise RuntimeError("this solution keeps no Jacobian weights; use Solution.jvp")
        sv = self.s * self.gather(v)
        c = sv.sum(-1, keepdim=True) / self.s_sum.clamp_min(torch.finfo(self.s_sum.dtype).tiny)
        return sv, c

    def jvp(self, v: Tensor, temperature: float = 1.0) -> Tensor:
        r"""The dense ``[R, k]`` gradient :math:`s \odot (v - \langle s, v\rangle/\sum_j s_j) / \beta` for an incoming ``v`` ``[R, k]``.

        ``β`` is the temperature the scores were divided by.  NaN in bad rows.
        """
        if self.jvp_kernel is not None:
            return self.jvp_kernel(v, 1.0 / temperature)
        sv, c = self.centered(v)
        assert self.s is not None  # centered() raised otherwise
        gx = torch.addcmul(sv, self.s, c, value=-1.0)  # s ⊙ (v - c)
        if temperature != 1.0:
            gx = gx.div_(temperature)
        gx = self.scatter(gx)
        if self.bad_rows is not None:
            gx = gx.masked_fill(self.bad_rows, math.nan)
        return gx

    # -- the Fenchel–Young loss value ----------------------------------------------------

    def inner(self, theta: Tensor, beta: float = 1.0, use_row_sums: bool = True,
              dtype: Optional[torch.dtype] = None) -> Tensor:
        r""":math:`\langle \theta, p\rangle` per row ``[R]``, for :math:`\theta = \beta z` the unscaled scores of these rows (``[R, k]``).

        Entries with ``p_j = 0`` add nothing (``0 · (-inf)`` does not become NaN).  With
        ``use_row_sums=False`` the backend's :math:`\langle z, p\rangle` is not used (for a ``z`` that is not
        ``θ / β``, e.g. shifted by the row maximum).  ``dtype``: of the result (default ``theta``'s;
        float32 for half-precision rows keeps the row sum unrounded).
        """
        dtype = dtype or theta.dtype
        if self.zp is not None and use_row_sums:  # the backend's row sums, from the pass that wrote p
            return (beta * self.zp).to(dtype)
        pc = self.p
        th_c = self.gather(theta)
        return torch.where(pc > 0, th_c * pc, torch.zeros_like(pc)).sum(-1, dtype=dtype)

    def f_sum(self, div: Divergence, q: Optional[Tensor], f0: float, dtype: torch.dtype) -> Tensor:
        r""":math:`\sum_{p_j > 0} q_j [f(p_j/q_j) - f(0)]` per row ``[R]`` (``q``: ``None`` or ``[R|1, k]``; ``f0 = f(0)`` finite)."""
        if self.omega is not None:  # the backend's, with the q it solved with
            return self.omega.to(dtype)
        R = self.p.shape[0]
        q_c = None if q is None else self.gather(q.expand(R, self.k))
        return sum_f_minus_f0(div, self.p, q_c, f0)


def sum_f_minus_f0(div: Divergence, p: Tensor, q: Optional[Tensor], f0: Union[float, Tensor],
                   dtype: Optional[torch.dtype] = None) -> Tensor:
    """``Σ_j q_j [f(p_j/q_j) - f(0)]`` over the entries with ``p_j > 0``, each term in ``p``'s dtype, summed in
    ``dtype`` (default: ``p``'s)."""
    pos = p > 0
    ratio = p if q is None else p / q
    vals = div.f(torch.where(pos, ratio, torch.ones_like(ratio))) - f0
    if q is not None:
        vals = vals * q
    return torch.where(pos, vals, torch.zeros_like(vals)).sum(-1, dtype=dtype)
