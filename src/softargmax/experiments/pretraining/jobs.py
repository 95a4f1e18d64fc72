"""Training and scoring the runs of ``softargmax reproduce lm``, in this process or ``jobs`` at a time in others,
and the time left of a call.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import torch

from .. import _progress as progress
from .._allocator import keep_freed_memory
from .._common import Log, load_checkpoint, save_checkpoint
from .evaluation import score_tokens
from .model import Decoder
from .plan import run_key
from .training import RunSpec, train_run

#: the seconds of a run beyond its training steps (the points of its learning curves, the scores of the validation
#: and test sets) per second of training steps, until a run of the call has measured its own: the share of the
#: forward passes in the default preset (21 curve points of 16,384 tokens and the 295,170 tokens of both sets scored,
#: against 6,000 training steps of 1,024 tokens, a forward pass a third of a training step, the scores about three
#: forward passes' worth)
OVERHEAD_RATIO = 0.07
#: the seconds of one fresh process of the memory measurement (:func:`.cost.memory_peaks`) on a quiet machine: 2.9–3.8 s on two
#: CPU cores with a load average of 3 (2026-12-02, the smoke and the default sizes), 24 s with 9.4
MEMORY_PROCESS_SECONDS = 3.0
#: what the whole job's time left adds to the runs' training, in its line
WHAT = "their evaluation, then the samples, the step timing and the memory peaks"


class JobEstimate(progress.JobEstimate):
    """The time left of a call (:class:`._progress.JobEstimate`): its runs (``jobs`` at a time), each its training
    steps and its evaluation, then the samples, the interleaved step timing and the memory peaks.

    The step timing is ``timing_rounds + 1`` rounds (one warms up) of ``timing_batches`` steps of the first run of
    every loss at the time per step; the samples ``sample_len`` forward passes of ``samples`` prompts per rule (own
    and classical softargmax) of every loss with ``q = 1``, a forward pass of ``samples`` sequences a third of a
    training step of ``batch``; each memory peak a fresh process (:data:`MEMORY_PROCESS_SECONDS`, with the report's
    figures the ``fixed`` seconds of :class:`._progress.JobEstimate`, scaled by how busy the machine is).

    Example:
        >>> from softargmax.experiments.pretraining.plan import PRESETS, run_specs
        >>> P = PRESETS["default"]
        >>> est = JobEstimate(run_specs(P, P["systems"], 0), P, jobs=1)
        >>> est.runs, est.work[0], round(est.after(0.06)), est.fixed  # 9 runs of 6,000 steps; 18 timed, 160 sampled
        (9, 6000.0, 11, 16.0)
    """

    def __init__(self, specs: list[RunSpec], P: dict, jobs: int = 1) -> None:
        processes = 2 * len(P["memory_mappings"])
        super().__init__([P["train"]["steps"]] * len(specs), OVERHEAD_RATIO, jobs,
                         fixed=progress.REPORT_SECONDS + processes * MEMORY_PROCESS_SECONDS)
        self.timed = (P["timing_rounds"] + 1) * P["timing_batches"] * len({run_key(s) for s in specs})
        losses = len({s.loss for s in specs if not s.learned_q})
        self.sampled = losses * 2 * P["sample_len"] * P["samples"] / (3 * P["train"]["batch"])

    def after(self, per_step: float) -> float:
        """The seconds of the samples and the step timing at ``per_step``."""
        return (self.timed + self.sampled) * per_step


def training_time(rec: dict) -> tuple[float, int]:
    """``(seconds, steps)`` of the training steps a run's ``rec`` (:func:`.training.train_run`'s record)
    took in this call."""
    steps = rec.get("steps_this_run", 0)
    return (sum(rec["step_seconds"][-steps:]) if steps else 0.0), steps


def score_run(spec: RunSpec, model: Decoder, log_q: Optional[torch.Tensor], held: dict, rdir: Path, rows: int, fp: dict,
            log: Log) -> dict:
    """Per-token scores of the validation and test sets, kept in the run folder with the run's fingerprint ``fp``
    (a resumed experiment reloads them; NumPy arrays, stored as tensors)."""
    path = rdir / "scores.pt"
    state = load_checkpoint(path, fp, log=log, keep=1, label=f"[{spec.name}] ")
    if state is not None:
        return {s: {k: v.numpy() for k, v in state[s].items()} for s in ("valid", "test")}
    out = {s: score_tokens(model, log_q, spec.mapping, held[s], rows) for s in ("valid", "test")}
    save_checkpoint(path, {s: {k: torch.from_numpy(v) for k, v in out[s].items()} for s in out}, fp, keep=1)
    log(f"[{spec.name}] validation accuracy {100 * out['valid']['correct'].mean():.2f}%, "
        f"test {100 * out['test']['correct'].mean():.2f}%")
    return out


def _train_and_score(item: tuple) -> tuple[list, float, int, float]:
    """One run trained (or resumed) and scored in a worker process with one torch thread: its log lines, the seconds
    and the number of its training steps in this call, and its seconds in all."""
    spec, cfg, S, train_ids, held, rdir, fp, device, rows, checkpoint_every = item
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    if str(device).startswith("cpu"):
        keep_freed_memory()  # as the calling process does (:func:`.lm.run`)
    lines: list = []
    model, log_q, rec = train_run(spec, cfg, S, train_ids, held["valid"], rdir, fp, device, lines.append,
                                  checkpoint_every=checkpoint_every)
    score_run(spec, model, log_q, held, rdir, rows, fp, lines.append)
    return (lines, *training_time(rec), time.perf_counter() - t0)


def dispatch_order(specs: list[RunSpec]) -> list[RunSpec]:
    """The order in which :func:`train_in_processes` hands the runs to its lanes: the runs with a learned ``q``
    first (α = 1.5's with a learned ``q`` take about 1.3 times the others' time: the second pass for the gradient
    with respect to ``q``), each group in the plan's order.  The lanes then end on the shorter runs, and the one that
    finishes first idles less: over the 21 runs of the ``full`` preset, with the times of its committed report, a
    simulation of two lanes gives 83.2 min against 85.4 in the plan's order (the runs' numbers do not depend on the
    order: each has its own seed and process).

    Example:
        >>> from softargmax.experiments.pretraining.plan import PRESETS, run_specs
        >>> P = PRESETS["full"]
        >>> [s.name for s in dispatch_order(run_specs(P, P["systems"], 0))][:4]
        ['kl+q-seed0', 'kl+q-seed1', 'kl+q-seed2', 'alpha1.5+q-seed0']
    """
    return sorted(specs, key=lambda s: not s.learned_q)  # (a stable sort: each group keeps its order)


def train_in_processes(work: list, jobs: int, log: Log, est: JobEstimate) -> None:
    """:func:`_train_and_score` of every item, ``jobs`` processes at a time (spawned: no state shared with this
    one); each run's log lines are logged here when it finishes, in the order the runs finish, then a line with the
    time left of the whole job (``est``, :meth:`._progress.JobEstimate.left_in_lanes`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    lanes = min(jobs, len(work))
    log(f"training {len(work)} runs {lanes} at a time, each in its own process with one torch thread; the time left "
        "of the whole job follows from the first runs to finish")
    t0 = time.perf_counter()
    ended: list[float] = []  # when each run ended, in the order they ended: the next run in line started then
    with ProcessPoolExecutor(max_workers=lanes, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_train_and_score, item): i for i, item in enumerate(work)}
        done: set = set()
        for future in as_completed(futures):
            lines, train, steps, seconds = future.result()
            for line in lines:
                log(line)
            index = futures[future]
            done.add(index)
            ended.append(time.perf_counter())
            est.finished(train, steps, seconds)
            now = ended[-1]
            # run i started when a lane came free: at the start for the first `lanes`, else at the (i - lanes)-th end
            started = {i: t0 if i < lanes else ended[i - lanes] for i in range(len(work))
                       if i not in done and i < len(ended) + lanes}
            waiting = [i for i in range(len(work)) if i not in done and i not in started]
            left = est.left_in_lanes({i: now - t for i, t in started.items()}, waiting)
            log(f"== run {len(done)} of {len(work)} done: {work[index][0].name} in {progress.format_seconds(seconds)}"
                + est.eta(left, WHAT))
