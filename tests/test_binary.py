"""f_sigmoid / f_softplus: the closed forms of Roulet et al. (2025), Appendix C.3, against the generic solver."""


import pytest
import torch

import softargmax as sa
from softargmax.divergences import get_divergence
from softargmax.operators.binary import _generic_inputs

F64 = torch.float64
CLOSED = ["kl", "reverse_kl", "jensen_shannon", "chi_square"]


def generic(s, name, q, beta=1.0, **params):
    q0 = torch.as_tensor(q[0], dtype=F64)
    q1 = torch.as_tensor(q[1], dtype=F64)
    x, qs = _generic_inputs(s / beta, q0, q1)
    div = get_divergence(name, **params)
    return sa.f_softargmax(x, div, q=qs)[..., 1], beta * sa.f_softmax(x, div, q=qs)


@pytest.mark.parametrize("name", CLOSED)
@pytest.mark.parametrize("q", [(1.0, 1.0), (0.3, 1.7), (2.0, 0.5)])
@pytest.mark.parametrize("beta", [1.0, 0.6])
def test_closed_forms_match_generic_solver(name, q, beta):
    s = torch.linspace(-8, 8, 81, dtype=F64)
    p_ref, v_ref = generic(s, name, q, beta)
    torch.testing.assert_close(sa.f_sigmoid(s, name, q=q, temperature=beta), p_ref, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(sa.f_softplus(s, name, q=q, temperature=beta), v_ref, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("name", CLOSED + ["squared_hellinger", "reverse_chi_square"])
def test_softplus_derivative_is_sigmoid_and_gradcheck(name):
    s = torch.linspace(-4, 4, 17, dtype=F64).requires_grad_()
    (g,) = torch.autograd.grad(sa.f_softplus(s, name).sum(), s)
    torch.testing.assert_close(g, sa.f_sigmoid(s.detach(), name), atol=1e-10, rtol=1e-8)
    q0 = torch.tensor(0.7, dtype=F64, requires_grad=True)
    q1 = torch.tensor(1.3, dtype=F64, requires_grad=True)
    s2 = torch.tensor([-1.3, 0.2, 0.9], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: sa.f_sigmoid(a, name, q=(b, c)), (s2, q0, q1), atol=1e-6)


@pytest.mark.parametrize("name", CLOSED + ["squared_hellinger"])
@pytest.mark.parametrize("q", [(1.0, 1.0), (0.3, 1.7)])
def test_sigmoid_derivative_at_zero_is_the_central_difference(name, q):
    """At exactly s = 0 the f-sigmoid's derivative is that of its two sides (the smaller-probability
    trick once took the derivative of |s|, 0 there): compared with a central difference in float64."""
    s = torch.zeros(1, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(sa.f_sigmoid(s, name, q=q).sum(), s)
    h = 1e-6
    plus, minus = (sa.f_sigmoid(torch.tensor([v], dtype=F64), name, q=q) for v in (h, -h))
    fd = (plus - minus) / (2 * h)
    assert float(fd) > 0.05
    torch.testing.assert_close(g, fd, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("name", CLOSED)
def test_builtin_generators_declare_their_closed_forms(name):
    """The comparison above is only meaningful if the closed forms run: each built-in
    generator of Appendix C.3 declares them, the others do not."""
    div = get_divergence(name)
    u, q0, q1 = torch.tensor([-2.0, 0.0], dtype=F64), torch.tensor(0.4, dtype=F64), torch.tensor(1.2, dtype=F64)
    assert div.hints.binary_low_probability(u, q0, q1) is not None
    assert div.hints.binary_softplus(u, q0, q1) is not None
    hellinger = get_divergence("squared_hellinger")
    assert hellinger.hints.binary_low_probability is None and hellinger.hints.binary_softplus is None


def test_a_new_generator_brings_its_own_closed_form():
    """A user's generator declares a closed form in its hints and f_sigmoid / f_softplus use it
    (here KL's, written as a CustomDivergence): nothing in softargmax.operators.binary changes."""
    calls = []

    def binary_low_probability(u, q0, q1):
        calls.append("sigmoid")
        return torch.sigmoid(u + torch.log(q1) - torch.log(q0))

    def binary_softplus(s, q0, q1):
        calls.append("softplus")
        return torch.logaddexp(torch.log(q0) + torch.zeros_like(s), s + torch.log(q1))

    functions = dict(f=lambda u: torch.special.xlogy(u, u), f_prime=lambda u: torch.log(u) + 1,
                     conj=lambda v: torch.exp(v - 1), conj_prime=lambda v: torch.exp(v - 1))
    hints = sa.divergences.SolverHints(binary_low_probability=binary_low_probability, binary_softplus=binary_softplus)
    mine = sa.divergences.CustomDivergence(**functions, name="my_kl", hints=hints)
    plain = sa.divergences.CustomDivergence(**functions)
    s = torch.linspace(-30, 30, 13, dtype=F64)
    q = (0.3, 1.7)
    torch.testing.assert_close(sa.f_sigmoid(s, mine, q=q), sa.f_sigmoid(s, "kl", q=q), atol=1e-15, rtol=1e-12)
    torch.testing.assert_close(sa.f_softplus(s, mine, q=q), sa.f_softplus(s, "kl", q=q), atol=1e-15, rtol=1e-12)
    assert calls == ["sigmoid", "softplus"]
    # without the declaration the generic solver gives the same function
    torch.testing.assert_close(sa.f_sigmoid(s, plain, q=q), sa.f_sigmoid(s, mine, q=q), atol=1e-10, rtol=1e-8)


def test_known_values():
    s = torch.linspace(-5, 5, 21, dtype=F64)
    torch.testing.assert_close(sa.f_sigmoid(s, "kl"), torch.sigmoid(s))
    torch.testing.assert_close(sa.f_softplus(s, "kl"), torch.nn.functional.softplus(s))
    # binary sparsemax (Martins & Astudillo, 2016, section 3.3)
    torch.testing.assert_close(sa.f_sigmoid(s, "chi_square"), torch.clamp((s + 1) / 2, 0, 1))
    # prior of the positive class at s = 0 (Roulet et al., 2025, Appendix A.4)
    for q1 in [0.1, 0.25, 0.75]:
        assert sa.f_sigmoid(torch.zeros(1, dtype=F64), "kl", q=(1 - q1, q1)).item() == pytest.approx(q1)


def test_stable_at_extreme_scores():
    s = torch.tensor([-1e4, -300.0, 300.0, 1e4], dtype=F64)
    for name in CLOSED:
        p = sa.f_sigmoid(s, name)
        v = sa.f_softplus(s, name)
        assert torch.isfinite(p).all() and torch.isfinite(v).all(), name
        assert p[0] == pytest.approx(0, abs=1e-3) and p[-1] == pytest.approx(1, abs=1e-3)


def test_errors():
    s = torch.zeros(3)
    with pytest.raises(TypeError, match="pair"):
        sa.f_sigmoid(s, "kl", q=1.0)
    with pytest.raises(ValueError, match="q0"):
        sa.f_sigmoid(s, "kl", q=(0.0, 1.0))
    with pytest.raises(TypeError, match=r"s must be a torch.Tensor"):
        sa.f_sigmoid([0.0], "kl")


def test_low_precision_in_and_out():
    s = torch.linspace(-4, 4, 9).to(torch.bfloat16)
    for name in ["kl", "jensen_shannon", "squared_hellinger"]:
        p = sa.f_sigmoid(s, name)
        v = sa.f_softplus(s, name)
        assert p.dtype == torch.bfloat16 and v.dtype == torch.bfloat16
        torch.testing.assert_close(p.float(), sa.f_sigmoid(s.float(), name), atol=1e-2, rtol=0)


@pytest.mark.parametrize("q", [(1.0, 1.0), (0.3, 0.7), (2.0, 0.5), (0.05, 3.0)])
@pytest.mark.parametrize("s", [-1e6, -3e5, -1e4, 2e5, 1e6])
def test_jensen_shannon_softplus_keeps_float32_precision_at_large_scores(s, q):
    """The closed form at |s| ~ 1e6 (temperature 0.5) agrees with the float64 f_softmax of (0, s) to float32's
    precision: the threshold is no longer the sum of two large opposite terms (it lost 1e-3 relative at s = -1e6)."""
    got = sa.f_softplus(torch.tensor([s]), "jensen_shannon", q=q, temperature=0.5)
    ref = sa.f_softmax(torch.tensor([[0.0, s]], dtype=torch.float64), "jensen_shannon",
                       q=torch.tensor(q, dtype=torch.float64), temperature=0.5)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(float(ref), rel=2e-6)
