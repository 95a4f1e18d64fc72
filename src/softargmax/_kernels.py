r"""The one dispatch point of the fast paths: the fused row solvers and the α-ReLU kernels.

* CUDA tensors (and CPU tensors under Triton's interpreter, for tests) go to the Triton
  kernels of :mod:`softargmax._triton_rows`;
* other CPU tensors go to the C row solver of :mod:`softargmax._cpu_rows`.

Each function returns ``None`` where its fast path does not cover the input (an operator
or dtype it lacks, no compiler, no Triton, switched off); the caller then takes the
PyTorch path, which is the reference and gives the same results.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import _cpu_rows, _triton_rows
from .divergences import Divergence


def solve(z: Tensor, div: Divergence):
    """A fused :class:`~softargmax.threshold.Solution` of ``z`` ``[R, k]`` with ``q = 1``, or ``None``."""
    if _triton_rows.usable_device(z):
        return _triton_rows.solve(z, div)
    return _cpu_rows.solve(z, div)


def solve_alpha_rows(z: Tensor, alpha2d: Tensor):
    """α-entmax with one α per row (``alpha2d`` ``[R, 1]``, every α in (1, 2]) by a fused solver, or ``None``."""
    if _triton_rows.usable_device(z):
        return _triton_rows.solve_alpha_rows(z, alpha2d)
    return _cpu_rows.solve_alpha_rows(z, alpha2d)


def on_gpu_kernels(t: Tensor) -> bool:
    """Whether ``t`` is where the GPU kernels run.  Callers use it to pick what suits them:
    half rows passed as they are (the kernels read them directly), and a dense solution for
    the Fenchel–Young loss values (on CPU the pruned PyTorch solution is cheaper for those:
    the C solver's dense rows made the loss 5× slower)."""
    return _triton_rows.usable_device(t)


def alpha_relu_forward(x: Tensor, alpha: float, tau: float) -> Optional[Tensor]:
    """α-ReLU with a float τ by the Triton kernel (``x``'s dtype), or ``None`` (then :func:`alpha_relu_backward` is not used)."""
    return _triton_rows.alpha_relu_forward(x, alpha, tau)


def alpha_relu_backward(x: Tensor, grad: Tensor, alpha: float, tau: float) -> Tensor:
    """The gradient paired with a :func:`alpha_relu_forward` that returned a tensor."""
    return _triton_rows.alpha_relu_backward(x, grad, alpha, tau)
