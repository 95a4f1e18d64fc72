"""``torch.nn`` modules wrapping the operators.

* :class:`Sparsemax`, :class:`Entmax15`, :class:`Entmax` (optionally learnable α),
  :class:`Normmax`, :class:`BudgetSparsemax` (and :class:`NormmaxLoss`, :class:`BudgetSparsemaxLoss`),
  :class:`AlphaReLU` (optionally calibrating τ on its first training batch),
  :class:`FSoftargmax` (optionally learnable reference measure ``q``);
* losses: :class:`FenchelYoungLoss` and the named :class:`SparsemaxLoss`,
  :class:`Entmax15Loss`, :class:`EntmaxLoss`, :class:`AlphaReLULoss`,
  :class:`FDivergenceLoss` (options of :func:`softargmax.losses.fenchel_young_loss`).

A learnable α is kept in ``(alpha_min, alpha_max)`` through the smooth
reparametrization ``α = alpha_min + (alpha_max - alpha_min) · sigmoid(w)``
(Correia et al. (2019) keeps α in (1, 2]); a learnable ``q`` is ``exp(log_q)``.

References:

* Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*, EMNLP 2019, https://arxiv.org/abs/1909.00015
* Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._utils.checks import (
    check_alpha,
    check_broadcastable,
    check_positive_number,
    check_real,
    check_tau,
    check_tensor,
    values_checkable,
)
from ..divergences import Divergence, get_divergence
from ..operators.alpha_relu import alpha_relu
from ..operators.entmax import entmax, entmax15, sparsemax
from ..operators.fdiv import f_softargmax
from ..operators.mappings import check_mapping

__all__ = [
    "Sparsemax",
    "Entmax15",
    "Entmax",
    "AlphaReLU",
    "FSoftargmax",
    "FenchelYoungLoss",
    "SparsemaxLoss",
    "Entmax15Loss",
    "EntmaxLoss",
    "AlphaReLULoss",
    "FDivergenceLoss",
    "Normmax",
    "BudgetSparsemax",
    "NormmaxLoss",
    "BudgetSparsemaxLoss",
    "SparseMultiheadAttention",
    "convert_attention",
]


def _bounded_logit(a: Tensor, lo: float, hi: float) -> Tensor:
    """``w`` with ``lo + (hi - lo) sigmoid(w) = a`` (the inverse of :func:`_bounded`)."""
    frac = (a - lo) / (hi - lo)
    return torch.log(frac) - torch.log1p(-frac)


def _bounded(w: Tensor, lo: float, hi: float) -> Tensor:
    """The smooth reparametrization of a learnable α kept in ``(lo, hi)``."""
    return lo + (hi - lo) * torch.sigmoid(w)


def _initial_value(value) -> Tensor:
    """A detached copy of ``value`` (a number or tensor) as the module's initial parameter or buffer.

    Values are validated by the caller on this copy *before* :func:`_placed` moves it: a
    ``device="meta"`` tensor has no values to check.  Without ``dtype`` a tensor keeps its
    floating dtype and a number takes the default dtype.
    """
    if isinstance(value, Tensor):
        t = value.detach().clone()
        return t if t.is_floating_point() else t.to(torch.get_default_dtype())
    return torch.tensor(float(value), dtype=torch.get_default_dtype())


def _placed(t: Tensor, device=None, dtype=None) -> Tensor:
    """``t`` on the module's ``device``/``dtype`` (the factory keywords of ``torch.nn`` modules), where given."""
    return t.to(device=device if device is not None else t.device, dtype=dtype if dtype is not None else t.dtype)


class Sparsemax(nn.Module):
    """:func:`softargmax.sparsemax` along ``dim``."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return sparsemax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Entmax15(Sparsemax):
    """:func:`softargmax.entmax15` along ``dim``."""

    def forward(self, x: Tensor) -> Tensor:
        return entmax15(x, self.dim)


class Entmax(nn.Module):
    """α-entmax along ``dim`` with a fixed or learnable α.

    Args:
        alpha: initial α: a float or a tensor broadcastable to the input with size 1
            along ``dim`` (e.g. shape ``(heads, 1, 1)`` for one α per attention head).
        learn_alpha: make α a parameter, ``α = alpha_min + (alpha_max - alpha_min) sigmoid(w)``;
            the initial α must then lie strictly inside ``(alpha_min, alpha_max)``.
        dim: the normalized dimension.
        alpha_min, alpha_max: the range of a learnable α (default ``(1, 2)``; any
            ``0 <= alpha_min < alpha_max < inf``: α below 1 gives dense outputs).
        device, dtype: where and in which dtype α (parameter or buffer) is created, as for
            ``torch.nn`` layers (default: a tensor α's own device and dtype; the default dtype
            for a float α).
    """

    def __init__(
        self,
        alpha: Union[float, Tensor] = 1.5,
        learn_alpha: bool = False,
        dim: int = -1,
        alpha_min: float = 1.0,
        alpha_max: float = 2.0,
        *,
        device=None,
        dtype=None,
    ):
        super().__init__()
        alpha = check_alpha(alpha, "alpha", minimum=0.0, strict=True)
        self.dim = dim
        self.learn_alpha = bool(learn_alpha)
        if self.learn_alpha:
            alpha_min, alpha_max = check_real(alpha_min, "alpha_min"), check_real(alpha_max, "alpha_max")
            if not 0.0 <= alpha_min < alpha_max:
                raise ValueError(f"alpha_min, alpha_max must satisfy 0 <= alpha_min < alpha_max < inf, got {alpha_min}, {alpha_max}")
            a = _initial_value(alpha)
            if values_checkable(a) and bool(((a <= alpha_min) | (a >= alpha_max)).any()):
                raise ValueError(f"learnable alpha={alpha} must start strictly inside (alpha_min, alpha_max) = "
                                 f"({alpha_min}, {alpha_max})")
            self.alpha_min, self.alpha_max = float(alpha_min), float(alpha_max)
            self.alpha_logit = nn.Parameter(_placed(_bounded_logit(a, alpha_min, alpha_max), device, dtype))
        elif isinstance(alpha, Tensor):
            self.register_buffer("_alpha", _placed(_initial_value(alpha), device, dtype))
        else:
            self._alpha_float = float(alpha)

    @property
    def alpha(self) -> Union[float, Tensor]:
        """The current α (a tensor that carries gradients when learnable)."""
        if self.learn_alpha:
            return _bounded(self.alpha_logit, self.alpha_min, self.alpha_max)
        if hasattr(self, "_alpha"):
            return self._alpha
        return self._alpha_float

    def forward(self, x: Tensor) -> Tensor:
        check_tensor(x)
        alpha = self.alpha
        if isinstance(alpha, Tensor) and alpha.dim() == 0:
            alpha = alpha.reshape([1] * x.dim())
        return entmax(x, alpha, self.dim)

    def extra_repr(self) -> str:
        if self.learn_alpha:
            return f"learn_alpha=True, range=({self.alpha_min}, {self.alpha_max}), dim={self.dim}"
        return f"alpha={self.alpha}, dim={self.dim}"


class AlphaReLU(nn.Module):
    """:func:`softargmax.alpha_relu` with fixed ``alpha`` and ``tau`` (τ in the entmax parametrization).

    With ``tau="calibrate"`` the module sets τ on its first forward call in training
    mode to the mean α-entmax threshold of that batch (:func:`softargmax.operators.alpha_relu_tau.from_logits`,
    how Tezekbayev et al. (2022) chooses τ from the untrained model); until then it must not be used in
    eval mode.  The calibrated value is a buffer, saved with the state dict.
    """

    def __init__(self, alpha: float = 1.5, tau: Union[float, Tensor, str] = 0.0, dim: int = -1, *,
                 device=None, dtype=None):
        super().__init__()
        self.alpha = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
        if isinstance(self.alpha, Tensor):
            raise TypeError("AlphaReLU: alpha must be a float > 1")
        self.dim = dim
        self.calibrate = tau == "calibrate"
        if isinstance(tau, str) and not self.calibrate:
            raise ValueError(f"tau must be a number, a tensor or 'calibrate', got {tau!r}")
        if not self.calibrate:
            check_tau(tau)
        # the τ buffer is created on ``device``/``dtype`` where given (``torch.nn`` factory keywords)
        t = _initial_value(float("nan") if self.calibrate else tau)
        self.register_buffer("tau", _placed(t, device, dtype))

    @property
    def calibrated(self) -> bool:
        return not bool(torch.isnan(self.tau).any())

    def forward(self, x: Tensor) -> Tensor:
        if self.calibrate and not self.calibrated:
            if not self.training:
                raise RuntimeError("AlphaReLU(tau='calibrate') has not seen a training batch yet")
            from ..operators.alpha_relu_tau import from_logits

            self.tau.copy_(from_logits(x.detach(), self.alpha, self.dim).to(self.tau.dtype))
        return alpha_relu(x, self.alpha, self.tau)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, tau={self.tau.tolist()}, calibrate={self.calibrate}"


class FSoftargmax(nn.Module):
    """:func:`softargmax.f_softargmax` with a fixed or learnable reference measure.

    Args:
        divergence: a name or a :class:`~softargmax.divergences.Divergence`.
        q: ``None`` or a positive tensor broadcastable to the input.
        temperature: ``β > 0``.
        dim: the normalized dimension.
        learn_q: make ``q = exp(log_q)`` a parameter (``q`` must be given).
        device, dtype: where and in which dtype ``q`` (parameter or buffer) is created, as for
            ``torch.nn`` layers (default: ``q``'s own).
        **params: parameters of the named divergence (``alpha=``).
    """

    def __init__(
        self,
        divergence: Union[str, Divergence] = "kl",
        q: Optional[Tensor] = None,
        temperature: float = 1.0,
        dim: int = -1,
        learn_q: bool = False,
        *,
        device=None,
        dtype=None,
        **params,
    ):
        super().__init__()
        self.divergence = get_divergence(divergence, **params)
        self.temperature = check_positive_number(temperature, "temperature")
        self.dim = dim
        self.learn_q = bool(learn_q)
        if q is not None:
            if not isinstance(q, Tensor) or not q.is_floating_point() or (values_checkable(q) and bool((q <= 0).any())):
                raise ValueError("q must be None or a strictly positive floating tensor")
            if self.learn_q:
                self.log_q = nn.Parameter(_placed(torch.log(_initial_value(q)), device, dtype))
            else:
                self.register_buffer("_q", _placed(_initial_value(q), device, dtype))
        elif self.learn_q:
            raise ValueError("learn_q=True needs an initial q (e.g. torch.ones(num_classes))")

    @property
    def q(self) -> Optional[Tensor]:
        if self.learn_q:
            return torch.exp(self.log_q)
        return getattr(self, "_q", None)

    def forward(self, x: Tensor) -> Tensor:
        return f_softargmax(x, self.divergence, q=self.q, temperature=self.temperature, dim=self.dim)

    def extra_repr(self) -> str:
        return f"divergence={self.divergence!r}, temperature={self.temperature}, dim={self.dim}, learn_q={self.learn_q}"


class FenchelYoungLoss(nn.Module):
    """:func:`softargmax.losses.fenchel_young_loss` as a module; keyword options are stored.

    Example: ``FenchelYoungLoss("entmax", alpha=1.3, ignore_index=0, label_smoothing=0.1)``.
    """

    def __init__(self, mapping: Union[str, Divergence] = "entmax15", **options):
        super().__init__()
        from ..losses._rows import resolve_loss

        resolve_loss(mapping, {k: v for k, v in options.items() if k in ("alpha", "tau")})  # validate early
        self.mapping = mapping
        self.options = options

    def forward(self, x: Tensor, target: Tensor):
        from ..losses.functional import fenchel_young_loss

        return fenchel_young_loss(x, target, self.mapping, **self.options)

    def extra_repr(self) -> str:
        return f"mapping={self.mapping!r}, " + ", ".join(f"{k}={v!r}" for k, v in self.options.items())


class SparsemaxLoss(FenchelYoungLoss):
    """The sparsemax loss."""

    def __init__(self, **options):
        super().__init__("sparsemax", **options)


class Entmax15Loss(FenchelYoungLoss):
    """The 1.5-entmax loss."""

    def __init__(self, **options):
        super().__init__("entmax15", **options)


class EntmaxLoss(FenchelYoungLoss):
    """The α-entmax loss (float α)."""

    def __init__(self, alpha: float = 1.5, **options):
        super().__init__("entmax", alpha=alpha, **options)


class AlphaReLULoss(FenchelYoungLoss):
    """The α-ReLU loss."""

    def __init__(self, alpha: float = 1.5, tau: float = 0.0, **options):
        super().__init__("alpha_relu", alpha=alpha, tau=tau, **options)


class FDivergenceLoss(FenchelYoungLoss):
    """The loss generated by an f-divergence, with ``q`` and ``temperature`` among the options."""

    def __init__(self, divergence: Union[str, Divergence] = "kl", **options):
        check_mapping(divergence, "divergence")
        super().__init__(divergence, **options)


class Normmax(nn.Module):
    """:func:`softargmax.normmax` (α > 1, a float or a per-row tensor) along ``dim``."""

    def __init__(self, alpha: Union[float, Tensor] = 2.0, dim: int = -1):
        super().__init__()
        self.alpha = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        from ..operators.normmax import normmax

        return normmax(x, self.alpha, self.dim)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, dim={self.dim}"


class BudgetSparsemax(nn.Module):
    """:func:`softargmax.budget_sparsemax` (every probability at most ``1/budget``) along ``dim``."""

    def __init__(self, budget: Union[float, Tensor] = 2.0, dim: int = -1):
        super().__init__()
        from ..operators.budget import check_budget

        self.budget = check_budget(budget)
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        from ..operators.budget import budget_sparsemax

        return budget_sparsemax(x, self.budget, self.dim)

    def extra_repr(self) -> str:
        return f"budget={self.budget}, dim={self.dim}"


class NormmaxLoss(nn.Module):
    """:func:`softargmax.normmax_loss` as a module; keyword options are stored."""

    def __init__(self, alpha: Union[float, Tensor] = 2.0, **options):
        super().__init__()
        self.alpha = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
        self.options = options

    def forward(self, x: Tensor, target: Tensor):
        from ..losses.normmax_budget import normmax_loss

        return normmax_loss(x, target, self.alpha, **self.options)


class BudgetSparsemaxLoss(nn.Module):
    """:func:`softargmax.budget_sparsemax_loss` as a module; keyword options are stored."""

    def __init__(self, budget: Union[float, Tensor] = 2.0, **options):
        super().__init__()
        from ..operators.budget import check_budget

        self.budget = check_budget(budget)
        self.options = options

    def forward(self, x: Tensor, target: Tensor):
        from ..losses.normmax_budget import budget_sparsemax_loss

        return budget_sparsemax_loss(x, target, self.budget, **self.options)


def _no_op_pre_hook(module, args):
    return None


class SparseMultiheadAttention(nn.MultiheadAttention):
    """A drop-in for ``torch.nn.MultiheadAttention`` with a sparse (or any) normalization.

    Same constructor, parameters, state dict and call as ``nn.MultiheadAttention``
    (``batch_first``, ``key_padding_mask`` and ``attn_mask`` with ``True`` = *not allowed*
    or additive floats, ``need_weights``, ``average_attn_weights``, ``is_causal``), plus:

    Args:
        mapping: ``"entmax15"`` (default), ``"softmax"``, ``"sparsemax"``, ``"entmax"`` or an
            f-divergence name (see :func:`softargmax.attention.attention`).
        alpha: α of ``mapping="entmax"``: a float, or a tensor of shape ``(num_heads,)``.
        learn_alpha: learn one α per head, kept in ``(1, 2)`` by
            ``α = 1 + sigmoid(w)`` (Correia et al., 2019); implies ``mapping="entmax"``.

    ``add_bias_kv`` and ``add_zero_attn`` are not supported.  The module registers a
    no-op forward pre-hook so that ``nn.TransformerEncoderLayer`` never takes its fused
    inference fast path, which would bypass this module and compute softmax.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None, *,
                 mapping: str = "entmax15", alpha: Union[float, Tensor] = 1.5, learn_alpha: bool = False):
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
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim,
                         batch_first=batch_first, device=device, dtype=dtype)
        from ..operators.attention import MAPPINGS

        if learn_alpha:
            mapping = "entmax"
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping: unknown name {mapping!r}; accepted: {', '.join(MAPPINGS)}")
        self.mapping = mapping
        self.learn_alpha = bool(learn_alpha)
        # α is validated where it is given, then created on the module's device/dtype (like its weights)
        a = _initial_value(alpha)
        if a.dim() == 0:
            a = a.expand(num_heads).clone()
        if a.shape != (num_heads,):
            raise ValueError(f"alpha must be a float or a tensor of shape ({num_heads},), got shape {tuple(a.shape)}")
        checkable = values_checkable(a)
        if self.learn_alpha:
            if checkable and bool(((a <= 1) | (a >= 2)).any()):
                raise ValueError(f"learnable alpha must start strictly inside (1, 2), got {a.tolist()}")
            self.alpha_logit = nn.Parameter(_placed(_bounded_logit(a, 1.0, 2.0), device, dtype))
        else:
            if checkable:
                check_alpha(a, "alpha", minimum=1.0)
            # not persistent: keeps nn.MultiheadAttention's state dict
            self.register_buffer("_alpha", _placed(a, device, dtype), persistent=False)
        self.register_forward_pre_hook(_no_op_pre_hook)
        #: when True, every forward keeps its per-head weights ``[B, H, L, S]`` (detached) in ``last_weights``
        self.store_weights = False
        self.last_weights: Optional[Tensor] = None

    @property
    def alpha(self) -> Tensor:
        """α per head, shape ``(num_heads,)``."""
        return _bounded(self.alpha_logit, 1.0, 2.0) if self.learn_alpha else self._alpha

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        from ..operators.attention import attention

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
                        mapping=self.mapping, alpha=alpha, return_weights=want)
        out, weights = res if want else (res, None)
        if self.store_weights:
            self.last_weights = weights.detach()
        out = out.permute(2, 0, 1, 3).reshape(L, B, E)
        out = self.out_proj(out)
        if self.batch_first and not unbatched:
            out = out.transpose(0, 1)
        if unbatched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(1)
        if unbatched:
            weights = weights.squeeze(0)
        return out, weights

    def _check_inputs(self, query, key, value, key_padding_mask, attn_mask) -> None:
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
            b, t = (0, 1) if self.batch_first else (1, 0)
            B, L, S = query.shape[b], query.shape[t], key.shape[t]
            if key.shape[b] != B:
                raise ValueError(f"key must have the batch size of query ({B}), got shape {tuple(key.shape)}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"key and value must have the same shape but the last, got {tuple(key.shape)} and {tuple(value.shape)}")
        H = self.num_heads
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
        return f"mapping={self.mapping!r}, learn_alpha={self.learn_alpha}"


def convert_attention(module: nn.Module, mapping: str = "entmax15", alpha: Union[float, Tensor] = 1.5,
                      learn_alpha: bool = False) -> nn.Module:
    """Replace, in place, every ``nn.MultiheadAttention`` inside ``module`` (including those of
    ``nn.Transformer*`` layers) by a :class:`SparseMultiheadAttention` with the same weights.

    Returns ``module`` (or the replacement if ``module`` itself is an ``nn.MultiheadAttention``).
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
