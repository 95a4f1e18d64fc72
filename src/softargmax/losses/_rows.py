r"""What a loss minimizes, row by row: :class:`RowLoss`, the one loss object of the one-process,
fused and vocabulary-parallel losses.

For a regularizer :math:`\Omega` with prediction map :math:`p = \nabla\Omega^*(\theta)`:

.. math::

    \ell(\theta, y) = \Omega^*(\theta) + \Omega(y) - \langle\theta, y\rangle
    = \langle\theta, p - y\rangle + \Omega(y) - \Omega(p) \ge 0,

so one solve gives the value, the prediction and the gradient :math:`p - y` of a row (Blondel,
Martins & Niculae, 2020).  A :class:`RowLoss` is one such :math:`\Omega` with its parameters,
validated once where it is made; :meth:`RowLoss.rows` is the template every loss follows
(the value and the prediction from the subclass's :meth:`RowLoss.values`, then ``p - y``,
NaN in rows with NaN scores or targets, 0 in ignored rows).  The subclasses:
:class:`~softargmax.losses._row_losses.FenchelYoungRowLoss` (every f-divergence),
:class:`~softargmax.losses._row_losses.AlphaReLURowLoss`, and the normmax and budget
sparsemax losses of :mod:`softargmax.losses.normmax_budget`.

References:

* Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*, JMLR 2020, https://arxiv.org/abs/1901.02324
"""

from __future__ import annotations

import abc
import math
from typing import Callable, Optional

import torch
from torch import Tensor

from .._utils.checks import compute_dtype
from .._utils.rows import Rows
from ..backends import TileFlags, loss_gradient
from ..backends.solution import Solution
from ..divergences import Divergence
from ._targets import Target

__all__ = ["RowLoss", "p_minus_y", "scaled_gradient", "kept_rows"]

#: ``compute(theta, ...) -> (loss [R], p [R, k], p - y [R, k])``: a loss's rows as the loss paths call them
RowsCompute = Callable[..., tuple[Tensor, Tensor, Tensor]]
#: ``solve(z, divergence, q) -> (Solution, S)``: the threshold of rows whose classes are split over processes
SplitSolve = Callable[[Tensor, Divergence, Optional[Tensor]], tuple[Solution, Tensor]]
#: :meth:`RowLoss.split_values`: ``(this process's terms [R], p, bad rows or None, correction [R] or None)``
SplitValues = tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]


class RowLoss(abc.ABC):
    """The loss of one regularizer, row by row (a template method: :meth:`rows` calls :meth:`values`).

    Attributes:
        name: the mapping's name, for messages.
    """

    name: str = "loss"
    #: whether the gradient ``p - y`` can hold exact zeros (outside the support and the target): the
    #: fused output layer then skips the all-zero tiles of ``G`` (:mod:`softargmax.backends.tile_flags`)
    sparse_gradient: bool = False

    def bind(self, q: Optional[Tensor], temperature: float, like: Tensor, rows: Rows) -> RowLoss:
        """This loss with a reference measure ``q`` and a temperature, checked once, for the rows ``rows``.

        ``like``: scores (or a ``meta`` stand-in) that ``q`` must broadcast to; ``rows``: their row
        layout (class and row parameters become ``[R|1, k]`` and ``[R, 1]`` there).  The default
        takes neither ``q`` nor a temperature (α-ReLU, normmax, budget).
        """
        if q is not None:
            raise ValueError(f"q: the {self.name} mapping takes no reference measure (q must be None)")
        if temperature != 1.0:
            raise ValueError(f"temperature: the {self.name} mapping takes no temperature (got {temperature!r})")
        return self

    @abc.abstractmethod
    def values(self, theta: Tensor, target: Target) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """``(loss [R], p [R, k], bad rows [R, 1] or None)`` of rows ``theta`` ``[R, k]``."""

    def solves_in_dtype(self, rows: Tensor, prediction: bool = False) -> bool:
        """Whether half-precision rows ``rows`` ``[R, k]`` are computed in their own dtype (no float32
        copy; the per-row values in float32); ``prediction``: the caller also needs ``p``.
        Default: ``False`` (the rows are converted first)."""
        return False

    def rows(self, theta: Tensor, target: Target, inplace: bool = False, scale: Optional[Tensor] = None,
             overwrite: bool = False, tiles: Optional[TileFlags] = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(loss [R], p [R, k], G = (p - y) · scale [R, k])``; ignored rows have loss 0 and ``G = 0``.

        ``inplace``: ``G`` is written over ``p`` (the returned ``p`` is then ``G``); ``scale``: ``[R]``
        row multipliers of ``G`` (the fused loss's item weights over its denominator; default 1);
        ``overwrite``: ``theta`` is the caller's own buffer, which ``G`` may overwrite (the fused
        loss's logits; the returned ``p`` is then ``G`` too).  ``G`` is written by one pass of the
        GPU loss kernels where they run (:mod:`softargmax.backends.triton.losses`), with no device
        synchronization on any device.  ``tiles``: cleared marks of ``G``'s tiles, which the loss kernel
        sets where a tile holds a non-zero entry (then ``tiles.written``; elsewhere they stay unwritten).
        """
        fast = self.fused_rows(theta, target, inplace, scale, overwrite, tiles)
        if fast is not None:
            return fast
        loss, p, bad = self.values(theta, target)
        G = scaled_gradient(p, target, inplace, scale, tiles)
        if bad is not None:
            loss = loss.masked_fill(bad.squeeze(1), math.nan)
        return kept_rows(loss, target), p, G

    def fused_rows(self, theta: Tensor, target: Target, inplace: bool, scale: Optional[Tensor],
                   overwrite: bool, tiles: Optional[TileFlags] = None) -> Optional[tuple[Tensor, Tensor, Tensor]]:
        """:meth:`rows` by a kernel that needs no ``p`` of :meth:`values` (the softmax loss), or ``None``."""
        return None

    # -- the classes split over processes (softargmax.losses.distributed) --------------------
    def split_values(self, theta: Tensor, target: Target, solve: SplitSolve) -> SplitValues:
        """``(this process's terms of the loss [R], p, bad rows, correction)`` for the slice ``theta``
        of the classes (``target``: the slice's, with ``owned``); ``solve(z, divergence, q) ->
        (Solution, S)`` is the threshold over all processes.  The terms are summed over the
        processes, then ``correction`` (``[R]`` or ``None``) is subtracted."""
        raise TypeError(f"process_group: the {self.name} loss has no vocabulary-parallel form")

    def split_rows(self, theta: Tensor, target: Target,
                   solve: SplitSolve) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
        """:meth:`split_values` and the local ``p - y``; ``p`` and ``G`` are NaN in bad rows."""
        partial, p, bad, correction = self.split_values(theta, target, solve)
        G = p_minus_y(p, target)
        if bad is not None:
            p, G = p.masked_fill(bad, math.nan), G.masked_fill(bad, math.nan)
        return partial, p, G, bad, correction

    def describe(self) -> str:
        """A canonical description of the loss and its parameters (the processes compare it)."""
        return repr(self)

    def row_parameters(self) -> Optional[Tensor]:
        """A per-row parameter that :meth:`describe` leaves out (a per-row α), else ``None``."""
        return None

    def operator_spec(self) -> Optional[tuple[str, float, float]]:
        """``(mapping, parameter, tau)`` naming the loss to the ``torch.library`` operator, or ``None`` (stays eager)."""
        return None


def kept_rows(loss: Tensor, target: Target) -> Tensor:
    """The rows' losses as every row loss returns them: a probability target with NaN gives NaN
    in its row (as ``F.cross_entropy``), never a finite number (the formulas skip the entries
    where ``y > 0`` is false, NaN included); ignored rows give 0."""
    if target.dense is not None and target.smoothing == 0:  # (smoothed class indices hold no NaN)
        loss = loss.masked_fill(torch.isnan(target.dense).any(-1), math.nan)
    return torch.where(target.keep, loss, torch.zeros_like(loss))


def p_minus_y(p: Tensor, target: Target, inplace: bool = False, scale: Optional[Tensor] = None) -> Tensor:
    """``(p - y) · scale`` with ``y`` the target's rows (class indices: those of ``target.owned`` only,
    where given; ``scale``: ``[R]`` row multipliers or ``None`` for 1), zero in ignored rows; with
    ``inplace`` written over ``p``.

    ``G`` has ``p``'s dtype (the input's on the half-precision GPU path: a float32 target is
    subtracted in float32 and rounded once).  No device synchronization: the ignored rows are
    zeroed by one in-place pass, after the scaling (so a NaN scale leaves them 0), unless the
    target is known to keep every row (``target.all_kept``), never after reading ``keep``.
    """
    if target.dense is not None:
        G = p.sub_(target.dense) if inplace else torch.sub(p, target.dense).to(p.dtype)
    else:
        G = p if inplace else p.clone()
        assert target.index is not None  # a target holds class indices or distributions
        if G.shape[1]:
            minus = -torch.ones_like(G[:, :1]) if target.owned is None else -target.owned.to(G.dtype).unsqueeze(1)
            G.scatter_add_(1, target.index.unsqueeze(1), minus)
    if scale is not None:
        G = G.mul_(scale.to(compute_dtype(G.dtype)).unsqueeze(1))
    if not target.all_kept:
        G = G.masked_fill_(~target.keep.unsqueeze(1), 0.0)
    return G


def scaled_gradient(p: Tensor, target: Target, inplace: bool = False, scale: Optional[Tensor] = None,
                    tiles: Optional[TileFlags] = None) -> Tensor:
    """``(p - y) · scale`` per row, zero in ignored rows (``scale``: ``[R]`` or ``None`` for 1); with
    ``inplace`` written over ``p``.  One pass of the GPU loss kernel where it runs (which marks ``tiles``,
    where given), else :func:`p_minus_y`."""
    if target.owned is None:
        G = loss_gradient(p, target.index, target.dense, target.keep, scale, out=p if inplace else None,
                          tiles=tiles)
        if G is not None:
            return G
    return p_minus_y(p, target, inplace, scale)
