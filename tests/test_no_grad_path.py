"""Eager calls that need no gradient compute the forward without the autograd function.

Under ``torch.no_grad``, ``torch.inference_mode``, or when no argument requires a gradient, the
normalized mappings and α-ReLU skip ``autograd.Function.apply`` and its saved context
(:func:`softargmax._utils.tracing.without_autograd`), and the C solver writes the output alone.
Here: the outputs equal the autograd path's bit for bit (NaN rows, masks, dims, dtypes, both CPU
solvers); the way is not taken when a gradient is needed (gradients still flow, checked by
gradcheck), nor for tensor subclasses, ``torch.func`` transforms or forward-mode AD, whose
errors stay those of the autograd function.
"""

import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import softargmax as sa
from softargmax.operators import _small
from softargmax.operators import alpha_relu as _alpha_relu_module
from softargmax.operators._autograd import NormalizedMapping

pytestmark = pytest.mark.usefixtures("solver_path")


def _per_row_alpha(x, dim):
    shape = [1] * x.dim()
    shape[0 if dim != 0 else 1] = x.shape[0 if dim != 0 else 1]
    return torch.linspace(1.1, 1.9, math.prod(shape), dtype=x.dtype).reshape(shape)


CALLS = {
    "sparsemax": lambda x, d: sa.sparsemax(x, d),
    "entmax15": lambda x, d: sa.entmax15(x, d),
    "entmax-1.3": lambda x, d: sa.entmax(x, 1.3, d),
    "entmax-2.5": lambda x, d: sa.entmax(x, 2.5, d),  # the PyTorch solver only
    "entmax-per-row": lambda x, d: sa.entmax(x, _per_row_alpha(x, d), d),
    "jensen_shannon": lambda x, d: sa.f_softargmax(x, "jensen_shannon", dim=d),
    "reverse_kl-temperature": lambda x, d: sa.f_softargmax(x, "reverse_kl", temperature=0.5, dim=d),
    "entmax15-temperature": lambda x, d: sa.f_softargmax(x, "alpha", alpha=1.5, temperature=0.7, dim=d),
    "entmax-q": lambda x, d: sa.f_softargmax(x, "alpha", alpha=1.5, q=torch.rand(x.shape[d], generator=torch.Generator().manual_seed(0)).add(0.5).to(x.dtype).reshape([-1] + [1] * (x.dim() - 1 - d % x.dim())), dim=d),
    "alpha_relu-1.5": lambda x, d: sa.alpha_relu(x, 1.5, 0.1),
    "alpha_relu-2": lambda x, d: sa.alpha_relu(x, 2.0, -0.2),
    "alpha_relu-1.3-tensor-tau": lambda x, d: sa.alpha_relu(x, 1.3, torch.full((1,) * x.dim(), 0.3, dtype=x.dtype)),
}
BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    small = torch.randn(4, 8, generator=gen, dtype=torch.float64) * 3
    edge = torch.randn(6, 9, generator=gen, dtype=torch.float64) * 2
    edge[1] = -math.inf
    edge[2, 3] = math.nan
    edge[3, 0] = math.inf
    edge[4, :5] = -math.inf
    edge[5, 2:5] = edge[5, 1]  # ties
    yield "4x8", small.to(dtype), -1
    yield "4x8-dim0", small.to(dtype), 0
    yield "edge", edge.to(dtype), -1
    yield "3x5x7-dim1", torch.randn(3, 5, 7, generator=gen, dtype=torch.float64).mul(3).to(dtype), 1
    yield "noncontiguous", torch.randn(8, 4, generator=gen, dtype=torch.float64).mul(3).to(dtype).t(), -1
    yield "offset", (torch.randn(4, 8, generator=gen, dtype=torch.float64) + 1e4).to(dtype), -1


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    assert torch.equal(a.contiguous().view(BITS[a.dtype]), b.contiguous().view(BITS[b.dtype]))


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_outputs_equal_the_autograd_path_bit_for_bit(name, dtype):
    fn = CALLS[name]
    for _, x, dim in _inputs(dtype):
        reference = fn(x.clone().requires_grad_(True), dim)  # the autograd function
        assert reference.grad_fn is not None
        with torch.no_grad():
            plain = fn(x, dim)
        with torch.inference_mode():
            inference = fn(x, dim)
        grad_mode_on = fn(x, dim)  # nothing requires a gradient
        for out in (plain, inference, grad_mode_on):
            _same(out, reference.detach())
            assert not out.requires_grad and out.grad_fn is None
        assert inference.is_inference() and not plain.is_inference()


class _Count:
    """Count the calls of the autograd functions' ``apply``."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for cls in (NormalizedMapping, _alpha_relu_module.AlphaReLUFunction):
            original = cls.apply

            def counted(*args, _original=original, **kwargs):
                self.calls += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(cls, "apply", counted)
        original_small = _small._apply  # the small calls' autograd function (softargmax.operators._small)

        def counted_small(*args):
            self.calls += 1
            return original_small(*args)

        monkeypatch.setattr(_small, "_apply", counted_small)
        original_relu = _alpha_relu_module._apply  # α-ReLU's: Function.apply less its Python wrapper

        def counted_relu(*args):
            self.calls += 1
            return original_relu(*args)

        monkeypatch.setattr(_alpha_relu_module, "_apply", counted_relu)


@pytest.mark.parametrize("name", list(CALLS))
def test_autograd_function_is_skipped_only_when_no_gradient_is_needed(name, monkeypatch):
    fn = CALLS[name]
    count = _Count(monkeypatch)
    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    with torch.no_grad():
        fn(x.requires_grad_(True), -1)
    with torch.inference_mode():
        fn(x, -1)
    fn(x.detach(), -1)
    assert count.calls == 0
    xg = x.detach().requires_grad_(True)
    y = fn(xg, -1)
    assert count.calls == 1 and y.grad_fn is not None
    # the gradient flows and is right
    assert torch.autograd.gradcheck(lambda t: fn(t, -1), (xg,), atol=1e-7)


def test_a_parameter_that_needs_a_gradient_keeps_the_autograd_function(monkeypatch):
    count = _Count(monkeypatch)
    x = torch.randn(2, 3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    alpha = torch.nn.Parameter(torch.tensor([[1.3], [1.6], [1.9]], dtype=torch.float64))
    tau = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():  # parameters are plain enough: the forward alone
        p_fast = sa.entmax(x, alpha)
        r_fast = sa.alpha_relu(x, 1.5, tau)
    assert count.calls == 0
    p = sa.entmax(x, alpha)  # x needs no gradient, α does
    r = sa.alpha_relu(x, 1.5, tau)
    assert count.calls == 2
    _same(p_fast, p.detach())
    _same(r_fast, r.detach())
    (p * torch.arange(7.0, dtype=torch.float64)).sum().backward()
    r.sum().backward()
    assert alpha.grad is not None and alpha.grad.abs().sum() > 0
    assert tau.grad is not None and tau.grad != 0


def test_tensor_subclasses_keep_the_autograd_function(monkeypatch):
    class Tagged(torch.Tensor):
        pass

    count = _Count(monkeypatch)
    x = torch.randn(3, 5).as_subclass(Tagged)
    with torch.no_grad():
        sa.sparsemax(x)
        sa.alpha_relu(x, 1.5, 0.0)
    assert count.calls == 2


@pytest.mark.parametrize("name", ["sparsemax", "entmax-1.3", "alpha_relu-1.5"])
@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.enable_grad])
def test_transforms_and_forward_ad_keep_the_autograd_functions_errors(name, grad_mode):
    """Without the autograd function, a dual tensor's tangent or a vmap's batch dimension would be
    dropped silently; with it they raise, as before."""
    fn = CALLS[name]
    x = torch.randn(3, 6)
    with grad_mode():
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, torch.ones_like(x))
            with pytest.raises(NotImplementedError, match="jvp"):
                fn(dual, -1)
        with pytest.raises(RuntimeError, match="setup_context"):
            torch.func.vmap(lambda t: fn(t, -1))(x)


def test_modules_under_inference_mode():
    x = torch.randn(2, 4, 10, generator=torch.Generator().manual_seed(3))
    modules = [sa.nn.Sparsemax(), sa.nn.Entmax15(), sa.nn.Entmax(1.3),
               sa.nn.Entmax(torch.tensor([[1.2], [1.4], [1.6], [1.8]]), learn_alpha=True), sa.nn.AlphaReLU(1.5, 0.1)]
    for m in modules:
        expect = m(x).detach()
        with torch.inference_mode():
            got = m(x)
        assert got.is_inference()
        _same(got, expect)
