"""Inputs of the fused output layer's benchmarks, and the share of ``G``'s tiles its backward skips.

Two kinds of logits (``hidden @ weight.T``) for the GPU benchmark (``run_gpu.py``, the peers' section)
and for this CPU proxy:

* ``"benchmark"``: the peer comparison's inputs, ``hidden ~ N(0, 1/H)`` and ``weight ~ N(0, 0.02²)``:
  logits of standard deviation about 0.02, on which 1.5-entmax keeps about 16% of the classes,
  scattered over the vocabulary, so almost no ``64 × 64`` tile of ``G = p - y`` is all zero;
* ``"realistic"``: a trained language model's support, built from topics (:func:`realistic_inputs`):
  each token's logits have a few hundred high scores, those of its document's topic, held by a few
  class tiles, and 1.5-entmax keeps at most 1% of the vocabulary.

``python benchmarks/fused_inputs.py`` (the CPU proxy) computes ``G`` for both kinds with PyTorch, marks
its tiles as the loss kernel does (:func:`softargmax.backends.tile_flags.tile_flags`) and prints the
share of tiles that the products ``G W`` and ``Gᵀ h`` skip, with the support sizes, for 1.5-entmax and
sparsemax; ``--json`` writes them.  Nothing here times anything.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import softargmax as sa
from softargmax.backends.tile_flags import TILE_CLASSES, TILE_TOKENS, tile_flags

#: tokens per document in :func:`realistic_inputs` (consecutive tokens sharing a topic)
DOC_TOKENS = 512
#: classes per topic (high-scoring for its documents' tokens), in tiles of TILE_CLASSES consecutive classes
TOPIC_CLASSES = 256
#: share of targets drawn over the whole vocabulary instead of from the topic's classes
OFF_TOPIC_TARGETS = 0.1
#: standard deviation of the topic classes' scores (their mean is 8; the other classes' logits are about N(0, 1))
TOPIC_SPREAD = 0.5
#: the scale of the random part of the topic classes' weights (the other classes': 1)
TOPIC_NOISE = 0.2


def benchmark_inputs(N: int, H: int, V: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The peer comparison's ``(hidden [N, H], weight [V, H], target [N])`` (float32, on the CPU)."""
    h = torch.randn(N, H, generator=gen) / H**0.5
    w = torch.randn(V, H, generator=gen) * 0.02
    t = torch.randint(0, V, (N,), generator=gen)
    return h, w, t


def realistic_inputs(N: int, H: int, V: int, gen: torch.Generator,
                     scattered: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hidden [N, H], weight [V, H], target [N])`` (float32, on the CPU) whose logits look like a trained
    language model's, with the support clustered by topic.

    Tokens come in documents of :data:`DOC_TOKENS` consecutive tokens, each with a topic drawn among
    ``T = min(64, V // TOPIC_CLASSES)``; topic ``c`` has a unit direction ``u_c`` (random, nearly orthogonal
    to the others at large ``H``) and owns :data:`TOPIC_CLASSES` classes: ``TOPIC_CLASSES / 64`` whole class
    tiles at random places (``scattered``: as many classes anywhere in the vocabulary).  A token of topic
    ``c`` has ``hidden = u_c + ξ`` (``ξ ~ N(0, 0.3²/H)``); a class ``j`` of topic ``c`` has weight
    ``(8 + 0.5 g_j) u_c + 0.2 ε_j`` and any other class ``ε_j`` (``g_j ~ N(0, 1)``, ``ε_j ~ N(0, 1)`` per
    coordinate).  So a token's logits are about ``N(8, 0.54²)`` on its topic's classes and ``N(0, 1)``
    on the rest: a few hundred high scores, of which 1.5-entmax keeps some tens (well under 1% of a
    large vocabulary).  The target is one of the topic's classes (uniformly), or with probability
    :data:`OFF_TOPIC_TARGETS` any class (its tile then holds a non-zero entry of ``G``, ``-1``, even where
    ``p`` is zero)."""
    T = max(1, min(64, V // TOPIC_CLASSES))
    per_tile = TOPIC_CLASSES // TILE_CLASSES
    u = torch.nn.functional.normalize(torch.randn(T, H, generator=gen), dim=1)
    if V < TOPIC_CLASSES:  # a smoke test's vocabulary: one topic owning half the classes
        classes = torch.randperm(V, generator=gen)[: max(1, V // 2)].view(1, -1)
    elif scattered:
        classes = torch.randperm(V, generator=gen)[: T * TOPIC_CLASSES].view(T, TOPIC_CLASSES)
    else:
        tiles = torch.randperm(V // TILE_CLASSES, generator=gen)[: T * per_tile].view(T, per_tile)
        classes = (tiles.unsqueeze(-1) * TILE_CLASSES + torch.arange(TILE_CLASSES)).view(T, -1)
    w = torch.randn(V, H, generator=gen)
    scores = 8.0 + TOPIC_SPREAD * torch.randn(T, classes.shape[1], generator=gen)
    for c in range(T):
        w[classes[c]] = TOPIC_NOISE * w[classes[c]] + scores[c].unsqueeze(1) * u[c]
    docs = -(-N // DOC_TOKENS)
    topic = torch.randint(0, T, (docs,), generator=gen).repeat_interleave(DOC_TOKENS)[:N]
    h = u[topic] + 0.3 * torch.randn(N, H, generator=gen) / H**0.5
    pick = torch.randint(0, classes.shape[1], (N,), generator=gen)
    t = classes[topic, pick]
    off = torch.rand(N, generator=gen) < OFF_TOPIC_TARGETS
    t = torch.where(off, torch.randint(0, V, (N,), generator=gen), t)
    return h, w, t


def inputs(kind: str, N: int, H: int, V: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs of a logits kind: ``"benchmark"``, ``"realistic"`` or ``"realistic_scattered"``."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "benchmark":
        return benchmark_inputs(N, H, V, gen)
    if kind in ("realistic", "realistic_scattered"):
        return realistic_inputs(N, H, V, gen, scattered=kind == "realistic_scattered")
    raise ValueError(f"kind must be 'benchmark', 'realistic' or 'realistic_scattered', got {kind!r}")


def skipped_tiles(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, mapping: str = "entmax15",
                  chunk: int = 1024) -> dict:
    """The share of ``G = p - y``'s tiles that are all zero (those the fused backward skips), with the
    support sizes, over chunks of ``chunk`` tokens (a multiple of 64, as the fused loss's chunks are
    tiled on their own), on ``h``'s device, in ``h``'s dtype for the logits and float32 for ``p``."""
    if chunk % 64:
        raise ValueError(f"chunk must be a multiple of 64, got {chunk}")
    zero = total = 0
    support = []
    for start in range(0, h.shape[0], chunk):
        z = (h[start:start + chunk] @ w.T).float()
        p = sa.fenchel_young_loss(z.requires_grad_(), t[start:start + chunk], mapping, reduction="sum")
        (G,) = torch.autograd.grad(p, z)  # p - y
        flags = tile_flags(G)
        zero += int((flags == 0).sum())
        total += flags.numel()
        support.append((G + torch.nn.functional.one_hot(t[start:start + chunk], w.shape[0]).float() != 0).sum(1))
        del z, G
    s = torch.cat(support).float()
    return {"mapping": mapping, "tiles_skipped": round(zero / total, 4), "tiles": total,
            "support_mean": round(float(s.mean()), 1), "support_max": int(s.max()),
            "support_max_fraction": round(float(s.max()) / w.shape[0], 5)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--json", help="write the results there")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    results = []
    for kind in ("benchmark", "realistic", "realistic_scattered"):
        h, w, t = inputs(kind, args.tokens, args.hidden, args.vocab)
        logits_std = float((h[:64] @ w.T).std())
        for mapping in ("entmax15", "sparsemax"):
            r = {"logits": kind, "shape": [args.tokens, args.hidden, args.vocab], "logits_std": round(logits_std, 4),
                 **skipped_tiles(h, w, t, mapping)}
            results.append(r)
            print(f"{kind:>20} {mapping:>9}: {100 * r['tiles_skipped']:5.1f}% of {r['tiles']} tiles skipped; support "
                  f"mean {r['support_mean']}, max {r['support_max']} ({100 * r['support_max_fraction']:.2f}% of V); "
                  f"logits std {r['logits_std']}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"results": results, "tile": [TILE_TOKENS, TILE_CLASSES]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
