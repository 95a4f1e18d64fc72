r"""Per-token losses of the fused linear + Fenchel–Young loss (``reduction="none"``): a backward that
recomputes each chunk's logits.

With a reduced loss (``"mean"``, ``"sum"``) the gradient with respect to the logits is known in the
forward up to one scalar, so :class:`~softargmax.losses._linear_chunks.LinearFY` computes the
gradients of ``hidden``, ``weight`` and ``bias`` there and the backward only scales them.  Per-token
losses :math:`\ell_i` receive a gradient :math:`g_i` per token: the gradient of the logits of token
:math:`i` is :math:`g_i w_i (p_i - y_i)` (:math:`w_i` its item weight), and the weight's gradient
:math:`\sum_i g_i w_i (p_i - y_i) h_i^\top` mixes every token's :math:`g_i`, unknown until the
backward.  So the forward keeps only what the backward cannot recompute cheaply, and the backward
computes the chunk's logits again (one more GEMM per chunk than the reduced loss):

* forward: for each chunk, the logits, the solve, the per-token loss, and one number per token,
  the threshold :math:`\tau_i` of its prediction; ``hidden``, ``weight`` and ``bias`` are saved as
  they are (no copy), the ``[tokens, vocabulary]`` logits never;
* backward: for each chunk, the logits again (the same GEMM on the same rows), the prediction from
  the stored :math:`\tau` by one elementwise pass, :math:`p = q \odot g(z - \tau)` with
  :math:`z = (\theta - \max_j \theta_j)/\beta` (no threshold search), then
  :math:`G = g_i w_i (p - y)` and the three GEMMs of the reduced loss (for the sparse losses where the
  GPU kernels run, the products skip ``G``'s all-zero tiles, marked from ``G`` by
  :func:`~softargmax.backends.tile_flags.tile_flags`: :func:`~._linear_chunks.backprop_chunk`).

That is the float32 path (the CPU, and rows the GPU kernels do not solve in half precision).  Where
the kernels solve half-precision chunks as they are (the reduced loss's ``"native"`` chunks), the
per-token loss keeps them so too and re-solves instead (``native`` of :class:`LinearFYPerToken`): the
forward takes the values from the kernels' float32 row sums, and the backward recomputes each
chunk's logits and calls the kernel that writes :math:`G = g_i w_i (p - y)` over them in the input's
dtype, one launch (two with the scaling) that costs a threshold search again but no float32
``[tokens, vocabulary]`` buffer and no PyTorch elementwise pass over one; a threshold read off a
half-precision :math:`p` would carry its rounding (:math:`2^{-8}` relative in bfloat16) into every
entry of the recomputed prediction at once.

The alternative on the float32 path, re-solving each chunk in the backward, costs a second threshold search
(several passes over the row); storing :math:`p` costs ``[tokens, vocabulary]`` memory, which is
what the fused loss avoids.  :math:`\tau_i` is read off the forward's prediction at its largest
entry :math:`j`: on the support :math:`p_j = q_j g(z_j - \tau)` with :math:`g = (f^*)' = (f')^{-1}`,
so :math:`\tau = z_j - f'(p_j / q_j)`, exact up to the rounding of :math:`p_j` (a relative error
:math:`\varepsilon` in :math:`p_j` moves :math:`\tau` by at most :math:`\varepsilon p_j^{\alpha - 1}`
for α-entmax, by :math:`\varepsilon` for softmax).  The α-ReLU mapping has a fixed threshold: its
prediction is elementwise in the logits and is simply evaluated again.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._utils.checks import compute_dtype
from .._utils.rows import shift_by_row_max
from ..backends import TileFlags
from ..divergences import Divergence
from ._linear_chunks import backprop_chunk, chunk_logits
from ._prediction_stats import StatsSink
from ._rows import RowsCompute, p_minus_y
from ._targets import Target, rows_of


class ThresholdPrediction:
    r"""The prediction :math:`p = q \odot g((\theta - \max\theta)/\beta - \tau)` of an f-softargmax, from its
    per-row threshold :math:`\tau` (module docstring)."""

    def __init__(self, div: Divergence, beta: float, q: Optional[Tensor]) -> None:
        self.div, self.beta, self.q = div, beta, q

    def state(self, theta: Tensor, p: Tensor) -> Tensor:
        """``[R, 1]`` thresholds of the rows' predictions ``p`` (``+inf`` in rows whose ``p`` is all zero)."""
        j = p.argmax(-1, keepdim=True)
        pj = p.gather(1, j)
        m = theta.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        zj = theta.gather(1, j).sub_(m)
        if self.beta != 1.0:
            zj = zj.div_(self.beta)
        uj = pj if self.q is None else pj / self.q.expand_as(p).gather(1, j)
        # an all-masked row has p = 0: τ = +inf gives g(-inf - inf) = 0 again (NaN rows stay NaN)
        safe = torch.where(pj == 0, torch.ones_like(uj), uj)
        tau = zj - self.div.f_prime(safe)
        return torch.where(pj == 0, torch.full_like(tau, math.inf), tau)

    def gradient(self, theta: Tensor, part: Target, tau: Tensor) -> Tensor:
        """``p - y`` of the rows ``theta`` (overwritten) from their thresholds ``tau``; 0 in ignored rows."""
        z = shift_by_row_max(theta, self.beta, out=theta).sub_(tau)
        p = self.div.conj_prime(z)
        del z
        if self.q is not None:
            p = p.mul_(self.q)
        return p_minus_y(p, part, inplace=True)


class ElementwisePrediction:
    """A mapping whose prediction depends on each logit alone (α-ReLU): evaluated again from the logits."""

    def __init__(self, compute: RowsCompute) -> None:
        self.compute = compute  # compute(theta, part, inplace) -> (loss, p, p - y)

    def state(self, theta: Tensor, p: Tensor) -> None:
        return None

    def gradient(self, theta: Tensor, part: Target, tau: Optional[Tensor]) -> Tensor:
        return self.compute(theta, part, inplace=True)[2]


class LinearFYPerToken(torch.autograd.Function):
    """Per-token fused loss ``[N]`` (module docstring); ``sink``: a :class:`~._prediction_stats.StatsSink` or ``None``.

    ``native``: every chunk stays in the input's dtype (half precision where the GPU kernels solve it, as the
    reduced loss's chunks do, :class:`~._linear_chunks.LinearFY`): the forward takes the value from the row
    kernels' float32 sums and keeps no threshold, and the backward solves each chunk again with the kernel
    that writes ``G = g_i w_i (p - y)`` in the input's dtype over the logits (the reduced loss's call, its
    row scale the incoming per-token gradient), so no float32 ``[tokens, V]`` buffer is made in either pass,
    and ``G`` is the reduced loss's to its rounding."""

    @staticmethod
    def forward(ctx: Any, hidden2d: Tensor, weight: Tensor, bias: Optional[Tensor], compute: RowsCompute,
                predictor: Union[ThresholdPrediction, ElementwisePrediction], tgt: Target, chunk: int,
                softcap: Optional[float], sink: Optional[StatsSink], skip: bool = False, native: bool = False) -> Tensor:
        N = hidden2d.shape[0]
        cdt = compute_dtype(hidden2d.dtype)
        losses = torch.empty(N, dtype=cdt, device=hidden2d.device)
        ctx.compute, ctx.predictor, ctx.tgt, ctx.chunk, ctx.softcap = compute, predictor, tgt, chunk, softcap
        ctx.skip, ctx.native = skip, native
        ctx.save_for_backward(hidden2d, weight, bias)
        if native:
            ctx.tau = None
            for start in range(0, N, chunk):
                end = min(N, start + chunk)
                theta, _ = chunk_logits(hidden2d[start:end], weight, bias, None, softcap, keep_tanh=False)
                part = rows_of(tgt, start, end)
                if sink is None:  # G is written over the chunk's own logits (discarded: the backward solves again)
                    loss = compute(theta, part, inplace=True, overwrite=True)[0]
                else:
                    loss, p, _ = compute(theta, part, inplace=False)
                    sink.add(p)
                    del p
                losses[start:end] = loss if part.item_weight is None else loss * part.item_weight
                del theta
            return losses
        states: list[Any] = []  # the predictor's per-chunk state: [R, 1] thresholds, or None
        for start in range(0, N, chunk):
            end = min(N, start + chunk)
            theta, _ = chunk_logits(hidden2d[start:end], weight, bias, cdt, softcap, keep_tanh=False)
            part = rows_of(tgt, start, end)
            loss, p, G = compute(theta, part, inplace=False)
            del G
            losses[start:end] = loss if part.item_weight is None else loss * part.item_weight
            states.append(predictor.state(theta, p))
            if sink is not None:
                sink.add(p)
            del theta, p
        ctx.tau = None if not states or states[0] is None else torch.cat(states)
        return losses

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_losses: Tensor) -> tuple[Optional[Tensor], ...]:
        hidden2d, weight, bias = ctx.saved_tensors
        N, d = hidden2d.shape
        V = weight.shape[0]
        cdt = compute_dtype(hidden2d.dtype)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        gh = torch.empty_like(hidden2d) if need_h else None
        gw = torch.zeros(V, d, dtype=cdt, device=weight.device) if need_w else None
        gb = torch.zeros(V, dtype=cdt, device=weight.device) if need_b else None
        scale_all = grad_losses.to(cdt)
        if ctx.tgt.item_weight is not None:
            scale_all = scale_all * ctx.tgt.item_weight
        softcap = ctx.softcap
        # the marks of each chunk's non-zero tiles, made from G (tile_flags): the products skip the others
        tiles = TileFlags(min(ctx.chunk, N), V, hidden2d.device) if ctx.skip and N else None
        for start in range(0, N, ctx.chunk):
            end = min(N, start + ctx.chunk)
            h = hidden2d[start:end]
            marks = None if tiles is None else tiles.reset(end - start)
            if ctx.native:  # the chunk solved again by the kernel that writes the scaled G (class docstring)
                theta, t = chunk_logits(h, weight, bias, None, softcap)
                G = ctx.compute(theta, rows_of(ctx.tgt, start, end), inplace=True, scale=scale_all[start:end],
                                overwrite=True, tiles=marks)[2]
                del theta
                backprop_chunk(G, t, hidden2d.dtype, weight, h, None if gh is None else gh[start:end], gw, gb, marks)
                del G, t
                continue
            theta, t = chunk_logits(h, weight, bias, cdt, softcap)
            tau = None if ctx.tau is None else ctx.tau[start:end]
            G = ctx.predictor.gradient(theta, rows_of(ctx.tgt, start, end), tau)
            del theta
            G = G.mul_(scale_all[start:end].unsqueeze(1))
            backprop_chunk(G, t, hidden2d.dtype, weight, h, None if gh is None else gh[start:end], gw, gb, marks)
            del G, t  # the chunk's buffers are freed before the next chunk's are made
        return (gh, None if gw is None else gw.to(weight.dtype), None if gb is None else gb.to(bias.dtype),
                None, None, None, None, None, None, None, None)
