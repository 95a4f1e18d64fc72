"""The compile report (benchmarks/compile_report.py): the Triton kernels built for an H100 (sm_90) on the CPU.

The slow test compiles the representative subset in a subprocess (``TRITON_INTERPRET=0``: the
interpreter's kernels cannot be compiled) and fails on a variant that no longer compiles, or on a
spill in a streaming kernel (long rows, α-ReLU, the loss epilogues).  The other tests check the
occupancy arithmetic by hand and that the report's table covers every kernel the launchers start
and every launch (constexprs, tile, warps, dtype) of the row and loss kernels.
"""

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import compile_report as CR  # noqa: E402  (benchmarks/ is not a package)

triton = pytest.importorskip("triton", reason="Triton is not installed")

#: streaming-kernel spills (spill stores + loads, bytes) allowed per ``(specialization, kernel, variant)``:
#: none.  (Triton 3.9.0's ptxas for sm_90a reported 16 to 28 bytes in the former long-row solver; the
#: rewritten row kernels, 2026-11-28, spill nowhere, aligned or not.)  Any streaming variant must not spill.
KNOWN_STREAMING_SPILLS: dict = {}

#: the streaming kernels compiled without the launch-time specialization: each kernel in every mode that changes
#: what it loads and stores (the sums, the gradient, a dense target, the tile flags), at one kind (the general power
#: kind: the kinds differ in arithmetic only, and one α per row where the kernel has it); the aligned report
#: compiles every kind
UNALIGNED = ["row_kernels.*long* *KIND=0 EXACT=0 *", "row_kernels.*split_* *PER_ROW=1*",
             "row_kernels.split_write *GRAD=1*", "row_kernels.split_scan*", "row_kernels.split_finish *KIND=0*",
             "row_kernels.alpha_relu* *EXACT=0*", "loss_kernels.gradient_rows*", "loss_kernels.softmax_gradient_rows*",
             "loss_kernels.scale_rows*", "loss_kernels.alpha_relu_gradient_rows *EXACT=0*"]


def test_ctas_per_sm_by_hand():
    """H100: 65,536 registers per SM in units of 256 per warp, 228 KiB shared memory (+1 KiB per CTA),
    2,048 threads, 32 CTAs."""
    # 64 registers x 32 lanes = 2048 per warp -> 32 warps per SM -> 2 CTAs of 16 warps
    assert CR.ctas_per_sm(64, 16, 512) == (2, "registers")
    # 62 registers round up to 64 per thread (1984 -> 2048 per warp): the same
    assert CR.ctas_per_sm(62, 16, 512) == (2, "registers")
    # 65 -> 2080 -> 2304 per warp -> 28 warps -> 1 CTA of 16 warps
    assert CR.ctas_per_sm(65, 16, 0) == (1, "registers")
    # 32 registers, 4 warps: registers allow 64 warps = 16 CTAs, threads 2048/128 = 16 CTAs; threads named first on a tie
    assert CR.ctas_per_sm(32, 4, 0)[0] == 16
    # 16 registers, 1 warp: 32 CTAs at most
    assert CR.ctas_per_sm(16, 1, 0) == (32, "ctas")
    # 100 KiB of shared memory: 228 KiB // 101 KiB = 2
    assert CR.ctas_per_sm(32, 4, 100 * 1024) == (2, "shared")
    # more than 227 KiB: does not launch
    assert CR.ctas_per_sm(32, 4, 228 * 1024) == (0, "shared")
    # 255 registers, 8 warps: 8160 -> 8192 per warp -> 8 warps -> 1 CTA
    assert CR.ctas_per_sm(255, 8, 12288) == (1, "registers")


def test_access_widths_read_ptx_instructions():
    ptx = "\n".join(["\tld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];", "\t@%p1 ld.global.b16 { %rs1 }, [ %rd2 ];",
                     "\tst.global.v2.b32 [ %rd3 + 0 ], { %r5, %r6 };", "\tst.global.b8 [ %rd4 ], %rs2;",
                     "\tld.global.nc.v4.b32 { %r7, %r8, %r9, %r10 }, [ %rd5 ];", "\tld.shared.b32 %r11, [%r12];"])
    assert CR.access_widths(ptx) == {"ld": {16: 2, 2: 1}, "st": {8: 1, 1: 1}}


def test_launch_specialization_marks_pointers_and_shape_integers():
    v = next(v for v in CR.variants() if v.kernel == "row_kernels.solve_long_rows")
    spec = CR._spec(v.kernel)
    fn = getattr(CR._mod(spec.module), spec.name)
    sig = CR._signature(fn, spec, v.dtype, v.constexprs)
    assert sig["BAD"] == "*u1" and sig["Z"] == "*" + v.dtype and sig["ALPHA"] == "*fp32"
    assert {sig[n] for n in ("a_value", "tau_c", "tol", "omega_c", "omega_scale")} == {"fp32"}
    assert sig["R"] == sig["k"] == sig["max_iter"] == "i32"
    marked = {fn.arg_names[i[0]] for i in CR._attrs(fn, sig, True)}
    assert {"Z", "P", "AUX", "BAD", "SUMS_OUT", "ALPHA", "R", "k"} <= marked
    assert not marked & {"tol", "max_iter", "omega_c", "a_value", "KIND", "BLOCK", "SLOTS"}
    assert CR._attrs(fn, sig, False) == {}


def test_barrier_count_reads_ptx_instructions():
    ptx = "\n".join(["\tbar.sync \t0;", "\t@%p1 bar.arrive 1, 64;", "\tbarrier.cta.sync.aligned 0;",
                     "\tbar.red.popc.u32 %r1, 0, %p2;", "\t// bar.sync in a comment", "\tmembar.gl;",
                     "\tst.shared.b32 [%r9], %r74;"])
    assert CR.count_barriers(ptx) == 4


class _Recorder:
    """Stands for a kernel module: ``rec.kernel[grid](*args, **kw)`` records the launch instead of running it."""

    def __init__(self):
        self.launches = []

    def __getattr__(self, name):
        log = self.launches

        class _Kernel:
            def __getitem__(self, grid):
                return lambda *args, **kw: log.append((name, args, kw))

        return _Kernel()


_CR_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _key(name, dtype, constexprs, warps):
    return name, dtype, tuple(sorted((k, int(v)) for k, v in constexprs.items())), warps


def _launched(rec):
    """The recorded launches as ``(kernel, dtype, constexprs, warps)`` (the first argument's dtype)."""
    out = set()
    for name, args, kw in rec.launches:
        kw = dict(kw)
        warps = kw.pop("num_warps", 4)  # Triton's default
        kw.pop("num_stages", None)
        out.add(_key(name, _CR_DTYPE[str(args[0].dtype).split(".")[1]], kw, warps))
    return out


def _drive_row_launchers(rows, modes, lengths):
    """``rows._run`` and its backward on 2 rows of every length in ``lengths``, every dtype and mode, and the
    losses' launch that writes ``G = p - y`` (with the sums, one α for all rows)."""
    import torch

    for dt in CR.DTYPES:
        for k in lengths:
            z = torch.zeros(2, k, dtype=getattr(torch, CR.TORCH_DTYPE[dt]))
            for kind, exact, per_row, sums in modes:
                alpha = torch.full((2,), 1.5) if per_row else None
                sol = rows._run(z, kind, exact, alpha, 0.5, 1.0, 0.0, 1.0, sums)
                sol.jvp_kernel(z, 1.0)
                if sums and not per_row:  # the losses with class indices: the solver writes G = p - y
                    target = (torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool))
                    rows._run(z, kind, exact, alpha, 0.5, 1.0, 0.0, 1.0, sums, target)


def test_the_table_covers_every_kernel_and_tile_the_launchers_choose(monkeypatch):
    """A kernel launched by ``rows.py`` / ``losses.py`` / ``flash_attention.py`` that the report does not list
    fails here (add one line to ``KERNELS``); so does a launch of the row or loss kernels (constexprs, tile,
    warps, dtype) that no variant compiles, or a variant no launch makes: the launchers run with their kernel
    module replaced by a recorder, over every row length class, dtype and mode the table lists."""
    import torch

    from softargmax.backends.tile_flags import TileFlags
    from softargmax.backends.triton import decoding, flash_attention, losses, rows, tile_gemms

    launched = set()
    for mod in (rows, losses, flash_attention, decoding, tile_gemms):
        launched |= set(re.findall(r"(?:K|_module\(\))\.(\w+)\[", Path(mod.__file__).read_text(encoding="utf-8")))
    listed = {v.kernel.split(".")[1] for v in CR.variants()}
    assert {"gradient_rows", "softmax_gradient_rows", "solve_block_rows", "jvp_long_rows"} <= launched
    assert launched <= listed, launched - listed
    # every variant names exactly its kernel's constexprs: all those without a default, and of those with one (a
    # diagnostics switch, the forward's second launch) the ones it sets
    for v in CR.variants():
        fn = getattr(CR._mod(CR._spec(v.kernel).module), v.kernel.split(".")[1])
        params = inspect.signature(getattr(fn, "fn", fn)).parameters.values()  # (the interpreter's kernels too)
        consts = [p for p in params if "constexpr" in str(p.annotation)]
        required = {p.name for p in consts if p.default is inspect.Parameter.empty}
        assert required <= set(v.constexprs) <= {p.name for p in consts}, v.kernel
    assert [v.constexprs["REPAIR"] for v in CR.variants() if "REPAIR" in v.constexprs]  # the second launch is listed
    # the modes: every kind with and without the loss row sums, and one α per row
    power = int(CR._mod("row_kernels").KIND_POWER.value)
    modes = CR._solve_modes()
    assert {(k, e) for k, e, _, _ in modes} == {(k, e) for k, e, _ in CR._row_kinds()}
    assert {(k, e, s) for k, e, pr, s in modes if not pr} == {(k, e, s) for k, e, _ in CR._row_kinds() for s in (0, 1)}
    assert [m for m in modes if m[2]] == [(power, 0, True, True)]
    # the row kernels: drive rows._run and the backward over the lengths where the tile changes
    rec = _Recorder()
    monkeypatch.setattr(rows, "_module", lambda: rec)
    lengths = sorted({1, 2, 3, rows.BLOCK_ROWS_MAX + 1, 3 * rows.BLOCK_ROWS_MAX}
                     | {n + d for i in range(1, rows.BLOCK_ROWS_MAX.bit_length()) for n in [1 << i] for d in (0, 1)})
    _drive_row_launchers(rows, modes, lengths)
    # long rows split over programs (forced: 3 slices, the compiled NSP of 4)
    monkeypatch.setattr(rows, "SPLIT_SLICES", 3)
    _drive_row_launchers(rows, modes, [3 * rows.BLOCK_ROWS_MAX])
    ns = rows._slices(2, 3 * rows.BLOCK_ROWS_MAX, torch.device("cpu"), rows.LONG_BLOCK)[0]
    assert ns == 3 and 1 << (ns - 1).bit_length() == CR.SPLIT_NSP
    monkeypatch.setattr(rows, "SPLIT_SLICES", None)
    split = ("split_scan", "split_solve", "split_write", "split_finish", "jvp_split_sums", "jvp_split_write")
    row_table = {_key(v.kernel.split(".")[1], v.dtype, v.constexprs, v.warps) for v in CR.variants()
                 if v.kernel.split(".")[1] in ("solve_block_rows", "jvp_block_rows", "solve_long_rows", "jvp_long_rows")
                 + split}
    assert _launched(rec) == row_table
    # rows._tile depends on the length's power of two only: the lengths above see every tile
    for eb in (2, 4):
        for heavy in (False, True):
            limit = rows.BLOCK_ROWS_MAX // 2 if heavy else rows.BLOCK_ROWS_MAX
            assert {rows._tile(k, eb, heavy) for k in range(1, limit + 1)} == set(CR._row_tiles(eb, heavy))
    # the loss kernels: class index or dense target, with or without a row scale
    rec = _Recorder()
    monkeypatch.setattr(losses, "_module", lambda: rec)
    monkeypatch.setattr(losses, "covers", lambda *a: True)
    monkeypatch.setattr(losses, "_rows_covered", lambda *a: True)
    for dt in CR.DTYPES:
        z = torch.zeros(2, 3000, dtype=getattr(torch, CR.TORCH_DTYPE[dt]))
        keep = torch.ones(2, dtype=torch.bool)
        for dense in (None, torch.zeros(2, 3000)):
            idx = None if dense is not None else torch.zeros(2, dtype=torch.long)
            for scale in (None, torch.ones(2)):
                # the fused loss marks G's tiles (always with a row scale)
                for tiles in (None,) + ((TileFlags(2, 3000, z.device),) if scale is not None else ()):
                    losses.gradient(z, idx, dense, keep, scale, tiles=tiles)
                    for alpha in (1.25, 2.0, 1.5):  # the general power, α = 2 and α = 1.5
                        losses.alpha_relu_gradient(z, idx, dense, keep, alpha, 0.0, scale, tiles=tiles)
                losses.softmax_gradient(z, idx, dense, keep, scale)
        losses.scale_rows(z, torch.ones(2))
    loss_table = {_key(v.kernel.split(".")[1], v.dtype, v.constexprs, v.warps) for v in CR.variants()
                  if v.kernel.startswith("loss_kernels.")}
    assert _launched(rec) == loss_table
    # the tile products of the fused layer's backward
    rec = _Recorder()
    monkeypatch.setattr(tile_gemms, "_module", lambda: rec)
    monkeypatch.setattr(tile_gemms, "covers", lambda *a: True)
    for dt in CR.DTYPES:
        G = torch.zeros(100, 3000, dtype=getattr(torch, CR.TORCH_DTYPE[dt]))
        W, h = G.new_zeros(3000, 16), G.new_zeros(100, 16)
        marks = TileFlags(100, 3000, G.device)
        marks.written = True
        assert tile_gemms.backprop(G, W, h, h.clone(), W.clone(), marks)
    tile_table = {_key(v.kernel.split(".")[1], v.dtype, v.constexprs, v.warps) for v in CR.variants()
                  if v.kernel.startswith("tile_gemm_kernels.")}
    # (the launcher's dot mode 2, the interpreter's widened bfloat16, is for CPU tensors only: not compiled)
    assert _launched(rec) == {k for k in tile_table if k[1] != "bf16"} | {
        (name, "bf16", tuple((c, 2 if c == "DOT" else v) for c, v in consts), warps)
        for name, dt, consts, warps in tile_table if dt == "bf16"}
    # the attention tiles
    fwd = {(v.dtype, v.constexprs["HEAD_DIM"], v.constexprs["BLOCK_M"], v.constexprs["BLOCK_N"], v.warps)
           for v in CR.variants() if v.kernel == "attention_kernels.attention_fwd" and not v.constexprs["HAS_MASK"]}
    want = {(dt, D, *flash_attention.blocks(D, torch.device("cuda"), getattr(torch, CR.TORCH_DTYPE[dt]), software_log=sl))
            for dt in CR.DTYPES for D in (64, 128) for sl in (False, True)}  # (below ALPHA_FAST_LOG: 64 x 32)
    assert fwd == want
    # the quick subset keeps every kernel
    assert {v.kernel for v in CR.variants() if v.quick} == {v.kernel for v in CR.variants()}
    assert CR.select(["row_kernels.*long*"], quick=True) and not CR.select(["no.such"])


def _report(tmp_path, *args, quick=True):
    out = tmp_path / "report.json"
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_report.py")] + ["--quick"] * quick
                          + ["--jobs", "2", "--json", str(out), *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failures"] == [] and report["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert report["triton"] == triton.__version__
    print("\n" + CR.table(report))
    return report, {(r["kernel"], r["variant"]): r for r in report["variants"]}


@pytest.mark.slow
def test_quick_report_compiles_for_sm90_without_streaming_spills(tmp_path):
    """The representative subset (every kernel in bfloat16: the register kernels' shortest and longest tile,
    every mode of the long-row kernels, the α-ReLU and loss kernels, the attention kernels at D = 64) compiles
    for sm_90 with the launch-time specialization of the usual shapes, and the streaming kernels also without
    it; no streaming kernel spills beyond :data:`KNOWN_STREAMING_SPILLS`; every variant fits at least one CTA
    per SM; aligned, the streaming kernels store as wide as a thread's share of a chunk allows (16 bytes: 8 scores
    per thread on the 4 warps of the half-precision passes; 8 bytes in the bfloat16 solves that keep 8 warps,
    ``rows._long_launch(..., solver=True)``, 4 scores per thread).  Without the specialization, the variants of
    :data:`UNALIGNED`.  About 35 s on the 2-core CPU machine."""
    report, rows = _report(tmp_path)
    assert report["specialization"] == "aligned" and len(rows) == len(CR.select(quick=True))
    odd, odd_rows = _report(tmp_path, "--unaligned", "--kernels", *UNALIGNED)
    assert odd["specialization"] == "none" and len(odd_rows) == len(CR.select(UNALIGNED, quick=True))
    assert {r["kernel"] for r in rows.values() if r["streaming"]} <= {r["kernel"] for r in odd_rows.values()}
    for key, r in rows.items():
        assert 1 <= r["regs"] <= 255 and r["ctas_per_sm"] >= 1 and 0 < r["occupancy"] <= 1, key
        if r["streaming"]:  # as wide as a thread's share of a BLOCK allows (bfloat16 solves on 8 warps: 4 x 2 bytes)
            share = r["constexprs"]["BLOCK"] // (32 * r["warps"])
            width = min(16, share * CR.ELEM_BYTES[r["dtype"]])
            assert r["widest_ld"] >= width, key
            if r["kernel"] == "row_kernels.split_scan":  # it stores float32 candidates, no row
                assert r["widest_st"] == min(16, share * 4), key
            elif r["kernel"] not in ("row_kernels.split_solve", "row_kernels.jvp_split_sums"):  # (per-row scalars only)
                assert r["widest_st"] == width, key
    over = {(spec, *key): r["spill_bytes"] for spec, table in (("aligned", rows), ("none", odd_rows))
            for key, r in table.items() if r["streaming"] and r["spill_bytes"] > KNOWN_STREAMING_SPILLS.get((spec, *key), 0)}
    assert not over, f"streaming kernels that spill (bytes): {over}"
    assert any(r["barriers"] > 0 for r in rows.values())  # the reductions' barriers are counted
    # no vector access without the alignment (but from the buffers a launcher allocates itself: split_solve's candidates)
    assert max(r["widest_ld"] for key, r in odd_rows.items() if not CR._spec(key[0]).scratch) < 16
    assert all(r["widest_ld"] == 16 for key, r in odd_rows.items() if key[0] == "row_kernels.split_solve")


@pytest.mark.slow
def test_rows_of_several_lines_stay_inside_one_warp(tmp_path):
    """Rows of 129 to 512 float32 scores (257 to 512 half): sparsemax's and 1.5-entmax's register kernels,
    forward (with and without the loss row sums) and backward, compile to programs with no shared memory and
    no barrier: one warp per program, so every row sum is a warp shuffle whatever Triton's layout passes do
    with several warps (Triton 3.6 laid a 4-row program's warps along each row's lines, and every Newton step's
    sums went through 16 to 32 KiB of shared memory).  About 10 s on the 2-core CPU machine."""
    from softargmax.backends.triton import rows

    globs = []
    for elem_bytes, dt in ((4, "fp32"), (2, "bf16")):
        n, ch, line, warps, split = rows._tile(512, elem_bytes)
        assert ch > 1 and not split
        globs.append(f"row_kernels.*_block_rows {dt} KIND=0 EXACT=[12] *ROWS={n} CH={ch} LINE={line} SPLIT=0 "
                     f"warps={warps}")
    _, table = _report(tmp_path, "--kernels", *globs, quick=False)
    # dtypes x (sparsemax, 1.5-entmax) x (solve, solve with sums, solve with sums writing G = p - y, jvp)
    assert len(table) == 2 * 2 * 4
    for key, r in table.items():
        assert r["smem"] == 0 and r["barriers"] == 0 and r["spill_bytes"] == 0, (key, r)
