"""The argument checks of ``softargmax._utils.checks`` against PyTorch's own rules.

``check_broadcastable`` compares plain sizes in Python (``torch.broadcast_shapes`` is a Python
function of ~10 µs, most of a small call of α-ReLU with a tensor τ); here it must accept exactly
the shapes for which ``torch.broadcast_shapes(t, x) == x``, on every pair of small shapes.  A
one-element τ is checked for finiteness as a number: the same answers as the tensor reduction.
"""

import itertools
import math

import pytest
import torch

from softargmax._utils.checks import check_broadcastable, check_tau

SIZES = (0, 1, 2, 3)


def _shapes(max_dim):
    for d in range(max_dim + 1):
        yield from itertools.product(SIZES, repeat=d)


def _pytorch_says(ts, xs):
    try:
        return torch.broadcast_shapes(ts, xs) == torch.Size(xs)
    except RuntimeError:
        return False


def test_check_broadcastable_is_pytorchs_rule():
    xs_all = list(_shapes(3))
    checked = accepted = 0
    for ts in _shapes(4):
        t = torch.empty(ts, device="meta")
        for xs in xs_all:
            x = torch.empty(xs, device="meta")
            expect = _pytorch_says(ts, xs)
            if expect:
                check_broadcastable(t, x, "t")
                accepted += 1
            else:
                with pytest.raises(ValueError, match="t of shape"):
                    check_broadcastable(t, x, "t")
            checked += 1
    assert checked == 341 * 85 and 0 < accepted < checked


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_tau_finiteness_one_value_and_many(dtype):
    x = torch.zeros(2, 3, dtype=dtype)
    for value in (0.0, -2.5, 1e30, math.inf, -math.inf, math.nan):
        for shape in ((), (1,), (1, 1), (2, 1), (1, 3)):
            tau = torch.full(shape, value, dtype=torch.float32).to(dtype)  # 1e30 overflows to inf in half
            finite = bool(torch.isfinite(tau).all())
            if finite:
                assert check_tau(tau, x) is tau
            else:
                with pytest.raises(ValueError, match="tau must be finite"):
                    check_tau(tau, x)
