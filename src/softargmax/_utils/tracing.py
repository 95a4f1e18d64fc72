"""What a call may do in the context it runs in: whether ``torch.compile`` or ``torch.export`` is
tracing it (then the public functions call their ``torch.library`` operators), whether it is being
recorded into a graph that leaves Python (``torch.onnx.export``, ``torch.jit.trace``: then they
compute with the fixed-step forms of :mod:`softargmax.solvers.traceable`), and whether a check may
read tensor values now (not while tracing, not during CUDA-graph capture, not on ``meta`` tensors)."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.nn import Parameter

__all__ = ["CUSTOM_OPS", "EAGER", "LIBRARY_OPS", "GRAPH", "compiling", "function_apply", "graph_mode", "onnx_capture",
           "recording_graph", "use_custom_ops", "values_checkable", "without_autograd"]


#: ``torch.library.custom_op`` (torch >= 2.4): the operators torch.compile uses are registered
CUSTOM_OPS = hasattr(torch.library, "custom_op")

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_is_jit_tracing = torch._C._is_tracing

#: ``torch.autograd.Function.apply`` as a function of the class: the library's autograd functions override ``apply``
#: (their ``DTensor`` hook) and call this, not ``super().apply``, which ``torch.compile``'s tracer cannot follow
#: there (an internal error where a graph break belongs: a forward it cannot trace then runs eagerly)
_apply = torch.autograd.Function.apply
function_apply: Callable[..., Any] = _apply.__func__  # type: ignore[attr-defined]  # a classmethod; stubs: a callable

#: the three answers of :func:`graph_mode`
EAGER, LIBRARY_OPS, GRAPH = 0, 1, 2


def compiling() -> bool:
    """Whether ``torch.compile`` or ``torch.export`` is tracing this call (``False`` on a torch without the query)."""
    return bool(_is_compiling()) if _is_compiling is not None else False


def _onnx_exporting() -> bool:
    onnx = sys.modules.get("torch.onnx")  # never imported here: an export has imported it
    return onnx is not None and bool(onnx.is_in_onnx_export())


def onnx_capture() -> bool:
    """Whether ``torch.onnx.export`` is capturing the model (with ``torch.export``) now."""
    return compiling() and _onnx_exporting()


#: the open :func:`recording_graph` blocks (a decomposition of :func:`softargmax.export.decompositions` runs)
_recording = threading.local()  # per thread: another thread's eager calls keep their path and checks


def _recording_depth() -> int:
    return getattr(_recording, "depth", 0)


@contextlib.contextmanager
def recording_graph() -> Iterator[None]:
    """Within the block :func:`graph_mode` answers :data:`GRAPH`: the decompositions of
    :func:`softargmax.export.decompositions` that call a public function record its graph of PyTorch's
    own operators, whatever table or tracer runs them."""
    _recording.depth = _recording_depth() + 1
    try:
        yield
    finally:
        _recording.depth -= 1


def graph_mode() -> int:
    """How the public functions run this call.

    * :data:`EAGER`: the autograd functions and the fused kernels;
    * :data:`LIBRARY_OPS`: ``torch.compile`` or ``torch.export`` traces: one opaque ``torch.library``
      operator per call (:mod:`softargmax.operators._library_ops`);
    * :data:`GRAPH`: ``torch.onnx.export`` or ``torch.jit.trace`` records a graph that must run
      without Python (or a decomposition records one: :func:`recording_graph`): the fixed-step
      forms of :mod:`softargmax.solvers.traceable`, made of PyTorch's own operators.
    """
    if _recording_depth():
        return GRAPH
    if compiling():  # first: torch.compile's tracer cannot call the TorchScript query below
        return GRAPH if _onnx_exporting() else (LIBRARY_OPS if CUSTOM_OPS else EAGER)
    return GRAPH if _is_jit_tracing() else EAGER


def use_custom_ops() -> bool:
    """Whether the public functions call their ``torch.library`` operators (while compiling, where they exist)."""
    return graph_mode() == LIBRARY_OPS


def values_checkable(t: Tensor) -> bool:
    """Whether a check may read the values of ``t`` now.

    Not while ``torch.compile``, ``torch.export`` or ``torch.jit.trace`` traces, nor while a decomposition
    records a graph (:func:`recording_graph`) (the custom operators of
    :mod:`softargmax.operators._library_ops` run the same checks at run time) and not for a CUDA tensor
    while its stream is being captured into a CUDA graph (reading a value would synchronize with the
    host), and not for a ``meta`` tensor (it has none).
    """
    if _recording_depth() or compiling() or _is_jit_tracing() or t.device.type == "meta":
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


_functorch_active = torch._C._are_functorch_transforms_active


def _plain_autograd() -> bool:
    """No ``torch.func`` transform active and no forward-mode AD level open: backward-mode autograd alone."""
    return forward_ad._current_level < 0 and not _functorch_active()


def eager() -> bool:
    """Whether this call runs eagerly: no graph traced, compiled or recorded (:func:`graph_mode` is :data:`EAGER`
    while ``torch.compile`` traces where the custom operators do not exist: that too is excluded)."""
    return graph_mode() == EAGER and not compiling()


def eager_autograd() -> bool:
    """Whether this call runs eagerly (:func:`eager`) under backward-mode autograd alone: where an autograd function
    may change its input in place and define no forward mode."""
    return eager() and _plain_autograd()


def without_autograd(*tensors: Optional[Tensor]) -> bool:
    """Whether an eager call may compute its forward alone, without an autograd function.

    True when no argument needs a gradient (grad mode is off, under ``torch.no_grad`` and
    ``torch.inference_mode``, or no tensor requires one), every tensor argument is a plain
    ``torch.Tensor`` or ``nn.Parameter`` (no subclass: ``DTensor``, fake tensors, tensors with
    ``__torch_function__``), no ``torch.func`` transform is active and no forward-mode AD level
    is open.  Then the autograd function's ``apply`` would only have run its forward (its
    outputs need no graph), and its errors under those transforms are kept by not taking
    this way.  ``None`` arguments are skipped; the caller has checked that the call is eager
    (:func:`graph_mode`).
    """
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) is not Tensor and type(t) is not Parameter:
            return False
        if grad and t.requires_grad:
            return False
    return _plain_autograd()
