"""Smoke runs of the small reproductions: tau-table (Speeding Up Entmax, Table 3) and bisection (the f-divergence paper, Fig. 6)."""


import pytest
from conftest import DATA  # noqa: E402

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)


def test_bisection_smoke(smoke_run):
    out, res = smoke_run("bisection")
    for label, r in res["generators"].items():
        assert r["bisection_within_bound"], label  # the measured error obeys (τmax − τmin)·2^−t
        assert r["newton_steps_to_1e-6"] is not None and r["newton_steps_to_1e-6"] <= 6, label
        assert r["bisection_iterations_to_1e-6"] >= 15, label
    assert (out / "report.md").exists() and (out / "convergence.png").exists()
    assert "Ran on cpu (" in (out / "report.md").read_text()


@pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="data not present: multi30k")
def test_tau_table_smoke(smoke_run):
    pytest.importorskip("sentencepiece")
    out, res = smoke_run("tau-table", "--data-dir", str(SHARED))
    for r in res["rows"]:
        assert r["tau_model"] == pytest.approx(r["tau_formula"], rel=0.1)
        assert r["logit_std_measured"] == pytest.approx(r["logit_std_formula"], rel=0.1)
    # the report names the hardware it ran on (CPU model and threads here)
    from softargmax.experiments._common import describe_device

    assert res["settings"]["device"] == describe_device("cpu")
    assert f"Ran on {describe_device('cpu')}" in (out / "report.md").read_text()


def test_bisection_rerun_with_the_same_seed_is_identical(rerun_is_identical):
    rerun_is_identical("bisection")


@pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="data not present: multi30k")
def test_tau_table_rerun_with_the_same_seed_is_identical(rerun_is_identical):
    pytest.importorskip("sentencepiece")
    rerun_is_identical("tau-table", "--data-dir", str(SHARED))
