"""The translation experiment: data, tokenizer, model, decoding, and a smoke run of the whole pipeline."""

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("sentencepiece")
pytest.importorskip("sacrebleu")

import softargmax as sa
from softargmax.experiments.nmt import data
from softargmax.experiments.nmt.decoding import DecodeStats, beam_search, empty_string_scores, pad_batch
from softargmax.experiments.nmt.model import ModelConfig, OutputLayer, Seq2Seq
from softargmax.experiments.nmt.tokenizer import BOS, EOS, PAD, Tokenizer
from softargmax.experiments.nmt.training import calibrate_tau, make_batches, noam, tensors

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="../shared/data/multi30k not present")


@needs_data
def test_local_data_sizes_and_checksums():
    folder = data.find(str(SHARED))
    assert folder == SHARED / "multi30k"
    train = data.read_split(folder, "train")
    val = data.read_split(folder, "val", verify=True)
    test = data.read_split(folder, "test", verify=True)
    assert (len(train), len(val), len(test)) == (29000, 1014, 1000)
    assert train.src[0] and train.tgt[0] and train.src[0] != train.tgt[0]
    with pytest.raises(ValueError, match="split must be"):
        data.read_split(folder, "dev")


def test_missing_data_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SOFTARGMAX_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        data.find(None)


def _toy():
    src = ["ein hund läuft", "eine katze schläft", "zwei männer spielen fußball", "ein kind lacht"] * 20
    tgt = ["a dog runs", "a cat sleeps", "two men play soccer", "a child laughs"] * 20
    return src, tgt


def test_tokenizer_roundtrip_and_special_ids(tmp_path):
    src, tgt = _toy()
    tok = Tokenizer.train(src + tgt, 60)
    ids = tok.encode(tgt[:3])
    assert tok.decode([[BOS] + i + [EOS, PAD] for i in ids]) == tgt[:3]
    tok.save(tmp_path / "m.model")
    assert Tokenizer.load(tmp_path / "m.model").encode(tgt[:2]) == ids[:2]


def test_output_layers_use_the_library():
    logits = torch.randn(6, 20)
    target = torch.tensor([1, 2, 3, PAD, 5, 6])
    for system, fn, loss in [("softmax", lambda z: torch.softmax(z, -1), "softmax"),
                             ("sparsemax", sa.sparsemax, "sparsemax"), ("entmax15", sa.entmax15, "entmax15")]:
        layer = OutputLayer(system)
        torch.testing.assert_close(layer.probs(logits), fn(logits))
        torch.testing.assert_close(layer.loss(logits, target), sa.fenchel_young_loss(logits, target, loss, ignore_index=PAD))
    layer = OutputLayer("alpha_relu")
    layer.tau = 0.3
    torch.testing.assert_close(layer.probs(logits), sa.alpha_relu(logits, 1.5, 0.3))
    with pytest.raises(ValueError, match="system must be"):
        OutputLayer("softmaxx")


def _tiny_model(vocab=30, seed=0):
    torch.manual_seed(seed)
    m = Seq2Seq(ModelConfig(vocab_size=vocab, d_model=16, heads=2, layers=1, ff=32, dropout=0.0, max_len=64))
    m.eval()
    return m


def test_beam_one_is_greedy_and_statistics():
    m = _tiny_model()
    src = pad_batch([[5, 6, 7, EOS], [8, 9, EOS]], "cpu")
    for system in ["softmax", "sparsemax", "entmax15"]:
        layer = OutputLayer(system)
        out, scores = beam_search(m, layer, src, beam=1, max_len=12)
        # greedy reference
        with torch.no_grad():
            memory, mask = m.encode(src)
        for i in range(2):
            seq, total = [BOS], 0.0
            for _ in range(12):
                with torch.no_grad():
                    logp = layer.log_probs(m.decode(torch.tensor([seq]), memory[i : i + 1], mask[i : i + 1])[:, -1])[0]
                t = int(logp.argmax())
                total += float(logp[t])
                if t == EOS:
                    break
                seq.append(t)
            assert out[i] == seq[1:]
            assert scores[i] == pytest.approx(total, abs=1e-4)
        # a wider beam returns complete hypotheses with finite scores
        seqs, wide = beam_search(m, layer, src, beam=4, max_len=12)
        assert len(seqs) == 2 and all(math.isfinite(w) for w in wide) and all(EOS not in q for q in seqs)
    stats = DecodeStats()
    beam_search(m, OutputLayer("sparsemax"), src, beam=2, max_len=6, stats=stats)
    assert stats.zeros and stats.vocab == 30 and 0 < stats.zero_fraction < 1
    assert all(abs(s - 1) < 1e-5 for s in stats.sums)


def test_empty_string_score_is_log_p_eos():
    m = _tiny_model()
    src = pad_batch([[5, 6, EOS]], "cpu")
    layer = OutputLayer("entmax15")
    memory, mask = m.encode(src)
    p = sa.entmax15(m.decode(torch.tensor([[BOS]]), memory, mask)[:, -1])
    assert empty_string_scores(m, layer, src)[0] == pytest.approx(math.log(float(p[0, EOS])) if p[0, EOS] > 0 else -math.inf)


def test_batches_schedule_and_tau_calibration():
    src, tgt = _toy()
    tok = Tokenizer.train(src + tgt, 60)
    pairs, batches = make_batches(tok.encode(src), tok.encode(tgt), 64, 0, 50)
    assert sorted(i for b in batches for i in b) == list(range(len(pairs)))
    assert noam(1, 128, 100, 1.0) < noam(100, 128, 100, 1.0) > noam(1000, 128, 100, 1.0)
    m = _tiny_model(vocab=len(tok))
    batch = tensors(pairs, batches[0], "cpu")
    tau = calibrate_tau(m, OutputLayer("alpha_relu"), batch)
    with torch.no_grad():
        logits = m(batch[0], batch[1])[batch[2] != PAD]
    assert tau == pytest.approx(float(sa.tau.from_logits(logits, 1.5)), rel=1e-5)


@needs_data
def test_smoke_run_end_to_end_and_resume(tmp_path, capsys):
    from softargmax.cli import main
    from softargmax.experiments import translation

    out = tmp_path / "smoke"
    assert main(["reproduce", "translation", "--preset", "smoke", "--data-dir", str(SHARED), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ETA" in printed and "test BLEU" in printed
    res = json.loads((out / "results.json").read_text())
    assert set(res["systems"]) == {"softmax", "sparsemax", "entmax15", "alpha_relu"}
    for name, rec in res["systems"].items():
        for key in ["bleu", "train_seconds", "tokens_per_second", "empty_string_rate", "zero_fraction",
                    "seconds_per_step", "inference_seconds", "history", "sum_per_step"]:
            assert key in rec, (name, key)
        assert 0 <= rec["bleu"] <= 100 and 0 <= rec["empty_string_rate"] <= 1
    assert res["systems"]["softmax"]["zero_fraction"] == 0
    assert res["systems"]["sparsemax"]["zero_fraction"] > 0
    assert "tau" in res["systems"]["alpha_relu"] and "tau_formula" in res["systems"]["alpha_relu"]
    assert res["settings"]["data"]["train"] == 300
    report = (out / "report.md").read_text()
    assert "Table 1" in report and "35.3" in report and "Claims checked" in report
    assert (out / "curves_bleu.png").exists() and (out / "alpha_relu_sums.png").exists()
    # resume: training is skipped, evaluation redone
    res2 = translation.run(preset="smoke", data_dir=str(SHARED), out=str(out), systems=("softmax",), log=lambda *_: None)
    assert res2["systems"]["softmax"]["steps_done"] == res["systems"]["softmax"]["steps_done"]
    assert res2["systems"]["softmax"]["bleu"] == pytest.approx(res["systems"]["softmax"]["bleu"])
