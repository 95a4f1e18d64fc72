r"""The Fenchel–Young loss of class indices in one C call per pass: small calls as cheap as ``F.cross_entropy``'s.

A call of :func:`softargmax.entmax15_loss` on a few rows of CPU scores spent most of its time outside
the solver: parsing the target, evaluating :math:`\Omega(y)`, forming ``⟨θ, p⟩ - θ_c``, ``p - y``
and the reduction, some sixty small tensor operations and Python calls.  :func:`index_loss` does the
same work with the fused CPU solver's :func:`~softargmax.backends.cpu.rows.index_loss`: one C call
checks the class indices, solves the rows, writes ``G = p - y`` where ``p`` would go, the per-row
values with the roundings of the general path (:class:`~softargmax.losses._row_losses.FenchelYoungRowLoss`)
and the reduced loss; the backward is one multiplication of ``G``.  :math:`\Omega` of a one-hot target
is the constant :func:`~softargmax.losses._omega.one_hot_omega`.

It takes the calls it can compute exactly as the general path does, and returns ``None`` for every
other (which then runs the general path, with its checks and messages):

* eager calls only (not while ``torch.compile``, ``torch.export`` or ``torch.jit.trace`` traces, no
  ``torch.func`` transform, no forward-mode AD), on plain tensors (no subclass, no fake tensor);
* scores with the classes along the last dimension, at least one row and one class, whose rows the
  backends' one decision (:func:`softargmax.backends.select`, as the loss values ask it) gives to the C
  solver: CPU, float32 or float64, contiguous, the library built and switched on
  (``SOFTARGMAX_CPU_KERNELS=0`` turns this path off as well), not Triton's interpreter;
* integer class indices of the scores' shape without the last dimension, no ``q``, temperature 1, no label
  sets, soft-capping, prediction or process group; label smoothing (not with :math:`f(0) = +\infty`, whose
  smoothed losses are finite) and class weights (a CPU tensor ``[k]``, finite and non-negative, that needs
  no gradient) are taken;
* a mapping of the C solver's (:data:`~softargmax.backends.kinds.CPU_KINDS`): the power kind, α-entmax with α
  in (1, 2] (sparsemax, ``"chi_square"``, 1.5-entmax), α - 1 not below
  :data:`~softargmax.backends.cpu.rows.MIN_A` (``select`` checks it); the Jensen–Shannon and squared-Hellinger
  f-divergences (their values from the rows' conjugate in float64, as the general path forms them); the
  reverse-KL, Jeffrey and reverse-χ² f-divergences (``+inf``, or 0 where the target is the row's one
  unmasked class: :math:`f(0) = +\infty`).

The per-row losses and the gradient equal the general path's bit for bit, class weights included (with
``reduction="none"`` too): the general path with the same row solver, the C one.  (Switched off, by
``SOFTARGMAX_CPU_KERNELS=0`` or :func:`~softargmax.backends.cpu.rows.set_enabled`, the general path
solves with the PyTorch solver, whose rows may differ from the C solver's in the last bits, weights or
not.)  The reduced loss sums the per-row values in float64 and rounds once (the general path sums in the
input's dtype), so it may differ from it in the last bits; the mean is that sum over the denominator (the
kept rows' count, or their weights' sum, taken in float64 and rounded once), divided in the input's dtype
as the general path and ``F.cross_entropy`` divide: weights whose sum overflows the dtype give a mean
of 0 where the weighted losses' sum is finite and NaN where it overflows too, with a zero gradient, in
both paths.  With label smoothing ``⟨θ, y⟩`` (its sum of the scores is taken in float64) may also differ
in the last bit.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.autograd.function import once_differentiable
from torch.nn import Parameter

from .._utils.tracing import EAGER, graph_mode
from ..backends import select
from ..backends.cpu import rows as cpu_rows
from ..backends.kinds import CPU_KINDS, KIND_POWER, kind_of
from ..divergences import Divergence
from ._omega import f_at_zero, one_hot_omega
from ._row_losses import FenchelYoungRowLoss, omega_y, resolve_loss
from ._targets import Target

__all__ = ["index_loss", "IndexLoss"]

#: what the C call needs of a loss: ``(divergence, kind, a, omega constants, {dtype: Ω of a one-hot target})``:
#: ``f(1) - f(0)`` in each dtype for the power kind; its float64 value for Jensen–Shannon and squared Hellinger
#: (the C solver forms their values in double); ``+inf`` where ``f(0) = +inf`` (reverse KL, Jeffrey, reverse χ²:
#: the closed form of the loss needs no Ω, and label smoothing, whose Ω is finite, is refused there)
Constants = tuple[Divergence, int, float, tuple[float, float], dict[torch.dtype, float]]
_CONSTANTS: dict[tuple[str, tuple[tuple[str, Any], ...]], Optional[Constants]] = {}
_MAX_ENTRIES = 256
_INT64 = (-(2**63), 2**63 - 1)
#: the class indices' dtypes (a bool or floating target goes to the general path, which says why it is refused)
_INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
#: PyTorch internals that let a call skip Function.apply's Python wrapper; where a PyTorch lacks them, the calls
#: go through Function.apply itself (the same result, a few microseconds slower)
_functorch_active: Callable[[], bool] = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_unwrap_if_dead: Optional[Callable[[Tensor], Tensor]] = getattr(getattr(torch._C, "_functorch", None),
                                                                 "unwrap_if_dead", None)


def _constants(mapping: str, params: dict[str, Any]) -> Optional[Constants]:
    """The constants of the loss named ``mapping`` with ``params`` (numbers), or ``None`` where the C call does
    not compute it (a divergence that the C solver has no kind for) or the name or a parameter is invalid (the
    general path then raises); kept for the valid ones."""
    if params and any(type(v) not in (float, int) for v in params.values()):
        return None  # a tensor alpha, a bool...: the general path takes or refuses it
    key = (mapping, tuple(params.items()))
    if key in _CONSTANTS:
        return _CONSTANTS[key]
    try:
        loss = resolve_loss(mapping, params)
    except (TypeError, ValueError):
        return None
    found = None
    if isinstance(loss, FenchelYoungRowLoss) and not loss.divergence.hints.softmax:
        div = loss.divergence
        kind, a = kind_of(div, CPU_KINDS)
        omega = cpu_rows.omega_constants(div)
        f0 = f_at_zero(div)
        if kind == KIND_POWER and a is not None and omega is not None and f0 < math.inf:
            found = (div, kind, a, omega, {dt: one_hot_omega(div, dt) for dt in (torch.float32, torch.float64)})
        elif kind in cpu_rows.CONJUGATE_KINDS and f0 < math.inf:  # the value in float64, rounded once
            cy = one_hot_omega(div, torch.float64)
            found = (div, kind, 1.0, (0.0, 1.0), {torch.float32: cy, torch.float64: cy})
        elif kind is not None and kind != KIND_POWER and f0 == math.inf:  # +inf or 0 (the C call decides)
            found = (div, kind, 1.0, (0.0, 1.0), {torch.float32: math.inf, torch.float64: math.inf})
    if len(_CONSTANTS) >= _MAX_ENTRIES:
        _CONSTANTS.clear()
    _CONSTANTS[key] = found
    return found


#: the constants of label smoothing by ``(mapping key, ε, k, dtype)``: ``(ε, ε/k, 1 - ε + ε/k, Ω(y) less k f(0))``
_SMOOTHING: dict[tuple[Any, ...], tuple[float, float, float, float]] = {}


def _smoothing_constants(mapping_key: tuple[Any, ...], div: Divergence, kind: int, eps: float, k: int,
                         dtype: torch.dtype) -> tuple[float, float, float, float]:
    """What the C call needs of label smoothing ε (:func:`softargmax.backends.cpu.rows.index_loss`): ``Ω(y)`` of the
    smoothed target less its ``k f(0)`` terms as the general path forms it (``omega_y``: in ``dtype`` for the
    power kind, in float64 for the conjugate kinds), kept."""
    key = (mapping_key, eps, k, dtype)
    found = _SMOOTHING.get(key)
    if found is None:
        cdt = dtype if kind == KIND_POWER else torch.float64
        rows = Target(index=None, dense=torch.empty(1, k, dtype=cdt), keep=torch.ones(1, dtype=torch.bool),
                      item_weight=None, smoothing=eps)
        value = float(omega_y(div, rows, None, f_at_zero(div), cdt).to(torch.float64)[0])
        if len(_SMOOTHING) >= _MAX_ENTRIES:
            _SMOOTHING.clear()
        found = _SMOOTHING[key] = (eps, eps / k, 1.0 - eps + eps / k, value)
    return found


def _plain_weight(weight: object, k: int, dtype: torch.dtype) -> Optional[Tensor]:
    """``weight`` as the C call reads it (``[k]``, contiguous, ``dtype``), or ``None`` where the general path must
    take it: not a plain CPU floating tensor of shape ``(k,)`` with finite non-negative values (the general path
    says what is wrong), or one that requires a gradient (the general path differentiates the weights)."""
    if type(weight) is not Tensor or not weight.is_floating_point() or weight.shape != (k,) or weight.requires_grad \
            or weight.device.type != "cpu":
        return None
    w = weight if weight.dtype == dtype else weight.to(dtype)
    if not w.is_contiguous():
        w = w.contiguous()
    return w if cpu_rows.weights_ok(w) else None  # one C pass, no tensor and no host read (NaN: refused)


def index_loss(x: Tensor, target: Tensor, mapping: str, params: dict[str, Any], dim: object, ignore_index: object,
               reduction: object, label_smoothing: object = 0.0, weight: Optional[Tensor] = None) -> Optional[Tensor]:
    """The loss ``mapping`` with its parameters ``params`` (``{"alpha": α}`` or ``{}``) of scores ``x`` against
    class indices ``target``, by one C call, or ``None`` where this path does not take the call (the module
    docstring lists when).  The other options are their defaults (the caller has checked)."""
    if graph_mode() != EAGER or (type(x) is not Tensor and type(x) is not Parameter) or type(target) is not Tensor \
            or target.dtype not in _INDEX_DTYPES or type(dim) is not int or type(ignore_index) is not int \
            or type(reduction) is not str or reduction not in cpu_rows.INDEX_REDUCTIONS \
            or not isinstance(label_smoothing, (float, int)) or isinstance(label_smoothing, bool) \
            or not 0.0 <= label_smoothing <= 1.0:
        return None
    nd = x.dim()
    if not (dim == -1 or dim == nd - 1) or not _INT64[0] <= ignore_index <= _INT64[1] or target.shape != x.shape[:-1] \
            or x.numel() == 0 or forward_ad._current_level >= 0 or _functorch_active():
        return None
    constants = _constants(mapping, params)
    if constants is None:
        return None
    div, kind, a, omega, cy = constants
    k = x.shape[-1]
    rows = x.numel() // k
    # the backends' one decision (softargmax.backends.select): the C solver takes these rows and this operator
    # (asked first: a call it does not take pays nothing for the weights and smoothing below)
    if (nd != 2 and not x.is_contiguous()) or \
            select(x if nd == 2 else x.view(rows, k), div, candidates_only=True, row_sums=True) is not cpu_rows:
        return None
    smoothing = None
    if label_smoothing > 0:
        if math.isinf(cy[torch.float64]):  # f(0) = +inf: Ω of a smoothed target is finite, not the C call's
            return None
        eps, ys, yc, cy_s = _smoothing_constants((mapping, tuple(params.items())), div, kind, float(label_smoothing),
                                                 k, x.dtype)
        smoothing, cy = (eps, ys, yc), {x.dtype: cy_s}
    w = None
    if weight is not None:
        w = _plain_weight(weight, k, x.dtype)
        if w is None:
            return None
    t = target if target.dim() == 1 else target.reshape(rows)
    if t.dtype != torch.int64 or not t.is_contiguous():
        t = t.to(torch.int64).contiguous()
    spec = (rows, kind, a, omega, cy[x.dtype], ignore_index, reduction, smoothing, w)
    if x.requires_grad and torch.is_grad_enabled():
        # Function.apply less its Python wrapper (a few microseconds, a third of a small call's forward): with no
        # functorch transform active (checked above) the wrapper only unwraps dead functorch wrappers, done here
        out: Tensor = _apply(_unwrap_if_dead(x), _unwrap_if_dead(t), spec) if _unwrap_if_dead is not None \
            else _apply(x, t, spec)
        return out
    return _forward(x, t, spec)[0]


#: what :func:`_forward` needs besides the scores and the indices: ``(rows, kind, a, omega constants,
#: Ω(y) less k f(0), ignore_index, reduction, label smoothing (ε, ε/k, 1 - ε + ε/k) or None, class weights or None)``
Spec = tuple[int, int, float, tuple[float, float], float, int, str, Optional[tuple[float, float, float]],
             Optional[Tensor]]


def _forward(x: Tensor, t: Tensor, spec: Spec) -> tuple[Tensor, Tensor, int, Optional[Tensor], float]:
    """``(loss, G of x's shape, kept rows, the rows' weights or None, the mean's denominator)``; a class index out
    of range raises the general path's ``ValueError``."""
    rows, kind, a, omega, cy, ignore_index, reduction, smoothing, weight = spec
    try:
        kept, G, loss, wrow, den = cpu_rows.index_loss(x, rows, kind, a, omega, cy, t, ignore_index, reduction,
                                                      smoothing, weight)
    except IndexError as err:
        r = int(str(err))
        raise ValueError(f"target: class index {int(t[r])} is out of range [0, {x.shape[-1]}) "
                         f"(ignore_index={ignore_index})") from None
    return loss, G, kept, wrow, den


_keep_graph_query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)


def _keeps_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``): then ``G`` must not be
    overwritten.  ``True`` where torch cannot tell."""
    return True if _keep_graph_query is None else bool(_keep_graph_query())


def _rounded(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype`` (float32 or float64), to nearest (``±inf`` past float32's range)."""
    if dtype != torch.float32:
        return value
    try:
        rounded: float = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    return rounded


class IndexLoss(torch.autograd.Function):
    """The reduced (or per-row) loss of :func:`index_loss`, with ``G = p - y`` from the same C call: the
    backward is ``G`` times the incoming gradient (over the kept rows' count for ``"mean"``), in place
    unless the graph is kept (``retain_graph=True``).  ``"mean"`` over no kept row has the value NaN and the
    gradient 0, as ``F.cross_entropy``.

    The factor of ``"mean"`` is formed on the host from the incoming scalar, ``grad / count`` (with class
    weights ``grad / Σ w``, the sum rounded to the dtype) rounded to the dtype (what the general path's
    ``DivBackward`` computes, an IEEE division); one C pass multiplies each row of ``G`` by it (with class
    weights by its product with the row's weight, rounded, as the general path's ``MulBackward``): the
    gradient equals the general path's bit for bit."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, t: Tensor, spec: Spec) -> Tensor:
        loss, G, kept, wrow, den = _forward(x, t, spec)
        ctx.G, ctx.kept, ctx.reduction, ctx.wrow, ctx.den = G, kept, spec[6], wrow, den
        return loss

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None]:
        if torch.is_grad_enabled():  # create_graph=True: a second differentiation is refused, as the general path's
            return _backward_once(ctx, grad)
        return _backward(ctx, grad)  # (the engine runs it with grad mode off: no no_grad() block needed)


def _backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None]:
    """:meth:`IndexLoss.backward`."""
    G: Optional[Tensor] = ctx.G
    if G is None:  # released by a backward that did not keep the graph: autograd's own message
        raise RuntimeError("Trying to backward through the graph a second time (or directly access saved tensors after "
                           "they have already been freed). Specify retain_graph=True if you need to backward through "
                           "the graph a second time.")
    keep = _keeps_graph()
    if not keep:  # the returned G is then the only reference: autograd takes it without a copy
        ctx.G = None
    wrow: Optional[Tensor] = ctx.wrow
    if ctx.reduction == "none":  # a factor per row: PyTorch's product (with class weights, after theirs)
        scale = grad.unsqueeze(-1) if wrow is None else (grad * wrow.view(grad.shape)).unsqueeze(-1)
        return (G * scale if keep else G.mul_(scale)), None, None
    g = grad.item()
    if ctx.reduction == "sum":
        factor = g
    elif wrow is not None:  # grad / Σ w (the weights' sum rounded to the dtype, as the general path sums them), or 0
        factor = _rounded(g / _rounded(ctx.den, G.dtype), G.dtype) if ctx.den != 0 else 0.0
    elif ctx.kept:  # grad / count of the general path's DivBackward (an IEEE division), rounded
        if g == 1.0 and ctx.kept == 1:
            return (G.clone() if keep else G), None, None
        factor = g / ctx.kept
    else:  # "mean" of no kept row: G is 0, as F.cross_entropy's gradient
        return (G.clone() if keep else G), None, None
    # one C pass: G times the factor rounded to the dtype (and, with class weights, by the row's weight)
    return cpu_rows.scale_rows(G, factor, wrow, in_place=not keep), None, None


_backward_once = once_differentiable(_backward)


#: ``torch.autograd.Function.apply``'s last step, the C++ ``apply`` bound to :class:`IndexLoss` (``apply`` itself
#: where this PyTorch has no ``unwrap_if_dead``)
_apply = super(torch.autograd.Function, IndexLoss).apply if _unwrap_if_dead is not None else IndexLoss.apply
