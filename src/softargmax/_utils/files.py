"""Writing a file atomically: to a temporary file beside it, flushed to the disk, then renamed over it.

:func:`atomic_path` is what the benchmarks (:func:`softargmax.bench.save`) and the experiments
(:mod:`softargmax.experiments._files`, which adds a clear "no space left on device" error) write
through.  ``os.replace`` is atomic within one file system on POSIX and Windows, so a process
killed at any moment leaves either the previous complete file or the new one, never a
truncated file.  A temporary file left by a killed process is named ``.<name>.<random>.tmp<suffix>``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union


def _mode(path: Path) -> int:
    """The permissions of ``path`` if it exists, else those a new file gets (0o666 less the umask)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Union[str, Path]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it replaces ``path`` atomically.

    The body writes the whole file to the yielded path (same folder, same suffix, so that
    writers that pick a format from the suffix keep working).  On normal exit the file is
    flushed to the disk and renamed over ``path`` (``os.replace``); on any exception it is
    deleted and ``path`` is left as it was.  The folder is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, _mode(path))  # mkstemp makes it private; the file gets the mode a plain write would give
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_folder(path.parent)


def atomic_write(path: Union[str, Path], data: Union[str, bytes], encoding: str = "utf-8") -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically (see :func:`atomic_path`); returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding=encoding)
        else:
            tmp.write_bytes(data)
    return path
