"""What a call may do in the context it runs in: whether ``torch.compile`` is tracing it (then the
public functions call their ``torch.library`` operators) and whether a check may read tensor values
now (not while tracing, not during CUDA-graph capture, not on ``meta`` tensors)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["CUSTOM_OPS", "compiling", "use_custom_ops", "values_checkable"]


#: ``torch.library.custom_op`` (torch >= 2.4): the operators torch.compile uses are registered
CUSTOM_OPS = hasattr(torch.library, "custom_op")


def compiling() -> bool:
    """Whether ``torch.compile`` is tracing this call (``False`` on a torch without the query)."""
    query = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(query()) if query is not None else False


def use_custom_ops() -> bool:
    """Whether the public functions call their ``torch.library`` operators (while compiling, where they exist)."""
    return CUSTOM_OPS and compiling()


def values_checkable(t: Tensor) -> bool:
    """Whether a check may read the values of ``t`` now.

    Not while ``torch.compile`` traces (the custom operators of :mod:`softargmax.operators._library_ops`
    run the same checks at run time) and not for a CUDA tensor while its stream is being
    captured into a CUDA graph (reading a value would synchronize with the host), and not
    for a ``meta`` tensor (it has none).
    """
    if compiling() or t.device.type == "meta":
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())
