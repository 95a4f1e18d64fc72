"""CPU operator benchmark (issue: core operators): writes benchmarks/results/cpu-operators.json.

    python benchmarks/run_cpu_operators.py            # full run, 2 threads, float32
    python benchmarks/run_cpu_operators.py --quick    # smoke run
"""

from _common import run

if __name__ == "__main__":
    run([], "cpu-operators.json")
