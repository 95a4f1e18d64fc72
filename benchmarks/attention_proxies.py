"""Instructions per score of the fused attention kernels, from their sm_90a PTX (no GPU needed).

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install torch==2.13.0 triton==3.6.0 "numpy<2.3"   # the GPU machine's Triton
    PYTHONPATH=src /tmp/t36/bin/python benchmarks/attention_proxies.py --json benchmarks/results/attention-proxies.json
    PYTHONPATH=src python benchmarks/attention_proxies.py --passes 2.64 4.97  # Newton passes given: no interpreter run

Each kernel of the fused α-entmax attention (``attention_kernels``: the forward, ``dK, dV`` and ``dQ``) is
compiled for sm_90a by :mod:`compile_report` (its variant at D = 64, bfloat16, causal: 1.5-entmax for a fixed
α, the general power with the α gradient for a learned α, with the hardware's ``log2`` (``FAST_LOG``, every
α ≥ ``ALPHA_FAST_LOG``) and, as ``total_learned_alpha_software_log2``, without it).  In its PTX the script finds the loops (the control
flow graph's natural loops: a backward branch ``@%p bra $L__BB...`` to a block that dominates it) and counts
the PTX instructions of one iteration of each innermost loop (the tile loops: every block of the body, as a
kept tile runs all of it), divided by the scores one thread handles per iteration,
``BLOCK_M × BLOCK_N / (32 × warps)``.  The total counts what executes per score: the sum over the tile loops
of that count times the loop's visits per score: the Newton loop's are the forward's mean Newton passes
(Triton's interpreter on a seeded random input, weighted by the tiles of each query block:
``--passes-length``, one head), the
max/histogram pass is visited once, the output pass and the backward loops once per kept tile (the kept
fraction of the same run: 1 on that input).  Every loop (the max/histogram, Newton, output, ``dK, dV`` and ``dQ``
loops) comes in two copies, over the tiles that need no mask and over the edge tiles (the causal diagonal's),
their visits split in the band's proportions (:func:`tile_split`: 96.9 % without a mask at L = 4096 in 64 × 64
tiles); the forward's Newton loop comes twice more, for its first pass (visited once: it writes the list of the
tiles still kept) and for the later ones (the other visits).  A tile loop is an innermost loop that loads a tile
of a streamed operand (below).  Work outside the tile loops (the Newton step per row, prologues and epilogues) is
left out: a few hundred instructions per row block, under 1 per score at 4k keys.

The JSON's ``kernels`` are keyed by :mod:`compile_report`'s ``"module.function variant"``.  Per kernel it also holds ptxas's registers and spills and the CTAs per SM (:func:`compile_report.resources`),
and ``kv_loops`` / ``kv_loops_async``: the tile loops that load a streamed operand (``K`` or ``V``; for the
``dK, dV`` kernel, whose loop runs over query blocks, ``Q`` and ``dO``) and those of them whose loads of it are
all ``cp.async`` or TMA (``cp.async.bulk``), i.e. software-pipelined by Triton.  Which argument a load reads is
found by following its address register back through the PTX to the ``ld.param`` of the kernel's arguments.

The reference is AdaSplash-2 (Gonçalves, Pitorro, Niculae, Ponti, Li, Martins & Treviso, *AdaSplash-2: Faster
Differentiable Sparse Attention*, ICML 2026, arXiv:2604.15180; its kernels are ``adasplash/adasplash_v2.py`` of
https://github.com/deep-spin/adasplash, BSD 3-Clause, a copy of which is in ``benchmarks/third_party/adasplash/``),
counted the same way at the tiles it launches (64 × 64 after its first pass, which is compiled at 64 × 64 too;
4 warps and 2 stages of its autotuner's choices; ``niter = 1``, its default): the max pass, the histogram, one
Halley pass and the final pass, the output, and the backward's ``dQ`` and ``dK, dV``, each tile visited once.
Its loops over the diagonal tiles run once per row block (one 64-key block) and compile to straight-line code,
counted at the price of the loop over the other tiles; its per-row loop over the histogram's bins loads no
tile and is left out like the Newton step.

Instruction counts are those of the Triton that runs the script (the GPU machine's is 3.6.0: run it in a venv
with that version).  The interpreter's pass count runs in a subprocess (``TRITON_INTERPRET=1``: its kernels
cannot be compiled; Triton 3.6's interpreter needs numpy < 2.3).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compile_report as CR  # noqa: E402  (benchmarks/ is not a package)

ADASPLASH = os.path.join(HERE, "third_party", "adasplash", "adasplash_v2.py.txt")
ADASPLASH_COMMIT = "4b64c94"

# -- PTX: instructions, basic blocks, loops -------------------------------------------------------------------

_LABEL = re.compile(r"^(\$L__\w+):")
_BRANCH = re.compile(r"^(@!?%\w+\s+)?bra(?:\.uni)?\s+(\$L__\w+)\s*;")
_END = re.compile(r"^(@!?%\w+\s+)?(?:ret|exit|trap)\b")
_PARAM = re.compile(r"\[\s*(\w+)_param_(\d+)\s*\]")
_REG = re.compile(r"%[a-z]+\d+")
#: instructions that write no register (their first operand is read)
_NO_DEST = re.compile(r"^(st|cp|red|bar|barrier|bra|ret|exit|prefetch|fence|membar|wgmma\.(fence|commit|wait)|"
                      r"mbarrier\.(init|arrive_drop|inval)|setmaxnreg|griddepcontrol|trap|elect)\b")


def code(line: str) -> str:
    """A PTX line without its comment, stripped."""
    return line.split("//", 1)[0].strip()


def is_instruction(line: str) -> bool:
    """Whether a PTX line is an instruction (not a label, directive, brace or comment)."""
    c = code(line)
    return c.endswith(";") and not c.startswith((".", "{", "}", "$"))


def entry_body(ptx: str) -> list[str]:
    """The lines of the first ``.entry`` function's body."""
    lines = ptx.splitlines()
    start = next(i for i, s in enumerate(lines) if ".entry" in s)
    open_ = next(i for i in range(start, len(lines)) if code(lines[i]) == "{")
    depth, out = 0, []
    for s in lines[open_:]:
        c = code(s)
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        out.append(s)
    return out[1:]


@dataclass
class Block:
    """A basic block: its label (``None`` for the entry or a fall-through start), instructions, successors."""

    label: Optional[str]
    instructions: list[str] = field(default_factory=list)
    succ: list[int] = field(default_factory=list)


def basic_blocks(lines: list[str]) -> list[Block]:
    """The basic blocks of a function body: a block starts at a label that a branch names and ends after a
    branch, ``ret`` or ``exit``.  Successors: the branch target, and the next block unless the branch is
    unconditional."""
    targets = {m.group(2) for s in lines if (m := _BRANCH.match(code(s)))}
    blocks = [Block(None)]
    for s in lines:
        c = code(s)
        m = _LABEL.match(c)
        if m and m.group(1) in targets:
            if blocks[-1].instructions or blocks[-1].label is not None:
                blocks.append(Block(m.group(1)))
            else:
                blocks[-1].label = m.group(1)
            continue
        if not is_instruction(s):
            continue
        blocks[-1].instructions.append(c)
        if _BRANCH.match(c) or _END.match(c):
            blocks.append(Block(None))
    if not blocks[-1].instructions and blocks[-1].label is None:
        blocks.pop()
    index = {b.label: i for i, b in enumerate(blocks) if b.label}
    for i, b in enumerate(blocks):
        last = b.instructions[-1] if b.instructions else ""
        br, end = _BRANCH.match(last), _END.match(last)
        if br:
            b.succ.append(index[br.group(2)])
        if (not br and not end) or ((br or end) and (br or end).group(1)):  # falls through
            if i + 1 < len(blocks):
                b.succ.append(i + 1)
    return blocks


def dominators(blocks: list[Block]) -> list[set[int]]:
    """``dom[i]``: the blocks that dominate block ``i`` (block 0 is the entry)."""
    n = len(blocks)
    preds: list[list[int]] = [[] for _ in range(n)]
    for i, b in enumerate(blocks):
        for s in b.succ:
            preds[s].append(i)
    dom = [set(range(n)) for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for i in range(1, n):
            ps = [dom[p] for p in preds[i]]
            new = {i} | (set.intersection(*ps) if ps else set())
            if new != dom[i]:
                dom[i], changed = new, True
    return dom


@dataclass
class Loop:
    """A natural loop: its header block, its blocks (nested loops' included), its parent and children."""

    header: int
    blocks: set[int]
    parent: Optional[int] = None
    children: list[int] = field(default_factory=list)


def loops(blocks: list[Block]) -> list[Loop]:
    """The natural loops, one per header (back edges ``u -> h`` with ``h`` dominating ``u``), in the order of
    their headers, with their nesting."""
    dom = dominators(blocks)
    preds: list[list[int]] = [[] for _ in blocks]
    for i, b in enumerate(blocks):
        for s in b.succ:
            preds[s].append(i)
    bodies: dict[int, set[int]] = {}
    for u, b in enumerate(blocks):
        for h in b.succ:
            if h in dom[u]:
                body, stack = {h}, [u]
                while stack:
                    x = stack.pop()
                    if x not in body:
                        body.add(x)
                        stack.extend(preds[x])
                bodies.setdefault(h, set()).update(body)
    out = [Loop(h, bodies[h]) for h in sorted(bodies)]
    for i, lp in enumerate(out):
        outer = [j for j, o in enumerate(out) if j != i and lp.blocks < o.blocks]
        if outer:
            lp.parent = min(outer, key=lambda j: len(out[j].blocks))
            out[lp.parent].children.append(i)
    return out


def own_blocks(lp: Loop, all_loops: list[Loop]) -> set[int]:
    """The blocks of a loop outside its nested loops: one iteration's."""
    inner: set[int] = set()
    for c in lp.children:
        inner |= all_loops[c].blocks
    return lp.blocks - inner


def _dests_and_sources(ins: str) -> tuple[list[str], list[str]]:
    """The registers an instruction writes and those it reads (a guard predicate counts as read)."""
    body = re.sub(r"^@!?%\w+\s+", "", ins).rstrip(";")
    parts = body.split(None, 1)
    if len(parts) < 2:
        return [], []
    op, operands = parts
    if _NO_DEST.match(op):
        return [], _REG.findall(operands)
    m = re.match(r"\s*(\{[^}]*\}|[^,]+)(.*)", operands)
    if m is None:
        return [], []
    return _REG.findall(m.group(1)), _REG.findall(m.group(2))


def register_params(blocks: list[Block]) -> dict[str, set[int]]:
    """For each register, the kernel arguments (indices of ``..._param_N``) its value derives from, through every
    instruction that writes it (a fixed point over the whole function)."""
    flow: list[tuple[list[str], list[str], set[int]]] = []
    for b in blocks:
        for ins in b.instructions:
            dests, srcs = _dests_and_sources(ins)
            if dests:
                flow.append((dests, srcs, {int(p) for _, p in _PARAM.findall(ins)}))
    origin: dict[str, set[int]] = {}
    changed = True
    while changed:
        changed = False
        for dests, srcs, params in flow:
            got = set(params)
            for r in srcs:
                got |= origin.get(r, set())
            for d in dests:
                have = origin.setdefault(d, set())
                if not got <= have:
                    have |= got
                    changed = True
    return origin


_GLOBAL_LOAD = re.compile(r"^(?:@!?%\w+\s+)?(ld\.global|cp\.async\.bulk|cp\.async)\S*\s+(.*);")


def loads(instructions: list[str], origin: dict[str, set[int]]) -> list[tuple[str, set[int]]]:
    """The global loads among ``instructions``: ``("ld" | "cp.async" | "tma", arguments the address derives from)``."""
    out = []
    for ins in instructions:
        m = _GLOBAL_LOAD.match(ins)
        if m is None:
            continue
        kind = {"ld.global": "ld", "cp.async": "cp.async", "cp.async.bulk": "tma"}[m.group(1)]
        addresses = re.findall(r"\[([^\]]*)\]", m.group(2))
        src = addresses[1] if kind != "ld" and len(addresses) > 1 else addresses[0] if addresses else ""
        params: set[int] = set()
        for r in _REG.findall(src):
            params |= origin.get(r, set())
        out.append((kind, params))
    return out


@dataclass
class LoopCount:
    """One innermost loop: the instructions of one iteration and its streamed loads by argument name."""

    instructions: int
    streams: dict  # argument name -> "ld" / "cp.async" / "tma" (the slowest kind seen)


def tile_loops(ptx: str, arg_names: list[str], streamed: tuple[str, ...]) -> list[LoopCount]:
    """The tile loops of a kernel's PTX, in order: the innermost loops that load one of the ``streamed``
    arguments (``arg_names``: the kernel's arguments in PTX parameter order), with one iteration's instruction
    count and the kind of those loads."""
    blocks = basic_blocks(entry_body(ptx))
    found = loops(blocks)
    origin = register_params(blocks)
    out = []
    for lp in found:
        if lp.children:
            continue
        ins = [s for i in sorted(own_blocks(lp, found)) for s in blocks[i].instructions]
        streams: dict = {}
        for kind, params in loads(ins, origin):
            for p in params:
                name = arg_names[p] if p < len(arg_names) else f"param_{p}"
                if name in streamed and streams.get(name) != "ld":
                    streams[name] = kind
        if streams:
            out.append(LoopCount(len(ins), streams))
    return out


# -- the kernels ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoopSpec:
    name: str
    visits: str  # a key of the visits dictionary ("once", "passes", "kept", ...)


def _ptx_args(fn: Any, signature: dict) -> list[str]:
    """The kernel's argument names in PTX parameter order (the constexprs are not parameters)."""
    return [n for n in fn.arg_names if signature[n] != "constexpr"]


def _inner(fn: Any) -> Any:
    from triton.runtime import JITFunction

    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):  # an autotuner around the JIT function
        fn = fn.fn
    return fn


def measure(fn: Any, signature: dict, constexprs: dict, warps: int, stages: Optional[int],
            block: tuple[int, int], specs: list[LoopSpec], visits: dict, streamed: tuple[str, ...]) -> dict:
    """Compile one kernel and return its entry: instructions per score (executed: each tile loop's count per
    score times its visits), the visits, ptxas's registers and spills, CTAs per SM and the streamed loops."""
    c, log = CR.build(fn, signature, constexprs, warps, stages)
    res = CR.resources(c, log, warps)
    found = tile_loops(c.asm["ptx"], _ptx_args(fn, signature), streamed)
    if len(found) != len(specs):
        raise RuntimeError(f"{fn.__name__}: {len(found)} tile loops in the PTX, {len(specs)} expected")
    out = summarize(found, specs, visits, block[0] * block[1] / (32 * warps))
    return {"instructions_per_score": out.pop("instructions_per_score"), "visits_per_score": out.pop("visits_per_score"),
            "regs": res["regs"], "ctas_per_sm": res["ctas_per_sm"], "spills": res["spill_bytes"], **out}


def summarize(found: list[LoopCount], specs: list[LoopSpec], visits: dict, per_thread: float) -> dict:
    """A kernel's entry from its tile loops (``found``, named and visited as ``specs`` say; ``per_thread``: the
    scores one thread handles per iteration): the instructions per score that execute (each loop's count per
    score times its visits per score), the visits, ``kv_loops`` / ``kv_loops_async`` and each loop's numbers.
    Copies of one loop (a ``tl.static_range`` unrolled around it) share a name: their visits add up."""
    loops_out: dict = {}
    total = vis = 0.0
    for spec, lc in zip(specs, found):
        per_score, v = lc.instructions / per_thread, visits[spec.visits]
        e = loops_out.setdefault(spec.name, {"instructions": 0, "instructions_per_score": 0.0,
                                             "visits_per_score": 0.0, "streams": {}})
        w = e["visits_per_score"]
        e["instructions_per_score"] = round((e["instructions_per_score"] * w + per_score * v) / max(w + v, 1e-12), 2)
        e["instructions"] = max(e["instructions"], lc.instructions)
        e["visits_per_score"] = round(w + v, 4)
        for name, kind in lc.streams.items():
            if e["streams"].get(name) != "ld":
                e["streams"][name] = kind
        total += per_score * v
        vis += v
    kv = [lp for lp in loops_out.values() if lp["streams"]]
    return {"instructions_per_score": round(total, 1), "visits_per_score": round(vis, 3), "kv_loops": len(kv),
            "kv_loops_async": sum(all(k != "ld" for k in lp["streams"].values()) for lp in kv),
            "scores_per_thread": per_thread, "loops": loops_out}


#: the library's tile loops per kernel, in PTX order, and their visits per score
#: (every loop comes in two copies: the tiles without a mask, then the edge tiles, the causal diagonal's: visited
#: in the proportions of :func:`tile_split`; the forward's Newton loop in two more: its first pass, which writes the
#: list of the tiles still kept, and the later ones, which do not)
OURS = {"attention_fwd": [LoopSpec("max", "once_free"), LoopSpec("max", "once_edge"), LoopSpec("newton", "first_free"),
                          LoopSpec("newton", "first_edge"), LoopSpec("newton", "more_free"),
                          LoopSpec("newton", "more_edge"), LoopSpec("output", "kept_free"),
                          LoopSpec("output", "kept_edge")],
        "attention_bwd_dkdv": [LoopSpec("tiles", "kept_free"), LoopSpec("tiles", "kept_edge")],
        "attention_bwd_dq": [LoopSpec("tiles", "kept_free"), LoopSpec("tiles", "kept_edge")]}
STREAMED = {"attention_fwd": ("K", "V"), "attention_bwd_dkdv": ("Q", "DO"), "attention_bwd_dq": ("K", "V")}


def tile_split(L: int, block_m: int, block_n: int) -> float:
    """The fraction of a causal ``L × L`` band's tiles that need no mask (whole key blocks at or before the
    query block's first row: the kernels' ``_free_blocks``); the others are the diagonal's."""
    tiles = free = 0
    for i in range(-(-L // block_m)):
        tiles += -(-min(L, (i + 1) * block_m) // block_n)
        free += min((i * block_m + 1) // block_n, L // block_n)
    return free / tiles


def case_variant(kernel: str, exact: int, D: int = 64, fast: Optional[bool] = None) -> int:
    """The index in :func:`compile_report.variants` of ``kernel`` at bfloat16, causal, no mask, no window, dense, ``D``
    (``fast``: its ``FAST_LOG``; by default the hardware's ``log2`` for the general power)."""
    fast = exact == 0 if fast is None else fast
    for i, v in enumerate(CR.variants()):
        c = v.constexprs
        if (v.kernel == f"attention_kernels.{kernel}" and v.dtype == "bf16" and c["EXACT"] == exact and c["CAUSAL"]
                and not c["HAS_MASK"] and not c["VARLEN"] and not c.get("WINDOWED", False) and c["HEAD_DIM"] == D
                and c.get("FAST_LOG", False) == fast):
            return i
    raise LookupError(f"no variant of {kernel} with EXACT={exact}, FAST_LOG={fast}")


def ours(exact: int, visits: dict, fast: Optional[bool] = None) -> dict:
    """The entries of the three attention kernels at ``EXACT`` (and ``FAST_LOG``: :func:`case_variant`), keyed
    ``"module.kernel variant"``."""
    out = {}
    for kernel, specs in OURS.items():
        i = case_variant(kernel, exact, fast=fast)
        v = CR.variants()[i]
        spec = CR._spec(v.kernel)
        fn = getattr(CR._mod(spec.module), spec.name)
        sig = CR._signature(fn, spec, v.dtype, v.constexprs)
        out[f"{v.kernel} {v.label}"] = measure(fn, sig, v.constexprs, v.warps, spec.stages() if spec.stages else None,
                                               (v.constexprs["BLOCK_M"], v.constexprs["BLOCK_N"]), specs, visits,
                                               STREAMED[kernel])
    return out


# -- AdaSplash-2 -----------------------------------------------------------------------------------------------

def _load_adasplash(path: str) -> Any:
    """The AdaSplash-2 kernel module from a copy of ``adasplash/adasplash_v2.py`` (imported from a temporary
    ``.py`` file: the vendored copy is stored as text, outside the repository's linters)."""
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "adasplash_v2_reference.py")
        shutil.copyfile(path, target)
        spec = importlib.util.spec_from_file_location("adasplash_v2_reference", target)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod


def _ada_signature(fn: Any, constexprs: dict, dtype: str) -> dict:
    sig = {}
    for n in fn.arg_names:
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in ("Q", "K", "V", "DO", "DQ", "DK", "DV", "OUT", "OUT2"):
            sig[n] = "*" + dtype
        elif n in ("BMASK", "BMASK_T"):
            sig[n] = "*i32"
        elif n[0].isupper():
            sig[n] = "*fp32"
        elif n == "sm_scale":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    return sig


def adasplash(path: str, L: int, warps: int = 4, stages: int = 2, niter: int = 1, block: int = 64) -> dict:
    """AdaSplash-2's kernels at sequence length ``L`` (causal, bfloat16, D = 64, one head, ``niter`` Halley
    passes), ``block × block`` tiles, ``warps`` and ``stages`` (its autotuner's choices: 2 or 4 warps, 2 to 4
    stages): the entries of :func:`measure` and the total."""
    A = _load_adasplash(path)
    n32 = -(-(L // block) // 32)  # its loops over the kept tiles: one copy per 32 key blocks (tl.static_range)
    visits = {"once": 1.0, "copy": 1 / n32}
    common = dict(N_H=1, N_KV_H=1, GROUP_SIZE=1, H_DIM=64, N_CTX=L, IS_VARLEN=False, VARLEN=None, BLOCK_M=block,
                  BLOCK_N=block)
    bins = A._select_bins(L, block)
    once = [LoopSpec("tiles", "once")]
    copies = [LoopSpec("tiles", "copy")] * n32
    kernels = [
        ("_get_tau", common, once, ("K",)),
        ("_get_tau_v2", dict(common, BINS=bins), once, ("K",)),
        ("_get_tau_v3", dict(common, BINS=bins, NITER=niter, N_INT32s=n32),
         [LoopSpec("halley", "once")] * niter + [LoopSpec("final", "once")], ("K",)),
        ("_get_output", dict(common, N_INT32s=n32, NEED_BACKWARD=True), copies, ("K", "V")),
        ("_bwd_q_kernel", dict(common, N_INT32s=n32), copies, ("K", "V")),
        ("_bwd_kv_kernel", dict(common, N_INT32s=n32), copies, ("Q", "DO")),
    ]
    out = {}
    for name, consts, specs, streamed in kernels:
        fn = _inner(getattr(A, name))
        consts = {k: v for k, v in consts.items() if k in fn.arg_names}
        sig = _ada_signature(fn, consts, "bf16")
        out[name] = measure(fn, sig, consts, warps, stages, (block, block), specs, visits, streamed)
    return {"name": "AdaSplash-2", "total": round(sum(k["instructions_per_score"] for k in out.values()), 1),
            "source": f"https://github.com/deep-spin/adasplash/blob/{ADASPLASH_COMMIT}/adasplash/adasplash_v2.py",
            "block": block, "warps": warps, "stages": stages, "niter": niter, "kernels": out}


# -- the Newton passes (Triton's interpreter) ------------------------------------------------------------------

def _passes_child(L: int, H: int, block_m: int, block_n: int) -> dict:
    """Run in a ``TRITON_INTERPRET=1`` process: the forward's Newton passes per query block and the kept tiles."""
    import torch

    from softargmax.backends.triton import flash_attention as FA

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, L, 64, generator=gen).to(torch.bfloat16) for _ in range(3))
    out = {}
    for key, kw in (("fixed_alpha", dict(mapping="entmax15")),
                    ("learned_alpha", dict(mapping="entmax", alpha=torch.full((H,), 1.5)))):
        st = FA.forward_stats(q, k, v, is_causal=True, block_m=block_m, block_n=block_n, **kw)
        passes = st["newton_passes"].reshape(H, -1).double()
        nq = passes.shape[1]
        tiles = torch.tensor([min(L, (i + 1) * block_m) // block_n + (min(L, (i + 1) * block_m) % block_n > 0)
                              for i in range(nq)], dtype=torch.float64)
        out[key] = {"mean": round(float(passes.mean()), 3),
                    "per_score": round(float((passes * tiles).sum() / (tiles.sum() * H)), 3),
                    "kept": round(st["kept"] / st["tiles"], 4)}
    return out


def newton_passes(L: int, H: int, block_m: int, block_n: int) -> dict:
    """:func:`_passes_child` in a subprocess under Triton's interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    code_ = (f"import sys, json; sys.path.insert(0, {HERE!r}); import attention_proxies as P; "
             f"print(json.dumps(P._passes_child({L}, {H}, {block_m}, {block_n})))")
    proc = subprocess.run([sys.executable, "-c", code_], capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the report ------------------------------------------------------------------------------------------------

def report(passes: dict, L: int, passes_L: int, H: int, adasplash_path: Optional[str]) -> dict:
    import triton

    fwd = CR.variants()[case_variant("attention_fwd", 2)].constexprs
    free = tile_split(L, fwd["BLOCK_M"], fwd["BLOCK_N"])
    kernels, totals = {}, {}
    for key, exact, fast in (("fixed_alpha", 2, False), ("learned_alpha", 0, True),
                             ("learned_alpha_software_log2", 0, False)):
        run = "learned_alpha" if exact == 0 else key
        per, kept = passes[run]["per_score"], passes[run].get("kept", 1.0)
        first = min(per, 1.0)  # (every query block with a row to solve makes a first pass)
        visits = {"once": 1.0, "once_free": free, "once_edge": 1 - free, "passes": per, "kept": kept,
                  "first_free": first * free, "first_edge": first * (1 - free), "more_free": (per - first) * free,
                  "more_edge": (per - first) * (1 - free), "kept_free": kept * free, "kept_edge": kept * (1 - free)}
        got = ours(exact, visits, fast)
        kernels.update(got)
        totals[key] = round(sum(k["instructions_per_score"] for k in got.values()), 1)
    out = {"triton": triton.__version__, "target": "sm_90a",
           "case": {"L": L, "H": H, "D": 64, "block_m": fwd["BLOCK_M"], "block_n": fwd["BLOCK_N"], "causal": True,
                    "dtype": "bfloat16"},
           "kernels": kernels, "total_fixed_alpha": totals["fixed_alpha"],
           "total_learned_alpha": totals["learned_alpha"],
           "total_learned_alpha_software_log2": totals["learned_alpha_software_log2"],
           "reference": adasplash(adasplash_path, L) if adasplash_path else None,
           "fast_log_from_alpha": CR._mod("flash_attention").ALPHA_FAST_LOG,
           "newton_passes": dict(passes, L=passes_L, H=H, inputs="standard normal q, k, v in bfloat16, seed 0",
                                 fixed="1.5-entmax (EXACT=2)",
                                 learned="alpha = 1.5 as a tensor (EXACT=0, FAST_LOG=1)")}
    return out


def table(rep: dict) -> str:
    lines = [f"Triton {rep['triton']}, {rep['target']}, case {rep['case']}",
             f"{'kernel':<100} {'instr/score':>11} {'visits':>6} {'regs':>4} {'CTA/SM':>6} {'spill':>5} {'kv':>2} "
             f"{'async':>5}"]
    rows = list(rep["kernels"].items()) + [(f"AdaSplash-2 {k}", v) for k, v in
                                           (rep["reference"] or {}).get("kernels", {}).items()]
    for name, k in rows:
        lines.append(f"{name[:100]:<100} {k['instructions_per_score']:>11} {k['visits_per_score']:>6} {k['regs']:>4} "
                     f"{k['ctas_per_sm']:>6} {k['spills']:>5} {k['kv_loops']:>2} {k['kv_loops_async']:>5}")
        for ln, lp in k["loops"].items():
            lines.append(f"    {ln:<20} {lp['instructions']:>5} PTX instructions, {lp['instructions_per_score']:>7} "
                         f"per score x {lp['visits_per_score']} visits  {lp['streams']}")
    lines.append(f"total: fixed alpha {rep['total_fixed_alpha']}, learned alpha {rep['total_learned_alpha']} "
                 f"(with tl.log2, below alpha {rep['fast_log_from_alpha']}: {rep['total_learned_alpha_software_log2']}), "
                 f"AdaSplash-2 {(rep['reference'] or {}).get('total')}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=4096, help="sequence length of the case (AdaSplash-2's loops)")
    ap.add_argument("--passes-length", type=int, default=512,
                    help="sequence length of the interpreter's Newton pass count (one head: about 40 s per α)")
    ap.add_argument("--passes", type=float, nargs=2, metavar=("FIXED", "LEARNED"),
                    help="Newton passes per score (fixed α, learned α) instead of the interpreter's count")
    ap.add_argument("--adasplash", default=ADASPLASH, help="AdaSplash-2's adasplash_v2.py ('' to skip)")
    ap.add_argument("--json", dest="json_path", help="write the report here")
    args = ap.parse_args(argv)
    fwd = CR.variants()[case_variant("attention_fwd", 2)].constexprs
    if args.passes:
        passes = {"fixed_alpha": {"per_score": args.passes[0]}, "learned_alpha": {"per_score": args.passes[1]}}
    else:
        passes = newton_passes(args.passes_length, 1, fwd["BLOCK_M"], fwd["BLOCK_N"])
    import triton

    cache = tempfile.mkdtemp(prefix="softargmax-attention-proxies-")
    triton.knobs.cache.dir = cache
    try:
        rep = report(passes, args.length, args.passes_length, 1, args.adasplash or None)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(table(rep))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(rep, f, indent=1)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "0"  # before Triton is imported: compilable kernels
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
    sys.exit(main())
