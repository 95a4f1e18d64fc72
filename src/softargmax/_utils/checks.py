"""Argument checks shared by every public function: each raises a ``ValueError`` or ``TypeError`` that names the argument.

Conventions: any shape and any ``dim``; float64 and float32 are
computed natively; float16/bfloat16 are computed in float32 and returned in the
input dtype; inputs are never modified in place.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Union

import torch
from torch import Tensor

from .tracing import values_checkable

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def check_tensor(x: object, name: str = "x") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    return x


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the math is done in: float32 for float16/bfloat16, else the input's."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def check_dim(x: Tensor, dim: object, name: str = "dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{name}: the input is a scalar (0-d); it needs at least one dimension to normalize over")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{name}={dim} is out of range for a tensor with {x.dim()} dimensions")
    return dim % x.dim()


def check_positive_number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {type(value).__name__}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


#: the largest sliding window taken: wider ones cut nothing off any sequence a tensor can hold, and are taken as this
WINDOW_MAX = 2 ** 62


def check_window(window: object, name: str = "window") -> Optional[int]:
    """A sliding window's size: ``None`` or a positive integer (an ``int`` or any ``numbers.Integral`` such as
    NumPy's, not a ``bool``), at most :data:`WINDOW_MAX` (a wider one is taken as that: it cuts nothing)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Integral):
        raise TypeError(f"{name} must be None or a positive int (the keys each query sees), got "
                        f"{type(window).__name__}")
    if window < 1:
        raise ValueError(f"{name} must be None or a positive int (the keys each query sees), got {window}")
    return min(int(window), WINDOW_MAX)


def check_real(value: object, name: str, what: str = "a finite number") -> float:
    """A finite real number (an ``int`` or a ``float``, not a ``bool``) as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {what}, got {value}")
    return value


def check_tau(tau: object, x: Optional[Tensor] = None, name: str = "tau") -> Union[float, Tensor]:
    """The α-ReLU threshold: a finite number, or a floating tensor of finite values.

    With the scores ``x``, a tensor must broadcast to ``x`` and follows :func:`check_device`
    (and may come back moved).  A non-finite threshold would make every output ``0``, ``+inf``
    or NaN.
    """
    if isinstance(tau, Tensor):
        if not tau.is_floating_point():
            raise TypeError(f"{name} must be a float or a floating-point tensor, got dtype {tau.dtype}")
        if x is not None:
            check_broadcastable(tau, x, name, "x")
            tau = check_device(tau, x, name)
        t = tau.detach()
        if values_checkable(t) and t.numel() and not _all_finite(t):
            raise ValueError(f"{name} must be finite, got values in [{t.min().item()}, {t.max().item()}]")
        return tau
    return check_real(tau, name, "a finite number or a floating-point tensor")


def check_device(t: Tensor, x: Tensor, name: str, move_scalar: bool = True) -> Tensor:
    """The one device rule for tensor arguments (α, τ, ``q``, class weights) that go with scores ``x``.

    A tensor on ``x``'s device is used as it is.  A 0-d CPU tensor is moved to ``x``'s
    device, as PyTorch's own elementwise operations treat CPU scalars (the move is
    differentiable).  Anything else raises a ``ValueError`` naming the argument: moving a
    whole per-row or per-head tensor silently would hide a model whose parameters were
    left on another device.  (``move_scalar=False``: no exception for 0-d tensors, for
    callers that use the argument as given.)  Against shape-only ``meta`` scores nothing is
    checked.
    """
    if t.device == x.device or x.device.type == "meta":
        return t
    if move_scalar and t.dim() == 0 and t.device.type == "cpu":
        return t.to(x.device)
    raise ValueError(
        f"{name} is on {t.device} but the input is on {x.device}; move it to the input's device "
        f"(for a module's parameters and buffers: module.to(device))"
    )


def check_alpha(alpha: object, name: str = "alpha", minimum: float = 1.0, strict: bool = False,
                x: Optional[Tensor] = None) -> Union[float, Tensor]:
    """α as a float (``>= minimum``, or ``> minimum`` if ``strict``) or a floating tensor.

    With the scores ``x``, a tensor α also follows :func:`check_device` (and may come back moved).
    """
    op = ">" if strict else ">="
    if isinstance(alpha, Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"{name} must be a float or a floating-point tensor, got dtype {alpha.dtype}")
        if x is not None:
            alpha = check_device(alpha, x, name)
        a = alpha.detach()
        if not values_checkable(a):
            return alpha
        bad = (a <= minimum) if strict else (a < minimum)
        if bool((bad | ~torch.isfinite(a)).any()):
            raise ValueError(f"{name} must be finite and {op} {minimum}, got values in [{a.min().item()}, {a.max().item()}]")
        return alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"{name} must be a float or a tensor, got {type(alpha).__name__}")
    alpha = float(alpha)
    if not math.isfinite(alpha) or (alpha <= minimum if strict else alpha < minimum):
        raise ValueError(f"{name} must be finite and {op} {minimum}, got {alpha}")
    return alpha


def _all_finite(t: Tensor) -> bool:
    """Whether every value of ``t`` is finite (one value: read as a number, three tensor operations less)."""
    return math.isfinite(t.item()) if t.numel() == 1 else bool(torch.isfinite(t).all())


def check_broadcastable(t: Tensor, x: Tensor, name: str, what: str = "the input's shape") -> None:
    """``ValueError`` unless ``t`` broadcasts to ``x``'s shape (without enlarging it)."""
    ts, xs = tuple(t.shape), tuple(x.shape)
    if all(type(n) is int for n in ts + xs):  # plain sizes: compared here (torch.broadcast_shapes costs ~10 us)
        ok = len(ts) <= len(xs) and all(a == b or a == 1 for a, b in zip(reversed(ts), reversed(xs)))
    else:  # symbolic sizes (compiling, exporting): PyTorch's rule, with its guards
        try:
            ok = torch.broadcast_shapes(ts, xs) == x.shape
        except RuntimeError:
            ok = False
    if not ok:
        raise ValueError(f"{name} of shape {tuple(t.shape)} is not broadcastable to {what} {tuple(x.shape)}")


def check_q(q: object, x: Tensor, name: str = "q") -> Optional[Tensor]:
    """Validate a reference measure: ``None`` or a finite, strictly positive floating tensor broadcastable to ``x``."""
    if q is None:
        return None
    if not isinstance(q, Tensor):
        raise TypeError(f"{name} must be None or a positive tensor, got {type(q).__name__}")
    if not q.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {q.dtype}")
    check_broadcastable(q, x, name)
    check_device(q, x, name, move_scalar=False)
    qd = q.detach()
    if values_checkable(qd) and bool((~(qd > 0) | ~torch.isfinite(qd)).any()):
        raise ValueError(f"{name} must be finite and strictly positive everywhere (a reference measure)")
    return q
