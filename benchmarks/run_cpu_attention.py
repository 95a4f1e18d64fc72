"""CPU attention benchmark (issue: sparse attention): writes benchmarks/results/cpu-attention.json.

Causal self-attention forward+backward for sequence lengths 128-2048 (batch 1, 8 heads x 64),
our normalizations against torch.nn.functional.scaled_dot_product_attention: time (interleaved,
median) and peak memory (growth of the resident set, one subprocess per variant).

    python benchmarks/run_cpu_attention.py
"""

import os
import sys

from softargmax.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--json" not in args:
        args += ["--json", os.path.join(HERE, "results", "cpu-attention.json")]
    sys.exit(main(["bench", "--attention", *args]))
