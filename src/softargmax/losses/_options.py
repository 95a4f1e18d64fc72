"""The options every Fenchel–Young loss takes, gathered once: :class:`LossOptions`.

The public losses keep their explicit keyword signatures; each gathers its keywords into one
:class:`LossOptions` (:meth:`LossOptions.of`) and hands that on, so no layer relays a dozen
keywords by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from torch import Tensor

__all__ = ["LossOptions"]


@dataclass(frozen=True)
class LossOptions:
    """The options of :func:`softargmax.losses.fenchel_young_loss` and its relatives (their meaning is
    documented there); the fused loss's ``class_weight`` is ``weight`` here."""

    dim: int = -1
    q: Optional[Tensor] = None
    temperature: float = 1.0
    multilabel: bool = False
    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    weight: Optional[Tensor] = None
    return_prediction: bool = False
    softcap: Optional[float] = None
    process_group: object = None
    class_offset: Optional[int] = None
    chunk_size: Optional[int] = None
    memory_budget: Optional[int] = None

    @classmethod
    def of(cls, arguments: dict, **renamed) -> LossOptions:
        """The options among a function's ``arguments`` (its ``locals()``: the names that are fields
        here), and ``renamed`` ones given by their field name (they win over an argument of that
        name: the fused loss's ``weight`` is its projection, its ``class_weight`` the option)."""
        return cls(**{k: v for k, v in arguments.items() if k in _FIELDS and k not in renamed}, **renamed)

    def replace(self, **changes) -> LossOptions:
        return dataclasses.replace(self, **changes)


#: the fields' names (read once: ``torch.compile`` traces :meth:`LossOptions.of`, not ``dataclasses.fields``)
_FIELDS = frozenset(f.name for f in dataclasses.fields(LossOptions))
