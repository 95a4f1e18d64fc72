"""Sparse attention: SDPA semantics, naive references, gradients, the MultiheadAttention drop-in."""

import math

import pytest
import torch
import torch.nn.functional as F

import softargmax as sa
from softargmax import nn as snn

F64 = torch.float64


def _qkv(B=2, H=3, L=5, S=7, E=8, Ev=4, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, E, generator=g, dtype=dtype), torch.randn(B, H, S, E, generator=g, dtype=dtype),
            torch.randn(B, H, S, Ev, generator=g, dtype=dtype))


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_softmax_equals_sdpa_for_every_mask_kind(dtype):
    q, k, v = _qkv(dtype=dtype)
    g = torch.Generator().manual_seed(1)
    bool_mask = torch.rand(5, 7, generator=g) > 0.3
    bool_mask[:, 0] = True
    float_mask = torch.randn(2, 1, 5, 7, generator=g, dtype=dtype)
    tol = dict(atol=1e-12, rtol=1e-10) if dtype == F64 else dict(atol=1e-5, rtol=1e-5)
    for kwargs in [{}, {"attn_mask": bool_mask}, {"attn_mask": float_mask}, {"is_causal": True}, {"scale": 0.3}]:
        torch.testing.assert_close(sa.attention(q, k, v, mapping="softmax", **kwargs), F.scaled_dot_product_attention(q, k, v, **kwargs), **tol)
    # broadcasting over batch and heads
    q1 = q[:, :1]
    torch.testing.assert_close(sa.attention(q1, k, v, mapping="softmax"), F.scaled_dot_product_attention(q1.expand_as(q), k, v), **tol)


@pytest.mark.parametrize("mapping,alpha", [("sparsemax", None), ("entmax15", None), ("entmax", 1.3),
                                           ("entmax", torch.tensor([1.2, 1.5, 1.9], dtype=F64)), ("jensen_shannon", None)])
def test_sparse_mappings_match_a_naive_reference(mapping, alpha):
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 5, 7) > 0.4
    mask[..., 0] = True
    out, w = sa.attention(q, k, v, attn_mask=mask, mapping=mapping, alpha=alpha, return_weights=True)
    ref_w = torch.zeros(2, 3, 5, 7, dtype=F64)
    for b in range(2):
        for h in range(3):
            for i in range(5):
                s = (q[b, h, i] @ k[b, h].T) / math.sqrt(8)
                s = s.masked_fill(~mask[b, 0, i], -math.inf)
                a = alpha[h] if isinstance(alpha, torch.Tensor) else alpha
                if mapping == "sparsemax":
                    ref_w[b, h, i] = sa.sparsemax(s)
                elif mapping == "entmax15":
                    ref_w[b, h, i] = sa.entmax15(s)
                elif mapping == "entmax":
                    ref_w[b, h, i] = sa.entmax(s, float(a))
                else:
                    ref_w[b, h, i] = sa.f_softargmax(s, mapping)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_w @ v)
    if mapping != "jensen_shannon":
        assert (w == 0).any()


def test_gradcheck_including_alpha_per_head():
    q, k, v = (t.requires_grad_() for t in _qkv(B=1, H=2, L=3, S=4, E=3, Ev=2))
    alpha = torch.tensor([1.3, 1.7], dtype=F64, requires_grad=True)
    f = lambda a, b, c, al: sa.attention(a, b, c, mapping="entmax", alpha=al)
    assert torch.autograd.gradcheck(f, (q, k, v, alpha), atol=1e-6)
    g = lambda a, b, c: sa.attention(a, b, c, mapping="entmax15", is_causal=True)
    assert torch.autograd.gradcheck(g, (q, k, v), atol=1e-6)


def _refuse_copies(monkeypatch):
    """Make every way of copying key/value heads per query head fail (``Tensor.repeat_interleave``, ``repeat``)."""
    from test_flash_attention_window import _refused

    for name in ("repeat_interleave", "repeat"):
        monkeypatch.setattr(torch.Tensor, name, _refused(name))


@pytest.mark.parametrize("mapping,alpha", [("softmax", None), ("entmax15", None),
                                           ("entmax", torch.tensor([1.2, 1.5, 1.9, 1.3, 1.7, 2.0], dtype=F64))])
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"window": 2}, {"attn_mask": "padding"}])
def test_grouped_heads_equal_repeated_heads_with_gradients(monkeypatch, mapping, alpha, kwargs):
    """``enable_gqa`` on the materialized path: 6 query heads over 2 key/value heads (and over 1), a query in the
    ``[B, L, H, E]`` memory layout of Transformers' attention functions, keys broadcast over the batch.  Output,
    weights and the gradients of ``q``, ``k``, ``v`` (and α per head) equal those of the heads repeated, in float64;
    softmax also equals SDPA's ``enable_gqa``.  No key/value head is copied per query head."""
    g = torch.Generator().manual_seed(3)
    B, H, L, S, E, Ev = 2, 6, 5, 7, 8, 4
    if kwargs.get("attn_mask") == "padding":
        mask = torch.rand(B, 1, 1, S, generator=g) > 0.3
        mask[..., 0] = True
        kwargs = {"attn_mask": mask}
    for hkv, kb in ((2, 1), (1, B)):
        q = torch.randn(B, L, H, E, generator=g, dtype=F64).transpose(1, 2)  # strided: heads and rows not one view
        k, v = torch.randn(kb, hkv, S, E, generator=g, dtype=F64), torch.randn(kb, hkv, S, Ev, generator=g, dtype=F64)
        go = torch.randn(B, H, L, Ev, generator=g, dtype=F64)

        def run(group, q=q, k=k, v=v):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            al = None if alpha is None else alpha.detach().clone().requires_grad_()
            qq, kk, vv = leaves
            if group:
                kk, vv = kk.repeat_interleave(H // hkv, 1), vv.repeat_interleave(H // hkv, 1)
            out, w = sa.attention(qq, kk, vv, mapping=mapping, alpha=al, enable_gqa=not group, return_weights=True,
                                  **kwargs)
            out.backward(go)
            return [out, w] + [t.grad for t in leaves] + ([] if al is None else [al.grad])

        want = run(True)
        with monkeypatch.context() as m:
            _refuse_copies(m)
            got = run(False)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
        if mapping == "softmax" and "window" not in kwargs:
            torch.testing.assert_close(got[0], F.scaled_dot_product_attention(q, k.expand(B, -1, -1, -1),
                                                                              v.expand(B, -1, -1, -1),
                                                                              enable_gqa=True, **kwargs))


def _autograd_nodes(t):
    """The names of every node of ``t``'s autograd graph."""
    seen, stack, names = set(), [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(f for f, _ in node.next_functions)
    return names


def test_grouped_scores_are_masked_in_place_without_copies():
    """Grouped heads' scores are a tensor of their own (not a view of their product), so the in-place causal and
    boolean masks add no ``CopySlices`` node (autograd copying the full-size gradient) to the graph."""
    q, k, v = (t.requires_grad_() for t in _qkv(B=1, H=4, L=6, S=6))
    k2, v2 = k[:, :2].detach().requires_grad_(), v[:, :2].detach().requires_grad_()
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    for kw in (dict(is_causal=True), dict(attn_mask=mask)):
        names = _autograd_nodes(sa.attention(q, k2, v2, enable_gqa=True, **kw))
        assert "CopySlices" not in names and "AsStridedBackward0" not in names, names


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15", "entmax", "jensen_shannon", "reverse_kl"])
def test_masked_scores_pass_the_gradient_as_it_is(mapping):
    """The causal band, the window and a boolean mask set the scores to ``-inf`` in place, and their backward passes
    the gradient through with no pass over it (the mapping's gradient is already 0 at a ``-inf`` score): the
    gradients of ``q``, ``k``, ``v`` from a loss on the output and on the weights equal those of out-of-place
    ``masked_fill`` (PyTorch's autograd) in float64, a row with every key masked included (zero, never NaN)."""
    q, k, v = (t.requires_grad_() for t in _qkv(L=6, S=6))
    g = torch.Generator().manual_seed(4)
    mask = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    mask[..., 0] = True
    mask[1, :, 3] = False  # every key of a row masked
    go, gw = torch.randn(2, 3, 6, 4, generator=g, dtype=F64), torch.randn(2, 3, 6, 6, generator=g, dtype=F64)
    alpha = 1.3 if mapping == "entmax" else None

    def grads(out, w):
        return torch.autograd.grad((out * go).sum() + (w * gw).sum(), (q, k, v))

    got = grads(*sa.attention(q, k, v, attn_mask=mask, window=3, mapping=mapping, alpha=alpha, return_weights=True))
    band = torch.ones(6, 6, dtype=torch.bool).tril().triu(-2)
    scores = ((q @ k.transpose(-2, -1)) / math.sqrt(8)).masked_fill(~band, -math.inf).masked_fill(~mask, -math.inf)
    w = sa.operators.attention.attention_weights(scores, mapping, alpha)
    want = grads(w @ v, w)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


_BLOCK_CASES = {
    "causal_gqa": dict(H=4, Hkv=2, L=50, S=50),
    "more_queries_than_keys": dict(L=50, S=37),
    "fewer_queries_than_keys": dict(L=37, S=50),
    "window": dict(L=50, S=50, window=20),
    "window_1_js": dict(L=50, S=50, window=1, mapping="jensen_shannon"),
    "window_past_the_keys": dict(L=60, S=20, window=3, mapping="sparsemax"),
    "window_and_mask": dict(H=2, Hkv=1, L=50, S=50, window=10, mask=(2, 1, 50, 50)),
    "window_and_padding": dict(L=50, S=50, window=10, mask=(2, 1, 1, 50)),
    "window_and_float_mask": dict(L=50, S=50, window=10, mask="float", mapping="softmax"),
    "alpha_per_head": dict(L=50, S=50, mapping="entmax", alpha=(1.2, 1.5, 1.8)),
    "alpha_per_row": dict(L=50, S=50, window=30, mapping="entmax", alpha="rows"),
    "scalar_mask": dict(L=50, S=50, window=10, mask=()),
    "key_mask_1d": dict(L=50, S=50, window=10, mask=(50,)),
}


@pytest.mark.parametrize("case", sorted(_BLOCK_CASES))
def test_causal_attention_by_blocks_equals_one_block(monkeypatch, case):
    """Causal and sliding-window attention without weights runs by blocks of query rows, each against the keys it can
    see (16-row blocks here): output and gradients (q, k, v, α) equal those of the whole matrix (``return_weights``)
    in float64, rows past every key, empty rows and masks included."""
    c = {**dict(H=3, Hkv=None, window=None, mask=None, mapping="entmax15", alpha=None), **_BLOCK_CASES[case]}
    monkeypatch.setattr(sa.operators.attention, "CAUSAL_BLOCK", 16)
    g = torch.Generator().manual_seed(7)
    B, H, L, S, hkv = 2, c["H"], c["L"], c["S"], c["Hkv"] or c["H"]
    q = torch.randn(B, H, L, 8, generator=g, dtype=F64).requires_grad_()
    k, v = (torch.randn(B, hkv, S, 8, generator=g, dtype=F64).requires_grad_() for _ in range(2))
    leaves = [q, k, v]
    alpha = None
    if c["alpha"] == "rows":  # one α per query row: [B, H, L, 1]
        alpha = (1.1 + 0.9 * torch.rand(B, H, L, 1, generator=g, dtype=F64)).requires_grad_()
        leaves.append(alpha)
    elif c["alpha"] is not None:
        alpha = torch.tensor(c["alpha"], dtype=F64, requires_grad=True)
        leaves.append(alpha)
    mask = c["mask"]
    if mask == "float":
        mask = torch.randn(L, S, generator=g, dtype=F64)
    elif mask is not None:
        mask = torch.rand(mask, generator=g) > (0.3 if mask else 0.0)  # (a scalar mask: True)
    kw = dict(attn_mask=mask, is_causal=mask is None, window=c["window"], mapping=c["mapping"], alpha=alpha,
              enable_gqa=hkv != H)
    go = torch.randn(B, H, L, 8, generator=g, dtype=F64)
    out = sa.attention(q, k, v, **kw)
    got = torch.autograd.grad(out, leaves, go)
    whole, _ = sa.attention(q, k, v, return_weights=True, **kw)
    want = torch.autograd.grad(whole, leaves, go)
    for a, b in zip((out,) + got, (whole,) + want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_masked_attention_traces_and_takes_forward_mode_derivatives():
    """The masks' in-place autograd function runs in eager calls only: ``torch.jit.trace`` records causal, windowed
    and boolean-masked attention (the traced function gives eager's output), and ``torch.func.jvp`` (forward mode) of
    causal attention equals a central difference in float64."""
    q, k, v = _qkv(B=1, H=2, L=6, S=6)
    mask = torch.rand(1, 1, 6, 6, generator=torch.Generator().manual_seed(5)) > 0.3
    mask[..., 0] = True
    for kw in (dict(is_causal=True), dict(window=2), dict(attn_mask=mask)):
        def f(a, b, c, kw=kw):
            return sa.attention(a, b, c, mapping="entmax15", **kw)

        traced = torch.jit.trace(f, (q, k, v), check_trace=False)
        torch.testing.assert_close(traced(q, k, v), f(q, k, v))
    t = torch.randn(q.shape, generator=torch.Generator().manual_seed(6), dtype=F64)

    def g(a):
        return sa.attention(a, k, v, is_causal=True, mapping="softmax")

    _, tangent = torch.func.jvp(g, (q,), (t,))
    torch.testing.assert_close(tangent, (g(q + 1e-6 * t) - g(q - 1e-6 * t)) / 2e-6, atol=1e-6, rtol=1e-5)


def test_masks_that_hide_the_future_take_the_causal_blocks(monkeypatch):
    """A boolean or float mask with every key after its query hidden (Transformers' causal mask with padding) takes
    the causal blocks, with the output and gradients of the whole matrix in float64; a mask that lets one query see
    a later key, and a float mask of large finite values instead of ``-inf``, keep the whole matrix."""
    A = sa.operators.attention
    monkeypatch.setattr(A, "CAUSAL_BLOCK", 16)
    taken = []
    blocks = A._causal_blocks
    monkeypatch.setattr(A, "_causal_blocks", lambda *a: taken.append(1) or blocks(*a))
    q, k, v = (t.requires_grad_() for t in _qkv(B=2, H=2, L=40, S=40))
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    padded = causal & (torch.arange(40) >= torch.tensor([0, 7])[:, None, None, None])  # [2, 1, 40, 40]
    padded[1, :, :7, 0] = True  # (the padded queries see the first key)
    leaky = padded.clone()
    leaky[0, 0, 3, 30] = True
    finite = torch.zeros(40, 40, dtype=F64).masked_fill(~causal, -1e30)
    infinite = torch.zeros(40, 40, dtype=F64).masked_fill(~causal, float("-inf"))
    go = torch.randn(2, 2, 40, 4, generator=torch.Generator().manual_seed(8), dtype=F64)
    for mask, blocked in ((padded, True), (infinite, True), (leaky, False), (finite, False)):
        taken.clear()
        out = sa.attention(q, k, v, attn_mask=mask, mapping="entmax15")
        assert bool(taken) == blocked
        whole, _ = sa.attention(q, k, v, attn_mask=mask, mapping="entmax15", return_weights=True)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), go), torch.autograd.grad(whole, (q, k, v), go)):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(out, whole, atol=1e-12, rtol=1e-10)


def test_causal_blocks_never_score_above_the_diagonal(monkeypatch):
    """The blocks' score products: 16-row blocks of 64 causal queries score 2,560 of the 4,096 query-key pairs (each
    block up to its last row), with a window of 8 keys 1,360 (from each block's first row's first key on)."""
    A = sa.operators.attention
    monkeypatch.setattr(A, "CAUSAL_BLOCK", 16)
    scored = []
    product = A.grouped_product

    def counted(x, y, group):
        out = product(x, y, group)
        if x.shape[-1] == 8:  # the scores: the queries' 8 features (the weights of the product with the values: keys)
            scored.append(out.shape[-2] * out.shape[-1])
        return out

    monkeypatch.setattr(A, "grouped_product", counted)
    q, k, v = _qkv(B=1, H=1, L=64, S=64)
    sa.attention(q, k, v, is_causal=True)
    assert sum(scored) == 16 * (16 + 32 + 48 + 64)
    scored.clear()
    sa.attention(q, k, v, window=8)
    assert sum(scored) == 16 * 16 + 3 * 16 * (16 + 7)


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15", "entmax"])
def test_fully_masked_rows_give_zero_output(mapping):
    q, k, v = (t.requires_grad_() for t in _qkv())
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    out = sa.attention(q, k, v, attn_mask=mask, mapping=mapping, alpha=1.4)
    assert torch.isfinite(out).all() and (out[..., 2, :] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_attention_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="cannot both be set"):
        sa.attention(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="mapping: unknown"):
        sa.attention(q, k, v, mapping="sparse")
    with pytest.raises(ValueError, match="needs alpha"):
        sa.attention(q, k, v, mapping="entmax")
    with pytest.raises(ValueError, match="feature size"):
        sa.attention(q, k[..., :3], v)


def _band(L, S, window):
    """The sliding window by brute force: query i sees key j iff i - window < j <= i."""
    return torch.tensor([[i - window < j <= i for j in range(S)] for i in range(L)])


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15"])
def test_sliding_window_is_the_band_mask(mapping):
    """``window=w`` equals the band as a boolean mask (softmax: SDPA given it), alone, with ``is_causal``, with
    another mask (both must allow a key) and with more keys than queries; a window as long as the queries is the
    causal mask; the gradients too."""
    q, k, v = _qkv(L=9, S=11)
    band = _band(9, 11, 3)
    want = sa.attention(q, k, v, attn_mask=band, mapping=mapping)
    torch.testing.assert_close(sa.attention(q, k, v, window=3, mapping=mapping), want, atol=1e-12, rtol=0)
    torch.testing.assert_close(sa.attention(q, k, v, window=3, is_causal=True, mapping=mapping), want, atol=1e-12,
                               rtol=0)
    if mapping == "softmax":
        torch.testing.assert_close(want, F.scaled_dot_product_attention(q, k, v, attn_mask=band), atol=1e-12, rtol=0)
    pad = torch.rand(2, 1, 1, 11, generator=torch.Generator().manual_seed(3)) > 0.3
    torch.testing.assert_close(sa.attention(q, k, v, attn_mask=pad, window=3, mapping=mapping),
                               sa.attention(q, k, v, attn_mask=pad & band, mapping=mapping), atol=1e-12, rtol=0)
    torch.testing.assert_close(sa.attention(q, k, v, window=9, mapping=mapping),
                               sa.attention(q, k, v, is_causal=True, mapping=mapping), atol=0, rtol=0)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    go = torch.randn_like(want)
    got = torch.autograd.grad(sa.attention(qq, kk, vv, window=3, mapping=mapping), (qq, kk, vv), go)
    ref = torch.autograd.grad(sa.attention(qq, kk, vv, attn_mask=band, mapping=mapping), (qq, kk, vv), go)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=1e-12, rtol=0)


def test_window_checks_and_the_module():
    q, k, v = _qkv()
    for bad, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError), ("3", TypeError)):
        with pytest.raises(error, match="window must be None or a positive int"):
            sa.attention(q, k, v, window=bad)
        with pytest.raises(error, match="window must be None or a positive int"):
            snn.SparseMultiheadAttention(16, 4, window=bad)
    # the module: its window applied with the padding mask, in its repr
    mha = snn.SparseMultiheadAttention(16, 4, batch_first=True, mapping="sparsemax", window=2)
    assert "window=2" in repr(mha)
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 0] = True  # key 0 of the second sequence masked
    with torch.no_grad():
        _, w = mha(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    allowed = _band(6, 6, 2) & ~pad.view(2, 1, 1, 6)
    assert (w[~allowed.expand_as(w)] == 0).all() and w[allowed.expand_as(w)].gt(0).any()
    assert (w[1, :, 0] == 0).all()  # the first query of the second sequence sees no key: zeros, never NaN


def test_mismatched_dtypes_and_batches_are_named():
    q, k, v = _qkv(dtype=torch.float32)
    for args, name in (((q.double(), k, v), "key"), ((q, k.double(), v), "key"), ((q, k, v.double()), "value")):
        with pytest.raises(TypeError, match=f"{name} must have query's dtype"):
            sa.attention(*args)
    other = torch.cat([k, k[:1]])  # batch 3 where query has 2
    with pytest.raises(ValueError, match=r"key: its batch dimensions \(3, 3\) do not broadcast"):
        sa.attention(q, other, v)
    with pytest.raises(ValueError, match=r"value: its batch dimensions \(3, 3\) do not broadcast"):
        sa.attention(q, k, torch.cat([v, v[:1]]))
    with pytest.raises(ValueError, match="value: its batch dimensions"):  # each broadcasts with query, not together
        sa.attention(q[:1], k, torch.cat([v, v[:1]]))
    with pytest.raises(TypeError, match="attn_mask must be a boolean or floating tensor"):
        sa.attention(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.long))
    # an additive mask of another floating dtype is added in the scores' dtype (as the fused kernels read it)
    mask = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(2), dtype=F64)
    torch.testing.assert_close(sa.attention(q, k, v, attn_mask=mask, mapping="softmax"),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask.float()), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch_first", [True, False])
def test_module_matches_multihead_attention_with_softmax(batch_first):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 4, dropout=0.0, batch_first=batch_first).double().eval()
    ours = snn.SparseMultiheadAttention(16, 4, batch_first=batch_first, mapping="softmax").double().eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 6, 16, dtype=F64)
    if not batch_first:
        x = x.transpose(0, 1)
    kp_bool = torch.zeros(2, 6, dtype=torch.bool)
    kp_bool[0, -2:] = True
    am_bool = torch.ones(6, 6, dtype=torch.bool).triu(1)
    am_float = torch.randn(2 * 4, 6, 6, dtype=F64)
    for kwargs in [{}, {"key_padding_mask": kp_bool}, {"attn_mask": am_bool}, {"attn_mask": am_float},
                   {"key_padding_mask": kp_bool.double() * -1e9, "attn_mask": am_bool.double() * -1e9},
                   {"need_weights": True, "average_attn_weights": False}, {"attn_mask": am_bool, "is_causal": True}]:
        o1, w1 = ref(x, x, x, **kwargs)
        o2, w2 = ours(x, x, x, **kwargs)
        torch.testing.assert_close(o2, o1)
        torch.testing.assert_close(w2, w1)
    # different key/value sizes and unbatched input
    ref2 = torch.nn.MultiheadAttention(16, 2, kdim=6, vdim=5).double().eval()
    ours2 = snn.convert_attention(torch.nn.MultiheadAttention(16, 2, kdim=6, vdim=5).double(), mapping="softmax").eval()
    ours2.load_state_dict(ref2.state_dict())
    qx, kx, vx = torch.randn(4, 16, dtype=F64), torch.randn(3, 6, dtype=F64), torch.randn(3, 5, dtype=F64)
    torch.testing.assert_close(ours2(qx, kx, vx)[0], ref2(qx, kx, vx)[0])


def test_converting_transformer_layers_keeps_weights_and_bypasses_the_fast_path():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True).eval()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        ref = layer(x)
        snn.convert_attention(layer, mapping="softmax")
        assert isinstance(layer.self_attn, snn.SparseMultiheadAttention)
        torch.testing.assert_close(layer(x), ref, atol=1e-5, rtol=1e-5)
        snn.convert_attention(layer, mapping="entmax15")  # already converted: unchanged
        layer.self_attn.mapping = "entmax15"
        sparse_out = layer(x)
    assert not torch.allclose(sparse_out, ref, atol=1e-3)
    # the attention weights really are sparse in eval mode inside the layer
    _, w = layer.self_attn(x, x, x, average_attn_weights=False)
    assert (w == 0).any()


def test_learned_alpha_per_head():
    torch.manual_seed(0)
    m = snn.SparseMultiheadAttention(16, 4, batch_first=True, learn_alpha=True, alpha=torch.tensor([1.2, 1.4, 1.6, 1.8]))
    torch.testing.assert_close(m.alpha, torch.tensor([1.2, 1.4, 1.6, 1.8]))
    x = torch.randn(2, 5, 16)
    out, _ = m(x, x, x)
    out.sum().backward()
    assert m.alpha_logit.grad is not None and torch.isfinite(m.alpha_logit.grad).all() and (m.alpha_logit.grad != 0).any()
    with pytest.raises(ValueError, match="strictly inside"):
        snn.SparseMultiheadAttention(16, 4, learn_alpha=True, alpha=2.0)
    with pytest.raises(ValueError, match="not supported"):
        snn.SparseMultiheadAttention(16, 4, add_bias_kv=True)


def test_alpha_mapping_uses_every_heads_alpha():
    """``mapping="alpha"`` (the α-divergence) with a per-head α is per-head α-entmax, not head 0's α everywhere."""
    torch.manual_seed(0)
    alpha = torch.tensor([1.2, 1.5, 1.8, 1.5])
    by_alpha = snn.SparseMultiheadAttention(16, 4, batch_first=True, mapping="alpha", alpha=alpha).eval()
    by_entmax = snn.SparseMultiheadAttention(16, 4, batch_first=True, mapping="entmax", alpha=alpha).eval()
    by_entmax.load_state_dict(by_alpha.state_dict())
    x = torch.randn(2, 5, 16)
    _, w_alpha = by_alpha(x, x, x, average_attn_weights=False)
    _, w_entmax = by_entmax(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(w_alpha, w_entmax)
    scores = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(sa.normalize(scores, "alpha", alpha.view(4, 1, 1)), sa.entmax(scores, alpha.view(4, 1, 1)))


def test_inspection_helpers():
    from softargmax import analysis as inspect

    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2).eval()
    snn.convert_attention(enc, mapping="entmax", alpha=torch.tensor([1.1, 1.5, 1.8, 2.0]))
    a = inspect.alphas(enc)
    assert set(a) == {"layers.0.self_attn", "layers.1.self_attn"}
    torch.testing.assert_close(a["layers.0.self_attn"], torch.tensor([1.1, 1.5, 1.8, 2.0]))
    x = torch.randn(3, 9, 16)
    w = inspect.collect_attention(enc, lambda: enc(x))
    assert w["layers.1.self_attn"].shape == (3, 4, 9, 9)
    dens = inspect.head_density(w["layers.0.self_attn"])
    # higher alpha, sparser head (on average); alpha = 1.1 is nearly dense
    assert dens[0] > dens[3] and dens[0] > 0.5
    # density by hand
    w0 = w["layers.0.self_attn"]
    torch.testing.assert_close(dens[2], (w0[:, 2] > 0).float().mean())
    js = inspect.head_js_divergence(w0)
    assert js.shape == (4, 4) and torch.allclose(js.diagonal(), torch.zeros(4), atol=1e-7)
    assert (js >= 0).all() and (js <= math.log(2) + 1e-6).all() and torch.allclose(js, js.T)
    # JS of two known distributions
    p = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])
    torch.testing.assert_close(inspect.head_js_divergence(p)[0, 1], torch.tensor(math.log(2)))
    with pytest.raises(ValueError, match="no SparseMultiheadAttention"):
        inspect.collect_attention(torch.nn.Linear(2, 2), lambda: None)


def test_mask_of_the_wrong_shape_is_named():
    q = torch.randn(2, 3, 5, 4)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\) is not broadcastable"):
        sa.attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be a tensor"):
        sa.attention(q, q, q, attn_mask=[[True]])
