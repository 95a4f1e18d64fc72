"""The fused (FlashAttention-style) α-entmax attention against the materialized path.

On a CPU the kernels run in Triton's interpreter at small sizes (16×16 tiles, so every
test spans several tiles, skips some, and has partial tiles at the edges); the reference is
:func:`softargmax.attention` with ``return_weights=True`` (the weights are materialized and
normalized by the row solvers) in float64.  The sm_90 compile test builds every kernel
variant for an H100/H200 and reports registers, spills and shared memory.
"""

import itertools
import json
import math
import os
import subprocess
import sys

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


def _inputs(B, H, Hkv, L, S, D, device, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=gen) * 1.5
    k = torch.randn(B, Hkv, S, D, generator=gen) * 1.5
    v = torch.randn(B, Hkv, S, D, generator=gen)
    go = torch.randn(B, H, L, D, generator=gen)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, go)]


def _reference(q, k, v, go, alpha=None, **kw):
    """Output and gradients of the materialized path in float64 (keys repeated for GQA)."""
    group = q.shape[1] // k.shape[1]
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    al = None if alpha is None else alpha.detach().double().requires_grad_()
    out, _ = sa.attention(qq, kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1),
                          alpha=al if al is not None else kw.pop("alpha_float", None), return_weights=True, **kw)
    out.backward(go.double())
    return out, qq.grad, kk.grad, vv.grad, None if al is None else al.grad


def _fused(q, k, v, go, alpha=None, **kw):
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    al = None if alpha is None else alpha.detach().clone().requires_grad_()
    out = FA.flash_attention(qq, kk, vv, alpha=al if al is not None else kw.pop("alpha_float", None), **kw)
    out.backward(go)
    return out, qq.grad, kk.grad, vv.grad, None if al is None else al.grad


def _close(got, want, atol, rtol=1e-3):
    names = ("out", "dq", "dk", "dv", "dalpha")
    for name, g, w in zip(names, got, want):
        if w is None:
            continue
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double(), w, atol=atol, rtol=rtol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("mapping,alpha", [("sparsemax", None), ("entmax15", None), ("entmax", 1.3)])
@pytest.mark.parametrize("causal", [False, True])
def test_values_and_gradients(device, mapping, alpha, causal):
    L, S = (33, 33) if causal else (20, 37)  # partial tiles; L != S without the causal mask
    q, k, v, go = _inputs(1, 2, 2, L, S, 16, device)
    kw = dict(mapping=mapping, alpha_float=alpha, is_causal=causal)
    _close(_fused(q, k, v, go, **kw), _reference(q, k, v, go, **kw), atol=2e-5)


@pytest.mark.parametrize("scale", [-0.3, 0.0])
@pytest.mark.parametrize("mapping,alpha", [("sparsemax", None), ("entmax15", None), ("entmax", 1.3)])
def test_a_scale_that_is_not_positive(device, mapping, alpha, scale):
    """The max pass maximizes and bins the dots unscaled only for a positive scale (a negative one would turn the
    row maxima into minima; zero times a masked ``-inf`` is NaN): with ``scale ≤ 0`` it scales every score."""
    q, k, v, go = _inputs(1, 2, 2, 33, 33, 16, device)
    kw = dict(mapping=mapping, alpha_float=alpha, is_causal=True, scale=scale)
    _close(_fused(q, k, v, go, **kw), _reference(q, k, v, go, **kw), atol=2e-5)


def test_learned_alpha_per_head_gqa_padding(device):
    """One α per head (its gradient too), 4 query heads sharing 2 key/value heads, key
    padding that empties a whole batch element, and a strided (transposed) query."""
    B, H, Hkv, L, S, D = 2, 4, 2, 18, 30, 32
    q, k, v, go = _inputs(B, H, Hkv, L, S, D, device, seed=1)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, L, H, D] memory, unit last stride
    alpha = torch.tensor([1.15, 1.5, 1.8, 2.0], device=device)
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)
    keep[0, ..., 25:] = False  # padding
    keep[1] = False  # every key of the second sequence masked: zero output and gradients
    kw = dict(mapping="entmax", attn_mask=keep)
    got = _fused(q, k, v, go, alpha=alpha, **kw)
    _close(got, _reference(q, k, v, go, alpha=alpha, **kw), atol=5e-5)
    assert (got[0][1] == 0).all() and (got[1][1] == 0).all()


def test_learned_alpha_float32_at_head_dim_128(device):
    """Float32 inputs at head dim 128 with one α per head: the forward that takes no step without a pass
    (``flash_attention._predicts``) and launches once; values and gradients, α's too, against float64."""
    q, k, v, go = _inputs(1, 2, 2, 33, 33, 128, device, seed=2)
    alpha = torch.tensor([1.3, 1.7], device=device)
    kw = dict(mapping="entmax", is_causal=True)
    _close(_fused(q, k, v, go, alpha=alpha, **kw), _reference(q, k, v, go, alpha=alpha, **kw), atol=5e-5)


if FA.available():
    import triton
    import triton.language as tl

    @triton.jit
    def _log2_worst(x, HW: tl.constexpr):
        """``log2 x``, with the error bound of ``lg2.approx.f32`` added where the kernels use the hardware's
        (``HW``), its sign from ``x``'s last bit."""
        lg = tl.log2(x)
        if HW:
            err = tl.maximum(tl.abs(lg), 1.0) * LOG2_ERROR
            odd = (x.to(tl.int32, bitcast=True) & 1) == 1
            lg = lg + tl.where(odd, err, -err)
        return lg


#: the error of ``lg2.approx.f32`` (PTX ISA): 2^-22, absolute on [1/2, 2] and relative elsewhere
LOG2_ERROR = 2.0 ** -22


def test_learned_alpha_within_the_hardware_log2_error(device, monkeypatch):
    """With every α ≥ ``ALPHA_FAST_LOG`` a GPU takes the general power's ``log2`` from ``lg2.approx.f32``
    (absolute error up to 2^-22 on [1/2, 2], relative 2^-22 elsewhere); the interpreter runs ``tl.log2``.
    With that worst-case error added to each such ``log2`` (its sign alternating with the argument's last
    mantissa bit), outputs and every gradient (α's included) stay within the float64 reference's tolerance
    at α = 1.25 and 1.6.  An error of 2^-12 instead fails (checked once)."""
    if device != "cpu":
        pytest.skip("the interpreter's log2 is replaced; a GPU runs the hardware's own")
    from softargmax.backends.triton import attention_kernels as AK

    monkeypatch.setattr(AK, "_log2", _log2_worst)
    q, k, v, go = _inputs(1, 2, 2, 33, 33, 16, device, seed=6)
    alpha = torch.tensor([FA.ALPHA_FAST_LOG, 1.6], device=device)
    assert FA._fast_log(FA.ALPHA_FAST_LOG - 1, 0) and not FA._fast_log(0.2, 0) and not FA._fast_log(0.5, 2)
    kw = dict(mapping="entmax", is_causal=True)
    _close(_fused(q, k, v, go, alpha=alpha, **kw), _reference(q, k, v, go, alpha=alpha, **kw), atol=5e-5)


def test_masks_and_empty_rows(device):
    """An additive float mask with -inf entries and a row without any key, then a boolean
    per-head mask; head dim 64."""
    B, H, L, S, D = 1, 2, 20, 24, 64
    q, k, v, go = _inputs(B, H, H, L, S, D, device, seed=2)
    gen = torch.Generator().manual_seed(3)
    add = torch.randn(L, S, generator=gen).to(device)
    add[torch.rand(L, S, generator=gen).to(device) < 0.3] = -math.inf
    add[5] = -math.inf
    got = _fused(q, k, v, go, attn_mask=add, mapping="entmax15")
    _close(got, _reference(q, k, v, go, attn_mask=add, mapping="entmax15"), atol=5e-5)
    assert (got[0][:, :, 5] == 0).all() and (got[1][:, :, 5] == 0).all()
    keep = torch.rand(B, H, L, S, generator=gen).to(device) > 0.5
    _close(_fused(q, k, v, go, attn_mask=keep, mapping="sparsemax"),
           _reference(q, k, v, go, attn_mask=keep, mapping="sparsemax"), atol=5e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(device, dtype):
    """Half inputs (float32 inside): against the reference on the same rounded inputs; the
    threshold solves every row to float32 tolerance (Σp from the solver)."""
    q, k, v, go = _inputs(1, 2, 2, 33, 33, 32, device, dtype=dtype, seed=4)
    alpha = torch.tensor([1.4, 1.9], device=device)
    kw = dict(mapping="entmax", is_causal=True)
    got = _fused(q, k, v, go, alpha=alpha.to(dtype), **kw)
    assert all(t.dtype == dtype for t in got)
    want = _reference(q, k, v, go, alpha=alpha, **kw)
    _close(got[:4], want[:4], atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got[4].double(), want[4], atol=0.5, rtol=3e-2)  # summed over 66 rows
    stats = FA.forward_stats(q, k, v, is_causal=True, mapping="entmax", alpha=alpha.to(dtype))
    assert (stats["psum"] - 1).abs().max() <= 1e-5


def test_block_sparsity_is_exact(device):
    """The tiles the fused path keeps are those where the materialized weights are nonzero,
    and Σp = 1 on every row (0 on the empty rows of a padded sequence)."""
    B, H, L, S, D = 1, 2, 40, 40, 16
    q, k, v, _ = _inputs(B, H, H, L, S, D, device, seed=5)
    # local attention: queries and keys in buckets of 8 positions, each query sees its bucket
    bucket = torch.nn.functional.one_hot(torch.arange(L) // 8, D).float().to(device)
    q = 0.1 * q + 8 * bucket
    k = 0.1 * k + bucket
    # the device's own tiles (16x16 in the interpreter, 32x32 or 64x32 on CUDA) and 16x16 tiles everywhere
    bm, bn, _ = FA.blocks(D, torch.device(device), q.dtype)
    for (block_m, block_n), causal in itertools.product(dict.fromkeys([(bm, bn), (16, 16)]), (False, True)):
        stats = FA.forward_stats(q, k, v, is_causal=causal, mapping="sparsemax", block_m=block_m, block_n=block_n)
        _, w = sa.attention(q.double(), k.double(), v.double(), is_causal=causal, mapping="sparsemax",
                            return_weights=True)
        nm, nn_ = -(-L // block_m), -(-S // block_n)
        wp = torch.nn.functional.pad(w, (0, nn_ * block_n - S, 0, nm * block_m - L))
        nz = (wp.reshape(B, H, nm, block_m, nn_, block_n) > 0).any(-1).any(-2)
        assert stats["kept"] == int(nz.sum()) and stats["block_sparsity"] > 0
        passes = stats["newton_passes"]
        # (one pass can end a block: its closed-form step certifies the support, no confirming pass)
        assert passes.shape == (B, H, nm) and (passes >= 1).all() and (passes < FA.MAX_ITER).all()
        torch.testing.assert_close(stats["psum"], torch.ones(B, H, L, device=device), atol=1e-5, rtol=0)
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)
    keep[..., :] = False
    stats = FA.forward_stats(q, k, v, attn_mask=keep, mapping="entmax15")
    assert (stats["psum"] == 0).all() and stats["kept"] == 0


def test_lists_of_kept_tiles(device):
    """The loops over key (query) blocks walk lists of the kept tiles (their loads then pipeline): the
    forward's final list of each query block is, in order, the key blocks of its tiles whose bit is set
    in the tile map, and the backward built on the lists (the forward's for ``dQ``, the columns of
    the tile map for ``dK, dV``) matches the materialized path in float64 on a block-sparse input."""
    B, H, L, S, D = 1, 1, 40, 40, 16
    q, k, v, go = _inputs(B, H, H, L, S, D, device, seed=5)
    bucket = torch.nn.functional.one_hot(torch.arange(L) // 8, D).float().to(device)
    q, k = 0.1 * q + 8 * bucket, 0.1 * k + bucket  # local attention: a query sees the keys of its bucket
    for causal in (False, True):
        prep = FA._prepare(q, k, v, None, causal, "sparsemax", None)
        cfg = FA._config(prep, 16, 16)
        A = FA._kernel_a(q, None, 1.0)
        _, _, _, words, _, lists = FA._forward(q, k, v, A, 1, None, causal, 0.25, cfg)
        nk = FA._grid(q, k, cfg, None)[2]
        kept = FA.kept_tiles(words, nk)
        assert kept.sum() < kept.numel() // 2  # most tiles are skipped
        for bq in range(kept.shape[0]):
            for mq in range(kept.shape[1]):
                n, half = lists[bq, mq, 2 * nk].item(), lists[bq, mq, 2 * nk + 1].item()
                assert half in (0, nk)
                want = torch.nonzero(kept[bq, mq]).flatten().tolist()
                assert lists[bq, mq, half:half + n].tolist() == want
    _close(_fused(q, k, v, go, mapping="entmax15"), _reference(q, k, v, go, mapping="entmax15"), atol=2e-5)


def test_kept_tiles_unpacks_the_bits():
    """``kept_tiles``: bit ``b`` of word ``w`` is key block ``32 w + b`` (bit 31 included: a negative int32), the
    bits past the last key block are left out; a wrong dtype or word count is refused."""
    words = torch.tensor([[[5 - 2 ** 31, 2 ** 30], [0, 6]]], dtype=torch.int32)  # [1 row, 2 query blocks, 2 words]
    got = FA.kept_tiles(words, 34)
    want = torch.zeros(1, 2, 34, dtype=torch.bool)
    want[0, 0, [0, 2, 31]] = True
    want[0, 1, [33]] = True  # (bit 2 of the second word: key block 34, past the end)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="nk"):
        FA.kept_tiles(words, 65)
    with pytest.raises(TypeError, match="int32"):
        FA.kept_tiles(words.long(), 34)


#: key blocks of the tile-map tests: 37 = 32 + 5, two words per query block, the second partly used
MAP_KEY_BLOCKS = 37


def classed(B, H, Hkv, L, S, D, device, seed, block_m=16):
    """Inputs (``[B, heads, length, D]``) where query block ``i`` (``block_m`` rows) attends the key blocks ``j``
    (16 keys) with ``7 j ≡ i (mod 5)``: about one key tile in five kept, spread over the whole key range (both
    words of the tile map), the others far below the threshold."""
    q, k, v, go = _inputs(B, H, Hkv, L, S, D, device, seed=seed)
    qc = torch.nn.functional.one_hot((torch.arange(L) // block_m) % 5, D).float().to(device)
    kc = torch.nn.functional.one_hot(((torch.arange(S) // 16) * 7) % 5, D).float().to(device)
    return 0.1 * q + 16 * qc, 0.1 * k + kc, v, go


def tile_pattern(w, block_m, block_n):
    """``[..., nq, nk]`` bool: the ``block_m × block_n`` tiles of the weights ``w [..., L, S]`` that hold a
    nonzero weight (the tiles past the end padded with zeros)."""
    L, S = w.shape[-2:]
    nm, nn_ = -(-L // block_m), -(-S // block_n)
    wp = torch.nn.functional.pad(w, (0, nn_ * block_n - S, 0, nm * block_m - L))
    return (wp.reshape(*w.shape[:-2], nm, block_m, nn_, block_n) != 0).any(-1).any(-2)


def check_map(want, words, nk=MAP_KEY_BLOCKS):
    """The tile map of the one fused forward that :func:`capture_words` recorded (``words``, unpacked by
    :func:`FA.kept_tiles <softargmax.backends.triton.flash_attention.kept_tiles>`, as ``forward_stats`` and
    ``dK, dV`` read it) is ``want`` (from float64 weights) over ``nk`` key blocks (33 to 63: two words), keeps
    some tiles and skips others in each word, and the words written have no bit set past the last key block."""
    assert len(words) == 1 and words[0].shape[-1] == 2
    got = FA.kept_tiles(words[0], nk)
    assert got.numel() == want.numel() and got.shape[-1] == nk
    got = got.reshape(want.shape)
    assert torch.equal(got.cpu(), want.cpu()), (got ^ want.to(got.device)).nonzero()[:8].tolist()
    for lo, hi in ((0, 32), (32, nk)):
        assert want[..., lo:hi].any() and not want[..., lo:hi].all()
    assert (words[0][..., 1].cpu() >> (nk - 32) == 0).all()


def capture_words(monkeypatch):
    """Makes the forward's tile map start as all ones (every word must be written) and records it."""
    seen = []
    real = FA.tile_words

    def filled(*args):
        w = real(*args).fill_(-1)
        seen.append(w)
        return w

    monkeypatch.setattr(FA, "tile_words", filled)
    return seen


@pytest.mark.parametrize("mapping,alpha,causal,mask", [
    ("sparsemax", None, False, None), ("entmax15", None, True, None), ("entmax", 1.3, False, "additive"),
    ("entmax", "learned", False, "boolean")])
def test_tile_map_bits(device, monkeypatch, mapping, alpha, causal, mask):
    """One bit per tile: the forward's tile map (two words per query block, the second partly used) is the
    set of tiles with a nonzero weight of the materialized path in float64, every word written; ``dK, dV`` (which
    lists its columns of it, over 2 query heads sharing a key/value head) and ``dQ`` match the float64
    gradients.  Sparsemax, 1.5-entmax causal, α = 1.3 with an additive mask, one learned α per head with a
    boolean mask."""
    S = 16 * MAP_KEY_BLOCKS - 5  # a partial last key block
    L = S if causal else 40
    bm = 128 if causal else 16  # (128-row query blocks: fewer tiles for the interpreter)
    q, k, v, go = classed(1, 2, 1, L, S, 16, device, seed=21, block_m=bm)
    gen = torch.Generator().manual_seed(22)
    kw = dict(mapping=mapping, is_causal=causal)
    if mask == "additive":
        add = 0.3 * torch.randn(L, S, generator=gen)
        add[torch.rand(L, S, generator=gen) < 0.2] = -math.inf
        add[:, 16 * 33:16 * 34] = -math.inf  # a whole key block masked: a skipped tile in the second word
        add[3] = -math.inf  # a row without any key
        kw["attn_mask"] = add.to(device)
    elif mask == "boolean":
        keep = torch.rand(1, 2, L, S, generator=gen) > 0.2
        keep[:, 1, :, 16 * 2:16 * 20] = False  # the second head: key blocks 2-19 masked
        kw["attn_mask"] = keep.to(device)
    alpha_t = torch.tensor([1.3, 1.7], device=device) if alpha == "learned" else None
    al = alpha_t if alpha_t is not None else alpha
    _, w = sa.attention(q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1),
                        alpha=al.double() if alpha_t is not None else al, return_weights=True, **kw)
    if alpha_t is None:
        kw["alpha_float"] = alpha
    words = capture_words(monkeypatch)
    got = _fused(q, k, v, go, alpha=alpha_t, block_m=bm, block_n=16, **kw)
    check_map(tile_pattern(w, bm, 16), words)
    want = _reference(q, k, v, go, alpha=alpha_t, **kw)
    _close(got[:4], want[:4], atol=5e-5)
    if alpha_t is not None:
        torch.testing.assert_close(got[4].double(), want[4], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("mapping", ["sparsemax", "entmax15"])
def test_small_weights_in_far_tiles(device, mapping):
    """Each row puts a small weight (u just above 0) in a key tile of its own: a solver or an
    output pass that skipped tiles too eagerly would lose it (scores set by the additive mask)."""
    B, H, L, S, D = 1, 1, 16, 48, 16
    q, k, v, go = _inputs(B, H, H, L, S, D, device, seed=7)
    q, k = 0.01 * q, 0.01 * k
    gen = torch.Generator().manual_seed(8)
    z = -3 + 0.1 * torch.rand(L, S, generator=gen)
    rows = torch.arange(L)
    z[rows, rows] = 1.0
    z[rows, (rows + 1) % 16] = 1.0
    z[rows, 32 + rows] = 0.52 + 0.002 * rows if mapping == "sparsemax" else 0.8 + 0.01 * rows
    z = z.to(device)
    got = _fused(q, k, v, go, attn_mask=z, mapping=mapping, scale=1.0)
    want = _reference(q, k, v, go, attn_mask=z, mapping=mapping, scale=1.0)
    _close(got, want, atol=2e-5)
    _, w = sa.attention(q.double(), k.double(), v.double(), attn_mask=z.double(), mapping=mapping, scale=1.0,
                        return_weights=True)
    assert ((w[..., 32:] > 0).sum(-1) == 1).all() and (w[..., 16:32] == 0).all()  # the case is as described
    stats = FA.forward_stats(q, k, v, attn_mask=z, mapping=mapping, scale=1.0)
    assert stats["kept"] == 2  # the middle tile is skipped


def test_attention_dispatch(device, monkeypatch):
    """``softargmax.attention`` takes the fused path where it covers the call (CPU tensors
    are routed there under the interpreter), and the materialized one otherwise."""
    calls = []
    real = FA._apply
    monkeypatch.setattr(FA, "_apply", lambda *a, **k: calls.append(1) or real(*a, **k))
    old = _triton_rows.set_cpu_interpret(True) if device == "cpu" else None
    try:
        q, k, v, _ = _inputs(1, 4, 2, 17, 17, 16, device, seed=6)
        out = sa.attention(q, k, v, is_causal=True, mapping="entmax15", enable_gqa=True)
        assert len(calls) == 1
        ref = sa.attention(q, k, v, is_causal=True, mapping="entmax15", enable_gqa=True, return_weights=True)[0]
        assert len(calls) == 1  # the weights: materialized
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        sa.attention(q, k, v, mapping="softmax", enable_gqa=True)  # not covered
        sa.attention(q.double(), k.double(), v.double(), mapping="sparsemax", enable_gqa=True)  # float64
        sa.attention(q[..., :8], k[..., :8], v, mapping="sparsemax", enable_gqa=True)  # head dim 8
        assert len(calls) == 1
        with pytest.raises(ValueError, match="enable_gqa"):
            sa.attention(q, k[:, :1].expand(1, 3, 17, 16), v[:, :1].expand(1, 3, 17, 16), enable_gqa=True)
        old_flag = FA.set_enabled(False)
        sa.attention(q, k, v, mapping="sparsemax", enable_gqa=True)
        FA.set_enabled(old_flag)
        assert len(calls) == 1
        # the module: need_weights=False goes to the kernels, the same output as with the weights
        mha = sa.nn.SparseMultiheadAttention(64, 4, mapping="entmax", alpha=1.5, learn_alpha=True,
                                             batch_first=True).to(device)
        x = torch.randn(2, 9, 64, device=device)
        with torch.no_grad():
            fast, none = mha(x, x, x, need_weights=False)
            slow, _ = mha(x, x, x, need_weights=True)
        assert none is None and len(calls) == 2
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    finally:
        if old is not None:
            _triton_rows.set_cpu_interpret(old)


def test_huggingface_function_without_weights_is_fused(device, monkeypatch):
    """The Transformers attention function asks for the weights only with
    ``output_attentions``; without it (grouped key/value heads, causal) it takes the kernels."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from softargmax.integrations.huggingface import attention_function

    calls = []
    real = FA._apply
    monkeypatch.setattr(FA, "_apply", lambda *a, **k: calls.append(1) or real(*a, **k))
    old = _triton_rows.set_cpu_interpret(True) if device == "cpu" else None
    try:
        q, k, v, _ = _inputs(1, 4, 2, 12, 12, 16, device, seed=9)
        module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False,
                                 config=SimpleNamespace(output_attentions=False))
        fn = attention_function("entmax15")
        out, w = fn(module, q, k, v, None, scaling=0.25)
        assert w is None and len(calls) == 1 and out.shape == (1, 12, 4, 16)
        ref, w = fn(module, q, k, v, None, scaling=0.25, output_attentions=True)
        assert w.shape == (1, 4, 12, 12) and len(calls) == 1
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    finally:
        if old is not None:
            _triton_rows.set_cpu_interpret(old)


def test_uncovered_arguments(device):
    q, k, v, _ = _inputs(1, 2, 2, 8, 8, 16, device)
    for kw in (dict(mapping="softmax"), dict(mapping="entmax", alpha=2.5), dict(mapping="entmax", alpha=1.001),
               dict(mapping="f_jensen_shannon"), dict(mapping="entmax", alpha=torch.full((2, 8, 1), 1.5))):
        with pytest.raises(ValueError, match="do not cover"):
            FA.flash_attention(q, k, v, **kw)
    with pytest.raises(ValueError, match="do not cover"):
        FA.flash_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="do not cover"):
        FA.flash_attention(q[..., :12], k[..., :12], v[..., :12])  # head dim not a power of two
    with pytest.raises(ValueError, match="do not cover"):
        FA.flash_attention(q, k[:, :1].expand(1, 3, 8, 16).contiguous(), v[:, :1].expand(1, 3, 8, 16).contiguous())


COMPILE_SCRIPT = r"""
import json, os, re, subprocess, sys, tempfile
import torch, triton
from concurrent.futures import ProcessPoolExecutor
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from softargmax.backends.triton import attention_kernels as K
from softargmax.backends.triton import flash_attention as F

target = GPUTarget("cuda", 90, 32)
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
HALF = {"Q", "K", "V", "O", "Wv", "DO", "DK", "DV", "DQ"}


def signature(fn, consts, dt):
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in HALF:
            sig[name] = "*" + dt
        elif name == "MASK":
            sig[name] = "*u8" if consts.get("HAS_MASK") == 2 else "*fp32"
        elif name in ("CU_Q", "CU_K", "ITERS", "LIST", "KEPT"):
            sig[name] = "*i32"
        elif name.isupper() and name not in ("H", "HKV", "L", "S", "NQB", "NKB"):
            sig[name] = "*fp32"
        else:
            sig[name] = "fp32" if name in ("scale", "tol") else "i32"
    return sig


variants = []
# every value of every constexpr at least once (EXACT, CAUSAL, HAS_MASK, DOT, VARLEN, HEAD_DIM, ALPHA_GRAD, FAST_LOG,
# WINDOWED, the tiles)
for dt, D, causal, mask, exact, varlen in [("bf16", 64, True, 0, 2, False), ("bf16", 128, False, 1, 0, False),
                                           ("fp16", 64, False, 2, 1, False), ("fp32", 64, True, 0, 0, False),
                                           ("bf16", 128, True, 0, 2, True)]:
    variants.append((dt, D, causal, mask, exact, varlen))
jobs = []
for var in variants:
    dt, D, causal, mask, exact, varlen = var
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dt])
    BM, BN, warps = F.blocks(D, torch.device("cuda"), dtype, masked=mask != 0)
    bwarps = F.backward_warps(D, torch.device("cuda"), dtype)
    c = dict(EXACT=exact, CAUSAL=causal, HAS_MASK=mask, DOT=1 if dt == "fp32" else 0, VARLEN=varlen, BLOCK_M=BM,
             BLOCK_N=BN, HEAD_DIM=D, FAST_LOG=exact == 0 and dt != "fp32", WINDOWED=varlen)  # the packed one windowed
    for fn, cc, w in ((K.attention_fwd, c, warps), (K.attention_bwd_dkdv, c, bwarps),
                      (K.attention_bwd_dq, dict(c, ALPHA_GRAD=exact == 0), bwarps)):
        jobs.append((fn, signature(fn, cc, dt), cc, w, var))
for dt, D in (("bf16", 64), ("bf16", 128)):
    c = dict(BLOCK_R=1024 // D, HEAD_DIM=D)
    sig = {"X": "*" + dt, "Y": "*" + dt, "OUT": "*fp32", "R": "i32", "H": "i32", "L": "i32", "BLOCK_R": "constexpr",
           "HEAD_DIM": "constexpr"}
    sig.update({f"stride_{t}{d}": "i32" for t in "xy" for d in "bhl"})
    jobs.append((K.row_dot, sig, c, 4, (dt, D)))


def build(i):
    fn, sig, consts, warps, var = jobs[i]
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target,
                       options={"num_warps": warps, "num_stages": F.NUM_STAGES})
    assert c.asm.get("cubin"), fn.__name__
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as fh:
        fh.write(c.asm["cubin"])
    out = subprocess.run([cuobjdump, "--dump-resource-usage", fh.name], capture_output=True, text=True)
    os.unlink(fh.name)
    use = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out.stdout)
    regs, stack, static_shared, local = (int(x) for x in use.groups())
    return {"kernel": fn.__name__, "variant": list(var), "warps": warps, "registers": regs,
            "stack_bytes": stack + local, "shared_bytes": c.metadata.shared + static_shared}


if __name__ == "__main__":
    with ProcessPoolExecutor(2) as pool:  # the compiles are independent: two at a time
        report = list(pool.map(build, range(len(jobs))))
    print(json.dumps(report))

"""


def test_kernels_compile_for_sm90():
    """Every kernel compiles to an sm_90 binary with every value of each compile-time switch
    (EXACT 0/1/2, causal, mask, packed sequences, a sliding window, head dims 64 and 128, bfloat16/float16/float32, α gradient); registers, spills and shared
    memory of each binary (``cuobjdump --dump-resource-usage``; stack bytes are spills) are
    printed (``-s``): the tile choice of :func:`softargmax.backends.triton.flash_attention.blocks` rests on them."""
    if not FA.available():
        pytest.skip("Triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report) == 3 * 5 + 2
    for r in report:
        print(f"{r['kernel']:>20} {r['variant']} warps={r['warps']} regs={r['registers']} "
              f"stack(spills)={r['stack_bytes']}B shared={r['shared_bytes']}B")
        assert r["registers"] <= 255 and r["shared_bytes"] <= 227 * 1024


# -- compiled variants -------------------------------------------------------------------------

_KERNELS = ("attention_fwd", "attention_bwd_dkdv", "attention_bwd_dq", "row_dot")


def _binder(kernel, plain=False):
    """Triton's own specialization of a launch's arguments (the key of its compiled-kernel
    cache, less the device): the function the JIT builds from the kernel's signature.
    ``plain``: as if the kernel had no ``do_not_specialize`` list."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    fn = getattr(kernel, "fn", kernel)
    kwargs = {} if plain else dict(getattr(kernel, "kwargs", None) or
                                   dict(do_not_specialize=kernel.do_not_specialize,
                                        do_not_specialize_on_alignment=kernel.do_not_specialize_on_alignment))
    jit = JITFunction(fn, **{k: v for k, v in kwargs.items() if k.startswith("do_not_specialize")})
    return create_function_from_signature(jit.signature, jit.params, BaseBackend)


class _Recorder:
    """Stands in for a kernel: records the specialization key of every launch (and launches
    it on CUDA, where the real cache is counted too)."""

    def __init__(self, kernel, launch):
        self.kernel, self.launch = kernel, launch
        self.keys = {False: set(), True: set()}
        try:
            self.binders = {plain: _binder(kernel, plain) for plain in (False, True)}
        except Exception:  # another Triton's internals (the GPU machine's): the real cache is counted there
            if not launch:
                raise
            self.binders = None

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            for plain, binder in (self.binders or {}).items():
                _, spec, options = binder(*args, **kwargs)
                self.keys[plain].add((tuple(spec), tuple(sorted(options.items()))))
            if self.launch:
                return self.kernel[grid](*args, **kwargs)
        return run


def test_one_compilation_per_configuration_over_lengths_and_batches(device, monkeypatch):
    """Five sequence lengths (1 included: Triton makes a constant of an integer equal to 1),
    two batch sizes, one and two heads, with and without a padding mask: every kernel is
    specialized (compiled) once per configuration (mapping, causal, mask kind, head dim,
    dtype), where Triton's default specialization would compile several.  In the interpreter
    the kernels are not run (the key is what counts); on CUDA they run and the compiled-kernel
    cache is counted as well."""
    K = FA._module()
    on_cuda = device == "cuda"
    recorders = {name: _Recorder(getattr(K, name), on_cuda) for name in _KERNELS}
    for name, rec in recorders.items():
        monkeypatch.setattr(K, name, rec)
    cached = {}
    if on_cuda:
        dev = torch.cuda.current_device()
        cached = {name: len(rec.kernel.device_caches[dev][0]) for name, rec in recorders.items()}
    for masked in (False, True):
        for rec in recorders.values():
            rec.keys = {False: set(), True: set()}
        for L, B, H in itertools.product((1, 7, 16, 33, 100), (1, 3), (1, 2)):
            q, k, v, go = _inputs(B, H, H, L, L, 16, device, seed=L)
            kw = dict(attn_mask=torch.arange(L, device=device) < max(1, L - 3)) if masked else dict(is_causal=True)
            qq, kk, vv = (t.requires_grad_() for t in (q, k, v))
            FA.flash_attention(qq, kk, vv, mapping="entmax15", **kw).backward(go)
        for name, rec in recorders.items():
            if rec.binders is None:
                continue
            assert len(rec.keys[False]) == 1, (name, masked, rec.keys[False])
            assert len(rec.keys[True]) > 1, name  # the default specialization would compile more
    if on_cuda:
        for name, rec in recorders.items():
            assert len(rec.kernel.device_caches[dev][0]) - cached[name] <= 2, name  # one per mask setting
