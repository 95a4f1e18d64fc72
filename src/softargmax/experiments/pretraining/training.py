r"""Training one language model with one Fenchel–Young loss, resumable from its checkpoint.

Every loss goes through the fused ``softargmax.linear_fenchel_young_loss`` (the ``[tokens, V]``
logits are never stored): ``loss(model(x), E, y)`` with the tied output embedding ``E``.  With
a learned reference measure, :math:`q = \exp(s)` for a parameter :math:`s \in \mathbb{R}^V` that starts at
0 (:math:`q = 1`, the paper's default) and is trained by the same optimizer, its gradient computed by
:mod:`.reference_measure`.

AdamW (:math:`\beta = (0.9, 0.95)`, weight decay on the matrices only), a linear warm-up then a cosine
decay to a share ``final`` of the peak learning rate (a tenth unless set; reached at the end, or, with
``hold`` > 0, after the first ``1 - hold`` of the steps and held there for the rest), gradients clipped at norm 1.  Runs with the same
seed share their initialization and the order of their batches (:func:`.data.train_batch`),
whatever their loss.

Checkpoints: ``<run folder>/checkpoint.pt`` (the experiments' :func:`~softargmax.experiments._common.save_checkpoint`:
atomic, the previous one kept as ``checkpoint.prev.pt``, stamped with the run's fingerprint) holds
the model, the optimizer, the schedule, ``s``, the record (the step included) and every
random-number state (:func:`~softargmax.experiments._common.rng_state`).  It is written every
``curve_every`` steps (where the learning curves get a point), every ``checkpoint_every`` steps
when given, and at the end (a finished run is then only loaded).  The batches depend on ``(seed, step)``
alone and the model has no dropout, so a resumed run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

import softargmax as sa

from .._common import Log, check_checkpoint_every, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .._progress import JobLeft, StepTimer, advance, format_seconds, progress_bar
from .data import Stream, eval_windows, train_batch
from .model import Decoder, DecoderConfig
from .reference_measure import linear_loss_with_learned_q


@dataclass(frozen=True)
class RunSpec:
    """One training run: a loss (its mapping), a seed, and whether ``q`` is learned."""

    loss: str
    mapping: str
    seed: int
    learned_q: bool = False

    @property
    def name(self) -> str:
        return f"{self.loss}{'+q' if self.learned_q else ''}-seed{self.seed}"


@dataclass
class TrainSettings:
    steps: int
    batch: int
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    clip: float = 1.0
    chunk: int = 512
    curve_every: int = 100
    curve_tokens: int = 8192
    hold: float = 0.0
    final: float = 0.1


def lr_factor(step: int, warmup: int, steps: int, hold: float = 0.0, final: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine decay from 1 to ``final`` (a share of the peak),
    reached at step ``(1 - hold) · steps`` and held from there to ``steps``.

    Example:
        >>> [round(lr_factor(s, 10, 100), 3) for s in (0, 9, 10, 55, 100)]
        [0.1, 1.0, 1.0, 0.55, 0.1]
        >>> [round(lr_factor(s, 10, 100, hold=0.2), 3) for s in (45, 80, 90, 100)]
        [0.55, 0.1, 0.1, 0.1]
        >>> [round(lr_factor(s, 10, 100, hold=0.2, final=0.02), 3) for s in (45, 80, 100)]
        [0.51, 0.02, 0.02]
    """
    if not 0.0 <= hold < 1.0:
        raise ValueError(f"hold must be in [0, 1), got {hold!r}")
    if not 0.0 < final <= 1.0:
        raise ValueError(f"final must be in (0, 1], got {final!r}")
    if step < warmup:
        return (step + 1) / warmup
    end = steps - round(hold * steps)
    t = (step - warmup) / max(1, end - warmup)
    return final + (1 - final) / 2 * (1 + math.cos(math.pi * min(t, 1.0)))


def reference_measure(log_q: Optional[Tensor]) -> Optional[Tensor]:
    return None if log_q is None else torch.exp(log_q)


def training_loss(model: Decoder, log_q: Optional[Tensor], mapping: str, x: Tensor, y: Tensor, chunk: int) -> Tensor:
    """Mean fused Fenchel–Young loss of the batch ``(x, y)``."""
    h = model(x)
    if log_q is None:
        return sa.linear_fenchel_young_loss(h, model.output_weight, y, mapping=mapping, chunk_size=chunk)
    return linear_loss_with_learned_q(h, model.output_weight, y, torch.exp(log_q), mapping, chunk)  # q = reference_measure(log_q)


@torch.no_grad()
def predictions(logits: Tensor, mapping: str, q: Optional[Tensor]) -> Tensor:
    """The arg-max of the model's distribution: of the logits when ``q = 1`` (every f-softargmax keeps their order),
    else of ``p = f-softargmax(logits; q)``."""
    if q is None:
        return logits.argmax(-1)
    return sa.sampling.probabilities(logits, mapping, q=q).argmax(-1)


@torch.no_grad()
def quick_accuracy(model: Decoder, log_q: Optional[Tensor], mapping: str, stream: Stream, context: int, rows: int = 32) -> float:
    """Next-token accuracy (%) on ``stream`` (for the training curves)."""
    was = model.training
    model.eval()
    correct = total = 0
    q = reference_measure(log_q)
    for x, y, _ in eval_windows(stream, context):
        for xb, yb in zip(x.split(rows), y.split(rows)):
            pred = predictions(model.logits(model(xb.to(model.embed.weight.device))), mapping, q)
            correct += int((pred.cpu() == yb).sum())
            total += yb.numel()
    model.train(was)
    return 100.0 * correct / max(total, 1)


def _optimizer(model: Decoder, log_q: Optional[Tensor], S: TrainSettings) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2] + ([log_q] if log_q is not None else [])
    return torch.optim.AdamW([{"params": decay, "weight_decay": S.weight_decay}, {"params": other, "weight_decay": 0.0}],
                             lr=S.lr, betas=(0.9, 0.95))


def _restore(state: dict, model: Decoder, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR,
             log_q: Optional[Tensor]) -> dict:
    """Load a checkpoint's training state and random-number state; returns its record."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    if log_q is not None:
        log_q.data.copy_(state["log_q"])
    set_rng_state(state["rng"])
    return state["record"]


def _step(model: Decoder, log_q: Optional[Tensor], opt: torch.optim.Optimizer,
          sched: torch.optim.lr_scheduler.LambdaLR, spec: RunSpec, S: TrainSettings, x: Tensor,
          y: Tensor) -> Tensor:
    """One optimizer step on the batch ``(x, y)``; returns the loss (detached)."""
    loss = training_loss(model, log_q, spec.mapping, x, y, S.chunk)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = list(model.parameters()) + ([log_q] if log_q is not None else [])
    nn.utils.clip_grad_norm_(params, S.clip)
    opt.step()
    sched.step()
    if x.is_cuda:
        torch.cuda.synchronize()
    return loss.detach()


def train_run(spec: RunSpec, cfg: DecoderConfig, S: TrainSettings, train_ids: Tensor, curve_stream: Stream,
              run_dir: Path, fingerprint: dict, device: str = "cpu", log: Log = print,
              checkpoint_every: Optional[int] = None, job_left: JobLeft = None) -> tuple[Decoder, Optional[nn.Parameter], dict]:
    """Train (or resume, or load) one run; returns ``(model, log_q or None, record)``.

    ``record``: ``steps_done``, ``train_seconds`` (forward, loss, backward and update; curve
    evaluations excluded), ``step_seconds`` (every step's time), ``loss_curve`` and
    ``accuracy_curve`` (``[step, value]`` pairs), ``resumed_at`` (the steps a resumed run started
    from), ``steps_this_run`` (the steps trained by this call).

    ``job_left``, where given, is called with the seconds left of this run's training steps and the time per
    step, and returns the seconds left of the whole job: the progress lines and the bar show it.

    Resumes from ``run_dir/checkpoint.pt`` (:func:`~softargmax.experiments._common.load_checkpoint`):
    a checkpoint whose fingerprint is not ``fingerprint`` raises
    :class:`~softargmax.experiments._common.CheckpointMismatchError`, one that cannot be read is
    reported and replaced by the previous one, or by training from scratch.  Checkpoints are
    written every ``S.curve_every`` steps (with a point of the curves), every ``checkpoint_every``
    steps when given, and at the end; the log line of a curve point comes after its checkpoint.
    """
    check_checkpoint_every(checkpoint_every)
    torch.manual_seed(spec.seed)
    model = Decoder(cfg).to(device)
    log_q = nn.Parameter(torch.zeros(cfg.vocab, device=device)) if spec.learned_q else None
    opt = _optimizer(model, log_q, S)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, S.warmup, S.steps, S.hold, S.final))
    record: dict[str, Any] = {"run": spec.name, "loss": spec.loss, "mapping": spec.mapping, "seed": spec.seed,
              "learned_q": spec.learned_q, "steps_done": 0, "train_seconds": 0.0, "step_seconds": [],
              "loss_curve": [], "accuracy_curve": [], "resumed_at": []}
    path = run_dir / "checkpoint.pt"
    state = load_checkpoint(path, fingerprint, map_location=device, log=log, label=f"[{spec.name}] ")
    if state is not None:
        record = _restore(state, model, opt, sched, log_q)
        if record["steps_done"] < S.steps:
            record["resumed_at"].append(record["steps_done"])
            log(f"[{spec.name}] resumed at step {record['steps_done']}")

    def checkpoint() -> None:
        save_checkpoint(path, {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                               "log_q": None if log_q is None else log_q.detach().clone(), "record": record,
                               "rng": rng_state()}, fingerprint)

    model.train()
    step = start = record["steps_done"]
    with progress_bar(S.steps, spec.name, step) as bar:  # on a terminal only
        step = _train_steps(model, log_q, opt, sched, spec, S, cfg, train_ids, curve_stream, device, record, step,
                            checkpoint, checkpoint_every, log, bar, job_left)
    record["steps_this_run"] = step - start
    model.eval()
    return model, log_q, record


def _train_steps(model: Decoder, log_q: Optional[nn.Parameter], opt: torch.optim.Optimizer,
                 sched: torch.optim.lr_scheduler.LambdaLR, spec: RunSpec,
                 S: TrainSettings, cfg: DecoderConfig, train_ids: torch.Tensor, curve_stream: Stream, device: str,
                 record: dict, step: int, checkpoint: Callable[[], None], checkpoint_every: Optional[int], log: Log,
                 bar: Any, job_left: JobLeft = None) -> int:
    """The training steps from ``step`` to ``S.steps`` (curves, checkpoints, progress lines, the bar); the last step."""
    timer = StepTimer(step)  # the bar's time left, from the recent steps
    while step < S.steps:
        x, y = (t.to(device) for t in train_batch(train_ids, cfg.context, S.batch, spec.seed, step))
        t0 = time.perf_counter()
        loss = _step(model, log_q, opt, sched, spec, S, x, y)
        dt = time.perf_counter() - t0
        step += 1
        record["steps_done"] = step
        record["train_seconds"] += dt
        record["step_seconds"].append(dt)
        curve = step % S.curve_every == 0 or step == S.steps or step == 1
        if curve:
            value = loss.item()
            acc = quick_accuracy(model, log_q, spec.mapping, curve_stream.head(S.curve_tokens), cfg.context)
            record["loss_curve"].append([step, value])
            record["accuracy_curve"].append([step, acc])
        if step % S.curve_every == 0 or step == S.steps or (checkpoint_every and step % checkpoint_every == 0):
            checkpoint()
        if curve:
            per_step = statistics.fmean(record["step_seconds"][-S.curve_every:])
            left = per_step * (S.steps - step)
            whole = None if job_left is None else job_left(left, per_step)
            log(f"[{spec.name}] step {step}/{S.steps} loss {value:.4f} validation-head accuracy {acc:.2f}% "
                f"({1000 * dt:.0f} ms/step, about {left / 60:.1f} min left"
                + ("" if whole is None else f"; whole job: {format_seconds(whole)}") + ")")
        advance(bar, timer, step, S.steps, float(loss) if bar is not None else 0.0, job_left)
    return step
