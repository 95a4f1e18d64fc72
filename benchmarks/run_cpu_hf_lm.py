"""Peak memory of one training step of a small Llama at a 32k vocabulary on the CPU: Transformers' own
cross-entropy head vs ``softargmax.integrations.huggingface.apply`` (fused Fenchel–Young losses), and the
fused loss's per-token mode (``reduction="none"``, optionally with ``return_stats``) on the same model's
hidden states, the backward of a mean over tokens.

Each configuration runs in a fresh process: build the model, read the peak resident set size
(``ru_maxrss``), run one forward + backward with labels, read it again; the difference is the step's
peak extra memory.  Prints a table and writes ``results/cpu-hf-lm.json`` (device, versions, sizes).

    PYTHONPATH=src python benchmarks/run_cpu_hf_lm.py [--tokens 2048] [--vocab 32000]
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

CONFIGS = [  # (name, loss, apply options; "per_token": the fused loss called directly with reduction="none")
    ("transformers cross-entropy", None, {}),
    ("fused softmax, apply's default (256 MiB)", "softmax", {}),
    ("fused 1.5-entmax, apply's default (256 MiB)", "entmax15", {}),
    ("fused 1.5-entmax, budget 64 MiB", "entmax15", {"memory_budget": 2**26}),
    ("fused 1.5-entmax, budget 1 GiB", "entmax15", {"memory_budget": 2**30}),
    ("fused 1.5-entmax per token, 256 MiB", "entmax15", {"per_token": True, "memory_budget": 2**28}),
    ("fused 1.5-entmax per token + stats, 256 MiB", "entmax15",
     {"per_token": True, "return_stats": True, "memory_budget": 2**28}),
]


def one(args, loss, options):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from softargmax.integrations.huggingface import apply
    from softargmax.losses.linear import linear_fenchel_young_loss

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=2 * args.hidden, max_position_embeddings=args.length)
    model = AutoModelForCausalLM.from_config(cfg).train()
    options = dict(options)
    per_token = options.pop("per_token", False)
    if loss is not None and not per_token:
        apply(model, loss, **options)
    ids = torch.randint(0, args.vocab, (args.tokens // args.length, args.length))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    if per_token:  # what apply computes, per token: the hidden states of positions 0..T-2 against tokens 1..T-1
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
        value = linear_fenchel_young_loss(hidden, model.lm_head.weight, ids[:, 1:], None, loss, reduction="none",
                                          **options)
        value = (value[0] if isinstance(value, tuple) else value).mean()
    else:
        value = model(input_ids=ids, labels=ids).loss
    value.backward()
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_extra_MiB": (after - before) / 1024, "seconds": seconds, "loss": float(value)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--json", default=os.path.join(RESULTS, "cpu-hf-lm.json"))
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        _, loss, options = CONFIGS[args.child]
        print(json.dumps(one(args, loss, options)))
        return
    import torch
    import transformers

    rows = []
    for i, (name, loss, options) in enumerate(CONFIGS):
        cmd = [sys.executable, __file__, "--child", str(i), "--tokens", str(args.tokens), "--length", str(args.length),
               "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append({"config": name, "loss": loss, "options": options, **res})
    print(f"{'configuration':45s} {'peak extra MiB':>15s} {'seconds':>8s} {'loss':>7s}")
    for r in rows:
        print(f"{r['config']:45s} {r['peak_extra_MiB']:15.0f} {r['seconds']:8.2f} {r['loss']:7.3f}")
    out = {
        "device": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sizes": {"tokens": args.tokens, "length": args.length, "vocab": args.vocab, "hidden": args.hidden,
                  "layers": 2, "logits_MiB_float32": args.tokens * args.vocab * 4 / 2**20},
        "results": rows,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
