"""alpha_relu: the formula, its link to entmax, gradients."""

import math

import pytest
import torch

import softargmax as sa
from softargmax.divergences import AlphaDivergence
from softargmax.solvers.threshold import solve

F64 = torch.float64


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
def test_formula(alpha):
    x = torch.randn(5, 17, dtype=F64) * 3
    tau = 0.3
    ref = torch.clamp((alpha - 1) * x - tau, min=0) ** (1 / (alpha - 1))
    torch.testing.assert_close(sa.alpha_relu(x, alpha, tau), ref)


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0])
def test_with_entmax_threshold_reproduces_entmax(alpha):
    """The f-divergence threshold τ_f maps to α-ReLU's τ as τ_e = (α-1) τ_f - 1."""
    x = torch.randn(6, 50, dtype=F64) * 2
    tau_f = solve(x, AlphaDivergence(alpha)).tau
    tau_e = (alpha - 1) * tau_f - 1
    torch.testing.assert_close(sa.alpha_relu(x, alpha, tau_e), sa.entmax(x, alpha))


@pytest.mark.parametrize("alpha", [1.5, 1.7, 2.0, 2.5])
def test_gradcheck(alpha):
    x = (torch.randperm(40).reshape(4, 10).to(F64) / 7 / math.pi).requires_grad_()
    tau = torch.tensor([[0.1], [0.2], [0.3], [0.15]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, t: sa.alpha_relu(a, alpha, t), (x, tau), atol=1e-6)


def test_masking_dtypes_and_errors():
    x = torch.tensor([[-math.inf, 1.0, 3.0]], requires_grad=True)
    p = sa.alpha_relu(x, 1.5, 0.0)
    p.sum().backward()
    assert p[0, 0] == 0 and x.grad[0, 0] == 0 and torch.isfinite(x.grad).all()
    h = torch.randn(4, 8, dtype=torch.bfloat16)
    assert sa.alpha_relu(h).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="alpha must be finite and > 1"):
        sa.alpha_relu(x, 1.0)
    with pytest.raises(ValueError, match="tau of shape"):
        sa.alpha_relu(x, 1.5, torch.zeros(5))


def test_nan_tau_is_refused():
    with pytest.raises(ValueError, match=r"tau must be a finite number.*got nan"):
        sa.alpha_relu(torch.randn(3), 1.5, float("nan"))
