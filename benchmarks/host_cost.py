"""Host cost per call: kernel launches and host synchronizations of the operators and losses.

    python benchmarks/host_cost.py                  # on the CPU, in Triton's interpreter (this script sets it)
    python benchmarks/host_cost.py --json out.json

On the CPU the library's Triton kernels run in Triton's interpreter through the GPU launchers, and
:mod:`_counting` counts the kernel launches and every operation that would synchronize a CUDA
device with the host (``item()``/``bool()`` of a tensor, data-dependent output sizes, ``tolist()``,
``cpu()``), with the line of the library that makes it.  The range check of class indices runs
as on a GPU (:func:`softargmax.losses.index_check.set_deferred_on_cpu`): on the device, its flag read
at a later call once its asynchronous copy has landed.  The vocabulary-parallel loss and fused loss
(``distributed`` cases) run over a group of one process (gloo; NCCL on CUDA): their first round's
table is read on the host, and carries their class-index range check.  PyTorch operators are not launches here;
their count (``torch_ops``: every ATen call, views and allocations included) stands for the host
work and the small kernels a GPU would launch for them; ``allocations`` and ``allocated_bytes`` the
new tensors the call makes.

On a GPU, :func:`cuda_syncs` counts the same synchronizations with
``torch.cuda.set_sync_debug_mode("warn")`` (one warning per synchronizing call).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from typing import Any, Callable, Iterator, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _counting  # noqa: E402

SHAPE = (4, 300)  # rows of several lines (one program each); the counts do not depend on the number of rows
FUSED = (8, 16, 300, 4)  # tokens, hidden, vocabulary, chunk_size (tokens per chunk: two chunks)


def cases() -> dict[str, tuple[str, Callable[[Any], Callable[[], Any]]]]:
    """``{name: (kind, make)}``: ``make(device)`` prepares the inputs and returns the call to count.
    Kinds: ``forward``/``backward`` of a row operator, ``loss`` (forward + backward), ``fused``, and
    ``distributed``: the vocabulary-parallel loss and fused loss (forward + backward) over a group of one
    process (:func:`process_group`)."""
    import torch

    import softargmax as sa

    def operator(fn: Callable[[Any], Any], backward: bool) -> Callable[[Any], Callable[[], Any]]:
        def make(device: Any) -> Callable[[], Any]:
            gen = torch.Generator().manual_seed(0)
            x = (torch.randn(*SHAPE, generator=gen) * 3).to(device).requires_grad_(True)
            v = torch.randn(*SHAPE, generator=gen).to(device)
            if not backward:
                return lambda: fn(x)
            y = fn(x)
            return lambda: torch.autograd.grad(y, x, v, retain_graph=True)

        return make

    def loss(fn: Callable[[Any, Any], Any]) -> Callable[[Any], Callable[[], Any]]:
        def make(device: Any) -> Callable[[], Any]:
            gen = torch.Generator().manual_seed(0)
            x = (torch.randn(*SHAPE, generator=gen) * 3).to(device).requires_grad_(True)
            t = torch.randint(0, SHAPE[1], (SHAPE[0],), generator=gen).to(device)
            return lambda: torch.autograd.grad(fn(x, t), x)

        return make

    def fused(mapping: str) -> Callable[[Any], Callable[[], Any]]:
        def make(device: Any) -> Callable[[], Any]:
            N, H, V, chunk = FUSED
            gen = torch.Generator().manual_seed(0)
            h = (torch.randn(N, H, generator=gen) / H**0.5).to(device).requires_grad_(True)
            w = (torch.randn(V, H, generator=gen) * 0.1).to(device).requires_grad_(True)
            t = torch.randint(0, V, (N,), generator=gen).to(device)
            return lambda: torch.autograd.grad(sa.linear_fenchel_young_loss(h, w, t, mapping=mapping,
                                                                            chunk_size=chunk), (h, w))

        return make

    def vocab_parallel(fused_call: bool) -> Callable[[Any], Callable[[], Any]]:
        # the classes split over a group of one process (every round of the split loss is made, and counted)
        from softargmax.losses import distributed

        def make(device: Any) -> Callable[[], Any]:
            gen = torch.Generator().manual_seed(0)
            if fused_call:
                N, H, V, chunk = FUSED
                h = (torch.randn(N, H, generator=gen) / H**0.5).to(device).requires_grad_(True)
                w = (torch.randn(V, H, generator=gen) * 0.1).to(device).requires_grad_(True)
                t = torch.randint(0, V, (N,), generator=gen).to(device)
                return lambda: torch.autograd.grad(
                    distributed.linear_fenchel_young_loss(h, w, t, mapping="entmax15", chunk_size=chunk), (h, w))
            x = (torch.randn(*SHAPE, generator=gen) * 3).to(device).requires_grad_(True)
            t = torch.randint(0, SHAPE[1], (SHAPE[0],), generator=gen).to(device)
            return lambda: torch.autograd.grad(distributed.fenchel_young_loss(x, t, "entmax15"), x)

        return make

    ops = {"sparsemax": sa.sparsemax, "entmax15": sa.entmax15, "entmax_a1.3": lambda x: sa.entmax(x, 1.3),
           "jensen_shannon": lambda x: sa.f_softargmax(x, "jensen_shannon"),
           "squared_hellinger": lambda x: sa.f_softargmax(x, "squared_hellinger"),
           "alpha_relu": lambda x: sa.alpha_relu(x, 1.5, 0.5)}
    out: dict[str, tuple[str, Callable[[Any], Callable[[], Any]]]] = {}
    for name, fn in ops.items():
        out[f"{name}.forward"] = ("forward", operator(fn, False))
        out[f"{name}.backward"] = ("backward", operator(fn, True))
    for name, lfn in {"sparsemax_loss": sa.sparsemax_loss, "entmax15_loss": sa.entmax15_loss,
                      "entmax_loss_a1.3": lambda x, t: sa.entmax_loss(x, t, alpha=1.3),
                      "jensen_shannon_loss": lambda x, t: sa.f_divergence_loss(x, t, "jensen_shannon"),
                      "alpha_relu_loss": lambda x, t: sa.alpha_relu_loss(x, t, alpha=1.5, tau=0.5)}.items():
        out[name] = ("loss", loss(lfn))
    out["linear_loss_kl"] = ("fused", fused("softmax"))
    out["linear_loss_entmax15"] = ("fused", fused("entmax15"))
    out["vocab_parallel_loss_entmax15"] = ("distributed", vocab_parallel(False))
    out["linear_vocab_parallel_loss_entmax15"] = ("distributed", vocab_parallel(True))
    return out


@contextlib.contextmanager
def process_group(kind: str, device: Any = "cpu") -> Iterator[None]:
    """For the ``distributed`` cases: a group of this one process (gloo on the CPU, NCCL on CUDA, whose
    all-gather gloo does not take) while none is initialized (destroyed after), so that the
    vocabulary-parallel losses make their rounds."""
    import torch.distributed as dist

    made = kind == "distributed" and not dist.is_initialized()
    if made:
        backend = "nccl" if str(device).startswith("cuda") else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if made:
            dist.destroy_process_group()


def count(name: str, device: Any = "cpu") -> dict:
    """Launches and synchronizations of one call of case ``name`` (after a first call: warm)."""
    from softargmax.losses import index_check

    kind, make = cases()[name]
    call = make(device)
    # the range check of class indices as on a GPU: on the device, read at a later call (the CPU raises at once)
    old = index_check.set_deferred_on_cpu(True)
    try:
        with process_group(kind, device):
            call()  # the first call: lazy imports, kernels compiled
            with _counting.counting() as c:
                call()
    finally:
        index_check.set_deferred_on_cpu(old)
    return {"case": name, "launches": sum(c.launches.values()), "kernels": dict(c.launches),
            "syncs": c.sync_count, "sync_sites": dict(c.syncs), "host_reads": dict(c.host_reads),
            "torch_ops": sum(c.torch_ops.values()),
            "allocations": sum(c.allocation_count.values()), "allocated_bytes": sum(c.allocations.values())}


def cuda_syncs(name: str) -> int:
    """On a CUDA device: the synchronizations of one warm call of case ``name``, counted by
    ``torch.cuda.set_sync_debug_mode("warn")`` (:func:`cuda_sync_sites` says where they were)."""
    return len(cuda_sync_sites(name))


def cuda_sync_sites(name: str) -> list[str]:
    """On a CUDA device: ``"file:line: message"`` of each synchronization of one warm call of case ``name``.

    The garbage collector is run before the call and kept off during it, so that a tensor of an earlier
    test freed there cannot add a synchronization that is not the call's own."""
    import gc

    import torch

    kind, make = cases()[name]
    with process_group(kind, "cuda"):
        call = make("cuda")
        call()
        torch.cuda.synchronize()
        gc.collect()
        gc.disable()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    call()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
        finally:
            gc.enable()
    return [f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}" for w in caught
            if "synchroniz" in str(w.message)]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--device", default="cpu", help="cpu (the interpreter, counted by mocks) or cuda (sync debug mode)")
    args = ap.parse_args(argv)
    rows = []
    if args.device == "cpu":
        if not _counting.interpreter_ready():
            print("host_cost.py: Triton's interpreter is not available", file=sys.stderr)
            return 2
        print(f"{'case':<28} {'launches':>8} {'syncs':>5} {'aten ops':>8} {'allocs':>6} {'bytes':>8}  where")
        for name in cases():
            r = count(name)
            rows.append(r)
            print(f"{name:<28} {r['launches']:>8} {r['syncs']:>5} {r['torch_ops']:>8} {r['allocations']:>6} "
                  f"{r['allocated_bytes']:>8}  {r['sync_sites']}")
    else:
        for name in cases():
            sites = cuda_sync_sites(name)
            rows.append({"case": name, "cuda_syncs": len(sites), "sync_sites": sites})
            print(f"{name:<28} {len(sites):>5} synchronizations  {sites}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"device": args.device, "cases": rows}, f, indent=1)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    if "--device" not in sys.argv or "cpu" in sys.argv:
        _counting.setup_interpreter()
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    sys.exit(main())
