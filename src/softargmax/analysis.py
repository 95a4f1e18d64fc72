r"""Inspecting trained sparse attention (Correia et al., 2019, Figs. 11–14).

* :func:`alphas` — α per head of every :class:`~softargmax.nn.SparseMultiheadAttention`;
* :func:`collect_attention` — run a model and keep every such module's per-head weights;
* :func:`head_density` — share of nonzero weights per head (over the keys a query may see);
* :func:`head_js_divergence` — Jensen–Shannon divergence between the heads of a layer,
  ``JS(p, p') = ½ KL(p ‖ m) + ½ KL(p' ‖ m)``, ``m = (p + p')/2`` (natural log), per pair of
  heads and averaged over queries.

References:

* Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*, EMNLP 2019, https://arxiv.org/abs/1909.00015
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from .nn import SparseMultiheadAttention

__all__ = ["alphas", "collect_attention", "head_density", "head_js_divergence"]


def _sparse_mhas(model: nn.Module) -> list[tuple[str, SparseMultiheadAttention]]:
    from .nn import SparseMultiheadAttention

    return [(name, m) for name, m in model.named_modules() if isinstance(m, SparseMultiheadAttention)]


def alphas(model: nn.Module) -> dict[str, Tensor]:
    """``{module name: α per head}`` (detached) for every sparse attention module of ``model``."""
    return {name: m.alpha.detach().clone() for name, m in _sparse_mhas(model)}


@torch.no_grad()
def collect_attention(model: nn.Module, run: Callable[[], object]) -> dict[str, Tensor]:
    """Call ``run()`` (e.g. ``lambda: model(batch)``) and return ``{module name: weights [B, H, L, S]}``."""
    mods = _sparse_mhas(model)
    if not mods:
        raise ValueError("model has no SparseMultiheadAttention (see softargmax.nn.convert_attention)")
    for _, m in mods:
        m.store_weights, m.last_weights = True, None
    try:
        run()
    finally:
        for _, m in mods:
            m.store_weights = False
    return {name: m.last_weights for name, m in mods if m.last_weights is not None}


def head_density(weights: Tensor, allowed: Optional[Tensor] = None) -> Tensor:
    """Share of nonzero weights per head, ``[H]``, from weights ``[B, H, L, S]``.

    ``allowed`` (broadcastable boolean ``[B, H, L, S]``) marks the keys each query may
    attend to (e.g. not padding); by default every key.  Query rows with no weight at all
    (fully masked) are left out.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be [batch, heads, queries, keys], got shape {tuple(weights.shape)}")
    allowed = torch.ones_like(weights, dtype=torch.bool) if allowed is None else allowed.expand_as(weights)
    live = (weights.sum(-1, keepdim=True) > 0) & allowed
    nonzero = ((weights > 0) & live).sum(dim=(0, 2, 3)).double()
    total = live.sum(dim=(0, 2, 3)).double()
    return (nonzero / total.clamp_min(1)).to(weights.dtype)


def head_js_divergence(weights: Tensor) -> Tensor:
    """``[H, H]`` mean Jensen–Shannon divergence between heads (natural log, in [0, log 2]).

    Averaged over batch and query positions whose rows are distributions in every head.
    The mean over distinct pairs is ``m[~eye].mean()``.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be [batch, heads, queries, keys], got shape {tuple(weights.shape)}")
    p = weights.double()
    live = (p.sum(-1) > 0).all(1)  # [B, L]
    p = p.permute(0, 2, 1, 3)[live]  # [N, H, S]
    a, b = p.unsqueeze(2), p.unsqueeze(1)  # [N, H, 1, S], [N, 1, H, S]
    m = 0.5 * (a + b)
    kl = lambda x: torch.where(x > 0, x * (torch.log(x) - torch.log(m)), torch.zeros_like(m)).sum(-1)  # noqa: E731
    js = 0.5 * kl(a.expand_as(m)) + 0.5 * kl(b.expand_as(m))
    return js.mean(0).to(weights.dtype)
