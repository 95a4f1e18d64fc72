"""Checkpoints that resume a training run exactly, and refuse to resume another run's state.

A checkpoint is one file written by :func:`save_checkpoint`:
``{"format": 1, "fingerprint": {...}, "state": {...}}``, saved with ``torch.save`` through
:func:`._files.atomic_path` (a kill or a full disk never leaves a truncated file).  The
previous checkpoint is kept beside it (``checkpoint.prev.pt`` for ``checkpoint.pt``), so
that a file damaged after it was written still leaves one to resume from.

* **Exact resumption.**  ``state`` is whatever the training loop needs, and it must hold
  every random-number state that training consumes: :func:`rng_state` captures Python's
  ``random``, NumPy's global generator, PyTorch's CPU generator and, when CUDA is in use,
  every CUDA generator; :func:`set_rng_state` restores them.  With the model, the
  optimizer, the schedule, the data position and these states restored, the steps after a
  resume draw the same dropout masks and batches as the uninterrupted run, which then
  matches it bit for bit on the same machine and thread count.
* **Fingerprint.**  :func:`fingerprint` names the run a checkpoint belongs to (experiment,
  preset, system, seed, a digest of the data's SHA-256 table, the softargmax version, and
  anything else the caller adds).  :func:`load_checkpoint` and :func:`check_checkpoint`
  raise :class:`CheckpointMismatchError`, naming each differing field, for a checkpoint
  of another run.
* **Damage.**  A checkpoint that cannot be read, or whose records fail their CRC-32 check
  (flipped bytes that ``torch.load`` alone would read as wrong weights), is reported by path and moved aside
  (``<name>.unreadable``); :func:`load_checkpoint` then falls back to the previous one, or
  returns ``None`` (train from scratch), and says which in its log.

Checkpoints are read with ``torch.load(weights_only=True)``: tensors, numbers, strings,
lists, tuples and dicts only, so loading one runs no code from the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import torch

from ._files import atomic_path

#: the layout of the checkpoint files written by :func:`save_checkpoint`
FORMAT = 1


class CheckpointMismatchError(ValueError):
    """A checkpoint belongs to another run: its fingerprint differs in the fields the message names.

    ``fields`` maps each differing field to ``(value in the checkpoint, value of this run)``.
    """

    def __init__(self, path: Union[str, Path], fields: dict):
        self.path, self.fields = Path(path), fields
        if "fingerprint" in fields:
            what = "it was written by an older softargmax, without a fingerprint"
        else:
            what = describe_differences(fields)
        super().__init__(f"checkpoint {self.path} belongs to another run: {what}. Delete {self.path.parent} to train "
                         "that run from scratch (--fresh moves everything earlier runs derived in the output folder aside), "
                         "or run again with the settings they were trained with")


def describe_differences(fields: dict, other: str = "this run") -> str:
    """``"seed is 1 there and 2 in this run; ..."``: the fields ``{name: (saved, expected)}`` that differ, in words
    (``None`` reads "absent"); the messages of refused checkpoints and run records."""
    show = lambda value: "absent" if value is None else repr(value)  # noqa: E731
    return "; ".join(f"{k} is {show(a)} there and {show(b)} in {other}" for k, (a, b) in fields.items())


def as_json_data(obj: object) -> Any:
    """``obj`` as JSON would give it back (tuples become lists), so that fingerprints and setups compare as data."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def data_digest(names: Iterable[str]) -> dict:
    """``{dataset: digest}`` of the SHA-256 tables of the named datasets (``experiments.datasets.DATASETS``).

    A run reads a dataset only after its files matched that table, so the digest stands for
    the data themselves; the first 16 hex digits of the SHA-256 of the sorted table.
    """
    from .datasets import DATASETS

    out = {}
    for name in names:
        table = json.dumps(sorted(DATASETS[name].sha256.items())).encode()
        out[name] = hashlib.sha256(table).hexdigest()[:16]
    return out


def fingerprint(experiment: str, preset: str, system: str, seed: int, data: Iterable[str] = (),
                **extra: object) -> dict:
    """What identifies a training run, stored in each of its checkpoints.

    Args:
        experiment: the experiment's command-line name (``"translation"``).
        preset: the preset's name.
        system: the system (output layer, loss, ...) the checkpoint trains.
        seed: its seed.
        data: the datasets it reads (names in ``experiments.datasets.DATASETS``), recorded
            by :func:`data_digest`.
        **extra: further fields that must agree (e.g. ``overrides``); JSON-like values.

    Returns:
        ``{"experiment", "preset", "system", "seed", "data", "softargmax", **extra}`` as
        plain JSON data.

    Example:
        >>> fp = fingerprint("translation", "smoke", "softmax", 0, data=["multi30k"])
        >>> sorted(fp)
        ['data', 'experiment', 'preset', 'seed', 'softargmax', 'system']
    """
    import softargmax

    return as_json_data({"experiment": experiment, "preset": preset, "system": system, "seed": seed,
                   "data": data_digest(data), "softargmax": softargmax.__version__, **extra})


def check_checkpoint_every(checkpoint_every: object) -> None:
    """``ValueError`` unless ``checkpoint_every`` (a run's extra checkpoint interval, in steps) is ``None`` or a positive integer."""
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 1):
        raise ValueError(f"checkpoint_every must be a positive integer or None, got {checkpoint_every!r}")


def _differences(saved: Any, expected: dict) -> dict:
    if not isinstance(saved, dict):
        return {"fingerprint": (None, "present")}
    saved, expected = as_json_data(saved), as_json_data(expected)
    return {k: (saved.get(k), expected.get(k)) for k in list(expected) + [k for k in saved if k not in expected]
            if saved.get(k) != expected.get(k)}


def previous_paths(path: Union[str, Path], keep: int = 2) -> list:
    """The files of a checkpoint, newest first: ``path``, then ``<stem>.prev<suffix>``, ``<stem>.prev2<suffix>``, ..."""
    path = Path(path)
    return [path] + [path.with_name(f"{path.stem}.prev{'' if i == 1 else i}{path.suffix}") for i in range(1, keep)]


def save_checkpoint(path: Union[str, Path], state: dict, fingerprint: dict, keep: int = 2) -> Path:
    """Write a checkpoint atomically, keeping the ``keep - 1`` previous ones; returns ``path``.

    The new file is complete on the disk before it replaces ``path``; the checkpoint it
    replaces becomes ``<stem>.prev<suffix>`` (with ``keep=2``, the default).  A full disk
    raises :class:`._files.DiskFullError` and leaves the existing checkpoints as they were.

    Args:
        path: the checkpoint file (e.g. ``runs/softmax/checkpoint.pt``).
        state: what to save: tensors, numbers, strings, lists, tuples and dicts
            (``state_dict()`` of models and optimizers, :func:`rng_state`, ...).
        fingerprint: the run's :func:`fingerprint`.
        keep: how many checkpoints to keep, this one included (at least 1).
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    path = Path(path)
    files = previous_paths(path, keep)
    with atomic_path(path) as tmp:
        torch.save({"format": FORMAT, "fingerprint": as_json_data(fingerprint), "state": state}, tmp)
        # the new file is complete: shift the older ones (oldest dropped) just before it replaces `path`
        for newer, older in reversed(list(zip(files, files[1:]))):
            if newer.exists():
                os.replace(newer, older)
    return path


def _read(path: Path, map_location: Any) -> dict:
    # torch.load does not check the CRC-32 of each record of the archive: flipped bytes inside a
    # tensor would load as wrong weights.  Reading the archive once more costs about 0.5 s per GB.
    with zipfile.ZipFile(path) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise ValueError(f"damaged: the CRC-32 of its record {bad} does not match")
    blob = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(blob, dict):
        raise ValueError("not a checkpoint (no dict at its top)")
    return blob


def check_checkpoint(path: Union[str, Path], fingerprint: dict, keep: int = 2) -> None:
    """Raise :class:`CheckpointMismatchError` if a readable checkpoint at ``path`` (or a previous one) is another run's.

    Reads only the fingerprints (the tensors are memory-mapped, not read), so a run can check
    all its checkpoints before it starts; unreadable files are left to :func:`load_checkpoint`.
    """
    for candidate in previous_paths(path, keep):
        if not candidate.is_file():
            continue
        try:
            blob = torch.load(candidate, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - damaged: load_checkpoint reports it
            continue
        diff = _differences(blob.get("fingerprint") if isinstance(blob, dict) else None, fingerprint)
        if diff:
            raise CheckpointMismatchError(candidate, diff)


def load_checkpoint(path: Union[str, Path], fingerprint: dict, map_location: Any = None, log: Callable[[str], object] = print,
                    keep: int = 2, set_aside: bool = True, label: str = "") -> Optional[dict]:
    """The ``state`` of the newest readable checkpoint at ``path`` of this run, or ``None`` if there is none.

    Tries ``path`` and then the previous checkpoints (:func:`previous_paths`).  A file that
    cannot be read (truncated, damaged, not a checkpoint) is logged with its path and the
    error, and moved aside to ``<name>.unreadable`` (when ``set_aside``; under several
    processes only one should move files); the log then says whether the run resumes from a
    previous checkpoint or starts from scratch.  A readable checkpoint whose fingerprint
    differs from ``fingerprint`` raises :class:`CheckpointMismatchError`, which names the
    fields.

    Args:
        path: the checkpoint file given to :func:`save_checkpoint`.
        fingerprint: this run's :func:`fingerprint`.
        map_location: as for ``torch.load``.
        log: where the messages go.
        keep: as given to :func:`save_checkpoint`.
        set_aside: move unreadable files aside.
        label: prefix of the log lines (e.g. ``"[softmax] "``).
    """
    unreadable: list[Path] = []
    for candidate in previous_paths(path, keep):
        if not candidate.is_file():
            continue
        try:
            blob = _read(candidate, map_location)
        except Exception as e:  # noqa: BLE001 - any failure to read is reported the same way
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            where = ""
            if set_aside:
                aside = candidate.with_name(candidate.name + ".unreadable")
                with contextlib.suppress(OSError):
                    os.replace(candidate, aside)
                    where = f"; moved to {aside}"
            log(f"{label}checkpoint {candidate} cannot be read ({type(e).__name__}: {reason}){where}")
            unreadable.append(candidate)
            continue
        diff = _differences(blob.get("fingerprint"), fingerprint)
        if diff:
            raise CheckpointMismatchError(candidate, diff)
        if blob.get("format") != FORMAT or not isinstance(blob.get("state"), dict):
            raise CheckpointMismatchError(candidate, {"format": (blob.get("format"), FORMAT)})
        if unreadable:
            log(f"{label}resuming from the previous checkpoint {candidate} instead")
        return blob["state"]
    if unreadable:
        log(f"{label}no readable checkpoint left in {Path(path).parent}: training from scratch")
    return None


def rng_state() -> dict:
    """Every global random-number state: Python's ``random``, NumPy's, PyTorch's CPU and (when used) CUDA generators.

    The result holds only tensors, numbers, tuples and lists, so it can be saved in a
    checkpoint and read back with ``weights_only=True``.  CUDA states are included when CUDA
    has been initialized in this process.  Generators an experiment creates itself
    (``torch.Generator``, ``random.Random``) are not global: save their states beside it.

    Example:
        >>> state = rng_state()
        >>> a = torch.rand(3)
        >>> set_rng_state(state)
        >>> bool((torch.rand(3) == a).all())
        True
    """
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        legacy = np.random.get_state()
        assert isinstance(legacy, tuple)  # the global generator is a Mersenne Twister: its state is a tuple
        kind, keys, pos, has_gauss, cached = legacy
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore the generators that :func:`rng_state` captured (those missing from ``state`` are left alone)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.cpu().numpy().astype("uint32"), pos, has_gauss, cached))
    if state.get("cuda") and torch.cuda.is_available():
        for index, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), index)
