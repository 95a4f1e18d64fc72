"""Dataset lookup: local folders, checksums, the download path (network replaced by local copies), errors;
the verification of the folder used (damaged, truncated, missing files; the stamp; the CLI's error)."""

import hashlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA  # noqa: E402

from softargmax.experiments import datasets

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)


@pytest.mark.parametrize("name", sorted(datasets.DATASETS))
def test_shared_copy_is_found_and_matches_its_checksums(name):
    if not (SHARED / name).exists():
        pytest.skip(f"data not present: {name}")
    folder = datasets.find(name, str(SHARED))
    assert folder == SHARED / name
    assert datasets.find(name, str(SHARED / name)) == SHARED / name  # the folder itself works too
    datasets.verify(name, folder)


class _Response(io.BytesIO):
    """What ``urllib.request.urlopen`` returns, for the bytes a fake server sends."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data))}


def _serve(monkeypatch, source):
    """The network replaced: ``source(url)`` gives the bytes of ``url`` (or raises, as a network that is down)."""
    monkeypatch.setattr(datasets.urllib.request, "urlopen", lambda url, timeout=None: _Response(source(url)))


@pytest.mark.parametrize("name", ["snli", "tinyshakespeare", "multi30k"])
def test_download_is_checksum_verified(name, tmp_path, monkeypatch):
    if not (SHARED / name).exists():
        pytest.skip(f"data not present: {name}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the stamps of tmp folders stay in tmp

    _serve(monkeypatch, lambda url: (SHARED / name / url.rsplit("/", 1)[1]).read_bytes())
    got = datasets.download(name, tmp_path / "cache", log=lambda *_: None)
    assert all((got / n).exists() for n in datasets.DATASETS[name].sha256)

    _serve(monkeypatch, lambda url: b"not the data\n")
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        datasets.download(name, tmp_path / "other", log=lambda *_: None)
    assert not list((tmp_path / "other").glob("*.part"))


def test_missing_data_and_unknown_names_give_clear_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOFTARGMAX_DATA", raising=False)  # one that is set is the only folder tried (below)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        datasets.find("snli")
    with pytest.raises(FileNotFoundError, match="no download"):
        datasets.find("mulan", download_missing=True)
    with pytest.raises(RuntimeError, match="no byte-identical public copy"):
        datasets.download("ptb", tmp_path / "x")
    with pytest.raises(ValueError, match="dataset must be one of"):
        datasets.find("imagenet")


# --- verification of the folder find() picks: damaged, truncated and missing files --------------------------------

def _needs(*names):
    missing = [n for n in names if not (SHARED / n).exists()]
    return pytest.mark.skipif(bool(missing), reason=f"data not present: {missing}")


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No ../shared/data, ./data or cache of the real machine is visible; returns tmp_path."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SOFTARGMAX_DATA", raising=False)
    return tmp_path


def _copy(name, folder):
    folder.mkdir(parents=True)
    for fname in datasets.DATASETS[name].sha256:
        shutil.copy(SHARED / name / fname, folder / fname)
    return folder


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x55
    path.write_bytes(bytes(data))


def _digest(path):  # independent of datasets.sha256
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("name, fname", [("multi30k", "train.en.gz"), ("tinyshakespeare", "input.txt"),
                                         ("mulan", "emotions-train.arff")])
def test_a_changed_byte_stops_the_run_naming_the_file_and_both_digests(name, fname, isolated):
    if not (SHARED / name).exists():
        pytest.skip(f"data not present: {name}")
    folder = _copy(name, isolated / "mine" / name)
    _flip(folder / fname)
    with pytest.raises(datasets.DataError) as err:
        datasets.find(name, str(isolated / "mine"))
    msg = str(err.value)
    assert str(folder / fname) in msg and "same size, different bytes" in msg
    assert _digest(SHARED / name / fname) in msg and _digest(folder / fname) in msg
    assert "Fix: copy the files again" in msg and "\n" not in msg
    assert [f for f in datasets.DATASETS[name].sha256 if str(folder / f) in msg] == [fname]  # only the bad one


@_needs("multi30k")
def test_a_truncated_file_is_named_with_its_size(isolated):
    folder = _copy("multi30k", isolated / "mine")
    full = (SHARED / "multi30k" / "train.en.gz").stat().st_size
    (folder / "train.en.gz").write_bytes((SHARED / "multi30k" / "train.en.gz").read_bytes()[:1000])
    with pytest.raises(datasets.DataError) as err:
        datasets.find("multi30k", str(folder), download_missing=True)  # an explicit folder is never replaced
    msg = str(err.value)
    assert f"{folder / 'train.en.gz'}: expected SHA-256 {_digest(SHARED / 'multi30k' / 'train.en.gz')}" in msg
    assert f"got {_digest(folder / 'train.en.gz')} (truncated: 1000 of {full} bytes)" in msg
    assert "neither --data-dir nor SOFTARGMAX_DATA to download it" in msg


@_needs("multi30k")
def test_an_explicit_folder_lacking_a_file_never_falls_back(isolated, monkeypatch):
    _copy("multi30k", isolated / "shared" / "data" / "multi30k")  # a complete ../shared/data/multi30k
    assert datasets.find("multi30k") == Path("../shared/data/multi30k")
    mine = _copy("multi30k", isolated / "mine")
    (mine / "val.de.gz").unlink()
    for given in ("arg", "env"):
        if given == "env":
            monkeypatch.setenv("SOFTARGMAX_DATA", str(mine))
        with pytest.raises(datasets.DataError, match=r"val.de.gz: missing") as err:
            datasets.find("multi30k", str(mine) if given == "arg" else None)
        assert str(mine / "val.de.gz") in str(err.value) and datasets.DATASETS["multi30k"].sha256["val.de.gz"] in str(err.value)
    monkeypatch.setenv("SOFTARGMAX_DATA", str(isolated / "empty"))
    with pytest.raises(datasets.DataNotFoundError, match="given as SOFTARGMAX_DATA, so no other folder"):
        datasets.find("multi30k")


@_needs("tinyshakespeare")
def test_a_damaged_default_folder_is_an_error_not_skipped(isolated):
    shared = _copy("tinyshakespeare", isolated / "shared" / "data" / "tinyshakespeare")
    _copy("tinyshakespeare", datasets.cache_dir("tinyshakespeare"))  # an intact copy further down the order
    _flip(shared / "input.txt", at=0)
    with pytest.raises(datasets.DataError, match="repair or remove") as err:
        datasets.find("tinyshakespeare")
    assert "../shared/data/tinyshakespeare/input.txt" in str(err.value) and _digest(shared / "input.txt") in str(err.value)


@_needs("tinyshakespeare")
def test_a_damaged_cache_is_caught_and_downloaded_again(isolated, monkeypatch):
    cached = _copy("tinyshakespeare", datasets.cache_dir("tinyshakespeare"))
    assert datasets.find("tinyshakespeare") == cached
    (cached / "input.txt").write_bytes((SHARED / "tinyshakespeare" / "input.txt").read_bytes()[:-1])
    with pytest.raises(datasets.DataError, match="rerun without --offline") as err:
        datasets.find("tinyshakespeare")
    assert str(cached / "input.txt") in str(err.value) and "truncated" in str(err.value)

    fetched = []
    _serve(monkeypatch, lambda url: fetched.append(url) or (SHARED / "tinyshakespeare" / url.rsplit("/", 1)[1]).read_bytes())
    assert datasets.find("tinyshakespeare", download_missing=True, log=lambda *_: None) == cached
    assert len(fetched) == 1 and _digest(cached / "input.txt") == _digest(SHARED / "tinyshakespeare" / "input.txt")


@_needs("multi30k")
def test_the_stamp_skips_rehashing_until_a_file_changes(isolated, monkeypatch):
    folder = _copy("multi30k", isolated / "mine")
    calls = []
    real = datasets.sha256
    monkeypatch.setattr(datasets, "sha256", lambda p: calls.append(Path(p).name) or real(p))
    datasets.find("multi30k", str(folder))
    assert sorted(calls) == sorted(datasets.DATASETS["multi30k"].sha256)  # first use hashes every file
    assert datasets.stamp_path(folder).exists()
    calls.clear()
    datasets.find("multi30k", str(folder))
    assert calls == []  # verified before, nothing changed
    st = (folder / "val.en.gz").stat()
    os.utime(folder / "val.en.gz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched
    datasets.find("multi30k", str(folder))
    assert calls == ["val.en.gz"]
    calls.clear()
    # replaced by a damaged copy of the same size and mtime (cp -p): the inode and ctime give it away
    st = (folder / "val.de.gz").stat()
    bad = isolated / "bad.gz"
    shutil.copy(folder / "val.de.gz", bad)
    _flip(bad)
    os.utime(bad, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(bad, folder / "val.de.gz")
    with pytest.raises(datasets.DataError, match=r"val.de.gz: expected SHA-256"):
        datasets.find("multi30k", str(folder))
    assert calls == ["val.de.gz"]


@_needs("tinyshakespeare")
def test_an_unwritable_stamp_costs_a_rehash_not_the_run(isolated, monkeypatch):
    (isolated / "not-a-dir").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated / "not-a-dir"))  # nothing can be created below it
    folder = _copy("tinyshakespeare", isolated / "mine")
    assert datasets.find("tinyshakespeare", str(folder)) == folder
    _flip(folder / "input.txt")
    with pytest.raises(datasets.DataError, match=r"input.txt: expected SHA-256"):
        datasets.find("tinyshakespeare", str(folder))


@_needs("multi30k")
def test_cli_reports_damaged_data_in_one_line_and_exits_2(isolated):
    folder = _copy("multi30k", isolated / "mine")
    _flip(folder / "train.en.gz")
    env = {**os.environ, "PYTHONPATH": str(Path(datasets.__file__).parents[2]),  # the src folder imported here
           "XDG_CACHE_HOME": str(isolated / "cache")}
    env.pop("SOFTARGMAX_DATA", None)
    r = subprocess.run([sys.executable, "-m", "softargmax", "reproduce", "tau-table", "--preset", "smoke",
                        "--data-dir", str(folder), "--out", str(isolated / "out")],
                       capture_output=True, text=True, env=env, cwd=isolated / "work", timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: multi30k data in ")
    assert str(folder / "train.en.gz") in lines[0] and _digest(folder / "train.en.gz") in lines[0]


def _down(url):
    raise datasets.urllib.error.URLError(OSError(-3, "Temporary failure in name resolution"))


def test_no_network_gives_one_error_and_leaves_nothing_in_the_cache(isolated, monkeypatch, capsys):
    from softargmax.cli import main

    _serve(monkeypatch, _down)
    with pytest.raises(datasets.DataError, match=r"could not download https://.*Temporary failure in name resolution"):
        datasets.find("multi30k", download_missing=True, log=lambda *_: None)
    assert not (isolated / "cache").exists()  # no empty cache folder left behind
    # the command line downloads by default: no network is one error line, exit status 2, no traceback
    out = isolated / "out"
    assert main(["reproduce", "tau-table", "--preset", "smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: could not download https://"), err
    assert "--data-dir" in err and "Traceback" not in err and not (isolated / "cache").exists()
    # --offline never downloads: the error says how to get the data
    assert main(["reproduce", "tau-table", "--preset", "smoke", "--out", str(out), "--offline"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "multi30k not found" in err and "without --offline" in err


@_needs("multi30k")
def test_the_command_line_downloads_missing_data_by_default_with_a_message(isolated, monkeypatch, capsys):
    from softargmax.cli import main

    fetched = []
    _serve(monkeypatch, lambda url: fetched.append(url) or (SHARED / "multi30k" / url.rsplit("/", 1)[1]).read_bytes())
    assert main(["reproduce", "tau-table", "--preset", "smoke", "--out", str(isolated / "out")]) == 0
    printed = capsys.readouterr().out
    assert "downloading multi30k (6 files" in printed and "SHA-256" in printed
    assert len(fetched) == len(datasets.DATASETS["multi30k"].sha256)
    assert datasets.find("multi30k") == datasets.cache_dir("multi30k")  # verified, from the cache
    # a second run finds the cache and fetches nothing
    assert main(["reproduce", "tau-table", "--preset", "smoke", "--out", str(isolated / "out")]) == 0
    assert len(fetched) == len(datasets.DATASETS["multi30k"].sha256) and "downloading" not in capsys.readouterr().out


def test_a_failed_download_keeps_no_part_file_and_no_new_folder(isolated, monkeypatch):
    calls = []

    def flaky(url):  # the first file arrives, the second fails
        calls.append(url)
        if len(calls) > 1:
            raise ConnectionResetError(104, "Connection reset by peer")
        return b"x"

    _serve(monkeypatch, flaky)
    with pytest.raises(datasets.DataError):  # the first file's checksum fails before the network does
        datasets.download("tinyshakespeare", isolated / "new" / "cache", log=lambda *_: None)
    assert not (isolated / "new").exists()
