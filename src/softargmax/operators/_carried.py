r"""A user's generator across the boundary of the ``torch.library`` operators, by a name valid in this process.

The operators of :mod:`softargmax.operators._library_ops` take a divergence as a string and a float
(their schemas hold no Python object): a built-in generator by its registry name and parameter
(:func:`softargmax.divergences.spec_of`), from which :func:`~softargmax.divergences.get_divergence`
rebuilds it.  A :class:`~softargmax.divergences.CustomDivergence`, or a user's subclass of
:class:`~softargmax.divergences.Divergence`, has no such name: :func:`carried_name` gives it one,
``"user:<n>:<its name>"``, and keeps a weak reference to the object under that name, which
:func:`carried_divergence` looks up when the operator runs (in the same process).  While
``torch.compile`` traces, the name is a constant of the graph, and the compiler guards the
object's identity: another object is another name and another graph.  An object created inside the traced
function is refused with a ``ValueError`` (the tracer's stand-in for it is not built yet).

A name outlives nothing: an exported program that records one runs (and decomposes) in the process
that holds the object; elsewhere, or once the object is freed, :func:`carried_divergence` raises.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from typing import Optional

from ..divergences import Divergence

__all__ = ["PREFIX", "carried_name", "carried_divergence"]

#: the names :func:`carried_name` gives begin with it (no registry name holds a colon)
PREFIX = "user:"

_objects: "weakref.WeakValueDictionary[str, Divergence]" = weakref.WeakValueDictionary()
_kept: dict[str, Divergence] = {}  # objects that take no weak reference (a class with __slots__), kept alive
_names: dict[int, str] = {}  # id(object) -> its name (checked against the object: an id is reused once freed)
_counter = itertools.count()


def _lookup(name: str) -> Optional[Divergence]:
    return _kept.get(name) or _objects.get(name)


def _made_while_tracing(divergence: Divergence) -> bool:
    """Whether ``torch.compile``'s tracer created ``divergence`` inside the region it traces: it then stands for
    the object with one that has not run ``__init__`` (the attributes set there are pending side effects of the
    graph), so the operator would call the generator's functions on a half-built object."""
    convert = sys.modules.get("torch._dynamo.symbolic_convert")
    new_object = getattr(sys.modules.get("torch._dynamo.variables.base"), "AttributeMutationNew", None)
    if convert is None or new_object is None:  # nothing traces: torch._dynamo was never imported
        return False
    try:
        tx = convert.InstructionTranslator.current_tx()
        tracked = tx.output.side_effects.id_to_variable.get(id(divergence)) if tx is not None else None
    except Exception:  # another PyTorch's internals, or no frame being traced: nothing to check with
        return False
    return isinstance(getattr(tracked, "mutation_type", None), new_object)


def _name_of(divergence: Divergence) -> str:
    name = _names.get(id(divergence))
    if name is not None and _lookup(name) is divergence:
        return name
    if _made_while_tracing(divergence):
        raise ValueError(
            f"divergence: a {type(divergence).__name__} created inside the function that torch.compile or "
            "torch.export traces cannot cross the library's operators (the tracer has not built the object yet); "
            "create it once outside that function (e.g. in the module's __init__) and use it there")
    name = f"{PREFIX}{next(_counter)}:{getattr(divergence, 'name', type(divergence).__name__)}"
    key = id(divergence)
    try:
        _objects[name] = divergence
        weakref.finalize(divergence, _names.pop, key, None)  # forget the id once the object is freed
    except TypeError:  # no weak reference to it
        _kept[name] = divergence
    _names[key] = name
    return name


#: the tracer calls it as Python and records its result as a constant (guarding the object): the mark that
#: ``torch.compiler.assume_constant_result`` sets, set here because calling that imports ``torch._dynamo`` (and
#: with it sympy, numpy and Triton, about a second) at ``import softargmax``; the fullgraph tests of user
#: generators fail if a PyTorch reads another mark
_name_of._dynamo_marked_constant = True  # type: ignore[attr-defined]  # a new attribute of a function
_traced_name_of = _name_of


def carried_name(divergence: Divergence) -> str:
    """The name under which an operator carries ``divergence`` (the same object, the same name).

    Args:
        divergence: a :class:`~softargmax.divergences.Divergence` that the registry cannot rebuild.

    Returns:
        ``"user:<n>:<divergence.name>"``, which :func:`carried_divergence` maps back to ``divergence``.

    Examples:
        >>> import torch, softargmax as sa
        >>> from softargmax.operators._carried import carried_divergence, carried_name
        >>> kl = sa.CustomDivergence(f=lambda u: torch.special.xlogy(u, u), f_prime=lambda u: torch.log(u) + 1,
        ...                          conj=lambda v: torch.exp(v - 1), conj_prime=lambda v: torch.exp(v - 1),
        ...                          name="my_kl")
        >>> name = carried_name(kl)
        >>> name.startswith("user:") and name.endswith(":my_kl") and carried_name(kl) == name
        True
        >>> carried_divergence(name) is kl
        True
    """
    return _traced_name_of(divergence)


def carried_divergence(name: str) -> Divergence:
    """The divergence that :func:`carried_name` named ``name``.

    Raises:
        ValueError: no object of this process holds that name (freed, or a program from another process).
    """
    divergence = _lookup(name)
    if divergence is None:
        raise ValueError(
            f"divergence {name!r}: the user-defined generator that this compiled or exported graph refers to is "
            "not alive in this process (it was freed, or the graph was saved elsewhere); a graph that calls a "
            "CustomDivergence or a Divergence subclass runs only in the process that holds the object")
    return divergence
