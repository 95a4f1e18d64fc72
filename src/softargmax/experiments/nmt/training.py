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

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

import softargmax as sa

from . import distributed
from .decoding import pad_batch, translate
from .model import ModelConfig, OutputLayer, Seq2Seq
from .tokenizer import BOS, EOS, PAD


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

    def __post_init__(self):
        if self.select not in ("last", "bleu", "loss"):
            raise ValueError(f"select must be 'last', 'bleu' or 'loss', got {self.select!r}")
        if self.patience is not None and (not isinstance(self.patience, int) or self.patience < 1):
            raise ValueError(f"patience must be a positive integer or None, got {self.patience!r}")
        if self.patience is not None and self.select == "last":
            raise ValueError("patience needs select='bleu' or 'loss' (a kept model to compare with)")


def make_batches(src_ids, tgt_ids, batch_tokens: int, seed: int, max_len: int):
    """Length-bucketed batches of about ``batch_tokens`` target tokens, shuffled by ``seed``."""
    pairs = [(s[: max_len - 1], t[: max_len - 1]) for s, t in zip(src_ids, tgt_ids) if s and t]
    rng = random.Random(seed)
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][1]), rng.random()))
    batches, cur, longest = [], [], 0
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


def tensors(pairs, batch, device):
    src = pad_batch([pairs[i][0] + [EOS] for i in batch], device)
    tgt_in = pad_batch([[BOS] + pairs[i][1] for i in batch], device)
    tgt_out = pad_batch([pairs[i][1] + [EOS] for i in batch], device)
    return src, tgt_in, tgt_out


def noam(step: int, d_model: int, warmup: int, factor: float) -> float:
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def calibrate_tau(model: Seq2Seq, layer: OutputLayer, batch, alpha: float = 1.5) -> float:
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
def validation_loss(model, layer, pairs, batches, device) -> float:
    model.eval()
    total, count = 0.0, 0
    for b in batches:
        src, tgt_in, tgt_out = tensors(pairs, b, device)
        loss = layer.loss(model(src, tgt_in), tgt_out, reduction="sum")
        total += float(loss)
        count += int((tgt_out != PAD).sum())
    model.train()
    return total / max(count, 1)


def _improves(entry: dict, best: Optional[dict], select: str) -> bool:
    if best is None:
        return True
    if select == "bleu":
        return entry["val_bleu"] > best["val_bleu"]
    return entry["val_loss"] < best["val_loss"]


@dataclass
class _Run:
    """What one system's training holds while it runs (:func:`train_system`)."""

    model: Seq2Seq
    layer: OutputLayer
    opt: torch.optim.Optimizer
    sched: object
    record: dict
    cfg: TrainConfig
    label: str
    log: object
    main: bool
    ckpt: Path
    best_path: Path
    best_entry: Optional[dict] = None
    best_state: Optional[dict] = None

    def save(self) -> None:
        """The checkpoint: model, optimizer, schedule and record."""
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                    "record": self.record}, self.ckpt)


def _optimizer(model: Seq2Seq, model_cfg: ModelConfig, cfg: TrainConfig):
    """Adam (AdamW with weight decay) and the inverse-square-root schedule with warm-up."""
    if cfg.weight_decay:
        opt = torch.optim.AdamW(model.parameters(), lr=1.0, betas=cfg.betas, eps=1e-9, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=cfg.betas, eps=1e-9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: noam(s + 1, model_cfg.d_model, cfg.warmup, cfg.lr))


def _resume_or_calibrate(run: _Run, resume: bool, device, first_batch, model_cfg: ModelConfig) -> None:
    """Load ``run.ckpt`` (and the best model) when resuming; otherwise calibrate α-ReLU's τ on the first batch."""
    if resume and run.ckpt.exists():
        state = torch.load(run.ckpt, weights_only=False, map_location=device)
        run.model.load_state_dict(state["model"])
        run.opt.load_state_dict(state["opt"])
        run.sched.load_state_dict(state["sched"])
        run.record = state["record"]
        run.record.setdefault("train_loss", [])
        run.layer.tau = run.record.get("tau", 0.0)
        if run.cfg.select != "last" and run.best_path.exists():
            run.best_state = torch.load(run.best_path, weights_only=False, map_location=device)["model"]
        run.log(f"[{run.label}] resumed at step {run.record['steps_done']}")
    elif run.layer.system == "alpha_relu":
        run.layer.tau = calibrate_tau(run.model, run.layer, first_batch())
        run.record["tau"] = run.layer.tau
        run.record["tau_formula"] = sa.alpha_relu_tau.gaussian(
            model_cfg.vocab_size, sa.alpha_relu_tau.linear_logit_std(model_cfg.d_model, model_cfg.vocab_size))
        run.log(f"[{run.label}] tau from the untrained model's first batch: {run.layer.tau:.4f} "
                f"(data-free estimate {run.record['tau_formula']:.4f})")
    if run.cfg.select != "last" and run.record.get("kept_step") is not None:
        run.best_entry = next((e for e in run.record["history"] if e["step"] == run.record["kept_step"]), None)


def _progress(run: _Run, step: int, start_step: int, t_start: float, shown: float, world: int) -> None:
    """The progress line: the step's loss, the throughput and the time left."""
    # time left: this run's wall clock per step so far (training and the evaluations done, so it
    # improves as steps are measured); the first step, which pays for warm-up, shows none
    steps_now = step - start_step
    eta = ""
    if steps_now > 1:
        per = (time.perf_counter() - t_start) / steps_now
        eta = f", ETA {per * (run.cfg.steps - step) / 60:.1f} min"
    record = run.record
    run.log(f"[{run.label}] step {step}/{run.cfg.steps} loss {shown:.3f}{' (rank 0 shard)' if world > 1 else ''} "
            f"{record['train_tokens'] / record['train_seconds']:.0f} tok/s{eta}")


def _evaluate(run: _Run, step: int, entry: dict, sentences: int) -> None:
    """Record an evaluation ``entry`` (BLEU on ``sentences`` sentences); keep the model if it is the best so
    far (``cfg.select``) and stop after ``cfg.patience`` evaluations without improvement."""
    cfg, record = run.cfg, run.record
    record["history"].append(entry)
    run.log(f"[{run.label}] step {step}: val loss {entry['val_loss']:.3f}, val BLEU (greedy, {sentences} sentences) "
            f"{entry['val_bleu']:.2f}")
    if cfg.select != "last":
        # every rank evaluated the same model; rank 0 decides for all of them
        if distributed.broadcast(_improves(entry, run.best_entry, cfg.select)):
            run.best_entry = entry
            run.best_state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
            record.update(kept_step=step, kept_val_bleu=entry["val_bleu"], kept_val_loss=entry["val_loss"])
            if run.main and cfg.save_every_eval:
                torch.save({"model": run.best_state, "step": step}, run.best_path)
        since = sum(1 for e in record["history"] if e["step"] > record["kept_step"])
        if cfg.patience is not None and since >= cfg.patience:
            record["stopped_early"] = True
            run.log(f"[{run.label}] stopping at step {step}: no better validation "
                    f"{'BLEU' if cfg.select == 'bleu' else 'loss'} in {since} evaluations; "
                    f"keeping step {record['kept_step']}")
    if run.main and cfg.save_every_eval:
        run.save()


def _finish(run: _Run, step: int, start_step: int, t_start: float, world: int) -> dict:
    """Save what is left to save, restore the kept model and complete the record."""
    record = run.record
    if step > start_step and run.main and not run.cfg.save_every_eval:
        run.save()
        if run.best_state is not None:
            torch.save({"model": run.best_state, "step": record["kept_step"]}, run.best_path)
    if run.cfg.select != "last" and run.best_state is not None:
        run.model.load_state_dict(run.best_state)
    else:
        record["kept_step"] = step
    record["processes"] = world
    record["wall_seconds_this_run"] = time.perf_counter() - t_start
    record["steps_this_run"] = step - start_step
    record["seconds_per_step"] = record["train_seconds"] / max(step, 1)
    record["tokens_per_second"] = record["train_tokens"] / max(record["train_seconds"], 1e-9)
    return {"model": run.model, "layer": run.layer, "record": record}


def train_system(
    system: str,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    tok,
    train_pairs,
    val,
    out_dir: Path,
    device: str = "cpu",
    log=print,
    resume: bool = True,
    attention: Optional[dict] = None,
    name: Optional[str] = None,
) -> dict:
    """Train one system; returns its record (history, timings, τ).  Resumes from ``out_dir/checkpoint.pt``.

    ``system`` names the output layer and its loss.  ``attention``, if given, holds the
    keyword arguments of :func:`softargmax.nn.convert_attention` (``mapping``, ``alpha``,
    ``learn_alpha``): every attention block of the freshly initialized model is converted
    (same weights, so all variants start from the same initialization).  Learned α are
    ordinary parameters of the same Adam optimizer.  ``name`` labels the log lines.

    The record's ``train_loss`` lists the per-token training loss of every step (of the
    global batch under ``torchrun``); ``kept_step`` is the step of the returned model.
    """
    import sacrebleu

    rank, world = distributed.rank_and_world()
    cuda = str(device).startswith("cuda")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = Seq2Seq(model_cfg).to(device)
    if attention:
        sa.nn.convert_attention(model, **attention)
    layer = OutputLayer(system, label_smoothing=cfg.label_smoothing)
    opt, sched = _optimizer(model, model_cfg, cfg)
    pairs, batches = make_batches(tok.encode(train_pairs.src), tok.encode(train_pairs.tgt), cfg.batch_tokens, cfg.seed, cfg.max_len)
    vpairs, vbatches = make_batches(tok.encode(val.src), tok.encode(val.tgt), cfg.batch_tokens, 0, cfg.max_len)
    record = {"system": name or system, "history": [], "train_seconds": 0.0, "train_tokens": 0, "steps_done": 0,
              "train_loss": []}
    run = _Run(model, layer, opt, sched, record, cfg, name or system, log, rank == 0, out_dir / "checkpoint.pt",
               out_dir / "best.pt")
    _resume_or_calibrate(run, resume, device, lambda: tensors(pairs, batches[0], device), model_cfg)
    record = run.record
    net = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[torch.device(device).index] if cuda else None)
    model.train()
    step = start_step = record["steps_done"]
    epoch_pos = step % len(batches)
    pending = []  # per-step loss contributions not yet gathered into record["train_loss"]

    def gather_losses():
        if pending:
            record["train_loss"].extend(distributed.sum_tensor(torch.stack(pending)).tolist())
            pending.clear()

    t_start = time.perf_counter()
    while step < cfg.steps and not record.get("stopped_early"):
        b = batches[epoch_pos]
        epoch_pos = (epoch_pos + 1) % len(batches)
        mine = distributed.shard(b, rank, world)
        ntok = sum(len(pairs[i][1]) + 1 for i in b)  # target tokens of the global batch (with EOS)
        src, tgt_in, tgt_out = tensors(pairs, mine or b[:1], device)
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.bf16 and cuda):
            logits = net(src, tgt_in)
        if world == 1:
            loss = layer.loss(logits.float(), tgt_out)
            pending.append(loss.detach())
        else:
            # rank sums / global token count, times N because DDP averages the gradients over the N ranks
            local = layer.loss(logits.float(), tgt_out, reduction="sum") * (1.0 if mine else 0.0)
            loss = local * (world / ntok)
            pending.append(local.detach() / ntok)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        sched.step()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step += 1
        record["train_seconds"] += dt
        record["train_tokens"] += ntok
        record["train_tokens_this_rank"] = record.get("train_tokens_this_rank", 0) + sum(len(pairs[i][1]) + 1 for i in mine)
        record["steps_done"] = step
        if step % max(1, cfg.eval_every // 4) == 0 or step == 1:
            shown = loss.detach().item() if world == 1 else float(local.detach()) / max(1, sum(len(pairs[i][1]) + 1 for i in mine))
            _progress(run, step, start_step, t_start, shown, world)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            gather_losses()
            vloss = validation_loss(model, layer, vpairs, vbatches, device)
            sub = val.head(cfg.val_bleu_sentences)
            hyps = translate(model, layer, tok, sub.src, beam=1, device=device)
            vbleu = sacrebleu.corpus_bleu(hyps, [sub.tgt]).score
            model.train()
            entry = {"step": step, "train_seconds": record["train_seconds"], "val_loss": vloss, "val_bleu": vbleu}
            if attention and attention.get("learn_alpha"):
                entry["alphas"] = {k: v.tolist() for k, v in sa.analysis.alphas(model).items()}
            _evaluate(run, step, entry, len(sub))
    gather_losses()
    return _finish(run, step, start_step, t_start, world)
