"""Progress of long runs (softargmax.experiments._progress): the time left follows the recent steps, the bar is off
where stderr is not a terminal, and Ctrl-C waits for a training step to end."""

import os
import signal

import pytest

from softargmax.experiments._progress import Interrupts, StepTimer, progress_bar


def test_the_time_left_follows_a_change_of_load_within_a_few_dozen_steps():
    # 50 steps at 1 s (a busy machine), then 50 at 0.1 s (quiet): the running mean since the start would still
    # say 0.55 s per step, and an ETA five times too long
    clock = iter([0.0] + [float(i + 1) for i in range(50)] + [50.0 + 0.1 * (i + 1) for i in range(50)])
    timer = StepTimer(0, clock=lambda: next(clock))
    for step in range(1, 101):
        timer.tick(step)
    assert timer.per_step == pytest.approx(0.1, rel=0.1)  # the mean since the start: 0.55
    assert timer.seconds_left(400) == pytest.approx(30.0, rel=0.1) and timer.eta(400) == f"{timer.seconds_left(400):.1f} s"
    fresh = StepTimer(0, clock=iter([0.0, 5.0]).__next__)  # the first step pays for warm-up: no estimate yet
    fresh.tick(1)
    assert fresh.eta(10) == "?" and fresh.seconds_left(10) is None
    with pytest.raises(ValueError, match="smoothing"):
        StepTimer(0, smoothing=0.0)


def test_no_progress_bar_when_stderr_is_not_a_terminal(capsys):
    with progress_bar(10, "x") as bar:  # pytest captures stderr: not a terminal
        assert bar is None


def test_ctrl_c_waits_for_the_held_block_and_a_second_one_does_not(ctrl_c_raises):
    done = []
    with Interrupts() as interrupts:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGINT)
                done.append("the step finished")
        assert done == ["the step finished"] and interrupts.consistent
        with pytest.raises(KeyboardInterrupt):
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)  # the second one breaks in
                done.append("not reached")
        assert done == ["the step finished"] and not interrupts.consistent
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_an_ignored_ctrl_c_stays_ignored():
    """A run started in the background by a script inherits SIGINT ignored: Interrupts keeps it so."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Interrupts() as interrupts:
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGINT)
            assert interrupts.consistent
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
