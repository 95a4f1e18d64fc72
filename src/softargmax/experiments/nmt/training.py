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
    main = rank == 0
    cuda = str(device).startswith("cuda")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = Seq2Seq(model_cfg).to(device)
    if attention:
        sa.nn.convert_attention(model, **attention)
    layer = OutputLayer(system, label_smoothing=cfg.label_smoothing)
    label = name or system
    if cfg.weight_decay:
        opt = torch.optim.AdamW(model.parameters(), lr=1.0, betas=cfg.betas, eps=1e-9, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=cfg.betas, eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: noam(s + 1, model_cfg.d_model, cfg.warmup, cfg.lr))
    pairs, batches = make_batches(tok.encode(train_pairs.src), tok.encode(train_pairs.tgt), cfg.batch_tokens, cfg.seed, cfg.max_len)
    vpairs, vbatches = make_batches(tok.encode(val.src), tok.encode(val.tgt), cfg.batch_tokens, 0, cfg.max_len)
    record = {"system": label, "history": [], "train_seconds": 0.0, "train_tokens": 0, "steps_done": 0, "train_loss": []}
    ckpt, best_path = out_dir / "checkpoint.pt", out_dir / "best.pt"
    best_state = None
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        record = state["record"]
        record.setdefault("train_loss", [])
        layer.tau = record.get("tau", 0.0)
        if cfg.select != "last" and best_path.exists():
            best_state = torch.load(best_path, weights_only=False, map_location=device)["model"]
        log(f"[{label}] resumed at step {record['steps_done']}")
    elif layer.system == "alpha_relu":
        first = tensors(pairs, batches[0], device)
        layer.tau = calibrate_tau(model, layer, first)
        record["tau"] = layer.tau
        record["tau_formula"] = sa.alpha_relu_tau.gaussian(model_cfg.vocab_size, sa.alpha_relu_tau.linear_logit_std(model_cfg.d_model, model_cfg.vocab_size))
        log(f"[{label}] tau from the untrained model's first batch: {layer.tau:.4f} "
            f"(data-free estimate {record['tau_formula']:.4f})")
    net = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[torch.device(device).index] if cuda else None)
    best_entry = None
    if cfg.select != "last" and record.get("kept_step") is not None:
        best_entry = next((e for e in record["history"] if e["step"] == record["kept_step"]), None)
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
            # time left: this run's wall clock per step so far (training and the evaluations
            # done, so it improves as steps are measured); the first step, which pays for
            # warm-up, shows none
            steps_now = step - start_step
            eta = ""
            if steps_now > 1:
                per = (time.perf_counter() - t_start) / steps_now
                eta = f", ETA {per * (cfg.steps - step) / 60:.1f} min"
            log(f"[{label}] step {step}/{cfg.steps} loss {shown:.3f}{' (rank 0 shard)' if world > 1 else ''} "
                f"{record['train_tokens'] / record['train_seconds']:.0f} tok/s{eta}")
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
            record["history"].append(entry)
            log(f"[{label}] step {step}: val loss {vloss:.3f}, val BLEU (greedy, {len(sub)} sentences) {vbleu:.2f}")
            if cfg.select != "last":
                # every rank evaluated the same model; rank 0 decides for all of them
                improved = distributed.broadcast(_improves(entry, best_entry, cfg.select))
                if improved:
                    best_entry = entry
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    record.update(kept_step=step, kept_val_bleu=vbleu, kept_val_loss=vloss)
                    if main and cfg.save_every_eval:
                        torch.save({"model": best_state, "step": step}, best_path)
                since = sum(1 for e in record["history"] if e["step"] > record["kept_step"])
                if cfg.patience is not None and since >= cfg.patience:
                    record["stopped_early"] = True
                    log(f"[{label}] stopping at step {step}: no better validation "
                        f"{'BLEU' if cfg.select == 'bleu' else 'loss'} in {since} evaluations; "
                        f"keeping step {record['kept_step']}")
            if main and cfg.save_every_eval:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                            "record": record}, ckpt)
    gather_losses()
    if step > start_step and main and not cfg.save_every_eval:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "record": record}, ckpt)
        if best_state is not None:
            torch.save({"model": best_state, "step": record["kept_step"]}, best_path)
    if cfg.select != "last" and best_state is not None:
        model.load_state_dict(best_state)
    else:
        record["kept_step"] = step
    record["processes"] = world
    record["wall_seconds_this_run"] = time.perf_counter() - t_start
    record["steps_this_run"] = step - start_step
    record["seconds_per_step"] = record["train_seconds"] / max(step, 1)
    record["tokens_per_second"] = record["train_tokens"] / max(record["train_seconds"], 1e-9)
    return {"model": model, "layer": layer, "record": record}
