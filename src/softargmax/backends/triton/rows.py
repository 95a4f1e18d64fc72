r"""The GPU row solver: Triton kernels behind the same :class:`~softargmax.backends.solution.Solution`.

CUDA tensors of the operators the fused row solvers cover (:mod:`softargmax.backends.kinds`:
α-entmax for α ∈ (1, 2] with a float α or one α per row, sparsemax, the Jensen–Shannon,
squared-Hellinger, reverse-KL, Jeffrey and reverse-χ² f-softargmax, all with ``q = 1``) and α-ReLU with a float τ go
through the kernels of :mod:`softargmax.backends.triton.row_kernels`; everything else stays on the
PyTorch path, which remains the reference.  Triton is optional: without it (or with
``SOFTARGMAX_GPU_KERNELS=0``) CUDA tensors take the PyTorch path, with the same results.

Design (the CPU row solver's, mapped to the GPU):

* the iteration is in float32 for every input type (float16/bfloat16 are read and
  written as they are; ``τ`` and ``Σ s`` stay float32); float64 inputs stay on the PyTorch path;
* rows of at most :data:`BLOCK_ROWS_MAX` entries are held in registers and read once
  (one warp per row up to 512 entries: several rows per program up to 128 float32 or 256
  half-precision entries, a program of one warp for longer ones, see :func:`_tile`);
  longer rows are streamed: one pass for the maximum and the
  candidates (each lane keeps its :data:`LONG_SLOTS` largest scores in registers), the
  Newton steps on those registers (plus full-row passes where they are not enough: the
  dense kinds, or a lane that overflowed; Jensen–Shannon's first pass also keeps the power sums
  of the scores no lane keeps, which solve the row with the registers unless a lane dropped a
  score of large ``p``, :func:`rest_kind`), and one pass that writes ``p``;
* few long rows (fewer than :data:`SPLIT_ROWS_PER_SM` per multiprocessor) are split over
  several programs each (:func:`_slices`): the same passes, each program on a slice of the row,
  and one program per row in between that finds the threshold from every slice's candidates
  (3 or 4 launches forward, 2 backward, no host synchronization; the same results up to the
  order of the sums).  Chosen from the launch geometry, not from timings: nothing about the
  split has been measured on a GPU yet;
* one kernel launch per call (split rows: a few) and no host synchronization: the kernel writes ``p``, ``τ``
  (already in the f-divergence parametrization), ``Σ s`` and the bad rows (NaN or ``+inf``)
  itself, and reads α as a kernel argument (or one α per row from a tensor); the row sums
  ``⟨z, p⟩`` and ``Σ_j f(p_j) - f(0)`` that make the Fenchel–Young loss values free are
  computed only when asked (``solve(..., row_sums=True)``, what the losses use); the
  backward kernel recomputes ``s`` from ``p``, so :attr:`Solution.s` is ``None`` and
  :attr:`Solution.jvp_kernel` computes the gradient, in the input's dtype.
  ``Solution.iterations`` is ``-1`` (counting would cost a device synchronization).

**Testing on a CPU.**  With ``TRITON_INTERPRET=1`` set before Triton is imported, the
kernels run in Triton's interpreter on CPU tensors; :func:`set_cpu_interpret` routes CPU
tensors here (the test suite does this at small sizes).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Optional

import torch
from torch import Tensor

from ..._utils.extras import LazyModule
from ...divergences import Divergence
from ..kinds import INFINITE_F0_KINDS, KIND_HELL, KIND_JS, KIND_POWER, alpha_rows_covered, kind_of
from ..solution import Solution
from ..switch import Switch
from .interpreter import interpreting
from .launch import current_rows

__all__ = ["available", "set_enabled", "set_cpu_interpret", "solve", "solve_alpha_rows", "solve_gradient",
           "alpha_relu_forward", "alpha_relu_backward", "relu_exact"]

#: rows up to this length are held in registers (one read of the scores)
BLOCK_ROWS_MAX = 16384
#: chunk length of the streamed (long-row) kernels
LONG_BLOCK = 1024
#: warps per program of the streamed kernels of float32 rows, and of their heaviest solvers for every dtype
#: (:func:`_long_launch`)
LONG_WARPS = 8
#: scores each lane of the streamed solver keeps in registers (1 to 4): ``LONG_SLOTS · LONG_BLOCK``
#: candidates per row; a row where a lane would need more iterates on the full row from there
LONG_SLOTS = 4
#: statistics per lane of the scores the streamed kernels do not keep (``row_kernels.REST_STATS``): rows of the
#: split kernels' candidate buffer for the kinds of :func:`rest_kind`
REST_STATS = 6
#: streamed rows are split over several programs each when there are fewer rows than this per
#: multiprocessor (a program per row would leave the GPU partly idle)
SPLIT_ROWS_PER_SM = 2
#: a split aims at about this many programs per multiprocessor in all (rows × slices)
SPLIT_PROGRAMS_PER_SM = 4
#: the shortest slice of a split row (entries; rounded up to a multiple of the chunk length)
SPLIT_MIN_SLICE = 16384
#: multiprocessors counted for CPU tensors (Triton's interpreter, the tests)
INTERPRET_MULTIPROCESSORS = 1
#: when set, every streamed row is split into (at most) this many slices, whatever the rule above: the
#: interpreter tests and the CPU proxies use it to reach the split kernels on tiny rows
SPLIT_SLICES: Optional[int] = None
#: most Newton steps per row
MAX_ITER = 100
#: elements per program of the elementwise (α-ReLU) kernels
ELEMENTWISE_BLOCK = 1024
#: scores per thread of the register kernels (one warp holds ``32 ·`` this many of a row)
PER_THREAD = 16
#: the row kernels' ``EXACT`` of the general power kind with one ``a = α - 1 >= NEAR_ONE`` for every row
#: (``row_kernels.EXACT_FAR``: the hardware ``log2``), and that bound (``row_kernels.NEAR_ONE``, below which the
#: kernels iterate on ``t + 1``)
EXACT_FAR = 3
NEAR_ONE = 0.25

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
    if flag and not interpreting():
        raise RuntimeError("set_cpu_interpret needs TRITON_INTERPRET=1 set before Triton is imported")
    if flag:
        from softargmax.backends.triton import interpreter

        interpreter.install()
    old, _cpu_interpret = _cpu_interpret, bool(flag)
    return old


def interprets_cpu() -> bool:
    """Whether CPU tensors are routed to the kernels now (:func:`set_cpu_interpret`, the tests), without
    :func:`usable_device`'s cost: the CPU small calls' fast path asks it on every call."""
    return _cpu_interpret


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


def _tile(k: int, elem_bytes: int = 4, heavy: bool = False) -> tuple[int, int, int, int, bool]:
    """``(ROWS, CH, LINE, num_warps, SPLIT)`` of the register kernels for rows of length ``k``.

    The row, rounded up to a power of two ``BLOCK``, is a ``[CH, LINE]`` tile with ``LINE`` 32
    lanes of 16 bytes; a warp holds ``32 ·`` :data:`PER_THREAD` scores.  Rows up to that size
    get one warp each (their sums never leave the warp); rows of one line (``CH = 1``) share a
    program of 4 warps, 4 warps' worth of rows; rows of several lines (``CH > 1``: 129 to 512
    float32 scores) get a program of one warp to themselves.  There the warps of a several-row
    program are placed by Triton's layout passes, which differ between versions: Triton 3.9 lays
    them along the rows, Triton 3.6 along ``CH``, where every Newton step's sums go through shared
    memory (compiled for sm_90a at 512 float32 scores: 16-32 KiB of shared memory and 520-1041
    instructions per step with 64-128 shared stores, against 200-304 and none for one warp, the
    same in both versions).  Longer rows are split over ``BLOCK / (32 · PER_THREAD)`` warps
    (``SPLIT``, one row per program).  ``heavy`` (:func:`heavy_kind`): half as many scores per thread.  Chosen from ptxas reports for sm_90, not from
    timings; a tuning run replaces ``ROWS`` and the warps
    (:func:`softargmax.backends.triton.launch.overridden`).
    """
    block = max(16, 1 << (k - 1).bit_length())
    line = min(block, 512 // elem_bytes)
    per_warp = 32 * (PER_THREAD // 2 if heavy else PER_THREAD)
    override = current_rows()
    if block <= per_warp:
        rows, warps = (4 * (per_warp // block), 4) if block == line else (1, 1)
        rows = override.rows_per_program or rows
        warps = override.warps or warps
        warps = min(warps, rows)  # one warp per row at most: warps beyond the rows would split them
        return rows, block // line, line, warps, False
    warps = override.warps or min(32, block // per_warp)
    return 1, block // line, line, warps, True


def heavy_kind(kind: int, exact: int) -> bool:
    """Whether the register kernels hold half as many scores per thread for ``(kind, exact)`` (:func:`_tile`'s
    ``heavy``, and register rows up to ``BLOCK_ROWS_MAX / 2``): the general power kind with ``EXACT = 0`` (one α
    per row or α < 1.25: a software log2 and the ``log(1 + w)`` correction per score) and the kinds with
    ``f(0) = +∞`` (Jensen's start, Jeffrey's Lambert W), which spill at 16 scores per thread in the sm_90a compile
    report.  :data:`EXACT_FAR` (the hardware log2) holds 16: its rows stay in registers up to
    :data:`BLOCK_ROWS_MAX`, read once, as sparsemax's (sm_90a, Triton 3.6: no spill in the 33 float16 and the 33
    bfloat16 variants, 63-126 registers; float32 spills 24 bytes at 8192 columns, 16 warps, without the gradient,
    2 of its 33; the backward's 32-warp tile spills 16-48 bytes as every kind's does; with Triton 3.9, 9 of the
    99 forward variants spill, all with the loss row sums, at the two longest tiles: float32 16 bytes at 8192
    columns (16 warps) and 24-108 bytes at 16384 (32 warps, 108 with the gradient), float16 and bfloat16 8 bytes
    at 8192 and 12-44 at 16384; the operator's variants none)."""
    return (kind == KIND_POWER and exact == 0) or kind in INFINITE_F0_KINDS


def long_slots(kind: int) -> int:
    """The scores each lane of the streamed solver keeps for ``kind``: :data:`LONG_SLOTS`, or 1 for the kinds with
    ``f(0) = +∞``, which take the row maximum alone from them (their Newton steps start from Jensen's bound)."""
    return 1 if kind in INFINITE_F0_KINDS else LONG_SLOTS


def rest_kind(kind: int) -> int:
    """The streamed kernels' ``REST`` for ``kind``: what their first pass also keeps, per lane, of the scores the lane
    does not keep (``row_kernels.scan_lanes``): 1 for Jensen–Shannon (the power sums ``Σ e^{n(z - c)}``,
    ``n = 1..6``, from which the register Newton solves the row), 2 for squared Hellinger (the count, ``Σ (c - z)``
    and ``Σ (c - z)²``: the start of its full-row steps), else 0 (nothing).

    Examples:
        >>> from softargmax.backends.triton.rows import KIND_HELL, KIND_JS, KIND_POWER, rest_kind
        >>> rest_kind(KIND_JS), rest_kind(KIND_HELL), rest_kind(KIND_POWER)
        (1, 2, 0)
    """
    return 1 if kind == KIND_JS else 2 if kind == KIND_HELL else 0


def _long_launch(elem_bytes: int = 4, solver: bool = False) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` of a streamed kernel for scores of ``elem_bytes`` bytes: :data:`LONG_BLOCK` and
    :data:`LONG_WARPS`, with as many fewer warps as the scores are narrower than float32 (4 for float16 and
    bfloat16), so that every thread loads and stores ``LONG_BLOCK / (32 · warps)`` contiguous scores, 16 bytes
    (one ``ld.global.v4.b32``; with 8 warps a thread's 4 half-precision scores are 8 bytes); or a tuning run's.
    ``solver``: the Newton kernels with the most live values, ``solve_long_rows`` with the loss row sums
    (``SUMS``) and ``split_solve``, keep :data:`LONG_WARPS` whatever the dtype: on 4 warps their float16 and
    bfloat16 variants spill 8-16 bytes with Triton 3.9 (sm_90a: the power kind with the sums at ``EXACT = 0``
    and :data:`EXACT_FAR`, Jensen–Shannon's and Jeffrey's with the gradient, ``split_solve`` of 1.5-entmax),
    none on 8 (``split_solve`` reads float32 candidates: 16 bytes a thread on 8 warps).  The chunk, and so the
    candidates each row keeps and the slices, stays the same for every kernel.  The launcher and
    ``benchmarks/compile_report.py`` both ask this function.

    Examples:
        >>> from softargmax.backends.triton.rows import _long_launch
        >>> _long_launch(4), _long_launch(2), _long_launch(2, solver=True)
        ((1024, 8), (1024, 4), (1024, 8))
    """
    override = current_rows()
    warps = LONG_WARPS if solver else max(1, LONG_WARPS * elem_bytes // 4)
    return override.long_block or LONG_BLOCK, override.long_warps or warps


@functools.lru_cache(maxsize=None)
def _device_multiprocessors(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def multiprocessors(device: torch.device) -> int:
    """The device's multiprocessors (a host query, cached per device, no synchronization), or
    :data:`INTERPRET_MULTIPROCESSORS` for CPU tensors."""
    if device.type != "cuda":
        return INTERPRET_MULTIPROCESSORS
    return _device_multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


def slice_plan(R: int, k: int, multiprocessors: int, block: int) -> tuple[int, int]:
    """``(ns, L)``: the streamed kernels' slices per row and slice length (a multiple of ``block``) for ``R``
    rows of ``k`` entries on ``multiprocessors`` multiprocessors.

    ``ns = 1`` (one program per row) unless there are fewer than :data:`SPLIT_ROWS_PER_SM` rows per
    multiprocessor; then enough slices for about :data:`SPLIT_PROGRAMS_PER_SM` programs per
    multiprocessor, none shorter than :data:`SPLIT_MIN_SLICE`.  :data:`SPLIT_SLICES` replaces the rule.

    Examples:
        >>> from softargmax.backends.triton.rows import slice_plan
        >>> slice_plan(256, 262144, 132, 1024)   # an H100: 3 slices of 88,064 entries
        (3, 88064)
        >>> slice_plan(4096, 32768, 132, 1024)   # enough rows: one program each
        (1, 32768)
        >>> slice_plan(32, 32768, 132, 1024)     # decoding: 32 rows, slices of 16,384 at least
        (2, 16384)
    """
    for name, value in (("R", R), ("k", k), ("multiprocessors", multiprocessors), ("block", block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if SPLIT_SLICES is not None:
        ns = SPLIT_SLICES
    elif R >= SPLIT_ROWS_PER_SM * multiprocessors:
        return 1, k
    else:
        ns = min(_cdiv(SPLIT_PROGRAMS_PER_SM * multiprocessors, R), k // max(SPLIT_MIN_SLICE, 1))
    if ns <= 1:
        return 1, k
    length = _cdiv(_cdiv(k, ns), block) * block
    return _cdiv(k, length), length


def forward_slices(R: int, k: int, device: torch.device, kind: int = KIND_POWER, exact: int = 1) -> int:
    """Programs per row of the forward kernels of ``(kind, exact)`` (as :func:`_run` launches them; the default:
    sparsemax) on ``R`` rows of ``k`` entries on ``device`` (0: the rows are held in registers; 1: one program per
    row).  The kinds of :func:`heavy_kind` hold register rows up to half the length (:func:`register_limit`).

    Examples:
        >>> import torch
        >>> from softargmax.backends.triton.rows import KIND_POWER, forward_slices
        >>> forward_slices(4, 300, torch.device("cpu"))   # short rows: in registers
        0
        >>> forward_slices(4, 12000, torch.device("cpu")), forward_slices(4, 12000, torch.device("cpu"), KIND_POWER, 0)
        (0, 1)
    """
    if k <= register_limit(kind, exact):
        return 0
    return _slices(R, k, device, _long_launch()[0])[0]


def register_limit(kind: int, exact: int) -> int:
    """The longest rows the register kernels hold for ``(kind, exact)``: :data:`BLOCK_ROWS_MAX`, or half of it for
    the kinds of :func:`heavy_kind` (8 scores per thread: their rows end at 8192 with 32 warps)."""
    return BLOCK_ROWS_MAX // 2 if heavy_kind(kind, exact) else BLOCK_ROWS_MAX


def operator_kind(div: Divergence) -> Optional[tuple[int, int]]:
    """``(kind, exact)`` of the row kernels that solve the operator of ``div`` (:func:`row_exact` for the power
    kind, 0 for the others), or ``None`` where no kernel has it; what :func:`solve` launches.

    Examples:
        >>> from softargmax.divergences import get_divergence
        >>> from softargmax.backends.triton.rows import operator_kind
        >>> operator_kind(get_divergence("alpha", alpha=1.3)), operator_kind(get_divergence("jensen_shannon"))
        ((0, 3), (1, 0))
    """
    kind, a = kind_of(div)
    if kind is None:
        return None
    return kind, row_exact(a) if kind == KIND_POWER and a is not None else 0


def _slices(R: int, k: int, device: torch.device, block: int) -> tuple[int, int]:
    """:func:`slice_plan` on ``device`` (the one place where the streamed kernels' split is chosen: the
    forward and the backward of the same rows get the same slices)."""
    return slice_plan(R, k, multiprocessors(device), block)


def _run(z: Tensor, kind: int, exact: int, alpha_rows: Optional[Tensor], a_value: float, tau_c: float,
         omega_c: float, omega_scale: float, sums: bool,
         target: Optional[tuple[Tensor, Tensor]] = None) -> Solution:
    """One kernel launch: ``p``, ``τ_f``, ``Σ s``, the bad rows and (``sums``) the loss row sums.

    ``target``: ``(index [R], keep [R] bool)``, class indices (0 in ignored rows) and the kept rows:
    the kernel writes the loss's gradient ``G = p - y`` (0 in rows not kept) where ``p`` would go, and
    the returned solution's ``p`` is ``G`` (:func:`solve_gradient`; with ``sums``).

    ``alpha_rows``: one float32 α per row (``[R]``, contiguous), else ``a = a_value`` for every
    row; ``tau_c``: the offset of :func:`_tau_f` (the power kind's ``power_offset``);
    ``exact``: 1 sparsemax, 2 1.5-entmax (closed-form steps), 0 general.  Allocates the
    outputs only (``τ`` and ``Σ s`` share one ``[R, 2]`` buffer)."""
    K = _module()
    R, k = z.shape
    p = torch.empty_like(z)
    aux = torch.empty(R, 2, dtype=torch.float32, device=z.device)
    bad = torch.empty(R, 1, dtype=torch.bool, device=z.device)
    row_sums = torch.empty(2, R, dtype=torch.float32, device=z.device) if sums else aux
    per_row = alpha_rows is not None
    alpha = alpha_rows if alpha_rows is not None else aux  # not read without PER_ROW
    grad = target is not None
    idx, keep = (target[0], target[1].view(torch.uint8)) if target is not None else (aux, aux)  # not read without GRAD
    tol = 2 * torch.finfo(torch.float32).eps  # below rounding: the iterations stop when the residual stalls
    if k <= register_limit(kind, exact):
        rows, ch, line, warps, split = _tile(k, z.element_size(), heavy_kind(kind, exact))
        K.solve_block_rows[(_cdiv(R, rows),)](z, p, aux, bad, row_sums, alpha, R, k, a_value, tau_c, tol, MAX_ITER,
                                              omega_c, omega_scale, idx, keep, KIND=kind, EXACT=exact,
                                              PER_ROW=per_row, SUMS=sums, GRAD=grad, ROWS=rows, CH=ch, LINE=line, SPLIT=split, num_warps=warps)
    else:
        block, warps = _long_launch(z.element_size())
        ns, length = _slices(R, k, z.device, block)
        slots = long_slots(kind)
        if ns > 1:
            # one float32 workspace: the candidates [R, ns, SLOTS (+ REST_STATS for the statistics of the scores
            # not kept: Jensen–Shannon, squared Hellinger), BLOCK] (at its start: 16-byte aligned whatever z is, so their loads are
            # vectors; benchmarks/compile_report.py compiles them so), the rows' (maximum, t) [R, 2] and the
            # slices' partial sums [R, ns, 3]
            rest = rest_kind(kind)
            n_cand = R * ns * (slots + REST_STATS * (rest > 0)) * block
            work = torch.empty(n_cand + 2 * R + 3 * R * ns, dtype=torch.float32, device=z.device)
            cand, state, part = work[:n_cand], work[n_cand:n_cand + 2 * R], work[n_cand + 2 * R:]
            K.split_scan[(R * ns,)](z, cand, k, length, ns, BLOCK=block, SLOTS=slots, REST=rest, num_warps=warps)
            K.split_solve[(R,)](z, cand, state, aux, bad, alpha, k, ns, a_value, tau_c, tol, MAX_ITER,
                                KIND=kind, EXACT=exact, PER_ROW=per_row, BLOCK=block, SLOTS=slots,
                                REST=rest, num_warps=_long_launch(z.element_size(), solver=True)[1])
            K.split_write[(R * ns,)](z, p, state, part, alpha, idx, keep, k, length, ns, a_value, omega_c,
                                     KIND=kind, EXACT=exact, PER_ROW=per_row, SUMS=sums, GRAD=grad, BLOCK=block,
                                     num_warps=warps)
            if sums or kind != KIND_POWER:
                K.split_finish[(R,)](part, state, aux, row_sums, R, ns, omega_scale, KIND=kind, SUMS=sums,
                                     NSP=1 << (ns - 1).bit_length(), num_warps=1)
        else:
            K.solve_long_rows[(R,)](z, p, aux, bad, row_sums, alpha, R, k, a_value, tau_c, tol, MAX_ITER, omega_c,
                                    omega_scale, idx, keep, KIND=kind, EXACT=exact, PER_ROW=per_row, SUMS=sums,
                                    GRAD=grad, BLOCK=block, SLOTS=slots,
                                    num_warps=_long_launch(z.element_size(), solver=sums)[1])

    def jvp(v: Tensor, scale: float) -> Tensor:
        return _jvp(p, v, kind, exact, alpha_rows, a_value, scale)

    return Solution(tau=aux[:, :1], p=p, s=None, s_sum=aux[:, 1:], block_index=None, k=k, bad_rows=bad,
                    iterations=-1, jvp_kernel=jvp, zp=row_sums[0] if sums else None,
                    omega=row_sums[1] if sums else None, backend="triton", nan_written=True)


def _jvp(p: Tensor, v: Tensor, kind: int, exact: int, alpha_rows: Optional[Tensor], a_value: float,
         scale: float) -> Tensor:
    """``scale · s ⊙ (v - ⟨s, v⟩/Σs)`` with ``s`` recomputed from ``p``, in ``p``'s dtype (one launch)."""
    K = _module()
    R, k = p.shape
    v = v.contiguous()
    g = torch.empty_like(p)
    per_row = alpha_rows is not None
    alpha = alpha_rows if alpha_rows is not None else p
    if k <= BLOCK_ROWS_MAX:
        rows, ch, line, warps, split = _tile(k, p.element_size())
        K.jvp_block_rows[(_cdiv(R, rows),)](p, v, g, alpha, R, k, a_value, scale, KIND=kind, EXACT=exact,
                                            PER_ROW=per_row, ROWS=rows, CH=ch, LINE=line, SPLIT=split,
                                            num_warps=warps)
    else:
        block, warps = _long_launch(p.element_size())
        ns, length = _slices(R, k, p.device, block)
        if ns > 1:
            part = torch.empty(R * ns * 2, dtype=torch.float32, device=p.device)
            K.jvp_split_sums[(R * ns,)](p, v, part, alpha, k, length, ns, a_value, KIND=kind, EXACT=exact,
                                        PER_ROW=per_row, BLOCK=block, num_warps=warps)
            K.jvp_split_write[(R * ns,)](p, v, g, part, alpha, k, length, ns, a_value, scale, KIND=kind, EXACT=exact,
                                         PER_ROW=per_row, BLOCK=block, NSP=1 << (ns - 1).bit_length(),
                                         num_warps=warps)
        else:
            K.jvp_long_rows[(R,)](p, v, g, alpha, k, a_value, scale, KIND=kind, EXACT=exact, PER_ROW=per_row,
                                  BLOCK=block, num_warps=warps)
    return g


def solve(z: Tensor, div: Divergence, row_sums: bool = True, q: Optional[Tensor] = None) -> Optional[Solution]:
    """The :class:`~softargmax.backends.solution.Solution` of ``z`` ``[R, k]`` (``q = 1``), or ``None`` if not covered.

    One kernel launch and no host synchronization; ``tau`` is already in the f-divergence
    parametrization.  ``row_sums``: also compute ``zp`` and ``omega`` (the Fenchel–Young loss
    values' row sums); the operators, which never use them, pass ``False`` and get ``None``.
    ``q``: a reference measure is not covered here (``None`` is returned; :func:`softargmax.backends.select`
    gives these kernels none).
    """
    return None if q is not None else _solve(z, div, row_sums, None)


def _solve(z: Tensor, div: Divergence, row_sums: bool, target: Optional[tuple[Tensor, Tensor]]) -> Optional[Solution]:
    """:func:`solve`; with ``target`` (:func:`_run`) the solution's ``p`` is the loss's gradient."""
    launch = operator_kind(div)  # the one choice of (kind, exact)
    if launch is None or not _usable(z):
        return None
    kind, exact = launch
    if kind != KIND_POWER:
        return _run(z, kind, exact, None, 1.0, 0.0, 0.0, 1.0, row_sums, target)
    a = kind_of(div)[1]
    assert a is not None  # the power kind carries its exponent a = α - 1
    # the kernel's raw regularizer sum is Σ (p^α - c p) for the power kind: with c = α it is
    # α(α-1) Σ [f(p) - f(0)] of the α-divergence; with c = 0 (chi-square: f(p) - f(0) = p²/2) twice it
    chi = div.hints.power_offset == 0.0  # g(v) = [v]_+ (chi-square): f(p) - f(0) = p²/2
    c = 0.0 if chi else a + 1.0
    scale = 0.5 if chi else 1.0 / ((a + 1.0) * a)
    return _run(z, kind, exact, None, a, div.hints.power_offset, c, scale, row_sums, target)


def solve_gradient(z: Tensor, div: Divergence, index: Tensor,
                   keep: Tensor) -> Optional[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """The Fenchel–Young loss of class indices in one launch: ``(G, ⟨z, p⟩, Ω-sum, bad rows)``, or ``None``
    if not covered.

    ``G = p - y`` (``y`` one-hot at ``index`` ``[R]`` int64, 0 in ignored rows; ``0`` where ``keep`` ``[R]``
    bool is false, NaN in bad rows kept) in ``z``'s dtype, written by the solver's last pass where ``p``
    would go (no separate epilogue pass over memory); the row sums ``zp`` and ``omega`` of
    :attr:`Solution.zp <softargmax.backends.solution.Solution.zp>` and ``Solution.omega`` (float32 ``[R]``,
    NaN in bad rows) and the bad rows ``[R, 1]``.
    """
    if index.dtype != torch.int64 or keep.dtype != torch.bool or index.shape != z.shape[:1] or \
            keep.shape != z.shape[:1] or not (index.is_contiguous() and keep.is_contiguous()):
        return None
    sol = _solve(z, div, True, (index, keep))
    if sol is None:
        return None
    assert sol.zp is not None and sol.omega is not None and sol.bad_rows is not None  # (row_sums=True)
    return sol.p, sol.zp, sol.omega, sol.bad_rows


def solve_alpha_rows(z: Tensor, alpha2d: Tensor, checked: bool = False) -> Optional[Solution]:
    """α-entmax with one α per row (``alpha2d`` ``[R, 1]``), or ``None`` if some α is outside (1, 2]
    (``checked``: :func:`covers_alpha_rows` already said yes).  The kernel reads α itself
    (float32: no conversion for a float32 ``alpha2d``)."""
    if not _usable(z):
        return None
    if not checked and not alpha_rows_covered(z, alpha2d, torch.float32):
        return None
    alpha = alpha2d.detach().reshape(-1).to(device=z.device, dtype=torch.float32).contiguous()
    return _run(z, KIND_POWER, 0, alpha, 1.0, 1.0, 0.0, 1.0, True)


def row_exact(a: float) -> int:
    """The row solver's ``EXACT`` for one ``a = α - 1`` for every row: :func:`relu_exact`'s 1 (sparsemax) and 2
    (1.5-entmax), :data:`EXACT_FAR` for the general power with ``a >= NEAR_ONE`` (α >= 1.25: the hardware
    ``log2``, no ``t + 1`` variable), else 0 (α near 1, and one α per row).

    Examples:
        >>> from softargmax.backends.triton.rows import row_exact
        >>> [row_exact(a) for a in (1.0, 0.5, 0.3, 0.1)]
        [1, 2, 3, 0]
    """
    exact = relu_exact(a)
    return EXACT_FAR if exact == 0 and a >= NEAR_ONE else exact


def relu_exact(a: float) -> int:
    """The α-ReLU kernels' ``EXACT`` for ``a = α - 1``: 1 (α = 2, ``p = t``), 2 (α = 1.5, ``p = t²``), else 0
    (the general power ``t^{1/a}`` by ``exp2``/``log2``)."""
    return 1 if a == 1.0 else 2 if a == 0.5 else 0


def alpha_relu_forward(x: Tensor, alpha: float, tau: float) -> Optional[Tensor]:
    """``[(α-1) x - τ]_+^{1/(α-1)}`` in ``x``'s dtype, or ``None`` where the kernels do not apply."""
    if not covers_alpha_relu(x, alpha):
        return None
    a = alpha - 1.0
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n = xc.numel()
    _module().alpha_relu_forward[(_cdiv(n, ELEMENTWISE_BLOCK),)](xc, y, n, a, tau, EXACT=relu_exact(a),
                                                                       BLOCK=ELEMENTWISE_BLOCK)
    return y


def alpha_relu_backward(x: Tensor, grad: Tensor, alpha: float, tau: float) -> Tensor:
    """``grad · [(α-1) x - τ]_+^{1/(α-1) - 1}`` (the pair of :func:`alpha_relu_forward`), in ``x``'s dtype."""
    a = alpha - 1.0
    xc = x.contiguous()
    gy = grad.contiguous()
    gx = torch.empty_like(xc)
    n = xc.numel()
    _module().alpha_relu_backward[(_cdiv(n, ELEMENTWISE_BLOCK),)](xc, gy, gx, n, a, tau, EXACT=relu_exact(a),
                                                                        BLOCK=ELEMENTWISE_BLOCK)
    return gx
