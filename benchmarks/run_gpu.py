"""GPU benchmark of the Triton kernels (issue: GPU kernels): writes benchmarks/results/gpu-<device>.json.

    python benchmarks/run_gpu.py                  # full run on the first CUDA device (H100/H200 sizes)
    python benchmarks/run_gpu.py --only operators # or: losses, fused, attention, decode
    python benchmarks/run_gpu.py --smoke          # tiny sizes; with --device cpu it checks the plumbing

Every case is timed as the median of interleaved calls (``softargmax.bench.time_thunks``)
against ``torch.softmax`` (operators) or ``F.cross_entropy`` (losses) in the same run, and
the reference ``entmax`` package where it has the operator.  The first call of each
implementation in a case is timed on its own before (``first_call_ms``: Triton's compilation
of a new variant, autotuning, lazy imports and allocations included; a variant compiled by an
earlier case of the same process is loaded, not rebuilt): a user-facing number beside the
steady state.  Bandwidth: the bytes an ideal
kernel moves (forward: read x, write p; backward: read p and the incoming gradient, write
the gradient) divided by the time, as a fraction of the device's copy bandwidth measured
in the same run (``y.copy_(x)`` of 1 GiB: read + write).  The attention section
(``attention_gpu.py``) times the fused α-entmax attention against SDPA, the materialized
path and AdaSplash when installed; the decode section (``decode_gpu.py``) a decoding step of
``softargmax.decode_attention`` against SDPA's.  The JSON follows the operator
benchmark's schema (``"device"`` names the GPU) with ``gbps`` and ``bw_fraction`` added.

The JSON is rewritten after every case, atomically (a temporary file renamed over it), so a
run that is killed or crashes keeps every case it finished: ``"complete"`` stays false and
``"sections_done"`` / ``"errors"`` say how far it got.  A section that raises is recorded
in ``"errors"`` and the next one runs.  ``"environment"`` records the GPU, the driver,
torch / Triton / CUDA versions and the installed peers' versions; ``"config"`` the sizes,
dtypes and repeats.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.backends.triton import rows as _triton_rows
from softargmax.bench import device_name, entmax_package, save, time_thunks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_gpu  # the attention section, next to this file
import decode_gpu  # the decode section
import fused_inputs  # the fused layer's inputs (the peers' section)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

VOCAB_SHAPES = [(4096, 32768), (1024, 131072), (256, 262144)]
ATTENTION_SHAPE = (65536, 512)
FUSED_SHAPE = (16384, 4096, 131072)  # tokens, hidden, vocab
SMOKE_VOCAB = [(8, 300)]
SMOKE_ATTENTION = (64, 32)
SMOKE_FUSED = (64, 16, 300)

#: the sections, in the order they run
SECTIONS = ("operators", "losses", "fused", "attention", "decode", "peers")

OPERATORS = {
    "sparsemax": sa.sparsemax,
    "entmax15": sa.entmax15,
    "entmax_a1.3": lambda x: sa.entmax(x, 1.3),
    "f_jensen_shannon": lambda x: sa.f_softargmax(x, "jensen_shannon"),
    "f_squared_hellinger": lambda x: sa.f_softargmax(x, "squared_hellinger"),
    "f_reverse_kl": lambda x: sa.f_softargmax(x, "reverse_kl"),
    "f_jeffrey": lambda x: sa.f_softargmax(x, "jeffrey"),
    "f_reverse_chi_square": lambda x: sa.f_softargmax(x, "reverse_chi_square"),
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


def first_calls(thunks, device):
    """Milliseconds of one call of each thunk, synchronized, in order: the first call of each in this
    process (compilation and autotuning included) when nothing ran it before."""
    out = {}
    for name, run in thunks.items():
        _sync(device)
        t0 = time.perf_counter()
        run()
        _sync(device)
        out[name] = (time.perf_counter() - t0) * 1e3
    return out


def _fwd_bwd(fn, x, grad):
    def run():
        xx = x.detach().requires_grad_(True)
        torch.autograd.grad(fn(xx), xx, grad)

    return run


#: the divergence of each operator of :data:`OPERATORS` that the Triton row solver runs (``rows.operator_kind``
#: gives its kernels' kind; α-ReLU is elementwise)
OPERATOR_DIVERGENCES = {"sparsemax": ("chi_square", {}), "entmax15": ("alpha", {"alpha": 1.5}),
                        "entmax_a1.3": ("alpha", {"alpha": 1.3}), "f_jensen_shannon": ("jensen_shannon", {}),
                        "f_squared_hellinger": ("squared_hellinger", {}), "f_reverse_kl": ("reverse_kl", {}),
                        "f_jeffrey": ("jeffrey", {}), "f_reverse_chi_square": ("reverse_chi_square", {})}


def row_slices(shape, device, op=None):
    """Programs per row of the Triton row solver's forward of operator ``op`` at ``shape`` on ``device`` (1: one
    per row; 0: the rows are held in registers), as ``rows.forward_slices`` chooses them for the operator's kind
    (``rows.operator_kind``; without a row kind, sparsemax's): the 256 x 262,144 case is split."""
    from softargmax.backends.triton import rows
    from softargmax.divergences import get_divergence

    kind = None
    if op in OPERATOR_DIVERGENCES:
        name, params = OPERATOR_DIVERGENCES[op]
        kind = rows.operator_kind(get_divergence(name, **params))
    return rows.forward_slices(*shape, device, *(kind or ()))


def operator_cases(shapes, dtypes, device, repeats, copy_gbps, with_package=True, log=print, emit=None):
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
            first = first_calls(thunks, device)
            times = time_thunks(thunks, repeats, max(2, repeats // 5), device)
            ideal_bytes = 5 * x.numel() * x.element_size()  # fwd: x, p; bwd: p, v, g
            for name in ops:
                ms = times[name]
                gbps = ideal_bytes / (ms * 1e-3) / 1e9
                # bw_fraction to 3 significant digits: a tiny (smoke) case does not round to 0
                case = {"op": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "pass": "fwd+bwd",
                        "ms": round(ms, 4), "softmax_ms": round(times["softmax"], 4),
                        "first_call_ms": round(first[name], 3), "softmax_first_call_ms": round(first["softmax"], 3),
                        "ratio": round(ms / times["softmax"], 3), "target": target(name, shape),
                        "gbps": round(gbps, 1), "bw_fraction": float(f"{gbps / copy_gbps:.3g}"),
                        "row_slices": row_slices(shape, device, name),
                        "entmax_pkg": {v: round(times[f"pkg:{name}:{v}"] / times["softmax"], 2)
                                       for v in package.get(name, {})}}
                cases.append(case)
                if emit is not None:
                    emit(case)
                log(f"{name:>20} {case['dtype']:>8} {shape[0]:>6}x{shape[1]:<7} {ms:9.3f} ms  "
                    f"{case['ratio']:5.2f}x softmax (target {case['target']})  {gbps:7.0f} GB/s "
                    f"({case['bw_fraction']:.0%} of copy)  first call {case['first_call_ms']:.1f} ms  "
                    f"pkg {case['entmax_pkg']}")
    return cases


def loss_cases(shapes, device, repeats, log=print, emit=None):
    cases = []
    # (a name ending in _ls0.1: label smoothing 0.1, timed against cross_entropy with the same smoothing)
    losses = {"sparsemax_loss": sa.sparsemax_loss, "entmax15_loss": sa.entmax15_loss,
              "entmax_loss_a1.3": lambda x, t: sa.entmax_loss(x, t, alpha=1.3),
              "alpha_relu_loss": lambda x, t: sa.alpha_relu_loss(x, t, alpha=1.5, tau=0.3),
              "entmax15_loss_ls0.1": lambda x, t: sa.entmax15_loss(x, t, label_smoothing=0.1),
              # f(0) = +inf: with class indices the value is 0 or +inf in closed form; the time is the row
              # solver's forward and the gradient p - y
              "f_reverse_kl_loss": lambda x, t: sa.f_divergence_loss(x, t, "reverse_kl"),
              "f_jeffrey_loss": lambda x, t: sa.f_divergence_loss(x, t, "jeffrey"),
              "f_reverse_chi_square_loss": lambda x, t: sa.f_divergence_loss(x, t, "reverse_chi_square")}
    baselines = {"cross_entropy": F.cross_entropy,
                 "cross_entropy_ls0.1": lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1)}
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

            thunks = {**{k: runner(v) for k, v in baselines.items()}, **{k: runner(v) for k, v in losses.items()}}
            first = first_calls(thunks, device)
            times = time_thunks(thunks, repeats, max(2, repeats // 5), device)
            for name in losses:
                base = "cross_entropy_ls0.1" if name.endswith("_ls0.1") else "cross_entropy"
                case = {"op": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                        "pass": "fwd+bwd", "ms": round(times[name], 4), "baseline": base,
                        "cross_entropy_ms": round(times[base], 4),
                        "ratio": round(times[name] / times[base], 3),
                        "first_call_ms": round(first[name], 3),
                        "cross_entropy_first_call_ms": round(first[base], 3)}
                cases.append(case)
                if emit is not None:
                    emit(case)
                log(f"{name:>20} {case['dtype']:>8} {shape[0]:>6}x{shape[1]:<7} {case['ms']:9.3f} ms  "
                    f"{case['ratio']:5.2f}x {base}  first call {case['first_call_ms']:.1f} ms")
    return cases


def peak_extra_mb(run, device):
    """``(peak extra MiB, baseline MiB)`` of one warm call of ``run`` on CUDA (``(None, None)`` elsewhere).

    Every implementation is measured from the same baseline: what is allocated once the garbage of
    the previous runs is collected (a reference cycle freed in the middle of the next
    implementation's run would hide part of its peak) and the cache emptied, that is the inputs
    alone; the peak includes everything the call allocates, the gradients of the inputs among it
    (``run`` makes the leaves, so their ``.grad`` buffers are allocated and freed inside the call).
    """
    if device.type != "cuda":
        run()
        return None, None
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20, base / 2**20


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
        first = first_calls({name: fn}, device)[name]  # the first call: compilation and autotuning
        peak, _ = peak_extra_mb(fn, device)  # a warm call, from the same baseline for every implementation
        ms = time_thunks({name: fn}, repeats, 1, device)[name]
        res[name] = {"ms": round(ms, 3), "first_call_ms": round(first, 3),
                     "peak_extra_mb": None if peak is None else round(peak, 1)}
    case = {"op": "linear+entmax15_loss", "shape": list(shape), "dtype": "bfloat16", "pass": "fwd+bwd",
            "fused": res["fused"], "unfused": res["unfused"],
            "time_ratio": round(res["fused"]["ms"] / res["unfused"]["ms"], 3), "time_target": 1.1,
            "memory_ratio": (round(res["fused"]["peak_extra_mb"] / res["unfused"]["peak_extra_mb"], 3)
                             if device.type == "cuda" else None), "memory_target": 0.25}
    log(f"fused linear+entmax15 loss {N}x{H}x{V} bf16: {case['time_ratio']}x time, "
        f"{case['memory_ratio']}x peak memory (targets 1.1x, 0.25x); first call {res['fused']['first_call_ms']:.1f} ms "
        f"(unfused {res['unfused']['first_call_ms']:.1f} ms)")
    return case


#: the optional packages compared (distribution names), recorded with their versions
PEER_DISTRIBUTIONS = ("entmax", "adasplash", "liger-kernel", "cut-cross-entropy")


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version():
    """The NVIDIA driver's version (``nvidia-smi``, else NVML), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None


def environment(device) -> dict:
    """What the numbers were measured on and with: the device, the driver, the software, the peers."""
    env = {"device": device_name(device), "python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "triton": _triton_version(), "softargmax": sa.__version__,
           "host_cpu_count": os.cpu_count(),
           "peers": {name: _version(name) for name in PEER_DISTRIBUTIONS},
           "torch_linear_cross_entropy": hasattr(F, "linear_cross_entropy")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update({"capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
                    "memory_gib": round(props.total_memory / 2**30, 1), "driver": _driver_version(),
                    "cudnn": torch.backends.cudnn.version()})
    return env


class Record:
    """The run's JSON, rewritten atomically (``softargmax.bench.save``) after every case."""

    def __init__(self, path, result):
        self.path, self.result = path, result
        self.save()

    def save(self):
        save(self.result, self.path)

    def adder(self, *keys):
        """``emit(case)`` appending to ``result[keys[0]][keys[1]]...`` (a list) and saving."""
        def emit(case):
            target = self.result
            for key in keys:
                target = target[key]
            target.append(case)
            self.save()

        return emit

    def setter(self, key):
        def emit(case):
            self.result[key] = case
            self.save()

        return emit


def _section_config(args, only) -> dict:
    smoke = args.smoke
    cfg = {"smoke": smoke, "sections": sorted(only), "repeats": args.repeats or (3 if smoke else 25)}
    if "operators" in only or "losses" in only:
        cfg["vocab_shapes"] = SMOKE_VOCAB if smoke else VOCAB_SHAPES
        cfg["operator_dtypes"] = ["float32", "bfloat16"]
        cfg["loss_dtypes"] = ["float32", "bfloat16"]
    if "operators" in only:
        cfg["attention_row_shape"] = SMOKE_ATTENTION if smoke else ATTENTION_SHAPE
    if "fused" in only:
        cfg["fused_shape"] = SMOKE_FUSED if smoke else FUSED_SHAPE
        cfg["fused_dtype"] = "bfloat16"
    if "attention" in only:
        cfg["attention"] = {"batch_heads": attention_gpu.SMOKE_BH if smoke else (attention_gpu.B, attention_gpu.H),
                            "causal_headdim_length": attention_gpu.chosen_shapes(smoke),
                            "variants": attention_gpu.chosen_variants(smoke),
                            "structured": [st._asdict() for st in attention_gpu.chosen_structured(smoke)],
                            "limits_s": [attention_gpu.IMPL_LIMIT_S, attention_gpu.PEER_LIMIT_S],
                            "dtype": "bfloat16"}
    if "decode" in only:
        cfg["decode"] = {"cache_lens": list(decode_gpu.SMOKE_CACHE_LENS if smoke else decode_gpu.CACHE_LENS),
                         "batch_heads_kv_heads_head_dim": list(decode_gpu.SMOKE_SHAPE if smoke else decode_gpu.SHAPE),
                         "dtype": "bfloat16"}
    if "peers" in only:
        cfg["peer_shapes"] = SMOKE_PEER_SHAPES if smoke else PEER_SHAPES
        cfg["peer_dtypes"] = ["float32", "bfloat16"]
        cfg["peer_fused_shapes"] = SMOKE_PEER_FUSED if smoke else PEER_FUSED_SHAPES
    return cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, few repeats")
    ap.add_argument("--only", choices=SECTIONS, nargs="+", help="sections (default: all but peers)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--no-package", action="store_true", help="do not time the reference entmax package")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        ap.error(f"--repeats must be a positive number of timed calls, got {args.repeats}")
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        ap.error(f"--device: {err}")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("run_gpu.py: no CUDA device here (use --device cpu --smoke to check the script)", file=sys.stderr)
        return 2
    if device.type == "cuda" and not _triton_rows.available():
        print("run_gpu.py: Triton is not importable: the GPU kernels would not run", file=sys.stderr)
        return 2
    only = set(args.only or ["operators", "losses", "fused", "attention", "decode"])
    repeats = args.repeats or (3 if args.smoke else 25)
    vocab = SMOKE_VOCAB if args.smoke else VOCAB_SHAPES
    attention = SMOKE_ATTENTION if args.smoke else ATTENTION_SHAPE
    name = "gpu-" + device_name(device).replace(" ", "-").lower() + ".json"
    path = args.json_path or os.path.join(RESULTS, name)
    env = environment(device)
    print(f"device: {env['device']}; torch {env['torch']} (CUDA {env['torch_cuda']}), triton {env['triton']}, "
          f"driver {env.get('driver')}; peers {env['peers']}", flush=True)
    result = {"device": env["device"], "torch": torch.__version__, "softargmax": sa.__version__,
              "triton": env["triton"], "environment": env, "config": _section_config(args, only),
              "complete": False, "sections_done": [], "errors": {}, "copy_gbps": None,
              "cases": [], "loss_cases": [], "fused": None, "attention": [], "decode": []}
    if "peers" in only:
        result["peers"] = {"operators": [], "fused": []}
    record = Record(path, result)
    copy_gbps = copy_bandwidth(device, gib=0.01 if args.smoke else 1.0, repeats=repeats)
    result["copy_gbps"] = round(copy_gbps, 1)
    record.save()
    print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)

    sections = {
        "operators": lambda: [operator_cases(shapes, [torch.float32, torch.bfloat16], device, repeats, copy_gbps,
                                             not args.no_package, emit=record.adder("cases"))
                              for shapes in (vocab, [attention])],
        "losses": lambda: loss_cases(vocab, device, repeats, emit=record.adder("loss_cases")),
        "fused": lambda: record.setter("fused")(fused_case(SMOKE_FUSED if args.smoke else FUSED_SHAPE, device,
                                                           max(3, repeats // 5))),
        "attention": lambda: attention_gpu.attention_cases(device, 1 if args.smoke else max(5, repeats // 2),
                                                           smoke=args.smoke, emit=record.adder("attention"),
                                                           save=record.save),
        "decode": lambda: decode_gpu.decode_cases(device, max(5, repeats), peak_extra_mb, smoke=args.smoke,
                                                  emit=record.adder("decode")),
        "peers": lambda: run_peers(args, device, repeats, emit_operators=record.adder("peers", "operators"),
                                   emit_fused=record.adder("peers", "fused")),
    }
    for section in SECTIONS:
        if section not in only:
            continue
        try:
            sections[section]()
            result["sections_done"].append(section)
        except Exception as err:  # recorded; the next section still runs
            traceback.print_exc()
            result["errors"][section] = f"{type(err).__name__}: {str(err)[:500]}"
            if device.type == "cuda":
                torch.cuda.empty_cache()
        record.save()
    result["complete"] = True
    record.save()
    print(f"wrote {path}" + (f"; sections that failed: {', '.join(result['errors'])}" if result["errors"] else ""))
    return 1 if result["errors"] else 0


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


def peer_operator_cases(shapes, dtypes, device, repeats, log=print, emit=None):
    """Forward+backward time of each installed peer next to ours and softmax, with the peer's
    largest absolute error against our exact result (float32 compute) on the same input."""
    cases = []
    peers = peer_operators()
    if not peers:
        log("peers: none of adasplash, liger_kernel is installed")
        skipped = {"op": "peers", "skipped": "none of adasplash, liger_kernel is installed"}
        if emit is not None:
            emit(skipped)
        return [skipped]
    for dtype in dtypes:
        for shape in shapes:
            gen = torch.Generator().manual_seed(0)
            x = (torch.randn(*shape, generator=gen) * 3).to(device=device, dtype=dtype)
            grad = torch.randn_like(x)
            thunks = {"softmax": _fwd_bwd(lambda t: torch.softmax(t, -1), x, grad)}
            errors = {}
            first = first_calls(dict(thunks), device)
            for op, fns in peers.items():
                ours = OPERATORS[op]
                thunks[op] = _fwd_bwd(ours, x, grad)
                first.update(first_calls({op: thunks[op]}, device))
                exact = ours(x.float())
                for peer, fn in fns.items():
                    try:
                        run = _fwd_bwd(fn, x, grad)
                        # its first call, backward too (compilation, autotuning): a peer that fails is recorded, not timed
                        first[f"{peer}:{op}"] = first_calls({peer: run}, device)[peer]
                        errors[(op, peer)] = float((fn(x).float() - exact).abs().max())
                        thunks[f"{peer}:{op}"] = run
                    except Exception as err:  # a shape or dtype the peer refuses
                        errors[(op, peer)] = f"error: {type(err).__name__}: {str(err)[:200]}"
            times = time_thunks(thunks, repeats, max(2, repeats // 5), device)
            for (op, peer), err in errors.items():
                key = f"{peer}:{op}"
                case = {"op": op, "peer": peer, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                        "pass": "fwd+bwd", "ours_ms": round(times[op], 4), "softmax_ms": round(times["softmax"], 4),
                        "peer_ms": round(times[key], 4) if key in times else None,
                        "ours_first_call_ms": round(first[op], 3),
                        "peer_first_call_ms": round(first[key], 3) if key in first else None,
                        "peer_max_abs_error": err}
                cases.append(case)
                if emit is not None:
                    emit(case)
                log(f"{peer:>10} {op:>12} {case['dtype']:>8} {shape[0]:>6}x{shape[1]:<7} ours {case['ours_ms']:8.3f} ms"
                    f"  peer {case['peer_ms']} ms  softmax {case['softmax_ms']:.3f} ms  peer error {err}  first calls: "
                    f"ours {case['ours_first_call_ms']} ms, peer {case['peer_first_call_ms']} ms")
    return cases


def _dense_gemms(fn):
    """``fn`` with the fused loss's tile-skipping products turned off (its gradients are computed in the forward)."""
    from softargmax.backends.triton import tile_gemms

    def run(*args):
        old = tile_gemms.set_enabled(False)
        try:
            return fn(*args)
        finally:
            tile_gemms.set_enabled(old)

    return run


def peer_fused_cases(shapes, device, repeats, log=print, emit=None):
    """Fused linear + loss (bf16): ours (entmax15, KL) against torch linear + cross_entropy,
    Liger's ``LigerFusedLinearCrossEntropyFunction``, Cut-Cross-Entropy's ``linear_cross_entropy``
    and ``torch.nn.functional.linear_cross_entropy`` where installed (chunked, ``options=LinearCrossEntropyOptions()``,
    and its reference path, ``options=None``); time, peak extra memory,
    and each cross-entropy's loss against our fused KL loss.  A comparison that is not available
    (a peer not installed, a torch without ``F.linear_cross_entropy``) is recorded once as
    ``{"op": name, "skipped": why}``.

    Every shape runs on the peer benchmark's logits (``"logits": "benchmark"``: std about 0.02, where
    1.5-entmax keeps about 16% of the classes, scattered); the first shape also on logits with a trained
    model's support clustered by topic (``"logits": "realistic"``, ``fused_inputs.realistic_inputs``),
    where our sparse losses' backward skips most tiles of the gradient (``ours_entmax15_dense_gemms``: the same
    loss with cuBLAS's dense products instead, what the skipping gains or costs).  ``ours_entmax15``'s case records
    ``tiles_skipped``: the share of the gradient's 64 × 64 tiles that are all zero on those inputs
    (``fused_inputs.skipped_tiles``, computed apart from the timed calls)."""
    runs = {
        "ours_entmax15": lambda h, w, t: sa.linear_fenchel_young_loss(h, w, t, mapping="entmax15"),
        # the same with the dense GEMMs (cuBLAS) instead of the tile-skipping ones: what the skipping gains or costs
        "ours_entmax15_dense_gemms": _dense_gemms(lambda h, w, t: sa.linear_fenchel_young_loss(h, w, t, mapping="entmax15")),
        "ours_kl": lambda h, w, t: sa.linear_fenchel_young_loss(h, w, t, mapping="softmax"),
        "torch_linear_ce": lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t),
    }
    cases = []

    def record(case):
        cases.append(case)
        if emit is not None:
            emit(case)

    if hasattr(F, "linear_cross_entropy"):
        # PyTorch's chunked path needs options; options=None is its reference path (the logits materialized)
        runs["torch_linear_cross_entropy"] = lambda h, w, t: F.linear_cross_entropy(
            h, w, t, options=torch.nn.LinearCrossEntropyOptions())
        runs["torch_linear_cross_entropy_reference"] = lambda h, w, t: F.linear_cross_entropy(h, w, t)
    else:
        record({"op": "torch_linear_cross_entropy",
                "skipped": f"torch.nn.functional.linear_cross_entropy is absent in torch {torch.__version__}"})
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        runs["liger_flce"] = lambda h, w, t: LigerFusedLinearCrossEntropyFunction.apply(h, w, t)[0]
    except Exception as err:
        record({"op": "liger_flce", "skipped": f"liger_kernel: {type(err).__name__}: {str(err)[:200]}"})
    try:
        from cut_cross_entropy import linear_cross_entropy

        runs["cce"] = lambda h, w, t: linear_cross_entropy(h, w, t)
        # CCE's default filter skips the gradient tiles whose entries are all below bf16 eps/32: on these
        # inputs most of the softmax part of the gradient.  filter_eps=None computes the whole gradient
        runs["cce_no_filter"] = lambda h, w, t: linear_cross_entropy(h, w, t, filter_eps=None)
    except Exception as err:
        record({"op": "cce", "skipped": f"cut_cross_entropy: {type(err).__name__}: {str(err)[:200]}"})
    # the realistic logits right after the first shape's benchmark ones: a time-limited run keeps both
    cases_in_order = [(shape, "benchmark") for shape in shapes[:1]] + [(shape, "realistic") for shape in shapes[:1]] \
        + [(shape, "benchmark") for shape in shapes[1:]]
    for (N, H, V), kind in cases_in_order:
        h, w, t = fused_inputs.inputs(kind, N, H, V)
        h, w, t = h.to(device, torch.bfloat16), w.to(device, torch.bfloat16), t.to(device)
        try:
            skipped = fused_inputs.skipped_tiles(h, w, t, "entmax15")["tiles_skipped"]
        except Exception as err:  # (out of memory): recorded, the timings still run
            skipped = f"error: {type(err).__name__}: {str(err)[:200]}"
        reference = None
        for name, fn in runs.items():
            def run():
                hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
                loss = fn(hh, ww, t)
                loss.backward()
                return loss

            try:
                _sync(device)
                t0 = time.perf_counter()
                value = float(run().detach())  # the first call: compilation and autotuning included
                first_ms = (time.perf_counter() - t0) * 1e3
                peak, baseline = peak_extra_mb(run, device)  # a warm call, from the same baseline for every one
                ms = time_thunks({name: run}, repeats, 1, device)[name]
            except Exception as err:
                record({"op": name, "shape": [N, H, V], "logits": kind, "error": f"{type(err).__name__}: {str(err)[:200]}"})
                log(f"{name:>28} {N}x{H}x{V} {kind}: error {err}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            if name == "ours_kl":
                reference = value
            case = {"op": name, "shape": [N, H, V], "logits": kind, "dtype": "bfloat16", "pass": "fwd+bwd",
                    "ms": round(ms, 3), "first_call_ms": round(first_ms, 3),
                    "peak_extra_mb": None if peak is None else round(peak, 1),
                    "baseline_mb": None if baseline is None else round(baseline, 1), "loss": value}
            if name == "ours_entmax15":
                case["tiles_skipped"] = skipped
            if reference is not None and not name.startswith("ours_"):
                case["loss_error_vs_ours_kl"] = abs(value - reference)  # ours_kl runs second, before any peer
            record(case)
            log(f"{name:>28} {N}x{H}x{V} {kind}: {ms:9.2f} ms  peak extra {case['peak_extra_mb']} MB  loss {value:.6f}  "
                f"first call {first_ms:.1f} ms" + (f"  tiles skipped {skipped}" if name == "ours_entmax15" else ""))
    return cases


def run_peers(args, device, repeats, log=print, emit_operators=None, emit_fused=None) -> dict:
    """The ``--only peers`` section: the fused output layer, then the operators, against the installed peers.

    The fused layer goes first: its comparison with Cut-Cross-Entropy and Liger-Kernel is what a time-limited run
    must not lose (on 2026-11-28 the section was stopped after 12 operator cases, before it)."""
    shapes = SMOKE_PEER_SHAPES if args.smoke else PEER_SHAPES
    fused = SMOKE_PEER_FUSED if args.smoke else PEER_FUSED_SHAPES
    fused_cases = peer_fused_cases(fused, device, max(3, repeats // 5), log, emit=emit_fused)
    return {"operators": peer_operator_cases(shapes, [torch.float32, torch.bfloat16], device, repeats, log,
                                             emit=emit_operators),
            "fused": fused_cases}


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
