"""The fused Fenchel–Young training loss patched into Transformers causal LMs (tiny random configs, CPU, no downloads)."""

import inspect
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import softargmax as sa  # noqa: E402
from softargmax.integrations import huggingface as H  # noqa: E402

V = 128
#: Gemma 2 with a soft-cap small enough to change the loss of a tiny random model
SOFTCAP = 1.0


def tiny(family: str, seed: int = 0):
    """A tiny randomly initialized causal LM of ``family`` (hidden 32, 2 layers, vocabulary 128)."""
    c = transformers
    common = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64)
    if family == "llama":
        cfg = c.LlamaConfig(num_key_value_heads=2, **common)
    elif family == "qwen2":
        cfg = c.Qwen2Config(num_key_value_heads=2, **common)
    elif family == "mistral":
        cfg = c.MistralConfig(num_key_value_heads=2, **common)
    elif family == "gemma2":
        cfg = c.Gemma2Config(num_key_value_heads=2, head_dim=8, final_logit_softcapping=SOFTCAP, **common)
    elif family == "gpt2":
        # no dropout (GPT-2's default is 0.1): the patched and the reference model must see the same network
        cfg = c.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    elif family == "gpt_neox":
        cfg = c.GPTNeoXConfig(**common)
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = c.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").train()
    if family == "gemma2":  # logits of a few units, so that the soft-cap changes them
        with torch.no_grad():
            model.lm_head.weight.mul_(50)
    return model


def batch(seed: int = 1, b: int = 3, t: int = 10):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    labels[2, 4] = -100  # an ignored position inside a sequence
    return ids, mask, labels


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def run(model, ids, mask, labels, **kw):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels, **kw)
    out.loss.backward()
    return out, grads(model)


@pytest.mark.parametrize("family", H.TESTED_FAMILIES)
def test_softmax_loss_equals_transformers_cross_entropy(family):
    """mapping="softmax": the fused loss is Transformers' own (shifted labels, ignore_index, soft-cap), value
    and every parameter's gradient, with and without num_items_in_batch, and no logits in training."""
    ids, mask, labels = batch()
    ref_model, model = tiny(family), H.apply(tiny(family), "softmax")
    for kw in ({}, {"num_items_in_batch": torch.tensor(7)}):
        ref, g_ref = run(ref_model, ids, mask, labels, **kw)
        out, g = run(model, ids, mask, labels, **kw)
        torch.testing.assert_close(out.loss, ref.loss, rtol=2e-6, atol=2e-6)
        assert out.logits is None
        assert g.keys() == g_ref.keys() and len(g) > 4
        for name in g:
            torch.testing.assert_close(g[name], g_ref[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", H.TESTED_FAMILIES)
def test_entmax_loss_equals_the_unfused_loss_on_the_models_logits(family):
    """A sparse mapping: the patched loss equals fenchel_young_loss on the unpatched model's (soft-capped)
    logits of positions 0..T-2 against the labels of 1..T-1, in value and gradients."""
    ids, mask, labels = batch(seed=2)
    ref_model, model = tiny(family), H.apply(tiny(family), "entmax15")
    ref_model.zero_grad()
    logits = ref_model(input_ids=ids, attention_mask=mask).logits
    ref = sa.entmax15_loss(logits[:, :-1], labels[:, 1:])
    ref.backward()
    out, g = run(model, ids, mask, labels)
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    g_ref = grads(ref_model)
    for name in g:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_gemma2_softcap_is_applied():
    """The soft-cap matters in these tests: without it the loss would differ (so the tests above can fail)."""
    ids, mask, labels = batch()
    model = H.apply(tiny("gemma2"), "entmax15")
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        uncapped = sa.linear_fenchel_young_loss(hidden[:, :-1], model.lm_head.weight, labels[:, 1:])
    assert abs(float(out.loss) - float(uncapped)) > 0.2 * float(uncapped)


def test_gradient_accumulation_as_trainer_does_it():
    """Trainer's gradient accumulation: each micro-batch's loss is its sum over tokens divided by the number of
    counted tokens of the whole accumulated batch, so the accumulated gradient is that of the full batch's mean."""
    ids, mask, labels = batch(b=4)
    model = H.apply(tiny("llama"), "entmax15")
    assert any(p.kind == inspect.Parameter.VAR_KEYWORD for p in inspect.signature(model.forward).parameters.values())
    full, g_full = run(model, ids, mask, labels)
    n = int((labels[:, 1:] != -100).sum())
    model.zero_grad()
    total = 0.0
    for part in (slice(0, 1), slice(1, 4)):
        out = model(input_ids=ids[part], attention_mask=mask[part], labels=labels[part], num_items_in_batch=torch.tensor(n))
        out.loss.backward()
        total += float(out.loss.detach())
    assert total == pytest.approx(float(full.loss), rel=1e-5)
    for name, g in grads(model).items():
        torch.testing.assert_close(g, g_full[name], rtol=1e-4, atol=1e-6, msg=name)


def test_logits_rule_and_revert():
    ids, mask, labels = batch()
    ref_model, model = tiny("gemma2").eval(), H.apply(tiny("gemma2"), "entmax15").eval()
    with torch.no_grad():
        ref = ref_model(input_ids=ids, attention_mask=mask).logits
        out = model(input_ids=ids, attention_mask=mask, labels=labels)  # eval mode: logits returned
        torch.testing.assert_close(out.logits, ref)
        assert model(input_ids=ids, labels=labels, return_logits=False).logits is None
        assert model(input_ids=ids, labels=labels, return_dict=False)[0].dim() == 0
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, ref)  # no labels: the model's own
        model.train()
        assert model(input_ids=ids, labels=labels).logits is None
        assert model(input_ids=ids, labels=labels, return_logits=True).logits.shape == (3, 10, V)
        H.revert(model)
        assert "forward" not in vars(model)
        torch.testing.assert_close(model(input_ids=ids, labels=labels).loss, ref_model.train()(input_ids=ids, labels=labels).loss)


def test_training_with_the_entmax_loss_lowers_it_and_sets_sparse_attention():
    torch.manual_seed(0)
    model = H.apply(tiny("llama"), "entmax15", attention="entmax15")
    assert model.config._attn_implementation == "entmax15"
    ids = torch.randint(0, V, (4, 12))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0]


def test_options_are_checked_up_front():
    model = tiny("llama")
    with pytest.raises(ValueError, match="mapping"):
        H.apply(model, "entmax", alpha=1.3, foo=1)
    with pytest.raises(ValueError, match="reduction"):
        H.apply(model, "entmax15", reduction="sum")
    with pytest.raises(ValueError, match="return_stats"):
        H.apply(model, "entmax15", return_stats=True)
    with pytest.raises(ValueError, match="temperature"):
        H.apply(model, "entmax15", temperature=-1.0)
    with pytest.raises(TypeError, match="model"):
        H.apply(torch.nn.Linear(2, 2), "entmax15")
    with pytest.raises(ValueError, match="not patched"):
        H.revert(model)
    assert "forward" not in vars(model)
    H.apply(model, "entmax", alpha=1.3)
    H.apply(model, "sparsemax")  # applying again replaces the patch
    ids = torch.randint(0, V, (1, 6))
    logits = tiny("llama")(input_ids=ids).logits
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, sa.sparsemax_loss(logits[:, :-1], ids[:, 1:]))


# -- Transformers' Trainer ---------------------------------------------------------------------------------------

def _trainer(model, tmp_path, dataset, **args):
    pytest.importorskip("accelerate")  # Trainer needs it
    options = dict(output_dir=str(tmp_path), report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
                   logging_steps=1, seed=0, dataloader_num_workers=0)
    options.update(args)
    return transformers.Trainer(model=model, args=transformers.TrainingArguments(**options), train_dataset=dataset)


def _spy_on_the_loss(monkeypatch):
    """What the patched loss receives from each forward: ``(tokens counted in the micro-batch, num_items_in_batch)``."""
    from softargmax.integrations import huggingface_loss

    seen = []
    loss = huggingface_loss._Fused.loss

    def spy(self, hidden, shift_labels, ignore_index, num_items):
        seen.append((int((shift_labels != ignore_index).sum()), num_items))
        return loss(self, hidden, shift_labels, ignore_index, num_items)

    monkeypatch.setattr(huggingface_loss._Fused, "loss", spy)
    return seen


def test_trainer_gradient_accumulation_equals_the_full_batch(tmp_path, monkeypatch):
    """A real Trainer step with gradient_accumulation_steps=2 (two micro-batches of 2 sequences with 13 and 17
    counted tokens) gives the parameters of a step on the full batch of 4 without accumulation, within float32
    rounding: Trainer passes num_items_in_batch (30, the whole batch's count) to the patched loss, which
    divides each micro-batch's sum by it."""
    ids, _, _ = batch(seed=1, b=4)
    labels = ids.clone()
    labels[0, :6] = -100  # uneven counts per sequence: per-micro-batch means would weigh tokens differently
    labels[3, 2] = -100
    dataset = [{"input_ids": ids[i], "labels": labels[i], "attention_mask": torch.ones_like(ids[i])} for i in range(4)]
    counted = int((labels[:, 1:] != -100).sum())
    seen = _spy_on_the_loss(monkeypatch)
    start = {n: p.detach().clone() for n, p in tiny("llama").named_parameters()}
    steps = {}
    for per_device, accumulate in ((2, 2), (4, 1)):
        seen.clear()
        model = H.apply(tiny("llama"), "entmax15")
        # SGD, constant learning rate, no clipping: the step is -lr times the accumulated gradient
        _trainer(model, tmp_path, dataset, per_device_train_batch_size=per_device,
                 gradient_accumulation_steps=accumulate, max_steps=1, learning_rate=0.5, optim="sgd",
                 lr_scheduler_type="constant", max_grad_norm=0.0).train()
        assert len(seen) == accumulate and sum(n for n, _ in seen) == counted
        assert all(num_items is not None and int(num_items) == counted for _, num_items in seen)
        if accumulate == 2:  # the micro-batches count different numbers of tokens (so the test can fail)
            assert seen[0][0] != seen[1][0]
        steps[accumulate] = {n: p.detach() - start[n] for n, p in model.named_parameters()}
    for name, step in steps[2].items():
        assert float(step.abs().max()) > 0, name
        torch.testing.assert_close(step, steps[1][name], rtol=1e-4, atol=1e-7, msg=name)


def test_trainer_fine_tunes_a_tiny_llama_with_the_entmax_loss(tmp_path):
    """Trainer with the patched 1.5-entmax loss: the training loss falls."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (8, 12), generator=g)
    dataset = [{"input_ids": ids[i], "labels": ids[i]} for i in range(8)]
    model = H.apply(tiny("llama"), "entmax15")
    trainer = _trainer(model, tmp_path, dataset, per_device_train_batch_size=4, max_steps=12, learning_rate=3e-3,
                       lr_scheduler_type="constant", warmup_steps=0)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 12 and all(loss > 0 for loss in losses)
    assert sum(losses[-2:]) < 0.6 * sum(losses[:2]), losses
