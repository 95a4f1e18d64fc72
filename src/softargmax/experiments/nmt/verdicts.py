"""The verdicts on the paper's claims, from the translation results: the criteria and the rules that apply them.

Every verdict is "holds", "does not hold" or "not shown" by a rule stated in the report: a
BLEU comparison by the paired bootstrap at the Bonferroni threshold (:func:`beats_verdict`,
:func:`as_good_verdict`, :func:`ordering`), a speed ratio against the measured variation of
the time per step (:func:`speed_verdict`, :func:`step_time_variation`), the empty string and
sparsity (:func:`empty_string_verdict`, :func:`sparsity_verdict`), and the model selection
of every run (:func:`check_selection`).  The criteria are the constants ``LEVEL``,
``BLEU_MARGIN``, ``SPEED_MARGIN``, ``TAU_TOLERANCE`` and ``SPARSITY_SE``.
"""

from __future__ import annotations

from typing import Iterator, Optional

from .._common import relative_span
from .names import display_name
from .results import mean_std
from .speed import ratio_verdict

#: significance level of the BLEU claims before the Bonferroni correction
LEVEL = 0.05
#: "1.5-ReLU translates as well as 1.5-entmax": BLEU may be lower by at most this margin
BLEU_MARGIN = 0.5
#: "1.5-ReLU trains as fast as softmax": at most this many times softmax's time per step
SPEED_MARGIN = 1.1
#: τ agrees with the data-free formula when within this distance: half a unit of the two decimals of Table 3
TAU_TOLERANCE = 0.005
#: "1.5-ReLU is less sparse": the mean zero shares over seeds differ by more than this many standard errors
SPARSITY_SE = 2.0


def bonferroni_threshold(sig: list, level: float = LEVEL) -> float:
    """``level / m`` for the ``m`` pairs of systems compared in ``sig`` (Bonferroni).

    A BLEU difference counts as shown when its paired bootstrap p-value is below this
    threshold, which bounds the chance of any false claim among the ``m`` tests by ``level``.
    """
    return level / max(len(sig or []), 1)


def _pair(sig: list, a: str, b: str) -> Optional[dict]:
    """The bootstrap record of ``a`` against ``b``, oriented so that ``delta = BLEU_a − BLEU_b``; ``None`` if not tested."""
    for r in sig or []:
        if (r["a"], r["b"]) == (a, b):
            return r
        if (r["a"], r["b"]) == (b, a):
            return {**r, "a": a, "b": b, "bleu_a": r["bleu_b"], "bleu_b": r["bleu_a"], "delta": -r["delta"],
                    "ci": [-r["ci"][1], -r["ci"][0]]}
    return None


def beats_verdict(sig: list, a: str, b: str, level: float = LEVEL) -> str:
    """The verdict on "system ``a`` has a higher BLEU than system ``b``", from the report's paired bootstrap ``sig``.

    Rule: ``"holds"`` only when ``a``'s BLEU is higher and the p-value is below the Bonferroni
    threshold ``level / m`` (:func:`bonferroni_threshold`, ``m`` the number of pairs tested);
    ``"does not hold"`` when ``b``'s BLEU is higher with such a p-value; otherwise
    ``"not shown"``.  The BLEU compared is the one the test scored: that of the seeds'
    translations pooled into one corpus (:mod:`.significance`).  The returned text starts
    with the verdict and gives the BLEU, the p-value and the threshold.
    """
    r = _pair(sig, a, b)
    if r is None:
        return "not tested (results.json has no paired bootstrap of these two systems)"
    thr = bonferroni_threshold(sig, level)
    nums = f"BLEU {r['bleu_a']:.2f} vs {r['bleu_b']:.2f}, p = {r['p_value']:.4f}"
    if r["p_value"] < thr:
        return f"{'holds' if r['delta'] > 0 else 'does not hold'} ({nums} < {thr:.4f})"
    return f"not shown ({nums}, threshold {thr:.4f})"


def as_good_verdict(sig: list, a: str, b: str, margin: float = BLEU_MARGIN) -> str:
    """The verdict on "system ``a`` translates as well as system ``b``": BLEU lower by at most ``margin``.

    Rule (non-inferiority): ``"holds"`` when the whole 95% bootstrap interval of
    ``BLEU_a − BLEU_b`` lies above ``−margin``; ``"does not hold"`` when it lies below
    ``−margin``; otherwise ``"not shown"``.  The interval is the one ``results.json`` stores,
    not widened for the number of comparisons.
    """
    r = _pair(sig, a, b)
    if r is None:
        return "not tested (results.json has no paired bootstrap of these two systems)"
    lo, hi = r["ci"]
    verdict = "holds" if lo > -margin else "does not hold" if hi < -margin else "not shown"
    return f"{verdict} (difference {r['delta']:+.2f}, 95% interval [{lo:+.2f}, {hi:+.2f}])"


def step_time_variation(rec: dict) -> Optional[float]:
    """``(max − min) / mean`` of a system's seconds per step between consecutive evaluations, over all its runs.

    Computed from the training seconds recorded at each evaluation (``history``), so that
    the report states a variation it measured; ``None`` with fewer than two intervals.
    """
    timed = rec.get("timed_seeds")  # the runs on the device whose timings are compared (results from run records)
    runs = [r.get("history", []) for seed, r in rec.get("seeds", {}).items() if timed is None or seed in timed]
    if not runs and timed is None:
        runs = [rec.get("history", [])]
    per_step = []
    for history in runs:
        step, seconds = 0, 0.0
        for e in history:
            if "train_seconds" in e and e["step"] > step:
                per_step.append((e["train_seconds"] - seconds) / (e["step"] - step))
                step, seconds = e["step"], e["train_seconds"]
    return relative_span(per_step) if len(per_step) > 1 else None


def _speed_variation(S: dict, *systems: str) -> Optional[float]:
    var = [step_time_variation(S[s]) for s in systems]
    known = [v for v in var if v is not None]
    return None if len(known) < len(var) else max(known)


def speed_verdict(S: dict, system: str, limit: float, speed: Optional[dict] = None) -> str:
    """The verdict on "``system`` takes at most ``limit`` × softmax's time per step".

    Rule: from the systems' training steps timed interleaved (``speed``, ``results["speed"]``:
    :mod:`.speed`), the claim ``ratio ≤ limit`` ``"holds"`` when the 95% bootstrap interval of
    the ratio lies at or below ``limit``, ``"does not hold"`` when it lies above, and is
    ``"not shown (noisy)"`` otherwise (:func:`.speed.ratio_verdict`).  Without interleaved
    timings (each run timed alone, under whatever load the machine had then) the claim is
    not shown.
    """
    if speed is not None and system in speed.get("train", {}):
        return ratio_verdict(speed["train"][system], limit)
    if "seconds_per_step_vs_softmax" not in S[system]:
        return "not tested (no runs of both systems on the device whose times are compared)"
    v = _speed_variation(S, system, "softmax")
    return (f"not shown ({S[system]['seconds_per_step_vs_softmax']:.2f}×, each run timed alone during its own training, "
            "not interleaved, so the machine's load may differ between them"
            + (f"; the time per step varied by {100 * v:.1f}% within a run" if v is not None else "") + ")")


def paper_sorting_ratios(paper: dict) -> tuple:
    """Smallest and largest ratio to softmax of the paper's training hours of sparsemax and 1.5-entmax (Table 5)."""
    ph = paper["training_hours"]
    ratios = [ph[s][k] / ph["softmax"][k] for s in ("sparsemax", "entmax15") if s in ph for k in ph[s]]
    return min(ratios), max(ratios)


def empty_string_verdict(S: dict, st: dict) -> str:
    """"Sparse outputs avoid the empty-string problem": holds when no sparse output layer prefers the empty
    translation on any dev sentence (in any seed), does not hold otherwise."""
    sparse = [s for s in S if s != "softmax"]
    if not sparse:
        return "not tested (no sparse output layer)"
    return "does not hold" if any(S[s]["empty_string_rate"] > 0 for s in sparse) else "holds"


def sparsity_verdict(S: dict) -> str:
    """"1.5-ReLU is less sparse than 1.5-entmax" (Figs. 5–6), from the exact-zero shares of the seeds' runs.

    Rule: with ``d`` the mean over seeds of 1.5-entmax's share minus 1.5-ReLU's and ``se`` its
    standard error (from the two standard deviations over seeds), ``"holds"`` when
    ``d > SPARSITY_SE · se``, ``"does not hold"`` when ``d < −SPARSITY_SE · se``, otherwise
    ``"not shown"``; ``"not tested"`` with one seed, whose seed-to-seed spread is unknown.
    """
    if not {"alpha_relu", "entmax15"} <= set(S):
        return "not tested (this run lacks 1.5-ReLU or 1.5-entmax)"
    share = {s: [r["zero_fraction"] for r in S[s].get("seeds", {}).values() if "zero_fraction" in r]
             for s in ("alpha_relu", "entmax15")}
    n = min(len(v) for v in share.values())
    if n < 2:
        return "not tested (one seed: the seed-to-seed spread of the zero share is not measured)"
    (ma, sa), (me, se_) = mean_std(share["alpha_relu"]), mean_std(share["entmax15"])
    d, se = me - ma, (sa ** 2 / len(share["alpha_relu"]) + se_ ** 2 / len(share["entmax15"])) ** 0.5
    verdict = "holds" if d > SPARSITY_SE * se else "does not hold" if d < -SPARSITY_SE * se else "not shown"
    return f"{verdict} (mean over {n} seeds: {ma:.3f} vs {me:.3f}; difference {d:+.3f}, standard error {se:.3f})"


def ordering(S: dict, sig: list, level: float = 0.05) -> str:
    """Systems by decreasing mean BLEU, joined by ``>`` (significant difference) or ``≈``."""
    p = {frozenset((r["a"], r["b"])): r["p_value"] for r in sig}
    order = sorted(S, key=lambda s: -S[s]["bleu"])
    text = display_name(order[0])
    for a, b in zip(order, order[1:]):
        text += (" > " if p.get(frozenset((a, b)), 1.0) < level else " ≈ ") + display_name(b)
    return text


def check_selection(S: dict, st: dict) -> dict:
    """Whether every run kept its best evaluated model and stopped within the patience after it."""
    tr = st["training"]
    key, sign = ("val_bleu", 1) if tr.get("select") == "bleu" else ("val_loss", -1)
    bad, late, capped, loss_rose = [], [], [], []
    n = 0
    for system, seed, r in _runs(S):
        h = r.get("history", [])
        if not h:
            continue
        n += 1
        best = max(h, key=lambda e: (sign * e[key], -e["step"]))
        if r.get("kept_step") != best["step"]:
            bad.append(f"{display_name(system)} seed {seed}")
        after = sum(1 for e in h if e["step"] > r.get("kept_step", h[-1]["step"]))
        if tr.get("patience") is not None and after > tr["patience"]:
            late.append(f"{display_name(system)} seed {seed}")
        if r.get("kept_step") == h[-1]["step"] and r.get("steps_done") == tr["steps"]:
            capped.append(f"{display_name(system)} seed {seed}")
        before = [e["val_loss"] for e in h if e["step"] <= r.get("kept_step", 0)]
        if before and before[-1] > min(before) + 1e-9:
            loss_rose.append(f"{display_name(system)} seed {seed}")
    return {"runs": n, "not_best": bad, "trained_past_patience": late, "best_at_step_limit": capped,
            "val_loss_rose_before_kept": loss_rose}


def _runs(S: dict) -> Iterator[tuple[str, str, dict]]:
    """``(system, seed, per-seed record)`` of every training run."""
    for system, rec in S.items():
        for seed, r in rec.get("seeds", {}).items():
            yield system, seed, r
