"""Checks of a run's arguments, made before any work: each bad value is one :class:`UsageError` that names the
argument and the fix.

The experiments' ``run`` functions call them (:func:`._common.begin`), and the command line calls the same checks
on its options before it locks the output folder, applies ``--fresh`` or opens the log, so that a mistake never
costs a vocabulary learned or a model trained first:

* :func:`check_systems`: every name among those accepted, with the closest one suggested;
* :func:`check_device`: ``cpu`` or ``cuda[:N]``, and a CUDA device only where this PyTorch was built with CUDA and
  sees that GPU;
* :func:`check_threads`, :func:`check_count`, :func:`check_seed`: a positive number of threads, of steps or
  processes, and a seed that every random-number generator of the experiments takes (a non-negative integer).
"""

from __future__ import annotations

import difflib
from typing import Collection, Optional

import torch

__all__ = ["UsageError", "check_systems", "check_device", "check_threads", "check_count", "check_seed"]


class UsageError(ValueError):
    """A bad argument of a run: ``"<option>: <what is wrong>; <the fix>"``.

    ``option`` is the argument's name (``"systems"``); the command line reports it as ``--systems`` in one line
    ``error: ...`` with exit status 2, as argparse reports a bad option.  A ``ValueError``, so that callers of the
    library catch it as before.
    """

    def __init__(self, option: str, message: str) -> None:
        self.option, self.message = option, message
        super().__init__(f"{option}: {message}")

    def for_command_line(self) -> str:
        """The message with the option spelled as on the command line (``--systems: ...``)."""
        return f"--{self.option.replace('_', '-')}: {self.message}"


def _closest(name: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_systems(systems: Collection[str], known: Collection[str], option: str = "systems",
                  what: str = "the run") -> None:
    """:class:`UsageError` unless every name of ``systems`` is one of ``known`` (and none twice).

    Example:
        >>> check_systems(["softmax", "sparsemx"], ["softmax", "sparsemax"], what="translation")
        Traceback (most recent call last):
        ...
        softargmax.experiments._options.UsageError: systems: unknown system 'sparsemx' (did you mean sparsemax?); translation takes softmax, sparsemax
    """
    if isinstance(systems, str):
        raise UsageError(option, f"give a list of names, got the string {systems!r}")
    names = list(systems)
    if not names:
        raise UsageError(option, f"name at least one system; {what} takes {', '.join(known)}")
    for name in names:
        if name not in known:
            raise UsageError(option, f"unknown system {name!r}{_closest(str(name), known)}; {what} takes "
                             f"{', '.join(known)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(option, f"{', '.join(twice)} named twice; name each system once")


def check_device(device: object, option: str = "device") -> str:
    """The device's name if a run can use it: ``cpu``, or ``cuda`` / ``cuda:N`` where this PyTorch has CUDA and
    sees GPU N; else :class:`UsageError` with the fix (install a CUDA build of PyTorch, pick a visible GPU, or
    use ``cpu``)."""
    try:
        dev = torch.device(str(device))
    except (RuntimeError, ValueError):
        raise UsageError(option, f"{device!r} is not a device; give cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return str(device)
    if dev.type != "cuda":
        raise UsageError(option, f"{device!r}: the experiments run on cpu or cuda[:N], not {dev.type}")
    if torch.version.cuda is None:
        raise UsageError(option, f"{device!r}: this PyTorch ({torch.__version__}) was built without CUDA; install a "
                         "CUDA build (https://pytorch.org/get-started/locally/) or use --device cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UsageError(option, f"{device!r}: PyTorch {torch.__version__} has CUDA {torch.version.cuda} but sees no "
                         "GPU; check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or use --device cpu")
    if dev.index is not None and dev.index >= count:
        raise UsageError(option, f"{device!r}: this machine shows {count} GPU{'s' * (count > 1)} (cuda:0"
                         f"{f' to cuda:{count - 1}' if count > 1 else ''})")
    return str(device)


def check_threads(threads: object, option: str = "threads") -> Optional[int]:
    """``threads`` if it is ``None`` (PyTorch's default) or a positive integer; else :class:`UsageError`."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise UsageError(option, f"give a positive number of CPU threads (e.g. 2), got {threads!r}")
    return threads


def check_count(value: object, option: str) -> int:
    """``value`` if it is a positive integer (steps, processes, repeats); else :class:`UsageError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(option, f"give a positive integer, got {value!r}")
    return value


def check_seed(seed: object, option: str = "seed") -> int:
    """``seed`` if it is a non-negative integer below 2**32 (what every random-number generator the experiments
    use accepts, NumPy's too); else :class:`UsageError`."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise UsageError(option, f"give an integer from 0 to {2**32 - 1}, got {seed!r}")
    return seed
