"""Batched beam search with the statistics the papers report.

Scores are sums of ``log p`` of the system's next-token scores (for 1.5-ReLU these are
unnormalized, as in Tezekbayev et al., "Speeding Up Entmax",
Findings of NAACL 2022, https://arxiv.org/abs/2111.06832), with no length penalty, the setting of the
"cat got your tongue" analysis (ibid., Table 2).  Zero-probability tokens have score
``-inf`` and are never expanded; a beam with fewer live continuations than its width
keeps ``-inf`` placeholders.  A sentence is finished when its best-scoring candidate
ends with EOS (the rule of OpenNMT-py, which the paper used), when no continuation has
a nonzero probability, or at the length limit.

While decoding, every step of every live hypothesis records the number of exact zeros
among the next-token probabilities and the sum of the scores (``Σ_i α-ReLU_i(z)`` for
1.5-ReLU, ibid., Fig. 9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

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
def beam_search(model: Seq2Seq, layer: OutputLayer, src: Tensor, beam: int = 4, max_len: Optional[int] = None,
                stats: Optional[DecodeStats] = None):
    """Translate a padded batch ``src`` ``[N, S]``; returns ``(token lists, scores)``.

    Finished sentences leave the batch (as in OpenNMT-py), so a sentence that never
    ends only costs its own steps; each sentence stops at ``2 * its source length + 10``
    tokens (or ``max_len``).
    """
    model.eval()
    N, _ = src.shape
    device = src.device
    src_len = (src != PAD).sum(1).tolist()
    limit = [min(model.cfg.max_len - 1, max_len or (2 * n + 10)) for n in src_len]
    memory, mask = model.encode(src)
    memory = memory.repeat_interleave(beam, 0)
    mask = mask.repeat_interleave(beam, 0)
    tokens = torch.full((N * beam, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((N, beam), -math.inf, device=device)
    scores[:, 0] = 0.0
    finished = [[] for _ in range(N)]
    active = list(range(N))
    t = 0
    while active:
        rows = torch.tensor([i * beam + b for i in active for b in range(beam)], device=device)
        logits = model.decode(tokens[rows], memory[rows], mask[rows])[:, -1]
        p = layer.probs(logits.float())
        sc_active = scores[active]
        live = torch.isfinite(sc_active).reshape(-1)
        if stats is not None and bool(live.any()):
            stats.add(p[live])
        logp = torch.log(p).view(len(active), beam, -1)
        V = logp.shape[-1]
        cand = (sc_active.unsqueeze(-1) + logp).view(len(active), beam * V)
        top, idx = cand.topk(min(2 * beam, beam * V), dim=-1)
        next_tok = torch.full((N, beam), PAD, dtype=torch.long, device=device)
        src_rows = torch.arange(N * beam, device=device).view(N, beam).clone()
        still = []
        for a, i in enumerate(active):
            k, done = 0, False
            new_sc = [-math.inf] * beam
            for rank, (sc, ix) in enumerate(zip(top[a].tolist(), idx[a].tolist())):
                if sc == -math.inf or k == beam:
                    break
                b, tok = divmod(ix, V)
                if tok == EOS:
                    finished[i].append((sc, tokens[i * beam + b, 1:].tolist()))
                    if rank == 0:  # the best candidate ends: this sentence is decoded (OpenNMT's rule)
                        done = True
                        break
                    continue
                src_rows[i, k] = i * beam + b
                next_tok[i, k] = tok
                new_sc[k] = sc
                k += 1
            scores[i] = torch.tensor(new_sc, device=device)
            if done or k == 0 or t + 1 >= limit[i]:
                if not done and k > 0 and not finished[i]:
                    # length limit: keep the best unfinished hypothesis
                    b0 = int(src_rows[i, 0])
                    finished[i].append((new_sc[0], tokens[b0, 1:].tolist() + [int(next_tok[i, 0])]))
                scores[i] = -math.inf
            else:
                still.append(i)
        tokens = torch.cat([tokens[src_rows.view(-1)], next_tok.view(-1, 1)], 1)
        active = still
        t += 1
    out, out_scores = [], []
    for i in range(N):
        if finished[i]:
            sc, seq = max(finished[i], key=lambda f: f[0])
        else:
            sc, seq = -math.inf, []
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
