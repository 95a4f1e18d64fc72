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
    r"""A Transformers ``LogitsProcessor`` for entmax sampling: ``generate`` draws from a sparse mapping of the logits.

    .. math::

        \text{scores} \mapsto \log p, \qquad p = \operatorname{mapping}(\text{scores} / T),

    :func:`softargmax.operators.sampling.log_probabilities`; Transformers' softmax of :math:`\log p` is
    :math:`p` again, so tokens off the support (:math:`\log p = -\infty`) are never drawn.  Pass
    ``top_k=0`` to ``generate`` so that its own warpers leave the scores alone (the module docstring).

    Args:
        mapping: ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``), ``"softmax"``, any
            divergence name or :class:`~softargmax.divergences.Divergence` (f-softargmax).
            Default: ``"entmax15"``.
        alpha: α of ``"entmax"``. Default: ``None``.
        q: optional reference measure ``[V]`` (positive), for f-softargmax with a prior over tokens.
            Default: ``None``.
        temperature: :math:`T > 0`. Default: ``1.0``.

    Shape:
        - input_ids: :math:`(B, L)` (unused).
        - scores: :math:`(B, V)`.
        - Output: :math:`(B, V)` float32 log-probabilities, :math:`-\infty` off the support.

    Examples:
        >>> import torch
        >>> from softargmax.integrations.huggingface import SparseSamplingProcessor
        >>> processor = SparseSamplingProcessor("sparsemax")
        >>> processor
        SparseSamplingProcessor(mapping='sparsemax', alpha=None, temperature=1.0)
        >>> logp = processor(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[2.0, 1.8, 0.0, -1.0]]))
        >>> logp
        tensor([[-0.5108, -0.9163,    -inf,    -inf]])
        >>> torch.softmax(logp, -1)  # what generate samples from
        tensor([[0.6000, 0.4000, 0.0000, 0.0000]])

        In ``generate``: ``model.generate(ids, do_sample=True, top_k=0, logits_processor=[processor])``.

    References:
        Pedro Henrique Martins, Zita Marinho and André F. T. Martins, *Sparse Text Generation*,
        EMNLP 2020, https://arxiv.org/abs/2004.02644
    """

    def __init__(self, mapping: Union[str, Divergence] = "entmax15", alpha: Optional[float] = None,
                 q: Optional[Tensor] = None, temperature: float = 1.0) -> None:
        resolve(mapping, alpha)  # checks the name and α now
        self.mapping, self.alpha, self.q = mapping, alpha, q
        self.temperature = check_positive_number(temperature, "temperature")

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        q = None if self.q is None else self.q.to(scores.device)
        return log_probabilities(scores, self.mapping, alpha=self.alpha, q=q, temperature=self.temperature)

    def __repr__(self) -> str:
        return (f"SparseSamplingProcessor(mapping={self.mapping!r}, alpha={self.alpha!r}, "
                f"temperature={self.temperature!r}{'' if self.q is None else ', q=...'})")
