r"""The operators the fused row solvers cover, shared by the CPU (C) and GPU (Triton) paths.

A fused row solver is a function ``run(z, kind, a, a_stride) -> Solution`` that solves
every row of a contiguous ``[R, k]`` matrix with ``q = 1`` for one of three kinds:

* ``KIND_POWER``: ``Σ_j [a z_j - t]_+^{1/a} = 1`` with ``a = α - 1 ∈ (0, 1]`` (α-entmax;
  ``a = 1`` is sparsemax, also as the ``"chi_square"`` divergence), one ``a`` for all
  rows (``a_stride = 0``) or one per row (``a_stride = 1``).  Its ``Solution.tau`` is
  ``t`` in the variable ``y = a z``; :func:`solve_with` converts it with the divergence's
  hint ``power_offset`` ``c`` (:class:`~softargmax.divergences.SolverHints`): ``τ_f = (t + c)/a``,
  ``(t + 1)/a`` for the α-divergence, ``t`` itself for ``"chi_square"``.
* ``KIND_JS`` and ``KIND_HELL``: the Jensen–Shannon and squared-Hellinger f-softargmax;
  ``Solution.tau`` is already ``τ_f``.
* ``KIND_RKL``, ``KIND_JEFF`` and ``KIND_RCHI``: the reverse-KL, Jeffrey and reverse-χ²
  f-softargmax (dense, ``f(0) = +∞``: :data:`INFINITE_F0_KINDS`); ``Solution.tau`` is ``τ_f``.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ..divergences import Divergence
from .solution import Solution

KIND_POWER, KIND_JS, KIND_HELL, KIND_RKL, KIND_JEFF, KIND_RCHI = 0, 1, 2, 3, 4, 5


#: the kinds of the hint ``fused_kind`` (:class:`softargmax.divergences.SolverHints`) that every fused
#: row solver has (C and Triton)
KINDS = {"power": KIND_POWER, "js": KIND_JS, "hellinger": KIND_HELL, "reverse_kl": KIND_RKL,
         "jeffrey": KIND_JEFF, "reverse_chi_square": KIND_RCHI}
#: the kinds of the C row solver: :data:`KINDS` (the Triton row solver has the same ones)
CPU_KINDS = dict(KINDS)
#: the dense kinds with ``f(0) = +∞`` (reverse KL, Jeffrey, reverse χ²): no loss row sum of ``f(p) - f(0)``
INFINITE_F0_KINDS = frozenset({KIND_RKL, KIND_JEFF, KIND_RCHI})

#: a fused row solver, ``run(z, kind, a, a_stride[, offset])`` (module docstring; the offset: :func:`solve_with`)
FusedRun = Callable[..., Solution]


def kind_of(div: Divergence, kinds: Optional[dict[str, int]] = None) -> tuple[Optional[int], Optional[float]]:
    """``(kind, a)`` of a divergence covered by a solver with ``kinds`` (default :data:`KINDS`, which both row
    solvers have; ``a`` is ``None`` for the dense kinds), else ``(None, None)``.

    The divergence declares it (the hint ``fused_kind`` of :class:`~softargmax.divergences.SolverHints`):
    no switch on its type here."""
    declared = div.hints.fused_kind
    if declared is None:
        return None, None
    name, a = declared
    kind = (KINDS if kinds is None else kinds).get(name)
    return (None, None) if kind is None else (kind, a)


def solve_with(run: FusedRun, z: Tensor, div: Divergence, a_dtype: torch.dtype = torch.float64,
               device: Union[str, torch.device] = "cpu", converts_tau: bool = False,
               kinds: Optional[dict[str, int]] = None) -> Optional[Solution]:
    """The :class:`~softargmax.backends.solution.Solution` of ``z`` by ``run``, or ``None`` if ``div`` is not covered.

    ``a`` goes to ``run`` as a one-element tensor on ``device`` (made there by a fill, not
    copied from the host, so a CUDA graph can capture it; on the CPU one tensor per value is
    kept, the fill cost a microsecond of every small call).  ``converts_tau``: ``run`` takes
    a fifth argument, the offset ``c`` of the power kind (``None`` for the other kinds), and
    returns ``τ_f = (t + c)/a`` itself, computed in ``z``'s dtype as the two tensor operations
    here would (the C solver: two operations less per call).  ``kinds``: those ``run`` has (:func:`kind_of`)."""
    kind, a = kind_of(div, kinds)
    if kind is None:
        return None
    value = 1.0 if a is None else a
    if str(device) == "cpu":
        a_t = cpu_parameter(value, a_dtype)
    else:
        a_t = torch.full((1,), value, dtype=a_dtype, device=device)
    offset = div.hints.power_offset if kind == KIND_POWER else None
    if converts_tau:
        return run(z, kind, a_t, 0, offset)
    sol = run(z, kind, a_t, 0)
    if offset is not None:
        assert a is not None  # the power kind carries its exponent a = α - 1
        sol.tau = (sol.tau + offset) / a
    return sol


#: the one-element parameter tensors the CPU solver reads, by ``(value, dtype)`` (never written)
_CPU_PARAMETERS: dict[tuple[float, torch.dtype], Tensor] = {}


def cpu_parameter(value: float, dtype: torch.dtype = torch.float64) -> Tensor:
    """The one-element CPU tensor holding ``value`` that the C solver reads as ``a`` (kept, never written)."""
    a_t = _CPU_PARAMETERS.get((value, dtype))
    if a_t is None:
        if len(_CPU_PARAMETERS) >= 64:  # many distinct α (one per step of a schedule): stay bounded
            _CPU_PARAMETERS.clear()
        a_t = _CPU_PARAMETERS[(value, dtype)] = torch.full((1,), value, dtype=dtype)
    return a_t


def alpha_rows_covered(z: Tensor, alpha2d: Tensor, a_dtype: torch.dtype = torch.float64) -> bool:
    """Whether ``alpha2d`` is one α per row of ``z`` with every ``a = α - 1`` in (0, 1] once
    rounded to ``a_dtype`` (what the solver reads; a device synchronization on CUDA)."""
    a = alpha2d.detach().reshape(-1).to(a_dtype) - 1
    return a.numel() == z.shape[0] and bool(((a > 0) & (a <= 1)).all())


def solve_alpha_rows_with(run: FusedRun, z: Tensor, alpha2d: Tensor, a_dtype: torch.dtype = torch.float64,
                          checked: bool = False, converts_tau: bool = False) -> Optional[Solution]:
    """α-entmax with one α per row (``alpha2d`` ``[R, 1]``) by ``run``, or ``None`` if some α is outside (1, 2]
    (``checked``: :func:`alpha_rows_covered` already said yes; ``converts_tau``: as for :func:`solve_with`)."""
    if not checked and not alpha_rows_covered(z, alpha2d, a_dtype):
        return None
    a = alpha2d.detach().reshape(-1).to(a_dtype) - 1
    a = a.contiguous()
    if converts_tau:
        return run(z, KIND_POWER, a, 1, 1.0)
    sol = run(z, KIND_POWER, a, 1)
    sol.tau = (sol.tau + 1) / a.to(z.dtype).unsqueeze(1)
    return sol
