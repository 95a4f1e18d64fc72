"""Compile report: every Triton kernel variant built for an H100 (sm_90) on this machine, no GPU needed.

    python benchmarks/compile_report.py                       # every variant, table + JSON
    python benchmarks/compile_report.py --quick               # the representative subset (the test's)
    python benchmarks/compile_report.py --kernels 'row_kernels.*long*' --json out.json --jobs 2

The Triton wheel for Linux x86-64 ships ``ptxas``: ``triton.compile(ASTSource(fn, signature,
constexprs), target=GPUTarget("cuda", 90, 32))`` lowers a kernel to PTX and assembles it for
sm_90a without a device.  For every variant the launchers can choose (the table :data:`KERNELS`,
one line per kernel) the report reads

* ``regs``, ``spill_bytes`` (spill stores + loads) and ``stack_bytes``: ptxas's own report (``-v``);
* ``smem``: the shared memory Triton asks for at launch (``metadata.shared``), in bytes;
* ``barriers``: the ``bar.sync`` / ``bar.arrive`` / ``barrier.*`` instructions in the PTX: a static
  count (a barrier inside a loop counts once), the price of each cross-warp reduction
  (``tl.sum``/``tl.max`` over a tensor spread across warps) and of ``tl.cumsum``;
* ``widest_ld`` / ``widest_st`` (and ``ld_bytes`` / ``st_bytes``, the instructions by width): the bytes
  one thread moves per global load / store instruction in the PTX; 16 is a full vector access;
* ``ctas_per_sm`` and ``occupancy`` (resident warps / 64): the smallest of the four H100 limits
  (:data:`H100`): 65,536 registers (allocated per warp in units of 256), 228 KiB shared memory
  (with 1 KiB reserved per CTA by the driver), 2,048 threads and 32 CTAs per SM; ``limit`` names it.

Each variant is compiled with the specialization Triton applies at launch to the usual shapes:
pointers 16-byte aligned and the shape integers (``ALIGNED_INTS``) multiples of 16, which lets it
vectorize the accesses; ``--unaligned`` compiles without (an odd row length).

The compiles go to a temporary Triton cache that is removed afterwards (the repository and
``~/.triton`` stay untouched).  The JSON holds the Triton version, the target and the limits.
A kernel that no longer compiles is listed under ``failures`` and the exit status is 1.

The kernels are imported with ``TRITON_INTERPRET=0`` (the interpreter's kernels cannot be compiled);
this script sets it before Triton is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import functools
import inspect
import io
import itertools
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

#: the H100 (sm_90) limits per SM that bound the CTAs resident at once
H100 = {"registers": 65536, "register_unit": 256, "max_registers_per_thread": 255, "shared_bytes": 228 * 1024,
        "shared_per_cta": 227 * 1024, "reserved_shared_per_cta": 1024, "threads": 2048, "ctas": 32, "warps": 64}
TARGET = ("cuda", 90, 32)
DTYPES = ("fp32", "fp16", "bf16")
TORCH_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Variant:
    """One compiled configuration of a kernel: its constexprs, warps and argument types."""

    kernel: str          # "module.function"
    dtype: str           # the input's element type (fp32, fp16, bf16)
    constexprs: dict
    warps: int
    streaming: bool      # a streaming (long-row / elementwise) kernel: the test refuses any spill there
    quick: bool          # in the representative subset (--quick, the test)

    @property
    def label(self) -> str:
        return " ".join([self.dtype] + [f"{k}={int(v) if isinstance(v, bool) else v}"
                                        for k, v in self.constexprs.items()] + [f"warps={self.warps}"])


@dataclass(frozen=True)
class KernelSpec:
    """A kernel and how its variants are enumerated.

    ``configs()`` yields ``(dtype, constexprs, warps, quick)``; ``data`` names the pointer arguments
    with the input's element type; ``types`` the arguments whose type differs from the default
    (other upper-case names: ``*fp32`` pointers, but ``i32`` for ``INT_SCALARS``; lower-case: ``i32``
    scalars, or ``fp32`` for the names in ``FLOAT_SCALARS``).
    """

    module: str
    name: str
    configs: Callable[[], Iterable[tuple[str, dict, int, bool]]]
    data: tuple[str, ...]
    types: dict = field(default_factory=dict)
    streaming: bool = False
    #: the launcher's ``num_stages`` where it sets one (else Triton's default)
    stages: Optional[Callable[[], int]] = None
    #: pointer arguments to buffers the launcher allocates itself at 16-byte aligned offsets: aligned even
    #: where the input is not (``--unaligned``)
    scratch: tuple[str, ...] = ()


FLOAT_SCALARS = {"tol", "omega_c", "omega_scale", "scale", "a", "a_value", "alpha", "tau", "tau_c"}
#: upper-case names that are integer scalars (row and head counts, lengths), not pointers
INT_SCALARS = {"R", "H", "HKV", "L", "S", "NQB", "NKB"}


def _mod(name: str) -> Any:
    import importlib

    return importlib.import_module(f"softargmax.backends.triton.{name}")


# -- the variants each launcher can choose ----------------------------------------------------------------

def _row_kinds() -> list[tuple[int, int, str]]:
    """``(KIND, EXACT, name)`` of the row kernels: α-entmax (general: α near 1 or one α per row, and one α >= 1.25
    for all rows, ``EXACT_FAR``; sparsemax, 1.5-entmax), JS, Hellinger, reverse KL, Jeffrey, reverse χ²."""
    K = _mod("row_kernels")
    power, js, hell = int(K.KIND_POWER.value), int(K.KIND_JS.value), int(K.KIND_HELL.value)
    rkl, jeff, rchi = int(K.KIND_RKL.value), int(K.KIND_JEFF.value), int(K.KIND_RCHI.value)
    far = int(K.EXACT_FAR.value)
    return [(power, 0, "entmax"), (power, far, "entmax_far"), (power, 1, "sparsemax"), (power, 2, "entmax15"), (js, 0, "js"),
            (hell, 0, "hellinger"), (rkl, 0, "reverse_kl"), (jeff, 0, "jeffrey"), (rchi, 0, "reverse_chi_square")]


def _solve_modes() -> list[tuple[int, int, bool, bool]]:
    """``(KIND, EXACT, PER_ROW, SUMS)`` of the solver launches (``rows._run``): every kind without the loss
    row sums (the operators, ``solve(..., row_sums=False)``) and with them (the losses), and α-entmax with
    one α per row (``solve_alpha_rows``: the general kind, with the sums)."""
    power = int(_mod("row_kernels").KIND_POWER.value)
    return [(kind, exact, False, sums) for kind, exact, _ in _row_kinds() for sums in (False, True)] + [
        (power, 0, True, True)]


def _jvp_modes() -> list[tuple[int, int, bool]]:
    """``(KIND, EXACT, PER_ROW)`` of the backward launches (``rows._jvp``): those of :func:`_solve_modes`."""
    return sorted({(kind, exact, per_row) for kind, exact, per_row, _ in _solve_modes()},
                  key=lambda m: (m[2], m[0], m[1]))


def _grads(per_row: bool, sums: bool) -> tuple[bool, ...]:
    """``GRAD`` of a solver launch: the losses with class indices (with the sums, one α for all rows) have the
    solver write ``G = p - y`` where ``p`` would go (``rows.solve_gradient``), the others ``p``."""
    return (False, True) if sums and not per_row else (False,)


def _heavy(kind: int, exact: int) -> bool:
    """The kinds to which ``rows._run`` gives half the register rows (``rows.heavy_kind``)."""
    return bool(_mod("rows").heavy_kind(kind, exact))


ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def _row_tiles(elem_bytes: int = 4, heavy: bool = False) -> list[tuple[int, int, int, int, bool]]:
    """Every ``(ROWS, CH, LINE, warps, SPLIT)`` that ``rows._tile`` chooses for rows of 1 to ``BLOCK_ROWS_MAX``
    entries (``heavy``: to half that, the solver's limit for the general power kind), shortest first (the
    tile depends on the row length rounded up to a power of two only)."""
    T = _mod("rows")
    limit = T.BLOCK_ROWS_MAX // 2 if heavy else T.BLOCK_ROWS_MAX
    lengths = [1] + [1 << i for i in range(1, limit.bit_length())]
    return sorted({T._tile(k, elem_bytes, heavy) for k in lengths if k <= limit}, key=lambda t: t[1] * t[2])


def _tile_constexprs(tile: tuple[int, int, int, int, bool]) -> dict:
    rows, ch, line, _, split = tile
    return dict(ROWS=rows, CH=ch, LINE=line, SPLIT=split)


#: the modes of the register kernels in the quick subset (bfloat16, the shortest and longest tile): the
#: general power kind with one α per row and the sums (the most registers), sparsemax as the operators run it
#: and as its loss runs it (the sums, writing the gradient); ``(KIND, EXACT, PER_ROW, SUMS, GRAD)``
_QUICK_SOLVE = ((0, 0, True, True, False), (0, 1, False, False, False), (0, 1, False, True, True))
_QUICK_JVP = ((0, 0, True), (0, 2, False))


def _block_rows_configs() -> Iterable[tuple[str, dict, int, bool]]:
    for dt in DTYPES:
        for kind, exact, per_row, sums in _solve_modes():
            tiles = _row_tiles(ELEM_BYTES[dt], _heavy(kind, exact))
            for tile, grad in itertools.product(tiles, _grads(per_row, sums)):
                quick = dt == "bf16" and tile in (tiles[0], tiles[-1]) and (kind, exact, per_row, sums, grad) in _QUICK_SOLVE
                yield (dt, dict(KIND=kind, EXACT=exact, PER_ROW=per_row, SUMS=sums, GRAD=grad, **_tile_constexprs(tile)),
                       tile[3], quick)


def _jvp_rows_configs() -> Iterable[tuple[str, dict, int, bool]]:
    for dt in DTYPES:
        for kind, exact, per_row in _jvp_modes():
            tiles = _row_tiles(ELEM_BYTES[dt])  # the backward holds p and v: the same tile for every kind
            for tile in tiles:
                quick = dt == "bf16" and tile in (tiles[0], tiles[-1]) and (kind, exact, per_row) in _QUICK_JVP
                yield dt, dict(KIND=kind, EXACT=exact, PER_ROW=per_row, **_tile_constexprs(tile)), tile[3], quick


def _quick_kind(kind: int) -> bool:
    """The kinds of the streamed kernels' quick subset: all but reverse KL and reverse χ² (Jeffrey stands for the
    kinds with ``f(0) = +∞``: the same passes, with its Lambert W the most registers)."""
    K = _mod("row_kernels")
    return kind not in (int(K.KIND_RKL.value), int(K.KIND_RCHI.value))


#: the streamed kernels' quick subset: bfloat16, every mode (the spills the test refuses are there)
def _long_solve_configs() -> Iterable[tuple[str, dict, int, bool]]:
    T = _mod("rows")
    for dt in DTYPES:
        for kind, exact, per_row, sums in _solve_modes():
            block, warps = T._long_launch(ELEM_BYTES[dt], solver=sums)  # (the launcher's warps: rows._run)
            for grad in _grads(per_row, sums):
                yield (dt, dict(KIND=kind, EXACT=exact, PER_ROW=per_row, SUMS=sums, GRAD=grad, BLOCK=block,
                                SLOTS=T.long_slots(kind)),
                       warps, dt == "bf16" and _quick_kind(kind))


def _long_jvp_configs() -> Iterable[tuple[str, dict, int, bool]]:
    T = _mod("rows")
    for dt in DTYPES:
        block, warps = T._long_launch(ELEM_BYTES[dt])
        for kind, exact, per_row in _jvp_modes():
            yield dt, dict(KIND=kind, EXACT=exact, PER_ROW=per_row, BLOCK=block), warps, dt == "bf16" and _quick_kind(kind)


#: the slice count of a split row, rounded up to a power of two (``NSP``), at which the split kernels that
#: add up the slices' partial sums are compiled: 4, what 256 rows of 262,144 entries get on 132 multiprocessors
#: (3 slices); ``NSP`` only sizes a vector of ``ns`` partial sums
SPLIT_NSP = 4


#: the split kernels' quick subset (bfloat16): the general power kind with one α per row, sparsemax as the
#: operators run it and as its loss does, 1.5-entmax, and Jensen–Shannon (a dense kind: full-row steps in the
#: row's program, ``Σ s`` from the slices); ``(KIND, EXACT, PER_ROW)`` (with the sums and ``GRAD`` of
#: :data:`_QUICK_SOLVE` for the write pass)
_QUICK_SPLIT = ((0, 0, True), (0, 1, False), (0, 2, False), (1, 0, False))


def _split_scan_configs() -> Iterable[tuple[str, dict, int, bool]]:
    T = _mod("rows")
    for dt in DTYPES:
        block, warps = T._long_launch(ELEM_BYTES[dt])
        # the slots each kind keeps (rows.long_slots) and REST (rows.rest_kind: the statistics of the scores not kept)
        for slots, rest in sorted({(T.long_slots(kind), T.rest_kind(kind)) for kind, _, _ in _row_kinds()}, reverse=True):
            yield dt, dict(BLOCK=block, SLOTS=slots, REST=rest), warps, dt == "bf16" and slots == T.LONG_SLOTS and not rest


def _split_solve_configs() -> Iterable[tuple[str, dict, int, bool]]:
    T = _mod("rows")
    for dt in DTYPES:
        block, warps = T._long_launch(ELEM_BYTES[dt], solver=True)
        for kind, exact, per_row in _jvp_modes():  # (the solve's modes without the sums: it writes none)
            yield (dt, dict(KIND=kind, EXACT=exact, PER_ROW=per_row, BLOCK=block, SLOTS=T.long_slots(kind),
                            REST=T.rest_kind(kind)), warps,
                   dt == "bf16" and (kind, exact, per_row) in _QUICK_SPLIT)


def _split_write_configs() -> Iterable[tuple[str, dict, int, bool]]:
    T = _mod("rows")
    for dt in DTYPES:
        block, warps = T._long_launch(ELEM_BYTES[dt])
        for kind, exact, per_row, sums in _solve_modes():
            for grad in _grads(per_row, sums):
                quick = dt == "bf16" and ((kind, exact, per_row, sums, grad) in _QUICK_SOLVE or (kind, sums) == (1, True))
                yield (dt, dict(KIND=kind, EXACT=exact, PER_ROW=per_row, SUMS=sums, GRAD=grad, BLOCK=block),
                       warps, quick)


def _split_finish_configs() -> Iterable[tuple[str, dict, int, bool]]:
    """Launched with the loss row sums, or for the dense kinds' ``Σ s``; it reads float32 partial sums only."""
    power = int(_mod("row_kernels").KIND_POWER.value)
    for kind, sums in sorted({(kind, sums) for kind, _, _, sums in _solve_modes() if sums or kind != power}):
        yield "fp32", dict(KIND=kind, SUMS=sums, NSP=SPLIT_NSP), 1, True


def _jvp_split_configs(nsp: bool) -> Callable[[], Iterable[tuple[str, dict, int, bool]]]:
    def configs() -> Iterable[tuple[str, dict, int, bool]]:
        T = _mod("rows")
        for dt in DTYPES:
            block, warps = T._long_launch(ELEM_BYTES[dt])
            for kind, exact, per_row in _jvp_modes():
                c = dict(KIND=kind, EXACT=exact, PER_ROW=per_row, BLOCK=block)
                if nsp:
                    c["NSP"] = SPLIT_NSP
                yield dt, c, warps, dt == "bf16" and (kind, exact, per_row) in _QUICK_SPLIT

    return configs


def _relu_configs() -> Iterable[tuple[str, dict, int, bool]]:
    T = _mod("rows")
    for dt in DTYPES:
        for exact in (0, 1, 2):  # 1/(α-1) general, 1 (α = 2), 2 (α = 1.5)
            yield dt, dict(EXACT=exact, BLOCK=T.ELEMENTWISE_BLOCK), 4, dt == "bf16"  # Triton's default warps


HEAD_DIMS = (64, 128)


def _attention_configs(kernel: str) -> Callable[[], Iterable[tuple[str, dict, int, bool]]]:
    """The fused attention kernels at D = 64, 128 with the tiles ``flash_attention.blocks`` chooses on CUDA (the
    backward's warps: ``flash_attention.backward_warps``): causal without a mask for EXACT 0/1/2 (EXACT 0 with
    the hardware's ``log2``, ``FAST_LOG``, and without; the forward's second launch, ``REPAIR``, with ``FAST_LOG``),
    the 1.5-entmax one on a packed variable-length batch
    (``VARLEN``), and with a boolean mask, not causal (the forward's warps: ``blocks(..., masked=True)``); with a
    sliding window (``WINDOWED``): causal for EXACT 0 (``FAST_LOG``)/1/2, packed, and with a boolean mask (the
    Transformers integration's sliding layers)."""

    def configs() -> Iterable[tuple[str, dict, int, bool]]:
        import torch

        F = _mod("flash_attention")
        cuda = torch.device("cuda")
        for dt in DTYPES:
            dtype = getattr(torch, TORCH_DTYPE[dt])
            for D in HEAD_DIMS:
                for exact, causal, mask, varlen, fast, windowed in (
                        (0, True, 0, False, True, False), (0, True, 0, False, False, False),
                        (1, True, 0, False, False, False), (2, True, 0, False, False, False),
                        (2, True, 0, True, False, False), (2, False, 2, False, False, False),
                        (0, True, 0, False, True, True), (1, True, 0, False, False, True),
                        (2, True, 0, False, False, True), (2, True, 0, True, False, True),
                        (2, True, 2, False, False, True)):
                    bm, bn, warps = F.blocks(D, cuda, dtype, masked=mask != 0, software_log=exact == 0 and not fast)
                    if kernel != "attention_fwd":
                        warps = F.backward_warps(D, cuda, dtype, masked_window=mask != 0 and windowed)
                    c = dict(EXACT=exact, CAUSAL=causal, HAS_MASK=mask, DOT=1 if dt == "fp32" else 0, VARLEN=varlen,
                             BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D)
                    if kernel == "attention_bwd_dq":
                        c["ALPHA_GRAD"] = exact == 0
                    c["FAST_LOG"] = fast
                    c["WINDOWED"] = windowed
                    predicts = exact == 0 and not (dt == "fp32" and D > 64)  # (flash_attention._predicts)
                    if kernel == "attention_fwd" and exact == 0 and not predicts:
                        c["PREDICT"] = False
                    yield dt, c, warps, dt == "bf16" and D == 64 and exact == 2 and causal and not varlen and not windowed
                    if kernel == "attention_fwd" and predicts and fast and not windowed:
                        # the general power's second launch (the rows the output pass's evaluation did not stop)
                        yield dt, dict(c, REPAIR=True), warps, False

    return configs


def _decode_configs() -> Iterable[tuple[str, dict, int, bool]]:
    """The decoding kernels (``decoding.layout``'s tiles and warps on CUDA) at D = 64, 128: a group's rows packed
    in a block of 16 (up to 16 query rows: 4 heads of one query, or one head of 16), 32 or 64 rows, a contiguous
    cache and a paged one (pages of ``BLOCK_N`` positions, and of 16); with a sliding window (``WINDOWED``) on a
    contiguous cache and on pages of ``BLOCK_N``."""
    import torch

    DEC = _mod("decoding")
    cuda = torch.device("cuda")
    for dt in DTYPES:
        for D in HEAD_DIMS:
            for block_m in (16, 32, DEC.MAX_BLOCK_M):
                block_n, warps = DEC.blocks(D, cuda, getattr(torch, TORCH_DTYPE[dt]), block_m)
                for page, windowed in ((0, False), (block_n, False), (16, False), (0, True), (block_n, True)):
                    c = dict(BLOCK_M=block_m, BLOCK_N=min(block_n, page) if page else block_n, HEAD_DIM=D,
                             DOT=1 if dt == "fp32" else 0, PAGED=page != 0, PAGE=page or 1, WINDOWED=windowed)
                    quick = (dt == "bf16" and D == 128 and not windowed
                             and (block_m, page) in ((16, 0), (16, 16), (DEC.MAX_BLOCK_M, 0)))
                    yield dt, c, warps, quick


def _attention_stages() -> int:
    return int(_mod("flash_attention").NUM_STAGES)


def _row_dot_configs() -> Iterable[tuple[str, dict, int, bool]]:
    for dt in DTYPES:
        for D in HEAD_DIMS:
            yield dt, dict(BLOCK_R=max(1, 1024 // D), HEAD_DIM=D), 4, dt == "bf16" and D == 64


def _tiles() -> tuple[int, int]:
    """The tiles of ``G`` (tokens × classes) that the loss kernels mark and the tile products walk."""
    T = _mod("tile_gemms")
    return T.TILE_TOKENS, T.TILE_CLASSES


def _loss_configs(name: str) -> Callable[[], Iterable[tuple[str, dict, int, bool]]]:
    """The loss epilogue kernels (``losses.gradient`` / ``losses.softmax_gradient``): a class index or a dense
    target, with or without a row scale, at the launchers' ``BLOCK`` and warps (the softmax one: 8)."""

    def configs() -> Iterable[tuple[str, dict, int, bool]]:
        L = _mod("losses")
        tm, tn = _tiles()
        block, warps = (L.SOFTMAX_BLOCK, 8) if name == "softmax_gradient_rows" else (L.BLOCK, 4)  # 4: Triton's default
        for dt in DTYPES:
            for dense in (False, True):
                for scale in (False, True):
                    if name == "softmax_gradient_rows":
                        yield dt, dict(HAS_DENSE=dense, HAS_SCALE=scale, BLOCK=block), warps, dt == "bf16" and scale
                        continue
                    for tiles in (False, True) if scale else (False,):  # the fused loss marks tiles with a scale
                        yield (dt, dict(HAS_DENSE=dense, HAS_SCALE=scale, HAS_TILES=tiles, TM=tm,
                                        TN=tn, BLOCK=block), warps, dt == "bf16" and scale)

    return configs


def _alpha_relu_loss_configs() -> Iterable[tuple[str, dict, int, bool]]:
    """The α-ReLU loss kernel (``losses.alpha_relu_gradient``): a class index or a dense target, with or without a
    row scale, each power (general, α = 2, α = 1.5), one program of 8 warps per row."""
    L = _mod("losses")
    tm, tn = _tiles()
    for dt in DTYPES:
        for dense in (False, True):
            for scale in (False, True):
                for exact in (0, 1, 2):
                    for tiles in (False, True) if scale else (False,):  # the fused loss marks tiles with a scale
                        yield (dt, dict(HAS_DENSE=dense, HAS_SCALE=scale, EXACT=exact, HAS_TILES=tiles,
                                        TM=tm, TN=tn, BLOCK=L.SOFTMAX_BLOCK), 8,
                               dt == "bf16" and scale and exact != 1)


def _tile_gemm_configs() -> Iterable[tuple[str, dict, int, bool]]:
    """The fused layer's products that skip G's all-zero tiles (``tile_gemms.backprop``): the launcher's dot mode
    (tensor cores for half precision, IEEE float32) and feature block per dtype, 4 warps (Triton's default)."""
    T = _mod("tile_gemms")
    tm, tn = _tiles()
    import torch

    for dt in DTYPES:
        torch_dtype = getattr(torch, TORCH_DTYPE[dt])
        yield (dt, dict(DOT=1 if dt == "fp32" else 0, TM=tm, TN=tn,
                        BD=T.feature_block(torch_dtype)), 4, dt == "bf16")


def _scale_configs() -> Iterable[tuple[str, dict, int, bool]]:
    """The backward's ``losses.scale_rows`` (``G`` scaled per row in place) at the launcher's ``BLOCK``."""
    L = _mod("losses")
    for dt in DTYPES:
        yield dt, dict(BLOCK=L.BLOCK), 4, dt == "bf16"  # 4: Triton's default warps


#: the attention kernels' iteration counts, lists and tile map (a bit per tile) and packed batches' offsets
_ATT = {"ITERS": "*i32", "LIST": "*i32", "KEPT": "*i32", "CU_Q": "*i32", "CU_K": "*i32"}
#: the row kernels' outputs besides p: the bad rows, a bool tensor
_ROWS = {"BAD": "*u1", "IDX": "*i64", "KEEP": "*u8"}
#: the decoding kernels' sequence ends, starts and block table
_DEC = {"END": "*i32", "START": "*i32", "TABLE": "*i32"}
#: the loss kernels' target (int64 class indices or float32 rows), the kept rows (bool viewed as uint8) and
#: the marks of G's non-zero tiles (uint8)
_LOSS = {"IDX": "*i64", "Y": "*fp32", "KEEP": "*u8", "FLAGS": "*u8"}
#: the tile products' lists of marked tiles and their lengths
_TILE_LISTS = {"LIST": "*i32", "COUNT": "*i32"}


#: every Triton kernel of the library: add a kernel here (one line) and every proxy reports it
KERNELS: list[KernelSpec] = [
    KernelSpec("row_kernels", "solve_block_rows", _block_rows_configs, ("Z", "P"), _ROWS),
    KernelSpec("row_kernels", "jvp_block_rows", _jvp_rows_configs, ("P", "V", "G")),
    KernelSpec("row_kernels", "solve_long_rows", _long_solve_configs, ("Z", "P"), _ROWS, streaming=True),
    KernelSpec("row_kernels", "jvp_long_rows", _long_jvp_configs, ("P", "V", "G"), streaming=True),
    KernelSpec("row_kernels", "split_scan", _split_scan_configs, ("Z",), streaming=True, scratch=("CAND",)),
    KernelSpec("row_kernels", "split_solve", _split_solve_configs, ("Z",), _ROWS, streaming=True, scratch=("CAND",)),
    KernelSpec("row_kernels", "split_write", _split_write_configs, ("Z", "P"), _ROWS, streaming=True),
    KernelSpec("row_kernels", "split_finish", _split_finish_configs, ()),
    KernelSpec("row_kernels", "jvp_split_sums", _jvp_split_configs(False), ("P", "V"), streaming=True),
    KernelSpec("row_kernels", "jvp_split_write", _jvp_split_configs(True), ("P", "V", "G"), streaming=True),
    KernelSpec("row_kernels", "alpha_relu_forward", _relu_configs, ("X", "Y"), streaming=True),
    KernelSpec("row_kernels", "alpha_relu_backward", _relu_configs, ("X", "GY", "GX"), streaming=True),
    KernelSpec("loss_kernels", "gradient_rows", _loss_configs("gradient_rows"), ("P", "G"), _LOSS, streaming=True),
    KernelSpec("loss_kernels", "softmax_gradient_rows", _loss_configs("softmax_gradient_rows"), ("Z", "G"), _LOSS,
               streaming=True),
    KernelSpec("loss_kernels", "alpha_relu_gradient_rows", _alpha_relu_loss_configs, ("Z", "G"), _LOSS, streaming=True),
    KernelSpec("loss_kernels", "scale_rows", _scale_configs, ("G", "OUT"), streaming=True),
    KernelSpec("tile_gemm_kernels", "grad_hidden_tiles", _tile_gemm_configs, ("G", "W", "OUT"), _TILE_LISTS),
    KernelSpec("tile_gemm_kernels", "grad_weight_tiles", _tile_gemm_configs, ("G", "HID", "GW"), _TILE_LISTS),
    KernelSpec("attention_kernels", "attention_fwd", _attention_configs("attention_fwd"), ("Q", "K", "V", "O", "Wv"), _ATT,
               stages=_attention_stages),
    KernelSpec("attention_kernels", "attention_bwd_dkdv", _attention_configs("attention_bwd_dkdv"),
               ("Q", "K", "V", "DO", "DK", "DV"), _ATT, stages=_attention_stages),
    KernelSpec("attention_kernels", "attention_bwd_dq", _attention_configs("attention_bwd_dq"), ("Q", "K", "V", "DO", "DQ"), _ATT,
               stages=_attention_stages),
    KernelSpec("attention_kernels", "row_dot", _row_dot_configs, ("X", "Y"), _ATT),
    KernelSpec("decode_kernels", "decode_scores", _decode_configs, ("Q", "K"), _DEC),
    KernelSpec("decode_kernels", "decode_pv", _decode_configs, ("V",), _DEC),
]


def _defaults(fn: Any, constexprs: dict) -> dict:
    """``constexprs`` with the defaults of the kernel's constexpr parameters that it does not give (a diagnostics
    switch such as the forward's ``STATS``: its training value, and the label stays as it was)."""
    params = inspect.signature(getattr(fn, "fn", fn)).parameters.values()  # (the interpreter's kernels too)
    return {**{p.name: p.default for p in params if "constexpr" in str(p.annotation)
               and p.default is not inspect.Parameter.empty}, **constexprs}


def _signature(fn: Any, spec: KernelSpec, dtype: str, constexprs: dict) -> dict:
    sig = {}
    constexprs = _defaults(fn, constexprs)
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in spec.data:
            sig[name] = "*" + dtype
        elif name == "MASK":
            sig[name] = "*u8" if constexprs.get("HAS_MASK") == 2 else "*fp32"
        elif name in spec.types:
            sig[name] = spec.types[name]
        elif name in INT_SCALARS:
            sig[name] = "i32"
        elif name[0].isupper():
            sig[name] = "*fp32"
        else:
            sig[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    return sig


@functools.lru_cache(maxsize=None)
def variants() -> list[Variant]:
    """Every variant of every kernel of :data:`KERNELS`, deduplicated, in table order."""
    out, seen = [], set()
    for spec in KERNELS:
        for dtype, consts, warps, quick in spec.configs():
            v = Variant(f"{spec.module}.{spec.name}", dtype, consts, warps, spec.streaming, quick)
            key = (v.kernel, v.label)
            if key not in seen:
                seen.add(key)
                out.append(v)
    return out


def _spec(kernel: str) -> KernelSpec:
    return next(s for s in KERNELS if f"{s.module}.{s.name}" == kernel)


# -- occupancy ---------------------------------------------------------------------------------------------

def ctas_per_sm(regs: int, warps: int, smem: int, limits: Optional[dict] = None) -> tuple[int, str]:
    """CTAs of ``warps`` warps, ``regs`` registers per thread and ``smem`` bytes of shared memory resident
    on one SM, and the limit that binds (``registers``, ``shared``, ``threads``, ``ctas``); 0 if one CTA
    does not fit."""
    lim = limits or H100
    unit = lim["register_unit"]
    regs_per_warp = math.ceil(max(regs, 1) * 32 / unit) * unit
    by = {"registers": (lim["registers"] // regs_per_warp) // warps,
          "shared": (lim["shared_bytes"] // (smem + lim["reserved_shared_per_cta"])
                     if smem <= lim["shared_per_cta"] else 0),
          "threads": lim["threads"] // (32 * warps), "ctas": lim["ctas"]}
    name = min(by, key=lambda k: by[k])
    return by[name], name


# -- compiling -----------------------------------------------------------------------------------------------

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_BARRIER = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:bar|barrier)(?:\.cta)?\.(?:sync|arrive|red)\b", re.MULTILINE)


def count_barriers(ptx: str) -> int:
    """The barrier instructions (``bar.sync``, ``bar.arrive``, ``bar.red``, ``barrier.*``) in a PTX text."""
    return len(_BARRIER.findall(ptx))


_GLOBAL_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[a-z0-9:]+)*)")


def access_widths(ptx: str) -> dict:
    """``{"ld": {bytes: count}, "st": {bytes: count}}``: the global loads and stores of a PTX text by the
    bytes each thread moves per instruction (``ld.global.v4.b32``: 16); a static count."""
    out: dict = {"ld": {}, "st": {}}
    for op, suffix in _GLOBAL_ACCESS.findall(ptx):
        parts = suffix.split(".")
        vec = next((int(x[1:]) for x in parts if re.fullmatch(r"v\d+", x)), 1)
        bits = next((int(x[1:]) for x in reversed(parts) if re.fullmatch(r"[bufs]\d+", x)), 8)
        width = vec * max(bits, 8) // 8
        out[op][width] = out[op].get(width, 0) + 1
    return out


#: integer arguments that a launch at the usual shapes specializes as multiples of 16 (row lengths, row
#: counts, element counts, strides); Triton does this at launch for every int argument divisible by 16
ALIGNED_INTS = re.compile(r"k|R|n|d|L|S|a_stride|stride_\w+")


def _attrs(fn: Any, signature: dict, aligned: bool, scratch: tuple[str, ...] = ()) -> dict:
    """Triton's launch-time specialization: pointers 16-byte aligned and the shape integers multiples of 16
    (``aligned``: what a launch at 32768 columns gets), or none (odd shapes, offset views) but the ``scratch``
    pointers, which the launcher allocates aligned."""
    if not aligned:
        return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in scratch}
    # the arguments the kernel exempts (``@triton.jit(do_not_specialize=...)``) are never specialized
    params = getattr(fn, "params", [])
    exempt = {p.name for p in params if getattr(p, "do_not_specialize", False)
              or getattr(p, "do_not_specialize_on_alignment", False)}
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name not in exempt and (
            signature[name].startswith("*") or (signature[name] == "i32" and ALIGNED_INTS.fullmatch(name)))}


def _resource_usage(cubin: bytes) -> str:
    """``cuobjdump --dump-resource-usage`` of a cubin, rewritten as ptxas's report (the spills: the stack frame)."""
    import subprocess

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
    try:
        out = subprocess.run([tool, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
    except OSError:
        return ""
    finally:
        os.unlink(fh.name)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    if m is None:
        return out
    stack = int(m.group(2)) + int(m.group(3))  # no spill counts there: the stack frame stands for them
    return f"Used {m.group(1)} registers; {stack} bytes stack frame, {stack} bytes spill stores, 0 bytes spill loads"


def build(fn: Any, signature: dict, constexprs: dict, warps: int, stages: Optional[int] = None,
          aligned: bool = True, scratch: tuple[str, ...] = ()) -> tuple[Any, str]:
    """``triton.compile`` of the ``@triton.jit`` function ``fn`` for sm_90a (:data:`TARGET`) with the launch-time
    specialization of :func:`_attrs`: the compiled kernel (``.asm["ptx"]``, ``.metadata``) and the text that
    ptxas -v printed (or, for a Triton that prints none, the binary's resource usage in the same words)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v's report, printed by Triton: captured here
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        c = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=_defaults(fn, constexprs),
                                     attrs=_attrs(fn, signature, aligned, scratch)), target=GPUTarget(*TARGET),
                           options=dict(num_warps=warps, **({"num_stages": stages} if stages else {})))
    text = log.getvalue()
    if _PTXAS_REGS.search(text) is None or _PTXAS_SPILLS.search(text) is None:
        text = _resource_usage(c.asm["cubin"])
    return c, text


def resources(compiled: Any, ptxas: str, warps: int) -> dict:
    """The report's columns of a kernel :func:`build` compiled (``ptxas``: its log); raises ``ValueError``
    where the log has no register or spill report."""
    regs, spills = _PTXAS_REGS.search(ptxas), _PTXAS_SPILLS.search(ptxas)
    if regs is None or spills is None:
        raise ValueError(f"no ptxas report in: {ptxas[-500:]!r}")
    smem = int(compiled.metadata.shared)
    ctas, limit = ctas_per_sm(int(regs.group(1)), warps, smem)
    widths = access_widths(compiled.asm["ptx"])
    return dict(regs=int(regs.group(1)), spill_bytes=int(spills.group(2)) + int(spills.group(3)),
                stack_bytes=int(spills.group(1)), smem=smem, barriers=count_barriers(compiled.asm["ptx"]),
                ctas_per_sm=ctas, limit=limit, occupancy=round(ctas * warps / H100["warps"], 3),
                ld_bytes=widths["ld"], st_bytes=widths["st"], widest_ld=max(widths["ld"], default=0),
                widest_st=max(widths["st"], default=0))


def compile_kernel(index: int, aligned: bool = True) -> tuple[Any, str]:
    """:func:`build` of :func:`variants` ``[index]``: its compiled kernel and ptxas's log."""
    v = variants()[index]
    spec = _spec(v.kernel)
    fn = getattr(_mod(spec.module), spec.name)
    return build(fn, _signature(fn, spec, v.dtype, v.constexprs), v.constexprs, v.warps,
                 spec.stages() if spec.stages else None, aligned, spec.scratch)


def compile_variant(index: int, aligned: bool = True) -> dict:
    """Compile :func:`variants` ``[index]`` for sm_90 and return its row of the report."""
    v = variants()[index]
    row: dict[str, Any] = {"kernel": v.kernel, "variant": v.label, "dtype": v.dtype, "constexprs": v.constexprs,
                           "warps": v.warps, "streaming": v.streaming}
    t0 = time.perf_counter()
    try:
        c, text = compile_kernel(index, aligned)
    except Exception as err:  # a variant that no longer compiles: reported, not raised
        row["error"] = f"{type(err).__name__}: {str(err)[-1500:]}"
        return row
    row["seconds"] = round(time.perf_counter() - t0, 2)
    try:
        row.update(resources(c, text, v.warps))
    except ValueError as err:
        row["error"] = str(err)
    return row


def select(patterns: Optional[list[str]] = None, quick: bool = False) -> list[int]:
    """Indices into :func:`variants`: those whose ``kernel`` (or ``kernel variant``) matches a glob of
    ``patterns`` (all by default), in the representative subset only with ``quick``."""
    out = []
    for i, v in enumerate(variants()):
        if quick and not v.quick:
            continue
        if patterns and not any(fnmatch.fnmatch(v.kernel, p) or fnmatch.fnmatch(f"{v.kernel} {v.label}", p)
                                for p in patterns):
            continue
        out.append(i)
    return out


def report(indices: list[int], jobs: int = 1, aligned: bool = True) -> dict:
    """Compile the variants ``indices`` (``jobs`` processes) into a fresh temporary Triton cache."""
    import triton

    cache = tempfile.mkdtemp(prefix="softargmax-compile-report-")
    old = triton.knobs.cache.dir
    t0 = time.perf_counter()
    try:
        triton.knobs.cache.dir = cache
        os.environ["TRITON_CACHE_DIR"] = cache  # the workers' too
        if jobs > 1 and len(indices) > 1:
            with ProcessPoolExecutor(jobs) as pool:
                rows = list(pool.map(functools.partial(compile_variant, aligned=aligned), indices))
        else:
            rows = [compile_variant(i, aligned) for i in indices]
    finally:
        triton.knobs.cache.dir = old
        shutil.rmtree(cache, ignore_errors=True)
    return {"triton": triton.__version__, "target": {"backend": TARGET[0], "arch": TARGET[1], "warp_size": TARGET[2]},
            "limits": H100, "specialization": "aligned" if aligned else "none",
            "seconds": round(time.perf_counter() - t0, 1), "variants": rows,
            "failures": [f"{r['kernel']} {r['variant']}: {r['error']}" for r in rows if "error" in r]}


def table(result: dict) -> str:
    lines = [f"Triton {result['triton']}, target sm_{result['target']['arch']} "
             f"({len(result['variants'])} variants, {result['seconds']} s, specialization: {result['specialization']})",
             f"{'kernel':<32} {'variant':<58} {'regs':>4} {'spill':>5} {'smem':>6} {'bars':>4} "
             f"{'CTA/SM':>6} {'occ':>5} {'ld B':>4} {'st B':>4}  limit"]
    for r in result["variants"]:
        if "error" in r:
            lines.append(f"{r['kernel']:<32} {r['variant']:<58} FAILED: {r['error'][:200]}")
            continue
        lines.append(f"{r['kernel']:<32} {r['variant']:<58} {r['regs']:>4} {r['spill_bytes']:>5} {r['smem']:>6} "
                     f"{r['barriers']:>4} {r['ctas_per_sm']:>6} {r['occupancy']:>5.0%} {r['widest_ld']:>4} "
                     f"{r['widest_st']:>4}  {r['limit']}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the representative subset (the test's)")
    ap.add_argument("--kernels", nargs="+", metavar="GLOB",
                    help="kernels to report, as globs on 'module.function' or 'module.function variant'")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="compiles in parallel")
    ap.add_argument("--json", dest="json_path", help="write the report here")
    ap.add_argument("--list", action="store_true", help="list the variants without compiling")
    ap.add_argument("--unaligned", action="store_true",
                    help="no launch-time specialization (odd row lengths, offset views) instead of 16-byte aligned "
                         "pointers and shape integers that are multiples of 16")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    indices = select(args.kernels, args.quick)
    if not indices:
        ap.error(f"no variant matches {args.kernels}")
    if args.list:
        for i in indices:
            print(variants()[i].kernel, variants()[i].label)
        return 0
    result = report(indices, args.jobs, aligned=not args.unaligned)
    print(table(result))
    if args.json_path:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json_path}")
    for line in result["failures"]:
        print("FAILED", line, file=sys.stderr)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "0"  # before Triton is imported: compilable kernels, not the interpreter's
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    sys.exit(main())
