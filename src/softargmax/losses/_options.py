"""The options every Fenchel–Young loss takes, gathered once: :class:`LossOptions`.

The public losses keep their explicit keyword signatures; each gathers its keywords into one
:class:`LossOptions` and hands that on, so no layer relays a dozen keywords by name.  They name
each keyword (``LossOptions(dim=dim, ...)``) rather than gather ``locals()``: Dynamo in torch 2.11
cannot trace ``locals()``, which broke ``torch.compile(fullgraph=True)`` of every loss there (torch
2.13 traces it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["LossOptions", "LossOutput"]

#: what a loss returns: the loss, or a pair with ``return_prediction`` (``return_stats``).  Written
#: ``Tensor | Any``, not as the union of the two forms, so that ``loss.backward()`` type-checks without
#: a test (typeshed's convention for a return type that depends on an argument's value)
LossOutput = Union[Tensor, Any]


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
    process_group: Optional[ProcessGroup] = None
    class_offset: Optional[int] = None
    chunk_size: Optional[int] = None
    memory_budget: Optional[int] = None

    def replace(self, **changes: Any) -> LossOptions:
        return dataclasses.replace(self, **changes)
