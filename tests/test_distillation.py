"""SFT vs distillation with f-divergence losses (Roulet et al., 2025, §4.2): sampling, scoring and a smoke run."""


import pytest
import torch
from conftest import DATA, check_progress_log  # noqa: E402

from softargmax.experiments import distillation as di

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)


def test_sampling_respects_the_support_and_scoring_is_cross_entropy():
    torch.manual_seed(0)
    model = di.CharLM(7, 16, 1).eval()
    prompts = torch.randint(0, 7, (5, 4))
    cont = di.sample(model, prompts, 6, "sparsemax", torch.Generator().manual_seed(0))
    assert cont.shape == (5, 6)
    seq = prompts
    for t in range(6):  # every sampled character had a nonzero sparsemax probability given the whole prefix
        with torch.no_grad():
            probs = di.sa.sparsemax(model(seq)[:, -1].double())
        assert bool((probs.gather(1, cont[:, t: t + 1]) > 0).all())
        seq = torch.cat([seq, cont[:, t: t + 1]], 1)
    nll = di.teacher_nll(model, prompts, cont)
    with torch.no_grad():
        logits = model(torch.cat([prompts, cont], 1)[:, :-1])[:, -6:]
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), cont.reshape(-1))
    assert nll == pytest.approx(float(ref))
    assert di.known_word_share(["xx the king yy"], {"the", "king"}) == 1.0


@pytest.mark.skipif(not (SHARED / "tinyshakespeare").exists(), reason="data not present: tinyshakespeare")
def test_distillation_smoke(smoke_run):
    out, res = smoke_run("distillation", "--data-dir", str(SHARED))
    assert set(res["students"]) == {f"{m}:{n}" for m in ("sft", "distillation") for n in di.LOSSES}
    for k, r in res["students"].items():
        assert 0 <= r["accuracy"] <= 100 and r["own_decoding"]["teacher_nll"] > 0, k
    kl = res["students"]["sft:kl"]  # KL's own f-softargmax is softmax: the same samples
    assert kl["own_decoding"] == kl["softmax_decoding"]
    assert (out / "report.md").exists() and (out / "fig3_fig4.png").exists()
    # the teacher, then 2 x 5 students, each after its "== run i of 11" line; the summary closes the log
    check_progress_log(out, 11, ["SFT", "Jensen–Shannon", f"{res['students']['sft:js']['accuracy']:.2f}"])


@pytest.mark.skipif(not (SHARED / "tinyshakespeare").exists(), reason="data not present: tinyshakespeare")
def test_distillation_rerun_with_the_same_seed_is_identical(rerun_is_identical):
    rerun_is_identical("distillation", "--data-dir", str(SHARED))
