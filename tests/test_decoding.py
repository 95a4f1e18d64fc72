"""Sparse decoding over a key/value cache (softargmax.decode_attention), the reference path: float64
against a brute force that takes each (sequence, head, query) row on its own (its valid keys gathered
by hand, the mapping by float64 bisection), with different lengths in one batch, left padding,
grouped heads and several causal queries; chunked prefills (more new queries than one pass holds,
taken in blocks); a boolean mask with ranges that only bound it; a paged cache against the contiguous
one; the argument checks."""

import pytest
import torch
from conftest import entmax_ref64  # noqa: E402

import softargmax as sa

#: mapping name, its α for the brute force, the alpha argument
MAPPINGS = [("sparsemax", 2.0, None), ("entmax15", 1.5, None), ("softmax", 1.0, None), ("entmax", 1.25, 1.25)]


def _brute_force(q, k, v, ends, starts, alpha, scale=None, window=None, mask=None):
    """Each row on its own: query i of sequence b sees positions starts[b] .. ends[b] - L + i (with a window, from
    ends[b] - L + i - window + 1 on; with a boolean mask [B or 1, 1, L, S], only where it is true)."""
    B, H, L, D = q.shape
    group = H // k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(B, H, L, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                first = starts[b] if window is None else max(starts[b], ends[b] - L + i - window + 1)
                keys = [j for j in range(first, min(ends[b] - L + i + 1, k.shape[2]))
                        if mask is None or mask[b % mask.shape[0], 0, i, j]]
                if not keys:
                    continue
                kk, vv = k[b, h // group, keys].double(), v[b, h // group, keys].double()
                al = alpha if not isinstance(alpha, torch.Tensor) else float(alpha[h])
                p = entmax_ref64((kk @ q[b, h, i].double()) * scale, al)
                out[b, h, i] = p @ vv
    return out


def _data(B, H, Hkv, L, S, D, seed=0, dtype=torch.float64, Dv=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64) * 1.5
    k = torch.randn(B, Hkv, S, D, generator=gen, dtype=torch.float64) * 1.5
    v = torch.randn(B, Hkv, S, Dv or D, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("mapping,alpha_ref,alpha", MAPPINGS)
def test_mixed_lengths_left_padding_gqa_causal_queries(mapping, alpha_ref, alpha):
    """Three sequences of different lengths, one left-padded, 4 query heads over 2 key/value heads,
    3 new queries causal among themselves (bottom-right)."""
    q, k, v = _data(3, 4, 2, 3, 12, 8)
    ends, starts = [12, 7, 10], [0, 0, 4]
    out = sa.decode_attention(q, k, v, torch.tensor(ends), torch.tensor(starts), mapping=mapping, alpha=alpha)
    torch.testing.assert_close(out, _brute_force(q, k, v, ends, starts, alpha_ref), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("mapping,alpha_ref,alpha", MAPPINGS[:2])
def test_sliding_window_bottom_right(mapping, alpha_ref, alpha):
    """A window of 4 keys for 3 new queries (aligned bottom-right with the cache): three sequences, one whose
    window is cut by its left padding and one whose first query sees a single key."""
    q, k, v = _data(3, 4, 2, 3, 12, 8, seed=7)
    ends, starts = [12, 7, 10], [0, 0, 7]
    out = sa.decode_attention(q, k, v, torch.tensor(ends), torch.tensor(starts), mapping=mapping, alpha=alpha,
                              window=4)
    torch.testing.assert_close(out, _brute_force(q, k, v, ends, starts, alpha_ref, window=4), atol=1e-10, rtol=1e-10)
    kn, vn = k.clone(), v.clone()
    kn[0, :, :6], vn[0, :, :6] = float("nan"), float("nan")  # before the first query's window (6 to 9): never used
    nan = sa.decode_attention(q, kn, vn, torch.tensor(ends), torch.tensor(starts), mapping=mapping, alpha=alpha,
                              window=4)
    torch.testing.assert_close(nan, out, atol=0, rtol=0)
    wide = sa.decode_attention(q, k, v, torch.tensor(ends), torch.tensor(starts), mapping=mapping, window=12)
    torch.testing.assert_close(wide, sa.decode_attention(q, k, v, torch.tensor(ends), torch.tensor(starts),
                                                         mapping=mapping), atol=0, rtol=0)


def test_per_head_alpha_mqa_and_scale():
    """A per-head α tensor (a learned α at inference), one key/value head for all (multi-query), a scale."""
    q, k, v = _data(2, 3, 1, 2, 9, 4, seed=1, Dv=5)
    alpha = torch.tensor([1.2, 1.5, 2.0], dtype=torch.float64)
    ends, starts = [9, 5], [2, 0]
    out = sa.decode_attention(q, k, v, torch.tensor(ends, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32),
                              mapping="entmax", alpha=alpha, scale=0.7)
    torch.testing.assert_close(out, _brute_force(q, k, v, ends, starts, alpha, scale=0.7), atol=1e-10, rtol=1e-10)


def test_single_query_matches_attention_over_the_valid_cache():
    """L = 1 is :func:`softargmax.attention` of the query over the valid keys (grouped heads)."""
    q, k, v = _data(2, 4, 2, 1, 10, 8, seed=2)
    out = sa.decode_attention(q, k, v, torch.tensor([10, 6]), torch.tensor([0, 1]))
    torch.testing.assert_close(out[0], sa.attention(q[0], k[0], v[0], enable_gqa=True))
    torch.testing.assert_close(out[1], sa.attention(q[1], k[1, :, 1:6], v[1, :, 1:6], enable_gqa=True))


def test_queries_without_keys_give_zeros_never_nan():
    """An empty sequence, and a sequence shorter than its new queries: zero outputs where no key is seen."""
    q, k, v = _data(2, 2, 2, 3, 6, 4, seed=3)
    out = sa.decode_attention(q, k, v, torch.tensor([0, 2]), mapping="sparsemax")
    assert torch.isfinite(out).all()
    assert (out[0] == 0).all() and (out[1, :, 0] == 0).all()
    torch.testing.assert_close(out, _brute_force(q, k, v, [0, 2], [0, 0], 2.0), atol=1e-10, rtol=1e-10)


def _paged(cache, page, gen):
    """A contiguous cache [B, Hkv, S, D] as shuffled pages [N, page, Hkv, D] and its block table."""
    B, Hkv, S, D = cache.shape
    n = S // page
    order = torch.randperm(B * n, generator=gen)
    pages = torch.empty(B * n + 1, page, Hkv, D, dtype=cache.dtype)  # one spare page
    pages[order] = cache.transpose(1, 2).reshape(B * n, page, Hkv, D)
    return pages, order.view(B, n)


def test_paged_cache_matches_contiguous():
    q, k, v = _data(2, 4, 2, 2, 12, 8, seed=4)
    gen = torch.Generator().manual_seed(0)
    kp, table = _paged(k, 4, gen)
    vp = torch.empty_like(kp)
    vp[table.reshape(-1)] = v.transpose(1, 2).reshape(-1, 4, 2, 8)
    ends, starts = torch.tensor([12, 7]), torch.tensor([0, 3])
    table = table.clone()
    table[1, 2] = -1  # a page past sequence 1's end: never read
    want = sa.decode_attention(q, k, v, ends, starts, mapping="entmax15")
    got = sa.decode_attention(q, kp, vp, ends, starts, mapping="entmax15", block_table=table.to(torch.int32))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_input_is_not_modified():
    q, k, v = _data(1, 2, 1, 2, 5, 4, seed=5)
    copies = [t.clone() for t in (q, k, v)]
    sa.decode_attention(q, k, v, torch.tensor([4]))
    for a, b in zip((q, k, v), copies):
        assert torch.equal(a, b)


@pytest.mark.parametrize("change,error,match", [
    (dict(query=torch.zeros(1, 2, 4)), ValueError, "query must be 4-D"),
    (dict(query=torch.zeros(1, 2, 0, 4)), ValueError, "at least one new query"),
    (dict(query=torch.zeros(1, 3, 1, 4)), ValueError, "multiple of the key/value heads"),
    (dict(key=torch.zeros(1, 2, 5, 4, dtype=torch.float64)), TypeError, "key must have query's dtype"),
    (dict(key=torch.zeros(2, 2, 5, 4)), ValueError, "key must hold query's batch"),
    (dict(value=torch.zeros(1, 2, 6, 4)), ValueError, "value must have key's shape"),
    (dict(key=torch.zeros(1, 2, 5, 3)), ValueError, "feature size"),
    (dict(cache_seqlens=[5]), TypeError, "cache_seqlens must be a tensor"),
    (dict(cache_seqlens=torch.tensor([5.0])), TypeError, "cache_seqlens must be an int32 or int64"),
    (dict(cache_seqlens=torch.tensor([5, 5])), ValueError, r"cache_seqlens must have shape \(1,\)"),
    (dict(cache_starts=torch.tensor([[0]])), ValueError, "cache_starts must have shape"),
    (dict(key=torch.zeros(3, 4, 2, 4), value=torch.zeros(3, 4, 2, 4), block_table=torch.zeros(1, 2)), TypeError,
     "block_table must be an int32 or int64"),
    (dict(key=torch.zeros(3, 4, 2, 4), value=torch.zeros(3, 4, 2, 4), block_table=torch.zeros(2, 2, dtype=torch.int32)),
     ValueError, "block_table must have shape"),
    (dict(scale="x"), TypeError, "scale must be"),
    (dict(mapping="entmax2"), ValueError, "unknown name"),
    (dict(num_splits=0), ValueError, "num_splits"),
    (dict(num_splits=2.0), TypeError, "num_splits"),
    (dict(window=0), ValueError, "window must be None or a positive int"),
    (dict(window=2.0), TypeError, "window must be None or a positive int"),
    (dict(query=torch.zeros(1, 2, 1, 4, dtype=torch.int64)), TypeError, "query must have a floating-point dtype"),
    (dict(attn_mask=torch.ones(1, 1, 1, 5)), TypeError, "attn_mask must be a boolean tensor"),
    (dict(attn_mask=[True]), TypeError, "attn_mask must be None or a boolean tensor"),
    (dict(attn_mask=torch.ones(1, 1, 2, 5, dtype=torch.bool)), ValueError, "attn_mask of shape"),
    (dict(attn_mask=torch.ones(1, 1, 1, 4, dtype=torch.bool)), ValueError, "attn_mask of shape"),
])
def test_bad_arguments_name_the_argument(change, error, match):
    args = dict(query=torch.zeros(1, 2, 1, 4), key=torch.zeros(1, 2, 5, 4), value=torch.zeros(1, 2, 5, 4),
                cache_seqlens=torch.tensor([5]))
    args.update(change)
    with pytest.raises(error, match=match):
        sa.decode_attention(**args)


def test_nan_outside_the_sequences_never_reaches_the_output():
    """An uninitialized cache: NaN keys and values past a sequence's end and in its left padding; the
    materialized path gives the brute force's answer on the valid positions, with no NaN."""
    q, k, v = _data(2, 2, 1, 2, 10, 4, seed=7)
    want = _brute_force(q, k, v, [7, 10], [2, 0], 1.5)
    k[0, :, 7:], v[0, :, 7:], k[0, :, :2], v[0, :, :2] = (float("nan"),) * 4
    out = sa.decode_attention(q, k, v, torch.tensor([7, 10]), torch.tensor([2, 0]))
    torch.testing.assert_close(out, want)


def test_huge_values_outside_the_sequences_keep_gradients_finite():
    """Finite garbage of 3e38 in the cache outside the sequences: the output and the gradients of the query, the keys
    and the values equal those with zeros there (the values' gradient is 0 outside), and stay finite (``dO · v`` at
    those positions would overflow, were the values not zeroed before the product)."""
    q, k, v = _data(2, 2, 1, 2, 10, 4, seed=8)
    go = torch.randn(q.shape[:3] + (v.shape[-1],), generator=torch.Generator().manual_seed(9), dtype=q.dtype)
    ends, starts = torch.tensor([7, 10]), torch.tensor([2, 0])
    results = []
    for fill in (0.0, 3e38):
        kk, vv = k.clone(), v.clone()
        kk[0, :, 7:], vv[0, :, 7:], kk[0, :, :2], vv[0, :, :2] = (fill,) * 4
        leaves = [t.detach().clone().float().requires_grad_() for t in (q, kk, vv)]
        out = sa.decode_attention(*leaves, ends, starts)
        results.append([out] + list(torch.autograd.grad(out, leaves, go.float())))
    for a, b in zip(*results):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a)


def _blocks(monkeypatch, n, B, H, S):
    """Sets the scores budget so that one pass takes ``n`` (a multiple of 16) new queries; returns the passes' query
    counts as the calls record them."""
    from softargmax.operators import decoding as D

    monkeypatch.setattr(D, "SCORES_BUDGET", n * B * H * S)
    passes = []
    real = D._one_pass

    def counted(query, *args):
        passes.append(query.shape[2])
        return real(query, *args)

    monkeypatch.setattr(D, "_one_pass", counted)
    return passes


@pytest.mark.parametrize("L", [17, 40])
@pytest.mark.parametrize("window", [None, 9])
def test_chunked_prefill_in_blocks_of_queries(monkeypatch, L, window):
    """L new queries appended to caches of different lengths (one left-padded, one whose first new queries see no
    key of their own... before its start), 4 query heads over 2, taken 16 queries per pass: each block bottom-right
    aligned at its own end, against the float64 brute force of the whole call."""
    B, H, S = 3, 4, 64
    q, k, v = _data(B, H, 2, L, S, 8, seed=20 + L)
    ends, starts = [64, L + 5, 50], [0, 0, 12]
    passes = _blocks(monkeypatch, 16, B, H, S)
    out = sa.decode_attention(q, k, v, torch.tensor(ends), torch.tensor(starts), window=window)
    assert passes == [16] * (L // 16) + [L % 16]
    torch.testing.assert_close(out, _brute_force(q, k, v, ends, starts, 1.5, window=window), atol=1e-10, rtol=1e-10)


def test_query_blocks_follow_the_budget():
    from softargmax.operators.decoding import SCORES_BUDGET, query_block

    assert query_block(1, 32, 16, 4096) == 16                   # fits: one pass
    assert query_block(1, 32, 2048, 4096) == SCORES_BUDGET // (32 * 4096)
    assert query_block(2, 32, 2048, 1 << 20) == 16              # never fewer than 16
    assert query_block(1, 3, 1000, 100_000) % 16 == 0


def test_chunked_prefill_over_a_paged_cache(monkeypatch):
    """40 new queries over a paged cache (pages of 4, shuffled), blocks of 16: the contiguous cache's answer."""
    q, k, v = _data(2, 4, 2, 40, 64, 8, seed=21)
    gen = torch.Generator().manual_seed(3)
    kp, table = _paged(k, 4, gen)
    vp = torch.empty_like(kp)
    vp[table.reshape(-1)] = v.transpose(1, 2).reshape(-1, 4, 2, 8)
    ends, starts = torch.tensor([64, 52]), torch.tensor([3, 0])
    passes = _blocks(monkeypatch, 16, 2, 4, 64)
    got = sa.decode_attention(q, kp, vp, ends, starts, mapping="sparsemax", block_table=table)
    assert passes == [16, 16, 8]
    want = _brute_force(q, k, v, [64, 52], [3, 0], 2.0)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_a_mask_with_bounding_ranges_is_attention_with_the_mask(monkeypatch):
    """A boolean mask with holes and keys after a query's own position (a bidirectional block), ranges that only
    bound it (the end past S), 20 new queries in blocks of 16: attention with the mask, and the brute force."""
    B, H, L, S = 2, 4, 20, 48
    q, k, v = _data(B, H, 2, L, S, 8, seed=22)
    gen = torch.Generator().manual_seed(4)
    mask = torch.rand(B, 1, L, S, generator=gen) < 0.6
    mask[..., :2] = False  # the first keys of every row hidden: the ranges start at 2
    mask[1, :, 3] = False  # a row of sequence 1 that sees nothing
    pos = torch.arange(S)
    first = torch.where(mask[:, 0], pos, S).amin((1, 2))
    bound = torch.where(mask[:, 0], pos + L - torch.arange(L).view(L, 1), 0).amax((1, 2))
    assert (bound > S).all()
    passes = _blocks(monkeypatch, 16, B, H, S)
    out = sa.decode_attention(q, k, v, bound, first, attn_mask=mask, mapping="sparsemax")
    assert passes == [16, 4]
    torch.testing.assert_close(out, sa.attention(q, k, v, attn_mask=mask, mapping="sparsemax", enable_gqa=True),
                               atol=1e-12, rtol=1e-12)
    want = _brute_force(q, k, v, bound.tolist(), first.tolist(), 2.0, mask=mask)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    assert (out[1, :, 3] == 0).all()


@pytest.mark.parametrize("shape", [(2, 1, 1, 64), (64,), (1, 64), ()])
def test_a_mask_broadcast_over_the_queries_holds_in_every_block(monkeypatch, shape):
    """A padding mask of one query row ([B, 1, 1, S], [S], [1, S], 0-D), 40 new queries in blocks of 16: the one-pass
    answer and the float64 brute force (each block keeps the mask, none drops it)."""
    B, H, L, S = 2, 2, 40, 64
    q, k, v = _data(B, H, 2, L, S, 8, seed=23)
    gen = torch.Generator().manual_seed(5)
    mask = torch.rand(shape, generator=gen) < 0.6 if shape else torch.tensor(False)
    if len(shape) == 4:
        mask[1, ..., :30] = False  # sequence 1 left-padded by the mask alone
    ends, starts = torch.tensor([64, 64]), torch.tensor([0, 0])
    one = sa.decode_attention(q, k, v, ends, starts, attn_mask=mask, mapping="sparsemax")
    passes = _blocks(monkeypatch, 16, B, H, S)
    out = sa.decode_attention(q, k, v, ends, starts, attn_mask=mask, mapping="sparsemax")
    assert passes == [16, 16, 8]
    torch.testing.assert_close(out, one, atol=1e-12, rtol=1e-12)
    want = _brute_force(q, k, v, [64, 64], [0, 0], 2.0, mask=mask.expand(B, 1, L, S))
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
