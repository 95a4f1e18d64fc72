"""The attention benchmark's structured inputs (benchmarks/attention_inputs.py), their calibration
(benchmarks/calibrate_attention_inputs.py and its JSON) and their cases in benchmarks/attention_gpu.py.

The kernels' block sparsity is counted in Triton's interpreter at a small length; the reference
``block_sparsity`` is checked against brute force (the library's materialized 1.5-entmax)."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import attention_gpu as AG  # noqa: E402
import attention_inputs as AI  # noqa: E402

CPU = torch.device("cpu")
CALIBRATION = ROOT / "benchmarks" / "results" / "attention-structured-inputs.json"


def test_the_inputs_are_deterministic_and_add_the_structure_to_the_random_draw():
    a = AI.structured_inputs(2, 4, 2, 64, 16, locality=30.0, seed=3)
    b = AI.structured_inputs(2, 4, 2, 64, 16, locality=30.0, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    other = AI.structured_inputs(2, 4, 2, 64, 16, locality=30.0, seed=4)
    assert not torch.equal(a[0], other[0])
    rand = AI.random_inputs(2, 4, 2, 64, 16, seed=3)
    assert [tuple(t.shape) for t in a] == [(2, 4, 64, 16), (2, 2, 64, 16), (2, 2, 64, 16), (2, 4, 64, 16)]
    # the content dimensions, v and dO are the random draw's; only the first four dimensions of q and k change
    assert torch.equal(a[0][..., 4:], rand[0][..., 4:]) and torch.equal(a[1][..., 4:], rand[1][..., 4:])
    assert torch.equal(a[2], rand[2]) and torch.equal(a[3], rand[3])


@pytest.mark.parametrize("head_dim", [16, 128])
def test_the_scores_carry_the_recency_bias_and_the_sinks_through_bfloat16(head_dim):
    """After the bfloat16 cast, the scores are the content's plus ``λ j / L`` plus, for the sinks, ``λ i / L + σ``:
    checked against that formula written out (the structured dimensions then matter to about 2⁻¹⁶ of λ)."""
    L, lam = 256, 50.0
    q, k, _, _ = (t.to(torch.bfloat16).double() for t in AI.structured_inputs(1, 1, 1, L, head_dim, locality=lam))
    scores = (q[0, 0] @ k[0, 0].T) / math.sqrt(head_dim)
    content = (q[0, 0, :, 4:] @ k[0, 0, :, 4:].T) / math.sqrt(head_dim)
    i = torch.arange(L, dtype=torch.float64)[:, None]
    j = torch.arange(L, dtype=torch.float64)[None, :]
    expected = content + lam * j / L + (j < AI.SINKS) * (lam * i / L + AI.SINK_LEVEL)
    assert float((scores - expected).abs().max()) < lam * 2 ** -13


def test_bad_arguments_name_the_argument():
    for kwargs, message in [(dict(locality=-1.0), "locality"), (dict(locality=float("nan")), "locality"),
                            (dict(locality=1.0, sinks=65), "sinks"), (dict(locality=1.0, sink_level=math.inf),
                                                                       "sink_level")]:
        with pytest.raises(ValueError, match=message):
            AI.structured_inputs(1, 2, 1, 64, 16, **kwargs)
    with pytest.raises(ValueError, match="head_dim"):
        AI.structured_inputs(1, 2, 1, 64, 4, locality=1.0)
    with pytest.raises(ValueError, match="kv_heads"):
        AI.random_inputs(1, 3, 2, 64, 16)
    with pytest.raises(ValueError, match="length"):
        AI.random_inputs(1, 2, 1, 0, 16)
    q, k, _, _ = AI.random_inputs(1, 2, 1, 64, 16)
    with pytest.raises(ValueError, match="block_n"):
        AI.block_sparsity(q, k, 16, 0)


def _brute_force(q, k, block_m, block_n):
    """Block sparsity with the library's materialized causal 1.5-entmax (one head, float64)."""
    import softargmax as sa

    L, D = q.shape
    s = (q.double() @ k.double().T) / math.sqrt(D)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    p = sa.entmax15(s, dim=-1)
    nq, nk = L // block_m, L // block_n
    hit = (p > 0).view(nq, block_m, nk, block_n).any(3).any(1)
    band = torch.arange(nk)[None, :] * block_n < (torch.arange(nq)[:, None] + 1) * block_m
    return 1 - int((hit & band).sum()) / int(band.sum())


def test_the_reference_block_sparsity_is_the_materialized_entmax():
    q, k, _, _ = (t.to(torch.bfloat16) for t in AI.structured_inputs(1, 4, 2, 256, 32, locality=60.0))
    expected = [_brute_force(q[0, h], k[0, h // 2], 32, 16) for h in range(4)]
    assert AI.block_sparsity(q, k, 32, 16, rows=64) == pytest.approx(sum(expected) / 4, abs=1e-12)
    assert 0.3 < sum(expected) / 4 < 1  # the bias leaves tiles out


def test_the_kernels_skip_more_tiles_on_structured_inputs(triton_device):
    """forward_stats (the fused kernels in Triton's interpreter) on random and structured inputs of one length:
    the structured ones reach a block sparsity well above the random ones' (which keep every tile), and the
    kernels' count is the reference's."""
    from softargmax.backends.triton import flash_attention as FA

    L, D, tile = 128, 16, 16
    got = {}
    for kind in ("random", "structured"):
        made = AI.random_inputs(1, 1, 1, L, D) if kind == "random" else AI.structured_inputs(1, 1, 1, L, D, 40.0)
        q, k, v, _ = (t.to(torch.bfloat16) for t in made)
        st = FA.forward_stats(*(t.to(triton_device) for t in (q, k, v)), is_causal=True, mapping="entmax15",
                              block_m=tile, block_n=tile)
        assert st["block_sparsity"] == pytest.approx(AI.block_sparsity(q, k, tile, tile), abs=1.5 / st["tiles"])
        got[kind] = st["block_sparsity"]
    assert got["random"] < 0.05 and got["structured"] > 0.4, got


def test_the_structured_cases_come_from_the_calibration(tmp_path):
    """STRUCTURED is the calibration's chosen λ (D = 128 also with 32 query heads over 8); no calibration: none."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"chosen": [
        {"head_dim": 64, "length": 4096, "target": 0.5, "locality": 7.5, "cpu_block_sparsity": 0.51},
        {"head_dim": 128, "length": 8192, "target": 0.7, "locality": 9.0, "cpu_block_sparsity": 0.69}]}))
    assert AG.structured_cases(str(path)) == [AG.Structured(64, 4096, 16, 16, 0.5, 7.5, 0.51),
                                              AG.Structured(128, 8192, 16, 16, 0.7, 9.0, 0.69),
                                              AG.Structured(128, 8192, 32, 8, 0.7, 9.0, 0.69)]
    assert AG.structured_cases(str(tmp_path / "missing.json")) == []


@pytest.mark.skipif(not CALIBRATION.exists(), reason="the calibration JSON is not committed yet")
def test_the_calibration_hits_its_targets_and_the_kernels_agreed():
    data = json.loads(CALIBRATION.read_text())
    for c in data["chosen"]:
        assert abs(c["cpu_block_sparsity"] - c["target"]) < 0.03, c
    assert data["tiles"] == {"64": [64, 64], "128": [64, 16]}
    for r in data.get("interpreter", []):
        assert r["forward_stats"] == pytest.approx(r["reference"], abs=1.5 / r["band_tiles"]), r
    assert "measured on the GPU by the benchmark run itself" in data["note"]
    full = AG.chosen_structured()
    assert {(s.length, s.target) for s in full if s.head_dim == 64} == {
        (L, t) for L in (4096, 16384) for t in (0.5, 0.7, 0.85)}
    assert {(s.heads, s.kv_heads) for s in full if s.head_dim == 128} == {(16, 16), (32, 8)}


def test_the_lists_of_structured_cases(monkeypatch):
    monkeypatch.setattr(AG, "STRUCTURED", [AG.Structured(64, 4096, 16, 16, t, 10.0, t) for t in (0.5, 0.7)]
                        + [AG.Structured(64, 16384, 16, 16, 0.5, 10.0, 0.5)])
    monkeypatch.setattr(AG, "QUICK_STRUCTURED", AG.STRUCTURED[:2])
    assert AG.chosen_structured() == AG.STRUCTURED
    monkeypatch.setenv("SOFTARGMAX_BENCH_ATTENTION_SHAPES", "quick")
    assert AG.chosen_structured() == AG.QUICK_STRUCTURED
    assert AG.chosen_structured(smoke=True) == AG.SMOKE_STRUCTURED


def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                          enable_gqa=k.shape[1] != q.shape[1]).to(q.dtype)


def test_structured_cases_run_with_grouped_heads_and_the_peers_by_group(monkeypatch):
    """Structured cases (the fused kernels off: the interpreter is slow) record their inputs and knob; a peer
    that reads grouped key/value heads gets them as they are, another repeated copies; the peers run over the
    cases grouped by head dim (one tuning per group) although a structured case of the first head dim comes
    after a shape of another."""
    from softargmax.backends.triton import flash_attention as FA

    monkeypatch.setattr(FA, "available", lambda: False)
    seen = []

    def peer(name, grouped):
        def run(q, k, v, causal):
            seen.append((name, q.shape[3], q.shape[1], k.shape[1]))
            return _sdpa(q, k, v, causal)

        run.grouped_kv = grouped
        return run

    peers = {"adasplash2_a1.5": peer("two", True), "adasplash1_a1.5": peer("one", False)}
    monkeypatch.setattr(AG, "_implementations", lambda device, heads, fused_ok, window=None: (
        {"sdpa": _sdpa}, peers, None))
    groups = []

    class Tuning:
        def new_group(self):
            groups.append(len(seen))

        def tuned(self):
            pass

        def record(self):
            return {}

    structured = [AG.Structured(16, 32, 4, 2, 0.5, 30.0, 0.5)]
    cases = AG.attention_cases(CPU, repeats=1, shapes=[(True, 16, 32), (True, 32, 32)], structured=structured,
                               impls={"sdpa": _sdpa}, peers=peers, batch_heads=(1, 2), tuning=Tuning(),
                               log=lambda s: None)
    assert [c["inputs"] for c in cases] == ["random", "random", "structured"]
    st = cases[2]
    assert st["shape"] == [1, 4, 32, 16] and st["kv_heads"] == 2 and st["locality"] == 30.0
    assert (st["target_block_sparsity"], st["cpu_block_sparsity"], st["sinks"]) == (0.5, 0.5, AI.SINKS)
    assert st["impls"]["adasplash2_a1.5"]["kv_input"] == "grouped"
    assert st["impls"]["adasplash1_a1.5"]["kv_input"] == "repeated"
    assert "kv_input" not in cases[0]["impls"]["adasplash2_a1.5"]
    # peers: D = 16 (the shape, then the structured case), then D = 32; one new group each
    dims = [s[1] for s in seen]  # (each timing calls a peer several times: warm-up, check, repeats)
    first = dims.index(32)
    assert set(dims[:first]) == {16} and set(dims[first:]) == {32} and groups == [0, first], (dims, groups)
    # the structured case (4 query heads) is timed within the D = 16 group, before any D = 32 call
    assert max(i for i, s in enumerate(seen) if s[2] == 4) < first
    assert ("two", 16, 4, 2) in seen and ("one", 16, 4, 4) in seen
