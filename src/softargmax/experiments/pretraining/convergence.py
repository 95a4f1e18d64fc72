"""The plateau criterion of ``softargmax reproduce lm``: whether a loss's validation accuracy has stopped rising.

A loss counts as converged when its validation-head accuracy, averaged over its seeds, rises by less than
:data:`PLATEAU_POINTS` points over the last :data:`PLATEAU_SHARE` of the training steps; the report draws the
paper's claims only from converged losses.
"""

from __future__ import annotations

import statistics
from typing import Optional

from .plan import loss_label

#: plateau criterion: a run has converged when its validation-head accuracy rises by less than this many points ...
PLATEAU_POINTS = 0.3
#: ... over this last share of its steps
PLATEAU_SHARE = 0.2


def mean_curves(results: dict) -> dict:
    """Validation-head accuracy per step, averaged over the seeds of each loss (q = 1): ``{loss: [[step, acc]]}``."""
    by: dict[str, list[list]] = {}
    for r in results["runs"].values():
        if not r["learned_q"]:
            by.setdefault(r["loss"], []).append(r["accuracy_curve"])
    return {k: [[c[0][i][0], statistics.fmean(x[i][1] for x in c)] for i in range(len(c[0]))] for k, c in by.items()}


def plateau(results: dict) -> dict:
    """The plateau verdict of every loss (and learned q): whether its validation-head accuracy, averaged over its seeds,
    rises by less than :data:`PLATEAU_POINTS` points over the last :data:`PLATEAU_SHARE` of the training steps.

    Returns ``{key: {"from_step", "to_step", "from", "to", "rise", "runs", "converged"}}``: the curve points the rise is
    measured between (the last point at or before ``(1 - PLATEAU_SHARE) · steps``, and the last), the mean accuracies
    there, their difference, each seed's own rise, and the verdict.  Computed from the curves alone, so the report of
    an earlier run (whose results hold no verdict) gets one too.
    """
    steps = results["settings"]["train"]["steps"]
    start = (1 - PLATEAU_SHARE) * steps
    by: dict[str, list[list]] = {}
    for r in results["runs"].values():
        by.setdefault(f"{r['loss']}+q" if r["learned_q"] else r["loss"], []).append(r["accuracy_curve"])
    out = {}
    for key, curves in by.items():
        rises, first, last = [], [], []
        for c in curves:
            a = [pt for pt in c if pt[0] <= start + 1e-9][-1]
            first.append(a)
            last.append(c[-1])
            rises.append(c[-1][1] - a[1])
        a0, a1 = statistics.fmean(p[1] for p in first), statistics.fmean(p[1] for p in last)
        out[key] = {"from_step": first[0][0], "to_step": last[0][0], "from": a0, "to": a1, "rise": a1 - a0,
                    "runs": rises, "converged": last[0][0] >= steps and a1 - a0 < PLATEAU_POINTS}
    return out


def exclusion(results: dict, *keys: str) -> Optional[str]:
    """``None`` when every loss of ``keys`` passed the plateau criterion, else the sentence that says which did not."""
    P = plateau(results)
    failed = [k for k in keys if k in P and not P[k]["converged"]]
    if not failed:
        return None
    return ("excluded: " + ", ".join(f"{loss_label(k)} still rose {P[k]['rise']:+.2f} points over the last "
                                     f"{100 * PLATEAU_SHARE:.0f}% of its steps" for k in failed)
            + f" (criterion: < {PLATEAU_POINTS})")
