"""Sparse attention as ``torch.nn`` modules: :class:`SparseMultiheadAttention`, a drop-in for
``torch.nn.MultiheadAttention``, and :func:`convert_attention`, which swaps the attention of
existing ``nn.Transformer*`` / ``nn.MultiheadAttention`` modules, keeping their weights.

References:

* Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*, EMNLP 2019, https://arxiv.org/abs/1909.00015
* Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
"""

from __future__ import annotations

from typing import Any, NoReturn, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._utils.checks import check_alpha, check_broadcastable, check_real, check_tensor, check_window
from .._utils.tracing import values_checkable
from ..operators.attention import MAPPINGS, attention
from ._parameters import bounded, bounded_logit, initial_value, placed
from .activations import not_scriptable

__all__ = ["SparseMultiheadAttention", "convert_attention"]


def _no_op_pre_hook(module: nn.Module, args: tuple[Any, ...]) -> None:
    return None


class SparseMultiheadAttention(nn.MultiheadAttention):
    r"""A drop-in for ``torch.nn.MultiheadAttention`` with a sparse (or any) normalization of the scores.

    .. math::

        \operatorname{MultiHead}(Q, K, V) = [\mathrm{head}_1, \dots, \mathrm{head}_H]\, W^O, \qquad
        \mathrm{head}_h = \operatorname{mapping}\Big(\frac{Q W_h^Q (K W_h^K)^\top}{\sqrt{d_h}} + M\Big)\, V W_h^V,

    the mapping (1.5-entmax by default) in place of the softmax, one α per head for ``"entmax"``.
    Same constructor, parameters, state dict and call as ``nn.MultiheadAttention``
    (``batch_first``, ``key_padding_mask`` and ``attn_mask`` with ``True`` = *not allowed*
    or additive floats, ``need_weights``, ``average_attn_weights``, ``is_causal``).

    Args:
        embed_dim: the model's feature size :math:`E`, divisible by ``num_heads``.
        num_heads: the number of heads :math:`H`.
        dropout: dropout on the attention weights in training. Default: ``0.0``.
        bias: biases in the input and output projections. Default: ``True``.
        add_bias_kv: not supported (``nn.MultiheadAttention``'s option; must stay ``False``). Default: ``False``.
        add_zero_attn: not supported (must stay ``False``). Default: ``False``.
        kdim: the keys' feature size. Default: ``None`` (``embed_dim``).
        vdim: the values' feature size. Default: ``None`` (``embed_dim``).
        batch_first: inputs and outputs are ``[batch, length, features]``. Default: ``False``.
        device: where the parameters are created. Default: ``None``.
        dtype: the parameters' dtype. Default: ``None``.
        mapping: ``"entmax15"``, ``"softmax"``, ``"sparsemax"``, ``"entmax"`` or an
            f-divergence name (see :func:`softargmax.attention`). Default: ``"entmax15"``.
        alpha: α of ``mapping="entmax"``: a float, or a tensor of shape ``(num_heads,)``. Default: ``1.5``.
        learn_alpha: learn one α per head, kept in :math:`(1, 2)` by
            :math:`\alpha = 1 + \operatorname{sigmoid}(w)` (Correia et al., 2019); implies
            ``mapping="entmax"``. Default: ``False``.
        window: a causal sliding window of this many keys: query :math:`i` attends only to keys
            :math:`i - w < j \le i` (as :func:`softargmax.attention`'s ``window``; combined with
            ``attn_mask``, ``key_padding_mask`` and ``is_causal``: a key must pass all of them).
            Default: ``None`` (no window).

    Shape:
        - query: :math:`(L, N, E)`, or :math:`(N, L, E)` with ``batch_first``, or :math:`(L, E)` unbatched.
        - key, value: :math:`(S, N, E_k)` and :math:`(S, N, E_v)` (batch first or unbatched likewise).
        - key_padding_mask: :math:`(N, S)`; attn_mask: :math:`(L, S)` or :math:`(N H, L, S)`.
        - Output: the attention output of the query's shape, and the weights :math:`(N, L, S)`
          (averaged over the heads) or :math:`(N, H, L, S)`, or ``None`` without ``need_weights``.

    ``add_bias_kv`` and ``add_zero_attn`` are not supported.  The module registers a
    no-op forward pre-hook so that ``nn.TransformerEncoderLayer`` never takes its fused
    inference fast path, which would bypass this module and compute softmax.

    Examples:
        >>> import torch, softargmax as sa
        >>> _ = torch.manual_seed(0)
        >>> mha = sa.nn.SparseMultiheadAttention(16, 4, batch_first=True, mapping="entmax", learn_alpha=True)
        >>> mha
        SparseMultiheadAttention(
          mapping='entmax', learn_alpha=True
          (out_proj): NonDynamicallyQuantizableLinear(in_features=16, out_features=16, bias=True)
        )
        >>> x = torch.randn(2, 5, 16)
        >>> out, weights = mha(x, x, x)
        >>> out.shape, weights.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 5, 5]))
        >>> torch.allclose(weights.sum(-1), torch.ones(2, 5))
        True
        >>> mha.alpha
        tensor([1.5000, 1.5000, 1.5000, 1.5000], grad_fn=<AddBackward0>)

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015

        Ashish Vaswani, Noam Shazeer, Niki Parmar, Jakob Uszkoreit, Llion Jones, Aidan N. Gomez,
        Łukasz Kaiser and Illia Polosukhin, *Attention Is All You Need*, NeurIPS 2017,
        https://arxiv.org/abs/1706.03762
    """

    _alpha: Tensor  # a buffer: the fixed α per head

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, batch_first: bool = False, device: Union[str, torch.device, None] = None,
                 dtype: Optional[torch.dtype] = None, *,
                 mapping: str = "entmax15", alpha: Union[float, Tensor] = 1.5, learn_alpha: bool = False,
                 window: Optional[int] = None) -> None:
        if add_bias_kv or add_zero_attn:
            raise ValueError("SparseMultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        for name, n in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{name} must be a positive int, got {type(n).__name__}")
            if n <= 0:
                raise ValueError(f"{name} must be a positive int, got {n}")
        if not 0.0 <= check_real(dropout, "dropout", "a number in [0, 1]") <= 1.0:
            raise ValueError(f"dropout must be in [0, 1], got {dropout}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if not isinstance(alpha, Tensor):
            check_real(alpha, "alpha", f"a number or a tensor of shape ({num_heads},)")
        window = check_window(window)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim,
                         batch_first=batch_first, device=device, dtype=dtype)
        if learn_alpha:
            mapping = "entmax"
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping: unknown name {mapping!r}; accepted: {', '.join(MAPPINGS)}")
        self.mapping = mapping
        self.learn_alpha = bool(learn_alpha)
        #: the causal sliding window (keys per query), or ``None``
        self.window = window
        # α is validated where it is given, then created on the module's device/dtype (like its weights)
        a = initial_value(alpha)
        if a.dim() == 0:
            a = a.expand(num_heads).clone()
        if a.shape != (num_heads,):
            raise ValueError(f"alpha must be a float or a tensor of shape ({num_heads},), got shape {tuple(a.shape)}")
        checkable = values_checkable(a)
        if self.learn_alpha:
            if checkable and bool(((a <= 1) | (a >= 2)).any()):
                raise ValueError(f"learnable alpha must start strictly inside (1, 2), got {a.tolist()}")
            self.alpha_logit = nn.Parameter(placed(bounded_logit(a, 1.0, 2.0), device, dtype))
        else:
            if checkable:
                check_alpha(a, "alpha", minimum=1.0)
            # not persistent: keeps nn.MultiheadAttention's state dict
            self.register_buffer("_alpha", placed(a, device, dtype), persistent=False)
        self.register_forward_pre_hook(_no_op_pre_hook)
        #: when True, every forward keeps its per-head weights ``[B, H, L, S]`` (detached) in ``last_weights``
        self.store_weights = False
        self.last_weights: Optional[Tensor] = None

    def __prepare_scriptable__(self) -> NoReturn:
        raise not_scriptable(self, "its forward checks its inputs and calls softargmax.attention, which are not TorchScript")

    @property
    def alpha(self) -> Tensor:
        """α per head, shape ``(num_heads,)``."""
        return bounded(self.alpha_logit, 1.0, 2.0) if self.learn_alpha else self._alpha

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        self._check_inputs(query, key, value, key_padding_mask, attn_mask)
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if self.batch_first and not unbatched:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        L, B, E = query.shape
        S = key.shape[0]
        H, D = self.num_heads, self.head_dim
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        q = F.linear(query, w_q, b_q).view(L, B, H, D).permute(1, 2, 0, 3)
        k = F.linear(key, w_k, b_k).view(S, B, H, D).permute(1, 2, 0, 3)
        v = F.linear(value, w_v, b_v).view(S, B, H, D).permute(1, 2, 0, 3)

        mask = torch.zeros(1, dtype=q.dtype, device=q.device)  # additive, broadcast to [B, H, L, S]
        if is_causal and attn_mask is None:
            attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).triu(1)
        if attn_mask is not None:
            am = attn_mask
            am = torch.zeros_like(am, dtype=q.dtype).masked_fill(am, float("-inf")) if am.dtype == torch.bool else am.to(q.dtype)
            mask = mask + (am.view(B, H, L, S) if am.dim() == 3 else am)
        if key_padding_mask is not None:
            kp = key_padding_mask
            kp = torch.zeros_like(kp, dtype=q.dtype).masked_fill(kp, float("-inf")) if kp.dtype == torch.bool else kp.to(q.dtype)
            mask = mask + kp.view(B, 1, 1, S)
        alpha = self.alpha.to(q.dtype).view(H, 1, 1) if self.mapping in ("entmax", "alpha") else None
        want = need_weights or self.store_weights  # without the weights CUDA inputs may take the fused kernels
        res = attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                        mapping=self.mapping, alpha=alpha, return_weights=want, window=getattr(self, "window", None))
        out, weights = res if want else (res, None)
        if self.store_weights:
            assert weights is not None  # want
            self.last_weights = weights.detach()
        out = out.permute(2, 0, 1, 3).reshape(L, B, E)
        out = self.out_proj(out)
        if self.batch_first and not unbatched:
            out = out.transpose(0, 1)
        if unbatched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        assert weights is not None  # want
        if average_attn_weights:
            weights = weights.mean(1)
        if unbatched:
            weights = weights.squeeze(0)
        return out, weights

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor],
                      attn_mask: Optional[Tensor]) -> None:
        """``TypeError``/``ValueError`` naming the argument for inputs ``nn.MultiheadAttention`` would reject."""
        for name, t, size in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            check_tensor(t, name)
            if t.dim() not in (2, 3) or t.dim() != query.dim():
                raise ValueError(f"{name} must be [L, E] (unbatched) or 3-d like query, got shape {tuple(t.shape)}")
            if t.shape[-1] != size:
                raise ValueError(f"{name} must have {size} features in its last dimension, got shape {tuple(t.shape)}")
        if query.dim() == 2:  # unbatched [L, E]
            B, L, S = 1, query.shape[0], key.shape[0]
        else:  # [B, L, E] (batch_first) or [L, B, E]
            b, ti = (0, 1) if self.batch_first else (1, 0)
            B, L, S = query.shape[b], query.shape[ti], key.shape[ti]
            if key.shape[b] != B:
                raise ValueError(f"key must have the batch size of query ({B}), got shape {tuple(key.shape)}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"key and value must have the same shape but the last, got {tuple(key.shape)} and {tuple(value.shape)}")
        H = self.num_heads
        shapes: list[tuple[int, ...]]
        for name, m in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if m is None:
                continue
            if not isinstance(m, Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(m).__name__}")
            if m.dtype != torch.bool and not m.is_floating_point():
                raise TypeError(f"{name} must be a boolean or floating tensor, got {m.dtype}")
            if name == "key_padding_mask":
                shapes = [(B, S)] if query.dim() == 3 else [(S,), (1, S)]
            elif m.dim() == 3:
                shapes = [(B * H, L, S)]
            else:  # [L, S], or anything that broadcasts to the scores [B, H, L, S]
                check_broadcastable(m, torch.empty(B, H, L, S, device="meta"), name, "the scores' shape [B, H, L, S] =")
                continue
            if tuple(m.shape) not in shapes:
                raise ValueError(f"{name} must have shape {' or '.join(map(str, shapes))}, got {tuple(m.shape)}")

    def extra_repr(self) -> str:
        window = "" if getattr(self, "window", None) is None else f", window={self.window}"
        return f"mapping={self.mapping!r}, learn_alpha={self.learn_alpha}{window}"


def convert_attention(module: nn.Module, mapping: str = "entmax15", alpha: Union[float, Tensor] = 1.5,
                      learn_alpha: bool = False) -> nn.Module:
    r"""Make a model's attention sparse: every ``nn.MultiheadAttention`` inside becomes a :class:`SparseMultiheadAttention`.

    .. math::

        \operatorname{softmax}\Big(\frac{Q K^\top}{\sqrt{d_h}}\Big) V \ \longrightarrow\
        \operatorname{mapping}\Big(\frac{Q K^\top}{\sqrt{d_h}}\Big) V,

    in place, including the attention of ``nn.Transformer*`` layers, keeping the weights (the
    state dict is copied) and the training mode.

    Args:
        module: the model, or an ``nn.MultiheadAttention``.
        mapping: as in :class:`SparseMultiheadAttention`. Default: ``"entmax15"``.
        alpha: as in :class:`SparseMultiheadAttention`. Default: ``1.5``.
        learn_alpha: as in :class:`SparseMultiheadAttention`. Default: ``False``.

    Returns:
        ``module`` (or the replacement if ``module`` itself is an ``nn.MultiheadAttention``).

    Shape:
        - alpha: a number, or :math:`(H)`, one α per head of every converted attention.

    Examples:
        >>> import torch, softargmax as sa
        >>> layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, batch_first=True)
        >>> before = layer.self_attn.in_proj_weight.clone()
        >>> layer = sa.nn.convert_attention(layer, mapping="sparsemax")
        >>> type(layer.self_attn).__name__, layer.self_attn.mapping
        ('SparseMultiheadAttention', 'sparsemax')
        >>> torch.equal(layer.self_attn.in_proj_weight, before)
        True

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """

    def convert(m: nn.MultiheadAttention) -> SparseMultiheadAttention:
        new = SparseMultiheadAttention(
            m.embed_dim, m.num_heads, dropout=m.dropout, bias=m.in_proj_bias is not None, kdim=m.kdim, vdim=m.vdim,
            batch_first=m.batch_first, device=m.out_proj.weight.device, dtype=m.out_proj.weight.dtype,
            mapping=mapping, alpha=alpha, learn_alpha=learn_alpha,
        )
        if m.bias_k is not None or m.bias_v is not None or m.add_zero_attn:
            raise ValueError("convert_attention: add_bias_kv / add_zero_attn are not supported")
        new.load_state_dict(m.state_dict(), strict=False)
        new.train(m.training)
        return new

    if isinstance(module, nn.MultiheadAttention) and not isinstance(module, SparseMultiheadAttention):
        return convert(module)
    for name, child in list(module.named_children()):
        if isinstance(child, nn.MultiheadAttention) and not isinstance(child, SparseMultiheadAttention):
            setattr(module, name, convert(child))
        else:
            convert_attention(child, mapping, alpha, learn_alpha)
    return module
