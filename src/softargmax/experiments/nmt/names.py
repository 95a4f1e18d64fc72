"""How the translation report and its figures name the output layers: ``alpha_relu`` is 1.5-ReLU, and so on."""

from __future__ import annotations

#: the report's name of each output layer (``SYSTEMS``); another system (``f:<divergence>``) is shown by its own name
NAMES = {"softmax": "softmax", "sparsemax": "sparsemax", "entmax15": "1.5-entmax", "alpha_relu": "1.5-ReLU"}


def display_name(system: str) -> str:
    """The name the report and the figures give ``system``: ``"1.5-ReLU"`` for ``"alpha_relu"``; ``system`` itself
    when it has none in :data:`NAMES`."""
    return NAMES.get(system, system)
