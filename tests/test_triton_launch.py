"""softargmax.backends.triton.launch: a tuning run's tiles and warps reach the kernels and leave the results alone.

Without a GPU the kernels run in Triton's interpreter (which ignores warps): the rows per program, the
streamed chunk length and the attention tiles are what changes there; the kernel launches are spied on
to see the overrides arrive.
"""

import pytest
import torch

import softargmax as sa
from softargmax.backends.triton import flash_attention as FA
from softargmax.backends.triton import rows as _triton_rows
from softargmax.backends.triton.launch import AttentionLaunch, RowLaunch, current_attention, current_rows, overridden

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning", "ignore:divide by zero:RuntimeWarning")
ON_GPU = torch.cuda.is_available()
OPS = {"sparsemax": sa.sparsemax, "entmax15": sa.entmax15, "entmax1.3": lambda x: sa.entmax(x, 1.3)}


class _Spy:
    """Wraps a kernel: records the constexprs and warps of each launch, then launches."""

    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append({k: v for k, v in kwargs.items() if k.isupper() or k == "num_warps"})
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.fixture
def spied(triton_device, monkeypatch):
    """``(device, launches)``: every row-kernel launch's ROWS, BLOCK and num_warps, recorded."""
    seen = []
    K = _triton_rows._module()

    class Module:
        def __getattr__(self, name):
            return _Spy(getattr(K, name), seen)

    monkeypatch.setattr(_triton_rows, "_module", lambda: Module())
    return triton_device, seen


def _values_and_grads(fn, x):
    x = x.detach().requires_grad_(True)
    p = fn(x)
    (g,) = torch.autograd.grad(p, x, torch.linspace(-1, 1, x.shape[-1], dtype=x.dtype, device=x.device).expand_as(x))
    return p.detach(), g


@pytest.mark.parametrize("op", list(OPS))
def test_rows_per_program_and_warps_reach_the_kernel_and_change_nothing(spied, op):
    device, seen = spied
    x = torch.randn(13, 50, generator=torch.Generator().manual_seed(0)).to(device) * 3
    default = _values_and_grads(OPS[op], x)
    # the table's choice at BLOCK = 64: 4 warps, 8 rows of 64 per warp (32 lanes × 16 scores), α = 1.3's solver
    # too (EXACT_FAR: one hardware log2 and one exp2 per score; the heavy kinds hold 8 scores per thread)
    assert {(launch["ROWS"], launch["num_warps"]) for launch in seen} == {(32, 4)}
    seen.clear()
    with overridden(rows=RowLaunch(rows_per_program=4, warps=2)):
        tuned = _values_and_grads(OPS[op], x)
    assert seen and all(launch["ROWS"] == 4 and launch["num_warps"] == 2 and launch["CH"] * launch["LINE"] == 64
                        for launch in seen)
    # each row is solved on its own: in the interpreter (which ignores warps) the same bits whatever the rows per
    # program; on a GPU the warps change how a row's sums are reduced, so rounding may differ
    for a, b in zip(default, tuned):
        if ON_GPU:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("op", list(OPS))
def test_streamed_chunk_length_reaches_the_kernel(spied, op, monkeypatch):
    device, seen = spied
    if not ON_GPU:  # the streamed kernels at interpreter sizes, as in test_triton_rows
        monkeypatch.setattr(_triton_rows, "BLOCK_ROWS_MAX", 32)
        monkeypatch.setattr(_triton_rows, "LONG_BLOCK", 16)
    k = 70 if not ON_GPU else 40000
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1)).to(device) * 3
    default = _values_and_grads(OPS[op], x)
    assert {launch["BLOCK"] for launch in seen} == {_triton_rows.LONG_BLOCK}
    seen.clear()
    with overridden(rows=RowLaunch(long_block=32 if not ON_GPU else 1024, long_warps=4)):
        tuned = _values_and_grads(OPS[op], x)
    assert seen and all(launch["BLOCK"] == (32 if not ON_GPU else 1024) and launch["num_warps"] == 4
                        for launch in seen)
    # the float32 sums over a row's chunks change order: rounding only
    for a, b in zip(default, tuned):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_attention_tiles_and_warps_reach_the_kernels(monkeypatch):
    if not FA.available():
        pytest.skip("Triton is not installed")
    device = "cuda" if ON_GPU else "cpu"
    if device == "cpu":
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(device) for _ in range(3))
    default = FA.flash_attention(q, k, v, mapping="entmax15", is_causal=True)
    seen = []
    real = FA.FlashEntmaxAttention.apply
    # the launch configuration (BLOCK_M, BLOCK_N, forward warps, backward warps) is the argument before the
    # packed-sequence offsets and the window
    monkeypatch.setattr(FA.FlashEntmaxAttention, "apply", lambda *a: seen.append(a[-3]) or real(*a))
    with overridden(attention=AttentionLaunch(block_m=32, block_n=16, warps=2)):
        assert FA.blocks(16, q.device, q.dtype) == (32, 16, 2)
        tuned = FA.flash_attention(q, k, v, mapping="entmax15", is_causal=True)
        # an argument of the call still wins over the override
        FA.flash_attention(q, k, v, mapping="entmax15", is_causal=True, block_m=16)
    assert seen == [(32, 16, 2, 2), (16, 16, 2, 2)]  # the override's warps apply to the backward too
    torch.testing.assert_close(tuned, default, rtol=1e-5, atol=1e-6)


def test_overrides_are_restored_and_checked():
    with pytest.raises(RuntimeError, match="inside"):
        with overridden(rows=RowLaunch(warps=8), attention=AttentionLaunch(block_n=64)):
            assert current_rows().warps == 8 and current_attention().block_n == 64
            with overridden(rows=RowLaunch(warps=4)):  # nested: the inner one wins, the outer one comes back
                assert current_rows().warps == 4 and current_attention().block_n == 64
            assert current_rows().warps == 8
            raise RuntimeError("inside")
    assert current_rows() == RowLaunch() and current_attention() == AttentionLaunch()
    for bad, name in ((dict(rows_per_program=3), "rows_per_program"), (dict(warps=3), "warps"),
                      (dict(long_block=8), "long_block"), (dict(long_warps=True), "long_warps"),
                      (dict(rows_per_program=2.0), "rows_per_program")):
        with pytest.raises(ValueError, match=name):
            RowLaunch(**bad)
    with pytest.raises(ValueError, match="block_m"):
        AttentionLaunch(block_m=8)
    with pytest.raises(TypeError, match="rows must be a RowLaunch"):
        with overridden(rows={"warps": 4}):
            pass
