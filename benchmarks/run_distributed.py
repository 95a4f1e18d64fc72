"""Communication of the vocabulary-parallel losses: writes benchmarks/results/cpu-distributed.json.

For a vocabulary of V classes split over W ranks, the loss of R tokens needs (per call of
``fenchel_young_loss(..., process_group=...)``; per chunk of the fused output layer):

* one MAX all-reduce of 2R + W numbers (row maxima, each slice's own root, slice sizes; float32);
* one SUM all-reduce of 2R numbers per Newton evaluation (T steps: T + 1 evaluations; float32);
* one SUM all-reduce of R numbers (row losses, float64; 2R-3R with class weights / soft targets).
(α-ReLU has a fixed threshold: a MAX of W numbers, the slice sizes, and the SUM of the float32 losses.)

So ``T + 3`` rounds and ``8 + 8(T + 1) + 8 = 8T + 24`` bytes per token, independent of V
and W (plus 4W bytes per call), against ``4V`` bytes per token received by every rank when
the logits are all-gathered (``4V(W-1)/W`` over the wire in a ring).  This script counts the collectives (``count_collectives``), the
Newton steps and the time on W = 2, 3, 4 gloo processes on CPU (127.0.0.1), for V = 131072,
and extrapolates the counts to W = 8 with the formula above (the iterates are those of one
rank: they depend on the scores, not on W).

    python benchmarks/run_distributed.py [--tokens 64] [--vocab 131072] [--ranks 2 3 4] [--json PATH]

Times on a shared CPU with gloo over loopback are indicative only; the counts are exact.
"""

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CASES = [("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("alpha_relu", {"alpha": 1.5, "tau": 0.0}),
         ("jensen_shannon", {})]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(fn, repeats):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        best = min(best, time.perf_counter() - t0)
    return best


def _worker(rank, world, port, args, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import softargmax as sa
    from softargmax.losses import distributed as D

    V, R, d = args.vocab, args.tokens, args.hidden
    sizes = [V // world + (1 if r < V % world else 0) for r in range(world)]
    off = sum(sizes[:rank])
    g = torch.Generator().manual_seed(0)
    # logits of a trained-looking output layer: a few large scores per row over a N(0, 2^2) background
    full = torch.randn(R, V, generator=g) * 2
    full[torch.arange(R), torch.randint(0, V, (R,), generator=g)] += 8
    x = full[:, off:off + sizes[rank]].contiguous()
    del full
    target = torch.randint(0, V, (R,), generator=g)
    group = dist.group.WORLD
    rows = []
    for mapping, kw in CASES:
        xl = x.clone().requires_grad_(True)

        def split_step(xl=xl, mapping=mapping, kw=kw):
            loss = sa.fenchel_young_loss(xl, target, mapping, process_group=group, **kw)
            loss.backward()

        with D.count_collectives() as st:
            split_step()
        iterations = None
        if mapping != "alpha_relu":
            div = sa.mappings.resolve(mapping, kw.get("alpha"))
            iterations = D.solve(x, div, group).iterations

        def gather_step(mapping=mapping, kw=kw):
            # gloo gathers equal sizes: pad the slices to the largest
            kmax = max(sizes)
            xp = torch.nn.functional.pad(x, (0, kmax - x.shape[1]))
            parts = [torch.empty(R, kmax) for _ in sizes]
            dist.all_gather(parts, xp)
            xf = torch.cat([p[:, :s] for p, s in zip(parts, sizes)], 1).requires_grad_(True)
            loss = sa.fenchel_young_loss(xf, target, mapping, **kw)
            loss.backward()
            return xf.grad[:, off:off + sizes[rank]]

        t_split = _timed(split_step, args.repeats)
        t_gather = _timed(gather_step, args.repeats)
        rows.append({
            "mapping": mapping, "params": kw, "newton_steps": iterations,
            "rounds": st.count, "rounds_by_kind": st.by_kind(),
            "bytes_all_reduced": st.bytes, "bytes_per_token": st.bytes / R,
            "formula_rounds": 2 if iterations is None else iterations + 3,
            "formula_bytes_per_token": (8 * iterations + 24 + 4 * world / R) if iterations is not None else 4 + 8 * world / R,
            "all_gather_bytes_per_token_received": 4 * V * (world - 1) / world,
            "all_gather_bytes_per_token_materialized": 4 * V,
            "time_split_ms": 1e3 * t_split, "time_all_gather_ms": 1e3 * t_gather,
        })

    # the fused output layer: chunks of 2^23 / V tokens, weight [V/W, d] per rank
    N = args.fused_tokens
    W = torch.randn(V, d, generator=torch.Generator().manual_seed(1))[off:off + sizes[rank]] * 0.3
    W.requires_grad_(True)
    h = torch.randn(N, d, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    tgt = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(3))
    with D.count_collectives() as fwd:
        loss = sa.linear_fenchel_young_loss(h, W, tgt, mapping="entmax15", process_group=group)
    with D.count_collectives() as bwd:
        loss.backward()
    fused = {"tokens": N, "hidden": d, "chunk_tokens": max(1, 2**23 // V),
             "forward_rounds": fwd.count, "forward_bytes": fwd.bytes, "forward_bytes_per_token": fwd.bytes / N,
             "backward_rounds": bwd.count, "backward_bytes": bwd.bytes,
             "note": "the backward all-reduces the gradient of hidden (N x d), as any column-parallel linear layer"}
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"world": world, "sizes": sizes, "losses": rows, "fused_entmax15": fused}, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--fused-tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(RESULTS, "cpu-distributed.json"))
    args = ap.parse_args()
    import softargmax

    results = []
    for world in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            mp.start_processes(_worker, args=(world, _free_port(), args, out), nprocs=world, start_method="spawn")
            with open(out, encoding="utf-8") as f:
                results.append(json.load(f))

    print(f"V = {args.vocab}, {args.tokens} tokens, gloo on CPU; bytes are float32 payloads all-reduced per token")
    print(f"{'W':>2} {'mapping':>14} {'steps':>5} {'rounds':>6} {'B/token':>8} {'gather B/token':>14} {'split ms':>9} {'gather ms':>9}")
    for res in results:
        for r in res["losses"]:
            print(f"{res['world']:>2} {r['mapping']:>14} {str(r['newton_steps']):>5} {r['rounds']:>6} {r['bytes_per_token']:>8.1f} "
                  f"{r['all_gather_bytes_per_token_received']:>14.0f} {r['time_split_ms']:>9.2f} {r['time_all_gather_ms']:>9.2f}")
    # W = 8 from the formula: the rounds and per-token bytes do not depend on W (but for 4W bytes per call)
    extrapolated = []
    for r in results[-1]["losses"]:
        T = r["newton_steps"]
        rounds = 2 if T is None else T + 3  # alpha-ReLU: the slice sizes (W numbers) and the row losses
        per_token = 4 + 8 * 8 / args.tokens if T is None else 8 * T + 24 + 4 * 8 / args.tokens
        extrapolated.append({"mapping": r["mapping"], "world": 8, "rounds": rounds, "bytes_per_token": per_token,
                             "all_gather_bytes_per_token_received": 4 * args.vocab * 7 / 8,
                             "ratio_all_gather_over_split": 4 * args.vocab * 7 / 8 / per_token})
    print("\nW = 8 (formula; Newton steps as measured):")
    for e in extrapolated:
        print(f"   {e['mapping']:>14} rounds {e['rounds']:>3}  {e['bytes_per_token']:.1f} B/token  vs all-gather "
              f"{e['all_gather_bytes_per_token_received']:.0f} B/token ({e['ratio_all_gather_over_split']:.0f}x)")
    for res in results:
        f = res["fused_entmax15"]
        print(f"fused entmax15, W={res['world']}: {f['tokens']} tokens in chunks of {f['chunk_tokens']}: forward "
              f"{f['forward_rounds']} rounds, {f['forward_bytes_per_token']:.1f} B/token; backward {f['backward_rounds']} "
              f"round of {f['backward_bytes']} B (grad of hidden)")
    doc = {
        "benchmark": "vocabulary-parallel Fenchel-Young losses: collectives per step",
        "device": f"CPU ({platform.processor() or platform.machine()}), {os.cpu_count()} cores shared; gloo over 127.0.0.1",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "softargmax": softargmax.__version__},
        "sizes": {"vocab": args.vocab, "tokens": args.tokens, "fused_tokens": args.fused_tokens, "hidden": args.hidden},
        "formula": "rounds = T + 3 (MAX of 2R+W float32; T+1 SUMs of 2R float32; one SUM of R float64); "
                   "bytes/token = 8T + 24 + 4W/R; alpha-ReLU (fixed threshold): 2 rounds, 4 + 8W/R bytes/token",
        "measured": results,
        "extrapolated_world_8": extrapolated,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
