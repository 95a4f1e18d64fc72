"""Progress of long runs (softargmax.experiments._progress): the time left follows the recent steps, the bar is off
where stderr is not a terminal, and Ctrl-C waits for a training step to end."""

import os
import re
import signal

import pytest

from softargmax.experiments._progress import Interrupts, JobEstimate, StepTimer, progress_bar, summary_table


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


def test_the_whole_job_estimate_of_runs_one_at_a_time_in_lanes_and_with_step_costs():
    est = JobEstimate([100, 100, 100, 100], overhead=0.5, fixed=0)
    assert est.left(0) is None and est.line(0, "a") == "== run 1 of 4: a"  # nothing timed yet
    # the current run at 2 s per step, 30 s of its training left; until a run finished, the rest of a run is half
    # its training
    assert est.left(0, 30.0, 2.0) == pytest.approx(30 + 100 + 3 * 300)
    est.finished(train=100.0, steps=100, run=110.0)  # 1 s per step, 0.1 s of evaluation per step
    assert est.left(1) == pytest.approx(3 * 110) and "ETA 5.5 min for the whole job (the runs left at 1 s per" in est.line(1, "b")
    est.finished(train=300.0, steps=100, run=330.0)  # a slower run: the mean of the two, 2 s and 0.2 s per step
    assert est.left(2) == pytest.approx(2 * 220)
    # two lanes: run 2 under way for 100 s (120 left), run 3 waits: it starts when a lane is free (now), ends at 220
    lanes = JobEstimate([100] * 4, jobs=2, fixed=0)
    lanes.finished(train=200.0, steps=100, run=220.0)
    assert lanes.left_in_lanes({2: 100.0}, [3]) == pytest.approx(220)
    assert lanes.left_in_lanes({1: 0.0, 2: 100.0}, [3]) == pytest.approx(120 + 220)  # run 3 after run 2
    assert lanes.left_in_lanes({}, []) == 0.0
    # a step of the first run costs 3 of the second's: its pace counts a third for the runs after it
    costs = JobEstimate([10, 30], cost=[3, 1], fixed=0)
    assert costs.left(0, 6.0, 0.6) == pytest.approx(6 + 30 * 0.2)
    costs.finished(train=6.0, steps=10, run=6.0, cost=3)
    assert costs.left(1) == pytest.approx(30 * 0.2) and "at 0.2 s per step" in costs.line(1, "student")
    with pytest.raises(ValueError, match="cost"):
        JobEstimate([10, 10], cost=[1])
    with pytest.raises(ValueError, match="jobs"):
        JobEstimate([10], jobs=0)
    assert summary_table([("a", "bb"), ("ccc", "d")]) == ["  a    bb", "  ccc   d"]


def test_the_end_of_a_call_takes_longer_on_a_busy_machine(monkeypatch):
    """The seconds that do not follow the time per step (the report, fresh processes) scale with the load average
    over the CPUs, at least 1: on 2 cores with a load of 9, 4.5 times as long; where there is no load, as measured."""
    from softargmax.experiments import _progress

    est = JobEstimate([10], fixed=4.0)
    est.finished(train=10.0, steps=10, run=10.0)
    monkeypatch.setattr(_progress.os, "cpu_count", lambda: 2)
    for load, factor in ((9.0, 4.5), (1.0, 1.0)):
        monkeypatch.setattr(_progress.os, "getloadavg", lambda load=load: (load, load, load))
        assert est.left(0, 0.0) == pytest.approx(4.0 * factor) and est.left(1) == pytest.approx(4.0 * factor)

    def unknown():
        raise OSError("no load average")

    monkeypatch.setattr(_progress.os, "getloadavg", unknown)
    assert _progress.busy() == 1.0


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


def _read_all(fd):
    import select

    out = b""
    while select.select([fd], [], [], 0.2)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out.decode("utf-8", "replace")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="no pseudo-terminals")
def test_on_a_terminal_the_bar_shows_and_log_lines_go_above_it(capsys, monkeypatch):
    """Under `script` without a terminal (a pseudo-terminal of 0 x 0, as os.openpty makes) tqdm hid the bar."""
    pytest.importorskip("tqdm")
    from softargmax.experiments._progress import format_seconds, write_line

    master, slave = os.openpty()
    terminal = open(slave, "w", encoding="utf-8")
    try:
        monkeypatch.setattr("sys.stderr", terminal)
        with progress_bar(20, "softmax") as bar:
            assert bar is not None
            bar.set_postfix_str("loss 1.000, ETA run 3.0 s, whole job 2.5 min", refresh=False)
            bar.update(5)
            bar.refresh()  # (tqdm draws at most every 0.1 s)
            terminal.flush()
            drawn = _read_all(master)
            write_line("[softmax] step 5/20 loss 1.000")  # tqdm.write: the bar cleared, the line printed, the bar drawn
            terminal.flush()
            after = _read_all(master)
    finally:
        terminal.close()
        os.close(master)
    assert "softmax:  25%" in drawn and "5/20" in drawn and "whole job 2.5 min" in drawn
    assert capsys.readouterr().out == "[softmax] step 5/20 loss 1.000\n"  # the line whole, on its own line
    cleared = re.match(r"\r +\r", after)
    assert cleared and "softmax:  25%" in after[cleared.end():], repr(after)
    # no bar (not a terminal): plain lines
    monkeypatch.undo()
    write_line("plain")
    assert capsys.readouterr().out == "plain\n"
    assert [format_seconds(s) for s in (None, 45, 192, 5400)] == ["?", "45.0 s", "3.2 min", "1.5 h"]
