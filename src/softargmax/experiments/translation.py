r"""Reproduce "Speeding Up Entmax" on real translation data.

Tezekbayev, Nikoulina, Gallé & Assylbekov, "Speeding Up Entmax", Findings of NAACL 2022,
https://arxiv.org/abs/2111.06832.

``softargmax reproduce translation --preset {smoke,default,full,gpu,gpu-1call}`` trains the same
Transformer with four output layers under identical settings and seeds — softmax +
cross-entropy, sparsemax + sparsemax loss, 1.5-entmax + 1.5-entmax loss, 1.5-ReLU +
1.5-ReLU loss (τ from the untrained model's first batch) — on Multi30k De→En, and
reports, beside the paper's numbers: test BLEU (Table 1), training curves against
steps and wall-clock (Figs. 2–3), time per step and tokens/s (Table 5), inference time
against beam size (Fig. 4), the empty-string rate on dev (Table 2), the exact-zero
share per decoding step (Figs. 5–6), :math:`\sum_j \alpha\text{-ReLU}(z)_j` per decoding step (Fig. 9) and τ
against the data-free formula (Table 3).

Presets:

* ``smoke`` (seconds, CI), ``default`` (minutes on a CPU: d_model 128, 2+2 layers, 500
  steps) and ``full`` (Transformer-base, 20000 steps; it overfits Multi30k long before
  the end) train a fixed number of steps, one seed, and keep the last model.
* ``gpu`` (one H100/H200): Transformer-base (d_model 512, 6+6 layers, 8 heads, FF 2048,
  10k joint BPE), batches of 8192 target tokens, at most 1600 steps, three seeds
  (``--seeds`` to add more, ``--runs`` to train some of the runs, see below).  Settings
  for 29k training sentences: dropout 0.3, AdamW with decoupled weight decay 0.01, noam
  schedule (warm-up 400, factor 0.5: peak learning rate 1.1e-3), no label smoothing (as
  in the paper; it would also make the targets of the sparse output layers dense).  Every
  200 steps the model is evaluated on the validation set (loss on all 1014 sentences,
  greedy BLEU on 500); the kept model is the one with the best validation BLEU and
  training stops after 2 evaluations without improvement, so no reported model trained
  on while its validation BLEU fell.  The Transformer runs
  under bfloat16 autocast with TF32 matrix products; losses are computed in float32.
  The report adds mean ± standard deviation over seeds of BLEU, the empty-string rate,
  the step time and τ, a per-seed table with the kept step, the validation curves of
  every run with the kept model marked, and a paired bootstrap test (Koehn, EMNLP 2004,
  pooled over seeds, see :mod:`.nmt.significance`) between every two systems.
* ``gpu-1call`` (one H100/H200, the four systems of one seed in one command of at most 9 minutes): the
  ``gpu`` preset's model, vocabulary, batches, schedule, regularization and precision, but 500 steps
  without model selection or early stopping (the last model is tested), an evaluation every 100 steps with
  greedy BLEU on 200 validation sentences (the curves of the time to a validation BLEU), the empty-string
  rate on 100 validation sentences, and inference timed on 32 test sentences at beams 1, 4, 16: once per run,
  then interleaved across the systems (:func:`time_speed`), whose ratios the report's verdicts use.  Seeds 1,
  2, 3 are planned; a call trains one seed (``--runs softmax:1 sparsemax:1 entmax15:1 alpha_relu:1``) and
  later calls add the others into the same folder (its own: the setups of ``gpu`` and ``gpu-1call`` differ,
  and records of another setup are refused).  Its time is estimated, not measured, in the translation guide.

Run records.  Every finished run (one system, one seed) writes a *run record*,
``<out>/records/<system>-seed<n>.json`` (:func:`make_record`, a few hundred kB, written
atomically): its test BLEU and translations, validation curves, kept step, timings,
decoding statistics, inference times, device (and its type, with the precision in effect:
bfloat16 autocast and TF32 apply on CUDA only), versions, the code that ran
(:func:`._common.code_identity`: a digest of the library's source files, and its git
revision where there is one) and fingerprint, everything the report needs without the
model.  Every call then rebuilds ``results.json``, the figures and ``report.md`` from
*all* the records in ``<out>/records`` (:func:`rebuild`; ``--render-only`` does that
alone, without data or a GPU), so the ``gpu`` preset's 4 systems × 3 seeds can be trained
a few runs per call (``--runs softmax:1 entmax15:2``), by several sessions on several
machines, into one report.  Records of another setup (preset, overrides, resolved
settings, data, vocabulary) are refused by name; a rerun of the same system and seed
replaces its record.  Records of other code, another device type or another precision are
merged, and the report says so above its results: their numbers compare only where those
differences do not touch what is measured.  The report lists the runs in (device, date,
code digest) and those the preset still owes (:func:`.nmt.plan.planned_runs`), computes
its statistics over the runs in, says so, and marks the ordering and the comparison with
the paper provisional until every run is in; times are compared only between runs on the
same device.

Speed.  After training, the finished runs of one seed are timed *interleaved*
(:func:`time_speed`, :mod:`.nmt.speed`): in short alternating rounds every system runs a few
training steps on the same batches and translates the same sentences at every beam size, so a
load on the machine that comes and goes falls on all of them alike.  The report's speed ratios
are a low quantile of the rounds with a bootstrap interval, and a speed claim is decided only
where the interval excludes its limit; the training curves against time use this interleaved
time per step.  The timing is kept in ``<out>/records/speed/interleaved.json`` and redone when
a run it timed is trained again.

Under ``torchrun --nproc_per_node N softargmax reproduce translation …`` training is data
parallel (``DistributedDataParallel``, :mod:`.nmt.distributed`): every global batch is
split over the N processes, so the optimizer sees the same batches as one process; rank
0 evaluates and writes the report, which states the number of processes.

Multi30k (29k training pairs of image captions) is a small stand-in for IWSLT'14 and
WMT, which are not available offline; the report says so.

This module holds the experiment's entry points: the presets, :func:`run` (training the
runs and writing their records), :func:`rebuild` and :func:`render` (``--render-only``).
The rest is in :mod:`.nmt`: which runs to train and which are owed (:mod:`.nmt.plan`), the
run records turned into ``results.json`` (:mod:`.nmt.results`), the verdicts on the paper's
claims (:mod:`.nmt.verdicts`), the report's text (:mod:`.nmt.report`) and its figures
(:mod:`.nmt.figures`).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Collection, Iterable, Optional, Sequence, Union

import torch

from softargmax.divergences import DIVERGENCE_NAMES

from . import _progress as progress
from ._allocator import keep_freed_memory
from ._common import (
    Log,
    atomic_json,
    begin,
    check_checkpoint,
    code_identity,
    data_digest,
    describe_device,
    environment,
    fingerprint,
    finish,
    load_checkpoint,
    read_records,
    record_path,
    render_existing,
    write_record,
)
from ._records import FORMAT as RECORD_FORMAT
from ._records import check_records, pack
from .nmt import data as nmt_data
from .nmt import distributed
from .nmt.data import Parallel
from .nmt.decoding import DecodeStats, empty_string_scores, pad_batch, translate
from .nmt.figures import write_figures
from .nmt.model import SYSTEMS, ModelConfig
from .nmt.plan import parse_runs, planned_runs, selected_runs
from .nmt.report import RESUME_TEST, render_report, summary_lines
from .nmt.results import results_from_records
from .nmt.tokenizer import EOS, Tokenizer
from .nmt.training import TrainConfig, make_batches, tensors, train_system
from .nmt.verdicts import (
    BLEU_MARGIN,
    LEVEL,
    SPARSITY_SE,
    SPEED_MARGIN,
    TAU_TOLERANCE,
    bonferroni_threshold,
    check_selection,
    ordering,
)

__all__ = [
    # the experiment: its presets, its runs and their records, the report rebuilt from them
    "PRESETS", "PRESET_KEYS", "EXPERIMENT", "SYSTEM_NAMES", "DERIVED", "Data", "load_data", "evaluate_system", "time_inference",
    "preset_settings", "run", "run_setup", "check_records", "RECORD_ABOUT", "make_record", "rebuild", "render",
    "time_speed", "SPEED_FILE", "SPEED_ROUNDS", "JobEstimate", "OVERHEAD_RATIO",
    # re-exported from .nmt, where they are defined: the command line (--render-only), the other experiments and
    # the tests use them as translation.X
    "SYSTEMS", "parse_runs", "selected_runs", "planned_runs", "results_from_records", "write_figures",
    "render_report", "RESUME_TEST", "LEVEL", "BLEU_MARGIN", "SPEED_MARGIN", "TAU_TOLERANCE", "SPARSITY_SE",
    "bonferroni_threshold", "check_selection", "ordering",
]

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        train=300, val=40, test=40, vocab=250,
        model=dict(d_model=32, heads=2, layers=1, ff=64, dropout=0.1),
        train_cfg=dict(steps=20, batch_tokens=600, warmup=10, lr=0.3, eval_every=20, val_bleu_sentences=20),
        beam=2, beams=(1, 2), timing_sentences=20, dev_sentences=40,
    ),
    "default": dict(
        train=None, val=None, test=None, vocab=3000,
        model=dict(d_model=128, heads=4, layers=2, ff=512, dropout=0.1),
        train_cfg=dict(steps=500, batch_tokens=2000, warmup=200, lr=0.3, eval_every=100, val_bleu_sentences=100),
        beam=4, beams=(1, 2, 4, 8), timing_sentences=50, dev_sentences=400,
    ),
    "full": dict(
        train=None, val=None, test=None, vocab=10000,
        model=dict(d_model=512, heads=8, layers=6, ff=2048, dropout=0.1),
        train_cfg=dict(steps=20000, batch_tokens=8192, warmup=4000, eval_every=1000, val_bleu_sentences=500),
        beam=5, beams=(1, 2, 4, 8, 16), timing_sentences=500, dev_sentences=None,
    ),
    # one H100/H200: Transformer-base, 4 systems x 3 seeds, validation-based model selection
    "gpu": dict(
        train=None, val=None, test=None, vocab=10000,
        model=dict(d_model=512, heads=8, layers=6, ff=2048, dropout=0.3),
        train_cfg=dict(steps=1600, batch_tokens=8192, warmup=400, lr=0.5, eval_every=200, val_bleu_sentences=500,
                       weight_decay=0.01, label_smoothing=0.0, select="bleu", patience=2, bf16=True,
                       save_every_eval=False),
        beam=5, beams=(1, 4, 16), timing_sentences=200, dev_sentences=None,
        systems=SYSTEMS, seeds=(1, 2, 3), tf32=True, bootstrap_samples=1000,
    ),
    # one H100/H200 in one command of at most 9 minutes: the gpu preset's model, batches, schedule and precision,
    # the four systems of one seed per call (seeds 1, 2, 3 planned, records merged), a fixed number of steps
    # (no model selection, no early stopping), fewer sentences per evaluation, a small timing set; the inference
    # speed comes from the interleaved timing after training (each run times itself once only)
    "gpu-1call": dict(
        train=None, val=None, test=None, vocab=10000,
        model=dict(d_model=512, heads=8, layers=6, ff=2048, dropout=0.3),
        train_cfg=dict(steps=500, batch_tokens=8192, warmup=400, lr=0.5, eval_every=100, val_bleu_sentences=200,
                       weight_decay=0.01, label_smoothing=0.0, select="last", bf16=True, save_every_eval=False),
        beam=5, beams=(1, 4, 16), timing_sentences=32, dev_sentences=100, inference_repeats=1,
        systems=SYSTEMS, seeds=(1, 2, 3), tf32=True, bootstrap_samples=1000,
    ),
}

#: keys a preset may hold (``run(overrides=...)`` accepts these); a preset with ``seeds`` plans its ``systems``
#: × ``seeds`` runs, which several calls may train (:func:`.nmt.plan.planned_runs`)
PRESET_KEYS = {"train", "val", "test", "vocab", "model", "train_cfg", "beam", "beams", "timing_sentences",
               "dev_sentences", "systems", "seeds", "tf32", "bootstrap_samples", "inference_repeats"}


#: this experiment's name on the command line (``softargmax reproduce translation``), in its checkpoints' fingerprints
EXPERIMENT = "translation"

#: the names ``--systems`` takes: the four output layers and ``f:<divergence>``, the f-divergence softargmax of any
#: divergence without a parameter (the command line checks them before any work)
SYSTEM_NAMES = SYSTEMS + tuple(f"f:{d}" for d in DIVERGENCE_NAMES if d != "alpha")

#: what a run derives in its output folder (``--fresh`` moves it aside): checkpoints, run records and the tokenizer
DERIVED = ("runs", "records", "spm.model", "spm.json")


#: ``load_data``'s ``(folder, train, val, test, dev, tokenizer)``
Data = tuple[Path, Parallel, Parallel, Parallel, Parallel, Tokenizer]


def load_data(P: dict, data_dir: Optional[str], download: bool, out_dir: Path, seed: int, log: Log = print) -> Data:
    """Multi30k splits cut to the preset's sizes and the joint BPE tokenizer (trained once, kept in ``out_dir``).

    The tokenizer is ``out_dir/spm.model``, with the settings it was learned with in
    ``out_dir/spm.json`` (vocabulary size, training sentences, data digest); one learned with
    other settings (another preset's) is learned again, never reused.  Both are written
    atomically.  Returns ``(folder, train, val, test, dev, tokenizer)``; ``dev`` is the head of ``val``.
    """
    folder = nmt_data.find(data_dir, download_missing=download, log=log)
    train = nmt_data.read_split(folder, "train").head(P["train"])
    val = nmt_data.read_split(folder, "val").head(P["val"])
    test = nmt_data.read_split(folder, "test").head(P["test"])
    dev = val.head(P["dev_sentences"])
    log(f"Multi30k De→En from {folder}: train {len(train)}, val {len(val)}, test (test_2016_flickr) {len(test)}")
    tok_path, about_path = out_dir / "spm.model", out_dir / "spm.json"
    about = {"vocab": P["vocab"], "sentences": len(train), "data": data_digest(["multi30k"])}
    try:
        kept = json.loads(about_path.read_text(encoding="utf-8")) if tok_path.exists() else None
    except (OSError, ValueError):
        kept = None
    tok = None
    if kept == about:
        try:
            tok = Tokenizer.load(tok_path)
        except (OSError, RuntimeError) as e:
            log(f"tokenizer {tok_path} cannot be read ({e}): learning it again")
    elif tok_path.exists():
        log(f"tokenizer {tok_path} was learned with other settings ({kept or 'unknown'}, this run: {about}): "
            "learning it again")
    if tok is None:
        tok = Tokenizer.train(train.src + train.tgt, P["vocab"], seed=seed)
        tok.save(tok_path)
        atomic_json(about_path, about)
    log(f"joint sentencepiece BPE vocabulary: {len(tok)} pieces")
    return folder, train, val, test, dev, tok


def evaluate_system(trained: dict, tok: Tokenizer, test: Parallel, dev: Parallel, preset: dict, device: str,
                    log: Log = print) -> dict:
    """BLEU with decoding statistics, the empty-string rate and inference time against beam size."""
    import sacrebleu

    model, layer, record = trained["model"], trained["layer"], dict(trained["record"])
    system = layer.system
    stats = DecodeStats()
    t0 = time.perf_counter()
    hyps = translate(model, layer, tok, test.src, beam=preset["beam"], stats=stats, device=device)
    record["test_decode_seconds"] = time.perf_counter() - t0
    bleu = sacrebleu.BLEU()
    record["bleu"] = bleu.corpus_score(hyps, [test.tgt]).score
    record["bleu_signature"] = str(bleu.get_signature())
    record["zero_fraction"] = stats.zero_fraction
    record["zeros_per_step"] = _summary(stats.zeros)
    record["sum_per_step"] = _summary(stats.sums)
    record["examples"] = [{"src": s, "ref": r, "hyp": h} for s, r, h in list(zip(test.src, test.tgt, hyps))[:5]]
    record["_hyps"] = hyps
    log(f"[{system}] test BLEU {record['bleu']:.2f} (beam {preset['beam']}), zero share {stats.zero_fraction:.3f}")

    # empty string vs the beam hypothesis on dev (Table 2)
    dev_hyps, dev_scores = translate(model, layer, tok, dev.src, beam=preset["beam"], device=device, return_scores=True)
    empty: list[float] = []
    ids = tok.encode(dev.src)
    for start in range(0, len(ids), 64):
        src = pad_batch([s[: model.cfg.max_len - 2] + [EOS] for s in ids[start : start + 64]], device)
        empty.extend(empty_string_scores(model, layer, src))
    record["empty_string_rate"] = sum(e > s for e, s in zip(empty, dev_scores)) / len(dev_scores)
    record["empty_hypotheses_dev"] = sum(h.strip() == "" for h in dev_hyps) / len(dev_hyps)

    record["_stats"] = stats
    return record


def time_inference(trained: dict, tok: Tokenizer, test: Parallel, preset: dict, device: str, repeats: int = 3) -> dict:
    """Seconds to translate the timing subset at each beam size, per run in ``trained`` (Fig. 4): the median of ``repeats``.

    :func:`run` calls it with one run, right after that run's training and evaluation, so
    each run is timed alone, on the machine it trained on; the beam sizes alternate within
    each repeat.  Runs timed by different calls (or machines) are compared only when their
    records name the same device (:mod:`.nmt.results`).
    """
    sub = test.head(preset["timing_sentences"])
    times: dict[str, dict[str, list[float]]] = {s: {str(b): [] for b in preset["beams"]} for s in trained}
    for _ in range(repeats):
        for b in preset["beams"]:
            for system, tr in trained.items():
                t0 = time.perf_counter()
                translate(tr["model"], tr["layer"], tok, sub.src, beam=b, device=device)
                times[system][str(b)].append(time.perf_counter() - t0)
    return {s: {b: statistics.median(v) for b, v in per.items()} for s, per in times.items()}


def _summary(values: Sequence[float]) -> dict:
    if not values:
        return {}
    v = sorted(values)
    q = lambda f: v[min(len(v) - 1, int(f * (len(v) - 1)))]  # noqa: E731
    return {"n": len(v), "mean": statistics.fmean(v), "p5": q(0.05), "median": q(0.5), "p95": q(0.95), "min": v[0], "max": v[-1]}


def preset_settings(preset: str, overrides: Optional[dict] = None) -> dict:
    """The preset's settings with ``overrides`` applied (``model`` and ``train_cfg`` are merged key by key)."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    P = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS[preset].items()}
    for key, value in (overrides or {}).items():
        if key not in PRESET_KEYS:
            raise ValueError(f"overrides: unknown key {key!r}; accepted: {', '.join(sorted(PRESET_KEYS))}")
        P[key] = {**P.get(key, {}), **value} if key in ("model", "train_cfg") else value
    return P


def run(
    preset: str = "default",
    data_dir: Optional[str] = None,
    out: str = "runs/translation",
    device: str = "cpu",
    seed: int = 0,
    systems: Optional[Collection[str]] = None,
    download: bool = False,
    threads: Optional[int] = None,
    log: Log = print,
    seeds: Optional[Sequence[int]] = None,
    overrides: Optional[dict] = None,
    checkpoint_every: Optional[int] = None,
    runs: Optional[Iterable[Any]] = None,
) -> dict:
    """Train the chosen runs, write a run record of each, and rebuild the report from every record in ``out``.

    Args:
        preset: ``smoke``, ``default``, ``full``, ``gpu`` or ``gpu-1call`` (:data:`PRESETS`).
        data_dir: the folder holding Multi30k (see :mod:`.datasets`).
        out: the output folder.
        device: ``cpu``, ``cuda``, ...
        seed: the seed of presets that name none.
        systems: the output layers to train (default: the preset's, else all four), each with
            every seed.
        download: fetch missing data.
        threads: torch CPU threads.
        log: where progress lines go.
        seeds: the seeds (default: the preset's, else ``[seed]``).
        overrides: settings that replace the preset's (:func:`preset_settings`), e.g. to run
            the ``gpu`` preset at toy size.
        checkpoint_every: an extra checkpoint every this many steps.
        runs: instead of ``systems`` × ``seeds``, the runs to train: ``"system:seed"``
            strings or pairs (:func:`.nmt.plan.parse_runs`).

    Returns:
        the content of ``results.json``, built from every run record in ``out/records``
        (``{}`` on the ranks other than 0 under ``torchrun``).

    Each finished run writes ``out/records/<system>-seed<n>.json``
    (:func:`.._records.record_path`, atomically): everything the report needs without the
    model (:func:`make_record`).  A run of the same system and seed again replaces its
    record.  The report (``results.json``, figures, ``report.md``) is then rebuilt from all
    records there (:func:`rebuild`), so calls that train different runs into one folder, on
    different machines, add up to one report, which lists the runs still owed.  Before
    anything is trained, every record already there is checked against this run's setup
    (experiment, preset, overrides, resolved settings, data, vocabulary, test references):
    one of another setup raises :class:`.._records.RecordMismatchError`, naming the file and
    the differing fields.

    Training resumes from the checkpoints in ``out/runs/<system>/seed<n>`` (one folder per
    run, whichever runs a call trains) and writes one at every
    evaluation, every ``checkpoint_every`` steps when given, and at the end
    (:func:`.nmt.training.train_system`).  A resumed run gives the numbers of an
    uninterrupted one.  Every checkpoint there is first checked against its run's
    fingerprint (experiment, preset, system, seed, data, library version, overrides): one of
    another run raises :class:`._common.CheckpointMismatchError`.  Under ``torchrun
    --nproc_per_node N`` training is data parallel over N processes
    (:mod:`.nmt.distributed`); rank 0 evaluates and writes.  On the CPU, glibc's ``malloc`` keeps the
    memory it frees (:func:`._allocator.keep_freed_memory`; the records' ``environment`` says whether it
    did): a training step of the ``default`` preset's model (one thread, 80 × 25 target tokens) reuses its buffers
    instead of faulting in 1,000 to 13,000 fresh pages, 2-6% of its time (medians of 40 steps, 2026-12-05).
    """
    P = preset_settings(preset, overrides)
    pairs = selected_runs(P, seed, systems, seeds, runs)
    _, out_dir, t_all = begin(preset, PRESETS, list(dict.fromkeys(s for s, _ in pairs)), SYSTEM_NAMES, threads, out,
                              what=EXPERIMENT, device=device)
    prints = {(system, sd): fingerprint(EXPERIMENT, preset, system, sd, data=["multi30k"], overrides=overrides or {})
              for system, sd in pairs}
    for (system, sd), fp in prints.items():  # refuse another run's checkpoints before any work
        check_checkpoint(_run_dir(out_dir, system, sd) / "checkpoint.pt", fp)
    owns_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    ctx = distributed.setup(device)
    device = ctx.device
    if not ctx.main:
        log = lambda *a, **k: None  # noqa: E731
    for system in dict.fromkeys(s for s, _ in pairs):
        old = out_dir / "runs" / system.replace(":", "_") / "checkpoint.pt"
        if old.exists():  # the layout of earlier versions with one seed per call
            log(f"{old} is a checkpoint in the layout of an earlier softargmax (one folder per system); runs keep "
                f"theirs in {old.parent}/seed<n> and do not use it: move it (and checkpoint.prev.pt) into the "
                "folder of its seed to resume from it")
    # on the CPU, freed buffers stay in the process: a training step reuses them instead of faulting in fresh pages
    kept_memory = device.startswith("cpu") and keep_freed_memory()
    tf32 = bool(P.get("tf32")) and device.startswith("cuda")
    old_precision = torch.get_float32_matmul_precision()
    if tf32:
        torch.set_float32_matmul_precision("high")
    try:
        # rank 0 learns the vocabulary; the other ranks load it.  The tokenizer's seed is the plan's
        # first (BPE ignores it), so that every call into a folder learns the same vocabulary
        tok_seed = next(iter(P.get("seeds") or [pairs[0][1]]))
        if ctx.main:
            data = load_data(P, data_dir, download, out_dir, tok_seed, log)
        distributed.barrier()
        if not ctx.main:
            data = load_data(P, data_dir, download, out_dir, tok_seed, log)
        folder, train, val, test, dev, tok = data
        model_cfg = ModelConfig(vocab_size=len(tok), **P["model"])
        setup = run_setup(preset, overrides, P, tok, test.tgt)
        earlier = check_records(out_dir, setup)  # refuse records of another setup before any training
        complete = False
        if runs is None:  # a call again into the same folder: the runs with a record are done
            pairs, complete = _runs_left(pairs, earlier, out_dir, log)
        autocast = TrainConfig(**P["train_cfg"]).autocast(device)
        common = {"settings": _settings_block(P, model_cfg, folder, train, val, test, dev, tok),
                  "environment": {**_env_with_precision(environment(t_all, device), device, autocast, tf32),
                                  **_versions(), "code": code_identity(), "malloc_keeps_freed_memory": kept_memory}}
        common["environment"].pop("total_seconds")
        if pairs:
            _train_runs(ctx, pairs, P, model_cfg, data, out_dir, log, prints, checkpoint_every, setup, common, earlier,
                        preset)
        if not ctx.main:
            return {}
        # only rank 0 gets here: it alone times the systems interleaved and writes results.json, the figures, report.md
        time_speed(out_dir, preset, overrides, P, model_cfg, data, setup, ctx.device, log, say_kept=not complete)
        results = rebuild(out_dir, log, setup=setup, t_start=t_all, rebuilt=complete)
        for line in summary_lines(results):
            log(line)
        return results
    finally:
        if tf32:
            torch.set_float32_matmul_precision(old_precision)
        if owns_group:
            distributed.teardown()


#: the interleaved timing per preset (:mod:`.nmt.speed`): rounds of training steps, steps per round, rounds of
#: translation at every beam size
SPEED_ROUNDS = {"smoke": dict(rounds=3, steps=1, inference_rounds=1),
                "default": dict(rounds=10, steps=3, inference_rounds=3),
                "gpu-1call": dict(rounds=10, steps=3, inference_rounds=3)}
#: where the interleaved timing is kept: beside the run records (not read as one), so that the report rebuilt from the
#: records alone (``--render-only``, records copied from other machines) keeps it, and ``--fresh`` moves it aside
SPEED_FILE = Path("records") / "speed" / "interleaved.json"


def _kept_model(out_dir: Path, system: str, seed: int, fp: dict, P: dict, model_cfg: ModelConfig, device: str,
                log: Log) -> Optional[tuple]:
    """``(model, layer)`` of a finished run, from its checkpoints (the kept model: ``best.pt`` under model
    selection, else the last checkpoint's); ``None`` when the run has no checkpoint here."""
    from .nmt.model import OutputLayer, Seq2Seq

    run_dir = _run_dir(out_dir, system, seed)
    state = load_checkpoint(run_dir / "checkpoint.pt", fp, map_location=device, log=log, set_aside=False,
                            label=f"[{system}] ")
    if state is None:
        return None
    model = Seq2Seq(model_cfg).to(device)
    weights = state["model"]
    if TrainConfig(**P["train_cfg"]).select != "last" and (run_dir / "best.pt").exists():
        weights = torch.load(run_dir / "best.pt", map_location=device, weights_only=True)["model"]
    model.load_state_dict(weights)
    model.eval()
    layer = OutputLayer(system, label_smoothing=P["train_cfg"].get("label_smoothing", 0.0))
    layer.tau = state["record"].get("tau", 0.0)
    return model, layer


def time_speed(out_dir: Path, preset: str, overrides: Optional[dict], P: dict, model_cfg: ModelConfig, data: Data,
               setup: dict, device: str, log: Log = print, say_kept: bool = True) -> Optional[dict]:
    """Time the finished runs of one seed interleaved (:func:`.nmt.speed.time_interleaved`) into
    ``out/records/speed/interleaved.json`` (:data:`SPEED_FILE`).

    The seed is the first, in the order of the plan, with at least two systems that have a
    run record and a checkpoint here.  The file names the runs it timed (each record's
    ``finished``): it is kept while they stay the same, and timed again when one was trained
    again (a line says which it was; ``say_kept=False``: nothing is said of a timing kept).  Returns what was written
    (or kept); ``None`` when no seed has two such runs.
    """
    from .nmt import speed

    _, train, _, test, _, tok = data
    records = check_records(out_dir, setup)
    seeds = list(dict.fromkeys(sd for _, sd in records))
    chosen = None
    for sd in seeds:
        runs = {s: rec["finished"] for (s, seed_), (_, rec) in records.items()
                if seed_ == sd and (_run_dir(out_dir, s, sd) / "checkpoint.pt").exists()}
        if len(runs) >= 2:
            chosen = sd, runs
            break
    if chosen is None:
        return None
    sd, runs = chosen
    device_name = describe_device(device)
    path = out_dir / SPEED_FILE
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kept = None
    about = {"setup": setup, "seed": sd, "runs": runs, "device": device_name}
    if isinstance(kept, dict) and all(kept.get(k) == v for k, v in about.items()):
        if say_kept:
            log(f"the speed of these runs was timed already ({path})")
        return kept
    systems = {}
    for s in runs:
        fp = fingerprint(EXPERIMENT, preset, s, sd, data=["multi30k"], overrides=overrides or {})
        got = _kept_model(out_dir, s, sd, fp, P, model_cfg, device, log)
        if got is not None:
            systems[s] = got
    cfg = TrainConfig(seed=sd, **P["train_cfg"])
    sub = train.head(2000)
    pairs, batches = make_batches(tok.encode(sub.src), tok.encode(sub.tgt), cfg.batch_tokens, sd, cfg.max_len)
    rounds = SPEED_ROUNDS.get(preset, dict(rounds=10, steps=3, inference_rounds=3))
    timing_sub = test.head(P["timing_sentences"])
    timing = speed.time_interleaved(
        systems, [tensors(pairs, b, device) for b in batches[: rounds["steps"]]],
        lambda model, layer, beam: translate(model, layer, tok, timing_sub.src, beam=beam, device=device),
        P["beams"], device=device, log=log, **rounds)
    result = {**about, "format": 1, "timing": timing,
              "about": "the finished runs of one seed timed interleaved (softargmax.experiments.nmt.speed)"}
    atomic_json(path, result)
    return result


def _run_dir(out_dir: Path, system: str, seed: int) -> Path:
    """Where one training run keeps its checkpoints: ``runs/<system>/seed<n>``, whichever runs a call trains (so a
    later call that trains some of them finds theirs)."""
    return out_dir / "runs" / system.replace(":", "_") / f"seed{seed}"


def run_setup(preset: str, overrides: Optional[dict], P: dict, tok: Tokenizer, refs: Sequence[str]) -> dict:
    """What the runs merged into one report must share: the ``setup`` of a run record.

    Args:
        preset: the preset's name.
        overrides: the overrides given to :func:`run`.
        P: the resolved settings (:func:`preset_settings`): a preset edited between two
            calls gives other settings under the same name.
        tok: the learned tokenizer (its :meth:`.nmt.tokenizer.Tokenizer.digest`).
        refs: the test set's references.

    Returns:
        ``{"experiment", "preset", "overrides", "data", "settings", "vocabulary",
        "test_references"}`` as plain JSON data; ``data`` is the digest of the data's SHA-256
        table (:func:`._common.data_digest`), ``test_references`` the SHA-256 of the references.
    """
    return json.loads(json.dumps({
        "experiment": EXPERIMENT, "preset": preset, "overrides": overrides or {}, "data": data_digest(["multi30k"]),
        "settings": P, "vocabulary": {"size": len(tok), "digest": tok.digest()},
        "test_references": hashlib.sha256("\n".join(refs).encode("utf-8")).hexdigest()[:16],
    }, sort_keys=True))


def _settings_block(P: dict, model_cfg: ModelConfig, folder: Path, train: Parallel, val: Parallel, test: Parallel,
                    dev: Parallel, tok: Tokenizer) -> dict:
    """What ``results["settings"]`` says of the data, the vocabulary, the model and decoding (the same for every run)."""
    return {
        "data": {"name": "Multi30k task 1, De→En", "folder": str(folder), "train": len(train), "val": len(val),
                 "test": "test_2016_flickr", "test_sentences": len(test), "dev_sentences_for_empty_rate": len(dev),
                 "stand_in_for": "IWSLT'14 De→En / WMT'14 En→De / WMT'13 En→Ru (not available offline)"},
        "vocabulary": {"type": "joint sentencepiece BPE", "size": len(tok)},
        "model": asdict(model_cfg),
        "decoding": {"beam": P["beam"], "length_penalty": None, "beams_timed": list(P["beams"]),
                     "timing_sentences": P["timing_sentences"]},
    }


def _versions() -> dict:
    """The versions of the packages besides torch that a run's numbers depend on (``None``: not installed)."""
    from importlib import metadata

    out: dict[str, Optional[str]] = {}
    for name in ("triton", "sentencepiece", "sacrebleu"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


#: what a run record is, in its ``about`` field
RECORD_ABOUT = ("a finished run of `softargmax reproduce translation`: everything its report needs without the model "
                "(see softargmax.experiments.translation.make_record)")


def make_record(system: str, seed: int, result: dict, hyps: Sequence[str], stats: DecodeStats, refs: Sequence[str],
                fp: dict, setup: dict, common: dict, training: dict) -> dict:
    """The run record of one finished run (:mod:`.._records`): JSON data of a few hundred kB.

    Args:
        system: the output layer.
        seed: the run's seed.
        result: the run's numbers (:func:`evaluate_system`'s record with ``inference_seconds``,
            ``run_seconds`` and ``resumed_from_checkpoint``).
        hyps: its test translations (for the paired bootstrap between systems).
        stats: the decoding statistics of its test translation (for the figures).
        refs: the test references.
        fp: the run's fingerprint (that of its checkpoints).
        setup: :func:`run_setup`, which records merged into one report share.
        common: ``{"settings", "environment"}``: data, vocabulary, model and decoding; device,
            versions and the number of processes.
        training: the run's training settings (``TrainConfig`` as a dict).

    Returns:
        ``{"format", "about", "system", "seed", "finished", "fingerprint", "setup", "environment",
        "settings", "results", "test_hypotheses", "test_references", "decoding_steps"}``;
        ``decoding_steps`` holds the number of exact zeros (``int32``) and the sum of the
        scores (``float32``) at every step of every live hypothesis, packed
        (:func:`.._records.pack`).
    """
    return {
        "format": RECORD_FORMAT, "about": RECORD_ABOUT, "system": system, "seed": seed,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fp, "setup": setup, "environment": common["environment"],
        "settings": {**common["settings"], "training": training},
        "results": result, "test_hypotheses": list(hyps), "test_references": list(refs),
        "decoding_steps": {"vocab": stats.vocab, "zeros": pack(stats.zeros, "int32"), "sums": pack(stats.sums, "float32")},
    }


def _runs_left(pairs: list, earlier: dict, out_dir: Path, log: Log) -> tuple[list, bool]:
    """``(the runs of pairs without a run record, whether none is left)``, and one line that says which."""
    done = [p for p in pairs if p in earlier]
    left = [p for p in pairs if p not in earlier]
    if done and not left:
        log(f"the results are complete: all {len(done)} runs asked for have their run record in "
            f"{out_dir / 'records'}; nothing to train, the report is rebuilt from them (--fresh trains them all "
            "again, --runs SYSTEM:SEED one again)")
    elif done:
        log(f"{len(done)} of the runs asked for have their run record in {out_dir / 'records'}: training the "
            f"{len(left)} left (--fresh trains them all again)")
    return left, bool(done) and not left


#: the seconds a run spends outside its training steps (validation, the test translation, the empty-string scores,
#: the inference timing) per second of training steps, until a run of the call has measured its own: the committed
#: report of the default preset (reports/translation/, two CPU threads), (sum of its 4 runs' times - their training steps) / training steps
OVERHEAD_RATIO = 0.27


class JobEstimate(progress.JobEstimate):
    """The time left of a call (:class:`._progress.JobEstimate`): the runs left, each its training steps and the rest
    of the run (evaluation, inference timing; :data:`OVERHEAD_RATIO` of its training until a run measured its own),
    then the interleaved timing (:func:`time_speed`).

    The interleaved timing is ``rounds x steps`` training steps of every system at the time per step plus
    ``inference_rounds`` translations at every beam, as long as the finished runs' own inference timing measured
    (:data:`SPEED_ROUNDS`).  The report that follows is ``fixed`` (:class:`._progress.JobEstimate`); the paired
    bootstrap is not in it: seconds (4 systems on 1000 test sentences, 1000 draws: 16 s on two busy CPU cores).

    Example:
        >>> est = JobEstimate(runs=2, steps=100, systems=2, rounds=dict(rounds=10, steps=3, inference_rounds=3), fixed=0)
        >>> round(est.left(0, run_left=50.0, per_step=1.0))  # 50 + 27 (rest of run 1) + 127 (run 2) + 60 (timing)
        264
        >>> est.finished(train=100.0, steps=100, run=130.0, inference=2.0)
        >>> round(est.left(1, run_left=100.0, per_step=1.0))  # 100 + 30 + 60 + 3 rounds x 2 systems x 2 s
        202
    """

    def __init__(self, runs: int, steps: int, systems: int, rounds: dict, fixed: Optional[float] = None) -> None:
        super().__init__([steps] * runs, overhead=OVERHEAD_RATIO, fixed=fixed)
        self.steps, self.systems, self.rounds = steps, systems, rounds
        self.inference: list[float] = []  # the inference timing of each finished run: seconds over every beam

    def finished(self, train: float, steps: float, run: float, inference: float = 0.0) -> None:
        """A run is done: ``train`` seconds for ``steps`` training steps of this call, ``run`` seconds in all,
        ``inference`` seconds to translate the timing sentences once at every beam."""
        super().finished(train, steps, run)
        self.inference.append(inference)

    def after(self, per_step: float) -> float:
        """The interleaved timing of every system (none with one system)."""
        if self.systems < 2:
            return 0.0
        inference = statistics.fmean(self.inference) if self.inference else 0.0
        r = self.rounds
        return self.systems * (r["rounds"] * r["steps"] * per_step + r["inference_rounds"] * inference)


def _train_runs(ctx: distributed.Context, pairs: list, P: dict, model_cfg: ModelConfig, data: Data, out_dir: Path,
                log: Log, prints: dict, checkpoint_every: Optional[int], setup: dict, common: dict,
                earlier: dict, preset: str) -> None:
    """Train and evaluate every run of ``pairs`` and write its run record (on rank 0).

    ``prints[system, seed]`` is the fingerprint of each run's checkpoints; ``checkpoint_every``
    as :func:`.nmt.training.train_system` takes it; ``earlier`` the records already there
    (:func:`check_records`).  The time left of the whole call (:class:`JobEstimate`) is in the
    progress lines and on the bar.
    """
    _, train, val, test, dev, tok = data
    device_name = common["environment"]["device"]
    run_seconds: list[float] = []
    seeded = "seeds" in P or len({sd for _, sd in pairs}) > 1  # the log names each run's seed
    first_seed = pairs[0][1]
    timed = {s for s, sd in pairs if sd == first_seed} | {s for s, sd in earlier if sd == first_seed}
    est = JobEstimate(len(pairs), P["train_cfg"]["steps"], len(timed),
                      SPEED_ROUNDS.get(preset, dict(rounds=10, steps=3, inference_rounds=3)))
    log(f"{len(pairs)} run{'s' * (len(pairs) > 1)} to train: {', '.join(f'{s}:{sd}' for s, sd in pairs)}; the time "
        "left of the whole job (training, evaluation and the interleaved timing) follows from the first steps")
    for index, (system, sd) in enumerate(pairs):
        name = f"{system} seed {sd}" if seeded else system
        log(est.line(index, name, "their evaluation" if len(timed) < 2 else "their evaluation, then the interleaved "
                     "timing"))
        t_run = time.perf_counter()
        training = asdict(TrainConfig(seed=sd, **P["train_cfg"]))

        trained = train_system(system, model_cfg, TrainConfig(seed=sd, **P["train_cfg"]), tok, train, val,
                               _run_dir(out_dir, system, sd), device=ctx.device, log=log, name=name,
                               fingerprint=prints[system, sd], checkpoint_every=checkpoint_every, job_left=est.job(index))
        if not ctx.main:
            continue
        result = evaluate_system(trained, tok, test, dev, P, ctx.device, log=log)
        hyps, stats = result.pop("_hyps"), result.pop("_stats")
        log(f"[{name}] timing inference against beam size ...")
        result["inference_seconds"] = time_inference({system: trained}, tok, test, P, ctx.device,
                                                     repeats=P.get("inference_repeats", 3))[system]
        result["seed"] = sd
        rec = trained["record"]
        result["resumed_from_checkpoint"] = rec["steps_this_run"] < rec["steps_done"]
        del trained  # the model: the next run needs the memory
        result["run_seconds"] = time.perf_counter() - t_run
        est.finished(rec["train_seconds"] * rec["steps_this_run"] / max(rec["steps_done"], 1), rec["steps_this_run"],
                     result["run_seconds"], sum(result["inference_seconds"].values()))
        path = record_path(out_dir, system, sd)
        if (system, sd) in earlier:
            old = earlier[system, sd][1]
            log(f"[{name}] replacing the record of this run finished {old.get('finished')} on "
                f"{old['environment'].get('device')}")
        about = {**common, "environment": {**common["environment"], "processes": ctx.world}}
        write_record(path, make_record(system, sd, result, hyps, stats, test.tgt, prints[system, sd], setup, about,
                                       training))
        run_seconds.append(result["run_seconds"])
        log(f"[{name}] wrote {path} ({path.stat().st_size / 1e3:.0f} kB); the run took "
            f"{result['run_seconds'] / 60:.1f} min ({result['train_seconds'] / 60:.1f} of training steps)")
    if ctx.main and run_seconds:
        log(f"this call trained {len(run_seconds)} run{'s' * (len(run_seconds) > 1)} in {sum(run_seconds) / 60:.1f} min: "
            f"{statistics.fmean(run_seconds) / 60:.1f} min per run on {device_name}")


def rebuild(out: Union[str, Path], log: Log = print, setup: Optional[dict] = None,
            t_start: Optional[float] = None, rebuilt: bool = True) -> dict:
    """Write ``results.json``, the figures and ``report.md`` of ``out`` from every run record in ``out/records``.

    Args:
        out: the output folder.
        log: where progress lines go.
        setup: what the records must share (:func:`run_setup`; default: the first record's).
        t_start: ``time.perf_counter()`` when the call began (for ``settings["total_seconds"]``).
        rebuilt: nothing was trained or timed before: the last line says that the report was rebuilt from the
            records (``False``: what was written, and in how long).

    Returns:
        the content of ``results.json``.

    Raises:
        FileNotFoundError: ``out/records`` holds no record.
        RecordMismatchError: a record of another setup.
    """
    t0 = time.perf_counter() if t_start is None else t_start
    out_dir = Path(out)
    found = check_records(out_dir, setup)
    if not found:
        raise FileNotFoundError(f"out: no run records in {out_dir / 'records'} to build a report from")
    try:
        speed = json.loads((out_dir / SPEED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        speed = None
    results, stats = results_from_records(found, log, speed)
    results["settings"]["total_seconds"] = time.perf_counter() - t0
    return finish(results, out_dir, lambda res, folder: write_figures(res, stats, folder), render_report, log,
                  rebuilt_from=f"the {len(found)} run record{'s' * (len(found) > 1)} in {out_dir / 'records'}"
                  if rebuilt else None)


def render(out: str, log: Log = print) -> Path:
    """``--render-only``: the report of ``out`` written again without training; returns the report's path.

    With run records in ``out/records`` everything is rebuilt from them (:func:`rebuild`):
    ``results.json``, the figures and ``report.md``; no data, model or GPU is needed.  A
    folder without records (written before records existed) has its ``report.md`` rendered
    from its ``results.json`` (:func:`._common.render_existing`), keeping its figures.

    Args:
        out: the output folder.
        log: where progress lines go.

    Returns:
        the path of ``report.md``.
    """
    if not read_records(out):
        return render_existing(out, render_report)
    rebuild(out, log)
    return Path(out) / "report.md"


def _env_with_precision(env: dict, device: str, autocast: Optional[str], tf32: bool) -> dict:
    """:func:`._common.environment` with the device's type and the precision in effect right after ``device``.

    ``autocast``: the dtype of the Transformer under autocast (``None``: float32,
    :meth:`.nmt.training.TrainConfig.autocast`); ``tf32``: whether float32 matrix products
    used TF32.  Both apply on CUDA only, so runs of one setup on a CPU and on a GPU differ here.
    """
    return {"device": env.pop("device"), "device_type": torch.device(device).type, "autocast": autocast,
            "tf32_matmul": tf32, **env}
