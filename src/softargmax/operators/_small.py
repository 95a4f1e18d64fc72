r"""The small calls' fast path: sparsemax, 1.5-entmax and α-entmax (a float α) on CPU rows in one C call.

On a ``4 × 16`` input the solver itself takes well under a microsecond; what a call costs is the
Python around it (argument checks, the row layout, the backend's dispatch, the
:class:`~softargmax.backends.solution.Solution`, the autograd function's wrapper).  For the common
case, a plain contiguous float32/float64 CPU tensor normalized along its last dimension in eager
mode, :func:`mapping` does only what depends on the call: it checks the tensor, allocates the
output (and, when a gradient is needed, the Jacobian weights), and makes one call of the C row
solver's small entry (:func:`softargmax.backends.cpu.rows.map_kernel`).  Everything that depends
on the operator alone (its kind, exponent, the dtypes the C solver covers for it) is computed once,
in a :class:`Mapping`.

Every other call (another ``dim``, a non-contiguous or half-precision tensor, a tensor subclass,
``torch.compile``, ``torch.jit.trace``, ``torch.func`` transforms, forward-mode AD, an empty tensor,
the fused path switched off or not built yet, CPU tensors routed to the Triton interpreter) returns
``None`` and takes the general path, which checks and computes the same: the outputs and gradients here are bit for bit those of the general
path (the same C solver writes ``p`` and ``s``, the same C pass computes the backward).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.autograd.function import once_differentiable
from torch.nn import Parameter

from .._utils.tracing import compiling
from ..backends.cpu import rows as _cpu_rows
from ..backends.kinds import CPU_KINDS, kind_of
from ..backends.triton.rows import interprets_cpu as _interprets_cpu
from ..divergences import Divergence

__all__ = ["Mapping", "mapping"]

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or compiling
_is_jit_tracing = torch._C._is_tracing
_switch, _map_kernels = _cpu_rows.SWITCH, _cpu_rows.MAP_KERNELS  # read on every call: map_kernel() without its call
_functorch_active = torch._C._are_functorch_transforms_active
_is_grad_enabled = torch.is_grad_enabled
_empty_like = torch.empty_like
_empty = torch.empty
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
_COVERED_DTYPES = (torch.float32, torch.float64)
#: the C entry indexes a row with 32-bit integers
_MAX_K = 2**31


class Mapping:
    """What a normalized mapping's small calls need that does not depend on the call: the C solver's
    kind and exponent for ``divergence`` and the dtypes it covers (:func:`softargmax.backends.cpu.rows.covers_divergence`).
    ``None`` kind: not a fused kind (then :func:`mapping` always returns ``None``)."""

    __slots__ = ("kind", "a", "dtypes")

    def __init__(self, divergence: Divergence) -> None:
        kind, a = kind_of(divergence, CPU_KINDS)
        self.kind = kind
        self.a = 1.0 if a is None else float(a)
        self.dtypes = frozenset(dt for dt in _COVERED_DTYPES
                                if kind is not None and _cpu_rows.covers_divergence(torch.empty(0, dtype=dt), divergence))


def mapping(x: Any, dim: Any, op: Mapping) -> Optional[Tensor]:
    """``op``'s output for ``x`` along ``dim`` by the fast path, or ``None`` where the general path must run
    (module docstring).  ``x`` and ``dim`` are the public function's arguments, not yet checked: anything
    unusual returns ``None`` and the general path checks it (and raises its errors)."""
    tx = type(x)
    if (tx is not Tensor and tx is not Parameter) or type(dim) is not int:
        return None
    if _is_compiling() or _is_jit_tracing():
        return None
    dtype = x.dtype
    if dtype not in op.dtypes or not _switch.on or _interprets_cpu():  # the interpreter: Triton's kernels
        return None
    fn = _map_kernels.get(dtype)  # None until the general path has loaded the library
    if fn is None or not x.is_cpu or not x.is_contiguous():
        return None
    shape = x.shape
    nd = len(shape)
    if nd == 0 or not (dim == -1 or dim == nd - 1):
        return None
    k = shape[-1]
    n = x.numel()
    if n == 0 or k >= _MAX_K or forward_ad._current_level >= 0 or _functorch_active():
        return None
    R = n // k
    threads = 1 if n < _cpu_rows.PARALLEL_MIN_ELEMENTS else _cpu_rows.threads_for(R, k)
    if x.requires_grad and _is_grad_enabled():
        return _apply(_unwrap_if_dead(x), op, fn, threads)
    p = _empty_like(x)
    if fn(x.data_ptr(), R, k, op.kind, op.a, p.data_ptr(), None, None, threads) < 0:
        raise MemoryError("softargmax: the CPU row solver could not allocate its row buffers")
    return p


class SmallMapping(torch.autograd.Function):
    """The fast path's autograd function: the forward of the C solver (``p``, the Jacobian weights ``s`` and
    the divisor ``sc`` of :func:`softargmax.backends.cpu.rows.map_kernel`) and the backward
    ``s ⊙ (v - ⟨s, v⟩/Σ s)`` of :func:`softargmax.backends.cpu.rows.jvp` (NaN in rows with NaN or ``+inf``),
    the general path's :meth:`~softargmax.backends.solution.Solution.jvp` on the C solver's rows;
    once differentiable, as the general path's function."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, op: Mapping, fn: Any, threads: int) -> Tensor:
        n = x.numel()
        k = x.shape[-1]
        R = n // k
        p = _empty_like(x)
        aux = _empty(n + R, dtype=x.dtype)  # s [R, k], then sc [R]: one allocation
        s_ptr = aux.data_ptr()
        if fn(x.data_ptr(), R, k, op.kind, op.a, p.data_ptr(), s_ptr, s_ptr + n * aux.element_size(), threads) < 0:
            raise MemoryError("softargmax: the CPU row solver could not allocate its row buffers")
        ctx.aux, ctx.rows, ctx.threads = aux, (R, k), threads
        return p

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None, None]:
        if _is_grad_enabled():  # create_graph=True: once_differentiable's error on a second derivative
            return _once_backward(ctx, grad)
        return _backward(ctx, grad)


def _backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None, None]:
    aux = ctx.aux
    R, k = ctx.rows
    v = grad.contiguous()
    g = _empty_like(v)
    s_ptr = aux.data_ptr()
    _cpu_rows.JVP_KERNELS[aux.dtype](s_ptr, v.data_ptr(), s_ptr + R * k * aux.element_size(), g.data_ptr(), R, k,
                                     1.0, ctx.threads)
    return g, None, None, None


_once_backward = once_differentiable(_backward)
_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, SmallMapping)
