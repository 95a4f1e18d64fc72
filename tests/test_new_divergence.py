"""A divergence written here from its mathematics alone (the four functions and f'(0) of the
``Divergence`` protocol, no solver hints) gives correct operators and losses everywhere:

* chi-square written from scratch equals sparsemax (sorted, exact: Martins & Astudillo, 2016) and
  the built-in chi-square operators, losses, fused loss and binary functions, with masks, a
  reference measure and a temperature;
* the exponential generator ``f(u) = e^u - e u``, in no library, equals a bisection on the threshold
  written from its formula ``p_j = max(0, log(θ_j - τ + e))``, and its loss equals
  ``⟨θ, p - y⟩ + Ω(y) - Ω(p)`` with gradient ``p - y``; its Jacobian passes gradcheck.
"""

import doctest
import math

import numpy as np
import pytest
import torch
from conftest import sparsemax_sort

import softargmax as sa
from softargmax.divergences import Divergence, base

F64 = torch.float64


class Pearson(Divergence):
    """Chi-square, ``f(u) = (u² - 1)/2``, from scratch: no ``conj_prime2``, no hints."""

    name = "pearson"
    f_prime_zero = 0.0

    def f(self, u):
        return (u * u - 1) / 2

    def f_prime(self, u):
        return u

    def conj(self, v):
        return (v * v + 1) / 2

    def conj_prime(self, v):
        return v  # the solvers clamp at f'(0) = 0: [v]_+ needs no clamp here


class Exponential(Divergence):
    """``f(u) = e^u - e u``: ``f'(0) = 1 - e``, ``g(v) = log(v + e)``, ``f*(v) = (v + e)(log(v + e) - 1)``."""

    name = "exponential"
    f_prime_zero = 1 - math.e

    def f(self, u):
        return torch.exp(u) - math.e * u

    def f_prime(self, u):
        return torch.exp(u) - math.e

    def conj(self, v):
        return (v + math.e) * (torch.log(v + math.e) - 1)

    def conj_prime(self, v):
        return torch.log(v + math.e)


def _scores(R, k, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, k, generator=g, dtype=F64) * scale
    x[0, : k // 3] = -math.inf  # masked classes
    return x


@pytest.mark.parametrize("k", [7, 300])  # short rows (no pruning) and long rows (pruned candidates)
def test_a_divergence_from_its_mathematics_equals_sparsemax(k):
    x = _scores(5, k, 0, scale=3.0)
    p = sa.f_softargmax(x, Pearson())
    torch.testing.assert_close(p, torch.from_numpy(sparsemax_sort(x.numpy())), atol=1e-12, rtol=0)
    # the Jacobian (the generic conj_prime2, by autograd, zero off the support) and the value
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    v = torch.randn_like(x)
    (sa.f_softargmax(xa, Pearson()) * v).sum().backward()
    (sa.sparsemax(xb) * v).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(sa.f_softmax(x, Pearson()), sa.f_softmax(x, "chi_square"), atol=1e-12, rtol=0)
    # a reference measure, a temperature, another dim
    q = torch.rand(k, dtype=F64) + 0.5
    torch.testing.assert_close(sa.f_softargmax(x.T, Pearson(), q=q[:, None], temperature=2.0, dim=0),
                               sa.f_softargmax(x.T, "chi_square", q=q[:, None], temperature=2.0, dim=0),
                               atol=1e-12, rtol=0)


def test_a_divergence_from_its_mathematics_gives_the_sparsemax_losses():
    x = _scores(6, 20, 1, scale=3.0)
    y = torch.randint(7, 20, (6,), generator=torch.Generator().manual_seed(1))  # not on the masked classes
    soft = torch.softmax(torch.randn(6, 20, dtype=F64), -1)
    for target, kw in ((y, {}), (y, {"label_smoothing": 0.1}), (soft, {}), ((soft > 0.05).to(F64), {"multilabel": True})):
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        mine = sa.f_divergence_loss(xa, target, Pearson(), reduction="none", **kw)
        theirs = sa.sparsemax_loss(xb, target, reduction="none", **kw)
        torch.testing.assert_close(mine, theirs, atol=1e-12, rtol=0)
        mine.sum().backward()
        theirs.sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, atol=1e-12, rtol=0)
    # the fused output layer and the two-class functions
    h, W = torch.randn(6, 4, dtype=F64), torch.randn(20, 4, dtype=F64)
    torch.testing.assert_close(sa.linear_fenchel_young_loss(h, W, y, mapping=Pearson(), chunk_size=4),
                               sa.linear_fenchel_young_loss(h, W, y, mapping="sparsemax", chunk_size=4))
    s = torch.linspace(-3, 3, 13, dtype=F64)
    torch.testing.assert_close(sa.f_sigmoid(s, Pearson(), q=(0.7, 1.3)), sa.f_sigmoid(s, "chi_square", q=(0.7, 1.3)))
    torch.testing.assert_close(sa.f_softplus(s, Pearson()), sa.f_softplus(s, "chi_square"))


def _bisection(row: torch.Tensor) -> torch.Tensor:
    """``p`` of the exponential generator by 200 halvings of ``τ`` in a bracket where ``Σ p`` goes from above 1 to 0."""
    lo, hi = float(row.max()) - 1.0, float(row.max()) + math.e
    for _ in range(200):
        tau = (lo + hi) / 2
        total = float(np.log(np.clip(row.numpy() - tau + math.e, 1.0, None)).sum())
        lo, hi = (tau, hi) if total > 1 else (lo, tau)
    return torch.from_numpy(np.log(np.clip(row.numpy() - tau + math.e, 1.0, None)))


@pytest.mark.parametrize("k", [10, 400])
def test_a_new_divergence_matches_a_brute_force_solver(k):
    div = Exponential()
    x = _scores(4, k, 2)
    p = sa.f_softargmax(x, div)
    reference = torch.stack([_bisection(row) for row in x])
    torch.testing.assert_close(p, reference, atol=1e-12, rtol=0)
    assert bool((p == 0).any()) and not bool(torch.isnan(p).any())
    # the loss: ⟨θ, p - y⟩ + Ω(y) - Ω(p) (Ω over the unmasked classes), gradient p - y
    y = torch.randint(k // 3, k, (4,), generator=torch.Generator().manual_seed(2))
    xr = x.clone().requires_grad_(True)
    loss = sa.fenchel_young_loss(xr, y, div, reduction="none")
    loss.sum().backward()
    onehot = torch.nn.functional.one_hot(y, k).to(F64)
    valid = x > -math.inf
    omega = lambda t: torch.where(valid, div.f(t), torch.zeros_like(t)).sum(-1)  # noqa: E731
    theta = torch.where(valid, x, torch.zeros_like(x))
    expected = (theta * (reference - onehot)).sum(-1) + omega(onehot) - omega(reference)
    torch.testing.assert_close(loss.detach(), expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(xr.grad, reference - onehot, atol=1e-12, rtol=0)


def test_a_new_divergence_has_the_jacobian_of_its_mapping():
    x = torch.randn(3, 6, dtype=F64) * 2
    assert torch.autograd.gradcheck(lambda t: sa.f_softargmax(t, Exponential()), (x.requires_grad_(True),))
    q = (torch.rand(6, dtype=F64) + 0.5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: sa.f_softargmax(x.detach(), Exponential(), q=t), (q,))


def test_the_protocol_is_abstract_and_hints_are_apart():
    with pytest.raises(TypeError):
        Divergence()

    class NoConjugate(Divergence):
        def f(self, u):
            return u

        def f_prime(self, u):
            return u

    with pytest.raises(TypeError):
        NoConjugate()
    hints = Exponential().hints  # the default: every field says "the generic path"
    assert hints.fused_kind is None and not hints.monotone_newton and hints.evaluator is None and not hints.softmax
    with pytest.raises(TypeError, match="SolverHints"):
        class Legacy(Pearson):  # solver hints as members, as before they were split off
            newton_power = 1.0


def test_the_protocol_docstring_example_runs():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    tests = [t for t in finder.find(base, "base") if t.examples]
    assert tests
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0
