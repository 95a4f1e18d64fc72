r"""The regularizer's constants that a loss call needs, evaluated once per divergence: :math:`f(0)` and
:math:`\Omega` of a one-hot target.

With :math:`q = 1`, :math:`\Omega(y) = \sum_j f(y_j)` (times the temperature, applied by the caller), and
the losses sum :math:`f(y_j) - f(0)` over the entries :math:`y_j > 0` only (the :math:`f(0)` terms of
:math:`\Omega(y)` and :math:`\Omega(p)` cancel).  For a class index :math:`c` the target is
:math:`e_c`, so

.. math::

    \Omega(e_c) - k f(0) = f(1) - f(0),

the same constant for every row: one evaluation of :math:`f` per divergence and dtype instead of three
tensor evaluations per call.  Both values are computed by the very expressions the per-row path used
(:math:`f` on a tensor of the compute dtype, less the float64 :math:`f(0)`), so they are the same
numbers, bit for bit.  Built-in divergences are cached by :func:`~softargmax.divergences.spec_of`; others
(a user's generator, a tensor α) are evaluated on every call, as before.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..divergences import Divergence, spec_of

__all__ = ["f_at_zero", "one_hot_omega"]

#: the values by ``(spec, dtype)`` (``dtype`` None: f(0)); cleared when it grows past :data:`_MAX_ENTRIES`
#: (many distinct α, one per step of a schedule)
_CACHE: dict[tuple[tuple[str, float], Optional[torch.dtype]], float] = {}
_MAX_ENTRIES = 256


def _cached(div: Divergence, dtype: Optional[torch.dtype]) -> tuple[Optional[tuple], Optional[float]]:
    spec = spec_of(div)
    if spec is None:
        return None, None
    key = (spec, dtype)
    return key, _CACHE.get(key)


def _store(key: Optional[tuple], value: float) -> float:
    if key is not None:
        if len(_CACHE) >= _MAX_ENTRIES:
            _CACHE.clear()
        _CACHE[key] = value
    return value


def f_at_zero(div: Divergence) -> float:
    """:math:`f(0)` of a generator with a scalar parameter, in float64 (``inf`` for the generators with a pole at 0)."""
    key, value = _cached(div, None)
    if value is not None:
        return value
    return _store(key, float(div.f(torch.zeros((), dtype=torch.float64))))


def one_hot_omega(div: Divergence, dtype: torch.dtype) -> float:
    r""":math:`f(1) - f(0)`, the sum :math:`\sum_{y_j > 0} [f(y_j) - f(0)]` of a one-hot target, with
    :math:`f(1)` evaluated in ``dtype`` and the difference rounded to ``dtype`` (as a ``[R]`` tensor of
    such targets holds it).  ``f(0)`` must be finite."""
    key, value = _cached(div, dtype)
    if value is not None:
        return value
    # read on the host as a 0-d float64 tensor (exact): a constant made on the host, like f(0) above, which the
    # synchronization counters of the tests tell from a device value
    diff = div.f(torch.ones(1, dtype=dtype)) - f_at_zero(div)
    return _store(key, float(diff.to(torch.float64).reshape(())))
