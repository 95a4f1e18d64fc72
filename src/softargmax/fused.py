r"""Output layer fused with its Fenchel–Young loss: the ``[tokens × vocab]`` logits are never held at once.

``linear_fenchel_young_loss(hidden, weight, target, bias)`` equals
``fenchel_young_loss(hidden @ weight.T + bias, target, ...)`` in value and gradients.
Tokens are processed in chunks; for each chunk the logits are computed, turned into
``w_i/denominator · (p - y)`` in place (the gradient of the reduced loss with respect
to the logits, ``p`` from the forward's own solve), and immediately multiplied into
the gradients of ``hidden``, ``weight`` and ``bias``, which the forward returns to
autograd pre-computed (the approach of Liger-Kernel / Cut-Cross-Entropy, here for every
Fenchel–Young loss).  Peak extra memory is one chunk of logits plus the gradients of
the parameters, instead of two ``tokens × vocab`` tensors.

``reduction`` is ``"mean"`` or ``"sum"`` (the pre-computed gradients are scaled by the
incoming scalar gradient); float16/bfloat16 matmuls run in the input dtype and the
solver in float32.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._checks import Rows, check_positive_number, check_q, check_tensor, compute_dtype
from .divergences import Divergence
from .losses import _resolve, alpha_relu_rows, fy_rows, parse_target, rows_of

__all__ = ["linear_fenchel_young_loss"]

#: default number of logits (chunk rows × vocabulary) computed at once
DEFAULT_CHUNK_ELEMENTS = 2**23


class _LinearFY(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden2d, weight, bias, compute, tgt, denom, chunk):
        N, d = hidden2d.shape
        V = weight.shape[0]
        cdt = compute_dtype(hidden2d.dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        gh = torch.empty_like(hidden2d) if need_h else None
        gw = torch.zeros(V, d, dtype=cdt, device=weight.device) if need_w else None
        gb = torch.zeros(V, dtype=cdt, device=weight.device) if need_b else None
        total = torch.zeros((), dtype=cdt, device=hidden2d.device)
        for start in range(0, N, chunk):
            end = min(N, start + chunk)
            h = hidden2d[start:end]
            logits = h @ weight.T if bias is None else torch.addmm(bias, h, weight.T)
            part = rows_of(tgt, start, end)
            loss, _, G = compute(logits.to(cdt), part)
            w = part.item_weight
            total = total + (loss if w is None else loss * w).sum()
            scale = (1.0 / denom) if w is None else (w / denom).unsqueeze(1)
            G = G.mul_(scale)
            Gm = G.to(hidden2d.dtype)
            if need_h:
                torch.mm(Gm, weight, out=gh[start:end])
            if need_w:
                gw.addmm_(Gm.T.to(cdt), h.to(cdt))
            if need_b:
                gb.add_(G.sum(0))
            del logits, G, Gm
        ctx.grads = (gh, None if gw is None else gw.to(weight.dtype), None if gb is None else gb.to(bias.dtype))
        return total / denom

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        gh, gw, gb = ctx.grads
        scale = grad_out.to(torch.float32)
        out = []
        for g in (gh, gw, gb):
            out.append(None if g is None else g * scale.to(g.dtype))
        return out[0], out[1], out[2], None, None, None, None


def linear_fenchel_young_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor] = None,
    mapping: Union[str, Divergence] = "entmax15",
    chunk_size: Optional[int] = None,
    *,
    q: Optional[Tensor] = None,
    temperature: float = 1.0,
    multilabel: bool = False,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    class_weight: Optional[Tensor] = None,
    **mapping_params,
) -> Tensor:
    r"""``fenchel_young_loss(hidden @ weight.T + bias, target, mapping, ...)`` without materializing the logits.

    Args:
        hidden: ``[..., d]`` features.
        weight: ``[V, d]`` output projection (as in ``torch.nn.Linear``).
        target: class indices ``[...]``, probability vectors ``[..., V]``, or label sets
            with ``multilabel=True``.
        bias: optional ``[V]``.
        mapping: as in :func:`softargmax.losses.fenchel_young_loss`.
        chunk_size: tokens per chunk; default ``max(1, 2**23 // V)`` (32 MiB of float32 logits).
        class_weight: per-class weights (the ``weight`` option of the unfused loss).
        reduction: ``"mean"`` or ``"sum"``.
        q, temperature, multilabel, ignore_index, label_smoothing, **mapping_params:
            as in :func:`softargmax.losses.fenchel_young_loss`.
    """
    check_tensor(hidden, "hidden")
    check_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [vocab, d], got shape {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden's last dimension ({hidden.shape[-1] if hidden.dim() else None}) must equal weight.shape[1] ({weight.shape[1]})")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    V, d = weight.shape
    if bias is not None:
        check_tensor(bias, "bias")
        if bias.shape != (V,):
            raise ValueError(f"bias must have shape ({V},), got {tuple(bias.shape)}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum' for the fused loss, got {reduction!r}")
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // V)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")

    hidden2d = hidden.reshape(-1, d)
    N = hidden2d.shape[0]
    # the target is validated against a [N, V] stand-in for the logits (never allocated)
    logits_meta = torch.empty(N, V, dtype=compute_dtype(hidden.dtype), device="meta")
    rows = _MetaRows(N, V, compute_dtype(hidden.dtype))
    if not multilabel and not target.is_floating_point():
        target2 = target.reshape(N)
    else:
        target2 = target.reshape(N, V)
    tgt = parse_target(target2, logits_meta, rows, multilabel=multilabel, ignore_index=ignore_index,
                       label_smoothing=label_smoothing, weight=class_weight)
    kind = _resolve(mapping, dict(mapping_params))
    if kind[0] == "fy":
        beta = check_positive_number(temperature, "temperature")
        check_q(q, logits_meta)
        q2d = None if q is None else q.detach().to(compute_dtype(hidden.dtype)).reshape(1, V)
        div = kind[1]
        compute = lambda th, part: fy_rows(th, part, div, beta, q2d, inplace=True)  # noqa: E731
    else:
        if q is not None:
            raise ValueError("q: the alpha_relu mapping takes no reference measure (q must be None)")
        if temperature != 1.0:
            raise ValueError(f"temperature: the alpha_relu mapping takes no temperature (got {temperature!r})")
        _, alpha, tau = kind
        compute = lambda th, part: alpha_relu_rows(th, part, alpha, float(tau), inplace=True)  # noqa: E731
    if reduction == "mean":
        denom = float(tgt.keep.sum()) if tgt.item_weight is None else float(tgt.item_weight.sum())
        if denom == 0:
            denom = math.nan
    else:
        denom = 1.0
    return _LinearFY.apply(hidden2d, weight, bias, compute, tgt, denom, chunk_size)


class _MetaRows(Rows):
    """The row layout of a ``[N, V]`` logits matrix that is never materialized."""

    def __init__(self, N: int, V: int, dtype):
        self.shape = torch.Size([N, V])
        self.dim = 1
        self.last = True
        self.in_dtype = self.dtype = dtype
        self.moved_shape = self.shape
        self.k, self.R = V, N

    def to_rows(self, t: Tensor) -> Tensor:
        return t.reshape(self.R, self.k).to(self.dtype)
