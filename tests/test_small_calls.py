"""The small calls' fast path (softargmax.operators._small) and the C library's small entries.

The fast path must be invisible: bit for bit the general path's output and gradient (the general
path runs when the fast path is bypassed), on edge rows (masks, all-masked, NaN and +inf rows,
ties, extreme scales), in float32 and float64, for every operator it takes; its gradient is the
Jacobian-vector product of the float64 reference; a second derivative raises as the general path's;
and the CPython entries compute what the ctypes entries compute.
"""

import ctypes

import pytest
import torch
from conftest import edge_rows

import softargmax as sa
from softargmax.backends.cpu import rows as _cpu_rows
from softargmax.operators import _small
from softargmax.operators import entmax as _entmax

pytestmark = pytest.mark.skipif(not _cpu_rows.available(), reason="no C compiler: the fused solver is not built")

OPS = {
    "sparsemax": sa.sparsemax,
    "entmax15": sa.entmax15,
    "entmax_1.3": lambda x: sa.entmax(x, 1.3),
    "entmax_1.7": lambda x: sa.entmax(x, 1.7),
    "entmax_2.0": lambda x: sa.entmax(x, 2.0),
}


def _bits(t):
    return t.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


def _output_and_gradient(f, x, w):
    p = f(x)
    xg = x.clone().requires_grad_(True)
    g = torch.autograd.grad((f(xg) * w).sum(), xg)[0]
    return p, g


def _general_path(monkeypatch, f, x, w):
    with monkeypatch.context() as m:
        m.setattr(_entmax, "mapping", lambda *args: None)
        return _output_and_gradient(f, x, w)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(9, 16), (9, 3, 40), (9, 300)])
def test_fast_path_is_bit_for_bit_the_general_path(monkeypatch, name, dtype, shape):
    f = OPS[name]
    k = shape[-1]
    x = edge_rows(k, dtype, torch.Generator().manual_seed(k)).repeat(1, *shape[1:-1], 1).reshape(9, *shape[1:])
    w = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    calls = []
    real = _small._apply
    monkeypatch.setattr(_small, "_apply", lambda *args: calls.append(1) or real(*args))
    p, g = _output_and_gradient(f, x, w)
    assert calls, "the fast path did not take the gradient call"
    p_ref, g_ref = _general_path(monkeypatch, f, x, w)
    assert torch.equal(_bits(p), _bits(p_ref))
    assert torch.equal(_bits(g), _bits(g_ref))


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_1.3"])
def test_fast_gradient_is_the_float64_jacobian_product(name):
    """The C backward against autograd through the float64 PyTorch path (an independent implementation)."""
    f = OPS[name]
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(3)) * 3
    x[1, :8] = -float("inf")
    w = torch.randn(6, 16, generator=torch.Generator().manual_seed(4))
    _, g = _output_and_gradient(f, x, w)
    old = _cpu_rows.set_enabled(False)
    try:
        _, g_ref = _output_and_gradient(f, x.double(), w.double())
    finally:
        _cpu_rows.set_enabled(old)
    torch.testing.assert_close(g, g_ref.float(), atol=2e-6, rtol=1e-5)
    assert torch.equal(g[1, :8], torch.zeros(8))


def test_nan_rows_give_nan_gradients_and_other_rows_are_untouched():
    x = torch.randn(3, 16) * 3
    x[1, 4] = float("nan")
    xg = x.clone().requires_grad_(True)
    g = torch.autograd.grad((sa.entmax15(xg) * torch.randn(3, 16)).sum(), xg)[0]
    assert bool(g[1].isnan().all()) and bool(g[[0, 2]].isfinite().all())


@pytest.mark.parametrize("fast", [True, False])
def test_second_derivative_raises_as_the_general_path(monkeypatch, fast):
    if not fast:
        monkeypatch.setattr(_entmax, "mapping", lambda *args: None)
    x = torch.randn(4, 16, requires_grad=True)
    (g,) = torch.autograd.grad((sa.entmax15(x) ** 2).sum(), x, create_graph=True)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


def test_unusual_calls_take_the_general_path():
    """What the fast path leaves alone returns None, and the public function still checks and computes it."""
    x = torch.randn(4, 16)
    op = _entmax._ENTMAX15
    assert _small.mapping(x, -1, op) is not None
    assert _small.mapping(x, 0, op) is None  # another dim
    assert _small.mapping(x.t(), -1, op) is None  # not contiguous
    assert _small.mapping(x.half(), -1, op) is None
    assert _small.mapping(x, True, op) is None  # a bool dim: the general path's TypeError
    assert _small.mapping(torch.empty(0, 16), -1, op) is None
    assert _small.mapping(torch.tensor(1.0), -1, op) is None
    with pytest.raises(TypeError, match="dim"):
        sa.entmax15(x, True)
    with pytest.raises(ValueError, match="dim"):
        sa.entmax15(x, 2)
    old = _cpu_rows.set_enabled(False)
    try:
        assert _small.mapping(x, -1, op) is None
    finally:
        _cpu_rows.set_enabled(old)
    assert _entmax._entmax_mapping(1.0) is None and _entmax._entmax_mapping(2.5) is None


def test_ctypes_entries_compute_what_the_python_entries_compute(tmp_path, monkeypatch):
    """The library built without Python's headers (its ctypes entries, the fallback) writes the same bits."""
    monkeypatch.setattr(_cpu_rows, "PYTHON_ENTRIES", False)
    monkeypatch.setenv("SOFTARGMAX_CACHE_DIR", str(tmp_path))
    path = _cpu_rows._build()
    lib = ctypes.CDLL(str(path))
    assert _cpu_rows._python_entries(path, lib) is None
    fn = lib.sa_map_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_double,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    x = edge_rows(16, torch.float32, torch.Generator().manual_seed(5))
    outs = []
    for kernel in (fn, _cpu_rows.MAP_KERNELS[torch.float32]):
        p, s, sc = torch.empty_like(x), torch.empty_like(x), torch.empty(9, 1)
        kernel(x.data_ptr(), 9, 16, 0, 0.3, p.data_ptr(), s.data_ptr(), sc.data_ptr(), 1)
        outs.append((p, s, sc))
    for a, b in zip(*outs):
        assert torch.equal(_bits(a), _bits(b))
