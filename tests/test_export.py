"""Export and deployment: ONNX (run in onnxruntime), torch.export (saved and loaded, decomposed),
torch.jit.trace and torch.jit.script, each compared with the eager operators.

The references are the eager operators (the fused C solver and the PyTorch solver); the exported
graphs compute differently (sort-based closed forms, a fixed number of Newton steps inside a
bracket, onnxruntime's kernels).  To keep the suite quick, every operator goes into one model with
one output per operator, exported once.
"""

import io
import math
import warnings

import pytest
import torch
from test_compile import _Sharp  # a user's generator: chi-square (c = 1) from its four functions

import softargmax
from softargmax import nn as snn
from softargmax.divergences import DIVERGENCE_NAMES, get_divergence
from softargmax.operators._traceable import normalized_graph
from softargmax.solvers import traceable

TOL = 1e-5
K = 8


def _inputs(batch: int = 6, k: int = K, seed: int = 0):
    """Scores with masked entries, a fully masked row, ties, a large offset and NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, k, generator=g) * 3
    x[0, 2:5] = -math.inf
    x[1] = -math.inf
    x[2, : k // 2] = 1.5  # ties at the maximum
    x[3] += 1e4
    if batch > 4:
        x[4, 3] = math.nan
    return x


def _close(got: torch.Tensor, ref: torch.Tensor, rtol: float = 0.0) -> None:
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    ok = ~torch.isnan(ref)
    err = (got[ok] - ref[ok]).abs().max().item() if ok.any() else 0.0
    assert err <= TOL + rtol * ref[ok].abs().max().item(), err


class Zoo(torch.nn.Module):
    """One output per operator: sparsemax, 1.5-entmax, α-entmax (float α, α > 2, one α per row),
    α-ReLU, every f-softargmax with q, two with a temperature, normmax (α = 2, 3, 1, one per row)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("q", torch.rand(K, generator=g) + 0.5)
        self.acts = torch.nn.ModuleList([
            snn.Sparsemax(), snn.Entmax15(), snn.Entmax(1.3), snn.Entmax(3.0), snn.Entmax(1.001),
            snn.Entmax(torch.tensor([1.2, 1.7, 1.0, 2.0, 1.5, 1.1, 1.9, 1.4])[:1].reshape(1, 1)),
            snn.AlphaReLU(1.5, 0.1), snn.AlphaReLU(1.3, torch.tensor(0.2)),
            snn.Normmax(2.0), snn.Normmax(3.0), snn.Normmax(1.0),
        ])
        self.fdivs = [get_divergence(n, **({"alpha": 1.7} if n == "alpha" else {})) for n in DIVERGENCE_NAMES]
        self.names = ([type(m).__name__ for m in self.acts] + [f"f_softargmax({d.name}, q)" for d in self.fdivs]
                      + ["f_softargmax(jensen_shannon, β=0.7)", "f_softargmax(chi_square, β=0.7)"]
                      + ["entmax(per row α)", "normmax(per row α)"])

    def forward(self, x):
        outs = [m(x) for m in self.acts]
        outs += [softargmax.f_softargmax(x, d, q=self.q) for d in self.fdivs]
        outs += [softargmax.f_softargmax(x, d, temperature=0.7) for d in ("jensen_shannon", "chi_square")]
        rows = 1.05 + torch.sigmoid(x.detach().sum(-1, keepdim=True).nan_to_num(0.0, 0.0, 0.0))  # α per row in (1.05, 2.05)
        outs.append(softargmax.entmax(x, rows))
        outs.append(softargmax.normmax(x, 1 + rows))
        return tuple(outs)


@pytest.fixture(scope="module")
def ort():
    pytest.importorskip("onnxscript")
    return pytest.importorskip("onnxruntime")


def _onnx_session(ort, model, args, dynamic_shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamic_shapes=dynamic_shapes, verbose=False)
    nodes = {n.op_type for n in program.model_proto.graph.node}
    assert not any("softargmax" in n for n in nodes)
    return ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(session, *args):
    names = [i.name for i in session.get_inputs()]
    return [torch.from_numpy(o) for o in session.run(None, {n: a.numpy() for n, a in zip(names, args)})]


@pytest.fixture(scope="module")
def zoo_session(ort):
    model = Zoo().eval()
    return model, _onnx_session(ort, model, (torch.randn(4, K),), ({0: torch.export.Dim.DYNAMIC},))


@pytest.mark.parametrize("batch", [6, 1, 13])
def test_every_operator_exports_to_onnx_and_agrees_with_eager(zoo_session, batch):
    """Exported once with a batch of 4; run with other batch sizes, masks, ties, offsets, NaN."""
    model, session = zoo_session
    x = _inputs(batch) if batch > 1 else torch.randn(1, K)
    with torch.no_grad():
        refs = model(x)
    outs = _run(session, x)
    assert len(outs) == len(refs)
    for name, got, ref in zip(model.names, outs, refs):
        # α-ReLU is not normalized: its large outputs are compared relatively
        rtol = 1e-6 if "AlphaReLU" in name else 0.0
        try:
            _close(got, ref, rtol)
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None
    if batch > 1:  # the masked row and the masked entries
        for name, got in zip(model.names, outs):
            if "AlphaReLU" not in name:
                assert torch.all(got[1] == 0) and torch.all(got[0, 2:5] == 0), name


class _Attention(torch.nn.Module):
    def __init__(self, mapping, alpha=None):
        super().__init__()
        self.mapping, self.alpha = mapping, alpha

    def forward(self, q, k, v, mask):
        return softargmax.attention(q, k, v, attn_mask=mask, mapping=self.mapping, alpha=self.alpha)


def test_causal_attention_exports_for_any_length(monkeypatch):
    """Eager causal attention runs by blocks of query rows past ``CAUSAL_BLOCK`` (16 here); ``torch.export`` with a
    dynamic length, from an example longer than a block, records the one-block graph, which runs at any length."""
    monkeypatch.setattr(softargmax.operators.attention, "CAUSAL_BLOCK", 16)

    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return softargmax.attention(q, k, v, is_causal=True, mapping="entmax15")

    g = torch.Generator().manual_seed(5)
    D = torch.export.Dim.DYNAMIC
    program = torch.export.export(Causal(), tuple(torch.randn(1, 2, 40, 8, generator=g) for _ in range(3)),
                                  dynamic_shapes=({2: D}, {2: D}, {2: D}))
    for L in (10, 70):
        q, k, v = (torch.randn(1, 2, L, 8, generator=g) for _ in range(3))
        torch.testing.assert_close(program.module()(q, k, v), Causal()(q, k, v), atol=1e-6, rtol=1e-5)


def test_attention_function_and_module_export_with_dynamic_batch_and_length(ort):
    """The function and the module, each with a dynamic batch and dynamic query and key lengths."""
    D = torch.export.Dim.DYNAMIC
    g = torch.Generator().manual_seed(2)
    # the functional form with a boolean mask: a per-head α, a float α and an f-divergence run the
    # solver's loop (the mask's broadcast checks the lengths: the loop once read a stride there)
    shapes = ({0: D, 2: D}, {0: D, 2: D}, {0: D, 2: D}, {0: D, 2: D, 3: D})
    for fn in (_Attention("entmax", torch.tensor([1.2, 1.5, 2.0])), _Attention("entmax", 1.3),
               _Attention("jensen_shannon")):
        q = torch.randn(2, 3, 5, 4, generator=g)
        k, v = (torch.randn(2, 3, 6, 4, generator=g) for _ in range(2))
        sess = _onnx_session(ort, fn, (q, k, v, torch.ones(2, 1, 5, 6, dtype=torch.bool)), shapes)
        for batch, L, S in ((3, 7, 9), (1, 2, 11)):
            q = torch.randn(batch, 3, L, 4, generator=g)
            k, v = (torch.randn(batch, 3, S, 4, generator=g) for _ in range(2))
            mask = torch.rand(batch, 1, L, S, generator=g) > 0.3
            mask[0, 0, 1] = False  # a query with every key masked: zero weights, zero output
            got = _run(sess, q, k, v, mask)[0]
            _close(got, fn(q, k, v, mask))
            assert torch.all(got[0, :, 1] == 0)
    # the module, batch first, with a key padding mask: sparsemax (sorted) and a learnable α per head (the loop)
    for options in ({"mapping": "sparsemax"}, {"mapping": "entmax", "alpha": 1.4, "learn_alpha": True}):
        mha = snn.SparseMultiheadAttention(8, 2, batch_first=True, **options).eval()

        class Wrap(torch.nn.Module):
            def __init__(self, mha):
                super().__init__()
                self.mha = mha

            def forward(self, x, pad):
                return self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]

        x = torch.randn(2, 5, 8, generator=g)
        sess = _onnx_session(ort, Wrap(mha), (x, torch.zeros(2, 5, dtype=torch.bool)), ({0: D, 1: D}, {0: D, 1: D}))
        x = torch.randn(4, 9, 8, generator=g)
        pad = torch.zeros(4, 9, dtype=torch.bool)
        pad[1, 6:] = True
        with torch.no_grad():
            _close(_run(sess, x, pad)[0], Wrap(mha)(x, pad))


@pytest.mark.parametrize("act", ["sparsemax", "entmax15"])
def test_tabnet_attentive_block_exports(ort, act):
    """TabNet's attentive transformer: Linear -> BatchNorm1d -> prior scaling -> sparsemax / 1.5-entmax mask."""
    torch.manual_seed(3)

    class Attentive(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 12, bias=False)
            self.bn = torch.nn.BatchNorm1d(12)
            self.act = snn.Sparsemax() if act == "sparsemax" else snn.Entmax15()

        def forward(self, a, prior):
            return self.act(self.bn(self.fc(a)) * prior)

    block = Attentive()
    block.train()
    block(torch.randn(64, 16), torch.ones(64, 12))  # running statistics
    block.eval()
    sess = _onnx_session(ort, block, (torch.randn(4, 16), torch.ones(4, 12)),
                         ({0: torch.export.Dim.DYNAMIC}, {0: torch.export.Dim.DYNAMIC}))
    a, prior = torch.randn(37, 16) * 4, torch.rand(37, 12) + 0.2
    with torch.no_grad():
        ref = block(a, prior)
    got = _run(sess, a, prior)[0]
    _close(got, ref)
    assert (got == 0).any()  # sparse masks


# -- the graph forms themselves, without an exporter (quick, wide ranges) -----------------


@pytest.mark.parametrize("name", [n for n in DIVERGENCE_NAMES if n != "kl"] + ["alpha0.5", "alpha1.01", "alpha2.5", "alpha6"])
def test_graph_forms_agree_with_the_reference_solver_over_the_stated_ranges(name):
    """Spreads up to 1e3, offsets ±1e4, rows of 2 to 4096 entries, ties, masks."""
    if name.startswith("alpha") and name != "alpha":
        div = get_divergence("alpha", alpha=float(name[5:]))
    else:
        div = get_divergence(name, **({"alpha": 1.7} if name == "alpha" else {}))
    g = torch.Generator().manual_seed(4)
    for k in (2, 9, 300, 4096):
        for spread in (1e-3, 1.0, 30.0, 1e3):
            x = torch.randn(5, k, generator=g) * spread + 1e4 * torch.randn(5, 1, generator=g).sign()
            x[0, : k // 2] = x[0, 0]
            x[1, 1::3] = -math.inf
            ref = softargmax.f_softargmax(x, div)
            got = normalized_graph(x, None, None, div, 1.0, 1)
            _close(got, ref)


def test_fewer_steps_are_not_enough():
    """The step count matters: three Newton steps leave Jeffrey's f-softargmax visibly off (so the
    test above can fail)."""
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(5)) * 3
    div = get_divergence("jeffrey")
    p = traceable.solve_rows(x, div, None, iterations=3)
    assert (p - softargmax.f_softargmax(x, div)).abs().max() > 1e-5


def test_sorted_closed_forms_match_brute_force():
    """Sparsemax and 1.5-entmax by sorting against an exhaustive search over supports (k = 6)."""
    import itertools

    x = torch.randn(20, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 2
    for row in x:
        zs = row - row.max()
        for fn, power in ((traceable.sparsemax_sorted, 1), (traceable.entmax15_sorted, 2)):
            got = fn(zs.unsqueeze(0))[0]
            y = zs if power == 1 else zs / 2
            best = None
            for size in range(1, 7):
                for S in itertools.combinations(range(6), size):
                    idx = list(S)
                    if power == 1:
                        tau = (y[idx].sum() - 1) / size
                    else:
                        m = y[idx].mean()
                        tau = m - torch.sqrt(torch.clamp((1 - ((y[idx] - m) ** 2).sum()) / size, min=0))
                    p = torch.clamp(y - tau, min=0) ** power
                    if abs(p.sum() - 1) < 1e-9 and all((p[j] > 0) == (j in S) or p[j] < 1e-12 for j in range(6)):
                        best = p
            assert best is not None and torch.allclose(got, best, atol=1e-12)


# -- torch.export, torch.jit.trace, torch.jit.script --------------------------------------


def _modules():
    return {
        "sparsemax": snn.Sparsemax(), "entmax15": snn.Entmax15(), "entmax": snn.Entmax(1.3),
        "entmax_learned": snn.Entmax(1.4, learn_alpha=True), "alpha_relu": snn.AlphaReLU(1.5, 0.1),
        "f_softargmax": snn.FSoftargmax("jensen_shannon", q=torch.rand(K) + 0.5, temperature=0.5),
        "normmax": snn.Normmax(3.0),
    }


@pytest.mark.parametrize("name", list(_modules()))
def test_torch_export_round_trips_and_decomposes(name):
    module = _modules()[name]
    D = torch.export.Dim.DYNAMIC
    program = torch.export.export(module, (torch.randn(4, K),), dynamic_shapes=({0: D},))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    x = _inputs(7)
    with torch.no_grad():
        ref = module(x)
    _close(loaded.module()(x), ref)
    # decomposed: PyTorch's operators only, the same values
    flat = program.run_decompositions(softargmax.export.decompositions())
    assert not any("softargmax" in str(n.target) for n in flat.graph.nodes)
    _close(flat.module()(x), ref)


@pytest.mark.parametrize("name", list(_modules()))
def test_jit_trace_saves_a_graph_of_pytorch_operators(name):
    module = _modules()[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, (torch.randn(4, K),))
    graph = str(traced.inlined_graph)
    assert "softargmax::" not in graph and "PythonOp" not in graph
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    x = _inputs(9)  # another batch size than the traced one
    with torch.no_grad():
        _close(loaded(x), module(x), rtol=1e-6 if name == "alpha_relu" else 0.0)


@pytest.mark.parametrize("name", list(_modules()))
def test_jit_script_compiles_the_activation_modules(name):
    module = _modules()[name]
    scripted = torch.jit.script(module)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    x = _inputs(5)
    _close(loaded(x), module(x))
    x = torch.randn(3, K, requires_grad=True)  # the operators' autograd formulas
    (g1,) = torch.autograd.grad((loaded(x) * torch.arange(K)).sum(), x)
    (g2,) = torch.autograd.grad((module(x) * torch.arange(K)).sum(), x)
    assert torch.allclose(g1, g2, atol=1e-6)


@pytest.mark.parametrize("module", [snn.SparseMultiheadAttention(8, 2), snn.BudgetSparsemax(),
                                    snn.AlphaReLU(1.5, "calibrate")], ids=["attention", "budget", "calibrate"])
def test_jit_script_names_the_way_out_where_it_cannot_compile(module):
    with pytest.raises(TypeError, match=r"torch\.export\.export"):
        torch.jit.script(module)


# -- decode_attention: its kernels' operator decomposed, and ONNX --------------------------


class _Decode(torch.nn.Module):
    """A decoding step; the mask and the block table are used where the options say so."""

    def __init__(self, masked=False, paged=False, **options):
        super().__init__()
        self.masked, self.paged, self.options = masked, paged, options

    def forward(self, q, k, v, ends, starts, mask, table):
        return softargmax.decode_attention(q, k, v, ends, starts, attn_mask=mask if self.masked else None,
                                           block_table=table if self.paged else None, **self.options)


#: case: (module options, α of the float64 brute force (per head: a tensor))
DECODE_CASES = {
    "gqa_ranges_sparsemax": ({"mapping": "sparsemax"}, 2.0),
    "mask_window_entmax": ({"masked": True, "window": 5, "mapping": "entmax", "alpha": 1.25}, 1.25),
    "paged_per_head_alpha": ({"paged": True, "mapping": "entmax", "alpha": torch.tensor([1.2, 1.5, 2.0, 1.7])},
                             torch.tensor([1.2, 1.5, 2.0, 1.7])),
    "user_divergence": ({"mapping": _Sharp()}, 2.0),
}


def _decode_inputs(seed, ends, starts):
    """2 sequences, 4 query heads over 2, 3 new queries, a cache of 12 positions whose values are the identity
    (the output is then the attention weights themselves, exact zeros included); a mask with one query that sees
    no key; the cache as shuffled pages of 4 positions and their block table."""
    from test_decoding import _paged

    gen = torch.Generator().manual_seed(seed)
    B, H, Hkv, L, S, D = 2, 4, 2, 3, 12, 8
    q = torch.randn(B, H, L, D, generator=gen) * 1.5
    k = torch.randn(B, Hkv, S, D, generator=gen) * 1.5
    v = torch.eye(S).expand(B, Hkv, S, S).contiguous()
    mask = torch.rand(B, 1, L, S, generator=gen) > 0.3
    mask[1, 0, 0] = False
    kp, table = _paged(k, 4, gen)
    vp = torch.empty(kp.shape[0], 4, Hkv, S)
    vp[table.reshape(-1)] = v.transpose(1, 2).reshape(-1, 4, Hkv, S)
    return (q, k, v, torch.tensor(ends), torch.tensor(starts), mask, table), (kp, vp)


def _decode_args(module, seed, ends, starts):
    (q, k, v, e, s, mask, table), (kp, vp) = _decode_inputs(seed, ends, starts)
    return (q, kp, vp, e, s, mask, table) if module.paged else (q, k, v, e, s, mask, table), (q, k, v, mask)


def _as_on_a_gpu(monkeypatch):
    """The kernels take the call (as on a GPU): tracing records their operator, or (ONNX) must not run them."""
    from softargmax.backends.triton import decoding as kernels

    monkeypatch.setattr(kernels, "covers", lambda *args, **kwargs: True)


@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_attention_operator_decomposes(monkeypatch, case):
    """torch.export records the kernels' softargmax::decode_attention (as on a GPU); decomposed, the program holds
    PyTorch's operators only and gives the float64 brute force's weights (the values are the identity), its exact
    zeros included, and eager's outputs, for lengths other than the exported ones."""
    from test_decoding import _brute_force

    options, alpha_ref = DECODE_CASES[case]
    module = _Decode(**options)
    with monkeypatch.context() as m:
        _as_on_a_gpu(m)
        program = torch.export.export(module, _decode_args(module, 0, [12, 9], [0, 2])[0])
    ours = lambda p: {str(n.target) for n in p.graph.nodes if str(n.target).startswith("softargmax")}  # noqa: E731
    assert ours(program) == {"softargmax.decode_attention.default"}
    flat = program.run_decompositions(softargmax.export.decompositions())
    assert not ours(flat)
    for seed, ends, starts in ((1, [12, 9], [0, 2]), (2, [10, 12], [3, 0])):
        args, (q, k, v, mask) = _decode_args(module, seed, ends, starts)
        got = flat.module()(*args)
        want = _brute_force(q, k, v, ends, starts, alpha_ref, window=options.get("window"),
                            mask=mask if module.masked else None)
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)
        assert torch.equal(got == 0, want == 0)
        torch.testing.assert_close(got, module(*args), atol=1e-6, rtol=1e-5)  # eager: the reference path
        if module.masked:
            assert torch.all(got[1, :, 0] == 0)  # the query that sees no key


def test_decode_attention_exports_to_onnx(ort, monkeypatch):
    """torch.onnx.export of a decoding step where the kernels would take the call (as on a GPU) records the
    materialized path (a mask, a window, grouped heads, an α of the Newton solver): no softargmax operator, and
    onnxruntime gives eager's outputs for other lengths, the query that sees no key a zero output."""
    module = _Decode(masked=True, window=5, mapping="entmax", alpha=1.25)
    with monkeypatch.context() as m:
        _as_on_a_gpu(m)
        session = _onnx_session(ort, module, _decode_args(module, 0, [12, 9], [0, 2])[0], None)
    for seed, ends, starts in ((1, [12, 9], [0, 2]), (2, [10, 12], [3, 0])):
        args = _decode_args(module, seed, ends, starts)[0]
        got = _run(session, *args)[0]
        torch.testing.assert_close(got, module(*args), atol=1e-6, rtol=1e-5)
        assert torch.all(got[1, :, 0] == 0)
