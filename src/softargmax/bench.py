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


def time_thunks(thunks: dict, repeats: int, warmup: int, device=torch.device("cpu")) -> dict:
    """Median milliseconds of each zero-argument callable, interleaved within every repeat.

    Interleaving makes a slow phase of a shared machine affect every callable alike, so
    their ratios stay meaningful.
    """
    for _ in range(warmup):
        for run in thunks.values():
            run()
    times = {name: [] for name in thunks}
    for _ in range(repeats):
        for name, run in thunks.items():
            _sync(device)
            t0 = time.perf_counter()
            run()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def time_calls(fns: dict, x: torch.Tensor, pas: str, repeats: int, warmup: int) -> dict:
    """Median milliseconds of each ``fn(x)`` (``pas="fwd"``) or ``fn`` + backward (``"fwd+bwd"``)."""
    return time_thunks({name: _runner(fn, x, pas) for name, fn in fns.items()}, repeats, warmup, x.device)


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
        "cpu_solver": _cpu_solver() if device.type == "cpu" else None,
        "input": "randn * 3",
        "repeats": repeats,
        "cases": cases,
    }


def _cpu_solver() -> str:
    """Which CPU solver the covered operators used: the fused C row solver or the PyTorch path."""
    from .backends.cpu import rows as _cpu_rows

    return "fused C row solver" if _cpu_rows.enabled() and _cpu_rows.available() else "PyTorch path"


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


# ----------------------------------------------------------------------------------
# losses
# ----------------------------------------------------------------------------------

LOSS_SHAPES = [(64, 32000)]
FUSED_SHAPE = (4096, 512, 32000)  # tokens, hidden, vocabulary


def _loss_ops() -> dict[str, Callable]:
    return {
        "sparsemax_loss": lambda x, t: sa.sparsemax_loss(x, t),
        "entmax15_loss": lambda x, t: sa.entmax15_loss(x, t),
        "entmax_loss_a1.3": lambda x, t: sa.entmax_loss(x, t, alpha=1.3),
        "alpha_relu_loss": lambda x, t: sa.alpha_relu_loss(x, t, alpha=1.5, tau=0.3),
        "kl_loss": lambda x, t: sa.fenchel_young_loss(x, t, "softmax"),
    }


def _loss_package() -> dict[str, dict[str, Callable]]:
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


LOSS_TARGETS = {"sparsemax_loss": 3.0, "entmax15_loss": 3.0}


def _time_losses(fns: dict, x, t, repeats: int, warmup: int) -> dict:
    """Forward+backward of ``fn(x, t)`` for each loss, interleaved."""
    def runner(fn):
        def run():
            xx = x.detach().requires_grad_(True)
            torch.autograd.grad(fn(xx, t), xx)
        return run

    return time_thunks({name: runner(fn) for name, fn in fns.items()}, repeats, warmup)



_PEAK_RSS = r"""
def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024  # MiB
def measure_peak(fn):
    # reset the peak resident set (Linux: write 5 to clear_refs), run, report the growth
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = _status("VmRSS:")
    fn()
    return _status("VmHWM:") - before
"""

_FUSED_CHILD = _PEAK_RSS + r"""
import json, resource, sys, time, torch, softargmax as sa
torch.set_num_threads(int(sys.argv[5]))
variant, N, d, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
g = torch.Generator().manual_seed(0)
h = torch.randn(N, d, generator=g).requires_grad_()
W = (torch.randn(V, d, generator=g) / d ** 0.5).requires_grad_()
t = torch.randint(0, V, (N,), generator=g)
def run():
    if variant == "fused":
        loss = sa.linear_fenchel_young_loss(h, W, t, mapping="entmax15")
    else:
        loss = sa.entmax15_loss(h @ W.T, t)
    gh, gw = torch.autograd.grad(loss, (h, W))
    return loss
peak_mb = measure_peak(run)
times = []
for _ in range(int(sys.argv[6])):
    t0 = time.perf_counter(); run(); times.append(time.perf_counter() - t0)
times.sort()
print(json.dumps({"ms": times[len(times) // 2] * 1e3, "peak_mb": peak_mb}))
"""


def fused_case(shape=FUSED_SHAPE, threads: int = 2, repeats: int = 3, log=print) -> dict:
    """Fused linear + entmax15 loss vs ``linear`` followed by the loss: time and extra peak memory.

    Each variant runs in a fresh subprocess; memory is the growth of the peak resident set
    during the first forward+backward (inputs already allocated; the peak is reset first
    through ``/proc/self/clear_refs``).
    """
    import subprocess

    N, d, V = shape
    res = {}
    for variant in ("unfused", "fused"):
        out = subprocess.run(
            [sys.executable, "-c", _FUSED_CHILD, variant, str(N), str(d), str(V), str(threads), str(repeats)],
            capture_output=True, text=True, check=True,
        )
        res[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    case = {
        "op": "linear+entmax15_loss (fused)",
        "shape": [N, d, V],
        "dtype": "float32",
        "pass": "fwd+bwd",
        "ms": round(res["fused"]["ms"], 2),
        "baseline": "linear then entmax15_loss (unfused)",
        "baseline_ms": round(res["unfused"]["ms"], 2),
        "ratio": round(res["fused"]["ms"] / res["unfused"]["ms"], 3),
        "peak_mb": round(res["fused"]["peak_mb"], 1),
        "baseline_peak_mb": round(res["unfused"]["peak_mb"], 1),
        "memory_ratio": round(res["fused"]["peak_mb"] / max(res["unfused"]["peak_mb"], 1e-9), 3),
        "target": 1.3,
        "memory_target": 0.25,
    }
    log(f"{case['op']:<30} {str(tuple(shape)):<20} {case['ms']:>9.1f} ms vs {case['baseline_ms']:.1f} ms "
        f"({case['ratio']:.2f}x, target <= 1.3x); peak +{case['peak_mb']:.0f} MB vs +{case['baseline_peak_mb']:.0f} MB "
        f"({case['memory_ratio']:.2f}, target <= 0.25)")
    return case


def run_losses(shapes=None, threads: Optional[int] = 2, repeats: int = 20, warmup: int = 3, with_package: bool = True,
               fused: bool = True, fused_shape=FUSED_SHAPE, seed: int = 0, log=print) -> dict:
    """Loss benchmark: forward+backward vs ``F.cross_entropy``, and the fused output layer."""
    import torch.nn.functional as F

    if threads is not None:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    ours = _loss_ops()
    package = _loss_package() if with_package else {}
    cases = []
    for shape in [tuple(s) for s in (shapes or LOSS_SHAPES)]:
        x = torch.randn(*shape, generator=gen) * 3
        t = torch.randint(0, shape[1], (shape[0],), generator=gen)
        for name, fn in ours.items():
            ms = _time_losses({"cross_entropy": F.cross_entropy, name: fn}, x, t, repeats, warmup)
            case = {
                "op": name, "shape": list(shape), "dtype": "float32", "pass": "fwd+bwd",
                "ms": round(ms[name], 4), "softmax_ms": round(ms["cross_entropy"], 4), "baseline": "F.cross_entropy",
                "ratio": round(ms[name] / ms["cross_entropy"], 3), "target": LOSS_TARGETS.get(name),
            }
            if name in package:
                pk = _time_losses({"cross_entropy": F.cross_entropy, **package[name]}, x, t, max(3, repeats // 4), 1)
                case["entmax_pkg"] = {v: {"ms": round(pk[v], 4), "ratio": round(pk[v] / pk["cross_entropy"], 2)} for v in package[name]}
            cases.append(case)
            log(_row(case))
    if fused:
        cases.append(fused_case(fused_shape, threads or torch.get_num_threads(), log=log))
    return {
        "device": device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "softargmax": sa.__version__,
        "python": sys.version.split()[0],
        "threads": torch.get_num_threads(),
        "input": "randn * 3, uniform random class indices",
        "repeats": repeats,
        "cases": cases,
    }


# ----------------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------------

ATTENTION_LENGTHS = (128, 256, 512, 1024, 2048)
ATTENTION_VARIANTS = ("sdpa", "softmax", "sparsemax", "entmax15", "entmax_per_head")

_ATTN_CHILD = _PEAK_RSS + r"""
import json, resource, sys, torch, torch.nn.functional as F, softargmax as sa
torch.set_num_threads(int(sys.argv[4]))
variant, L, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, H, L, 64, generator=g).requires_grad_() for _ in range(3))
alpha = torch.linspace(1.2, 1.8, H)
def run():
    if variant == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif variant == "entmax_per_head":
        out = sa.attention(q, k, v, is_causal=True, mapping="entmax", alpha=alpha)
    else:
        out = sa.attention(q, k, v, is_causal=True, mapping=variant)
    out.sum().backward()
run()  # warm up allocator and kernels once
print(json.dumps({"peak_mb": measure_peak(run)}))
"""


def _attention_fn(variant: str, alpha):
    import torch.nn.functional as F

    if variant == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if variant == "entmax_per_head":
        return lambda q, k, v: sa.attention(q, k, v, is_causal=True, mapping="entmax", alpha=alpha)
    return lambda q, k, v: sa.attention(q, k, v, is_causal=True, mapping=variant)


def run_attention(lengths=ATTENTION_LENGTHS, heads: int = 8, threads: Optional[int] = 2, repeats: int = 5,
                  memory: bool = True, log=print) -> dict:
    """Causal self-attention forward+backward (batch 1, ``heads`` × 64 features) vs ``scaled_dot_product_attention``."""
    import subprocess

    if threads is not None:
        torch.set_num_threads(threads)
    alpha = torch.linspace(1.2, 1.8, heads)
    cases = []
    for L in lengths:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, L, 64, generator=g) for _ in range(3))

        def runner(fn):
            def run():
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                fn(qq, kk, vv).sum().backward()
            return run

        ms = time_thunks({var: runner(_attention_fn(var, alpha)) for var in ATTENTION_VARIANTS}, repeats, 1)
        peaks = {}
        if memory:
            for var in ATTENTION_VARIANTS:
                out = subprocess.run([sys.executable, "-c", _ATTN_CHILD, var, str(L), str(heads), str(threads or 2)],
                                     capture_output=True, text=True, check=True)
                peaks[var] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]
        for var in ATTENTION_VARIANTS[1:]:
            case = {"op": f"attention[{var}]", "shape": [1, heads, L, 64], "dtype": "float32", "pass": "fwd+bwd",
                    "ms": round(ms[var], 3), "softmax_ms": round(ms["sdpa"], 3), "baseline": "F.scaled_dot_product_attention",
                    "ratio": round(ms[var] / ms["sdpa"], 3), "target": None}
            if memory:
                case.update({"peak_mb": round(peaks[var], 1), "baseline_peak_mb": round(peaks["sdpa"], 1),
                             "memory_ratio": round(peaks[var] / max(peaks["sdpa"], 1e-9), 2)})
            cases.append(case)
            mem = f", peak +{case['peak_mb']:.0f} MB vs +{case['baseline_peak_mb']:.0f} MB" if memory else ""
            log(f"{case['op']:<28} L={L:<5} {case['ms']:>9.2f} ms vs sdpa {case['softmax_ms']:>8.2f} ms ({case['ratio']:.2f}x){mem}")
    return {
        "device": device_name(torch.device("cpu")), "torch": torch.__version__, "softargmax": sa.__version__,
        "python": sys.version.split()[0], "threads": torch.get_num_threads(),
        "input": "randn, causal self-attention, batch 1, 64 features per head", "repeats": repeats, "cases": cases,
    }
