"""Samples of ``softargmax reproduce lm`` (the paper's Fig. 4 question): every loss's model continues the same
validation prompts with its own f-softargmax and with the classical softargmax.
"""

from __future__ import annotations

from typing import Any

import torch

from .data import Stream, Vocabulary
from .evaluation import generate
from .metrics import distinct_n, repetition
from .training import RunSpec


def _prompts(stream: Stream, P: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 7)
    span = P["prompt"] + P["sample_len"]
    start = torch.randint(0, len(stream.ids) - span, (P["samples"],), generator=gen)
    window = stream.ids[start[:, None] + torch.arange(span)]
    return window[:, : P["prompt"]], window[:, P["prompt"]:]


def _text_metrics(conts: torch.Tensor) -> dict:
    seqs = [c.tolist() for c in conts]
    return {"distinct_1": distinct_n(seqs, 1), "distinct_2": distinct_n(seqs, 2), "distinct_3": distinct_n(seqs, 3),
            "rep_16": repetition(seqs, 16)}


def draw_samples(specs: list, trained: dict, stream: Stream, vocab: Vocabulary, P: dict, seed: int) -> dict:
    """Samples of the first seed of every loss with q = 1: with its own f-softargmax and with the classical softargmax
    (the same prompts and the same seed of the draws for every model and rule)."""
    prompts, human = _prompts(stream, P, seed)
    words = vocab.text
    out: dict[str, Any] = {"human": {**_text_metrics(human), "examples": [words(human[i]) for i in range(min(3, len(human)))]},
           "prompts": [words(prompts[i]) for i in range(min(3, len(prompts)))], "models": {}}
    first: dict[str, RunSpec] = {}
    for s in specs:
        if not s.learned_q:
            first.setdefault(s.loss, s)
    for loss, s in first.items():
        model, log_q = trained[s.name]
        rec: dict[str, Any] = {"run": s.name}
        for rule, mapping in (("own", s.mapping), ("softmax", "softmax")):
            cont = generate(model, log_q, mapping, prompts, P["sample_len"], seed + 11)
            rec[rule] = {**_text_metrics(cont), "examples": [words(cont[i]) for i in range(min(3, len(cont)))]}
        out["models"][loss] = rec
    return out
