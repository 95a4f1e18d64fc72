"""The attention section of ``run_gpu.py``: fused α-entmax attention against SDPA, the
materialized path and AdaSplash (when installed), forward+backward.

Per case (``B × H`` heads, ``L`` queries = keys, head dim ``D``, bfloat16):

* ``ms``: median forward+backward time, interleaved with the other implementations;
* ``peak_mib``: peak CUDA memory of one forward+backward above the inputs;
* ``first_call_ms``: that first forward+backward, timed on its own (Triton's compilation and
  autotuning of the case's variants included);
* ``max_abs_psum_minus_1``: the largest ``|Σ_j p_ij - 1|`` over the rows, measured the same
  way for every implementation: its output with ``v = 1`` (every output entry is then
  ``Σ_j p_ij``), run in float32 when the implementation takes float32 (the bfloat16 output
  cannot resolve 1e-3 near 1), else in the case's dtype (``psum_dtype`` says which); for the
  fused kernels also ``psum_solver``: the threshold solver's own row sums (float32);
* ``block_sparsity``: for the fused kernels, the fraction of score tiles inside the causal
  band skipped by the output pass; ``newton_passes_mean``/``_max``: the Newton passes over
  the key tiles that the blocks of query rows took.

AdaSplash (Gonçalves, Treviso & Martins, *AdaSplash: Adaptive Sparse Flash Attention*,
ICML 2025, code: deep-spin/adasplash) is an optional comparison: imported when present,
never a dependency.  An implementation that fails (out of memory, unsupported case) is
recorded with its error and left out of the timing.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.backends.triton import flash_attention as FA
from softargmax.bench import time_thunks

B, H = 2, 16
#: (is_causal, head dim, length)
SHAPES = ([(True, 64, n) for n in (1024, 4096, 8192, 16384, 32768)]
          + [(True, 128, n) for n in (1024, 4096, 8192, 16384)]
          + [(False, 64, n) for n in (1024, 4096, 8192, 16384, 32768)])
SMOKE_SHAPES = [(True, 16, 32)]
SMOKE_BH = (1, 1)
ALPHA = 1.5


class Unsupported(Exception):
    """An implementation does not cover a case (recorded as ``"skipped"``, not as an error)."""


def _adasplash():
    """AdaSplash's entry points, when the package is installed: ``{name: fn(q, k, v, causal)}``.

    ``adasplash_v2`` took ``alpha`` and ``is_causal`` in early releases; from 0.2 it is
    ``adasplash_v2(q, k, v, niter=1, varlen=None)``, causal 1.5-entmax only (AdaSplash-2): a
    non-causal case is then skipped.  Both run with the package's default iteration counts
    except ``adasplash_v1`` (``niter=10``)."""
    import inspect

    try:
        import adasplash as A
    except Exception:
        return {}
    impls = {}
    v2 = getattr(A, "adasplash_v2", None)
    if v2 is not None:
        try:
            params = set(inspect.signature(v2).parameters)
        except (TypeError, ValueError):
            params = set()
        if {"alpha", "is_causal"} <= params:
            impls["adasplash2_a1.5"] = lambda q, k, v, causal: v2(q, k, v, alpha=ALPHA, is_causal=causal)
        else:
            def v2_causal(q, k, v, causal):
                if not causal:
                    raise Unsupported("AdaSplash-2 (adasplash_v2) is causal 1.5-entmax only")
                return v2(q, k, v)

            impls["adasplash2_a1.5"] = v2_causal
    v1 = getattr(A, "adasplash_v1", None) or getattr(A, "adasplash", None)
    if v1 is not None:
        impls["adasplash1_a1.5"] = lambda q, k, v, causal: v1(q, k, v, alpha=ALPHA, niter=10, is_causal=causal)
    return impls


def _implementations(device, heads, fused_ok):
    alpha_h = torch.linspace(1.2, 1.8, heads, device=device)

    def materialized(q, k, v, causal):
        old = FA.set_enabled(False)
        try:
            return sa.attention(q, k, v, is_causal=causal, mapping="entmax15")
        finally:
            FA.set_enabled(old)

    impls = {"sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
    if fused_ok:
        impls["fused_entmax15"] = lambda q, k, v, causal: FA.flash_attention(q, k, v, is_causal=causal,
                                                                             mapping="entmax15")
        impls["fused_learned_alpha"] = lambda q, k, v, causal: FA.flash_attention(
            q, k, v, is_causal=causal, mapping="entmax", alpha=alpha_h.detach().requires_grad_())
    impls["materialized_entmax15"] = materialized
    if device.type == "cuda":
        impls.update(_adasplash())
    return impls, alpha_h


def _fwd_bwd(fn, q, k, v, do, causal):
    def run():
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        fn(qq, kk, vv, causal).backward(do)

    return run


def _psum_error(fn, q, k, causal):
    """``(max |Σp - 1| over the non-empty rows, dtype used)`` from the output with ``v = 1``."""
    for dtype in (torch.float32, q.dtype):
        try:
            qq, kk = q.to(dtype), k.to(dtype)
            with torch.no_grad():
                out = fn(qq, kk, torch.ones_like(kk), causal)
            return float((out.float() - 1).abs().max()), str(dtype).replace("torch.", "")
        except Exception:
            continue
    return None, None


def _peak(run, device):
    if device.type != "cuda":
        run()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def attention_cases(device, repeats, smoke=False, log=print, emit=None):
    cases = []
    b, heads = SMOKE_BH if smoke else (B, H)
    fused_ok = FA.available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
    impls, alpha_h = _implementations(device, heads, fused_ok)
    for causal, D, L in (SMOKE_SHAPES if smoke else SHAPES):
        gen = torch.Generator().manual_seed(0)
        dtype = torch.bfloat16
        q, k, v, do = ((torch.randn(b, heads, L, D, generator=gen)).to(device, dtype) for _ in range(4))
        case = {"op": "attention", "causal": causal, "shape": [b, heads, L, D], "dtype": "bfloat16",
                "pass": "fwd+bwd", "impls": {}}
        runs = {}
        for name, fn in impls.items():
            res = {}
            run = _fwd_bwd(fn, q, k, v, do, causal)
            try:
                t0 = time.perf_counter()
                res["peak_mib"] = _peak(run, device)  # the first call: compilation and autotuning included
                res["first_call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
            except Unsupported as e:
                case["impls"][name] = {"skipped": str(e)}
                continue
            except Exception as e:  # out of memory, an unsupported case: recorded, not timed
                res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                case["impls"][name] = res
                continue
            res["max_abs_psum_minus_1"], res["psum_dtype"] = _psum_error(fn, q, k, causal)
            if name == "sdpa":
                res["block_sparsity"] = 0.0
            if name.startswith("fused"):
                kw = dict(mapping="entmax15") if name == "fused_entmax15" else dict(mapping="entmax", alpha=alpha_h)
                st = FA.forward_stats(q, k, v, is_causal=causal, **kw)
                nonempty = st["psum"] > 0
                res["psum_solver"] = float((st["psum"][nonempty] - 1).abs().max())
                res["block_sparsity"] = round(st["block_sparsity"], 4)
                passes = st["newton_passes"].float()
                res["newton_passes_mean"] = round(float(passes.mean()), 2)
                res["newton_passes_max"] = int(passes.max())
            runs[name] = run
            case["impls"][name] = res
        times = time_thunks(runs, repeats, 0 if smoke else max(2, repeats // 5), device) if runs else {}
        base = times.get("sdpa")
        for name, ms in times.items():
            case["impls"][name]["ms"] = round(ms, 4)
            case["impls"][name]["ratio_sdpa"] = round(ms / base, 3) if base else None
        for name in ("adasplash2_a1.5", "adasplash1_a1.5"):
            if name in times and "fused_entmax15" in times:
                case["fused_vs_" + name.split("_")[0]] = round(times["fused_entmax15"] / times[name], 3)
        cases.append(case)
        if emit is not None:
            emit(case)
        for name, r in case["impls"].items():
            if "error" in r or "skipped" in r:
                log(f"attention {'causal' if causal else 'full':>6} D={D:<3} L={L:<6} {name:>22}  "
                    f"{r.get('error') or 'skipped: ' + r['skipped']}")
                continue
            peak = "-" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f} MiB"
            err = r["max_abs_psum_minus_1"]
            log(f"attention {'causal' if causal else 'full':>6} D={D:<3} L={L:<6} {name:>22} {r['ms']:9.3f} ms "
                f"({r['ratio_sdpa']}x sdpa)  {peak:>9}  |Σp-1| {'-' if err is None else f'{err:.1e}'}"
                f" ({r['psum_dtype']})  sparsity {r.get('block_sparsity', '-')}  first call {r['first_call_ms']:.0f} ms")
        if device.type == "cuda":
            del q, k, v, do
            torch.cuda.empty_cache()
    return cases
