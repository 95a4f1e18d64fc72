"""Progress of a long run: the time left from recent steps, a progress bar on a terminal, and Ctrl-C / SIGTERM
held back until a training step is complete.

* :class:`StepTimer`: the time per step as an exponential moving average of the last steps' wall
  clock (a window of about ``2 / smoothing`` steps), so the time left follows a change of the
  machine's load within a few dozen steps instead of averaging over the whole run;
* :func:`progress_bar`: a ``tqdm`` bar on stderr when stderr is a terminal (off in logs, pipes
  and CI, and when tqdm is not installed); the log lines are written either way, through
  :func:`write_line`, which prints them above the bar (``tqdm.write``) instead of over it;
* :func:`format_seconds`: a time left as ``"45 s"``, ``"3.2 min"``, ``"1.5 h"``;
* :class:`Interrupts`: inside :meth:`Interrupts.held`, a Ctrl-C or SIGTERM waits until the block
  ends (a second one does not wait), so that a checkpoint written after it holds a state of the
  uninterrupted run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterator, Optional


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
