"""Counters behind the CPU proxies of GPU cost (bytes_moved.py, host_cost.py), on Triton's interpreter.

With ``TRITON_INTERPRET=1`` set before Triton is imported and
``softargmax.backends.triton.rows.set_cpu_interpret(True)``, the library's Triton kernels run in
Triton's interpreter on CPU tensors, through the same launchers as on a GPU.  :func:`counting`
then records, until it exits,

* every kernel launch (``GridExecutor.__call__``), by kernel name;
* every global load and store of a kernel (the interpreter's ``create_masked_load`` /
  ``create_masked_store``, which unmasked accesses go through too): the masked-in elements and
  their bytes, attributed to the tensor whose storage holds the first address (names given with
  :meth:`Counts.name`, else ``"other"``);
* the bytes of every PyTorch operator run outside the kernels (a ``TorchDispatchMode``: the bytes
  of its tensor inputs and outputs; views, allocations and metadata move nothing), by operator;
* the host synchronizations a CUDA run would make: ``aten._local_scalar_dense`` (``item()``,
  ``bool()``, ``int()``, ``float()`` of a tensor), the operators whose output size depends on the
  data (``nonzero``, ``masked_select``, ``unique``, boolean indexing, ...), and ``tolist()``,
  ``numpy()`` and ``cpu()`` called on a tensor; each with the innermost stack frame inside
  ``softargmax`` that made it.  Everything is a CPU tensor here, so the counter tells the tensors
  a GPU run would hold on the host apart: those made inside the block from host values only
  (``torch.zeros(())``, arithmetic on them) and never passed to a kernel, and the library's pinned
  host buffers that it reads once their asynchronous copy has completed (the deferred range check of
  class indices, :mod:`softargmax.losses.index_check`).  Reading those is no synchronization
  (``host_reads``).  The tensors that existed before the block (the inputs), a
  kernel's arguments and whatever is computed from them are device tensors.  (A tensor allocated
  for the device but filled by PyTorch from host values only would be taken for a host one.)

The counts are of the accesses issued, as a GPU would issue them (each program's loads count
once per program, repeated passes over a row count each time); what the caches absorb is not
modelled.  The PyTorch bytes are the operators' tensor arguments and results: an upper bound
for a fused GPU kernel, exact for element-wise ones.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: PyTorch operators that move no data (views, allocations, metadata)
_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "view",
         "_unsafe_view", "reshape", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze", "select", "slice",
         "as_strided", "unbind", "split", "split_with_sizes", "chunk", "narrow", "diagonal", "view_as_real",
         "view_as_complex", "_reshape_alias", "lift_fresh", "set_", "sym_size", "sym_stride", "sym_numel",
         "is_same_size", "size", "stride", "dim", "numel", "result_type", "_to_copy_noop", "resize_", "record_stream",
         "unfold", "movedim", "flatten", "unflatten", "expand_as", "view_as", "real", "imag", "conj",
         "_conj", "_neg_view", "resolve_conj", "resolve_neg", "is_nonzero"}
#: PyTorch operators that synchronize with the host on CUDA (their result's size or value is read)
_SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive",
            "unique_dim", "repeat_interleave", "bincount", "histc", "nonzero_static", "masked_scatter"}


@dataclass
class Counts:
    """What :func:`counting` recorded (see the module docstring)."""

    launches: Counter = field(default_factory=Counter)
    accesses: list = field(default_factory=list)            # (kernel, "load"/"store", first address, bytes, elements)
    torch_bytes: Counter = field(default_factory=Counter)   # operator -> bytes
    torch_ops: Counter = field(default_factory=Counter)     # operator -> calls (views and allocations included)
    gemm_flops: Counter = field(default_factory=Counter)    # matrix operator -> 2·M·N·K summed
    allocations: Counter = field(default_factory=Counter)   # operator -> bytes of the new tensors it made
    allocation_count: Counter = field(default_factory=Counter)  # operator -> new tensors it made
    syncs: Counter = field(default_factory=Counter)         # "what @ file:line" -> count
    _names: list = field(default_factory=list)
    host_reads: Counter = field(default_factory=Counter)    # reads of host-made tensors: no synchronization
    _in_kernel: list = field(default_factory=list)
    _host: set = field(default_factory=set)                 # storages made on the host inside the block

    def is_host(self, t: torch.Tensor) -> bool:
        """Whether ``t`` was made inside the block from host values only (a factory such as
        ``torch.zeros(())``, or arithmetic on such tensors), never written by a kernel: on a GPU it is
        a CPU tensor (or its reading needs no wait), so reading its value is no synchronization."""
        ptr = t.untyped_storage().data_ptr()
        return ptr in self._host or any(b.untyped_storage().data_ptr() == ptr for b in _library_host_buffers())

    def _mark(self, tensors: list, host: bool) -> None:
        for t in tensors:
            if t.device.type != "meta":
                (self._host.add if host else self._host.discard)(t.untyped_storage().data_ptr())

    def name(self, tensor: torch.Tensor, label: str) -> None:
        """Attribute the kernels' accesses inside ``tensor``'s storage to ``label``."""
        s = tensor.untyped_storage()
        self._names.append((s.data_ptr(), s.data_ptr() + s.nbytes(), label))

    def _label(self, address: int) -> str:
        for lo, hi, label in reversed(self._names):
            if lo <= address < hi:
                return label
        return "other"

    def _by(self, kind: str) -> Counter:
        out: Counter = Counter()
        for kernel, k, address, nbytes, _ in self.accesses:
            if k == kind:
                out[(kernel, self._label(address))] += nbytes
        return out

    @property
    def loads(self) -> Counter:
        """``(kernel, tensor) -> bytes`` loaded (tensors labelled when read: a tensor named after the
        kernel ran, such as its output, is recognized)."""
        return self._by("load")

    @property
    def stores(self) -> Counter:
        return self._by("store")

    @property
    def kernel_bytes(self) -> int:
        return sum(a[3] for a in self.accesses)

    @property
    def total_bytes(self) -> int:
        return self.kernel_bytes + sum(self.torch_bytes.values())

    def by_tensor(self) -> dict[str, dict[str, int]]:
        """``{tensor: {"load": bytes, "store": bytes}}`` over all kernels."""
        out: dict[str, dict[str, int]] = {}
        for (kernel, tensor), b in self.loads.items():
            out.setdefault(tensor, {"load": 0, "store": 0})["load"] += b
        for (kernel, tensor), b in self.stores.items():
            out.setdefault(tensor, {"load": 0, "store": 0})["store"] += b
        return out

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())


def _library_host_buffers() -> list:
    """The library's host buffers that asynchronous copies from the device fill and that it reads only once the
    copy has completed (the deferred range check of class indices: pinned memory on a GPU): reading them is
    no synchronization."""
    check = sys.modules.get("softargmax.losses.index_check")
    return check.host_buffers() if check is not None else []


#: operators that read or write only the indexed entries of their first argument
_INDEXED = {"gather", "index_select", "index", "take", "take_along_dim", "embedding", "scatter_", "scatter_add_",
            "scatter_reduce_", "index_put_", "index_add_", "index_copy_", "index_fill_", "masked_scatter_"}


#: matrix products and the operand positions of their [M, K] and [K, N] (or batched) factors
GEMMS = {"mm": (0, 1), "addmm": (1, 2), "addmm_": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2), "baddbmm_": (1, 2),
          "addbmm": (1, 2), "addbmm_": (1, 2), "_addmm_activation": (1, 2)}


def _gemm_flops(name: str, args: tuple) -> int:
    """``2 M N K`` (times the batch) of a matrix product."""
    i, j = GEMMS[name]
    a, b = args[i], args[j]
    batch = a.shape[0] if a.dim() == 3 else 1
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _tensors(values: list) -> list:
    out = []
    for value in values:
        for t in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def _nbytes(values: Any) -> int:
    total = 0
    for value in values:
        for t in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                total += t.numel() * t.element_size()
    return total


def _moved(name: str, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes an operator reads and writes: its tensor arguments and results; for the indexed operators, the
    indices, the values and the entries of the first argument they reach (read and written in place)."""
    if name in _INDEXED and args:
        rest = _nbytes(list(args[1:]) + list(kwargs.values()))
        if name.endswith("_"):  # in place: the entries reached are read and written (at most the values' size)
            return rest + _nbytes([args[-1]]) if isinstance(args[-1], torch.Tensor) else rest
        return rest + 2 * _nbytes([out])  # the entries read from the first argument, and the result written
    return _nbytes(list(args) + list(kwargs.values()) + [out])


def _where() -> str:
    """The innermost frame of the library (``softargmax/``) on the stack, as ``file:line``."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace(os.sep, "/")
        if "/softargmax/" in path and "/benchmarks/" not in path:
            return f"{path.rsplit('/softargmax/', 1)[1]}:{frame.lineno}"
    return "?"


class _TorchCounter(TorchDispatchMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:  # noqa: PLW3201  (PyTorch's hook)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.counts._in_kernel:
            return out
        name = func.overloadpacket.__name__
        self.counts.torch_ops[name] += 1
        inputs = _tensors(list(args) + list(kwargs.values()))
        from_host = all(self.counts.is_host(t) for t in inputs)  # a factory (no tensor input) included
        if name in _SYNCING or (name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) if i is not None)):
            if inputs and from_host:
                self.counts.host_reads[f"{name} @ {_where()}"] += 1
            else:
                self.counts.syncs[f"{name} @ {_where()}"] += 1
        # what is made from host tensors only stays on the host; anything touched by a device tensor is on the device
        self.counts._mark(_tensors([out]) + ([] if from_host else inputs[:1] if name.endswith("_") else []), from_host)
        seen = {t.untyped_storage().data_ptr() for t in inputs if t.device.type != "meta"}
        for t in _tensors([out]):  # new storages: allocations (empty, the results of out-of-place operators)
            if t.device.type != "meta" and t.untyped_storage().data_ptr() not in seen:
                self.counts.allocations[name] += t.untyped_storage().nbytes()
                self.counts.allocation_count[name] += 1
        if name in _FREE or name == "_local_scalar_dense" or getattr(func, "is_view", False):
            return out
        self.counts.torch_bytes[name] += _moved(name, args, kwargs, out)
        if name in GEMMS:
            self.counts.gemm_flops[name] += _gemm_flops(name, args)
        return out


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Count launches, kernel loads/stores, PyTorch bytes and host synchronizations inside the block."""
    from triton.runtime import interpreter as interp

    counts = Counts()
    builder = interp.interpreter_builder
    real_load, real_store, real_call = builder.create_masked_load, builder.create_masked_store, interp.GridExecutor.__call__
    kernel: list[str] = []

    def record(kind: str, ptrs: Any, mask: Any) -> None:
        m = mask.data
        n = int(m.sum()) if hasattr(m, "sum") else int(bool(m))
        if n == 0:
            return
        size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        addresses = ptrs.data[m] if getattr(m, "shape", ()) == ptrs.data.shape else ptrs.data.reshape(-1)
        counts.accesses.append((kernel[-1], kind, int(addresses.reshape(-1)[0]), n * size, n))

    def load(ptrs: Any, mask: Any, other: Any, cache_policy: Any, is_volatile: Any) -> Any:
        record("load", ptrs, mask)
        return real_load(ptrs, mask, other, cache_policy, is_volatile)

    def store(ptrs: Any, value: Any, mask: Any, cache_policy: Any) -> Any:
        record("store", ptrs, mask)
        return real_store(ptrs, value, mask, cache_policy)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.launches[self.fn.__name__] += 1
        counts._mark(_tensors(list(args) + list(kwargs.values())), False)  # a kernel's arguments live on the device
        kernel.append(self.fn.__name__)
        counts._in_kernel.append(True)
        try:
            return real_call(self, *args, **kwargs)
        finally:
            counts._in_kernel.pop()
            kernel.pop()

    real_methods = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu")}

    def host_reader(name: str) -> Any:
        real = real_methods[name]

        def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not counts._in_kernel:
                (counts.host_reads if counts.is_host(self) else counts.syncs)[f"{name} @ {_where()}"] += 1
            return real(self, *args, **kwargs)

        return method

    builder.create_masked_load, builder.create_masked_store = load, store
    interp.GridExecutor.__call__ = call
    for name in real_methods:
        setattr(torch.Tensor, name, host_reader(name))
    try:
        with _TorchCounter(counts):
            yield counts
    finally:
        del builder.create_masked_load, builder.create_masked_store  # the class's methods again
        interp.GridExecutor.__call__ = real_call
        for name, real in real_methods.items():
            setattr(torch.Tensor, name, real)


def interpreter_ready() -> bool:
    """Whether the kernels run in Triton's interpreter on CPU tensors here (``TRITON_INTERPRET=1`` set
    before Triton was imported); turns the CPU routing on."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from softargmax.backends.triton import rows

    if not rows.available():
        return False
    rows.set_cpu_interpret(True)
    return True


def setup_interpreter() -> None:
    """For the scripts: the interpreter on, before Triton is imported, and ``src`` on the path."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("Triton was imported before TRITON_INTERPRET=1 was set")
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
