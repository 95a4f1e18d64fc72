"""Fashion-MNIST classification with f-divergence losses (Roulet et al., 2025, §4.1): the IDX reader and a smoke run."""

import gzip
import json

import pytest
import torch
from conftest import DATA, check_progress_log  # noqa: E402

from softargmax.cli import main
from softargmax.experiments import classification as cl

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)


def test_idx_reader_roundtrip_and_errors(tmp_path):
    data = torch.arange(24, dtype=torch.uint8).view(2, 3, 4)
    header = b"\x00\x00\x08\x03" + b"".join(d.to_bytes(4, "big") for d in (2, 3, 4))
    path = tmp_path / "x-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(header + bytes(data.flatten().tolist()))
    assert torch.equal(cl.read_idx(path), data)
    with gzip.open(path, "wb") as f:
        f.write(header + b"\x00" * 5)
    with pytest.raises(RuntimeError, match="bytes of data"):
        cl.read_idx(path)


@pytest.mark.skipif(not (SHARED / "fashion-mnist").exists(), reason="data not present: fashion-mnist")
def test_fashion_mnist_and_classification_smoke(tmp_path):
    data = cl.load(SHARED / "fashion-mnist")
    x, y = data["train"]
    assert x.shape == (60000, 1, 28, 28) and float(x.max()) <= 1.0 and set(y.unique().tolist()) == set(range(10))
    assert torch.bincount(data["test"][1]).tolist() == [1000] * 10
    out = tmp_path / "cls"
    assert main(["reproduce", "classification", "--preset", "smoke", "--data-dir", str(SHARED), "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["losses"]) == set(cl.LOSSES)
    for name, r in res["losses"].items():
        assert r["mean"] > 40, name  # one epoch on 2,000 images: far above chance (10%)
    assert set(res["alpha_sweep"]) == {"1.0", "1.5", "2.0"}
    assert res["alpha_sweep"]["1.5"] == res["losses"]["alpha1.5"]
    assert (out / "report.md").exists() and (out / "accuracy.png").exists()
    # 5 losses and α = 2 (α = 1 and 1.5 are KL's and 1.5-entmax's runs), the summary with the best α
    summary = check_progress_log(out, 6, ["Kullback–Leibler", f"{res['losses']['kl']['mean']:.2f}"])
    assert summary[-1].startswith("  α sweep: the best α is ")
