"""Multi-label benchmarks (Martins & Astudillo, 2016, §4.2): ARFF reader, loading, F1, decision rules, and a smoke run."""


import pytest
import torch
from conftest import DATA, check_progress_log  # noqa: E402

from softargmax.experiments import multilabel as ml

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)
needs_mulan = pytest.mark.skipif(not (SHARED / "mulan").exists(), reason="data not present: mulan")


def test_arff_reader_dense_sparse_nominal_and_missing(tmp_path):
    dense = tmp_path / "d.arff"
    dense.write_text("% comment\n@relation r\n@attribute 'a b' numeric\n@attribute loc {x,y,z}\n"
                     "@attribute lab {0,1}\n@data\n1.5,y,1\n?,z,0\n")
    attrs, X = ml.read_arff(dense)
    assert [w for _, w in attrs] == [1, 3, 1] and attrs[0][0] == "a b"
    torch.testing.assert_close(X, torch.tensor([[1.5, 0, 1, 0, 1], [0, 0, 0, 1, 0]], dtype=torch.float64))
    sparse = tmp_path / "s.arff"
    sparse.write_text("@relation r\n@attribute f0 {0,1}\n@attribute f1 {0,1}\n@attribute f2 numeric\n@data\n"
                      "{1 1,2 3.5}\n{}\n{0 1}\n")
    _, X = ml.read_arff(sparse)
    torch.testing.assert_close(X, torch.tensor([[0, 1, 3.5], [0, 0, 0], [1, 0, 0]], dtype=torch.float64))


@needs_mulan
def test_loaded_datasets_have_the_documented_sizes():
    folder = SHARED / "mulan"
    for name, labels, feats in [("scene", 6, 294), ("emotions", 6, 72), ("yeast", 14, 103), ("cal500", 174, 68),
                                ("medical", 45, 1449)]:
        parts = ml.load(folder, name)
        X, Y = parts["train"]
        assert Y.shape[1] == labels and X.shape[1] == feats, name
        assert bool((Y.sum(1) > 0).all()) and set(Y.unique().tolist()) <= {0.0, 1.0}
    assert ml.load(folder, "cal500")["test"] is None


def test_f1_against_a_direct_count():
    torch.manual_seed(0)
    pred = torch.rand(50, 7) > 0.5
    Y = torch.rand(50, 7) > 0.6
    micro, macro = ml.f1_scores(pred, Y)
    tp = fp = fn = 0
    per = []
    for j in range(7):
        a = sum(bool(pred[i, j] and Y[i, j]) for i in range(50))
        b = sum(bool(pred[i, j] and not Y[i, j]) for i in range(50))
        c = sum(bool(not pred[i, j] and Y[i, j]) for i in range(50))
        tp, fp, fn = tp + a, fp + b, fn + c
        per.append(2 * a / (2 * a + b + c) if 2 * a + b + c else 1.0)
    assert micro == pytest.approx(100 * 2 * tp / (2 * tp + fp + fn))
    assert macro == pytest.approx(100 * sum(per) / 7)


def test_decision_rules():
    z = torch.tensor([[3.0, 2.9, -1.0, -5.0]])
    assert ml.decide("sparsemax", z, 1.0).tolist() == [[True, True, False, False]]
    assert ml.decide("sparsemax", z, 20.0).tolist() == [[True, False, False, False]]  # scaling sparsifies
    assert ml.decide("softmax", z, 0.3).tolist() == [[True, True, False, False]]
    assert ml.decide("logistic", z, 0.5).tolist() == [[True, True, False, False]]
    assert ml.decide("binary_chi_square", torch.tensor([[2.5, -2.5]]), 0.5).tolist() == [[True, False]]


@needs_mulan
def test_multilabel_smoke(smoke_run):
    out, res = smoke_run("multilabel", "--data-dir", str(SHARED))
    em = res["datasets"]["emotions"]["systems"]
    assert set(em) == set(ml.SYSTEMS)
    for s, rec in em.items():
        assert 45 < rec["micro"]["f1"] < 90 and 40 < rec["macro"]["f1"] < 90, s  # paper: 66-69
    assert (out / "report.md").exists() and (out / "f1.png").exists()
    check_progress_log(out, 1, ["emotions", f"{em['logistic']['micro']['f1']:.2f}", "/"])


@needs_mulan
def test_multilabel_rerun_with_the_same_seed_is_identical(rerun_is_identical):
    rerun_is_identical("multilabel", "--data-dir", str(SHARED))
