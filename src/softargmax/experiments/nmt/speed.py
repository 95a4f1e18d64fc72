"""Speed of the translation systems, measured so that the machine's load cannot flip a verdict.

Timing each system alone, right after its own training, compares times taken under different
loads: on a shared machine a system trained while another job ran looks slower by whatever that
job took.  Here the trained systems are timed *interleaved* (:func:`time_interleaved`): in each of
``rounds`` short rounds every system runs ``steps`` training steps on the same batches (a copy of
its trained model, a fresh optimizer, so the trained model is untouched), and then translates the
same sentences at every beam size; the systems' order rotates from round to round.  A load that
comes and goes then hits every system within the same round.

Summary (:func:`summarize`): a system's time is a low quantile (``QUANTILE``) of its per-round
times (the rounds least disturbed by other jobs), and its ratio to softmax's comes with a 95%
percentile-bootstrap interval that resamples whole rounds, so the systems' times stay paired
(Efron & Tibshirani, *An Introduction to the Bootstrap*, Chapman & Hall, 1993).  A speed claim
"ratio ≤ limit" holds only when the whole interval lies at or below the limit, does not hold
when it lies above, and is "not shown (noisy)" otherwise (:func:`ratio_verdict`), with the
spread of the per-round ratios in the sentence.  Process CPU time is recorded beside wall time.

On the CPU the timing runs with one torch thread (``threads``) and the ratios are taken from the
process CPU time (``"clock": "cpu"``).  With several threads, a second job busy on one core stalls
every parallel region of every system, and the ratios shrink towards 1 (measured: each step 2.5–3×
longer with one of two cores busy); one thread runs on whichever core is free, and its CPU time is
the work of the step, to which time spent waiting for the core does not add.  Wall time stays beside
it.  On a GPU the clock is the wall time, the device synchronized around every timing.
"""

from __future__ import annotations

import copy
import random
import time
from typing import Any, Callable, Optional, Sequence

import torch

#: the quantile of the per-round times that stands for a system's time (0: the minimum)
QUANTILE = 0.2
#: bootstrap resamples of the rounds, and the interval's coverage
BOOTSTRAP = 2000
COVERAGE = 0.95
#: the fewest rounds a verdict is drawn from: with fewer, resampling the rounds cannot show how they vary
MIN_ROUNDS = 3


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``values``, linear between order statistics (NumPy's default).

    Example:
        >>> quantile([4.0, 1.0, 3.0, 2.0], 0.0), quantile([4.0, 1.0, 3.0, 2.0], 0.5)
        (1.0, 2.5)
    """
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("values: empty")
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def ratio_summary(times: Sequence[float], reference: Sequence[float], q: float = QUANTILE, samples: int = BOOTSTRAP,
                  seed: int = 0) -> dict:
    """The ratio of two systems' times measured in the same rounds, with a bootstrap interval.

    Args:
        times: the system's time in each round.
        reference: the reference system's time in the same rounds (paired with ``times``).
        q: the quantile of the rounds that stands for a time (:data:`QUANTILE`).
        samples: bootstrap resamples (whole rounds, drawn with replacement; seeded).
        seed: the resampling's seed.

    Returns:
        ``{"ratio", "ci": [lo, hi], "round_ratios": [min, max], "rounds"}``: ``ratio`` is
        ``quantile(times) / quantile(reference)``; ``ci`` its 95% percentile interval;
        ``round_ratios`` the range of the per-round ratios (the measured variation).
    """
    if len(times) != len(reference) or not times:
        raise ValueError(f"times and reference must be paired and non-empty, got {len(times)} and {len(reference)}")
    n = len(times)
    ratio = quantile(times, q) / quantile(reference, q)
    rng = random.Random(seed)
    boot = []
    for _ in range(samples):
        idx = [rng.randrange(n) for _ in range(n)]
        boot.append(quantile([times[i] for i in idx], q) / quantile([reference[i] for i in idx], q))
    tail = (1 - COVERAGE) / 2
    per_round = [t / r for t, r in zip(times, reference)]
    return {"ratio": ratio, "ci": [quantile(boot, tail), quantile(boot, 1 - tail)],
            "round_ratios": [min(per_round), max(per_round)], "rounds": n}


def ratio_verdict(entry: Optional[dict], limit: float) -> str:
    """The verdict on "time ratio ≤ ``limit``" from :func:`ratio_summary`'s ``entry``.

    Rule: ``"holds"`` when the 95% interval lies at or below ``limit``, ``"does not hold"``
    when it lies above, otherwise ``"not shown (noisy)"``; the text gives the ratio, the
    interval and the range of the per-round ratios.  Fewer than :data:`MIN_ROUNDS` rounds give
    ``"not shown (too few rounds)"``: their interval says nothing of the variation.

    Example:
        >>> ratio_verdict({"ratio": 0.9, "ci": [0.85, 0.95], "round_ratios": [0.8, 1.0], "rounds": 8}, 1.1)
        'holds (0.90×; 95% interval 0.85–0.95× over 8 interleaved rounds, per-round ratios 0.80–1.00×)'
    """
    if entry is None:
        return "not tested (the systems were not timed interleaved)"
    lo, hi = entry["ci"]
    if entry["rounds"] < MIN_ROUNDS:
        return (f"not shown (too few rounds: {entry['ratio']:.2f}× from {entry['rounds']} interleaved round"
                f"{'s' * (entry['rounds'] > 1)}, at least {MIN_ROUNDS} needed for an interval)")
    verdict = "holds" if hi <= limit else "does not hold" if lo > limit else "not shown (noisy)"
    return (f"{verdict} ({entry['ratio']:.2f}×; 95% interval {lo:.2f}–{hi:.2f}× over {entry['rounds']} interleaved "
            f"rounds, per-round ratios {entry['round_ratios'][0]:.2f}–{entry['round_ratios'][1]:.2f}×)")


def summarize(timing: dict, reference: str = "softmax", q: float = QUANTILE) -> dict:
    """Ratios to ``reference`` of the interleaved timings (:func:`time_interleaved`'s output), from the process CPU
    time where the timing's ``clock`` is ``"cpu"`` (one thread on the CPU), else from the wall time (a timing
    without ``clock``, written before it was recorded, is wall time).

    Returns:
        ``{"clock", "threads", "train": {system: ratio_summary}, "inference": {system: {beam: ratio_summary}},
        "seconds_per_step": {system: quantile}, "inference_seconds": {system: {beam: quantile}},
        "cpu_seconds_per_step": {system: quantile}}`` (the times in wall seconds, the CPU column beside); the
        reference itself has ratio 1.
    """
    clock = timing.get("clock", "wall")
    wall_train, wall_infer = timing["train_seconds_per_step"], timing["inference_seconds"]
    if clock == "cpu":
        train, infer = timing["train_cpu_seconds_per_step"], timing["inference_cpu_seconds"]
    else:
        train, infer = wall_train, wall_infer
    out: dict[str, Any] = {"reference": reference, "quantile": q, "train": {}, "inference": {},
                           **({"clock": clock, "threads": timing.get("threads")} if "clock" in timing else {}),
                           "seconds_per_step": {s: quantile(v, q) for s, v in wall_train.items()},
                           "cpu_seconds_per_step": {s: quantile(v, q) for s, v in timing.get("train_cpu_seconds_per_step",
                                                                                           {}).items()},
                           "inference_seconds": {s: {b: quantile(v, q) for b, v in per.items()}
                                                 for s, per in wall_infer.items()}}
    if reference not in train:
        return out
    for s in train:
        out["train"][s] = ratio_summary(train[s], train[reference], q)
        out["inference"][s] = {b: ratio_summary(v, infer[reference][b], q) for b, v in infer.get(s, {}).items()
                               if b in infer.get(reference, {})}
    return out


def _clone_for_timing(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A copy of ``model`` in training mode and an Adam optimizer for it: the trained model stays as it is."""
    clone = copy.deepcopy(model)
    clone.train()
    return clone, torch.optim.Adam(clone.parameters(), lr=1e-6, betas=(0.9, 0.998), eps=1e-9)


def time_interleaved(systems: dict, batches: Sequence[tuple], translate: Callable[[Any, Any, int], object],
                     beams: Sequence[int], rounds: int = 10, steps: int = 3, inference_rounds: int = 5,
                     device: str = "cpu", log: Callable[[str], object] = print, threads: Optional[int] = 1) -> dict:
    """Time every system's training step and translation in alternating rounds (see the module docstring).

    Args:
        systems: ``{name: (model, layer)}``: trained models and their output layers (not modified).
        batches: ``(src, tgt_in, tgt_out)`` tensors, the same for every system; each round runs
            ``steps`` of them.
        translate: ``translate(model, layer, beam)`` translates the timing sentences.
        beams: the beam sizes.
        rounds: rounds of training steps; ``steps``: steps per system per round.
        inference_rounds: rounds of translation (each at every beam size).
        device: where the models are (CUDA is synchronized around every timing).
        log: where progress lines go.
        threads: on the CPU, the torch threads during the timing (restored after); ``None`` keeps the
            current number (module docstring). Default: ``1``.

    Returns:
        ``{"rounds", "steps", "inference_rounds", "threads", "clock", "train_seconds_per_step": {system: [per
        round]}, "train_cpu_seconds_per_step": {...}, "inference_seconds": {system: {beam: [per round]}},
        "inference_cpu_seconds": {...}}``; ``clock`` is ``"cpu"`` (one thread on the CPU: :func:`summarize` takes
        the ratios from process CPU time) or ``"wall"``.
    """
    names = list(systems)
    cuda = str(device).startswith("cuda")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None or a positive int, got {threads!r}")
    before = torch.get_num_threads()
    if threads is not None and not cuda:
        torch.set_num_threads(threads)
    try:
        out = _time_rounds(systems, names, batches, translate, beams, rounds, steps, inference_rounds, cuda, log)
    finally:
        torch.set_num_threads(before)
    used = torch.get_num_threads() if threads is None or cuda else threads
    return {**out, "threads": None if cuda else used, "clock": "cpu" if not cuda and used == 1 else "wall"}


def _time_rounds(systems: dict, names: list, batches: Sequence[tuple], translate: Callable[[Any, Any, int], object],
                 beams: Sequence[int], rounds: int, steps: int, inference_rounds: int, cuda: bool,
                 log: Callable[[str], object]) -> dict:
    """:func:`time_interleaved`'s rounds, with the threads already set."""

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    clones = {s: _clone_for_timing(systems[s][0]) for s in names}

    def train_steps(s: str, count: int) -> None:
        model, opt = clones[s]
        layer = systems[s][1]
        for i in range(count):
            src, tgt_in, tgt_out = batches[i % len(batches)]
            loss = layer.loss(model(src, tgt_in).float(), tgt_out)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        sync()

    for s in names:  # warm-up: allocations, the C solver's first call
        train_steps(s, 1)
    log(f"timing {len(names)} systems interleaved: {rounds} rounds of {steps} training steps each, then "
        f"{inference_rounds} rounds of translation at beam {', '.join(map(str, beams))} ...")
    wall: dict[str, list] = {s: [] for s in names}
    cpu: dict[str, list] = {s: [] for s in names}
    for r in range(rounds):
        for s in names[r % len(names):] + names[: r % len(names)]:  # the order rotates
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            train_steps(s, steps)
            wall[s].append((time.perf_counter() - t0) / steps)
            cpu[s].append((time.process_time() - c0) / steps)
    clones.clear()  # the copies: the memory is needed for decoding
    infer: dict[str, dict[str, list]] = {s: {str(b): [] for b in beams} for s in names}
    infer_cpu: dict[str, dict[str, list]] = {s: {str(b): [] for b in beams} for s in names}
    for r in range(inference_rounds):
        for b in beams:
            for s in names[r % len(names):] + names[: r % len(names)]:
                model, layer = systems[s]
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                translate(model, layer, b)
                sync()
                infer[s][str(b)].append(time.perf_counter() - t0)
                infer_cpu[s][str(b)].append(time.process_time() - c0)
    return {"rounds": rounds, "steps": steps, "inference_rounds": inference_rounds, "train_seconds_per_step": wall,
            "train_cpu_seconds_per_step": cpu, "inference_seconds": infer, "inference_cpu_seconds": infer_cpu}
