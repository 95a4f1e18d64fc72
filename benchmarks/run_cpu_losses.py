"""CPU loss benchmark (issue: losses): writes benchmarks/results/cpu-losses.json.

Forward+backward of the Fenchel-Young losses against F.cross_entropy at 64x32000, and the
fused linear + entmax15 loss against linear followed by the loss at 4096 tokens x 512 x 32000
(time and peak memory, each in a fresh subprocess).

    python benchmarks/run_cpu_losses.py
"""

import os
import sys

from softargmax.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--json" not in args:
        args += ["--json", os.path.join(HERE, "results", "cpu-losses.json")]
    sys.exit(main(["bench", "--losses", *args]))
