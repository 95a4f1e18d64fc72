r"""Sampling from a sparse distribution over classes: sparsemax, entmax, any f-softargmax of the scores.

Entmax sampling (Martins, Marinho & Martins, *Sparse Text Generation*, EMNLP 2020,
https://arxiv.org/abs/2004.02644) draws the next token from ``p = α-entmax(logits / T)``
instead of ``softmax(logits / T)``: tokens off the support have probability exactly zero,
so the tail is cut by the model itself rather than by a top-k or top-p threshold.  The
same holds for every f-softargmax with a sparse generator (sparsemax, α > 1, ...), and for
a reference measure ``q`` (Roulet, Niculae et al., *Loss Functions and Operators Generated
by f-Divergences*, ICML 2025, https://arxiv.org/abs/2501.18537).

:func:`log_probabilities` returns ``log p`` (``-inf`` off the support), the form Transformers'
``generate`` expects from a logits processor: its softmax of ``log p`` is ``p`` again, so
its multinomial draw is exactly from ``p``
(:class:`softargmax.integrations.huggingface_sampling.SparseSamplingProcessor`).
:func:`sample` draws indices for users outside Transformers.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_positive_number, check_tensor
from ..divergences import Divergence
from .fdiv import f_softargmax
from .mappings import resolve

__all__ = ["probabilities", "log_probabilities", "sample"]


def probabilities(logits: Tensor, mapping: Union[str, Divergence] = "entmax15", *, alpha: Optional[float] = None,
                  q: Optional[Tensor] = None, temperature: float = 1.0) -> Tensor:
    r"""``p = mapping(logits / temperature)`` along the last dimension, in float32 (float64 for float64 input).

    Args:
        logits: ``[..., V]`` scores; ``-inf`` entries get probability 0 (a row needs a finite one).
        mapping: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``), a divergence
            name (``"jensen_shannon"``, ...) or a :class:`~softargmax.divergences.Divergence`.
        alpha: α of ``"entmax"`` / ``"alpha"``.
        q: optional reference measure, positive, broadcastable to ``logits`` (e.g. ``[V]``).
        temperature: ``T > 0``; small ``T`` concentrates ``p``, and for sparse mappings shrinks its support.
    """
    check_tensor(logits, "logits")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (class) dimension, got shape {tuple(logits.shape)}")
    temperature = check_positive_number(temperature, "temperature")
    x = logits.detach()
    x = x.double() if x.dtype == torch.float64 else x.float()
    if q is not None:
        check_tensor(q, "q")
        q = q.detach().to(x.dtype)
    if bool((x.amax(-1) == float("-inf")).any()):
        raise ValueError("logits: a row has no finite entry (nothing can be sampled)")
    if bool(torch.isnan(x).any()):
        raise ValueError("logits: NaN entries")
    return f_softargmax(x, resolve(mapping, alpha), q=q, temperature=temperature)


def log_probabilities(logits: Tensor, mapping: Union[str, Divergence] = "entmax15", *, alpha: Optional[float] = None,
                      q: Optional[Tensor] = None, temperature: float = 1.0) -> Tensor:
    """``log p`` of :func:`probabilities`: ``-inf`` exactly off the support (float32, float64 for float64 input)."""
    return torch.log(probabilities(logits, mapping, alpha=alpha, q=q, temperature=temperature))


def sample(logits: Tensor, mapping: Union[str, Divergence] = "entmax15", *, alpha: Optional[float] = None,
           q: Optional[Tensor] = None, temperature: float = 1.0, num_samples: int = 1,
           generator: Optional[torch.Generator] = None) -> Tensor:
    r"""Draw class indices from ``p = mapping(logits / temperature)`` (see :func:`probabilities`).

    Args:
        logits: ``[..., V]`` scores.
        num_samples: draws per row, with replacement.
        generator: a ``torch.Generator`` for reproducible draws (default: the global one).
        mapping, alpha, q, temperature: as in :func:`probabilities`.

    Returns:
        ``[..., num_samples]`` int64 indices; an index off the support (``p = 0``) is never drawn.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    p = probabilities(logits, mapping, alpha=alpha, q=q, temperature=temperature)
    flat = p.reshape(-1, p.shape[-1])
    out = torch.multinomial(flat, num_samples, replacement=True, generator=generator)
    return out.reshape(*p.shape[:-1], num_samples)
