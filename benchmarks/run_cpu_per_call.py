"""The cost of one call on small and large inputs: sparsemax, 1.5-entmax, α-entmax (α = 1.3) and
α-ReLU against ``torch.softmax`` and the reference ``entmax`` package, under ``torch.no_grad``
and ``torch.inference_mode``, one thread.

    python benchmarks/run_cpu_per_call.py --label after     # writes benchmarks/results/cpu-per-call-after.json
    python benchmarks/run_cpu_per_call.py --quick           # smoke run, no JSON

Every sample times ``--calls`` consecutive calls with the CPU time of this process
(``time.process_time``): on a shared machine wall-clock medians mostly measure the waits for a
core.  The callables are interleaved within every repeat (:func:`softargmax.bench.time_thunks`'s
method), and the table reports the median per call in microseconds.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import softargmax as sa
from softargmax.bench.timing import cpu_model, save, versions

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SHAPES = [(4, 8), (64, 64), (256, 1000), (64, 32000)]


def cases():
    import entmax as E

    return {
        "torch.softmax": lambda x: torch.softmax(x, -1),
        "sparsemax": sa.sparsemax,
        "entmax15": sa.entmax15,
        "entmax(1.3)": lambda x: sa.entmax(x, 1.3),
        "alpha_relu(1.5)": lambda x: sa.alpha_relu(x, 1.5, 0.1),
        "entmax pkg sparsemax": lambda x: E.sparsemax(x, -1),
        "entmax pkg entmax15": lambda x: E.entmax15(x, -1),
        "entmax pkg bisect(1.3)": lambda x: E.entmax_bisect(x, 1.3, -1),
    }


def time_per_call(fns: dict, x, mode: str, calls: int, repeats: int) -> dict:
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    samples = {n: [] for n in fns}
    with ctx():
        for fn in fns.values():
            for _ in range(3):
                fn(x)
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = time.process_time()
                for _ in range(calls):
                    fn(x)
                samples[name].append((time.process_time() - t0) / calls)
    return {n: statistics.median(s) * 1e6 for n, s in samples.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="after")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = [(4, 8), (64, 64)] if args.quick else SHAPES
    rows = []
    print(f"{'shape':<12} {'mode':<15} " + " ".join(f"{n:>22}" for n in cases()))
    for shape in shapes:
        x = torch.randn(*shape) * 3
        n = shape[0] * shape[1]
        calls = max(1, min(200, 200_000 // n)) if not args.quick else 20
        repeats = 5 if args.quick else (31 if n < 100_000 else 7)
        for mode in ("no_grad", "inference_mode"):
            us = time_per_call(cases(), x, mode, calls, repeats)
            rows.append({"shape": list(shape), "mode": mode, "us_per_call": us})
            print(f"{str(shape):<12} {mode:<15} " + " ".join(f"{v:>20.1f}us" for v in us.values()), flush=True)
    result = {"benchmark": "cpu-per-call", "label": args.label, "device": cpu_model(), "threads": 1,
              "clock": "process CPU time, median of interleaved repeats", **versions(), "rows": rows}
    path = args.json or (None if args.quick else os.path.join(RESULTS, f"cpu-per-call-{args.label}.json"))
    if path:
        save(result, path)
        print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
