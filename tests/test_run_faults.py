"""Runs that survive faults and lose nothing: kills, damaged checkpoints, shared folders, full disks.

* A smoke translation run killed with SIGKILL at moments drawn by a seeded generator and
  resumed until it finishes equals an uninterrupted run (every number of results.json,
  timings aside), and its log keeps every attempt.
* Training resumed from any checkpoint is bit for bit the uninterrupted training (dropout on),
  and a damaged checkpoint falls back to the previous one, or to training from scratch.
* Checkpoints of another seed or preset are refused by name; ``--fresh`` removes the
  checkpoints, the tokenizer and the run records; a second run into a folder in use stops
  at once, a dead run's lock is taken over.
* A full disk (``OSError(ENOSPC)`` injected, or ``torch.save``'s short write) gives one error
  that says "no space left on device" and names the file, and the previous file stays.
"""

import errno
import itertools
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import softargmax
from softargmax.cli import main
from softargmax.experiments import _common
from softargmax.experiments._common import (
    CheckpointMismatchError,
    DiskFullError,
    OutputInUseError,
    OutputLock,
    atomic_write,
    fingerprint,
    load_checkpoint,
    measurements,
    remove_temporaries,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

SRC_DIR = str(Path(softargmax.__file__).resolve().parents[1])
from conftest import DATA  # noqa: E402

SHARED = DATA  # --data-dir, $SOFTARGMAX_DATA or ../shared/data (conftest.py)
needs_data = pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="data not present: multi30k")


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=SRC_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    return env


#: one smoke translation run of two output layers, one thread, a checkpoint every 3 steps
SMOKE = ["-m", "softargmax", "reproduce", "translation", "--preset", "smoke", "--systems", "softmax", "alpha_relu",
         "--threads", "1", "--checkpoint-every", "3", "--data-dir", str(SHARED)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``(folder, results)`` of the smoke run, uninterrupted, in a separate process."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    proc = subprocess.run([sys.executable, *SMOKE, "--out", str(out)], env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out, json.loads((out / "results.json").read_text())


def _start(out: Path, resume: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *SMOKE, "--out", str(out), *(["--resume"] if resume else [])],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)


def _kill_after(proc: subprocess.Popen, pattern, delay: float):
    """SIGKILL ``proc`` ``delay`` seconds after it prints a line matching ``pattern`` (``None``: after it
    starts); returns that line (``""`` for ``None``), or ``None`` if the run ended first."""
    for line in itertools.chain([""] if pattern is None else [], proc.stdout):
        if pattern is None or re.search(pattern, line):
            time.sleep(delay)
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            return line
    proc.communicate(timeout=300)
    assert proc.returncode == 0, f"the run failed with status {proc.returncode}"
    return None


def kill_moments(seed: int) -> list:
    """``(line pattern, delay)`` of four kills, drawn by ``random.Random(seed)``, in the run's order: in the start
    (the lock, the data, the tokenizer), in the training of each system (a checkpoint every 3 steps, a log line
    every 5), and anywhere after it (decoding, timing, the bootstrap, writing the report).  Each kill follows a
    line of the log: a kill timed from the start alone landed after the first system's training on a quiet
    machine (a smoke run trains in a fraction of a second), and then the next patterns never came.  The kills in
    training follow the log line of step 5 or 10, after the checkpoint of step 3 (or 9) is written, by at most
    20 ms: they land in training, with a checkpoint to resume from, however busy the machine is (after the
    line of step 1 by up to 0.2 s, a busy machine had not reached the first checkpoint, a quiet one could
    finish the system)."""
    rng = random.Random(seed)
    return [(rng.choice([r"Multi30k De→En from", r"joint sentencepiece BPE vocabulary", r"runs to train"]),
             rng.uniform(0.0, 0.05)),
            (rf"\[softmax\] step {rng.choice([5, 10])}/", rng.uniform(0.0, 0.02)),
            (rf"\[alpha_relu\] step {rng.choice([5, 10])}/", rng.uniform(0.0, 0.02)),
            (rng.choice([r"\[alpha_relu\] step 20:", r"\[alpha_relu\] test BLEU", r"timing inference",
                         r"paired bootstrap"]), rng.uniform(0.0, 0.5))]


@needs_data
def test_a_smoke_translation_run_killed_at_random_moments_and_resumed_until_it_finishes_equals_an_uninterrupted_run(
        uninterrupted, tmp_path):
    reference = uninterrupted[1]
    out = tmp_path / "killed"
    killed_after = []
    for k, (pattern, delay) in enumerate(kill_moments(30)):
        killed_after.append(_kill_after(_start(out, resume=k > 0), pattern, delay))
    proc = _start(out, resume=True)
    tail = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, tail[-3000:]
    kills = [line for line in killed_after if line is not None]
    assert len(kills) >= 3, f"only {len(kills)} of the kills landed before the run ended"
    results = json.loads((out / "results.json").read_text())
    # the same BLEU, losses, curves, decoding statistics ... every number but the timings
    assert measurements(results) == measurements(reference)
    for system in ("softmax", "alpha_relu"):
        a, b = results["systems"][system], reference["systems"][system]
        assert a["bleu"] == b["bleu"] and a["train_loss"] == b["train_loss"] and len(a["train_loss"]) == 20
    log = (out / "log.txt").read_text()
    # every attempt's log is kept (the first one may have died before it opened its log), and a
    # killed run's lock was taken over
    starts = re.findall(r"^== \d{4}-\d\d-\d\d [\d:]+ pid \d+: softargmax reproduce translation", log, re.MULTILINE)
    assert len(kill_moments(30)) <= len(starts) <= len(kill_moments(30)) + 1, log
    assert all(line in log for line in kills) and "which is no longer running, was taken over" in log
    # at least one kill landed in the middle of training, and that run was resumed from a checkpoint
    assert re.search(r"resumed at step ([1-9]|1[0-9])\n", log), log
    assert not list(out.rglob(".*.tmp*")) and not (out / ".softargmax.lock").exists()


# --- training resumed from any checkpoint ---------------------------------------------------------------------------

def _toy():
    rng = random.Random(0)
    de = "ein eine zwei hund katze mann frau kind spielt läuft im park auf der straße mit ball rot blau".split()
    en = "a an two dog cat man woman child plays runs in the park on the street with ball red blue".split()
    src, tgt = [], []
    for _ in range(80):
        idx = [rng.randrange(len(de)) for _ in range(rng.randint(2, 8))]
        src.append(" ".join(de[i] for i in idx))
        tgt.append(" ".join(en[i] for i in idx))
    return src, tgt


@pytest.fixture
def one_thread():
    """One torch thread: a shared machine's second core, when busy, makes OpenMP spin 25× longer than the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def toy_training():
    """``train(out, log=..., checkpoint_every=...)``: 12 steps of a tiny Transformer with dropout 0.3."""
    pytest.importorskip("sentencepiece")
    pytest.importorskip("sacrebleu")
    from softargmax.experiments.nmt.data import Parallel
    from softargmax.experiments.nmt.model import ModelConfig
    from softargmax.experiments.nmt.tokenizer import Tokenizer
    from softargmax.experiments.nmt.training import TrainConfig, train_system

    src, tgt = _toy()
    tok = Tokenizer.train(src + tgt, 60)
    pairs, val = Parallel(src, tgt), Parallel(src[:6], tgt[:6])
    mcfg = ModelConfig(vocab_size=len(tok), d_model=16, heads=2, layers=1, ff=32, dropout=0.3, max_len=48)
    cfg = TrainConfig(steps=12, batch_tokens=80, warmup=4, lr=0.5, eval_every=4, val_bleu_sentences=6, seed=5,
                      select="loss")
    fp = fingerprint("toy", "smoke", "entmax15", 5)

    def train(out, log=lambda *a: None, checkpoint_every=3, system="entmax15"):
        return train_system(system, mcfg, cfg, tok, pairs, val, out, log=log, fingerprint=fp,
                            checkpoint_every=checkpoint_every)

    return train


def _weights(model) -> list:
    return [p.detach().clone() for p in model.state_dict().values()]


def _same_run(a: dict, b: dict) -> None:
    ra, rb = a["record"], b["record"]
    assert ra["train_loss"] == rb["train_loss"] and len(ra["train_loss"]) == 12
    assert [(e["step"], e["val_loss"], e["val_bleu"]) for e in ra["history"]] == \
           [(e["step"], e["val_loss"], e["val_bleu"]) for e in rb["history"]]
    assert ra["kept_step"] == rb["kept_step"]
    assert all(torch.equal(x, y) for x, y in zip(_weights(a["model"]), _weights(b["model"])))


class Killed(BaseException):
    """Stands for a kill: raised from inside a checkpoint write."""


def test_training_resumed_from_any_checkpoint_is_bit_identical(toy_training, one_thread, tmp_path, monkeypatch):
    from softargmax.experiments.nmt import training

    saved = []
    real = training.save_checkpoint

    def counting(path, state, fp, **kw):
        saved.append(state["record"]["steps_done"])
        return real(path, state, fp, **kw)

    monkeypatch.setattr(training, "save_checkpoint", counting)
    whole = toy_training(tmp_path / "whole")
    # every 3 steps, at every evaluation (4, 8, 12), and never twice at one step
    assert saved == [3, 4, 6, 8, 9, 12]

    real_save = torch.save

    def half_and_killed(obj, f, *a, **k):  # the process dies with half the file on the disk
        real_save(obj, f, *a, **k)
        Path(f).write_bytes(Path(f).read_bytes()[: Path(f).stat().st_size // 2])
        raise Killed

    def killed(out, n):
        """Train in ``out`` until the (n+1)-th checkpoint write, which is killed halfway."""
        calls = []

        def dies(path, state, fp, **kw):
            calls.append(1)
            if len(calls) > n:
                monkeypatch.setattr(torch, "save", half_and_killed)
            return real(path, state, fp, **kw)

        monkeypatch.setattr(training, "save_checkpoint", dies)
        with pytest.raises(Killed):
            toy_training(out)
        monkeypatch.setattr(training, "save_checkpoint", real)
        monkeypatch.setattr(torch, "save", real_save)

    for n in range(1, len(saved)):  # killed while writing the (n+1)-th checkpoint: resumed from the n-th
        killed(tmp_path / f"killed{n}", n)
        lines = []
        resumed = toy_training(tmp_path / f"killed{n}", log=lines.append)
        assert f"[entmax15] resumed at step {saved[n - 1]}" in lines
        _same_run(resumed, whole)
    # the comparison can fail: without the random-number states, dropout differs after a resume
    killed(tmp_path / "lost", 1)
    monkeypatch.setattr(training, "set_rng_state", lambda state: None)
    lost = toy_training(tmp_path / "lost")
    assert lost["record"]["train_loss"][:3] == whole["record"]["train_loss"][:3]
    assert lost["record"]["train_loss"][3:] != whole["record"]["train_loss"][3:]


def test_a_damaged_checkpoint_falls_back_to_the_previous_one_or_to_training_from_scratch(toy_training, one_thread,
                                                                                          tmp_path, monkeypatch):
    from softargmax.experiments.nmt import training

    whole = toy_training(tmp_path / "whole")
    out = tmp_path / "run"
    real = training.save_checkpoint
    calls = []

    def stop_after_three(path, state, fp, **kw):
        calls.append(1)
        if len(calls) > 3:
            raise Killed
        return real(path, state, fp, **kw)

    monkeypatch.setattr(training, "save_checkpoint", stop_after_three)
    with pytest.raises(Killed):
        toy_training(out)
    monkeypatch.undo()
    ckpt, prev = out / "checkpoint.pt", out / "checkpoint.prev.pt"
    assert ckpt.exists() and prev.exists()  # steps 6 and 4
    # truncated: the previous checkpoint (step 4) is used, and the log says so with both paths
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    lines = []
    _same_run(toy_training(out, log=lines.append), whole)
    text = "\n".join(lines)
    assert f"checkpoint {ckpt} cannot be read" in text and f"resuming from the previous checkpoint {prev}" in text
    assert "[entmax15] resumed at step 4" in lines and (out / "checkpoint.pt.unreadable").exists()
    # both damaged (flipped bytes, and not a checkpoint at all): the system is trained again from scratch
    for path in (ckpt, prev):
        data = bytearray(path.read_bytes())
        data[len(data) // 3: len(data) // 3 + 64] = bytes(64)
        path.write_bytes(bytes(data))
    lines = []
    _same_run(toy_training(out, log=lines.append), whole)
    text = "\n".join(lines)
    assert f"checkpoint {ckpt} cannot be read" in text and f"checkpoint {prev} cannot be read" in text
    assert f"no readable checkpoint left in {out}: training from scratch" in text


def test_rng_state_covers_python_numpy_and_torch():
    import numpy as np

    state = rng_state()
    first = (random.random(), float(np.random.rand()), torch.rand(2).tolist(), torch.randint(0, 9, (3,)).tolist())
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), torch.rand(2).tolist(), torch.randint(0, 9, (3,)).tolist()) == first


# --- fingerprints -------------------------------------------------------------------------------------------------

def test_a_checkpoint_of_another_run_is_refused_naming_the_field(tmp_path):
    fp = fingerprint("translation", "smoke", "softmax", 0, data=["multi30k"])
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"weights": torch.ones(3)}, fp)
    assert torch.equal(load_checkpoint(path, fp)["weights"], torch.ones(3))
    others = {"experiment": "adaptive-attention", "preset": "default", "system": "sparsemax", "seed": 1,
              "softargmax": "0.0.1"}
    for field, value in others.items():
        with pytest.raises(CheckpointMismatchError, match=f"{field} is {fp[field]!r} there and {value!r} in this run"):
            load_checkpoint(path, {**fp, field: value})
    with pytest.raises(CheckpointMismatchError, match="data is"):
        load_checkpoint(path, fingerprint("translation", "smoke", "softmax", 0, data=["snli"]))
    # a checkpoint of the format before fingerprints
    torch.save({"model": {}, "record": {}}, tmp_path / "old.pt")
    with pytest.raises(CheckpointMismatchError, match="without a fingerprint"):
        load_checkpoint(tmp_path / "old.pt", fp)


@needs_data
def test_resume_refuses_the_checkpoints_of_another_seed_or_preset(uninterrupted, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(uninterrupted[0], out)
    before = (out / "results.json").read_bytes()
    base = ["reproduce", "translation", "--systems", "softmax", "--data-dir", str(SHARED), "--out", str(out)]
    # each seed has its own folder: seed 0's checkpoints found in seed 1's (copied by hand) are refused
    runs = out / "runs" / "softmax"
    shutil.copytree(runs / "seed0", runs / "seed1")
    assert main(base + ["--preset", "smoke", "--seed", "1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {runs / 'seed1' / 'checkpoint.pt'} belongs to another run" in err
    assert "seed is 0 there and 1 in this run" in err
    assert main(base + ["--preset", "default", "--resume"]) == 2
    assert "preset is 'smoke' there and 'default' in this run" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == before


# --- the output folder ---------------------------------------------------------------------------------------------

@needs_data
def test_fresh_moves_the_tokenizer_checkpoints_run_records_and_log_aside(tmp_path, monkeypatch, capsys):
    """``--fresh`` starts over: the report is then built from the new runs alone; what the earlier runs derived is
    moved into a dated folder, not deleted (a --fresh run again by mistake loses nothing)."""
    from softargmax.experiments import translation

    out = tmp_path / "run"
    derived = [out / "spm.model", out / "spm.json", out / "runs" / "softmax" / "seed0" / "checkpoint.pt",
               out / "records" / "sparsemax-seed0.json", out / ".results.json.abcd1234.tmp.json"]
    for path in [*derived, out / "log.txt"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("left by an earlier run")
    (out / "results.json").write_text("{}")
    seen = {}

    def run(**kwargs):  # what the run finds when it starts
        seen.update({p.name: p.exists() for p in derived})

    monkeypatch.setattr(translation, "run", run)
    assert main(["reproduce", "translation", "--preset", "smoke", "--out", str(out), "--fresh"]) == 0
    assert seen and not any(seen.values()), seen
    assert "left by an earlier run" not in (out / "log.txt").read_text()  # a new log
    assert (out / "results.json").exists()  # replaced only when a run finishes
    aside = next(out.glob("previous-*"))
    for path in [*derived[:-1], out / "log.txt"]:  # all but the killed writer's temporary file, deleted
        assert (aside / path.relative_to(out)).read_text() == "left by an earlier run", path
    assert f"--fresh: moved runs, records, spm.model, spm.json, log.txt of the earlier runs to {aside}/" in capsys.readouterr().out


@needs_data
def test_a_tokenizer_learned_with_other_settings_is_learned_again(tmp_path):
    from softargmax.experiments import translation
    from softargmax.experiments.nmt.tokenizer import Tokenizer

    out = tmp_path / "run"
    out.mkdir()
    src, tgt = _toy()
    Tokenizer.train(src + tgt, 60).save(out / "spm.model")  # e.g. another preset's, and no record of its settings
    lines = []
    P = translation.preset_settings("smoke")
    *_, tok = translation.load_data(P, str(SHARED), False, out, 0, log=lines.append)
    assert len(tok) == P["vocab"] and any("learning it again" in line for line in lines)
    assert json.loads((out / "spm.json").read_text())["vocab"] == P["vocab"]
    lines.clear()
    *_, again = translation.load_data(P, str(SHARED), False, out, 0, log=lines.append)
    assert len(again) == P["vocab"] and not any("learning it again" in line for line in lines)


@needs_data
def test_a_second_run_into_a_folder_in_use_stops_and_a_dead_runs_lock_is_taken_over(tmp_path, capsys, monkeypatch):
    from softargmax.experiments import translation

    out = tmp_path / "shared-out"
    first = subprocess.Popen([sys.executable, *SMOKE, "--out", str(out)], env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        assert "Multi30k" in first.stdout.readline()  # it holds the folder now
        t0 = time.perf_counter()
        assert main(["reproduce", "translation", "--preset", "smoke", "--seed", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert time.perf_counter() - t0 < 5
        assert f"{out} is in use by another run (process {first.pid} " in err and "--out" in err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    assert (out / ".softargmax.lock").exists()  # a killed process cannot clean up
    monkeypatch.setattr(translation, "run", lambda log, **kw: log("ran"))
    assert main(["reproduce", "translation", "--preset", "smoke", "--out", str(out), "--resume"]) == 0
    assert f"the lock left by process {first.pid} " in (out / "log.txt").read_text()
    assert not (out / ".softargmax.lock").exists()


def test_output_lock_in_one_process():
    import tempfile

    folder = Path(tempfile.mkdtemp())
    with OutputLock(folder, command="first") as lock:
        assert lock.held and lock.stale is None
        with pytest.raises(OutputInUseError, match=f"process {os.getpid()} .*: first"):
            OutputLock(folder).acquire()
    again = OutputLock(folder).acquire()  # released on exit
    assert again.stale is None
    again.release()


# --- atomic writes and a full disk ------------------------------------------------------------------------------

def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = atomic_write(tmp_path / "results.json", "good")
    with pytest.raises(KeyboardInterrupt):
        with _common.atomic_path(path) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt  # Ctrl-C in the middle of a write
    assert path.read_text() == "good" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    # a temporary left by a killed writer is recognised and removed; other files are not
    (tmp_path / ".results.json.x1y2z3_a.tmp.json").write_text("half")
    (tmp_path / ".keep.tmp").write_text("not ours")
    assert [p.name for p in remove_temporaries(tmp_path)] == [".results.json.x1y2z3_a.tmp.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keep.tmp", "results.json"]


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    path = atomic_write(tmp_path / "report.md", "previous report")
    monkeypatch.setattr(os, "fsync", _no_space)  # the disk fills while the data are flushed
    with pytest.raises(DiskFullError, match=f"no space left on device: could not write {re.escape(str(path))}"):
        atomic_write(path, "new report")
    monkeypatch.undo()
    real = Path.write_text

    def short(self, data, *a, **k):  # the disk fills in the middle of the write
        real(self, data[: len(data) // 2], *a, **k)
        _no_space()

    monkeypatch.setattr(Path, "write_text", short)
    with pytest.raises(DiskFullError) as e:
        atomic_write(path, "new report")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    monkeypatch.undo()
    assert path.read_text() == "previous report" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_torch_saves_short_write_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    fp = fingerprint("translation", "smoke", "softmax", 0)
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"step": 1}, fp)
    real = torch.save

    def short(obj, f, *a, **k):  # what torch.save raises when the disk fills during its write
        real(obj, f, *a, **k)
        Path(f).write_bytes(Path(f).read_bytes()[:100])
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 452160 vs 452048")

    monkeypatch.setattr(torch, "save", short)
    with pytest.raises(DiskFullError, match=f"no space left on device: could not write {re.escape(str(path))}"):
        save_checkpoint(path, {"step": 2}, fp)
    monkeypatch.undo()
    assert load_checkpoint(path, fp) == {"step": 1} and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_the_command_line_reports_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys):
    from softargmax.experiments import bisection

    def run(out, log, seed, **kw):  # an experiment's last step, as every experiment ends its run
        return _common.finish({"settings": {"seed": seed}}, Path(out), lambda r, d: [], lambda r, f: "report\n", log)

    monkeypatch.setattr(bisection, "run", run)
    out = tmp_path / "bisection"
    args = ["reproduce", "bisection", "--preset", "smoke", "--out", str(out)]
    assert main(args) == 0
    before = (out / "results.json").read_bytes()
    monkeypatch.setattr(os, "fsync", _no_space)
    assert main(args + ["--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no space left on device: could not write {out / 'results.json'}")
    assert (out / "results.json").read_bytes() == before and "Traceback" not in err
    assert "error: DiskFullError: no space left on device" in (out / "log.txt").read_text()


def test_checkpoint_every_is_checked_and_refused_where_no_checkpoints_are_kept(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "translation", "--checkpoint-every", "0"])
    assert "argument --checkpoint-every: give a positive integer, got 0" in capsys.readouterr().err
    assert main(["reproduce", "bisection", "--preset", "smoke", "--checkpoint-every", "5", "--out", "/nonexistent/x"]) == 2
    assert capsys.readouterr().err.startswith("error: --checkpoint-every: bisection does not take it")


def test_the_report_names_the_test_of_resumed_runs():
    pytest.importorskip("sentencepiece")
    from softargmax.experiments.nmt import report

    name = test_a_smoke_translation_run_killed_at_random_moments_and_resumed_until_it_finishes_equals_an_uninterrupted_run
    words = name.__name__[len("test_"):].replace("_", " ")
    assert f"“{words}”" in report.RESUME_TEST


# --- Ctrl-C and SIGTERM: a checkpoint, the lock released, one line that says how to continue -----------------------

@needs_data
@pytest.mark.parametrize("sig, code, said, fresh", [(signal.SIGINT, 130, "interrupted (Ctrl-C)", ["--fresh"]),
                                                    (signal.SIGTERM, 143, "terminated (SIGTERM)", [])])
def test_ctrl_c_and_sigterm_stop_cleanly_with_a_checkpoint_and_the_command_printed_continues(sig, code, said, fresh,
                                                                                            tmp_path, ctrl_c_raises):
    out = tmp_path / "run"
    # no --checkpoint-every: the checkpoint is the one the signal makes the run save
    options = [*SMOKE[3:-4], "--data-dir", str(SHARED), "--systems", "softmax", "--out", str(out)]
    command = [sys.executable, *SMOKE[:3], *fresh, *options]
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    for line in proc.stdout:
        if re.search(r"\[softmax\] step 1/", line):
            proc.send_signal(sig)
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    lines = stderr.strip().splitlines()
    assert 1 <= len(lines) <= 3 and "Traceback" not in stderr, stderr
    # the command that continues: the same without --fresh (which would set the checkpoint aside)
    assert lines[-1] == (f"translation: {said}; to continue from its checkpoints, run: python -m softargmax reproduce "
                         + shlex.join(options)), lines[-1]
    assert "stopped at step" in stdout and "checkpoint saved" in stdout, stdout
    assert not (out / ".softargmax.lock").exists()  # the lock is released
    log = (out / "log.txt").read_text()
    assert said in log.splitlines()[-1] and "error: KeyboardInterrupt" not in log
    steps = int(re.search(r"stopped at step (\d+)", stdout).group(1))
    assert (out / "runs" / "softmax" / "seed0" / "checkpoint.pt").exists()
    # the command printed continues from the checkpoint and finishes
    again = subprocess.run([sys.executable, *SMOKE[:3], *options], env=_env(), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resumed at step {steps}" in again.stdout


def test_an_unwritable_output_folder_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for out, why in ((a_file, "a file of that name exists"), (a_file / "below", "a part of the path is a file")):
        assert main(["reproduce", "bisection", "--preset", "smoke", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: cannot write the output folder {out}: {why}"), err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main(["reproduce", "bisection", "--preset", "smoke", "--out", str(locked / "x")]) == 2
        assert "permission denied" in capsys.readouterr().err
    # --debug shows the traceback
    with pytest.raises(FileExistsError):
        main(["reproduce", "bisection", "--preset", "smoke", "--out", str(a_file), "--debug"])
