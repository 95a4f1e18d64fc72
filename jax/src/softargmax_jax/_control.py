r"""``lax.while_loop`` and ``lax.cond`` whose carries and branches agree on the mesh axes they vary over.

Inside ``jax.shard_map`` every value has a type that records the manual mesh axes it varies over
(values computed from a sharded input vary over that input's axes; a constant such as
``jnp.zeros(...)`` varies over none; ``lax.psum`` over an axis makes a value invariant over it).
A loop's initial carry must have the type of the body's output, and a conditional's two branches the
same output types.  The solver starts its loops from constants and the rows' own values: with the
classes split over one axis (``vocab_parallel_fenchel_young_loss`` on a 1-D mesh) these agree, but with
the rows split over a second axis of the mesh a carry such as "the rows solved so far" starts invariant and
leaves the body varying over the rows' axis, which ``lax.while_loop`` refuses.  :func:`while_loop` and
:func:`cond` cast the initial carries and the branches' outputs to vary over the axes the other side
varies over (``lax.pcast(..., to="varying")``, a change of type, not of value), found by tracing the
body and the branches abstractly (``jax.eval_shape``).  Outside ``shard_map`` (nothing varies), and
with JAX versions without ``lax.pcast``, they are ``lax.while_loop`` and ``lax.cond`` themselves.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax import lax

__all__ = ["while_loop", "cond"]

_HAS_PCAST = hasattr(lax, "pcast") and hasattr(jax, "typeof")


def _varying(x: Any) -> frozenset:
    """The manual mesh axes a value (or an abstract value from ``jax.eval_shape``) varies over."""
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()) or ())


def _cast(x: Any, axes: frozenset) -> Any:
    """``x`` varying over ``axes`` too."""
    missing = tuple(sorted(axes - _varying(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


def _any_varying(tree: Any) -> bool:
    return any(_varying(leaf) for leaf in jax.tree.leaves(tree))


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init: Any, like: Any) -> Any:
    """``lax.while_loop(cond_fun, body_fun, init)`` with each initial carry cast to vary over the mesh axes
    that the body's output for it varies over (a fixed point: each round can only add axes).  ``like``:
    the values the body reads besides the carries (the rows); where neither they nor the carries vary over
    any axis (not inside ``shard_map``), no abstract trace is made."""
    if not _HAS_PCAST or not (_any_varying(like) or _any_varying(init)):
        return lax.while_loop(cond_fun, body_fun, init)
    state = init
    for _ in range(8):  # at most one round per mesh axis, and one to see nothing change
        out = jax.eval_shape(body_fun, state)
        cast = jax.tree.map(lambda s, o: _cast(s, _varying(o)), state, out)
        if all(_varying(a) == _varying(b) for a, b in zip(jax.tree.leaves(cast), jax.tree.leaves(state))):
            break
        state = cast
    return lax.while_loop(cond_fun, body_fun, state)


def cond(pred: Any, true_fun: Callable[[Any], Any], false_fun: Callable[[Any], Any], operand: Any, like: Any) -> Any:
    """``lax.cond(pred, true_fun, false_fun, operand)`` with each output of the two branches cast to vary over
    the mesh axes that either branch's varies over; ``like`` as for :func:`while_loop`."""
    if not _HAS_PCAST or not (_any_varying(like) or _any_varying(operand)):
        return lax.cond(pred, true_fun, false_fun, operand)
    out_t = jax.eval_shape(true_fun, operand)
    out_f = jax.eval_shape(false_fun, operand)
    axes = jax.tree.map(lambda a, b: _varying(a) | _varying(b), out_t, out_f)

    def wrap(fun: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda x: jax.tree.map(_cast, fun(x), axes)

    return lax.cond(pred, wrap(true_fun), wrap(false_fun), operand)
