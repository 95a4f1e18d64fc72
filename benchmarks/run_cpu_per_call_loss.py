"""The cost of one loss call, forward + backward, with class indices: 1.5-entmax, sparsemax and α-entmax
(α = 1.3) losses, the Jensen–Shannon, squared-Hellinger and reverse-KL f-divergence losses, and the 1.5-entmax
loss with label smoothing and with class weights (beside ``F.cross_entropy`` with the same option), against
``F.cross_entropy`` in the same run, on small (8 x 100) and larger (64 x 1000) batches, float32, one thread.

    python benchmarks/run_cpu_per_call_loss.py --label after    # writes benchmarks/results/cpu-per-call-loss-after.json
    python benchmarks/run_cpu_per_call_loss.py --quick          # smoke run, no JSON

To compare two checkouts, run the script alternately with ``PYTHONPATH`` pointing at each
(``--label before`` / ``--label after``): the load of a shared machine then weighs on both alike.
``--merge`` combines such runs of one checkout into one file (per shape and case the smallest of the runs'
minima, the median of their medians, and each run's ratios):

    python benchmarks/run_cpu_per_call_loss.py --label after --merge run1.json run2.json

Each call is ``loss(x, target).backward()`` on a leaf ``x`` whose gradient is reset first.  Every
sample times ``--calls`` consecutive calls with the CPU time of this process (``time.process_time``:
on a shared machine wall-clock time mostly measures the waits for a core); the cases are
interleaved within every round (:func:`softargmax.bench.time_thunks`'s method).  The table gives the
minimum and the median per call over the rounds, in microseconds, and each loss's ratio to
``F.cross_entropy`` (minimum over minimum, median over median).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.bench.timing import cpu_model, save, versions

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = [(8, 100), (64, 1000)]
BASELINE = "F.cross_entropy"


def cases(k: int) -> dict:
    weight = torch.rand(k, generator=torch.Generator().manual_seed(1)) + 0.5
    return {
        BASELINE: F.cross_entropy,
        "entmax15_loss": sa.entmax15_loss,
        "sparsemax_loss": sa.sparsemax_loss,
        "entmax_loss(1.3)": lambda x, t: sa.entmax_loss(x, t, alpha=1.3),
        "jensen_shannon": lambda x, t: sa.f_divergence_loss(x, t, "jensen_shannon"),
        "squared_hellinger": lambda x, t: sa.f_divergence_loss(x, t, "squared_hellinger"),
        "reverse_kl": lambda x, t: sa.f_divergence_loss(x, t, "reverse_kl"),
        "entmax15_loss(label_smoothing=0.1)": lambda x, t: sa.entmax15_loss(x, t, label_smoothing=0.1),
        "entmax15_loss(weight)": lambda x, t: sa.entmax15_loss(x, t, weight=weight),
        "F.cross_entropy(label_smoothing=0.1)": lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
        "F.cross_entropy(weight)": lambda x, t: F.cross_entropy(x, t, weight=weight),
    }


def step(fn, x, t):
    def run():
        x.grad = None
        fn(x, t).backward()
    return run


def time_shape(shape, rounds: int, calls: int) -> dict:
    torch.manual_seed(0)
    x = (torch.randn(*shape) * 3).requires_grad_()
    t = torch.randint(0, shape[1], (shape[0],))
    runs = {name: step(fn, x, t) for name, fn in cases(shape[1]).items()}
    for run in runs.values():  # warm-up (and the C solver's build)
        for _ in range(20):
            run()
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.process_time()
            for _ in range(calls):
                run()
            samples[name].append((time.process_time() - t0) / calls * 1e6)
    us_min = {n: min(s) for n, s in samples.items()}
    us_med = {n: statistics.median(s) for n, s in samples.items()}
    return {"shape": list(shape), "calls_per_sample": calls, "rounds": rounds, "us_min": us_min, "us_median": us_med,
            "ratio_min": {n: us_min[n] / us_min[BASELINE] for n in runs if n != BASELINE},
            "ratio_median": {n: us_med[n] / us_med[BASELINE] for n in runs if n != BASELINE}}


def merge(paths: list, label: str) -> dict:
    """One result from several runs' files (module docstring)."""
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    rows = []
    for i, row in enumerate(runs[0]["rows"]):
        same = [r["rows"][i] for r in runs]
        assert all(o["shape"] == row["shape"] for o in same)
        us_min = {n: min(o["us_min"][n] for o in same) for n in row["us_min"]}
        us_med = {n: statistics.median(o["us_median"][n] for o in same) for n in row["us_median"]}
        rows.append({"shape": row["shape"], "calls_per_sample": row["calls_per_sample"], "rounds": row["rounds"],
                     "us_min": us_min, "us_median": us_med,
                     "ratio_min": {n: us_min[n] / us_min[BASELINE] for n in us_min if n != BASELINE},
                     "ratio_median": {n: us_med[n] / us_med[BASELINE] for n in us_med if n != BASELINE},
                     "runs_ratio_min": [o["ratio_min"] for o in same]})
    head = {k: v for k, v in runs[0].items() if k not in ("rows", "label", "note")}
    return {**head, "label": label, "runs": len(runs), "merged_from": [r.get("label") for r in runs], "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="after")
    ap.add_argument("--quick", action="store_true", help="a smoke run: few rounds, no JSON")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--json", default=None)
    ap.add_argument("--note", default=None, help="a note kept in the JSON (the commit measured, the load)")
    ap.add_argument("--merge", nargs="+", metavar="RUN_JSON", help="combine these runs' files instead of measuring")
    args = ap.parse_args(argv)
    if args.merge:
        result = merge(args.merge, args.label)
        if args.note:
            result["note"] = args.note
        for row in result["rows"]:
            print(f"{str(tuple(row['shape'])):<12} " + "  ".join(
                f"{n}: {row['us_min'][n]:.1f}/{row['us_median'][n]:.1f}us" for n in row["us_min"]))
        path = args.json or str(RESULTS / f"cpu-per-call-loss-{args.label}.json")
        save(result, path)
        print("wrote", path)
        return 0
    torch.set_num_threads(1)
    rounds = 3 if args.quick else args.rounds
    rows = []
    for shape in SHAPES:
        calls = (20 if args.quick else 200) if shape[0] * shape[1] < 10_000 else (5 if args.quick else 20)
        row = time_shape(shape, rounds, calls)
        rows.append(row)
        print(f"{str(tuple(shape)):<12} " + "  ".join(
            f"{n}: {row['us_min'][n]:.1f}/{row['us_median'][n]:.1f}us"
            + (f" (x{row['ratio_min'][n]:.2f}/x{row['ratio_median'][n]:.2f})" if n != BASELINE else "")
            for n in row["us_min"]), flush=True)
    result = {"benchmark": "cpu-per-call-loss", "label": args.label, "device": cpu_model(), "threads": 1,
              "dtype": "float32", "pass": "fwd+bwd", "target": "class indices (uniform random), scores randn * 3",
              "clock": "process CPU time per call: minimum and median over interleaved rounds", **versions(),
              "rows": rows}
    if args.note:
        result["note"] = args.note
    path = args.json or (None if args.quick else str(RESULTS / f"cpu-per-call-loss-{args.label}.json"))
    if path:
        save(result, path)
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
