"""CPU attention benchmark (issue: sparse attention): writes benchmarks/results/cpu-attention.json.

Causal self-attention forward+backward for sequence lengths 128-2048 (batch 1, 8 heads x 64),
our normalizations against torch.nn.functional.scaled_dot_product_attention: time (interleaved,
median) and peak memory (growth of the resident set, one subprocess per variant).

    python benchmarks/run_cpu_attention.py
"""

from _common import run

if __name__ == "__main__":
    run(["--attention"], "cpu-attention.json")
