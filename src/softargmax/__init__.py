"""softargmax: sparse and f-divergence softargmax operators for PyTorch.

Operators: :func:`sparsemax`, :func:`entmax15`, :func:`entmax` (any
α > 0, learnable), :func:`alpha_relu`, :func:`f_softargmax` / :func:`f_softmax`
for every f-divergence, and the binary :func:`f_sigmoid` / :func:`f_softplus`.
Modules live in :mod:`softargmax.nn`, generators in :mod:`softargmax.divergences`,
the threshold solvers in :mod:`softargmax.threshold`.
"""

from . import _custom_ops, _loss_ops, divergences, losses, mappings, tau, threshold  # noqa: F401  (register the torch.library operators torch.compile uses)
from .alpha_relu import alpha_relu
from .attention import attention
from .binary import f_sigmoid, f_softplus
from .budget import budget_sparsemax
from .divergences import CustomDivergence, Divergence
from .entmax import entmax, entmax15, sparsemax
from .fdiv import f_softargmax, f_softmax
from .fused import linear_fenchel_young_loss
from .losses import (
    alpha_relu_loss,
    binary_f_divergence_loss,
    entmax15_loss,
    entmax_loss,
    f_divergence_loss,
    fenchel_young_loss,
    sparsemax_loss,
)
from .mappings import normalize
from .norm_budget_losses import budget_sparsemax_loss, normmax_loss
from .normmax import normmax

__version__ = "0.1.0"

__all__ = [
    "sparsemax",
    "entmax15",
    "entmax",
    "alpha_relu",
    "normmax",
    "budget_sparsemax",
    "normmax_loss",
    "budget_sparsemax_loss",
    "f_softargmax",
    "f_softmax",
    "f_sigmoid",
    "f_softplus",
    "fenchel_young_loss",
    "sparsemax_loss",
    "entmax15_loss",
    "entmax_loss",
    "alpha_relu_loss",
    "f_divergence_loss",
    "binary_f_divergence_loss",
    "linear_fenchel_young_loss",
    "attention",
    "normalize",
    "Divergence",
    "CustomDivergence",
    "divergences",
    "losses",
    "mappings",
    "tau",
    "threshold",
]


_LAZY = ("nn", "inspect", "compat")


def __getattr__(name):  # lazy submodules that import torch.nn
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'softargmax' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
