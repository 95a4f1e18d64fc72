"""Run records: what a finished training run keeps for its report, small enough to commit and to carry between machines.

A training run's checkpoints (hundreds of MB at Transformer-base size) stay on the machine
that trained it; its *run record* is a JSON file of a few hundred kB that holds everything
the report needs without the model.  An experiment writes one record per finished run into
``<out>/records/`` (a tracked folder, unlike ``<out>/runs/``) and rebuilds its results from
all the records there, so runs trained in different sessions, on different machines, merge
into one report.

* :func:`record_path` names a run's record: ``records/<system>-seed<n>.json``, one file per
  (system, seed), so a rerun of the same pair replaces the older record.
* :func:`write_record` writes it atomically (:func:`._files.atomic_json`); :func:`read_records`
  reads every record of a folder and refuses files that are not records.
* :func:`check_records` reads them all and refuses one of another setup (or two of one run);
* :func:`differences` lists the fields in which two records' setups differ, by dotted path;
  :class:`RecordMismatchError` (a :class:`RecordError`) carries them in its message ("preset is 'smoke' there and
  'gpu' in this run").
* :func:`pack` / :func:`unpack` store a long list of numbers (a statistic per decoding step)
  as zlib-compressed, base64-encoded little-endian binary.
"""

from __future__ import annotations

import array
import base64
import json
import sys
import zlib
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from ._checkpoints import as_json_data, describe_differences
from ._files import atomic_json

#: the layout of a run record (its ``"format"`` field)
FORMAT = 1

#: the folder of an output folder that holds its run records
FOLDER = "records"

#: the element types :func:`pack` stores: ``array`` type code and size in bytes
_TYPES = {"int32": ("i", 4), "float32": ("f", 4), "float64": ("d", 8)}


class RecordError(ValueError):
    """A folder's run records cannot be used as they are: the message names the file and what to do."""


class RecordMismatchError(RecordError):
    """A run record belongs to another experiment setup: its fields differ as the message says.

    ``fields`` maps each differing field (a dotted path, e.g. ``"overrides.train_cfg.steps"``)
    to ``(value in the record, value it was compared with)``; ``other`` names what it was
    compared with (``"this run"`` or another record's path).
    """

    def __init__(self, path: Union[str, Path], fields: dict, other: str = "this run"):
        self.path, self.fields, self.other = Path(path), fields, other
        what = describe_differences(fields, other)
        super().__init__(f"run record {self.path} belongs to another experiment setup: {what}. Records are merged only "
                         "when their experiment, preset, overrides, settings, data and vocabulary agree: move it out of "
                         f"{self.path.parent}, or pass another --out")


def record_path(out_dir: Union[str, Path], system: str, seed: int) -> Path:
    """The record of the run of ``system`` with ``seed`` in the output folder ``out_dir``.

    Args:
        out_dir: the experiment's output folder.
        system: the system's name (a ``:`` in it becomes ``_`` in the file name).
        seed: the run's seed.

    Returns:
        ``out_dir/records/<system>-seed<seed>.json``.

    Example:
        >>> record_path("reports/translation-gpu", "entmax15", 2).as_posix()
        'reports/translation-gpu/records/entmax15-seed2.json'
    """
    return Path(out_dir) / FOLDER / f"{system.replace(':', '_')}-seed{seed}.json"


def write_record(path: Union[str, Path], record: dict) -> Path:
    """Write ``record`` (JSON-like data with a ``"format"`` field) to ``path`` atomically; returns ``path``.

    A run killed while writing leaves the previous record (or none), never half a file.
    Floats that JSON cannot hold as numbers (NumPy scalars) are written as floats.

    Args:
        path: the record's file, usually :func:`record_path`.
        record: the record.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"record must be a dict with format {FORMAT}, got {type(record).__name__}")
    return atomic_json(path, record, indent=1, ensure_ascii=False, default=float)


def read_records(out_dir: Union[str, Path]) -> list[tuple[Path, dict]]:
    """Every run record in ``out_dir/records``, as ``(path, record)`` sorted by file name.

    Hidden files (the temporary files of killed writers) are skipped.  A file that is not
    a record of this layout raises :class:`RecordError` naming it.

    Args:
        out_dir: the experiment's output folder.

    Returns:
        ``[(path, record), ...]``; empty when the folder has no records.
    """
    folder = Path(out_dir) / FOLDER
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise RecordError(f"run record {path} cannot be read: {e}") from e
        if not isinstance(record, dict) or record.get("format") != FORMAT or "fingerprint" not in record:
            raise RecordError(f"{path} is not a run record (format {FORMAT} with a fingerprint): move it out of {folder}")
        out.append((path, record))
    return out


def differences(saved: Any, expected: Any, prefix: str = "") -> dict:
    """The fields in which ``saved`` differs from ``expected``, by dotted path: ``{path: (saved, expected)}``.

    Dictionaries are compared key by key (a key missing on one side counts as ``None``);
    anything else is compared whole, after a JSON round trip (so a tuple equals its list).

    Args:
        saved: the value found (e.g. a record's setup).
        expected: the value it should have.
        prefix: the path of ``saved`` itself (``""`` at the top).

    Returns:
        ``{dotted path: (saved value, expected value)}``, empty when they agree.

    Example:
        >>> differences({"preset": "gpu", "overrides": {"train": 10}}, {"preset": "gpu", "overrides": {"train": 20}})
        {'overrides.train': (10, 20)}
    """
    if isinstance(saved, dict) and isinstance(expected, dict):
        out: dict = {}
        for key in list(expected) + [k for k in saved if k not in expected]:
            out.update(differences(saved.get(key), expected.get(key), f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {} if as_json_data(saved) == as_json_data(expected) else {prefix or "record": (saved, expected)}


def check_records(out_dir: Union[str, Path], setup: Optional[dict] = None) -> dict:
    """The run records of ``out_dir``, checked: ``{(system, seed): (path, record)}``.

    Args:
        out_dir: the output folder.
        setup: what every record's ``setup`` must equal (the experiment's setup of this run);
            default: the first record's.

    Returns:
        the records by run.

    Raises:
        RecordMismatchError: a record of another setup (the message names the file and
            the differing fields).
        RecordError: two records of the same run, or a file in ``records/`` that is not a
            record.
    """
    found: dict[tuple[str, int], tuple[Path, dict]] = {}
    other, expected = "this run", setup
    for path, rec in read_records(out_dir):
        if expected is None:
            other, expected = str(path), rec.get("setup")
        if not isinstance(rec.get("setup"), dict):
            raise RecordMismatchError(path, {"setup": (None, "present")}, other)
        diff = differences(rec["setup"], expected)
        if diff:
            shown = dict(list(diff.items())[:6])
            if len(diff) > len(shown):
                shown[f"and {len(diff) - len(shown)} more fields, e.g. {list(diff)[len(shown)]}"] = ("…", "…")
            raise RecordMismatchError(path, shown, other)
        key = (str(rec["system"]), int(rec["seed"]))
        if key in found:
            raise RecordError(f"run records {found[key][0]} and {path} are both of {key[0]} seed {key[1]}: keep one")
        found[key] = (path, rec)
    return found


def pack(values: Sequence[float], dtype: str) -> dict:
    """``values`` as ``{"dtype", "n", "zlib_base64"}``: little-endian binary, zlib-compressed, base64 text.

    Args:
        values: the numbers.
        dtype: ``"int32"``, ``"float32"`` (about 7 significant digits) or ``"float64"`` (exact).

    Returns:
        the packed form, which :func:`unpack` turns back into a list.

    Example:
        >>> unpack(pack([1, 2, 3], "int32"))
        [1, 2, 3]
    """
    if dtype not in _TYPES:
        raise ValueError(f"dtype must be one of {sorted(_TYPES)}, got {dtype!r}")
    code, size = _TYPES[dtype]
    data = array.array(code, values)
    assert data.itemsize == size  # the sizes of C's int, float and double on every platform torch supports
    if sys.byteorder != "little":
        data.byteswap()
    return {"dtype": dtype, "n": len(data), "zlib_base64": base64.b64encode(zlib.compress(data.tobytes(), 9)).decode()}


def unpack(packed: dict) -> list:
    """The list of numbers that :func:`pack` stored.

    Args:
        packed: the output of :func:`pack`.

    Returns:
        a list of ints (``int32``) or floats.
    """
    if not isinstance(packed, dict) or packed.get("dtype") not in _TYPES:
        raise ValueError(f"packed must be the output of pack(), got {packed!r:.80}")
    code, _ = _TYPES[packed["dtype"]]
    data = array.array(code)
    data.frombytes(zlib.decompress(base64.b64decode(packed["zlib_base64"])))
    if sys.byteorder != "little":
        data.byteswap()
    if len(data) != packed["n"]:
        raise ValueError(f"packed: {len(data)} values where {packed['n']} were stored")
    return data.tolist()
