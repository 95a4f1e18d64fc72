r"""Sparse sampling in Transformers' ``generate``: :class:`SparseSamplingProcessor`.

``model.generate(ids, do_sample=True, top_k=0, logits_processor=[SparseSamplingProcessor("entmax15")])``
draws every new token from ``p = entmax15(logits / T)`` (entmax sampling: Martins, Marinho &
Martins, *Sparse Text Generation*, EMNLP 2020, https://arxiv.org/abs/2004.02644), or from any
other mapping of :func:`softargmax.operators.sampling.probabilities`.

The processor returns ``log p`` with ``-inf`` off the support.  Transformers then takes the
softmax of the processed scores, which gives back ``p`` exactly (``exp(-inf) = 0``), and draws
with ``torch.multinomial``: a token off the support is never emitted.

Transformers applies its own warpers (``temperature``, ``top_k``, ``top_p``, ...) *before* the
processors passed in ``logits_processor``, and a model's generation config may set
``top_k=50`` by default.  To sample from ``p`` itself, pass ``top_k=0`` (and leave
``temperature=1.0`` and ``top_p=1.0``), and set the temperature on the processor.  Greedy
decoding (``do_sample=False``) is unaffected by the processor: the mode of ``p`` is the argmax
of the logits for every mapping.
"""

from __future__ import annotations

from typing import Optional, Union

from torch import Tensor

from .._utils.checks import check_positive_number
from .._utils.extras import require
from ..divergences import Divergence
from ..operators.mappings import resolve
from ..operators.sampling import log_probabilities

__all__ = ["SparseSamplingProcessor"]

require("hf", "softargmax.integrations.huggingface_sampling")

from transformers import LogitsProcessor  # noqa: E402


class SparseSamplingProcessor(LogitsProcessor):
    r"""A Transformers ``LogitsProcessor`` whose output is ``log mapping(scores / temperature)``.

    Args:
        mapping: ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``), ``"softmax"``, any
            divergence name or :class:`~softargmax.divergences.Divergence` (f-softargmax).
        alpha: α of ``"entmax"``.
        q: optional reference measure ``[V]`` (positive), for f-softargmax with a prior over tokens.
        temperature: ``T > 0``.

    Call: ``(input_ids [B, L], scores [B, V]) -> [B, V]`` float32 log-probabilities, ``-inf`` off the support.
    """

    def __init__(self, mapping: Union[str, Divergence] = "entmax15", alpha: Optional[float] = None,
                 q: Optional[Tensor] = None, temperature: float = 1.0):
        resolve(mapping, alpha)  # checks the name and α now
        self.mapping, self.alpha, self.q = mapping, alpha, q
        self.temperature = check_positive_number(temperature, "temperature")

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        q = None if self.q is None else self.q.to(scores.device)
        return log_probabilities(scores, self.mapping, alpha=self.alpha, q=q, temperature=self.temperature)

    def __repr__(self) -> str:
        return (f"SparseSamplingProcessor(mapping={self.mapping!r}, alpha={self.alpha!r}, "
                f"temperature={self.temperature!r}{'' if self.q is None else ', q=...'})")
