"""Batched beam search with the statistics the papers report.

Scores are sums of ``log p`` of the system's next-token scores (for 1.5-ReLU these are
unnormalized, as in ``001_…``), with no length penalty, the setting of the
"cat got your tongue" analysis (``001_…`` Table 2).  Zero-probability tokens have score
``-inf`` and are never expanded; a beam with fewer live continuations than its width
keeps ``-inf`` placeholders.  A sentence is finished when its best-scoring candidate
ends with EOS (the rule of OpenNMT-py, which the paper used), when no continuation has
a nonzero probability, or at the length limit.

While decoding, every step of every live hypothesis records the number of exact zeros
among the next-token probabilities and the sum of the scores (``Σ_i α-ReLU_i(z)`` for
1.5-ReLU, ``001_…`` Fig. 9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .model import OutputLayer, Seq2Seq
from .tokenizer import BOS, EOS, PAD


@dataclass
class DecodeStats:
    zeros: list = field(default_factory=list)  # number of exact zeros per (hypothesis, step)
    sums: list = field(default_factory=list)   # Σ p per (hypothesis, step)
    vocab: int = 0

    def add(self, p: Tensor) -> None:
        self.vocab = p.shape[-1]
        self.zeros.extend((p == 0).sum(-1).tolist())
        self.sums.extend(p.sum(-1).tolist())

    @property
    def zero_fraction(self) -> float:
        return float(sum(self.zeros) / (len(self.zeros) * self.vocab)) if self.zeros else 0.0


def pad_batch(seqs, device) -> Tensor:
    T = max(len(s) for s in seqs)
    out = torch.full((len(seqs), T), PAD, dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


@torch.no_grad()
def beam_search(model: Seq2Seq, layer: OutputLayer, src: Tensor, beam: int = 4, max_len: int = None,
                stats: DecodeStats = None):
    """Translate a padded batch ``src`` ``[N, S]``; returns ``(token lists, scores)``."""
    model.eval()
    N, S = src.shape
    device = src.device
    max_len = max_len or min(model.cfg.max_len - 1, 2 * S + 10)
    memory, mask = model.encode(src)
    memory = memory.repeat_interleave(beam, 0)
    mask = mask.repeat_interleave(beam, 0)
    tokens = torch.full((N * beam, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((N, beam), -math.inf, device=device)
    scores[:, 0] = 0.0
    finished = [[] for _ in range(N)]
    done = [False] * N
    for t in range(max_len):
        logits = model.decode(tokens, memory, mask)[:, -1]
        p = layer.probs(logits.float())
        live = torch.isfinite(scores).reshape(-1)
        if stats is not None and bool(live.any()):
            stats.add(p[live])
        logp = torch.log(p).view(N, beam, -1)
        V = logp.shape[-1]
        cand = (scores.unsqueeze(-1) + logp).view(N, beam * V)
        top, idx = cand.topk(min(2 * beam, beam * V), dim=-1)
        new_scores = torch.full((N, beam), -math.inf, device=device)
        src_rows = torch.zeros(N, beam, dtype=torch.long, device=device)
        next_tok = torch.full((N, beam), PAD, dtype=torch.long, device=device)
        for i in range(N):
            if done[i]:
                continue
            k = 0
            for rank, (sc, ix) in enumerate(zip(top[i].tolist(), idx[i].tolist())):
                if sc == -math.inf or k == beam:
                    break
                b, tok = divmod(ix, V)
                if tok == EOS:
                    finished[i].append((sc, tokens[i * beam + b, 1:].tolist()))
                    if rank == 0:  # the best candidate ends: this sentence is decoded (OpenNMT's rule)
                        done[i] = True
                        break
                    continue
                src_rows[i, k] = i * beam + b
                next_tok[i, k] = tok
                new_scores[i, k] = sc
                k += 1
            if k == 0:  # every continuation has probability zero
                done[i] = True
        if all(done):
            break
        for i in range(N):
            if done[i]:
                new_scores[i] = -math.inf
        tokens = torch.cat([tokens[src_rows.view(-1)], next_tok.view(-1, 1)], 1)
        scores = new_scores
    out, out_scores = [], []
    for i in range(N):
        if finished[i]:
            sc, seq = max(finished[i], key=lambda f: f[0])
        else:
            b = int(scores[i].argmax())
            sc, seq = float(scores[i, b]), tokens[i * beam + b, 1:].tolist()
        out.append(seq)
        out_scores.append(sc)
    return out, out_scores


@torch.no_grad()
def empty_string_scores(model: Seq2Seq, layer: OutputLayer, src: Tensor) -> list:
    """``log p(EOS | BOS, src)`` of every sentence: the score of the empty translation."""
    model.eval()
    memory, mask = model.encode(src)
    bos = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    logp = layer.log_probs(model.decode(bos, memory, mask)[:, -1].float())
    return logp[:, EOS].tolist()


def translate(model, layer, tok, sources, beam: int = 4, batch_size: int = 64, stats=None, device="cpu",
              return_scores: bool = False):
    """Translate sentences (strings) in length-sorted batches; returns detokenized strings (and scores)."""
    ids = tok.encode(sources)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    hyps, scores = [None] * len(ids), [None] * len(ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = pad_batch([ids[i][: model.cfg.max_len - 2] + [EOS] for i in chunk], device)
        out, sc = beam_search(model, layer, src, beam=beam, stats=stats)
        for i, o, s in zip(chunk, out, sc):
            hyps[i], scores[i] = o, s
    text = tok.decode(hyps)
    return (text, scores) if return_scores else text
