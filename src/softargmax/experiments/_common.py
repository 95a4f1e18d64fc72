"""What every ``softargmax reproduce`` experiment does before and after its own work.

:func:`begin` checks the preset and system names, sets the CPU threads and creates the
output folder; :func:`environment` records the software versions; :func:`finish` writes
``results.json``, the PNG figures and ``report.md``; :func:`pyplot` gives matplotlib's
``pyplot`` with a file backend, or ``None`` when matplotlib is not installed (then the
report is written without figures).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Callable, Optional

import torch


def begin(preset: str, presets: dict, systems, known, threads: Optional[int], out: str,
          prefixes: dict = None) -> tuple[dict, Path, float]:
    """``(preset settings, output folder, start time)``; ``ValueError`` names a bad preset or system.

    ``prefixes`` maps a prefix to what follows it, e.g. ``{"f:": "<divergence>"}``: system
    names that start with one of them are accepted besides those in ``known``.
    """
    if preset not in presets:
        raise ValueError(f"preset must be one of {sorted(presets)}, got {preset!r}")
    prefixes = prefixes or {}
    unknown = [s for s in systems if s not in known and not str(s).startswith(tuple(prefixes))]
    if unknown:
        patterns = "".join(f" or {p}{what}" for p, what in prefixes.items())
        raise ValueError(f"systems: unknown {unknown}; accepted: {', '.join(known)}{patterns}")
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
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu ({torch.get_num_threads()} threads, {model})"


def environment(t_start: float, device: str = "cpu") -> dict:
    """Device, versions and the seconds since ``t_start``, for ``results["settings"]``."""
    import softargmax

    return {"device": describe_device(device), "torch": torch.__version__,
            "softargmax": softargmax.__version__, "python": platform.python_version(),
            "total_seconds": time.perf_counter() - t_start}


def finish(results: dict, out_dir: Path, write_figures: Callable, render_report: Callable, log=print) -> dict:
    """Write ``results.json``, the figures and ``report.md`` into ``out_dir``; returns ``results``."""
    with open(out_dir / "results.json", "w") as f:
        json.dump(results, f, indent=1, default=float)
    figures = write_figures(results, out_dir)
    (out_dir / "report.md").write_text(render_report(results, figures))
    minutes = results.get("settings", {}).get("total_seconds", 0.0) / 60
    log(f"wrote {out_dir / 'results.json'}, {out_dir / 'report.md'} and {len(figures)} figures in {minutes:.1f} min")
    return results


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend, or ``None`` if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
