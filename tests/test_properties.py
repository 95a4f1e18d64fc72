"""Property-based tests of the public API's numerical contract (hypothesis).

Generated inputs: shapes with empty batches and single-element rows, every dtype, offsets
up to 1e6, flat and tied rows, ``-inf`` masks (whole rows included), α across (0, ∞)
sampled densely near 1 and 2, every divergence with and without ``q``, temperatures.
Each case is compared with an independent float64 reference:

* α-entmax / the α-divergence with ``q = 1``: a float64 bisection written in the tests
  (:func:`conftest.entmax_ref64`);
* sparsemax and 1.5-entmax: sort-based exact solutions;
* every f-softargmax: the optimality conditions checked with the primal generator only
  (``f'(p_j/q_j) - z_j`` is the same on the support, and at least ``-f'(0)`` off it), and
  the float64 result for the same input values (the float32 answer must match it);
* gradients: ``∇ f_softmax = f_softargmax``, loss gradient ``= p - y``, and float64 central
  differences for α.

Tolerances per dtype are those stated in docs/numerics.md.  CI runs the ``ci`` profile (a
small, derandomized budget, registered in conftest); ``HYPOTHESIS_PROFILE=thorough`` runs
many more examples.
"""

import math

import pytest
import torch
from conftest import entmax15_sort, entmax_ref64, sparsemax_sort

import softargmax as sa
from softargmax.divergences import get_divergence

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, example, given
from hypothesis import strategies as st

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
#: |p - p_float64| allowed for the output of each dtype (half types: the output rounding)
P_TOL = {torch.float64: 1e-9, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 4e-3}
DIVERGENCES = ["kl", "reverse_kl", "jeffrey", "jensen_shannon", "squared_hellinger", "chi_square",
               "reverse_chi_square", "alpha"]

alphas = st.one_of(
    st.floats(-16, -1).map(lambda e: 1 + 10 ** e),  # just above 1, down to the next float
    st.just(math.nextafter(1.0, 2.0)),
    st.floats(-7, -1).map(lambda e: 2 - 10 ** e),  # just below 2
    st.floats(-7, -1).map(lambda e: 2 + 10 ** e),  # just above 2
    st.sampled_from([1.0, 1.5, 2.0]),
    st.floats(1.0, 6.0),
)
alphas_any = st.one_of(alphas, st.floats(0.1, 1.0))  # (0, ∞) for the α-divergence f-softargmax


@st.composite
def score_rows(draw, max_rows=4, max_k=24, dtype=None):
    """``x`` (in ``dtype``) with offsets up to 1e6, flat/tied rows and ``-inf`` masks."""
    R = draw(st.integers(0, max_rows))
    k = draw(st.integers(1, max_k))
    dtype = dtype or draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.0, 1e-4, 1e-2, 1.0, 10.0]))
    x = torch.randn(R, k, generator=g, dtype=torch.float64) * scale
    if R and draw(st.booleans()):  # ties at the maximum
        x[0, : max(1, k // 2)] = x[0].max()
    offset = draw(st.sampled_from([0.0, -3.0, 1e2, 1e4, 1e6])) if dtype in (torch.float32, torch.float64) else 0.0
    x = x + offset
    if R and k > 1 and draw(st.booleans()):  # masks
        mask = torch.rand(R, k, generator=g) < 0.3
        mask[:, 0] = False
        x = x.masked_fill(mask, -math.inf)
        if R > 1 and draw(st.booleans()):
            x[-1] = -math.inf  # a whole row masked
    return x.to(dtype)


def holder_bound(x, alpha):
    """Four times the float64 error bound of α-entmax for α > 2 (docs/numerics.md): p = [y - t]_+^{1/(α-1)} is only
    Hölder continuous at the edge of the support, so an entry within rounding of the threshold moves by up to
    (ε |y|)^{1/(α-1)}, y = (α - 1) x; on flat rows (scores of 1e-4) at α = 4.3 that is ~2e-6."""
    finite = x[torch.isfinite(x)]
    y = (alpha - 1) * float(finite.abs().max()) if finite.numel() else 0.0
    return 4 * (torch.finfo(torch.float64).eps * y) ** (1 / (alpha - 1))


def _check_mapping(p, x, ref, dtype, tol=None):
    """Shape, non-negativity, zeros at masks, row sums, and distance to ``ref`` (float64)."""
    tol = P_TOL[dtype] if tol is None else tol
    assert p.shape == x.shape and p.dtype == x.dtype
    pd = p.double()
    assert not torch.isnan(pd).any()
    assert (pd >= 0).all()
    masked = x == -math.inf
    assert (pd[masked] == 0).all()
    live = ~masked.all(-1)
    sums = pd.sum(-1)
    k = x.shape[-1]
    assert ((sums[live] - 1).abs() <= tol * max(1.0, math.sqrt(k)) + 2 * torch.finfo(dtype).eps * k).all()
    assert (sums[~live] == 0).all()
    assert (pd - ref).abs().max() <= tol if pd.numel() else True


@given(x=score_rows(), alpha=alphas)
def test_entmax_matches_float64_bisection(x, alpha):
    p = sa.entmax(x, alpha)
    ref = entmax_ref64(x.double(), alpha)
    tol = P_TOL[x.dtype]
    if alpha > 2 and x.dtype == torch.float64:
        tol = max(1e-8, holder_bound(x, alpha))
    _check_mapping(p, x, ref, x.dtype, tol)


@given(x=score_rows(), which=st.sampled_from(["sparsemax", "entmax15"]))
def test_sparsemax_entmax15_match_sort(x, which):
    fn, ref_fn = (sa.sparsemax, sparsemax_sort) if which == "sparsemax" else (sa.entmax15, entmax15_sort)
    p = fn(x)
    xd = x.double()
    live = ~(xd == -math.inf).all(-1)
    ref = torch.zeros_like(xd)
    if live.any():
        ref[live] = torch.as_tensor(ref_fn(xd[live].numpy()))
    _check_mapping(p, x, ref, x.dtype)


#: a nearly flat row (spread 4e-4) at α = 4, β = 0.3: shifted by 1e6, its p moves by 1.6e-8, all of it the rounding of
#: x + c passed on by the Jacobian (the shifted row's p equals that of its rounded scores exactly)
FLAT_ROW_SHIFTED = [1.5410e-04, -2.9343e-05, -2.1788e-04, 5.6843e-05, -1.0845e-04, -1.3986e-04, 4.0335e-05, 8.3803e-05]


@given(x=score_rows(dtype=torch.float64, max_k=16), c=st.sampled_from([-1e3, 1.0, 1e4, 1e6]),
       div=st.sampled_from(DIVERGENCES), alpha=alphas_any, use_q=st.booleans(),
       beta=st.sampled_from([0.3, 1.0, 4.0]), qseed=st.integers(0, 1000))
@example(x=torch.tensor([FLAT_ROW_SHIFTED], dtype=torch.float64), c=1e6, div="alpha", alpha=4.0, use_q=False,
         beta=0.3, qseed=0)
def test_f_softargmax_optimality_shift_and_float32(x, c, div, alpha, use_q, beta, qseed):
    params = {"alpha": alpha} if div == "alpha" else {}
    k = x.shape[-1]
    q = (torch.rand(k, generator=torch.Generator().manual_seed(qseed), dtype=torch.float64) + 0.2) if use_q else None
    p = sa.f_softargmax(x, div, q=q, temperature=beta, **params)
    assert not torch.isnan(p).any() and (p >= 0).all()
    live = ~(x == -math.inf).all(-1)
    assert ((p.sum(-1)[live] - 1).abs() <= 1e-9).all()
    # optimality with the primal generator only: f'(p/q) - z/β is constant on the support
    d = get_divergence(div, **params)
    qq = torch.ones_like(x) if q is None else q.expand_as(x)
    z = x / beta
    supp = p > 1e-12
    for i in range(x.shape[0]):
        if not live[i]:
            continue
        r = d.f_prime(p[i][supp[i]] / qq[i][supp[i]]) - z[i][supp[i]]
        if (p[i][supp[i]] > 1e-6).sum() >= 2:
            big = p[i][supp[i]] > 1e-6
            spread = float(r[big].max() - r[big].min())
            assert spread <= 1e-6 * max(1.0, float(r[big].abs().max()))
    # shift invariance (float64), up to the rounding of x + c: each score moves by up to ulp(|x| + |c|)/β, which the
    # Jacobian passes on (nearly flat rows at α > 2 amplify it a thousandfold: dp/dz = p^{2-α}; such a row shifted
    # by 1e6 gives exactly the p of its rounded scores, 1.6e-8 from the unshifted p)
    p2 = sa.f_softargmax(x + c, div, q=q, temperature=beta, **params)
    if p.numel():
        fn = lambda v: sa.f_softargmax(v, div, q=q, temperature=beta, **params)  # noqa: E731
        gain = float(torch.autograd.functional.jacobian(fn, x).abs().sum((2, 3)).max())
        finite = x[x.isfinite()]
        scale = abs(c) + (float(finite.abs().max()) if finite.numel() else 0.0)
        moved = torch.finfo(torch.float64).eps * scale / beta
        assert (p2 - p).abs().max() <= 1e-8 + gain * moved
    # float32 of the same values (with the offset) agrees with float64 of those values
    x32 = (x + c).float()
    p32 = sa.f_softargmax(x32, div, q=None if q is None else q.float(), temperature=beta, **params)
    p64 = sa.f_softargmax(x32.double(), div, q=q, temperature=beta, **params)
    tol = 1e-6 if not (div == "alpha" and alpha > 2) else 5e-6
    assert (p32.double() - p64).abs().max() <= tol if p.numel() else True


#: nearly flat float64 rows at α = 5, β = 0.5, where a central difference of f_softmax is off
#: ⟨p, v⟩ by 6.9e-5 in exact arithmetic (the entry at -3.0001628 sits at the edge of the support)
STEEP_FLAT_ROW = [[-3.000242, -3.0003586, -2.9999222, -3.0002647, -3.0001628, -2.9996874, -3.0001137]]


@given(x=score_rows(dtype=torch.float64, max_k=12, max_rows=3), div=st.sampled_from(DIVERGENCES),
       alpha=alphas_any, use_q=st.booleans(), beta=st.sampled_from([0.5, 1.0, 2.0]))
@example(x=torch.tensor(STEEP_FLAT_ROW, dtype=torch.float64), div="alpha", alpha=5.0, use_q=False, beta=0.5)
def test_f_softmax_gradient_is_f_softargmax(x, div, alpha, use_q, beta):
    """The backward of f_softmax is f_softargmax, and the value's differences agree with it.

    The value is checked by convexity, not by a central difference's Taylor error: f_softmax
    is convex with gradient p = f_softargmax, so ``s -> ⟨p(x + s v), v⟩`` is nondecreasing
    and the central difference (its mean over ``[-h, h]``) lies between its values at ``±h``.
    A bound on ``fd - ⟨p(x), v⟩`` instead assumes a smooth p; for α > 2, ``p_j = [y_j -
    t]_+^{1/(α-1)}`` is only Hölder continuous at the edge of the support and the exact
    central difference is off by ``O(h^{1/(α-1)})`` (6.9e-5 on :data:`STEEP_FLAT_ROW`, with
    the value exact to 1 ulp: test_edge_cases.test_steep_alpha_f_softmax_value_on_flat_rows).
    Where p is Lipschitz the bracket is ``O(h)`` wide, as tight as the old bound.
    """
    assume(x.shape[0] > 0 and not (x == -math.inf).all(-1).any())
    params = {"alpha": alpha} if div == "alpha" else {}
    q = torch.linspace(0.5, 1.5, x.shape[-1], dtype=torch.float64) if use_q else None
    xr = x.clone().requires_grad_(True)
    v = sa.f_softmax(xr, div, q=q, temperature=beta, **params)
    v.sum().backward()
    p = sa.f_softargmax(x, div, q=q, temperature=beta, **params)
    assert (xr.grad - p).abs().max() <= 1e-9
    # the value along a direction (finite entries only), on the shifted scores (the value
    # itself is of the size of the scores; the slack covers its rounding, ε |V| / h)
    xs = x - x.amax(-1, keepdim=True)
    g = torch.Generator().manual_seed(31 * x.shape[0] + x.shape[1])
    dirn = torch.randn(x.shape, generator=g, dtype=torch.float64).masked_fill(x == -math.inf, 0.0)
    h = 1e-6
    value = lambda z: sa.f_softmax(z, div, q=q, temperature=beta, **params)  # noqa: E731
    slope = lambda z: (sa.f_softargmax(z, div, q=q, temperature=beta, **params) * dirn).sum(-1)  # noqa: E731
    fd = (value(xs + h * dirn) - value(xs - h * dirn)) / (2 * h)
    slack = 1e-5 * max(1.0, float(dirn.abs().max()))
    assert (fd >= slope(xs - h * dirn) - slack).all() and (fd <= slope(xs + h * dirn) + slack).all()


@given(x=score_rows(max_k=12), mapping=st.sampled_from(["sparsemax", "entmax15", "softmax", "entmax-2.5",
                                                         "squared_hellinger", "jensen_shannon"]),
       soft=st.booleans(), reduction=st.sampled_from(["sum", "mean", "none"]))
def test_loss_gradient_is_p_minus_y(x, mapping, soft, reduction):
    R, k = x.shape
    assume(not (x == -math.inf).any())  # a target on a masked class has an infinite loss
    params = {}
    if mapping == "entmax-2.5":
        mapping, params = "entmax", {"alpha": 2.5}
    g = torch.Generator().manual_seed(R * 31 + k)
    if soft:
        y = torch.rand(R, k, generator=g, dtype=torch.float64)
        y = (y / y.sum(-1, keepdim=True)).to(x.dtype)
        if x.dtype in (torch.float16, torch.bfloat16):
            y = (y.float() / y.float().sum(-1, keepdim=True)).to(x.dtype)
            assume(bool(((y.double().sum(-1) - 1).abs() < 1e-4 * math.sqrt(k) + 1e-4).all()))
    else:
        y = torch.randint(0, k, (R,), generator=g)
    xr = x.clone().requires_grad_(True)
    loss, pred = sa.fenchel_young_loss(xr, y, mapping, reduction=reduction, return_prediction=True, **params)
    if R == 0:
        assert (reduction == "mean") == bool(torch.isnan(loss).all()) or reduction == "none"
        loss.sum().backward()
        assert xr.grad.shape == x.shape
        return
    assert torch.isfinite(loss).all() and (loss.double() >= -1e-3 * max(1.0, float(x.double().abs().max()) * 1e-3)).all()
    loss.sum().backward()
    yd = y.double() if soft else torch.nn.functional.one_hot(y, k).double()
    G = pred.double() - yd
    if reduction == "mean":
        G = G / R
    tol = {torch.float64: 1e-9, torch.float32: 1e-6}.get(x.dtype, 8e-3)
    assert (xr.grad.double() - G).abs().max() <= tol


@given(s=st.one_of(st.floats(-1e5, 1e5), st.sampled_from([math.inf, -math.inf, 0.0, 7e4, -7e4])),
       div=st.sampled_from(DIVERGENCES), alpha=alphas_any,
       q=st.tuples(st.floats(0.2, 5.0), st.floats(0.2, 5.0)), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_binary_contract(s, div, alpha, q, dtype):
    params = {"alpha": alpha} if div == "alpha" else {}
    t = torch.tensor([s], dtype=dtype)
    sig = sa.f_sigmoid(t, div, q=q, **params)
    sp = sa.f_softplus(t, div, q=q, **params)
    assert 0 <= float(sig) <= 1 and not math.isnan(float(sp))
    x = torch.tensor([[0.0, s]], dtype=torch.float64)
    qt = torch.tensor(q, dtype=torch.float64)
    if s == math.inf:
        assert float(sig) == 1 and float(sp) == math.inf
        return
    ref = sa.f_softargmax(x, div, q=qt, **params)[0, 1]
    ref_sp = sa.f_softmax(x, div, q=qt, **params)[0]  # -inf: the class is absent, as in f_softmax
    assert abs(float(sig) - float(ref)) <= (2e-6 if dtype == torch.float32 else 1e-9)
    if math.isfinite(float(ref_sp)):
        # f_softplus is a value of the size of s: its error scales with ε |s| (docs/numerics.md)
        eps = torch.finfo(dtype).eps
        assert abs(float(sp) - float(ref_sp)) <= 1e-9 + 64 * eps * max(1.0, abs(s), abs(float(ref_sp)))


@given(alpha=st.one_of(st.floats(-7, -2).map(lambda e: 1 + 10 ** e), st.floats(1.0, 1.01), st.floats(1.01, 2.5)),
       seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.float32, torch.float64]))
@example(alpha=2.0729873190467254, seed=541, dtype=torch.float64)
def test_alpha_gradient_matches_finite_differences(alpha, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 10, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(3, 10, generator=g, dtype=torch.float64)
    a = torch.full((3, 1), alpha, dtype=dtype, requires_grad=True)
    (sa.entmax(x, a) * v.to(dtype)).sum().backward()
    # small steps: an entry that just entered the support makes p(α) strongly curved (for
    # α > 2, p_j = b^{1/(α-1)} is not even differentiable at b = 0).  The reference's own
    # truncation error is then not negligible (7.9e-7 at h = 1e-6 for α = 2.073, an entry of
    # 4e-5 in the support; 7e-9 at h = 1e-7): it is estimated by the change from h to h/10
    # and allowed on top of the tolerance (where p is smooth that change is ~1e-10)
    xd = x.double()

    def fd(h):
        return ((entmax_ref64(xd, alpha + h) - entmax_ref64(xd, alpha - h)) * v).sum(-1) / (2 * h)

    ref = fd(1e-6)
    ref_error = (ref - fd(1e-7)).abs()
    err = (a.grad.squeeze(1).double() - ref).abs() - ref_error
    rel = err / ref.abs().clamp_min(1e-2)
    assert rel.max() <= (1e-3 if dtype == torch.float32 else 1e-6)
