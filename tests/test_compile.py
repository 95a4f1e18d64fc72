"""torch.compile(fullgraph=True) and CUDA graphs accept the operators and losses, with eager's results.

On CPU (CI) the compiled functions run with the ``aot_eager`` backend: Dynamo traces with no
graph break (``fullgraph=True``), AOTAutograd traces forward and backward through the fake
implementations and autograd formulas of the custom operators (:mod:`softargmax.operators._library_ops`,
:mod:`softargmax.losses._library_ops`); Inductor's code generation adds nothing to check here and
would take minutes on a small CPU.  The GPU tests (skipped without CUDA) compile with the
default backend, capture and replay CUDA graphs, and run the operators with device
synchronization made an error.
"""

import pytest
import torch
from conftest import needs_cuda

import softargmax as sa

GEN = torch.Generator().manual_seed(0)
X = torch.randn(6, 40, generator=GEN, dtype=torch.float64) * 2
X[1, :10] = -float("inf")
ALPHA_ROWS = torch.tensor([[1.2], [1.5], [1.9], [2.0], [1.05], [3.0]], dtype=torch.float64)
Y = torch.randint(0, 40, (6,), generator=GEN)
Y[1] = 20  # not a masked class
Y[4] = -100  # ignored
SOFT = torch.softmax(torch.randn(6, 40, generator=GEN, dtype=torch.float64), -1)
CLASS_W = torch.rand(40, generator=GEN, dtype=torch.float64) + 0.5

OPERATORS = {
    "entmax15": lambda x, a: sa.entmax15(x),
    "sparsemax": lambda x, a: sa.sparsemax(x),
    "entmax_1.3": lambda x, a: sa.entmax(x, 1.3),
    "entmax_alpha_rows": lambda x, a: sa.entmax(x, a),
    "entmax15_dim0": lambda x, a: sa.entmax15(x.t(), dim=0).t(),
    "js": lambda x, a: sa.f_softargmax(x, "jensen_shannon"),
    "hellinger_T": lambda x, a: sa.f_softargmax(x, "squared_hellinger", temperature=2.0),
    "alpha_relu": lambda x, a: sa.alpha_relu(x, 1.5, 0.2),
}

LOSSES = {
    "entmax15_loss": lambda x: sa.entmax15_loss(x, Y),
    "sparsemax_loss_sum": lambda x: sa.sparsemax_loss(x, Y, reduction="sum"),
    "entmax_loss_soft": lambda x: sa.entmax_loss(x, SOFT, alpha=1.3, label_smoothing=0.1),
    "entmax15_loss_none_weight": lambda x: sa.entmax15_loss(x, Y, reduction="none", weight=CLASS_W),
    "js_loss": lambda x: sa.f_divergence_loss(x, Y, "jensen_shannon"),
    "alpha_relu_loss": lambda x: sa.alpha_relu_loss(x, Y, alpha=1.5, tau=0.3),
}


def _run_operators(xs, alpha):
    return tuple(fn(x, alpha) for fn, x in zip(OPERATORS.values(), xs))


def _run_losses(xs):
    return tuple(fn(x) for fn, x in zip(LOSSES.values(), xs))


def _values_and_grads(fn, n, extra=None):
    """Outputs and the gradients of a random projection of them, for ``n`` fresh inputs (and ``extra``)."""
    xs = [X.clone().requires_grad_(True) for _ in range(n)]
    args = (xs,) if extra is None else (xs, extra)
    outs = fn(*args)
    gen = torch.Generator().manual_seed(1)
    total = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs)
    wrt = xs + ([extra] if extra is not None and extra.requires_grad else [])
    return outs, torch.autograd.grad(total, wrt)


def _compare(eager, compiled):
    (outs_e, grads_e), (outs_c, grads_c) = eager, compiled
    for o_e, o_c in zip(outs_e, outs_c):
        assert o_e.dtype == o_c.dtype and o_e.shape == o_c.shape
        torch.testing.assert_close(o_c, o_e, rtol=1e-12, atol=1e-14, equal_nan=True)
    for g_e, g_c in zip(grads_e, grads_c):
        torch.testing.assert_close(g_c, g_e, rtol=1e-12, atol=1e-14)


def test_operators_compile_fullgraph():
    torch._dynamo.reset()
    compiled = torch.compile(_run_operators, fullgraph=True, backend="aot_eager")
    alpha = ALPHA_ROWS.clone().requires_grad_(True)
    eager = _values_and_grads(_run_operators, len(OPERATORS), alpha)
    alpha_c = ALPHA_ROWS.clone().requires_grad_(True)
    _compare(eager, _values_and_grads(compiled, len(OPERATORS), alpha_c))
    assert eager[1][-1].abs().sum() > 0  # the α gradient is compared too, and is not trivially zero


def test_losses_compile_fullgraph():
    torch._dynamo.reset()
    compiled = torch.compile(_run_losses, fullgraph=True, backend="aot_eager")
    _compare(_values_and_grads(_run_losses, len(LOSSES)), _values_and_grads(compiled, len(LOSSES)))


def test_no_locals_in_the_code_torch_compile_traces():
    """Dynamo in torch 2.11 (the CUDA machines' build) cannot trace ``locals()`` (2.13 can): the
    losses once gathered their options with ``LossOptions.of(locals())``, and every loss failed to
    compile with ``fullgraph=True`` there.  CI runs 2.13, so this is checked in the source."""
    import ast
    from pathlib import Path

    src = Path(sa.__file__).parent
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.split("/")[0] in ("experiments", "bench", "analysis") or rel in ("cli.py", "__main__.py"):
            continue  # never traced
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "locals":
                found.append(f"{rel}:{node.lineno}")
    assert not found, found


def test_compiled_operators_still_check_values():
    """Checks that read tensor values move into the operators: they still raise, at run time."""
    torch._dynamo.reset()
    f = torch.compile(lambda x, a: sa.entmax(x, a), fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="alpha"):
        f(X, torch.full((6, 1), 0.5, dtype=torch.float64))
    g = torch.compile(lambda x, y: sa.entmax15_loss(x, y), fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="out of range"):
        g(X, torch.full((6,), 40))


def test_compile_on_the_triton_path(triton_device):
    """The operators' Triton solutions (no s, a JVP kernel, bad rows kept on the device) inside
    the custom operators: compiled equals eager, NaN rows included (Triton's interpreter on CPU)."""
    from softargmax.divergences import get_divergence
    from softargmax.solvers.threshold import solve

    x = X.float().to(triton_device)
    x[3, 2] = float("nan")
    y = Y.to(triton_device)
    assert solve(x, get_divergence("alpha", alpha=1.5)).backend == "triton"

    def run(xs):
        return sa.entmax15(xs[0]), sa.entmax15(xs[1].bfloat16()).float(), sa.entmax15_loss(xs[2], y, reduction="none")

    def values_and_grads(fn):
        xs = [x.clone().requires_grad_(True) for _ in range(3)]
        outs = fn(xs)
        total = sum((o.nan_to_num(0.0) * (i + 1)).sum() for i, o in enumerate(outs))
        return [o.detach() for o in outs], torch.autograd.grad(total, xs)

    torch._dynamo.reset()
    eager, compiled = values_and_grads(run), values_and_grads(torch.compile(run, fullgraph=True, backend="aot_eager"))
    for a, b in zip(eager[0] + list(eager[1]), compiled[0] + list(compiled[1])):
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)


# -- a user's generator -------------------------------------------------------------------


def _my_kl(sharpness=1.0, declared=False):
    """KL from its four functions, f(u) = u log u / c (its mapping: softmax(c x)), with g' declared or not."""
    c = sharpness
    return sa.CustomDivergence(
        f=lambda u: torch.special.xlogy(u, u) / c, f_prime=lambda u: (torch.log(u) + 1) / c,
        conj=lambda v: torch.exp(c * v - 1) / c, conj_prime=lambda v: torch.exp(c * v - 1),
        conj_prime2=(lambda v: c * torch.exp(c * v - 1)) if declared else None, name=f"kl_{c}")


class _Sharp(sa.Divergence):
    """A subclass with the four methods, f(u) = (u² - 1)/(2c): its mapping is sparsemax(c x), with no fused kernel
    (c = 1: chi-square); ``c`` has a class default, which an object that has not run ``__init__`` would silently
    use."""

    f_prime_zero = 0.0
    c = 1.0

    def __init__(self, c=1.0):
        self.c = c

    def f(self, u):
        return (u * u - 1) / (2 * self.c)

    def f_prime(self, u):
        return u / self.c

    def conj(self, v):
        return (self.c * v) ** 2 / (2 * self.c) + 0.5 / self.c

    def conj_prime(self, v):
        return torch.clamp(self.c * v, min=0)


@pytest.mark.parametrize("case", ["custom_autograd_g'", "custom_declared_g'", "subclass_sparse"])
def test_user_divergences_compile_fullgraph(case):
    """A CustomDivergence (g' by autograd or declared) and a Divergence subclass cross the custom operators by a
    name of this process: fullgraph=True, values and gradients equal eager's, the float64 softmax and sparsemax,
    and gradcheck holds through the compiled function."""
    div = {"custom_autograd_g'": _my_kl(), "custom_declared_g'": _my_kl(declared=True),
           "subclass_sparse": _Sharp()}[case]
    ref = sa.sparsemax if case == "subclass_sparse" else (lambda x: torch.softmax(x, -1))
    x = X[:3, :12].clone()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: sa.f_softargmax(x, div), fullgraph=True, backend="aot_eager")
    eager = _values_and_grads(lambda xs: (sa.f_softargmax(xs[0], div),), 1)
    _compare(eager, _values_and_grads(lambda xs: (compiled(xs[0]),), 1))
    torch.testing.assert_close(compiled(x), ref(x), rtol=1e-10, atol=1e-12)
    if case == "subclass_sparse":
        assert (compiled(X) == 0).any()  # exact zeros
    assert torch.autograd.gradcheck(compiled, (x.requires_grad_(True),), atol=1e-6)


def test_user_divergence_objects_get_their_own_graphs():
    """Two CustomDivergences passed to one compiled function (and to its loss) give their own results (softmax of x
    and of 2x): each object crosses by its own name, the compiler guards it and compiles once per object."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda x, div: (sa.f_softargmax(x, div), sa.fenchel_young_loss(x, Y, div)),
                             fullgraph=True, backend="aot_eager")
    one, two = _my_kl(1.0), _my_kl(2.0)
    for _ in range(2):
        for c, div in ((1.0, one), (2.0, two)):
            p, loss = compiled(X, div)
            torch.testing.assert_close(p, torch.softmax(c * X, -1), rtol=1e-10, atol=1e-12)
            kept = Y != -100  # the loss of f = u log u / c: cross-entropy of c x, over c
            want = torch.nn.functional.cross_entropy(c * X[kept], Y[kept]) / c
            torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
    assert counters["stats"]["unique_graphs"] == 2


def test_user_divergence_losses_compile_fullgraph():
    """The Fenchel–Young loss of a CustomDivergence under fullgraph=True: eager's value and gradient."""
    div = _my_kl(declared=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: sa.fenchel_young_loss(x, Y, div, reduction="sum"), fullgraph=True,
                             backend="aot_eager")
    fn = lambda xs: (sa.fenchel_young_loss(xs[0], Y, div, reduction="sum"),)  # noqa: E731
    _compare(_values_and_grads(fn, 1), _values_and_grads(lambda xs: (compiled(xs[0]),), 1))


def test_user_divergence_in_attention_and_decoding_compiles_fullgraph():
    """sa.attention and sa.decode_attention with a Divergence subclass as the mapping, fullgraph=True: eager's
    outputs, and those of the built-in sparsemax."""
    div = _Sharp()
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, n, 8, generator=gen, dtype=torch.float64) for n in (3, 10, 10))
    ends = torch.tensor([10, 7])

    def run(q, k, v, ends):
        return (sa.attention(q, k, v, mapping=div),
                sa.decode_attention(q, k[:, :2], v[:, :2], ends, mapping=div))

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    builtin = (sa.attention(q, k, v, mapping="sparsemax"),
               sa.decode_attention(q, k[:, :2], v[:, :2], ends, mapping="sparsemax"))
    for got, eager, same in zip(compiled(q, k, v, ends), run(q, k, v, ends), builtin):
        torch.testing.assert_close(got, eager, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got, same, rtol=1e-10, atol=1e-12)


def test_a_user_divergence_created_inside_the_compiled_function_is_refused():
    """A generator built inside the traced function: the tracer's stand-in has not run ``__init__`` (it would have
    computed sparsemax(x), not sparsemax(4x), with no error); it is refused with a message that says where to create
    it, for the mapping and the loss, and the same object created outside compiles to eager's values."""
    torch._dynamo.reset()
    for fn in (lambda x: sa.f_softargmax(x, _Sharp(4.0)),
               lambda x: sa.fenchel_young_loss(x, Y, _Sharp(4.0), reduction="none")):
        with pytest.raises(Exception, match=r"created inside the function that torch\.compile"):
            torch.compile(fn, fullgraph=True, backend="aot_eager")(X)
    outside = _Sharp(4.0)
    torch._dynamo.reset()
    got = torch.compile(lambda x: sa.f_softargmax(x, outside), fullgraph=True, backend="aot_eager")(X)
    torch.testing.assert_close(got, sa.sparsemax(4 * X), rtol=1e-10, atol=1e-12)


def test_a_freed_user_divergence_forgets_its_id():
    """The id of a freed generator leaves the table of names (ids are reused: the table would otherwise grow)."""
    import gc

    from softargmax.operators import _carried

    div = _Sharp(2.0)
    key = id(div)
    _carried.carried_name(div)
    assert key in _carried._names
    del div
    gc.collect()
    assert key not in _carried._names


def test_a_freed_user_divergence_is_named_in_the_error():
    from softargmax.operators._carried import carried_divergence

    with pytest.raises(ValueError, match="not alive in this process"):
        carried_divergence("user:123456789:gone")


def test_autograd_functions_break_the_graph_rather_than_crash():
    """f_softmax (no operator of its own) under fullgraph=False: a graph break around its autograd function (the
    tracer once failed on its apply with an internal error), eager's value and gradient."""
    torch._dynamo.reset()
    fn = lambda xs: (sa.f_softmax(xs[0], "jensen_shannon") * 2,)  # noqa: E731
    compiled = torch.compile(lambda x: sa.f_softmax(x, "jensen_shannon") * 2, backend="aot_eager")
    _compare(_values_and_grads(fn, 1), _values_and_grads(lambda xs: (compiled(xs[0]),), 1))


# -- GPU ---------------------------------------------------------------------------------

#: the operators and losses the GPU kernels cover, with float parameters (a per-row tensor α
#: is checked on the host: it is neither graph-capturable nor free of synchronization)
GPU_OPERATORS = {k: v for k, v in OPERATORS.items() if k != "entmax_alpha_rows"}


def _gpu_inputs(dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn(64, 1000, generator=gen, device="cuda", dtype=dtype) * 2


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(GPU_OPERATORS))
def test_gpu_operators_without_synchronization(name, dtype):
    fn = GPU_OPERATORS[name]
    x = _gpu_inputs(dtype).requires_grad_(True)
    v = torch.randn_like(x)
    fn(x, None)  # first call: kernels compile, the C/Triton modules load
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = fn(x, None)
        (gx,) = torch.autograd.grad(y, x, v)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(gx).all()


@needs_cuda
@pytest.mark.parametrize("name", list(GPU_OPERATORS) + list(LOSSES))
def test_gpu_cuda_graph_replays(name):
    if name in GPU_OPERATORS:
        fn = lambda x: GPU_OPERATORS[name](x, None)  # noqa: E731
        y_gpu = None
    else:
        fn = LOSSES[name]
        y_gpu = {"Y": Y.cuda(), "SOFT": SOFT.float().cuda(), "CLASS_W": CLASS_W.float().cuda()}
    g = globals()
    saved = {k: g[k] for k in ("Y", "SOFT", "CLASS_W")}
    if y_gpu is not None:
        g.update(y_gpu)
    try:
        static_x = torch.randn(6, 40, device="cuda", requires_grad=True)
        static_v = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up: kernels compile, the allocator settles
                out = fn(static_x)
                static_v = torch.ones_like(out)
                torch.autograd.grad(out, static_x, static_v)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fn(static_x)
            (static_grad,) = torch.autograd.grad(static_out, static_x, static_v)
        for seed in range(3):
            new = torch.randn(6, 40, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
            with torch.no_grad():
                static_x.copy_(new)
            graph.replay()
            x = new.clone().requires_grad_(True)
            out = fn(x)
            (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
            torch.testing.assert_close(static_out, out)
            torch.testing.assert_close(static_grad, grad)
    finally:
        g.update(saved)


@needs_cuda
@pytest.mark.parametrize("name", list(GPU_OPERATORS))
def test_gpu_compile_fullgraph(name):
    torch._dynamo.reset()
    fn = GPU_OPERATORS[name]
    compiled = torch.compile(lambda x: fn(x, None) * 2, fullgraph=True)
    x = _gpu_inputs(torch.float32).requires_grad_(True)
    y = compiled(x)
    (gc,) = torch.autograd.grad(y.sum(), x)
    x2 = x.detach().clone().requires_grad_(True)
    y2 = fn(x2, None) * 2
    (ge,) = torch.autograd.grad(y2.sum(), x2)
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(gc, ge)
