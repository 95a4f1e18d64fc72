"""The row kernels' PTX proxies (benchmarks/row_proxies.py): their loops, named by what they read and write.

The streamed forward of α = 1.3 on bfloat16 rows (``EXACT_FAR``) is compiled for sm_90a in a subprocess (Triton's
interpreter is on in the test session): its four loops are the first pass, the Newton loop on the kept scores,
the full-row Newton loop and the write; the row is read and written 16 bytes per instruction; the power costs
one hardware ``log2`` and one ``exp2`` per score in every loop that evaluates it.  Instruction counts are
reported by the script (benchmarks/results/row-proxies.json), not asserted: they depend on the Triton version.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import row_proxies as RP
import compile_report as CR
(i,) = CR.select(["row_kernels.solve_long_rows bf16 KIND=0 EXACT=3 PER_ROW=0 SUMS=0 GRAD=0 *"])
(j,) = CR.select(["row_kernels.solve_block_rows bf16 KIND=0 EXACT=3 PER_ROW=0 SUMS=0 GRAD=0 ROWS=1 CH=64 *"])
print(json.dumps([RP.measure(i), RP.measure(j)]))
"""


def test_far_power_loops(tmp_path):
    """The streamed kernel's loops (module docstring); the register kernel's largest bfloat16 tile of the ``EXACT_FAR``
    operator holds 16 scores per thread without spilling (what ``rows.heavy_kind`` relies on; its loss variants
    spill 12-44 bytes with Triton 3.9, none with the GPU's 3.6), one lg2 and one ex2 per score in its Newton loop.
    About 20 s (two compiles)."""
    pytest.importorskip("triton", reason="Triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "benchmarks")], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    entry, block = json.loads(proc.stdout.strip().splitlines()[-1])
    loops = entry["loops"]
    assert list(loops) == ["scan", "slot_newton", "row_newton", "write"]
    assert loops["scan"]["scores_per_thread"] == 8 and loops["slot_newton"]["scores_per_thread"] == 32
    assert loops["scan"]["mufu_per_score"] == 0
    for name in ("slot_newton", "row_newton", "write"):
        assert 2.0 <= loops[name]["mufu_per_score"] <= 2.1, (name, loops[name])  # one lg2 and one ex2 per score
    assert set(entry["ld_bytes"]) == {"16"} and entry["st_bytes"]["16"] >= 1 and entry["spill_bytes"] == 0
    assert list(block["loops"]) == ["tile_newton"] and block["spill_bytes"] == 0
    assert block["loops"]["tile_newton"]["scores_per_thread"] == 16
    assert 2.0 <= block["loops"]["tile_newton"]["mufu_per_score"] <= 2.1
