"""Calibrate the structured attention inputs' knob (the locality ``λ``) on the CPU.

    PYTHONPATH=src python benchmarks/calibrate_attention_inputs.py \\
        --json benchmarks/results/attention-structured-inputs.json

writes how the block sparsity of causal 1.5-entmax depends on ``λ`` and on the length ``L``
(``attention_inputs.py`` builds the inputs and states why they resemble trained attention), and the
``λ`` that the GPU benchmark (``attention_gpu.py``, ``STRUCTURED``) uses for each target:

1. **The knob** (``chosen``, first): at each ``(D, L)`` of the benchmark, the reference
   :func:`attention_inputs.block_sparsity` (float64, from the scores, without the kernels) over a grid of
   ``λ`` (``curve``), then for each target ``λ`` interpolated linearly in ``log λ`` between the grid's
   neighbours (the block sparsity grows with ``λ``), rounded to 3 significant digits, and measured again
   there (``cpu_block_sparsity``; one more interpolation if it missed by more than 0.02).  One head of
   bfloat16 inputs (seed 0), at the tiles the GPU uses (``flash_attention.blocks(D, cuda, bfloat16)``:
   64 × 64 at D = 64, 64 × 16 at D = 128).
2. **The kernels' count** (``interpreter``): :func:`softargmax.backends.triton.flash_attention.forward_stats`
   in Triton's interpreter (a subprocess with ``TRITON_INTERPRET=1``; slow: one head at L = 512, about 20 s
   a call on an idle core), at the same tiles, beside the reference on the same inputs: they agree.  It runs
   last (after 3).
3. The reference's block sparsity over a grid of ``λ`` at the shorter lengths (``curve``): how it grows
   with ``L``.

The block sparsity of the 4096-, 8192- and 16384-long cases is measured on the GPU by the benchmark run
itself (every case records ``forward_stats``'s ``block_sparsity`` for the fused kernels); the values
here are the CPU's prediction of it.  About 5 minutes on an idle core; the JSON is written after each part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import attention_inputs as AI  # noqa: E402
import torch  # noqa: E402

#: ``(head dim, length): targets`` of the benchmark's structured cases
TARGETS = {(64, 4096): (0.5, 0.7, 0.85), (128, 8192): (0.7,), (64, 16384): (0.5, 0.7, 0.85)}
#: the interpreter's points: ``(head dim, length, λ)`` (λ = 0: random inputs)
INTERPRETER_POINTS = [(64, 512, 0.0), (64, 512, 20.0), (128, 512, 40.0)]
#: the grid of λ at each ``(head dim, length)`` of the benchmark (around its targets), and at the shorter lengths
GRIDS = {(64, 4096): (5.0, 10.0, 20.0, 40.0, 80.0), (64, 16384): (5.0, 10.0, 20.0, 40.0), (128, 8192): (5.0, 10.0, 20.0)}
GRID = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
SHORT_LENGTHS = {64: (512, 1024, 2048), 128: (1024, 2048)}


def gpu_tiles(head_dim: int) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)`` of the fused kernels on a GPU for causal bfloat16 1.5-entmax at ``head_dim``."""
    from softargmax.backends.triton import flash_attention as FA

    bm, bn, _ = FA.blocks(head_dim, torch.device("cuda"), torch.bfloat16)
    return bm, bn


def _bf16(tensors):
    return [t.to(torch.bfloat16) for t in tensors]


def inputs(head_dim: int, length: int, locality: float, heads: int = 1, kv_heads: int = 1, batch: int = 1):
    """Bfloat16 ``[q, k, v, dO]``: random ones (no sinks) at ``locality = 0``, else structured ones."""
    if locality == 0:
        return _bf16(AI.random_inputs(batch, heads, kv_heads, length, head_dim))
    return _bf16(AI.structured_inputs(batch, heads, kv_heads, length, head_dim, locality))


def reference(head_dim: int, length: int, locality: float, heads: int = 1, batch: int = 1) -> float:
    q, k, _, _ = inputs(head_dim, length, locality, heads, heads, batch)
    return AI.block_sparsity(q, k, *gpu_tiles(head_dim))


def _interpreter_child(points) -> list[dict]:
    """Run under ``TRITON_INTERPRET=1``: ``forward_stats`` and the reference at each point."""
    from softargmax.backends.triton import flash_attention as FA

    out = []
    for D, L, lam in points:
        bm, bn = gpu_tiles(D)
        q, k, v, _ = inputs(D, L, lam)
        t0 = time.perf_counter()
        st = FA.forward_stats(q, k, v, is_causal=True, mapping="entmax15", block_m=bm, block_n=bn)
        out.append({"head_dim": D, "length": L, "locality": lam, "inputs": "structured" if lam else "random",
                    "tiles": [bm, bn], "forward_stats": round(st["block_sparsity"], 4),
                    "kept": st["kept"], "band_tiles": st["tiles"],
                    "reference": round(AI.block_sparsity(q, k, bm, bn), 4),
                    "seconds": round(time.perf_counter() - t0, 1)})
        print(f"interpreter D={D} L={L} λ={lam}: {out[-1]}", file=sys.stderr, flush=True)
    return out


def interpreter(points) -> list[dict]:
    """:func:`_interpreter_child` in a subprocess under Triton's interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = (f"import sys, json; sys.path.insert(0, {HERE!r}); import calibrate_attention_inputs as C; "
            f"print(json.dumps(C._interpreter_child({list(points)!r})))")
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(f"the interpreter's run failed (exit status {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def interpolate(points: dict, target: float) -> float:
    """``λ`` (3 significant digits) where the measured ``{λ: block sparsity}`` reach ``target``: linearly in
    ``log λ`` between the nearest points below and above it (beyond the range, along its two end points)."""
    if not 0 < target < 1:
        raise ValueError(f"target must be in (0, 1), got {target!r}")
    pts = sorted(points.items())
    below = [p for p in pts if p[1] <= target]
    above = [p for p in pts if p[1] > target]
    if below and above:
        (l0, s0), (l1, s1) = below[-1], above[0]
    else:
        (l0, s0), (l1, s1) = pts[:2] if above else pts[-2:]
    f = (target - s0) / (s1 - s0)
    return float(f"{math.exp(math.log(l0) + f * (math.log(l1) - math.log(l0))):.3g}")


def choose(head_dim: int, length: int, targets, log=print) -> tuple[dict, list]:
    """The grid's ``{λ: block sparsity}`` at ``(head_dim, length)`` and the chosen λ per target."""
    points = {lam: reference(head_dim, length, lam) for lam in GRIDS[(head_dim, length)]}

    def at(lam):
        if lam not in points:
            points[lam] = reference(head_dim, length, lam)
        return lam

    chosen = []
    for target in targets:
        lam = at(interpolate(points, target))
        if abs(points[lam] - target) > 0.02:  # once more, with the new point
            lam = at(interpolate(points, target))
        chosen.append({"head_dim": head_dim, "length": length, "target": target, "locality": lam,
                       "cpu_block_sparsity": round(points[lam], 4)})
        log(f"chosen {chosen[-1]}")
    return {str(k): round(v, 4) for k, v in sorted(points.items())}, chosen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="where to write the calibration")
    ap.add_argument("--skip-interpreter", action="store_true", help="no forward_stats run (the reference only)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    result = {"what": "block sparsity of causal 1.5-entmax on attention_inputs.structured_inputs (bfloat16), "
                      "1 - kept / tiles over the causal band's tiles, at the GPU's tiles",
              "sinks": AI.SINKS, "sink_level": AI.SINK_LEVEL, "seed": 0,
              "tiles": {str(D): list(gpu_tiles(D)) for D in (64, 128)},
              "note": "the block sparsity at L = 4096, 8192 and 16384 is measured on the GPU by the benchmark "
                      "run itself (every case records forward_stats's block_sparsity); cpu_block_sparsity is "
                      "the CPU reference's prediction of it"}

    def save():
        result["seconds"] = round(time.perf_counter() - t0, 1)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

    def log(line):
        print(line, file=sys.stderr, flush=True)

    result["chosen"], result["curve"] = [], []
    for (D, L), targets in TARGETS.items():
        points, chosen = choose(D, L, targets, log)
        result["curve"].append({"head_dim": D, "length": L, "block_sparsity": points})
        result["chosen"] += chosen
        save()
    for D, lengths in SHORT_LENGTHS.items():
        for L in lengths:
            result["curve"].append({"head_dim": D, "length": L,
                                    "block_sparsity": {str(lam): round(reference(D, L, lam), 4) for lam in GRID}})
            log(f"curve {result['curve'][-1]}")
    save()
    if not args.skip_interpreter:
        result["interpreter"] = interpreter(INTERPRETER_POINTS)
    result["curve"].sort(key=lambda r: (r["head_dim"], r["length"]))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
