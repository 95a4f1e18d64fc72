"""How an experiment writes its files: atomically, with a clear error on a full disk, into a locked folder.

* :func:`atomic_path` / :func:`atomic_write` / :func:`save_figure`: every file a run
  writes (checkpoints, the tokenizer, ``results.json``, ``report.md``, figures) is first
  written to a temporary file in the same folder, flushed to the disk (``fsync``) and then
  renamed over the target with ``os.replace``, which POSIX and Windows make atomic within
  one file system.  A run killed at any moment, a Ctrl-C or a full disk therefore leaves
  either the previous good file or the new complete one, never a truncated file.  A
  temporary file left by a killed process is named ``.<name>.<random>.tmp`` and is removed
  by :func:`remove_temporaries`.
* :class:`DiskFullError`: a write that fails because the disk is full (``OSError`` with
  ``errno.ENOSPC`` or ``EDQUOT``, or the ``RuntimeError`` that ``torch.save`` raises on a
  short write, "unexpected pos ...") becomes one error that says "no space left on device"
  and names the file.
* :class:`OutputLock`: one run at a time in an output folder.  The lock is an advisory
  ``fcntl.flock`` (``msvcrt.locking`` on Windows) on ``<folder>/.softargmax.lock``, which
  the kernel releases when the process ends in any way, so a lock left by a killed run is
  simply taken over (and reported); the file holds the holder's PID, host, start time and
  command line for the message a second run gets.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

from .._utils.files import atomic_path as _atomic_path
from .._utils.files import atomic_write as _atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the name of the lock file inside a locked output folder
LOCK_NAME = ".softargmax.lock"

#: the names :func:`atomic_path` gives its temporary files: ``.<name>.<8 random characters>.tmp<suffix>``
_TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp(\.[^.]*)?")

#: how ``torch.save`` reports a short write (a full disk) in its ``RuntimeError``
_SHORT_WRITE = ("unexpected pos", "file write failed", "PytorchStreamWriter failed writing")


class DiskFullError(OSError):
    """A file could not be written because its disk is full: "no space left on device: could not write <path>".

    ``errno`` is ``errno.ENOSPC`` and ``filename`` the file that was being written; the
    previous version of that file, if any, is unchanged.
    """

    def __init__(self, path: Union[str, Path], detail: str = ""):
        self.path = Path(path)
        message = (f"no space left on device: could not write {self.path}"
                   + (f" ({detail})" if detail else "")
                   + f"; its previous version, if any, is unchanged. Free space on the disk of {self.path.parent} "
                   "(or pass another --out) and run again with --resume")
        super().__init__(errno.ENOSPC, message, str(self.path))

    def __str__(self) -> str:
        return str(self.strerror)  # the message given to OSError in __init__


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says that the disk is full: ``OSError`` ENOSPC/EDQUOT, or ``torch.save``'s short write."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    return isinstance(error, RuntimeError) and any(s in str(error) for s in _SHORT_WRITE)


@contextlib.contextmanager
def atomic_path(path: Union[str, Path]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it replaces ``path`` atomically.

    .. code-block:: python

        with atomic_path(out / "checkpoint.pt") as tmp:
            torch.save(state, tmp)

    The body writes the whole file to ``tmp`` (same folder, same suffix, so that writers
    that pick a format from the suffix keep working).  On normal exit the file is flushed
    to the disk and renamed over ``path`` (``os.replace``, atomic); on any exception it is
    deleted and ``path`` is left as it was.  A full disk raises :class:`DiskFullError`
    naming ``path``.  The folder is created if needed.  (The write itself is
    :func:`softargmax._utils.files.atomic_path`, which the benchmarks use too.)

    Args:
        path: the file to write.

    Yields:
        the temporary path (a :class:`~pathlib.Path`).
    """
    path = Path(path)
    with _disk_full_named(path), _atomic_path(path) as tmp:
        yield tmp


@contextlib.contextmanager
def _disk_full_named(path: Path) -> Iterator[None]:
    """A full disk inside the block raises :class:`DiskFullError` naming ``path``; other errors pass."""
    try:
        yield
    except BaseException as e:
        if is_disk_full(e) and not isinstance(e, DiskFullError):
            raise DiskFullError(path, str(e).strip().splitlines()[0] if str(e).strip() else "") from e
        raise


def atomic_write(path: Union[str, Path], data: Union[str, bytes], encoding: str = "utf-8") -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically (see :func:`atomic_path`); returns ``path``.

    Example:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> atomic_write(folder / "results.json", '{"bleu": 1.0}').read_text()
        '{"bleu": 1.0}'
    """
    with _disk_full_named(Path(path)):
        return _atomic_write(path, data, encoding)


def atomic_json(path: Union[str, Path], obj: object, **kwargs: Any) -> Path:
    """``json.dump(obj)`` into ``path`` atomically (keyword arguments go to :func:`json.dumps`)."""
    return atomic_write(path, json.dumps(obj, **kwargs))


def save_figure(fig: Figure, path: Union[str, Path], **kwargs: Any) -> Path:
    """``fig.savefig(path, **kwargs)`` atomically: a killed run never leaves half a PNG.  Returns ``path``."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".") or None)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, **kwargs)
    return path


def remove_temporaries(folder: Union[str, Path]) -> list:
    """Delete the temporary files that killed writers left under ``folder`` (``.<name>.<random>.tmp*``).

    Call it only while holding the folder's :class:`OutputLock` (no other writer is active).
    Returns the paths removed.
    """
    removed = []
    folder = Path(folder)
    if folder.is_dir():
        for p in folder.rglob(".*.tmp*"):
            if p.is_file() and _TEMPORARY.fullmatch(p.name):
                with contextlib.suppress(OSError):
                    p.unlink()
                    removed.append(p)
    return removed


class OutputInUseError(RuntimeError):
    """Another process holds the :class:`OutputLock` of the folder; the message names it."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class OutputLock:
    """An exclusive lock on an output folder, held for one run.

    .. code-block:: python

        with OutputLock(out) as lock:
            if lock.stale is not None:
                log(f"took over the lock of {out}: {lock.stale}")
            run(...)

    Entering creates the folder and locks ``<folder>/.softargmax.lock`` without waiting; if
    another process holds it, :class:`OutputInUseError` says which (PID, host, start time,
    command).  The lock is an ``fcntl.flock`` (``msvcrt.locking`` on Windows): the kernel
    releases it when the holder exits, crashes or is killed, so a lock left by a dead
    process is taken over at once; :attr:`stale` then describes the dead holder (else it
    is ``None``).  Leaving removes the lock file.  Locks are advisory: they keep out other
    runs, not other programs.  On file systems without ``flock`` (some network mounts) the
    folder is used unlocked, with :attr:`stale` saying so.

    Args:
        folder: the output folder (created if missing).
        command: what the holder is doing, shown to a second run (default: this process's
            command line).
    """

    def __init__(self, folder: Union[str, Path], command: Optional[str] = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.command = command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self.stale: Optional[str] = None
        self._fd: Optional[int] = None

    @staticmethod
    def _try_lock(fd: int) -> bool:
        if sys.platform == "win32":
            import msvcrt

            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            except OSError:
                return False
            return True
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _holder(self) -> str:
        try:
            info = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            info = {}
        if not info:
            return "another process"
        return (f"process {info.get('pid')} on {info.get('host')}, started {info.get('started')}: "
                f"{info.get('command')}")

    def acquire(self) -> "OutputLock":
        """Take the lock, or raise :class:`OutputInUseError` at once.  Returns ``self``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                locked = self._try_lock(fd)
            except OSError as e:  # no flock on this file system
                os.close(fd)
                self.stale = f"this file system does not support locks ({e}); {self.folder} is used unlocked"
                return self
            if not locked:
                os.close(fd)
                raise OutputInUseError(
                    f"{self.folder} is in use by another run ({self._holder()}). Wait for it to finish or stop it, "
                    "or pass another --out; two runs writing into one folder would mix their checkpoints and "
                    "results")
            # the file may have been removed by its last holder between our open and our lock:
            # then we hold a lock on a deleted file, and must lock the new one
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        previous = os.read(fd, 4096).decode("utf-8", "replace").strip()
        if previous:  # the last holder ended without releasing: it was killed
            try:
                info = json.loads(previous)
                pid = int(info.get("pid"))
                state = ("is no longer running" if info.get("host") == socket.gethostname() and not _alive(pid)
                         else "no longer holds it")
                self.stale = (f"the lock left by process {pid} ({info.get('command')}, started "
                              f"{info.get('started')}), which {state}, was taken over")
            except (ValueError, TypeError):
                self.stale = "a lock left by a process that no longer holds it was taken over"
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": self.command}
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode("utf-8"))
        return self

    def release(self) -> None:
        """Remove the lock file and release the lock (nothing happens if it is not held)."""
        if self._fd is None:
            return
        try:
            if os.name != "nt":  # Windows cannot remove an open file: it stays, emptied
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            else:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
