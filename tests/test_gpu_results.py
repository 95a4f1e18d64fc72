"""The committed GPU measurements and the documentation's performance page that shows them.

Each ``benchmarks/results/gpu-*`` folder is one GPU session's files (``call*/bench/gpu-*.json``);
``benchmarks/plot_gpu_results.py`` renders their tables, and ``docs/performance.md`` must show
exactly what it renders, so that the page cannot drift from the data.
"""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = sorted((ROOT / "benchmarks" / "results").glob("gpu-*"))


def _script():
    spec = importlib.util.spec_from_file_location("plot_gpu_results", ROOT / "benchmarks" / "plot_gpu_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_gpu_session_is_committed():
    assert SESSIONS, "no benchmarks/results/gpu-* folder"
    for session in SESSIONS:
        assert list(session.glob("call*/bench/gpu-*.json")), session


@pytest.mark.parametrize("session", SESSIONS, ids=lambda p: p.name)
def test_committed_ratios_are_the_times_divided(session):
    """Every ratio in the JSON is its time over the baseline's, timed in the same run (nothing edited by hand)."""
    for path in session.glob("call*/bench/gpu-*.json"):
        data = json.loads(path.read_text())
        assert data["environment"]["device"].startswith("NVIDIA"), path
        for case in data.get("cases") or []:
            assert case["ratio"] == pytest.approx(case["ms"] / case["softmax_ms"], abs=2e-3), case
        for case in data.get("loss_cases") or []:
            assert case["ratio"] == pytest.approx(case["ms"] / case["cross_entropy_ms"], abs=2e-3), case


def test_performance_page_shows_the_latest_session_as_rendered():
    page = (ROOT / "docs" / "performance.md").read_text()
    latest = SESSIONS[-1]
    for table in _script().render_tables(latest).strip().split("\n\n"):
        assert table in page, f"docs/performance.md does not show this table of {latest.name}:\n{table}"
    figure = f"_static/{latest.name}.png"
    assert f"]({figure})" in page and (ROOT / "docs" / figure).stat().st_size > 10_000


def test_tables_mark_failed_peers_and_missing_cases():
    script = _script()
    cases = [{"op": "sparsemax", "peer": "adasplash", "shape": [4, 8], "dtype": "bfloat16", "ours_ms": 1.0,
              "softmax_ms": 0.5, "peer_ms": None, "peer_max_abs_error": "error: CompilationError: at 48:33"},
             {"op": "sparsemax", "peer": "liger", "shape": [4, 8], "dtype": "bfloat16", "ours_ms": 1.0,
              "softmax_ms": 0.5, "peer_ms": 2.0, "peer_max_abs_error": 1.5e-3}]
    table = script.peer_table(cases)
    assert "| sparsemax | 4×8 | bfloat16 | 1.000 | fails (CompilationError) | 2.000 ms (max error 1.5e-03) |" in table
    ops = script.operator_table([{"op": "entmax15", "shape": [4, 8], "dtype": "float32", "ms": 2.0,
                                  "softmax_ms": 1.0, "ratio": 2.0}])
    assert ops.splitlines()[-1] == "| 4×8 | float32 | 1.000 | 2.00× |"


def test_structured_attention_cases_have_their_own_table():
    """Structured-input cases stay out of the attention table (whose rows are the random inputs' as before) and
    get a table of their own, beside the random case of the same shape, with the block sparsity the kernels
    measured and ours ÷ AdaSplash-2's time."""
    script = _script()

    def case(inputs, ms, sparsity, **extra):
        impls = {"sdpa": {"ms": 1.0, "peak_mib": 10.0},
                 "fused_entmax15": {"ms": ms, "peak_mib": 9.0, "block_sparsity": sparsity},
                 "adasplash2_a1.5": {"ms": 2.0, "peak_mib": 9.0}}
        return {"op": "attention", "inputs": inputs, "causal": True, "shape": [2, 16, 4096, 64], "impls": impls,
                **extra}

    random = case("random", 6.0, 0.0002)
    sparse = case("structured", 1.5, 0.712, locality=17.5, kv_heads=16)
    cases = [random, sparse]
    plain = script.attention_table(cases)
    assert plain == script.attention_table([random]) and len(plain.splitlines()) == 3
    table = script.structured_attention_table(cases).splitlines()
    assert table[2] == "| random | 2×16×4096×64 | 0.0% | 1.00 ms | 6.00 ms (6.00×) | 2.00 ms (2.00×) | 3.00× |"
    assert table[3] == ("| structured, λ = 17.5 | 2×16×4096×64 | 71.2% | 1.00 ms | 1.50 ms (1.50×) | 2.00 ms (2.00×) "
                        "| 0.75× |")
    gqa = case("structured", 1.0, 0.7, locality=9.0, kv_heads=8)
    gqa["shape"] = [2, 32, 8192, 128]
    assert "| 2×32 (over 8)×8192×128 | 70.0% |" in script.structured_attention_table([gqa])
