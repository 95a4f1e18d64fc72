"""Speed verdicts of the translation report that survive a busy machine: the systems timed in interleaved rounds,
a low quantile of the rounds, a bootstrap interval of the ratio, and a verdict only where the interval excludes
the limit (softargmax.experiments.nmt.speed).  Timings are injected: a load that comes and goes, spikes that
hit one system, noise at the limit."""

import math
import random

import numpy as np
import pytest

from softargmax.experiments.nmt import speed
from softargmax.experiments.nmt.verdicts import speed_verdict


def _rounds(ratio, n=12, load=lambda r, who: 1.0, noise=0.03, seed=0, base=0.25):
    """Per-round seconds per step of a system at ``ratio`` × softmax's, and softmax's; ``load(round, who)`` multiplies
    a measurement (who: 0 softmax, 1 the other), ``noise`` is a log-normal spread."""
    rng = random.Random(seed)
    soft = [base * load(r, 0) * math.exp(rng.gauss(0, noise)) for r in range(n)]
    other = [base * ratio * load(r, 1) * math.exp(rng.gauss(0, noise)) for r in range(n)]
    return other, soft


LOADS = {
    "quiet": lambda r, who: 1.0,
    # the machine busy for the first half of the run, then quiet: the pattern that flipped the verdicts when each
    # system was timed during its own training (softmax, trained first, looked 3× slower)
    "loaded then quiet": lambda r, who: 4.0 if r < 6 else 1.0,
    # spikes that hit one system's turn in a few rounds (a job starting in the middle of a round)
    "spikes on one system": lambda r, who: 3.0 if (r, who) in {(1, 0), (4, 1), (7, 0), (10, 1)} else 1.0,
    "load ramping up": lambda r, who: 1.0 + 0.3 * r,
}


@pytest.mark.parametrize("load", sorted(LOADS))
def test_the_verdict_does_not_move_with_the_machines_load(load):
    for ratio, expected in ((0.9, "holds"), (1.5, "does not hold")):
        entry = speed.ratio_summary(*_rounds(ratio, load=LOADS[load]))
        verdict = speed.ratio_verdict(entry, 1.1)
        assert verdict.startswith(expected + " ("), (load, ratio, verdict)
        assert entry["ci"][0] <= entry["ratio"] <= entry["ci"][1]


def test_the_old_rule_on_the_same_load_flipped_and_the_interleaved_one_does_not():
    """Each system timed alone during its own training (softmax while the machine was busy) gives a ratio far
    from the true one; the interleaved rounds give the true one."""
    busy = lambda r, who: 4.0  # noqa: E731
    softmax_alone = _rounds(1.0, load=busy)[1]  # softmax trained first, on a busy machine
    other_alone = _rounds(1.5, seed=1)[0]  # the other system later, on a quiet one
    assert np.mean(other_alone) / np.mean(softmax_alone) < 0.5  # "1.5× slower" looked 2.7× faster
    entry = speed.ratio_summary(*_rounds(1.5, load=LOADS["loaded then quiet"]))
    assert entry["ratio"] == pytest.approx(1.5, rel=0.05)


def test_too_few_rounds_give_no_verdict():
    times, reference = _rounds(1.5)
    for n in (1, 2):
        text = speed.ratio_verdict(speed.ratio_summary(times[:n], reference[:n]), 1.1)
        assert text.startswith("not shown (too few rounds: ") and f"× from {n} interleaved round" in text, text
    assert speed.ratio_verdict(speed.ratio_summary(times[:3], reference[:3]), 1.1).startswith("does not hold (")


def test_a_ratio_at_the_limit_or_drowned_in_noise_is_not_shown_with_its_variation():
    at_limit = speed.ratio_verdict(speed.ratio_summary(*_rounds(1.1, noise=0.05)), 1.1)
    assert at_limit.startswith("not shown (noisy) (")
    noisy = speed.ratio_summary(*_rounds(1.0, noise=0.3, seed=0))  # a 30% spread from round to round
    text = speed.ratio_verdict(noisy, 1.1)
    lo, hi = noisy["round_ratios"]
    assert text.startswith("not shown (noisy)") and f"per-round ratios {lo:.2f}–{hi:.2f}×" in text
    assert noisy["ci"][0] < 1.1 < noisy["ci"][1]


def test_the_bootstrap_interval_and_the_quantile():
    values = [0.3, 0.1, 0.4, 0.2, 0.5]
    for q in (0.0, 0.2, 0.5, 1.0):
        assert speed.quantile(values, q) == pytest.approx(np.quantile(values, q))
    exact = speed.ratio_summary([0.2] * 6, [0.1] * 6)  # no noise: a point interval
    assert exact["ratio"] == exact["ci"][0] == exact["ci"][1] == pytest.approx(2.0)
    a = speed.ratio_summary(*_rounds(0.8, noise=0.1))
    assert a == speed.ratio_summary(*_rounds(0.8, noise=0.1))  # seeded: the same interval every time
    with pytest.raises(ValueError, match="paired"):
        speed.ratio_summary([0.1, 0.2], [0.1])


def test_speed_verdict_uses_the_interleaved_timing_and_refuses_runs_timed_alone():
    other, soft = _rounds(0.9)
    timing = {"train_seconds_per_step": {"softmax": soft, "alpha_relu": other},
              "train_cpu_seconds_per_step": {"softmax": soft, "alpha_relu": other},
              "inference_seconds": {"softmax": {"1": soft}, "alpha_relu": {"1": other}}}
    summary = speed.summarize(timing)
    assert summary["train"]["softmax"]["ratio"] == 1.0
    assert summary["inference"]["alpha_relu"]["1"]["ratio"] == pytest.approx(summary["train"]["alpha_relu"]["ratio"])
    S = {"softmax": {"seconds_per_step_vs_softmax": 1.0}, "alpha_relu": {"seconds_per_step_vs_softmax": 0.3}}
    assert speed_verdict(S, "alpha_relu", 1.1, summary).startswith("holds (0.9")
    alone = speed_verdict(S, "alpha_relu", 1.1)
    assert alone.startswith("not shown (0.30×, each run timed alone") and "not interleaved" in alone


def test_one_thread_cpu_timing_takes_its_ratios_from_process_cpu_time():
    """With ``clock: cpu`` (one torch thread on the CPU) the ratios come from the process CPU time: a busy core that
    stretches the wall time of some rounds (injected here at random, up to 3×) leaves the CPU-time verdict as it is
    on a quiet machine, while the wall-time ratio of the same rounds would be left undecided."""
    cpu_other, cpu_soft = _rounds(0.98, noise=0.01, seed=3)
    rng = random.Random(1)
    stretch = [[1.0 + 2.0 * rng.random() for _ in range(len(cpu_soft))] for _ in range(2)]
    wall_other = [c * f for c, f in zip(cpu_other, stretch[0])]
    wall_soft = [c * f for c, f in zip(cpu_soft, stretch[1])]
    timing = {"clock": "cpu", "threads": 1,
              "train_seconds_per_step": {"softmax": wall_soft, "alpha_relu": wall_other},
              "train_cpu_seconds_per_step": {"softmax": cpu_soft, "alpha_relu": cpu_other},
              "inference_seconds": {"softmax": {"1": wall_soft}, "alpha_relu": {"1": wall_other}},
              "inference_cpu_seconds": {"softmax": {"1": cpu_soft}, "alpha_relu": {"1": cpu_other}}}
    summary = speed.summarize(timing)
    assert summary["clock"] == "cpu" and summary["threads"] == 1
    assert speed.ratio_verdict(summary["train"]["alpha_relu"], 1.1).startswith("holds (0.9")
    assert summary["inference"]["alpha_relu"]["1"]["ratio"] == pytest.approx(0.98, abs=0.02)
    assert summary["seconds_per_step"]["softmax"] == speed.quantile(wall_soft, speed.QUANTILE)  # wall time beside
    wall = speed.summarize({k: v for k, v in timing.items() if k != "clock"})  # a timing without a clock: wall time
    assert "clock" not in wall and speed.ratio_verdict(wall["train"]["alpha_relu"], 1.1).startswith("not shown")


def test_time_interleaved_runs_one_thread_on_the_cpu_and_restores_the_threads():
    import torch

    seen = []
    model = torch.nn.Linear(4, 3)

    class Layer:
        def loss(self, out, target):
            seen.append(torch.get_num_threads())
            return torch.nn.functional.cross_entropy(out, target)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = model

        def forward(self, src, tgt_in):
            return self.lin(src)

    batches = [(torch.randn(5, 4), None, torch.randint(0, 3, (5,)))]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = speed.time_interleaved({"softmax": (Net(), Layer()), "sparsemax": (Net(), Layer())}, batches,
                                     lambda m, layer, beam: seen.append(torch.get_num_threads()), [1], rounds=2,
                                     steps=1, inference_rounds=1, log=lambda m: None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert set(seen) == {1} and out["clock"] == "cpu" and out["threads"] == 1
    assert set(out["inference_cpu_seconds"]) == {"softmax", "sparsemax"}
    with pytest.raises(ValueError, match="threads"):
        speed.time_interleaved({}, batches, lambda m, layer, beam: None, [1], threads=0)
