"""linear_fenchel_young_loss: same values and gradients as the unfused loss."""

import pytest
import torch

import softargmax as sa

F64 = torch.float64


@pytest.mark.parametrize("mapping,params", [("entmax15", {}), ("softmax", {}), ("sparsemax", {}), ("entmax", {"alpha": 1.3}),
                                            ("jensen_shannon", {}), ("alpha_relu", {"alpha": 1.5, "tau": 0.1})])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_equals_unfused(mapping, params, reduction):
    g = torch.Generator().manual_seed(0)
    N, d, V = 29, 12, 40
    h = torch.randn(2, N, d, dtype=F64, generator=g).requires_grad_()
    W = (torch.randn(V, d, dtype=F64, generator=g) * 0.5).requires_grad_()
    b = torch.randn(V, dtype=F64, generator=g).requires_grad_()
    t = torch.randint(0, V, (2, N), generator=g)
    t[0, 3] = t[1, 7] = -100
    cw = torch.rand(V, dtype=F64, generator=g) + 0.5
    for bias in (b, None):
        for extra in ({}, {"class_weight": cw}, {"label_smoothing": 0.1}):
            if mapping == "alpha_relu" and "label_smoothing" in extra:
                continue
            fused = sa.linear_fenchel_young_loss(h, W, t, bias, mapping=mapping, chunk_size=7, reduction=reduction, **extra, **params)
            ref_extra = {("weight" if k == "class_weight" else k): v for k, v in extra.items()}
            logits = h @ W.T + (bias if bias is not None else 0)
            ref = sa.fenchel_young_loss(logits, t, mapping, reduction=reduction, **ref_extra, **params)
            torch.testing.assert_close(fused, ref)
            inputs = (h, W) if bias is None else (h, W, b)
            gf = torch.autograd.grad(fused * 1.7, inputs)
            gr = torch.autograd.grad(ref * 1.7, inputs)
            for a, c in zip(gf, gr):
                torch.testing.assert_close(a, c)


def test_fused_soft_labels_and_float32():
    N, d, V = 50, 8, 30
    h = torch.randn(N, d, requires_grad=True)
    W = torch.randn(V, d, requires_grad=True)
    y = torch.softmax(torch.randn(N, V), -1)
    fused = sa.linear_fenchel_young_loss(h, W, y, chunk_size=16)
    ref = sa.entmax15_loss(h @ W.T, y)
    torch.testing.assert_close(fused, ref)
    torch.testing.assert_close(torch.autograd.grad(fused, h)[0], torch.autograd.grad(ref, h)[0])


def test_fused_errors():
    h, W = torch.randn(4, 8), torch.randn(10, 8)
    t = torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match="'mean' or 'sum'"):
        sa.linear_fenchel_young_loss(h, W, t, reduction="none")
    with pytest.raises(ValueError, match="last dimension"):
        sa.linear_fenchel_young_loss(torch.randn(4, 7), W, t)
    with pytest.raises(ValueError, match="out of range"):
        sa.linear_fenchel_young_loss(h, W, torch.tensor([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="chunk_size"):
        sa.linear_fenchel_young_loss(h, W, t, chunk_size=0)
