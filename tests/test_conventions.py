"""The conventions, for every normalized operator: dims, dtypes, masking, NaN, no in-place, errors."""

import math

import pytest
import torch
from conftest import ALL_DIVERGENCES, div_id
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import softargmax as sa

F64 = torch.float64

OPS = {
    "sparsemax": lambda x, dim=-1: sa.sparsemax(x, dim),
    "entmax15": lambda x, dim=-1: sa.entmax15(x, dim),
    "entmax1.3": lambda x, dim=-1: sa.entmax(x, 1.3, dim),
    "entmax-tensor-alpha": lambda x, dim=-1: sa.entmax(x, torch.tensor(1.7, dtype=torch.float64).reshape([1] * x.dim()), dim),
    "softmax-alpha1": lambda x, dim=-1: sa.entmax(x, 1.0, dim),
    "entmax0.5": lambda x, dim=-1: sa.entmax(x, 0.5, dim),
    "normmax2.5": lambda x, dim=-1: sa.normmax(x, 2.5, dim),
    "normmax-tensor-alpha": lambda x, dim=-1: sa.normmax(x, torch.tensor(1.5, dtype=torch.float64).reshape([1] * x.dim()), dim),
}
for _d in ALL_DIVERGENCES:
    OPS["f-" + div_id(_d)] = (lambda d: lambda x, dim=-1: sa.f_softargmax(x, d[0], dim=dim, **d[1]))(_d)
    OPS["fq-" + div_id(_d)] = (lambda d: lambda x, dim=-1: sa.f_softargmax(
        x, d[0], q=torch.linspace(0.5, 2.0, x.shape[dim], dtype=torch.float64).reshape(
            [-1 if i == dim % x.dim() else 1 for i in range(x.dim())]), dim=dim, **d[1]))(_d)

NAMES = sorted(OPS)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_any_dim(name, dim):
    op = OPS[name]
    x = torch.randn(5, 6, 7, dtype=F64) * 2
    ref = op(x.movedim(dim, -1).contiguous()).movedim(-1, dim)
    torch.testing.assert_close(op(x, dim=dim), ref)
    torch.testing.assert_close(op(x, dim=dim).sum(dim), torch.ones(x.sum(dim).shape, dtype=F64))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_in_and_out(name, dtype):
    op = OPS[name]
    x = (torch.randn(4, 300) * 2).to(dtype).requires_grad_()
    p = op(x)
    assert p.dtype == dtype
    ref = op(x.detach().double())
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(p.double(), ref, atol=tol, rtol=0)
    (g,) = torch.autograd.grad(p[:, 0].sum(), x)
    assert g.dtype == dtype and torch.isfinite(g).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("k", [7, 512])
def test_masked_entries_and_rows(name, k):
    op = OPS[name]
    x = torch.randn(4, k, dtype=F64) * 2
    x[0, ::2] = -math.inf      # half masked
    x[1] = -math.inf           # fully masked row
    x[2, 1:] = -math.inf       # a single live entry
    x = x.requires_grad_()
    p = op(x)
    assert torch.isfinite(p).all()
    assert (p[0, ::2] == 0).all() and (p[1] == 0).all()
    torch.testing.assert_close(p[2, 0], torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(p[[0, 2, 3]].sum(-1), torch.ones(3, dtype=F64))
    # the unmasked part equals the operator on the unmasked entries alone (masked = excluded)
    if not name.startswith("fq-"):  # (those build q from the row length)
        torch.testing.assert_close(p[0, 1::2], op(x.detach()[0:1, 1::2])[0])
    (g,) = torch.autograd.grad((p * torch.randn_like(p)).sum(), x)
    assert torch.isfinite(g).all()
    assert (g[0, ::2] == 0).all() and (g[1] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_nan_stays_in_its_row_and_no_inplace(name):
    op = OPS[name]
    x = torch.randn(3, 300, dtype=F64)
    x[1, 7] = math.nan
    x0 = x.clone()
    p = op(x)
    assert torch.isnan(p[1]).all()
    assert torch.isfinite(p[[0, 2]]).all()
    torch.testing.assert_close(p[[0, 2]], op(x0[[0, 2]]))
    assert torch.equal(torch.isnan(x), torch.isnan(x0)) and torch.equal(x.nan_to_num(), x0.nan_to_num())


@given(
    arr=arrays(
        dtype="float64",
        shape=st.tuples(st.integers(1, 4), st.integers(1, 40)),
        elements=st.one_of(st.floats(-50, 50), st.just(-math.inf)),
    ),
    name=st.sampled_from(NAMES),
)
@settings(max_examples=150, deadline=None)
def test_property_distribution(arr, name):
    """Any finite/masked input gives a distribution on the unmasked entries (or zeros if all masked)."""
    x = torch.tensor(arr)
    p = OPS[name](x)
    assert torch.isfinite(p).all()
    assert (p >= 0).all()
    assert (p[x == -math.inf] == 0).all()
    live = (x > -math.inf).any(-1)
    sums = p.sum(-1)
    torch.testing.assert_close(sums[live], torch.ones_like(sums[live]), atol=1e-9, rtol=0)
    assert (sums[~live] == 0).all()
    if name.startswith("fq-"):
        return  # with a non-uniform q, order is not preserved (the prior weighs in)
    # order preserving: a larger score never gets a smaller probability
    _, idx = torch.sort(torch.where(x > -math.inf, x, torch.full_like(x, -1e300)), -1)
    ps = p.gather(-1, idx)
    assert (ps[..., 1:] >= ps[..., :-1] - 1e-12).all()


@given(shift=st.floats(-1e3, 1e3), seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_property_shift_invariance_of_sparse_maps(shift, seed):
    x = torch.randn(3, 50, dtype=F64, generator=torch.Generator().manual_seed(seed)) * 3
    for op in (sa.sparsemax, sa.entmax15, lambda t: sa.entmax(t, 1.4)):
        torch.testing.assert_close(op(x + shift), op(x), atol=1e-9, rtol=0)


def test_argument_errors():
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match="x must have a floating-point dtype"):
        sa.sparsemax(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        sa.entmax15([[1.0, 2.0]])
    with pytest.raises(ValueError, match="dim=2 is out of range"):
        sa.sparsemax(x, dim=2)
    with pytest.raises(TypeError, match="dim must be an int"):
        sa.sparsemax(x, dim=1.0)
    with pytest.raises(ValueError, match="alpha must be finite and > 0"):
        sa.entmax(x, 0.0)
    with pytest.raises(ValueError, match="alpha must be finite and > 0"):
        sa.entmax(x, torch.tensor([[-0.1], [1.5]]))
    with pytest.raises(ValueError, match="alpha of shape"):
        sa.entmax(x, torch.full((2, 3), 1.5))
    with pytest.raises(ValueError, match="scalar"):
        sa.sparsemax(torch.tensor(1.0))


def test_empty_inputs():
    for op in (sa.sparsemax, sa.entmax15, lambda t: sa.entmax(t, 1.3), lambda t: sa.f_softargmax(t, "jensen_shannon")):
        assert op(torch.randn(0, 5)).shape == (0, 5)
        assert op(torch.randn(3, 0)).shape == (3, 0)


def test_deterministic():
    x = torch.randn(64, 4096) * 3
    for op in (sa.sparsemax, sa.entmax15, lambda t: sa.entmax(t, 1.3)):
        assert torch.equal(op(x), op(x))
