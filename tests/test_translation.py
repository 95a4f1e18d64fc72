"""The translation experiment: data, tokenizer, model, decoding, and a smoke run of the whole pipeline."""

import json
import math
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("sentencepiece")
pytest.importorskip("sacrebleu")

from conftest import DATA  # noqa: E402

import softargmax as sa
from softargmax.experiments.nmt import data
from softargmax.experiments.nmt.decoding import DecodeStats, beam_search, empty_string_scores, pad_batch
from softargmax.experiments.nmt.model import ModelConfig, OutputLayer, Seq2Seq
from softargmax.experiments.nmt.tokenizer import BOS, EOS, PAD, Tokenizer
from softargmax.experiments.nmt.training import calibrate_tau, make_batches, noam, tensors

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)
needs_data = pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="data not present: multi30k")


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
    assert tau == pytest.approx(float(sa.alpha_relu_tau.from_logits(logits, 1.5)), rel=1e-5)


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
    assert (out / "runs" / "softmax" / "seed0" / "checkpoint.pt").exists()  # one folder per run, one seed or several
    # the trained systems timed interleaved: the speed ratios, their intervals and the inference times come from it
    speed = res["speed"]
    assert set(speed["train"]) == set(res["systems"]) and speed["rounds"] == 3 and (out / translation.SPEED_FILE).exists()
    for name, rec in res["systems"].items():
        assert rec["seconds_per_step_vs_softmax"] == speed["train"][name]["ratio"]
        lo, hi = speed["train"][name]["ci"]
        assert lo <= rec["seconds_per_step_vs_softmax"] <= hi and len(speed["timing"]["train_seconds_per_step"][name]) == 3
        assert rec["inference_normalized"]["1"] == speed["inference"][name]["1"]["ratio"]
    assert "timed interleaved" in report and "95% interval" in report
    # the same command again: every run has its record, nothing is trained, the report is rebuilt
    assert main(["reproduce", "translation", "--preset", "smoke", "--data-dir", str(SHARED), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # one message: the results are complete, the report is rebuilt, where (no ETA, no timing, no run time)
    assert "the results are complete: all 4 runs asked for have their run record in" in printed
    assert f"rebuilt {out / 'report.md'} (with {out / 'results.json'} and " in printed
    assert "step 1/" not in printed and "timed" not in printed and " min" not in printed and "continuing" not in printed
    # the headline numbers close the log: BLEU and step time of each system, the verdict on each claim
    summary = printed[printed.index("summary ("):].splitlines()
    assert summary[2].split()[:2] == ["softmax", f"{res['systems']['softmax']['bleu']:.2f}"]
    assert summary[5].split()[:2] == ["1.5-ReLU", f"{res['systems']['alpha_relu']['bleu']:.2f}"]
    assert any(line.strip().startswith(("holds:", "not shown:", "does not hold:")) for line in summary[6:])
    assert json.loads((out / "results.json").read_text())["systems"]["softmax"]["bleu"] == res["systems"]["softmax"]["bleu"]
    # --runs trains a run again: training is skipped (its last checkpoint), evaluation redone
    res2 = translation.run(preset="smoke", data_dir=str(SHARED), out=str(out), runs=["softmax:0"], log=lambda *_: None)
    assert res2["systems"]["softmax"]["steps_done"] == res["systems"]["softmax"]["steps_done"]
    assert res2["systems"]["softmax"]["bleu"] == pytest.approx(res["systems"]["softmax"]["bleu"])


# --- the gpu preset: seeds, model selection, significance ---------------------------------------------------

from softargmax.experiments.nmt.data import Parallel  # noqa: E402
from softargmax.experiments.nmt.training import TrainConfig, train_system, validation_loss  # noqa: E402


def test_train_config_checks_selection_settings():
    with pytest.raises(ValueError, match="select must be"):
        TrainConfig(select="best")
    with pytest.raises(ValueError, match="patience needs"):
        TrainConfig(patience=2)
    with pytest.raises(ValueError, match="patience must be"):
        TrainConfig(select="bleu", patience=0)


def test_early_stopping_returns_the_kept_weights_and_resumes_without_training(tmp_path):
    src, tgt = _toy()
    tok = Tokenizer.train(src + tgt, 60)
    train, val = Parallel(src, tgt), Parallel(src[:8], tgt[:8])
    mcfg = ModelConfig(vocab_size=len(tok), d_model=16, heads=2, layers=1, ff=32, dropout=0.0, max_len=64)
    # the loss keeps falling; "select on loss with a step limit" and "select on BLEU with patience 1"
    # exercise both ways a run ends
    cfg = TrainConfig(steps=40, batch_tokens=64, warmup=4, lr=0.5, eval_every=3, val_bleu_sentences=8, seed=1,
                      select="bleu", patience=1)
    tr = train_system("entmax15", mcfg, cfg, tok, train, val, tmp_path / "run", log=lambda *a: None)
    rec = tr["record"]
    h = rec["history"]
    best = max(h, key=lambda e: (e["val_bleu"], -e["step"]))
    assert rec["kept_step"] == best["step"]
    # stopped one evaluation after the last improvement, or at the step limit
    assert rec["stopped_early"] and h[-1]["step"] == rec["kept_step"] + cfg.eval_every
    assert rec["steps_done"] == h[-1]["step"] < cfg.steps and len(rec["train_loss"]) == rec["steps_done"]
    # the returned model is the kept one, not the last one
    vpairs, vbatches = make_batches(tok.encode(val.src), tok.encode(val.tgt), cfg.batch_tokens, 0, cfg.max_len)
    layer = tr["layer"]
    assert validation_loss(tr["model"], layer, vpairs, vbatches, "cpu") == pytest.approx(best["val_loss"], rel=1e-6)
    assert best["val_loss"] != pytest.approx(h[-1]["val_loss"], rel=1e-6)
    # resuming a stopped run trains nothing and gives back the kept weights
    again = train_system("entmax15", mcfg, cfg, tok, train, val, tmp_path / "run", log=lambda *a: None)
    assert again["record"]["steps_this_run"] == 0
    assert validation_loss(again["model"], layer, vpairs, vbatches, "cpu") == pytest.approx(best["val_loss"], rel=1e-6)


def _hyps_pair(n=150, seed=0):
    import random

    rng = random.Random(seed)
    words = "a dog cat runs man woman plays ball in the park red blue on grass".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) for _ in range(n)]

    def noisy(r, p):
        return " ".join(w if rng.random() > p else rng.choice(words) for w in r.split())

    return refs, noisy


def test_paired_bootstrap_is_sacrebleus_for_one_seed_and_pools_seeds():
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from softargmax.experiments.nmt.significance import paired_bootstrap

    refs, noisy = _hyps_pair()
    a1, a2 = [noisy(r, 0.35) for r in refs], [noisy(r, 0.35) for r in refs]
    b1, b2 = [noisy(r, 0.38) for r in refs], [noisy(r, 0.38) for r in refs]
    ours = paired_bootstrap([a1], [b1], refs, n_samples=500, seed=12345)
    _, theirs = PairedTest([("B", b1), ("A", a1)], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=500)()
    assert ours["bleu_a"] == pytest.approx(theirs["BLEU"][1].score)
    assert ours["bleu_b"] == pytest.approx(theirs["BLEU"][0].score)
    assert ours["p_value"] == pytest.approx(theirs["BLEU"][1].p_value)
    assert 0.01 < ours["p_value"] < 1  # close systems: a p-value away from the floor
    assert ours["ci"][0] < ours["delta"] < ours["ci"][1]
    # pooled seeds: the BLEU of the concatenated corpora; the same seed twice changes nothing
    pooled = paired_bootstrap([a1, a2], [b1, b2], refs, n_samples=200)
    assert pooled["bleu_a"] == pytest.approx(BLEU().corpus_score(a1 + a2, [refs + refs]).score)
    twice = paired_bootstrap([a1, a1], [b1, b1], refs, n_samples=500, seed=12345)
    assert twice["bleu_a"] == pytest.approx(ours["bleu_a"]) and twice["p_value"] == ours["p_value"]
    # a clearly better system is significant
    far = paired_bootstrap([[noisy(r, 0.05) for r in refs]], [b1], refs, n_samples=200)
    assert far["p_value"] < 0.01 and far["ci"][0] > 0
    with pytest.raises(ValueError, match="same positive number of seeds"):
        paired_bootstrap([a1], [b1, b2], refs)


def test_selection_check_and_ordering_flag_what_they_should():
    from softargmax.experiments.nmt import report, verdicts

    st = {"training": {"select": "bleu", "patience": 2, "steps": 100}}
    h = [{"step": 10, "val_bleu": 5.0, "val_loss": 2.0}, {"step": 20, "val_bleu": 7.0, "val_loss": 1.9},
         {"step": 30, "val_bleu": 6.0, "val_loss": 2.1}]
    good = {"s": {"seeds": {"1": {"history": h, "kept_step": 20, "steps_done": 30}}}}
    assert verdicts.check_selection(good, st)["not_best"] == []
    assert "holds" in report._selection_claims(good, st)[0]
    kept_last = {"s": {"seeds": {"1": {"history": h, "kept_step": 30, "steps_done": 30}}}}
    assert verdicts.check_selection(kept_last, st)["not_best"] == ["s seed 1"]
    assert "does not hold" in report._selection_claims(kept_last, st)[0]
    late = {"s": {"seeds": {"1": {"history": h + [{"step": 40, "val_bleu": 1.0, "val_loss": 3.0}] * 2,
                                  "kept_step": 20, "steps_done": 50}}}}
    assert verdicts.check_selection(late, st)["trained_past_patience"] == ["s seed 1"]
    S = {"softmax": {"bleu": 30.0}, "entmax15": {"bleu": 31.0}, "alpha_relu": {"bleu": 31.2}}
    sig = [{"a": "alpha_relu", "b": "entmax15", "p_value": 0.3}, {"a": "entmax15", "b": "softmax", "p_value": 0.001},
           {"a": "alpha_relu", "b": "softmax", "p_value": 0.001}]
    assert verdicts.ordering(S, sig) == "1.5-ReLU ≈ 1.5-entmax > softmax"


def test_gpu_preset_is_transformer_base_with_selection_and_cli_accepts_it():
    from softargmax.cli import build_parser
    from softargmax.experiments import translation

    P = translation.preset_settings("gpu")
    assert P["model"] == dict(d_model=512, heads=8, layers=6, ff=2048, dropout=0.3) and P["vocab"] == 10000
    cfg = TrainConfig(**P["train_cfg"])
    assert cfg.select == "bleu" and cfg.patience and cfg.batch_tokens == 8192 and len(P["seeds"]) == 3
    small = translation.preset_settings("gpu", {"model": {"d_model": 16}, "train": 10})
    assert small["model"]["d_model"] == 16 and small["model"]["layers"] == 6 and small["train"] == 10
    assert translation.PRESETS["gpu"]["model"]["d_model"] == 512  # the preset itself is untouched
    with pytest.raises(ValueError, match="overrides: unknown key"):
        translation.preset_settings("gpu", {"modle": {}})
    args = build_parser().parse_args(["reproduce", "translation", "--preset", "gpu", "--seeds", "1", "2", "3"])
    assert args.preset == "gpu" and args.seeds == [1, 2, 3]
    with pytest.raises(ValueError, match="seeds must be distinct"):
        translation.run(preset="smoke", seeds=[1, 1])


@needs_data
def test_gpu_preset_at_toy_size(split_runs):
    out, res = split_runs[0] / "one", split_runs[1]  # 2 systems × seeds 1, 2 in one call (the fixture below)
    st = res["settings"]
    assert st["seeds"] == [1, 2] and st["processes"] == 1 and st["training"]["select"] == "bleu"
    assert st["model"]["dropout"] == 0.3 and st["training"]["weight_decay"] == 0.01
    for rec in res["systems"].values():
        per = rec["seeds"]
        assert set(per) == {"1", "2"}
        bleus = [per[s]["bleu"] for s in per]
        assert rec["bleu"] == pytest.approx(sum(bleus) / 2) and "bleu_std" in rec and "empty_string_rate_std" in rec
        for r in per.values():
            h = r["history"]
            assert r["kept_step"] == max(h, key=lambda e: (e["val_bleu"], -e["step"]))["step"]
            assert r["steps_done"] <= 12 and (not r.get("stopped_early") or h[-1]["step"] - r["kept_step"] == 2 * 3)
    assert any(r.get("stopped_early") for rec in res["systems"].values() for r in rec["seeds"].values())
    assert res["systems"]["alpha_relu"]["tau_std"] >= 0
    (sig,) = res["significance"]
    assert {sig["a"], sig["b"]} == {"softmax", "alpha_relu"} and sig["seeds"] == 2 and 0 < sig["p_value"] <= 1
    report = (out / "report.md").read_text()
    for text in ["seeds 1, 2", "± ", "Significance of the BLEU differences", "Seeds and model selection",
                 "No validation curve rises while the kept model keeps training", "weight decay 0.01", "dropout 0.3"]:
        assert text in report, text
    assert "keeps training: in all 4 runs" in report and (out / "curves_selection.png").exists()
    assert (out / "runs" / "softmax" / "seed2" / "best.pt").exists()


# --- the report says no more than its statistics ----------------------------------------------------------

REPORT = Path(__file__).resolve().parents[1] / "reports" / "translation"
PAIRS = [("softmax", "sparsemax"), ("softmax", "entmax15"), ("softmax", "alpha_relu"), ("sparsemax", "entmax15"),
         ("sparsemax", "alpha_relu"), ("entmax15", "alpha_relu")]


def _results_with(bleu: dict, p: dict) -> dict:
    """The committed results with the systems' BLEU set to ``bleu`` and a paired bootstrap of all 6 pairs whose
    p-values are ``p[(a, b)]`` (0.5 for pairs not named)."""
    res = json.loads((REPORT / "results.json").read_text())
    for s, v in bleu.items():
        res["systems"][s]["bleu"] = v
    res["significance"] = [{"a": a, "b": b, "bleu_a": bleu[a], "bleu_b": bleu[b], "delta": bleu[a] - bleu[b],
                            "ci": [bleu[a] - bleu[b] - 1.0, bleu[a] - bleu[b] + 1.0], "p_value": p.get((a, b), 0.5),
                            "n_samples": 1000, "seeds": 1, "sentences": 1000} for a, b in PAIRS]
    return res


def _claim_lines(report: str, start: str) -> list:
    return [line for line in report.splitlines() if line.startswith(start)]


def test_a_bleu_claim_holds_only_below_the_reports_bonferroni_threshold():
    from softargmax.experiments.nmt.report import render_report

    bleu = {"softmax": 24.0, "sparsemax": 17.6, "entmax15": 25.0, "alpha_relu": 24.7}
    # 0.7 BLEU better with p = 0.049: significant at 0.05 but not at 0.05 / 6 = 0.0083, the report's own threshold
    report = render_report(_results_with(bleu, {("softmax", "alpha_relu"): 0.049}), [])
    assert "p < 0.0083 (0.05 / 6 comparisons, Bonferroni)" in report
    (line,) = _claim_lines(report, "- 1.5-ReLU beats softmax")
    assert "holds" not in line and "not shown (BLEU 24.70 vs 24.00, p = 0.0490, threshold 0.0083)" in line
    # the same difference with p far below the threshold holds
    report = render_report(_results_with(bleu, {("softmax", "alpha_relu"): 0.002}), [])
    (line,) = _claim_lines(report, "- 1.5-ReLU beats softmax")
    assert line.startswith("- 1.5-ReLU beats softmax: holds (") and "p = 0.0020 < 0.0083" in line
    # reversed and significant: does not hold; reversed and not significant: not shown
    swapped = dict(bleu, softmax=24.7, alpha_relu=24.0)
    (line,) = _claim_lines(render_report(_results_with(swapped, {("softmax", "alpha_relu"): 0.002}), []),
                           "- 1.5-ReLU beats softmax")
    assert ": does not hold (BLEU 24.00 vs 24.70" in line
    (line,) = _claim_lines(render_report(_results_with(swapped, {}), []), "- 1.5-ReLU beats softmax")
    assert ": not shown (" in line
    # the committed run: 1.5-ReLU's lead over softmax is not significant, its lead over sparsemax is
    committed = (REPORT / "report.md").read_text()
    assert _claim_lines(committed, "- 1.5-ReLU beats softmax: not shown (")
    assert _claim_lines(committed, "- 1.5-ReLU beats sparsemax: holds (")


def _perturbed(x, shift: int, counter=None):
    """Every float in ``x`` moved, each by its own factor (so that ratios move too); integers and strings kept.

    The factors are drawn per float (seeded by ``shift`` and the float's position, in ``[shift + 0.1, shift + 1]``,
    so that the three moves never round a small number alike), not from a short cycle: two
    times whose positions differ by the cycle's length would keep their ratio, and a speed ratio stay put."""
    counter = [shift] if counter is None else counter
    if isinstance(x, dict):
        return {k: _perturbed(v, shift, counter) for k, v in x.items()}
    if isinstance(x, list):
        return [_perturbed(v, shift, counter) for v in x]
    if isinstance(x, float):
        counter[0] += 1
        return random.Random(1000 * shift + counter[0]).uniform(0.1 + shift, 1.0 + shift) * x + 0.037 * shift
    return x


def _strings(x):
    if isinstance(x, dict):
        for k, v in x.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)
    elif isinstance(x, str):
        yield x


def test_every_number_in_the_report_moves_with_results_json():
    """A decimal number that stays put when every float of results.json moves must be a stated criterion or part
    of a string in results.json (a device or version name): a past run's BLEU kept in code would stay put."""
    import re

    from softargmax.experiments.nmt import verdicts
    from softargmax.experiments.nmt.report import render_report

    number = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.-])")  # not the 1.5 of "1.5-ReLU", nor parts of "2.13.0"
    results = json.loads((REPORT / "results.json").read_text())
    report = render_report(results, [])

    def lines(text):  # each line with numbers by the words before its first number and that prefix's rank
        seen: dict = {}
        out = {}
        for line in text.splitlines():
            found = number.findall(line)
            if not found:
                continue
            prefix = line[: number.search(line).start()]
            rank = seen[prefix] = seen.get(prefix, -1) + 1
            out[(prefix, rank)] = (number.sub("#", line), found)
        return out

    # a number stays put where the same line (the same words before its first number) holds it again: at the same
    # place when the line reads the same, anywhere in it when its words changed (a verdict that flipped); two
    # lines that happen to hold one number do not count
    stays = {(key, j): n for key, (_, found) in lines(report).items() for j, n in enumerate(found)}
    for shift in (1, 2, 3):  # three moves, so that no number stays put by coincidence
        moved = _perturbed(results, shift)
        report_moved = render_report(moved, [])
        assert report_moved != report
        before, now = lines(report), lines(report_moved)
        kept = {}
        for (key, j), n in stays.items():
            if key not in now:
                continue
            template, found = now[key]
            if (template == before[key][0] and found[j] == n) or (template != before[key][0] and n in found):
                kept[(key, j)] = n
        stays = kept
    stays = set(stays.values())
    criteria = [verdicts.LEVEL, verdicts.BLEU_MARGIN, verdicts.SPEED_MARGIN, verdicts.TAU_TOLERANCE,
                verdicts.SPARSITY_SE, verdicts.bonferroni_threshold(results["significance"]), 0.0, 1.0]
    in_strings = {n for s in _strings(results) for n in number.findall(s)}
    stuck = []
    for n in sorted(stays):
        digits = len(n.split(".")[1])
        if n not in in_strings and not any(float(n) == round(c, digits) for c in criteria):
            stuck.append(n)
    assert not stuck, f"numbers in the report that do not come from results.json: {stuck}"
    # and those that come from it follow it: the claims quote the BLEU and p-values the bootstrap gave
    claims = report_moved.split("## Claims checked")[1].split("## Discussion")[0]
    for r in moved["significance"]:
        if r["b"] == "alpha_relu" and r["a"] in ("softmax", "sparsemax"):
            assert f"BLEU {r['bleu_b']:.2f} vs {r['bleu_a']:.2f}, p = {r['p_value']:.4f}" in claims, r["a"]


def test_claims_of_a_run_with_some_systems_and_several_seeds():
    from softargmax.experiments.nmt import verdicts
    from softargmax.experiments.nmt.report import render_report

    res = json.loads((REPORT / "results.json").read_text())
    S = {s: res["systems"][s] for s in ("softmax", "alpha_relu")}
    res["systems"], res["significance"] = S, [r for r in res["significance"] if {r["a"], r["b"]} == set(S)]
    report = render_report(res, [])
    assert "p < 0.0500 (one comparison)" in report and "1.5-entmax" not in report.split("## Claims")[1].split("## Discussion")[0]
    # several seeds: the sparsity verdict compares the mean zero shares with their standard error
    seeds = {"alpha_relu": [0.90, 0.91, 0.92], "entmax15": [0.95, 0.96, 0.97]}
    S = {s: {"seeds": {str(k): {"zero_fraction": z} for k, z in enumerate(v)}} for s, v in seeds.items()}
    assert verdicts.sparsity_verdict(S).startswith("holds (mean over 3 seeds: 0.910 vs 0.960")
    S["entmax15"]["seeds"]["0"]["zero_fraction"] = 0.85  # difference 0.017, below 2 standard errors (0.078)
    assert verdicts.sparsity_verdict(S).startswith("not shown")


# --- the gpu preset split over calls: run records ----------------------------------------------------------------

#: the gpu preset at toy size (short sentences, 12 steps, an evaluation every 3), planning 2 output layers × 2 seeds:
#: 4 runs of about a second each on one thread
SPLIT_TOY = dict(train=200, val=12, test=12, vocab=200, model=dict(d_model=16, heads=2, layers=1, ff=32, max_len=24),
                 train_cfg=dict(steps=12, batch_tokens=500, warmup=4, lr=0.3, eval_every=3, val_bleu_sentences=8,
                                patience=2, max_len=24),
                 beam=2, beams=(1,), timing_sentences=4, dev_sentences=8, bootstrap_samples=50,
                 systems=("softmax", "alpha_relu"), seeds=(1, 2))


def _toy_call(out, runs=None, overrides=SPLIT_TOY, **kwargs):
    from softargmax.experiments import translation

    threads = torch.get_num_threads()
    try:
        return translation.run(preset="gpu", data_dir=str(SHARED), out=str(out), threads=1, overrides=overrides,
                               runs=runs, log=lambda *a: None, **kwargs)
    finally:
        torch.set_num_threads(threads)


def test_one_call_preset_is_the_gpu_model_without_selection_and_plans_three_seeds():
    from softargmax.cli import build_parser
    from softargmax.experiments import translation

    one, gpu = translation.preset_settings("gpu-1call"), translation.preset_settings("gpu")
    assert one["model"] == gpu["model"] and one["vocab"] == gpu["vocab"] and one["beams"] == gpu["beams"]
    cfg, cfg_gpu = TrainConfig(**one["train_cfg"]), TrainConfig(**gpu["train_cfg"])
    assert cfg.select == "last" and cfg.patience is None  # no early stopping
    assert (cfg.batch_tokens, cfg.lr, cfg.warmup, cfg.bf16) == (cfg_gpu.batch_tokens, cfg_gpu.lr, cfg_gpu.warmup, True)
    assert cfg.steps < cfg_gpu.steps and cfg.val_bleu_sentences < cfg_gpu.val_bleu_sentences
    assert one["timing_sentences"] < gpu["timing_sentences"] and one["inference_repeats"] == 1
    assert tuple(one["systems"]) == translation.SYSTEMS and tuple(one["seeds"]) == (1, 2, 3)
    assert "gpu-1call" in translation.SPEED_ROUNDS  # the four systems of a call are timed interleaved
    args = build_parser().parse_args(["reproduce", "translation", "--preset", "gpu-1call", "--seeds", "1"])
    assert args.preset == "gpu-1call"


#: the one-call preset at toy size: SPLIT_TOY's sizes without early stopping
ONE_CALL_TOY = {**SPLIT_TOY, "train_cfg": {k: v for k, v in SPLIT_TOY["train_cfg"].items() if k != "patience"}}


@needs_data
def test_one_call_preset_at_toy_size_times_interleaved_and_reports_time_to_bleu(tmp_path, monkeypatch):
    """The runs of one seed in one call: records, the interleaved timing of their systems, the time to a validation
    BLEU and the inference time per sentence with their ratios and verdicts; the other seeds are owed."""
    from softargmax.experiments import translation

    monkeypatch.setitem(translation.SPEED_ROUNDS, "gpu-1call", translation.SPEED_ROUNDS["smoke"])  # fewer rounds
    threads = torch.get_num_threads()
    try:
        results = translation.run(preset="gpu-1call", data_dir=str(SHARED), out=str(tmp_path), threads=1,
                                  overrides=ONE_CALL_TOY, runs=["softmax:1", "alpha_relu:1"], log=lambda *a: None)
    finally:
        torch.set_num_threads(threads)
    assert sorted(p.name for p in (tmp_path / "records").glob("*.json")) == ["alpha_relu-seed1.json",
                                                                             "softmax-seed1.json"]
    assert (tmp_path / translation.SPEED_FILE).exists() and results["speed"]["seed"] == 1
    assert sorted(map(tuple, results["plan"]["owed"])) == [("alpha_relu", 2), ("softmax", 2)]
    reached = results["time_to_bleu"]
    assert reached["clock"] == "interleaved" and set(reached["systems"]) == {"softmax", "alpha_relu"}
    for s, e in reached["systems"].items():
        first = next(h for h in results["systems"][s]["seeds"]["1"]["history"] if h["val_bleu"] >= reached["target"])
        assert e["step"] == first["step"]
        assert e["seconds"] == pytest.approx(first["step"] * results["speed"]["seconds_per_step"][s])
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert f"Time to a validation BLEU of {reached['target']:.1f}" in report
    assert "Per sentence, timed interleaved" in report
    assert "1.5-ReLU decodes as fast as softmax at beam 1" in report
    assert "1.5-ReLU reaches the validation BLEU of" in report


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory):
    """``(folder, results of one/, results of two/)``: the toy plan's 4 runs trained by one call into ``one/``
    (``systems`` × ``seeds``), and by two calls into ``two/`` (``runs``: 3 in another order, then the 4th), with
    ``partial/`` a copy of ``two/`` between the calls."""
    import shutil

    base = tmp_path_factory.mktemp("split")
    one = _toy_call(base / "one", systems=("softmax", "alpha_relu"), seeds=[1, 2])
    _toy_call(base / "two", ["alpha_relu:2", "softmax:1", "alpha_relu:1"])
    shutil.copytree(base / "two", base / "partial")
    two = _toy_call(base / "two", ["softmax:2"])
    return base, one, two


@needs_data
def test_two_calls_with_disjoint_runs_merge_into_the_results_of_one_call(split_runs):
    from softargmax.experiments._common import measurements

    base, one, two = split_runs
    assert one["plan"]["complete"] and two["plan"]["complete"] and two["plan"]["owed"] == []
    assert json.loads((base / "two" / "results.json").read_text()) == json.loads(json.dumps(two))
    # every number but the timings: BLEU of every run, the means over seeds, the curves, the bootstrap
    assert measurements(two) == measurements(one)
    for system in ("softmax", "alpha_relu"):
        for seed in ("1", "2"):
            assert two["systems"][system]["seeds"][seed]["bleu"] == one["systems"][system]["seeds"][seed]["bleu"]
        assert "bleu_std" in two["systems"][system]
    assert two["significance"] == one["significance"] and [r["seed_list"] for r in two["significance"]] == [[1, 2]]
    assert [(r["system"], r["seed"]) for r in two["runs"]] == [("softmax", 1), ("softmax", 2), ("alpha_relu", 1),
                                                               ("alpha_relu", 2)]
    # one small, self-contained record per run, outside runs/ (which git ignores)
    records = sorted(p.name for p in (base / "two" / "records").glob("*.json"))
    assert records == ["alpha_relu-seed1.json", "alpha_relu-seed2.json", "softmax-seed1.json", "softmax-seed2.json"]
    # and the interleaved timing of the first seed's runs beside them (timed again by the call that completed them)
    assert (base / "two" / "records" / "speed" / "interleaved.json").is_file()
    assert two["speed"]["seed"] == 1 and sorted(two["speed"]["systems"]) == ["alpha_relu", "softmax"]
    rec = json.loads((base / "two" / "records" / "alpha_relu-seed2.json").read_text())
    assert rec["fingerprint"]["seed"] == 2 and rec["setup"]["preset"] == "gpu" and len(rec["test_hypotheses"]) == 12
    assert {"device", "torch", "triton", "softargmax"} <= set(rec["environment"])
    from softargmax.experiments._common import code_identity

    env = rec["environment"]
    assert env["code"] == code_identity() and env["device_type"] == "cpu" and env["autocast"] is None
    assert env["tf32_matmul"] is False and two["runs"][0]["precision"] == "float32"
    from softargmax.experiments._allocator import keep_freed_memory

    assert env["malloc_keeps_freed_memory"] is keep_freed_memory()  # set on the CPU (False without glibc)
    assert {"bleu", "history", "kept_step", "steps_done", "seconds_per_step", "tokens_per_second", "inference_seconds",
            "empty_string_rate", "zero_fraction", "sum_per_step"} <= set(rec["results"])
    report = (base / "two" / "report.md").read_text()
    assert "All of them are in." in report and "**owed**" not in report and "Provisional" not in report
    assert f"| softmax | in (D1, {rec['finished'][:10]}, code {env['code']['digest'][:8]}) | " in report
    assert "The runs in come from" not in report  # one code, one device type and precision: nothing to flag
    words = test_two_calls_with_disjoint_runs_merge_into_the_results_of_one_call.__name__[len("test_"):]
    assert f"“{words.replace('_', ' ')}”" in report  # the Reproducibility section names this test


@needs_data
def test_a_partial_folder_lists_the_owed_runs_and_marks_the_ordering_provisional(split_runs):
    base, one, _ = split_runs
    res = json.loads((base / "partial" / "results.json").read_text())
    assert res["plan"]["owed"] == [["softmax", 2]] and not res["plan"]["complete"]
    S = res["systems"]
    # a mean ± std only with two seeds in; the bootstrap over the seed both systems have
    assert "bleu_std" in S["alpha_relu"] and "bleu_std" not in S["softmax"]
    assert S["softmax"]["bleu"] == one["systems"]["softmax"]["seeds"]["1"]["bleu"]
    assert S["alpha_relu"]["bleu"] == pytest.approx(one["systems"]["alpha_relu"]["bleu"])
    (sig,) = res["significance"]
    assert sig["seed_list"] == [1] and sig["seeds"] == 1
    report = (base / "partial" / "report.md").read_text()
    runs = report.split("## Runs in and owed")[1].split("\n## ")[0]
    assert "3 of the 4 planned runs are in, 1 owed (softmax seed 2)" in runs
    assert "| softmax | in (D1, " in runs and " | **owed** |" in runs and "| 1.5-ReLU | in (D1, " in runs
    assert "- D1: cpu (" in runs
    (ordering,) = [line for line in report.splitlines() if line.startswith("Ordering by mean test BLEU")]
    assert "**Provisional:** 3 of the 4 planned runs are in" in ordering
    claims = report.split("## Claims checked")[1].split("## Discussion")[0]
    assert claims.lstrip().startswith("**Provisional:**")
    assert "| softmax | cross-entropy | " in report and " (1) |" in report  # the seeds in, where they differ
    assert "times are compared only between runs on the same device" in report


@needs_data
def test_render_only_rebuilds_the_report_from_the_records_alone(split_runs, tmp_path):
    import shutil

    from softargmax.cli import main

    base, _, two = split_runs
    copy = tmp_path / "copy"
    shutil.copytree(base / "two" / "records", copy / "records")  # no runs/, tokenizer, results or figures
    assert main(["reproduce", "translation", "--render-only", "--out", str(copy)]) == 0
    assert (copy / "report.md").read_text() == (base / "two" / "report.md").read_text()
    rebuilt = json.loads((copy / "results.json").read_text())
    rebuilt["settings"]["total_seconds"] = two["settings"]["total_seconds"]  # the rendering's own time
    assert rebuilt == json.loads(json.dumps(two))
    assert sorted(p.name for p in copy.glob("*.png")) == sorted(p.name for p in (base / "two").glob("*.png"))
    assert not (copy / "runs").exists()


@needs_data
def test_a_record_of_another_preset_or_overrides_is_refused_naming_it(split_runs, tmp_path, capsys):
    import shutil

    from softargmax.cli import main
    from softargmax.experiments._common import RecordError, RecordMismatchError

    base = split_runs[0]
    out = tmp_path / "mixed"
    shutil.copytree(base / "one" / "records", out / "records")
    rec = json.loads((out / "records" / "softmax-seed1.json").read_text())
    stranger = out / "records" / "softmax-seed3.json"
    rec["seed"] = 3
    rec["setup"]["overrides"]["train_cfg"]["steps"] = 9
    stranger.write_text(json.dumps(rec))
    assert main(["reproduce", "translation", "--render-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: run record {stranger} belongs to another experiment setup: ")
    assert "overrides.train_cfg.steps is 9 there and 12 in " in err and "Traceback" not in err
    # a call that would train refuses it before training anything
    rec["setup"]["overrides"]["train_cfg"]["steps"] = 12
    rec["setup"]["preset"] = "smoke"
    stranger.write_text(json.dumps(rec))
    with pytest.raises(RecordMismatchError, match=f"run record {stranger} .* preset is 'smoke' there and 'gpu' in "
                                                  "this run"):
        _toy_call(out, ["softmax:2"])
    assert not (out / "runs").exists()
    # two records of one run
    stranger.unlink()
    shutil.copy(out / "records" / "softmax-seed1.json", out / "records" / "softmax-seed1-again.json")
    with pytest.raises(RecordError, match="are both of softmax seed 1: keep one"):
        _toy_call(out, ["softmax:2"])


def test_runs_are_named_system_colon_seed_and_records_pack_their_numbers(capsys):
    from softargmax.cli import main
    from softargmax.experiments import translation
    from softargmax.experiments._records import pack, unpack
    from softargmax.experiments.nmt.plan import parse_runs, planned_runs, selected_runs

    assert parse_runs(["f:kl:2", "softmax:1"]) == [("f:kl", 2), ("softmax", 1)]
    for bad in (["softmax"], ["softmax:one"], [":1"]):
        with pytest.raises(ValueError, match="system:seed"):
            parse_runs(bad)
    with pytest.raises(TypeError, match="runs must be a list"):
        parse_runs("softmax:1")
    P = translation.preset_settings("gpu")
    with pytest.raises(ValueError, match="runs: give either runs or systems"):
        selected_runs(P, systems=["softmax"], runs=["softmax:1"])
    with pytest.raises(ValueError, match="each system:seed once"):
        selected_runs(P, runs=["softmax:1", "softmax:1"])
    assert selected_runs(P) == [(s, sd) for s in translation.SYSTEMS for sd in (1, 2, 3)]
    plan = planned_runs(P, [("softmax", 1), ("entmax15", 5)])
    assert len(plan["owed"]) == 11 and plan["extra"] == [["entmax15", 5]] and plan["seeds"] == [1, 2, 3, 5]
    assert planned_runs(translation.preset_settings("smoke"), [("softmax", 0)])["complete"]
    with pytest.raises(SystemExit):
        main(["reproduce", "translation", "--runs", "softmax"])
    assert "SYSTEM:SEED" in capsys.readouterr().err
    assert main(["reproduce", "translation", "--runs", "softmax:1", "--seeds", "2", "--out", "/nonexistent/x"]) == 2
    assert capsys.readouterr().err.startswith("error: --runs: it names the runs itself")
    assert main(["reproduce", "adaptive-attention", "--preset", "smoke", "--runs", "softmax:1", "--out",
                 "/nonexistent/x"]) == 2
    assert capsys.readouterr().err.startswith("error: --runs: adaptive-attention does not take it (use --systems)")
    sums = [float(torch.tensor(v, dtype=torch.float32)) for v in (1.0, 0.999999, 1.2345678, 0.0)]
    assert unpack(pack(sums, "float32")) == sums and unpack(pack([0, 9999, 3], "int32")) == [0, 9999, 3]


@needs_data
def test_times_are_compared_only_between_runs_on_one_device(split_runs, tmp_path):
    import shutil

    from softargmax.experiments import translation

    base, one, _ = split_runs
    out = tmp_path / "devices"
    # the records alone: the interleaved timing (records/speed) times every system on one device by construction;
    # without it, the times of the runs themselves are compared, and only those on one device
    shutil.copytree(base / "one" / "records", out / "records", ignore=shutil.ignore_patterns("speed"))
    for seed in (1, 2):  # softmax's runs on another GPU: 2 runs on each device, softmax's (the first run's) chosen
        path = out / "records" / f"alpha_relu-seed{seed}.json"
        rec = json.loads(path.read_text())
        rec["environment"].update(device="cuda (NVIDIA H200)", device_type="cuda", autocast="bfloat16", tf32_matmul=True)
        path.write_text(json.dumps(rec))
    path = out / "records" / "softmax-seed2.json"  # and one run of other code
    rec = json.loads(path.read_text())
    rec["environment"]["code"] = {"digest": "0123456789abcdef", "files": 1}
    path.write_text(json.dumps(rec))
    res = translation.rebuild(out, log=lambda *a: None)
    S, st = res["systems"], res["settings"]
    assert st["device"] == one["settings"]["device"] and st["devices"] == {st["device"]: 2, "cuda (NVIDIA H200)": 2}
    assert S["softmax"]["seconds_per_step"] == one["systems"]["softmax"]["seconds_per_step"]
    assert S["alpha_relu"]["timed_seeds"] == [] and "seconds_per_step" not in S["alpha_relu"]
    assert "seconds_per_step_vs_softmax" not in S["alpha_relu"] and "inference_normalized" not in S["alpha_relu"]
    assert S["alpha_relu"]["bleu"] == one["systems"]["alpha_relu"]["bleu"]  # the other numbers are all there
    report = (out / "report.md").read_text()
    assert "| 1.5-ReLU | — | — | — | " in report
    assert "Times are compared only between runs on the same device: these are from the 2 runs on " in report
    assert "trains as fast as softmax (at most 1.1× its time per step): not tested (no runs of both" in report
    # a flag above the results, not a refusal
    code = json.loads((out / "records" / "softmax-seed1.json").read_text())["environment"]["code"]["digest"][:8]
    assert (f"\n\nThe runs in come from 2 versions of the library's code ({code}, 01234567) and 2 device types or "
            "precisions (cpu in float32; cuda in bfloat16 autocast, TF32): their results compare across these only if "
            "the differences did not touch what they measure.\n\n## Test BLEU") in report
    assert "- D2: cuda (NVIDIA H200), bfloat16 autocast, TF32 (2 runs; " in report
    assert "- code 01234567 (1 run)" in report and "in (D1, " in report and ", code 01234567) |" in report


def test_the_runs_section_flags_runs_of_other_code_or_precision_within_a_system():
    from softargmax.experiments.nmt.plan import planned_runs
    from softargmax.experiments.nmt.report import _runs_section

    def entry(system, seed, code="aaaaaaaa11111111", device_type="cuda", precision="bfloat16 autocast, TF32"):
        return {"system": system, "seed": seed, "device": f"{device_type} (some device)", "device_type": device_type,
                "precision": precision, "finished": "2025-01-02T03:04:05Z",
                "code": code and {"digest": code, "files": 3, "git_revision": "f" * 40, "git_dirty": False}}

    def section(runs):
        P = {"systems": ("softmax", "alpha_relu"), "seeds": (1, 2)}
        results = {"plan": planned_runs(P, [(r["system"], r["seed"]) for r in runs]), "settings": {"preset": "gpu"},
                   "runs": runs}
        return "\n".join(_runs_section(results))

    same = [entry("softmax", 1), entry("softmax", 2), entry("alpha_relu", 1)]
    text = section(same)
    assert "The runs in come from" not in text and "| softmax | in (D1, 2025-01-02, code aaaaaaaa) | in (D1, " in text
    assert "- code aaaaaaaa: git ffffffffffff (3 runs)" in text
    # softmax's seeds on a CPU and on a GPU: the same sentence, naming the system
    mixed = same + [entry("alpha_relu", 2, device_type="cpu", precision="float32")]
    mixed[1] = entry("softmax", 2, device_type="cpu", precision="float32")
    assert text != section(mixed)
    assert section(mixed).endswith(
        "\n\nThe runs in come from 2 device types or precisions (cuda in bfloat16 autocast, TF32; cpu in float32), "
        "mixed within the seeds of softmax, 1.5-ReLU: their results compare across these only if the differences did "
        "not touch what they measure.")
    # a record written before the code was recorded: no digest in its cell, and counted as other code
    old = same[:2] + [entry("alpha_relu", 1, code=None)]
    assert "| 1.5-ReLU | in (D1, 2025-01-02) | " in section(old)
    assert "2 versions of the library's code (aaaaaaaa, not recorded)" in section(old)


def test_code_identity_digests_the_sources_and_names_the_git_revision_without_needing_git(tmp_path, monkeypatch):
    import shutil
    import subprocess

    from softargmax.experiments import _common
    from softargmax.experiments._common import code_identity
    from softargmax.experiments.nmt.training import TrainConfig

    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "a.py").write_text("x = 1\n")
    (root / "sub" / "b.c").write_text("int b;\n")
    (root / "notes.txt").write_text("not code")
    (root / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    first = code_identity(root)
    assert first == {"digest": first["digest"], "files": 2} and len(first["digest"]) == 16  # not in a git checkout
    (root / "notes.txt").write_text("other text")
    assert code_identity(root) == first
    (root / "a.py").write_text("x = 2\n")
    changed = code_identity(root)["digest"]
    (root / "sub" / "b.c").rename(root / "sub" / "c.c")  # the same bytes under another name
    renamed = code_identity(root)["digest"]
    assert len({first["digest"], changed, renamed}) == 3
    # the installed package: once per process, a copy each time
    package = code_identity()
    package["digest"] = "changed by a caller"
    assert code_identity()["digest"] != "changed by a caller" and code_identity()["files"] > 50
    # in a git checkout: the commit, and whether the sources differ from it
    git = shutil.which("git")
    if git is not None:
        run = lambda *a: subprocess.run([git, "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=root,  # noqa: E731
                                        check=True, capture_output=True, text=True).stdout.strip()
        run("init", "-q")
        run("add", "-A")
        run("commit", "-q", "-m", "sources")
        clean = code_identity(root)
        assert clean["git_revision"] == run("rev-parse", "HEAD") and clean["git_dirty"] is False
        (root / "a.py").write_text("x = 3\n")
        assert code_identity(root)["git_dirty"] is True
    # without git: the digest alone, never an error
    monkeypatch.setattr(_common.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("git")))
    assert code_identity(root) == {"digest": code_identity(root)["digest"], "files": 2}
    # bfloat16 autocast applies on CUDA only, so a record of a CPU run says float32
    assert TrainConfig(bf16=True).autocast("cuda:0") == "bfloat16" and TrainConfig(bf16=True).autocast("cpu") is None
    assert TrainConfig().autocast("cuda") is None


def test_a_run_finds_its_checkpoints_in_one_folder_however_many_runs_a_call_trains(tmp_path):
    """``runs/<system>/seed<n>`` whether a call trains that run alone or beside others, so a later ``--resume``
    of some runs finds them: checked through the fingerprint check that every call makes before any work."""
    from softargmax.experiments import translation
    from softargmax.experiments._common import CheckpointMismatchError, fingerprint, save_checkpoint
    from softargmax.experiments.datasets import DataError

    out = tmp_path / "run"
    foreign = out / "runs" / "softmax" / "seed1" / "checkpoint.pt"
    save_checkpoint(foreign, {}, fingerprint("translation", "default", "softmax", 1, data=["multi30k"], overrides={}))
    for runs in (["softmax:0", "softmax:1"], ["softmax:1"]):
        with pytest.raises(CheckpointMismatchError, match=f"checkpoint {foreign} belongs to another run: preset is "):
            translation.run(preset="smoke", out=str(out), runs=runs, data_dir=str(tmp_path / "no-data"))
    # a checkpoint in the layout of earlier versions (one folder per system) is named, not silently ignored
    foreign.rename(out / "runs" / "softmax" / "checkpoint.pt")
    lines: list = []
    with pytest.raises(DataError, match="multi30k"):  # the message comes before the data are read
        translation.run(preset="smoke", out=str(out), runs=["softmax:1"], data_dir=str(tmp_path / "no-data"),
                        log=lines.append)
    assert any(f"{out / 'runs' / 'softmax' / 'checkpoint.pt'} is a checkpoint in the layout of an earlier" in line
               for line in lines), lines


def test_the_whole_job_estimate_adds_the_runs_left_their_evaluation_and_the_interleaved_timing():
    from softargmax.experiments.translation import OVERHEAD_RATIO, JobEstimate

    rounds = dict(rounds=10, steps=3, inference_rounds=3)
    est = JobEstimate(runs=4, steps=500, systems=4, rounds=rounds, fixed=0)
    assert est.left(0) is None  # no step timed yet
    # run 1 of 4 at 0.3 s per step, 60 s of its training left: before any run finished, the rest of a run
    # (evaluation, inference timing) is OVERHEAD_RATIO of its training; then 3 runs; then 4 systems x 30 steps
    per_run = 500 * 0.3 * (1 + OVERHEAD_RATIO)
    assert est.left(0, 60.0, 0.3) == pytest.approx(60 + OVERHEAD_RATIO * 150 + 3 * per_run + 4 * 30 * 0.3)
    # run 1 took 200 s, 150 of them training steps, 4 s of inference timing at every beam: measured from now on
    est.finished(train=150.0, steps=500, run=200.0, inference=4.0)
    timing = 4 * (30 * 0.3 + 3 * 4.0)
    assert est.left(1) == pytest.approx(3 * (150 + 50) + timing)
    # the current run's pace counts for the runs after it (a slower system: 2.7 s per step)
    assert est.left(3, 27.0, 2.7) == pytest.approx(27 + 50 + 4 * (30 * 2.7 + 3 * 4.0))
    # one system: no interleaved timing
    assert JobEstimate(1, 10, 1, rounds, fixed=0).left(0, 5.0, 1.0) == pytest.approx(5 + OVERHEAD_RATIO * 10)
