"""Shortcuts for Triton's interpreter (``TRITON_INTERPRET=1``), which runs the kernels on CPU tensors.

The tests and the CPU proxies (passes per row, bytes moved, launches per call) run the kernels there.
Three of the interpreter's helpers cost far more than the kernels' own arithmetic:

- a reduction with a user combine function (``tl.reduce((S, S'), 0, combine)``, the row kernels'
  fused sums; the attention's three smallest entries) is evaluated one element at a time in Python,
  with a call of the combine function per element;
- every conversion looks up NumPy's dtype in a table that it builds anew on each call;
- every call of a device function lists every member of ``triton.language`` to find the builtins to
  patch (after the kernel's first call has patched them all).

:func:`install` replaces the first by a tree over whole slices: each level combines the even entries
with the odd ones along the axis in one vectorized call, ``⌈log₂ n⌉`` calls in all.  Adjacent runs
are combined left to right, so a combine function need only be associative, as Triton already
requires of it (a GPU reduces in a tree too); sums are added in another order than the element-wise
loop's.  The second is memoized; the third lists the builtins once per module and patches those still
unpatched, as Triton does.  Nothing changes where Triton compiles for a GPU.

:func:`softargmax.backends.triton.rows.set_cpu_interpret` installs them; a Triton whose interpreter lacks one
of the replaced helpers is left as it is.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any


def interpreting() -> bool:
    """Whether Triton runs its kernels in the interpreter: Triton's own setting, ``triton.knobs.runtime.interpret``
    (``TRITON_INTERPRET`` read as Triton reads it: ``1``, ``true``, ``on``, ``yes``, any case), or where a Triton has
    no such knob, ``TRITON_INTERPRET == "1"`` as its ``triton.jit`` reads it.  The kernel modules decide with it,
    when imported, whether they may use inline PTX (the interpreter runs none).

    Examples:
        >>> from softargmax.backends.triton.interpreter import interpreting
        >>> isinstance(interpreting(), bool)
        True
    """
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):  # a Triton without the knob
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


#: whether :func:`install` has put the shortcuts in place
_state = {"installed": False}


def _take(d: Any, axis: int, start: int, stop: int, step: int = 1) -> Any:
    index = [slice(None)] * d.ndim
    index[axis] = slice(start, stop, step)
    return d[tuple(index)]


def _tree_reduce(self: Any, input: tuple) -> list:
    """``ReduceOps.generic_reduce`` by levels: the even entries combined with the odd ones, per level."""
    import numpy as np

    ndim = input[0].handle.data.ndim
    axis = 0 if self.axis is None else self.axis
    # over the whole tile: every operand flattened (Triton's own helper flattens the first one only)
    data = [t.handle.data.reshape(-1) if self.axis is None else t.handle.data for t in input]
    types = [t.dtype for t in input]
    while data[0].shape[axis] > 1:
        n = data[0].shape[axis]
        pairs = n - n % 2
        left = [self.to_tensor(_take(d, axis, 0, pairs, 2), ty) for d, ty in zip(data, types)]
        right = [self.to_tensor(_take(d, axis, 1, pairs, 2), ty) for d, ty in zip(data, types)]
        out = self.combine_fn.fn(*left, *right)
        out = out if isinstance(out, tuple) else (out,)
        shape = left[0].handle.data.shape
        joined = []
        for d, o in zip(data, out):
            value = o.handle.data if hasattr(o, "handle") else np.full(shape, getattr(o, "value", o))
            value = np.broadcast_to(value, shape).astype(d.dtype, copy=False)
            if n % 2:  # the odd last entry, after the combined pairs
                value = np.concatenate([value, _take(d, axis, n - 1, n)], axis=axis)
            joined.append(value)
        data = joined
    ret = []
    for d, ty in zip(data, types):
        d = np.take(d, 0, axis=axis)
        if self.keep_dims:
            d = np.expand_dims(d, axis) if self.axis is not None else d.reshape((1,) * ndim)
        elif self.axis is None:
            d = d.item()
        ret.append(self.to_tensor(d, ty))
    return ret


def _memoized_dtype(get_dtype: Any) -> Any:
    memo: dict[Any, Any] = {}

    @functools.wraps(get_dtype)
    def np_dtype(tt_dtype: Any) -> Any:
        try:
            return memo[tt_dtype]
        except KeyError:
            memo[tt_dtype] = found = get_dtype(tt_dtype)
            return found
        except TypeError:  # an unhashable type: the table as Triton builds it
            return get_dtype(tt_dtype)

    return np_dtype


def _builtin_patcher(patch_attr: Any, is_builtin: Any) -> Any:
    names: dict[int, list[str]] = {}

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        listed = names.get(id(pkg))
        if listed is None:  # the module's builtins, listed once (not on every call of a device function)
            listed = names[id(pkg)] = [name for name, member in inspect.getmembers(pkg) if is_builtin(member)]
        for name in listed:
            member = getattr(pkg, name, None)
            if member is not None and is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    return patch_builtin


def install() -> bool:
    """Install the shortcuts in Triton's interpreter, once; returns whether they are in place."""
    if _state["installed"]:
        return True
    try:
        from triton.runtime import interpreter as it
    except ImportError:
        return False
    reduce_ops = getattr(it, "ReduceOps", None)
    get_dtype = getattr(it, "_get_np_dtype", None)
    patch_attr = getattr(it, "_patch_attr", None)
    is_builtin = getattr(getattr(getattr(it, "tl", None), "core", None), "is_builtin", None)
    needed = (hasattr(reduce_ops, "generic_reduce") and hasattr(reduce_ops, "to_tensor")
              and hasattr(it, "_patch_builtin"))
    if reduce_ops is None or get_dtype is None or patch_attr is None or is_builtin is None or not needed:
        return False
    it._get_np_dtype = _memoized_dtype(get_dtype)
    it._patch_builtin = _builtin_patcher(patch_attr, is_builtin)
    reduce_ops.generic_reduce = _tree_reduce
    _state["installed"] = True
    return True
