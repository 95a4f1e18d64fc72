"""Which runs of the translation experiment: the ``--runs`` option, the runs one call trains, the runs a preset plans.

A run is one output layer (system) trained with one seed.  :func:`parse_runs` reads the
``"system:seed"`` strings of ``--runs``; :func:`selected_runs` gives the runs one call trains
(those, or ``systems`` × ``seeds``); :func:`planned_runs` compares the preset's plan with the
runs that have a record: which are in, which are owed, which are extra.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Iterable, Optional, Sequence

from .model import SYSTEMS


def parse_runs(runs: Iterable[Any]) -> list[tuple[str, int]]:
    """``(system, seed)`` pairs from ``"system:seed"`` strings (the ``--runs`` option) or from pairs.

    The seed follows the last ``:``, so ``"f:kl:2"`` is the system ``f:kl`` with seed 2.

    Args:
        runs: ``"system:seed"`` strings or ``(system, seed)`` pairs.

    Returns:
        the pairs, in the order given.

    Example:
        >>> parse_runs(["softmax:1", "entmax15:2", ("alpha_relu", 3)])
        [('softmax', 1), ('entmax15', 2), ('alpha_relu', 3)]
    """
    if isinstance(runs, (str, bytes)):
        raise TypeError(f"runs must be a list of 'system:seed' strings or (system, seed) pairs, got {runs!r}")
    out = []
    for item in runs:
        if isinstance(item, str):
            system, _, seed = item.rpartition(":")
            if not system or not seed.strip().lstrip("-").isdigit():
                raise ValueError(f"runs: {item!r} is not of the form system:seed (e.g. softmax:1)")
            pair = (system, int(seed))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str) \
                and isinstance(item[1], int) and not isinstance(item[1], bool):
            pair = (item[0], item[1])
        else:
            raise TypeError(f"runs: {item!r} is neither a 'system:seed' string nor a (system, seed) pair")
        out.append(pair)
    return out


def selected_runs(P: dict, seed: int = 0, systems: Optional[Collection[str]] = None,
                  seeds: Optional[Sequence[int]] = None, runs: Optional[Iterable[Any]] = None) -> list[tuple[str, int]]:
    """The ``(system, seed)`` runs one call trains, in training order.

    Args:
        P: the preset's settings (:func:`..translation.preset_settings`).
        seed: the seed of presets that name none (``--seed``).
        systems: the systems (default: the preset's ``systems``, else all four); every one is
            trained with every seed.
        seeds: the seeds (default: the preset's ``seeds``, else ``[seed]``).
        runs: instead of ``systems`` × ``seeds``, the runs themselves (:func:`parse_runs`).

    Returns:
        the runs, each once.

    Example:
        >>> from softargmax.experiments.translation import preset_settings
        >>> selected_runs(preset_settings("gpu"), systems=["softmax", "alpha_relu"], seeds=[2])
        [('softmax', 2), ('alpha_relu', 2)]
        >>> selected_runs(preset_settings("gpu"), runs=["entmax15:3"])
        [('entmax15', 3)]
    """
    if runs is not None:
        if systems is not None or seeds is not None:
            raise ValueError("runs: give either runs or systems and seeds, not both")
        pairs = parse_runs(runs)
        if not pairs:
            raise ValueError("runs must name at least one system:seed")
    else:
        chosen = _seeds(P, seed, seeds)
        pairs = [(s, sd) for s in (P.get("systems", SYSTEMS) if systems is None else systems) for sd in chosen]
    if len(set(pairs)) != len(pairs):
        raise ValueError(f"runs: each system:seed once, got {[f'{s}:{sd}' for s, sd in pairs]}")
    return pairs


def planned_runs(P: dict, present: Iterable[tuple[str, int]] = ()) -> dict:
    """The runs the report owes and those it has: the preset's plan against the runs ``present``.

    A preset that names its seeds (``gpu``) plans its ``systems`` × ``seeds``, to be trained
    by as many calls as needed; the other presets plan the runs present (one call trains them
    all).  Runs present beyond the plan (more seeds, other systems) are ``extra``: in the
    report, not owed.

    Args:
        P: the preset's settings (:func:`..translation.preset_settings`, or a record's ``setup["settings"]``).
        present: the ``(system, seed)`` runs that have a record.

    Returns:
        ``{"systems", "seeds", "in", "owed", "extra", "complete"}``: the systems and seeds
        (the plan's first, then the extra ones), the runs in, owed and extra as ``[system,
        seed]`` lists, and whether no run is owed.

    Example:
        >>> from softargmax.experiments.translation import preset_settings
        >>> plan = planned_runs(preset_settings("gpu"), [("softmax", 1), ("softmax", 4)])
        >>> len(plan["owed"]), plan["extra"], plan["complete"]
        (11, [['softmax', 4]], False)
    """
    present = [(str(s), int(sd)) for s, sd in present]
    if "seeds" in P:
        plan = [(s, sd) for s in P.get("systems", SYSTEMS) for sd in P["seeds"]]
    else:
        plan = sorted(present, key=_run_order(list(SYSTEMS), []))
    key = _run_order([s for s, _ in plan], [sd for _, sd in plan])
    extra = sorted((r for r in present if r not in plan), key=key)
    has = set(present)
    return {"systems": list(dict.fromkeys([s for s, _ in plan] + [s for s, _ in sorted(extra, key=key)])),
            "seeds": list(dict.fromkeys([sd for _, sd in plan] + sorted(sd for _, sd in extra))),
            "in": [[s, sd] for s, sd in sorted(has, key=key)],
            "owed": [[s, sd] for s, sd in plan if (s, sd) not in has],
            "extra": [[s, sd] for s, sd in extra],
            "complete": all(r in has for r in plan)}


def _run_order(systems: list, seeds: list) -> Callable[[tuple[str, int]], tuple]:
    """Sort key of runs: the systems in the order of ``systems`` (then ``SYSTEMS``, then by name), then the seeds
    in the order of ``seeds`` (then by value)."""
    known = list(dict.fromkeys([*systems, *SYSTEMS]))

    def key(run: tuple[str, int]) -> tuple:
        system, seed = run
        return (known.index(system) if system in known else len(known), system,
                seeds.index(seed) if seed in seeds else len(seeds), seed)

    return key


def _seeds(P: dict, seed: int, seeds: Optional[Iterable[int]]) -> list[int]:
    """The seeds to train every system with: ``seeds``, else the preset's, else ``[seed]``; distinct integers."""
    chosen = list(P.get("seeds", (seed,))) if seeds is None else list(seeds)
    if not chosen or len(set(chosen)) != len(chosen) or not all(isinstance(s, int) for s in chosen):
        raise ValueError(f"seeds must be distinct integers, got {chosen!r}")
    return chosen
