"""Every built-in f-divergence's f_softargmax against torch.softmax on the CPU: writes
benchmarks/results/cpu-f-divergences.json.

    python benchmarks/run_cpu_f_divergences.py                 # 64 x 32000, 2 threads, float32
    python benchmarks/run_cpu_f_divergences.py --rounds 5 --json /tmp/f.json

Each call is timed once per round, the callables interleaved within a round (a slow phase of a
shared machine slows them alike); the reported time is the minimum over the rounds, after two
warm-up calls each.  Forward under ``torch.no_grad()``; forward + backward with ``autograd.grad``
of a fixed random cotangent.  The JSON records the machine's load average beside the numbers.
"""

import argparse
import os
import time

import torch
from _common import RESULTS

import softargmax as sa
from softargmax.bench.timing import device_name, save, versions

DIVERGENCES = ["kl", "reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "reverse_chi_square"]


def _runner(fn, x, grad, pas):
    def run():
        if pas == "fwd":
            with torch.no_grad():
                fn(x)
        else:
            xx = x.detach().requires_grad_(True)
            torch.autograd.grad(fn(xx), xx, grad)

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64x32000")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--json", default=os.path.join(RESULTS, "cpu-f-divergences.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, cols = (int(v) for v in args.shape.split("x"))
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, cols, generator=gen) * 3).to(getattr(torch, args.dtype))
    grad = torch.randn(rows, cols, generator=gen).to(x.dtype)
    fns = {"softmax": lambda t: torch.softmax(t, -1)}
    fns.update({name: (lambda n: lambda t: sa.f_softargmax(t, n))(name) for name in DIVERGENCES})
    cases = []
    load = os.getloadavg()
    for pas in ("fwd", "fwd+bwd"):
        runs = {name: _runner(fn, x, grad, pas) for name, fn in fns.items()}
        for run in runs.values():
            run()
            run()
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t0)
        best = {name: min(t) * 1e3 for name, t in times.items()}
        for name in DIVERGENCES:
            case = {"op": name, "pass": pas, "ms": round(best[name], 4), "softmax_ms": round(best["softmax"], 4),
                    "ratio": round(best[name] / best["softmax"], 3)}
            cases.append(case)
            print(f"{pas:8s} {name:20s} {case['ms']:9.3f} ms  {case['ratio']:6.2f}x torch.softmax "
                  f"({case['softmax_ms']:.3f} ms)", flush=True)
    result = {"device": device_name(x.device), **versions(), "threads": torch.get_num_threads(),
              "shape": [rows, cols], "dtype": args.dtype, "input": "randn * 3", "rounds": args.rounds,
              "statistic": "minimum over interleaved rounds",
              "load_average_at_start": [round(v, 2) for v in load],
              "load_average_at_end": [round(v, 2) for v in os.getloadavg()], "cases": cases}
    save(result, args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
