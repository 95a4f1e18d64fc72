r"""Evaluating a trained language model: per-token scores under its own f-softargmax and the classical softargmax,
samples from either, and interleaved timings of training steps.

:func:`score_tokens` predicts every token of a split once (:func:`.data.eval_windows`) and
keeps, per token: whether the arg-max is right, the probability the model's own distribution
:math:`p = \mathrm{softargmax}_f(\theta; q)` gives the observed token, the probability the classical
:math:`\mathrm{softmax}(\theta)` gives it, the support size of :math:`p`, and whether the arg-max of
:math:`p` is the arg-max of :math:`\mathrm{softmax}(\theta)`.  The logits are computed ``rows`` windows at a time.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

import softargmax as sa

from .data import Stream, eval_windows
from .model import Decoder
from .training import reference_measure, training_loss


@torch.no_grad()
def score_tokens(model: Decoder, log_q: Optional[Tensor], mapping: str, stream: Stream, rows: int = 16) -> dict:
    """Per-token arrays (NumPy): ``correct``, ``p_own``, ``p_softmax``, ``support``, ``same_argmax``, ``sentence``."""
    model.eval()
    q = reference_measure(log_q)
    device = model.embed.weight.device
    parts: dict[str, list[Any]] = {k: [] for k in ("correct", "p_own", "p_softmax", "support", "same_argmax", "sentence")}
    for x, y, sent in eval_windows(stream, model.cfg.context):
        for xb, yb, sb in zip(x.split(rows), y.split(rows), sent.split(rows)):
            logits = model.logits(model(xb.to(device))).reshape(-1, model.cfg.vocab).float()
            yy = yb.reshape(-1).to(device)
            soft = torch.softmax(logits, -1)
            own = soft if (mapping == "softmax" and q is None) else sa.sampling.probabilities(logits, mapping, q=q)
            pred = logits.argmax(-1) if q is None else own.argmax(-1)  # as :func:`.training.predictions`
            parts["correct"].append((pred == yy).cpu())
            parts["p_own"].append(own.gather(1, yy[:, None]).squeeze(1).double().cpu())
            parts["p_softmax"].append(soft.gather(1, yy[:, None]).squeeze(1).double().cpu())
            parts["support"].append((own > 0).sum(-1).cpu())
            parts["same_argmax"].append((pred == logits.argmax(-1)).cpu())
            parts["sentence"].append(sb.reshape(-1))
    return {k: torch.cat(v).numpy() for k, v in parts.items()}


def per_sentence(scores: dict, sentences: int) -> tuple[np.ndarray, np.ndarray]:
    """``(correct predictions, predictions)`` per sentence index, for the paired bootstrap."""
    s = scores["sentence"]
    return (np.bincount(s, weights=scores["correct"].astype(np.float64), minlength=sentences),
            np.bincount(s, minlength=sentences).astype(np.float64))


def summarize(scores: dict) -> dict:
    """Means over the tokens of :func:`score_tokens`; ``perplexity`` is ``None`` where some observed token has
    probability 0 (the sparse mappings)."""
    p, ps = scores["p_own"], scores["p_softmax"]
    zero = float(np.mean(p == 0))
    with np.errstate(divide="ignore"):
        nll = float(-np.mean(np.log(p))) if zero == 0 else None
    return {"accuracy": 100.0 * float(np.mean(scores["correct"])), "tokens": int(len(p)),
            "mean_p_true": float(np.mean(p)), "mean_p_true_softmax": float(np.mean(ps)),
            "support_mean": float(np.mean(scores["support"])), "support_median": float(np.median(scores["support"])),
            "zero_probability_share": zero, "nll": nll, "perplexity": None if nll is None else float(np.exp(nll)),
            "softmax_perplexity": float(np.exp(-np.mean(np.log(np.maximum(ps, 1e-300))))),
            "same_argmax_share": float(np.mean(scores["same_argmax"]))}


@torch.no_grad()
def generate(model: Decoder, log_q: Optional[Tensor], mapping: str, prompts: Tensor, length: int, seed: int) -> Tensor:
    """``length`` tokens after each prompt ``[n, P]``, each drawn from ``mapping(logits; q)`` at temperature 1
    (``sa.sample``); the context is cut to the model's last ``context`` tokens.  ``seed`` fixes the draws."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    q = reference_measure(log_q)
    seq = prompts.clone()
    device = model.embed.weight.device
    for _ in range(length):
        h = model(seq[:, -model.cfg.context:].to(device))[:, -1]
        nxt = sa.sample(model.logits(h).float().cpu(), mapping, q=None if q is None else q.cpu(), generator=gen)
        seq = torch.cat([seq, nxt], 1)
    return seq[:, prompts.shape[1]:]


def time_training_steps(entries: dict, batches: list, chunk: int, rounds: int) -> dict:
    """Median seconds of one training step's forward, loss and backward, per entry, measured round-robin.

    ``entries`` maps a name to ``(model, log_q, mapping)``; every round times each entry once on
    each batch of ``batches`` (``[(x, y)]``), so slow phases of a shared machine hit every entry alike.
    Returns ``{name: {"median_seconds": ..., "seconds": [...]}}``.
    """
    times: dict[str, list[float]] = {name: [] for name in entries}
    for r in range(rounds + 1):  # round 0 warms up
        for name, (model, log_q, mapping) in entries.items():
            model.train()
            cuda = model.embed.weight.is_cuda
            for x, y in batches:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss = training_loss(model, log_q, mapping, x, y, chunk)
                loss.backward()
                if cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                model.zero_grad(set_to_none=True)
                if log_q is not None:
                    log_q.grad = None
                if r:
                    times[name].append(dt)
            model.eval()
    return {name: {"median_seconds": statistics.median(t), "seconds": t} for name, t in times.items()}
