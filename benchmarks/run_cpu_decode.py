"""One decoding step and one chunk of a chunked prefill on the CPU, one thread: ``softargmax.decode_attention``
against SDPA's (softmax) on a small Llama's attention shape, and a whole small Llama's decode step and prefill chunk
(Transformers, ``attn_implementation`` entmax15 against sdpa) with the same cache.

Attention: ``B`` sequences, 32 query heads over 8 key/value heads, head dim 64, one new query against a
cache of ``--cache`` positions (float32); ``decode_attention`` with 1.5-entmax, sparsemax and softmax, and
``softargmax.attention`` with 1.5-entmax (the materialized path with ``enable_gqa``), against
``F.scaled_dot_product_attention(..., enable_gqa=True)``.  The chunk: ``--chunk`` new queries appended to
``--cache`` positions in all, each causal (bottom-right): ``decode_attention`` (blocks of queries within its
scores budget) against ``softargmax.attention`` and SDPA with the boolean mask.  Each error is the largest
absolute difference from the same mapping computed in float64 by ``softargmax.attention`` on the repeated heads.

Model: a 4-layer Llama (hidden 512, 8 heads over 2 key/value heads), the prompt of ``--cache`` tokens
prefilled once into a ``DynamicCache``, then one token's forward with the cache, timed, the cache cropped
back after each step; the chunk: the prompt's last ``--chunk`` tokens' forward over the cache of the others
(through the Hugging Face function: ``decode_attention`` with the mask).  The error column there is the largest difference of the step's logits from the same
model's without the cache (the whole sequence at once), in float32.

Times are the minimum and the median over interleaved rounds (every implementation once per round), wall
clock, with ``torch.set_num_threads(1)``.  Prints a table and writes ``results/cpu-decode.json`` (device,
versions, sizes, the machine's load).

    PYTHONPATH=src python benchmarks/run_cpu_decode.py [--cache 2048] [--chunk 64] [--batch 4] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import softargmax as sa

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _times(fns: dict, rounds: int) -> dict:
    """``{name: (min ms, median ms)}`` of each zero-argument callable, interleaved, after one warm-up call each."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: (min(t) * 1e3, statistics.median(t) * 1e3) for name, t in times.items()}


def attention_cases(args: argparse.Namespace) -> list:
    B, H, Hkv, D, S = args.batch, 32, 8, 64, args.cache
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 1, D, generator=gen)
    k, v = torch.randn(B, Hkv, S, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen)
    lengths = torch.full((B,), S, dtype=torch.int32)
    fns = {
        "sdpa (softmax)": ("softmax", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
        "decode_attention entmax15": ("entmax15", lambda: sa.decode_attention(q, k, v, lengths)),
        "decode_attention sparsemax": ("sparsemax", lambda: sa.decode_attention(q, k, v, lengths, mapping="sparsemax")),
        "decode_attention softmax": ("softmax", lambda: sa.decode_attention(q, k, v, lengths, mapping="softmax")),
        "attention entmax15 (enable_gqa)": ("entmax15", lambda: sa.attention(q, k, v, enable_gqa=True)),
    }
    with torch.no_grad():
        times = _times({name: fn for name, (_, fn) in fns.items()}, args.rounds)
        rep = [t.double().repeat_interleave(H // Hkv, 1) for t in (k, v)]
        exact = {m: sa.attention(q.double(), *rep, mapping=m) for m in ("softmax", "entmax15", "sparsemax")}
        errors = {name: float((fn().double() - exact[m]).abs().max()) for name, (m, fn) in fns.items()}
    base = times["sdpa (softmax)"][0]
    return [{"impl": name, "min_ms": round(t[0], 4), "median_ms": round(t[1], 4), "ratio_to_sdpa": round(t[0] / base, 3),
             "max_abs_error": errors[name]} for name, t in times.items()]


def chunk_cases(args: argparse.Namespace) -> list:
    """``--chunk`` new queries over a cache of ``--cache`` positions in all (the last ones theirs), causal."""
    B, H, Hkv, D, S, L = args.batch, 32, 8, 64, args.cache, args.chunk
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, L, D, generator=gen)
    k, v = torch.randn(B, Hkv, S, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen)
    lengths = torch.full((B,), S, dtype=torch.int32)
    mask = torch.ones(L, S, dtype=torch.bool).tril(S - L)  # query i sees keys 0 .. S - L + i
    fns = {
        f"sdpa (softmax), chunk of {L}": ("softmax", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                                            enable_gqa=True)),
        f"decode_attention entmax15, chunk of {L}": ("entmax15", lambda: sa.decode_attention(q, k, v, lengths)),
        f"attention entmax15 (mask, enable_gqa), chunk of {L}": (
            "entmax15", lambda: sa.attention(q, k, v, attn_mask=mask, enable_gqa=True)),
    }
    with torch.no_grad():
        times = _times({name: fn for name, (_, fn) in fns.items()}, args.rounds)
        rep = [t.double().repeat_interleave(H // Hkv, 1) for t in (k, v)]
        exact = {m: sa.attention(q.double(), *rep, attn_mask=mask, mapping=m) for m in ("softmax", "entmax15")}
        errors = {name: float((fn().double() - exact[m]).abs().max()) for name, (m, fn) in fns.items()}
    base = times[f"sdpa (softmax), chunk of {L}"][0]
    return [{"impl": name, "new_queries": L, "min_ms": round(t[0], 4), "median_ms": round(t[1], 4),
             "ratio_to_sdpa": round(t[0] / base, 3), "max_abs_error": errors[name]} for name, t in times.items()]


def model_cases(args: argparse.Namespace) -> list:
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    import softargmax.integrations.huggingface  # noqa: F401  (registers "entmax15")

    out = []
    S = args.cache
    cfg = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=S + 8)
    ids = torch.randint(0, 1024, (1, S + 1), generator=torch.Generator().manual_seed(0))
    C = args.chunk
    for what, new in (("decode step", 1), (f"prefill chunk of {C}", C)):
        steps, errors = {}, {}
        for impl in ("sdpa", "entmax15"):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()
            with torch.no_grad():
                cache = DynamicCache()
                start = S + 1 - new  # the cache holds the tokens before the new ones
                model(input_ids=ids[:, :start], past_key_values=cache, use_cache=True)
                full = model(input_ids=ids).logits[0, -new:]

                def step(model=model, cache=cache, start=start, new=new) -> None:
                    model(input_ids=ids[:, start:], past_key_values=cache, use_cache=True)
                    cache.crop(-new)  # back to the prompt

                logits = model(input_ids=ids[:, start:], past_key_values=cache, use_cache=True).logits[0]
                cache.crop(-new)
                errors[impl] = float((logits - full).abs().max())
                steps[impl] = step
        with torch.no_grad():
            times = _times(steps, args.rounds)
        base = times["sdpa"][0]
        for impl, t in times.items():
            out.append({"impl": f"Llama {what}, attn_implementation={impl}", "new_queries": new,
                        "min_ms": round(t[0], 4), "median_ms": round(t[1], 4), "ratio_to_sdpa": round(t[0] / base, 3),
                        "max_abs_error_vs_no_cache": errors[impl]})
    return out


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=64, help="new queries of the prefill chunk")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--no-model", action="store_true", help="the attention step only (no Transformers model)")
    ap.add_argument("--json", dest="json_path", default=os.path.join(RESULTS, "cpu-decode.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()
    cases = attention_cases(args) + chunk_cases(args)
    if not args.no_model:
        cases += model_cases(args)
    for c in cases:
        err = c.get("max_abs_error", c.get("max_abs_error_vs_no_cache"))
        print(f"{c['impl']:>55}  min {c['min_ms']:8.3f} ms  median {c['median_ms']:8.3f} ms  "
              f"{c['ratio_to_sdpa']:5.2f}x  error {err:.2e}")
    result = {"device": platform.processor() or platform.machine(), "platform": platform.platform(),
              "python": sys.version.split()[0], "torch": torch.__version__, "softargmax": sa.__version__,
              "threads": 1, "load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()],
              "config": {"cache": args.cache, "chunk": args.chunk, "batch": args.batch, "heads": 32, "kv_heads": 8, "head_dim": 64,
                         "dtype": "float32", "rounds": args.rounds,
                         "model": None if args.no_model else {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 2}},
              "cases": cases}
    os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
    with open(args.json_path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
