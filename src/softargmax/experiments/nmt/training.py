"""Training loop: Adam with the inverse-square-root warm-up ("noam") schedule, dropout,
gradient clipping, token-count batches, periodic validation, resumable checkpoints.

Model selection (``TrainConfig.select``): ``"last"`` keeps the model of the last step;
``"bleu"`` / ``"loss"`` keep the weights of the evaluation with the best validation BLEU
(greedy) / validation loss, and with ``patience`` training stops once that many
evaluations in a row have not improved on it (early stopping; Prechelt, "Early Stopping
— But When?", Neural Networks: Tricks of the Trade, 1998,
https://doi.org/10.1007/3-540-49430-8_3).  The returned model is the kept one.

Under ``torchrun`` (see :mod:`.distributed`) the loop wraps the model in
``DistributedDataParallel`` and each rank trains on its shard of every global batch;
every rank evaluates the same (identical) model and rank 0's stopping decision is
broadcast, so all ranks stop together.  Only rank 0 writes checkpoints.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import torch

import softargmax as sa

from .._common import (
    Log,
    atomic_path,
    check_checkpoint_every,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from .._progress import Interrupts, JobLeft, StepTimer, advance, format_seconds, progress_bar
from . import distributed
from .data import Parallel
from .decoding import pad_batch, translate
from .model import ModelConfig, OutputLayer, Seq2Seq
from .tokenizer import BOS, EOS, PAD, Tokenizer

#: a training pair (source ids, target ids), and the three padded tensors of a batch (source, target in, target out)
Pair = tuple[list[int], list[int]]
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_tokens: int = 4096
    lr: float = 2.0
    warmup: int = 400
    betas: tuple = (0.9, 0.998)
    clip: float = 1.0
    eval_every: int = 200
    val_bleu_sentences: int = 200
    seed: int = 0
    max_len: int = 100
    weight_decay: float = 0.0  # decoupled (AdamW) when > 0
    label_smoothing: float = 0.0
    select: str = "last"  # "last", "bleu" or "loss": which evaluated model to keep
    patience: Optional[int] = None  # stop after this many evaluations without improvement
    bf16: bool = False  # bfloat16 autocast of the model on CUDA (the loss is computed in float32)
    save_every_eval: bool = True  # checkpoint at every evaluation (else only at the end)

    def __post_init__(self) -> None:
        if self.select not in ("last", "bleu", "loss"):
            raise ValueError(f"select must be 'last', 'bleu' or 'loss', got {self.select!r}")
        if self.patience is not None and (not isinstance(self.patience, int) or self.patience < 1):
            raise ValueError(f"patience must be a positive integer or None, got {self.patience!r}")
        if self.patience is not None and self.select == "last":
            raise ValueError("patience needs select='bleu' or 'loss' (a kept model to compare with)")

    def autocast(self, device: str) -> Optional[str]:
        """The dtype the Transformer computes in under autocast on ``device``: ``"bfloat16"`` with ``bf16`` on CUDA,
        else ``None`` (float32; ``bf16`` has no effect on other devices)."""
        return "bfloat16" if self.bf16 and str(device).startswith("cuda") else None


def make_batches(src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]], batch_tokens: int, seed: int,
                 max_len: int) -> tuple[list[Pair], list[list[int]]]:
    """Length-bucketed batches of about ``batch_tokens`` target tokens, shuffled by ``seed``."""
    pairs = [(s[: max_len - 1], t[: max_len - 1]) for s, t in zip(src_ids, tgt_ids) if s and t]
    rng = random.Random(seed)
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][1]), rng.random()))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        longest = max(longest, len(pairs[i][1]) + 1)
        if cur and longest * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, longest = [], len(pairs[i][1]) + 1
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return pairs, batches


def tensors(pairs: Sequence[Pair], batch: Sequence[int], device: Union[str, torch.device]) -> Batch:
    src = pad_batch([pairs[i][0] + [EOS] for i in batch], device)
    tgt_in = pad_batch([[BOS] + pairs[i][1] for i in batch], device)
    tgt_out = pad_batch([pairs[i][1] + [EOS] for i in batch], device)
    return src, tgt_in, tgt_out


def noam(step: int, d_model: int, warmup: int, factor: float) -> float:
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def calibrate_tau(model: Seq2Seq, layer: OutputLayer, batch: Batch, alpha: float = 1.5) -> float:
    """τ of 1.5-ReLU: the mean 1.5-entmax threshold of the untrained model's first batch (Tezekbayev et al., "Speeding Up Entmax", 2022, §3.1)."""
    model.eval()
    with torch.no_grad():
        src, tgt_in, tgt_out = batch
        logits = model(src, tgt_in)
        keep = tgt_out != PAD
        tau = float(sa.alpha_relu_tau.from_logits(logits[keep], alpha))
    model.train()
    return tau


@torch.no_grad()
def validation_loss(model: Seq2Seq, layer: OutputLayer, pairs: Sequence[Pair], batches: Sequence[Sequence[int]],
                    device: Union[str, torch.device]) -> float:
    model.eval()
    total, count = 0.0, 0
    for b in batches:
        src, tgt_in, tgt_out = tensors(pairs, b, device)
        loss = layer.loss(model(src, tgt_in), tgt_out, reduction="sum")
        total += float(loss)
        count += int((tgt_out != PAD).sum())
    model.train()
    return total / max(count, 1)


def _save_best(best_state: dict, step: int, path: Path) -> None:
    """``best.pt``: the kept model alone, ``{"model": state_dict, "step": step}`` (atomically)."""
    with atomic_path(path) as tmp:
        torch.save({"model": best_state, "step": step}, tmp)


def _improves(entry: dict, best: Optional[dict], select: str) -> bool:
    if best is None:
        return True
    if select == "bleu":
        return entry["val_bleu"] > best["val_bleu"]
    return entry["val_loss"] < best["val_loss"]


def _optimizer(model: Seq2Seq, model_cfg: ModelConfig,
               cfg: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam (AdamW with weight decay) and the inverse-square-root schedule with warm-up."""
    opt: torch.optim.Optimizer
    if cfg.weight_decay:
        opt = torch.optim.AdamW(model.parameters(), lr=1.0, betas=cfg.betas, eps=1e-9, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=cfg.betas, eps=1e-9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: noam(s + 1, model_cfg.d_model, cfg.warmup, cfg.lr))


def _progress(label: str, record: dict, cfg: TrainConfig, step: int, timer: StepTimer, shown: float, world: int,
              job: JobLeft) -> str:
    """The progress line: the step's loss, the throughput and the time left at the pace of the recent steps (this
    run's training, and the whole job's where ``job`` estimates it)."""
    left = timer.seconds_left(cfg.steps)  # none before two steps were timed (the first pays for warm-up)
    eta = "" if left is None else f", ETA {timer.eta(cfg.steps)}"
    whole = None if job is None or left is None else job(left, timer.per_step)
    if whole is not None:
        eta += f" (whole job: {format_seconds(whole)})"
    return (f"[{label}] step {step}/{cfg.steps} loss {shown:.3f}{' (rank 0 shard)' if world > 1 else ''} "
            f"{record['train_tokens'] / record['train_seconds']:.0f} tok/s{eta}")


@contextlib.contextmanager
def _bar(main: bool, total: int, label: str, start: int) -> Iterator[Any]:
    """The progress bar of rank 0 (:func:`.._progress.progress_bar`: on a terminal only); ``None`` elsewhere."""
    if not main:
        yield None
        return
    with progress_bar(total, label, start) as bar:
        yield bar


def _selected(entry: dict, best_entry: Optional[dict], best_state: Optional[dict], model: Seq2Seq, record: dict,
              cfg: TrainConfig, label: str, log: Log, best_path: Optional[Path]) -> tuple[Optional[dict], Optional[dict]]:
    """Model selection at an evaluation: the kept ``(entry, weights)``; ``best.pt`` written when they change
    (where ``best_path`` is given and every evaluation checkpoints)."""
    if cfg.select != "last" and _select(entry, best_entry, record, cfg, f"[{label}]", log):
        best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if best_path is not None and cfg.save_every_eval:
            _save_best(best_state, entry["step"], best_path)
        return entry, best_state
    return best_entry, best_state


def _every(step: int, every: Optional[int], also: Optional[int] = None) -> bool:
    """Whether ``step`` is a multiple of ``every`` (``None``: never) or is ``also``."""
    if not every:
        return step == also
    return step % every == 0 or step == also


def _stopped(save: Any, possible: list, needed: bool, what: str, log: Log) -> None:
    """A Ctrl-C or SIGTERM between two steps: where ``possible`` holds (one process, steps done, not broken into
    mid-step), save a checkpoint (where the last one is older) and say so."""
    if not all(possible):
        return
    if needed:
        save()
    log(f"{what}: checkpoint saved, the run continues from it")


def _restore(state: dict, model: Seq2Seq, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR,
             layer: OutputLayer, rank: int, world: int, label: str, log: Log) -> dict:
    """Load a checkpoint's training state and this rank's random-number state; returns its record."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    record = state["record"]
    layer.tau = record.get("tau", 0.0)
    rngs = state["rng"]
    if len(rngs) != world:
        log(f"{label} the checkpoint was written by {len(rngs)} process(es), this run has {world}: the "
            "resumed steps draw other dropout masks than an uninterrupted run would")
    set_rng_state(rngs[rank] if len(rngs) == world else rngs[0])
    log(f"{label} resumed at step {record['steps_done']}")
    return record


def _calibrate(model: Seq2Seq, layer: OutputLayer, first_batch: Batch, model_cfg: ModelConfig, record: dict,
               label: str, log: Log) -> None:
    """α-ReLU's τ from the untrained model's first batch, into ``layer`` and ``record``."""
    layer.tau = calibrate_tau(model, layer, first_batch)
    record["tau"] = layer.tau
    record["tau_formula"] = sa.alpha_relu_tau.gaussian(
        model_cfg.vocab_size, sa.alpha_relu_tau.linear_logit_std(model_cfg.d_model, model_cfg.vocab_size))
    log(f"{label} tau from the untrained model's first batch: {layer.tau:.4f} "
        f"(data-free estimate {record['tau_formula']:.4f})")


def _select(entry: dict, best_entry: Optional[dict], record: dict, cfg: TrainConfig, label: str, log: Log) -> bool:
    """Model selection at an evaluation: whether ``entry`` is kept (``record`` updated), and early stopping
    after ``cfg.patience`` evaluations without improvement (``record["stopped_early"]``)."""
    # every rank evaluated the same model; rank 0 decides for all of them
    improved = distributed.broadcast(_improves(entry, best_entry, cfg.select))
    if improved:
        record.update(kept_step=entry["step"], kept_val_bleu=entry["val_bleu"], kept_val_loss=entry["val_loss"])
    since = sum(1 for e in record["history"] if e["step"] > record["kept_step"])
    if cfg.patience is not None and since >= cfg.patience:
        record["stopped_early"] = True
        log(f"{label} stopping at step {entry['step']}: no better validation "
            f"{'BLEU' if cfg.select == 'bleu' else 'loss'} in {since} evaluations; keeping step {record['kept_step']}")
    return improved


def _complete(record: dict, step: int, start_step: int, wall_seconds: float, world: int) -> None:
    """The record's summary of this run: processes, wall time, steps, time per step and throughput."""
    record["processes"] = world
    record["wall_seconds_this_run"] = wall_seconds
    record["steps_this_run"] = step - start_step
    record["seconds_per_step"] = record["train_seconds"] / max(step, 1)
    record["tokens_per_second"] = record["train_tokens"] / max(record["train_seconds"], 1e-9)


def _step(net: torch.nn.Module, model: Seq2Seq, layer: OutputLayer, opt: torch.optim.Optimizer,
          sched: torch.optim.lr_scheduler.LambdaLR, cfg: TrainConfig, batch: Batch, rank_tokens: int, ntok: int,
          world: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step on this rank's ``batch`` (``(src, tgt_in, tgt_out)``, ``rank_tokens`` target tokens)
    of a global batch of ``ntok`` target tokens; returns ``(the loss to show, this step's contribution to the
    per-token training loss)`` (under ``torchrun``: this rank's loss per token, and its share of the global
    batch's, summed over the ranks later)."""
    src, tgt_in, tgt_out = batch
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.autocast(device) == "bfloat16"):
        logits = net(src, tgt_in)
    if world == 1:
        loss = layer.loss(logits.float(), tgt_out)
        shown, contribution = loss.detach(), loss.detach()
    else:
        # rank sums / global token count, times N because DDP averages the gradients over the N ranks
        local = layer.loss(logits.float(), tgt_out, reduction="sum") * (1.0 if rank_tokens else 0.0)
        loss = local * (world / ntok)
        shown, contribution = local.detach() / max(1, rank_tokens), local.detach() / ntok
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    opt.step()
    sched.step()
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return shown, contribution


def _validate(model: Seq2Seq, layer: OutputLayer, tok: Tokenizer, val: Parallel,
              valid_batches: tuple[Sequence[Pair], Sequence[Sequence[int]]], cfg: TrainConfig,
              device: Union[str, torch.device], step: int, train_seconds: float, learn_alpha: bool) -> dict:
    """An evaluation entry: validation loss, greedy BLEU on the first ``cfg.val_bleu_sentences`` sentences,
    and the learned α of the attention heads where they are learned."""
    import sacrebleu

    vloss = validation_loss(model, layer, *valid_batches, device)
    sub = val.head(cfg.val_bleu_sentences)
    hyps = translate(model, layer, tok, sub.src, beam=1, device=device)
    vbleu = sacrebleu.corpus_bleu(hyps, [sub.tgt]).score
    model.train()
    entry: dict[str, Any] = {"step": step, "train_seconds": train_seconds, "val_loss": vloss, "val_bleu": vbleu}
    if learn_alpha:
        entry["alphas"] = {k: v.tolist() for k, v in sa.analysis.alphas(model).items()}
    return entry


def _data_parallel(model: Seq2Seq, device: Union[str, torch.device]) -> torch.nn.Module:
    """``model`` wrapped for data parallelism over the ``torchrun`` processes."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[torch.device(device).index] if str(device).startswith("cuda")
                                   else None)


def _kept_entry(record: dict) -> Optional[dict]:
    """The evaluation entry of the kept model (model selection), if one was kept."""
    if record.get("kept_step") is None:
        return None
    return next((e for e in record["history"] if e["step"] == record["kept_step"]), None)


def _keep(model: Seq2Seq, best_state: Optional[dict], record: dict, step: int, cfg: TrainConfig,
          best_path: Optional[Path]) -> None:
    """At the end of training: load the kept model (model selection) into ``model``, and write ``best_path``
    (where given) unless every evaluation wrote it already; with ``select="last"`` the last step is kept."""
    if best_path is not None and not cfg.save_every_eval and best_state is not None:
        _save_best(best_state, record["kept_step"], best_path)
    if cfg.select != "last" and best_state is not None:
        model.load_state_dict(best_state)
    else:
        record["kept_step"] = step


def _build_model(model_cfg: ModelConfig, attention: Optional[dict], device: Union[str, torch.device]) -> Seq2Seq:
    """A freshly initialized model, its attention blocks converted where ``attention`` asks (same weights)."""
    model = Seq2Seq(model_cfg).to(device)
    if attention:
        sa.nn.convert_attention(model, **attention)
    return model


def train_system(
    system: str,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    tok: Tokenizer,
    train_pairs: Parallel,
    val: Parallel,
    out_dir: Path,
    device: str = "cpu",
    log: Log = print,
    resume: bool = True,
    attention: Optional[dict] = None,
    name: Optional[str] = None,
    fingerprint: Optional[dict] = None,
    checkpoint_every: Optional[int] = None,
    job_left: JobLeft = None,
) -> dict:
    """Train one system; returns its record (history, timings, τ).  Resumes from ``out_dir/checkpoint.pt``.

    ``job_left``, where given, is called with the seconds left of this run's training steps and the current
    seconds per step, and returns the seconds left of the whole job (its progress lines and bar show both).

    ``system`` names the output layer and its loss.  ``attention``, if given, holds the
    keyword arguments of :func:`softargmax.nn.convert_attention` (``mapping``, ``alpha``,
    ``learn_alpha``): every attention block of the freshly initialized model is converted
    (same weights, so all variants start from the same initialization).  Learned α are
    ordinary parameters of the same Adam optimizer.  ``name`` labels the log lines.

    The record's ``train_loss`` lists the per-token training loss of every step (of the
    global batch under ``torchrun``); ``kept_step`` is the step of the returned model.

    Checkpoints (:func:`softargmax.experiments._common.save_checkpoint`, the last two kept)
    are written at every evaluation (``cfg.save_every_eval``), every ``checkpoint_every``
    steps when given, and at the end.  Each holds the model, the optimizer, the schedule,
    the record, the kept model (model selection), the data position and every random-number
    state (:func:`~softargmax.experiments._common.rng_state`; of every rank under
    ``torchrun``), so that a run resumed from any of them (``resume=True``) continues
    exactly as the uninterrupted run: the same dropout masks and batches, bit for bit on the
    same machine and thread count.  ``fingerprint`` (default: the system, the seed and the
    library version) is stored in each; a checkpoint with another fingerprint raises
    :class:`~softargmax.experiments._common.CheckpointMismatchError`, and one that cannot be
    read is reported and replaced by the previous one, or by training from scratch.
    ``best.pt`` holds the kept model alone (``{"model", "step"}``) for those who load it.
    """
    rank, world = distributed.rank_and_world()
    main = rank == 0
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = _build_model(model_cfg, attention, device)
    layer = OutputLayer(system, label_smoothing=cfg.label_smoothing)
    label = name or system
    opt, sched = _optimizer(model, model_cfg, cfg)
    pairs, batches = make_batches(tok.encode(train_pairs.src), tok.encode(train_pairs.tgt), cfg.batch_tokens, cfg.seed, cfg.max_len)
    vpairs, vbatches = make_batches(tok.encode(val.src), tok.encode(val.tgt), cfg.batch_tokens, 0, cfg.max_len)
    check_checkpoint_every(checkpoint_every)
    record: dict[str, Any] = {"system": label, "history": [], "train_seconds": 0.0, "train_tokens": 0, "steps_done": 0, "train_loss": []}
    ckpt, best_path = out_dir / "checkpoint.pt", out_dir / "best.pt"
    fingerprint = fingerprint or {"system": system, "seed": cfg.seed, "softargmax": sa.__version__}
    state = load_checkpoint(ckpt, fingerprint, map_location=device, log=log, set_aside=main,
                            label=f"[{label}] ") if resume else None
    if state is not None:
        record = _restore(state, model, opt, sched, layer, rank, world, f"[{label}]", log)
    elif layer.system == "alpha_relu":
        _calibrate(model, layer, tensors(pairs, batches[0], device), model_cfg, record, f"[{label}]", log)
    best_state = None if state is None else state.get("best")
    net = _data_parallel(model, device) if world > 1 else model
    best_entry = _kept_entry(record) if cfg.select != "last" else None
    model.train()
    step = start_step = record["steps_done"]
    epoch_pos = state["data"]["position"] if state is not None else 0
    pending: list[torch.Tensor] = []  # per-step loss contributions not yet gathered into record["train_loss"]
    saved_step = step if state is not None else None

    def gather_losses() -> None:
        if pending:
            record["train_loss"].extend(distributed.sum_tensor(torch.stack(pending)).tolist())
            pending.clear()

    def save() -> None:
        """Checkpoint the whole training state (a collective under torchrun: every rank calls it)."""
        nonlocal saved_step
        gather_losses()
        rngs = distributed.gather_objects(rng_state())
        if main:
            save_checkpoint(ckpt, {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                                   "record": record, "best": best_state, "rng": rngs,
                                   "data": {"position": epoch_pos, "batches": len(batches)}}, fingerprint)
        saved_step = step

    def evaluate() -> None:
        """Validation at ``step``, model selection, and the checkpoint of the evaluation."""
        nonlocal best_entry, best_state
        gather_losses()
        entry = _validate(model, layer, tok, val, (vpairs, vbatches), cfg, device, step, record["train_seconds"],
                          learn_alpha=bool(attention and attention.get("learn_alpha")))
        record["history"].append(entry)
        log(f"[{label}] step {step}: val loss {entry['val_loss']:.3f}, val BLEU (greedy, "
            f"{len(val.head(cfg.val_bleu_sentences))} sentences) {entry['val_bleu']:.2f}")
        best_entry, best_state = _selected(entry, best_entry, best_state, model, record, cfg, label, log,
                                           best_path if main else None)
        if cfg.save_every_eval:
            save()

    t_start = time.perf_counter()
    eta = StepTimer(start_step)  # the time left, from the recent steps
    with Interrupts() as interrupts, _bar(main, cfg.steps, label, start_step) as bar:
        try:
            while step < cfg.steps and not record.get("stopped_early"):
                # Ctrl-C / SIGTERM wait for the step (and its evaluation, its checkpoint) to end, so that the
                # checkpoint saved then is the state of the uninterrupted run at that step; a second one does not wait
                with interrupts.held():
                    b = batches[epoch_pos]
                    mine = distributed.shard(b, rank, world)
                    ntok = sum(len(pairs[i][1]) + 1 for i in b)  # target tokens of the global batch (with EOS)
                    t0 = time.perf_counter()
                    shown, contribution = _step(net, model, layer, opt, sched, cfg,
                                                tensors(pairs, mine or b[:1], device),
                                                sum(len(pairs[i][1]) + 1 for i in mine), ntok, world, device)
                    epoch_pos = (epoch_pos + 1) % len(batches)
                    pending.append(contribution)
                    dt = time.perf_counter() - t0
                    step += 1
                    record["train_seconds"] += dt
                    record["train_tokens"] += ntok
                    record["train_tokens_this_rank"] = (record.get("train_tokens_this_rank", 0)
                                                        + sum(len(pairs[i][1]) + 1 for i in mine))
                    record["steps_done"] = step
                    advance(bar, eta, step, cfg.steps, float(shown), job_left)
                    if _every(step, max(1, cfg.eval_every // 4), 1):
                        log(_progress(label, record, cfg, step, eta, float(shown), world, job_left))
                    if _every(step, cfg.eval_every, cfg.steps):
                        evaluate()
                    if _every(step, checkpoint_every) and saved_step != step:
                        save()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep the steps done (one process: a collective needs all)
            _stopped(save, [world == 1, step > start_step, interrupts.consistent], saved_step != step,
                     f"[{label}] stopped at step {step}", log)
            raise
    gather_losses()
    if step > start_step and saved_step != step:
        save()  # the last step is always saved: a resumed finished run only evaluates
    _keep(model, best_state, record, step, cfg, best_path if step > start_step and main else None)
    _complete(record, step, start_step, time.perf_counter() - t_start, world)
    return {"model": model, "layer": layer, "record": record}
