"""The attention section of ``run_gpu.py``: fused α-entmax attention against SDPA, the
materialized path and AdaSplash (when installed), forward+backward.

Per case (``B × H`` heads, ``L`` queries = keys, head dim ``D``, bfloat16) and implementation:

* ``first_call_s``: the first forward+backward, compilation and autotuning included (Triton's
  on-disk cache can make it short on a machine that compiled before);
* ``ms``: median forward+backward time in the steady state (``repeats`` calls after a warm-up);
  ``ms_calls`` says how many were timed (fewer when the time limit came first);
* ``peak_mib``: peak CUDA memory of one steady-state forward+backward above the inputs;
* ``max_abs_psum_minus_1``: the largest ``|Σ_j p_ij - 1|`` over the rows, measured the same
  way for every implementation, in the case's dtype (``psum_dtype``): its output with ``v = 1``
  (every output entry is then ``Σ_j p_ij``).  The weights entering the tensor-core product
  and the output are rounded to that dtype, so this resolves ``|Σp - 1|`` only to a few of its
  ``ε`` (``psum_resolution``: the spacing of the dtype at 1, 2⁻⁷ for bfloat16); for the fused
  kernels ``psum_solver`` is the threshold solver's own float32 row sum;
* ``block_sparsity``: for the fused kernels, the fraction of score tiles inside the causal
  band skipped by the output pass; ``newton_passes_mean``/``_max``: the Newton passes over
  the key tiles that the blocks of query rows took;
* ``timed_out`` / ``error`` / ``skipped``: what stopped an implementation.

**Shapes**: ``SHAPES`` (causal D = 64 up to L = 32768, causal D = 128 up to 16384, non-causal
D = 64), or ``QUICK_SHAPES`` with ``SOFTARGMAX_BENCH_ATTENTION_SHAPES=quick``; then the ``VARIANTS``
(``QUICK_VARIANTS``): grouped-query attention, 32 query heads over 8 key/value heads (the fused kernels
read the grouped heads in place; SDPA with ``enable_gqa=True``; AdaSplash, which takes one key/value head
per query head in AdaSplash-1, on repeated copies made before the timing; AdaSplash-2 reads the grouped
heads in place where the installed package does, as 0.2.2 does, else repeated copies too; ``kv_input`` says
which), and a causal sliding window (the fused
kernels and the materialized path with ``window=``; ``sdpa`` there is plain causal SDPA, which has no
window: its ratio is against attention over the whole causal triangle; AdaSplash is skipped).  A
variant's case records ``variant``, ``kv_heads`` and ``window``.

**Inputs**: every case records ``inputs``.  ``"random"`` (the shapes and the variants): independent standard
normal ``q, k, v, dO`` (seed 0), on which 1.5-entmax keeps scattered keys and the fused kernels skip almost no
tile (block sparsity 0.02 % at L = 4096, 1.3 % at 16384).  ``"structured"`` (``STRUCTURED``, ``QUICK_STRUCTURED``):
the same draw with a recency bias and four attention sinks written into four dimensions of ``q`` and ``k``
(``attention_inputs.py`` says how and why they resemble trained attention), its knob, the ``locality`` λ,
set for a target block sparsity (``target_block_sparsity``: about 0.5, 0.7 and 0.85 for causal D = 64 at
L = 4096 and 16384, 0.7 for D = 128 and for 32 query heads over 8 at L = 8192), from the CPU calibration
``benchmarks/calibrate_attention_inputs.py`` (``benchmarks/results/attention-structured-inputs.json``), whose
prediction is recorded as ``cpu_block_sparsity``; the case also records ``kv_heads``, ``sinks`` and
``sink_level``.  The block sparsity reached is measured by the run itself (``block_sparsity`` of the fused
kernels, as everywhere).  The structured cases run after the shapes and before the variants.

**Order and time limits.**  Every case runs SDPA, our kernels and the materialized path
first; the peers (AdaSplash) run afterwards, over every case again, so a slow peer never costs
our numbers (grouped by head dim and masking, in the order the groups first appear, so that each
group's autotuning happens once).  Each implementation of each case has a time limit (``IMPL_LIMIT_S``, for the
peers ``PEER_LIMIT_S``; environment ``SOFTARGMAX_BENCH_IMPL_LIMIT_S`` and
``SOFTARGMAX_BENCH_PEER_LIMIT_S``): no timed call starts once it has passed since the first
call (compilation, autotuning) ended, and a watchdog (``SIGALRM``) interrupts whatever still
runs at twice the limit from the start (a first call, compilation or autotuning:
recorded as ``timed_out``).  An implementation that timed out or ran out of memory is skipped for the longer
lengths of the same head dim and masking.  The JSON is rewritten (atomically) after every
implementation of every case, so a run that is killed keeps everything it measured.

**AdaSplash's autotuning** (``triton.autotune`` over 30 tile configurations for its threshold
kernel and 6 for each of five others, keyed on the sequence length: by default it retunes, and
recompiles, at every new length) is pinned by ``SOFTARGMAX_BENCH_ADASPLASH_TUNING``:

* ``once`` (default): it tunes at the first (shortest) length of each head dim and masking, as it would;
  then each of its autotuners is restricted to the configuration it chose
  (``Autotuner.configs = [winner]``), so the longer lengths reuse it without tuning (they
  still compile, since AdaSplash specializes on the length); the tuning time is its
  ``first_call_s`` at that length;
* ``full``: its own autotuning at every length (the package's default behaviour);
* ``single``: the first configuration of each list, never tuned (quick, possibly slow kernels).

The pinned configurations are recorded in ``"adasplash_tuning"``.

AdaSplash (Gonçalves, Treviso & Martins, *AdaSplash: Adaptive Sparse Flash Attention*,
ICML 2025, https://arxiv.org/abs/2502.12082) is an optional comparison: imported when
present, never a dependency.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import NamedTuple, Optional

import attention_inputs as AI  # next to this file (as run_gpu.py imports this one)
import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax.backends.triton import flash_attention as FA

B, H = 2, 16
#: (is_causal, head dim, length)
SHAPES = ([(True, 64, n) for n in (1024, 4096, 8192, 16384, 32768)]
          + [(True, 128, n) for n in (1024, 4096, 8192, 16384)]
          + [(False, 64, n) for n in (1024, 4096, 8192, 16384, 32768)])
#: a shorter list for a GPU call with a few minutes (``SOFTARGMAX_BENCH_ATTENTION_SHAPES=quick``;
#: benchmarks/gpu_all.sh sets it unless told otherwise)
QUICK_SHAPES = [(True, 64, 1024), (True, 64, 4096), (True, 64, 16384), (True, 128, 1024), (True, 128, 8192),
                (False, 64, 4096)]
#: grouped heads and sliding windows: ``(name, is_causal, head dim, length, query heads, key/value heads, window)``
VARIANTS = [("gqa_32_over_8", True, 128, 8192, 32, 8, None), ("gqa_32_over_8", True, 64, 16384, 32, 8, None),
            ("window_4096", True, 64, 16384, 16, 16, 4096), ("window_4096", True, 64, 32768, 16, 16, 4096)]
QUICK_VARIANTS = [("gqa_32_over_8", True, 128, 4096, 32, 8, None), ("window_1024", True, 64, 16384, 16, 16, 1024)]


class Structured(NamedTuple):
    """A causal case on structured inputs (``attention_inputs.structured_inputs``): the locality λ gives about
    ``target`` block sparsity (``cpu_block_sparsity``: the CPU calibration's prediction, measured again by the run)."""

    head_dim: int
    length: int
    heads: int
    kv_heads: int
    target: Optional[float]
    locality: float
    cpu_block_sparsity: Optional[float]


#: the CPU calibration of the structured inputs' knob (benchmarks/calibrate_attention_inputs.py)
CALIBRATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "attention-structured-inputs.json")


def structured_cases(path=CALIBRATION):
    """The structured cases of the full list, from the calibration's chosen λ (``path``): each ``(D, L, target)``
    at ``H`` heads, and at D = 128 also 32 query heads over 8 (the same λ: grouping leaves each head's scores as
    they are); none, with a line on stderr, where the calibration is missing."""
    import json
    import sys

    try:
        with open(path, encoding="utf-8") as f:
            chosen = json.load(f)["chosen"]
    except (OSError, ValueError, KeyError) as err:
        print(f"attention_gpu: no structured cases ({path}: {err})", file=sys.stderr)
        return []
    out = []
    for c in chosen:
        for heads, kv_heads in ((H, H), (32, 8)) if c["head_dim"] == 128 else ((H, H),):
            out.append(Structured(c["head_dim"], c["length"], heads, kv_heads, c["target"], c["locality"],
                                  c["cpu_block_sparsity"]))
    return out


#: structured inputs (batch ``B``): about 0.5, 0.7 and 0.85 block sparsity at L = 4096 and 16384 (D = 64), 0.7
#: at D = 128, L = 8192 (16 heads, and 32 query heads over 8)
STRUCTURED = structured_cases()
#: the three targets at L = 4096 (a few seconds of device time)
QUICK_STRUCTURED = [st for st in STRUCTURED if st.length == 4096]
SMOKE_STRUCTURED = [Structured(16, 64, 1, 1, None, 20.0, None)]
SMOKE_SHAPES = [(True, 16, 32)]
SMOKE_BH = (1, 1)
ALPHA = 1.5
#: seconds per implementation and case (first call, compilation, steady state) and for the peers
IMPL_LIMIT_S = float(os.environ.get("SOFTARGMAX_BENCH_IMPL_LIMIT_S", "30"))
PEER_LIMIT_S = float(os.environ.get("SOFTARGMAX_BENCH_PEER_LIMIT_S", "120"))
#: the peers: run after every other implementation of every case
PEERS = ("adasplash2_a1.5", "adasplash1_a1.5")
_RESOLUTION = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}


def chosen_shapes(smoke=False):
    """The cases of this run: the smoke, quick (``SOFTARGMAX_BENCH_ATTENTION_SHAPES=quick``) or full list."""
    if smoke:
        return SMOKE_SHAPES
    return QUICK_SHAPES if os.environ.get("SOFTARGMAX_BENCH_ATTENTION_SHAPES", "full") == "quick" else SHAPES


def chosen_variants(smoke=False):
    """The grouped-head and sliding-window cases of this run (none in a smoke run)."""
    if smoke:
        return []
    return QUICK_VARIANTS if os.environ.get("SOFTARGMAX_BENCH_ATTENTION_SHAPES", "full") == "quick" else VARIANTS


def chosen_structured(smoke=False):
    """The structured-input cases of this run: the smoke, quick or full list (as :func:`chosen_shapes`)."""
    if smoke:
        return SMOKE_STRUCTURED
    quick = os.environ.get("SOFTARGMAX_BENCH_ATTENTION_SHAPES", "full") == "quick"
    return QUICK_STRUCTURED if quick else STRUCTURED


class Unsupported(Exception):
    """An implementation does not cover a case (recorded as ``"skipped"``, not as an error)."""


class TimedOut(Exception):
    """Raised by the watchdog when an implementation runs past its time limit."""


@contextlib.contextmanager
def watchdog(seconds: float):
    """Raise :class:`TimedOut` in the main thread after ``seconds`` (``SIGALRM``: it interrupts
    Python code, such as compilation or autotuning loops, not a single CUDA call; elsewhere
    than in the main thread of a POSIX process the deadline is only checked between calls)."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or seconds <= 0:
        yield
        return

    def fire(signum, frame):
        raise TimedOut(f"over the {seconds:g} s limit")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- AdaSplash --------------------------------------------------------------------------------

def _adasplash_autotuners():
    """``{name: Autotuner}`` of the installed AdaSplash's kernels (empty without the package)."""
    import importlib

    try:
        from triton.runtime.autotuner import Autotuner
    except Exception:
        return {}
    found = {}
    for mod_name in ("adasplash.adasplash_v2", "adasplash.adasplash_block_mask", "adasplash.adasplash_no_block_mask"):
        try:
            mod = importlib.import_module(mod_name)
        except Exception:
            continue
        for name, obj in vars(mod).items():
            if isinstance(obj, Autotuner):
                found[f"{mod_name}.{name}"] = obj
    return found


class AdaSplashTuning:
    """Pins AdaSplash's autotuning (module docstring): ``policy`` ``once``, ``full`` or ``single``."""

    def __init__(self, policy: str, tuners=None):
        if policy not in ("once", "full", "single"):
            raise ValueError(f"SOFTARGMAX_BENCH_ADASPLASH_TUNING must be once, full or single, got {policy!r}")
        self.policy = policy
        self.tuners = _adasplash_autotuners() if tuners is None else tuners
        self.original = {name: list(t.configs) for name, t in self.tuners.items()}
        self.pinned: dict[str, list[str]] = {}
        if policy == "single":
            for name, t in self.tuners.items():
                t.configs = self.original[name][:1]
                self.pinned[name] = [str(c) for c in t.configs]

    def new_group(self):
        """A new head dim or masking: ``once`` tunes again (the original lists are restored)."""
        if self.policy == "once":
            for name, t in self.tuners.items():
                t.configs = list(self.original[name])
                t.cache.clear()

    def tuned(self):
        """After a call that tuned: ``once`` restricts each autotuner to the configuration it chose."""
        if self.policy != "once":
            return
        for name, t in self.tuners.items():
            winners = list(dict.fromkeys(t.cache.values()))
            if winners and len(t.configs) > 1:
                t.configs = winners[:1]
                self.pinned[name] = [str(c) for c in t.configs]

    def record(self):
        return {"policy": self.policy, "autotuners": len(self.tuners),
                "configurations": {n: len(c) for n, c in self.original.items()}, "pinned": dict(self.pinned)}


def _reads_grouped_heads(module_name):
    """Whether the installed AdaSplash module takes fewer key/value heads than query heads (grouped-query
    attention): AdaSplash 0.2.2's ``adasplash_v2`` does (its kernels index the key/value head ``h // GROUP_SIZE``
    of ``N_KV_H``); ``adasplash_block_mask`` (AdaSplash-1) does not."""
    import importlib
    import inspect

    try:
        source = inspect.getsource(importlib.import_module(module_name))
    except Exception:
        return False
    return "N_KV_H" in source and "GROUP_SIZE" in source


def _adasplash():
    """AdaSplash's entry points, when the package is installed: ``{name: fn(q, k, v, causal)}``.

    ``adasplash_v2`` took ``alpha`` and ``is_causal`` in early releases; from 0.2 it is
    ``adasplash_v2(q, k, v, niter=1, varlen=None)``, causal 1.5-entmax only (AdaSplash-2): a
    non-causal case is then skipped.  Both run with the package's default iteration counts
    except ``adasplash_v1`` (``niter=10``).  An entry point that reads grouped key/value heads
    in place (:func:`_reads_grouped_heads`) has ``grouped_kv = True``; the others get one key/value head
    per query head."""
    import inspect

    try:
        import adasplash as A
    except Exception:
        return {}
    impls = {}
    v2 = getattr(A, "adasplash_v2", None)
    if v2 is not None:
        try:
            params = set(inspect.signature(v2).parameters)
        except (TypeError, ValueError):
            params = set()
        if {"alpha", "is_causal"} <= params:
            impls["adasplash2_a1.5"] = lambda q, k, v, causal: v2(q, k, v, alpha=ALPHA, is_causal=causal)
        else:
            def v2_causal(q, k, v, causal):
                if not causal:
                    raise Unsupported("AdaSplash-2 (adasplash_v2) is causal 1.5-entmax only")
                return v2(q, k, v)

            impls["adasplash2_a1.5"] = v2_causal
        impls["adasplash2_a1.5"].grouped_kv = _reads_grouped_heads("adasplash.adasplash_v2")
    v1 = getattr(A, "adasplash_v1", None) or getattr(A, "adasplash", None)
    if v1 is not None:
        impls["adasplash1_a1.5"] = lambda q, k, v, causal: v1(q, k, v, alpha=ALPHA, niter=10, is_causal=causal)
    return impls


# -- implementations ----------------------------------------------------------------------------

def _alpha(device, heads):
    """The learned-α implementation's α per head."""
    return torch.linspace(1.2, 1.8, heads, device=device)


def _implementations(device, heads, fused_ok, window=None):
    """``(ours, peers, alpha_h)``: ``{name: fn(q, k, v, causal)}`` run first, then the peers; ``k``, ``v`` may
    have fewer heads than ``q`` (grouped: ``enable_gqa``), and ``window`` is a sliding window (a variant)."""
    alpha_h = _alpha(device, heads)

    def materialized(q, k, v, causal):
        old = FA.set_enabled(False)
        try:
            return sa.attention(q, k, v, is_causal=causal, mapping="entmax15", enable_gqa=k.shape[1] != q.shape[1],
                                window=window)
        finally:
            FA.set_enabled(old)

    impls = {"sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                            enable_gqa=k.shape[1] != q.shape[1])}
    if fused_ok:
        impls["fused_entmax15"] = lambda q, k, v, causal: FA.flash_attention(q, k, v, is_causal=causal,
                                                                             mapping="entmax15", window=window)
        impls["fused_learned_alpha"] = lambda q, k, v, causal: FA.flash_attention(
            q, k, v, is_causal=causal, mapping="entmax", alpha=alpha_h.detach().requires_grad_(), window=window)
    impls["materialized_entmax15"] = materialized
    peers = _adasplash() if device.type == "cuda" else {}
    if window is not None:  # AdaSplash has no sliding window
        peers = {name: _unsupported("no sliding window") for name in peers}
    return impls, peers, alpha_h


def _unsupported(why):
    def fn(q, k, v, causal):
        raise Unsupported(why)

    return fn


def _fwd_bwd(fn, q, k, v, do, causal):
    def run():
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        fn(qq, kk, vv, causal).backward(do)

    return run


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _psum_error(fn, q, k, causal):
    """``max |Σp - 1|`` over the rows from the output with ``v = 1``, in the inputs' dtype."""
    with torch.no_grad():
        out = fn(q, k, torch.ones_like(k), causal)
    return float((out.float() - 1).abs().max())


def _peak(run, device):
    if device.type != "cuda":
        run()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def measure(name, fn, q, k, v, do, causal, device, repeats, warmup, limit, clock=time.perf_counter):
    """One implementation on one case: the record described in the module docstring (raises
    :class:`Unsupported` for a case the implementation does not cover).  No timed call starts
    ``limit`` seconds after the first call ended; the watchdog stops whatever still runs at
    ``2 · limit`` from the start (a first call that compiles or autotunes for that long is
    recorded as ``timed_out``; timed calls already made are kept)."""
    res = {}
    run = _fwd_bwd(fn, q, k, v, do, causal)
    start = clock()
    times = []
    try:
        with watchdog(2 * limit):
            _sync(device)
            t0 = clock()
            run()
            _sync(device)
            first_end = clock()
            res["first_call_s"] = round(first_end - t0, 3)
            res["peak_mib"] = _peak(run, device)
            res["max_abs_psum_minus_1"] = _psum_error(fn, q, k, causal)
            res["psum_dtype"] = str(q.dtype).replace("torch.", "")
            res["psum_resolution"] = _RESOLUTION.get(q.dtype)
            for i in range(warmup + repeats):
                if clock() - first_end > limit:  # the compilation is not charged to the steady state
                    res["stopped"] = f"time limit ({limit:g} s) after {len(times)} timed calls"
                    break
                _sync(device)
                t0 = clock()
                run()
                _sync(device)
                if i >= warmup:
                    times.append(clock() - t0)
    except Unsupported:
        raise
    except TimedOut as e:
        if times:
            res["stopped"] = f"watchdog ({2 * limit:g} s) after {len(times)} timed calls"
        else:
            res["timed_out"] = f"{e} ({round(clock() - start, 1)} s)"
    except Exception as e:  # out of memory, an unsupported case: recorded, not timed
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if times:
        res["ms"] = round(sorted(times)[len(times) // 2] * 1e3, 4)
        res["ms_calls"] = len(times)
    if device.type == "cuda" and ("error" in res or "timed_out" in res):
        torch.cuda.empty_cache()
    return res


def _fused_stats(name, q, k, v, causal, alpha_h, window=None):
    kw = dict(mapping="entmax15") if name == "fused_entmax15" else dict(mapping="entmax", alpha=alpha_h)
    st = FA.forward_stats(q, k, v, is_causal=causal, window=window, **kw)
    nonempty = st["psum"] > 0
    passes = st["newton_passes"].float()
    return {"psum_solver": float((st["psum"][nonempty] - 1).abs().max()),
            "block_sparsity": round(st["block_sparsity"], 4),
            "newton_passes_mean": round(float(passes.mean()), 2), "newton_passes_max": int(passes.max())}


def _log_line(case, name, r, log):
    causal, (_, _, L, D) = case["causal"], case["shape"]
    label = case.get("variant") or ("struct" if case.get("inputs") == "structured" else "causal" if causal else "full")
    head = f"attention {label:>6} D={D:<3} L={L:<6} {name:>22}"
    if "ms" not in r:
        why = r.get("error") or r.get("timed_out") or r.get("skipped") or r.get("stopped")
        log(f"{head}  {why}")
        return
    peak = "-" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f} MiB"
    err = r.get("max_abs_psum_minus_1")
    log(f"{head} {r['ms']:9.3f} ms ({r.get('ratio_sdpa')}x sdpa) first {r['first_call_s']:.1f} s  {peak:>9}  "
        f"|Σp-1| {'-' if err is None else f'{err:.1e}'} ({r.get('psum_dtype')})  sparsity {r.get('block_sparsity', '-')}")


class _Runner:
    """Runs one implementation on one case and records it (the state shared across cases)."""

    def __init__(self, device, repeats, warmup, save, log, tuning, clock):
        self.device, self.repeats, self.warmup, self.clock = device, repeats, warmup, clock
        self.save, self.log, self.tuning = save, log, tuning
        self.given_up = {}  # (name, causal, D, variant) -> why (a timeout or out of memory)

    def run(self, case, name, fn, tensors, limit, peer=False, note=None):
        """``note``: entries added to the implementation's record (how the peer was given the key/value heads)."""
        causal, D = case["causal"], case["shape"][3]
        q, k, v, do = tensors
        group = (name, causal, D, case.get("variant"), case.get("inputs"))
        if group in self.given_up:
            res = {"skipped": f"{self.given_up[group]} at a shorter length"}
        else:
            try:
                res = measure(name, fn, q, k, v, do, causal, self.device, self.repeats, self.warmup, limit, self.clock)
            except Unsupported as e:
                res = {"skipped": str(e)}
            if "timed_out" in res or "OutOfMemory" in res.get("error", ""):
                self.given_up[group] = "timed out" if "timed_out" in res else "out of memory"
            if name.startswith("fused") and "ms" in res:
                res.update(_fused_stats(name, q, k, v, causal, _alpha(self.device, q.shape[1]), case.get("window")))
            base = case["impls"].get("sdpa", {}).get("ms")
            if "ms" in res and base:
                res["ratio_sdpa"] = round(res["ms"] / base, 3)
        res.update(note or {})
        case["impls"][name] = res
        ours = case["impls"].get("fused_entmax15", {}).get("ms")
        for other in PEERS:
            if ours and case["impls"].get(other, {}).get("ms"):
                case["fused_vs_" + other.split("_")[0]] = round(ours / case["impls"][other]["ms"], 3)
        if peer and self.tuning is not None:  # AdaSplash's autotuning pinned after its call, and recorded
            if "first_call_s" in res:
                self.tuning.tuned()
            case["adasplash_tuning"] = self.tuning.record()
        self.save()
        _log_line(case, name, res, self.log)


def _run_peers(cases, case_peers, inputs, runner, tuning, limit, device):
    """The peers over every case again, grouped by head dim and masking (in the order the groups first appear:
    one autotuning per group), each given the grouped key/value heads if it reads them, else repeated copies."""
    groups = {}
    for case in cases:
        groups.setdefault((case["causal"], case["shape"][3]), len(groups))
    group = None
    for case in sorted(cases, key=lambda c: groups[(c["causal"], c["shape"][3])]):
        causal, (_, h, _, D) = case["causal"], case["shape"]
        its_peers = case_peers[id(case)]
        if not its_peers:
            continue
        if tuning is not None and (causal, D) != group:
            tuning.new_group()
            group = (causal, D)
        hkv = case.get("kv_heads") or h
        grouped = inputs(case)
        expanded = inputs(case, expanded=True) if hkv != h else grouped
        for name, fn in its_peers.items():
            reads_groups = getattr(fn, "grouped_kv", False)
            note = None if hkv == h else {"kv_input": "grouped" if reads_groups else "repeated"}
            runner.run(case, name, fn, grouped if reads_groups else expanded, limit, peer=True, note=note)
        del grouped, expanded
        _free(device)


def attention_cases(device, repeats, smoke=False, log=print, emit=None, save=None, impls=None, peers=None,
                    shapes=None, batch_heads=None, limits=(None, None), tuning=None, clock=time.perf_counter,
                    variants=None, structured=None):
    """Run every case (module docstring); ``emit(case)`` is called once per case when it starts
    (the case dict is then filled in place) and ``save()`` after every implementation.
    ``impls``/``peers``/``shapes``/``batch_heads``/``limits``/``tuning``/``variants``/``structured`` replace the
    defaults (tests; given ``shapes``, no variant or structured case runs unless ``variants`` or ``structured``
    are given too, with the default implementations)."""
    b, heads = batch_heads or (SMOKE_BH if smoke else (B, H))
    fused_ok = FA.available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
    default_impls, default_peers, _ = _implementations(device, heads, fused_ok)
    impls = default_impls if impls is None else impls
    peers = default_peers if peers is None else peers
    if variants is None:
        variants = chosen_variants(smoke) if shapes is None else []
    if structured is None:
        structured = chosen_structured(smoke) if shapes is None else []
    if tuning is None and (peers or ((variants or structured) and default_peers)):
        tuning = AdaSplashTuning(os.environ.get("SOFTARGMAX_BENCH_ADASPLASH_TUNING", "once"))
    runner = _Runner(device, repeats, 0 if smoke else max(2, repeats // 5), save or (lambda: None), log, tuning, clock)

    def inputs(case, expanded=False):
        """``q, k, v, dO`` of a case, bfloat16 on the device: ``k`` and ``v`` with the case's key/value heads
        (repeated to the query heads when ``expanded``)."""
        (_, h, L, D), hkv = case["shape"], case.get("kv_heads") or case["shape"][1]
        if case["inputs"] == "structured":
            made = AI.structured_inputs(b, h, hkv, L, D, case["locality"], sinks=case["sinks"],
                                        sink_level=case["sink_level"])
        else:
            made = AI.random_inputs(b, h, hkv, L, D)
        q, k, v, do = (t.to(device, torch.bfloat16) for t in made)
        if expanded and hkv != h:
            k, v = (t.repeat_interleave(h // hkv, 1) for t in (k, v))
        return [q, k, v, do]

    cases, case_peers = [], {}

    def start(case, case_impls, its_peers):
        cases.append(case)
        case_peers[id(case)] = its_peers
        if emit is not None:
            emit(case)
        tensors = inputs(case)
        for name, fn in case_impls.items():
            runner.run(case, name, fn, tensors, limits[0] or IMPL_LIMIT_S)
        del tensors
        _free(device)

    for causal, D, L in shapes if shapes is not None else chosen_shapes(smoke):
        start({"op": "attention", "inputs": "random", "causal": causal, "shape": [b, heads, L, D],
               "dtype": "bfloat16", "pass": "fwd+bwd", "impls": {}}, impls, peers)
    for st in structured:
        h, hkv = (heads, heads) if smoke else (st.heads, st.kv_heads)
        ours, its_peers, _ = _implementations(device, h, fused_ok)
        start({"op": "attention", "inputs": "structured", "causal": True, "shape": [b, h, st.length, st.head_dim],
               "kv_heads": hkv, "locality": st.locality, "sinks": AI.SINKS, "sink_level": AI.SINK_LEVEL,
               "target_block_sparsity": st.target, "cpu_block_sparsity": st.cpu_block_sparsity,
               "dtype": "bfloat16", "pass": "fwd+bwd", "impls": {}}, ours, its_peers)
    for variant, causal, D, L, h, hkv, window in variants:
        ours, its_peers, _ = _implementations(device, h, fused_ok, window)
        start({"op": "attention", "inputs": "random", "variant": variant, "causal": causal, "shape": [b, h, L, D],
               "kv_heads": hkv, "window": window, "dtype": "bfloat16", "pass": "fwd+bwd", "impls": {}},
              ours, its_peers)
    _run_peers(cases, case_peers, inputs, runner, tuning, limits[1] or PEER_LIMIT_S, device)
    return cases


def _free(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
