"""The attention reproductions: adaptive-attention (Correia et al., 2019, Multi30k) and nli-attention (Martins & Astudillo, 2016, §4.3, SNLI)."""


import pytest
import torch
from conftest import DATA, check_progress_log  # noqa: E402

import softargmax as sa

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)


@pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="data not present: multi30k")
def test_adaptive_attention_smoke(smoke_run):
    pytest.importorskip("sentencepiece")
    pytest.importorskip("sacrebleu")
    out, res = smoke_run("adaptive-attention", "--data-dir", str(SHARED))
    S = res["systems"]
    assert set(S) == {"softmax", "entmax15", "adaptive"}
    for name, rec in S.items():
        assert 0 <= rec["bleu"] <= 100 and rec["step_seconds_interleaved"] > 0
        assert len(rec["attention"]) == 3  # encoder self, decoder self, context (1 layer each in smoke)
        for m in rec["attention"].values():
            assert all(0 < d <= 1 for d in m["density"])
            assert 0 <= m["js_mean"] <= 0.6932
            if name == "softmax":
                assert m["density"] == [1.0] * len(m["density"]) and m["alpha"] is None
            if name == "adaptive":  # learned: alpha moved off its start, stays inside (1, 2)
                assert all(1 < a < 2 for a in m["alpha"]) and any(abs(a - 1.5) > 1e-4 for a in m["alpha"])
    assert S["entmax15"]["mean_density"] < 1
    hist = [h for h in S["adaptive"]["history"] if "alphas" in h]
    assert hist, "the learned alphas are recorded during training"
    for f in ("report.md", "alpha_per_head.png", "density_and_js.png", "alpha_trajectories.png"):
        assert (out / f).exists(), f
    check_progress_log(out, 3, ["softmax", f"{S['softmax']['bleu']:.2f}", "100%", "1.00×"])


def test_analysis_masks_padding_and_causality():
    """Densities are counted over the keys a query may see: a causal, padded decoder row of softmax is fully dense."""
    from softargmax.experiments.adaptive_attention import _block

    assert _block("transformer.encoder.layers.1.self_attn") == ("self_attn@encoder", 1)
    assert _block("transformer.decoder.layers.0.multihead_attn") == ("multihead_attn@decoder", 0)
    w = torch.zeros(1, 2, 3, 3)
    allowed = torch.ones(3, 3, dtype=torch.bool).tril()
    w[..., :, :] = torch.softmax(torch.randn(1, 2, 3, 3).masked_fill(~allowed, float("-inf")), -1)
    assert sa.analysis.head_density(w, allowed).tolist() == [1.0, 1.0]


@pytest.mark.skipif(not (SHARED / "snli").exists(), reason="data not present: snli")
def test_nli_attention_smoke(smoke_run):
    out, res = smoke_run("nli-attention", "--data-dir", str(SHARED))
    S = res["systems"]
    assert set(S) == {"noattention", "logistic", "softmax", "sparsemax", "entmax15"}
    for rec in S.values():
        assert 20 < rec["test_mean"] < 100  # three balanced classes
    assert S["softmax"]["selected_share"] == 1.0 and 0 < S["sparsemax"]["selected_share"] < 1
    for ex in res["examples"]:
        w = torch.tensor(ex["weights"]["sparsemax"])
        assert len(w) == len(ex["premise"]) and abs(float(w.sum()) - 1) < 1e-3
    assert (out / "report.md").exists() and (out / "attention_examples.png").exists()
    check_progress_log(out, 5, ["NoAttention", f"{S['noattention']['test_mean']:.2f}"])


def test_nli_model_ignores_padding_and_rejects_bad_input():
    from softargmax.experiments.nli_attention import AttentionNLI, Vocab, pad, read_split

    torch.manual_seed(0)
    model = AttentionNLI(20, 8, "sparsemax", dropout=0.0).eval()
    prem, plen = pad([[2, 3, 4], [5, 6, 7, 8, 9]])
    hyp, hlen = pad([[3, 4], [6, 7, 8]])
    with torch.no_grad():
        logits, w = model(prem, plen, hyp, hlen)
        alone, _ = model(*pad([[2, 3, 4]]), *pad([[3, 4]]))
    torch.testing.assert_close(logits[:1], alone, atol=1e-5, rtol=1e-5)
    assert float(w[0, 3:].abs().sum()) == 0 and torch.allclose(w.sum(1), torch.ones(2))
    assert Vocab([["a", "a", "b"]], min_count=2).encode(["a", "b"]) == [2, 1]
    with pytest.raises(ValueError, match="system must be"):
        AttentionNLI(10, 4, "tanh")
    with pytest.raises(ValueError, match="training split is not available"):
        read_split(SHARED / "snli", "train")


@pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="data not present: multi30k")
def test_adaptive_attention_rerun_with_the_same_seed_is_identical(rerun_is_identical):
    pytest.importorskip("sentencepiece")
    pytest.importorskip("sacrebleu")
    rerun_is_identical("adaptive-attention", "--data-dir", str(SHARED))


@pytest.mark.skipif(not (SHARED / "snli").exists(), reason="data not present: snli")
def test_nli_attention_rerun_with_the_same_seed_is_identical(rerun_is_identical):
    rerun_is_identical("nli-attention", "--data-dir", str(SHARED))


def test_adaptive_attention_gives_no_bleu_verdict_without_a_measure_of_noise():
    from softargmax.experiments import adaptive_attention

    # one seed, no significance test: a 0.3 BLEU gap may not be called "no loss" (nor a 3-point gap a loss)
    for gap in (0.3, 3.0):
        (line,) = adaptive_attention._claims({"softmax": {"bleu": 24.0}, "entmax15": {"bleu": 24.0 - gap}})
        assert "not tested" in line and "holds" not in line, line
