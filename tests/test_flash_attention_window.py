"""Sliding windows and grouped key/value heads in the fused attention kernels (in Triton's interpreter on
a CPU, 16×16 tiles): outputs and gradients of q, k, v (and a per-head α) against the materialized path in
float64, whose window is a dense band mask built independently here; the key tiles outside the band
never scored; grouped heads read in place (never repeated) with dK, dV summed over each group; the
window with a padding mask (Transformers' sliding layers) and in a packed batch."""

import pytest
import torch
from test_flash_attention import _close, _fused, _inputs, _reference, capture_words, check_map, classed, tile_pattern  # noqa: E402
from test_flash_attention_varlen import _offsets, _packed  # noqa: E402

import softargmax as sa
from softargmax.backends.triton import attention_kernels as AK
from softargmax.backends.triton import flash_attention as FA
from softargmax.backends.triton import rows as _triton_rows


@pytest.fixture
def device(gpu_when_present):
    if not FA.available():
        pytest.skip("Triton is not installed")
    if gpu_when_present:
        return "cuda"
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    return "cpu"


def _band(L, S, window, device):
    """The sliding window as a dense boolean mask, by brute force: query i sees key j iff i - window < j <= i."""
    return torch.tensor([[i - window < j <= i for j in range(S)] for i in range(L)], device=device)


@pytest.mark.parametrize("mapping,alpha,window", [("entmax15", None, 40), ("sparsemax", None, 5),
                                                  ("entmax", 1.3, 17)])
def test_window_values_and_gradients_with_grouped_heads(device, mapping, alpha, window):
    """2 query heads over 1 key/value head, 80 positions: a window of 40 (tiles wholly inside the band,
    walked first without a mask, and whole key blocks before it), 5 (every tile an edge) and 17."""
    L = 80
    q, k, v, go = _inputs(1, 2, 1, L, L, 16, device, seed=11)
    got = _fused(q, k, v, go, mapping=mapping, alpha_float=alpha, window=window)
    want = _reference(q, k, v, go, mapping=mapping, alpha_float=alpha, attn_mask=_band(L, L, window, device))
    _close(got, want, atol=3e-5)


def test_key_tiles_outside_the_window_are_never_scored(device, monkeypatch):
    """The forward's first pass scores exactly the tiles that meet the band (the later passes and the backward
    walk its lists), and forward_stats counts those tiles; a window at least as long as the queries is the
    causal mask (the same kernels: no window)."""
    if device != "cpu":
        pytest.skip("counts the interpreter's calls")
    seen = []
    real = AK._score_tile

    def counted(q, K, k_base, stride_kn, offs_m, offs_n, *rest):
        seen.append((int(offs_m.handle.data[0]), int(offs_n.handle.data[0])))
        return real(q, K, k_base, stride_kn, offs_m, offs_n, *rest)

    monkeypatch.setattr(AK, "_score_tile", counted)
    L, S, window = 64, 70, 20
    q, k, v, _ = _inputs(1, 1, 1, L, S, 16, device, seed=12)
    stats = FA.forward_stats(q, k, v, mapping="entmax15", window=window, block_m=16, block_n=16)
    band = _band(L, S, window, device)
    tiles = {(16 * i, 16 * j) for i in range(4) for j in range(5) if band[16 * i:16 * i + 16, 16 * j:16 * j + 16].any()}
    assert sorted(seen) == sorted(tiles) and len(seen) == len(set(seen)) == stats["tiles"] == 9
    assert 0 < stats["kept"] <= stats["tiles"]
    seen.clear()
    causal = FA.forward_stats(q, k, v, mapping="entmax15", is_causal=True, block_m=16, block_n=16)
    assert len(seen) == causal["tiles"] == 10
    seen.clear()
    wide = FA.forward_stats(q, k, v, mapping="entmax15", window=L, block_m=16, block_n=16)
    assert len(seen) == wide["tiles"] == 10 and torch.equal(wide["psum"], causal["psum"])


def test_grouped_heads_are_never_repeated(device, monkeypatch):
    """4 query heads over 2 key/value heads (and over 1: multi-query), causal with a window: no copy of the
    keys or values per query head (``repeat_interleave``/``expand`` would be one), dK and dV summed over each
    group of 2 (4) query heads, against the float64 reference on repeated heads."""
    for hkv in (2, 1):
        q, k, v, go = _inputs(1, 4, hkv, 33, 33, 16, device, seed=13)
        want = _reference(q, k, v, go, mapping="entmax15", attn_mask=_band(33, 33, 9, device))
        with monkeypatch.context() as m:
            for name in ("repeat_interleave", "expand", "repeat"):
                m.setattr(torch.Tensor, name, _refused(name))
            got = _fused(q, k, v, go, mapping="entmax15", window=9)
        assert got[2].shape == k.shape and got[3].shape == v.shape
        _close(got, want, atol=3e-5)


def _refused(name):
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"Tensor.{name} called on the fused path")

    return refuse


def test_window_with_a_padding_mask_and_learned_alpha(device):
    """A boolean key-padding mask with the window (both must allow a key: Transformers' sliding layers pass
    both), one α per head with its gradient; a padded-out row gets zeros."""
    L = 40
    q, k, v, go = _inputs(2, 2, 2, L, L, 16, device, seed=14)
    keep = torch.ones(2, 1, 1, L, dtype=torch.bool, device=device)
    keep[0, ..., :6] = False  # left padding: rows 0-5 of the first sequence see no key
    alpha = torch.tensor([1.2, 1.7], device=device)
    got = _fused(q, k, v, go, mapping="entmax", alpha=alpha, attn_mask=keep, window=12)
    want = _reference(q, k, v, go, mapping="entmax", alpha=alpha, attn_mask=keep & _band(L, L, 12, device))
    _close(got, want, atol=5e-5)
    assert (got[0][0, :, :6] == 0).all()


def test_packed_batch_with_window(device):
    """A packed batch of three sequences (9, 40 and 23 tokens): the window counts from each sequence's start;
    grouped heads; against each sequence alone with its band mask, through softargmax.attention."""
    lq = [9, 40, 23]
    q, k, v, go = _packed(lq, lq, 4, 2, 16, device, seed=15)
    cu = _offsets(lq, device)
    old = _triton_rows.set_cpu_interpret(True) if device == "cpu" else None
    calls = []
    real = FA._apply
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(FA, "_apply", lambda *a, **kw: calls.append(kw.get("window")) or real(*a, **kw))
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            out = sa.attention(qq, kk, vv, mapping="entmax15", enable_gqa=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                               window=10)
            out.backward(go)
    finally:
        if old is not None:
            _triton_rows.set_cpu_interpret(old)
    assert calls == [10]
    q0 = 0
    for n in lq:
        qs, ks, vs = (t[q0:q0 + n].detach().double().transpose(0, 1).requires_grad_() for t in (q, k, v))
        ref = sa.attention(qs, ks.repeat_interleave(2, 0), vs.repeat_interleave(2, 0), mapping="entmax15",
                           attn_mask=_band(n, n, 10, device), return_weights=True)[0]
        ref.backward(go[q0:q0 + n].double().transpose(0, 1))
        for got, want in ((out, ref), (qq.grad, qs.grad), (kk.grad, ks.grad), (vv.grad, vs.grad)):
            torch.testing.assert_close(got[q0:q0 + n].double().transpose(0, 1), want, atol=3e-5, rtol=1e-3)
        q0 += n


def test_window_tile_map_bits(device, monkeypatch):
    """The tile map (one bit per tile, two words per query block) under a window of 200 over 587 positions in
    128×16 tiles: the tiles with a nonzero float64 weight, every word written; α = 1.3 with 2 query heads over 1,
    gradients against the float64 reference (``dK, dV`` lists the query blocks of its column that see it)."""
    L, window = 16 * 37 - 5, 200
    q, k, v, go = classed(1, 2, 1, L, L, 16, device, seed=23, block_m=128)
    band = _band(L, L, window, device)
    _, w = sa.attention(q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1),
                        mapping="entmax", alpha=1.3, attn_mask=band, return_weights=True)
    words = capture_words(monkeypatch)
    got = _fused(q, k, v, go, mapping="entmax", alpha_float=1.3, window=window, block_m=128, block_n=16)
    check_map(tile_pattern(w, 128, 16), words)
    _close(got, _reference(q, k, v, go, mapping="entmax", alpha_float=1.3, attn_mask=band), atol=3e-5)
