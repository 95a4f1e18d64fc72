"""Threshold estimation for alpha-ReLU: Tezekbayev et al., 2022, Table 3, Monte Carlo, calibration."""

import math

import pytest
import torch

import softargmax as sa
from softargmax.operators import alpha_relu_tau as T

F64 = torch.float64


@pytest.mark.parametrize("vocab,p_star,tau_hat", [(10000, 0.0184, 0.33), (40000, 0.0171, 0.17), (60000, 0.0169, 0.14)])
def test_table3_of_the_paper(vocab, p_star, tau_hat):
    std = T.linear_logit_std(512, vocab)
    tau, p = T.gaussian(vocab, std, alpha=1.5, method="paper", return_support=True)
    assert round(tau, 2) == tau_hat
    assert p == pytest.approx(p_star, abs=1.5e-4)
    # eq. (4) written out
    phi_inv = torch.special.ndtri(torch.tensor(1 - p, dtype=F64)).item()
    assert tau == pytest.approx((512 / (2 * (512 + vocab))) ** 0.5 * phi_inv, rel=1e-9)


@pytest.mark.parametrize("alpha,vocab,std,rel", [(1.5, 10000, 0.312, 0.03), (1.25, 32000, 0.5, 0.05),
                                                 (1.5, 2000, 1.0, 0.05), (2.0, 32000, 0.5, 0.05), (2.0, 1000, 1.0, 0.1)])
def test_gaussian_estimate_against_monte_carlo(alpha, vocab, std, rel):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, vocab, dtype=F64, generator=g) * std
    mc = T.from_logits(z, alpha).item()
    est = T.gaussian(vocab, std, alpha=alpha)
    assert est == pytest.approx(mc, rel=rel)
    if alpha == 1.5:
        assert T.gaussian(vocab, std, method="integral") == pytest.approx(T.gaussian(vocab, std, method="paper"), rel=0.01)


def test_from_logits_reproduces_entmax_via_alpha_relu():
    x = torch.randn(5, 300, dtype=F64)
    taus = T.entmax_threshold(x, 1.5)
    for i in range(5):
        torch.testing.assert_close(sa.alpha_relu(x[i], 1.5, float(taus[i])), sa.entmax15(x[i]))
    assert T.from_logits(x, 1.5).item() == pytest.approx(taus.mean().item())


def test_linear_logit_std_matches_xavier_uniform_layer():
    torch.manual_seed(0)
    d, V = 256, 4000
    layer = torch.nn.Linear(d, V, bias=False)
    torch.nn.init.xavier_uniform_(layer.weight)
    h = torch.nn.functional.layer_norm(torch.randn(64, d), (d,))
    assert layer(h).std().item() == pytest.approx(T.linear_logit_std(d, V), rel=0.03)


def test_calibrating_module_and_errors():
    m = sa.nn.AlphaReLU(1.5, tau="calibrate")
    x = torch.randn(16, 500)
    m.eval()
    with pytest.raises(RuntimeError, match="not seen a training batch"):
        m(x)
    m.train()
    y = m(x)
    assert m.calibrated and m.tau.item() == pytest.approx(T.from_logits(x, 1.5).item(), rel=1e-5)
    torch.testing.assert_close(y, sa.alpha_relu(x, 1.5, m.tau.item()))
    tau_before = m.tau.clone()
    m(torch.randn(16, 500) * 5)
    assert torch.equal(m.tau, tau_before)  # only the first batch calibrates
    with pytest.raises(ValueError, match="vocab_size"):
        T.gaussian(1, 1.0)
    with pytest.raises(ValueError, match=r"alpha=1.5 only"):
        T.gaussian(100, 1.0, alpha=2.0, method="paper")


@pytest.mark.parametrize("alpha", [1.0001, 1.5, 2.0, 2.5, 3.0])
def test_entmax_threshold_of_nan_and_inf_rows_is_nan(alpha):
    """A row with a NaN or ``+inf`` score has NaN as its threshold for every α (α-entmax gives NaN there), an
    all-``-inf`` row -1, and the other rows are unchanged."""
    x = torch.tensor([[1.0, math.nan, 0.0], [1.0, math.inf, 0.0], [1.0, 2.0, 3.0], [-math.inf] * 3])
    tau = T.entmax_threshold(x, alpha)
    assert torch.isnan(tau[:2]).all() and tau[3] == -1.0
    assert tau[2] == T.entmax_threshold(x[2:3], alpha)[0]
