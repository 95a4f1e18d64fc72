"""The attention benchmark: causal self-attention forward+backward against
``F.scaled_dot_product_attention`` (time in one run; peak memory in a fresh process per case)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from .memory import attention_fn, measure
from .timing import device_name, restores_threads, time_thunks, versions

ATTENTION_LENGTHS = (128, 256, 512, 1024, 2048)
ATTENTION_VARIANTS = ("sdpa", "softmax", "sparsemax", "entmax15", "entmax_per_head")


@restores_threads
def run_attention(lengths: Sequence[int] = ATTENTION_LENGTHS, heads: int = 8, threads: Optional[int] = 2,
                  repeats: int = 5, memory: bool = True, log: Callable[[str], object] = print) -> dict[str, Any]:
    """Causal self-attention forward+backward (batch 1, ``heads`` × 64 features) vs ``scaled_dot_product_attention``."""
    if threads is not None:
        torch.set_num_threads(threads)
    alpha = torch.linspace(1.2, 1.8, heads)
    cases: list[dict[str, Any]] = []
    for L in lengths:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, L, 64, generator=g) for _ in range(3))

        def runner(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                fn(qq, kk, vv).sum().backward()
            return run

        ms = time_thunks({var: runner(attention_fn(var, alpha)) for var in ATTENTION_VARIANTS}, repeats, 1)
        peaks = {}
        if memory:
            for var in ATTENTION_VARIANTS:
                peaks[var] = measure("attention", var, L, heads, threads or 2)["peak_mb"]
        for var in ATTENTION_VARIANTS[1:]:
            case: dict[str, Any] = {"op": f"attention[{var}]", "shape": [1, heads, L, 64], "dtype": "float32", "pass": "fwd+bwd",
                    "ms": round(ms[var], 3), "softmax_ms": round(ms["sdpa"], 3), "baseline": "F.scaled_dot_product_attention",
                    "ratio": round(ms[var] / ms["sdpa"], 3), "target": None}
            if memory:
                case.update({"peak_mb": round(peaks[var], 1), "baseline_peak_mb": round(peaks["sdpa"], 1),
                             "memory_ratio": round(peaks[var] / max(peaks["sdpa"], 1e-9), 2)})
            cases.append(case)
            mem = f", peak +{case['peak_mb']:.0f} MB vs +{case['baseline_peak_mb']:.0f} MB" if memory else ""
            log(f"{case['op']:<28} L={L:<5} {case['ms']:>9.2f} ms vs sdpa {case['softmax_ms']:>8.2f} ms ({case['ratio']:.2f}x){mem}")
    return {
        "device": device_name(torch.device("cpu")), **versions(), "threads": torch.get_num_threads(),
        "input": "randn, causal self-attention, batch 1, 64 features per head", "repeats": repeats, "cases": cases,
    }
