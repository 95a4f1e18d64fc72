r"""A teacher's logits as a target of the fused loss: :func:`teacher_target`.

:func:`~softargmax.losses.linear.linear_fenchel_young_loss` takes a teacher as probability vectors
``[..., V]`` or as its top-k ``(probs, indices)``; a teacher model gives logits.  This turns them
into either, one chunk of rows at a time.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_positive_number, check_tensor, compute_dtype

__all__ = ["teacher_target"]

#: bytes of the compute-dtype copy of one chunk of rows
_CHUNK_BYTES = 2**26


def teacher_target(logits: Tensor, temperature: float = 1.0,
                   top_k: Optional[int] = None) -> Union[Tensor, Any]:  # or (probs, indices): Tensor | Any as LossOutput
    r"""The target of a teacher given as logits: its softmax at a temperature, dense or as its top-k.

    .. math::

        y = \operatorname{softmax}(\ell / T), \qquad
        \text{top-}k:\ (y_{i_1}, \dots, y_{i_k}),\ i_1, \dots, i_k \text{ the } k \text{ largest logits}.

    The top-k probabilities are those of the full softmax (not renormalized over the k classes),
    so they sum to at most 1, and :func:`~softargmax.losses.linear.linear_fenchel_young_loss`
    spreads the remaining mass :math:`1 - \sum_i y_{i}` evenly over the other classes (its module
    docstring says why that keeps the loss a Fenchel–Young loss).  This is how distillation
    libraries use a teacher's logits: TRL's GKD trainer divides the teacher's (and the student's)
    logits by one temperature before the softmax, and verl's top-k distillation keeps the teacher's
    k largest logits with their log-probabilities under the full softmax (and logs the mass they
    cover).

    Temperature on both sides (Hinton et al.): pass the same ``T`` here and as the loss's
    ``temperature``; the loss is then :math:`T \, \ell(\theta / T, y)`, the Fenchel–Young loss of the
    softened student, with gradient :math:`p - y` with respect to the logits :math:`\theta`
    (Hinton et al. scale their softened loss by :math:`T^2`, a gradient :math:`T(p - y)`: multiply
    by ``T`` to match).

    The logits are read one chunk of rows at a time (64 MiB of compute-dtype copies); with
    ``top_k`` no ``[tokens, vocabulary]`` tensor is allocated.  The result carries no gradient.

    Args:
        logits: ``[..., V]`` teacher logits (any floating dtype; ``-inf`` masks a class).
        temperature: ``T > 0`` (default 1).
        top_k: ``None`` (default) for the dense target, or ``1 <= k <= V``.

    Returns:
        ``[..., V]`` probabilities, or the pair ``(probs, indices)``, each ``[..., k]``, largest
        first (as ``torch.topk``); probabilities in the compute dtype (float32 for half-precision
        logits, float64 for float64).

    Shape:
        - logits: :math:`(*, V)`.
        - Output: :math:`(*, V)`, or two :math:`(*, k)` tensors with ``top_k``.

    Raises:
        ValueError: a row without a finite largest logit (all ``-inf``, or NaN/``+inf``).

    Examples:
        >>> import torch, softargmax as sa
        >>> _ = torch.manual_seed(0)
        >>> teacher_logits = torch.randn(2, 6, 50)
        >>> probs, indices = sa.teacher_target(teacher_logits, temperature=2.0, top_k=8)
        >>> probs.shape, indices.shape, bool((probs.sum(-1) <= 1).all())
        (torch.Size([2, 6, 8]), torch.Size([2, 6, 8]), True)
        >>> hidden, weight = torch.randn(2, 6, 16), torch.randn(50, 16)
        >>> loss = sa.linear_fenchel_young_loss(hidden, weight, (probs, indices), temperature=2.0)
        >>> sa.teacher_target(torch.tensor([0.0, 0.0, 2.0 * 0.6931]), temperature=2.0)  # softmax(logits / T)
        tensor([0.2500, 0.2500, 0.5000])

    References:
        Geoffrey Hinton, Oriol Vinyals and Jeff Dean, *Distilling the Knowledge in a Neural
        Network*, NIPS 2014 Deep Learning Workshop, https://arxiv.org/abs/1503.02531
    """
    check_tensor(logits, "logits")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with V >= 1 classes, got shape {tuple(logits.shape)}")
    T = check_positive_number(temperature, "temperature")
    V = logits.shape[-1]
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise TypeError(f"top_k must be None or an int, got {top_k!r}")
        if not 1 <= top_k <= V:
            raise ValueError(f"top_k must be in [1, {V}] (the number of classes), got {top_k}")
    cdt = compute_dtype(logits.dtype)
    x = logits.detach().reshape(-1, V)
    N = x.shape[0]
    if top_k is None:
        out = torch.empty(N, V, dtype=cdt, device=x.device)
    else:
        probs = torch.empty(N, top_k, dtype=cdt, device=x.device)
        indices = torch.empty(N, top_k, dtype=torch.long, device=x.device)
    rows = max(1, _CHUNK_BYTES // (V * torch.empty((), dtype=cdt).element_size()))
    for start in range(0, N, rows):
        end = min(N, start + rows)
        z = torch.div(x[start:end].to(cdt), T)  # a new tensor: the logits are never written
        lse = torch.logsumexp(z, -1, keepdim=True)
        if not bool(torch.isfinite(lse).all()):
            raise ValueError("logits: every row needs a finite largest logit (found a row that is all -inf, or "
                             "holds NaN or +inf)")
        if top_k is None:
            torch.exp(z.sub_(lse), out=out[start:end])
        else:
            values, idx = z.topk(top_k, -1)
            torch.exp(values.sub_(lse), out=probs[start:end])
            indices[start:end] = idx
    batch = tuple(logits.shape[:-1])
    if top_k is None:
        return out.reshape(batch + (V,))
    return probs.reshape(batch + (top_k,)), indices.reshape(batch + (top_k,))
