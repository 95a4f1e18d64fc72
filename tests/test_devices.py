"""Modules create their parameters and buffers where they are told, and tensor arguments on
another device than the scores get one documented rule (``softargmax._utils.checks.check_device``).

The ``meta`` device stands in for a GPU on CPU-only machines: a parameter built on the CPU
while the module was asked for ``device="meta"`` is the bug that crashed learned-α attention
on CUDA (α stayed on the CPU while the model moved to the GPU).
"""

import pytest
import torch
from conftest import needs_cuda
from torch import nn

import softargmax as sa


def _all_tensors(module: nn.Module):
    return list(module.named_parameters()) + list(module.named_buffers())


def _assert_on(module: nn.Module, device: str, dtype=None):
    tensors = _all_tensors(module)
    assert tensors, "the module has no tensors to check"
    for name, t in tensors:
        assert t.device.type == device, f"{name} is on {t.device}, expected {device}"
        if dtype is not None and t.is_floating_point():
            assert t.dtype == dtype, f"{name} has dtype {t.dtype}, expected {dtype}"


MODULES = {
    "Entmax learned alpha": lambda **kw: sa.nn.Entmax(alpha=1.5, learn_alpha=True, **kw),
    "Entmax per-head learned alpha": lambda **kw: sa.nn.Entmax(alpha=torch.full((4, 1, 1), 1.3), learn_alpha=True, **kw),
    "Entmax fixed tensor alpha": lambda **kw: sa.nn.Entmax(alpha=torch.full((4, 1, 1), 1.3), **kw),
    "AlphaReLU": lambda **kw: sa.nn.AlphaReLU(1.5, tau=0.2, **kw),
    "AlphaReLU calibrate": lambda **kw: sa.nn.AlphaReLU(1.5, tau="calibrate", **kw),
    "FSoftargmax learned q": lambda **kw: sa.nn.FSoftargmax("jensen_shannon", q=torch.rand(6) + 0.5, learn_q=True, **kw),
    "FSoftargmax fixed q": lambda **kw: sa.nn.FSoftargmax("kl", q=torch.rand(6) + 0.5, **kw),
    "MHA learned alpha": lambda **kw: sa.nn.SparseMultiheadAttention(16, 4, learn_alpha=True, **kw),
    "MHA per-head alpha": lambda **kw: sa.nn.SparseMultiheadAttention(
        16, 4, mapping="entmax", alpha=torch.tensor([1.1, 1.3, 1.5, 1.9]), **kw),
    "MHA entmax15": lambda **kw: sa.nn.SparseMultiheadAttention(16, 4, batch_first=True, **kw),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_modules_create_tensors_on_the_given_device(name):
    _assert_on(MODULES[name](device="meta"), "meta")


@pytest.mark.parametrize("name", list(MODULES))
def test_modules_create_tensors_in_the_given_dtype(name):
    _assert_on(MODULES[name](dtype=torch.float64), "cpu", torch.float64)


@pytest.mark.parametrize("learn_alpha", [False, True])
def test_convert_attention_keeps_the_source_device_and_dtype(learn_alpha):
    model = nn.Transformer(d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                           batch_first=True, device="meta", dtype=torch.float64)
    sa.nn.convert_attention(model, mapping="entmax15", learn_alpha=learn_alpha)
    converted = [m for m in model.modules() if isinstance(m, sa.nn.SparseMultiheadAttention)]
    assert len(converted) == 3
    if learn_alpha:
        assert all(m.alpha_logit.device.type == "meta" for m in converted)
    _assert_on(model, "meta", torch.float64)


def test_convert_attention_alone_keeps_the_device():
    mha = nn.MultiheadAttention(16, 4, device="meta")
    new = sa.nn.convert_attention(mha, learn_alpha=True)
    assert isinstance(new, sa.nn.SparseMultiheadAttention)
    _assert_on(new, "meta")


def test_learned_alpha_module_still_validates_its_start():
    with pytest.raises(ValueError, match="strictly inside"):
        sa.nn.SparseMultiheadAttention(16, 4, learn_alpha=True, alpha=2.5, device="meta")
    with pytest.raises(ValueError, match="strictly inside"):
        sa.nn.Entmax(alpha=2.5, learn_alpha=True, device="meta")


# the functional rule: same device, a 0-d CPU tensor is moved, anything else is a ValueError naming the argument
OTHER = "meta"  # a device the CPU scores are not on


@pytest.mark.parametrize("call, name", [
    (lambda x: sa.entmax(x, torch.full((3, 1), 1.5, device=OTHER)), "alpha"),
    (lambda x: sa.f_softargmax(x, "kl", q=torch.ones(5, device=OTHER)), "q"),
    (lambda x: sa.f_softargmax(x, "kl", q=torch.ones((), device=OTHER)), "q"),
    (lambda x: sa.alpha_relu(x, 1.5, torch.zeros(3, 1, device=OTHER)), "tau"),
    (lambda x: sa.attention(x[None, None], x[None, None], x[None, None], mapping="entmax",
                            alpha=torch.tensor([1.5], device=OTHER)), "alpha"),
])
def test_tensor_arguments_on_another_device_are_refused_by_name(call, name):
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match=rf"^{name} is on meta but the input is on cpu"):
        call(x)


def test_check_device_moves_only_cpu_scalars():
    from softargmax._utils.checks import check_device

    x = torch.randn(3, 5)
    a = torch.tensor(1.5)
    assert check_device(a, x, "alpha") is a
    # a 0-d tensor on another device than the CPU is not a "CPU scalar": refused
    with pytest.raises(ValueError, match="alpha is on meta"):
        check_device(torch.tensor(1.5, device="meta"), x, "alpha")
    # against shape-only (meta) scores nothing is checked
    assert check_device(a, x.to("meta"), "alpha") is a


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_learned_alpha_attention_on_cuda(dtype):
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2)
    model = sa.nn.convert_attention(model.to("cuda", dtype), learn_alpha=True)
    _assert_on(model, "cuda", dtype)
    x = torch.randn(2, 7, 32, device="cuda", dtype=dtype)
    out = model(x)
    # a loss that depends on α (a plain sum of attention outputs would not test the α gradient)
    (out.float() ** 2).mean().backward()
    for m in model.modules():
        if isinstance(m, sa.nn.SparseMultiheadAttention):
            assert m.alpha_logit.grad is not None and torch.isfinite(m.alpha_logit.grad).all()
            assert m.alpha_logit.grad.abs().sum() > 0
    # a CPU scalar α is moved; a CPU per-row α is refused by name
    s = torch.randn(4, 9, device="cuda")
    assert sa.entmax(s, torch.tensor(1.3)).device.type == "cuda"
    with pytest.raises(ValueError, match="alpha is on cpu"):
        sa.entmax(s, torch.full((4, 1), 1.3))
