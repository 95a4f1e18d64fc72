"""Multi30k German-English (task 1): local files first, a checksum-verified download otherwise.

The files are the raw gzipped captions of github.com/multi30k/dataset (``data/task1/raw``),
one sentence per line, aligned by line.  The folder is found (or downloaded and checked
against SHA-256 sums) as :mod:`softargmax.experiments.datasets` describes.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .. import datasets
from ..datasets import DATASETS

SHA256 = DATASETS["multi30k"].sha256

SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}


@dataclass
class Parallel:
    """Aligned source and target sentences of one split."""

    src: list
    tgt: list

    def __len__(self) -> int:
        return len(self.src)

    def head(self, n: Optional[int]) -> "Parallel":
        return self if n is None else Parallel(self.src[:n], self.tgt[:n])


def cache_dir() -> Path:
    return datasets.cache_dir("multi30k")


def download(target_dir: Optional[Path] = None, log: Callable[[str], object] = print) -> Path:
    """Download the six files into ``target_dir`` (default: the cache) and verify their checksums."""
    return datasets.download("multi30k", target_dir, log=log)


def find(data_dir: Optional[str] = None, download_missing: bool = False,
         log: Callable[[str], object] = print) -> Path:
    """The folder holding the Multi30k files (see :mod:`softargmax.experiments.datasets`)."""
    return datasets.find("multi30k", data_dir, download_missing=download_missing, log=log)


def read_split(folder: Path, split: str, src_lang: str = "de", tgt_lang: str = "en", verify: bool = False) -> Parallel:
    """One split (``"train"``, ``"val"`` or ``"test"`` = test_2016_flickr) as aligned sentence lists.

    ``verify=True`` checks the split's two files against their SHA-256 sums first
    (:func:`softargmax.experiments.datasets.verify`); :func:`find` has verified the whole folder.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    names = [f"{SPLITS[split]}.{lang}.gz" for lang in (src_lang, tgt_lang)]
    if verify:  # raises datasets.DataError naming the file (find() has checked them already)
        datasets.verify("multi30k", folder, files=names)
    out = []
    for name in names:
        with gzip.open(Path(folder) / name, "rt", encoding="utf-8") as f:
            out.append([line.rstrip("\n") for line in f])
    if len(out[0]) != len(out[1]):
        raise RuntimeError(f"{split}: {len(out[0])} source lines but {len(out[1])} target lines")
    return Parallel(*out)
