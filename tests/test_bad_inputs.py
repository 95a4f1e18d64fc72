"""Bad arguments to every public callable, with generated inputs (hypothesis).

Every public function of :mod:`softargmax` (``softargmax.__all__``), the modules of
:mod:`softargmax.nn` (constructor and forward) and :mod:`softargmax.compat.entmax` is called
with one argument replaced by a bad value: a wrong Python type (a string, a list, ``None``, a
complex number, a bool where a number is expected), an integer/bool/complex tensor where a
floating one is needed, NaN/±inf/0/negative parameters, an out-of-range ``dim``, targets of
the wrong shape, dtype or range, class weights of the wrong length, masks of the wrong shape
or dtype.  The scores, batch shapes (empty batches included), class counts and dtypes are
drawn by hypothesis.  Each call must either

* raise a ``ValueError``/``TypeError`` whose message names the argument, or
* (for values marked as possibly valid) return a result that is finite, or non-finite only
  where the library documents it: a non-finite input, the ``"mean"`` of an empty batch or of
  zero total weight (NaN, as ``F.cross_entropy``), a budget-sparsemax loss of a class index
  (``+inf``: outside the capped simplex).

Any other exception (``RuntimeError``, ``IndexError``, ``AttributeError``, ...) fails, and no
input may be modified in place.  CI runs the ``ci`` hypothesis profile (conftest).
"""

from __future__ import annotations

import math

import pytest
import torch

import softargmax as sa
import softargmax.compat.entmax as ce
import softargmax.nn as snn

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

RAISE, MAY = True, False  # a bad value that must raise / that may give a documented answer


# ------------------------------------------------------------------------------------------
# generated inputs
# ------------------------------------------------------------------------------------------


class Ctx:
    """The inputs of one example: scores ``x`` of shape ``batch + (k,)`` and targets for them."""

    def __init__(self, batch, k, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        self.batch, self.k, self.dtype = tuple(batch), k, dtype
        self.shape = self.batch + (k,)
        self.n = math.prod(self.batch)
        self.x = (torch.randn(self.shape, generator=g, dtype=torch.float64) * 3).to(dtype)
        self.index = torch.randint(0, k, self.batch, generator=g)
        self.prob = torch.softmax(torch.randn(self.shape, generator=g, dtype=torch.float64), -1).to(dtype)
        self.q = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5).to(dtype)
        self.w = (torch.rand(k, generator=g, dtype=torch.float64) + 0.1).to(dtype)
        self.unit = torch.rand(self.shape, generator=g, dtype=torch.float64).to(dtype)
        d = 4
        self.hidden = torch.randn(self.batch + (d,), generator=g, dtype=torch.float64).to(dtype)
        self.W = torch.randn(k, d, generator=g, dtype=torch.float64).to(dtype)
        self.b = torch.randn(k, generator=g, dtype=torch.float64).to(dtype)


@st.composite
def contexts(draw):
    batch = draw(st.lists(st.integers(0, 3), min_size=1, max_size=2))
    k = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return Ctx(batch, k, dtype, draw(st.integers(0, 2**31 - 1)))


@st.composite
def attention_inputs(draw):
    B, H = draw(st.integers(0, 2)), draw(st.integers(1, 2))
    L, S, E = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return tuple(torch.randn(B, H, n, E, generator=g) for n in (L, S, S))


# ------------------------------------------------------------------------------------------
# bad values: (value, RAISE or MAY)
# ------------------------------------------------------------------------------------------


def bad_tensor(t):
    """Not a floating tensor."""
    return [("abc", RAISE), (t.tolist(), RAISE), (None, RAISE), (1.5, RAISE), (t.long(), RAISE), (t.bool(), RAISE),
            (t.to(torch.complex128), RAISE)]


WRONG_TYPES = [("1.5", RAISE), ([1.5], RAISE), (None, RAISE), (1 + 2j, RAISE), (True, RAISE)]
NON_FINITE = [(math.nan, RAISE), (math.inf, RAISE), (-math.inf, RAISE)]
#: a parameter that must be a finite number > 0 (temperature, softcap, budget)
POSITIVE = WRONG_TYPES + NON_FINITE + [(0, RAISE), (-1.0, RAISE), (torch.tensor(math.nan), RAISE)]
#: an optional parameter that is None or a finite number > 0 (softcap)
OPTIONAL_POSITIVE = [v for v in POSITIVE if v[0] is not None]
#: α of entmax-type maps (> 0 or > 1 depending on the map: values in between may be valid)
ALPHA = WRONG_TYPES + NON_FINITE + [(0, RAISE), (-1.0, RAISE), (0.5, MAY), (1.0, MAY), (torch.tensor(math.nan), RAISE)]
#: α where it must be > 1
ALPHA_GT1 = WRONG_TYPES + NON_FINITE + [(0, RAISE), (-1.0, RAISE), (0.5, RAISE), (1.0, RAISE)]
#: α of normmax: >= 1 (α = 1 is the argmax)
ALPHA_GE1 = WRONG_TYPES + NON_FINITE + [(0, RAISE), (-1.0, RAISE), (0.5, RAISE), (0.999, RAISE), (1.0, MAY)]
#: the α-ReLU threshold: any finite number
TAU = WRONG_TYPES + NON_FINITE + [(torch.tensor(math.nan), RAISE), (torch.tensor([math.inf]), RAISE),
                                  (torch.tensor(1), RAISE), (-1.0, MAY), (0, MAY)]
REDUCTION = [("avg", RAISE), (None, RAISE), (1, RAISE)]
MAPPING = [("nope", RAISE), (3, RAISE), (None, RAISE), ("", RAISE)]
IGNORE_INDEX = [(1.5, RAISE), ("x", RAISE), (None, RAISE), (True, RAISE), (torch.tensor(1.5), RAISE)]
#: the fused loss takes torch.nn.functional.linear_cross_entropy's ignore_index=None (meaning -100)
FUSED_IGNORE_INDEX = [(v, RAISE) for v, _ in IGNORE_INDEX if v is not None] + [(None, MAY)]
LABEL_SMOOTHING = [(-0.1, RAISE), (1.5, RAISE), (math.nan, RAISE), (math.inf, RAISE), ("0.1", RAISE), (None, RAISE),
                   (True, RAISE)]
COUNT = [(0, RAISE), (-1, RAISE), (1.5, RAISE), ("x", RAISE), (True, RAISE), (math.nan, RAISE)]


def bad_dim(ndim):
    return [(1.5, RAISE), ("0", RAISE), (None, RAISE), (True, RAISE), (ndim, RAISE), (-ndim - 1, RAISE)]


def bad_q(c: Ctx):
    q = c.q
    return [("abc", RAISE), (q.tolist(), RAISE), (1.5, RAISE), (q.long(), RAISE), (q.to(torch.complex128), RAISE),
            (torch.ones(c.k + 1, dtype=c.dtype), RAISE), (torch.full_like(q, math.nan), RAISE), (-q, RAISE),
            (torch.zeros_like(q), RAISE), (torch.full_like(q, math.inf), RAISE),
            (q.expand((2,) * (len(c.shape)) + (c.k,)), RAISE)]


def bad_class_weight(c: Ctx):
    w = c.w
    return [("abc", RAISE), (w.tolist(), RAISE), (torch.ones(c.k + 1, dtype=c.dtype), RAISE), (w.long(), RAISE),
            (-w, RAISE), (torch.full_like(w, math.nan), RAISE), (torch.full_like(w, math.inf), RAISE),
            (w.unsqueeze(0), RAISE), (w.to(torch.complex128), RAISE), (torch.zeros_like(w), MAY)]


def bad_index_target(c: Ctx):
    """Class-index targets of the wrong type, shape, dtype or range (range: only with a non-empty batch)."""
    t = c.index
    out = [("abc", RAISE), (t.tolist(), RAISE), (None, RAISE), (t.bool(), RAISE), (t.to(torch.complex64), RAISE),
           (t.unsqueeze(-1).expand(c.batch + (2,)), RAISE), (t.reshape(-1)[:0] if c.n else t.unsqueeze(0), MAY)]
    if c.n:
        out += [(torch.full_like(t, c.k), RAISE), (torch.full_like(t, -1), RAISE), (t.to(c.dtype), RAISE),
                (t.reshape(-1)[:-1], RAISE), (t.to(torch.uint8), MAY)]
    return out


def bad_prob_target(c: Ctx):
    p = c.prob
    out = [(torch.full_like(p, math.nan), MAY)]  # documented: a NaN target gives a NaN loss
    if c.n:
        out += [(p * 2, RAISE), (-p, RAISE), (p[..., :-1] if c.k > 1 else p.unsqueeze(0), RAISE)]
    return out


def loss_bad(c: Ctx, **extra):
    bad = dict(x=bad_tensor(c.x), target=bad_index_target(c) + bad_prob_target(c), dim=bad_dim(len(c.shape)),
               reduction=REDUCTION, ignore_index=IGNORE_INDEX, label_smoothing=LABEL_SMOOTHING,
               weight=bad_class_weight(c), softcap=OPTIONAL_POSITIVE)
    bad.update(extra)
    return bad


# ------------------------------------------------------------------------------------------
# the public surface: name -> (call(**kwargs), good kwargs of a context, bad values of a context)
# ------------------------------------------------------------------------------------------


def module(cls, *forward_args):
    """Construct ``cls`` from the keyword arguments not in ``forward_args`` and call it on those."""

    def call(**kw):
        fwd = [kw.pop(a) for a in forward_args]
        return cls(**kw)(*fwd)

    call.__name__ = cls.__name__
    return call


SURFACE = {
    "sparsemax": (sa.sparsemax, lambda c: dict(x=c.x), lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)))),
    "entmax15": (sa.entmax15, lambda c: dict(x=c.x), lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)))),
    "entmax": (sa.entmax, lambda c: dict(x=c.x, alpha=1.5),
               lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), alpha=ALPHA)),
    "alpha_relu": (sa.alpha_relu, lambda c: dict(x=c.x, alpha=1.5, tau=0.5),
                   lambda c: dict(x=bad_tensor(c.x), alpha=ALPHA_GT1, tau=TAU + [(torch.zeros(c.k + 1), RAISE)])),
    "normmax": (sa.normmax, lambda c: dict(x=c.x, alpha=2.0),
                lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), alpha=ALPHA_GE1)),
    "budget_sparsemax": (sa.budget_sparsemax, lambda c: dict(x=c.x, budget=2.0),
                         lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), budget=POSITIVE)),
    "f_softargmax": (sa.f_softargmax, lambda c: dict(x=c.x, divergence="alpha", alpha=1.5, q=c.q),
                     lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), divergence=MAPPING, q=bad_q(c),
                                    temperature=POSITIVE, alpha=ALPHA)),
    "f_softmax": (sa.f_softmax, lambda c: dict(x=c.x, divergence="jensen_shannon", q=c.q),
                  lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), divergence=MAPPING, q=bad_q(c),
                                 temperature=POSITIVE)),
    "f_sigmoid": (sa.f_sigmoid, lambda c: dict(s=c.x, divergence="chi_square"),
                  lambda c: dict(s=bad_tensor(c.x), divergence=MAPPING, temperature=POSITIVE,
                                 q=[("x", RAISE), (None, RAISE), ((1.0,), RAISE), ((1.0, -1.0), RAISE),
                                    ((math.nan, 1.0), RAISE), ((0.0, 1.0), RAISE), ((1.0, math.inf), RAISE)])),
    "f_softplus": (sa.f_softplus, lambda c: dict(s=c.x, divergence="kl"),
                   lambda c: dict(s=bad_tensor(c.x), divergence=MAPPING, temperature=POSITIVE,
                                  q=[("x", RAISE), (None, RAISE), ((1.0, -1.0), RAISE), ((math.nan, 1.0), RAISE)])),
    "normalize": (sa.normalize, lambda c: dict(x=c.x, mapping="entmax", alpha=1.5),
                  lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), mapping=MAPPING, alpha=ALPHA)),
    "fenchel_young_loss": (sa.fenchel_young_loss, lambda c: dict(x=c.x, target=c.index, mapping="entmax15"),
                           lambda c: loss_bad(c, mapping=MAPPING, temperature=POSITIVE, q=bad_q(c))),
    "fenchel_young_loss[kl, q]": (sa.fenchel_young_loss, lambda c: dict(x=c.x, target=c.prob, mapping="kl", q=c.q),
                                  lambda c: loss_bad(c, q=bad_q(c), temperature=POSITIVE)),
    "sparsemax_loss": (sa.sparsemax_loss, lambda c: dict(x=c.x, target=c.index), loss_bad),
    "entmax15_loss": (sa.entmax15_loss, lambda c: dict(x=c.x, target=c.index), loss_bad),
    "entmax_loss": (sa.entmax_loss, lambda c: dict(x=c.x, target=c.index, alpha=1.3),
                    lambda c: loss_bad(c, alpha=ALPHA)),
    "alpha_relu_loss": (sa.alpha_relu_loss, lambda c: dict(x=c.x, target=c.index, alpha=1.5, tau=0.2),
                        lambda c: loss_bad(c, alpha=ALPHA_GT1, tau=TAU)),
    "f_divergence_loss": (sa.f_divergence_loss, lambda c: dict(x=c.x, target=c.index, divergence="squared_hellinger"),
                          lambda c: loss_bad(c, divergence=MAPPING, q=bad_q(c), temperature=POSITIVE)),
    "normmax_loss": (sa.normmax_loss, lambda c: dict(x=c.x, target=c.index, alpha=2.0),
                     lambda c: {**loss_bad(c, alpha=ALPHA_GE1), "softcap": []}),
    "budget_sparsemax_loss": (sa.budget_sparsemax_loss, lambda c: dict(x=c.x, target=c.index, budget=1.0),
                              lambda c: {**loss_bad(c, budget=POSITIVE + [(3.0, MAY)]), "softcap": []}),
    "binary_f_divergence_loss": (
        sa.binary_f_divergence_loss, lambda c: dict(s=c.x, target=c.unit, divergence="kl", weight=c.unit),
        lambda c: dict(s=bad_tensor(c.x), divergence=MAPPING, temperature=POSITIVE, reduction=REDUCTION,
                       target=[("abc", RAISE), (None, RAISE), (c.unit.reshape(-1), RAISE if c.x.dim() > 1 else MAY),
                               (c.unit.unsqueeze(0), RAISE)] + ([(c.unit + 2, RAISE), (-1 - c.unit, RAISE)] if c.n else []),
                       weight=[("abc", RAISE), (torch.ones(c.k + 1, dtype=c.dtype), RAISE), (c.unit.long(), RAISE),
                               (torch.full_like(c.unit, math.nan), RAISE if c.n else MAY), (c.unit.unsqueeze(0).expand(2, *c.shape), RAISE)],
                       q=[("x", RAISE), (None, RAISE), ((1.0, -1.0), RAISE), ((math.nan, 1.0), RAISE)])),
    "linear_fenchel_young_loss": (
        sa.linear_fenchel_young_loss, lambda c: dict(hidden=c.hidden, weight=c.W, target=c.index, bias=c.b),
        lambda c: dict(hidden=bad_tensor(c.hidden) + [(c.hidden[..., :3], RAISE)], weight=bad_tensor(c.W),
                       target=bad_index_target(c) + bad_prob_target(c),
                       bias=[("abc", RAISE), (c.b.tolist(), RAISE), (torch.ones(c.k + 1, dtype=c.dtype), RAISE),
                             (c.b.long(), RAISE), (c.b.unsqueeze(0), RAISE), (c.b.to(torch.complex128), RAISE)],
                       mapping=MAPPING, chunk_size=COUNT, memory_budget=COUNT, q=bad_q(c)[:-1], temperature=POSITIVE,
                       reduction=REDUCTION, ignore_index=FUSED_IGNORE_INDEX, label_smoothing=LABEL_SMOOTHING,
                       class_weight=bad_class_weight(c), softcap=OPTIONAL_POSITIVE,
                       return_stats=[("yes", RAISE), (1, RAISE), (None, RAISE)])),
    "linear_fenchel_young_loss(reduction='none')": (
        sa.linear_fenchel_young_loss,
        lambda c: dict(hidden=c.hidden, weight=c.W, target=c.index, bias=c.b, reduction="none", return_stats=True),
        lambda c: dict(hidden=bad_tensor(c.hidden), target=bad_index_target(c) + bad_prob_target(c),
                       mapping=MAPPING, temperature=POSITIVE, ignore_index=FUSED_IGNORE_INDEX,
                       class_weight=bad_class_weight(c), softcap=OPTIONAL_POSITIVE)),
    "teacher_target": (
        sa.teacher_target, lambda c: dict(logits=c.x, temperature=2.0, top_k=1),
        lambda c: dict(logits=bad_tensor(c.x), temperature=POSITIVE,
                       top_k=[(0, RAISE), (c.k + 1, RAISE), (1.5, RAISE), ("x", RAISE), (True, RAISE)])),
    # torch.nn modules: constructor and forward arguments in one call
    "nn.Sparsemax": (module(snn.Sparsemax, "x"), lambda c: dict(x=c.x),
                     lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)))),
    "nn.Entmax15": (module(snn.Entmax15, "x"), lambda c: dict(x=c.x), lambda c: dict(x=bad_tensor(c.x))),
    "nn.Entmax": (module(snn.Entmax, "x"), lambda c: dict(x=c.x, alpha=1.5, learn_alpha=True),
                  lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), alpha=ALPHA,
                                 alpha_min=WRONG_TYPES + NON_FINITE + [(-1.0, RAISE), (0.0, RAISE), (1.7, RAISE)],
                                 alpha_max=WRONG_TYPES + NON_FINITE + [(1.0, RAISE), (1.2, RAISE)])),
    "nn.AlphaReLU": (module(snn.AlphaReLU, "x"), lambda c: dict(x=c.x, alpha=1.5, tau=0.1),
                     lambda c: dict(x=bad_tensor(c.x), alpha=ALPHA_GT1, tau=TAU + [("nope", RAISE)])),
    "nn.FSoftargmax": (module(snn.FSoftargmax, "x"), lambda c: dict(x=c.x, divergence="alpha", alpha=1.5, q=c.q),
                       lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), divergence=MAPPING,
                                      q=bad_q(c)[:-1], temperature=POSITIVE, alpha=ALPHA)),
    "nn.Normmax": (module(snn.Normmax, "x"), lambda c: dict(x=c.x),
                   lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), alpha=ALPHA_GE1)),
    "nn.BudgetSparsemax": (module(snn.BudgetSparsemax, "x"), lambda c: dict(x=c.x),
                           lambda c: dict(x=bad_tensor(c.x), dim=bad_dim(len(c.shape)), budget=POSITIVE)),
    "nn.FenchelYoungLoss": (module(snn.FenchelYoungLoss, "x", "target"), lambda c: dict(x=c.x, target=c.index),
                            lambda c: loss_bad(c, mapping=MAPPING, temperature=POSITIVE)),
    "nn.SparsemaxLoss": (module(snn.SparsemaxLoss, "x", "target"), lambda c: dict(x=c.x, target=c.index),
                         lambda c: dict(x=bad_tensor(c.x), target=bad_index_target(c), reduction=REDUCTION)),
    "nn.Entmax15Loss": (module(snn.Entmax15Loss, "x", "target"), lambda c: dict(x=c.x, target=c.index),
                        lambda c: dict(x=bad_tensor(c.x), weight=bad_class_weight(c), dim=bad_dim(len(c.shape)))),
    "nn.EntmaxLoss": (module(snn.EntmaxLoss, "x", "target"), lambda c: dict(x=c.x, target=c.index),
                      lambda c: dict(alpha=ALPHA, label_smoothing=LABEL_SMOOTHING)),
    "nn.AlphaReLULoss": (module(snn.AlphaReLULoss, "x", "target"), lambda c: dict(x=c.x, target=c.index),
                         lambda c: dict(alpha=ALPHA_GT1, tau=TAU)),
    "nn.FDivergenceLoss": (module(snn.FDivergenceLoss, "x", "target"), lambda c: dict(x=c.x, target=c.index),
                           lambda c: dict(divergence=MAPPING, q=bad_q(c)[:-1], temperature=POSITIVE)),
    "nn.NormmaxLoss": (module(snn.NormmaxLoss, "x", "target"), lambda c: dict(x=c.x, target=c.index),
                       lambda c: dict(alpha=ALPHA_GE1, target=bad_index_target(c), dim=bad_dim(len(c.shape)))),
    "nn.BudgetSparsemaxLoss": (module(snn.BudgetSparsemaxLoss, "x", "target"),
                               lambda c: dict(x=c.x, target=c.index, budget=1.0),
                               lambda c: dict(budget=POSITIVE, ignore_index=IGNORE_INDEX)),
}

for _name in ce.__all__:  # the entmax package's API
    _fn = getattr(ce, _name)
    if isinstance(_fn, type):
        continue
    if _name.endswith("_loss"):
        _extra = {"alpha": ALPHA} if _name == "entmax_bisect_loss" else {"alpha": ALPHA_GE1} if "normmax" in _name else {}
        SURFACE["compat." + _name] = (_fn, lambda c: dict(X=c.x, target=c.index),
                                      lambda c, e=_extra: dict(X=bad_tensor(c.x), target=bad_index_target(c), **e))
    else:
        _extra = {"alpha": ALPHA} if _name == "entmax_bisect" else {"alpha": ALPHA_GE1} if _name == "normmax_bisect" \
            else {"budget": WRONG_TYPES + NON_FINITE + [(-1.0, RAISE), (torch.ones(7), RAISE)]} if _name == "budget_bisect" else {}
        SURFACE["compat." + _name] = (_fn, lambda c: dict(X=c.x),
                                      lambda c, e=_extra: dict(X=bad_tensor(c.x), dim=bad_dim(len(c.shape)), **e))
SURFACE.update({
    "compat.EntmaxBisect": (module(ce.EntmaxBisect, "X"), lambda c: dict(X=c.x),
                            lambda c: dict(X=bad_tensor(c.x), alpha=ALPHA, dim=bad_dim(len(c.shape)))),
    "compat.BudgetBisect": (module(ce.BudgetBisect, "X"), lambda c: dict(X=c.x),
                            lambda c: dict(budget=WRONG_TYPES + NON_FINITE + [(-1.0, RAISE)])),
    "compat.SparsemaxLoss": (module(ce.SparsemaxLoss, "X", "target"), lambda c: dict(X=c.x, target=c.index),
                             lambda c: dict(X=bad_tensor(c.x), target=bad_index_target(c), ignore_index=IGNORE_INDEX,
                                            reduction=REDUCTION + [("mean", RAISE)])),
    "compat.EntmaxBisectLoss": (module(ce.EntmaxBisectLoss, "X", "target"), lambda c: dict(X=c.x, target=c.index),
                                lambda c: dict(alpha=ALPHA, ignore_index=IGNORE_INDEX)),
    "compat.NormmaxBisectLoss": (module(ce.NormmaxBisectLoss, "X", "target"), lambda c: dict(X=c.x, target=c.index),
                                 lambda c: dict(alpha=ALPHA_GE1)),
})

CASES = [(name, arg) for name, (_, good, bad) in SURFACE.items() for arg in bad(Ctx((2,), 3, torch.float64, 0))]


# ------------------------------------------------------------------------------------------
# the contract
# ------------------------------------------------------------------------------------------


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)


def _snapshot(kw):
    return {k: [t.clone() for t in _tensors(v)] for k, v in kw.items()}


def _unchanged(kw, snap):
    for k, v in kw.items():
        for a, b in zip(_tensors(v), snap[k]):
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5)):
                return k
    return None


def _documented_non_finite(name: str, kw) -> bool:
    """Where the library documents a non-finite answer (module docstring)."""
    if any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for v in kw.values() for t in _tensors(v)):
        return True  # a non-finite input
    if "loss" in name.lower():
        x = kw.get("x", kw.get("X", kw.get("hidden")))
        empty = x is not None and x.numel() == 0
        w = kw.get("weight") if "linear" not in name else kw.get("class_weight")
        zero_weight = isinstance(w, torch.Tensor) and w.is_floating_point() and bool((w == 0).all())
        if empty or zero_weight:
            return True  # the mean over no items: NaN, as F.cross_entropy
        budget = kw.get("budget", 1.0)
        if "budget" in name.lower() and isinstance(budget, float) and budget > 1:
            return True  # a class index lies outside the capped simplex: +inf
    return False


def check_call(name, fn, kw, arg, value, must_raise):
    kw = dict(kw)
    kw[arg] = value
    snap = _snapshot(kw)
    shown = f"{name}({arg}={value!r})"
    try:
        out = fn(**kw)
    except (ValueError, TypeError) as e:
        assert arg in str(e), f"{shown}: the message does not name {arg!r}: {type(e).__name__}: {e}"
        assert _unchanged(kw, snap) is None, f"{shown} modified an input in place"
        return
    assert not must_raise, f"{shown} was accepted"
    changed = _unchanged(kw, snap)
    assert changed is None, f"{shown} modified {changed} in place"
    outs = [t for t in _tensors(out) if t.is_floating_point()]
    if not _documented_non_finite(name, kw):
        assert all(bool(torch.isfinite(t).all()) for t in outs), f"{shown} gave a non-finite result"


@pytest.mark.parametrize("name", list(SURFACE))
@given(c=contexts())
def test_good_inputs_are_finite_and_untouched(name, c):
    """The reference call of every case: finite (or documented) and no input modified."""
    fn, good, _ = SURFACE[name]
    kw = good(c)
    snap = _snapshot(kw)
    out = fn(**kw)
    assert _unchanged(kw, snap) is None
    if not _documented_non_finite(name, kw):
        assert all(bool(torch.isfinite(t).all()) for t in _tensors(out) if t.is_floating_point())


@pytest.mark.parametrize("name, arg", CASES, ids=[f"{n}-{a}" for n, a in CASES])
@given(c=contexts())
def test_bad_argument_is_named(name, arg, c):
    """Every bad value of ``arg``: a ValueError/TypeError naming it, or a documented answer."""
    fn, good, bad = SURFACE[name]
    kw = good(c)
    for value, must_raise in bad(c)[arg]:
        check_call(name, fn, kw, arg, value, must_raise)


ATTENTION_BAD = {
    "query": lambda q, k, v: bad_tensor(q) + [(q[..., :0, :], MAY), (torch.randn(*q.shape[:-1], q.shape[-1] + 1), RAISE)],
    "key": lambda q, k, v: bad_tensor(k) + [(torch.randn(*k.shape[:-2], k.shape[-2] + 1, k.shape[-1]), RAISE)],
    "value": lambda q, k, v: bad_tensor(v) + [(v[..., :1], MAY), (torch.randn(*v.shape[:-2], v.shape[-2] + 1, v.shape[-1]), RAISE)],
    "attn_mask": lambda q, k, v: [("abc", RAISE), (torch.ones(q.shape[-2], k.shape[-2] + 1, dtype=torch.bool), RAISE),
                                  (torch.ones(q.shape[-2], k.shape[-2], dtype=torch.long), RAISE),
                                  (torch.ones(q.shape[-2], k.shape[-2], dtype=torch.complex64), RAISE),
                                  (torch.ones(3, *q.shape[:-1], k.shape[-2], dtype=torch.bool), RAISE),
                                  (torch.zeros(q.shape[-2], k.shape[-2], dtype=torch.bool), MAY)],
    "dropout_p": lambda q, k, v: WRONG_TYPES + NON_FINITE + [(1.0, RAISE), (-0.1, RAISE), (torch.tensor([0.1, 0.2]), RAISE)],
    "scale": lambda q, k, v: [("x", RAISE), (1 + 2j, RAISE), ([1.0], RAISE), (True, RAISE)] + NON_FINITE
    + [(0.0, MAY), (-1.0, MAY)],
    "mapping": lambda q, k, v: MAPPING,
    "alpha": lambda q, k, v: ALPHA + [(torch.full((q.shape[-3] + 1,), 1.5), RAISE)],
}


@pytest.mark.parametrize("arg", list(ATTENTION_BAD))
@given(qkv=attention_inputs())
def test_attention_bad_argument_is_named(arg, qkv):
    q, k, v = qkv
    kw = dict(query=q, key=k, value=v, mapping="entmax", alpha=1.5)
    for value, must_raise in ATTENTION_BAD[arg](q, k, v):
        check_call("attention", sa.attention, kw, arg, value, must_raise)


MHA_BAD = {
    "embed_dim": [(0, RAISE), (-1, RAISE), (1.5, RAISE), ("x", RAISE), (7, RAISE)],
    "num_heads": [(0, RAISE), (3, RAISE), (1.5, RAISE), ("x", RAISE)],
    "dropout": [(-0.1, RAISE), (1.5, RAISE), ("x", RAISE)],
    "mapping": MAPPING,
    "alpha": WRONG_TYPES + NON_FINITE + [(torch.tensor([1.5, 1.5, 1.5]), RAISE), (0.5, RAISE)],
}


@st.composite
def mha_inputs(draw):
    L, S, B = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return L, S, B, torch.randn(L, B, 8, generator=g), torch.randn(S, B, 8, generator=g)


@pytest.mark.parametrize("arg", list(MHA_BAD))
def test_sparse_multihead_attention_constructor(arg):
    kw = dict(embed_dim=8, num_heads=2, mapping="entmax", alpha=1.5)
    for value, must_raise in MHA_BAD[arg]:
        check_call("SparseMultiheadAttention", snn.SparseMultiheadAttention, kw, arg, value, must_raise)


@pytest.mark.parametrize("arg", ["query", "key", "value", "key_padding_mask", "attn_mask"])
@given(inputs=mha_inputs())
def test_sparse_multihead_attention_forward(arg, inputs):
    L, S, B, query, key = inputs
    m = snn.SparseMultiheadAttention(8, 2, mapping="entmax15")
    bad = {
        "query": bad_tensor(query) + [(query[..., :7], RAISE), (query[0], RAISE)],
        "key": bad_tensor(key) + [(key[..., :7], RAISE), (key[:, :0], RAISE) if B else (key, MAY)],
        "value": bad_tensor(key) + [(key[1:], RAISE) if S > 1 else (key[:, :, :3], RAISE)],
        "key_padding_mask": [("x", RAISE), (torch.ones(B, S + 1, dtype=torch.bool), RAISE),
                             (torch.ones(B, S, dtype=torch.long), RAISE), (torch.zeros(B, S, dtype=torch.bool), MAY)],
        "attn_mask": [("x", RAISE), (torch.ones(L, S + 1, dtype=torch.bool), RAISE),
                      (torch.ones(L, S, dtype=torch.long), RAISE), (torch.ones(5, L, S, dtype=torch.bool), RAISE)],
    }[arg]
    kw = dict(query=query, key=key, value=key)
    for value, must_raise in bad:
        check_call("SparseMultiheadAttention.forward", lambda **a: m(**a), kw, arg, value, must_raise)
