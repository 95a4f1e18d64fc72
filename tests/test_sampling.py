"""Sparse sampling: softargmax.sample and the Transformers logits processor (support and frequencies)."""

import math

import pytest
import torch

import softargmax as sa

entmax_pkg = pytest.importorskip("entmax")


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probs (classes with p > 0); p-value from the
    regularized upper incomplete gamma function, the chi-square survival function."""
    keep = probs > 0
    n = counts.sum()
    expected = n * probs[keep].double()
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    if df == 0:  # one class: every draw is it (the support check covers the rest)
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def _reference(logits, mapping, alpha, temperature):
    """Independent probabilities: the entmax package (sparsemax, entmax_bisect) or torch.softmax, in float64."""
    x = logits.double() / temperature
    if mapping == "sparsemax":
        return entmax_pkg.sparsemax(x, dim=-1)
    if mapping == "softmax":
        return torch.softmax(x, -1)
    return entmax_pkg.entmax_bisect(x, alpha=alpha, dim=-1, n_iter=200)


@pytest.mark.parametrize("mapping,alpha,temperature", [("sparsemax", None, 1.0), ("entmax", 1.3, 0.7),
                                                       ("entmax", 1.5, 2.0), ("softmax", None, 1.5)])
def test_sample_draws_from_the_sparse_distribution(mapping, alpha, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 30, generator=g) * 2
    ref = _reference(logits, mapping, alpha, temperature)
    torch.testing.assert_close(sa.sampling.probabilities(logits, mapping, alpha=alpha, temperature=temperature).double(),
                               ref, atol=1e-5, rtol=1e-4)
    draws = sa.sample(logits, mapping, alpha=alpha, temperature=temperature, num_samples=20000,
                      generator=torch.Generator().manual_seed(1))
    assert draws.shape == (3, 20000) and draws.dtype == torch.long
    for row in range(3):
        counts = torch.bincount(draws[row], minlength=30)
        assert int(counts[ref[row] == 0].sum()) == 0  # never off the support
        if mapping != "softmax":
            assert bool((ref[row] == 0).any())  # (and there is something off the support)
        assert chi_square_p_value(counts, ref[row]) > 1e-4


def test_q_and_log_probabilities():
    """A reference measure q reaches the mapping (softmax with q: p ∝ q exp(z / T), closed form); log p is -inf
    exactly off the support."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 12, generator=g, dtype=torch.float64) * 3
    q = torch.rand(12, generator=g, dtype=torch.float64) + 0.1
    p = sa.sampling.probabilities(logits, "softmax", q=q, temperature=0.5)
    torch.testing.assert_close(p, torch.softmax(logits / 0.5 + q.log(), -1))
    p = sa.sampling.probabilities(logits, "sparsemax", q=q, temperature=0.5)
    lp = sa.sampling.log_probabilities(logits, "sparsemax", q=q, temperature=0.5)
    assert torch.equal(torch.isinf(lp), p == 0) and bool((p == 0).any())
    assert not torch.equal(p, sa.sampling.probabilities(logits, "sparsemax", temperature=0.5))


def test_sample_bad_input():
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="temperature"):
        sa.sample(x, temperature=0.0)
    with pytest.raises(ValueError, match="num_samples"):
        sa.sample(x, num_samples=0)
    with pytest.raises(ValueError, match="mapping"):
        sa.sample(x, "nope")
    with pytest.raises(ValueError, match="logits"):
        sa.sample(torch.full((1, 3), -math.inf))
    with pytest.raises(TypeError, match="generator"):
        sa.sample(x, generator=0)
    y = torch.tensor([[0.0, -math.inf, 1.0]])
    before = y.clone()
    assert int(sa.sample(y, "softmax", num_samples=50).eq(1).sum()) == 0  # -inf: never drawn, no NaN
    assert torch.equal(y, before)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # spread-out logits, so that 1.5-entmax is sparse
    return model


def test_generate_with_the_entmax_processor_draws_from_entmax():
    """One new token for 2000 copies of a prompt: never off the support of 1.5-entmax of the model's logits
    (computed independently with the entmax package), frequencies pass a chi-square test."""
    from softargmax.integrations.huggingface import SparseSamplingProcessor

    model = _tiny_llama()
    prompt = torch.tensor([[5, 17, 99, 3]])
    with torch.no_grad():
        p = entmax_pkg.entmax15(model(prompt).logits[0, -1].double(), dim=-1)
    assert 1 < int((p > 0).sum()) < 128
    torch.manual_seed(3)  # generate draws from the global generator
    out = model.generate(prompt.expand(2000, -1), do_sample=True, top_k=0, max_new_tokens=1, pad_token_id=0,
                         logits_processor=[SparseSamplingProcessor("entmax15")])
    tokens = out[:, -1]
    counts = torch.bincount(tokens, minlength=128)
    assert int(counts[p == 0].sum()) == 0
    assert chi_square_p_value(counts, p) > 1e-4


def test_generate_many_steps_stays_on_the_support():
    from softargmax.integrations.huggingface import SparseSamplingProcessor

    model = _tiny_llama()
    torch.manual_seed(4)
    prompt = torch.randint(0, 128, (8, 3))
    out = model.generate(prompt, do_sample=True, top_k=0, max_new_tokens=12, pad_token_id=0, output_logits=True,
                         return_dict_in_generate=True,
                         logits_processor=[SparseSamplingProcessor("entmax", alpha=1.3, temperature=0.8)])
    new = out.sequences[:, 3:]
    assert new.shape == (8, 12)
    sparse = 0
    for t, raw in enumerate(out.logits):  # the model's raw logits at each step
        p = entmax_pkg.entmax_bisect(raw.double() / 0.8, alpha=1.3, dim=-1, n_iter=200)
        assert bool((p.gather(1, new[:, t:t + 1]) > 0).all())
        sparse += int((p == 0).sum())
    assert sparse > 0
    with pytest.raises(ValueError, match="temperature"):
        SparseSamplingProcessor("entmax15", temperature=-1)
    with pytest.raises(ValueError, match="mapping"):
        SparseSamplingProcessor("nope")
