r"""Per-token statistics of the prediction, for logging and RL-style uses: its support size and entropy.

For a prediction :math:`p` (one token's row):

* ``support_size`` :math:`= |\{j : p_j > 0\}|`, the number of classes with non-zero probability
  (the vocabulary size for softmax, unless probabilities underflow to 0);
* ``entropy`` :math:`= H(p) = -\sum_{j:\,p_j > 0} p_j \log p_j`, the Shannon entropy in nats
  (:math:`0 \log 0 = 0`), the quantity RL and distillation libraries log for softmax policies, here
  for every mapping, so that runs with different mappings compare on one scale.  For the α-ReLU
  mapping, whose :math:`p` is not normalized, it is the same sum on the unnormalized :math:`p`.

Both are computed one chunk of tokens at a time from the prediction of the fused loss's own
forward, detached (no gradient).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from .._utils.checks import compute_dtype
from ..backends import TileFlags
from ._rows import RowsCompute
from ._targets import Target

__all__ = ["PredictionStats"]


class PredictionStats(NamedTuple):
    r"""Per-token statistics of the prediction :math:`p`: its Shannon entropy and its support size.

    .. math::

        H(p) = -\sum_{j:\,p_j > 0} p_j \log p_j, \qquad \lvert\{j : p_j > 0\}\rvert,

    each of the target's batch shape, returned by
    :func:`~softargmax.losses.linear.linear_fenchel_young_loss` with ``return_stats=True``.  For the
    α-ReLU mapping, whose :math:`p` is not normalized, the entropy is the same sum on that :math:`p`.

    Args:
        entropy: :math:`H(p)` in nats (:math:`0 \log 0 = 0`), in the loss's compute dtype.
        support_size: the number of non-zero entries of :math:`p` (``torch.long``).

    Shape:
        - entropy, support_size: the target's batch shape :math:`(*)`.

    Examples:
        A uniform prediction over :math:`s` classes has entropy :math:`\log s`:

        >>> import math, torch, softargmax as sa
        >>> hidden, weight = torch.ones(1, 2), torch.tensor([[1.0, 0.0], [1.0, 0.0], [-5.0, 0.0]])
        >>> loss, stats = sa.linear_fenchel_young_loss(hidden, weight, torch.tensor([0]), mapping="sparsemax",
        ...                                            return_stats=True)
        >>> stats.support_size, torch.allclose(stats.entropy, torch.tensor([math.log(2)]))
        (tensor([2]), True)

    References:
        Claude E. Shannon, *A Mathematical Theory of Communication*, Bell System Technical Journal
        27, 1948, https://doi.org/10.1002/j.1538-7305.1948.tb01338.x
    """

    entropy: Tensor
    support_size: Tensor


PredictionStats.entropy.__doc__ = (r"Shannon entropy :math:`-\sum_j p_j \log p_j` in nats (:math:`0 \log 0 = 0`), in the "
                                   "loss's compute dtype.")
PredictionStats.support_size.__doc__ = r"Number of non-zero entries of :math:`p` (``torch.long``)."


#: rows of a half-precision prediction converted to float32 at once by :meth:`StatsSink.add`
STATS_ROWS = 64


class StatsSink:
    """Collects the statistics of each chunk's prediction, in the order of the chunks."""

    def __init__(self) -> None:
        self.entropy: list[Tensor] = []
        self.support: list[Tensor] = []

    def add(self, p: Tensor) -> None:
        """Record the rows of ``p`` (``[R, V]``); a half-precision ``p`` (the fused loss's chunks on the GPU
        kernels' route) is converted to float32 :data:`STATS_ROWS` rows at a time, so each term of the
        entropy is computed in float32 with no float32 copy of the whole chunk."""
        cdt = compute_dtype(p.dtype)
        if p.dtype == cdt or p.shape[0] == 0:
            self.entropy.append(-torch.special.xlogy(p, p).sum(-1, dtype=cdt))
        else:
            self.entropy.append(torch.cat([-torch.special.xlogy(q, q).sum(-1)
                                           for q in (rows.to(cdt) for rows in p.split(STATS_ROWS))]))
        self.support.append((p > 0).sum(-1))

    def result(self, batch_shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> PredictionStats:
        if not self.entropy:  # no token
            return PredictionStats(torch.zeros(batch_shape, dtype=dtype, device=device),
                                   torch.zeros(batch_shape, dtype=torch.long, device=device))
        return PredictionStats(torch.cat(self.entropy).reshape(batch_shape),
                               torch.cat(self.support).reshape(batch_shape))

    def recording(self, compute: RowsCompute) -> RowsCompute:
        """``compute(theta, part)`` of the fused loss, with the prediction recorded before it is overwritten by
        the gradient (the row function is called with ``inplace=False``)."""

        def compute_and_record(theta: Tensor, part: Target, inplace: bool = True, scale: Optional[Tensor] = None,
                               overwrite: bool = False, tiles: Optional[TileFlags] = None) -> tuple[Tensor, Tensor, Tensor]:
            loss, p, G = compute(theta, part, inplace=False, scale=scale, tiles=tiles)
            self.add(p)
            return loss, p, G

        return compute_and_record
