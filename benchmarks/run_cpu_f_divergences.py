"""Every built-in f-divergence's f_softargmax against torch.softmax on the CPU: writes
benchmarks/results/cpu-f-divergences.json.

    python benchmarks/run_cpu_f_divergences.py                 # 64 x 32000, 2 threads, float32
    python benchmarks/run_cpu_f_divergences.py --rounds 5 --json /tmp/f.json
    python benchmarks/run_cpu_f_divergences.py --threads 1 --clock cpu   # a loaded machine: CPU time
    python benchmarks/run_cpu_f_divergences.py --loss-memory 2048x32000  # the losses' peak memory
    python benchmarks/run_cpu_f_divergences.py --by-hand --json /tmp/h.json  # and KL as a user's generator

Each call is timed once per round, the callables interleaved within a round (a slow phase of a
shared machine slows them alike); the reported time is the minimum over the rounds, after two
warm-up calls each.  Forward under ``torch.no_grad()``; forward + backward with ``autograd.grad``
of a fixed random cotangent.  The JSON records the machine's load average beside the numbers.
``--clock cpu`` times the process's CPU time instead of the wall clock: on a machine shared with
other jobs, a wall-clock time jumps by the scheduler's time slices whenever a thread waits for the
core, and with one thread the CPU time is what the call itself cost.

``--loss-memory RxK``: f_divergence_loss's forward and backward with class indices for each
divergence (and KL written by hand as a user's generator, ``kl_by_hand``) in a child process of its own, reporting the growth of the child's peak resident memory
(``ru_maxrss``) over the call, in units of one ``[R, K]`` float32 buffer (the scores, their
gradient and the targets exist before the baseline is taken).  ``--general-path``: the same with the
one-C-call class-index path switched off (what calls with options it does not take go through).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
from _common import RESULTS, interleaved_times

import softargmax as sa
from softargmax.bench.timing import device_name, save, versions

DIVERGENCES = ["kl", "reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "reverse_chi_square"]
#: the loss memory also of a user's generator: KL from its functions, no hints (the generic solver)
BY_HAND = ["kl_by_hand"]


def _divergence(name):
    """A built-in divergence's name, or ``"kl_by_hand"``: KL as a user declares it (``g = (f')⁻¹`` and ``g'``)."""
    if name != "kl_by_hand":
        return name
    return sa.CustomDivergence(f=lambda u: torch.special.xlogy(u, u), f_prime=lambda u: torch.log(u) + 1,
                               conj=lambda v: torch.exp(v - 1), conj_prime=lambda v: torch.exp(v - 1),
                               conj_prime2=lambda v: torch.exp(v - 1), name=name)


def _loss_memory_child(name, rows, cols, general=False):
    """In a child process: the peak memory growth (MB) of one loss forward + backward (``general``: with the
    one-C-call class-index path switched off, as for options it does not take)."""
    if general:
        from softargmax.losses import functional

        functional._index_call = lambda *args: None
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, cols, generator=gen) * 3).requires_grad_(True)
    target = torch.randint(0, cols, (rows,), generator=gen)
    div = _divergence(name)
    sa.f_divergence_loss(x[:2].detach(), target[:2], div)  # builds or loads the C library
    x.grad = torch.zeros_like(x)  # the gradient's buffer exists before the baseline
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loss = sa.f_divergence_loss(x, target, div)
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"op": name, "loss": float(loss.detach()), "peak_growth_mb": round((peak - base) / 1024, 1)}))


def _loss_memory(shape, divergences, general=False):
    rows, cols = (int(v) for v in shape.split("x"))
    buffer_mb = rows * cols * 4 / 2**20
    cases = []
    for name in divergences:
        proc = subprocess.run([sys.executable, __file__, "--loss-memory-child", name, shape]
                              + (["--general-path"] if general else []), capture_output=True, text=True, check=True)
        case = json.loads(proc.stdout.strip().splitlines()[-1])
        case["buffers"] = round(case["peak_growth_mb"] / buffer_mb, 2)
        cases.append(case)
        print(f"{name:20s} loss {case['loss']:.4g}  peak growth {case['peak_growth_mb']:8.1f} MB = "
              f"{case['buffers']:.2f} x [{rows}, {cols}] float32", flush=True)
    return {"shape": [rows, cols], "buffer_mb": round(buffer_mb, 1), "cases": cases}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64x32000")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    parser.add_argument("--json", default=os.path.join(RESULTS, "cpu-f-divergences.json"))
    parser.add_argument("--loss-memory", metavar="RxK", help="the losses' peak memory instead of the timings")
    parser.add_argument("--loss-memory-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--general-path", action="store_true",
                        help="with --loss-memory: the general loss path (the one-C-call class-index path off)")
    parser.add_argument("--by-hand", action="store_true",
                        help="also time KL written by hand as a user's generator (kl_by_hand: the generic solver)")
    args = parser.parse_args()
    if args.loss_memory_child:
        name, shape = args.loss_memory_child
        _loss_memory_child(name, *(int(v) for v in shape.split("x")), general=args.general_path)
        return
    if args.loss_memory:
        result = {"device": device_name(torch.device("cpu")), **versions(),
                  "path": "general (one-C-call class-index path off)" if args.general_path else "default",
                  **_loss_memory(args.loss_memory, DIVERGENCES + BY_HAND, args.general_path)}
        save(result, args.json)
        print(f"wrote {args.json}")
        return
    torch.set_num_threads(args.threads)
    rows, cols = (int(v) for v in args.shape.split("x"))
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, cols, generator=gen) * 3).to(getattr(torch, args.dtype))
    grad = torch.randn(rows, cols, generator=gen).to(x.dtype)
    fns = {"softmax": lambda t: torch.softmax(t, -1)}
    timed = DIVERGENCES + (BY_HAND if args.by_hand else [])
    fns.update({name: (lambda d: lambda t: sa.f_softargmax(t, d))(_divergence(name)) for name in timed})
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    cases = []
    load = os.getloadavg()
    for pas in ("fwd", "fwd+bwd"):
        times = interleaved_times(fns, x, pas, args.rounds, clock, warmup=2, grad=grad)
        best = {name: min(t) * 1e3 for name, t in times.items()}
        for name in timed:
            case = {"op": name, "pass": pas, "ms": round(best[name], 4), "softmax_ms": round(best["softmax"], 4),
                    "ratio": round(best[name] / best["softmax"], 3)}
            cases.append(case)
            print(f"{pas:8s} {name:20s} {case['ms']:9.3f} ms  {case['ratio']:6.2f}x torch.softmax "
                  f"({case['softmax_ms']:.3f} ms)", flush=True)
    result = {"device": device_name(x.device), **versions(), "threads": torch.get_num_threads(),
              "shape": [rows, cols], "dtype": args.dtype, "input": "randn * 3", "rounds": args.rounds,
              "statistic": "minimum over interleaved rounds",
              "clock": "wall (perf_counter)" if args.clock == "wall" else "process CPU time (process_time)",
              "load_average_at_start": [round(v, 2) for v in load],
              "load_average_at_end": [round(v, 2) for v in os.getloadavg()], "cases": cases}
    save(result, args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
