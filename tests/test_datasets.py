"""Dataset lookup: local folders, checksums, the download path (network replaced by local copies), errors."""

import shutil
from pathlib import Path

import pytest

from softargmax.experiments import datasets

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.mark.parametrize("name", sorted(datasets.DATASETS))
def test_shared_copy_is_found_and_matches_its_checksums(name):
    if not (SHARED / name).exists():
        pytest.skip(f"../shared/data/{name} not present")
    folder = datasets.find(name, str(SHARED))
    assert folder == SHARED / name
    assert datasets.find(name, str(SHARED / name)) == SHARED / name  # the folder itself works too
    datasets.verify(name, folder)


@pytest.mark.parametrize("name", ["snli", "tinyshakespeare", "multi30k"])
def test_download_is_checksum_verified(name, tmp_path, monkeypatch):
    if not (SHARED / name).exists():
        pytest.skip(f"../shared/data/{name} not present")

    def fake_retrieve(url, dest):
        shutil.copy(SHARED / name / url.rsplit("/", 1)[1], dest)

    monkeypatch.setattr(datasets.urllib.request, "urlretrieve", fake_retrieve)
    got = datasets.download(name, tmp_path / "cache", log=lambda *_: None)
    assert all((got / n).exists() for n in datasets.DATASETS[name].sha256)

    def corrupt(url, dest):
        Path(dest).write_text("not the data\n")

    monkeypatch.setattr(datasets.urllib.request, "urlretrieve", corrupt)
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        datasets.download(name, tmp_path / "other", log=lambda *_: None)
    assert not list((tmp_path / "other").glob("*.part"))


def test_missing_data_and_unknown_names_give_clear_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SOFTARGMAX_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        datasets.find("snli")
    with pytest.raises(FileNotFoundError, match="no download"):
        datasets.find("mulan", download_missing=True)
    with pytest.raises(RuntimeError, match="no byte-identical public copy"):
        datasets.download("ptb", tmp_path / "x")
    with pytest.raises(ValueError, match="dataset must be one of"):
        datasets.find("imagenet")
