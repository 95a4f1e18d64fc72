"""The generic solver a block of rows at a time (softargmax.solvers.row_blocks): a user's generator that
re-declares a built-in one (KL, α = 1.5 with a reference measure) gives the built-in's operator, backward and
loss to float64 precision, whatever the blocks; bad rows stay in their rows; and the loss allocates one
full-size buffer (p, then p - y), the operator two (p and the Jacobian weights)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import softargmax as sa
from softargmax.divergences import AlphaDivergence, CustomDivergence
from softargmax.solvers import row_blocks, threshold

F64 = torch.float64


def kl_by_hand():
    """KL from its functions (``g = (f')⁻¹`` and ``g'`` declared), no hints: the generic evaluator alone."""
    return CustomDivergence(f=lambda u: torch.special.xlogy(u, u), f_prime=lambda u: torch.log(u) + 1,
                            conj=lambda v: torch.exp(v - 1), conj_prime=lambda v: torch.exp(v - 1),
                            conj_prime2=lambda v: torch.exp(v - 1), name="kl_by_hand")


def entmax15_by_hand():
    """The α-divergence at α = 1.5 from its functions: ``g(v) = [1 + v/2]_+²``, ``g' = [1 + v/2]_+``, ``f'(0) = -2``."""
    ref = AlphaDivergence(1.5)
    return CustomDivergence(f=lambda u: (u * torch.sqrt(u) - 1 - 1.5 * (u - 1)) / 0.75,
                            f_prime=lambda u: 2 * (torch.sqrt(u) - 1), conj=ref.conj,
                            conj_prime=lambda v: torch.clamp(1 + 0.5 * v, min=0) ** 2,
                            conj_prime2=lambda v: torch.clamp(1 + 0.5 * v, min=0), f_prime_zero=-2.0)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 3 rows of 50 classes: every call below crosses several blocks."""
    monkeypatch.setattr(row_blocks, "BLOCK_ELEMENTS", 150)


def _rows(R=10, k=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(R, k, generator=gen, dtype=F64) * 3, torch.randint(0, k, (R,), generator=gen)


def test_blocks_are_taken_for_a_users_generator_only():
    z, _ = _rows()
    q = torch.rand(1, 50, dtype=F64) + 0.5
    assert row_blocks.covers(z, kl_by_hand(), None, prune=True)
    assert row_blocks.covers(z, entmax15_by_hand(), q, prune=True)
    assert not row_blocks.covers(z, entmax15_by_hand(), None, prune=True)  # pruned candidates instead
    for name in ("kl", "jensen_shannon", "reverse_kl", "chi_square"):
        assert not row_blocks.covers(z, sa.divergences.get_divergence(name), q, prune=True)
    assert not row_blocks.covers(z, AlphaDivergence(3.0), q, prune=True)  # its own α > 2 solver


def test_kl_by_hand_is_softmax_in_float64(small_blocks):
    """Operator, backward and loss (value and gradient) against torch.softmax and F.cross_entropy."""
    x, y = _rows()
    x[4, :7] = -math.inf  # masked entries in a middle block
    div = kl_by_hand()
    xr = x.clone().requires_grad_(True)
    p = sa.f_softargmax(xr, div)
    torch.testing.assert_close(p, torch.softmax(x, -1), atol=1e-14, rtol=1e-12)
    v = torch.randn_like(x)
    (g,) = torch.autograd.grad(p, xr, v)
    xs = x.clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(torch.softmax(xs, -1), xs, v)
    torch.testing.assert_close(g, g_ref, atol=1e-13, rtol=1e-12)
    loss = sa.f_divergence_loss(xr, y, div, reduction="none")
    torch.testing.assert_close(loss, F.cross_entropy(x, y, reduction="none"), atol=1e-13, rtol=1e-12)
    (gl,) = torch.autograd.grad(loss.sum(), xr)
    torch.testing.assert_close(gl, torch.softmax(x, -1) - F.one_hot(y, 50).to(F64), atol=1e-14, rtol=1e-12)
    # a temperature and distributions as targets: the built-in KL loss (softmax's closed form)
    target = torch.softmax(torch.randn(10, 50, generator=torch.Generator().manual_seed(6), dtype=F64), -1)
    target[4, :7] = 0.0
    target = target / target.sum(-1, keepdim=True)
    for t in (target, y):
        mine = sa.f_divergence_loss(x, t, div, temperature=0.5, reduction="none")
        ref = sa.f_divergence_loss(x, t, "kl", temperature=0.5, reduction="none")
        torch.testing.assert_close(mine, ref, atol=1e-13, rtol=1e-12)


def test_entmax15_by_hand_with_q_is_the_builtin_in_float64(small_blocks):
    """α = 1.5 with a reference measure (its candidates the full rows): operator, backward, loss with
    distributions as targets, against the built-in α-divergence (whose generator has its own evaluator)."""
    x, _ = _rows(seed=1)
    gen = torch.Generator().manual_seed(2)
    q = torch.rand(10, 50, generator=gen, dtype=F64) + 0.25
    y = torch.softmax(torch.randn(10, 50, generator=gen, dtype=F64), -1)
    mine, ref = entmax15_by_hand(), AlphaDivergence(1.5)
    out = {}
    for name, div in (("mine", mine), ("ref", ref)):
        xr = x.clone().requires_grad_(True)
        p = sa.f_softargmax(xr, div, q=q)
        (g,) = torch.autograd.grad(p, xr, torch.cos(x))
        loss = sa.f_divergence_loss(xr, y, div, q=q, temperature=0.7, reduction="none")
        (gl,) = torch.autograd.grad(loss.sum(), xr)
        out[name] = (p, g, loss, gl)
    assert (out["mine"][0] == 0).any()  # sparse rows
    for a, b in zip(out["mine"], out["ref"]):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=1e-11)


def test_sparse_loss_by_hand_is_the_builtin_in_float64(small_blocks, monkeypatch):
    """The loss of α = 1.5 by hand with class indices on rows long enough to be pruned (each block pruned
    to its candidates, p scattered into the full rows): value and gradient against the built-in α-divergence
    (1.5-entmax) in float64, a masked and a NaN row included."""
    monkeypatch.setattr(row_blocks, "BLOCK_ELEMENTS", 3 * 512)
    x, y = _rows(R=8, k=512, seed=4)
    x[1, ::2] = -math.inf
    x[5, 7] = math.nan
    y[1] = 4
    out = []
    for div in (entmax15_by_hand(), AlphaDivergence(1.5)):
        xr = x.clone().requires_grad_(True)
        loss = sa.f_divergence_loss(xr, y, div, reduction="none")
        (g,) = torch.autograd.grad(loss.sum(), xr)
        out.append((loss, g))
    assert ((out[0][1] == 0) & torch.isfinite(x)).any()  # sparse
    assert torch.isnan(out[0][0][5]) and torch.isnan(out[0][1][5]).all()
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=1e-11, equal_nan=True)


def test_rows_do_not_depend_on_the_blocks(monkeypatch):
    """The same rows solved in blocks of 1, 3 and all rows: p equal to rounding, τ too."""
    x, _ = _rows(R=7, k=40, seed=3)
    div = kl_by_hand()
    sols = []
    for elements in (1, 120, 10**9):
        monkeypatch.setattr(row_blocks, "BLOCK_ELEMENTS", elements)
        sols.append(threshold.solve(x, div))
    for sol in sols[1:]:
        torch.testing.assert_close(sol.p, sols[0].p, atol=1e-15, rtol=1e-13)
        torch.testing.assert_close(sol.tau, sols[0].tau, atol=1e-13, rtol=1e-13)


def test_bad_rows_stay_in_their_rows(small_blocks):
    """NaN and +inf rows give NaN in their own rows (operator and loss), an all-masked row gives p = 0, the
    others are softmax."""
    x, y = _rows()
    x[2, 5] = math.nan
    x[7, 0] = math.inf
    x[8] = -math.inf
    p = sa.f_softargmax(x, kl_by_hand())
    assert torch.isnan(p[[2, 7]]).all()
    assert (p[8] == 0).all()
    ok = [0, 1, 3, 4, 5, 6, 9]
    torch.testing.assert_close(p[ok], torch.softmax(x[ok], -1), atol=1e-14, rtol=1e-12)
    loss = sa.f_divergence_loss(x, y, kl_by_hand(), reduction="none")
    assert torch.isnan(loss[[2, 7]]).all()
    torch.testing.assert_close(loss[ok], F.cross_entropy(x[ok], y[ok], reduction="none"), atol=1e-13, rtol=1e-12)


class _FullSizeAllocations(TorchDispatchMode):
    """Counts the allocations of at least ``numel`` elements (outputs of every aten operator)."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: PLW3201
        out = func(*args, **(kwargs or {}))
        views = {"view", "_unsafe_view", "reshape", "slice", "select", "expand", "detach", "alias", "as_strided",
                 "unsqueeze", "squeeze", "t", "lift_fresh", "permute", "transpose"}
        name = func.overloadpacket.__name__
        if name not in views and not name.endswith("_"):  # in-place operators write into their input
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.numel() >= self.numel:
                    self.count += 1
        return out


def test_full_size_allocations():
    """The loss of the generator by hand allocates p alone at full size (p - y is written over it); the
    operator p and the Jacobian weights s (the generic solver over whole rows allocated several per Newton
    step)."""
    R, k = 64, 4096  # 4 blocks of 16 rows
    x, y = _rows(R, k)
    x = x.float()
    div = kl_by_hand()
    count = _FullSizeAllocations(R * k)
    with count:
        sa.f_divergence_loss(x, y, div)
    assert count.count == 1, count.count
    count.count = 0
    with count:
        sol = threshold.solve(x, div)
    assert count.count == 2 and sol.s is not None, count.count
    # α = 1.5: a constant row leaves no block to prune away, so the whole batch's candidates were its full rows
    # (the generic solver over them: 365 full-size allocations); pruned block by block, only that row's block is
    x[0] = 0.5
    count.count = 0
    with count:
        sa.f_divergence_loss(x, y, entmax15_by_hand())
    assert count.count == 1, count.count


def test_float32_loss_values_within_an_ulp_of_float64():
    """The float32 loss values of KL by hand (the conjugate from the block's float64 row sums, stationary in p)
    within one float32 ulp of float64 cross-entropy (1.6 ulps from the two row sums rounded apart, 1.7 without
    the stationary term τ (Σ p - 1))."""
    x, y = _rows(R=32, k=8192, seed=5)
    for shift in (0.0, 1000.0):  # shifted logits: ⟨z, p⟩'s products in float32 were 10 ulps off at 1000
        loss = sa.f_divergence_loss(x.float() + shift, y, kl_by_hand(), reduction="none").double()
        ref = F.cross_entropy((x.float() + shift).double(), y, reduction="none")
        ulps = (loss - ref).abs() / (torch.finfo(torch.float32).eps * ref.abs())
        assert float(ulps.max()) <= 1.0, (shift, float(ulps.max()))


def test_g_prime_by_autograd_evaluates_g_once():
    """A user's generator without ``g'``: each Newton evaluation calls ``g`` once (differentiated by autograd;
    it was called twice) and gives the declared ``g'``'s values, masked entries 0."""
    calls = []

    def g(v):
        calls.append(1)
        return torch.exp(v - 1)

    plain = CustomDivergence(f=lambda u: torch.special.xlogy(u, u), f_prime=lambda u: torch.log(u) + 1,
                             conj=lambda v: torch.exp(v - 1), conj_prime=g)
    v = torch.tensor([[-1.0, 0.5, -math.inf]], dtype=F64)
    got, ref = plain.conj_prime_and_prime2(v), kl_by_hand().conj_prime_and_prime2(v)
    assert len(calls) == 1 and not got[0].requires_grad
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=0, rtol=1e-15)
    x, _ = _rows(R=4, k=30, seed=7)
    calls.clear()
    sol = threshold.solve(x, plain)
    assert len(calls) == sol.iterations + 1, (len(calls), sol.iterations)
    torch.testing.assert_close(sol.p, torch.softmax(x, -1), atol=1e-15, rtol=1e-12)


def test_g_prime_by_autograd_under_inference_mode_and_a_subclass_own_g_prime():
    """Without a declared ``g'`` the generic solver differentiates ``g`` by autograd, also under
    ``torch.inference_mode`` (which records no graph: it raised); a subclass's own ``conj_prime2`` is the one
    called (the shortcut for the constructor's functions bypassed it)."""
    plain = CustomDivergence(f=lambda u: torch.special.xlogy(u, u), f_prime=lambda u: torch.log(u) + 1,
                             conj=lambda v: torch.exp(v - 1), conj_prime=lambda v: torch.exp(v - 1))
    x, _ = _rows(R=4, k=30, seed=8)
    with torch.inference_mode():
        p = sa.f_softargmax(x, plain)
    torch.testing.assert_close(p, torch.softmax(x, -1), atol=1e-15, rtol=1e-12)

    calls = []

    class OwnGPrime(CustomDivergence):
        def conj_prime2(self, v):
            calls.append(1)
            return torch.exp(v - 1)

    own = OwnGPrime(f=lambda u: torch.special.xlogy(u, u), f_prime=lambda u: torch.log(u) + 1,
                    conj=lambda v: torch.exp(v - 1), conj_prime=lambda v: torch.exp(v - 1))
    torch.testing.assert_close(sa.f_softargmax(x, own), torch.softmax(x, -1), atol=1e-15, rtol=1e-12)
    assert calls
