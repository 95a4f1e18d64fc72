"""Operator benchmarks: forward and forward+backward time against ``torch.softmax`` in one run.

Used by ``softargmax bench`` and ``benchmarks/``.  Every case is timed as the
median of ``repeats`` calls after ``warmup`` calls, inputs ``randn * 3``; the
reference ``entmax`` package is timed beside ours when it is installed.  The JSON
written is::

    {"device": ..., "torch": ..., "threads": ..., "cases": [
        {"op": ..., "shape": [rows, cols], "dtype": ..., "pass": "fwd" | "fwd+bwd",
         "ms": ..., "softmax_ms": ..., "ratio": ..., "target": ..., "entmax_pkg": {...}}]}

``target`` is the ratio the project aims at (issue "core operators"); ``null`` where none is set.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Optional

import torch

import softargmax as sa

LONG = [(64, 32000), (16, 128000)]
SHORT = [(256, 1000), (2048, 64), (8192, 512)]
FULL_SHAPES = LONG + SHORT
QUICK_SHAPES = [(8, 2000), (64, 64)]


def _ours() -> dict[str, Callable]:
    return {
        "sparsemax": sa.sparsemax,
        "entmax15": sa.entmax15,
        "entmax_a1.3": lambda x: sa.entmax(x, 1.3),
        "entmax_a1.7": lambda x: sa.entmax(x, 1.7),
        "f_alpha1.5": lambda x: sa.f_softargmax(x, "alpha", alpha=1.5),
        "f_jensen_shannon": lambda x: sa.f_softargmax(x, "jensen_shannon"),
        "f_squared_hellinger": lambda x: sa.f_softargmax(x, "squared_hellinger"),
        "alpha_relu": lambda x: sa.alpha_relu(x, 1.5, 0.0),
    }


def _package() -> dict[str, dict[str, Callable]]:
    """The reference ``entmax`` package's counterparts (full sort, k=100 partial sort, bisection)."""
    try:
        import entmax as E
    except ImportError:
        return {}
    return {
        "sparsemax": {"sort": E.sparsemax, "topk100": lambda x: E.sparsemax(x, -1, 100)},
        "entmax15": {"sort": E.entmax15, "topk100": lambda x: E.entmax15(x, -1, 100)},
        "entmax_a1.3": {"bisect": lambda x: E.entmax_bisect(x, 1.3)},
        "entmax_a1.7": {"bisect": lambda x: E.entmax_bisect(x, 1.7)},
        "f_alpha1.5": {"bisect": lambda x: E.entmax_bisect(x, 1.5)},
    }


def target_ratio(op: str, shape, pas: str) -> Optional[float]:
    """The forward+backward ratio to ``torch.softmax`` aimed at, or ``None``."""
    if pas != "fwd+bwd":
        return None
    if op in ("sparsemax", "entmax15"):
        return 3.0 if tuple(shape) in LONG else 4.0 if tuple(shape) in SHORT else None
    if op in ("entmax_a1.3", "entmax_a1.7", "f_alpha1.5", "f_jensen_shannon", "f_squared_hellinger"):
        return 8.0 if tuple(shape) in FULL_SHAPES else None
    if op == "alpha_relu":
        return 1.5 if tuple(shape) in FULL_SHAPES else None
    return None


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _runner(fn: Callable, x: torch.Tensor, pas: str) -> Callable[[], None]:
    grad = torch.randn_like(x)

    def run():
        if pas == "fwd":
            with torch.no_grad():
                fn(x)
        else:
            xx = x.detach().requires_grad_(True)
            y = fn(xx)
            torch.autograd.grad(y, xx, grad)

    return run


def time_calls(fns: dict, x: torch.Tensor, pas: str, repeats: int, warmup: int) -> dict:
    """Median milliseconds of each ``fn(x)`` (``pas="fwd"``) or ``fn`` + backward (``"fwd+bwd"``).

    The functions are interleaved within every repeat, so that a slow phase of a shared
    machine affects them alike and their ratios stay meaningful.
    """
    runs = {name: _runner(fn, x, pas) for name, fn in fns.items()}
    for _ in range(warmup):
        for run in runs.values():
            run()
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            _sync(x.device)
            t0 = time.perf_counter()
            run()
            _sync(x.device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: {name}"


def run(
    shapes=None,
    ops=None,
    passes=("fwd", "fwd+bwd"),
    dtype=torch.float32,
    device="cpu",
    threads: Optional[int] = 2,
    repeats: int = 20,
    warmup: int = 3,
    with_package: bool = True,
    seed: int = 0,
    log=print,
) -> dict:
    """Run the operator benchmark and return the JSON-ready result (see the module docstring)."""
    device = torch.device(device)
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(threads)
    shapes = [tuple(s) for s in (shapes or FULL_SHAPES)]
    ours = _ours()
    names = list(ops or ours)
    unknown = [n for n in names if n not in ours]
    if unknown:
        raise ValueError(f"ops: unknown {unknown}; accepted: {', '.join(ours)}")
    package = _package() if with_package else {}
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for shape in shapes:
        x = (torch.randn(*shape, generator=gen) * 3).to(device=device, dtype=dtype)
        for pas in passes:
            for name in names:
                ms = time_calls({"softmax": lambda t: torch.softmax(t, -1), name: ours[name]}, x, pas, repeats, warmup)
                case = {
                    "op": name,
                    "shape": list(shape),
                    "dtype": str(dtype).replace("torch.", ""),
                    "pass": pas,
                    "ms": round(ms[name], 4),
                    "softmax_ms": round(ms["softmax"], 4),
                    "ratio": round(ms[name] / ms["softmax"], 3),
                    "target": target_ratio(name, shape, pas),
                }
                if name in package:
                    fns = {"softmax": lambda t: torch.softmax(t, -1), **package[name]}
                    pk = time_calls(fns, x, pas, max(3, repeats // 4), 1)
                    case["entmax_pkg"] = {
                        v: {"ms": round(pk[v], 4), "ratio": round(pk[v] / pk["softmax"], 2)} for v in package[name]
                    }
                cases.append(case)
                log(_row(case))
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "softargmax": sa.__version__,
        "python": sys.version.split()[0],
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "input": "randn * 3",
        "repeats": repeats,
        "cases": cases,
    }


def _row(c: dict) -> str:
    pkg = ", ".join(f"{k} {v['ratio']:.1f}x" for k, v in c.get("entmax_pkg", {}).items())
    tgt = c["target"]
    mark = "" if tgt is None else ("  ok  " if c["ratio"] <= tgt else "  OVER")
    return (
        f"{c['op']:<20} {str(tuple(c['shape'])):<14} {c['pass']:<8} {c['ms']:>9.3f} ms "
        f"{c['softmax_ms']:>8.3f} ms {c['ratio']:>7.2f}x "
        f"{'' if tgt is None else f'<= {tgt:g}x':<8}{mark} {pkg}"
    )


def header() -> str:
    return (
        f"{'op':<20} {'shape':<14} {'pass':<8} {'ours':>12} {'softmax':>11} {'ratio':>8} "
        f"{'target':<8}{'':6} entmax package"
    )


def save(result: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
