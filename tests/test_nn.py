"""Modules: same results as the functions, learnable alpha and q."""

import math

import pytest
import torch

import softargmax as sa
from softargmax import nn as snn

F64 = torch.float64


def test_modules_match_functions():
    x = torch.randn(3, 4, 20)
    torch.testing.assert_close(snn.Sparsemax(dim=1)(x), sa.sparsemax(x, dim=1))
    torch.testing.assert_close(snn.Entmax15()(x), sa.entmax15(x))
    torch.testing.assert_close(snn.Entmax(1.3)(x), sa.entmax(x, 1.3))
    torch.testing.assert_close(snn.AlphaReLU(1.5, 0.2)(x), sa.alpha_relu(x, 1.5, 0.2))
    q = torch.rand(20) + 0.5
    torch.testing.assert_close(snn.FSoftargmax("jensen_shannon", q=q)(x), sa.f_softargmax(x, "jensen_shannon", q=q))
    torch.testing.assert_close(snn.FSoftargmax("alpha", alpha=1.5)(x), sa.entmax15(x))


def test_learnable_alpha_per_head_trains_and_stays_in_range():
    torch.manual_seed(0)
    m = snn.Entmax(alpha=torch.full((4, 1, 1), 1.5), learn_alpha=True)
    assert torch.allclose(m.alpha, torch.full((4, 1, 1), 1.5))
    opt = torch.optim.SGD(m.parameters(), lr=5.0)
    x = torch.randn(2, 4, 5, 9)
    target = sa.entmax(x, 1.9)  # a sparser target pushes alpha up
    for _ in range(30):
        opt.zero_grad()
        loss = ((m(x) - target) ** 2).sum()
        loss.backward()
        assert m.alpha_logit.grad is not None and torch.isfinite(m.alpha_logit.grad).all()
        opt.step()
        a = m.alpha.detach()
        assert ((a > 1) & (a < 2)).all()
    assert (m.alpha.detach() > 1.6).all()


def test_scalar_learnable_alpha_and_errors():
    # a loss that depends on α (``y.sum()`` is constant: its α-gradient is 0 whatever the code does),
    # compared with central finite differences in the reparametrized α
    torch.manual_seed(0)
    x = torch.randn(3, 7, dtype=torch.float64) * 2
    m = snn.Entmax(alpha=1.2, learn_alpha=True, dtype=torch.float64)

    def loss():
        return (m(x) ** 2).sum() + m(x)[:, 0].sum()

    loss().backward()
    g = m.alpha_logit.grad
    assert g is not None and g.abs() > 1e-3
    eps = 1e-6
    with torch.no_grad():
        w0 = m.alpha_logit.clone()
        m.alpha_logit.copy_(w0 + eps)
        up = loss()
        m.alpha_logit.copy_(w0 - eps)
        down = loss()
        m.alpha_logit.copy_(w0)
    torch.testing.assert_close(g, (up - down) / (2 * eps), rtol=1e-5, atol=1e-8)
    with pytest.raises(ValueError, match="strictly inside"):
        snn.Entmax(alpha=2.0, learn_alpha=True)
    with pytest.raises(ValueError, match="alpha must be finite and > 0"):
        snn.Entmax(alpha=0.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -1.0])
@pytest.mark.parametrize("learn_q", [False, True])
def test_fsoftargmax_refuses_what_f_softargmax_refuses_in_q(bad, learn_q):
    q = torch.tensor([1.0, bad, 1.0])
    with pytest.raises(ValueError, match="q must be finite and strictly positive") as functional:
        sa.f_softargmax(torch.randn(2, 3), "kl", q=q)
    with pytest.raises(ValueError, match="q must be finite and strictly positive") as module:
        snn.FSoftargmax("kl", q=q, learn_q=learn_q)
    assert str(module.value) == str(functional.value)
    with pytest.raises(TypeError, match="q must be None or a positive tensor"):
        snn.FSoftargmax("kl", q=[1.0, 1.0, 1.0], learn_q=learn_q)


def test_learnable_q():
    m = snn.FSoftargmax("squared_hellinger", q=torch.ones(6), learn_q=True)
    x = torch.randn(5, 6)
    m(x)[:, 0].sum().backward()
    assert m.log_q.grad is not None and torch.isfinite(m.log_q.grad).all()
    with pytest.raises(ValueError, match="learn_q=True needs"):
        snn.FSoftargmax("kl", learn_q=True)


def test_a_learnable_alpha_range_must_stay_above_zero_even_when_the_sigmoid_saturates():
    """α = alpha_min is reached when the sigmoid rounds to 0, so alpha_min = 0 would give α = 0, which α-entmax
    refuses: the constructor refuses it, naming the argument."""
    with pytest.raises(ValueError, match="alpha_min, alpha_max must satisfy 0 < alpha_min"):
        sa.nn.Entmax(alpha=0.5, alpha_min=0.0, learn_alpha=True)
    m = sa.nn.Entmax(alpha=0.5, alpha_min=0.25, learn_alpha=True)
    with torch.no_grad():
        m.alpha_logit.fill_(-200.0)  # sigmoid(-200) = 0 in float32: α = alpha_min exactly
    assert float(m.alpha) == 0.25
    p = m(torch.randn(3, 6))
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(3))


def test_loss_modules_show_their_mapping_and_options():
    """The loss modules' repr: the mapping, then each option given, comma-separated (no trailing separator)."""
    assert repr(snn.Entmax15Loss()) == "Entmax15Loss(mapping='entmax15')"
    assert repr(snn.SparsemaxLoss(ignore_index=3)) == "SparsemaxLoss(mapping='sparsemax', ignore_index=3)"
    assert repr(snn.FenchelYoungLoss("entmax", alpha=1.3)) == "FenchelYoungLoss(mapping='entmax', alpha=1.3)"
