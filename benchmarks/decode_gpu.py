"""The decode section of ``run_gpu.py``: one decoding step of ``softargmax.decode_attention`` against SDPA's.

Per case: ``B = 8`` sequences, 32 query heads over 8 key/value heads, head dim 128, bfloat16, one new
query per sequence against a full cache of ``cache_len`` positions (4k, 32k, 128k; the smoke run: 64
positions, 2 sequences, 4 heads over 2, head dim 16).  Implementations (``impls``):

* ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` (softmax: flash decoding where
  PyTorch dispatches to it); ``sdpa_backends`` lists the backends that accept the call;
* ``decode_entmax15``, ``decode_sparsemax``: ``softargmax.decode_attention`` (on CUDA: the split-K
  scores kernel, the row solver, the split ``P·V``);
* ``attention_entmax15``: ``softargmax.attention(..., enable_gqa=True)`` (on CUDA the training kernel:
  one program per head, what a decode step ran before ``decode_attention``).

Each records ``ms`` (median of ``repeats`` interleaved calls after a warm-up), ``first_call_ms``
(compilation included), ``peak_extra_mb`` (CUDA memory above the inputs) and ``max_abs_error``: the
largest difference from the same mapping's attention computed in float32 with the weights materialized.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.bench import time_thunks

CACHE_LENS = (4096, 32768, 131072)
SHAPE = (8, 32, 8, 128)  # batch, query heads, key/value heads, head dim
SMOKE_CACHE_LENS = (64,)
SMOKE_SHAPE = (2, 4, 2, 16)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list:
    """The SDPA backends that accept the call (on CUDA)."""
    if q.device.type != "cuda":
        return []
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ok = []
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([b]):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            ok.append(b.name)
        except RuntimeError:
            pass
    return ok


def decode_cases(device: torch.device, repeats: int, peak_extra_mb, smoke: bool = False, log=print,
                 emit=None) -> list:
    """Every case (module docstring); ``emit(case)`` once per case, when it is complete; ``peak_extra_mb(fn,
    device)``: ``run_gpu``'s memory measure, ``(peak MiB above the inputs, baseline MiB)``."""
    B, H, HKV, D = SMOKE_SHAPE if smoke else SHAPE
    cases = []
    for S in SMOKE_CACHE_LENS if smoke else CACHE_LENS:
        case = _case(device, repeats, peak_extra_mb, B, H, HKV, D, S)
        log(f"decode cache {S}: " + ", ".join(f"{n} {r.get('ms', 'error')} ms" for n, r in case["impls"].items()))
        cases.append(case)
        if emit is not None:
            emit(case)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return cases


def _case(device: torch.device, repeats: int, peak_extra_mb, B: int, H: int, HKV: int, D: int, S: int) -> dict:
    """One cache length: every implementation (module docstring)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 1, D, generator=gen).to(device, torch.bfloat16)
    k = torch.randn(B, HKV, S, D, generator=gen).to(device, torch.bfloat16)
    v = torch.randn(B, HKV, S, D, generator=gen).to(device, torch.bfloat16)
    lengths = torch.full((B,), S, dtype=torch.int32, device=device)
    impls = {
        "sdpa": ("softmax", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
        "decode_entmax15": ("entmax15", lambda: sa.decode_attention(q, k, v, lengths)),
        "decode_sparsemax": ("sparsemax", lambda: sa.decode_attention(q, k, v, lengths, mapping="sparsemax")),
        "attention_entmax15": ("entmax15", lambda: sa.attention(q, k, v, enable_gqa=True)),
    }
    case: dict = {"op": "decode", "cache_len": S, "shape": [B, H, HKV, 1, D], "dtype": "bfloat16",
                  "sdpa_backends": _backends(q, k, v), "impls": {}}
    with torch.no_grad():
        qf, kf, vf = q.float(), k.float(), v.float()
        exact = {m: sa.attention(qf, kf, vf, mapping=m, enable_gqa=True, return_weights=True)[0]
                 for m in ("softmax", "entmax15", "sparsemax")}
        del qf, kf, vf
        for name, (mapping, fn) in impls.items():
            try:
                _sync(device)
                t0 = time.perf_counter()
                out = fn()
                _sync(device)
                first = (time.perf_counter() - t0) * 1e3
                err = float((out.float() - exact[mapping]).abs().max())
                del out
                peak, _ = peak_extra_mb(fn, device)
                ms = time_thunks({name: fn}, repeats, 1, device)[name]
                case["impls"][name] = {"ms": round(ms, 4), "first_call_ms": round(first, 2),
                                       "peak_extra_mb": None if peak is None else round(peak, 1),
                                       "max_abs_error": err}
            except Exception as e:  # recorded; the next implementation runs
                case["impls"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    base = case["impls"].get("sdpa", {}).get("ms")
    for r in case["impls"].values():
        if base and "ms" in r:
            r["ratio_to_sdpa"] = round(r["ms"] / base, 3)
    return case
