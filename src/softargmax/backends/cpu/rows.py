r"""The fused CPU row solver: one C call per batch instead of a dozen tensor ops per Newton step.

:func:`softargmax.solvers.threshold.solve` spends most of its time on short rows in per-op
dispatch (a few microseconds for each of ~15 tensor operations per Newton step, whatever
the row length).  ``_cpu_rows.c`` solves each row in one pass over the data plus a few
passes over its shrinking candidate list, in double precision, with the rows spread over
OpenMP threads.  It covers the operators of the speed targets, with ``q = 1``:

* α-entmax for α ∈ (1, 2] with a float α or one α per row (sparsemax is α = 2, also as
  the ``"chi_square"`` divergence), except α just above 1 (α - 1 below :data:`MIN_A`);
  sparsemax and 1.5-entmax are exact (Michelot's iteration and its quadratic analogue on
  the candidates); these also with a reference measure ``q`` (:func:`covers_weights`: the
  same iteration on ``Σ_j q_j [a z_j - t]_+^{1/a} = 1``);
* the Jensen–Shannon, squared-Hellinger, reverse-KL, Jeffrey and reverse-χ² f-softargmax (the
  last three on the CPU only: :data:`~softargmax.backends.kinds.CPU_KINDS`);
* α-ReLU, elementwise, forward and backward in one pass each (:func:`alpha_relu_forward`,
  :func:`alpha_relu_backward`), with one τ or one τ per row.

It returns the same :class:`~softargmax.backends.solution.Solution` (dense candidates) as the
PyTorch path, which stays the reference and handles everything else (``q`` for the other kinds, other
generators, α > 2 or α < 1, tracing).  The tests run both paths against each other and
against the brute-force references.

**Building.**  The C file is compiled on first use with the system C compiler
(``$CC``, else ``cc``; ``-O3 -march=native -fopenmp``, with glibc's vector math library
libmvec where it links, else without) into a cache directory
(``$SOFTARGMAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/softargmax`` or
``~/.cache/softargmax``), keyed by a hash of the source, the flags and the CPU, and
loaded with :mod:`ctypes`; the first build says so on stderr (once; about a second of compiler
time).  Where Python's headers are found (``sysconfig``'s ``include`` directory), ``rows_py.c`` is
appended and the same library is also imported as a CPython extension module whose entries
(:data:`MAP_KERNELS`, :data:`JVP_KERNELS`) cost a small call about a microsecond less than the
ctypes ones (the key then includes the interpreter's ABI); without the headers the ctypes entries
are used, with the same results.  The library does not link PyTorch, so it does not depend on its
version.  If there is no compiler, or ``SOFTARGMAX_CPU_KERNELS=0`` is
set, or the build fails (a :class:`RuntimeWarning` says why, once), the PyTorch path is
used: results are the same, only slower.  OpenMP threads follow
``torch.get_num_threads()``; the library links ``libgomp.so.1`` by soname, so it shares
the OpenMP runtime PyTorch has already loaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import math
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Optional, Union

import torch
from torch import Tensor

from ..._utils.tracing import compiling as _compiling
from ...divergences import Divergence
from ..kinds import (
    CPU_KINDS,
    KIND_HELL,
    KIND_JS,
    KIND_POWER,
    alpha_rows_covered,
    cpu_parameter,
    kind_of,
    solve_alpha_rows_with,
    solve_with,
)
from ..solution import Solution
from ..switch import Switch

__all__ = ["available", "enabled", "set_enabled", "solve", "solve_alpha_rows", "probabilities", "alpha_relu_forward",
           "alpha_relu_backward", "covers_alpha_relu"]

SOURCE = Path(__file__).with_name("rows.c")
#: the C source as it was when this module was imported: the library is built from these bytes, so that the
#: function signatures below always match the code they call, even if ``rows.c`` changes on disk later (an
#: editable install updated while a long run is going; the build is lazy)
_SOURCE_AT_IMPORT: Optional[bytes] = SOURCE.read_bytes() if SOURCE.exists() else None
#: the small calls' entries as a CPython extension module, appended to ``rows.c`` where Python's headers exist
PY_SOURCE = SOURCE.with_name("rows_py.c")
_PY_SOURCE_AT_IMPORT: Optional[bytes] = PY_SOURCE.read_bytes() if PY_SOURCE.exists() else None
#: whether the build tries the CPython entries (a ctypes call costs about a microsecond more per small call)
PYTHON_ENTRIES = True
_PY_MODULE = "_sa_cpu_rows"
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fPIC", "-shared", "-fopenmp", "-std=c99"]
#: tried first: vector pow/exp from glibc's libmvec; without them if that does not link
VECTOR_MATH = ["-DSA_VECTOR_MATH", "-lmvec"]
#: below this many elements one thread does the whole batch (thread start-up costs more)
PARALLEL_MIN_ELEMENTS = 1 << 15

_lock = threading.Lock()
_loaded: list[Union[ctypes.CDLL, Literal[False]]] = []  # once tried: [the library] or [False] (unavailable)
_switch = SWITCH = Switch("SOFTARGMAX_CPU_KERNELS")  # SWITCH: read by the small calls (softargmax.operators._small)
#: the small calls' entry ``sa_map_*`` by dtype (:func:`map_kernel`, which also reads :data:`SWITCH`), filled
#: when the library loads
MAP_KERNELS: dict[torch.dtype, Any] = {}
#: the backward's entry ``sa_jvp_*`` by dtype (:func:`jvp`; ``fn(s, v, sc, g, R, k, scale, threads)``, pointers as
#: ``data_ptr()`` integers), filled when the library loads
JVP_KERNELS: dict[torch.dtype, Any] = {}
#: α-ReLU's entries ``(sa_relu_fwd_*, sa_relu_bwd_*)`` by dtype (:func:`alpha_relu_forward`,
#: :func:`alpha_relu_backward`), filled when the library loads
RELU_KERNELS: dict[torch.dtype, tuple[Any, Any]] = {}
#: the class-index loss's entries ``(sa_weights_ok_*, sa_scale_rows_*)`` by dtype (:func:`weights_ok`,
#: :func:`scale_rows`), filled when the library loads
INDEX_KERNELS: dict[torch.dtype, tuple[Any, Any]] = {}


def _cache_dir() -> Path:
    if os.environ.get("SOFTARGMAX_CACHE_DIR"):
        return Path(os.environ["SOFTARGMAX_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "softargmax"


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    info = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("model name", "flags")):
                    info += line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return platform.machine() + platform.processor() + info


def _python_include() -> Optional[str]:
    """The directory of ``Python.h`` when the CPython entries are to be built (:data:`PYTHON_ENTRIES`), else ``None``."""
    if not PYTHON_ENTRIES or _PY_SOURCE_AT_IMPORT is None:
        return None
    include = sysconfig.get_paths().get("include")
    return include if include and os.path.exists(os.path.join(include, "Python.h")) else None


def _build() -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler found (set $CC)")
    source = _SOURCE_AT_IMPORT
    if source is None:
        raise RuntimeError(f"{SOURCE} is missing")
    include = _python_include()
    attempts = [(False, VECTOR_MATH), (False, [])]
    key_text = " ".join([cc] + FLAGS + VECTOR_MATH).encode() + _cpu_signature().encode()
    if include is not None:  # tried first; the library is then tied to this interpreter's ABI
        assert _PY_SOURCE_AT_IMPORT is not None  # _python_include() checked it
        attempts = [(True, VECTOR_MATH), (True, [])] + attempts
        key_text += (_PY_SOURCE_AT_IMPORT + (sysconfig.get_config_var("SOABI") or sys.version).encode()
                     + include.encode())
    key = hashlib.sha256(source + key_text)
    target = _cache_dir() / f"cpu_rows-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    sources = []
    for with_python in sorted({a[0] for a in attempts}):
        src_fd, src = tempfile.mkstemp(suffix=".c", dir=target.parent)
        with os.fdopen(src_fd, "wb") as f:  # compiled from the bytes that were hashed, never from a file changed since
            if with_python:
                assert _PY_SOURCE_AT_IMPORT is not None
                f.write(b"#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n" + source + b"\n" + _PY_SOURCE_AT_IMPORT)
            else:
                f.write(source)
        sources.append((with_python, src))
    paths = dict(sources)
    sys.stderr.write(f"softargmax: compiling the CPU row solver (once, a few seconds) into {target}\n")
    try:
        for with_python, extra in attempts:
            py_flags = ["-I", include, "-DSA_PYTHON"] if with_python and include is not None else []
            proc = subprocess.run([cc, *FLAGS, *py_flags, "-o", tmp, paths[with_python], *extra, "-lm"],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                break
        else:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: concurrent builders agree on the result
    finally:
        for path in [tmp, *paths.values()]:
            if os.path.exists(path):
                os.unlink(path)
    return target


def _python_entries(path: Path, lib: ctypes.CDLL) -> Optional[ModuleType]:
    """The library ``lib`` at ``path`` imported as the CPython extension module of ``rows_py.c``, or ``None`` (built without)."""
    if not hasattr(lib, "PyInit_" + _PY_MODULE):
        return None
    loader = importlib.machinery.ExtensionFileLoader(_PY_MODULE, str(path))
    spec = importlib.util.spec_from_file_location(_PY_MODULE, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _load() -> Union[ctypes.CDLL, Literal[False]]:
    if _loaded:  # built and opened once: no lock on every call
        return _loaded[0]
    with _lock:
        if not _loaded:
            _loaded.append(_open())
    return _loaded[0]


def _open() -> Union[ctypes.CDLL, Literal[False]]:
    """The built library with its functions' signatures, or ``False`` (with a warning) if it cannot be built."""
    try:
        path = _build()
        lib = ctypes.CDLL(str(path))
        for name in ("sa_solve_f32", "sa_solve_f64"):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_void_p,
                           ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                           ctypes.c_void_p, ctypes.c_double, ctypes.c_double]
        for dtype, name in ((torch.float32, "sa_map_f32"), (torch.float64, "sa_map_f64")):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_double,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            MAP_KERNELS[dtype] = fn
        for dtype, name in ((torch.float32, "sa_jvp_f32"), (torch.float64, "sa_jvp_f64")):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                           ctypes.c_long, ctypes.c_double, ctypes.c_int]
            JVP_KERNELS[dtype] = fn
        _relu_signatures(lib)
        _index_signatures(lib)
        module = _python_entries(path, lib)
        if module is not None:  # the same functions without ctypes's cost per call
            MAP_KERNELS.update({torch.float32: module.map_f32, torch.float64: module.map_f64})
            JVP_KERNELS.update({torch.float32: module.jvp_f32, torch.float64: module.jvp_f64})
            RELU_KERNELS.update({torch.float32: (module.relu_fwd_f32, module.relu_bwd_f32),
                                 torch.float64: (module.relu_fwd_f64, module.relu_bwd_f64),
                                 torch.bfloat16: (module.relu_fwd_bf16, module.relu_bwd_bf16)})
            INDEX_KERNELS.update({torch.float32: (module.weights_ok_f32, module.scale_rows_f32),
                                  torch.float64: (module.weights_ok_f64, module.scale_rows_f64)})
        return lib
    except Exception as err:  # no compiler, no OpenMP, read-only cache...: fall back
        warnings.warn(f"softargmax: the fused CPU row solver is unavailable ({err}); "
                      "using the PyTorch path (same results, slower)", RuntimeWarning, stacklevel=4)
        return False


def available() -> bool:
    """Whether the C library is built and loadable (builds it on first call)."""
    return bool(_load())


def enabled() -> bool:
    """Whether CPU tensors take the fused path (when it covers the operator)."""
    return _switch.on


def set_enabled(flag: bool) -> bool:
    """Turn the fused path on or off (e.g. to compare with the PyTorch path); returns the old setting."""
    return _switch.set(flag)


def _usable(z: Tensor) -> bool:
    return (_switch.on and z.device.type == "cpu" and z.dtype in (torch.float32, torch.float64)
            and z.dim() == 2 and z.is_contiguous() and z.shape[1] < 2**31 and bool(_load()))


def map_kernel(dtype: torch.dtype) -> Any:
    """The C entry ``sa_map_*`` for rows of ``dtype`` (a ctypes function), or ``None``: the fused path is
    switched off, the library is not loaded yet (:func:`available` loads it) or could not be built, or
    the dtype is not float32/float64.

    ``fn(z, R, k, kind, a, p, s, sc, threads)`` (pointers as ``data_ptr()`` integers, ``s`` and ``sc``
    ``None`` or ``[R, k]`` and ``[R, 1]``) solves the contiguous rows of ``z`` for ``kind`` and one
    exponent ``a`` (:func:`~softargmax.backends.kinds.kind_of` with :data:`~softargmax.backends.kinds.CPU_KINDS`, ``1.0`` for the dense kinds), writes the
    output ``p`` (NaN in rows with NaN or ``+inf``) and, unless ``None``, the Jacobian weights ``s`` and
    ``sc`` = their row sums clamped below at ``torch.finfo(dtype).tiny``, as :func:`solve` writes them;
    it returns ``2 · iterations + (some row has NaN or +inf)``, negative if out of memory.  The caller
    checks what :func:`covers` and :func:`covers_divergence` check (``threads``: :func:`threads_for`)."""
    return MAP_KERNELS.get(dtype) if _switch.on else None


def jvp(s: Tensor, v: Tensor, sc: Tensor, scale: float = 1.0, threads: int = 1) -> Tensor:
    r"""The backward of a normalized mapping, :math:`\mathrm{scale} \cdot s \odot (v - \langle s, v\rangle / \mathrm{sc})`
    per row, in one pass of the C library (sums and products in double), as a new ``[R, k]`` tensor.

    ``s`` (the Jacobian weights) and ``v`` (the incoming gradient): ``[R, k]``, contiguous, of one dtype
    (float32 or float64); ``sc``: ``[R, 1]`` (or ``[R]``), contiguous, the rows' :math:`\sum_j s_j`
    clamped below at ``torch.finfo(dtype).tiny`` (0 for an all-``-inf`` row would divide 0 by 0), NaN in
    rows whose gradient is NaN (NaN or ``+inf`` in the scores), as :func:`map_kernel` writes it.  The
    library is loaded (the caller solved the rows with it)."""
    R, k = s.shape
    g = torch.empty_like(s)
    JVP_KERNELS[s.dtype](s.data_ptr(), v.data_ptr(), sc.data_ptr(), g.data_ptr(), R, k, scale, threads)
    return g


def threads_for(R: int, k: int) -> int:
    """The OpenMP threads the C solver uses for ``R`` rows of ``k``: one below :data:`PARALLEL_MIN_ELEMENTS`."""
    return 1 if R * k < PARALLEL_MIN_ELEMENTS else max(1, min(torch.get_num_threads(), R))


def covers(z: Tensor) -> bool:
    """Whether the C solver takes rows ``z`` (device, dtype, layout, and the library loads)."""
    return _usable(z)


#: rows with ``a = α - 1`` below this (per input dtype) go to the PyTorch solver.  The C
#: iteration forms the base ``d_j - t`` of ``p_j = (d_j - t)^{1/a}`` in double; the base is
#: within ``a`` of 1, so its rounding ``ε₆₄`` becomes a relative error ``ε₆₄/a`` in ``p`` (and in
#: ``s``): 2e-7 at α = 1 + 1e-9, 0.1 (rows summing to 1.29) at the float next to 1.  The PyTorch
#: solver takes ``log1p`` of the base, exact as α → 1.  At the cut-off the C path's extra error
#: is ``ε₆₄/a`` = 2.2e-10 for float32 rows (0.004 of float32's rounding) and 2.2e-12 for
#: float64 rows (within the documented 1e-9); ordinary α (α - 1 >= 1e-4) keep the C path.
MIN_A = {torch.float32: 1e-6, torch.float64: 1e-4}


def covers_divergence(z: Tensor, div: Divergence) -> bool:
    """Whether the operator of ``div`` is covered for rows ``z``: a fused kind, and not
    α - 1 < :data:`MIN_A` (the PyTorch solver keeps full precision there)."""
    kind, a = kind_of(div, CPU_KINDS)
    return kind is not None and not (a is not None and a < MIN_A.get(z.dtype, 1.0))


def covers_alpha_rows(z: Tensor, alpha2d: Tensor) -> bool:
    """Whether one α per row ``alpha2d`` is covered (every α in (1, 2] with α - 1 >= :data:`MIN_A`)."""
    if not alpha_rows_covered(z, alpha2d, torch.float64):
        return False
    a = alpha2d.detach().reshape(-1).to(torch.float64) - 1  # what the C solver reads
    return not bool((a < MIN_A.get(z.dtype, 1.0)).any())


def _call(z: Tensor, kind: int, a: Tensor, a_stride: int, p: Tensor, s: Optional[Tensor], tau: Optional[Tensor],
          ssum: Optional[Tensor], status: Optional[Tensor], offset: Optional[float],
          sums: Optional[Tensor] = None, omega: tuple[float, float] = (0.0, 1.0), q: Optional[Tensor] = None) -> int:
    """One call of the C solver on the rows of ``z``, writing ``p`` (and ``s``, ``tau``, ``ssum``, ``status``
    unless ``None``); with an ``offset`` (the power kind) ``τ_f = (t + offset)/a`` in ``z``'s dtype.
    ``sums`` (float64 ``[R, 2]``, or ``None``): for the power kind per row ``⟨z, p⟩`` and
    ``omega[1] · Σ_j p_j ((p_j/q_j)^a - omega[0])`` over the support; for :data:`CONJUGATE_KINDS` ``Ω*(z)`` and 0.
    ``q``: the power kind's reference measure, ``[R, k]`` or ``[1, k]``, contiguous, of ``z``'s dtype (``None``: 1).
    Returns the C function's value (``2 · iterations + some row bad``)."""
    R, k = z.shape
    threads = threads_for(R, k)
    lib = _load()
    assert lib  # _usable() loaded it
    fn = lib.sa_solve_f32 if z.dtype == torch.float32 else lib.sa_solve_f64
    q_stride = 0 if q is None or q.shape[0] == 1 else k
    ret: int = fn(z.data_ptr(), R, k, kind, a.data_ptr(), a_stride, None if q is None else q.data_ptr(), q_stride,
             p.data_ptr(),
             None if s is None else s.data_ptr(), None if tau is None else tau.data_ptr(),
             None if ssum is None else ssum.data_ptr(), None if status is None else status.data_ptr(),
             threads, offset is not None, 0.0 if offset is None else offset,
             None if sums is None else sums.data_ptr(), omega[0], omega[1])
    if ret < 0:
        raise MemoryError("softargmax: the CPU row solver could not allocate its row buffers")
    return ret


def _run(z: Tensor, kind: int, a: Tensor, a_stride: int, offset: Optional[float] = None,
         omega: Optional[tuple[float, float]] = None, conjugate: bool = False, q: Optional[Tensor] = None) -> Solution:
    """Solve the rows of ``z`` (:func:`~softargmax.backends.kinds.solve_with`'s ``run``).  With an
    ``offset`` (the power kind) the C code writes ``τ_f = (t + offset)/a`` in ``z``'s dtype.  With
    ``omega`` (the power kind) it also writes the loss values' row sums, ``zp`` and ``omega``
    (:func:`omega_constants`); with ``conjugate`` (:data:`CONJUGATE_KINDS`) the rows' ``Ω*(z)``,
    ``omega_star``.  ``q``: the power kind's reference measure, as :func:`_call` takes it."""
    R = z.shape[0]
    wants = (omega is not None and kind == KIND_POWER) or (conjugate and kind in CONJUGATE_KINDS)
    sums = torch.empty(R, 2, dtype=torch.float64) if wants else None
    p = torch.empty_like(z)
    s = torch.empty_like(z)
    tau = torch.empty(R, 1, dtype=z.dtype)
    ssum = torch.empty(R, 1, dtype=z.dtype)
    status = torch.empty(R, dtype=torch.int8)
    ret = _call(z, kind, a, a_stride, p, s, tau, ssum, status, offset, sums, omega or (0.0, 1.0), q)
    # the low bit: some row has NaN or +inf (status 2), so no reduction over status is needed
    bad = (status == 2).unsqueeze(1) if ret & 1 else None

    def jvp_kernel(v: Tensor, scale: float) -> Tensor:  # Solution.jvp: one C pass, as the small calls' backward
        sc = ssum.clamp_min(torch.finfo(ssum.dtype).tiny)
        if bad is not None:
            sc = sc.masked_fill(bad, math.nan)
        return jvp(s, v.contiguous(), sc, scale, threads_for(R, z.shape[1]))

    return Solution(tau=tau, p=p, s=s, s_sum=ssum, block_index=None, k=z.shape[1], bad_rows=bad,
                    iterations=ret >> 1, backend="cpu", nan_written=True,  # the C code writes NaN into p in bad rows
                    zp=None if sums is None or kind != KIND_POWER else sums[:, 0],
                    omega=None if sums is None or kind != KIND_POWER else sums[:, 1],
                    omega_star=None if sums is None or kind == KIND_POWER else sums[:, 0], jvp_kernel=jvp_kernel)


def probabilities(z: Tensor, div: Divergence, q: Optional[Tensor] = None) -> Tensor:
    """``solve(z, div, q=q).dense_p()`` alone: the C solver writes ``p`` (NaN in rows with NaN or
    ``+inf``) and no Jacobian weights, thresholds or statuses, for callers that need no
    gradient.  The caller has checked that the operator is covered (:func:`softargmax.backends.select`)."""
    kind, a = kind_of(div, CPU_KINDS)
    assert kind is not None  # covered (the caller asked select())
    p = torch.empty_like(z)
    _call(z, kind, cpu_parameter(1.0 if a is None else a), 0, p, None, None, None, None, None,
          q=None if q is None else weights_for(z, q))
    return p


def covers_weights(z: Tensor, div: Divergence, q: Tensor) -> bool:
    """Whether the C solver takes rows ``z`` with the reference measure ``q`` (``[R|1, k]``): the power kind
    (α-entmax and the α-divergence with α ∈ (1, 2], sparsemax and χ²), ``q`` on the CPU and not traced
    (the caller has checked that it is positive and finite)."""
    return (kind_of(div, CPU_KINDS)[0] == KIND_POWER and q.device.type == "cpu" and q.dim() == 2
            and q.shape[-1] == z.shape[-1] and q.shape[0] in (1, z.shape[0]) and not _compiling())


def weights_for(z: Tensor, q: Tensor) -> Tensor:
    """``q`` as the C solver reads it: contiguous ``[R|1, k]`` in ``z``'s dtype."""
    return q.detach().to(z.dtype).contiguous()


def omega_constants(div: Divergence) -> Optional[tuple[float, float]]:
    r"""``(c, scale)`` with :math:`\sum_j [f(p_j) - f(0)] = \mathrm{scale} \cdot \sum_j p_j (p_j^a - c)` over the
    support, for the power kind (``None`` for the others): :math:`p_j^a = y_j - t` is the solver's own base,
    so the sum costs one pass over the support.  The α-divergence, :math:`f(u) = (u^\alpha - 1 - \alpha(u - 1))
    / (\alpha(\alpha - 1))`: :math:`f(p) - f(0) = (p^\alpha - \alpha p)/(\alpha(\alpha - 1))`, so ``c = α`` and
    ``scale = 1/(α(α - 1))``; χ² (:math:`f(p) - f(0) = p^2/2`, ``a = 1``): ``c = 0`` and ``scale = 1/2``
    (the constants of the GPU kernels)."""
    kind, a = kind_of(div, CPU_KINDS)
    if kind != KIND_POWER or a is None:
        return None
    if div.hints.power_offset == 0.0:  # g(v) = [v]_+ (chi-square)
        return 0.0, 0.5
    return a + 1.0, 1.0 / ((a + 1.0) * a)


#: the kinds whose loss values the C solver gives as the conjugate ``Ω*(z)`` of each row (``Solution.omega_star``),
#: summed in double after the last pass: Jensen–Shannon and squared Hellinger
CONJUGATE_KINDS = frozenset({KIND_JS, KIND_HELL})


def computes_row_sums(div: Divergence) -> bool:
    """Whether the C solver gives the Fenchel–Young loss values' row sums of ``div`` with ``p`` (``solve(...,
    row_sums=True)``): ``zp`` and ``omega`` of the power kind (:func:`omega_constants`), or ``omega_star``
    of :data:`CONJUGATE_KINDS`."""
    return omega_constants(div) is not None or kind_of(div, CPU_KINDS)[0] in CONJUGATE_KINDS


def solve(z: Tensor, div: Divergence, row_sums: bool = True, q: Optional[Tensor] = None) -> Optional[Solution]:
    r"""The :class:`~softargmax.backends.solution.Solution` of ``z`` ``[R, k]``, or ``None`` if not covered.

    ``row_sums``: also the Fenchel–Young loss values' row sums (:func:`computes_row_sums`): for the power
    kind (α-entmax) ``zp`` and ``omega``, from the pass that writes ``p``; for Jensen–Shannon and squared
    Hellinger the conjugate ``omega_star`` (the other dense kinds leave them to
    :class:`~softargmax.backends.solution.Solution`, which computes them from ``p``).  ``q``: the
    reference measure ``[R|1, k]`` (``None``: 1), for the power kind only (:func:`covers_weights`); the
    row sums then hold :math:`\sum_j q_j [f(p_j/q_j) - f(0)]`."""
    if not (_usable(z) and covers_divergence(z, div)):
        return None
    omega = omega_constants(div) if row_sums else None
    if q is not None:
        if not covers_weights(z, div, q):
            return None
        run = functools.partial(_run, omega=omega, q=weights_for(z, q))
        return solve_with(run, z, div, converts_tau=True, kinds=CPU_KINDS)
    if omega is not None:
        return solve_with(functools.partial(_run, omega=omega), z, div, converts_tau=True, kinds=CPU_KINDS)
    if row_sums and kind_of(div, CPU_KINDS)[0] in CONJUGATE_KINDS:
        return solve_with(functools.partial(_run, conjugate=True), z, div, converts_tau=True, kinds=CPU_KINDS)
    return solve_with(_run, z, div, converts_tau=True, kinds=CPU_KINDS)


def solve_alpha_rows(z: Tensor, alpha2d: Tensor, checked: bool = False) -> Optional[Solution]:
    """α-entmax with one α per row (``alpha2d`` ``[R, 1]``), or ``None`` if some α is outside (1, 2]
    (``checked``: :func:`covers_alpha_rows` already said yes)."""
    if not _usable(z):
        return None
    if not checked and not covers_alpha_rows(z, alpha2d):
        return None
    return solve_alpha_rows_with(_run, z, alpha2d, checked=True, converts_tau=True)


#: the reductions of :func:`index_loss`, as the C function numbers them
INDEX_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}
_index_loss_fns: dict[torch.dtype, Any] = {}  # the ctypes functions


def _index_loss_fn(dtype: torch.dtype) -> Any:
    """``sa_index_loss_f32`` or ``_f64`` with its signature (set once)."""
    fn = _index_loss_fns.get(dtype)
    if fn is None:
        lib = _load()
        assert lib  # covers() loaded it
        fn = lib.sa_index_loss_f32 if dtype == torch.float32 else lib.sa_index_loss_f64
        real = ctypes.c_float if dtype == torch.float32 else ctypes.c_double
        fn.restype = ctypes.c_long
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_double, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_double, ctypes.c_double, real, ctypes.c_double, ctypes.c_double,
                       real, real, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        _index_loss_fns[dtype] = fn
    return fn


def _index_signatures(lib: ctypes.CDLL) -> None:
    """The ctypes signatures of ``sa_weights_ok_*`` and ``sa_scale_rows_*``, into :data:`INDEX_KERNELS`."""
    ptr = ctypes.c_void_p
    for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
        ok, scale = getattr(lib, "sa_weights_ok_" + suffix), getattr(lib, "sa_scale_rows_" + suffix)
        ok.restype, scale.restype = ctypes.c_int, None
        ok.argtypes = [ptr, ctypes.c_long]
        scale.argtypes = [ptr, ptr, ctypes.c_long, ctypes.c_long, ptr, ctypes.c_double, ctypes.c_int]
        INDEX_KERNELS[dtype] = (ok, scale)


def weights_ok(w: Tensor) -> bool:
    """Whether the class weights ``w`` (``[k]``, contiguous, float32 or float64) are all finite and non-negative,
    in one C pass (the library is loaded: :func:`covers`)."""
    return bool(INDEX_KERNELS[w.dtype][0](w.data_ptr(), w.shape[0]))


def scale_rows(G: Tensor, factor: float, wrow: Optional[Tensor] = None, in_place: bool = True) -> Tensor:
    """``G`` ``[..., k]`` (contiguous, float32 or float64) times ``s_r`` per row in one C pass, with
    ``s_r = (factor · wrow[r])`` rounded to ``G``'s dtype (``factor`` rounded first), or ``factor`` rounded where
    ``wrow`` (``[rows]``, contiguous, ``G``'s dtype) is ``None``: the products a 0-d factor's and then the row
    weights' multiplications would give, bit for bit.  In place unless ``in_place`` is false (then a new tensor)."""
    k = G.shape[-1]
    n = G.numel()
    rows = n // k if k else 0
    out = G if in_place else torch.empty_like(G)
    INDEX_KERNELS[G.dtype][1](G.data_ptr(), out.data_ptr(), rows, k, None if wrow is None else wrow.data_ptr(),
                              factor, threads_for(rows, k))
    return out


def index_loss(z: Tensor, rows: int, kind: int, a: float, omega: tuple[float, float], cy: float, target: Tensor,
               ignore_index: int, reduction: str, smoothing: Optional[tuple[float, float, float]] = None,
               weight: Optional[Tensor] = None) -> tuple[int, Tensor, Tensor, Optional[Tensor], float]:
    r"""The Fenchel–Young loss of a kind of :data:`~softargmax.backends.kinds.CPU_KINDS` against class indices,
    in one C call.

    ``z``: the scores, contiguous, the classes last, ``rows`` rows; ``target``: int64 ``[rows]``,
    contiguous; ``kind`` and ``a`` (``a = α - 1`` of the power kind, 1 for the others): as
    :func:`~softargmax.backends.kinds.kind_of` gives them; ``omega``: :func:`omega_constants` (the power
    kind; ``(0, 1)`` for the others); ``cy``: :math:`\Omega(y)` less its :math:`k f(0)` terms
    (:math:`f(1) - f(0)` for a one-hot target), rounded to ``z``'s dtype by the caller for the power kind
    (its value is formed in that dtype), in float64 for :data:`CONJUGATE_KINDS` (their value is formed in
    double from the conjugate and rounded once); the kinds with :math:`f(0) = +\infty` give ``+inf``, or 0
    where the target is the row's one unmasked class.  ``smoothing``: ``(ε, ε/k, 1 - ε + ε/k)`` of label
    smoothing (the target ``(1 - ε) e_c + ε/k``; not for :math:`f(0) = +\infty`), or ``None``; ``weight``:
    per-class weights ``[k]`` (contiguous, ``z``'s dtype) that multiply each row's loss, the mean then
    divided by the kept rows' weights, or ``None``.  Returns ``(kept rows, G = p - y`` of ``z``'s shape, the
    loss, the rows' weights ``[rows]`` (0 where ignored; ``None`` without ``weight``), the mean's
    denominator``)``: the loss is reduced (0-d) for ``"sum"`` and ``"mean"``, per row (``z``'s shape without
    the last dimension) for ``"none"``.  Raises ``IndexError`` with the row of the first class index
    outside ``[0, k)`` (nothing computed)."""
    k = z.shape[-1]
    G = torch.empty_like(z)
    none = reduction == "none"
    loss = z.new_empty(z.shape[:-1] if none else ())
    wrow = None if weight is None else z.new_empty(rows)
    den = ctypes.c_double(0.0)
    eps, ys, yc = (0.0, 0.0, 1.0) if smoothing is None else smoothing
    threads = threads_for(rows, k)
    ptr = loss.data_ptr()
    kept: int = _index_loss_fn(z.dtype)(
        z.data_ptr(), rows, k, kind, a, target.data_ptr(), ignore_index, omega[0], omega[1], cy, cy, eps, ys, yc,
        None if weight is None else weight.data_ptr(), None if wrow is None else wrow.data_ptr(), G.data_ptr(),
        ptr if none else None, None if none else ptr, ctypes.byref(den), INDEX_REDUCTIONS[reduction], threads)
    if kept < -1:
        raise IndexError(-2 - kept)
    if kept < 0:
        raise MemoryError("softargmax: the CPU row solver could not allocate its row buffers")
    return kept, G, loss, wrow, den.value


# -- α-ReLU (elementwise) -------------------------------------------------------------------------------


def _relu_signatures(lib: ctypes.CDLL) -> None:
    """The ctypes signatures of ``sa_relu_fwd_*`` and ``sa_relu_bwd_*``, into :data:`RELU_KERNELS`."""
    ptr, long_, double = ctypes.c_void_p, ctypes.c_long, ctypes.c_double
    for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64"), (torch.bfloat16, "bf16")):
        fwd, bwd = getattr(lib, "sa_relu_fwd_" + suffix), getattr(lib, "sa_relu_bwd_" + suffix)
        fwd.restype = bwd.restype = None
        fwd.argtypes = [ptr, long_, long_, double, double, ptr, ptr, ctypes.c_int]
        bwd.argtypes = [ptr, ptr, long_, long_, long_, double, double, ptr, ptr, ptr, ctypes.c_int]
        RELU_KERNELS[dtype] = (fwd, bwd)


_RELU_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _relu_taus(x: Tensor, tau: Union[float, Tensor]) -> Optional[tuple[float, Optional[Tensor]]]:
    """α-ReLU's τ as the C entries read it: ``(τ, None)`` for one τ (a float, or a tensor of one element),
    ``(0.0, τ per row)`` for a tensor of one τ per row of ``x`` (``x``'s shape with a last dimension of 1, or
    that shape less leading dimensions of 1: ``[R]``, contiguous, ``x``'s compute dtype, float32 for
    bfloat16), ``None`` for the other shapes (a τ per column...)."""
    if not isinstance(tau, Tensor):
        return tau, None
    n = tau.numel()
    if n == 1:
        return float(tau), None
    k = x.shape[-1]
    if tau.dim() == 0 or tau.shape[-1] != 1 or n * k != x.numel() or tau.device != x.device:
        return None
    return 0.0, tau.detach().reshape(n).to(torch.float32 if x.dtype == torch.bfloat16 else x.dtype).contiguous()


def covers_alpha_relu(x: Tensor, alpha: float, tau: Union[float, Tensor] = 0.0) -> bool:
    """Whether the C α-ReLU takes ``x`` (the fused path on, float32, float64 or bfloat16 (computed in float32),
    contiguous, not empty, a plain tensor, not while ``torch.compile`` traces, the library loads) with this τ
    (:func:`_relu_taus`: one τ, or one per row); any α > 1."""
    return (_switch.on and (type(x) is Tensor or type(x) is torch.nn.Parameter) and x.device.type == "cpu"
            and x.dtype in _RELU_DTYPES and x.dim() > 0 and x.numel() > 0 and x.is_contiguous()
            and (not isinstance(tau, Tensor) or (type(tau) in (Tensor, torch.nn.Parameter)
                                                 and (tau.numel() == 1 or tau.shape[-1:] == (1,))))
            and not _compiling() and bool(_load()))


#: the entries of one thread's block in the C α-ReLU with one τ (``RELU_BLOCK`` in ``rows.c``)
RELU_BLOCK = 4096


def _relu_threads(R: int, k: int, per_row: bool) -> int:
    """The OpenMP threads of the C α-ReLU: :func:`threads_for` with one τ per row (at most one per row), else at
    most one per block of :data:`RELU_BLOCK` entries."""
    n = R * k
    if per_row or n < PARALLEL_MIN_ELEMENTS:
        return threads_for(R, k)
    return max(1, min(torch.get_num_threads(), -(-n // RELU_BLOCK)))


def alpha_relu_forward(x: Tensor, alpha: float, tau: Union[float, Tensor]) -> Optional[Tensor]:
    r"""α-ReLU :math:`[(\alpha-1) x - \tau]_+^{1/(\alpha-1)}` of a covered ``x`` (:func:`covers_alpha_relu`)
    in one C pass, a new tensor of ``x``'s shape and dtype, or ``None`` for a τ the C entry does not take
    (:func:`_relu_taus`).  The roundings are the PyTorch path's (module ``softargmax.operators.alpha_relu``):
    bit for bit at α = 2, 1.5 and 3, within a rounding of the power elsewhere (float64: about an ulp, the
    vector ``pow``; float32 and bfloat16: ``exp(e log t)`` in double, rounded once)."""
    taus = _relu_taus(x, tau)
    if taus is None:
        return None
    k = x.shape[-1]
    n = x.numel()
    p = torch.empty_like(x)
    t = taus[1]
    RELU_KERNELS[x.dtype][0](x.data_ptr(), n // k, k, alpha - 1.0, taus[0], None if t is None else t.data_ptr(),
                             p.data_ptr(), _relu_threads(n // k, k, t is not None))
    return p


def alpha_relu_backward(x: Tensor, grad: Tensor, alpha: float, tau: Union[float, Tensor],
                        tau_grad: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    r"""The pair of :func:`alpha_relu_forward`: ``(∂L/∂x, ∂L/∂τ or None)`` with
    :math:`\partial L/\partial x = g\,[(\alpha-1)x - \tau]_+^{1/(\alpha-1) - 1}` (in ``x``'s dtype, one C pass
    that recomputes the base from ``x``) and, with ``tau_grad`` and a tensor τ,
    :math:`\partial L/\partial \tau = -\sum \partial L/\partial x / (\alpha - 1)` over the entries each τ
    covers (summed in double, ``τ``'s shape and dtype; one τ: the blocks' sums added in block order, the same
    bits for any thread count)."""
    taus = _relu_taus(x, tau)
    assert taus is not None  # the forward took it
    k = x.shape[-1]
    n = x.numel()
    R = n // k
    v = grad if grad.dtype == x.dtype else grad.to(x.dtype)
    gs = 1  # the C pass reads v contiguous, or one value for all entries (an expanded scalar: a sum's gradient)
    if not v.is_contiguous():
        if not any(v.stride()):
            gs = 0
        else:
            v = v.contiguous()
    gx = torch.empty_like(x)
    t = taus[1]
    want = tau_grad and isinstance(tau, Tensor)
    sums = torch.empty(R if t is not None else 1, dtype=torch.float64) if want else None
    RELU_KERNELS[x.dtype][1](x.data_ptr(), v.data_ptr(), gs, R, k, alpha - 1.0, taus[0],
                             None if t is None else t.data_ptr(), gx.data_ptr(),
                             None if sums is None else sums.data_ptr(), _relu_threads(R, k, t is not None))
    if sums is None:
        return gx, None
    assert isinstance(tau, Tensor)
    return gx, sums.mul_(-1.0 / (alpha - 1.0)).to(tau.dtype).reshape(tau.shape)
