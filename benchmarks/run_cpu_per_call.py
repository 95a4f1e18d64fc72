"""The cost of one call on small and large inputs: sparsemax, 1.5-entmax, α-entmax (α = 1.3) and
α-ReLU against ``torch.softmax`` and the reference ``entmax`` package, under ``torch.no_grad``
and ``torch.inference_mode``, one thread.

    python benchmarks/run_cpu_per_call.py --label after     # writes benchmarks/results/cpu-per-call-after.json
    python benchmarks/run_cpu_per_call.py --quick           # smoke run, no JSON
    python benchmarks/run_cpu_per_call.py --label after --merge run1.json run2.json run3.json

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


def merge(paths: list, label: str) -> dict:
    """One result from several runs' JSON files: per shape, mode and case the median of the runs' medians
    (``us_per_call``) and their range (``us_per_call_min``, ``us_per_call_max``)."""
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
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
    args = ap.parse_args(argv)
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
