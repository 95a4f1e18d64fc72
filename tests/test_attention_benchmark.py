"""The attention benchmark's control flow on the CPU, with fake implementations: the order
(our kernels before the peers, over every case), the JSON rewritten after every
implementation, the time limits (a watchdog that interrupts a first call, a deadline between
timed calls), the compilation time recorded apart from the steady state, and the pinning of
AdaSplash's autotuning (fake autotuners)."""

import json
import os
import sys
import time

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import attention_gpu as AG  # noqa: E402

CPU = torch.device("cpu")


def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal).to(q.dtype)


class _Calls:
    def __init__(self):
        self.order = []

    def impl(self, name, fn=_sdpa, first_sleep=0.0, each_sleep=0.0):
        seen = set()

        def run(q, k, v, causal):
            self.order.append((name, q.shape[2], q.shape[3]))
            key = (q.shape[2], q.shape[3])
            if key not in seen:  # a "compilation" at every new length
                seen.add(key)
                time.sleep(first_sleep)
            time.sleep(each_sleep)
            return fn(q, k, v, causal)

        return run


SHAPES = [(True, 16, 8), (True, 16, 16), (True, 32, 8)]


def test_ours_first_peers_last_and_the_json_after_every_implementation(tmp_path, monkeypatch):
    calls = _Calls()
    impls = {"sdpa": calls.impl("sdpa"), "ours": calls.impl("ours", first_sleep=1.0)}

    def unsupported(q, k, v, causal):
        raise AG.Unsupported("causal only")

    peers = {"adasplash2_a1.5": calls.impl("adasplash2_a1.5"), "adasplash1_a1.5": unsupported}
    path = tmp_path / "att.json"
    result = {"attention": []}
    snapshots = []

    def save():
        AG_save(result, path)
        snapshots.append(json.loads(path.read_text()))

    cases = AG.attention_cases(CPU, repeats=3, emit=result["attention"].append, save=save, impls=impls, peers=peers,
                               shapes=SHAPES, batch_heads=(1, 2), limits=(10, 10), log=lambda s: None)
    # every non-peer call comes before the first peer call
    first_peer = next(i for i, c in enumerate(calls.order) if c[0].startswith("adasplash"))
    assert all(not c[0].startswith("adasplash") for c in calls.order[:first_peer])
    assert all(c[0].startswith("adasplash") for c in calls.order[first_peer:])
    assert {c[1:] for c in calls.order[:first_peer]} == {(8, 16), (16, 16), (8, 32)}
    # one save per implementation and case, each adding exactly that implementation
    assert len(snapshots) == len(SHAPES) * (len(impls) + len(peers))
    counts = [sum(len(c["impls"]) for c in s["attention"]) for s in snapshots]
    assert counts == list(range(1, len(snapshots) + 1))
    assert snapshots[0]["attention"][0]["impls"].keys() == {"sdpa"}
    for case in cases:
        ours = case["impls"]["ours"]
        assert ours["ms"] > 0 and ours["ms_calls"] == 3 and ours["first_call_s"] >= 1.0
        assert ours["ms"] < 500  # the compilation (1 s) is not in the steady state
        assert ours["psum_dtype"] == "bfloat16" and ours["max_abs_psum_minus_1"] <= ours["psum_resolution"]
        assert ours["ratio_sdpa"] > 0
        assert case["impls"]["adasplash1_a1.5"] == {"skipped": "causal only"}
    assert json.loads(path.read_text())["attention"] == json.loads(json.dumps(cases))


def AG_save(result, path):
    from softargmax.bench import save

    save(result, path)


def test_a_slow_first_call_times_out_and_the_run_goes_on(monkeypatch):
    calls = _Calls()
    impls = {"sdpa": calls.impl("sdpa"), "hangs": calls.impl("hangs", first_sleep=30),
             "slow": calls.impl("slow", each_sleep=0.1), "ours": calls.impl("ours")}
    t0 = time.perf_counter()
    cases = AG.attention_cases(CPU, repeats=20, impls=impls, peers={}, shapes=SHAPES, batch_heads=(1, 1),
                               limits=(1.0, 1.0), log=lambda s: None)
    assert time.perf_counter() - t0 < 20  # not 30 s per case
    first, second, third = (c["impls"] for c in cases)
    assert "timed_out" in first["hangs"] and "ms" not in first["hangs"]
    assert second["hangs"] == {"skipped": "timed out at a shorter length"}  # the same head dim and masking
    assert "timed_out" in third["hangs"]  # another head dim: tried again
    # the deadline between timed calls: fewer calls than asked, the median of those
    assert 0 < first["slow"]["ms_calls"] < 20 and "time limit" in first["slow"]["stopped"]
    for c in cases:  # the next implementation is unaffected (a loaded machine may cut its timed calls short)
        assert c["impls"]["ours"]["first_call_s"] < 1.0 and "timed_out" not in c["impls"]["ours"]


def test_the_watchdog_interrupts_python_code():
    with pytest.raises(AG.TimedOut):
        with AG.watchdog(0.2):
            time.sleep(5)
    with AG.watchdog(1.0):  # disarmed on exit
        pass
    time.sleep(1.2)


class _FakeAutotuner:
    def __init__(self, n):
        self.configs = [f"config{i}" for i in range(n)]
        self.cache = {}


def test_adasplash_tuning_is_pinned_once_per_head_dim():
    tuners = {"tau": _FakeAutotuner(30), "out": _FakeAutotuner(6)}
    tried = []

    def peer(q, k, v, causal):  # tunes (tries every configuration) when it has more than one
        for t in tuners.values():
            tried.append(len(t.configs))
            if len(t.configs) > 1:
                t.cache[(q.shape[2], q.shape[3])] = t.configs[3]
        return _sdpa(q, k, v, causal)

    tuning = AG.AdaSplashTuning("once", tuners)
    cases = AG.attention_cases(CPU, repeats=1, impls={"sdpa": _sdpa}, peers={"adasplash2_a1.5": peer},
                               shapes=SHAPES, batch_heads=(1, 1), tuning=tuning, log=lambda s: None)
    # the first case tunes (30 and 6 candidates), the second reuses the winner, the new head dim tunes again
    per_call = [tried[i:i + 2] for i in range(0, len(tried), 2)]
    calls_per_case = len(per_call) // 3
    assert per_call[0] == [30, 6] and per_call[calls_per_case] == [1, 1] and per_call[2 * calls_per_case] == [30, 6]
    assert cases[1]["adasplash_tuning"]["pinned"] == {"tau": ["config3"], "out": ["config3"]}
    assert cases[0]["adasplash_tuning"]["configurations"] == {"tau": 30, "out": 6}
    single = AG.AdaSplashTuning("single", {"tau": _FakeAutotuner(30)})
    assert single.tuners["tau"].configs == ["config0"]
    with pytest.raises(ValueError, match="SOFTARGMAX_BENCH_ADASPLASH_TUNING"):
        AG.AdaSplashTuning("fast", {})


def test_the_quick_list_of_shapes(monkeypatch):
    monkeypatch.setenv("SOFTARGMAX_BENCH_ATTENTION_SHAPES", "quick")
    assert AG.chosen_shapes() == AG.QUICK_SHAPES and AG.chosen_shapes(smoke=True) == AG.SMOKE_SHAPES
    assert {D for _, D, _ in AG.QUICK_SHAPES} == {64, 128} and {c for c, _, _ in AG.QUICK_SHAPES} == {True, False}
    monkeypatch.delenv("SOFTARGMAX_BENCH_ATTENTION_SHAPES")
    assert AG.chosen_shapes() == AG.SHAPES


def test_grouped_heads_and_sliding_window_variants(monkeypatch):
    """The variant cases (32 query heads over 8 shrunk to 4 over 2; a sliding window) on the CPU with the default
    implementations (the fused kernels switched off: the interpreter is slow): their records, the grouped
    inputs as they are, and the window reaching the materialized path."""
    from softargmax.backends.triton import flash_attention as FA

    monkeypatch.setattr(FA, "available", lambda: False)
    seen = []
    real = AG.sa.attention
    monkeypatch.setattr(AG.sa, "attention", lambda *a, **kw: seen.append((a[1].shape[1], kw["window"])) or real(*a, **kw))
    variants = [("gqa", True, 16, 12, 4, 2, None), ("window", True, 16, 12, 2, 2, 3)]
    cases = AG.attention_cases(CPU, repeats=1, shapes=[], variants=variants, batch_heads=(1, 2), log=lambda s: None)
    assert [c["variant"] for c in cases] == ["gqa", "window"]
    assert cases[0]["shape"] == [1, 4, 12, 16] and cases[0]["kv_heads"] == 2 and cases[1]["window"] == 3
    for case in cases:
        assert set(case["impls"]) == {"sdpa", "materialized_entmax15"}
        for r in case["impls"].values():
            assert r["ms"] > 0 and r["max_abs_psum_minus_1"] <= r["psum_resolution"], r
    assert {(2, None), (2, 3)} == set(seen)  # grouped key/value heads as they are, and the window
    assert AG.chosen_variants(smoke=True) == [] and {v[4:6] for v in AG.VARIANTS if v[0].startswith("gqa")} == {(32, 8)}
