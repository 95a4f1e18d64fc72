"""What every ``softargmax reproduce`` experiment does before and after its own work.

:func:`begin` checks the preset and system names, sets the CPU threads and creates the
output folder; :func:`environment` records the software versions; :func:`finish` writes
``results.json``, the PNG figures and ``report.md``; :func:`code_identity` names the library's
code that ran (a digest of its source files, and the git revision where there is one);
:func:`pyplot` gives matplotlib's
``pyplot`` with a file backend, or ``None`` when matplotlib is not installed (then the
report is written without figures).

Every report ends with the section that :func:`reproducibility` renders: its seeds, what a
rerun with the same seed gives, the spread from seed to seed and how much its timings vary.
:func:`render_existing` writes a report again from its ``results.json`` without rerunning,
and :func:`measurements` is what a rerun with the same seed must repeat exactly.

A run killed at any moment loses nothing.  The machinery for that is here, for every
experiment (the command line uses it around each run):

* files: :func:`atomic_write`, :func:`atomic_json`, :func:`atomic_path` and
  :func:`save_figure` write through a temporary file and ``os.replace``; a full disk raises
  :class:`DiskFullError` ("no space left on device", naming the file);
* the output folder: :class:`OutputLock` keeps a second run out of a folder in use and takes
  over a lock left by a killed one; :func:`set_aside_derived` is ``--fresh``;
* checkpoints: :func:`save_checkpoint` / :func:`load_checkpoint` (atomic, the previous one
  kept, unreadable ones reported and skipped), :func:`fingerprint` and
  :class:`CheckpointMismatchError` (a checkpoint of another run is refused),
  :func:`check_checkpoint_every` (the ``checkpoint_every`` argument of a run), and
  :func:`rng_state` / :func:`set_rng_state` (every random-number state, so that a resumed
  run equals the uninterrupted one);
* run records (:mod:`._records`): :func:`record_path`, :func:`write_record` (atomic) and
  :func:`read_records`, the small JSON file of a finished run that a report is rebuilt from
  without its model, and :class:`RecordMismatchError` (a record of another setup is refused,
  naming the differing fields).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Collection, Iterable, Optional, Sequence, Union

import torch

from ._checkpoints import (
    CheckpointMismatchError,
    check_checkpoint,
    check_checkpoint_every,
    data_digest,
    fingerprint,
    load_checkpoint,
    previous_paths,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from ._files import (
    DiskFullError,
    OutputInUseError,
    OutputLock,
    atomic_json,
    atomic_path,
    atomic_write,
    is_disk_full,
    remove_temporaries,
    save_figure,
)
from ._options import UsageError, check_device, check_seed, check_systems, check_threads
from ._records import RecordError, RecordMismatchError, read_records, record_path, write_record

#: where an experiment's progress lines go (``print``, or the command line's logger)
Log = Callable[[str], object]

__all__ = ["Log", "begin", "describe_device", "environment", "code_identity", "finish", "pyplot", "measurements", "seed_spread",
           "relative_span", "reproducibility", "render_existing", "set_aside_derived", "DERIVED", "PREVIOUS", "INVOCATION_KEYS", "TIMING_KEYS",
           "CheckpointMismatchError", "check_checkpoint", "check_checkpoint_every", "data_digest", "fingerprint", "load_checkpoint",
           "previous_paths", "rng_state", "save_checkpoint", "set_rng_state", "DiskFullError", "OutputInUseError",
           "OutputLock", "atomic_json", "atomic_path", "atomic_write", "is_disk_full", "remove_temporaries",
           "save_figure", "UsageError", "check_device", "check_seed", "check_systems", "check_threads", "RecordError", "RecordMismatchError", "read_records", "record_path", "write_record"]


def begin(preset: str, presets: dict, systems: Collection[str], known: Collection[str], threads: Optional[int], out: str,
          what: str = "the experiment", device: Optional[str] = None) -> tuple[dict, Path, float]:
    """``(preset settings, output folder, start time)``; a bad preset, system, thread count or ``device`` (one this
    PyTorch cannot use, :func:`._options.check_device`; ``None``: not checked) is a :class:`._options.UsageError`
    (a ``ValueError``) that names it, raised before the output folder is created.

    ``what`` names the experiment in the message of an unknown system (``"translation takes softmax, ..."``).
    """
    if preset not in presets:
        raise UsageError("preset", f"give one of {', '.join(sorted(presets))}, got {preset!r}")
    if known or systems:
        check_systems(systems, known, what=what)
    check_threads(threads)
    if device is not None:
        check_device(device)
    if threads:
        torch.set_num_threads(threads)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    return presets[preset], out_dir, time.perf_counter()


def describe_device(device: str = "cpu") -> str:
    """The hardware a run used, for its report: the GPU's name, or the CPU model and threads."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    if str(device) != "cpu":
        return str(device)
    from ..bench.timing import cpu_model

    return f"cpu ({torch.get_num_threads()} threads, {cpu_model()})"


def environment(t_start: float, device: str = "cpu") -> dict:
    """Device, versions and the seconds since ``t_start``, for ``results["settings"]``."""
    import softargmax

    return {"device": describe_device(device), "torch": torch.__version__,
            "softargmax": softargmax.__version__, "python": platform.python_version(),
            "total_seconds": time.perf_counter() - t_start}


def code_identity(root: Union[str, Path, None] = None) -> dict:
    """Which code of the library ran: a digest of its source files, and the git revision where there is one.

    The version number (``softargmax.__version__``) stays the same across commits; this
    names the code itself, so that results produced by different code can be told apart
    (translation's run records store it).  The digest is the SHA-256 of every ``*.py`` and
    ``*.c`` file under ``root``, as installed, in the order of their relative paths, each
    hashed with its path and length.  When ``root`` is tracked in a git checkout and
    ``git`` can be run, ``git_revision`` is the commit checked out and ``git_dirty`` whether
    the files under ``root`` differ from it (uncommitted or untracked changes); without git
    these keys are absent, never an error.  For the installed package (``root=None``) it is
    computed once per process.

    Args:
        root: the folder of the sources (default: the ``softargmax`` package's).

    Returns:
        ``{"digest": first 16 hex digits, "files": number of files}``, plus ``"git_revision"``
        and ``"git_dirty"`` in a git checkout.
    """
    if root is None:
        return dict(_package_identity())
    return _identity(Path(root))


@functools.lru_cache(maxsize=None)
def _package_identity() -> dict:
    import softargmax

    return _identity(Path(softargmax.__file__).resolve().parent)


def _identity(root: Path) -> dict:
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*")
                   if p.suffix in (".py", ".c") and p.is_file())
    h = hashlib.sha256()
    for rel, path in files:
        data = path.read_bytes()
        h.update(rel.encode("utf-8") + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    out: dict = {"digest": h.hexdigest()[:16], "files": len(files)}
    tracked = _git(root, "ls-files", "--", ".")
    if tracked:  # None: no git, or not a checkout; "": a checkout that does not track these files
        revision = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--", ".")
        if revision and status is not None:
            out.update(git_revision=revision, git_dirty=bool(status))
    return out


def _git(folder: Path, *args: str) -> Optional[str]:
    """The output of ``git args`` run in ``folder``, stripped; ``None`` when git is missing or fails."""
    try:
        proc = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=30,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def finish(results: dict, out_dir: Path, write_figures: Callable[[dict, Path], list],
           render_report: Callable[[dict, list], str], log: Log = print, rebuilt_from: Optional[str] = None,
           summary: Optional[Callable[[dict], list]] = None) -> dict:
    """Write ``results.json``, the figures and ``report.md`` into ``out_dir``; returns ``results``.

    Each file is written atomically (:func:`atomic_write`): a run killed here leaves each of
    them either as it was or complete.  The line logged says what was written and the run's
    time; with ``rebuilt_from`` (e.g. ``"the 4 run records"``: a call that ran nothing) it says
    that the report was rebuilt from those instead.  ``summary``, where given, gives the lines that
    close the log: the headline numbers of ``results`` (the experiment's ``summary_lines``).
    """
    atomic_json(out_dir / "results.json", results, indent=1, default=float)
    figures = write_figures(results, out_dir)
    atomic_write(out_dir / "report.md", render_report(results, figures))
    files = f"{out_dir / 'report.md'} (with {out_dir / 'results.json'} and {len(figures)} figures)"
    if rebuilt_from:
        log(f"rebuilt {files} from {rebuilt_from}")
    else:
        minutes = results.get("settings", {}).get("total_seconds", 0.0) / 60
        log(f"wrote {files} in {minutes:.1f} min")
    for line in summary(results) if summary is not None else []:
        log(line)
    return results


def pyplot() -> Optional[ModuleType]:
    """``matplotlib.pyplot`` with the Agg backend, or ``None`` if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


#: keys of ``results.json`` that describe an invocation rather than a measurement: the steps trained by
#: this invocation, the systems it resumed (a run resumed after a kill differs from an uninterrupted one there)
#: and when a run finished (the date in its run record)
INVOCATION_KEYS = frozenset({"steps_this_run", "resumed_from_checkpoint", "finished"})

#: keys of timings whose names do not say "second": times relative to each other, the interleaved timing
TIMING_KEYS = frozenset({"inference_normalized", "speed", "time_to_bleu"})


def measurements(results: dict) -> dict:
    """``results`` without what a rerun cannot repeat: every timing (a key that names seconds, tokens per
    second, or one of ``TIMING_KEYS``), data folders and what describes the invocation (``INVOCATION_KEYS``).

    Two runs with the same seed, preset, thread count and machine give equal ``measurements``
    (the experiments' tests check it on the ``smoke`` presets), and so does a run killed and
    resumed from its checkpoints (translation's test).
    """
    if isinstance(results, dict):
        return {k: measurements(v) for k, v in results.items()
                if "second" not in k and k != "folder" and k not in INVOCATION_KEYS and k not in TIMING_KEYS}
    if isinstance(results, list):
        return [measurements(v) for v in results]
    return results


def seed_spread(stds: Sequence[float], seeds: int, unit: str, over: str) -> str:
    """``"standard deviation over the 3 seeds 0.33–0.51 points across the 5 losses (...)"``."""
    lo, hi = min(stds), max(stds)
    span = f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"
    return f"standard deviation over the {seeds} seeds {span} {unit} across {over} (the ± in the tables)."


def relative_span(values: Sequence[float]) -> float:
    """``(max − min) / mean`` of repeated timings of one thing."""
    values = [float(v) for v in values]
    return (max(values) - min(values)) / (sum(values) / len(values))


def reproducibility(settings: dict, rerun_tested: bool = False, rerun: Optional[str] = None,
                    spread: Optional[str] = None, timings: Optional[str] = None,
                    resume_test: Optional[str] = None) -> list:
    """The lines of a report's "Reproducibility" section, from ``results["settings"]`` and the experiment's sentences.

    ``rerun_tested``: a test reruns the experiment's ``smoke`` preset with the same seed and
    finds identical :func:`measurements`; ``rerun``, when given, says instead what rerunning
    this report's preset measured.  ``spread``: the seed-to-seed spread (``None``: one seed, not measured).
    ``timings``: how much the report's timings vary (``None``: it shows none but the run time).
    ``resume_test``: a sentence naming the test that kills and resumes runs of the experiment
    and what it shows (which preset and systems; ``None``: no test does); the section then
    says whether this run was resumed (``settings["resumed_from_checkpoint"]``) and that sentence.
    Without a test and without a resumed run the section says nothing about resuming.
    """
    seeds = settings.get("seeds") or [settings.get("seed", 0)]
    preset = settings.get("preset", "default")
    where = (f"ran on {settings['device']}" if settings.get("device") else
             "its device and thread count were not recorded")
    if rerun:
        same = rerun
    elif rerun_tested and preset == "smoke":
        same = "identical numbers, timings aside: a test reruns this preset and compares every measurement."
    elif rerun_tested:
        same = (f"not measured for this `{preset}` run; on the `smoke` preset a test reruns the experiment and gets "
                "identical numbers, timings aside.")
    else:
        same = "not measured: neither this run nor a test was repeated with the same seed."
    lines = ["", "## Reproducibility", "",
             f"- **Seed{'s' if len(seeds) > 1 else ''}:** {', '.join(map(str, seeds))}; preset `{preset}`; {where}.",
             f"- **Rerun with the same seed, preset, thread count and machine:** {same}",
             "- **From seed to seed:** " + (spread or "not measured: this report rests on one seed."),
             "- **Timings:** " + (timings or ("none in this report apart from the run's total time, which was not "
                                             "compared between runs." if "total_seconds" in settings else
                                             "none in this report."))]
    resumed = settings.get("resumed_from_checkpoint") or []
    this = (f"this run resumed the training of {', '.join(resumed)} from checkpoints; " if resumed else
            "this run was not resumed; " if resume_test else "")
    if resume_test:
        lines.append(f"- **Killed and resumed:** {this}{resume_test}")
    elif resumed:
        lines.append(f"- **Killed and resumed:** {this}no test compares a resumed run of this experiment with an "
                     "uninterrupted one.")
    return lines


#: what a run derives in its output folder (``--fresh`` sets it aside): the training checkpoints; an experiment adds
#: its own (a learned tokenizer, caches, run records) in a ``DERIVED`` of its module
DERIVED = ("runs",)

#: the folders ``--fresh`` moves earlier runs' files into: ``<out>/previous-YYYYmmdd-HHMMSS``
PREVIOUS = "previous-"


def set_aside_derived(out: Union[str, Path], names: Iterable[str] = DERIVED,
                      when: Optional[time.struct_time] = None) -> tuple[Optional[Path], list[str]]:
    """``--fresh``: move what earlier runs derived in ``out`` (the named files and folders of an experiment's
    ``DERIVED``: checkpoints, run records, caches; and ``log.txt``) into a new folder
    ``out/previous-YYYYmmdd-HHMMSS`` (``-2``, ``-3``, ... when that exists), and delete the temporary files of
    killed writers.  Nothing else is deleted.

    Each item moves with one ``os.rename`` within the folder (atomic on one file system): a run killed while
    they move leaves every item either where it was or in the new folder, never lost or half moved.
    ``results.json``, ``report.md`` and the figures stay until the new run replaces them (atomically): a fresh
    run that fails leaves the last complete report.  Hold the folder's :class:`OutputLock` while calling it.

    Returns:
        ``(folder, names moved)``; ``(None, [])`` when there was nothing to move (no folder is created).
    """
    out_dir = Path(out)
    remove_temporaries(out_dir)
    found = [n for n in dict.fromkeys([*names, "log.txt"])
             if (out_dir / n).exists() or (out_dir / n).is_symlink()]
    if not found:
        return None, []
    stamp = time.strftime("%Y%m%d-%H%M%S", when or time.localtime())
    for k in range(1, 1000):
        folder = out_dir / f"{PREVIOUS}{stamp}{f'-{k}' if k > 1 else ''}"
        try:
            folder.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"out: {out_dir}/{PREVIOUS}{stamp}-1 to -999 all exist; delete the old ones")
    for name in found:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)  # a name with a folder in it keeps its place
        os.rename(out_dir / name, target)
    return folder, found


def render_existing(out: str, render_report: Callable[[dict, list], str],
                    write_figures: Optional[Callable[[dict, Path], list]] = None) -> Path:
    """Write ``report.md`` in ``out`` again from its ``results.json``, without rerunning the experiment.

    With ``write_figures`` (an experiment whose figures are drawn from ``results`` alone) the
    figures are drawn again too; otherwise they are the ones already in ``out``: those the
    current report shows (in its order), or every PNG there when it has no report yet.
    Returns the report's path.
    """
    out_dir = Path(out)
    path = out_dir / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"out: no results.json in {out_dir} to render a report from")
    results = json.loads(path.read_text())
    report = out_dir / "report.md"
    if write_figures is not None:
        figures = write_figures(results, out_dir)
    elif report.exists():
        named = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", report.read_text())
        figures = [f for f in dict.fromkeys(named) if (out_dir / f).is_file()]
    else:
        figures = sorted(p.name for p in out_dir.glob("*.png"))
    atomic_write(report, render_report(results, figures))
    return report
