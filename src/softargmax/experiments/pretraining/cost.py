"""The cost of the losses of ``softargmax reproduce lm``: the time of a training step (the paper's Fig. 7
question) and the peak memory of the fused loss beside the unfused one.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._common import relative_span
from .data import train_batch
from .evaluation import time_training_steps
from .model import Decoder, DecoderConfig
from .plan import run_key
from .training import RunSpec, TrainSettings


def time_steps(specs: list[RunSpec], trained: dict, train_ids: torch.Tensor, cfg: DecoderConfig, S: TrainSettings,
                P: dict, seed: int, device: str) -> dict:
    """Interleaved medians of a training step (forward, loss, backward) of the first run of every loss and learned q
    among ``specs``; ``"timed"`` names the run timed for each."""
    entries: dict[str, tuple[Decoder, Optional[torch.Tensor], str]] = {}
    timed: dict[str, str] = {}
    for s in specs:
        if run_key(s) in timed:
            continue
        timed[run_key(s)] = s.name
        model, log_q = trained[s.name]
        entries[run_key(s)] = (model, log_q, s.mapping)
    batches = [tuple(t.to(device) for t in train_batch(train_ids, cfg.context, S.batch, seed + 99, i))
               for i in range(P["timing_batches"])]
    times = time_training_steps(entries, batches, S.chunk, P["timing_rounds"])
    kl = times.get("kl", {}).get("median_seconds")
    for t in times.values():
        t["seconds_relative_to_kl"] = t["median_seconds"] / kl if kl else None
        t["seconds_spread"] = relative_span(t["seconds"]) if len(t["seconds"]) > 1 else 0.0
    return {"rounds": P["timing_rounds"], "batches": P["timing_batches"], "systems": times, "timed": timed}


def memory_peaks(P: dict, cfg: DecoderConfig, S: TrainSettings, threads: Optional[int], device: str = "cpu") -> dict:
    """Peak memory of one forward and backward of the output layer and loss, fused and unfused, at the training
    batch's number of tokens, each in a fresh process (``softargmax.bench.memory``), on ``device``: the growth of
    the resident set on the CPU, of the CUDA caching allocator's peak on a GPU."""
    from ...bench.memory import measure

    N, out = P["memory_tokens"], {}
    cuda = torch.device(device).type == "cuda"
    for mapping in P["memory_mappings"]:
        out[mapping] = {v: measure("fused", v, N, cfg.d, cfg.vocab, threads or torch.get_num_threads(), 0, mapping,
                                   S.chunk, device)["peak_mb"] for v in ("fused", "unfused")}
    tool = ("softargmax.bench.memory: CUDA caching allocator peak (torch.cuda.max_memory_allocated) above the inputs, "
            "one call in a fresh process" if cuda else
            "softargmax.bench.memory: resident-set peak (VmHWM) growth of one call, in a fresh process")
    return {"tokens": N, "d": cfg.d, "vocab": cfg.vocab, "chunk": S.chunk, "peak_mb": out, "device": str(device),
            "tool": tool}
