r"""α-ReLU (Tezekbayev et al., 2022): α-entmax's elementwise map with a fixed threshold.

.. math::

    \operatorname{alpha\_relu}(x) = [(\alpha - 1) x - \tau]_+^{1/(\alpha-1)}

No normalization: one read and one write per element, like a ReLU.  :math:`\tau` is in
the entmax parametrization: with the τ that 1.5-entmax would compute,
1.5-ReLU reproduces 1.5-entmax; :mod:`softargmax.operators.alpha_relu_tau` estimates it.

Derivatives: :math:`\partial p/\partial x = p^{2-\alpha}` (diagonal) and :math:`\partial p/\partial \tau = -p^{2-\alpha}/(\alpha-1)`.  For
α = 1.5 these are :math:`\sqrt{p}`, so the PyTorch path's backward stores :math:`[(\alpha-1)x - \tau]_+` and costs one
multiplication.  Where a fused kernel takes the call (:func:`softargmax.backends.alpha_relu_forward`: the Triton
kernels with a float τ on the GPU; on the CPU the C library's for contiguous float32, float64 and bfloat16 tensors
with one τ or one τ per row), the forward is one pass that writes ``p`` and the backward one pass that recomputes the base from
``x`` (saved, no copy) and writes the gradient (and sums τ's): one allocation each way, as a ReLU's.

References:

* Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.autograd.function import once_differentiable
from torch.nn import Parameter

from .. import backends as _kernels
from .._utils.checks import check_alpha, check_tau, check_tensor, compute_dtype
from .._utils.rows import sum_to
from .._utils.tracing import EAGER, GRAPH, LIBRARY_OPS, function_apply, graph_mode, without_autograd

__all__ = ["alpha_relu", "alpha_relu_graph"]


def power_of_base(t: Tensor, a: float) -> Tensor:
    """``t^{1/a}`` for a base ``t >= 0``, with the exact forms of ``a = 1, 1/2, 2``."""
    if a == 1.0:
        return t
    if a == 0.5:
        return t * t
    if a == 2.0:
        return torch.sqrt(t)
    return t ** (1.0 / a)


def power_of_base_(t: Tensor, a: float) -> Tensor:
    """:func:`power_of_base` in place on ``t`` (a tensor the caller owns): the same operations, one allocation less."""
    if a == 1.0:
        return t
    if a == 0.5:
        return t.mul_(t)
    if a == 2.0:
        return t.sqrt_()
    return t.pow_(1.0 / a)


def relu_base(x: Tensor, tau: Union[float, Tensor], alpha: float) -> Tensor:
    r""":math:`[(\alpha - 1) x - \tau]_+` in the compute dtype, a new tensor."""
    dtype = compute_dtype(x.dtype)
    a = alpha - 1.0
    xc = x if x.dtype == dtype else x.to(dtype)
    t = torch.mul(xc, a) if a != 1.0 else xc.clone()
    if isinstance(tau, Tensor):
        t.sub_(tau.to(dtype))
    elif tau != 0.0:  # (x - 0 is x, -0.0 and NaN included: the pass is skipped)
        t.sub_(tau)
    return t.relu_()  # relu_ is clamp_min_(0), the cheapest call


def alpha_relu_forward(x: Tensor, tau: Union[float, Tensor], alpha: float) -> Tensor:
    """:class:`AlphaReLUFunction`'s output without the autograd function, for calls that need no
    gradient (:func:`softargmax._utils.tracing.without_autograd`): the same operations, the power
    taken in place."""
    fused = _kernels.alpha_relu_forward(x, alpha, tau)
    if fused is not None:
        return fused[0]
    p = power_of_base_(relu_base(x, tau, alpha), alpha - 1.0)
    return p.to(x.dtype) if p.dtype != x.dtype else p


def alpha_relu_graph(x: Tensor, alpha: float, tau: Union[float, Tensor]) -> Tensor:
    r"""α-ReLU's forward as PyTorch's own operators, what exporters record for :func:`alpha_relu`.

    .. math::

        p = [(\alpha - 1) x - \tau]_+^{1/(\alpha-1)},

    computed in ``x``'s compute dtype (float32 for half precision) by a clamp and a power (a square,
    a square root or the identity where :math:`1/(\alpha - 1)` is 2, 1/2 or 1), with no autograd
    function and no fused kernel: :func:`alpha_relu` calls it while ``torch.onnx.export`` or
    ``torch.jit.trace`` records a model, and :func:`softargmax.operators.export.decompositions`
    replaces the ``softargmax::alpha_relu`` operator of an exported program by it.  The
    arguments are not checked (the caller has).

    Args:
        x: the scores.
        alpha: :math:`\alpha > 1`, a float.
        tau: :math:`\tau` in the entmax parametrization, a float or a tensor broadcastable to ``x``.

    Returns:
        :math:`p`, ``x``'s shape and dtype.

    Shape:
        - x: :math:`(*)`; tau: broadcastable to :math:`(*)`.
        - Output: :math:`(*)`.

    Examples:
        >>> import torch, softargmax as sa
        >>> from softargmax.operators.alpha_relu import alpha_relu_graph
        >>> x = torch.tensor([2.0, 1.0, 0.5, -1.0])
        >>> alpha_relu_graph(x, 1.5, 0.25)  # [x/2 - 1/4]_+^2
        tensor([0.5625, 0.0625, 0.0000, 0.0000])
        >>> torch.equal(alpha_relu_graph(x, 1.5, 0.25), sa.alpha_relu(x, 1.5, tau=0.25))
        True

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up
        Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    dtype = compute_dtype(x.dtype)
    t = torch.clamp(x.to(dtype) * (alpha - 1.0) - (tau.to(dtype) if isinstance(tau, Tensor) else tau), min=0)
    return power_of_base(t, alpha - 1.0).to(x.dtype)


class AlphaReLUFunction(torch.autograd.Function):
    @classmethod
    def apply(cls, x: Tensor, *args: Any) -> Tensor:
        if type(x).__name__ == "DTensor":  # elementwise: run on the local shards
            from ._dtensor import dtensor_apply

            return dtensor_apply(super().apply, x, *args)
        return function_apply(cls, x, *args)  # (torch.compile's tracer follows this, not super())

    @staticmethod
    def forward(ctx: Any, x: Tensor, tau: Union[float, Tensor], alpha: float) -> Tensor:
        ctx.alpha = alpha
        ctx.x_dtype = x.dtype
        ctx.tau_shape = tau.shape if isinstance(tau, Tensor) else None
        ctx.tau_dtype = tau.dtype if isinstance(tau, Tensor) else None
        # a fused kernel (Triton on the GPU, the C library on the CPU): one elementwise pass each way, the
        # backward recomputes the base from x
        fused = _kernels.alpha_relu_forward(x, alpha, tau)
        ctx.kernel = None if fused is None else fused[1]
        if fused is not None:
            if isinstance(tau, Tensor):
                ctx.save_for_backward(x, tau)
            else:
                ctx.save_for_backward(x)
                ctx.kernel_tau = tau
            return fused[0]
        t = relu_base(x, tau, alpha)
        p = power_of_base(t, alpha - 1.0)
        ctx.save_for_backward(t)
        return p.to(x.dtype) if p.dtype != x.dtype else p

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], None]:
        if torch.is_grad_enabled():  # create_graph=True: once_differentiable's error on a second derivative
            return _backward_once(ctx, grad_out)
        return _backward(ctx, grad_out)  # (the engine runs it with grad mode off: no no_grad() block needed)


def _backward(ctx: Any, grad_out: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], None]:
    """:meth:`AlphaReLUFunction.backward`."""
    if ctx.kernel is not None:
        saved = ctx.saved_tensors
        gx, gtau = _kernels.alpha_relu_backward(ctx.kernel, saved[0], grad_out, ctx.alpha,
                                                saved[1] if len(saved) > 1 else ctx.kernel_tau,
                                                ctx.needs_input_grad[1])
        return (gx if ctx.needs_input_grad[0] else None), gtau, None
    (t,) = ctx.saved_tensors
    a = ctx.alpha - 1.0
    # ∂p/∂x = p^{2-α} = t^{(2-α)/(α-1)}
    if a == 1.0:
        d = torch.where(t > 0, torch.ones_like(t), t.clamp(max=0))  # NaN (a NaN score) stays NaN
    elif a == 0.5:
        d = t
    else:
        e = (1.0 - a) / a
        d = t ** e
        if e < 0:
            d = torch.where(t > 0, d, torch.zeros_like(d))
    g = grad_out.to(t.dtype) * d
    grad_x = g.to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
    grad_tau = None
    if ctx.needs_input_grad[1]:
        grad_tau = sum_to(-g / a, ctx.tau_shape).to(ctx.tau_dtype)
    return grad_x, grad_tau, None


_backward_once = once_differentiable(_backward)


def alpha_relu(x: Tensor, alpha: float = 1.5, tau: Union[float, Tensor] = 0.0) -> Tensor:
    r"""α-ReLU: α-entmax's elementwise map with a fixed threshold, and no normalization.

    .. math::

        \operatorname{alpha\_relu}(x)_j = [(\alpha - 1) x_j - \tau]_+^{1/(\alpha-1)},
        \qquad \frac{\partial p_j}{\partial x_j} = p_j^{2-\alpha}.

    :math:`\tau` is in the entmax parametrization: with the :math:`\tau` that :func:`entmax` computes
    for a row, α-ReLU reproduces α-entmax on that row; :mod:`softargmax.operators.alpha_relu_tau`
    estimates a :math:`\tau` for a model.  One read and one write per element, like a ReLU.

    Args:
        x: scores, any shape; float16/bfloat16 are computed in float32.
        alpha: a float > 1. Default: ``1.5``.
        tau: a finite float or a tensor of finite values broadcastable to ``x`` (entmax
            parametrization); a tensor τ is differentiable. Default: ``0.0``.

    Returns:
        the non-negative outputs, of ``x``'s shape and dtype (they need not sum to one).

    Note:
        Where a fused kernel takes the call (Triton on the GPU; on the CPU the C library, for contiguous
        float32, float64 and bfloat16 tensors), the backward recomputes the base from ``x``, which is saved
        without a copy: modifying ``x`` in place after the call and before the backward raises PyTorch's
        ``RuntimeError`` ("one of the variables needed for gradient computation has been modified by an
        inplace operation").  The PyTorch path saves the base itself and does not.  Give a copy (or do
        not reuse the buffer) where ``x`` must change before the backward.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - tau: a number, or a tensor broadcastable to the input.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> x = torch.tensor([1.0, 0.5, -1.0])
        >>> sa.alpha_relu(x, alpha=1.5, tau=-0.25)
        tensor([0.5625, 0.2500, 0.0000])

        With the threshold of 1.5-entmax on a row, α-ReLU equals 1.5-entmax there:

        >>> tau = (1.8 - 7.96 ** 0.5) / 4  # (0.5 - tau)^2 + (0.4 - tau)^2 = 1: the support's quadratic
        >>> sa.alpha_relu(torch.tensor([1.0, 0.8, -1.0]), 1.5, tau)
        tensor([0.5705, 0.4295, 0.0000])
        >>> sa.entmax15(torch.tensor([1.0, 0.8, -1.0]))
        tensor([0.5705, 0.4295, 0.0000])

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding
        Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """
    check_tensor(x)
    checked = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
    if isinstance(checked, Tensor):
        raise TypeError("alpha_relu: alpha must be a float > 1")
    alpha = checked
    tau = check_tau(tau, x)
    mode = graph_mode()
    if mode == GRAPH:  # recorded for ONNX or torch.jit.trace: PyTorch's operators only
        return alpha_relu_graph(x, alpha, tau)
    if not isinstance(tau, Tensor) and mode == LIBRARY_OPS:  # one opaque operator for the compiler (softargmax.operators._library_ops)
        return torch.ops.softargmax.alpha_relu(x, alpha, tau)
    tau_t = tau if isinstance(tau, Tensor) else None
    if mode != LIBRARY_OPS and without_autograd(x, tau_t):
        return alpha_relu_forward(x, tau, alpha)  # no gradient: the forward without the autograd function's cost
    if mode == EAGER and _plain(x) and (tau_t is None or _plain(tau_t)) and forward_ad._current_level < 0 \
            and not _functorch_active():
        # Function.apply less its Python wrapper (a few microseconds of a small call): with no functorch transform
        # active the wrapper only unwraps dead functorch wrappers, done here
        return _apply(_unwrap_if_dead(x), tau if tau_t is None else _unwrap_if_dead(tau_t), alpha)
    return AlphaReLUFunction.apply(x, tau, alpha)


def _plain(t: Tensor) -> bool:
    return type(t) is Tensor or type(t) is Parameter


_functorch_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
#: ``torch.autograd.Function.apply``'s last step, the C++ ``apply`` bound to :class:`AlphaReLUFunction`
_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, AlphaReLUFunction)
