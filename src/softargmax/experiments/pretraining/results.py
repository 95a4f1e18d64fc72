"""The results of ``softargmax reproduce lm`` (``results.json``), rebuilt from its run records.

One run's numbers (:func:`run_result`) go into its record; :func:`results_from_records` merges every record of the
output folder into the results: the runs, the mean and standard deviation over seeds of every loss, the paired
bootstrap, the samples, the step times, the plateau verdicts, and the runs the plan still owes.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .._common import relative_span
from .._records import unpack
from .convergence import plateau
from .evaluation import summarize
from .metrics import best_epsilon, epsilon_perplexity
from .plan import RunSpec, run_key
from .significance import paired_tests

#: the paper's numbers (Table 3 and the findings the report checks), from the data file of the experiments' folder
PAPER = json.loads((Path(__file__).parent.parent / "lm_paper.json").read_text(encoding="utf-8"))


def results_from_records(found: dict, planned: list[RunSpec], settings: dict, memory: dict, bootstrap: int) -> dict:
    """The content of ``results.json`` from the checked run records ``found`` (:func:`._records.check_records`): the
    runs in the order of the plan, then the others; aggregates, the paired bootstrap, samples, step times; the runs
    the plan still owes are listed in ``settings["owed"]``."""
    order = {(run_key(s), s.seed): i for i, s in enumerate(planned)}
    recs = [rec for _, (_, rec) in sorted(found.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))]
    results: dict[str, Any] = {"runs": {}, "losses": {}, "paper": PAPER}
    for rec in recs:
        results["runs"][f"{rec['system']}-seed{rec['seed']}"] = rec["run"]
    for key in dict.fromkeys(rec["system"] for rec in recs):
        results["losses"][key] = _aggregate([rec["run"] for rec in recs if rec["system"] == key])
    sentences = {(rec["system"], rec["seed"]): (np.array(unpack(rec["test_sentences"]["correct"]), dtype=np.float64),
                                               np.array(unpack(rec["test_sentences"]["tokens"]), dtype=np.float64))
                 for rec in recs}
    results["significance"] = paired_tests(sentences, bootstrap)
    dec = [rec["decoding"] for rec in recs if rec.get("decoding")]
    results["decoding"] = {"human": dec[0]["human"] if dec else {}, "prompts": dec[0]["prompts"] if dec else [],
                           "models": {d["model"]["run"].split("-seed")[0]: d["model"] for d in dec}}
    systems: dict[str, Any] = {}
    for rec in recs:
        t = rec.get("step_time")
        if t is None or rec["system"] in systems:
            continue
        med = statistics.median(t["seconds"])
        kl = statistics.median(t["kl_seconds"]) if t.get("kl_seconds") else None
        systems[rec["system"]] = {"seconds": t["seconds"], "median_seconds": med, "kl_median_seconds": kl,
                                  "seconds_relative_to_kl": med / kl if kl else None,
                                  "seconds_spread": relative_span(t["seconds"]) if len(t["seconds"]) > 1 else 0.0}
    first = next((rec["step_time"] for rec in recs if rec.get("step_time")), None)
    results["step_time"] = {"rounds": first["rounds"] if first else 0, "batches": first["batches"] if first else 0,
                            "systems": systems}
    results["memory"] = memory
    have = set(found)
    settings = {**settings, "runs_in": [f"{k}:{sd}" for k, sd in sorted(have, key=lambda r: order.get(r, len(order)))],
                "owed": [f"{run_key(s)}:{s.seed}" for s in planned if (run_key(s), s.seed) not in have],
                "devices": sorted({rec["device"] for rec in recs}),
                "resumed_from_checkpoint": [f"{rec['system']}-seed{rec['seed']}" for rec in recs if rec.get("resumed_at")]}
    # a call stopped after its runs were evaluated leaves records without samples or step times
    samples_owed = [k for k in dict.fromkeys(rec["system"] for rec in recs)
                    if not k.endswith("+q") and not any(r.get("decoding") for r in recs if r["system"] == k)]
    timing_owed = [k for k in dict.fromkeys(rec["system"] for rec in recs) if k not in systems]
    if samples_owed or timing_owed:
        settings["samples_owed"], settings["step_times_owed"] = samples_owed, timing_owed
    results["settings"] = settings
    results["plateau"] = plateau(results)
    return results


def run_result(spec: RunSpec, rec: dict, sc: dict, log_q: Optional[torch.Tensor], vocab: int,
                unigram: torch.Tensor) -> dict:
    """One run's numbers: the summaries of both sets, ε-perplexity, timings, curves, and what ``q`` learned."""
    res = {"loss": spec.loss, "seed": spec.seed, "learned_q": spec.learned_q,
           "valid": summarize(sc["valid"]), "test": summarize(sc["test"])}
    eps = best_epsilon(sc["valid"]["p_own"], vocab)  # chosen on the validation tokens, used for both sets
    res["eps_perplexity"] = {"epsilon": eps, "valid": epsilon_perplexity(sc["valid"]["p_own"], vocab, eps),
                             "test": epsilon_perplexity(sc["test"]["p_own"], vocab, eps)}
    res["train_seconds"] = rec["train_seconds"]
    steps = rec["step_seconds"][1:] or rec["step_seconds"]
    res["step_seconds_median"] = statistics.median(steps)
    res["loss_curve"], res["accuracy_curve"] = rec["loss_curve"], rec["accuracy_curve"]
    if log_q is not None:
        lq = log_q.detach().double().cpu()
        seen = unigram > 0
        corr = float(np.corrcoef(lq[seen].numpy(), torch.log(unigram[seen]).numpy())[0, 1])
        res["log_q"] = {"min": float(lq.min()), "max": float(lq.max()), "std": float(lq.std()),
                        "corr_with_log_unigram": corr}
    return res


def _aggregate(runs: list) -> dict:
    """Mean and standard deviation over seeds of every number the report shows."""
    def ms(values: list[Optional[float]]) -> dict[str, Any]:
        known = [v for v in values if v is not None]
        if not known:
            return {"mean": None, "std": None}
        return {"mean": statistics.fmean(known), "std": statistics.stdev(known) if len(known) > 1 else 0.0}

    out: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "learned_q": runs[0]["learned_q"], "loss": runs[0]["loss"]}
    for split in ("valid", "test"):
        out[split] = {k: ms([r[split][k] for r in runs]) for k in
                      ("accuracy", "mean_p_true", "mean_p_true_softmax", "support_mean", "zero_probability_share",
                       "perplexity", "softmax_perplexity", "same_argmax_share")}
        out[split]["accuracy"]["runs"] = [r[split]["accuracy"] for r in runs]
        out[split]["eps_perplexity"] = ms([r["eps_perplexity"][split] for r in runs])
    out["epsilon"] = ms([r["eps_perplexity"]["epsilon"] for r in runs])
    out["step_seconds_median"] = ms([r["step_seconds_median"] for r in runs])
    out["train_seconds"] = ms([r["train_seconds"] for r in runs])
    return out
