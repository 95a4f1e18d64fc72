"""A batch whose every target is ignored: the loss's value is what ``F.cross_entropy`` gives (NaN for
``"mean"``, 0 for ``"sum"``, zeros for ``"none"``) and its gradient is zero, as ``F.cross_entropy``'s, for
every loss, reduction, dtype and path (eager, the ``torch.library`` operator, the fused output layer,
the vocabulary-parallel loss, the Hugging Face patch).  Such batches are ordinary: a micro-batch of
padding under gradient accumulation, an SFT batch whose labels are all prompt tokens.  One optimizer
step on a NaN gradient turns every parameter into NaN."""

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import softargmax as sa
from softargmax.losses import distributed as sad

IGNORE = -100
REDUCTIONS = ("mean", "sum", "none")

#: every loss that takes class indices, called as ``loss(x, target, **options)``
LOSSES = {
    "entmax15": sa.entmax15_loss,
    "sparsemax": sa.sparsemax_loss,
    "entmax(1.3)": lambda x, t, **kw: sa.entmax_loss(x, t, alpha=1.3, **kw),
    "softmax": lambda x, t, **kw: sa.fenchel_young_loss(x, t, "softmax", **kw),
    "kl": lambda x, t, **kw: sa.f_divergence_loss(x, t, "kl", **kw),
    "jensen_shannon": lambda x, t, **kw: sa.f_divergence_loss(x, t, "jensen_shannon", **kw),
    "alpha_relu": lambda x, t, **kw: sa.alpha_relu_loss(x, t, alpha=1.5, tau=-0.5, **kw),
    "normmax": sa.normmax_loss,
    "budget_sparsemax": lambda x, t, **kw: sa.budget_sparsemax_loss(x, t, budget=0.5, **kw),
}


def reference(x: torch.Tensor, target: torch.Tensor, reduction: str, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """``F.cross_entropy``'s value and gradient on the same batch: the behaviour to match."""
    x = x.detach().clone().requires_grad_(True)
    value = F.cross_entropy(x.movedim(-1, 1) if x.dim() > 2 else x, target, reduction=reduction, ignore_index=IGNORE,
                            **options)
    (grad,) = torch.autograd.grad(value.sum(), x)
    return value.detach(), grad


def check(value: torch.Tensor, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, reduction: str,
          **options) -> None:
    ref_value, ref_grad = reference(x, target, reduction, **options)
    assert value.shape == ref_value.shape
    torch.testing.assert_close(value.detach().float(), ref_value.float(), equal_nan=True, rtol=0, atol=0)
    assert grad.shape == x.shape and grad.dtype == x.dtype
    assert not grad.isnan().any(), "NaN gradient"
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=0, atol=0)  # zero, as F.cross_entropy's


def all_ignored(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 2).to(dtype).requires_grad_(True)
    return x, torch.full(shape[:-1], IGNORE)


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_loss_reduction_and_dtype(name, dtype):
    loss = LOSSES[name]
    x, t = all_ignored((5, 7), dtype)
    for reduction in REDUCTIONS:
        value = loss(x, t, reduction=reduction)
        (grad,) = torch.autograd.grad(value.sum(), x)
        check(value, grad, x, t, reduction)
        if reduction == "sum":
            assert float(value.detach()) == 0.0


@pytest.mark.parametrize("name", ["entmax15", "softmax", "alpha_relu"])
def test_label_smoothing_class_weights_and_batch_shapes(name):
    loss = LOSSES[name]
    x, t = all_ignored((2, 3, 6))
    w = torch.rand(6, generator=torch.Generator().manual_seed(1)) + 0.5
    for options in ({"label_smoothing": 0.1}, {"weight": w}, {"weight": w, "label_smoothing": 0.2}):
        for reduction in REDUCTIONS:
            value = loss(x, t, reduction=reduction, **options)
            (grad,) = torch.autograd.grad(value.sum(), x)
            check(value, grad, x, t, reduction, **options)


def test_kept_items_of_weight_zero_give_a_zero_gradient():
    """Kept items whose class weights are all 0: the weighted mean is 0/0 = NaN and no item moves it, in the
    eager and the fused loss (``F.cross_entropy``'s own gradient is NaN there: zero is what a training step needs)."""
    x, _ = all_ignored((4, 5))
    t = torch.tensor([1, 1, IGNORE, 1])
    w = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
    value = sa.entmax15_loss(x, t, weight=w)
    (grad,) = torch.autograd.grad(value, x)
    assert value.isnan() and not grad.isnan().any() and not grad.any()
    hidden = torch.randn(4, 3, generator=torch.Generator().manual_seed(4), requires_grad=True)
    weight = torch.randn(5, 3, generator=torch.Generator().manual_seed(5), requires_grad=True)
    value = sa.linear_fenchel_young_loss(hidden, weight, t, class_weight=w)
    gh, gw = torch.autograd.grad(value, (hidden, weight))
    assert value.isnan() and not gh.isnan().any() and not gh.any() and not gw.isnan().any() and not gw.any()


def test_a_partly_ignored_batch_is_unchanged():
    """The mean over the kept items and its gradient, as ``F.cross_entropy`` forms them (the softmax loss is it)."""
    x, t = all_ignored((6, 5))
    t = t.clone()
    t[[1, 4]] = torch.tensor([2, 0])
    value = sa.fenchel_young_loss(x, t, "softmax")
    (grad,) = torch.autograd.grad(value, x)
    ref_value, ref_grad = reference(x, t, "mean")
    torch.testing.assert_close(value, ref_value)
    torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("mapping", ["entmax15", "softmax"])
def test_the_library_operator(mapping):
    """The opaque ``torch.library`` operator that ``torch.compile`` and export see: its own backward."""
    if not hasattr(torch.ops.softargmax, "fenchel_young_loss"):
        pytest.skip("no torch.library operators in this PyTorch")
    from softargmax.losses import _row_losses  # the operator names its loss by (mapping, parameter, tau)

    spec = _row_losses.resolve_loss(mapping, {}).operator_spec()
    assert spec is not None
    x, t = all_ignored((4, 6))
    for reduction in REDUCTIONS:
        value, _ = torch.ops.softargmax.fenchel_young_loss(x, t, None, None, *spec, 1.0, -1, False, IGNORE, reduction,
                                                           0.0)
        (grad,) = torch.autograd.grad(value.sum(), x)
        check(value, grad, x, t, reduction)


@pytest.mark.parametrize("mapping", ["entmax15", "softmax", "alpha_relu"])
def test_the_fused_output_layer(mapping):
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(5, 8, generator=g, requires_grad=True)
    weight = torch.randn(11, 8, generator=g, requires_grad=True)
    t = torch.full((5,), IGNORE)
    params = {"alpha": 1.5, "tau": -0.5} if mapping == "alpha_relu" else {}
    for reduction in REDUCTIONS:
        value = sa.linear_fenchel_young_loss(hidden, weight, t, mapping=mapping, reduction=reduction, **params)
        gh, gw = torch.autograd.grad(value.sum(), (hidden, weight))
        logits = (hidden @ weight.T).detach()
        ref_value, _ = reference(logits, t, reduction)
        torch.testing.assert_close(value.detach(), ref_value, equal_nan=True, rtol=0, atol=0)
        assert not gh.isnan().any() and not gh.any() and not gw.isnan().any() and not gw.any()


@pytest.fixture
def one_process_group():
    """A gloo group of one process: the vocabulary-parallel losses run their collectives on it."""
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_the_vocabulary_parallel_losses(one_process_group):
    x, t = all_ignored((4, 9))
    for mapping in ("entmax15", "softmax"):
        for reduction in REDUCTIONS:
            value = sad.fenchel_young_loss(x, t, mapping, process_group=one_process_group, reduction=reduction)
            (grad,) = torch.autograd.grad(value.sum(), x)
            check(value, grad, x, t, reduction)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 6, generator=g, requires_grad=True)
    weight = torch.randn(9, 6, generator=g, requires_grad=True)
    value = sad.linear_fenchel_young_loss(hidden, weight, t, mapping="entmax15", process_group=one_process_group)
    gh, gw = torch.autograd.grad(value, (hidden, weight))
    assert value.isnan() and not gh.isnan().any() and not gh.any() and not gw.isnan().any() and not gw.any()


def test_the_hugging_face_patch():
    """A causal LM patched with the entmax loss on a batch of labels that are all masked (an SFT batch of prompt
    tokens): the loss is NaN, as the model's own cross-entropy, and no parameter's gradient is NaN."""
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from softargmax.integrations import huggingface as H

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    model = H.apply(transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager"), "entmax15")
    ids = torch.randint(0, 64, (2, 8))
    labels = torch.full_like(ids, IGNORE)
    for extra in ({}, {"num_items_in_batch": torch.tensor(5)}):
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, **extra)
        out.loss.backward()
        assert out.loss.isnan() if not extra else float(out.loss.detach()) == 0.0
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(not g.isnan().any() for g in grads)
