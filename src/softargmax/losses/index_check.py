r"""The range check of class indices on a GPU, without a host synchronization.

A loss given class indices must refuse an index outside :math:`[0, C)` (``ignore_index`` excluded).
On the CPU the check reads the indices where they are and raises the ``ValueError`` at once.  On a
GPU, reading whether an index is bad would make the host wait for the device at every loss call
(a synchronization that stalls the host's queue of kernels).  So there the losses check the indices
on the device and read the result later, without waiting:

* each call computes, on the device, its largest bad index (if any) and folds it into a small flag
  tensor kept per device (the largest bad index since the last report, and a log of the last calls'
  own, which names the call);
  the rows with a bad index are computed with class 0, so that no kernel reads outside the row and
  no device-side assertion fires;
* after the update, the flag is copied into pinned host memory by an asynchronous copy, and a CUDA
  event is recorded behind it (one copy in flight at a time: while it is, the flag only accumulates);
* at the start of the next loss call on that device, the event is queried (``Event.query``, which
  does not wait); once the copy has landed, the host reads the flag and, if a call had a bad index,
  raises the ``ValueError`` there, naming that earlier call, its scores' shape and a bad index.

A bad index is thus reported one or a few loss calls late, and the loss returned by the call that
had it was computed with class 0 in the bad rows.  :func:`check_class_indices` raises it now: it waits
for the copy (a synchronization) and reads the flag; call it after a loss call to raise at that
call (in a debugging run, or once per epoch).  Only the first bad call before a report is named.

The check is skipped, as every value check of the library is, while ``torch.compile``,
``torch.export`` or ``torch.jit.trace`` traces, during CUDA-graph capture, and for tensor subclasses
(fake tensors).  There the index is kept as it is, and a bad one fails in the kernel that reads it, as
PyTorch's own gather does (a device-side assertion on a GPU); the losses that run as one traced operator
(class indices without ``return_prediction``) check at run time as in eager mode.

The vocabulary-parallel losses (:mod:`softargmax.losses.distributed`) do not defer: their first round, an
all-gather whose table every rank reads on the host anyway, carries the smallest and the largest kept class
index, computed on the device, and each rank checks them against the global number of classes there.  The
``ValueError`` is then raised at the call itself, on every rank at once; a check raised a few calls late
could be read at different calls on different ranks, and a rank that did not raise would wait in the next
collective for the ones that did.

The flag of a device assumes its loss calls come from one stream at a time (the usual training loop);
calls from several threads are serialized by a lock.  A bad index of the last calls before the program
ends, with no later loss call to report it, is reported at exit on standard error.
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import Any, Optional, Union

import torch
from torch import Tensor

from .._utils.tracing import values_checkable

__all__ = ["check_class_indices"]

_LOW = -(2**63)  # below every index: a call's entry when it had no bad index
#: the calls whose entries the flag holds at once (a call's entry is overwritten ``LOG`` calls later)
LOG = 64


class DeviceFlag:
    """The deferred check of one device (see the module docstring).

    ``state``: ``int64 [1 + LOG]`` on the device: ``state[0]`` the largest bad index of the calls since the last
    report (:data:`_LOW` while none), and ``state[1 + n % LOG]`` that of call ``n`` alone (the log that names the
    call); ``host``: its copy in pinned host memory (plain host memory on the CPU, where the deferred check runs
    only when asked: :func:`set_deferred_on_cpu`); ``event``: the CUDA event recorded behind the last copy
    (``None`` on the CPU, whose copies complete at once).  Per call: four small device operations and the copy
    (while no copy is in flight)."""

    def __init__(self, device: torch.device, event: Any = None):
        self.device = device
        self.state = torch.full((1 + LOG,), _LOW, dtype=torch.int64, device=device)
        self.host = torch.empty(1 + LOG, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.event = event if event is not None else (torch.cuda.Event() if device.type == "cuda" else None)
        self.pending = False  # a copy of state into host is in flight
        self.copied = 0  # the number of the last call the copy in flight covers
        self.count = 0  # calls checked so far
        #: the calls not yet covered by a copy read back: number -> (caller, k, ignore_index, shape)
        self.calls: dict[int, tuple[str, int, int, tuple[int, ...]]] = {}

    def record(self, index: Tensor, bad: Tensor, caller: str, k: int, ignore_index: int,
               shape: tuple[int, ...]) -> None:
        """Fold the bad rows ``bad`` of class indices ``index`` (``[R]``, on the device) of one call into the
        flag (device operations only), and start the copy to the host if none is in flight."""
        self.count += 1
        n = self.count
        self.calls[n] = (caller, k, ignore_index, shape)
        # the largest bad index, or _LOW (an index of -2**63 itself counts as -2**63 + 1, still bad)
        some = torch.where(bad, index.clamp_min(_LOW + 1), _LOW).amax()
        self.state[1 + n % LOG].copy_(some)
        torch.maximum(self.state[0], some, out=self.state[0])
        if not self.pending:
            self._start_copy()

    def _start_copy(self) -> None:
        """Copy the flag to the host behind the calls queued so far (asynchronously), covering them."""
        self.host.copy_(self.state, non_blocking=True)
        if self.event is not None:  # behind the copy, on the stream of the flag's device
            self.event.record(torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None)
        self.pending, self.copied = True, self.count

    def poll(self, wait: bool) -> None:
        """Read the flag if its copy has landed (``wait``: wait for it; a copy is started first if calls are
        left that none covers) and raise the ``ValueError`` of a bad call it reports; what it reported is
        then cleared, and a copy of the calls left is started."""
        if not self.pending and wait and self.calls:
            self._start_copy()
        if not self.pending:
            return
        if self.event is not None:
            if wait:
                self.event.synchronize()
            elif not self.event.query():
                return
        self.pending = False
        values = self.host.tolist()  # pinned host memory whose copy has completed: no synchronization
        covered = sorted(n for n in self.calls if n <= self.copied)
        bad = values[0] != _LOW
        # the first covered call whose log entry (not overwritten since: one of the last LOG calls) is bad
        first = next((n for n in covered if n > self.copied - LOG and values[1 + n % LOG] != _LOW), None) \
            if bad else None
        call = self.calls.get(first) if first is not None else None
        for n in covered:
            del self.calls[n]
        if not bad:
            if wait and self.calls:  # calls made after that copy: waiting covers them too
                self._start_copy()
                self.poll(wait=True)
            return
        # clear what this report covers, behind the calls already queued (device fills): the log entries of
        # the covered calls (not those a later, uncovered call has taken over), and the running maximum, which
        # is then that of the entries left (the bad calls queued after the copy stay to be reported)
        later = {n % LOG for n in self.calls}
        for slot in {n % LOG for n in covered} - later:
            self.state[1 + slot].fill_(_LOW)
        torch.amax(self.state[1:], 0, out=self.state[0])
        if self.calls:  # calls queued after the copy: the next poll reads them
            self._start_copy()
        hint = ("On a GPU the check is read a few calls late, without waiting for the device: call "
                "softargmax.losses.check_class_indices() after a loss call to raise there")
        if call is None or first is None:  # its log entry was overwritten: more than LOG calls ran before the copy
            raise ValueError(f"target: a class index outside [0, C) (class index {values[0]}) was passed to an "
                             f"earlier loss call on {self.device}.  {hint}")
        caller, k, ignore_index, shape = call
        raise ValueError(
            f"target: a class index outside [0, {k}) was passed to an earlier call of {caller} on {self.device} "
            f"(scores of shape {shape}; class index {values[1 + first % LOG]} is out of range, "
            f"ignore_index={ignore_index}); that call computed the bad rows with class 0.  {hint}")


_FLAGS: dict[torch.device, DeviceFlag] = {}
_LOCK = threading.Lock()  # the flags' host state (counts, pending copy, calls) is updated by one thread at a time
_deferred_on_cpu = False


def set_deferred_on_cpu(on: bool) -> bool:
    """Run the deferred check (a GPU's) on CPU tensors as well: for the tests and the CPU counters of host cost,
    which stand in for a GPU.  Returns the previous setting."""
    global _deferred_on_cpu
    old, _deferred_on_cpu = _deferred_on_cpu, bool(on)
    return old


def deferred(index: Tensor) -> bool:
    """Whether the class indices ``index`` are checked on the device (a CUDA tensor, or a CPU one under
    :func:`set_deferred_on_cpu`) rather than read at once."""
    return index.is_cuda or (_deferred_on_cpu and index.device.type == "cpu")


def check_on_device(index: Tensor, bad: Tensor, caller: str, k: int, ignore_index: int,
                    shape: tuple[int, ...]) -> bool:
    """The deferred check of one loss call: raise the ``ValueError`` of an earlier call whose result has
    landed, then fold this call's bad rows ``bad`` of ``index`` into its device's flag.  ``False`` (nothing
    checked) where values cannot be read (tracing, CUDA-graph capture, tensor subclasses); ``True`` for no
    indices (nothing to check)."""
    if type(index) is not Tensor or type(bad) is not Tensor or not values_checkable(index):
        return False
    if index.numel() == 0:
        return True
    with _LOCK:
        flag = _FLAGS.get(index.device)
        if flag is None:
            flag = _FLAGS[index.device] = DeviceFlag(index.device)
        flag.poll(wait=False)  # (an earlier call's error stops this call before its indices are read)
        flag.record(index, bad, caller, k, ignore_index, shape)
    return True


def check_class_indices(device: Optional[Union[torch.device, str, int]] = None) -> None:
    """Raise now the ``ValueError`` of a class index outside ``[0, C)`` passed to an earlier loss call on a GPU.

    On a GPU the losses check class indices on the device and read the result at a later call, without
    waiting (see :mod:`softargmax.losses.index_check`); this function waits for that result (a host
    synchronization) and raises if a call since the last report had a bad index.  On the CPU the losses
    raise at the call itself, and this function has nothing to do.

    Args:
        device: the device whose calls to check (a ``torch.device``, ``"cuda:1"`` or an index); default every
            device the losses have checked indices on.

    Raises:
        ValueError: a loss call had a class index outside ``[0, C)`` that is not ``ignore_index``; the message
            names the call.

    Examples:
        >>> import torch, softargmax as sa
        >>> loss = sa.entmax15_loss(torch.randn(2, 3), torch.tensor([0, 2]))
        >>> sa.losses.check_class_indices()  # nothing pending: returns
    """
    if device is None:
        flags = list(_FLAGS.values())
    else:
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if d.type == "cuda" and d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
        flags = [_FLAGS[d]] if d in _FLAGS else []
    with _LOCK:
        for flag in flags:
            flag.poll(wait=True)


@atexit.register
def _report_at_exit() -> None:
    """A bad class index of the last loss calls, which no later call reported: one line on standard error."""
    for flag in list(_FLAGS.values()):
        try:
            flag.poll(wait=True)
        except ValueError as err:
            print(f"softargmax: {err}", file=sys.stderr)
        except Exception:  # noqa: BLE001  (the device may be gone at exit: nothing more to say)
            pass


def host_buffers() -> list[Tensor]:
    """The flags' host copies (pinned memory on a GPU, read only once their copy has completed): for the
    counters of host synchronizations, which must not take reading them for one."""
    return [flag.host for flag in _FLAGS.values()]
