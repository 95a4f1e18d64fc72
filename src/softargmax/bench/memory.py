"""One memory measurement per process: ``python -m softargmax.bench.memory CASE ARGS...`` allocates
the case's inputs, runs one forward+backward and prints ``{"peak_mb": ..., "ms": ...}`` as JSON.

A fresh process per case makes the peak resident memory of the call its own
(:func:`~softargmax.bench.timing.peak_growth_mb`); :func:`measure` starts one and reads its answer.

* ``fused VARIANT N d V THREADS REPEATS [MAPPING [CHUNK [DEVICE]]]``: ``linear_fenchel_young_loss(h, W, t,
  MAPPING, chunk_size=CHUNK)`` (``VARIANT=fused``) or ``fenchel_young_loss(h @ W.T, t, MAPPING)`` (``unfused``,
  the logits materialized); ``MAPPING`` defaults to ``entmax15``, ``CHUNK`` to the fused loss's own choice
  (``0``: the same), ``DEVICE`` to ``cpu``.  On a CUDA device the peak is the growth of the CUDA caching
  allocator's peak (``torch.cuda.max_memory_allocated``) over what the inputs hold, not the resident set;
  ``VARIANT=torch`` is PyTorch's chunked ``F.linear_cross_entropy(h, W, t,
  options=LinearCrossEntropyOptions())`` and ``torch_reference`` its reference path (``options=None``),
  both PyTorch 2.13 or later (``MAPPING`` ignored); also the median time of ``REPEATS`` more calls;
* ``attention VARIANT L HEADS THREADS``: causal self-attention (batch 1, 64 features per head),
  ``VARIANT`` one of ``sdpa``, ``softmax``, ``sparsemax``, ``entmax15``, ``entmax_per_head``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

import softargmax as sa

from .timing import peak_growth_mb


def attention_fn(variant: str, alpha: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(q, k, v) -> output`` of one attention variant (causal)."""
    if variant == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if variant == "entmax_per_head":
        return lambda q, k, v: sa.attention(q, k, v, is_causal=True, mapping="entmax", alpha=alpha)
    return lambda q, k, v: sa.attention(q, k, v, is_causal=True, mapping=variant)


def _fused(variant: str, N: int, d: int, V: int, repeats: int, mapping: str = "entmax15",
           chunk: Optional[int] = None, device: str = "cpu") -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, d, generator=g).to(device).requires_grad_()
    W = (torch.randn(V, d, generator=g) / d ** 0.5).to(device).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g).to(device)

    def run() -> None:
        if variant == "fused":
            loss = sa.linear_fenchel_young_loss(h, W, t, mapping=mapping, chunk_size=chunk)
        elif variant == "unfused":
            loss = sa.fenchel_young_loss(h @ W.T, t, mapping)
        else:  # PyTorch's own linear + cross-entropy, chunked or not
            options = torch.nn.LinearCrossEntropyOptions() if variant == "torch" else None
            loss = F.linear_cross_entropy(h, W, t, options=options)
        torch.autograd.grad(loss, (h, W))

    cuda = torch.device(device).type == "cuda"
    peak = _cuda_peak_growth_mb(run) if cuda else peak_growth_mb(run)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"peak_mb": peak, "ms": statistics.median(times) * 1e3 if times else None,
            "memory": "cuda allocator peak" if cuda else "resident set peak"}


def _cuda_peak_growth_mb(run: Callable[[], None]) -> float:
    """The CUDA caching allocator's peak during a warm ``run()`` above what was allocated before it, in MiB."""
    run()  # a warm-up: Triton's compilation and the allocator's first blocks are not the call's own
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _attention(variant: str, L: int, heads: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, L, 64, generator=g).requires_grad_() for _ in range(3))
    fn = attention_fn(variant, torch.linspace(1.2, 1.8, heads))

    def run() -> None:
        fn(q, k, v).sum().backward()

    return {"peak_mb": peak_growth_mb(run)}


def measure(case: str, *args: object) -> dict[str, Any]:
    """Run :func:`main` with ``case *args`` in a fresh Python process and return its JSON."""
    entry = f"import sys; from {__name__} import main; main(sys.argv[1:])"
    out = subprocess.run([sys.executable, "-c", entry, case, *map(str, args)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str]) -> None:
    case, variant, *rest = argv
    if case == "fused":
        if variant not in ("fused", "unfused", "torch", "torch_reference"):
            raise SystemExit(f"fused: VARIANT must be fused, unfused, torch or torch_reference, got {variant!r}")
        N, d, V, threads, repeats = map(int, rest[:5])
        mapping = rest[5] if len(rest) > 5 else "entmax15"
        chunk = int(rest[6]) if len(rest) > 6 and int(rest[6]) > 0 else None
        device = rest[7] if len(rest) > 7 else "cpu"
        torch.set_num_threads(threads)
        result = _fused(variant, N, d, V, repeats, mapping, chunk, device)
    elif case == "attention":
        L, heads, threads = map(int, rest)
        torch.set_num_threads(threads)
        result = _attention(variant, L, heads)
    else:
        raise SystemExit(f"case must be fused or attention, got {case!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
