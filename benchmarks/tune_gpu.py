"""Tune the Triton kernels' launch settings by measuring: tiles and warps of the row kernels and the fused attention.

The kernels' built-in tiles were read off sm_90 register reports (no spills), never timed.  This
script times forward+backward for a grid of settings around them, through
``softargmax.backends.triton.launch.overridden``, checks every setting's output against the
built-in one (a setting that changes the answer is reported and never chosen), and prints per
case the built-in time, the best time and its setting, beside ``torch.softmax`` (rows) or SDPA
(attention).  Results go to JSON after every case (so a run stopped by its deadline keeps what it
measured), with the device and versions.

    python benchmarks/tune_gpu.py --json OUT/tune.json [--only rows attention] [--budget 240]
    python benchmarks/tune_gpu.py --device cpu --smoke --json /tmp/tune.json   # the plumbing, in Triton's interpreter

Each setting is compiled on first use (about a second each on a GPU), so the grid is kept small and
ordered nearest the built-in setting first; ``--budget`` seconds stops the sweep (the cases measured
so far are kept).  The next step, in the library, is to write the winners into the tables of
``softargmax.backends.triton.rows._tile`` and ``flash_attention.blocks``, with the measured times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.bench import device_name, save, time_thunks
from softargmax.bench.timing import versions

ROW_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sparsemax": sa.sparsemax,
    "entmax15": sa.entmax15,
    "entmax_a1.3": lambda x: sa.entmax(x, 1.3),
}
#: (rows, row length): attention-shaped, a 32k and a 128k vocabulary (the last on the streamed kernels)
ROW_SHAPES = [(65536, 512), (4096, 32768), (1024, 131072)]
ATTENTION_CASES = [  # (B, H, L, D, causal)
    (2, 16, 4096, 64, True), (2, 16, 8192, 64, True), (2, 16, 4096, 128, True), (2, 16, 4096, 64, False)]
SMOKE_ROWS = [(8, 50)]
SMOKE_ATTENTION = [(1, 1, 32, 16, True)]


def row_candidates(k: int, smoke: bool, register_max: int = 16384) -> list[dict[str, int]]:
    """Settings to try for rows of length ``k``: rows per program and warps of the register kernels
    (2 to 64 scores per thread), or chunk length and warps of the streamed ones."""
    if smoke:
        return [{"rows_per_program": 1}, {"rows_per_program": 4}] if k <= 1024 else [{"long_block": 32}]
    if k > register_max:
        return [{"long_block": b, "long_warps": w} for b in (2048, 4096, 8192) for w in (4, 8, 16, 32)]
    block = max(16, 1 << (k - 1).bit_length())
    out = []
    for rows in (1, 2, 4, 8, 16, 32):
        for warps in (2, 4, 8, 16, 32):
            per_thread = rows * block // (32 * warps)
            if rows * block <= 16384 and 2 <= per_thread <= 64:
                out.append({"rows_per_program": rows, "warps": warps})
    return out


def attention_candidates(D: int, smoke: bool) -> list[dict[str, int]]:
    """Tiles (queries × keys) and warps to try at head dimension ``D``."""
    if smoke:
        return [{"block_m": 32, "block_n": 16}]
    tiles = [(64, 32), (64, 64), (128, 32), (32, 32), (128, 64), (32, 64)] if D <= 64 else \
        [(32, 32), (64, 32), (32, 64), (64, 64)]
    return [{"block_m": m, "block_n": n, "warps": w} for m, n in tiles for w in (4, 8)]


def _fwd_bwd(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
    """Forward+backward of ``fn(*inputs)``, whose output has the first input's shape, with a fixed
    output gradient (the same for every setting, so their answers compare)."""
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1)).to(inputs[0])

    def run() -> tuple[torch.Tensor, ...]:
        xs = [x.detach().requires_grad_(True) for x in inputs]
        y = fn(*xs)
        return (y.detach(), *torch.autograd.grad(y, xs, grad))

    return run


def _max_rel_diff(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> float:
    """The largest ``max|x - y| / max|y|`` over the outputs and gradients (rounding scales with the values)."""
    return max(float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30))
               for x, y in zip(a, b))


def sweep(run_with: Callable[[dict[str, int]], Callable[[], tuple[torch.Tensor, ...]]],
          candidates: list[dict[str, int]], baseline: Callable[[], object], rtol: float, device: torch.device,
          repeats: int, deadline: float) -> dict[str, Any]:
    """Time the built-in setting (``{}``) with the baseline, then each candidate interleaved with the built-in
    setting (so that a slow phase of the machine affects both: ``speedup`` is their ratio in that run);
    ``run_with(setting)`` gives a forward+backward thunk under that setting.  A candidate whose answer
    differs from the built-in one by more than ``rtol`` (relative to the largest value) is recorded and
    not chosen."""
    default = run_with({})
    reference = default()
    tried: list[dict[str, Any]] = []
    times = time_thunks({"default": default, "baseline": baseline}, repeats, 2, device)
    for setting in candidates:
        if time.monotonic() > deadline:
            break
        run = run_with(setting)
        try:
            diff = _max_rel_diff(run(), reference)
            pair = time_thunks({"default": default, "candidate": run}, repeats, 2, device)
        except Exception as exc:  # a setting the compiler refuses (too many registers, shared memory)
            tried.append({"setting": setting, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            continue
        tried.append({"setting": setting, "ms": round(pair["candidate"], 4), "default_ms": round(pair["default"], 4),
                      "speedup": round(pair["default"] / pair["candidate"], 3), "max_rel_diff": diff,
                      "same_answer": diff <= rtol})
    good = [t for t in tried if t.get("same_answer")]
    best = max(good, key=lambda t: t["speedup"]) if good else None
    return {"default_ms": round(times["default"], 4), "baseline_ms": round(times["baseline"], 4),
            "best": best, "speedup": best["speedup"] if best else None,
            "tried": tried, "complete": len(tried) == len(candidates)}


def tune_rows(shapes: list[tuple[int, int]], dtypes: list[torch.dtype], device: torch.device, repeats: int,
              deadline: float, smoke: bool, record: Callable[[dict[str, Any]], None]) -> bool:
    """Sweep every row case; ``True`` if the deadline stopped it before the last case."""
    from softargmax.backends.triton.launch import RowLaunch, overridden

    for dtype in dtypes:
        for shape in shapes:
            x = (torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3).to(device, dtype)
            softmax = _fwd_bwd(lambda t: torch.softmax(t, -1), x)
            for name, fn in ROW_OPS.items() if not smoke else [("entmax15", sa.entmax15)]:
                if time.monotonic() > deadline:
                    return True

                def run_with(setting: dict[str, int], fn: Callable[[torch.Tensor], torch.Tensor] = fn) -> Callable:
                    thunk = _fwd_bwd(fn, x)

                    def run() -> tuple[torch.Tensor, ...]:
                        with overridden(rows=RowLaunch(**setting)):
                            return thunk()
                    return run

                rtol = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16: a few units of its 2^-7 rounding
                result = sweep(run_with, row_candidates(shape[1], smoke), softmax, rtol, device, repeats, deadline)
                record({"section": "rows", "op": name, "shape": list(shape), "dtype": str(dtype)[6:],
                        "baseline": "torch.softmax", **result})
    return False


def tune_attention(cases: list[tuple[int, int, int, int, bool]], device: torch.device, repeats: int, deadline: float,
                   smoke: bool, record: Callable[[dict[str, Any]], None]) -> bool:
    """Sweep every attention case; ``True`` if the deadline stopped it before the last case."""
    from softargmax.backends.triton.flash_attention import flash_attention
    from softargmax.backends.triton.launch import AttentionLaunch, overridden

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for B, H, L, D, causal in cases:
        if time.monotonic() > deadline:
            return True
        g = torch.Generator().manual_seed(0)
        q, k, v = ((torch.randn(B, H, L, D, generator=g)).to(device, dtype) for _ in range(3))
        sdpa = _fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v)

        def run_with(setting: dict[str, int], causal: bool = causal) -> Callable:
            thunk = _fwd_bwd(lambda a, b, c: flash_attention(a, b, c, mapping="entmax15", is_causal=causal), q, k, v)

            def run() -> tuple[torch.Tensor, ...]:
                with overridden(attention=AttentionLaunch(**setting)):
                    return thunk()
            return run

        rtol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        result = sweep(run_with, attention_candidates(D, smoke), sdpa, rtol, device, repeats, deadline)
        record({"section": "attention", "op": "entmax15", "shape": [B, H, L, D], "causal": causal,
                "dtype": str(dtype)[6:], "baseline": "SDPA", **result})
    return False


def _line(case: dict[str, Any]) -> str:
    best = case["best"]
    won = f"{best['ms']:9.3f} ms {best['setting']}" if best else "none kept"
    return (f"{case['section']:<9} {case['op']:<12} {case['dtype']:<9} {str(case['shape']):<22} "
            f"built-in {case['default_ms']:9.3f} ms  best {won}  x{case['speedup'] or 0:.2f}  "
            f"({case['baseline']} {case['baseline_ms']:.3f} ms){'' if case['complete'] else '  [grid cut by the deadline]'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", choices=["rows", "attention"], nargs="+", default=["rows", "attention"])
    ap.add_argument("--budget", type=float, default=240.0, help="seconds before the sweep stops (default 240)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and grids (the plumbing)")
    ap.add_argument("--json", dest="json_path", required=True)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("tune_gpu.py: no CUDA device (use --device cpu --smoke for the plumbing)", file=sys.stderr)
        return 2
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("tune_gpu.py: on the CPU the kernels run only in Triton's interpreter: set TRITON_INTERPRET=1",
                  file=sys.stderr)
            return 2
        from softargmax.backends.triton import rows

        rows.set_cpu_interpret(True)
    deadline = time.monotonic() + args.budget
    repeats = args.repeats or (3 if args.smoke else 20)
    result: dict[str, Any] = {"device": device_name(device), **versions(), "budget_s": args.budget,
                              "repeats": repeats, "pass": "fwd+bwd", "cases": []}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        result["triton"] = None

    def record(case: dict[str, Any]) -> None:
        result["cases"].append(case)
        save(result, args.json_path)
        print(_line(case), flush=True)

    cut = False
    if "rows" in args.only:
        dtypes = [torch.float32] if args.smoke else [torch.float32, torch.bfloat16]
        cut |= tune_rows(SMOKE_ROWS if args.smoke else ROW_SHAPES, dtypes, device, repeats, deadline, args.smoke,
                         record)
    if "attention" in args.only:
        cut |= tune_attention(SMOKE_ATTENTION if args.smoke else ATTENTION_CASES, device, repeats, deadline,
                              args.smoke, record)
    result["stopped_by_deadline"] = cut or not all(case["complete"] for case in result["cases"])
    save(result, args.json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
