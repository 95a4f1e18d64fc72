"""Shared entry point of the benchmark scripts: ``softargmax bench`` with a default JSON path."""

import os
import sys

from softargmax.cli import main

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def run(bench_args, filename):
    """Run ``softargmax bench *bench_args *argv``, writing ``results/filename`` unless ``--json`` is given."""
    args = sys.argv[1:]
    if "--json" not in args:
        args += ["--json", os.path.join(RESULTS, filename)]
    sys.exit(main(["bench", *bench_args, *args]))
