"""CPU loss benchmark (issue: losses): writes benchmarks/results/cpu-losses.json.

Forward+backward of the Fenchel-Young losses against F.cross_entropy at 64x32000, and the
fused linear + entmax15 loss against linear followed by the loss at 4096 tokens x 512 x 32000
(time and peak memory, each in a fresh subprocess).

    python benchmarks/run_cpu_losses.py
"""

from _common import run

if __name__ == "__main__":
    run(["--losses"], "cpu-losses.json")
