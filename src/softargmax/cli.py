"""Command line: ``softargmax bench``, ``softargmax reproduce``, ``softargmax --version`` (also
``python -m softargmax ...``)."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, NoReturn, Optional, Sequence, TextIO


def _shape(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 64x32000, got {text!r}") from None
    if rows <= 0 or cols <= 0:
        raise argparse.ArgumentTypeError(f"shape must be positive, got {text!r}")
    return rows, cols


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a mistake reported in one line, ``error: ...`` (exit status 2), without the usage
    block (``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _checked(check: str, what: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``int(text)`` (else the text) passed to ``check``, the name of a run-argument check of
    :mod:`.experiments._options`, whose message becomes argparse's (imported when an option is given)."""
    def parse(text: str) -> Any:
        from .experiments import _options

        try:
            value: Any = int(text)
        except ValueError:
            value = text
        try:
            return getattr(_options, check)(value, what)
        except _options.UsageError as e:
            raise argparse.ArgumentTypeError(e.message) from None

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def _device(text: str) -> str:
    """``--device``: one this PyTorch can use (:func:`.experiments._options.check_device`)."""
    from .experiments._options import UsageError, check_device

    try:
        return check_device(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _bench_module() -> ModuleType:
    """:mod:`softargmax.bench`, imported when a ``bench`` command needs it (it imports torch and the library)."""
    from . import bench

    return bench


def _operator(text: str) -> str:
    """A ``bench --ops`` item: an operator the benchmark times (:data:`.bench.operators.OPERATORS`)."""
    names = _bench_module().OPERATORS
    if text not in names:
        raise argparse.ArgumentTypeError(f"unknown operator {text!r}; accepted: {', '.join(names)}")
    return text


def _folder(text: str) -> str:
    """``--data-dir``: an existing folder."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is {'a file, not' if path.exists() else 'not'} a folder; give the "
                                         "folder that holds the dataset (or leave --data-dir out: the data are then "
                                         "looked for in $SOFTARGMAX_DATA, ../shared/data, ./data and the cache, and "
                                         "downloaded)")
    return text


def _run_pair(text: str) -> str:
    """A ``--runs`` item: ``SYSTEM:SEED`` (the seed after the last ``:``, so ``f:kl:1`` works)."""
    from .experiments.nmt.plan import parse_runs

    try:
        parse_runs([text])
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like SYSTEM:SEED (e.g. softmax:1), got {text!r}") from None
    return text


def version_string() -> str:
    """``softargmax <version> (torch <version>)``: what ``softargmax --version`` prints."""
    import torch

    from . import __version__

    return f"softargmax {__version__} (torch {torch.__version__})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="softargmax", description="softargmax: sparse and f-divergence softargmax operators")
    parser.add_argument("--version", action="version", version=version_string(),
                        help="print softargmax's and torch's versions and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="time the operators against torch.softmax (and the entmax package)")
    b.add_argument("--quick", action="store_true", help="small shapes and few repeats (a smoke run)")
    b.add_argument("--losses", action="store_true", help="time the losses against F.cross_entropy and the fused output layer")
    b.add_argument("--attention", action="store_true", help="time sparse attention against scaled_dot_product_attention")
    b.add_argument("--shapes", type=_shape, nargs="+", help="row x column sizes, e.g. 64x32000 256x1000")
    b.add_argument("--ops", nargs="+", type=_operator, metavar="OP",
                   help="operators to time (default: all; an unknown name is refused with the list of them)")
    b.add_argument("--pass", dest="passes", choices=["fwd", "fwd+bwd", "both"], default="both")
    b.add_argument("--threads", type=_checked("check_threads", "threads"), default=2, help="torch CPU threads (default 2)")
    b.add_argument("--repeats", type=_checked("check_count", "repeats"), default=None,
                   help="timed calls per case (median reported)")
    b.add_argument("--device", type=_device, default="cpu", help="cpu or cuda")
    b.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    b.add_argument("--no-package", action="store_true", help="do not time the reference entmax package")
    b.add_argument("--json", dest="json_path", help="write the results to this JSON file")
    r = sub.add_parser(
        "reproduce", help="run a reproduction experiment and write its report",
        description="Run a reproduction experiment and write results.json, report.md, PNG figures and log.txt into "
        "--out (default runs/<experiment>). Data found in no local folder are downloaded (--offline: never). Every file is written atomically (a killed run leaves the previous version or the new one, never "
        "half a file), and log.txt is appended to, each run after a line that says when and how it started. A full "
        "disk stops the run with 'no space left on device' and the file's name. One run at a "
        "time per --out: a second run into a folder in use stops at once, and a lock left by a killed run is taken "
        "over. Training experiments (translation, adaptive-attention, lm) keep checkpoints in <out>/runs: a run killed "
        "at any moment (Ctrl-C and SIGTERM save a checkpoint first) continues when the same command is run again, and "
        "gives the numbers of an uninterrupted run; the line printed then is the command that continues. Every option is "
        "checked before any work: a mistake, and every other error, is one line 'error: ...' with exit status 2 "
        "(--debug: the traceback).")
    from .experiments import EXPERIMENTS, PRESET_NAMES

    r.add_argument("experiment", choices=list(EXPERIMENTS))
    common = sorted(set.intersection(*(set(p) for p in PRESET_NAMES.values())), key=["smoke", "default"].index)
    extra = "; ".join(f"{name} also {', '.join(p for p in presets if p not in common)}"
                      for name, presets in PRESET_NAMES.items() if set(presets) - set(common))
    r.add_argument("--preset", choices=sorted({p for v in PRESET_NAMES.values() for p in v}, key=["smoke", "default",
                   "full", "gpu", "gpu-1call"].index), default="default", metavar="PRESET",
                   help=f"the run's size (default: default, sized for a CPU with two cores): every experiment takes "
                   f"{' and '.join(common)} (smoke: seconds, as in the tests); {extra} (translation's gpu: "
                   "Transformer-base on one GPU, 3 seeds; translation's gpu-1call: the same model, 500 steps, the "
                   "four systems of one seed in one call; translation's full: the paper's schedule; lm's gpu: a wider, "
                   "deeper decoder with learned q; lm's full: the default with every loss and learned q)")
    r.add_argument("--data-dir", type=_folder, help="folder with the dataset (default: $SOFTARGMAX_DATA, ../shared/data, ./data, cache)")
    net = r.add_mutually_exclusive_group()
    net.add_argument("--offline", action="store_true",
                     help="never download: use local data only (by default data found in no local folder are "
                     "downloaded from their public source, with a progress bar, and checked against their SHA-256)")
    net.add_argument("--download", action="store_true", help="download missing data (the default; kept for scripts)")
    r.add_argument("--out", help="output folder (default: runs/<experiment>, which git ignores; the committed reference "
                   "reports in reports/<experiment> are never written unless named here)")
    r.add_argument("--device", type=_device, default=None,
                   help="where the models run: cpu (default), cuda, cuda:1, ... (the timings in the report are this "
                   "device's; translation, adaptive-attention and lm: the others run on the CPU)")
    r.add_argument("--seed", type=_checked("check_seed", "seed"), default=None,
                   help="the random seed of initialization, dropout and data order (default 0); presets with several "
                   "seeds (translation's gpu) use --seeds or their own")
    fresh = r.add_mutually_exclusive_group()
    fresh.add_argument("--resume", action="store_true",
                       help="continue from the training checkpoints in <out>/runs (translation, adaptive-attention, lm; "
                       "also what a run does by default when it finds checkpoints); "
                       "they must come from a run with the same experiment, preset, systems, seed, data and softargmax "
                       "version (else an error names what differs); an unreadable checkpoint is reported and the "
                       "previous one, or training from scratch, is used instead")
    fresh.add_argument("--fresh", action="store_true",
                       help="start over: move what earlier runs derived in <out> (checkpoints in runs/, translation's "
                       "and lm's run records in records/, the learned tokenizer, caches, log.txt) into "
                       "<out>/previous-YYYYmmdd-HHMMSS/ (one line says so; nothing is deleted, and no question is "
                       "asked); the report is then built from this call's runs alone; results.json, report.md and "
                       "figures are replaced when the run ends. To train one translation run again and keep the "
                       "other records, use --runs SYSTEM:SEED instead")
    fresh.add_argument("--render-only", action="store_true",
                       help="run nothing: write <out>/report.md again from <out>/results.json, and its figures where "
                       "they come from results.json alone (translation: results.json, the figures and report.md are "
                       "rebuilt from the run records in <out>/records when there are any; else the figures already "
                       "there are kept)")
    r.add_argument("--seeds", type=_checked("check_seed", "seed"), nargs="+", help="translation: train every system once per seed "
                   "(default: the preset's seeds, else --seed)")
    r.add_argument("--runs", type=_run_pair, nargs="+", metavar="SYSTEM:SEED",
                   help="translation, lm: train these runs only (e.g. softmax:1 entmax15:2; lm: kl:0 alpha1.5+q:1), "
                   "instead of --systems x --seeds; each finished run writes <out>/records/SYSTEM-seedSEED.json, and "
                   "the report is rebuilt from every record there, listing the runs the preset still owes")
    r.add_argument("--threads", type=_checked("check_threads", "threads"), default=None, help="torch CPU threads (a positive number)")
    r.add_argument("--jobs", type=_checked("check_count", "jobs"), default=None,
                   help="lm: train this many runs at once, each in its own process with one torch thread (default: "
                   "the preset's on the CPU: 2 for default and full, sized for two cores; 1 (one after another in "
                   "this process, with --threads) for the others and on a GPU); sampling, timing and memory run here")
    r.add_argument("--debug", action="store_true",
                   help="show the full traceback of an error (by default an error is one line: what failed and the fix)")
    r.add_argument("--checkpoint-every", type=_checked("check_count", "checkpoint_every"), metavar="STEPS",
                   help="training experiments (translation, adaptive-attention, lm): also write a checkpoint every "
                   "STEPS training steps (default: at every evaluation and at the end); the last two are kept")
    r.add_argument("--systems", nargs="+", help="systems to compare (translation: output layers, default softmax "
                   "sparsemax entmax15 alpha_relu; adaptive-attention: softmax entmax15 adaptive; lm: losses, default "
                   "the preset's: kl chi_square alpha1.5, and jensen_shannon reverse_chi_square in full and smoke)")
    return parser


def _main_process() -> bool:
    """Whether this is the process that writes files (rank 0 under torchrun, else the only one)."""
    return int(os.environ.get("RANK", "0")) == 0


def _fresh(out: Path, fresh: bool, derived: Sequence[str]) -> Optional[str]:
    """Apply ``--fresh`` (on rank 0): what earlier runs derived in ``out`` is moved aside
    (:func:`.experiments._common.set_aside_derived`), and the line that says where; without ``--fresh`` only the
    temporary files of killed writers are deleted, and the checkpoints found are continued from (the training
    says so, run by run: every checkpoint is checked against its run's fingerprint first).  ``None``: nothing to
    say.
    """
    from .experiments._common import remove_temporaries, set_aside_derived

    if not _main_process():
        return None
    if not fresh:
        remove_temporaries(out)  # what writers killed in an earlier run left
        return None
    folder, moved = set_aside_derived(out, derived)
    if folder is None:
        return f"--fresh: nothing of an earlier run in {out}; starting from scratch"
    return (f"--fresh: moved {', '.join(moved)} of the earlier runs to {folder}/ (delete it when no longer needed); "
            "starting over")


def _open_run_log(out: Path, argv: Sequence[str]) -> Optional[TextIO]:
    """``<out>/log.txt`` (rank 0 only under torchrun, else ``None``), appended to: the log of a killed run is kept.

    Every run starts with a line that says when and how it was started.
    """
    if not _main_process():
        return None
    from .experiments._common import DiskFullError, is_disk_full

    path = out / "log.txt"
    try:
        out.mkdir(parents=True, exist_ok=True)
        log_file = open(path, "a", encoding="utf-8")
        log_file.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: softargmax {' '.join(argv)}\n")
        log_file.flush()
    except OSError as e:
        if is_disk_full(e):
            raise DiskFullError(path, str(e)) from e
        raise
    return log_file


def _logger(log_file: Optional[TextIO]) -> Callable[[str], None]:
    """Print a line and append it to ``log_file``; a log that cannot be written (a full disk) is reported once."""
    from .experiments._progress import write_line

    state = {"file": log_file}

    def log(line: str) -> None:
        file = state["file"]
        if file is not None:  # the file first: what the terminal shows, the log has
            try:
                file.write(f"{line}\n")
                file.flush()
            except OSError as e:
                print(f"warning: could not write {file.name} ({e}); logging to the terminal only",
                      file=sys.stderr)
                state["file"] = None
        write_line(line)  # above the progress bar on a terminal

    return log


def _errors() -> tuple[type[Exception], ...]:
    """The errors a run reports as one line ``error: ...`` (exit status 2) instead of a traceback."""
    from .experiments._common import CheckpointMismatchError, DiskFullError, OutputInUseError, RecordError
    from .experiments.datasets import DataError

    return (DataError, CheckpointMismatchError, DiskFullError, OutputInUseError, RecordError)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (like Ctrl-C's ``KeyboardInterrupt``), so that the run saves a
    checkpoint where it can, releases its lock and says how to continue."""

    signal_number = 15


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def _command_again(argv: Sequence[str]) -> str:
    """The command line that runs ``argv`` again without ``--fresh`` (which would set aside the checkpoints that
    the run continues from), as the user typed it: ``softargmax ...`` or ``python -m softargmax ...``."""
    script = Path(sys.argv[0])
    prog = ["python", "-m", "softargmax"] if script.parent.name == "softargmax" else ["softargmax"]
    kept = [a for a in argv if not (len(a) > 3 and "--fresh".startswith(a))]  # argparse takes --fre for --fresh
    return shlex.join([*prog, *kept])


def _resume_hint(args: argparse.Namespace, argv: Sequence[str]) -> str:
    """How to continue a stopped run: the command to run (checkpoints are continued from)."""
    how = ("to continue from its checkpoints" if args.experiment in _CHECKPOINTED else "to run it again (it starts over)")
    return f"{how}, run: {_command_again(argv)}"


#: the experiments that keep training checkpoints (an interrupted run continues from them)
_CHECKPOINTED = ("translation", "adaptive-attention", "lm")


def _output_error(e: OSError, out: str) -> Optional[str]:
    """The one-line message of an output folder that cannot be written (``None``: another error)."""
    what = {PermissionError: "permission denied", NotADirectoryError: "a part of the path is a file, not a folder",
            FileExistsError: "a file of that name exists", IsADirectoryError: "a folder is in the way"}
    for kind, why in what.items():
        if isinstance(e, kind):
            name = f" ({e.filename})" if e.filename and str(e.filename) != str(out) else ""
            return f"cannot write the output folder {out}: {why}{name}. Fix: pass --out a folder you can write"
    return None


def _reproduce(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``softargmax reproduce``: run an experiment (or render its report again); the exit status.

    Every failure a user can meet is one line ``error: ...`` on stderr with exit status 2 (no traceback unless
    ``--debug``); Ctrl-C and SIGTERM end the run with a checkpoint where training was under way, the lock released
    and one line that says how to continue (exit status 130 and 143, as a shell reports a signal).
    """
    import importlib
    import signal

    from ._utils.extras import MissingExtraError, require
    from .experiments import EXPERIMENTS
    from .experiments._options import UsageError

    try:
        require("experiments", f"softargmax reproduce {args.experiment}")
    except MissingExtraError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    module = importlib.import_module(EXPERIMENTS[args.experiment])
    if args.preset not in module.PRESETS:
        print(f"error: {args.experiment} takes --preset {' or '.join(sorted(module.PRESETS))}, not {args.preset!r}",
              file=sys.stderr)
        return 2
    out = args.out or f"runs/{args.experiment}"
    previous = None
    if _main_process() and _in_main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run_locked(args, module, Path(out), argv)
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted (Ctrl-C)"
        print(f"\n{args.experiment}: {how}; {_resume_hint(args, argv)}", file=sys.stderr)
        return 128 + (Terminated.signal_number if isinstance(e, Terminated) else 2)
    except UsageError as e:  # an option: before any work (a run's own checks: the same messages)
        if args.debug:
            raise
        print(f"error: {e.for_command_line()}", file=sys.stderr)
        return 2
    except _errors() as e:  # the message names the file, the field or the other run, and the fix
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk where no file name is known to the writer; an unwritable --out
        from .experiments._common import is_disk_full

        if args.debug:
            raise
        if is_disk_full(e):
            print(f"error: no space left on device{f': could not write {e.filename}' if e.filename else ''} "
                  f"({e.strerror or e}); free space on the disk of {out}, then, {_resume_hint(args, argv)}", file=sys.stderr)
            return 2
        message = _output_error(e, out)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _in_main_thread() -> bool:
    """Whether this is the main thread (only it may install signal handlers)."""
    import threading

    return threading.current_thread() is threading.main_thread()


#: the options of ``reproduce`` that an experiment may not take: its ``run`` argument, and why it does not
_OPTIONAL = {"seeds": " (use --seed)", "checkpoint_every": " (it keeps no checkpoints)", "runs": " (use --systems)",
             "jobs": " (lm alone trains runs in several processes)", "systems": " (it has no systems to choose)", "threads": " (it sets no thread count)",
             "data_dir": " (it uses no dataset)", "device": " (it runs on the CPU only)"}


def _check_options(args: argparse.Namespace, module: ModuleType) -> None:
    """Every option against what the experiment takes, before any work (no lock, no ``--fresh``, no log yet):
    :class:`.experiments._options.UsageError` names the first bad one and the fix.

    argparse checked each value alone (a positive number of threads, a seed, a device this PyTorch can use, an
    existing folder); here: options the experiment does not take, its system names, ``--runs`` and ``--seeds``.
    """
    from .experiments._options import UsageError, check_seed, check_systems
    from .experiments.nmt.plan import parse_runs

    name = args.experiment
    given = {"seeds": args.seeds, "checkpoint_every": args.checkpoint_every, "runs": args.runs, "jobs": args.jobs,
             "systems": args.systems, "threads": args.threads, "data_dir": args.data_dir,
             "device": None if args.device in (None, "cpu") else args.device}
    if args.render_only:
        extra = [k for k, v in {**given, "seed": args.seed}.items() if v is not None]
        if extra:
            raise UsageError("render_only", f"it runs nothing, so it takes no --{extra[0].replace('_', '-')}; "
                             "leave that out, or --render-only")
        return
    parameters = inspect.signature(module.run).parameters
    for option, value in given.items():
        if value is not None and option not in parameters:
            why = "" if option == "runs" and "systems" not in parameters else _OPTIONAL[option]
            raise UsageError(option, f"{name} does not take it{why}; leave it out")
    if args.runs and (args.systems or args.seeds):
        raise UsageError("runs", "it names the runs itself; give it without --systems and --seeds")
    if args.systems:
        check_systems(args.systems, module.SYSTEM_NAMES, what=name)
    if args.seeds and len(set(args.seeds)) != len(args.seeds):
        raise UsageError("seeds", f"name each seed once, got {' '.join(map(str, args.seeds))}")
    if args.runs:
        pairs = parse_runs(args.runs)
        names = getattr(module, "RUN_NAMES", module.SYSTEM_NAMES)
        for system, seed in pairs:
            check_systems([system], names, option="runs", what=name)
            check_seed(seed, option="runs")
        twice = sorted({f"{s}:{sd}" for s, sd in pairs if pairs.count((s, sd)) > 1})
        if twice:
            raise UsageError("runs", f"{', '.join(twice)} named twice; name each run once")


def _run_kwargs(args: argparse.Namespace, module: ModuleType, out: Path) -> dict[str, Any]:
    """The keyword arguments of ``module.run`` from the command line (checked by :func:`_check_options`)."""
    kwargs: dict[str, Any] = dict(preset=args.preset, data_dir=args.data_dir, out=str(out),
                                  device=args.device or "cpu", seed=0 if args.seed is None else args.seed,
                                  download=not args.offline, threads=args.threads)
    if args.systems:
        kwargs["systems"] = args.systems
    for option in ("seeds", "checkpoint_every", "runs", "jobs"):
        value = getattr(args, option)
        if value is not None:
            kwargs[option] = value
    return kwargs


def _run_locked(args: argparse.Namespace, module: ModuleType, out: Path, argv: Sequence[str]) -> int:
    """Lock ``out``, apply ``--fresh`` / ``--resume``, open the log and run; or render the report again."""
    from .experiments._common import DERIVED, OutputLock

    _check_options(args, module)
    kwargs = _run_kwargs(args, module, out)
    # one run at a time in `out` (rank 0 holds the lock for all ranks under torchrun)
    locking = _main_process() and (out.is_dir() or not args.render_only)
    lock: contextlib.AbstractContextManager[object] = OutputLock(out) if locking else contextlib.nullcontext()
    with lock:
        if args.render_only:  # before the run log is opened: it describes the run that made results.json
            return _render_only(module, str(out))
        fresh = _fresh(out, args.fresh, getattr(module, "DERIVED", DERIVED))
        log_file = _open_run_log(out, argv)
        log = _logger(log_file)
        try:
            stale = getattr(lock, "stale", None)  # a lock left by a killed run, taken over
            if stale:
                log(f"{out}: {stale}")
            if fresh:
                log(fresh)
            module.run(log=log, **kwargs)
        except BaseException as e:  # the log says how the run ended (the terminal gets it from main)
            if log_file is not None:
                with contextlib.suppress(OSError):
                    log_file.write(f"{_ending(e)}\n")
            raise
        finally:
            if log_file is not None:
                with contextlib.suppress(OSError):
                    log_file.close()
    return 0


def _ending(e: BaseException) -> str:
    """The log's last line for a run that ended with ``e``."""
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(e, KeyboardInterrupt):
        return f"== {when}: {'terminated (SIGTERM)' if isinstance(e, Terminated) else 'interrupted (Ctrl-C)'}"
    return f"== {when}: error: {type(e).__name__}: {e}".rstrip(": ")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "reproduce":
        return _reproduce(args, argv if argv is not None else sys.argv[1:])
    if args.command == "bench":
        return _bench(args)
    return 0


def _render_only(module: ModuleType, out: str) -> int:
    """``--render-only``: the report written again from ``results.json`` (or, where the experiment has its own
    ``render``, as that says: translation rebuilds everything from its run records); the exit status."""
    from .experiments._common import render_existing

    try:
        render = getattr(module, "render", None)
        if render is not None:
            print(f"wrote {render(out, log=lambda line: print(line, flush=True))}")
            return 0
        # figures drawn from results.json alone are drawn again (translation's need its run)
        draw = getattr(module, "write_figures", None)
        if draw is not None and len(inspect.signature(draw).parameters) != 2:
            draw = None
        print(f"wrote {render_existing(out, module.render_report, draw)}")
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _bench(args: argparse.Namespace) -> int:
    """``softargmax bench``: the operators' (default), the losses' or attention's benchmark; the exit status."""
    import torch

    bench = _bench_module()
    repeats = args.repeats or (3 if args.quick else 20)
    log = lambda line: print(line, flush=True)  # noqa: E731
    if args.attention:
        result = bench.run_attention(
            lengths=(64, 128) if args.quick else bench.ATTENTION_LENGTHS, threads=args.threads,
            repeats=min(repeats, 2 if args.quick else 5), memory=not args.quick, log=log,
        )
    elif args.losses:
        print(bench.header(), flush=True)
        result = bench.run_losses(
            shapes=args.shapes or (bench.QUICK_SHAPES if args.quick else bench.LOSS_SHAPES),
            threads=args.threads,
            repeats=repeats,
            warmup=1 if args.quick else 3,
            with_package=not args.no_package,
            fused_shape=(256, 64, 2000) if args.quick else bench.FUSED_SHAPE,
            log=log,
        )
    else:
        print(bench.header(), flush=True)
        result = bench.run(
            shapes=args.shapes or (bench.QUICK_SHAPES if args.quick else bench.FULL_SHAPES),
            ops=args.ops,
            passes=("fwd", "fwd+bwd") if args.passes == "both" else (args.passes,),
            dtype=getattr(torch, args.dtype),
            device=args.device,
            threads=args.threads,
            repeats=repeats,
            warmup=1 if args.quick else 3,
            with_package=not args.no_package,
            log=log,
        )
        over = [c for c in result["cases"] if c["target"] is not None and c["ratio"] > c["target"]]
        print(f"\n{result['device']}, torch {result['torch']}, {result['threads']} threads; "
              f"{len(result['cases'])} cases, {len(over)} over their target")
    if args.json_path:
        bench.save(result, args.json_path)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
