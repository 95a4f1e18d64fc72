r"""The GPU row solver: Triton kernels behind the same :class:`~softargmax.backends.solution.Solution`.

CUDA tensors of the operators the fused row solvers cover (:mod:`softargmax.backends.kinds`:
α-entmax for α ∈ (1, 2] with a float α or one α per row, sparsemax, the Jensen–Shannon
and squared-Hellinger f-softargmax, all with ``q = 1``) and α-ReLU with a float τ go
through the kernels of :mod:`softargmax.backends.triton.row_kernels`; everything else stays on the
PyTorch path, which remains the reference.  Triton is optional: without it (or with
``SOFTARGMAX_GPU_KERNELS=0``) CUDA tensors take the PyTorch path, with the same results.

Design (the CPU row solver's, mapped to the GPU):

* the iteration is in float32 for every input type (float16/bfloat16 are read and
  written as they are; ``τ`` and ``Σ s`` stay float32); float64 inputs stay on the PyTorch path;
* rows of at most :data:`BLOCK_ROWS_MAX` entries are held in registers and read once
  (several short rows per program, so attention-shaped inputs fill the GPU); longer rows
  are streamed: one pass for the maximum and the candidates (at most :data:`CAP` per row
  are kept; a row with more iterates on the whole row), the Newton passes on the
  candidates, and one pass that writes ``p``;
* the forward writes only ``p`` (plus per-row ``τ``, ``Σ s``, a status, and the row sums
  ``⟨z, p⟩`` and ``Σ_j f(p_j) - f(0)`` that make the Fenchel–Young loss values free); the backward
  kernel recomputes ``s`` from ``p``, so :attr:`Solution.s` is ``None`` and
  :attr:`Solution.jvp_kernel` computes the gradient.  ``Solution.iterations`` is ``-1`` (counting
  would cost a device synchronization).

**Testing on a CPU.**  With ``TRITON_INTERPRET=1`` set before Triton is imported, the
kernels run in Triton's interpreter on CPU tensors; :func:`set_cpu_interpret` routes CPU
tensors here (the test suite does this at small sizes).
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Optional

import torch
from torch import Tensor

from ..._utils.extras import LazyModule
from ...divergences import Divergence
from ..kinds import KIND_POWER, alpha_rows_covered, kind_of, solve_alpha_rows_with, solve_with
from ..solution import Solution
from ..switch import Switch
from .launch import current_rows

__all__ = ["available", "set_enabled", "set_cpu_interpret", "solve", "solve_alpha_rows",
           "alpha_relu_forward", "alpha_relu_backward"]

#: rows up to this length are held in registers (one read of the scores)
BLOCK_ROWS_MAX = 16384
#: chunk length of the streamed (long-row) kernels
LONG_BLOCK = 4096
#: candidate slots per long row; a row with more iterates on the whole row
CAP = 4096
#: most Newton steps per row
MAX_ITER = 100
#: elements per program of the elementwise (α-ReLU) kernels
ELEMENTWISE_BLOCK = 1024

_switch = Switch("SOFTARGMAX_GPU_KERNELS")
_cpu_interpret = False


def _load() -> ModuleType:
    from . import row_kernels as _triton_kernels

    return _triton_kernels


_module = LazyModule(_load)  # the kernel module, or False where Triton is unavailable


def available() -> bool:
    """Whether Triton imports and the kernels compile to Python objects."""
    return bool(_module())


def set_enabled(flag: bool) -> bool:
    """Turn the GPU kernels on or off (e.g. to compare with the PyTorch path); returns the old setting."""
    return _switch.set(flag)


def set_cpu_interpret(flag: bool) -> bool:
    """Route CPU tensors to the kernels (only with ``TRITON_INTERPRET=1``: the interpreter); returns the old setting."""
    global _cpu_interpret
    if flag and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise RuntimeError("set_cpu_interpret needs TRITON_INTERPRET=1 set before Triton is imported")
    old, _cpu_interpret = _cpu_interpret, bool(flag)
    return old


def usable_device(t: Tensor) -> bool:
    """Whether ``t`` lives where the kernels run (CUDA, or the CPU under the interpreter)."""
    return _switch.on and (t.device.type == "cuda" or (_cpu_interpret and t.device.type == "cpu")) and available()


def _usable(z: Tensor) -> bool:
    return (z.dtype in (torch.float32, torch.float16, torch.bfloat16) and z.dim() == 2 and z.is_contiguous()
            and z.shape[0] > 0 and 0 < z.shape[1] < 2**31 and usable_device(z))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def covers(z: Tensor) -> bool:
    """Whether the kernels take rows ``z`` (where they run, dtype, layout)."""
    return _usable(z)


def covers_divergence(z: Tensor, div: Divergence) -> bool:
    """Whether the operator of ``div`` has a kernel (:func:`softargmax.backends.kinds.kind_of`)."""
    return kind_of(div)[0] is not None


def covers_alpha_rows(z: Tensor, alpha2d: Tensor) -> bool:
    """Whether one α per row ``alpha2d`` is covered (every α in (1, 2]; a device synchronization)."""
    return alpha_rows_covered(z, alpha2d, torch.float32)


def covers_alpha_relu(x: Tensor, alpha: float) -> bool:
    """Whether the elementwise α-ReLU kernels take ``x`` with this α (``1/(α-1) >= 1`` keeps their exp2/log2 form accurate)."""
    return (x.dtype in (torch.float32, torch.float16, torch.bfloat16) and x.numel() > 0 and usable_device(x)
            and 0.0 < alpha - 1.0 <= 1.0)


def _tile(k: int) -> tuple[int, int, int]:
    """``(ROWS, BLOCK, num_warps)`` of the register kernels for rows of length ``k``.

    About 8 scores per thread (16 at ``BLOCK = 16384``); several rows per program up to
    ``BLOCK = 1024``.  Chosen from ptxas register reports for sm_90 (no spills, or a few
    bytes for the shortest rows), not from timings; a tuning run replaces ``ROWS`` and the
    warps (:func:`softargmax.backends.triton.launch.overridden`).
    """
    block = max(16, 1 << (k - 1).bit_length())
    if block <= 128:
        rows, warps = 1024 // block, 4
    elif block <= 1024:
        rows, warps = 2048 // block, 8
    else:
        rows, warps = 1, min(32, block // 256)
    override = current_rows()
    return override.rows_per_program or rows, block, override.warps or warps


def _long_launch() -> tuple[int, int]:
    """``(BLOCK, num_warps)`` of the streamed kernels: :data:`LONG_BLOCK` and 16 warps, or a tuning run's."""
    override = current_rows()
    return override.long_block or LONG_BLOCK, override.long_warps or 16


def _run(z: Tensor, kind: int, a: Tensor, a_stride: int, omega_c: float = 0.0, exact: int = 0) -> Solution:
    """``exact``: 1 sparsemax, 2 1.5-entmax (closed-form steps), 0 general (the caller knows α as a float)."""
    K = _module()
    R, k = z.shape
    a = a.to(device=z.device, dtype=torch.float32)
    p = torch.empty_like(z)
    tau = torch.empty(R, 1, dtype=torch.float32, device=z.device)
    ssum = torch.empty(R, 1, dtype=torch.float32, device=z.device)
    status = torch.empty(R, dtype=torch.int8, device=z.device)
    zp = torch.empty(R, dtype=torch.float32, device=z.device)
    omega = torch.empty(R, dtype=torch.float32, device=z.device)
    tol = 2 * torch.finfo(torch.float32).eps  # below rounding: the iterations stop when the residual stalls
    if k <= BLOCK_ROWS_MAX:
        rows, block, warps = _tile(k)
        K.solve_block_rows[(_cdiv(R, rows),)](z, p, tau, ssum, status, zp, omega, a, R, k, a_stride, tol, MAX_ITER,
                                              omega_c,
                                                    KIND=kind, EXACT=exact, ROWS=rows, BLOCK=block,
                                                    num_warps=warps)
    else:
        cap = CAP if kind == KIND_POWER else 1
        scratch = torch.empty(R, cap, dtype=torch.float32, device=z.device)
        block, warps = _long_launch()
        K.solve_long_rows[(R,)](z, p, tau, ssum, status, zp, omega, a, scratch, k, a_stride, tol, MAX_ITER, omega_c,
                                KIND=kind, EXACT=exact, BLOCK=block, CAP=cap, num_warps=warps)
    bad = (status == 2).unsqueeze(1)  # always a tensor: testing it for "none" would synchronize

    def jvp(v: Tensor, scale: float) -> Tensor:
        return _jvp(p, v, kind, exact, a, a_stride, scale)

    return Solution(tau=tau, p=p, s=None, s_sum=ssum, block_index=None, k=k, bad_rows=bad, iterations=-1,
                    jvp_kernel=jvp, zp=zp, omega=omega, backend="triton", nan_written=True)


def _jvp(p: Tensor, v: Tensor, kind: int, exact: int, a: Tensor, a_stride: int, scale: float) -> Tensor:
    """``scale · s ⊙ (v - ⟨s, v⟩/Σs)`` with ``s`` recomputed from ``p``."""
    K = _module()
    R, k = p.shape
    v = v.contiguous()
    g = torch.empty_like(p)
    if k <= BLOCK_ROWS_MAX:
        rows, block, warps = _tile(k)
        K.jvp_block_rows[(_cdiv(R, rows),)](p, v, g, a, R, k, a_stride, scale, KIND=kind, EXACT=exact,
                                                  ROWS=rows, BLOCK=block, num_warps=warps)
    else:
        block, warps = _long_launch()
        K.jvp_long_rows[(R,)](p, v, g, a, k, a_stride, scale, KIND=kind, EXACT=exact, BLOCK=block,
                              num_warps=warps)
    return g


def solve(z: Tensor, div: Divergence) -> Optional[Solution]:
    """The :class:`~softargmax.backends.solution.Solution` of ``z`` ``[R, k]`` (``q = 1``), or ``None`` if not covered."""
    kind, a = kind_of(div)
    if kind is None or not _usable(z):
        return None
    if kind != KIND_POWER:
        return solve_with(_run, z, div, a_dtype=torch.float32, device=z.device)
    assert a is not None  # the power kind carries its exponent a = α - 1
    # the kernel's raw regularizer sum is Σ (p^α - c p) for the power kind: with c = α it is
    # α(α-1) Σ [f(p) - f(0)] of the α-divergence; with c = 0 (chi-square: f(p) - f(0) = p²/2) twice it
    chi = div.hints.power_offset == 0.0  # g(v) = [v]_+ (chi-square): f(p) - f(0) = p²/2
    c = 0.0 if chi else a + 1.0
    sol = solve_with(functools.partial(_run, omega_c=c, exact=_relu_exact(a)), z, div, a_dtype=torch.float32,
                     device=z.device)
    assert sol is not None and sol.omega is not None  # covered, and the kernels write the row sums
    sol.omega = sol.omega / (2.0 if chi else (a + 1.0) * a)
    return sol


def solve_alpha_rows(z: Tensor, alpha2d: Tensor, checked: bool = False) -> Optional[Solution]:
    """α-entmax with one α per row (``alpha2d`` ``[R, 1]``), or ``None`` if some α is outside (1, 2]
    (``checked``: :func:`covers_alpha_rows` already said yes)."""
    if not _usable(z):
        return None
    return solve_alpha_rows_with(_run, z, alpha2d, a_dtype=torch.float32, checked=checked)


def _relu_exact(a: float) -> int:
    return 1 if a == 1.0 else 2 if a == 0.5 else 0


def alpha_relu_forward(x: Tensor, alpha: float, tau: float) -> Optional[Tensor]:
    """``[(α-1) x - τ]_+^{1/(α-1)}`` in ``x``'s dtype, or ``None`` where the kernels do not apply."""
    if not covers_alpha_relu(x, alpha):
        return None
    a = alpha - 1.0
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n = xc.numel()
    _module().alpha_relu_forward[(_cdiv(n, ELEMENTWISE_BLOCK),)](xc, y, n, a, tau, EXACT=_relu_exact(a),
                                                                       BLOCK=ELEMENTWISE_BLOCK)
    return y


def alpha_relu_backward(x: Tensor, grad: Tensor, alpha: float, tau: float) -> Tensor:
    """``grad · [(α-1) x - τ]_+^{1/(α-1) - 1}`` (the pair of :func:`alpha_relu_forward`), in ``x``'s dtype."""
    a = alpha - 1.0
    xc = x.contiguous()
    gy = grad.contiguous()
    gx = torch.empty_like(xc)
    n = xc.numel()
    _module().alpha_relu_backward[(_cdiv(n, ELEMENTWISE_BLOCK),)](xc, gy, gx, n, a, tau, EXACT=_relu_exact(a),
                                                                        BLOCK=ELEMENTWISE_BLOCK)
    return gx
