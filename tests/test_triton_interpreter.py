"""softargmax.backends.triton.interpreter: the tree reduction installed in Triton's interpreter gives what
NumPy gives for multi-operand reductions with user combine functions (sums, minima, a leftmost argmax, which
is associative but not commutative), over either axis of a tile, over the whole tile, with and without
``keep_dims``; and the memoized dtype lookup and builtin patching leave kernels' results as they were."""

import os

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":  # conftest sets it before Triton is imported
    pytest.skip("TRITON_INTERPRET is not 1", allow_module_level=True)

import triton.language as tl  # noqa: E402

from softargmax.backends.triton import interpreter  # noqa: E402


@triton.jit
def _sum_min(a0, b0, a1, b1):
    return a0 + a1, tl.minimum(b0, b1)


@triton.jit
def _argmax_left(v0, i0, v1, i1):
    # the larger value; on a tie the left one (its smaller index): associative, not commutative
    take_right = v1 > v0
    return tl.where(take_right, v1, v0), tl.where(take_right, i1, i0)


@triton.jit
def _reduce_kernel(X, SUM0, MIN0, SUM1, MIN1, ALL, ARGV, ARGI, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(X + r[:, None] * C + c[None, :])
    s0, m0 = tl.reduce((x, x), 0, _sum_min)
    tl.store(SUM0 + c, s0)
    tl.store(MIN0 + c, m0)
    s1, m1 = tl.reduce((x, x), 1, _sum_min, keep_dims=True)
    tl.store(SUM1 + r[:, None], s1)
    tl.store(MIN1 + r[:, None], m1)
    total, low = tl.reduce((x, x), None, _sum_min)
    tl.store(ALL, total)
    tl.store(ALL + 1, low)
    idx = r[:, None] * C + c[None, :]
    v, i = tl.reduce((x, idx), 1, _argmax_left)
    tl.store(ARGV + r, v)
    tl.store(ARGI + r, i)


@pytest.mark.parametrize("shape", [(4, 8), (1, 16), (8, 2)])
def test_multi_operand_reductions_match_numpy(shape):
    assert interpreter.install()
    R, C = shape
    g = torch.Generator().manual_seed(R * C)
    x = torch.randint(-4, 5, (R, C), generator=g).float()  # small integers: sums exact in any order, many ties
    out = {name: torch.empty(n) for name, n in (("s0", C), ("m0", C), ("s1", R), ("m1", R), ("all", 2), ("argv", R))}
    argi = torch.empty(R, dtype=torch.int32)
    _reduce_kernel[(1,)](x, out["s0"], out["m0"], out["s1"], out["m1"], out["all"], out["argv"], argi, R=R, C=C)
    a = x.numpy()
    np.testing.assert_array_equal(out["s0"].numpy(), a.sum(0))
    np.testing.assert_array_equal(out["m0"].numpy(), a.min(0))
    np.testing.assert_array_equal(out["s1"].numpy(), a.sum(1))
    np.testing.assert_array_equal(out["m1"].numpy(), a.min(1))
    np.testing.assert_array_equal(out["all"].numpy(), [a.sum(), a.min()])
    np.testing.assert_array_equal(out["argv"].numpy(), a.max(1))
    # the leftmost maximum of each row (np.argmax takes the first): the tree keeps the left operand left
    np.testing.assert_array_equal(argi.numpy(), np.arange(R) * C + a.argmax(1))


def test_install_is_idempotent_and_reports_itself():
    assert interpreter.install() and interpreter.install()
    from triton.runtime import interpreter as it

    assert it.ReduceOps.generic_reduce is interpreter._tree_reduce
    assert it._get_np_dtype(tl.float32) == np.dtype(np.float32) and it._get_np_dtype(tl.bfloat16) == np.dtype(np.uint16)
