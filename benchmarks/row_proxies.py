"""Instructions per score of the Triton row solver's loops, from their sm_90a PTX (no GPU needed).

    TRITON_INTERPRET=0 PYTHONPATH=src /tmp/t36/bin/python benchmarks/row_proxies.py --json benchmarks/results/row-proxies.json

For each variant of :data:`VARIANTS` (globs on :mod:`compile_report`'s ``"module.function variant"``: the
forward of α-entmax at α = 1.3, 1.5 and 2 as the operators launch it, in the streamed and the register
kernels, bfloat16 and float32) the script compiles the kernel for sm_90a with :mod:`compile_report`, finds the
innermost loops of its PTX with :mod:`attention_proxies`' control-flow helpers (natural loops of the basic
blocks) and counts the PTX instructions of one iteration of each, divided by the scores one thread handles
per iteration: ``BLOCK / (32 · warps)`` for a loop that reads the row (``Z``), ``SLOTS · BLOCK / (32 · warps)``
for the streamed kernel's Newton loop on the kept scores (no load), ``ROWS · CH · LINE / (32 · warps)`` for
the register kernel's Newton loop.  Each loop is named by what it reads and writes:

* ``scan``: reads ``Z``, the streamed kernel's first pass (the lanes' largest scores);
* ``row_newton``: reads ``Z``, writes nothing: a Newton step over the full row;
* ``write``: reads ``Z`` and writes ``P``: the last pass;
* ``slot_newton`` / ``tile_newton``: no load: Newton on the registers (streamed / register kernel).

Also ptxas's registers and spills, and the global access widths (``ld_bytes`` / ``st_bytes``, bytes per
instruction: 16 is a full vector).  A static count: one iteration of each loop, every block of its body
(the branch-free bodies of these loops run all of it).  Work outside the loops (the reductions after a
pass, the Newton step per row) is left out.  Counts are those of the Triton that runs the script (the GPU
machine's is 3.6.0).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Optional

os.environ["TRITON_INTERPRET"] = "0"  # (before Triton is imported: compiled kernels, not the interpreter's)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import attention_proxies as AP  # noqa: E402
import compile_report as CR  # noqa: E402

#: the variants reported: the operators' forward (no loss sums, no gradient, one α for all rows)
VARIANTS = ("row_kernels.solve_long_rows * KIND=0 EXACT=? PER_ROW=0 SUMS=0 GRAD=0 *",
            "row_kernels.solve_block_rows * KIND=0 EXACT=? PER_ROW=0 SUMS=0 GRAD=0 ROWS=1 CH=* SPLIT=1 warps=32")


def _op(ins: str) -> str:
    return re.sub(r"^@!?%\w+\s+", "", ins).split()[0]


def loop_counts(ptx: str, arg_names: list[str]) -> list[dict]:
    """The innermost loops of a row kernel's PTX, in order: ``{"reads": [...], "writes": bool, "instructions": n,
    "mufu": lg2/ex2 count}`` (``reads``: the kernel arguments its global loads derive from, by name)."""
    blocks = AP.basic_blocks(AP.entry_body(ptx))
    found = AP.loops(blocks)
    origin = AP.register_params(blocks)
    out = []
    for lp in found:
        if lp.children:
            continue
        ins = [s for i in sorted(AP.own_blocks(lp, found)) for s in blocks[i].instructions]
        reads: set = set()
        for _, params in AP.loads(ins, origin):
            reads |= {arg_names[p] if p < len(arg_names) else f"param_{p}" for p in params}
        out.append({"reads": sorted(reads), "writes": any(_op(s).startswith("st.global") for s in ins),
                    "instructions": len(ins),
                    "mufu": sum(_op(s).startswith(("lg2.", "ex2.")) for s in ins)})
    return out


def name_loops(kernel: str, found: list[dict], constexprs: dict, warps: int) -> dict:
    """``{name: entry}`` with the scores per thread and the instructions per score of each loop
    (module docstring); a second loop of one name gets ``_2``."""
    out: dict = {}
    for lp in found:
        if "Z" in lp["reads"]:
            name = "write" if lp["writes"] else ("scan" if not any(n.startswith("scan") for n in out) else "row_newton")
            per_thread = constexprs["BLOCK"] / (32 * warps)
        elif kernel.endswith("solve_long_rows"):
            name, per_thread = "slot_newton", constexprs["SLOTS"] * constexprs["BLOCK"] / (32 * warps)
        else:
            name = "tile_newton"
            per_thread = constexprs.get("ROWS", 1) * constexprs["CH"] * constexprs["LINE"] / (32 * warps)
        key = name
        i = 2
        while key in out:
            key, i = f"{name}_{i}", i + 1
        out[key] = {"instructions": lp["instructions"], "scores_per_thread": per_thread,
                    "instructions_per_score": round(lp["instructions"] / per_thread, 2),
                    "mufu_per_score": round(lp["mufu"] / per_thread, 2)}
    return out


def measure(index: int) -> dict:
    """One variant's entry: its loops (:func:`name_loops`), registers, spills and access widths."""
    v = CR.variants()[index]
    spec = CR._spec(v.kernel)
    fn = getattr(CR._mod(spec.module), spec.name)
    sig = CR._signature(fn, spec, v.dtype, v.constexprs)
    c, log = CR.build(fn, sig, v.constexprs, v.warps)
    res = CR.resources(c, log, v.warps)
    found = loop_counts(c.asm["ptx"], AP._ptx_args(fn, sig))
    return {"kernel": v.kernel, "variant": v.label, "regs": res["regs"], "spill_bytes": res["spill_bytes"],
            "ld_bytes": res["ld_bytes"], "st_bytes": res["st_bytes"],
            "loops": name_loops(v.kernel, found, v.constexprs, v.warps)}


def report(patterns: tuple[str, ...] = VARIANTS) -> dict:
    import triton

    rows = [measure(i) for i in CR.select(list(patterns))]
    return {"triton": triton.__version__, "target": "sm_90a", "variants": rows}


def table(rep: dict) -> str:
    lines = [f"Triton {rep['triton']}, {rep['target']}: PTX instructions per score of each loop"]
    for r in rep["variants"]:
        loops = "  ".join(f"{k} {e['instructions_per_score']:g} ({e['mufu_per_score']:g} MUFU)" for k, e in r["loops"].items())
        lines.append(f"{r['kernel']} {r['variant']}: regs {r['regs']} spill {r['spill_bytes']} "
                     f"ld {r['ld_bytes']} st {r['st_bytes']}\n    {loops}")
    return "\n".join(lines)


def compare(base: dict, rep: dict) -> str:
    """Per variant of ``rep`` and loop, the instructions per score of ``base`` (the same kernel, dtype and
    ``KIND``, ``SUMS``, ``GRAD``, ``PER_ROW``, ``EXACT`` or, for ``EXACT_FAR``, the general power's ``EXACT = 0``
    that ran those rows before) -> now."""
    def key(r: dict, exact_far_as_general: bool) -> str:
        label = re.sub(r" (BLOCK|SLOTS|ROWS|CH|LINE|SPLIT|warps)=\S+", "", r["variant"])
        return r["kernel"] + " " + (label.replace("EXACT=3", "EXACT=0") if exact_far_as_general else label)

    before = {key(r, False): r for r in base["variants"]}
    lines = ["instructions per score, baseline -> now:"]
    for r in rep["variants"]:
        b = before.get(key(r, True))
        if b is None:
            continue
        loops = "  ".join(f"{k} {b['loops'][k]['instructions_per_score']:g} -> {e['instructions_per_score']:g}"
                          for k, e in r["loops"].items() if k in b["loops"])
        lines.append(f"{key(r, False)}: regs {b['regs']} -> {r['regs']}\n    {loops}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="GLOB",
                    help="compile_report globs ('module.function variant')")
    ap.add_argument("--json", metavar="PATH", help="write the report here")
    ap.add_argument("--baseline", metavar="PATH",
                    help="a report of this script on other code (e.g. the commit before a change): kept in the JSON "
                         "as 'baseline', with --baseline-label, and compared loop by loop in the table")
    ap.add_argument("--baseline-label", default="", help="what the baseline ran on (a commit)")
    args = ap.parse_args(argv)
    rep: dict[str, Any] = report(tuple(args.variants))
    print(table(rep))
    if args.baseline:
        with open(args.baseline, encoding="utf-8") as fh:
            base = json.load(fh)
        base.pop("baseline", None)
        rep["baseline"] = {"label": args.baseline_label, **base}
        print(compare(base, rep))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
