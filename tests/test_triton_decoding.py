"""The Triton path of softargmax.decode_attention (in Triton's interpreter on a CPU): split-K against one
program per group, grouped heads packed against repeated heads, different lengths and left padding with
several causal queries against the float64 brute force, chunked prefills (blocks of 16 new queries) with
a window and over pages, a boolean mask with bounding ranges, a paged cache against the contiguous one,
the tiles outside the support and outside the sequences never read, the kernels as one operator under
torch.compile; on a GPU only, a step without host synchronization replayed in a CUDA graph.  Tiny shapes: the interpreter runs each
program instance in turn (tens of them per test)."""

import pytest
import torch
from conftest import needs_cuda
from test_decoding import _blocks, _brute_force, _data, _paged  # noqa: E402

import softargmax as sa
from softargmax.backends.triton import decoding as DEC
from softargmax.backends.triton import rows as _triton_rows
from softargmax.divergences import get_divergence


@pytest.fixture
def device(triton_device):
    """Where the kernels run; under the interpreter the middle step (the row solver) runs on the CPU solver:
    the interpreted Triton row solver costs 3 to 11 s per call (it has its own tests, test_triton_rows.py;
    :func:`test_the_triton_row_solver_in_the_middle` runs the three steps in Triton)."""
    if triton_device != "cpu":
        yield triton_device
        return
    old = _triton_rows.set_enabled(False)
    yield triton_device
    _triton_rows.set_enabled(old)


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of the kernel path (a test that expects it fails if the reference path ran)."""
    calls = []
    real = DEC.weighted_values

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(DEC, "weighted_values", counted)
    return calls


def _to(device, *ts, dtype=torch.float32):
    return [t.to(device=device, dtype=dtype) for t in ts]


def _lengths(device, *xs):
    return [torch.tensor(x, device=device) for x in xs]


@pytest.mark.parametrize("mapping,alpha_ref,alpha", [("entmax15", 1.5, None), ("sparsemax", 2.0, None),
                                                     ("entmax", 1.25, 1.25), ("softmax", 1.0, None)])
def test_mixed_lengths_left_padding_causal_queries(device, spy, mapping, alpha_ref, alpha):
    """Three sequences (one left-padded), 2 query heads over 1 key/value head, 3 causal queries, 2 splits of a
    70-position cache: float32 kernels against the float64 brute force."""
    q64, k64, v64 = _data(3, 2, 1, 3, 70, 16, seed=10)
    q, k, v = _to(device, q64, k64, v64)
    ends, starts = [70, 33, 61], [0, 0, 20]
    out = sa.decode_attention(q, k, v, *_lengths(device, ends, starts), mapping=mapping, alpha=alpha, num_splits=2)
    assert spy
    want = _brute_force(q64, k64, v64, ends, starts, alpha_ref)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_split_k_matches_one_program(device, spy):
    """The cache split over 3 programs per group against 1 (the same sums, in another order)."""
    q, k, v = _to(device, *_data(2, 2, 1, 2, 96, 16, seed=11))
    ends = torch.tensor([96, 50], device=device)
    one = sa.decode_attention(q, k, v, ends, num_splits=1)
    three = sa.decode_attention(q, k, v, ends, num_splits=3)
    assert DEC.layout(q, k, None, 3).splits == 3 and DEC.layout(q, k, None, 1).splits == 1
    torch.testing.assert_close(three, one, atol=1e-6, rtol=1e-6)
    assert len(spy) == 2


def test_packed_group_matches_repeated_heads(device, spy):
    """4 query heads over 2 key/value heads (one program per split reads each tile once for its group of 2)
    against the same cache repeated for each head (4 programs)."""
    q, k, v = _to(device, *_data(1, 4, 2, 2, 64, 16, seed=12))
    ends, starts = _lengths(device, [60], [5])
    packed = sa.decode_attention(q, k, v, ends, starts, mapping="sparsemax", num_splits=1)
    rep = sa.decode_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), ends, starts,
                              mapping="sparsemax", num_splits=1)
    lay = DEC.layout(q, k, None, 1)
    assert (lay.block_m, lay.chunks) == (16, 1)  # 4 rows of a group, one program per group
    torch.testing.assert_close(packed, rep, atol=1e-6, rtol=1e-6)


def test_paged_matches_contiguous(device, spy):
    """Pages of 32 positions, shuffled, one table entry past a sequence's end left invalid."""
    q, k, v = _data(2, 2, 1, 2, 96, 16, seed=13)
    gen = torch.Generator().manual_seed(1)
    kp, table = _paged(k, 32, gen)
    vp = torch.empty_like(kp)
    vp[table.reshape(-1)] = v.transpose(1, 2).reshape(-1, 32, 1, 16)
    table = table.clone()
    table[1, 2] = -1  # sequence 1 ends at 60: its third page is never read
    q, k, v, kp, vp = _to(device, q, k, v, kp, vp)
    ends, starts = _lengths(device, [96, 60], [0, 10])
    want = sa.decode_attention(q, k, v, ends, starts, num_splits=2)
    got = sa.decode_attention(q, kp, vp, ends, starts, block_table=table.to(device=device, dtype=torch.int32),
                              num_splits=2)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert len(spy) == 2


def test_tiles_without_support_and_outside_the_sequence_are_not_read(device, spy):
    """NaN values in a tile where sparsemax gives every row zero weight, and NaN keys and values in the left
    padding and past the end: the output stays finite (a tile read would give 0 · NaN = NaN)."""
    q, k, v = _data(1, 2, 1, 1, 96, 16, seed=14)
    q = q.abs()
    k[0, 0, 32:64] = -q[0, 0, 0] - q[0, 1, 0]  # the second tile scores far below the rest for both heads
    v[0, 0, 32:64] = float("nan")
    k[0, 0, :8], v[0, 0, :8] = float("nan"), float("nan")    # left padding
    k[0, 0, 90:], v[0, 0, 90:] = float("nan"), float("nan")  # past the end
    q, k, v = _to(device, q, k, v)
    ends, starts = _lengths(device, [90], [8])
    out = sa.decode_attention(q, k, v, ends, starts, mapping="sparsemax", num_splits=3)
    assert spy and torch.isfinite(out).all()
    k64, v64 = k.cpu().double(), v.cpu().double()
    v64[0, 0, 32:64] = 0.0  # the weights there are zero: any finite values give the same answer
    want = _brute_force(q.cpu().double(), k64, v64, [90], [8], 2.0)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_sliding_window_never_reads_before_it(device, spy):
    """A window of 20 positions for 3 causal queries (bottom-right): two sequences, one left-padded, grouped heads;
    NaN keys and values before the first query's window (inside the sequence) stay unread, and the output is the
    float64 brute force's with the window (split over the cache, so that whole splits lie before the window)."""
    q, k, v = _data(2, 4, 2, 3, 96, 16, seed=16)
    ends, starts = [90, 70], [0, 5]
    for b, end in enumerate(ends):  # every position before the first query's window, from the sequence's start
        k[b, :, starts[b]:end - 3 + 1 - 20], v[b, :, starts[b]:end - 3 + 1 - 20] = float("nan"), float("nan")
    q, k, v = _to(device, q, k, v)
    out = sa.decode_attention(q, k, v, *_lengths(device, ends, starts), window=20, num_splits=3)
    assert spy and torch.isfinite(out).all()
    k64, v64 = (torch.nan_to_num(t.cpu().double()) for t in (k, v))
    want = _brute_force(q.cpu().double(), k64, v64, ends, starts, 1.5, window=20)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_bfloat16_within_rounding(device, spy):
    """bfloat16 inputs: within bfloat16's rounding of the float64 answer on the same (rounded) inputs."""
    q, k, v = _to(device, *_data(2, 2, 1, 1, 64, 16, seed=15), dtype=torch.bfloat16)
    out = sa.decode_attention(q, k, v, torch.tensor([64, 40], device=device), num_splits=2)
    assert out.dtype == torch.bfloat16 and spy
    want = _brute_force(q.cpu().double(), k.cpu().double(), v.cpu().double(), [64, 40], [0, 0], 1.5)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-2, rtol=2e-2)


def test_gradients_take_the_reference_path(device, spy):
    """The kernels have no backward: a query that requires a gradient takes the materialized path."""
    q, k, v = _to(device, *_data(1, 2, 1, 1, 40, 16, seed=16))
    q.requires_grad_()
    out = sa.decode_attention(q, k, v, torch.tensor([40], device=device))
    out.sum().backward()
    assert not spy and q.grad is not None and torch.isfinite(q.grad).all()


def test_the_triton_row_solver_in_the_middle(triton_device, spy):
    """The three steps in Triton (scores, the row solver, P·V): 4 rows of 40 keys, one of them left-padded."""
    q64, k64, v64 = _data(2, 2, 1, 1, 40, 16, seed=17)
    q, k, v = _to(triton_device, q64, k64, v64)
    out = sa.decode_attention(q, k, v, *_lengths(triton_device, [40, 33], [0, 6]), mapping="sparsemax", num_splits=2)
    assert spy
    want = _brute_force(q64, k64, v64, [40, 33], [0, 6], 2.0)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_strided_lengths_and_block_table(device, spy):
    """Lengths taken every other entry of a longer tensor and a block table with column stride 2 (both int32,
    so that the conversion keeps their strides): the kernels read them as the contiguous ones."""
    q, k, v = _data(2, 2, 1, 1, 64, 16, seed=18)
    gen = torch.Generator().manual_seed(2)
    kp, table = _paged(k, 16, gen)
    vp = torch.empty_like(kp)
    vp[table.reshape(-1)] = v.transpose(1, 2).reshape(-1, 16, 1, 16)
    q, kp, vp = _to(device, q, kp, vp)
    table = table.to(device=device, dtype=torch.int32)
    strided_table = table.t().contiguous().t()
    assert strided_table.stride(1) != 1 and torch.equal(strided_table, table)
    ends = torch.tensor([64, 99, 30, 99], dtype=torch.int32, device=device)[::2]
    got = sa.decode_attention(q, kp, vp, ends, block_table=strided_table, mapping="sparsemax", num_splits=2)
    want = sa.decode_attention(q, kp, vp, ends.contiguous(), block_table=table, mapping="sparsemax", num_splits=2)
    assert len(spy) == 2
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_learned_alpha_keeps_its_gradient(device, spy):
    """α per head that requires a gradient: the call takes the differentiable path and α gets a gradient."""
    q, k, v = _to(device, *_data(1, 2, 1, 1, 40, 16, seed=19))
    alpha = torch.tensor([1.3, 1.6], device=device, requires_grad=True)
    out = sa.decode_attention(q, k, v, torch.tensor([40], device=device), mapping="entmax", alpha=alpha)
    out.sum().backward()
    assert not spy and alpha.grad is not None and torch.isfinite(alpha.grad).all()


@pytest.mark.parametrize("L,window", [(17, None), (40, None), (40, 24)])
def test_chunked_prefill_in_blocks(device, spy, monkeypatch, L, window):
    """L new queries over caches of different lengths (one left-padded, one whose first queries sit before its
    start), 4 query heads over 2, 16 queries per pass, split over the cache: float32 kernels against the float64
    brute force of the whole call."""
    B, H, S = 3, 4, 96
    q64, k64, v64 = _data(B, H, 2, L, S, 16, seed=30 + L)
    ends, starts = [96, L + 20, 70], [0, 0, 40]
    passes = _blocks(monkeypatch, 16, B, H, S)
    q, k, v = _to(device, q64, k64, v64)
    out = sa.decode_attention(q, k, v, *_lengths(device, ends, starts), window=window, num_splits=2)
    assert passes == [16] * (L // 16) + [L % 16] and len(spy) == len(passes)
    want = _brute_force(q64, k64, v64, ends, starts, 1.5, window=window)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_chunked_prefill_in_blocks_with_a_padding_mask(device, spy, monkeypatch):
    """A padding mask [B, 1, 1, S] (one query row, broadcast over the queries), 40 new queries in blocks of 16: every
    block keeps it; float32 kernels against the float64 brute force."""
    B, H, L, S = 2, 2, 40, 64
    q64, k64, v64 = _data(B, H, 1, L, S, 16, seed=35)
    pad = torch.ones(B, 1, 1, S, dtype=torch.bool)
    pad[1, ..., :30] = False
    passes = _blocks(monkeypatch, 16, B, H, S)
    q, k, v = _to(device, q64, k64, v64)
    out = sa.decode_attention(q, k, v, *_lengths(device, [64, 64], [0, 0]), attn_mask=pad.to(device), num_splits=2)
    assert passes == [16, 16, 8] and len(spy) == 3
    want = _brute_force(q64, k64, v64, [64, 64], [0, 0], 1.5, mask=pad.expand(B, 1, L, S))
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_chunked_prefill_over_pages(device, spy, monkeypatch):
    """40 new queries over shuffled pages of 16 positions (tiles of one page), blocks of 16: float32 kernels
    against the float64 brute force."""
    q64, k64, v64 = _data(2, 2, 1, 40, 96, 16, seed=31)
    gen = torch.Generator().manual_seed(5)
    kp, table = _paged(k64, 16, gen)
    vp = torch.empty_like(kp)
    vp[table.reshape(-1)] = v64.transpose(1, 2).reshape(-1, 16, 1, 16)
    q, kp, vp = _to(device, q64, kp, vp)
    passes = _blocks(monkeypatch, 16, 2, 2, 96)
    got = sa.decode_attention(q, kp, vp, *_lengths(device, [96, 75], [0, 9]), mapping="sparsemax", num_splits=2,
                              block_table=table.to(device=device, dtype=torch.int32))
    assert passes == [16, 16, 8] and len(spy) == 3
    want = _brute_force(q64, k64, v64, [96, 75], [0, 9], 2.0)
    torch.testing.assert_close(got.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_a_mask_with_bounding_ranges(device, spy):
    """A boolean mask with holes and a bidirectional block, ranges that only bound it (the ends past S): the
    kernels give attention with the mask (float64, the reference path)."""
    B, H, L, S = 2, 2, 6, 64
    q64, k64, v64 = _data(B, H, 1, L, S, 16, seed=32)
    gen = torch.Generator().manual_seed(6)
    mask = torch.rand(B, 1, L, S, generator=gen) < 0.5
    mask[..., :20] = False
    pos = torch.arange(S)
    first = torch.where(mask[:, 0], pos, S).amin((1, 2))
    bound = torch.where(mask[:, 0], pos + L - torch.arange(L).view(L, 1), 0).amax((1, 2))
    assert (bound > S).all() and (first >= 20).all()
    q, k, v = _to(device, q64, k64, v64)
    k[..., :20, :], v[..., :20, :] = float("nan"), float("nan")  # before the ranges: never read
    out = sa.decode_attention(q, k, v, bound.to(device), first.to(device), attn_mask=mask.to(device), num_splits=2)
    assert spy and torch.isfinite(out).all()
    want = sa.attention(q64, k64, v64, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


def test_compiled_calls_take_the_kernels_as_one_operator(device, spy):
    """Under torch.compile(fullgraph=True) the kernel path is the opaque softargmax::decode_attention operator (the
    lengths stay tensors: no graph break, no recompilation when they change): eager's outputs."""
    q, k, v = _to(device, *_data(2, 4, 2, 3, 64, 16, seed=33))

    def step(q, k, v, ends, starts, mask):
        return sa.decode_attention(q, k, v, ends, starts, attn_mask=mask, mapping="sparsemax", num_splits=2)

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    mask = torch.ones(1, 1, 3, 64, dtype=torch.bool, device=device)
    for ends, starts in (([64, 40], [0, 5]), ([50, 33], [2, 0])):
        args = (q, k, v, *_lengths(device, ends, starts), mask)
        torch.testing.assert_close(compiled(*args), step(*args), atol=0, rtol=0)
    assert len(spy) == 4 and counters["stats"]["unique_graphs"] == 1


def test_compiled_calls_carry_a_divergence_object(device, spy):
    """A built-in Divergence as the mapping under torch.compile(fullgraph=True) (α = 1.25, chi-square) crosses the
    operator by its name and parameter (the kernels run): eager's outputs, and the float64 brute force for α = 1.25."""
    q64, k64, v64 = _data(1, 2, 1, 2, 32, 16, seed=34)
    q, k, v = _to(device, q64, k64, v64)
    ends = torch.tensor([32], device=device)
    for div in (get_divergence("alpha", alpha=1.25), get_divergence("chi_square")):
        torch._dynamo.reset()
        spy.clear()
        eager = sa.decode_attention(q, k, v, ends, mapping=div)
        compiled = torch.compile(lambda q, k, v, e: sa.decode_attention(q, k, v, e, mapping=div), fullgraph=True,
                                 backend="aot_eager")
        torch.testing.assert_close(compiled(q, k, v, ends), eager, atol=1e-6, rtol=1e-6)
        assert len(spy) == 2
    want = _brute_force(q64, k64, v64, [32], [0], 1.25)
    alpha = get_divergence("alpha", alpha=1.25)
    out = torch.compile(lambda q, k, v, e: sa.decode_attention(q, k, v, e, mapping=alpha), fullgraph=True,
                        backend="aot_eager")(q, k, v, ends)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)


@needs_cuda
def test_gpu_step_without_synchronization_replays_in_a_cuda_graph():
    """A step of 3 new queries with a mask (bfloat16, 8 query heads over 2) reads nothing back to the host, and a
    CUDA graph captured once replays it for other lengths, starts and masks with eager's outputs."""
    gen = torch.Generator().manual_seed(40)
    B, H, Hkv, L, S, D = 2, 8, 2, 3, 512, 64
    q, k, v = (torch.randn(*shape, generator=gen).cuda().bfloat16()
               for shape in ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, D)))
    ends = torch.tensor([512, 300], dtype=torch.int32, device="cuda")
    starts = torch.tensor([0, 40], dtype=torch.int32, device="cuda")
    mask = torch.ones(B, 1, L, S, dtype=torch.bool, device="cuda")

    def step():
        return sa.decode_attention(q, k, v, ends, starts, attn_mask=mask)

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for new_ends, new_starts in (([400, 128], [0, 17]), ([512, 64], [100, 0])):
        ends.copy_(torch.tensor(new_ends))
        starts.copy_(torch.tensor(new_starts))
        mask.fill_(True)
        mask[..., new_starts[0] + 30] = False  # a hole
        graph.replay()
        torch.testing.assert_close(static_out, step(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("end,window", [(100, 40), (40, 30), (100, 2 ** 62)])
def test_a_window_wider_than_the_cache_binds_when_the_end_passes_it(device, spy, end, window):
    """Ends past the cache (ranges that bound a mask) with a window at least as wide as the cache: the window still
    cuts the keys before ``end - window`` (all of them at end 100, window 40; none with the widest window), as the
    float64 brute force says."""
    q64, k64, v64 = _data(1, 1, 1, 1, 32, 16, seed=15)
    q, k, v = _to(device, q64, k64, v64)
    out = sa.decode_attention(q, k, v, *_lengths(device, [end], [0]), window=window)
    assert spy
    want = _brute_force(q64, k64, v64, [end], [0], 1.5, window=window)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-5, rtol=1e-4)
