"""``torch.nn`` modules wrapping the operators, by role:

* :mod:`.activations`: :class:`Sparsemax`, :class:`Entmax15`, :class:`Entmax` (optionally
  learnable α), :class:`AlphaReLU` (optionally calibrating τ on its first training batch),
  :class:`FSoftargmax` (optionally learnable reference measure ``q``), :class:`Normmax`,
  :class:`BudgetSparsemax`;
* :mod:`.losses`: :class:`FenchelYoungLoss` and the named :class:`SparsemaxLoss`,
  :class:`Entmax15Loss`, :class:`EntmaxLoss`, :class:`AlphaReLULoss`,
  :class:`FDivergenceLoss` (options of :func:`softargmax.losses.fenchel_young_loss`),
  :class:`NormmaxLoss`, :class:`BudgetSparsemaxLoss`;
* :mod:`.attention`: :class:`SparseMultiheadAttention` and :func:`convert_attention`.

Every class is importable from ``softargmax.nn`` itself.
"""

from .activations import AlphaReLU, BudgetSparsemax, Entmax, Entmax15, FSoftargmax, Normmax, Sparsemax
from .attention import SparseMultiheadAttention, convert_attention
from .losses import (
    AlphaReLULoss,
    BudgetSparsemaxLoss,
    Entmax15Loss,
    EntmaxLoss,
    FDivergenceLoss,
    FenchelYoungLoss,
    NormmaxLoss,
    SparsemaxLoss,
)

__all__ = [
    "Sparsemax",
    "Entmax15",
    "Entmax",
    "AlphaReLU",
    "FSoftargmax",
    "FenchelYoungLoss",
    "SparsemaxLoss",
    "Entmax15Loss",
    "EntmaxLoss",
    "AlphaReLULoss",
    "FDivergenceLoss",
    "Normmax",
    "BudgetSparsemax",
    "NormmaxLoss",
    "BudgetSparsemaxLoss",
    "SparseMultiheadAttention",
    "convert_attention",
]
