"""The value checks of the vocabulary-parallel losses that ride on their first round (one process, gloo).

The range of the class indices and the sign of the class weights are computed on the device and carried
by the first round's all-gather, whose table every rank reads on the host anyway: the ``ValueError`` is
raised at the call itself, the same on every rank, with no synchronization of its own (counted in
tests/test_host_cost.py; several ranks raising together: tests/test_distributed.py).
"""

import pytest
import torch
import torch.distributed as dist

import softargmax as sa
from softargmax.losses import distributed
from softargmax.losses import index_check as ic

F64 = torch.float64


@pytest.fixture
def group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield None
    dist.destroy_process_group()


@pytest.fixture
def deferred():
    """The one-process losses' deferred check on CPU tensors, as on a GPU: the split losses must not use it."""
    old = ic.set_deferred_on_cpu(True)
    yield
    ic.set_deferred_on_cpu(old)
    ic._FLAGS.clear()


def _problem(N=6, d=4, V=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, W = torch.randn(N, d, generator=g, dtype=F64), torch.randn(V, d, generator=g, dtype=F64)
    return h, W, torch.randint(0, V, (N,), generator=g)


def _calls(h, W, kw):
    return {"unfused": lambda t: distributed.fenchel_young_loss((h @ W.T).requires_grad_(), t, "entmax15", **kw),
            "fused": lambda t: distributed.linear_fenchel_young_loss(h.requires_grad_(), W, t, chunk_size=4, **kw)}


@pytest.mark.parametrize("kind", ["unfused", "fused"])
@pytest.mark.parametrize("bad", [10, 11, 2**62, -1, -5, -(2**63)])
def test_bad_class_index_raises_at_the_call(group, deferred, kind, bad):
    """An index outside [0, K) (K = 10 here; -2**63, the one-process flag's sentinel, too) raises at the call that
    has it, with the deferred check of the one-process losses on: no value is returned, nothing is left for
    ``check_class_indices``, and the next call with good indices works."""
    h, W, t = _problem()
    call = _calls(h, W, {})[kind]
    t[2], t[4] = bad, -100  # (an ignored row besides)
    with pytest.raises(ValueError, match=rf"class index {bad} is out of range \[0, 10\) \(ignore_index=-100\)"):
        call(t)
    sa.losses.check_class_indices()  # nothing deferred
    t[2] = 3
    ref = sa.entmax15_loss(h @ W.T, t)
    assert torch.allclose(call(t), ref, rtol=1e-10, atol=0)


@pytest.mark.parametrize("kind", ["unfused", "fused"])
def test_ignored_and_edge_indices_pass(group, kind):
    """0 and K - 1 are in range; every row ignored raises nothing (the table says no index was kept); the rows of
    an ignore_index of K + 2 are skipped by the range check (not counted as the largest index)."""
    h, W, t = _problem()
    t[0], t[1] = 0, 9
    call = _calls(h, W, {})[kind]
    assert torch.allclose(call(t), sa.entmax15_loss(h @ W.T, t), rtol=1e-10, atol=0)
    every = torch.full_like(t, -100)
    assert torch.isnan(call(every))  # the mean over no item, as F.cross_entropy
    t[3] = 12
    loss = _calls(h, W, {"ignore_index": 12})[kind](t)
    assert torch.allclose(loss, sa.entmax15_loss(h @ W.T, t, ignore_index=12), rtol=1e-10, atol=0)


@pytest.mark.parametrize("kind", ["unfused", "fused"])
def test_negative_class_weight_raises_at_the_call(group, kind):
    h, W, t = _problem()
    w = torch.ones(10, dtype=F64)
    w[7] = -0.5
    key = "weight" if kind == "unfused" else "class_weight"
    with pytest.raises(ValueError, match=r"weight must be finite and non-negative \(rank 0: a negative, infinite or NaN class weight\)"):
        _calls(h, W, {key: w})[kind](t)
    w[7] = 0.5
    ref = sa.entmax15_loss(h @ W.T, t, weight=w)
    assert torch.allclose(_calls(h, W, {key: w})[kind](t), ref, rtol=1e-10, atol=0)
