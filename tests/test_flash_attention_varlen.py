"""Packed variable-length batches (``cu_seqlens_q``/``cu_seqlens_k``, as FlashAttention's varlen
API): the fused kernels (in Triton's interpreter on a CPU) and the materialized path against
each sequence run on its own in float64, gradients of q, k, v and a per-head α included; the
argument checks; one compilation per configuration whatever the packing."""

import os

import pytest
import torch

import softargmax as sa
from softargmax.backends.triton import flash_attention as FA
from softargmax.backends.triton import rows as _triton_rows


@pytest.fixture
def device(gpu_when_present):
    if not FA.available():
        pytest.skip("Triton is not installed")
    if gpu_when_present:
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    return "cpu"


def _offsets(lengths, device):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


def _packed(lq, lk, H, Hkv, D, device, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), H, D, generator=gen) * 1.5
    k = torch.randn(sum(lk), Hkv, D, generator=gen) * 1.5
    v = torch.randn(sum(lk), Hkv, D, generator=gen)
    go = torch.randn(sum(lq), H, D, generator=gen)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, go)]


def _each_sequence(q, k, v, go, lq, lk, alpha=None, **kw):
    """Output and gradients from every sequence on its own ([1, H, L, D], float64, weights materialized)."""
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    al = None if alpha is None else alpha.detach().double().requires_grad_()
    group = q.shape[1] // k.shape[1]
    outs, q0, k0 = [], 0, 0
    for Lb, Sb in zip(lq, lk):
        if Lb and Sb:
            qs = qq[q0:q0 + Lb].transpose(0, 1)[None]
            ks, vs = (t[k0:k0 + Sb].transpose(0, 1)[None].repeat_interleave(group, 1) for t in (kk, vv))
            out, _ = sa.attention(qs, ks, vs, alpha=al if al is not None else kw.get("alpha_float"),
                                  return_weights=True, mapping=kw["mapping"], is_causal=kw.get("is_causal", False))
            outs.append(out[0].transpose(0, 1))
        elif Lb:
            outs.append(qq.new_zeros(Lb, q.shape[1], v.shape[-1]))
        q0, k0 = q0 + Lb, k0 + Sb
    out = torch.cat(outs)
    out.backward(go.double())
    return out, qq.grad, kk.grad, vv.grad, None if al is None else al.grad


def _fused(q, k, v, go, lq, lk, alpha=None, **kw):
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    al = None if alpha is None else alpha.detach().clone().requires_grad_()
    packed = FA.Packed(_offsets(lq, q.device), _offsets(lk, q.device), max(lq), max(lk))
    out = FA.flash_attention(qq, kk, vv, alpha=al if al is not None else kw.get("alpha_float"), packed=packed,
                             mapping=kw["mapping"], is_causal=kw.get("is_causal", False),
                             block_m=kw.get("block_m"), block_n=kw.get("block_n"))
    assert out.shape == (sum(lq), q.shape[1], v.shape[-1]) and out.is_contiguous()
    out.backward(go)
    return out, qq.grad, kk.grad, vv.grad, None if al is None else al.grad


def _close(got, want, atol, rtol=1e-3):
    for name, g, w in zip(("out", "dq", "dk", "dv", "dalpha"), got, want):
        if w is None:
            continue
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double(), w, atol=atol, rtol=rtol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("mapping,alpha", [("sparsemax", None), ("entmax15", None), ("entmax", 1.3)])
def test_causal_packed_batch_equals_each_sequence(device, mapping, alpha):
    """Sequences of 17, 1, 0 and 33 tokens (partial tiles, a length-1 and an empty sequence), causal."""
    lq = [17, 1, 0, 33]
    q, k, v, go = _packed(lq, lq, 2, 2, 16, device)
    kw = dict(mapping=mapping, alpha_float=alpha, is_causal=True)
    _close(_fused(q, k, v, go, lq, lq, **kw), _each_sequence(q, k, v, go, lq, lq, **kw), atol=2e-5)


def test_different_query_and_key_lengths_learned_alpha_gqa(device):
    """Queries and keys of different lengths per sequence (one with no key at all: zero rows), 4
    query heads on 2 key/value heads, one learned α per head: its gradient within 1e-3."""
    lq, lk = [9, 1, 20, 3], [30, 4, 18, 0]
    q, k, v, go = _packed(lq, lk, 4, 2, 16, device, seed=1)
    alpha = torch.tensor([1.2, 1.5, 1.8, 2.0], device=device)
    got = _fused(q, k, v, go, lq, lk, alpha=alpha, mapping="entmax")
    want = _each_sequence(q, k, v, go, lq, lk, alpha=alpha, mapping="entmax")
    _close(got[:4], want[:4], atol=5e-5)
    torch.testing.assert_close(got[4].double(), want[4], atol=1e-3, rtol=1e-3)
    assert (got[0][-3:] == 0).all() and (got[1][-3:] == 0).all()  # the sequence without keys


def test_packed_tile_map_bits(device, monkeypatch):
    """The tile map (one bit per tile) of a packed batch, causal, sequences of 17, 1, 0 and 530 tokens (34 key
    blocks of 16: two words per query block), 2 query heads over 1, sparsemax: each sequence's tiles with a
    nonzero float64 weight, counted from its own start, every word written; gradients against each sequence
    alone."""
    from test_flash_attention import capture_words, check_map, tile_pattern

    lq = [17, 1, 0, 530]
    q, k, v, go = _packed(lq, lq, 2, 1, 16, device, seed=24)
    pos = torch.cat([torch.arange(n) for n in lq])  # the position in its sequence
    qc = torch.nn.functional.one_hot((pos // 128) % 5, 16).float().to(device)[:, None]
    kc = torch.nn.functional.one_hot(((pos // 16) * 7) % 5, 16).float().to(device)[:, None]
    q, k = 0.1 * q + 16 * qc, 0.1 * k + kc  # query block i (128 rows) attends the key blocks j with 7 j = i (mod 5)
    nq, nk = -(-max(lq) // 128), -(-max(lq) // 16)
    want = torch.zeros(len(lq), 2, nq, nk, dtype=torch.bool)
    q0 = 0
    for b, n in enumerate(lq):
        if n:
            qs, ks, vs = (t[q0:q0 + n].double().transpose(0, 1)[None] for t in (q, k, v))
            _, w = sa.attention(qs, ks.repeat_interleave(2, 1), vs.repeat_interleave(2, 1), mapping="sparsemax",
                                is_causal=True, return_weights=True)
            tiles = tile_pattern(w[0], 128, 16)
            want[b, :, :tiles.shape[-2], :tiles.shape[-1]] = tiles.cpu()
        q0 += n
    kw = dict(mapping="sparsemax", is_causal=True, block_m=128, block_n=16)
    words = capture_words(monkeypatch)
    _close(_fused(q, k, v, go, lq, lq, **kw), _each_sequence(q, k, v, go, lq, lq, **kw), atol=3e-5)
    check_map(want, words, nk)


def test_public_function_dispatches_packed_batches(device, monkeypatch):
    """``softargmax.attention(..., cu_seqlens_q=...)`` takes the kernels on their devices (CPU
    tensors under the interpreter) and gives the materialized path's output otherwise."""
    calls = []
    real = FA._apply
    monkeypatch.setattr(FA, "_apply", lambda *a, **k: calls.append(1) or real(*a, **k))
    lq, lk = [5, 12, 1], [7, 12, 2]
    q, k, v, _ = _packed(lq, lk, 2, 1, 16, device, seed=2)
    cu_q, cu_k = _offsets(lq, device), _offsets(lk, device).long()
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, enable_gqa=True, mapping="entmax15")
    old = _triton_rows.set_cpu_interpret(True) if device == "cpu" else None
    try:
        fused = sa.attention(q, k, v, max_seqlen_q=12, max_seqlen_k=12, **kw)
        assert len(calls) == 1
    finally:
        if old is not None:
            _triton_rows.set_cpu_interpret(old)
    old_flag = FA.set_enabled(False)
    try:
        reference = sa.attention(q, k, v, **kw)  # materialized, one sequence at a time
    finally:
        FA.set_enabled(old_flag)
    assert len(calls) == 1
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=1e-4)
    want = _each_sequence(q, k, v, torch.zeros_like(q), lq, lk, mapping="entmax15")[0]
    torch.testing.assert_close(reference.double(), want, atol=1e-5, rtol=1e-4)


def test_packed_batch_argument_checks():
    q, k, v = torch.randn(8, 2, 4), torch.randn(8, 2, 4), torch.randn(8, 2, 4)
    cu = torch.tensor([0, 3, 8])
    for kw, err, match in [
        (dict(cu_seqlens_q=cu), ValueError, "both cu_seqlens_q and cu_seqlens_k"),
        (dict(cu_seqlens_q=[0, 3, 8], cu_seqlens_k=cu), TypeError, "cu_seqlens_q must be a tensor"),
        (dict(cu_seqlens_q=cu.float(), cu_seqlens_k=cu), TypeError, "int32 or int64"),
        (dict(cu_seqlens_q=cu, cu_seqlens_k=cu[None]), ValueError, "cu_seqlens_k must be 1-D"),
        (dict(cu_seqlens_q=torch.tensor([0, 8]), cu_seqlens_k=cu), ValueError, "as many offsets"),
        (dict(cu_seqlens_q=torch.tensor([0, 5, 3]), cu_seqlens_k=cu), ValueError, "increase from 0"),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 7]), cu_seqlens_k=cu), ValueError, r"query's rows \(8\)"),
        (dict(cu_seqlens_q=cu, cu_seqlens_k=cu, attn_mask=torch.ones(8, 8, dtype=torch.bool)), ValueError,
         "attn_mask cannot be combined"),
        (dict(cu_seqlens_q=cu, cu_seqlens_k=cu, return_weights=True), ValueError, "return_weights"),
        (dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5.0, max_seqlen_k=5), TypeError, "max_seqlen_q"),
    ]:
        with pytest.raises(err, match=match):
            sa.attention(q, k, v, **kw)
    with pytest.raises(ValueError, match="packed"):
        sa.attention(q[None], k[None], v[None], cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match="enable_gqa"):
        sa.attention(q, k[:, :1], v[:, :1], cu_seqlens_q=cu, cu_seqlens_k=cu)


def test_packed_batches_compile_once(device, monkeypatch):
    """Five packings of different lengths and sequence counts: one specialization per kernel (on
    CUDA: at most one new entry in each kernel's compiled-kernel cache)."""
    from test_flash_attention import _KERNELS, _Recorder

    K = FA._module()
    recorders = {name: _Recorder(getattr(K, name), device == "cuda") for name in _KERNELS}
    for name, rec in recorders.items():
        monkeypatch.setattr(K, name, rec)
    if device == "cuda":
        dev = torch.cuda.current_device()
        cached = {name: len(rec.kernel.device_caches[dev][0]) for name, rec in recorders.items()}
    for lq in ([1], [5, 16], [17, 1, 0, 33], [100], [3, 3, 3, 3, 3]):
        q, k, v, go = _packed(lq, lq, 2, 2, 16, device, seed=len(lq))
        packed = FA.Packed(_offsets(lq, device), _offsets(lq, device), max(lq), max(lq))
        qq, kk, vv = (t.requires_grad_() for t in (q, k, v))
        FA.flash_attention(qq, kk, vv, mapping="entmax15", is_causal=True, packed=packed).backward(go)
    for name, rec in recorders.items():
        if device == "cuda":
            assert len(rec.kernel.device_caches[dev][0]) - cached[name] <= 1, name
        if rec.binders is not None:
            assert len(rec.keys[False]) == 1, (name, rec.keys[False])


def test_huggingface_packed_batch():
    """Transformers' flash-attention keywords of a packed batch (one row of several sequences):
    each sequence attends to itself only, causally, as each sequence alone would."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from softargmax.integrations.huggingface import attention_function

    lq = [4, 9, 1]
    q, k, v, _ = _packed(lq, lq, 2, 2, 16, "cpu", seed=5)
    module = SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False,
                             config=SimpleNamespace(output_attentions=False))
    cu = _offsets(lq, "cpu")
    to_hf = lambda t: t.transpose(0, 1)[None]  # noqa: E731  [1, heads, total, head_dim]
    out, w = attention_function("entmax15")(module, to_hf(q), to_hf(k), to_hf(v), None, scaling=0.25,
                                            cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    assert w is None and out.shape == (1, 14, 2, 16)
    want = _each_sequence(q, k, v, torch.zeros_like(q), lq, lq, mapping="entmax15", is_causal=True)[0]
    torch.testing.assert_close(out[0].double(), want, atol=1e-5, rtol=1e-4)
