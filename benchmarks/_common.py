"""Shared entry point of the benchmark scripts: ``softargmax bench`` with a default JSON path."""

import os
import sys

import torch

from softargmax.cli import main

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def run(bench_args, filename):
    """Run ``softargmax bench *bench_args *argv``, writing ``results/filename`` unless ``--json`` is given."""
    args = sys.argv[1:]
    if "--json" not in args:
        args += ["--json", os.path.join(RESULTS, filename)]
    sys.exit(main(["bench", *bench_args, *args]))


def interleaved_times(fns, x, pas, rounds, clock, warmup=1, grad=None):
    """Seconds of each ``fn(x)`` per round (``{name: [seconds, ...]}``), the callables interleaved within
    every round so that a slow phase of a shared machine slows them alike, after ``warmup`` calls each.
    ``pas``: ``"fwd"`` (under ``torch.no_grad()``) or ``"fwd+bwd"`` (``autograd.grad`` of the cotangent
    ``grad``, by default a fixed random one).  ``clock``: ``time.perf_counter`` or ``time.process_time``."""
    if grad is None:
        grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x.dtype)

    def call(fn):
        if pas == "fwd":
            with torch.no_grad():
                fn(x)
        else:
            xx = x.detach().requires_grad_(True)
            torch.autograd.grad(fn(xx), xx, grad)

    for _ in range(warmup):
        for fn in fns.values():
            call(fn)
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = clock()
            call(fn)
            times[name].append(clock() - t0)
    return times
