"""Hugging Face Transformers integration, on tiny randomly initialized models built from configs (no downloads)."""

import pytest
import torch

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


@pytest.mark.parametrize("queries", [1, 3])
def test_decode_ranges_with_a_sliding_window(queries):
    """A decoding step of a sliding layer (1 or 3 new queries, left padding): its mask is read as each sequence's
    range with the window, and decode_attention with those ranges and the window equals attention with the mask;
    without the window the mask of several queries is refused."""
    import softargmax as sa
    from softargmax.integrations.huggingface_attention import _decode_ranges

    L, S, w = queries, 12, 4
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(2, 4, L, 8, generator=gen), torch.randn(2, 2, S, 8, generator=gen), torch.randn(2, 2, S, 8, generator=gen)
    pos = torch.arange(S)
    last = S - L + torch.arange(L).view(L, 1)  # each query's position
    mask = (pos <= last) & (pos > last - w) & (pos >= torch.tensor([0, 9]).view(2, 1, 1, 1))  # [2, 1, L, S]
    ends, starts = _decode_ranges(q, k, mask, w)
    assert ends.tolist() == [S, S]
    out = sa.decode_attention(q, k, v, ends, starts, window=w)
    want = sa.attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    if queries > 1:
        assert _decode_ranges(q, k, mask) is None


def test_generate_with_sliding_layers_keeps_the_greedy_tokens(monkeypatch):
    """Greedy generation over the cache with a sliding layer: every step after the prompt takes decode_attention
    with the layer's window (3, then ``None`` for the full layer), with the tokens and logits of generation
    without the cache."""
    seen = _spy_windows(monkeypatch, "decode_attention")
    m = _sliding("entmax15")
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = m.generate(ids, use_cache=True, **kw)
        plain = m.generate(ids, use_cache=False, **kw)
    assert seen == [3, None] * 4
    assert torch.equal(cached.sequences, plain.sequences)
    for a, b in zip(cached.logits, plain.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_decode_ranges_refuse_other_masks():
    """A sliding window, a hole in the keys or an additive mask: no decode ranges (the call keeps attention)."""
    from softargmax.integrations.huggingface_attention import _decode_ranges

    q, k = torch.zeros(2, 4, 2, 8), torch.zeros(2, 2, 10, 8)
    pos = torch.arange(10)
    causal = pos <= 8 + torch.arange(2).view(2, 1)  # [2, 10]: bottom-right causal over the whole cache
    ends, starts = _decode_ranges(q, k, causal.expand(2, 1, 2, 10))
    assert ends.tolist() == [10, 10] and starts.tolist() == [0, 0]
    padded = causal & (pos >= torch.tensor([0, 3]).view(2, 1, 1, 1))
    ends, starts = _decode_ranges(q, k, padded)
    assert ends.tolist() == [10, 10] and starts.tolist() == [0, 3]
    window = causal & (pos > 8 + torch.arange(2).view(2, 1) - 4)
    assert _decode_ranges(q, k, window.expand(2, 1, 2, 10)) is None  # each query's window starts elsewhere
    holed = causal.clone()
    holed[:, 5] = False
    assert _decode_ranges(q, k, holed.expand(2, 1, 2, 10)) is None
    assert _decode_ranges(q, k, torch.zeros(2, 1, 2, 10)) is None  # additive
    assert _decode_ranges(q, k, causal.expand(3, 1, 2, 10)) is None  # another batch size: not this call's mask


def test_decode_ranges_are_read_once_per_mask_until_it_changes(monkeypatch):
    """Every layer of a step passes the same mask (sliced to the keys): its ranges are read once (one host
    synchronization per step, not per layer); a mask changed in place, or another mask, is read again."""
    from softargmax.integrations import huggingface_attention as hfa

    reads = []
    real = hfa._ranges_of_mask
    monkeypatch.setattr(hfa, "_ranges_of_mask", lambda *a: reads.append(1) or real(*a))
    q, k = torch.zeros(2, 4, 1, 8), torch.zeros(2, 2, 10, 8)
    mask = (torch.arange(12) >= torch.tensor([0, 3]).view(2, 1, 1, 1)) & (torch.arange(12) < 10)  # [2, 1, 1, 12]
    for _ in range(3):  # three layers
        ends, starts = hfa._decode_ranges(q, k, mask[..., :10])
    assert len(reads) == 1 and ends.tolist() == [10, 10] and starts.tolist() == [0, 3]
    mask[1, ..., 3] = False  # the next step's padding, written into the same tensor
    ends, starts = hfa._decode_ranges(q, k, mask[..., :10])
    assert len(reads) == 2 and starts.tolist() == [0, 4]
    other = mask.clone()
    hfa._decode_ranges(q, k, other[..., :10])
    assert len(reads) == 3
