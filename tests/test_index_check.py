"""The range check of class indices without a host synchronization (softargmax.losses.index_check).

On a GPU the losses check class indices on the device and raise the ValueError at a later call, once the
flag's asynchronous copy has landed.  Here the same code runs on CPU tensors under
``set_deferred_on_cpu(True)`` (the C solver's path, which raises at once, switched off), and the event of
the copy is replaced by one whose readiness the test decides.  The CUDA test runs it on a GPU.
"""

import pytest
import torch
from conftest import needs_cuda

import softargmax as sa
from softargmax.backends.cpu import rows as cpu_rows
from softargmax.losses import index_check as ic


@pytest.fixture
def deferred():
    """The deferred check on CPU tensors, with fresh flags; everything restored afterwards."""
    old_flags = dict(ic._FLAGS)
    ic._FLAGS.clear()
    old = ic.set_deferred_on_cpu(True)
    old_c = cpu_rows.SWITCH.set(False)  # the C solver's path checks at once (a CPU path only)
    yield
    cpu_rows.SWITCH.set(old_c)
    ic.set_deferred_on_cpu(old)
    ic._FLAGS.clear()
    ic._FLAGS.update(old_flags)


class Event:
    """A CUDA event's interface, whose completion the test sets."""

    def __init__(self):
        self.ready, self.records, self.waits = False, 0, 0

    def record(self, stream=None):
        self.records += 1
        self.ready = False

    def query(self):
        return self.ready

    def synchronize(self):
        self.waits += 1
        self.ready = True


X = torch.randn(4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_cpu_tensors_raise_at_once():
    """Without the switch, a CPU call raises at the call itself (C path and general path)."""
    t = torch.tensor([0, 7, -100, 1])
    with pytest.raises(ValueError, match="class index 7 is out of range"):
        sa.entmax15_loss(X, t)
    old = cpu_rows.SWITCH.set(False)
    try:
        with pytest.raises(ValueError, match="class index 7 is out of range"):
            sa.entmax15_loss(X, t)
    finally:
        cpu_rows.SWITCH.set(old)
    assert not ic.deferred(t)


def test_a_bad_index_raises_at_the_next_call(deferred):
    """The bad call returns the loss with class 0 in its bad row (no error, no access outside the row); the next
    call raises, naming it, its shape and the index; then the flag is clear."""
    x = X.clone().requires_grad_()
    want = sa.entmax15_loss(X, torch.tensor([0, 0, -100, 1]), reduction="none")
    bad = sa.entmax15_loss(x, torch.tensor([0, 7, -100, 1]), reduction="none")
    torch.testing.assert_close(bad.detach(), want)
    bad.sum().backward()  # the backward runs as well
    with pytest.raises(ValueError, match=r"earlier call of entmax15_loss on cpu \(scores of shape \(4, 5\); "
                                         r"class index 7 is out of range, ignore_index=-100\)"):
        sa.sparsemax_loss(X, torch.tensor([0, 1, 2, 3]))
    sa.sparsemax_loss(X, torch.tensor([0, 1, 2, 3]))  # reported once
    ic.check_class_indices()


def test_good_indices_and_ignore_index_never_raise(deferred):
    for t in ([0, 4, -100, 1], [4, 4, 4, 4], [-100] * 4):
        sa.entmax_loss(X, torch.tensor(t), alpha=1.3)
    sa.entmax15_loss(X, torch.tensor([0, 5, 1, 1]), ignore_index=5)  # 5 ignored, though >= C
    ic.check_class_indices()


def test_the_first_bad_call_is_named(deferred):
    """Several bad calls before the flag is read: the first is named, with its own index (a negative one)."""
    flag_event = Event()
    ic._FLAGS[torch.device("cpu")] = ic.DeviceFlag(torch.device("cpu"), event=flag_event)
    sa.entmax15_loss(X, torch.tensor([0, 1, 2, 3]))  # good; its copy is in flight
    sa.entmax_loss(X, torch.tensor([0, -3, 2, 3]), alpha=1.3)
    sa.entmax15_loss(X, torch.tensor([0, 9, 2, 3]))
    flag_event.ready = True  # the first copy lands: it covers the good call only
    sa.entmax15_loss(X, torch.tensor([0, 1, 2, 3]))  # reads it (clean), starts the next copy
    flag_event.ready = True
    with pytest.raises(ValueError, match=r"call of entmax_loss\(alpha=1.3\) .* class index -3 is out of range"):
        sa.entmax15_loss(X, torch.tensor([0, 1, 2, 3]))


def test_the_flag_is_read_only_once_its_copy_has_landed(deferred):
    """While the event says the copy is in flight, no call reads the flag (nor waits); the first call after it
    lands raises; ``check_class_indices`` waits for it."""
    event = Event()
    ic._FLAGS[torch.device("cpu")] = flag = ic.DeviceFlag(torch.device("cpu"), event=event)
    sa.entmax15_loss(X, torch.tensor([0, 7, 1, 1]))
    assert event.records == 1 and flag.pending
    for _ in range(3):  # in flight: the calls go on; the flag accumulates, no new copy starts
        sa.entmax15_loss(X, torch.tensor([0, 1, 1, 1]))
    assert event.records == 1 and event.waits == 0
    event.ready = True
    with pytest.raises(ValueError, match="class index 7"):
        sa.entmax15_loss(X, torch.tensor([0, 1, 1, 1]))
    sa.entmax15_loss(X, torch.tensor([0, 1, 1, -1]))  # a new bad call, its copy in flight
    assert event.records == 2 and not event.ready
    with pytest.raises(ValueError, match="class index -1"):
        ic.check_class_indices()  # waits: for the copy in flight (the good calls), then for one covering the bad one
    assert event.waits == 2
    ic.check_class_indices()


def test_an_overwritten_log_still_raises(deferred):
    """More calls than the log holds while a copy is in flight: the bad index is still reported."""
    event = Event()
    ic._FLAGS[torch.device("cpu")] = ic.DeviceFlag(torch.device("cpu"), event=event)
    sa.entmax15_loss(X, torch.tensor([0, 1, 1, 1]))  # the copy in flight
    sa.entmax15_loss(X, torch.tensor([0, 8, 1, 1]))
    for _ in range(ic.LOG):
        sa.entmax15_loss(X, torch.tensor([0, 1, 1, 1]))
    event.ready = True
    sa.entmax15_loss(X, torch.tensor([0, 1, 1, 1]))  # the first copy: before the bad call
    with pytest.raises(ValueError, match=r"class index outside \[0, C\) \(class index 8\) was passed to an earlier"):
        ic.check_class_indices()
    assert len(ic._FLAGS[torch.device("cpu")].calls) == 0  # the records are dropped as the copies are read


def test_the_fused_loss_is_checked_on_the_device(deferred):
    h, W = torch.randn(4, 3, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    sa.linear_fenchel_young_loss(h, W, torch.tensor([0, 1, 6, 2]), chunk_size=2)
    with pytest.raises(ValueError, match=r"call of linear_fenchel_young_loss .* class index 6 is out of range"):
        ic.check_class_indices()


def test_fake_tensors_are_not_checked(deferred):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        idx = torch.tensor([0, 9])
        ic.check_on_device(idx, idx > 5, "f", 5, -100, (2, 5))
    assert ic._FLAGS == {}


def test_compiled_losses_check_at_run_time(deferred):
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: sa.entmax15_loss(x, y), fullgraph=True, backend="aot_eager")
    f(X, torch.tensor([0, 1, 9, 2]))
    with pytest.raises(ValueError, match="class index 9 is out of range"):
        ic.check_class_indices()


@needs_cuda
def test_cuda_deferred_check():
    """On a GPU: no synchronization in the loss call, the ValueError at a later call or on request."""
    x = X.float().cuda()
    sa.entmax15_loss(x, torch.tensor([0, 7, 1, 1], device="cuda"))
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="earlier call of entmax15_loss on cuda"):
        sa.entmax15_loss(x, torch.tensor([0, 1, 1, 1], device="cuda"))
    sa.entmax15_loss(x, torch.tensor([0, 1, 1, -2], device="cuda"))
    with pytest.raises(ValueError, match="class index -2"):
        ic.check_class_indices("cuda")


def test_a_later_bad_call_is_reported_after_an_earlier_one(deferred):
    """Two bad calls, the first copy covering the first only: its report clears what it covered, not the second
    call's entry, which the next report names."""
    event = Event()
    ic._FLAGS[torch.device("cpu")] = ic.DeviceFlag(torch.device("cpu"), event=event)
    sa.entmax15_loss(X, torch.tensor([0, 7, 1, 1]))  # its copy in flight
    sa.sparsemax_loss(X, torch.tensor([0, 1, 9, 1]))  # queued after the copy
    event.ready = True
    with pytest.raises(ValueError, match=r"call of entmax15_loss .* class index 7"):
        sa.entmax15_loss(X, torch.tensor([0, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"call of sparsemax_loss .* class index 9"):
        ic.check_class_indices()
    ic.check_class_indices()  # both reported: clear


def test_the_smallest_int64_index_is_bad(deferred):
    sa.entmax15_loss(X, torch.tensor([0, -(2**63), 1, 1]))
    with pytest.raises(ValueError, match="out of range"):
        ic.check_class_indices()


def test_traced_losses_keep_a_bad_index_and_fail_in_the_kernel(deferred):
    """A loss that torch.compile traces (normmax, a prediction returned) cannot read the flag: the bad index is
    kept, and reading it fails as PyTorch's own gather does, instead of a loss computed with class 0."""
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: sa.entmax15_loss(x, y, return_prediction=True)[0], backend="aot_eager")
    with pytest.raises(Exception, match=r"out of bounds|out of range|index"):
        f(X, torch.tensor([0, 1, 9, 2]))
    ic.check_class_indices()
