"""CPU operator benchmark (issue: core operators): writes benchmarks/results/cpu-operators.json.

    python benchmarks/run_cpu_operators.py            # full run, 2 threads, float32
    python benchmarks/run_cpu_operators.py --quick    # smoke run
"""

import os
import sys

from softargmax.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--json" not in args:
        args += ["--json", os.path.join(HERE, "results", "cpu-operators.json")]
    sys.exit(main(["bench", *args]))
