"""The translation experiment's results: the content of ``results.json``, built from run records.

:func:`results_from_records` turns the checked run records of one setup (see
:mod:`softargmax.experiments._records`) into the results the report and figures are drawn
from: per system, means ± standard deviations over the seeds in (:func:`_aggregate`), timings
from the runs on one device only, the timings relative to softmax and to the fastest; the
paired bootstrap between every two systems (:func:`significance`); the plan of runs (in,
owed) and where and when each run in was trained; and the paper's numbers (:data:`PAPER`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from .._common import Log
from .._records import unpack
from .decoding import DecodeStats
from .plan import planned_runs

#: the paper's numbers (Tables 1, 2, 3, 5 and Fig. 4), from the data file next to the experiment's module
PAPER = json.loads((Path(__file__).parent.parent / "translation_paper.json").read_text(encoding="utf-8"))


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """The mean and the standard deviation (the sample's; ``0.0`` for one value) of ``values``."""
    floats = [float(v) for v in values]
    return statistics.fmean(floats), (statistics.stdev(floats) if len(floats) > 1 else 0.0)


PER_SEED_KEYS = ("bleu", "empty_string_rate", "empty_hypotheses_dev", "zero_fraction", "seconds_per_step",
                 "tokens_per_second", "train_seconds", "steps_done", "kept_step", "kept_val_bleu", "kept_val_loss",
                 "stopped_early", "tau", "history", "train_loss", "device")

#: a run's timings: averaged and compared only over the runs on one device (``settings["device"]``)
TIMED_KEYS = ("seconds_per_step", "tokens_per_second")


def _aggregate(per_seed: dict, timed: Optional[Sequence] = None) -> dict:
    """The first seed's record, with means over seeds (and ``*_std``) of the figures that vary by seed.

    The timings (``TIMED_KEYS`` and ``inference_seconds``) come from the seeds in ``timed``
    alone (default: all), the runs on the device whose timings the report compares; they are
    left out when ``timed`` is empty.  ``timed_seeds`` lists those seeds.
    """
    seeds = list(per_seed)
    timed = seeds if timed is None else [s for s in seeds if s in timed]
    rec = dict(per_seed[seeds[0]])
    if len(seeds) > 1:
        for key in ("bleu", "empty_string_rate", "empty_hypotheses_dev", "tau"):
            if all(key in per_seed[s] for s in seeds):
                rec[key], rec[key + "_std"] = mean_std(per_seed[s][key] for s in seeds)
        rec["first_seed_only"] = ["history", "train_loss", "examples", "zero_fraction", "zeros_per_step", "sum_per_step",
                                  "inference_seconds"]
    for key in TIMED_KEYS:
        values = [per_seed[s][key] for s in timed if key in per_seed[s]]
        if not values:
            rec.pop(key, None)
        elif len(values) == 1:
            rec[key] = values[0]
        else:
            rec[key], rec[key + "_std"] = mean_std(values)
    if timed and "inference_seconds" in per_seed[timed[0]]:
        rec["inference_seconds"] = per_seed[timed[0]]["inference_seconds"]
    else:
        rec.pop("inference_seconds", None)
    rec["timed_seeds"] = [str(s) for s in timed]
    rec["seeds"] = {str(s): {k: per_seed[s][k] for k in PER_SEED_KEYS if k in per_seed[s]} for s in seeds}
    return rec


def significance(hyps: dict, refs: list, n_samples: int = 1000) -> list:
    """Paired bootstrap (pooled over seeds) for every pair of systems, in the order given.

    Args:
        hyps: ``{system: translations of the test set}``, one list per seed, as a list of
            lists (the same number of seeds for every system) or as ``{seed: list}``; with
            the latter each pair is pooled over the seeds both systems have (its entry's
            ``seed_list``), and a pair without a common seed is not tested.
        refs: the test set's references.
        n_samples: bootstrap draws.

    Returns:
        one entry per pair tested: ``{"a", "b", **paired_bootstrap(...)}``.
    """
    from .significance import paired_bootstrap

    names = list(hyps)
    out = []
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            ha, hb = hyps[names[a]], hyps[names[b]]
            if isinstance(ha, dict) and isinstance(hb, dict):
                common = [s for s in ha if s in hb]
                if not common:
                    continue
                r = paired_bootstrap([ha[s] for s in common], [hb[s] for s in common], refs, n_samples=n_samples)
                out.append({"a": names[a], "b": names[b], **r, "seed_list": common})
            else:
                r = paired_bootstrap(ha, hb, refs, n_samples=n_samples)
                out.append({"a": names[a], "b": names[b], **r})
    return out


def speed_results(speed: Optional[dict], records: dict) -> Optional[dict]:
    """``results["speed"]`` from the interleaved timing (``records/speed/interleaved.json``, :func:`..translation.time_speed`), or
    ``None`` when there is none or it timed other runs than the records in (a run trained again since).

    Returns ``{"seed", "device", "systems", "rounds", "steps", "inference_rounds", **summarize(timing), "timing"}``
    (:func:`.speed.summarize`: the low quantile of every system's per-round times and the ratios to softmax
    with their bootstrap intervals).
    """
    from .speed import summarize

    if not isinstance(speed, dict) or "timing" not in speed:
        return None
    runs = speed.get("runs") or {}
    for system, finished in runs.items():
        rec = records.get((system, speed.get("seed")))
        if rec is None or rec.get("finished") != finished or rec.get("setup") != speed.get("setup"):
            return None
    t = speed["timing"]
    return {"seed": speed["seed"], "device": speed["device"], "systems": list(runs), "rounds": t["rounds"],
            "steps": t["steps"], "inference_rounds": t["inference_rounds"], **summarize(t), "timing": t}


def results_from_records(found: dict, log: Log = print, speed: Optional[dict] = None) -> tuple[dict, dict]:
    """``results.json``'s content and the decoding statistics of the figures, from checked run records.

    Args:
        found: :func:`..translation.check_records`'s ``{(system, seed): (path, record)}``, all of one setup.
        log: where progress lines go.
        speed: the content of ``records/speed/interleaved.json`` (the runs of one seed timed interleaved), if any:
            it becomes ``results["speed"]`` (:func:`speed_results`) and gives the speed
            ratios, the inference times and the time axis of the training curves.

    Returns:
        ``(results, {system: DecodeStats of its first seed})``.  ``results`` has the layout
        of a single call's (``settings``, ``systems``, ``paper``, ``significance``) plus
        ``plan`` (:func:`planned_runs`) and ``runs`` (device, date, versions of every run
        in).  Means ± standard deviations are over the seeds in; timings only over the runs
        on one device (``settings["device"]``, the device with the most runs); the paired
        bootstrap of each pair of systems pools the seeds both have.
    """
    records = {key: rec for key, (_, rec) in found.items()}
    first_setup = next(iter(records.values()))["setup"]
    P = first_setup["settings"]
    plan = planned_runs(P, records)
    order = [(s, sd) for s, sd in plan["in"]]
    devices: dict[str, int] = {}
    for key in order:
        d = records[key]["environment"]["device"]
        devices[d] = devices.get(d, 0) + 1
    timing_device = max(devices, key=lambda d: devices[d])  # the first one among equals: the first run's
    S: dict[str, dict] = {}
    hyps: dict[str, dict] = {}
    stats: dict[str, DecodeStats] = {}
    for system in dict.fromkeys(s for s, _ in order):
        per_seed: dict[int, dict] = {}
        for sd in [sd for s, sd in order if s == system]:
            rec = records[system, sd]
            per_seed[sd] = {**rec["results"], "seed": sd, "device": rec["environment"]["device"]}
            hyps.setdefault(system, {})[sd] = rec["test_hypotheses"]
        timed = [sd for sd, r in per_seed.items() if r["device"] == timing_device]
        S[system] = _aggregate(per_seed, timed)
        steps = records[system, next(iter(per_seed))]["decoding_steps"]
        stats[system] = DecodeStats(zeros=unpack(steps["zeros"]), sums=unpack(steps["sums"]), vocab=steps["vocab"])
    interleaved = speed_results(speed, records)
    _relative_timings(S, interleaved)
    results: dict[str, Any] = {"settings": _merged_settings(records, order, plan, devices, timing_device),
                               "systems": S, "paper": PAPER}
    if interleaved is not None:
        results["speed"] = interleaved
    reached = time_to_bleu(S, interleaved)
    if reached is not None:
        results["time_to_bleu"] = reached
    if len(hyps) > 1:
        log("paired bootstrap resampling of test BLEU ...")
        refs = records[order[0]]["test_references"]
        sig = significance(hyps, refs, P.get("bootstrap_samples", 1000))
        if sig:
            results["significance"] = sig
    results["plan"] = plan
    results["runs"] = [_run_entry(found[key][0], records[key]) for key in order]
    return results, stats


#: the validation BLEU of "time to BLEU": this share of the highest validation BLEU that every system reaches
TARGET_SHARE = 0.9


def time_to_bleu(S: dict, speed: Optional[dict] = None) -> Optional[dict]:
    """The training time each system takes to reach one validation BLEU (the paper's Fig. 2 read in wall time).

    The target is :data:`TARGET_SHARE` of the lowest, over the systems, of each system's best validation BLEU (so
    that every system reaches it), rounded down to 0.1.  A system's time is the first evaluation at or above it:
    its step × the interleaved time per step (``speed``, :func:`speed_results`; the seed timed there), else the
    run's own training seconds at that evaluation (the first seed).  With interleaved timing the ratio to softmax
    is the ratio of the steps times the step-time ratio of the speed claims (:func:`.speed.summarize`: process CPU
    time on the CPU, wall time on a GPU), with that ratio's bootstrap interval scaled alike (the steps are counted
    at evaluations, so the interval carries the timing noise, not the evaluations' spacing): the entries read as
    :func:`.speed.ratio_summary`'s and take :func:`.speed.ratio_verdict`.

    Returns:
        ``{"target", "seed", "clock": "interleaved" | "run", "systems": {system: {"step", "seconds", "val_bleu",
        "ratio", "ci", "round_ratios", "rounds"}}}`` (``ci``, ``round_ratios`` and ``rounds`` with interleaved
        timing only; ``ratio`` where softmax is in); ``None`` when a system has no validation curve.

    Example:
        >>> S = {"softmax": {"seeds": {"1": {"history": [{"step": 100, "train_seconds": 9.0, "val_bleu": 20.0},
        ...                                              {"step": 200, "train_seconds": 18.0, "val_bleu": 30.0}]}}},
        ...      "alpha_relu": {"seeds": {"1": {"history": [{"step": 100, "train_seconds": 10.0, "val_bleu": 28.0},
        ...                                                 {"step": 200, "train_seconds": 20.0, "val_bleu": 31.0}]}}}}
        >>> got = time_to_bleu(S)
        >>> got["target"], got["systems"]["softmax"]["step"], got["systems"]["alpha_relu"]["ratio"]
        (27.0, 200, 0.5555555555555556)
    """
    if not S:
        return None
    timing: dict = speed if speed is not None and all(s in speed["seconds_per_step"] for s in S) else {}
    timed = bool(timing)
    seed = str(timing["seed"]) if timed else None
    curves = {}
    for s, rec in S.items():
        seeds = rec.get("seeds") or {}
        key = seed if seed in seeds else next(iter(seeds), None)
        seed = seed or key
        history = (seeds.get(key) or {}).get("history") if key is not None else rec.get("history")
        if not history:
            return None
        curves[s] = history
    target = int(TARGET_SHARE * min(max(e["val_bleu"] for e in h) for h in curves.values()) * 10) / 10
    out: dict[str, Any] = {}
    for s, history in curves.items():
        first = next(e for e in history if e["val_bleu"] >= target)
        seconds = first["step"] * timing["seconds_per_step"][s] if timed else first["train_seconds"]
        out[s] = {"step": first["step"], "seconds": seconds, "val_bleu": first["val_bleu"]}
    if "softmax" in out:
        base = out["softmax"]
        for s, entry in out.items():
            entry["ratio"] = entry["seconds"] / base["seconds"] if base["seconds"] > 0 else None
            if timed and s in timing["train"]:
                # the step-time ratio of the speed claims (process CPU time on the CPU), scaled by the steps
                steps = entry["step"] / base["step"]
                tr = timing["train"][s]
                entry.update(ratio=steps * tr["ratio"], ci=[steps * tr["ci"][0], steps * tr["ci"][1]],
                             round_ratios=[steps * tr["round_ratios"][0], steps * tr["round_ratios"][1]],
                             rounds=tr["rounds"])
    return {"target": target, "seed": seed, "clock": "interleaved" if timed else "run", "systems": out}


def _run_entry(path: Path, rec: dict) -> dict:
    """One line of ``results["runs"]``: where, when and with what a run in was trained.

    ``device_type`` and ``precision`` (:func:`precision`) say what the run computed on;
    ``code`` is the library's code that ran (:func:`.._common.code_identity`; ``None`` in
    records written before it was recorded).
    """
    env, res = rec["environment"], rec["results"]
    return {"system": rec["system"], "seed": rec["seed"], "file": f"{path.parent.name}/{path.name}",
            "device": env["device"], "device_type": env.get("device_type") or str(env["device"]).split(" ")[0].split(":")[0],
            "precision": precision(env), "code": env.get("code"),
            "finished": rec.get("finished"), "processes": env.get("processes", 1),
            "torch": env.get("torch"), "triton": env.get("triton"), "softargmax": env.get("softargmax"),
            "bleu": res.get("bleu"), "seconds_per_step": res.get("seconds_per_step"),
            "run_seconds": res.get("run_seconds"), "resumed_from_checkpoint": bool(res.get("resumed_from_checkpoint"))}


def precision(env: dict) -> Optional[str]:
    """The precision a run computed in, from its record's ``environment``: ``"float32"``, ``"bfloat16 autocast"``,
    each with ``", TF32"`` when float32 matrix products used TF32; ``None`` when the record does not say.

    Example:
        >>> precision({"autocast": "bfloat16", "tf32_matmul": True}), precision({"autocast": None})
        ('bfloat16 autocast, TF32', 'float32')
    """
    if "autocast" not in env:
        return None
    return (f"{env['autocast']} autocast" if env["autocast"] else "float32") + (", TF32" if env.get("tf32_matmul") else "")


def joined_distinct(values: Iterable[Any]) -> Any:
    """The one value of ``values``, or the distinct ones joined by " / " (a key read by the report as one string)."""
    distinct = list(dict.fromkeys(values))
    return distinct[0] if len(distinct) == 1 else " / ".join(map(str, distinct))


def _merged_settings(records: dict, order: list, plan: dict, devices: dict, timing_device: str) -> dict:
    """``results["settings"]`` of the runs in: the first run's settings, the devices, versions and processes of all."""
    first = records[order[0]]
    envs = [records[key]["environment"] for key in order]
    timed = [e for e in envs if e["device"] == timing_device]
    settings = first["settings"]
    seeds = list(dict.fromkeys(sd for _, sd in order))
    return {
        "preset": first["setup"]["preset"], "seed": seeds[0], "seeds": seeds,
        "processes": max(int(e.get("processes", 1)) for e in envs), "overrides": first["setup"]["overrides"],
        "data": settings["data"], "vocabulary": settings["vocabulary"], "model": settings["model"],
        "training": settings["training"], "decoding": settings["decoding"],
        "device": timing_device, "tf32_matmul": bool(timed[0].get("tf32_matmul")),
        "torch": joined_distinct(e.get("torch") for e in envs), "softargmax": joined_distinct(e.get("softargmax") for e in envs),
        "python": joined_distinct(e.get("python") for e in envs), "triton": joined_distinct(e.get("triton") for e in envs),
        "total_seconds": 0.0,
        "resumed_from_checkpoint": [f"{s} seed {sd}" if len(seeds) > 1 else s for s, sd in order
                                    if records[s, sd]["results"].get("resumed_from_checkpoint")],
        "devices": devices,
        "run_seconds": sum(records[key]["results"].get("run_seconds", 0.0) for key in order),
    }


def _relative_timings(S: dict, speed: Optional[dict] = None) -> None:
    """Times relative to softmax's, into ``S``: from the interleaved timing (``speed``, :func:`speed_results`)
    when there is one, else from each run's own training (only between systems timed on the same device, those
    whose records :func:`_aggregate` kept timings of).  Inference times are relative to softmax's at the same
    beam size, like the step times: one normalization throughout."""
    if speed is not None:
        for s, rec in S.items():
            if s in speed["train"]:
                rec["seconds_per_step_vs_softmax"] = speed["train"][s]["ratio"]
                rec["seconds_per_step_vs_softmax_ci"] = speed["train"][s]["ci"]
                rec["interleaved_seconds_per_step"] = speed["seconds_per_step"][s]
                rec["inference_seconds"] = speed["inference_seconds"][s]
                rec["inference_normalized"] = {b: e["ratio"] for b, e in speed["inference"][s].items()}
            else:
                rec.pop("inference_seconds", None)
        return
    soft = S.get("softmax", {}).get("seconds_per_step")
    for rec in S.values():
        if soft and "seconds_per_step" in rec:
            rec["seconds_per_step_vs_softmax"] = rec["seconds_per_step"] / soft
    base = S.get("softmax", {}).get("inference_seconds")
    for rec in S.values():
        if base and rec.get("inference_seconds"):
            rec["inference_normalized"] = {b: v / base[b] for b, v in rec["inference_seconds"].items() if b in base}
