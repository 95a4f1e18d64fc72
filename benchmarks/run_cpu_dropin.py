"""CPU benchmark of the drop-in mappings: normmax, budget sparsemax and α-entmax with α < 1,
against ``torch.softmax`` and the reference ``entmax`` package's bisection, in the same run.

    python benchmarks/run_cpu_dropin.py                 # writes benchmarks/results/cpu-dropin.json
    python benchmarks/run_cpu_dropin.py --quick         # smoke run, no JSON unless --json is given
    python benchmarks/run_cpu_dropin.py --json out.json --threads 1

Ours is what a user switching imports gets (``softargmax.compat.entmax``); each case is the
median of ``--repeats`` calls (forward, and forward + backward with a random incoming
gradient), interleaved with ``torch.softmax`` and the package so that a slow phase of a
shared machine affects all alike.  Inputs are ``randn * 3`` in float32.

``--clock process`` (the default) times the CPU time of this process (``time.process_time``)
with one thread: on a machine shared with other jobs, wall-clock medians mostly measure the
waits for a core; ``--clock wall`` times wall-clock (``time.perf_counter``), as the other
benchmarks do, and is the right choice on a quiet machine (and with several threads).
"""

import argparse
import os
import statistics
import sys
import time

import torch
from _common import RESULTS, interleaved_times

import softargmax as sa
import softargmax.compat.entmax as ours
from softargmax import bench

SHAPES = [(64, 4000), (256, 1000), (2048, 64)]
QUICK_SHAPES = [(8, 500), (64, 64)]


def cases():
    """name -> (ours, the package's function)."""
    import entmax as E

    return {
        "normmax_a2": (lambda x: ours.normmax_bisect(x, 2.0), lambda x: E.normmax_bisect(x, 2.0)),
        "normmax_a1.5": (lambda x: ours.normmax_bisect(x, 1.5), lambda x: E.normmax_bisect(x, 1.5)),
        "normmax_a5": (lambda x: ours.normmax_bisect(x, 5.0), lambda x: E.normmax_bisect(x, 5.0)),
        "budget_b2": (lambda x: ours.budget_bisect(x, 2.0), lambda x: E.budget_bisect(x, 2.0)),
        "budget_b10": (lambda x: ours.budget_bisect(x, 10.0), lambda x: E.budget_bisect(x, 10.0)),
        "entmax_a0.75": (lambda x: ours.entmax_bisect(x, 0.75), lambda x: E.entmax_bisect(x, 0.75)),
    }


def time_interleaved(fns: dict, x: torch.Tensor, pas: str, repeats: int, clock) -> dict:
    """Median milliseconds of each ``fn(x)`` (or ``fn`` + backward), interleaved per repeat."""
    times = interleaved_times(fns, x, pas, repeats, clock, grad=torch.randn_like(x))
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["process", "wall"], default="process")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    shapes = QUICK_SHAPES if args.quick else SHAPES
    repeats = args.repeats or (3 if args.quick else 15)
    json_path = args.json_path or (None if args.quick else os.path.join(RESULTS, "cpu-dropin.json"))
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'op':<14} {'shape':<13} {'pass':<8} {'ours ms':>9} {'softmax ms':>11} {'ratio':>7} "
          f"{'package ms':>11} {'ratio':>7} {'speed-up':>9}", flush=True)
    for shape in shapes:
        x = torch.randn(*shape, generator=gen) * 3
        for pas in ("fwd", "fwd+bwd"):
            for name, (mine, theirs) in cases().items():
                ms = time_interleaved({"softmax": lambda t: torch.softmax(t, -1), "ours": mine, "package": theirs},
                                      x, pas, repeats, clock)
                row = {
                    "op": name, "shape": list(shape), "dtype": "float32", "pass": pas,
                    "ms": round(ms["ours"], 4), "softmax_ms": round(ms["softmax"], 4),
                    "ratio": round(ms["ours"] / ms["softmax"], 3),
                    "package_ms": round(ms["package"], 4),
                    "package_ratio": round(ms["package"] / ms["softmax"], 3),
                    "speedup_vs_package": round(ms["package"] / ms["ours"], 2),
                }
                rows.append(row)
                print(f"{name:<14} {str(shape):<13} {pas:<8} {row['ms']:>9.3f} {row['softmax_ms']:>11.3f} "
                      f"{row['ratio']:>6.2f}x {row['package_ms']:>11.3f} {row['package_ratio']:>6.2f}x "
                      f"{row['speedup_vs_package']:>8.2f}x", flush=True)
    import entmax

    result = {
        "device": bench.device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "softargmax": sa.__version__,
        "entmax_package": getattr(entmax, "__version__", "?"),
        "python": sys.version.split()[0],
        "threads": torch.get_num_threads(),
        "input": "randn * 3",
        "repeats": repeats,
        "clock": "process CPU time (time.process_time)" if args.clock == "process" else "wall (time.perf_counter)",
        "load_average": os.getloadavg(),
        "note": "package: entmax's 50-step bisection (normmax_bisect, budget_bisect, entmax_bisect)",
        "cases": rows,
    }
    if json_path:
        bench.save(result, json_path)
        print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
