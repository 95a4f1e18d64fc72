"""The translation report's text: ``report.md`` rendered from the results (the content of ``results.json``).

:func:`render_report` writes every section: the setup, the runs in and owed, the tables
beside the paper's (BLEU, speed, empty translations, sparsity, τ, inference time), the
seeds and the paired bootstrap, the claims checked (by the rules of :mod:`.verdicts`), the
discussion, the figures, examples and the reproducibility section.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from .._common import reproducibility, seed_spread
from .._progress import summary_table
from .names import display_name
from .results import TARGET_SHARE, joined_distinct
from .speed import ratio_verdict
from .verdicts import (
    BLEU_MARGIN,
    LEVEL,
    SPARSITY_SE,
    SPEED_MARGIN,
    TAU_TOLERANCE,
    as_good_verdict,
    beats_verdict,
    bonferroni_threshold,
    check_selection,
    empty_string_verdict,
    ordering,
    paper_sorting_ratios,
    sparsity_verdict,
    speed_verdict,
    step_time_variation,
)

#: what the test of killed and resumed runs shows, for the report's Reproducibility section
RESUME_TEST = ("the test “a smoke translation run killed at random moments and resumed until it finishes equals an "
               "uninterrupted run” kills a `smoke` run of softmax and 1.5-ReLU with SIGKILL at moments drawn by a "
               "seeded random generator, resumes it from its checkpoints until it finishes, and gets every number of "
               "an uninterrupted run of the same seed, timings aside.")

#: what the test of runs trained by separate calls shows, for the report's Reproducibility section (results built
#: from run records)
SPLIT_TEST = ("Training the runs by separate calls into one folder changes no number: the test “two calls with disjoint "
              "runs merge into the results of one call” trains the 4 runs of a toy-size `gpu` preset by one call and "
              "by two, and gets the same results, timings aside.")


def _fmt(v: Optional[float], nd: int = 2) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def _times(v: Optional[float]) -> str:
    """``1.05×``, or ``—`` when there is no ratio."""
    return "—" if v is None else f"{v:.2f}×"


def _pm(rec: dict, key: str, scale: float = 1.0, nd: int = 2) -> str:
    """``mean ± std`` over seeds when the record has a ``*_std``, else the value (``—`` when it has none)."""
    if key not in rec:
        return "—"
    v = f"{scale * rec[key]:.{nd}f}"
    return v + (f" ± {scale * rec[key + '_std']:.{nd}f}" if key + "_std" in rec else "")


def _training_text(st: dict) -> str:
    tr, m = st["training"], st["model"]
    opt = (f"AdamW (decoupled weight decay {tr['weight_decay']})" if tr.get("weight_decay") else "Adam")
    ls = tr.get("label_smoothing", 0.0)
    text = (f"{opt} β=({tr['betas'][0]}, {tr['betas'][1]}), noam warm-up {tr['warmup']} (factor {tr['lr']}), "
            f"dropout {m['dropout']}, clip {tr['clip']}, "
            + (f"label smoothing {ls}" if ls else "no label smoothing as in the paper"))
    if tr.get("bf16"):
        text += ", bfloat16 autocast of the Transformer on the GPU (losses in float32)"
    if st.get("tf32_matmul"):
        text += ", TF32 float32 matrix products"
    return text


def _selection_text(st: dict) -> str:
    tr = st["training"]
    if tr.get("select", "last") == "last":
        return f"trained {tr['steps']} steps"
    metric = "greedy BLEU" if tr["select"] == "bleu" else "loss"
    n = tr["val_bleu_sentences"] or st["data"]["val"]
    return (f"trained at most {tr['steps']} steps, evaluated every {tr['eval_every']} steps on the validation set "
            f"(loss on all {st['data']['val']} sentences, greedy BLEU on {n}); the kept model is the evaluated one with "
            f"the best validation {metric}, and training stops after {tr['patience']} evaluations without improvement")


def _timing_device(speed: dict) -> str:
    """The device of the interleaved timing as it ran: the machine's description, with the one torch thread of a
    CPU timing (``clock: cpu``) in place of the threads the process had (the description is taken before the
    timing sets them)."""
    device = str(speed["device"])
    if speed.get("clock") == "cpu" and speed.get("threads") == 1:
        return re.sub(r"\(\d+ threads?, ", "(1 thread, ", device, count=1)
    return device


def render_report(results: dict, figures: list) -> str:
    """The report's markdown, rendered from ``results`` (the content of ``results.json``) and the figure files.

    The report says no more than its statistics: every number in it comes from ``results``
    (ours, the settings and the paper's numbers stored with them) or is one of the stated
    criteria (``LEVEL``, ``BLEU_MARGIN``, ``SPEED_MARGIN``, ``TAU_TOLERANCE``, ``SPARSITY_SE``),
    and every verdict follows a rule the report states: "A beats B" in BLEU holds only when
    A's BLEU is higher and the paired bootstrap's p-value is below the Bonferroni threshold
    (:func:`beats_verdict`); see :func:`_claims` for the others.
    """
    S, st, paper = results["systems"], results["settings"], results["paper"]
    seeds = st.get("seeds", [st["seed"]])
    plan = results.get("plan")  # results built from run records: some runs may be owed
    who = f"seed {st['seed']}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    procs = st.get("processes", 1)
    hours = [h for per in paper["training_hours"].values() for h in per.values()]
    who += f", {procs} process{'es' if procs > 1 else ''} (torchrun, data parallel over the batch)" if procs > 1 else ", 1 process"
    devices = st.get("devices") or {st["device"]: 1}
    where = (st["device"] if len(devices) == 1 else
             f"{len(devices)} devices (the timings compared are from {st['device']}; see Runs)")
    took = (f"this invocation took {st['total_seconds'] / 60:.1f} min" if plan is None else
            f"{len(plan['in'])} run{'s' * (len(plan['in']) > 1)} in, {st['run_seconds'] / 60:.1f} min of training and "
            "evaluation in all")
    lines = [
        "# Reproducing “Speeding Up Entmax” on Multi30k De→En",
        "",
        f"Preset `{st['preset']}`, {who}, {where}, torch {st['torch']}, softargmax {st['softargmax']}; {took}"
        + (f" (training of {', '.join(st['resumed_from_checkpoint'])} was resumed from checkpoints; "
           "training times add up those recorded before and after)." if st.get("resumed_from_checkpoint") else "."),
        "",
        "**Stand-in data and model.** The paper trains Transformer-base on IWSLT'14 / WMT'14 / WMT'13 "
        f"for {min(hours):.0f}–{max(hours):.0f} hours per model (Table 5). Here: Multi30k task 1 De→En ({st['data']['train']:,} training pairs of image captions, "
        f"test_2016_flickr, {st['data']['test_sentences']} sentences), a joint {st['vocabulary']['size']}-piece BPE "
        f"vocabulary, a Transformer with d_model={st['model']['d_model']}, {st['model']['layers']}+{st['model']['layers']} "
        f"layers, {st['model']['heads']} heads, FF {st['model']['ff']}, {_selection_text(st)}; batches of "
        f"~{st['training']['batch_tokens']} target tokens ({_training_text(st)}). Every system has the same data order, "
        "initialization and settings" + (" for each seed." if len(seeds) > 1 else "."),
    ]
    if plan is not None:
        lines += _runs_section(results)
    counts = {s: len(rec.get("seeds") or {"": 0}) for s, rec in S.items()}
    uneven = len(set(counts.values())) > 1
    lines += [
        "",
        "## Test BLEU (Table 1)",
        "",
        f"Detokenized, case-sensitive sacreBLEU (`{next(iter(S.values()))['bleu_signature']}`), beam {st['decoding']['beam']}, no length penalty"
        + ("; ours: mean ± standard deviation over each system's seeds in (their number in parentheses; the value "
           "of a single seed has no ±)." if uneven else
           f"; ours: mean ± standard deviation over {len(seeds)} seeds." if len(seeds) > 1 else "."),
        "",
        "| output layer | loss | ours (Multi30k) | paper IWSLT De→En | paper WMT En→De | paper WMT En→Ru |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s, rec in S.items():
        pb = paper["bleu"].get(s, {})
        loss_name = "cross-entropy" if s == "softmax" else f"{display_name(s)} loss"
        ours = _pm(rec, 'bleu') + (f" ({counts[s]})" if uneven else "")
        lines.append(f"| {display_name(s)} | {loss_name} | {ours} | {_fmt(pb.get('IWSLT De→En'), 1)} | "
                     f"{_fmt(pb.get('WMT En→De'), 1)} | {_fmt(pb.get('WMT En→Ru'), 1)} |")
    if plan is not None and not plan["complete"]:
        lines += ["", f"**Provisional:** {_in_and_owed(plan)}; this comparison with the paper may change when the "
                  "owed runs are in."]
    lines += _seed_sections(results)
    speed = results.get("speed")
    ph = paper["training_hours"]
    if speed is not None:
        lines += ["", "## Training speed (Table 5)", "",
                  f"Seconds per training step (forward, loss, backward, optimizer) with the systems timed interleaved "
                  f"after training: {speed['rounds']} rounds, each running {speed['steps']} steps of every system on "
                  f"the same batches (the order rotating), on {_timing_device(speed)}; a system's time is the "
                  f"{speed['quantile']:g} quantile of its rounds (the rounds least disturbed by other jobs on the "
                  "machine), its ratio to softmax comes with a 95% bootstrap interval over the rounds, and process CPU "
                  "time stands beside wall time. "
                  + ("The systems were timed with one torch thread, and the ratios are of process CPU time: the work "
                     "of a step, to which time spent waiting for a core that another job holds does not add. "
                     if speed.get("clock") == "cpu" else "")
                  + "Tokens per second are each run's own, over its whole training."
                  + ("" if plan is None else f" {_timing_scope(results)}") + " The paper's columns are its ratios "
                  "of total training hours.", "",
                  "| output layer | s/step (interleaved) | CPU s/step | ours vs softmax [95% interval] | tokens/s in "
                  "training | paper IWSLT | paper WMT En→De | paper WMT En→Ru |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for s, rec in S.items():
            ratios = [ph[s][k] / ph["softmax"][k] if s in ph else None for k in ("IWSLT", "WMT En→De", "WMT En→Ru")]
            tr = speed["train"].get(s)
            ours = "–" if tr is None else f"{tr['ratio']:.2f}× [{tr['ci'][0]:.2f}–{tr['ci'][1]:.2f}]"
            lines.append(f"| {display_name(s)} | {_fmt(speed['seconds_per_step'].get(s), 3)} | "
                         f"{_fmt(speed['cpu_seconds_per_step'].get(s), 3)} | {ours} | "
                         f"{_pm(rec, 'tokens_per_second', nd=0)} | " + " | ".join(f"{_fmt(r)}×" for r in ratios) + " |")
        lines += _time_to_bleu(results.get("time_to_bleu"))
    else:
        lines += ["", "## Training speed (Table 5)", "",
                  "Seconds per training step and target tokens per second (forward, loss, backward, optimizer; "
                  "evaluation excluded), each run timed alone during its own training (not interleaved, so the "
                  "machine's load may differ between systems), and the time relative to softmax, beside the paper's "
                  "ratios of total training hours." + ("" if plan is None else " " + _timing_scope(results)), "",
                  "| output layer | s/step | tokens/s | ours vs softmax | paper IWSLT | paper WMT En→De | paper WMT En→Ru |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for s, rec in S.items():
            ratios = [ph[s][k] / ph["softmax"][k] if s in ph else None for k in ("IWSLT", "WMT En→De", "WMT En→Ru")]
            lines.append(f"| {display_name(s)} | {_pm(rec, 'seconds_per_step', nd=3)} | "
                         f"{_pm(rec, 'tokens_per_second', nd=0)} | {_times(rec.get('seconds_per_step_vs_softmax'))} | "
                         + " | ".join(f"{_fmt(r)}×" for r in ratios) + " |")
    lines += ["", "## Empty translations (Table 2)", "",
              f"Share of dev sentences ({st['data']['dev_sentences_for_empty_rate']}) whose empty translation scores higher "
              "than the beam hypothesis (`log p(EOS | BOS)` vs the hypothesis' summed log-scores).", "",
              "| output layer | ours | paper IWSLT | paper WMT En→De | paper WMT En→Ru |", "| --- | --- | --- | --- | --- |"]
    pe = paper["empty_string_percent"]
    for s, rec in S.items():
        p = pe.get(s, {})
        lines.append(f"| {display_name(s)} | {_pm(rec, 'empty_string_rate', 100, 1)}% | {_fmt(p.get('IWSLT De→En'), 1)}% | "
                     f"{_fmt(p.get('WMT En→De'), 2)}% | {_fmt(p.get('WMT En→Ru'), 1)}% |")
    lines += ["", "## Sparsity and self-normalization (Figs. 5–6, 9)", "",
              "| output layer | exact-zero share over test decoding steps | zeros per step (median) | Σ scores per step: mean [p5, p95] |",
              "| --- | --- | --- | --- |"]
    for s, rec in S.items():
        z, su = rec["zeros_per_step"], rec["sum_per_step"]
        lines.append(f"| {display_name(s)} | {rec['zero_fraction']:.4f} | {z.get('median', 0):.0f} of {st['vocabulary']['size']} | "
                     f"{su.get('mean', 0):.3f} [{su.get('p5', 0):.3f}, {su.get('p95', 0):.3f}] |")
    if "alpha_relu" in S:
        a = S["alpha_relu"]
        lines += ["", "## τ of 1.5-ReLU (Table 3)", "",
                  f"τ from the untrained model's first batch (mean 1.5-entmax threshold): **{_pm(a, 'tau', nd=4)}**"
                  + (f" (mean ± std over the {len(a['seeds'])} seeds' initializations and first batches)"
                     if len(a.get("seeds") or seeds) > 1 else "")
                  + "; data-free "
                  f"estimate `alpha_relu_tau.gaussian(V={st['vocabulary']['size']}, std=linear_logit_std({st['model']['d_model']}, "
                  f"{st['vocabulary']['size']}))`: **{a['tau_formula']:.4f}** (model / formula = {a['tau'] / a['tau_formula']:.3f}). "
                  f"Paper (d_model {', '.join(sorted({str(r['d_model']) for r in paper['tau_table3']}))}): "
                  + ", ".join(f"V={r['vocab']:,}: model {r['tau_model']}, formula {r['tau_formula']}" for r in paper["tau_table3"])
                  + ". `softargmax.alpha_relu_tau.gaussian` reproduces the paper's formula column to its two decimals (a test of "
                  "the library checks it)."]
    lines += ["", "## Inference time vs beam size (Fig. 4)", "",
              f"Translating {st['decoding']['timing_sentences']} test sentences, "
              + (f"timed interleaved with the other systems ({speed['inference_rounds']} rounds, each at every beam "
                 f"size; the {speed['quantile']:g} quantile of the rounds), " if speed is not None else
                 "the median of 3 with all systems interleaved (the results of one call, without run records), "
                 if plan is None else
                 "each run timed alone right after its training (median of 3; not interleaved), ")
              + "relative to softmax's time at the same beam size. "
              f"Paper: {paper['inference']}.", "",
              "| output layer | " + " | ".join(f"beam {b}" for b in st["decoding"]["beams_timed"]) + " |",
              "| --- |" + " --- |" * len(st["decoding"]["beams_timed"])]
    base = S.get("softmax", {}).get("inference_seconds") or {}
    for s, rec in S.items():
        # relative to softmax at the same beam size (results.json of earlier versions stored ratios to the fastest)
        times = rec.get("inference_seconds") or {}
        norm = {b: v / base[b] for b, v in times.items() if base.get(b)}
        lines.append(f"| {display_name(s)} | " + " | ".join(_fmt(norm.get(str(b))) for b in st["decoding"]["beams_timed"]) + " |")
    lines += _per_sentence(speed, st, S)
    lines += ["", "## Claims checked", ""] + _claims(results) + _selection_claims(S, st)
    lines += ["", "## Discussion", ""] + _discussion(results) + ["", "## Figures", ""]
    lines += [f"![{f}]({f})" for f in figures]
    lines += ["", "## Example translations (1.5-ReLU)" if "alpha_relu" in S else "", ""]
    if "alpha_relu" in S:
        for ex in S["alpha_relu"]["examples"][:3]:
            lines += [f"- src: {ex['src']}", f"  - ref: {ex['ref']}", f"  - hyp: {ex['hyp']}"]
    lines += reproducibility(st, resume_test=RESUME_TEST, **_variation(S, st, split=plan is not None, speed=speed))
    return "\n".join(lines) + "\n"


def _variation(S: dict, st: dict, split: bool = False, speed: Optional[dict] = None) -> dict:
    """What this run measured of its own variation, for :func:`.._common.reproducibility`.

    Reruns: the test of killed and resumed runs (``RESUME_TEST``) runs a `smoke` run of two
    output layers twice with the same seed; with ``split`` (results built from run records)
    the sentence adds the test of calls that train the runs separately (``SPLIT_TEST``);
    nothing else is rerun, and no past run's numbers are kept.  The timing sentence gives the
    variation of the time per step between the evaluations of each run
    (:func:`step_time_variation`), the one measured in ``results.json``.
    """
    seeds = st.get("seeds", [st["seed"]])
    this = ("the other output layers were not repeated" if st.get("preset") == "smoke" else
            f"this `{st.get('preset')}` run was not repeated")
    out = {"rerun": ("a `smoke` run of softmax and 1.5-ReLU repeated with the same seed gives identical numbers, "
                     f"timings aside (the test of killed and resumed runs, below, runs it twice); {this}."
                     + (f" {SPLIT_TEST}" if split else ""))}
    spread = {s: r for s, r in S.items() if "bleu_std" in r}
    counts = sorted({len(r.get("seeds") or seeds) for r in spread.values()})
    over = f"the {len(spread)} output layers" + (f" with at least 2 seeds in (of {len(S)})" if len(spread) < len(S) else "")
    if len(counts) == 1:
        out["spread"] = seed_spread([r["bleu_std"] for r in spread.values()], counts[0], "BLEU", over)
    elif counts:
        stds = [r["bleu_std"] for r in spread.values()]
        out["spread"] = (f"standard deviation over {counts[0]}–{counts[-1]} seeds (the seeds in) "
                         f"{min(stds):.2f}–{max(stds):.2f} BLEU across {over} (the ± in the tables).")
    var = {s: step_time_variation(rec) for s, rec in S.items()}
    measured = {s: v for s, v in var.items() if v is not None}
    text = ("within each training run, the time per step between consecutive evaluations varied by "
            + ", ".join(f"{100 * v:.1f}% ({display_name(s)})" for s, v in measured.items())
            + " ((max − min) / mean over the run's evaluation intervals); " if measured else
            "the variation of the time per step within a run was not measured (fewer than two evaluations); ")
    if len(seeds) > 1:
        text += "the ± of s/step and tokens/s is their spread over the seeds' runs; "
    if speed is not None:
        tr = {s: e for s, e in speed["train"].items() if s != speed["reference"]}
        out["timings"] = text + (
            f"the speed ratios come from {speed['rounds']} rounds of interleaved timing, over which the per-round "
            "ratio to softmax ranged " + ", ".join(f"{e['round_ratios'][0]:.2f}–{e['round_ratios'][1]:.2f}× "
                                                   f"({display_name(s)})" for s, e in tr.items())
            + " (the 95% bootstrap intervals in the tables account for it); how much the timings vary between "
            "invocations was not measured.")
        return out
    if split:
        out["timings"] = text + ("how much the timings vary between invocations was not measured; the inference "
                                 "times of the systems were measured each in its own run, right after its training, "
                                 "not interleaved.")
        return out
    out["timings"] = text + ("how much the timings vary between invocations was not measured, and the inference "
                             "times were not compared between runs.")
    return out


def _seed_sections(results: dict) -> list:
    """Per-seed table and the paired bootstrap between systems."""
    S, st, plan = results["systems"], results["settings"], results.get("plan")
    seeds = plan["seeds"] if plan else st.get("seeds", [st["seed"]])
    owed = {(s, sd) for s, sd in plan["owed"]} if plan else set()
    sel = st["training"].get("select", "last") != "last"
    out = []
    if len(seeds) > 1 or sel:
        out += ["", "## Seeds and model selection", "",
                "Per training seed: test BLEU, empty-string rate on dev, the step of the kept model and the steps "
                "trained" + (" (training stops early when the validation BLEU has not improved for "
                             f"{st['training']['patience']} evaluations)" if sel else "") + ".", "",
                "| output layer | " + " | ".join(f"seed {sd}: BLEU / empty / kept / trained" for sd in seeds) + " |",
                "| --- |" + " --- |" * len(seeds)]
        for system in (plan["systems"] if plan else S):
            cells = []
            for sd in seeds:
                r = S.get(system, {}).get("seeds", {}).get(str(sd))
                if r is None and plan is not None:
                    cells.append("owed" if (system, sd) in owed else "—")
                    continue
                r = r or {}
                cells.append(f"{r.get('bleu', float('nan')):.2f} / {100 * r.get('empty_string_rate', float('nan')):.1f}% / "
                             f"{r.get('kept_step', '—')} / {r.get('steps_done', '—')}")
            out.append(f"| {display_name(system)} | " + " | ".join(cells) + " |")
    sig = results.get("significance")
    if sig:
        n_pairs, level = len(sig), bonferroni_threshold(sig)
        per_pair = len({tuple(r.get("seed_list", ())) for r in sig}) > 1  # pairs pooled over different seeds
        subset = plan is not None and sig[0].get("seed_list", seeds) != st.get("seeds")  # fewer than the seeds in
        pooled = ("; each pair pools the seeds both systems have in (column seeds): each sentence carries their "
                  "translations of those seeds, so BLEU here is that of the seeds' translations pooled into one corpus, "
                  "and a system's BLEU may differ from pair to pair" if per_pair else
                  f"; each sentence carries the translations of all {sig[0]['seeds']} seeds, so BLEU here is that of "
                  "the seeds' translations pooled into one corpus" if sig[0]["seeds"] > 1 else "")
        if subset and not per_pair:
            pooled += (f"; only seed{'s' * (sig[0]['seeds'] > 1)} {', '.join(map(str, sig[0]['seed_list']))} "
                       "of the seeds in, the ones the systems compared all have")
        out += ["", "## Significance of the BLEU differences (paired bootstrap)", "",
                f"Paired bootstrap resampling of the {sig[0]['sentences']} test sentences (Koehn, EMNLP 2004), "
                f"{sig[0]['n_samples']} draws, the statistic and p-value of sacreBLEU's paired bootstrap"
                + pooled
                + f". `*`: p < {LEVEL}" + (f"; `**`: p < {level:.4f} ({LEVEL} / {n_pairs} comparisons, Bonferroni)."
                                           if n_pairs > 1 else "."), "",
                "| A | B | BLEU A | BLEU B | A − B | 95% interval of A − B | p |" + (" seeds |" if per_pair else ""),
                "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if per_pair else "")]
        for r in sig:
            mark = "**" if n_pairs > 1 and r["p_value"] < level else ("*" if r["p_value"] < LEVEL else "")
            out.append(f"| {display_name(r['a'])} | {display_name(r['b'])} | {r['bleu_a']:.2f} | {r['bleu_b']:.2f} | {r['delta']:+.2f} | "
                       f"[{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}] | {r['p_value']:.4f}{mark} |"
                       + (f" {', '.join(map(str, r.get('seed_list', [])))} |" if per_pair else ""))
        out += ["", f"Ordering by mean test BLEU (`>`: the difference is significant at p < {level:.4f}, the threshold "
                "every claim below uses; `≈`: it is not): " + ordering(S, sig, level) + "."
                + (f" **Provisional:** {_in_and_owed(plan)}." if plan and not plan["complete"] else "")]
    return out


def _in_and_owed(plan: dict) -> str:
    """"5 of the 12 planned runs are in, 7 owed (softmax seed 2, ...)"."""
    n = len(plan["in"]) - len(plan["extra"]) + len(plan["owed"])
    owed = ", ".join(f"{display_name(s)} seed {sd}" for s, sd in plan["owed"])
    return f"{n - len(plan['owed'])} of the {n} planned runs are in, {len(plan['owed'])} owed ({owed})"


def _device_labels(results: dict) -> dict:
    """``{device: "D1", ...}`` in the order of the runs in."""
    return {d: f"D{i + 1}" for i, d in enumerate(dict.fromkeys(r["device"] for r in results.get("runs", [])))}


def _runs_section(results: dict) -> list:
    """The preset's systems × seeds: which runs are in (device and date) and which are owed."""
    plan, st = results["plan"], results["settings"]
    runs = {(r["system"], r["seed"]): r for r in results.get("runs", [])}
    owed = {(s, sd) for s, sd in plan["owed"]}
    labels = _device_labels(results)
    n = len(plan["in"]) - len(plan["extra"]) + len(plan["owed"])
    planned = [(s, sd) for s in plan["systems"] for sd in plan["seeds"] if (s, sd) in owed or
               ((s, sd) in runs and [s, sd] not in plan["extra"])]
    systems = list(dict.fromkeys(s for s, _ in planned))
    seeds = list(dict.fromkeys(sd for _, sd in planned))
    text = (f"The `{st['preset']}` preset plans {n} run{'s' * (n > 1)}: "
            + (f"{len(systems)} output layers × seeds {', '.join(map(str, seeds))}" if len(systems) * len(seeds) == n
               else ", ".join(f"{display_name(s)} seed {sd}" for s, sd in planned))
            + ". Each call trains some of them (`--runs system:seed`), on any machine, and leaves a run record of each "
            "finished run in `records/`; this report is built from all the records there. ")
    if plan["complete"]:
        text += "All of them are in."
    else:
        text += (f"{_in_and_owed(plan)}. Until they are in, everything below uses only the runs in: a mean ± standard "
                 "deviation only where at least 2 seeds of a system are in, the paired bootstrap only between systems "
                 "that are in (over the seeds both have), and the ordering of the systems and the comparison with "
                 "the paper are provisional.")
    if plan["extra"]:
        text += (" Runs beyond the plan are in too and count like the others: "
                 + ", ".join(f"{display_name(s)} seed {sd}" for s, sd in plan["extra"]) + ".")
    out = ["", "## Runs in and owed", "", text, "",
           "| output layer | " + " | ".join(f"seed {sd}" for sd in plan["seeds"]) + " |",
           "| --- |" + " --- |" * len(plan["seeds"])]
    for system in plan["systems"]:
        cells = []
        for sd in plan["seeds"]:
            r = runs.get((system, sd))
            code = f", code {_code(r)}" if r and r.get("code") else ""
            cells.append(f"in ({labels[r['device']]}, {str(r.get('finished') or '?')[:10]}{code})" if r else
                         "**owed**" if (system, sd) in owed else "—")
        out.append(f"| {display_name(system)} | " + " | ".join(cells) + " |")
    out.append("")
    for device, label in labels.items():
        mine = [r for r in runs.values() if r["device"] == device]
        versions = "; ".join(f"{k} {joined_distinct(r.get(k) for r in mine)}" for k in ("torch", "triton", "softargmax")
                             if any(r.get(k) for r in mine))
        computed = [r["precision"] for r in mine if r.get("precision")]
        out.append(f"- {label}: {device}" + (f", {joined_distinct(computed)}" if computed else "")
                   + f" ({len(mine)} run{'s' * (len(mine) > 1)}; {versions})")
    for code, mine in _by_code(runs.values()).items():
        git = mine[0]["code"]
        where = ("" if "git_revision" not in git else f": git {git['git_revision'][:12]}"
                 + (" with uncommitted changes" if git.get("git_dirty") else ""))
        out.append(f"- code {code}{where} ({len(mine)} run{'s' * (len(mine) > 1)})")
    mixed = _mixed_setups(runs.values())
    if mixed:
        out += ["", mixed]
    return out


def _code(run: dict) -> str:
    """A run's code digest, short (8 hex digits)."""
    return str(run["code"]["digest"])[:8]


def _by_code(runs: Iterable[dict]) -> dict:
    """``{short code digest: [runs]}`` of the runs that recorded their code, in their order."""
    out: dict = {}
    for r in runs:
        if r.get("code"):
            out.setdefault(_code(r), []).append(r)
    return out


def _mixed_setups(runs: Iterable[dict]) -> str:
    """One sentence when the runs in come from more than one version of the code, or more than one device type or
    precision (within a system's seeds too); ``""`` otherwise.  A flag, not a refusal: whether the differences
    touch what the report measures is for its reader to judge."""
    runs = list(runs)
    codes = [c if c else "not recorded" for c in dict.fromkeys(_code(r) if r.get("code") else None for r in runs)]
    kind = lambda r: f"{r.get('device_type') or '?'} in {r.get('precision') or 'a precision not recorded'}"  # noqa: E731
    kinds = list(dict.fromkeys(kind(r) for r in runs))
    parts = []
    if len(codes) > 1:
        parts.append(f"{len(codes)} versions of the library's code ({', '.join(codes)})")
    if len(kinds) > 1:
        systems = list(dict.fromkeys(r["system"] for r in runs))
        within = [s for s in systems if len({kind(r) for r in runs if r["system"] == s}) > 1]
        parts.append(f"{len(kinds)} device types or precisions ({'; '.join(kinds)})"
                     + (f", mixed within the seeds of {', '.join(display_name(s) for s in within)}" if within else ""))
    if not parts:
        return ""
    return (f"The runs in come from {' and '.join(parts)}: their results compare across these only if the "
            "differences did not touch what they measure.")


def _interval(entry: Optional[dict]) -> str:
    """A ratio to softmax with its 95% interval (:func:`.speed.ratio_summary`'s entry), or its ratio alone."""
    if not entry or entry.get("ratio") is None:
        return "–"
    return f"{entry['ratio']:.2f}×" + (f" [{entry['ci'][0]:.2f}–{entry['ci'][1]:.2f}]" if entry.get("ci") else "")


def _time_to_bleu(reached: Optional[dict]) -> list:
    """The table of the training time to one validation BLEU (:func:`.results.time_to_bleu`; none without it)."""
    if not reached:
        return []
    how = ("step × the interleaved time per step above, the ratio's 95% interval that of the step times scaled by "
           "the ratio of the steps" if reached["clock"] == "interleaved" else
           "each run's own training seconds at that evaluation (not interleaved: the machine's load may differ "
           "between systems)")
    lines = ["", f"Time to a validation BLEU of {reached['target']:.1f} (greedy; {100 * TARGET_SHARE:.0f}% of the "
             f"highest validation BLEU every system reaches; seed {reached['seed']}), the paper's Fig. 2 read in "
             f"wall time: the first evaluation at or above it, {how}. Evaluations are spaced, so a step count is "
             "exact only to the evaluation interval.", "",
             "| output layer | step | validation BLEU there | training time (s) | vs softmax [95% interval] |",
             "| --- | --- | --- | --- | --- |"]
    for s, e in reached["systems"].items():
        lines.append(f"| {display_name(s)} | {e['step']} | {e['val_bleu']:.2f} | {e['seconds']:.1f} | "
                     f"{_interval(e)} |")
    return lines


def _per_sentence(speed: Optional[dict], st: dict, S: dict) -> list:
    """Inference time per sentence at every beam from the interleaved timing, with the ratios to softmax and their
    95% intervals, in the order of the systems ``S`` (none without interleaved timing)."""
    if speed is None:
        return []
    n = st["decoding"]["timing_sentences"]
    beams = [str(b) for b in st["decoding"]["beams_timed"]]
    clock = ", of process CPU time (one torch thread)" if speed.get("clock") == "cpu" else ""
    lines = ["", f"Per sentence, timed interleaved (wall milliseconds: the {speed['quantile']:g} quantile of the "
             f"rounds / {n} sentences; ratio to softmax{clock} with its 95% bootstrap interval over the rounds):", "",
             "| output layer | " + " | ".join(f"beam {b}" for b in beams) + " |", "| --- |" + " --- |" * len(beams)]
    for s in [s for s in S if s in speed["inference_seconds"]]:
        per, ratios = speed["inference_seconds"][s], speed["inference"].get(s, {})
        lines.append(f"| {display_name(s)} | " + " | ".join(
            f"{1e3 * per[b] / n:.1f} ms, {_interval(ratios.get(b))}" if b in per else "–" for b in beams) + " |")
    return lines


def _timing_scope(results: dict) -> str:
    """Which runs the compared timings come from: one device only."""
    st = results["settings"]
    devices = st.get("devices") or {st["device"]: 1}
    if len(devices) == 1:
        return (f"All {sum(devices.values())} runs in ran on {st['device']}; times are compared only between runs on "
                "the same device (an H100 and an H200, say, are not compared).")
    others = ", ".join(f"{d} ({k} run{'s' * (k > 1)})" for d, k in devices.items() if d != st["device"])
    return (f"Times are compared only between runs on the same device: these are from the {devices[st['device']]} runs "
            f"on {st['device']}, the device with the most runs in; the runs on {others} enter no comparison of times "
            "(a system with no run on that device shows —).")


def _selection_claims(S: dict, st: dict) -> list:
    if st["training"].get("select", "last") == "last":
        return []
    c = check_selection(S, st)
    ok = not c["not_best"] and not c["trained_past_patience"]
    metric = "BLEU" if st["training"]["select"] == "bleu" else "loss"
    out = [f"- No validation curve rises while the kept model keeps training: in all {c['runs']} runs the kept model is "
           f"the evaluation with the best validation {metric} and training ended at most {st['training']['patience']} "
           f"evaluations after it: {'holds' if ok else 'does not hold (' + ', '.join(c['not_best'] + c['trained_past_patience']) + ')'}."]
    if c["best_at_step_limit"]:
        out.append(f"- The best validation {metric} came at the step limit in {', '.join(c['best_at_step_limit'])}: "
                   "these runs might have improved with more steps.")
    if metric == "BLEU":
        k = len(c["val_loss_rose_before_kept"])
        out.append(f"- Validation loss (the system's own loss) had already risen above its minimum at the kept step in "
                   f"{k} of {c['runs']} runs" + (" (the loss overfits before BLEU does)." if k else "."))
    return out


def _discussion(results: dict) -> list:
    """What this run can and cannot say about the paper's claims; every number is from ``results``."""
    S, st, paper = results["systems"], results["settings"], results["paper"]
    seeds = st.get("seeds", [st["seed"]])
    m = st["model"]
    scale = (f"- **Scale.** The model (d_model={m['d_model']}, {m['layers']}+{m['layers']} layers) "
             + ("has Transformer-base's size" if m["d_model"] >= 512 else "is much smaller than Transformer-base")
             + f", and the data are {st['data']['train']:,} short captions rather than the paper's IWSLT and WMT "
             "corpora, so absolute BLEU is not comparable with the paper's; what can be compared is the ordering of "
             "the output layers under identical settings and the qualitative effects.")
    scale += (" With one seed, the paired bootstrap measures only the noise of the test set: the noise of training "
              "(initialization, data order) is not measured, so even a significant difference may be a seed effect."
              if len(seeds) == 1 else
              f" With {len(seeds)} seeds, the significance section says which differences exceed the test-set noise; "
              "the standard deviations over seeds show the training noise.")
    lo, hi = paper_sorting_ratios(paper)
    var = [v for v in (step_time_variation(rec) for rec in S.values()) if v is not None]
    timed = results.get("speed")
    speed = ("- **Speed.** In the paper, sparsemax and 1.5-entmax, computed by sorting, took "
             f"{lo:.2f}–{hi:.2f}× the training time of softmax (Table 5); here both use this library's pruned Newton "
             f"solvers, so the remaining overhead is the solver on a {st['vocabulary']['size']}-word vocabulary. "
             + (f"The speed claims rest on the systems timed interleaved on {_timing_device(timed)} after training "
                f"({timed['rounds']} rounds; seed {timed['seed']}), so that a load on the machine that comes and goes "
                "falls on every system alike; a claim is decided only where the bootstrap interval of the ratio "
                "excludes its limit. The time axis of the training curves is steps × this interleaved time per "
                "step, not the wall clock of each run."
                if timed is not None else
                f"Per-step times come from {st['device']}, each run timed alone during its training"
                + (f" (within a run the time per step varied by up to {100 * max(var):.1f}% between evaluations)"
                   if var else "")
                + "; the systems were not timed interleaved, so the speed claims above are not shown."))
    out = [
        scale,
        speed,
        "- **Inference.** Decoding here recomputes the decoder over the prefix at every step (no cache) and stops a "
        "sentence when its best candidate ends (OpenNMT's rule); sparse output layers also end beams whose "
        "continuations all have probability zero, which shortens their searches. The paper's Fig. 4 measured the "
        "output layer's own cost on a GPU; here the output layer is a small share of decoding time.",
    ]
    if empty_string_verdict(S, st).startswith("holds"):
        out.append("- **Empty translations** are a property of the trained distributions and transfer to this setting: "
                   "the sparse output layers can give EOS exactly zero probability at the first step, a dense softmax "
                   "cannot.")
    if sparsity_verdict(S).startswith("does not hold"):
        out.append("- Unlike the paper (Figs. 5–6), 1.5-ReLU is *not* less sparse than 1.5-entmax here.")
    return out


def _claims(results: dict) -> list:
    """One line per claim of the paper: the verdict on this run, its numbers and the rule that gave it.

    Every verdict comes from ``results`` by a rule stated in the report: BLEU comparisons from
    the paired bootstrap at the Bonferroni threshold (:func:`beats_verdict`,
    :func:`as_good_verdict`), speed from the ratio of times per step against the measured
    step-time variation (:func:`speed_verdict`), empty strings, sparsity and τ by the rules
    of :func:`empty_string_verdict`, :func:`sparsity_verdict` and ``TAU_TOLERANCE``.
    """
    S, st, sig, paper = results["systems"], results["settings"], results.get("significance") or [], results["paper"]
    thr = bonferroni_threshold(sig)
    m = (f"{LEVEL} / {len(sig)} comparisons, Bonferroni" if len(sig) > 1 else "one comparison")
    plan = results.get("plan")
    out = [f"**Provisional:** {_in_and_owed(plan)}; the verdicts below use only the runs in and may change when the "
           "owed runs are in.", ""] if plan and not plan["complete"] else []
    out += [f"Rules: a BLEU comparison \"A beats B\" holds only when A's BLEU is higher and the paired bootstrap gives "
           f"p < {thr:.4f} ({m}); it does not hold when B's is higher "
           f"with such a p, and is not shown otherwise. \"As well as\" holds when the 95% interval of the difference "
           f"lies above −{BLEU_MARGIN} BLEU. A speed claim holds or does not hold only when the 95% bootstrap interval "
           "of the ratio, over rounds of interleaved timing, lies wholly on one side of its limit; otherwise it is "
           "not shown (noisy).", ""]
    if {"alpha_relu", "entmax15"} <= set(S):
        out.append(f"- 1.5-ReLU translates as well as 1.5-entmax (BLEU at most {BLEU_MARGIN} lower): "
                   f"{as_good_verdict(sig, 'alpha_relu', 'entmax15')}.")
    for other in ("softmax", "sparsemax"):
        if {"alpha_relu", other} <= set(S):
            out.append(f"- 1.5-ReLU beats {display_name(other)}: {beats_verdict(sig, 'alpha_relu', other)}.")
    if {"alpha_relu", "softmax"} <= set(S):
        out.append(f"- 1.5-ReLU trains as fast as softmax (at most {SPEED_MARGIN}× its time per step): "
                   f"{speed_verdict(S, 'alpha_relu', SPEED_MARGIN, results.get('speed'))}.")
    speed = results.get("speed")
    if {"alpha_relu", "softmax"} <= set(S) and speed is not None:
        for b, entry in (speed["inference"].get("alpha_relu") or {}).items():
            out.append(f"- 1.5-ReLU decodes as fast as softmax at beam {b} (at most {SPEED_MARGIN}× its time per "
                       f"sentence; Fig. 4): {ratio_verdict(entry, SPEED_MARGIN)}.")
    reached = (results.get("time_to_bleu") or {}).get("systems", {})
    if {"alpha_relu", "softmax"} <= set(reached) and speed is not None:
        out.append(f"- 1.5-ReLU reaches the validation BLEU of {results['time_to_bleu']['target']:.1f} in at most "
                   f"{SPEED_MARGIN}× softmax's training time (Fig. 2 in wall time): "
                   f"{ratio_verdict(reached['alpha_relu'] if 'ci' in reached['alpha_relu'] else None, SPEED_MARGIN)}.")
    lo, _ = paper_sorting_ratios(paper)
    for s in ("entmax15", "sparsemax"):
        if {s, "softmax"} <= set(S):
            out.append(f"- {display_name(s)} with this library's solvers trains faster, relative to softmax, than the paper's "
                       f"sorting ({lo:.2f}× at least): {speed_verdict(S, s, lo, results.get('speed'))}.")
    if "softmax" in S and len(S) > 1:
        out.append(f"- Sparse outputs avoid the empty-string problem (no sparse output layer prefers the empty "
                   f"translation on any of the {st['data']['dev_sentences_for_empty_rate']} dev sentences): "
                   f"{empty_string_verdict(S, st)} (softmax {100 * S['softmax']['empty_string_rate']:.1f}%, "
                   + ", ".join(f"{display_name(s)} {100 * S[s]['empty_string_rate']:.1f}%" for s in S if s != "softmax") + ").")
    if "alpha_relu" in S:
        su = S["alpha_relu"]["sum_per_step"]
        out.append(f"- 1.5-ReLU self-normalizes: Σ α-ReLU(z) per decoding step has mean {su.get('mean', 0):.3f}, "
                   f"5–95% range [{su.get('p5', 0):.3f}, {su.get('p95', 0):.3f}] (a measurement; the paper gives no "
                   "tolerance to judge it by).")
        a = S["alpha_relu"]
        d = a["tau"] - a["tau_formula"]
        out.append(f"- τ of the untrained model matches the data-free formula (Table 3; within {TAU_TOLERANCE}, half a "
                   f"unit of the table's two decimals): {'holds' if abs(d) <= TAU_TOLERANCE else 'does not hold'} "
                   f"({a['tau']:.4f} vs {a['tau_formula']:.4f}, difference {d:+.4f}).")
    if {"alpha_relu", "entmax15"} <= set(S):
        out.append(f"- 1.5-ReLU is less sparse than 1.5-entmax (Figs. 5–6; exact-zero share "
                   f"{S['alpha_relu']['zero_fraction']:.3f} vs {S['entmax15']['zero_fraction']:.3f}"
                   + (", first seed" if len(S["alpha_relu"].get("seeds", {})) > 1 else "")
                   + f"; holds when the mean shares over seeds differ by more than {SPARSITY_SE:g} standard errors): "
                   f"{sparsity_verdict(S)}.")
    return out


def summary_lines(results: dict) -> list:
    """The headline numbers for the end of a run's log, a few lines: BLEU per system (mean over its seeds), the
    time per training step against softmax with its 95% interval (the interleaved timing, else the runs' own),
    and the verdict on each claim of the paper (the rules are in the report's "Claims checked").
    """
    S = results["systems"]
    if not S:
        return []
    speed = (results.get("speed") or {}).get("train", {})
    seeds = {len(rec.get("seeds") or [rec.get("seed")]) for rec in S.values()}
    rows = [("system", "BLEU", "step time vs softmax")]
    for name, rec in S.items():
        ratio = rec.get("seconds_per_step_vs_softmax")
        ci = (speed.get(name) or {}).get("ci") or rec.get("seconds_per_step_vs_softmax_ci")
        time = "" if ratio is None else f"{ratio:.2f}×" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci and name != "softmax"
                                                            else "")
        rows.append((display_name(name), f"{rec['bleu']:.2f}", time))
    lines = [f"summary ({max(seeds)} seed{'s' * (max(seeds) > 1)} per system; BLEU on the test set, step time with "
             "its 95% interval):"]
    lines += summary_table(rows)
    for claim in _claims(results):
        found = re.match(r"- (.+?): (holds|does not hold|not shown)\b", claim)
        if found:
            text = re.sub(r" \([^()]*\)$", "", found.group(1))
            lines.append(f"  {found.group(2):>13}: {text}")
    return lines
