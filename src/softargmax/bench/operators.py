"""The operator benchmark: forward and forward+backward time against ``torch.softmax`` in one run.

Used by ``softargmax bench`` and ``benchmarks/``.  Every case is timed as the
median of ``repeats`` calls after ``warmup`` calls, inputs ``randn * 3``; the
reference ``entmax`` package is timed beside ours when it is installed.  The JSON
written is::

    {"device": ..., "torch": ..., "threads": ..., "cases": [
        {"op": ..., "shape": [rows, cols], "dtype": ..., "pass": "fwd" | "fwd+bwd",
         "ms": ..., "softmax_ms": ..., "ratio": ..., "target": ..., "entmax_pkg": {...}}]}

``target`` is the ratio the project aims at (``targets.json`` beside this module); ``null`` where none is set.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

import softargmax as sa

from .timing import device_name, ratio_row, restores_threads, targets, time_calls, versions

LONG = [tuple(s) for s in targets()["shapes"]["long"]]
SHORT = [tuple(s) for s in targets()["shapes"]["short"]]
FULL_SHAPES = LONG + SHORT
QUICK_SHAPES = [(8, 2000), (64, 64)]


def target_ratio(op: str, shape: Sequence[int], pas: str) -> Optional[float]:
    """The forward+backward ratio to ``torch.softmax`` aimed at for ``op`` at ``shape`` (``targets.json``), or ``None``."""
    if pas != "fwd+bwd":
        return None
    kind = "long" if tuple(shape) in LONG else "short" if tuple(shape) in SHORT else None
    return targets()["operators"].get(op, {}).get(kind) if kind else None


def _ours() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    return {
        "sparsemax": sa.sparsemax,
        "entmax15": sa.entmax15,
        "entmax_a1.3": lambda x: sa.entmax(x, 1.3),
        "entmax_a1.7": lambda x: sa.entmax(x, 1.7),
        "f_alpha1.5": lambda x: sa.f_softargmax(x, "alpha", alpha=1.5),
        "f_kl": lambda x: sa.f_softargmax(x, "kl"),
        "f_reverse_kl": lambda x: sa.f_softargmax(x, "reverse_kl"),
        "f_jeffrey": lambda x: sa.f_softargmax(x, "jeffrey"),
        "f_jensen_shannon": lambda x: sa.f_softargmax(x, "jensen_shannon"),
        "f_squared_hellinger": lambda x: sa.f_softargmax(x, "squared_hellinger"),
        "f_reverse_chi_square": lambda x: sa.f_softargmax(x, "reverse_chi_square"),
        "alpha_relu": lambda x: sa.alpha_relu(x, 1.5, 0.0),
    }


#: the operators :func:`run` times, by the names ``ops`` takes (``softargmax bench --ops``)
OPERATORS = tuple(_ours())


def entmax_package() -> dict[str, dict[str, Callable[[torch.Tensor], torch.Tensor]]]:
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


@restores_threads
def run(
    shapes: Optional[Iterable[Sequence[int]]] = None,
    ops: Optional[Sequence[str]] = None,
    passes: Sequence[str] = ("fwd", "fwd+bwd"),
    dtype: torch.dtype = torch.float32,
    device: Union[str, torch.device] = "cpu",
    threads: Optional[int] = 2,
    repeats: int = 20,
    warmup: int = 3,
    with_package: bool = True,
    seed: int = 0,
    log: Callable[[str], object] = print,
) -> dict[str, Any]:
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
    package = entmax_package() if with_package else {}
    gen = torch.Generator().manual_seed(seed)
    cases: list[dict[str, Any]] = []
    for shape in shapes:
        x = (torch.randn(*shape, generator=gen) * 3).to(device=device, dtype=dtype)
        for pas in passes:
            for name in names:
                ms = time_calls({"softmax": lambda t: torch.softmax(t, -1), name: ours[name]}, x, pas, repeats, warmup)
                case: dict[str, Any] = {
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
                log(ratio_row(case))
    return {
        "device": device_name(device),
        **versions(),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "cpu_solver": _cpu_solver() if device.type == "cpu" else None,
        "input": "randn * 3",
        "repeats": repeats,
        "cases": cases,
    }


def _cpu_solver() -> str:
    """Which CPU solver the covered operators used: the fused C row solver or the PyTorch path."""
    from ..backends.cpu import rows as _cpu_rows

    return "fused C row solver" if _cpu_rows.enabled() and _cpu_rows.available() else "PyTorch path"
