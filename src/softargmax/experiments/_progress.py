"""Progress of a long run: the time left from recent steps, a progress bar on a terminal, and Ctrl-C / SIGTERM
held back until a training step is complete.

* :class:`StepTimer`: the time per step as an exponential moving average of the last steps' wall
  clock (a window of about ``2 / smoothing`` steps), so the time left follows a change of the
  machine's load within a few dozen steps instead of averaging over the whole run;
* :func:`progress_bar`: a ``tqdm`` bar on stderr when stderr is a terminal (off in logs, pipes
  and CI, and when tqdm is not installed); the log lines are written either way, through
  :func:`write_line`, which prints them above the bar (``tqdm.write``) instead of over it;
* :func:`format_seconds`: a time left as ``"45 s"``, ``"3.2 min"``, ``"1.5 h"``;
* :class:`JobEstimate`: the time left of a whole call (its runs, each one's training and evaluation, and what
  follows them), from the runs done so far and the work left; :meth:`JobEstimate.line` is the
  ``"== run i of n: NAME, ETA ... for the whole job"`` line every experiment prints before each run;
* :func:`busy`: how many times busier than its cores the machine is (what does not follow a step's time, such as a
  fresh process or the figures, takes that much longer);
* :func:`advance`: a training step done, into a :class:`StepTimer` and onto the bar (loss, ETA of the run and of
  the whole job);
* :func:`training`: a training loop's bar and time left, as one ``tick(step, loss)`` per step;
* :func:`summary_table`: the closing summary's table, in aligned columns;
* :class:`Interrupts`: inside :meth:`Interrupts.held`, a Ctrl-C or SIGTERM waits until the block
  ends (a second one does not wait), so that a checkpoint written after it holds a state of the
  uninterrupted run.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import signal
import statistics
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterator, Optional, Sequence


class StepTimer:
    """Seconds per step from the recent steps: an exponential moving average of the wall clock between ticks.

    Args:
        start_step: the step the run starts from (a resumed run's).
        smoothing: the weight of the newest interval (0.1: about the last 20 steps count).
        clock: the clock, in seconds (``time.perf_counter``).

    Example:
        >>> t = iter([0.0, 1.0, 2.0, 2.1, 2.2, 2.3])
        >>> timer = StepTimer(0, smoothing=0.5, clock=lambda: next(t))
        >>> for step in range(1, 6):
        ...     timer.tick(step)
        >>> round(timer.per_step, 3), timer.eta(10)
        (0.212, '1.1 s')
    """

    def __init__(self, start_step: int = 0, smoothing: float = 0.1, clock: Callable[[], float] = time.perf_counter):
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.smoothing, self.clock = smoothing, clock
        self.step, self.last = start_step, clock()
        self.per_step: Optional[float] = None
        self._ticks = 0

    def tick(self, step: int) -> None:
        """Record that ``step`` is done (the interval since the last tick, per step, enters the average)."""
        now = self.clock()
        if step > self.step:
            dt = (now - self.last) / (step - self.step)
            self._ticks += 1
            if self._ticks > 1:  # the first interval pays for warm-up
                self.per_step = dt if self.per_step is None else self.smoothing * dt + (1 - self.smoothing) * self.per_step
        self.step, self.last = step, now

    def seconds_left(self, total: int) -> Optional[float]:
        """Seconds until step ``total`` at the current pace (``None`` before two steps were timed)."""
        return None if self.per_step is None else self.per_step * max(total - self.step, 0)

    def eta(self, total: int) -> str:
        """The time left as text: ``"45 s"``, ``"3.2 min"``, ``"1.5 h"``, or ``"?"``."""
        return format_seconds(self.seconds_left(total))


def format_seconds(seconds: Optional[float]) -> str:
    """``"45.0 s"``, ``"3.2 min"``, ``"1.5 h"``; ``"?"`` for ``None`` (not known yet)."""
    if seconds is None:
        return "?"
    return (f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min" if seconds < 5400
            else f"{seconds / 3600:.1f} h")


#: the seconds of writing the report at the end of a call on a quiet machine: its figures drawn (matplotlib imported
#: first) and the files written; 20 s for lm's four figures on two CPU cores with a load average of 9.4 (2026-12-02),
#: that is about 4 s per unit of :func:`busy`
REPORT_SECONDS = 4.0


def busy() -> float:
    """How many times busier than its cores the machine is now: the load average of the last minute over the number of
    CPUs, at least 1 (1 where the load is not known).  What does not follow the time of a training step (a fresh
    process importing torch, matplotlib drawing the figures) takes about that much longer than on a quiet machine."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows)
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


#: a training loop's estimate of its whole job: called with the seconds left of the run's training and its time per
#: step (``None``: not known), it returns the seconds left of the whole job (``None``: not known)
JobLeft = Optional[Callable[[float, Optional[float]], Optional[float]]]


class JobEstimate:
    """The time left of a call: the runs left, each its training and the rest of the run (evaluation and what else
    it does beyond its training steps), then what follows the runs (:meth:`after`).

    Each run has its training steps, each of a relative ``cost`` (1 unless runs of one call train models of
    different sizes); its *work* is their product.  The time per unit of work is the current run's (its recent
    steps, :class:`StepTimer`), else the mean of the runs this call finished; the rest of a run is what the
    finished runs took beyond their training, per unit of work, else ``overhead`` times its training (a ratio the
    experiment measured or estimated).  With ``jobs`` > 1 the runs are trained that many at a time, and the time left
    is that of the busiest lane (:meth:`left_in_lanes`).  An experiment with work after its runs (an interleaved
    timing) adds it in a subclass's :meth:`after`.  The call ends with ``fixed`` seconds that do not follow the
    time per step (the report's figures, fresh processes), measured on a quiet machine and scaled by how busy the
    machine is now (:func:`busy`).

    Args:
        steps: the training steps of each run of the call, in order.
        overhead: the seconds of a run beyond its training per second of training, until a run has measured its own.
        jobs: the runs trained at once.
        cost: the relative cost of a training step of each run (default: 1 for every run).
        fixed: the seconds at the end of the call on a quiet machine (default :data:`REPORT_SECONDS`).

    Example:
        >>> est = JobEstimate([100, 100, 50], overhead=0.5, fixed=0)
        >>> est.left(0) is None  # nothing timed yet
        True
        >>> est.left(0, run_left=40.0, per_step=1.0)  # 40 + 50 (rest of run 1) + 150 + 75
        315.0
        >>> est.finished(train=100.0, steps=100, run=120.0)  # 1 s per step, 0.2 s of evaluation per step
        >>> est.left(1), est.line(1, "kl-seed1")
        (180.0, '== run 2 of 3: kl-seed1, ETA 3.0 min for the whole job (the runs left at 1 s per step and their evaluation)')
    """

    def __init__(self, steps: Sequence[float], overhead: float = 0.0, jobs: int = 1,
                 cost: Optional[Sequence[float]] = None, fixed: Optional[float] = None) -> None:
        if overhead < 0 or jobs < 1:
            raise ValueError(f"overhead must be >= 0 and jobs >= 1, got {overhead!r} and {jobs!r}")
        self.cost = [1.0] * len(steps) if cost is None else [float(c) for c in cost]
        if len(self.cost) != len(steps) or min(self.cost, default=1.0) <= 0:
            raise ValueError(f"cost must hold one positive number per run, got {cost!r} for {len(steps)} runs")
        self.work = [s * c for s, c in zip(steps, self.cost)]
        self.overhead, self.jobs = overhead, jobs
        self.fixed = REPORT_SECONDS if fixed is None else fixed
        self.per_unit: list[float] = []  # seconds per unit of training work, of each finished run
        self.rest: list[float] = []  # seconds beyond the training per unit of work, of each finished run

    @property
    def runs(self) -> int:
        """The number of runs."""
        return len(self.work)

    def finished(self, train: float, steps: float, run: float, cost: float = 1.0) -> None:
        """A run is done: ``train`` seconds for the ``steps`` it trained in this call (of relative ``cost``), ``run``
        seconds in all (a run that trained nothing here, loaded from its checkpoint, tells nothing)."""
        if steps > 0:
            self.per_unit.append(train / (steps * cost))
            self.rest.append(max(run - train, 0.0) / (steps * cost))

    def pace(self, per_step: Optional[float] = None, index: Optional[int] = None) -> Optional[float]:
        """Seconds per unit of work: ``per_step`` (the current run's, run ``index``'s), else the mean of the finished
        runs'."""
        if per_step:
            return per_step / (1.0 if index is None else self.cost[index])
        return statistics.fmean(self.per_unit) if self.per_unit else None

    def job(self, index: int) -> Callable[[float, Optional[float]], Optional[float]]:
        """What the training loop of run ``index`` calls for the whole job's time left (:data:`JobLeft`)."""
        return lambda run_left, per_step: self.left(index, run_left, per_step)

    def run_seconds(self, index: int, per_step: float, trained: Optional[float] = None) -> float:
        """The seconds of run ``index`` at ``per_step``: its training (``trained`` seconds of it left, where given)
        and the rest of the run."""
        w = self.work[index]
        rest = statistics.fmean(self.rest) * w if self.rest else self.overhead * w * per_step
        return (w * per_step if trained is None else trained) + rest

    def after(self, per_step: float) -> float:
        """The seconds of the work after the runs at ``per_step`` (none here; a subclass adds its own)."""
        return 0.0

    def closing(self) -> float:
        """The seconds that end the call: ``fixed``, scaled by how busy the machine is now (:func:`busy`)."""
        return self.fixed * busy() if self.fixed else 0.0

    def left(self, index: int, run_left: Optional[float] = None, per_step: Optional[float] = None) -> Optional[float]:
        """Seconds left from run ``index`` (0-based) on, one run at a time, with ``run_left`` seconds of its training
        left (``None``: it has not started), at ``per_step`` seconds per unit of work (``None``: the finished runs'
        mean); ``None`` while no time per unit is known."""
        ps = self.pace(per_step, index)
        if ps is None:
            return None
        current = self.run_seconds(index, ps, run_left) if index < self.runs else 0.0  # index == runs: all done
        return (current + sum(self.run_seconds(i, ps) for i in range(index + 1, self.runs))
                + self.after(ps) + self.closing())

    def left_in_lanes(self, running: dict, waiting: Sequence[int]) -> Optional[float]:
        """Seconds left with ``jobs`` runs trained at once: ``running`` maps each run under way (its index) to the
        seconds since it started, ``waiting`` lists the runs not started, in order; each lane takes the next run when
        its run ends, and the call ends with the last lane, then :meth:`after`.  ``None`` while no run finished."""
        ps = self.pace()
        if ps is None:
            return None
        lanes = [max(self.run_seconds(i, ps) - elapsed, 0.0) for i, elapsed in running.items()]
        lanes += [0.0] * max(self.jobs - len(lanes), 0)
        heapq.heapify(lanes)
        for i in waiting:
            heapq.heappush(lanes, heapq.heappop(lanes) + self.run_seconds(i, ps))
        return max(lanes, default=0.0) + self.after(ps) + self.closing()

    def line(self, index: int, name: str, what: str = "their evaluation", unit: Optional[str] = "step") -> str:
        """``"== run i of n: NAME"`` before run ``index``, with the time left of the whole job once it is known
        (:meth:`eta`)."""
        return f"== run {index + 1} of {self.runs}: {name}{self.eta(self.left(index), what, index, unit)}"

    def eta(self, left: Optional[float], what: str = "their evaluation", index: Optional[int] = None,
            unit: Optional[str] = "step") -> str:
        """``", ETA 3.2 min for the whole job (the runs left at 45 ms per step and WHAT)"``: ``left`` seconds, and what
        the estimate rests on: the time per ``unit`` of run ``index`` (else of a unit of cost 1; ``unit=None``: not
        shown, ``what`` says it all) and ``what`` it adds to the runs' training; ``""`` while ``left`` is ``None``."""
        ps = self.pace()
        if left is None or ps is None:
            return ""
        ps *= 1.0 if index is None else self.cost[index]
        basis = what if unit is None else f"the runs left at {_pace(ps)} per {unit} and {what}"
        return f", ETA {format_seconds(left)} for the whole job ({basis})"


def _pace(seconds: float) -> str:
    """``"0.12 s"``, ``"45 ms"``, ``"3 s"``: a time per step with two significant digits."""
    return f"{seconds * 1000:.2g} ms" if seconds < 0.1 else f"{seconds:.2g} s"


def advance(bar: Any, timer: StepTimer, step: int, total: int, shown: Any, job: JobLeft = None) -> None:
    """Training step ``step`` of ``total`` is done: into ``timer``, and onto ``bar`` (where there is one) with the
    loss ``shown`` (a number, or a one-element tensor: read only for the bar), the run's time left and, where
    ``job`` estimates it from the run's seconds left and its time per step, the whole job's."""
    timer.tick(step)
    if bar is not None:
        left = timer.seconds_left(total)
        whole = None if job is None or left is None else job(left, timer.per_step)
        bar.set_postfix_str(f"loss {float(shown):.3f}, ETA run {timer.eta(total)}"
                            + (f", whole job {format_seconds(whole)}" if whole is not None else ""), refresh=False)
        bar.update(1)


@contextlib.contextmanager
def training(total: int, label: str, job: JobLeft = None, start: int = 0) -> Iterator[Callable[[int, Any], None]]:
    """The progress of a training loop of ``total`` steps: yields ``tick(step, loss)``, to call after each step, which
    moves the bar (:func:`progress_bar`: on a terminal only) with the loss, the run's time left and the whole
    job's (``job``, e.g. :meth:`JobEstimate.job`).

    Example:
        >>> with training(3, "kl") as tick:  # no terminal here: no bar, nothing printed
        ...     for step in range(1, 4):
        ...         tick(step, 0.5)
    """
    timer = StepTimer(start)
    with progress_bar(total, label, start) as bar:
        yield lambda step, loss: advance(bar, timer, step, total, loss, job)


def summary_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` (the first: the header) as lines of aligned columns, indented by two spaces: the first column aligned
    left, the others right.

    Example:
        >>> for line in summary_table([("loss", "accuracy"), ("KL", "43.94"), ("α=1.5", "42.71 ± 0.10")]):
        ...     print(line)
          loss       accuracy
          KL            43.94
          α=1.5  42.71 ± 0.10
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


#: the bars shown now (:func:`progress_bar`): :func:`write_line` prints above them
_BARS: list = []


@contextlib.contextmanager
def progress_bar(total: int, label: str, initial: int = 0) -> Iterator[Any]:
    """A ``tqdm`` bar of ``total`` steps on stderr, or ``None`` when stderr is not a terminal, tqdm is missing, or
    this is a worker process (``multiprocessing``: runs trained side by side would draw over each other's bar).

    While it is shown, the lines written through :func:`write_line` go above it.
    """
    import multiprocessing

    bar = None
    if sys.stderr.isatty() and multiprocessing.parent_process() is None:
        try:
            from tqdm import tqdm

            # the terminal's size, followed as it changes; a terminal that reports none (0 x 0: `script` run without
            # a terminal, some CI runners) gets 100 x 24, where tqdm would hide the bar (it hides bars below the
            # screen's last row)
            width: dict[str, Any] = {"dynamic_ncols": True} if min(_size()) > 0 else {"ncols": 100, "nrows": 24}
            bar = tqdm(total=total, initial=initial, desc=label, unit="step", leave=False, file=sys.stderr, **width)
        except ImportError:
            bar = None
    if bar is not None:
        _BARS.append(bar)
    try:
        yield bar
    finally:
        if bar is not None:
            _BARS.remove(bar)
            bar.close()


def _size() -> tuple[int, int]:
    """``(columns, rows)`` of the terminal on stderr (0: unknown)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return 0, 0
    return size.columns, size.lines


def write_line(line: str) -> None:
    """Print a log line on stdout: above the progress bar where one is shown (``tqdm.write`` clears the bar,
    prints, and draws it again), else plainly."""
    if _BARS:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()
    else:
        print(line, flush=True)


class Interrupts:
    """Ctrl-C (SIGINT) and SIGTERM held back while a block runs (:meth:`held`), then delivered.

    Only handlers that raise in Python are wrapped (Python's ``KeyboardInterrupt`` for SIGINT,
    a command line's own for SIGTERM); outside the main thread nothing changes.  A second signal
    while one waits is delivered at once, and :attr:`consistent` is then ``False``.
    """

    def __init__(self) -> None:
        self._old: dict[int, Callable[[int, Optional[FrameType]], Any]] = {}
        self._pending: Optional[tuple[int, Optional[FrameType]]] = None
        self._holding = False
        self.consistent = True

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.getsignal(sig)
                if callable(old):
                    self._old[sig] = old
                    signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._holding and self._pending is None:
            self._pending = (signum, frame)
            return
        if self._holding:
            self.consistent = False
        self._old[signum](signum, frame)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Run the block with the signals held back; one that came is delivered when the block ends."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self._pending is not None:
            signum, frame = self._pending
            self._pending = None
            self._old[signum](signum, frame)
