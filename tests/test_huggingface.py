"""Hugging Face Transformers integration, on tiny randomly initialized models built from configs (no downloads)."""

import pytest
import torch
from conftest import needs_cuda

transformers = pytest.importorskip("transformers")

import softargmax.integrations.huggingface as H  # noqa: E402  (registers sparsemax and entmax15)


def _tiny(attn="eager"):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def test_softmax_registration_equals_eager_attention():
    m = _tiny("eager")
    ids = torch.randint(0, 97, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).logits
        H.register("softargmax_softmax", mapping="softmax")
        m.set_attn_implementation("softargmax_softmax")
        out = m(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["entmax15", "sparsemax"])
def test_sparse_attention_from_config_runs_forward_and_backward(impl):
    m = _tiny(impl).train()
    assert m.config._attn_implementation == impl
    ids = torch.randint(0, 97, (2, 9))
    out = m(ids, labels=ids, output_attentions=True)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grad = m.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    w = out.attentions[0]
    assert (w == 0).any()  # sparse attention weights
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    # causal: no weight on future positions
    assert (w.triu(1) == 0).all()
    # and generation works
    gen = m.eval().generate(ids[:, :3], max_new_tokens=4, do_sample=False)
    assert gen.shape == (2, 7)


def test_custom_alpha_registration():
    """The registered name really computes 1.3-entmax: the first layer's weights equal
    ``entmax(scores, 1.3)``, with the scores recovered (up to a per-row constant, to which
    entmax is invariant) as the log of the eager model's softmax weights of that layer
    (same seed, so the same parameters and the same first-layer scores)."""
    import softargmax as sa

    H.register("entmax13", mapping="entmax", alpha=1.3)
    ids = torch.randint(0, 97, (1, 6))
    models = []
    for impl in ("entmax13", "eager"):
        m = _tiny(impl)
        with torch.no_grad():
            m.model.layers[0].self_attn.q_proj.weight.mul_(300)  # peaked scores, so that entmax is sparse
        models.append(m)
    with torch.no_grad():
        out, eager = (m(ids, output_attentions=True) for m in models)
    assert torch.isfinite(out.logits).all()
    w, w_soft = out.attentions[0], eager.attentions[0]
    scores = torch.log(w_soft.double())  # -inf where the causal mask is
    expected = sa.entmax(scores, 1.3)
    assert ((expected == 0) & (w_soft > 0)).any()  # zeros where softmax has none
    torch.testing.assert_close(w.double(), expected, atol=2e-5, rtol=1e-4)
    # and it is neither softmax nor 1.5-entmax
    assert (w.double() - w_soft.double()).abs().max() > 1e-2
    assert (w.double() - sa.entmax15(scores)).abs().max() > 1e-3


@pytest.mark.parametrize("impl", ["entmax15", "sparsemax"])
def test_generate_with_the_cache_takes_decode_attention_and_keeps_the_greedy_tokens(impl, monkeypatch):
    """A left-padded batch with grouped heads (4 over 2): every step after the prompt goes through
    softargmax.decode_attention (the mask read as each sequence's range), and the greedy tokens and the
    logits with the cache are those without it."""
    import softargmax.integrations.huggingface_attention as HA

    calls = []

    def spy(*args, **kwargs):
        calls.append(args[3].tolist())  # the sequences' ends in the cache
        return real(*args, **kwargs)

    real = HA.decode_attention
    monkeypatch.setattr(HA, "decode_attention", spy)
    m = _tiny(impl)
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = m.generate(ids, use_cache=True, **kw)
        steps = len(calls)
        plain = m.generate(ids, use_cache=False, **kw)
    assert steps == 4 * 2 and len(calls) == steps  # 4 steps after the prompt, 2 layers; none without the cache
    assert calls[0] == [8, 8] and calls[-1] == [11, 11]
    assert torch.equal(cached.sequences, plain.sequences)
    for a, b in zip(cached.logits, plain.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _sliding(attn="eager", window=3):
    """A tiny Qwen2 whose first layer has a sliding window and the second full attention (``layer_types``)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=64, use_sliding_window=True, sliding_window=window,
                      layer_types=["sliding_attention", "full_attention"])
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def _spy_windows(monkeypatch, name):
    """Records the ``window`` each call of ``softargmax.attention`` / ``decode_attention`` gets from the layers."""
    import softargmax.integrations.huggingface_attention as HA

    seen = []
    real = getattr(HA, name)

    def spy(*args, **kwargs):
        seen.append(kwargs.get("window"))
        return real(*args, **kwargs)

    monkeypatch.setattr(HA, name, spy)
    return seen


def test_sliding_layers_pass_their_window_and_equal_eager_softmax(monkeypatch):
    """Transformers passes ``sliding_window`` per layer (3 on the sliding layer, ``None`` on the full one); with
    softmax the registered function equals eager attention (whose mask holds the band) on a left-padded batch
    longer than the window, and sparsemax's weights are zero outside the band."""
    seen = _spy_windows(monkeypatch, "attention")
    m = _sliding()
    ids = torch.randint(0, 97, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).logits
        H.register("softargmax_softmax", mapping="softmax")
        m.set_attn_implementation("softargmax_softmax")
        out = m(ids, attention_mask=mask).logits
        assert seen == [None, None]  # with a mask (which holds the band) the mask alone says which keys count
        keep = mask.bool()
        torch.testing.assert_close(out[keep], ref[keep], atol=1e-5, rtol=1e-5)
        m.set_attn_implementation("sparsemax")
        w = m(ids, output_attentions=True).attentions
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    band = causal.triu(-2)  # i - 3 < j <= i
    assert (w[0][..., ~band] == 0).all() and (w[1][..., ~causal] == 0).all()
    assert (w[1][..., ~band] > 0).any()  # the full layer sees past the window


def test_a_bidirectional_sliding_layer_keeps_its_mask_and_is_refused_without_one():
    """A non-causal sliding layer (ModernBERT's local layers: a symmetric band) with its mask equals SDPA with
    that mask, the window not applied as a causal band; without a mask such a call is refused."""
    q, k, v = (torch.randn(1, 2, 9, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    pos = torch.arange(9)
    band = ((pos.view(-1, 1) - pos).abs() < 3).view(1, 1, 9, 9)  # |i - j| < 3
    layer = torch.nn.Module()
    layer.is_causal = False
    forward = H.attention_function("softmax")
    out, _ = forward(layer, q, k, v, band, scaling=0.5, sliding_window=3, output_attentions=False)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band, scale=0.5)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="sliding_window=3 on a non-causal attention call without a mask"):
        forward(layer, q, k, v, None, scaling=0.5, sliding_window=3, output_attentions=False)


def test_sliding_layers_in_a_packed_batch_equal_each_sequence(monkeypatch):
    """A packed batch (flash-attention keywords, no mask: the band comes from ``sliding_window`` alone) equals each
    sequence run on its own through eager softmax attention; without the window the sliding layer would see
    the whole sequence."""
    import softargmax.integrations.huggingface_attention as HA

    seen = _spy_windows(monkeypatch, "attention")
    m = _sliding()
    lengths = [6, 9]
    ids = torch.randint(0, 97, (1, sum(lengths)))
    cu = torch.tensor([0, 6, 15], dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    H.register("softargmax_softmax", mapping="softmax")
    with torch.no_grad():
        each = [m(ids[:, a:b]).logits[0] for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
        m.set_attn_implementation("softargmax_softmax")
        out = m(ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9).logits[0]
        assert seen == [3, None]
        torch.testing.assert_close(out, torch.cat(each), atol=1e-5, rtol=1e-5)
        monkeypatch.setattr(HA, "check_window", lambda *a: None)  # the window ignored: the sliding layer differs
        wrong = m(ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9).logits[0]
    assert (wrong - out).abs().max() > 1e-3


@pytest.mark.parametrize("queries", [1, 3, 20])
def test_a_step_with_a_sliding_window_takes_decode_attention_with_its_mask(queries, monkeypatch):
    """A step of a sliding layer over the cache (1, 3 or 20 new queries, left padding): the function sends it to
    decode_attention with the mask, the ranges starting at the first query's window; it equals attention with
    the mask."""
    import softargmax as sa
    import softargmax.integrations.huggingface_attention as HA

    seen = []
    real = HA.decode_attention
    monkeypatch.setattr(HA, "decode_attention", lambda *a, **k: seen.append((a[3].tolist(), a[4].tolist())) or
                        real(*a, **k))
    L, S, w = queries, 30, 4
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(2, 4, L, 8, generator=gen), torch.randn(2, 2, S, 8, generator=gen), torch.randn(2, 2, S, 8, generator=gen)
    pos = torch.arange(S)
    last = S - L + torch.arange(L).view(L, 1)  # each query's position
    mask = (pos <= last) & (pos > last - w) & (pos >= torch.tensor([0, 27]).view(2, 1, 1, 1))  # [2, 1, L, S]
    layer = torch.nn.Module()
    layer.num_key_value_groups = 2
    out, _ = H.attention_function("entmax15")(layer.eval(), q, k, v, mask, scaling=0.4, sliding_window=w,
                                              output_attentions=False)
    first = S - L + 1 - w
    assert seen == [([S, S], [first, max(first, 27)])]
    want = sa.attention(q, k, v, attn_mask=mask, scale=0.4, enable_gqa=True)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-6, rtol=1e-5)


def test_generate_with_sliding_layers_keeps_the_greedy_tokens(monkeypatch):
    """Greedy generation over the cache with a sliding layer: every step after the prompt takes decode_attention
    with the layer's mask (which holds the band): the sliding layer over the 3 keys its cache keeps, the full
    layer over the whole cache from the padding on, with the tokens and logits of generation without the cache."""
    import softargmax.integrations.huggingface_attention as HA

    seen = []
    real = HA.decode_attention
    monkeypatch.setattr(HA, "decode_attention", lambda *a, **k: seen.append((a[3].tolist(), a[4].tolist(),
                                                                              k["window"])) or real(*a, **k))
    m = _sliding("entmax15")
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = m.generate(ids, use_cache=True, **kw)
        plain = m.generate(ids, use_cache=False, **kw)
    assert len(seen) == 2 * 4
    for step, n in enumerate(range(8, 12)):  # the sequences' ends in the cache
        assert seen[2 * step] == ([3, 3], [0, 0], None)  # the sliding layer: its cache holds its window
        assert seen[2 * step + 1] == ([n, n], [0, 3], None)  # the full layer: the padding
    assert torch.equal(cached.sequences, plain.sequences)
    for a, b in zip(cached.logits, plain.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_decode_ranges_bound_any_boolean_mask():
    """The ranges read off a boolean mask: exact for a causal one (left padding, a sliding window: its first
    query's window), bounding for holes and bidirectional blocks (the end past S); additive masks, masks of another
    batch or per head, several queries without a mask, and as many queries as keys: no decode ranges."""
    from softargmax.integrations.huggingface_attention import _decode_ranges

    q, k = torch.zeros(2, 4, 2, 8), torch.zeros(2, 2, 10, 8)
    pos = torch.arange(10)
    causal = pos <= 8 + torch.arange(2).view(2, 1)  # [2, 10]: bottom-right causal over the whole cache

    def ranges(mask):
        ends, starts, got, window = _decode_ranges(q, k, mask)
        assert got is mask and window is None
        return ends.tolist(), starts.tolist()

    assert ranges(causal.expand(2, 1, 2, 10)) == ([10, 10], [0, 0])
    assert ranges(causal.expand(1, 1, 2, 10)) == ([10, 10], [0, 0])  # one mask for the batch
    assert ranges(causal & (pos >= torch.tensor([0, 3]).view(2, 1, 1, 1))) == ([10, 10], [0, 3])
    assert ranges((causal & (pos > 8 + torch.arange(2).view(2, 1) - 4)).expand(2, 1, 2, 10)) == ([10, 10], [5, 5])
    holed = causal.clone()
    holed[:, 5] = False
    assert ranges(holed.expand(2, 1, 2, 10)) == ([10, 10], [0, 0])
    block = causal.clone()
    block[0, 9] = True  # the first query also sees the second one's key (a bidirectional block)
    assert ranges(block.expand(2, 1, 2, 10)) == ([11, 11], [0, 0])
    nothing = causal.expand(2, 1, 2, 10).clone()
    nothing[1] = False
    assert ranges(nothing) == ([10, 0], [0, 0])
    assert _decode_ranges(q, k, torch.zeros(2, 1, 2, 10)) is None  # additive
    assert _decode_ranges(q, k, causal.expand(3, 1, 2, 10)) is None  # another batch size: not this call's mask
    assert _decode_ranges(q, k, causal.expand(2, 4, 2, 10)) is None  # one mask per head
    assert _decode_ranges(q, k, None) is None  # several queries without a mask: Transformers' causal call
    assert _decode_ranges(q, torch.zeros(2, 2, 2, 8), causal[:, :2].expand(2, 1, 2, 2)) is None  # no cache before


def test_step_ranges_are_read_once_per_mask_until_it_changes(monkeypatch):
    """Every layer of a step passes the same mask (sliced to the keys): in eager calls its ranges are read once; a
    mask changed in place, or another mask, is read again; two masks that alternate (sliding and full layers) are
    each read once."""
    from softargmax.integrations import huggingface_attention as hfa

    reads = []
    real = hfa._bounding_ranges
    monkeypatch.setattr(hfa, "_bounding_ranges", lambda *a: reads.append(1) or real(*a))
    q, k = torch.zeros(2, 4, 1, 8), torch.zeros(2, 2, 10, 8)
    mask = (torch.arange(12) >= torch.tensor([0, 3]).view(2, 1, 1, 1)) & (torch.arange(12) < 10)  # [2, 1, 1, 12]
    for _ in range(3):  # three layers
        ends, starts, _, _ = hfa._decode_ranges(q, k, mask[..., :10])
    assert len(reads) == 1 and ends.tolist() == [10, 10] and starts.tolist() == [0, 3]
    mask[1, ..., 3] = False  # the next step's padding, written into the same tensor
    ends, starts, _, _ = hfa._decode_ranges(q, k, mask[..., :10])
    assert len(reads) == 2 and starts.tolist() == [0, 4]
    other = mask.clone()
    hfa._decode_ranges(q, k, other[..., :10])
    assert len(reads) == 3
    for _ in range(3):  # a sliding and a full layer in turn: two masks a step, each read once
        hfa._decode_ranges(q, k, mask[..., :10])
        hfa._decode_ranges(q, k, other[..., :10])
    assert len(reads) == 3
    third = mask.clone()
    hfa._decode_ranges(q, k, third[..., :10])
    hfa._decode_ranges(q, k, mask[..., :10])  # the oldest of two kept masks made room for the third
    assert len(reads) == 5


def test_a_step_compiles_whole_and_equals_attention_with_its_mask():
    """The function on a step over the cache under torch.compile(fullgraph=True) (no host synchronization, no
    data-dependent Python: a static cache's step compiles whole), with masks of different paddings, holes and a
    bidirectional block, 3 new queries: one graph, and attention with each mask."""
    from torch._dynamo.utils import counters

    import softargmax as sa

    gen = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 4, 3, 8, generator=gen), torch.randn(2, 2, 16, 8, generator=gen), torch.randn(2, 2, 16, 8, generator=gen)
    layer = torch.nn.Module().eval()
    layer.num_key_value_groups = 2
    forward = H.attention_function("sparsemax")
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda q, k, v, m: forward(layer, q, k, v, m, scaling=0.5, output_attentions=False)[0],
                             fullgraph=True, backend="aot_eager")
    pos = torch.arange(16)
    for pad, end in (([0, 4], 13), ([2, 0], 16)):
        mask = (pos >= torch.tensor(pad).view(2, 1, 1, 1)) & (pos <= end - 3 + torch.arange(3).view(3, 1))
        mask[0, 0, :, 7] = False  # a hole
        mask[1, 0, 0, end - 2] = True  # the first query sees the second's key
        want = sa.attention(q, k, v, attn_mask=mask, scale=0.5, mapping="sparsemax", enable_gqa=True)
        torch.testing.assert_close(compiled(q, k, v, mask), want.transpose(1, 2), atol=1e-6, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def _spy_decode(monkeypatch):
    """Records ``(new queries, keys)`` of every call of decode_attention from the layers."""
    import softargmax.integrations.huggingface_attention as HA

    seen = []
    real = HA.decode_attention

    def spy(*args, **kwargs):
        seen.append((args[0].shape[2], args[1].shape[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(HA, "decode_attention", spy)
    return seen


@pytest.mark.parametrize("family", ["llama", "qwen2-sliding"])
def test_chunked_prefill_keeps_the_greedy_tokens(family, monkeypatch):
    """generate(prefill_chunk_size=20) on a left-padded 50-token prompt: the chunks after the first (20 and 10 new
    queries over 40 and 50 keys) take decode_attention, in blocks of 16 queries (the scores budget made small),
    with the tokens and logits of generation without the cache."""
    from softargmax.operators import decoding as D

    seen = _spy_decode(monkeypatch)
    monkeypatch.setattr(D, "SCORES_BUDGET", 16 * 2 * 4 * 60)  # 16 queries of a pass for up to 60 keys
    m = _tiny("entmax15") if family == "llama" else _sliding("entmax15", window=6)
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 97, (2, 50), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 50, dtype=torch.long)
    mask[1, :7] = 0
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        chunked = m.generate(ids, prefill_chunk_size=20, **kw)
        prefill = [s for s in seen if s[0] > 1]
        plain = m.generate(ids, use_cache=False, **kw)
    # (new queries, keys) of the layers: a sliding layer's cache keeps its window (5 keys) and the new ones
    assert prefill == ([(20, 40), (20, 40), (10, 50), (10, 50)] if family == "llama" else
                       [(20, 25), (20, 40), (10, 15), (10, 50)])
    assert torch.equal(chunked.sequences, plain.sequences)
    for a, b in zip(chunked.logits, plain.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _compile_config(fullgraph=True):
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=fullgraph, mode="default")
    config._compile_all_devices = True  # generate compiles the decoding steps on the CPU too
    return config


@pytest.mark.parametrize("family", ["llama", "qwen2-sliding"])
def test_static_cache_eager_and_compiled_keep_the_greedy_tokens(family, monkeypatch):
    """generate(cache_implementation="static") on a left-padded batch: the prompt (7 queries over the static
    cache's 11 positions) and every step take decode_attention (eager: recorded; compiled: softargmax.attention
    fails on a step); eager, and with the steps under torch.compile(fullgraph=True) (Transformers' automatic
    compilation, on the CPU), give the tokens of generation without the cache, the compiled logits eager's, in
    one graph for all the steps."""
    from torch._dynamo.utils import counters

    import softargmax.integrations.huggingface_attention as HA

    seen = _spy_decode(monkeypatch)
    real = HA.attention

    def no_step(query, *args, **kwargs):
        assert query.shape[2] > 1, "a decoding step took softargmax.attention"
        return real(query, *args, **kwargs)

    m = _tiny("entmax15") if family == "llama" else _sliding("entmax15", window=3)
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        plain = m.generate(ids, use_cache=False, **kw)
        eager = m.generate(ids, cache_implementation="static", disable_compile=True, **kw)
        # the prompt and 4 steps; a sliding layer's static cache holds its window (3 keys), the prompt not
        assert seen == ([(7, 11)] * 2 + [(1, 11)] * 8 if family == "llama" else [(7, 11)] + [(1, 3), (1, 11)] * 4)
        monkeypatch.undo()  # (a spy that records each call would be a side effect of the traced step)
        monkeypatch.setattr(HA, "attention", no_step)
        compiled = m.generate(ids, cache_implementation="static", compile_config=_compile_config(), **kw)
    assert torch.equal(eager.sequences, plain.sequences) and torch.equal(compiled.sequences, plain.sequences)
    for a, b, c in zip(eager.logits, compiled.logits, plain.logits):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    # one graph for every step; Transformers' sliding static layer compiles a second one when it fills (a guard on
    # its Python length, the same with its own eager attention)
    assert counters["stats"]["unique_graphs"] == (1 if family == "llama" else 2) and not counters["graph_break"]


@needs_cuda
def test_gpu_static_cache_under_cuda_graphs_keeps_the_greedy_tokens():
    """On a GPU, generate with a static cache and Transformers' default compilation of the steps
    (mode="reduce-overhead": CUDA graphs) with fullgraph=True: the tokens of the eager static-cache run."""
    from transformers import CompileConfig

    m = _tiny("entmax15").cuda()
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(3)).cuda()
    mask = torch.ones(2, 7, dtype=torch.long, device="cuda")
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, cache_implementation="static")
    torch._dynamo.reset()
    with torch.no_grad():
        eager = m.generate(ids, disable_compile=True, **kw)
        graphs = m.generate(ids, compile_config=CompileConfig(fullgraph=True), **kw)
    assert torch.equal(graphs, eager)


def test_generate_under_inference_mode_keeps_the_greedy_tokens():
    """Under torch.inference_mode the masks are inference tensors (no version counter): their ranges are read
    uncached, and the greedy tokens are those under no_grad."""
    m = _tiny("entmax15")
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    kw = dict(attention_mask=mask, max_new_tokens=3, do_sample=False)
    with torch.no_grad():
        want = m.generate(ids, **kw)
    with torch.inference_mode():
        got = m.generate(ids, **kw)
    assert torch.equal(got, want)


def test_the_range_cache_does_not_keep_a_large_mask_of_several_queries():
    """A static cache's prompt mask (several query rows, over 1 MiB) is not held by the range cache after the call
    (computed uncached, the right ranges); a decoding step's mask of one query row is kept."""
    import gc
    import weakref

    from softargmax.integrations import huggingface_attention as hfa

    B, L, S = 1, 600, 2048  # 1.2 MB of booleans
    q, k = torch.zeros(B, 2, L, 8), torch.zeros(B, 2, S, 8)
    mask = torch.ones(B, 1, L, S, dtype=torch.bool).tril(S - L)
    ends, starts, _, _ = hfa._decode_ranges(q, k, mask)
    assert ends.tolist() == [S] and starts.tolist() == [0]
    gone = weakref.ref(mask)
    del mask
    gc.collect()
    assert gone() is None
    step = torch.ones(B, 1, 1, S, dtype=torch.bool)
    hfa._decode_ranges(q[:, :, :1], k, step)
    kept = weakref.ref(step)
    del step
    gc.collect()
    assert kept() is not None
