"""Language-model pretraining with f-divergence losses (Roulet et al., 2025, Table 3): the decoder's pieces, the
metrics, the gradient with respect to a learned reference measure, and the experiment's smoke run, rerun and resume."""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA, check_progress_log  # noqa: E402

import softargmax as sa
from softargmax.experiments.pretraining import metrics
from softargmax.experiments.pretraining.model import Decoder, DecoderConfig, apply_rotary, rotary_tables
from softargmax.experiments.pretraining.reference_measure import linear_loss_with_learned_q, reference_measure_gradient

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)
needs_ptb = pytest.mark.skipif(not (SHARED / "ptb").exists(), reason="data not present: ptb")
SMOKE = ("--data-dir", str(SHARED), "--threads", "1")


@pytest.fixture(autouse=True)
def _keep_thread_count():
    """The smoke runs set one CPU thread (``--threads 1``); the tests after them get the count they had."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------------------------------- the decoder


def test_rotary_embedding_is_a_complex_rotation_of_feature_pairs():
    """Each pair (x_2i, x_2i+1) read as x_2i + i·x_2i+1 is multiplied by exp(i·m·10000^(-2i/D)) (float64 reference)."""
    T, D = 11, 8
    x = torch.randn(2, 3, T, D)
    cos, sin = rotary_tables(T, D)
    got = apply_rotary(x, cos, sin)
    z = torch.view_as_complex(x.double().reshape(2, 3, T, D // 2, 2).contiguous())
    m = torch.arange(T, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ref = torch.view_as_real(z * torch.polar(torch.ones(T, D // 2, dtype=torch.float64), m * omega)).reshape(2, 3, T, D)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    # the point of the rotation: <R_m q, R_n k> depends on m - n only
    q, k = torch.randn(D).double(), torch.randn(D).double()
    c64, s64 = (t.double() for t in rotary_tables(T, D))
    rot = lambda v, pos: apply_rotary(v.expand(T, D), c64, s64)[pos]
    assert float(rot(q, 5) @ rot(k, 2)) == pytest.approx(float(rot(q, 9) @ rot(k, 6)), rel=1e-6)


def test_decoder_is_causal():
    """Changing the tokens from position t on leaves the outputs before t unchanged, and changes those from t on."""
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab=50, d=16, heads=2, layers=2, ff=32, context=12)).eval()
    ids = torch.randint(0, 50, (3, 12))
    other = ids.clone()
    other[:, 7:] = torch.randint(0, 50, (3, 5))
    with torch.no_grad():
        a, b = model(ids), model(other)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert (a[:, 7:] - b[:, 7:]).abs().amax() > 1e-3
    assert model.logits(a).shape == (3, 12, 50)
    assert model.output_weight is model.embed.weight  # tied


# ---------------------------------------------------------------------------------------------- the metrics


def test_epsilon_perplexity_by_hand():
    p, V, eps = [0.5, 0.0, 0.25], 4, 0.1
    by_hand = math.exp(-(math.log(0.6 / 1.4) + math.log(0.1 / 1.4) + math.log(0.35 / 1.4)) / 3)
    assert metrics.epsilon_perplexity(p, V, eps) == pytest.approx(by_hand, rel=1e-12)
    assert metrics.epsilon_perplexity([0.5, 0.25], V, 0.0) == pytest.approx(math.sqrt(8))  # ε = 0: the perplexity
    assert metrics.epsilon_perplexity(p, V, 0.0) == math.inf
    # the ε that minimizes it: against a fine grid of the mixture weight λ, ε = λ / ((1 - λ) V)
    p = [0.9, 0.0, 0.8, 0.7, 0.6]
    grid = np.linspace(1e-4, 0.9999, 20001)
    best = min(grid, key=lambda lam: metrics.epsilon_perplexity(p, V, lam / ((1 - lam) * V)))
    assert 0.01 < best < 0.5  # an interior optimum
    eps_star = metrics.best_epsilon(p, V)
    assert eps_star == pytest.approx(best / ((1 - best) * V), rel=1e-3)
    assert metrics.best_epsilon([0.9, 0.8], 4) == 0.0  # a model that is never wrong needs no smoothing


def test_distinct_n_and_repetition_by_hand():
    samples = [[1, 2, 1, 2], [3, 3]]
    assert metrics.distinct_n(samples, 1) == 3 / 6
    assert metrics.distinct_n(samples, 2) == 3 / 4  # (1,2) (2,1) (1,2) (3,3)
    assert metrics.distinct_n(samples, 3) == 2 / 2  # (1,2,1) (2,1,2)
    assert math.isnan(metrics.distinct_n([[1]], 2))
    # tokens 2..: 2 (new), 1 (seen), 2 (seen); 3 (seen): 3 of 4
    assert metrics.repetition(samples, window=16) == 3 / 4
    assert metrics.repetition([[1, 2, 3, 1]], window=2) == 0.0  # the repeated 1 lies 3 tokens back


def test_paired_bootstrap_of_accuracy():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 30, 300).astype(float)
    a = np.stack([rng.binomial(tokens.astype(int), 0.4) for _ in range(3)]).astype(float)
    same = metrics.paired_bootstrap_accuracy(a, a, tokens, n_samples=300)
    assert same["delta"] == 0 and same["p_value"] == 1.0
    better = np.minimum(a + rng.binomial(tokens.astype(int), 0.1), tokens)
    r = metrics.paired_bootstrap_accuracy(better, a, tokens, n_samples=300)
    assert r["delta"] == pytest.approx(100 * (better.sum() - a.sum()) / (3 * tokens.sum()))
    assert r["delta"] > 0 and r["p_value"] < 0.01 and r["ci"][0] > 0
    assert metrics.bonferroni_threshold(7) == pytest.approx(0.05 / 7)
    with pytest.raises(ValueError, match="tokens"):
        metrics.paired_bootstrap_accuracy(a, a, tokens[:10])


# ---------------------------------------------------------------------------------------------- learned q


@pytest.mark.parametrize("mapping", ["softmax", "entmax15", "chi_square"])
def test_learned_q_gradient_matches_finite_differences(mapping):
    """d/dq of the mean loss (float64, central differences of the unfused loss's value), through q = exp(s)."""
    torch.manual_seed(0)
    N, d, V = 9, 4, 7
    h = torch.randn(N, d, dtype=torch.float64, requires_grad=True)
    W = (2 * torch.randn(V, d, dtype=torch.float64)).requires_grad_()
    y = torch.randint(0, V, (N,))
    s = (0.5 * torch.randn(V, dtype=torch.float64)).requires_grad_()
    loss = linear_loss_with_learned_q(h, W, y, torch.exp(s), mapping, chunk_size=4)
    value = lambda logq, hh=h.detach(), WW=W.detach(): sa.fenchel_young_loss(hh @ WW.T, y, mapping, q=torch.exp(logq))
    assert float(loss.detach()) == pytest.approx(float(value(s.detach())), rel=1e-12)  # the value is the fused loss's
    loss.backward()
    fd = torch.zeros(V, dtype=torch.float64)
    for j in range(V):
        e = torch.zeros(V, dtype=torch.float64)
        e[j] = 1e-6
        fd[j] = (value(s.detach() + e) - value(s.detach() - e)) / 2e-6
    torch.testing.assert_close(s.grad, fd, rtol=1e-6, atol=1e-8)
    # h and W get the gradients of the loss at fixed q
    hh, WW = h.detach().clone().requires_grad_(), W.detach().clone().requires_grad_()
    value(s.detach(), hh, WW).backward()
    torch.testing.assert_close(h.grad, hh.grad)
    torch.testing.assert_close(W.grad, WW.grad)


def test_learned_q_for_kl_is_an_output_bias():
    """KL with reference measure q is cross-entropy of logits + log q: the gradients with respect to log q agree."""
    torch.manual_seed(1)
    h, W, y = torch.randn(12, 5), torch.randn(6, 5), torch.randint(0, 6, (12,))
    s = torch.randn(6, requires_grad=True)
    g = reference_measure_gradient(h, W, y, torch.exp(s.detach()), "softmax", chunk_size=5) * torch.exp(s.detach())
    torch.nn.functional.cross_entropy(h @ W.T + s, y).backward()
    torch.testing.assert_close(g, s.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="f\\(0\\)"):
        reference_measure_gradient(h, W, y, torch.ones(6), "reverse_chi_square")


def test_sparsemax_loss_is_the_chi_square_loss():
    """Why the experiment trains χ² once: with q = 1 the chi-square f-softargmax is sparsemax, so the losses agree."""
    torch.manual_seed(2)
    h, W, y = torch.randn(40, 8, requires_grad=True), torch.randn(30, 8, requires_grad=True), torch.randint(0, 30, (40,))
    a = sa.linear_fenchel_young_loss(h, W, y, mapping="sparsemax", chunk_size=16)
    ga = torch.autograd.grad(a, (h, W))
    b = sa.linear_fenchel_young_loss(h, W, y, mapping="chi_square", chunk_size=16)
    gb = torch.autograd.grad(b, (h, W))
    torch.testing.assert_close(a, b)
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v)


# ---------------------------------------------------------------------------------------------- the experiment


@needs_ptb
def test_lm_smoke(smoke_run, tmp_path):
    from softargmax.cli import main
    from softargmax.experiments import lm

    out, res = smoke_run("lm", *SMOKE)
    assert set(res["losses"]) == set(lm.LOSSES) | {f"{n}+q" for n in lm.LEARNED_Q}
    V = res["settings"]["vocab"]
    assert V == lm.PRESETS["smoke"]["vocab"] and res["settings"]["tokenizer"]["digest"]  # BPE pieces of the training split
    assert set(res["plateau"]) == set(res["losses"])
    for name, r in res["runs"].items():
        for split in ("valid", "test"):
            assert 0 <= r[split]["accuracy"] <= 100, name
            assert 1 <= r[split]["support_mean"] <= V, name
    kl = res["runs"]["kl-seed0"]
    assert kl["valid"]["support_mean"] == V and kl["valid"]["perplexity"] is not None
    assert kl["valid"]["mean_p_true"] == kl["valid"]["mean_p_true_softmax"]
    assert res["runs"]["chi_square-seed0"]["valid"]["perplexity"] is None  # sparse: some observed tokens get p = 0
    assert res["runs"]["chi_square-seed0"]["valid"]["support_mean"] < V
    # with q = 1 the arg-max of every f-softargmax is that of the logits
    assert all(r["valid"]["same_argmax_share"] == 1.0 for r in res["runs"].values() if not r["learned_q"])
    dec = res["decoding"]["models"]["kl"]  # KL's own f-softargmax is softmax: the same samples
    assert dec["own"] == dec["softmax"]
    assert res["significance"]["threshold"] == pytest.approx(0.05 / len(res["significance"]["tests"]))
    assert set(res["memory"]["peak_mb"]) == {"softmax"}
    report = (out / "report.md").read_text()
    for f in ("accuracy.png", "curves.png", "decoding.png", "cost.png"):
        assert (out / f).is_file() and f"]({f})" in report
    assert "## Reproducibility" in report and "Table 3" in report
    # "== run i of 10" before each run, the whole job's ETA from the second on; the summary table closes the log
    summary = check_progress_log(out, 10, ["KL", f"{res['losses']['kl']['test']['accuracy']['mean']:.2f}"])
    assert summary[-3].startswith("  order of Table 3's losses: ") and summary[-1].endswith("still rising)")
    # --render-only writes the same report from results.json alone
    copy = tmp_path / "again"
    copy.mkdir()
    (copy / "results.json").write_text((out / "results.json").read_text())
    assert main(["reproduce", "lm", "--render-only", "--out", str(copy)]) == 0
    assert (copy / "report.md").read_text() == report


def _repeatable(results: dict) -> str:
    """What a rerun with the same seed must repeat: every number but the timings and the memory peaks."""
    from softargmax.experiments._common import measurements

    results = json.loads(json.dumps(results, default=float))
    results["memory"].pop("peak_mb")
    return json.dumps(measurements(results), sort_keys=True)


#: the run killed by the resume test, and the line after which it is killed: printed once its step-4 checkpoint is
#: written (the runs before it have finished)
KILLED_RUN = "alpha1.5-seed1"


@needs_ptb
def test_a_smoke_lm_run_killed_after_a_checkpoint_and_resumed_equals_an_uninterrupted_run(smoke_run, tmp_path):
    """SIGKILL in the middle of a run's training (after its step-4 checkpoint, with a checkpoint every 2 steps), then
    ``--resume``: the run continues from its checkpoint and every number equals an uninterrupted run's."""
    from softargmax.experiments import lm
    from softargmax.experiments._common import CheckpointMismatchError, fingerprint, load_checkpoint

    _, first = smoke_run("lm", *SMOKE)
    out = tmp_path / "killed"
    src = str(Path(sa.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "softargmax", "reproduce", "lm", "--preset", "smoke", *SMOKE, "--checkpoint-every", "2",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f"[{KILLED_RUN}] step 4/"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-20:])
    ckpt = out / "runs" / KILLED_RUN / "checkpoint.pt"
    tok = first["settings"]["tokenizer"]["digest"]
    fp = fingerprint(lm.EXPERIMENT, "smoke", "alpha1.5", 1, data=["ptb"], tokenizer=tok)
    state = load_checkpoint(ckpt, fp)
    assert 4 <= state["record"]["steps_done"] < 8  # killed in the middle of the run's 8 steps
    assert state["rng"]["torch"].dtype == torch.uint8  # every random-number state is kept
    with pytest.raises(CheckpointMismatchError, match="seed is 1 there and 2"):
        load_checkpoint(ckpt, fingerprint(lm.EXPERIMENT, "smoke", "alpha1.5", 2, data=["ptb"], tokenizer=tok))
    resumed = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    again = json.loads((out / "results.json").read_text())
    assert again["settings"]["resumed_from_checkpoint"] == [KILLED_RUN]
    assert _repeatable(again) == _repeatable(first)
    log = (out / "log.txt").read_text()
    assert f"[{KILLED_RUN}] resumed at step {state['record']['steps_done']}\n" in log
    assert "which is no longer running, was taken over" in log  # the killed run's lock
    assert f"this run resumed the training of {KILLED_RUN}" in (out / "report.md").read_text()
    assert not list(out.rglob(".*.tmp*")) and not (out / ".softargmax.lock").exists()
    # the same command again, without --resume: every run has its record, with samples and step times; one
    # message says so, nothing is trained, sampled or timed, the report is rebuilt with the same numbers, and the
    # summary closes the log
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert _repeatable(json.loads((out / "results.json").read_text())) == _repeatable(first)
    said = rerun.stdout.splitlines()
    assert said[0].startswith("the results are complete: all 10 runs asked for have their run record in ")
    assert said[1].startswith(f"rebuilt {out / 'report.md'} (with ") and said[2].startswith("summary (10 runs; ")
    assert not any(line.startswith(("== run", "[", "sampling", "timing", "peak memory")) for line in said)


def test_the_lm_report_names_the_test_of_resumed_runs():
    from softargmax.experiments import lm

    words = test_a_smoke_lm_run_killed_after_a_checkpoint_and_resumed_equals_an_uninterrupted_run.__name__
    assert f"“{words[len('test_'):].replace('_', ' ')}”" in lm.RESUME_TEST


def test_large_numbers_in_the_lm_report_are_readable():
    """A perplexity of 2.5e43 (reverse χ²'s softmax perplexity in the default run) is not printed with 45 digits."""
    from softargmax.experiments.pretraining.report import _num, _pm

    assert _pm({"mean": 25128929782637899165727628544955163204386816.0, "std": 0.0}, 1) == "2.5e+43"
    assert _pm({"mean": 6743.52, "std": 114.84}, 1) == "6,743.5 ± 114.8"
    assert _pm({"mean": 0.494, "std": 0.005}, 1, 100) == "49.4 ± 0.5"
    assert _num(float("inf")) == "inf" and _num(999_999.0, 1) == "999,999.0" and _num(1e6, 1) == "1.0e+06"
    assert _pm({"mean": None, "std": None}) == "—"


def _curves_results(curves: dict, steps: int = 100) -> dict:
    runs = {f"{k}-seed{i}": {"loss": k, "learned_q": False, "accuracy_curve": c}
            for k, cs in curves.items() for i, c in enumerate(cs)}
    return {"runs": runs, "settings": {"train": {"steps": steps}}}


def test_the_plateau_verdict_is_the_rise_over_the_last_fifth_of_the_steps():
    """Rise of the mean curve between the last point at or before 80% of the steps and the last point, against 0.3."""
    from softargmax.experiments.lm import PLATEAU_POINTS, plateau

    flat = [[1, 5.0], [40, 30.0], [80, 31.0], [90, 31.1], [100, 31.2]]  # +0.2 over the last 20%
    rising = [[1, 5.0], [40, 30.0], [80, 31.0], [100, 31.5]]  # +0.5
    v = plateau(_curves_results({"kl": [flat, rising], "chi_square": [flat, flat]}))
    assert v["chi_square"]["converged"] and v["chi_square"]["rise"] == pytest.approx(0.2)
    assert v["chi_square"]["from_step"] == 80 and v["chi_square"]["to_step"] == 100
    assert v["kl"]["rise"] == pytest.approx(0.35) and v["kl"]["runs"] == pytest.approx([0.2, 0.5])
    assert not v["kl"]["converged"]  # the mean over seeds rises by 0.35 >= 0.3
    # a curve with no point between 80% and the end is measured from its last point before 80%
    sparse = plateau(_curves_results({"kl": [[[1, 5.0], [60, 30.0], [100, 30.0 + PLATEAU_POINTS]]]}))
    assert sparse["kl"]["from_step"] == 60 and not sparse["kl"]["converged"]
    # a curve that stops before the last step has not shown a plateau
    assert not plateau(_curves_results({"kl": [[[1, 5.0], [80, 30.0], [90, 30.0]]]}))["kl"]["converged"]


def test_claims_with_a_loss_that_did_not_converge_are_excluded():
    from softargmax.experiments.pretraining.report import _claim

    res = _curves_results({"kl": [[[80, 30.0], [100, 31.0]]], "alpha1.5": [[[80, 30.0], [100, 30.1]]]})
    line = _claim(res, "α = 1.5 as good as KL", ("alpha1.5", "kl"), "holds (numbers)")
    assert "*excluded: KL still rose +1.00 points" in line and "the run says holds" in line
    res["runs"]["kl-seed0"]["accuracy_curve"][-1][1] = 30.2
    assert _claim(res, "α = 1.5 as good as KL", ("alpha1.5", "kl"), "holds (numbers)") == \
        "- α = 1.5 as good as KL: **holds (numbers)**."


@needs_ptb
def test_lm_runs_from_two_calls_merge_into_the_report_of_one(smoke_run, tmp_path, capsys):
    """``--runs`` trains part of the preset; every call writes run records and rebuilds the report from all of them,
    listing the runs still owed; two calls that train the plan between them give the numbers of one call."""
    from softargmax.cli import main
    _, whole = smoke_run("lm", *SMOKE)
    out = tmp_path / "merged"
    first = ["kl:0", "chi_square:0", "alpha1.5:0"]
    assert main(["reproduce", "lm", "--preset", "smoke", *SMOKE, "--runs", *first, "--out", str(out)]) == 0
    part = json.loads((out / "results.json").read_text())
    assert part["settings"]["runs_in"] == first and "kl:1" in part["settings"]["owed"]
    assert "**Runs owed.**" in (out / "report.md").read_text()
    capsys.readouterr()
    # another setup's records are refused before any training
    assert main(["reproduce", "lm", "--preset", "smoke", *SMOKE, "--seed", "5", "--runs", "kl:5", "--out", str(out),
                 "--resume"]) != 0
    assert "seed is 0 there and 5 in this run" in capsys.readouterr().err
    assert not (out / "runs" / "kl-seed5").exists()
    rest = [f"{k}:{sd}" for k, sd in (r.rsplit(":", 1) for r in part["settings"]["owed"])]
    # the rest trained two at a time, each in its own process with one thread: the same numbers
    assert main(["reproduce", "lm", "--preset", "smoke", *SMOKE, "--runs", *rest, "--out", str(out), "--resume",
                 "--jobs", "2"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert merged["settings"]["owed"] == [] and merged["settings"]["this_call"] == [
        f"{k}-seed{sd}" for k, sd in (r.rsplit(":", 1) for r in rest)]
    assert merged["settings"]["training_processes"] == 2 and whole["settings"]["training_processes"] == 1
    log = (out / "log.txt").read_text()
    assert "each in its own process with one torch thread" in log and f"[{rest[0].replace(':', '-seed')}] step" in log
    # as each run ends, a line with the whole job's ETA: the runs left in two lanes, then samples, timing, memory
    ends = [line for line in log.splitlines() if line.startswith("== run ") and " done: " in line]
    assert [e.split(" done:")[0] for e in ends] == [f"== run {i} of {len(rest)}" for i in range(1, len(rest) + 1)]
    assert all(", ETA " in e and "for the whole job" in e for e in ends)
    for r in (merged, whole):
        r["settings"].pop("this_call")
        r["settings"].pop("training_processes")
    # every number but the timings, as a rerun with the same seed must give them: the first three runs retrained in
    # this process after the session's smoke run, the other seven in fresh processes
    assert _repeatable(merged) == _repeatable(whole)
    assert '"seed' in _repeatable(whole)  # the comparison covers the settings, seeds included
    assert "**Runs owed.**" not in (out / "report.md").read_text()


@needs_ptb
def test_a_call_stopped_after_its_runs_trained_keeps_their_records(smoke_run, tmp_path, monkeypatch):
    """Each run's record is written when the run is evaluated: a call stopped later (here while sampling) keeps its
    finished runs, and a later call's report counts them with the numbers of an uninterrupted call."""
    from softargmax.experiments import lm
    from softargmax.experiments._records import check_records

    _, whole = smoke_run("lm", *SMOKE)
    out = tmp_path / "stopped"

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lm, "draw_samples", stop)  # where lm.run looks it up
    with pytest.raises(KeyboardInterrupt):
        lm.run(preset="smoke", data_dir=str(SHARED), out=str(out), runs=["kl:0", "chi_square:0"], threads=1,
               log=lambda m: None)
    found = check_records(out)
    assert sorted(found) == [("chi_square", 0), ("kl", 0)]
    # the results built from them say what the stopped call still owes
    P = lm.PRESETS["smoke"]
    partial = lm.results_from_records(found, lm.run_specs(P, P["systems"], 0), dict(whole["settings"]),
                                      whole["memory"], 50)
    assert "**Samples and step times owed.**" in lm.render_report(partial, [])
    assert partial["settings"]["samples_owed"] == ["kl", "chi_square"]
    assert partial["settings"]["step_times_owed"] == ["kl", "chi_square"]
    assert "step_times_owed" not in whole["settings"]
    for _, rec in found.values():
        assert rec["decoding"] is None and rec["step_time"] is None  # the call stopped before it sampled and timed
        run = {"runs": {"r": rec["run"]}, "memory": {"peak_mb": None}}
        assert _repeatable(run) == _repeatable({"runs": {"r": whole["runs"][f"{rec['system']}-seed0"]},
                                                "memory": {"peak_mb": None}})  # timings aside


def test_runs_with_a_learned_q_go_to_the_lanes_first():
    """The runs trained in processes start with the learned-q runs (the longest), each group in the plan's order: every
    run once, and the lanes end on the shorter runs."""
    from softargmax.experiments.pretraining.jobs import dispatch_order
    from softargmax.experiments.pretraining.plan import PRESETS, run_specs

    for preset in ("full", "default", "smoke"):
        P = PRESETS[preset]
        specs = run_specs(P, P["systems"], 0)
        order = dispatch_order(specs)
        assert sorted(s.name for s in order) == sorted(s.name for s in specs)
        flags = [s.learned_q for s in order]
        assert flags == sorted(flags, reverse=True)  # every learned-q run before every other
        for group in (True, False):
            assert [s.name for s in order if s.learned_q == group] == [s.name for s in specs if s.learned_q == group]
    full = run_specs(PRESETS["full"], PRESETS["full"]["systems"], 0)
    assert sum(s.learned_q for s in full) == 6 and dispatch_order(full)[0].name == "kl+q-seed0"


def test_default_preset_holds_its_learning_rate_over_the_plateau_window():
    """The default preset: Table 3's losses at 3 seeds, and a learning rate that is constant (2% of the peak)
    over the whole last share of the steps on which the plateau is measured, so that the rise is not the decay's."""
    from softargmax.experiments import lm
    from softargmax.experiments.pretraining.training import lr_factor

    P = lm.PRESETS["default"]
    assert tuple(P["systems"]) == lm.TABLE3 and len(P["seeds"]) == 3 and not P["learned_q_seeds"]
    S = P["train"]
    first = math.floor((1 - lm.PLATEAU_SHARE) * S["steps"])
    factors = {round(lr_factor(s, S["warmup"], S["steps"], S["hold"], S["final"]), 12) for s in range(first, S["steps"] + 1)}
    assert factors == {S["final"]} == {0.02}
    assert S["steps"] % S["curve_every"] == 0 and first % S["curve_every"] == 0  # a curve point starts the window


def test_jobs_is_checked_and_refused_where_runs_are_not_trained_in_processes(capsys, tmp_path):
    from softargmax.cli import main
    from softargmax.experiments import lm

    with pytest.raises(SystemExit):
        main(["reproduce", "lm", "--jobs", "0"])
    assert "positive" in capsys.readouterr().err
    assert main(["reproduce", "bisection", "--preset", "smoke", "--jobs", "2", "--out", "/nonexistent/x"]) == 2
    assert capsys.readouterr().err.startswith("error: --jobs: bisection does not take it")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="jobs: give a positive integer"):
            lm.run("smoke", out=str(tmp_path / "x"), jobs=bad)
    with pytest.raises(ValueError, match=r"jobs: .* for the CPU"):
        lm.run("smoke", out=str(tmp_path / "x"), jobs=2, device="cuda")
    # without --jobs: the presets sized for two cores train two runs at once on the CPU, one elsewhere
    assert [lm.default_jobs(p, d) for p, d in [("default", "cpu"), ("full", "cpu"), ("default", "cuda:0"),
                                               ("smoke", "cpu"), ("gpu", "cpu")]] == [2, 2, 1, 1, 1]
    assert not (tmp_path / "x").exists()
