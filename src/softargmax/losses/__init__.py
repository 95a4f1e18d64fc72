"""The losses: Fenchel–Young losses of every operator, fused with the output layer, distributed.

The Fenchel–Young losses of every operator (:mod:`.functional`), the fused linear + loss
(:mod:`.linear`), a teacher's logits as its target (:mod:`.teacher`), the normmax and
budget-sparsemax losses (:mod:`.normmax_budget`) and the vocabulary-parallel losses
(:mod:`.distributed`).  On a GPU the range check of class indices is read without waiting for the
device, at a later call; :func:`check_class_indices` (:mod:`.index_check`) reads it now.

Private: ``_targets`` (targets and reductions), ``_options`` (the options every loss takes, gathered
once), ``_rows`` (the loss object: :class:`~softargmax.losses._rows.RowLoss`, per-row values and p − y),
``_row_losses`` (its Fenchel–Young and α-ReLU kinds, and the resolver from a mapping name),
``_fenchel_young`` (the one-process loss of any row loss), ``_linear_chunks`` (the fused loss's chunks),
``_linear_recompute`` (the fused per-token loss, whose backward recomputes the chunks),
``_prediction_stats`` (support size and entropy of the prediction), ``_library_ops`` (the
``torch.library`` operators of the losses).  :mod:`.distributed` is a package by concern
(collectives, the first round's agreement, the solver, targets, the losses, DTensor).

Imports come from :mod:`softargmax.operators` and the layers below it.
"""

from .functional import *  # noqa: F403  (softargmax.losses.entmax15_loss, as before the move)
from .functional import MAPPINGS, __all__  # noqa: F401
from .index_check import check_class_indices

__all__ = __all__ + ["check_class_indices"]  # (a new list: functional's is unchanged)
