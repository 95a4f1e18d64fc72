r"""Training one language model with one Fenchel–Young loss, resumable from its checkpoint.

Every loss goes through the fused ``softargmax.linear_fenchel_young_loss`` (the ``[tokens, V]``
logits are never stored): ``loss(model(x), E, y)`` with the tied output embedding ``E``.  With
a learned reference measure, :math:`q = \exp(s)` for a parameter :math:`s \in \mathbb{R}^V` that starts at
0 (:math:`q = 1`, the paper's default) and is trained by the same optimizer, its gradient computed by
:mod:`.reference_measure`.

AdamW (:math:`\beta = (0.9, 0.95)`, weight decay on the matrices only), a linear warm-up then a cosine
decay to a tenth of the peak learning rate, gradients clipped at norm 1.  Runs with the same
seed share their initialization and the order of their batches (:func:`.data.train_batch`),
whatever their loss.

Checkpoints: ``<run folder>/checkpoint.pt`` holds the model, the optimizer, the schedule, ``s``,
the record and the step, written every ``checkpoint_every`` steps and at the end (a finished
run is then only loaded).  The batches depend on ``(seed, step)`` alone and training draws no
other random numbers, so a resumed run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

import softargmax as sa

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
    checkpoint_every: int = 100
    curve_every: int = 100
    curve_tokens: int = 8192


def save_checkpoint(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` through a temporary file and a rename, so a killed run never leaves half a file.

    The experiments' shared checkpoint helper, when there is one, replaces this function.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, device: str = "cpu") -> Optional[dict]:
    """The state :func:`save_checkpoint` wrote, or ``None`` if there is none."""
    return torch.load(path, map_location=device, weights_only=False) if path.is_file() else None


def lr_factor(step: int, warmup: int, steps: int) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine decay from 1 to 0.1 at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(t, 1.0)))


def reference_measure(log_q: Optional[Tensor]) -> Optional[Tensor]:
    return None if log_q is None else torch.exp(log_q)


def training_loss(model: Decoder, log_q: Optional[Tensor], mapping: str, x: Tensor, y: Tensor, chunk: int) -> Tensor:
    """Mean fused Fenchel–Young loss of the batch ``(x, y)``."""
    h = model(x)
    if log_q is None:
        return sa.linear_fenchel_young_loss(h, model.output_weight, y, mapping=mapping, chunk_size=chunk)
    return linear_loss_with_learned_q(h, model.output_weight, y, reference_measure(log_q), mapping, chunk)


@torch.no_grad()
def predictions(logits: Tensor, mapping: str, q: Optional[Tensor]) -> Tensor:
    """The arg-max of the model's distribution: of the logits when ``q = 1`` (every f-softargmax keeps their order),
    else of ``p = f-softargmax(logits; q)``."""
    if q is None:
        return logits.argmax(-1)
    return sa.sampling.probabilities(logits, mapping, q=q).argmax(-1)


@torch.no_grad()
def quick_accuracy(model: Decoder, log_q, mapping: str, stream: Stream, context: int, rows: int = 32) -> float:
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


def train_run(spec: RunSpec, cfg: DecoderConfig, S: TrainSettings, train_ids: Tensor, curve_stream: Stream,
              run_dir: Path, device: str = "cpu", log=print, stop_at: Optional[int] = None):
    """Train (or resume, or load) one run; returns ``(model, log_q or None, record)``.

    ``record``: ``steps_done``, ``train_seconds`` (forward, loss, backward and update; curve
    evaluations excluded), ``step_seconds`` (every step's time), ``loss_curve`` and
    ``accuracy_curve`` (``[step, value]`` pairs), ``resumed_at`` (the steps a resumed run started
    from).  ``stop_at``: stop after that many steps (tests use it to interrupt a run).
    """
    torch.manual_seed(spec.seed)
    model = Decoder(cfg).to(device)
    log_q = nn.Parameter(torch.zeros(cfg.vocab, device=device)) if spec.learned_q else None
    opt = _optimizer(model, log_q, S)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, S.warmup, S.steps))
    record = {"run": spec.name, "loss": spec.loss, "mapping": spec.mapping, "seed": spec.seed,
              "learned_q": spec.learned_q, "steps_done": 0, "train_seconds": 0.0, "step_seconds": [],
              "loss_curve": [], "accuracy_curve": [], "resumed_at": []}
    path = run_dir / "checkpoint.pt"
    state = load_checkpoint(path, device)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        if log_q is not None:
            log_q.data.copy_(state["log_q"])
        record = state["record"]
        if record["steps_done"] < S.steps:
            record["resumed_at"].append(record["steps_done"])
            log(f"[{spec.name}] resumed at step {record['steps_done']}")

    def checkpoint():
        save_checkpoint(path, {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                               "log_q": None if log_q is None else log_q.detach().clone(), "record": record})

    model.train()
    step = record["steps_done"]
    while step < S.steps:
        if stop_at is not None and step >= stop_at:
            return model, log_q, record
        x, y = train_batch(train_ids, cfg.context, S.batch, spec.seed, step)
        x, y = x.to(device), y.to(device)
        t0 = time.perf_counter()
        loss = training_loss(model, log_q, spec.mapping, x, y, S.chunk)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        params = list(model.parameters()) + ([log_q] if log_q is not None else [])
        nn.utils.clip_grad_norm_(params, S.clip)
        opt.step()
        sched.step()
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step += 1
        record["steps_done"] = step
        record["train_seconds"] += dt
        record["step_seconds"].append(dt)
        if step % S.curve_every == 0 or step == S.steps or step == 1:
            value = loss.item()
            acc = quick_accuracy(model, log_q, spec.mapping, curve_stream.head(S.curve_tokens), cfg.context)
            record["loss_curve"].append([step, value])
            record["accuracy_curve"].append([step, acc])
            left = statistics.fmean(record["step_seconds"][-S.curve_every:]) * (S.steps - step) / 60
            log(f"[{spec.name}] step {step}/{S.steps} loss {value:.4f} validation-head accuracy {acc:.2f}% "
                f"({1000 * dt:.0f} ms/step, about {left:.1f} min left)")
        if step % S.checkpoint_every == 0 or step == S.steps:
            checkpoint()
    model.eval()
    return model, log_q, record
