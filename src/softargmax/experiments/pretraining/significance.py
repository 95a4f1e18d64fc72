"""The paired bootstrap of ``softargmax reproduce lm`` and its verdicts on the paper's claims.

Every comparison the report makes (the Table 3 ordering, the other losses against KL, a learned ``q`` against
``q = 1``) is a paired bootstrap over the seeds both losses share and the test sentences, judged at the Bonferroni
level: ``beats`` (a significant difference) or ``at_least`` (non-inferiority within :data:`MARGIN` points).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .metrics import LEVEL, bonferroni_threshold, paired_bootstrap_accuracy
from .plan import LEARNED_Q, SHORT, TABLE3

#: "A is at least as good as B": A's accuracy may be lower by at most this many points (non-inferiority)
MARGIN = 0.5


def _pairs(keys: list) -> list:
    """The comparisons the report tests among the loss keys ``keys``: the Table 3 ordering, the other losses against
    KL, learned q against q = 1."""
    pairs = [(a, b) for a, b in (("alpha1.5", "kl"), ("kl", "chi_square"), ("alpha1.5", "chi_square")) if {a, b} <= set(keys)]
    pairs += [(n, "kl") for n in ("jensen_shannon", "reverse_chi_square") if {n, "kl"} <= set(keys)]
    pairs += [(f"{n}+q", n) for n in LEARNED_Q if {f"{n}+q", n} <= set(keys)]
    return pairs


def paired_tests(sentences: dict, n_samples: int) -> dict:
    """Paired bootstrap over the seeds both systems share and the test sentences, for every pair of :func:`_pairs`;
    ``sentences``: ``{(loss key, seed): (correct predictions per test sentence, predictions per sentence)}``."""
    by_key: dict[str, dict[int, tuple]] = {}
    for (key, sd), v in sentences.items():
        by_key.setdefault(key, {})[sd] = v
    tests = []
    for a, b in _pairs(list(by_key)):
        shared = sorted(set(by_key[a]) & set(by_key[b]))
        if not shared:
            continue
        ca = [by_key[a][sd][0] for sd in shared]
        cb = [by_key[b][sd][0] for sd in shared]
        tokens = by_key[a][shared[0]][1]
        keep = tokens > 0
        r = paired_bootstrap_accuracy(np.array(ca)[:, keep], np.array(cb)[:, keep], tokens[keep], n_samples=n_samples,
                                      keep_draws=True)
        tests.append({"a": a, "b": b, "shared_seeds": shared, **r})
    level = bonferroni_threshold(len(tests))
    for t in tests:  # one-sided lower bound at the corrected level, for the non-inferiority verdicts
        t["lower_bound"] = float(np.percentile(t.pop("draws"), 100 * level))
    return {"tests": tests, "level": LEVEL, "threshold": level, "margin": MARGIN}


def oriented_test(results: dict, a: str, b: str) -> Optional[dict]:
    """The bootstrap record of ``a`` against ``b``, oriented so that ``delta = acc_a − acc_b``; ``None`` if not tested."""
    for t in results["significance"]["tests"]:
        if (t["a"], t["b"]) == (a, b):
            return t
        if (t["a"], t["b"]) == (b, a):
            return {**t, "a": a, "b": b, "acc_a": t["acc_b"], "acc_b": t["acc_a"], "delta": -t["delta"],
                    "ci": [-t["ci"][1], -t["ci"][0]], "lower_bound": None}
    return None


def beats(results: dict, a: str, b: str) -> str:
    """Verdict on "``a`` has a higher test accuracy than ``b``": ``holds`` only when the paired bootstrap's p-value is
    below the Bonferroni threshold and ``a`` is higher; ``reversed`` when ``b`` is higher at that level; else
    ``not shown``.  The text gives the accuracies, the p-value and the threshold."""
    t = oriented_test(results, a, b)
    if t is None:
        return "not tested"
    thr = results["significance"]["threshold"]
    nums = f"{t['acc_a']:.2f} vs {t['acc_b']:.2f}%, p = {t['p_value']:.4f}, threshold {thr:.4f}"
    if t["p_value"] < thr:
        return f"{'holds' if t['delta'] > 0 else 'reversed'} ({nums})"
    return f"not shown ({nums})"


def at_least(results: dict, a: str, b: str) -> str:
    """Verdict on "``a`` is at least as accurate as ``b``" (non-inferiority with margin :data:`MARGIN` points):
    ``holds`` when the one-sided bootstrap lower bound of ``acc_a − acc_b`` at the Bonferroni level lies above
    ``−MARGIN``; ``does not hold`` when the difference is significantly negative (``b`` beats ``a``); else
    ``not shown``."""
    t = oriented_test(results, a, b)
    if t is None or t.get("lower_bound") is None:
        return "not tested"
    sig = results["significance"]
    nums = f"difference {t['delta']:+.2f} points, one-sided lower bound {t['lower_bound']:+.2f} at level {sig['threshold']:.4f}"
    if t["lower_bound"] > -sig["margin"]:
        return f"holds ({nums} > −{sig['margin']})"
    if t["p_value"] < sig["threshold"] and t["delta"] < 0:
        return f"does not hold ({nums}; {b} is significantly better, p = {t['p_value']:.4f})"
    return f"not shown ({nums} ≤ −{sig['margin']})"


def verdict_word(verdict: str) -> str:
    return verdict.split(" (")[0]


def ordering(results: dict) -> str:
    """The losses of Table 3 by mean test accuracy, joined by ``>`` where the paired test shows the difference between
    neighbours and ``≈`` where it does not."""
    L = results["losses"]
    keys = sorted((k for k in TABLE3 if k in L), key=lambda k: -L[k]["test"]["accuracy"]["mean"])
    if not keys:
        return "—"
    out = SHORT[keys[0]]
    for a, b in zip(keys, keys[1:]):
        v = beats(results, a, b)
        out += (" > " if v.startswith("holds") else " ≈ " if v.startswith("not shown") else " ? ") + SHORT[b]
    return out
