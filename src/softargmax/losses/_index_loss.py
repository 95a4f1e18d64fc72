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
* integer class indices of the scores' shape without the last dimension, no ``q``, temperature 1, no
  weights, label smoothing, label sets, soft-capping, prediction or process group;
* a mapping of the C solver's power kind: α-entmax with α in (1, 2] (sparsemax, ``"chi_square"``,
  1.5-entmax), α - 1 not below :data:`~softargmax.backends.cpu.rows.MIN_A` (``select`` checks it).

The per-row losses and the gradient equal the general path's bit for bit; the reduced loss sums the
per-row values in float64 and rounds once (the general path sums in the input's dtype), so it may
differ from it in the last bit.
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
from ..backends.kinds import KIND_POWER, kind_of
from ..divergences import Divergence
from ._omega import f_at_zero, one_hot_omega
from ._row_losses import FenchelYoungRowLoss, resolve_loss

__all__ = ["index_loss", "IndexLoss"]

#: what the C call needs of a loss: ``(divergence, a, omega constants, {dtype: f(1) - f(0)})``
Constants = tuple[Divergence, float, tuple[float, float], dict[torch.dtype, float]]
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
    not compute it (not the power kind, an infinite f(0)) or the name or a parameter is invalid (the general path
    then raises); kept for the valid ones."""
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
    if isinstance(loss, FenchelYoungRowLoss):
        div = loss.divergence
        kind, a = kind_of(div)
        omega = cpu_rows.omega_constants(div)
        if kind == KIND_POWER and a is not None and omega is not None and f_at_zero(div) < math.inf:
            found = (div, a, omega, {dt: one_hot_omega(div, dt) for dt in (torch.float32, torch.float64)})
    if len(_CONSTANTS) >= _MAX_ENTRIES:
        _CONSTANTS.clear()
    _CONSTANTS[key] = found
    return found


def index_loss(x: Tensor, target: Tensor, mapping: str, params: dict[str, Any], dim: object, ignore_index: object,
               reduction: object) -> Optional[Tensor]:
    """The loss ``mapping`` with its parameters ``params`` (``{"alpha": α}`` or ``{}``) of scores ``x`` against
    class indices ``target``, by one C call, or ``None`` where this path does not take the call (the module
    docstring lists when).  The other options are their defaults (the caller has checked)."""
    if graph_mode() != EAGER or (type(x) is not Tensor and type(x) is not Parameter) or type(target) is not Tensor \
            or target.dtype not in _INDEX_DTYPES or type(dim) is not int or type(ignore_index) is not int \
            or type(reduction) is not str or reduction not in cpu_rows.INDEX_REDUCTIONS:
        return None
    nd = x.dim()
    if not (dim == -1 or dim == nd - 1) or not _INT64[0] <= ignore_index <= _INT64[1] or target.shape != x.shape[:-1] \
            or x.numel() == 0 or forward_ad._current_level >= 0 or _functorch_active():
        return None
    constants = _constants(mapping, params)
    if constants is None:
        return None
    div, a, omega, cy = constants
    k = x.shape[-1]
    rows = x.numel() // k
    # the backends' one decision (softargmax.backends.select): the C solver takes these rows and this operator
    if (nd != 2 and not x.is_contiguous()) or \
            select(x if nd == 2 else x.view(rows, k), div, candidates_only=True, row_sums=True) is not cpu_rows:
        return None
    rows = x.numel() // x.shape[-1]
    t = target if target.dim() == 1 else target.reshape(rows)
    if t.dtype != torch.int64 or not t.is_contiguous():
        t = t.to(torch.int64).contiguous()
    spec = (rows, a, omega, cy[x.dtype], ignore_index, reduction)
    if x.requires_grad and torch.is_grad_enabled():
        # Function.apply less its Python wrapper (a few microseconds, a third of a small call's forward): with no
        # functorch transform active (checked above) the wrapper only unwraps dead functorch wrappers, done here
        out: Tensor = _apply(_unwrap_if_dead(x), _unwrap_if_dead(t), spec) if _unwrap_if_dead is not None \
            else _apply(x, t, spec)
        return out
    return _forward(x, t, spec)[0]


#: what :func:`_forward` needs besides the scores and the indices: ``(rows, a, omega constants, f(1) - f(0),
#: ignore_index, reduction)``
Spec = tuple[int, float, tuple[float, float], float, int, str]


def _forward(x: Tensor, t: Tensor, spec: Spec) -> tuple[Tensor, Tensor, int]:
    """``(loss, G of x's shape, kept rows)``; a class index out of range raises the general path's ``ValueError``."""
    rows, a, omega, cy, ignore_index, reduction = spec
    try:
        kept, G, loss = cpu_rows.index_loss(x, rows, a, omega, cy, t, ignore_index, reduction)
    except IndexError as err:
        r = int(str(err))
        raise ValueError(f"target: class index {int(t[r])} is out of range [0, {x.shape[-1]}) "
                         f"(ignore_index={ignore_index})") from None
    return loss, G, kept


_keep_graph_query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)


def _keeps_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``): then ``G`` must not be
    overwritten.  ``True`` where torch cannot tell."""
    return True if _keep_graph_query is None else bool(_keep_graph_query())


#: 0-d tensors of the backward's factors by ``(value, dtype)`` (a Python number would cost a tensor per call:
#: a few microseconds of a small call's backward); cleared when it grows past :data:`_MAX_ENTRIES`
_FACTORS: dict[tuple[float, torch.dtype], Tensor] = {}


def _factor(value: float, dtype: torch.dtype) -> Tensor:
    """``value`` rounded to ``dtype`` (float32 or float64) as a 0-d tensor, kept (never written)."""
    if dtype == torch.float32:
        value = struct.unpack("f", struct.pack("f", value))[0]
    key = (value, dtype)
    f = _FACTORS.get(key)
    if f is None:
        if len(_FACTORS) >= _MAX_ENTRIES:
            _FACTORS.clear()
        f = _FACTORS[key] = torch.tensor(value, dtype=dtype)
    return f


class IndexLoss(torch.autograd.Function):
    """The reduced (or per-row) loss of :func:`index_loss`, with ``G = p - y`` from the same C call: the
    backward is ``G`` times the incoming gradient (over the kept rows' count for ``"mean"``), in place
    unless the graph is kept (``retain_graph=True``).  ``"mean"`` over no kept row has the value NaN and the
    gradient 0, as ``F.cross_entropy``.

    The factor of ``"mean"`` is formed on the host from the incoming scalar, ``grad / count`` rounded to the
    dtype (what the general path's ``DivBackward`` computes, an IEEE division), and kept as a 0-d tensor: the
    gradient equals the general path's bit for bit."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, t: Tensor, spec: Spec) -> Tensor:
        loss, G, kept = _forward(x, t, spec)
        ctx.G, ctx.kept, ctx.reduction = G, kept, spec[5]
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
    if ctx.reduction == "none":
        scale: Optional[Tensor] = grad.unsqueeze(-1)
    elif ctx.reduction == "sum":
        scale = grad
    elif ctx.kept:  # the factor grad / count of the general path's DivBackward (an IEEE division), rounded
        g = grad.item()
        scale = None if g == 1.0 and ctx.kept == 1 else _factor(g / ctx.kept, G.dtype)
    else:  # "mean" of no kept row: G is 0, as F.cross_entropy's gradient
        scale = None
    if scale is None:
        return (G.clone() if keep else G), None, None
    return (G * scale if keep else G.mul_(scale)), None, None


_backward_once = once_differentiable(_backward)


#: ``torch.autograd.Function.apply``'s last step, the C++ ``apply`` bound to :class:`IndexLoss` (``apply`` itself
#: where this PyTorch has no ``unwrap_if_dead``)
_apply = super(torch.autograd.Function, IndexLoss).apply if _unwrap_if_dead is not None else IndexLoss.apply
