"""GPU benchmark of the Triton kernels (issue: GPU kernels): writes benchmarks/results/gpu-<device>.json.

    python benchmarks/run_gpu.py                  # full run on the first CUDA device (H100/H200 sizes)
    python benchmarks/run_gpu.py --only operators # or: losses, fused, attention
    python benchmarks/run_gpu.py --smoke          # tiny sizes; with --device cpu it checks the plumbing

Every case is timed as the median of interleaved calls (``softargmax.bench.time_thunks``)
against ``torch.softmax`` (operators) or ``F.cross_entropy`` (losses) in the same run, and
the reference ``entmax`` package where it has the operator.  Bandwidth: the bytes an ideal
kernel moves (forward: read x, write p; backward: read p and the incoming gradient, write
the gradient) divided by the time, as a fraction of the device's copy bandwidth measured
in the same run (``y.copy_(x)`` of 1 GiB: read + write).  The attention section
(``attention_gpu.py``) times the fused α-entmax attention against SDPA, the materialized
path and AdaSplash when installed.  The JSON follows the operator
benchmark's schema (``"device"`` names the GPU) with ``gbps`` and ``bw_fraction`` added.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.backends.triton import rows as _triton_rows
from softargmax.bench import device_name, entmax_package, time_thunks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_gpu  # the attention section, next to this file

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

VOCAB_SHAPES = [(4096, 32768), (1024, 131072), (256, 262144)]
ATTENTION_SHAPE = (65536, 512)
FUSED_SHAPE = (16384, 4096, 131072)  # tokens, hidden, vocab
SMOKE_VOCAB = [(8, 300)]
SMOKE_ATTENTION = (64, 32)
SMOKE_FUSED = (64, 16, 300)

OPERATORS = {
    "sparsemax": sa.sparsemax,
    "entmax15": sa.entmax15,
    "entmax_a1.3": lambda x: sa.entmax(x, 1.3),
    "f_jensen_shannon": lambda x: sa.f_softargmax(x, "jensen_shannon"),
    "f_squared_hellinger": lambda x: sa.f_softargmax(x, "squared_hellinger"),
    "alpha_relu": lambda x: sa.alpha_relu(x, 1.5, 0.0),
}


def target(op: str, shape) -> float:
    """The forward+backward ratio to ``torch.softmax`` the issue sets."""
    if op == "alpha_relu":
        return 1.0
    if op.startswith("f_") or tuple(shape) == ATTENTION_SHAPE:
        return 1.5
    return 1.25


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device, gib: float = 1.0, repeats: int = 20) -> float:
    """GB/s of ``y.copy_(x)`` (bytes read + written), the reference for the bandwidth fractions."""
    n = int(gib * 2**30) // 4
    x = torch.empty(n, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        y.copy_(x)
        _sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 2 * n * 4 / times[len(times) // 2] / 1e9


def _fwd_bwd(fn, x, grad):
    def run():
        xx = x.detach().requires_grad_(True)
        torch.autograd.grad(fn(xx), xx, grad)

    return run


def operator_cases(shapes, dtypes, device, repeats, copy_gbps, with_package=True, log=print):
    cases = []
    package = entmax_package() if with_package else {}
    for dtype in dtypes:
        for shape in shapes:
            gen = torch.Generator().manual_seed(0)
            x = (torch.randn(*shape, generator=gen) * 3).to(device=device, dtype=dtype)
            grad = torch.randn_like(x)
            thunks = {"softmax": _fwd_bwd(lambda t: torch.softmax(t, -1), x, grad)}
            ops = OPERATORS if tuple(shape) != ATTENTION_SHAPE else {k: v for k, v in OPERATORS.items()
                                                                    if not k.startswith("f_")}
            for name, fn in ops.items():
                thunks[name] = _fwd_bwd(fn, x, grad)
                for variant, pfn in package.get(name, {}).items():
                    thunks[f"pkg:{name}:{variant}"] = _fwd_bwd(pfn, x, grad)
            times = time_thunks(thunks, repeats, max(2, repeats // 5), device)
            ideal_bytes = 5 * x.numel() * x.element_size()  # fwd: x, p; bwd: p, v, g
            for name in ops:
                ms = times[name]
                gbps = ideal_bytes / (ms * 1e-3) / 1e9
                case = {"op": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "pass": "fwd+bwd",
                        "ms": round(ms, 4), "softmax_ms": round(times["softmax"], 4),
                        "ratio": round(ms / times["softmax"], 3), "target": target(name, shape),
                        "gbps": round(gbps, 1), "bw_fraction": float(f"{gbps / copy_gbps:.3g}"),  # 3 significant digits: tiny on a CPU, never 0
                        "entmax_pkg": {v: round(times[f"pkg:{name}:{v}"] / times["softmax"], 2)
                                       for v in package.get(name, {})}}
                cases.append(case)
                log(f"{name:>20} {case['dtype']:>8} {shape[0]:>6}x{shape[1]:<7} {ms:9.3f} ms  "
                    f"{case['ratio']:5.2f}x softmax (target {case['target']})  {gbps:7.0f} GB/s "
                    f"({case['bw_fraction']:.0%} of copy)  pkg {case['entmax_pkg']}")
    return cases


def loss_cases(shapes, device, repeats, log=print):
    cases = []
    losses = {"sparsemax_loss": sa.sparsemax_loss, "entmax15_loss": sa.entmax15_loss,
              "entmax_loss_a1.3": lambda x, t: sa.entmax_loss(x, t, alpha=1.3)}
    for dtype in (torch.float32, torch.bfloat16):
        for shape in shapes:
            gen = torch.Generator().manual_seed(0)
            x = (torch.randn(*shape, generator=gen) * 3).to(device=device, dtype=dtype)
            t = torch.randint(0, shape[1], (shape[0],), generator=gen).to(device)

            def runner(fn):
                def run():
                    xx = x.detach().requires_grad_(True)
                    fn(xx, t).backward()

                return run

            thunks = {"cross_entropy": runner(F.cross_entropy), **{k: runner(v) for k, v in losses.items()}}
            times = time_thunks(thunks, repeats, max(2, repeats // 5), device)
            for name in losses:
                case = {"op": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                        "pass": "fwd+bwd", "ms": round(times[name], 4),
                        "cross_entropy_ms": round(times["cross_entropy"], 4),
                        "ratio": round(times[name] / times["cross_entropy"], 3)}
                cases.append(case)
                log(f"{name:>20} {case['dtype']:>8} {shape[0]:>6}x{shape[1]:<7} {case['ms']:9.3f} ms  "
                    f"{case['ratio']:5.2f}x cross_entropy")
    return cases


def fused_case(shape, device, repeats, log=print):
    """Fused linear + 1.5-entmax loss against ``linear`` followed by the loss (bfloat16)."""
    N, H, V = shape
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    h = (torch.randn(N, H, generator=gen) / H**0.5).to(device, dtype)
    w = (torch.randn(V, H, generator=gen)).to(device, dtype)
    t = torch.randint(0, V, (N,), generator=gen).to(device)

    def unfused():
        hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
        sa.entmax15_loss(F.linear(hh, ww), t).backward()

    def fused():
        hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
        sa.linear_fenchel_young_loss(hh, ww, t, mapping="entmax15").backward()

    res = {}
    for name, fn in (("unfused", unfused), ("fused", fused)):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        fn()
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
        ms = time_thunks({name: fn}, repeats, 1, device)[name]
        res[name] = {"ms": round(ms, 3), "peak_extra_mb": None if peak is None else round(peak, 1)}
    case = {"op": "linear+entmax15_loss", "shape": list(shape), "dtype": "bfloat16", "pass": "fwd+bwd",
            "fused": res["fused"], "unfused": res["unfused"],
            "time_ratio": round(res["fused"]["ms"] / res["unfused"]["ms"], 3), "time_target": 1.1,
            "memory_ratio": (round(res["fused"]["peak_extra_mb"] / res["unfused"]["peak_extra_mb"], 3)
                             if device.type == "cuda" else None), "memory_target": 0.25}
    log(f"fused linear+entmax15 loss {N}x{H}x{V} bf16: {case['time_ratio']}x time, "
        f"{case['memory_ratio']}x peak memory (targets 1.1x, 0.25x)")
    return case


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, few repeats")
    ap.add_argument("--only", choices=["operators", "losses", "fused", "attention", "peers"], nargs="+",
                    help="sections (default: all but peers)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--no-package", action="store_true", help="do not time the reference entmax package")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("run_gpu.py: no CUDA device here (use --device cpu --smoke to check the script)", file=sys.stderr)
        return 2
    if device.type == "cuda" and not _triton_rows.available():
        print("run_gpu.py: Triton is not importable: the GPU kernels would not run", file=sys.stderr)
        return 2
    only = set(args.only or ["operators", "losses", "fused", "attention"])
    repeats = args.repeats or (3 if args.smoke else 25)
    vocab = SMOKE_VOCAB if args.smoke else VOCAB_SHAPES
    attention = SMOKE_ATTENTION if args.smoke else ATTENTION_SHAPE
    copy_gbps = copy_bandwidth(device, gib=0.01 if args.smoke else 1.0, repeats=repeats)
    print(f"device: {device_name(device)}; copy bandwidth {copy_gbps:.0f} GB/s")
    result = {"device": device_name(device), "torch": torch.__version__, "softargmax": sa.__version__,
              "triton": _triton_version(), "copy_gbps": round(copy_gbps, 1), "cases": [], "loss_cases": [],
              "fused": None, "attention": []}
    if "operators" in only:
        dtypes = [torch.float32, torch.bfloat16]
        result["cases"] += operator_cases(vocab, dtypes, device, repeats, copy_gbps, not args.no_package)
        result["cases"] += operator_cases([attention], dtypes, device, repeats, copy_gbps, not args.no_package)
    if "losses" in only:
        result["loss_cases"] = loss_cases(vocab, device, repeats)
    if "fused" in only:
        result["fused"] = fused_case(SMOKE_FUSED if args.smoke else FUSED_SHAPE, device, max(3, repeats // 5))
    if "attention" in only:
        result["attention"] = attention_gpu.attention_cases(device, 1 if args.smoke else max(5, repeats // 2),
                                                            smoke=args.smoke)
    if "peers" in only:
        result["peers"] = run_peers(args, device, repeats)
    name = "gpu-" + device_name(device).replace(" ", "-").lower() + ".json"
    path = args.json_path or os.path.join(RESULTS, name)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    return 0


# -- peers (optional packages, never dependencies) -----------------------------------------

#: shapes of the peer comparison: the vocabulary shapes, 16384x4096 and the attention shape
PEER_SHAPES = [(4096, 32768), (1024, 131072), (256, 262144), (16384, 4096), (65536, 512)]
#: fused linear + loss shapes of the peer comparison (tokens, hidden, vocab)
PEER_FUSED_SHAPES = [(8192, 4096, 131072), (16384, 4096, 131072)]
SMOKE_PEER_SHAPES = [(8, 300)]
SMOKE_PEER_FUSED = [(64, 16, 300)]


def _call_with(fn, x, **maybe):
    """``fn(x, **kw)`` passing only the keywords ``fn`` declares (peer signatures differ by version)."""
    import inspect

    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = set()
    return fn(x, **{k: v for k, v in maybe.items() if k in names})


def peer_operators():
    """``{op: {peer: fn(x)}}`` for the installed peers: AdaSplash ``triton_entmax``/``triton_sparsemax``
    and Liger's sparsemax.  Missing packages are skipped; a call that fails is recorded, not raised."""
    peers = {"sparsemax": {}, "entmax15": {}, "entmax_a1.3": {}}
    try:
        from adasplash import triton_entmax
    except Exception:
        triton_entmax = None
    try:
        from adasplash import triton_sparsemax
    except Exception:
        triton_sparsemax = None
    if triton_entmax is not None:
        peers["entmax15"]["adasplash"] = lambda x: _call_with(triton_entmax, x, alpha=1.5)
        peers["entmax_a1.3"]["adasplash"] = lambda x: _call_with(triton_entmax, x, alpha=1.3)
        if triton_sparsemax is None:
            peers["sparsemax"]["adasplash"] = lambda x: _call_with(triton_entmax, x, alpha=2.0)
    if triton_sparsemax is not None:
        peers["sparsemax"]["adasplash"] = lambda x: triton_sparsemax(x)
    try:
        from liger_kernel.ops.sparsemax import LigerSparsemaxFunction

        peers["sparsemax"]["liger"] = lambda x: LigerSparsemaxFunction.apply(x, -1)
    except Exception:
        pass
    return {op: fns for op, fns in peers.items() if fns}


def peer_operator_cases(shapes, dtypes, device, repeats, log=print):
    """Forward+backward time of each installed peer next to ours and softmax, with the peer's
    largest absolute error against our exact result (float32 compute) on the same input."""
    cases = []
    peers = peer_operators()
    if not peers:
        log("peers: none of adasplash, liger_kernel is installed")
        return cases
    for dtype in dtypes:
        for shape in shapes:
            gen = torch.Generator().manual_seed(0)
            x = (torch.randn(*shape, generator=gen) * 3).to(device=device, dtype=dtype)
            grad = torch.randn_like(x)
            thunks = {"softmax": _fwd_bwd(lambda t: torch.softmax(t, -1), x, grad)}
            errors = {}
            for op, fns in peers.items():
                ours = OPERATORS[op]
                thunks[op] = _fwd_bwd(ours, x, grad)
                exact = ours(x.float())
                for peer, fn in fns.items():
                    try:
                        errors[(op, peer)] = float((fn(x).float() - exact).abs().max())
                        thunks[f"{peer}:{op}"] = _fwd_bwd(fn, x, grad)
                    except Exception as err:  # a shape or dtype the peer refuses
                        errors[(op, peer)] = f"error: {type(err).__name__}: {str(err)[:200]}"
            times = time_thunks(thunks, repeats, max(2, repeats // 5), device)
            for (op, peer), err in errors.items():
                key = f"{peer}:{op}"
                case = {"op": op, "peer": peer, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                        "pass": "fwd+bwd", "ours_ms": round(times[op], 4), "softmax_ms": round(times["softmax"], 4),
                        "peer_ms": round(times[key], 4) if key in times else None,
                        "peer_max_abs_error": err}
                cases.append(case)
                log(f"{peer:>10} {op:>12} {case['dtype']:>8} {shape[0]:>6}x{shape[1]:<7} ours {case['ours_ms']:8.3f} ms"
                    f"  peer {case['peer_ms']} ms  softmax {case['softmax_ms']:.3f} ms  peer error {err}")
    return cases


def peer_fused_cases(shapes, device, repeats, log=print):
    """Fused linear + loss (bf16): ours (entmax15, KL) against torch linear + cross_entropy,
    Liger's ``LigerFusedLinearCrossEntropyFunction``, Cut-Cross-Entropy's ``linear_cross_entropy``
    and ``torch.nn.functional.linear_cross_entropy`` where installed; time, peak extra memory,
    and each cross-entropy's loss against our fused KL loss."""
    runs = {
        "ours_entmax15": lambda h, w, t: sa.linear_fenchel_young_loss(h, w, t, mapping="entmax15"),
        "ours_kl": lambda h, w, t: sa.linear_fenchel_young_loss(h, w, t, mapping="softmax"),
        "torch_linear_ce": lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t),
    }
    if hasattr(F, "linear_cross_entropy"):
        runs["torch_linear_cross_entropy"] = lambda h, w, t: F.linear_cross_entropy(h, w, t)
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        runs["liger_flce"] = lambda h, w, t: LigerFusedLinearCrossEntropyFunction.apply(h, w, t)[0]
    except Exception:
        pass
    try:
        from cut_cross_entropy import linear_cross_entropy

        runs["cce"] = lambda h, w, t: linear_cross_entropy(h, w, t)
    except Exception:
        pass
    cases = []
    for N, H, V in shapes:
        gen = torch.Generator().manual_seed(0)
        h = (torch.randn(N, H, generator=gen) / H**0.5).to(device, torch.bfloat16)
        w = (torch.randn(V, H, generator=gen) * 0.02).to(device, torch.bfloat16)
        t = torch.randint(0, V, (N,), generator=gen).to(device)
        reference = None
        for name, fn in runs.items():
            def run():
                hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
                loss = fn(hh, ww, t)
                loss.backward()
                return loss

            try:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                    base = torch.cuda.memory_allocated(device)
                value = float(run().detach())
                peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
                ms = time_thunks({name: run}, repeats, 1, device)[name]
            except Exception as err:
                cases.append({"op": name, "shape": [N, H, V], "error": f"{type(err).__name__}: {str(err)[:200]}"})
                log(f"{name:>28} {N}x{H}x{V}: error {err}")
                continue
            if name == "ours_kl":
                reference = value
            case = {"op": name, "shape": [N, H, V], "dtype": "bfloat16", "pass": "fwd+bwd", "ms": round(ms, 3),
                    "peak_extra_mb": None if peak is None else round(peak, 1), "loss": value}
            cases.append(case)
            log(f"{name:>28} {N}x{H}x{V}: {ms:9.2f} ms  peak extra {case['peak_extra_mb']} MB  loss {value:.6f}")
        for case in cases:
            if case.get("shape") == [N, H, V] and "loss" in case and reference is not None and case["op"] != "ours_entmax15":
                case["loss_error_vs_ours_kl"] = abs(case["loss"] - reference)
    return cases


def run_peers(args, device, repeats, log=print) -> dict:
    """The ``--only peers`` section: operators and the fused output layer against the installed peers."""
    shapes = SMOKE_PEER_SHAPES if args.smoke else PEER_SHAPES
    fused = SMOKE_PEER_FUSED if args.smoke else PEER_FUSED_SHAPES
    return {"operators": peer_operator_cases(shapes, [torch.float32, torch.bfloat16], device, repeats, log),
            "fused": peer_fused_cases(fused, device, max(3, repeats // 5), log)}


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
