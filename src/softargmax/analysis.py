r"""Inspecting trained sparse attention (Correia et al., 2019, Figs. 11–14).

* :func:`alphas` — α per head of every :class:`~softargmax.nn.SparseMultiheadAttention`;
* :func:`collect_attention` — run a model and keep every such module's per-head weights;
* :func:`head_density` — share of nonzero weights per head (over the keys a query may see);
* :func:`head_js_divergence` — Jensen–Shannon divergence between the heads of a layer,
  :math:`\mathrm{JS}(p, p') = \tfrac12 \mathrm{KL}(p \,\Vert\, m) + \tfrac12 \mathrm{KL}(p' \,\Vert\, m)`,
  :math:`m = (p + p')/2` (natural log), per pair of heads and averaged over queries.

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
    r"""The α of every head of every sparse attention module of a model, detached.

    .. math::

        \alpha_h = 1 + \operatorname{sigmoid}(w_h) \in (1, 2)

    for a learnable α (``learn_alpha=True``), the fixed α otherwise; how Correia et al. (2019, Fig. 11)
    show what the heads learned.

    Args:
        model: a module holding :class:`~softargmax.nn.SparseMultiheadAttention` modules.

    Returns:
        ``{module name: α per head}``, each a tensor of shape ``(num_heads,)``.

    Shape:
        - Output: each value :math:`(H)`, one α per head.

    Examples:
        >>> import torch, softargmax as sa
        >>> layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4)
        >>> layer = sa.nn.convert_attention(layer, learn_alpha=True, alpha=1.25)
        >>> sa.analysis.alphas(layer)
        {'self_attn': tensor([1.2500, 1.2500, 1.2500, 1.2500])}

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """
    return {name: m.alpha.detach().clone() for name, m in _sparse_mhas(model)}


@torch.no_grad()
def collect_attention(model: nn.Module, run: Callable[[], object]) -> dict[str, Tensor]:
    """Run a model and keep the per-head attention weights of every sparse attention module.

    Gradients are off during the call; every module's weights are recorded while ``run()`` runs
    and the recording is switched off afterwards.

    Args:
        model: a module holding :class:`~softargmax.nn.SparseMultiheadAttention` modules.
        run: a function of no arguments that calls the model (e.g. ``lambda: model(batch)``).

    Returns:
        ``{module name: weights [B, H, L, S]}``, detached.

    Shape:
        - Output: each value :math:`(B, H, L, S)`: batch, heads, queries, keys.

    Raises:
        ValueError: the model has no sparse attention module.

    Examples:
        >>> import torch, softargmax as sa
        >>> _ = torch.manual_seed(0)
        >>> layer = sa.nn.convert_attention(torch.nn.TransformerEncoderLayer(16, 4, batch_first=True).eval())
        >>> x = torch.randn(2, 5, 16)
        >>> weights = sa.analysis.collect_attention(layer, lambda: layer(x))
        >>> weights["self_attn"].shape
        torch.Size([2, 4, 5, 5])

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """
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
    r"""The share of nonzero attention weights of each head: how sparse each head is.

    .. math::

        d_h = \frac{\lvert \{(b, l, s) : w_{bhls} > 0,\ (b, l, s) \text{ allowed}\}\rvert}
        {\lvert \{(b, l, s) \text{ allowed}\}\rvert},

    over the query rows that hold weights (fully masked rows are left out), as in Correia et al.
    (2019, Fig. 13).

    Args:
        weights: attention weights ``[B, H, L, S]`` (as :func:`collect_attention` returns them).
        allowed: a boolean mask broadcastable to ``[B, H, L, S]`` of the keys each query may attend
            to (e.g. not padding). Default: ``None`` (every key).

    Returns:
        the densities, ``[H]``, in ``weights``' dtype.

    Shape:
        - weights: :math:`(B, H, L, S)`.
        - allowed: broadcastable to :math:`(B, H, L, S)`.
        - Output: :math:`(H)`.

    Examples:
        >>> import torch, softargmax as sa
        >>> weights = torch.tensor([[[[1.0, 0.0]], [[0.5, 0.5]]]])  # B = 1, H = 2, L = 1, S = 2
        >>> sa.analysis.head_density(weights)
        tensor([0.5000, 1.0000])

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be [batch, heads, queries, keys], got shape {tuple(weights.shape)}")
    allowed = torch.ones_like(weights, dtype=torch.bool) if allowed is None else allowed.expand_as(weights)
    live = (weights.sum(-1, keepdim=True) > 0) & allowed
    nonzero = ((weights > 0) & live).sum(dim=(0, 2, 3)).double()
    total = live.sum(dim=(0, 2, 3)).double()
    return (nonzero / total.clamp_min(1)).to(weights.dtype)


def head_js_divergence(weights: Tensor) -> Tensor:
    r"""The mean Jensen–Shannon divergence between every pair of heads of a layer.

    .. math::

        D_{hh'} = \operatorname{mean}_{b, l}\ \mathrm{JS}(w_{bhl}, w_{bh'l}), \qquad
        \mathrm{JS}(p, p') = \tfrac12 \mathrm{KL}(p \,\Vert\, m) + \tfrac12 \mathrm{KL}(p' \,\Vert\, m), \quad m = \frac{p + p'}{2},

    in nats, in :math:`[0, \log 2]`, averaged over the batch and the query positions whose rows are
    distributions in every head (Correia et al., 2019, Fig. 14).  The mean over distinct pairs is
    ``D[~torch.eye(H, dtype=torch.bool)].mean()``.

    Args:
        weights: attention weights ``[B, H, L, S]``.

    Returns:
        the ``[H, H]`` matrix :math:`D`, symmetric with a zero diagonal, in ``weights``' dtype.

    Shape:
        - weights: :math:`(B, H, L, S)`.
        - Output: :math:`(H, H)`.

    Examples:
        >>> import torch, softargmax as sa
        >>> weights = torch.tensor([[[[1.0, 0.0]], [[0.5, 0.5]]]])  # B = 1, H = 2, L = 1, S = 2
        >>> sa.analysis.head_js_divergence(weights)
        tensor([[0.0000, 0.2158],
                [0.2158, 0.0000]])

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
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
