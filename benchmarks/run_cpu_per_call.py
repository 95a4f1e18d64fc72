"""The cost of one call on small and large inputs: sparsemax, 1.5-entmax, α-entmax (α = 1.3) and
α-ReLU against ``torch.softmax`` and the reference ``entmax`` package, under ``torch.no_grad``
and ``torch.inference_mode``, one thread.

    python benchmarks/run_cpu_per_call.py --label after     # writes benchmarks/results/cpu-per-call-after.json
    python benchmarks/run_cpu_per_call.py --quick           # smoke run, no JSON
    python benchmarks/run_cpu_per_call.py --label after --merge run1.json run2.json run3.json
    python benchmarks/run_cpu_per_call.py --suite small --label after   # cpu-per-call-small-after.json
    python benchmarks/run_cpu_per_call.py --suite small --label after --merge run1.json run2.json

``--suite small`` times the small calls against PyTorch's call in the same run, as ratios: the
forward of sparsemax, 1.5-entmax and α-entmax (α = 1.3) at 4×16 against ``torch.softmax``; forward +
backward (``torch.autograd.grad`` of ``(p * w).sum()``) of sparsemax and 1.5-entmax at 4×16 and
64×64 against softmax's; α-ReLU (α = 1.5) at 2048×64 with 2 threads, forward (``torch.no_grad``) and
forward + backward, against softmax's, with α-ReLU's PyTorch path beside it (the C kernels switched off for
its calls: the code before them, timed in the same rounds).  Each case reports, per callable, the minimum and the median
over the interleaved rounds (each round times ``calls`` consecutive calls), and the ratios of the
minima and of the medians to the baseline.  One-thread cases use the process's CPU time; the
2-thread α-ReLU cases use both the CPU time (which counts both threads' work) and the wall clock.

``--merge`` combines runs made alternately with the code before and after a change (the
same script, ``PYTHONPATH`` pointing at each checkout in turn: the load of a shared machine
then weighs on both alike) into one file: the median over the runs of each per-call median,
with the smallest and largest beside it.

Every sample times ``--calls`` consecutive calls with the CPU time of this process
(``time.process_time``): on a shared machine wall-clock medians mostly measure the waits for a
core.  The callables are interleaved within every repeat (:func:`softargmax.bench.time_thunks`'s
method), and the table reports the median per call in microseconds.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

import softargmax as sa
from softargmax.backends.cpu import rows as cpu_rows
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


def _small_cases() -> list:
    """``(name, shape, threads, clocks, calls, rounds, {callable name: thunk factory})`` of ``--suite small``;
    the first callable is the baseline.  A thunk factory takes ``x`` and returns a zero-argument callable."""

    def fwd(f):
        def make(x):
            return lambda: f(x)
        return make

    def fwd_no_grad(f):
        def make(x):
            def run():
                with torch.no_grad():
                    f(x)
            return run
        return make

    def fwd_bwd(f):
        def make(x):
            w = torch.randn_like(x)

            def run():
                xx = x.detach().requires_grad_(True)
                torch.autograd.grad((f(xx) * w).sum(), xx)
            return run
        return make

    softmax = lambda t: torch.softmax(t, -1)  # noqa: E731
    mappings = {"sparsemax": sa.sparsemax, "entmax15": sa.entmax15}
    relu = lambda t: sa.alpha_relu(t, 1.5, 0.0)  # noqa: E731

    def relu_torch(t):  # the PyTorch path (the C library's switch off for this call): the code before the C kernels
        old = cpu_rows.set_enabled(False)
        try:
            return relu(t)
        finally:
            cpu_rows.set_enabled(old)

    cpu, both = ("cpu",), ("cpu", "wall")
    return [
        ("fwd 4x16", (4, 16), 1, cpu, 2000, 25,
         {"torch.softmax": fwd(softmax), **{n: fwd(f) for n, f in mappings.items()},
          "entmax(1.3)": fwd(lambda t: sa.entmax(t, 1.3))}),
        ("fwd+bwd 4x16", (4, 16), 1, cpu, 200, 25,
         {"torch.softmax": fwd_bwd(softmax), **{n: fwd_bwd(f) for n, f in mappings.items()}}),
        ("fwd+bwd 64x64", (64, 64), 1, cpu, 100, 25,
         {"torch.softmax": fwd_bwd(softmax), **{n: fwd_bwd(f) for n, f in mappings.items()}}),
        ("alpha_relu fwd 2048x64", (2048, 64), 2, both, 50, 25,
         {"torch.softmax": fwd_no_grad(softmax), "alpha_relu(1.5)": fwd_no_grad(relu),
          "alpha_relu(1.5) PyTorch path": fwd_no_grad(relu_torch)}),
        ("alpha_relu fwd+bwd 2048x64", (2048, 64), 2, both, 20, 25,
         {"torch.softmax": fwd_bwd(softmax), "alpha_relu(1.5)": fwd_bwd(relu),
          "alpha_relu(1.5) PyTorch path": fwd_bwd(relu_torch)}),
    ]


def run_small(quick: bool = False) -> list:
    """The rows of ``--suite small`` (module docstring): per case and clock, each callable's minimum and
    median microseconds per call over the interleaved rounds, and their ratios to the baseline's."""
    rows = []
    for name, shape, threads, clocks, calls, rounds, makers in _small_cases():
        torch.set_num_threads(threads)
        x = torch.randn(*shape) * 3
        thunks = {n: make(x) for n, make in makers.items()}
        if quick:
            calls, rounds = max(1, calls // 20), 3
        for run in thunks.values():
            for _ in range(3):
                run()
        samples = {c: {n: [] for n in thunks} for c in clocks}
        for _ in range(rounds):
            for n, run in thunks.items():
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    run()
                c1, w1 = time.process_time(), time.perf_counter()
                for clock, t in (("cpu", c1 - c0), ("wall", w1 - w0)):
                    if clock in samples:
                        samples[clock][n].append(t / calls * 1e6)
        base = next(iter(thunks))
        for clock, per in samples.items():
            us_min = {n: min(v) for n, v in per.items()}
            us_med = {n: statistics.median(v) for n, v in per.items()}
            row = {"case": name, "shape": list(shape), "threads": threads, "clock": clock, "calls": calls,
                   "rounds": rounds, "baseline": base, "us_min": us_min, "us_median": us_med,
                   "ratio_min": {n: us_min[n] / us_min[base] for n in per if n != base},
                   "ratio_median": {n: us_med[n] / us_med[base] for n in per if n != base}}
            rows.append(row)
            print(f"{name:<28} {clock:<5} " + " ".join(
                f"{n} {us_min[n]:.2f}us (x{row['ratio_min'].get(n, 1.0):.2f}, median x{row['ratio_median'].get(n, 1.0):.2f})"
                for n in per), flush=True)
    torch.set_num_threads(1)
    return rows


def _read_runs(paths: list) -> list:
    """The JSON results of several runs."""
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    return runs


def merge_small(paths: list, label: str) -> dict:
    """One ``--suite small`` result from several runs' files: per case, clock and callable the smallest of the
    runs' minima (``us_min``) and the median of their medians (``us_median``), the ratios of those, and
    each run's ratios (``runs_ratio_min``)."""
    runs = _read_runs(paths)
    rows = []
    for i, row in enumerate(runs[0]["rows"]):
        same = [r["rows"][i] for r in runs]
        assert all(o["case"] == row["case"] and o["clock"] == row["clock"] for o in same)
        base = row["baseline"]
        us_min = {n: min(o["us_min"][n] for o in same) for n in row["us_min"]}
        us_med = {n: statistics.median(o["us_median"][n] for o in same) for n in row["us_median"]}
        rows.append({**{k: row[k] for k in ("case", "shape", "threads", "clock", "calls", "rounds", "baseline")},
                     "us_min": us_min, "us_median": us_med,
                     "ratio_min": {n: us_min[n] / us_min[base] for n in us_min if n != base},
                     "ratio_median": {n: us_med[n] / us_med[base] for n in us_med if n != base},
                     "runs_ratio_min": [o["ratio_min"] for o in same]})
    head = {k: v for k, v in runs[0].items() if k not in ("rows", "label")}
    return {**head, "label": label, "runs": len(runs), "merged_from": [r.get("label") for r in runs], "rows": rows}


def merge(paths: list, label: str) -> dict:
    """One result from several runs' JSON files: per shape, mode and case the median of the runs' medians
    (``us_per_call``) and their range (``us_per_call_min``, ``us_per_call_max``)."""
    runs = _read_runs(paths)
    rows = []
    for i, row in enumerate(runs[0]["rows"]):
        values = {n: [r["rows"][i]["us_per_call"][n] for r in runs] for n in row["us_per_call"]}
        assert all(r["rows"][i]["shape"] == row["shape"] and r["rows"][i]["mode"] == row["mode"] for r in runs)
        rows.append({"shape": row["shape"], "mode": row["mode"],
                     "us_per_call": {n: statistics.median(v) for n, v in values.items()},
                     "us_per_call_min": {n: min(v) for n, v in values.items()},
                     "us_per_call_max": {n: max(v) for n, v in values.items()}})
    head = {k: v for k, v in runs[0].items() if k not in ("rows", "label")}
    return {**head, "label": label, "runs": len(runs), "merged_from": [r.get("label") for r in runs], "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="after")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--merge", nargs="+", metavar="RUN_JSON", help="combine these runs' files instead of measuring")
    ap.add_argument("--note", default=None, help="a note kept in the JSON (e.g. the commit measured, the load)")
    ap.add_argument("--suite", choices=("shapes", "small"), default="shapes",
                    help="shapes: the no_grad/inference_mode table (default); small: the small calls' ratios")
    args = ap.parse_args(argv)
    if args.suite == "small":
        if args.merge:
            result = merge_small(args.merge, args.label)
            for row in result["rows"]:
                print(f"{row['case']:<28} {row['clock']:<5} " + " ".join(
                    f"{n} x{v:.2f} (median x{row['ratio_median'][n]:.2f})" for n, v in row["ratio_min"].items()))
        else:
            torch.manual_seed(0)
            result = {"benchmark": "cpu-per-call-small", "label": args.label, "device": cpu_model(),
                      "clock": "minimum and median over interleaved rounds; cpu: process CPU time, wall: perf_counter",
                      **versions(), "rows": run_small(args.quick)}
        if args.note:
            result["note"] = args.note
        path = args.json or (None if args.quick and not args.merge
                             else os.path.join(RESULTS, f"cpu-per-call-small-{args.label}.json"))
        if path:
            save(result, path)
            print("wrote", path)
        return 0
    if args.merge:
        result = merge(args.merge, args.label)
        if args.note:
            result["note"] = args.note
        for row in result["rows"]:
            print(f"{str(tuple(row['shape'])):<12} {row['mode']:<15} " + " ".join(
                f"{n} {v:.1f} [{row['us_per_call_min'][n]:.1f}-{row['us_per_call_max'][n]:.1f}]"
                for n, v in row["us_per_call"].items()))
        path = args.json or os.path.join(RESULTS, f"cpu-per-call-{args.label}.json")
        save(result, path)
        print("wrote", path)
        return 0
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
    if args.note:
        result["note"] = args.note
    path = args.json or (None if args.quick else os.path.join(RESULTS, f"cpu-per-call-{args.label}.json"))
    if path:
        save(result, path)
        print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
