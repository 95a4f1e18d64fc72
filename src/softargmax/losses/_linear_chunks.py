r"""The chunked linear + loss of :func:`softargmax.losses.linear.linear_fenchel_young_loss`: chunks of
tokens whose logits are computed, turned into the scaled gradient ``p - y`` in place and
multiplied into the gradients of ``hidden``, ``weight`` and ``bias`` at once (the approach of
Liger-Kernel and Cut-Cross-Entropy, here for every Fenchel–Young loss).  Shared by the
one-process and the vocabulary-parallel losses.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import check_tensor, compute_dtype
from ..backends import TileFlags, skips_tiles, tile_backprop
from ._rows import RowLoss, RowsCompute
from ._targets import Target, rows_of

#: default bytes for one chunk's ``[tokens, V]`` buffers (:func:`chunk_tokens`): 384 MiB, 768 tokens of
#: bfloat16 logits and prediction at V = 131072 (1536 for the softmax loss, whose gradient overwrites the
#: logits); with the 1 GiB bfloat16 weight gradient, about 1.5 GiB at d = 4096
DEFAULT_MEMORY_BUDGET = 3 * 2**27


def chunk_tokens(V: int, dtype: torch.dtype, memory_budget: int, softcap: bool = False, chunk_target: bool = False,
                 extra_buffers: int = 0, native: bool = False, in_place: bool = False) -> int:
    """Tokens per chunk so that one chunk's ``[tokens, V]`` buffers fit in ``memory_budget`` bytes
    (``chunk_target``: plus the chunk's dense float32 target, built from a teacher's top-k;
    ``extra_buffers``: plus that many compute-dtype buffers, e.g. the prediction kept beside its gradient).

    ``native``: the chunk is computed in the input's dtype (half precision on the GPU kernels'
    route): the logits and the prediction, which becomes the gradient in place, are the only
    buffers, ``2 × 2`` bytes per class in bfloat16 (``in_place``: the softmax loss's kernel writes
    the gradient over the logits, ``2`` bytes); otherwise the logits, their float32 copy, the
    prediction/gradient and its half copy for the GEMMs (``2 + 4 + 4 + 4 + 2`` in bfloat16).
    """
    size = torch.empty((), dtype=dtype).element_size()
    cdt_size = torch.empty((), dtype=compute_dtype(dtype)).element_size()
    if native:
        # logits + prediction/gradient (unless written over the logits) + softcap's capped copy
        per_class = size * (1 + (0 if in_place else 1) + (1 if softcap else 0))
    else:
        half = dtype != compute_dtype(dtype)
        # logits (input dtype) + compute-dtype copy (half only) + prediction/gradient + its half copy
        # + the solver's output before the gradient overwrites it + softcap's tanh
        per_class = (size + (cdt_size if half else 0) + 2 * cdt_size + (size if half else 0)
                     + (cdt_size if softcap else 0))
    per_token = V * (per_class + (4 if chunk_target else 0) + extra_buffers * cdt_size)
    return max(1, memory_budget // per_token)


def accumulate_weight_grad(gw: Tensor, Gm: Tensor, h: Tensor) -> None:
    """``gw += Gmᵀ h`` with ``Gm``, ``h`` in the input dtype and ``gw`` in the input dtype or float32.

    ``gw`` in the input dtype (the one-process fused loss): one GEMM that reads and writes ``gw``
    in that dtype, accumulating in float32 inside the GEMM (tensor cores on a GPU), as Liger-Kernel
    does.  ``gw`` float32 with half operands (the per-token loss's backward): on CUDA one
    tensor-core GEMM that adds into ``gw`` in float32 (``out_dtype``); elsewhere the operands are
    converted to float32.
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


def skips_zero_tiles(loss: RowLoss, hidden2d: Tensor, weight: Tensor, tgt: Target) -> bool:
    """Whether the fused loss's backward products skip the all-zero tiles of each chunk's gradient ``G``
    (the one place that chooses): a loss whose gradient ``p - y`` has exact zeros (the sparse mappings,
    α-ReLU, normmax, budget sparsemax) with class-index targets without label smoothing, a vocabulary and a
    hidden size that are multiples of 16 (the tile products' specialization), where the GPU kernels run.
    The dense losses (softmax: no entry of ``G`` is zero), dense or smoothed targets (every entry of ``y``
    is non-zero), other shapes (a vocabulary of 50257), the CPU, and every loss where the tile products are
    turned off (:func:`softargmax.backends.triton.tile_gemms.set_enabled`) keep the dense GEMMs (cuBLAS on
    a GPU), and mark no tiles."""
    V, d = weight.shape
    return (loss.sparse_gradient and hidden2d.shape[0] > 0 and tgt.dense is None and tgt.topk_index is None
            and not tgt.smoothing and V % 16 == 0 and d % 16 == 0 and skips_tiles(hidden2d))


def keeps_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``): then the buffers an
    autograd function saved must not be overwritten.  ``True`` where torch cannot tell."""
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if query is None else bool(query())


def chunk_logits(h: Tensor, weight: Tensor, bias: Optional[Tensor], dtype: Optional[torch.dtype],
                 softcap: Optional[float], keep_tanh: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """A chunk's logits ``h Wᵀ + b``, converted to ``dtype`` (``None``: the GEMM's, the input's), soft-capped
    where asked: ``(θ, tanh(z / c))`` (the backward's chain factor), or ``(θ, None)`` without a cap or with
    ``keep_tanh`` false (then θ is capped in place: one buffer)."""
    z = h @ weight.T if bias is None else torch.addmm(bias, h, weight.T)
    if dtype is not None and z.dtype != dtype:
        z = z.to(dtype)
    if softcap is None:
        return z, None
    t = z.div_(softcap).tanh_()  # in place: z is this chunk's own buffer
    if not keep_tanh:
        return t.mul_(softcap), None
    return t * softcap, t


class LinearFY(torch.autograd.Function):
    """The reduced fused loss: every chunk's gradients computed in the forward, scaled in the backward.

    ``mode``: ``None`` for a ``compute(logits, part) -> (loss, p, G)`` that knows no row scale (the
    vocabulary-parallel loss: ``G`` is scaled here); ``"compute"`` or ``"native"`` for
    :meth:`~softargmax.losses._rows.RowLoss.rows`, which folds the row scale into ``G`` and may
    write it over the logits; ``"native"`` keeps the chunk in the input's dtype (half precision on
    the GPU kernels' route), ``"compute"`` converts it to the compute dtype first.

    ``skip`` (:func:`skips_zero_tiles` chooses): the loss kernel marks, as it writes ``G``, the
    ``64 × 64`` tiles that hold a non-zero entry (:mod:`softargmax.backends.tile_flags`; without a
    ``mode``, the vocabulary-parallel loss, they are marked from ``G``), and the products ``G W`` and
    ``Gᵀ h`` skip the others (:func:`backprop_chunk`), read on the device.

    The weight's gradient is accumulated in the weight's dtype (:func:`accumulate_weight_grad`):
    for bfloat16 each chunk's GEMM accumulates in float32 and rounds the running sum once, so
    ``n`` chunks add at most ``n`` roundings (about 2.5 units of bfloat16 at 32 chunks, measured); the
    bias's in float32.  The backward scales the three gradients in place by the incoming scalar
    and hands them on (unless the graph is kept for another backward).
    """

    @staticmethod
    def forward(ctx: Any, hidden2d: Tensor, weight: Tensor, bias: Optional[Tensor], compute: RowsCompute, tgt: Target,
                denom: Union[float, Tensor], chunk: int, softcap: Optional[float],
                mode: Optional[str] = None, skip: bool = False) -> Tensor:
        N, d = hidden2d.shape
        V = weight.shape[0]
        dt = hidden2d.dtype
        cdt = compute_dtype(dt)
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        gh = torch.empty_like(hidden2d) if need_h else None
        # the weight's gradient in its own dtype for the one-process loss (no float32 [V, d] buffer, no final copy)
        gw = torch.zeros(V, d, dtype=weight.dtype if mode is not None else cdt, device=weight.device) if need_w else None
        gb = torch.zeros(V, dtype=cdt, device=weight.device) if need_b else None
        total = torch.zeros((), dtype=cdt, device=hidden2d.device)
        inv = 1.0 / denom
        # the gradient's factor: 0 where the denominator is NaN (a mean over no kept item, or over items whose
        # weights sum to 0): the value is NaN, as F.cross_entropy's, and no item moves it
        ginv = (0.0 if math.isnan(inv) else inv) if not isinstance(inv, Tensor) else torch.nan_to_num(inv, nan=0.0)
        # the marks of the chunks' non-zero tiles, one buffer for every chunk
        tiles = TileFlags(min(chunk, N), V, hidden2d.device) if skip and N else None
        for start in range(0, N, chunk):
            end = min(N, start + chunk)
            h = hidden2d[start:end]
            part = rows_of(tgt, start, end)
            z, t = chunk_logits(h, weight, bias, None if mode == "native" else cdt, softcap)
            w = part.item_weight
            n = end - start
            marks = None if tiles is None else tiles.reset(n)
            if mode is None:  # (G's tiles are then marked from G: backprop_chunk)
                loss, _, G = compute(z, part)
                G = G.mul_(ginv if w is None else (w * ginv).unsqueeze(1))
            else:
                scale = (w * ginv) if w is not None else \
                    (ginv.expand(n) if isinstance(ginv, Tensor) else torch.full((n,), ginv, dtype=cdt, device=z.device))
                loss, _, G = compute(z, part, inplace=True, scale=scale.to(cdt), overwrite=True, tiles=marks)
            del z
            total = total + (loss if w is None else loss * w).sum()
            backprop_chunk(G, t, dt, weight, h, None if gh is None else gh[start:end], gw, gb, marks)
            del G, t  # the chunk's buffers are freed before the next chunk's are made
        ctx.grads = (gh, None if gw is None else gw.to(weight.dtype), None if gb is None or bias is None else gb.to(bias.dtype))
        return total * inv

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Optional[Tensor], ...]:
        grads = ctx.grads
        in_place = not keeps_graph()
        if in_place:
            ctx.grads = None  # the buffers are handed on: autograd then takes them without a copy
        out: list[Optional[Tensor]] = []
        for g in grads:
            if g is None:
                out.append(None)
            else:
                s = grad_out.to(compute_dtype(g.dtype))
                out.append(g.mul_(s) if in_place else torch.mul(g, s, out=torch.empty_like(g)))
        return out[0], out[1], out[2], None, None, None, None, None, None, None


def backprop_chunk(G: Tensor, tanh: Optional[Tensor], dtype: torch.dtype, weight: Tensor, h: Tensor,
                   gh: Optional[Tensor], gw: Optional[Tensor], gb: Optional[Tensor],
                   tiles: Optional[TileFlags] = None) -> None:
    """One chunk's gradient ``G = ∂loss/∂logits`` ``[n, V]`` (scaled; in the input dtype or the
    compute dtype) taken back through the output layer: through the soft-cap first when ``tanh``
    (``tanh(x/c)`` of the chunk, overwritten) is given, then ``gh = G W`` written into ``gh``
    ``[n, d]``, ``gw += Gᵀ h`` and ``gb += Σ G`` (each skipped when ``None``).  ``G`` is overwritten.

    ``tiles``: the marks of ``G``'s non-zero tiles (made from ``G`` here where no kernel wrote them);
    the two products then skip the unmarked tiles where the GPU kernels take them
    (:func:`softargmax.backends.tile_backprop`), else run as dense GEMMs.  The soft-cap's factor
    keeps a zero zero, so the marks stay valid after it."""
    if tanh is not None:
        G.mul_(tanh.mul_(tanh).neg_().add_(1.0))  # d(c·tanh(x/c))/dx = 1 - tanh²
    Gm = G if G.dtype == dtype else G.to(dtype)
    if gb is not None:
        gb.add_(G.sum(0, dtype=gb.dtype))
    if tiles is not None and (gh is not None or gw is not None):
        if not tiles.written:
            tiles.mark_from(G)
        if tile_backprop(Gm, weight, h, gh, gw, tiles):
            return
    if gh is not None:
        torch.mm(Gm, weight, out=gh)
    if gw is not None:
        accumulate_weight_grad(gw, Gm, h)


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
