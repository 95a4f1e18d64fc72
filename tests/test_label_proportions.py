"""Label-proportion estimation (Martins & Astudillo, 2016, §4.1): the generator, the metrics, the fit, and a smoke run."""

import math

import pytest
import torch
from conftest import check_progress_log  # noqa: E402

import softargmax as sa
from softargmax.experiments import label_proportions as lp


def _word_dists(K, gen):
    w = -torch.log(torch.rand(K, K, generator=gen, dtype=torch.float64))
    return w / w.sum(1, keepdim=True)


@pytest.mark.parametrize("mixture", ["uniform", "random"])
def test_generator_draws_sparse_proportions_and_word_frequencies(mixture):
    gen = torch.Generator().manual_seed(0)
    K = 8
    x, q = lp.generate(500, K, 300, mixture, _word_dists(K, gen), gen)
    torch.testing.assert_close(q.sum(1), torch.ones(500, dtype=torch.float64))
    torch.testing.assert_close(x.sum(1), torch.ones(500, dtype=torch.float64))
    active = (q > 0).sum(1)
    assert int(active.min()) >= 1 and int(active.max()) <= K
    assert 1.5 < float(active.double().mean()) < 3.0  # Poisson(2) rejected to [1, K]
    if mixture == "uniform":
        torch.testing.assert_close(q.max(1).values, 1.0 / active.double())
    else:
        assert bool((q.max(1).values > 1.0 / active.double() - 1e-12).all())
    with pytest.raises(ValueError, match="mixture"):
        lp.generate(2, K, 10, "zipf", _word_dists(K, gen), gen)


def test_metrics_match_their_definitions():
    q = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    p = torch.tensor([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]], dtype=torch.float64)
    got = lp.metrics(q, p)
    assert got["mse"] == pytest.approx((0.25 ** 2 * 2) / 2)
    m = [0.5, 0.375, 0.125]
    js = 0.5 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])) + 0.5 * (
        0.5 * math.log(0.5 / m[0]) + 0.25 * math.log(0.25 / m[1]) + 0.25 * math.log(0.25 / m[2]))
    assert got["js"] == pytest.approx(js / 2)


def test_fit_reaches_the_loss_minimum():
    """At the L-BFGS solution the gradient of the regularized objective vanishes: p(x) − q balances λW."""
    gen = torch.Generator().manual_seed(1)
    x, q = lp.generate(200, 5, 500, "random", _word_dists(5, gen), gen)
    x = (x - x.mean(0)) / x.std(0)
    for loss in lp.LOSSES.values():
        W, b = lp.fit(x, q, loss, 1e-2)
        W.requires_grad_(True)
        obj = sa.fenchel_young_loss(x @ W + b, q, **loss) + 1e-2 * (W * W).sum()
        (g,) = torch.autograd.grad(obj, W)
        assert float(g.abs().max()) < 1e-5


def test_label_proportions_smoke(smoke_run):
    out, res = smoke_run("label-proportions")
    assert len(res["rows"]) == 2 * 2 * len(lp.LOSSES)
    for r in res["rows"]:
        assert 0 <= r["mse"] <= 2 and 0 <= r["js"] <= math.log(2)
    long = {r["loss"]: r for r in res["rows"] if r["length"] == 1000 and r["mixture"] == "uniform"}
    assert long["sparsemax"]["mse"] < long["softmax"]["mse"]  # the paper's effect, already at smoke size
    assert (out / "report.md").exists() and (out / "fig3_K10.png").exists()
    summary = check_progress_log(out, 4)  # 2 mixtures x 2 lengths; the sparsemax loss beats logistic at 1000 words
    assert summary[1].split()[-1] == "—" and summary[2].startswith("  sparsemax") and summary[2].split()[-1] in "12"


def test_label_proportions_rerun_with_the_same_seed_is_identical(rerun_is_identical):
    rerun_is_identical("label-proportions")
