"""The loss benchmark: forward+backward of every loss against ``F.cross_entropy`` in one run, and the
fused linear + loss against ``linear`` followed by the loss and against PyTorch's own
``F.linear_cross_entropy`` (time and peak memory)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

import torch

import softargmax as sa

from .memory import measure
from .operators import QUICK_SHAPES  # noqa: F401  (the CLI's quick shapes, shared)
from .timing import device_name, ratio_row, restores_threads, targets, time_thunks, versions

LOSS_SHAPES = [(64, 32000)]
FUSED_SHAPE = (4096, 512, 32000)  # tokens, hidden, vocabulary


def _loss_ops() -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    return {
        "sparsemax_loss": lambda x, t: sa.sparsemax_loss(x, t),
        "entmax15_loss": lambda x, t: sa.entmax15_loss(x, t),
        "entmax_loss_a1.3": lambda x, t: sa.entmax_loss(x, t, alpha=1.3),
        "alpha_relu_loss": lambda x, t: sa.alpha_relu_loss(x, t, alpha=1.5, tau=0.3),
        "kl_loss": lambda x, t: sa.fenchel_young_loss(x, t, "softmax"),
    }


def _loss_package() -> dict[str, dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]]:
    try:
        import entmax as E
    except ImportError:
        return {}
    return {
        "sparsemax_loss": {"sort": lambda x, t: E.sparsemax_loss(x, t).mean(),
                           "topk100": lambda x, t: E.sparsemax_loss(x, t, k=100).mean()},
        "entmax15_loss": {"sort": lambda x, t: E.entmax15_loss(x, t).mean(),
                          "topk100": lambda x, t: E.entmax15_loss(x, t, k=100).mean()},
        "entmax_loss_a1.3": {"bisect": lambda x, t: E.entmax_bisect_loss(x, t, alpha=1.3).mean()},
    }


def loss_target(name: str) -> Optional[float]:
    """The forward+backward ratio to ``F.cross_entropy`` aimed at (``targets.json``), or ``None``."""
    return targets()["losses"].get(name)


def _time_losses(fns: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]], x: torch.Tensor,
                 t: torch.Tensor, repeats: int, warmup: int) -> dict[str, float]:
    """Forward+backward of ``fn(x, t)`` for each loss, interleaved."""
    def runner(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            xx = x.detach().requires_grad_(True)
            torch.autograd.grad(fn(xx, t), xx)
        return run

    return time_thunks({name: runner(fn) for name, fn in fns.items()}, repeats, warmup)


def _versus(ours: dict[str, Any], baseline: dict[str, Any], op: str, baseline_name: str,
            shape: Sequence[int]) -> dict[str, Any]:
    """The case record of the fused loss ``ours`` against ``baseline`` (each ``{"ms", "peak_mb"}``)."""
    return {
        "op": op,
        "shape": list(shape),
        "dtype": "float32",
        "pass": "fwd+bwd",
        "ms": round(ours["ms"], 2),
        "baseline": baseline_name,
        "baseline_ms": round(baseline["ms"], 2),
        "ratio": round(ours["ms"] / baseline["ms"], 3),
        "peak_mb": round(ours["peak_mb"], 1),
        "baseline_peak_mb": round(baseline["peak_mb"], 1),
        "memory_ratio": round(ours["peak_mb"] / max(baseline["peak_mb"], 1e-9), 3),
    }


def _versus_line(case: dict[str, Any]) -> str:
    return (f"{case['op']:<30} {str(tuple(case['shape'])):<20} {case['ms']:>9.1f} ms vs {case['baseline_ms']:.1f} ms "
            f"({case['ratio']:.2f}x); peak +{case['peak_mb']:.0f} MB vs +{case['baseline_peak_mb']:.0f} MB "
            f"({case['memory_ratio']:.2f})")


def fused_case(shape: Sequence[int] = FUSED_SHAPE, threads: int = 2, repeats: int = 3,
               log: Callable[[str], object] = print) -> dict[str, Any]:
    """Fused linear + entmax15 loss vs ``linear`` followed by the loss: time and extra peak memory.

    Each variant runs in a fresh process (:mod:`.memory`); memory is the growth of the peak
    resident set during the first forward+backward, the inputs already allocated.
    """
    N, d, V = shape
    res = {variant: measure("fused", variant, N, d, V, threads, repeats) for variant in ("unfused", "fused")}
    case = {**_versus(res["fused"], res["unfused"], "linear+entmax15_loss (fused)",
                      "linear then entmax15_loss (unfused)", shape),
            "target": targets()["fused"]["time"], "memory_target": targets()["fused"]["memory"]}
    log(f"{_versus_line(case)}; targets <= {case['target']:g}x time, <= {case['memory_target']:g} memory")
    return case


def torch_fused_case(shape: Sequence[int] = FUSED_SHAPE, threads: int = 2, repeats: int = 3,
                     log: Callable[[str], object] = print) -> Optional[dict[str, Any]]:
    """Our fused linear + KL loss (softmax's Fenchel–Young loss, the cross-entropy) vs PyTorch's own
    ``F.linear_cross_entropy`` (PyTorch 2.13 or later; ``None`` before): time and extra peak memory.

    PyTorch's chunked path (``options=LinearCrossEntropyOptions()``) is the baseline; its reference path
    (``options=None``: the logits materialized) is recorded beside it.  Each variant runs in a fresh process
    (:mod:`.memory`), as in :func:`fused_case`.
    """
    import torch.nn.functional as F

    if not hasattr(F, "linear_cross_entropy"):
        log(f"F.linear_cross_entropy: not in PyTorch {torch.__version__} (new in 2.13): not compared")
        return None
    N, d, V = shape
    res = {variant: measure("fused", variant, N, d, V, threads, repeats, "kl")
           for variant in ("torch", "fused", "torch_reference")}
    case = {**_versus(res["fused"], res["torch"], "linear+kl_loss (fused)",
                      "F.linear_cross_entropy (chunked: options=LinearCrossEntropyOptions())", shape),
            "torch_reference_ms": round(res["torch_reference"]["ms"], 2),
            "torch_reference_peak_mb": round(res["torch_reference"]["peak_mb"], 1)}
    log(f"{_versus_line(case)} against F.linear_cross_entropy chunked; unchunked {case['torch_reference_ms']:.1f} ms, "
        f"+{case['torch_reference_peak_mb']:.0f} MB")
    return case


@restores_threads
def run_losses(shapes: Optional[Iterable[Sequence[int]]] = None, threads: Optional[int] = 2, repeats: int = 20,
               warmup: int = 3, with_package: bool = True, fused: bool = True,
               fused_shape: Sequence[int] = FUSED_SHAPE, seed: int = 0,
               log: Callable[[str], object] = print) -> dict[str, Any]:
    """Loss benchmark: forward+backward vs ``F.cross_entropy``, and the fused output layer."""
    import torch.nn.functional as F

    if threads is not None:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    ours = _loss_ops()
    package = _loss_package() if with_package else {}
    cases: list[dict[str, Any]] = []
    for shape in [tuple(s) for s in (shapes or LOSS_SHAPES)]:
        x = torch.randn(*shape, generator=gen) * 3
        t = torch.randint(0, shape[1], (shape[0],), generator=gen)
        for name, fn in ours.items():
            ms = _time_losses({"cross_entropy": F.cross_entropy, name: fn}, x, t, repeats, warmup)
            case: dict[str, Any] = {
                "op": name, "shape": list(shape), "dtype": "float32", "pass": "fwd+bwd",
                "ms": round(ms[name], 4), "softmax_ms": round(ms["cross_entropy"], 4), "baseline": "F.cross_entropy",
                "ratio": round(ms[name] / ms["cross_entropy"], 3), "target": loss_target(name),
            }
            if name in package:
                pk = _time_losses({"cross_entropy": F.cross_entropy, **package[name]}, x, t, max(3, repeats // 4), 1)
                case["entmax_pkg"] = {v: {"ms": round(pk[v], 4), "ratio": round(pk[v] / pk["cross_entropy"], 2)} for v in package[name]}
            cases.append(case)
            log(ratio_row(case))
    if fused:
        cases.append(fused_case(fused_shape, threads or torch.get_num_threads(), log=log))
        torch_case = torch_fused_case(fused_shape, threads or torch.get_num_threads(), log=log)
        if torch_case is not None:
            cases.append(torch_case)
    return {
        "device": device_name(torch.device("cpu")),
        **versions(),
        "threads": torch.get_num_threads(),
        "input": "randn * 3, uniform random class indices",
        "repeats": repeats,
        "cases": cases,
    }
