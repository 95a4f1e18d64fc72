"""The fused output layer's backward products that skip the all-zero tiles of ``G``
(softargmax.backends.tile_flags, softargmax.backends.triton.tile_gemms), in Triton's interpreter on tiny
shapes: the loss kernels' marks against a brute-force reference, the products against float64 with the
unmarked tiles poisoned (a product that reads one fails), and the fused loss end to end."""

import pytest
import torch

import softargmax as sa
from softargmax.backends import tile_flags as TF
from softargmax.losses import _linear_chunks

F64 = torch.float64
TM, TN = TF.TILE_TOKENS, TF.TILE_CLASSES


def _brute_flags(G):
    n, V = G.shape
    out = torch.zeros(-(-n // TM), -(-V // TN), dtype=torch.uint8)
    for m in range(out.shape[0]):
        for k in range(out.shape[1]):
            tile = G[m * TM:(m + 1) * TM, k * TN:(k + 1) * TN]
            out[m, k] = int(bool(((tile != 0) | torch.isnan(tile)).any()))
    return out


def _sparse_G(n=70, V=208, seed=0, dtype=torch.float32):
    """``G`` ``[70, 208]`` (token tiles of 64 and 6, class tiles of 64, 64, 64 and 16) with the tiles
    (0, 0), (0, 2), (1, 1) and (1, 3) holding entries, the others exactly zero."""
    g = torch.Generator().manual_seed(seed)
    G = torch.zeros(n, V)
    for m, k in ((0, 0), (0, 2), (1, 1), (1, 3)):
        rows, cols = slice(m * TM, min(n, (m + 1) * TM)), slice(k * TN, min(V, (k + 1) * TN))
        block = torch.randn(G[rows, cols].shape, generator=g)
        block[torch.rand(block.shape, generator=g) < 0.7] = 0.0  # sparse inside the tile too
        block[0, 0] = 1.0
        G[rows, cols] = block
    return G.to(dtype)


@pytest.mark.parametrize("n,V", [(70, 200), (64, 128), (10, 30), (130, 257), (1, 1)])
def test_tile_flags_on_ragged_shapes_and_slices(n, V):
    """Full tiles, a short last token tile and class tile, a row-strided slice of a wider ``G``; NaN marks, -0.0 not."""
    g = torch.Generator().manual_seed(n * V)
    for trial in range(6):
        G = torch.randn(n, V, generator=g)
        G[torch.rand(n, V, generator=g) < 0.995] = 0.0
        G[int(torch.randint(0, n, (1,), generator=g)), int(torch.randint(0, V, (1,), generator=g))] = \
            float("nan") if trial % 2 else -0.0
        wide = torch.zeros(n, V + 16)
        wide[:, :V] = G
        assert torch.equal(TF.tile_flags(G), _brute_flags(G))
        assert torch.equal(TF.tile_flags(wide[:, :V]), _brute_flags(G))


def test_tile_flags_is_the_brute_force_marking():
    G = _sparse_G()
    G[3, 195] = float("nan")  # a NaN marks its tile, (0, 3)
    want = _brute_flags(G)
    assert want.tolist() == [[1, 0, 1, 1], [0, 1, 0, 1]]
    assert torch.equal(TF.tile_flags(G), want)
    assert TF.skipped_fraction(want) == 3 / 8
    with pytest.raises(ValueError, match="G must be"):
        TF.tile_flags(G[0])


@pytest.mark.parametrize("dense", [False, True])
def test_loss_kernel_marks_the_nonzero_tiles(triton_device, dense):
    """The loss kernel's marks equal the reference on its own ``G``: the support's tiles and the target's
    (class 150 of token 5: ``p`` is zero in that whole tile, ``G = -1`` there), none in an ignored row."""
    from softargmax.backends.triton import losses

    n, V = 70, 208
    p = _sparse_G().abs()
    p[:, 128:192] = 0.0  # tile (0, 2) zero in p ...
    index = torch.zeros(n, dtype=torch.long)
    index[5] = 150  # ... but the target of token 5 lies there
    index[64:] = 70  # tile (1, 1)
    keep = torch.ones(n, dtype=torch.bool)
    keep[6] = False
    p[6, 195] = 0.5  # an ignored row marks nothing: (0, 3) stays unmarked
    y = torch.nn.functional.one_hot(index, V).float() if dense else None
    dev = triton_device
    marks = TF.TileFlags(n, V, torch.device(dev))
    marks.flags.fill_(7)
    marks.reset(n)
    assert not marks.written and int(marks.flags.sum()) == 0
    G = losses.gradient(p.to(dev), None if dense else index.to(dev), None if y is None else y.to(dev),
                        keep.to(dev), torch.full((n,), 0.5, device=dev), tiles=marks)
    assert marks.written
    ref = 0.5 * (p - torch.nn.functional.one_hot(index, V).float())
    ref[6] = 0
    torch.testing.assert_close(G.cpu(), ref)
    assert torch.equal(marks.flags.cpu(), _brute_flags(ref))
    assert marks.flags.cpu().tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]
    with pytest.raises(ValueError, match="tiles: marks of shape"):
        losses.gradient(p.to(dev), index.to(dev), None, keep.to(dev), tiles=TF.TileFlags(n, V + 64, torch.device(dev)))


def test_alpha_relu_loss_kernel_marks_the_nonzero_tiles(triton_device):
    from softargmax.backends.triton import losses

    n, V = 70, 208
    z = torch.full((n, V), -1.0)
    z[:64, :20] = 3.0
    z[64:, 130:140] = 2.0
    index = torch.full((n,), 10, dtype=torch.long)
    index[64] = 199  # the target's tile (1, 3), where p is zero
    dev = triton_device
    marks = TF.TileFlags(n, V, torch.device(dev)).reset(n)
    G = losses.alpha_relu_gradient(z.to(dev), index.to(dev), None, torch.ones(n, dtype=torch.bool, device=dev),
                                   1.5, 0.0, tiles=marks)[0]
    assert marks.written and marks.flags.cpu().tolist() == [[1, 0, 0, 0], [1, 0, 1, 1]]
    assert torch.equal(marks.flags.cpu(), _brute_flags(G.cpu()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_products_skip_the_unmarked_tiles_and_equal_the_dense_ones(triton_device, dtype):
    """``G W`` and ``gw += Gᵀ h`` over the marked tiles equal the float64 products of the dense ``G``, with
    every unmarked tile of the ``G`` given to the kernels filled with 1e6 (a kernel that reads one is off
    by far more than rounding); a class tile with no mark leaves its rows of ``gw`` untouched, bit for bit."""
    from softargmax.backends.triton import tile_gemms

    n, V, d = 70, 208, 32
    g = torch.Generator().manual_seed(3)
    G = _sparse_G(dtype=dtype)
    flags = TF.tile_flags(G)
    assert flags.tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]
    W = torch.randn(V, d, generator=g).to(dtype)
    h = torch.randn(n, d, generator=g).to(dtype)
    gw0 = torch.randn(V, d, generator=g).to(dtype)
    poisoned = G.clone()
    for m in range(2):
        for k in range(4):
            if not flags[m, k]:
                poisoned[m * TM:(m + 1) * TM, k * TN:(k + 1) * TN] = 1e6
    dev = triton_device
    marks = TF.TileFlags(n, V, torch.device(dev)).reset(n)
    marks.flags.copy_(flags)
    gh = torch.empty(n, d, dtype=dtype, device=dev)
    gw = gw0.clone().to(dev)
    assert tile_gemms.backprop(poisoned.to(dev), W.to(dev), h.to(dev), gh, gw, marks)
    ref_h = G.to(F64) @ W.to(F64)
    ref_w = gw0.to(F64) + G.to(F64).T @ h.to(F64)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert float((gh.cpu().to(F64) - ref_h).abs().max()) <= tol * float(ref_h.abs().max())
    assert float((gw.cpu().to(F64) - ref_w).abs().max()) <= tol * float(ref_w.abs().max())
    # class tile 0 is marked in token tile 0 only, tile 1 in token tile 1 only: all four class tiles are
    # touched; unmark class tile 3 everywhere and its rows of gw stay as they were
    marks.flags[:, 3] = 0
    gw = gw0.clone().to(dev)
    assert tile_gemms.backprop(poisoned.to(dev), W.to(dev), h.to(dev), None, gw, marks)
    assert torch.equal(gw[192:].cpu(), gw0[192:])
    with pytest.raises(ValueError, match="tiles: marks of shape"):
        tile_gemms.backprop(G.to(dev), W.to(dev), h.to(dev), gh, None, TF.TileFlags(n + 64, V, torch.device(dev)))
    # a vocabulary or a width that is not a multiple of 16 (the kernels' compiled specialization): not taken
    assert not tile_gemms.backprop(G[:, :200].contiguous().to(dev), W[:200].to(dev), h.to(dev), gh, None, marks)
    assert not tile_gemms.backprop(G.to(dev), W[:, :24].contiguous().to(dev), h[:, :24].contiguous().to(dev),
                                   gh[:, :24].contiguous(), None, marks)


def test_tile_lists_are_the_marked_tiles_in_order():
    from softargmax.backends.triton import tile_gemms

    flags = torch.tensor([[0, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 1]], dtype=torch.uint8)
    row_list, row_count, col_list, col_count = tile_gemms.tile_lists(flags)
    assert row_count.tolist() == [3, 0, 2] and col_count.tolist() == [1, 1, 0, 1, 2]
    assert [row_list[m, :c].tolist() for m, c in enumerate(row_count.tolist())] == [[1, 3, 4], [], [0, 4]]
    assert [col_list[k, :c].tolist() for k, c in enumerate(col_count.tolist())] == [[2], [0], [], [0], [0, 2]]
    # the kernels read a list's entries as adjacent (argsort of the transposed marks keeps their strides)
    assert row_list.is_contiguous() and col_list.is_contiguous()


def test_products_sum_every_token_tile_of_a_class_tile(triton_device):
    """Every tile marked, three token tiles (130 tokens, the last ragged): each class tile's ``gw`` sums the
    products of all three token tiles (a kernel that walks its list with a wrong stride adds some twice
    and others not at all) and ``gh`` sums every class tile, against float64."""
    from softargmax.backends.triton import tile_gemms

    n, V, d = 130, 208, 16
    g = torch.Generator().manual_seed(5)
    G, W, h = torch.randn(n, V, generator=g), torch.randn(V, d, generator=g), torch.randn(n, d, generator=g)
    dev = triton_device
    marks = TF.TileFlags(n, V, torch.device(dev)).reset(n)
    marks.flags.fill_(1)
    gh = torch.empty(n, d, device=dev)
    gw = torch.zeros(V, d, device=dev)
    assert tile_gemms.backprop(G.to(dev), W.to(dev), h.to(dev), gh, gw, marks)
    torch.testing.assert_close(gh.cpu().to(F64), G.to(F64) @ W.to(F64), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(gw.cpu().to(F64), G.to(F64).T @ h.to(F64), rtol=1e-5, atol=1e-4)


def _spy_marks(monkeypatch) -> list:
    """Records ``(tiles.written, the marks)`` of every call of the tile products, which still run."""
    from softargmax.backends.triton import tile_gemms

    seen = []
    backprop = tile_gemms.backprop

    def spy(G, weight, h, gh, gw, tiles):
        seen.append((tiles.written, tiles.flags.cpu().clone()))
        return backprop(G, weight, h, gh, gw, tiles)

    monkeypatch.setattr(tile_gemms, "backprop", spy)
    return seen


def _topic_problem(dtype=torch.float32):
    """72 tokens (token tiles of 64 and 8), 208 classes: tokens 0-63 score classes 0-19 high (class tile
    0), tokens 64-71 classes 130-149 (class tile 2); token 5's target is class 100 (tile 1, outside its
    support).  The tiles (0, 0), (0, 1), (1, 2) hold entries of ``G``; the other five are all zero."""
    g = torch.Generator().manual_seed(0)
    N, d, V = 72, 16, 208
    W = torch.randn(V, d, generator=g) * 0.05
    W[:20, 0] += 4.0
    W[130:150, 1] += 4.0
    h = torch.randn(N, d, generator=g) * 0.1
    h[:64, 0] += 2.0
    h[64:, 1] += 2.0
    t = torch.randint(0, 20, (N,), generator=g)
    t[64:] = 140
    t[5] = 100
    t[7] = -100
    return h.to(dtype), W.to(dtype), t


@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("alpha_relu", {"tau": 1.0})])
def test_fused_loss_skips_zero_tiles_and_equals_the_unfused_loss(triton_device, monkeypatch, mapping, params):
    """The fused loss on the kernels' route skips five of the eight tiles of ``G`` (the loss kernel's
    marks, the target's tile included) and its gradients equal the float64 unfused loss's; the softmax
    loss (no zero in ``G``) keeps the dense products.  (Sparsemax's marks come from the same kernel as
    1.5-entmax's, ``gradient_rows``; α-ReLU's from its own.)"""
    seen = _spy_marks(monkeypatch)
    h, W, t = _topic_problem()
    dev = triton_device
    hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
    loss = sa.linear_fenchel_young_loss(hh, WW, t.to(dev), mapping=mapping, chunk_size=72, **params)
    gh, gw = torch.autograd.grad(loss * 1.5, (hh, WW))
    assert len(seen) == 1 and seen[0][0] is True
    assert seen[0][1].tolist() == [[1, 1, 0, 0], [0, 0, 1, 0]]
    hd, Wd = h.to(F64).requires_grad_(), W.to(F64).requires_grad_()
    ref = sa.fenchel_young_loss(hd @ Wd.T, t, mapping, **params)
    rh, rw = torch.autograd.grad(ref * 1.5, (hd, Wd))
    torch.testing.assert_close(float(loss.detach()), float(ref.detach()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gh.cpu().to(F64), rh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw.cpu().to(F64), rw, rtol=1e-4, atol=1e-6)
    seen.clear()
    sa.linear_fenchel_young_loss(hh, WW, t.to(dev), mapping="softmax", chunk_size=72).backward()
    assert seen == []


def test_fused_loss_in_bfloat16_skips_with_several_chunks(triton_device, monkeypatch):
    """bfloat16 on the kernels' route (mode ``"native"``), chunks of 40 tokens (the marks of a ragged last
    chunk), a soft-cap: the gradients are those of the same loss with the skipping turned off, to bfloat16
    rounding."""
    h, W, t = _topic_problem(torch.bfloat16)
    dev = triton_device
    import softargmax.losses.linear as linear

    out = {}
    for skip in (True, False):
        monkeypatch.setattr(linear, "skips_zero_tiles", lambda *args, s=skip: s)
        hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
        loss = sa.linear_fenchel_young_loss(hh, WW, t.to(dev), chunk_size=40, softcap=5.0)
        out[skip] = (loss, *torch.autograd.grad(loss, (hh, WW)))
    for a, b in zip(out[True], out[False]):
        assert float((a.float() - b.float()).abs().max()) <= 2 ** -7 * float(b.float().abs().max())


def _chooses(name, h, V=208, d=16, **target):
    """:func:`skips_zero_tiles` for the loss ``name``, hidden states ``h`` and a weight ``[V, d]``, with class
    indices (``target`` overrides the parsed target's fields)."""
    from softargmax.losses._row_losses import resolve_loss
    from softargmax.losses._targets import Target

    n = h.shape[0]
    tgt = Target(index=torch.zeros(n, dtype=torch.long, device=h.device), dense=None,
                 keep=torch.ones(n, dtype=torch.bool, device=h.device), item_weight=None)
    for key, value in target.items():
        setattr(tgt, key, value)
    return _linear_chunks.skips_zero_tiles(resolve_loss(name, {}), h, torch.zeros(V, d, device=h.device), tgt)


def test_skip_is_chosen_for_sparse_losses_where_the_kernels_run(triton_device):
    h = torch.zeros(4, 16, device=triton_device)
    assert _chooses("entmax15", h) and _chooses("alpha_relu", h)
    assert not _chooses("softmax", h)
    assert not _chooses("entmax15", h[:0])
    # every entry of a smoothed or dense target is non-zero: nothing to skip
    assert not _chooses("entmax15", h, smoothing=0.1)
    assert not _chooses("entmax15", h, index=None, dense=torch.full((4, 208), 1 / 208, device=triton_device))
    # the tile products' specialization: a vocabulary and a width that are multiples of 16
    assert not _chooses("entmax15", h, V=200) and not _chooses("entmax15", h, d=24)


def test_skip_is_not_chosen_on_the_cpu():
    assert not _chooses("entmax15", torch.zeros(4, 16))


def test_skip_is_turned_off_by_its_switch(triton_device):
    from softargmax.backends.triton import tile_gemms

    h = torch.zeros(4, 16, device=triton_device)
    old = tile_gemms.set_enabled(False)
    try:
        assert not tile_gemms.enabled() and not _chooses("entmax15", h)
    finally:
        tile_gemms.set_enabled(old)
    assert _chooses("entmax15", h)


def test_backprop_chunk_marks_the_tiles_itself_where_no_kernel_did(triton_device):
    """Marks left unwritten (a row loss that took the PyTorch path) are made from ``G`` (tile_flags): the
    products still skip, and equal the dense ones."""
    n, V, d = 70, 208, 32
    g = torch.Generator().manual_seed(4)
    G = _sparse_G()
    W, h = torch.randn(V, d, generator=g), torch.randn(n, d, generator=g)
    dev = triton_device
    marks = TF.TileFlags(n, V, torch.device(dev)).reset(n)
    gh, gw, gb = torch.empty(n, d, device=dev), torch.zeros(V, d, device=dev), torch.zeros(V, device=dev)
    _linear_chunks.backprop_chunk(G.to(dev), None, torch.float32, W.to(dev), h.to(dev), gh, gw, gb, marks)
    assert marks.written and marks.flags.cpu().tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]
    torch.testing.assert_close(gh.cpu(), G @ W, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw.cpu(), G.T @ h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb.cpu(), G.sum(0))


def test_skipping_reads_no_value_on_the_host(triton_device, monkeypatch):
    """The marks, their lists and the tile products stay on the device: the fused loss with the skipping,
    forward + backward in bfloat16 over two chunks, reads no value on the host beyond the target's
    validation (none with the checks off, as under CUDA-graph capture)."""
    from test_loss_fast_paths import SyncCount

    from softargmax.backends.triton import tile_gemms
    from softargmax.losses import _targets

    monkeypatch.setattr(_targets, "values_checkable", lambda t: False)
    calls = []
    backprop = tile_gemms.backprop
    monkeypatch.setattr(tile_gemms, "backprop", lambda *a: calls.append(1) or backprop(*a))
    dev = triton_device
    h, W, t = _topic_problem(torch.bfloat16)
    hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
    with SyncCount() as c:
        sa.linear_fenchel_young_loss(hh, WW, t.to(dev), chunk_size=40).backward()
    assert c.names == [] and len(calls) == 2


def test_per_token_loss_skips_zero_tiles(triton_device, monkeypatch):
    """``reduction="none"``: the backward's products skip the tiles marked from ``G`` (no kernel marks them
    there), and the gradients of a weighted sum of the per-token losses equal the float64 unfused ones
    (α-ReLU, whose prediction needs no solver: the interpreter's row solver costs seconds here)."""

    seen = _spy_marks(monkeypatch)
    h, W, t = _topic_problem()
    dev = triton_device
    hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
    losses = sa.linear_fenchel_young_loss(hh, WW, t.to(dev), mapping="alpha_relu", tau=1.0, reduction="none",
                                          chunk_size=72)
    g = torch.linspace(0.5, 1.5, 72)
    gh, gw = torch.autograd.grad((losses * g.to(dev)).sum(), (hh, WW))
    assert len(seen) == 1 and seen[0][1].tolist() == [[1, 1, 0, 0], [0, 0, 1, 0]]
    hd, Wd = h.to(F64).requires_grad_(), W.to(F64).requires_grad_()
    ref = sa.fenchel_young_loss(hd @ Wd.T, t, "alpha_relu", tau=1.0, reduction="none")
    rh, rw = torch.autograd.grad((ref * g.to(F64)).sum(), (hd, Wd))
    torch.testing.assert_close(losses.detach().cpu().to(F64), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gh.cpu().to(F64), rh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw.cpu().to(F64), rw, rtol=1e-4, atol=1e-6)


def test_vocab_parallel_loss_skips_zero_tiles(triton_device, monkeypatch):
    """The vocabulary-parallel fused loss (one process here) computes ``G`` with PyTorch: its tiles are
    marked from ``G`` and the products skip the others; the gradients equal the float64 unfused ones."""
    import torch.distributed as dist

    from softargmax.losses import distributed

    seen = _spy_marks(monkeypatch)
    h, W, t = _topic_problem()
    dev = triton_device
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        hh, WW = h.to(dev).requires_grad_(), W.to(dev).requires_grad_()
        loss = distributed.linear_fenchel_young_loss(hh, WW, t.to(dev), mapping="alpha_relu", tau=1.0, chunk_size=72)
        gh, gw = torch.autograd.grad(loss, (hh, WW))
    finally:
        dist.destroy_process_group()
    assert len(seen) == 1 and seen[0][1].tolist() == [[1, 1, 0, 0], [0, 0, 1, 0]]
    hd, Wd = h.to(F64).requires_grad_(), W.to(F64).requires_grad_()
    ref = sa.fenchel_young_loss(hd @ Wd.T, t, "alpha_relu", tau=1.0)
    rh, rw = torch.autograd.grad(ref, (hd, Wd))
    torch.testing.assert_close(float(loss.detach()), float(ref.detach()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gh.cpu().to(F64), rh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw.cpu().to(F64), rw, rtol=1e-4, atol=1e-6)
