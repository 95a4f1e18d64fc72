r"""The normalized mappings and α-ReLU as ``torch.library`` custom operators, for ``torch.compile``.

Eager calls run the autograd functions directly (:class:`softargmax.operators._autograd.NormalizedMapping`,
α-ReLU's own); while ``torch.compile`` traces (``torch.compiler.is_compiling()``) the public
functions call these operators instead.  To the compiler each is one opaque node with a
fake (meta) implementation that gives the output's shape and dtype, and an autograd formula
that calls a second opaque operator for the backward, so ``fullgraph=True`` holds: the
solver's data-dependent iteration never reaches the tracer.

The backward operator solves the rows again from the saved input and applies the same
backward as eager (one more forward pass in exchange for saving only the input; the
results equal eager's).  A divergence crosses the operator boundary by name and parameter
(:func:`divergence_spec`): a built-in one by its registry name, a user's generator (a
:class:`~softargmax.divergences.CustomDivergence`, a subclass of :class:`~softargmax.divergences.Divergence`)
by a name that this process maps back to the object (:mod:`softargmax.operators._carried`), so
``fullgraph=True`` holds for them too.

Operators (namespace ``softargmax``): ``normalized``, ``normalized_backward``,
``alpha_relu``, ``alpha_relu_backward``, ``normmax``, ``normmax_backward`` (whose backward
differentiates normmax's eager autograd function).

``torch.export`` records these operators too.  ``torch.onnx.export`` and ``torch.jit.trace``
do not: while they record, the public functions compute with PyTorch's own operators
(:mod:`softargmax.operators._traceable`), and :func:`softargmax.export.decompositions` replaces
the operators of an exported program by the same graphs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from .._utils.checks import check_alpha, check_dim, check_q, check_tensor
from .._utils.tracing import CUSTOM_OPS, GRAPH, LIBRARY_OPS, graph_mode, without_autograd
from ..divergences import Divergence, get_divergence, spec_of
from ._autograd import NormalizedMapping, normalized_forward
from ._carried import PREFIX, carried_divergence, carried_name
from ._traceable import normalized_graph
from .alpha_relu import AlphaReLUFunction
from .normmax import normmax_eager

__all__ = ["divergence_spec", "normalized_operator_divergence", "normalized", "alpha_relu"]


def divergence_spec(div: Optional[Divergence]) -> tuple[str, float]:
    """``(name, parameter)`` that :func:`normalized_operator_divergence` maps back to ``div``: a built-in
    generator's registry name and parameter, a user's generator's name in this process
    (:func:`~softargmax.operators._carried.carried_name`), ``("", 0.0)`` for ``None`` (a tensor α)."""
    if div is None:
        return "", 0.0
    spec = spec_of(div)
    return spec if spec is not None else (carried_name(div), 0.0)


def normalized_operator_divergence(name: str, param: float) -> Optional[Divergence]:
    """The generator that ``softargmax::normalized``'s ``(divergence, param)`` arguments name (``None``: a tensor α)."""
    if not name:
        return None
    if name.startswith(PREFIX):
        return carried_divergence(name)
    return get_divergence(name, alpha=param) if name == "alpha" else get_divergence(name)


def _check_values(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor]) -> None:
    """The checks of tensor values that the public functions skip while compiling."""
    if q is not None:
        check_q(q, x)
    if alpha is not None:
        check_alpha(alpha, "alpha", minimum=1.0)


class _Ctx:
    """What the autograd functions' forward and backward read and write on ``ctx``."""

    def __init__(self, needs: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs

    def save_for_backward(self, *tensors: Optional[Tensor]) -> None:
        self.saved_tensors = tensors


# -- normalized mappings --------------------------------------------------------------


def _normalized(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: str, param: float,
                temperature: float, dim: int) -> Tensor:
    check_tensor(x)  # called from TorchScript, the operator is the public entry point
    dim = check_dim(x, dim)
    _check_values(x, q, alpha)
    if x.numel() == 0:
        return x.new_zeros(x.shape)
    ctx = _Ctx((False,) * 6)
    out = NormalizedMapping.forward(ctx, x, q, alpha, normalized_operator_divergence(divergence, param), temperature, dim)
    return out.contiguous()


def _normalized_fake(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: str, param: float,
                     temperature: float, dim: int) -> Tensor:
    return x.new_empty(x.shape)


def _normalized_backward(grad: Tensor, x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: str,
                         param: float, temperature: float, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    ctx = _Ctx((True, q is not None, alpha is not None, False, False, False))
    NormalizedMapping.forward(ctx, x, q, alpha, normalized_operator_divergence(divergence, param), temperature, dim)
    gx, gq, ga = NormalizedMapping.backward(ctx, grad)[:3]
    assert gx is not None  # needs_input_grad[0]
    return (gx.contiguous(), x.new_empty(0) if gq is None else gq.contiguous(),
            x.new_empty(0) if ga is None else ga.contiguous())


def _normalized_backward_fake(grad: Tensor, x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: str,
                              param: float, temperature: float, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    return (x.new_empty(x.shape), x.new_empty(0) if q is None else q.new_empty(q.shape),
            x.new_empty(0) if alpha is None else alpha.new_empty(alpha.shape))


def _normalized_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, q, alpha, divergence, param, temperature, dim = inputs
    ctx.save_for_backward(x, q, alpha)
    ctx.args = (divergence, param, temperature, dim)


def _normalized_grad(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    x, q, alpha = ctx.saved_tensors
    gx, gq, ga = torch.ops.softargmax.normalized_backward(grad, x, q, alpha, *ctx.args)
    return gx, (gq if q is not None else None), (ga if alpha is not None else None), None, None, None, None


def normalized(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: Optional[Divergence],
               temperature: float, dim: int) -> Tensor:
    """``NormalizedMapping.apply`` in eager mode (its forward alone, :func:`normalized_forward`, when no
    gradient is needed); the ``softargmax::normalized`` operator while compiling or exporting;
    PyTorch's own operators (:func:`~softargmax.operators._traceable.normalized_graph`) when the graph
    is recorded for ONNX or ``torch.jit.trace``."""
    mode = graph_mode()
    if mode == GRAPH:
        return normalized_graph(x, q, alpha, divergence, temperature, dim)
    if mode == LIBRARY_OPS:
        spec = divergence_spec(divergence)
        return torch.ops.softargmax.normalized(x, q, alpha, spec[0], spec[1], float(temperature), dim)
    if without_autograd(x, q, alpha):  # eager, no gradient: the forward without the autograd function's cost
        return normalized_forward(x, q, alpha, divergence, temperature, dim)
    return NormalizedMapping.apply(x, q, alpha, divergence, temperature, dim)


# -- α-ReLU with a float τ --------------------------------------------------------------


def _alpha_relu(x: Tensor, alpha: float, tau: float) -> Tensor:
    return AlphaReLUFunction.forward(_Ctx((False,) * 3), x, tau, alpha).contiguous()


def _alpha_relu_fake(x: Tensor, alpha: float, tau: float) -> Tensor:
    return x.new_empty(x.shape)


def _alpha_relu_backward(grad: Tensor, x: Tensor, alpha: float, tau: float) -> Tensor:
    ctx = _Ctx((True, False, False))
    AlphaReLUFunction.forward(ctx, x, tau, alpha)
    gx = AlphaReLUFunction.backward(ctx, grad)[0]
    assert gx is not None  # needs_input_grad[0]
    return gx.contiguous()


def _alpha_relu_backward_fake(grad: Tensor, x: Tensor, alpha: float, tau: float) -> Tensor:
    return x.new_empty(x.shape)


def _alpha_relu_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, alpha, tau = inputs
    ctx.save_for_backward(x)
    ctx.args = (alpha, tau)


def _alpha_relu_grad(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None]:
    (x,) = ctx.saved_tensors
    return torch.ops.softargmax.alpha_relu_backward(grad, x, *ctx.args), None, None


def alpha_relu(x: Tensor, alpha: float, tau: float) -> Tensor:
    """The ``softargmax::alpha_relu`` operator (a float τ), for compiled code."""
    return torch.ops.softargmax.alpha_relu(x, float(alpha), float(tau))


# -- normmax ------------------------------------------------------------------------------


def _normmax(x: Tensor, alpha: Optional[Tensor], alpha_value: float, dim: int) -> Tensor:
    if alpha is not None:
        check_alpha(alpha, "alpha", minimum=1.0)
    return normmax_eager(x, alpha_value if alpha is None else alpha, dim).contiguous()


def _normmax_fake(x: Tensor, alpha: Optional[Tensor], alpha_value: float, dim: int) -> Tensor:
    return x.new_empty(x.shape)


def _normmax_backward(grad: Tensor, x: Tensor, alpha: Optional[Tensor], alpha_value: float, dim: int) -> Tensor:
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        out = normmax_eager(xg, alpha_value if alpha is None else alpha, dim)
        return torch.autograd.grad(out, xg, grad)[0].contiguous()


def _normmax_backward_fake(grad: Tensor, x: Tensor, alpha: Optional[Tensor], alpha_value: float, dim: int) -> Tensor:
    return x.new_empty(x.shape)


def _normmax_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, alpha, alpha_value, dim = inputs
    ctx.save_for_backward(x, alpha)
    ctx.args = (alpha_value, dim)


def _normmax_grad(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
    x, alpha = ctx.saved_tensors
    return torch.ops.softargmax.normmax_backward(grad, x, alpha, *ctx.args), None, None, None


def define(name: str, impl: Callable[..., Any], fake: Callable[..., Any], backward: Optional[Callable[..., Any]] = None,
           setup_context: Optional[Callable[..., Any]] = None) -> Any:
    """``torch.library.custom_op(name, impl)`` with its fake implementation and autograd formula."""
    op = torch.library.custom_op(name, impl, mutates_args=())
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op


def _register() -> dict:
    """Register the operators (torch >= 2.4); returns them by name."""
    return {
        "normalized": define("softargmax::normalized", _normalized, _normalized_fake, _normalized_grad,
                             _normalized_setup),
        "normalized_backward": define("softargmax::normalized_backward", _normalized_backward,
                                      _normalized_backward_fake),
        "alpha_relu": define("softargmax::alpha_relu", _alpha_relu, _alpha_relu_fake, _alpha_relu_grad,
                             _alpha_relu_setup),
        "alpha_relu_backward": define("softargmax::alpha_relu_backward", _alpha_relu_backward,
                                      _alpha_relu_backward_fake),
        "normmax": define("softargmax::normmax", _normmax, _normmax_fake, _normmax_grad, _normmax_setup),
        "normmax_backward": define("softargmax::normmax_backward", _normmax_backward, _normmax_backward_fake),
    }


OPERATORS = _register() if CUSTOM_OPS else {}
