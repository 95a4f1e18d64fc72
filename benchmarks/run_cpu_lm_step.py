"""Where the CPU training step of the language-model experiment spends its time, by loss.

Two measurements, each a few seconds, in process CPU time with one thread (less noise on a
shared machine), the cases interleaved round-robin and the minimum over rounds reported:

* the output layer and loss alone, forward + backward, at ``tokens x d x V``: ``F.cross_entropy``
  of the stored logits, and the fused ``linear_fenchel_young_loss`` with KL (softmax), chi-square
  (sparsemax) and alpha = 1.5 (1.5-entmax), at several scales of the logits (the standard
  deviation of the logits: a small scale gives flat rows, i.e. a model early in training, whose
  sparse mappings keep more candidates in the threshold solver);
* the whole training step (model forward, fused loss, backward, AdamW step) of a preset of
  ``softargmax reproduce lm``, per loss, on the freshly initialized model.

    PYTHONPATH=src python benchmarks/run_cpu_lm_step.py --preset default --rounds 5 \
        --out benchmarks/results/cpu-lm-step.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.experiments import lm
from softargmax.experiments.pretraining.model import Decoder, DecoderConfig
from softargmax.experiments.pretraining.training import RunSpec, TrainSettings, _optimizer, _step

MAPPINGS = {"kl": "softmax", "chi_square": "chi_square", "alpha1.5": "entmax15"}


def output_layer(tokens: int, d: int, vocab: int, scale: float, chunk: int, rounds: int) -> dict:
    torch.manual_seed(0)
    h = torch.randn(tokens, d, requires_grad=True)
    W = (torch.randn(vocab, d) * scale / d ** 0.5).requires_grad_()
    y = torch.randint(0, vocab, (tokens,))

    def call(case: str) -> None:
        if case == "cross_entropy":
            loss = F.cross_entropy(h @ W.T, y)
        else:
            loss = sa.linear_fenchel_young_loss(h, W, y, mapping=MAPPINGS[case], chunk_size=chunk)
        loss.backward()
        h.grad = W.grad = None

    cases = ["cross_entropy", *MAPPINGS]
    return _interleaved(cases, call, rounds)


def whole_step(preset: str, vocab: int, rounds: int, model: dict) -> dict:
    P = lm.PRESETS[preset]
    cfg = DecoderConfig(vocab=vocab, **model)
    S = TrainSettings(**P["train"])
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (S.batch, cfg.context), generator=gen)
    y = torch.randint(0, vocab, (S.batch, cfg.context), generator=gen)
    state = {}
    for k, mapping in MAPPINGS.items():
        torch.manual_seed(0)
        model = Decoder(cfg)
        opt = _optimizer(model, None, S)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        state[k] = (model, opt, sched, RunSpec(k, mapping, 0))

    def call(case: str) -> None:
        model, opt, sched, spec = state[case]
        _step(model, None, opt, sched, spec, S, x, y)

    return _interleaved(list(MAPPINGS), call, rounds)


def _interleaved(cases: list, call, rounds: int) -> dict:
    for c in cases:  # warm-up (the C solver's first build, allocator)
        call(c)
    seconds: dict[str, list] = {c: [] for c in cases}
    for _ in range(rounds):
        for c in cases:
            t = time.process_time()
            call(c)
            seconds[c].append(time.process_time() - t)
    best = {c: min(v) for c, v in seconds.items()}
    base = best.get("kl")
    return {c: {"min_seconds": best[c], "seconds": seconds[c], "relative_to_kl": best[c] / base if base else None}
            for c in cases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--vocab", type=int, default=None, help="default: the preset's subword vocabulary")
    ap.add_argument("--scales", type=float, nargs="+", default=[0.5, 1.0, 3.0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d", type=int, default=None, help="another model width (MLP 4d, heads d/32, at least 2)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    P = lm.PRESETS[a.preset]
    vocab = a.vocab or P.get("vocab") or 10000
    tokens = P["train"]["batch"] * P["model"]["context"]
    model = dict(P["model"])
    if a.d:
        model.update(d=a.d, ff=4 * a.d, heads=max(2, a.d // 32))
    out = {"preset": a.preset, "tokens": tokens, "d": model["d"], "model": model, "vocab": vocab, "threads": a.threads,
           "clock": "process CPU time, minimum over interleaved rounds", "rounds": a.rounds, "output_layer": {}}
    for s in a.scales:
        r = output_layer(tokens, model["d"], vocab, s, P["train"]["chunk"], a.rounds)
        out["output_layer"][str(s)] = r
        print(f"output layer + loss, {tokens} x {model['d']} x {vocab}, logit scale {s}: " + ", ".join(
            f"{c} {1000 * v['min_seconds']:.1f} ms ({v['relative_to_kl']:.2f}x KL)" for c, v in r.items()))
    r = whole_step(a.preset, vocab, a.rounds, model)
    out["whole_step"] = r
    print("whole training step: " + ", ".join(f"{c} {1000 * v['min_seconds']:.1f} ms ({v['relative_to_kl']:.2f}x KL)"
                                              for c, v in r.items()))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
