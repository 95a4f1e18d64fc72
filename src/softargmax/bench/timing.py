"""How every benchmark times: interleaved medians (:func:`time_thunks`), the growth of the peak
resident memory of a fresh process (:func:`peak_growth_mb`), the device's name, and the targets
the project aims at, read from ``targets.json`` beside this module (never written in code)."""

from __future__ import annotations

import functools
import json
import os
import platform
import resource
import statistics
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

import torch

from .._utils.files import atomic_write

_F = TypeVar("_F", bound=Callable[..., Any])


def restores_threads(fn: _F) -> _F:
    """``fn`` (a benchmark that sets torch's intra-op threads for its timings) with torch's thread count put back
    as it was when it returns or raises: a benchmark called in-process (the CLI's, a notebook's) leaves the
    caller's threads alone."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = torch.get_num_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)
    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature; mypy sees a plain callable


@functools.lru_cache(maxsize=None)
def targets() -> dict[str, Any]:
    """The speed targets of ``targets.json``: ratios to the baseline that the project aims at."""
    return json.loads(resources.files(__package__).joinpath("targets.json").read_text())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_thunks(thunks: dict[str, Callable[[], object]], repeats: int, warmup: int,
                device: torch.device = torch.device("cpu")) -> dict[str, float]:
    """Median milliseconds of each zero-argument callable, interleaved within every repeat.

    Interleaving makes a slow phase of a shared machine affect every callable alike, so
    their ratios stay meaningful.
    """
    for _ in range(warmup):
        for run in thunks.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in thunks}
    for _ in range(repeats):
        for name, run in thunks.items():
            _sync(device)
            t0 = time.perf_counter()
            run()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def _runner(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, pas: str) -> Callable[[], None]:
    grad = torch.randn_like(x)

    def run() -> None:
        if pas == "fwd":
            with torch.no_grad():
                fn(x)
        else:
            xx = x.detach().requires_grad_(True)
            y = fn(xx)
            torch.autograd.grad(y, xx, grad)

    return run


def time_calls(fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, pas: str, repeats: int,
               warmup: int) -> dict[str, float]:
    """Median milliseconds of each ``fn(x)`` (``pas="fwd"``) or ``fn`` + backward (``"fwd+bwd"``)."""
    return time_thunks({name: _runner(fn, x, pas) for name, fn in fns.items()}, repeats, warmup, x.device)


def _proc_status_mb(key: str) -> Optional[float]:
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key))
    except (OSError, StopIteration):
        return None


def _reset_peak() -> bool:
    """Reset the kernel's peak resident set of this process to its current size (Linux ≥ 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")
        return True
    except OSError:
        return False


def peak_growth_mb(run: Callable[[], object]) -> float:
    """How far ``run()`` raises this process's resident memory above what it holds before the call, in MiB.

    On Linux the kernel's peak (``VmHWM``) is reset to the current resident size first
    (``/proc/self/clear_refs``) and read after the call.  Elsewhere it falls back to
    ``getrusage``'s ``ru_maxrss``, which counts from the process's start: there it is meaningful
    only in a fresh process whose setup peak is below the call's, and even then a process
    started from a large parent can inherit that parent's peak through ``exec`` (Linux does).
    :mod:`.memory` runs each case in a fresh process.
    """
    if _reset_peak():
        before = _proc_status_mb("VmRSS:")
        run()
        after = _proc_status_mb("VmHWM:")
        if before is not None and after is not None:
            return max(after - before, 0.0)
    scale = 2**20 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    run()
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale - before, 0.0)


def device_name(device: torch.device) -> str:
    """The GPU's name, or ``cpu: <processor>``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {cpu_model()}"


def cpu_model() -> str:
    """The processor's model name (Linux: from /proc/cpuinfo, where platform.processor() is empty)."""
    name = platform.processor() or platform.machine()
    if sys.platform.startswith("linux") and os.path.exists("/proc/cpuinfo"):  # platform.processor() is empty there
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    return name


def versions() -> dict[str, Any]:
    """The software a result was measured with."""
    import softargmax

    return {"torch": torch.__version__, "softargmax": softargmax.__version__, "python": sys.version.split()[0]}


def save(result: dict[str, Any], path: Union[str, Path]) -> None:
    """Write ``result`` as indented JSON, atomically (the folder is created).

    The text goes to a temporary file beside ``path`` that replaces it once complete
    (:func:`softargmax._utils.files.atomic_write`): a benchmark that saves after every case
    and is killed leaves the last complete JSON, never a truncated one.
    """
    atomic_write(path, json.dumps(result, indent=1) + "\n")


def ratio_row(c: dict[str, Any]) -> str:
    """One line of the printed table for a case of :func:`softargmax.bench.operators.run` or the losses."""
    pkg = ", ".join(f"{k} {v['ratio']:.1f}x" for k, v in c.get("entmax_pkg", {}).items())
    tgt: Optional[float] = c["target"]
    mark = "" if tgt is None else ("  ok  " if c["ratio"] <= tgt else "  OVER")
    return (
        f"{c['op']:<20} {str(tuple(c['shape'])):<14} {c['pass']:<8} {c['ms']:>9.3f} ms "
        f"{c['softmax_ms']:>8.3f} ms {c['ratio']:>7.2f}x "
        f"{'' if tgt is None else f'<= {tgt:g}x':<8}{mark} {pkg}"
    )


def header() -> str:
    """The printed table's header line."""
    return (
        f"{'op':<20} {'shape':<14} {'pass':<8} {'ours':>12} {'softmax':>11} {'ratio':>8} "
        f"{'target':<8}{'':6} entmax package"
    )
