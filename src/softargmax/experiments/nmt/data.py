"""Multi30k German-English (task 1): local files first, a checksum-verified download otherwise.

The files are the raw gzipped captions of github.com/multi30k/dataset (``data/task1/raw``),
one sentence per line, aligned by line.  Lookup order for a folder holding them:

1. ``data_dir`` (either the ``multi30k`` folder itself or a folder containing it);
2. the environment variable ``SOFTARGMAX_DATA`` (same meaning);
3. ``../shared/data`` and ``./data`` relative to the working directory;
4. the cache ``~/.cache/softargmax/multi30k``, downloaded from the dataset's public
   repository when ``download=True`` and checked against the SHA-256 sums below.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SOURCE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"

SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}

SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}


@dataclass
class Parallel:
    """Aligned source and target sentences of one split."""

    src: list
    tgt: list

    def __len__(self):
        return len(self.src)

    def head(self, n: Optional[int]) -> "Parallel":
        return self if n is None else Parallel(self.src[:n], self.tgt[:n])


def _candidates(data_dir: Optional[str]):
    for base in [data_dir, os.environ.get("SOFTARGMAX_DATA"), "../shared/data", "data"]:
        if base:
            p = Path(base).expanduser()
            yield p
            yield p / "multi30k"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "softargmax" / "multi30k"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(target_dir: Optional[Path] = None, log=print) -> Path:
    """Download the six files into ``target_dir`` (default: the cache) and verify their checksums."""
    target_dir = Path(target_dir or cache_dir())
    target_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in SHA256.items():
        path = target_dir / name
        if path.exists() and _sha256(path) == digest:
            continue
        url = SOURCE_URL.format(name=name)
        log(f"downloading {url}")
        tmp = path.with_suffix(".part")
        urllib.request.urlretrieve(url, tmp)
        got = _sha256(tmp)
        if got != digest:
            tmp.unlink()
            raise RuntimeError(f"checksum mismatch for {name}: expected {digest}, got {got}")
        tmp.rename(path)
    return target_dir


def find(data_dir: Optional[str] = None, download_missing: bool = False, log=print) -> Path:
    """The folder holding the Multi30k files (see the module docstring)."""
    for p in _candidates(data_dir):
        if all((p / name).exists() for name in SHA256):
            return p
    cached = cache_dir()
    if all((cached / name).exists() for name in SHA256):
        return cached
    if download_missing:
        return download(cached, log=log)
    raise FileNotFoundError(
        "Multi30k not found: pass --data-dir (a folder with train.de.gz, ...), set SOFTARGMAX_DATA, "
        "or allow the download (--download)"
    )


def read_split(folder: Path, split: str, src_lang: str = "de", tgt_lang: str = "en", verify: bool = False) -> Parallel:
    """One split (``"train"``, ``"val"`` or ``"test"`` = test_2016_flickr) as aligned sentence lists."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    out = []
    for lang in (src_lang, tgt_lang):
        name = f"{SPLITS[split]}.{lang}.gz"
        path = Path(folder) / name
        if verify and _sha256(path) != SHA256[name]:
            raise RuntimeError(f"checksum mismatch for {path}")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out.append([line.rstrip("\n") for line in f])
    if len(out[0]) != len(out[1]):
        raise RuntimeError(f"{split}: {len(out[0])} source lines but {len(out[1])} target lines")
    return Parallel(*out)
