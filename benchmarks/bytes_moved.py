"""Bytes moved: the global loads and stores of each Triton kernel, per element, counted in Triton's interpreter.

    python benchmarks/bytes_moved.py                   # the operators and the losses, both shapes
    python benchmarks/bytes_moved.py --json out.json --dtype bfloat16

Each operator runs forward and backward on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``;
this script sets it), through the launchers a GPU uses; :mod:`_counting` records every masked-in
element each kernel loads or stores.  ``passes`` is the bytes over one pass of the input
(elements × element size): forward + backward can do with 5 (read x, write p; read p and the
incoming gradient, write the gradient), the floor every row is compared with.  The PyTorch
operators around the kernels (a cast, a clone, a loss's own arithmetic) are counted by their tensor
arguments and results (``torch_passes``).

Shapes: a short-row one (64 × 512: rows held in registers) and a long-row one (rows just above
``rows.BLOCK_ROWS_MAX``: the streamed kernels; two rows, small enough for the interpreter).  With
``--split``, also rows of 262,144 entries split over programs as 256 such rows are on an H100 (132
multiprocessors: 3 slices per row, ``rows.slice_plan``; two rows are counted, the passes per row do not
depend on the row count): the split kernels, whose candidate buffer (``SLOTS · BLOCK`` float32 per
slice, written once and read once) is counted with the rest.
The losses (Fenchel–Young, forward + backward with class targets) are counted the same way, beside
``F.cross_entropy`` counted by the same PyTorch counter, and the fused linear loss per token (logits
rows moved and allocated, GEMM FLOPs per token and class).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _counting  # noqa: E402

#: forward + backward floor of a row operator, in passes over the input
FLOOR_PASSES = 5
SHORT = (64, 512)


def long_shape() -> tuple[int, int]:
    """Two rows just above ``rows.BLOCK_ROWS_MAX`` (the streamed kernels)."""
    from softargmax.backends.triton import rows

    return 2, rows.BLOCK_ROWS_MAX + rows.BLOCK_ROWS_MAX // 4 + 3


#: the split case of ``--split``: the rows and the multiprocessors whose slices are counted (on two rows)
SPLIT_CASE = (256, 262144)
H100_MULTIPROCESSORS = 132


@contextlib.contextmanager
def split_as_on(rows_count: int, k: int, multiprocessors: int = H100_MULTIPROCESSORS) -> Iterator[int]:
    """Inside: every streamed row is split into the slices that ``rows_count`` rows of ``k`` entries get on
    ``multiprocessors`` multiprocessors (``rows.SPLIT_SLICES``); yields that slice count."""
    from softargmax.backends.triton import rows

    ns, _ = rows.slice_plan(rows_count, k, multiprocessors, rows._long_launch()[0])
    old = rows.SPLIT_SLICES
    rows.SPLIT_SLICES = ns
    try:
        yield ns
    finally:
        rows.SPLIT_SLICES = old


def operators() -> dict[str, Callable[[Any], Any]]:
    import softargmax as sa

    return {
        "sparsemax": sa.sparsemax,
        "entmax15": sa.entmax15,
        "entmax_a1.3": lambda x: sa.entmax(x, 1.3),
        "jensen_shannon": lambda x: sa.f_softargmax(x, "jensen_shannon"),
        "squared_hellinger": lambda x: sa.f_softargmax(x, "squared_hellinger"),
        "reverse_kl": lambda x: sa.f_softargmax(x, "reverse_kl"),
        "jeffrey": lambda x: sa.f_softargmax(x, "jeffrey"),
        "reverse_chi_square": lambda x: sa.f_softargmax(x, "reverse_chi_square"),
        "alpha_relu": lambda x: sa.alpha_relu(x, 1.5, 0.5),
    }


def losses() -> dict[str, Callable[[Any, Any], Any]]:
    import torch.nn.functional as F

    import softargmax as sa

    return {
        "cross_entropy": F.cross_entropy,  # the reference, counted by the same PyTorch counter
        "sparsemax_loss": sa.sparsemax_loss,
        "entmax15_loss": sa.entmax15_loss,
        "entmax_loss_a1.3": lambda x, t: sa.entmax_loss(x, t, alpha=1.3),
        "jensen_shannon_loss": lambda x, t: sa.f_divergence_loss(x, t, "jensen_shannon"),
        "reverse_kl_loss": lambda x, t: sa.f_divergence_loss(x, t, "reverse_kl"),
        "alpha_relu_loss": lambda x, t: sa.alpha_relu_loss(x, t, alpha=1.5, tau=0.5),
    }


def _inputs(shape: tuple[int, int], dtype: Any, seed: int = 0) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * 3).to(dtype)


def _summary(counts: Any, numel: int, size: int) -> dict:
    per = numel * size
    return {"launches": dict(counts.launches), "kernel_bytes": counts.kernel_bytes,
            "torch_bytes": sum(counts.torch_bytes.values()),
            "passes": round(counts.kernel_bytes / per, 3),
            "torch_passes": round(sum(counts.torch_bytes.values()) / per, 3),
            "by_tensor": {k: {kk: round(vv / per, 3) for kk, vv in v.items()} for k, v in counts.by_tensor().items()},
            "torch_ops": {k: round(v / per, 3) for k, v in counts.torch_bytes.most_common()}}


def operator_bytes(name: str, shape: tuple[int, int], dtype: Any) -> dict:
    """Forward and backward counts of operator ``name`` at ``shape``: passes over the input per kernel."""
    import torch

    fn = operators()[name]
    x = _inputs(shape, dtype).requires_grad_(True)
    dy = _inputs(shape, dtype, seed=1)
    size = x.element_size()
    with _counting.counting() as fwd:
        fwd.name(x, "x")
        y = fn(x)
    with _counting.counting() as bwd:
        for t, label in ((x, "x"), (y, "p"), (dy, "dp")):
            bwd.name(t, label)
        (dx,) = torch.autograd.grad(y, x, dy)
    fwd.name(y, "p")  # outputs are named after the fact (the accesses are labelled when read)
    bwd.name(dx, "dx")
    f, b = _summary(fwd, x.numel(), size), _summary(bwd, x.numel(), size)
    total = round(f["passes"] + b["passes"], 3)
    return {"op": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "forward": f, "backward": b,
            "passes": total, "torch_passes": round(f["torch_passes"] + b["torch_passes"], 3),
            "floor": FLOOR_PASSES, "over_floor": round(total / FLOOR_PASSES, 3)}


def loss_bytes(name: str, shape: tuple[int, int], dtype: Any) -> dict:
    """Forward + backward of loss ``name`` (class targets, mean reduction): kernel and PyTorch bytes."""
    import torch

    fn = losses()[name]
    x = _inputs(shape, dtype).requires_grad_(True)
    t = torch.randint(0, shape[1], (shape[0],), generator=torch.Generator().manual_seed(2))
    with _counting.counting() as c:
        c.name(x, "x")
        loss = fn(x, t)
        torch.autograd.grad(loss, x)
    s = _summary(c, x.numel(), x.element_size())
    return {"loss": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), **s,
            "all_passes": round(s["passes"] + s["torch_passes"], 3)}


#: tokens, hidden size, vocabulary, tokens per chunk of the fused linear loss (two chunks)
FUSED = (64, 32, 1000, 32)


def fused_bytes(mapping: str, dtype: Any, shape: tuple[int, int, int, int] = FUSED) -> dict:
    """Forward + backward of ``linear_fenchel_young_loss`` (class targets): bytes per token in units of one
    logits row (``V`` × the element size), GEMM FLOPs per token and class (the unfused floor is 6: the logits,
    the hidden gradient and the weight gradient; a CCE-style kernel that recomputes the logits does 8), the
    bytes of the tensors allocated per token, and the kernels launched."""
    import torch

    import softargmax as sa

    N, H, V, chunk = shape
    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(N, H, generator=gen) / H**0.5).to(dtype).requires_grad_(True)
    w = (torch.randn(V, H, generator=gen) * 0.1).to(dtype).requires_grad_(True)
    t = torch.randint(0, V, (N,), generator=gen)
    with _counting.counting() as c:
        loss = sa.linear_fenchel_young_loss(h, w, t, mapping=mapping, chunk_size=chunk)
        torch.autograd.grad(loss, (h, w))
    row = V * h.element_size()
    return {"loss": f"linear_{mapping}", "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
            "launches": dict(c.launches), "kernel_rows_per_token": round(c.kernel_bytes / (N * row), 3),
            "torch_rows_per_token": round(sum(c.torch_bytes.values()) / (N * row), 3),
            "rows_per_token": round(c.total_bytes / (N * row), 3),
            # without the GEMMs' operands (their weight reads scale with hidden / chunk): the element-wise traffic
            "elementwise_rows_per_token": round((c.total_bytes - sum(c.torch_bytes[g] for g in _counting.GEMMS))
                                                / (N * row), 3),
            "gemm_flops_per_token_class": round(sum(c.gemm_flops.values()) / (N * H * V), 3),
            "allocated_rows_per_token": round(sum(c.allocations.values()) / (N * row), 3),
            "torch_ops": {k: round(v / (N * row), 3) for k, v in c.torch_bytes.most_common(8)}}


def run(dtypes: list[Any], shapes: Optional[list[tuple[int, int]]] = None, with_losses: bool = True,
        log: Callable[[str], None] = print, split: bool = False) -> dict:
    shapes = shapes or [SHORT, long_shape()]
    out: dict[str, Any] = {"floor_passes": FLOOR_PASSES, "operators": [], "losses": []}
    log(f"{'operator':<18} {'dtype':<9} {'shape':<12} {'fwd':>6} {'bwd':>6} {'total':>6} {'/floor':>6} "
        f"{'torch':>6}  launches (fwd | bwd)")
    cases: list[tuple[tuple[int, int], Optional[int]]] = [(shape, None) for shape in shapes]
    if split:
        cases.append(((2, SPLIT_CASE[1]), SPLIT_CASE[0]))
    for dtype in dtypes:
        for shape, as_rows in cases:
            for name in operators():
                if as_rows is None:
                    r = operator_bytes(name, shape, dtype)
                    label = f"{shape[0]}x{shape[1]}"
                else:
                    with split_as_on(as_rows, shape[1]) as ns:
                        r = operator_bytes(name, shape, dtype)
                    r["split"] = {"as_rows": as_rows, "multiprocessors": H100_MULTIPROCESSORS, "slices": ns}
                    label = f"{as_rows}x{shape[1]}/{ns}"
                out["operators"].append(r)
                log(f"{name:<18} {r['dtype']:<9} {label:<12} {r['forward']['passes']:>6.2f} "
                    f"{r['backward']['passes']:>6.2f} {r['passes']:>6.2f} {r['over_floor']:>6.2f} "
                    f"{r['torch_passes']:>6.2f}  {r['forward']['launches']} | {r['backward']['launches']}")
    if with_losses:
        log(f"\n{'loss (fwd+bwd)':<20} {'dtype':<9} {'shape':<12} {'kernel':>7} {'torch':>7} {'all':>7}  launches")
        for dtype in dtypes:
            for name in losses():
                r = loss_bytes(name, SHORT, dtype)
                out["losses"].append(r)
                log(f"{name:<20} {r['dtype']:<9} {SHORT[0]}x{SHORT[1]:<9} {r['passes']:>7.2f} {r['torch_passes']:>7.2f} "
                    f"{r['all_passes']:>7.2f}  {r['launches']}")
        out["fused"] = []
        log(f"\nfused linear loss {FUSED[0]} tokens x {FUSED[1]} hidden x {FUSED[2]} classes, chunks of {FUSED[3]}: "
            "logits rows moved and allocated per token, GEMM FLOPs per token-class (floor 6, CCE 8)")
        for dtype in dtypes:
            for mapping in ("softmax", "entmax15"):
                r = fused_bytes(mapping, dtype)
                out["fused"].append(r)
                log(f"{r['loss']:<20} {r['dtype']:<9} moved {r['rows_per_token']:>6.2f} rows/token "
                    f"(element-wise {r['elementwise_rows_per_token']:.2f}, kernels {r['kernel_rows_per_token']:.2f}), allocated {r['allocated_rows_per_token']:.2f}, "
                    f"GEMM {r['gemm_flops_per_token_class']:.2f}  {r['launches']}")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--no-losses", action="store_true")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--split", action="store_true",
                    help="also 256 x 262,144 split over programs as on an H100 (3 slices; two rows counted)")
    args = ap.parse_args(argv)
    import torch

    if not _counting.interpreter_ready():
        print("bytes_moved.py: Triton's interpreter is not available (TRITON_INTERPRET=1 and Triton needed)",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    result = run([getattr(torch, d) for d in args.dtype], with_losses=not args.no_losses, split=args.split)
    import triton

    result["triton"] = triton.__version__
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    _counting.setup_interpreter()
    sys.exit(main())
