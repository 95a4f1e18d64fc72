"""Benchmark of softargmax_jax under jax.jit (CPU, or the GPU JAX finds): sparsemax and 1.5-entmax against jax.nn.softmax (forward and
forward + backward), and the sparsemax loss against optax's multiclass_sparsemax_loss, in one run.

    PYTHONPATH=jax/src python benchmarks/run_cpu_jax.py [--rows 64] [--sizes 1024 32768] [--rounds 9]
        [--json benchmarks/results/cpu-jax.json]
    PYTHONPATH=jax/src python benchmarks/run_cpu_jax.py --f-divergences --sizes 32000   # every f-divergence

Prints a table (milliseconds per call, wall clock and process CPU time, and each case's ratio to softmax or
optax) and writes a JSON record with the device, the versions, the sizes, the load average before and after,
and every timing.  Timings are of compiled calls (the first call, which compiles, is not counted).  The cases
of one size are interleaved: each round times every case once (a loop sized to last about 0.1 s), so a change
in the machine's load reaches all of them alike; the ratios are of the minimum process CPU time over the
rounds (the fairest figure on a shared machine: the least disturbed round, and no time spent waiting for a
core), and the medians are recorded beside them.

On a GPU (``benchmarks/gpu_all.sh``'s ``bench-jax`` step, XLA on the device JAX finds: the JSON's
``info.device`` names it) the process CPU time counts the host only: read the wall-clock ratios
(``ratio_to_baseline``: each round's loop of calls ends with ``jax.block_until_ready``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import softargmax_jax as sj

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def timed_rounds(fns: dict, rounds: int) -> dict:
    """``{name: (wall seconds, cpu seconds)}`` lists, one entry per round, of one call of each compiled
    ``fn(*args)`` in ``fns`` (``name -> (fn, args)``), the cases interleaved within every round.

    The CPU time (all of XLA's threads) is the fairer comparison on a machine shared with other work,
    where the wall clock also counts the time the process waited for a core."""
    loops = {}
    for name, (fn, args) in fns.items():
        jax.block_until_ready(fn(*args))  # compile
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        loops[name] = max(1, int(0.1 / max(time.perf_counter() - start, 1e-6)))
    out: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (fn, args) in fns.items():
            n = loops[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                res = fn(*args)
            jax.block_until_ready(res)
            out[name].append(((time.perf_counter() - start) / n, (time.process_time() - start_cpu) / n))
    return out


def forward_backward(op):
    """``x -> grad of <op(x), v>``: one forward and one backward pass."""
    return jax.jit(jax.grad(lambda x, v: jnp.vdot(op(x), v)))


def cases(rows: int, k: int):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, k)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(rows, k)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, k, size=rows))
    softmax = lambda t: jax.nn.softmax(t, axis=-1)
    ops = {"softmax (jax.nn)": softmax, "sparsemax": sj.sparsemax, "entmax15": sj.entmax15}
    out = []
    for name, op in ops.items():
        out.append((f"{name} forward", "softmax (jax.nn) forward", jax.jit(op), (x,)))
        out.append((f"{name} forward+backward", "softmax (jax.nn) forward+backward", forward_backward(op), (x, v)))
    import optax

    for name, loss in [("optax multiclass_sparsemax_loss", optax.losses.multiclass_sparsemax_loss),
                       ("sparsemax_loss", sj.sparsemax_loss),
                       ("entmax15_loss", sj.entmax15_loss)]:
        fwd = jax.jit(lambda t, y, loss=loss: loss(t, y).sum())
        both = jax.jit(jax.value_and_grad(lambda t, y, loss=loss: loss(t, y).sum()))
        out.append((f"{name} forward", "optax multiclass_sparsemax_loss forward", fwd, (x, labels)))
        out.append((f"{name} forward+backward", "optax multiclass_sparsemax_loss forward+backward", both,
                    (x, labels)))
    return out


F_DIVERGENCES = ["kl", "reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "reverse_chi_square"]


def f_divergence_cases(rows: int, k: int):
    """Every built-in f-divergence's ``f_softargmax`` against ``jax.nn.softmax`` (forward, forward + backward) on
    scores of scale 3, as the PyTorch benchmark ``run_cpu_f_divergences.py`` times them."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, k)) * 3, jnp.float32)
    v = jnp.asarray(rng.normal(size=(rows, k)), jnp.float32)
    ops = {"softmax (jax.nn)": lambda t: jax.nn.softmax(t, axis=-1)}
    ops.update({name: (lambda n: lambda t: sj.f_softargmax(t, n))(name) for name in F_DIVERGENCES})
    out = []
    for name, op in ops.items():
        out.append((f"{name} forward", "softmax (jax.nn) forward", jax.jit(op), (x,)))
        out.append((f"{name} forward+backward", "softmax (jax.nn) forward+backward", forward_backward(op), (x, v)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 32768])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", default=None, help="default: results/cpu-jax.json, or cpu-jax-f-divergences.json")
    parser.add_argument("--f-divergences", action="store_true",
                        help="every built-in f-divergence's f_softargmax against jax.nn.softmax (scores of scale 3)")
    args = parser.parse_args()
    if args.json is None:
        args.json = os.path.join(RESULTS, "cpu-jax-f-divergences.json" if args.f_divergences else "cpu-jax.json")

    load_before = os.getloadavg()
    records = []
    for k in args.sizes:
        cs = f_divergence_cases(args.rows, k) if args.f_divergences else cases(args.rows, k)
        runs = timed_rounds({name: (fn, fargs) for name, _, fn, fargs in cs}, args.rounds)
        best = {name: (min(w for w, _ in r), min(c for _, c in r)) for name, r in runs.items()}
        for name, baseline, _, _ in cs:
            r = runs[name]
            records.append({
                "k": k, "rows": args.rows, "case": name, "baseline": baseline,
                "seconds": best[name][0], "cpu_seconds": best[name][1],
                "median_seconds": statistics.median(w for w, _ in r),
                "median_cpu_seconds": statistics.median(c for _, c in r),
                "ratio_to_baseline": best[name][0] / best[baseline][0],
                "cpu_ratio_to_baseline": best[name][1] / best[baseline][1],
                "median_cpu_ratio_to_baseline": statistics.median(c for _, c in r)
                / statistics.median(c for _, c in runs[baseline]),
            })
    print(f"{'k':>6} {'case':48} {'wall ms':>9} {'ratio':>7} {'cpu ms':>9} {'ratio':>7}"
          "  (ratios: to the baseline named in the JSON, softmax or optax)")
    for r in records:
        print(f"{r['k']:>6} {r['case']:48} {1e3 * r['seconds']:9.3f} {r['ratio_to_baseline']:7.2f} "
              f"{1e3 * r['cpu_seconds']:9.3f} {r['cpu_ratio_to_baseline']:7.2f}")
    import optax

    info = {
        "device": str(jax.devices()[0]), "platform": platform.platform(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else None, "optax": optax.__version__,
        "numpy": np.__version__, "softargmax_jax": sj.__version__, "dtype": "float32", "rows": args.rows,
        "input": "standard normal * 3" if args.f_divergences else "standard normal",
        "sizes": args.sizes, "rounds": args.rounds, "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "timing": "minimum over interleaved rounds of the seconds per compiled call (jax.jit): wall clock and "
                  "process CPU time (all threads); ratios of those minima, medians recorded beside them",
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"info": info, "results": records}, f, indent=1)
        print("wrote", args.json)


if __name__ == "__main__":
    main()
