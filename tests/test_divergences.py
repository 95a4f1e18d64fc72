"""The generators: conjugates agree with the primal f, registry and custom generators."""

import math

import numpy as np
import pytest
import torch
from conftest import ALL_DIVERGENCES, div_id

from softargmax import divergences as D
from softargmax.divergences import CustomDivergence, get_divergence, lambertw_exp

F64 = torch.float64


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_conjugate_inverts_f_prime_and_fenchel_equality(d):
    div = get_divergence(d[0], **d[1])
    u = torch.tensor([0.05, 0.3, 0.9, 1.0, 1.7, 3.0], dtype=F64)
    v = div.f_prime(u)
    # g = (f*)' is the inverse of f' on the interior of the domain
    torch.testing.assert_close(div.conj_prime(v), u, rtol=1e-9, atol=1e-12)
    # Fenchel-Young equality: f*(f'(u)) = u f'(u) - f(u)
    torch.testing.assert_close(div.conj(v), u * v - div.f(u), rtol=1e-9, atol=1e-12)
    # f(1) = 0
    assert abs(float(div.f(torch.ones((), dtype=F64)))) < 1e-12


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_conj_prime2_is_derivative_and_evaluate_matches(d):
    div = get_divergence(d[0], **d[1])
    u = torch.tensor([0.05, 0.3, 0.9, 1.7, 3.0], dtype=F64)
    v = div.f_prime(u)
    h = 1e-6
    fd = (div.conj_prime(v + h) - div.conj_prime(v - h)) / (2 * h)
    torch.testing.assert_close(div.conj_prime2(v), fd, rtol=1e-5, atol=1e-8)
    # the fast evaluate() path agrees with the plain conjugates
    z = torch.randn(3, 9, dtype=F64)
    m = z.amax(-1, keepdim=True)
    tau = m - div.f_prime(torch.tensor(0.5, dtype=F64))
    ev = D.evaluator_of(div)
    g, gp = ev.evaluate(z, tau, ev.prepare(z, m))
    g2, gp2 = div.conj_prime_and_prime2(torch.clamp(z - tau, min=div.f_prime_zero) if div.sparse else z - tau)
    torch.testing.assert_close(g, g2)
    torch.testing.assert_close(gp, gp2)


@pytest.mark.parametrize("d", ALL_DIVERGENCES, ids=div_id)
def test_masked_scores_give_zero_not_nan(d):
    div = get_divergence(d[0], **d[1])
    v = torch.tensor([-math.inf], dtype=F64)
    g, gp = div.conj_prime_and_prime2(torch.clamp(v, min=div.f_prime_zero) if div.sparse else v)
    assert g.item() == 0.0 and gp.item() == 0.0


def test_f_prime_zero_values():
    assert get_divergence("chi_square").f_prime_zero == 0.0
    assert get_divergence("alpha", alpha=1.5).f_prime_zero == pytest.approx(-2.0)
    assert get_divergence("alpha", alpha=2.0).f_prime_zero == pytest.approx(-1.0)
    for name in ["kl", "reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "reverse_chi_square"]:
        assert get_divergence(name).f_prime_zero == -math.inf
    assert get_divergence("alpha", alpha=0.7).f_prime_zero == -math.inf
    # the limit value matches f' near 0 for the sparse ones
    for d in [get_divergence("chi_square"), get_divergence("alpha", alpha=1.5)]:
        assert float(d.f_prime(torch.tensor(1e-12, dtype=F64))) == pytest.approx(d.f_prime_zero, abs=1e-5)


def test_lambertw_matches_scipy():
    from scipy.special import lambertw

    L = np.linspace(-30, 60, 301)
    ours = lambertw_exp(torch.tensor(L, dtype=F64)).numpy()
    ref = np.real(lambertw(np.exp(L)))
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-300)
    inf = lambertw_exp(torch.tensor([math.inf, -math.inf], dtype=F64))
    assert inf[0] == math.inf and inf[1] == 0.0


def test_alpha_tensor_matches_float():
    v = torch.linspace(-5, 1.5, 40, dtype=F64)
    for a in [0.5, 1.0, 1.25, 1.5, 2.0, 3.0]:
        df = D.AlphaDivergence(a)
        dt = D.AlphaDivergence(torch.tensor([[a]], dtype=F64))
        vv = v if a >= 1 else torch.clamp(v, max=0.5)
        for fn in ["conj_prime", "conj_prime2", "conj"]:
            torch.testing.assert_close(getattr(dt, fn)(vv)[0], getattr(df, fn)(vv), rtol=1e-10, atol=1e-12)


def test_registry_errors():
    with pytest.raises(ValueError, match=r"unknown name 'nope'.*accepted"):
        get_divergence("nope")
    with pytest.raises(ValueError, match="alpha="):
        get_divergence("alpha")
    with pytest.raises(ValueError, match="alpha must be"):
        get_divergence("alpha", alpha=-1.0)
    with pytest.raises(ValueError, match="takes no parameters"):
        get_divergence("kl", alpha=1.5)
    with pytest.raises(TypeError, match="divergence must be"):
        get_divergence(3)
    with pytest.raises(ValueError, match="parameters"):
        get_divergence(D.KL(), alpha=2)


def test_custom_divergence_reproduces_builtin():
    h = D.SquaredHellinger()
    custom = CustomDivergence(
        f=lambda u: (torch.sqrt(u) - 1) ** 2,
        f_prime=lambda u: 1 - 1 / torch.sqrt(u),
        conj=lambda v: v / (1 - v),
        conj_prime=lambda v: 1 / (1 - v) ** 2,
        name="my_hellinger",
    )
    v = torch.linspace(-4, 0.5, 11, dtype=F64)
    torch.testing.assert_close(custom.conj_prime2(v), h.conj_prime2(v))
    with pytest.raises(TypeError, match="callable"):
        CustomDivergence(f=1, f_prime=abs, conj=abs, conj_prime=abs)
