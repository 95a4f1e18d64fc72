r"""The chunked linear + loss of :func:`softargmax.losses.linear.linear_fenchel_young_loss`: chunks of
tokens whose logits are computed, turned into the scaled gradient ``p - y`` in place and
multiplied into the gradients of ``hidden``, ``weight`` and ``bias`` at once (the approach of
Liger-Kernel and Cut-Cross-Entropy, here for every Fenchel–Young loss).  Shared by the
one-process and the vocabulary-parallel losses.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import check_tensor, compute_dtype
from ._rows import RowsCompute
from ._targets import Target, rows_of

#: default bytes for one chunk's buffers (logits, their float32 copy, prediction/gradient, half copy)
DEFAULT_MEMORY_BUDGET = 2**30


def chunk_tokens(V: int, dtype: torch.dtype, memory_budget: int, softcap: bool = False, chunk_target: bool = False,
                 extra_buffers: int = 0) -> int:
    """Tokens per chunk so that one chunk's ``[tokens, V]`` buffers fit in ``memory_budget`` bytes
    (``chunk_target``: plus the chunk's dense target, built from a teacher's top-k; ``extra_buffers``: plus
    that many compute-dtype buffers, e.g. the prediction kept beside its gradient)."""
    size = torch.empty((), dtype=dtype).element_size()
    half = dtype != compute_dtype(dtype)
    cdt_size = torch.empty((), dtype=compute_dtype(dtype)).element_size()
    # logits (input dtype) + compute-dtype copy (half only) + prediction/gradient + its half copy
    # + the solver's output before the gradient overwrites it + softcap's tanh
    per_token = V * (size + (cdt_size if half else 0) + 2 * cdt_size + (size if half else 0)
                     + (cdt_size if softcap else 0) + (cdt_size if chunk_target else 0) + extra_buffers * cdt_size)
    return max(1, memory_budget // per_token)


def accumulate_weight_grad(gw: Tensor, Gm: Tensor, h: Tensor) -> None:
    """``gw += Gmᵀ h`` with ``gw`` float32 and ``Gm``, ``h`` in the input dtype.

    Half inputs on CUDA: one tensor-core GEMM that accumulates in float32 and adds into ``gw``
    (``out_dtype``); elsewhere the operands are converted to ``gw``'s dtype.
    """
    if Gm.dtype == gw.dtype:
        gw.addmm_(Gm.T, h)
    elif gw.is_cuda and _OUT_DTYPE[0] is not False:
        try:
            torch.addmm(gw, Gm.T, h, out_dtype=gw.dtype, out=gw)
            _OUT_DTYPE[0] = True
            return
        except (TypeError, RuntimeError):  # a torch without the out_dtype GEMM
            if _OUT_DTYPE[0]:
                raise
            _OUT_DTYPE[0] = False
        gw.addmm_(Gm.T.to(gw.dtype), h.to(gw.dtype))
    else:
        gw.addmm_(Gm.T.to(gw.dtype), h.to(gw.dtype))


#: whether torch.addmm(..., out_dtype=) works here: None (not tried), True, False
_OUT_DTYPE: list[Optional[bool]] = [None]


class LinearFY(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden2d: Tensor, weight: Tensor, bias: Optional[Tensor], compute: RowsCompute, tgt: Target,
                denom: float, chunk: int, softcap: Optional[float]) -> Tensor:
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
            z = logits.to(cdt)
            del logits
            if softcap is not None:
                t = z.div_(softcap).tanh_()  # in place: z is this chunk's own buffer
                z = t * softcap
            loss, _, G = compute(z, part)
            del z
            w = part.item_weight
            total = total + (loss if w is None else loss * w).sum()
            scale = (1.0 / denom) if w is None else (w / denom).unsqueeze(1)
            G = G.mul_(scale)
            backprop_chunk(G, t if softcap is not None else None, hidden2d.dtype, weight, h,
                           None if gh is None else gh[start:end], gw, gb)
            del G
            if softcap is not None:
                del t  # the chunk's soft-capped buffer is freed before the next chunk's is made
        ctx.grads = (gh, None if gw is None else gw.to(weight.dtype), None if gb is None or bias is None else gb.to(bias.dtype))
        return total / denom

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Optional[Tensor], ...]:
        gh, gw, gb = ctx.grads
        scale = grad_out.to(torch.float32)
        out = []
        for g in (gh, gw, gb):
            out.append(None if g is None else g * scale.to(g.dtype))
        return out[0], out[1], out[2], None, None, None, None, None


def backprop_chunk(G: Tensor, tanh: Optional[Tensor], dtype: torch.dtype, weight: Tensor, h: Tensor,
                   gh: Optional[Tensor], gw: Optional[Tensor], gb: Optional[Tensor]) -> None:
    """One chunk's gradient ``G = ∂loss/∂logits`` ``[n, V]`` (scaled, float32 or float64) taken back
    through the output layer: through the soft-cap first when ``tanh`` (``tanh(x/c)`` of the chunk,
    overwritten) is given, then ``gh = G W`` written into ``gh`` ``[n, d]``, ``gw += Gᵀ h`` and
    ``gb += Σ G`` (each skipped when ``None``).  ``G`` is overwritten."""
    if tanh is not None:
        G.mul_(tanh.mul_(tanh).neg_().add_(1.0))  # d(c·tanh(x/c))/dx = 1 - tanh²
    Gm = G.to(dtype)
    if gh is not None:
        torch.mm(Gm, weight, out=gh)
    if gw is not None:
        accumulate_weight_grad(gw, Gm, h)
    if gb is not None:
        gb.add_(G.sum(0))


def projection_arguments(weight: Optional[Tensor], linear_weight: Optional[Tensor], bias: Optional[Tensor],
                         linear_bias: Optional[Tensor],
                         ignore_index: Optional[int]) -> tuple[Tensor, Optional[Tensor], int]:
    """The projection, bias and ``ignore_index`` of the fused loss under either set of names:
    ``weight``/``bias`` (this library's) or ``linear_weight``/``linear_bias`` (those of
    ``torch.nn.functional.linear_cross_entropy``); ``ignore_index=None`` is ``-100``, as there.

    A projection given under both names is a ``TypeError``: it is what porting a call of
    ``linear_cross_entropy(..., weight=class_weights)`` gives, where ``weight`` means the class
    weights (``class_weight`` here)."""
    for name, given, alias in (("weight", weight, linear_weight), ("bias", bias, linear_bias)):
        if given is not None and alias is not None:
            raise TypeError(f"linear_{name} and {name} both given: they are two names of the projection's {name} "
                            f"(linear_{name} as in torch.nn.functional.linear_cross_entropy); give one.  "
                            "Class weights, linear_cross_entropy's weight=, are class_weight= here")
    weight = linear_weight if weight is None else weight
    if weight is None:
        raise TypeError("linear_weight (or weight), the [V, d] output projection, is required")
    return weight, linear_bias if bias is None else bias, -100 if ignore_index is None else ignore_index


def check_linear_arguments(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], reduction: str, rows: str = "vocab",
                           reductions: tuple[str, ...] = ("mean", "sum")) -> None:
    """The argument checks of the fused linear + loss (``rows``: what ``weight``'s rows are, for the message;
    ``reductions``: those the caller computes)."""
    check_tensor(hidden, "hidden")
    check_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [{rows}, d], got shape {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden's last dimension ({hidden.shape[-1] if hidden.dim() else None}) must equal weight.shape[1] ({weight.shape[1]})")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    if bias is not None:
        check_tensor(bias, "bias")
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if reduction not in reductions:
        accepted = ", ".join(map(repr, reductions[:-1])) + f" or {reductions[-1]!r}"
        raise ValueError(f"reduction must be {accepted} for the fused loss, got {reduction!r}")


def target_rows(target: object, hidden: Tensor, V: int, multilabel: bool) -> Tensor:
    """``target`` as ``[N]`` class indices or ``[N, V]`` rows, once its shape is checked against ``hidden``'s."""
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    batch = tuple(hidden.shape[:-1])
    N = math.prod(batch)
    if not multilabel and not target.is_floating_point():
        if tuple(target.shape) != batch:
            raise ValueError(f"target: class indices must have hidden's shape without its last dimension, {batch}, "
                             f"got {tuple(target.shape)}")
        return target.reshape(N)
    if tuple(target.shape) != batch + (V,):
        if not multilabel and tuple(target.shape) == batch:
            raise TypeError(f"target: a floating tensor of shape {batch} looks like class indices: pass them as an "
                            f"integer tensor (target.long()); probability vectors must have shape {batch + (V,)}")
        what = "label sets" if multilabel else "probability vectors"
        raise ValueError(f"target: {what} must have shape {batch + (V,)} (hidden's batch shape, V), got {tuple(target.shape)}")
    return target.reshape(N, V)


def check_chunking(chunk_size: object, memory_budget: object) -> int:
    """The memory budget in bytes (default :data:`DEFAULT_MEMORY_BUDGET`), once it and ``chunk_size``
    (``None``: from the budget) are checked to be positive ints."""
    budget = DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return budget
