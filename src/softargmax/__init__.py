"""softargmax: sparse and f-divergence softargmax operators for PyTorch.

Operators: :func:`sparsemax`, :func:`entmax15`, :func:`entmax` (any
α > 0, learnable), :func:`alpha_relu`, :func:`f_softargmax` / :func:`f_softmax`
for every f-divergence, and the binary :func:`f_sigmoid` / :func:`f_softplus`.
Modules live in :mod:`softargmax.nn`, generators in :mod:`softargmax.divergences`,
the threshold solvers in :mod:`softargmax.solvers.threshold`.

The folders are the layers, and imports run one way (``tests/test_imports.py`` checks it):

    _utils → divergences → backends → solvers → operators → losses → nn, compat, integrations
    → tools (analysis, experiments, bench, cli)

``divergences`` holds the mathematics (the generators f and their conjugates); ``backends``
the fused kernels (C on CPU, Triton on GPU), chosen in one place, and the ``Solution``
contract they honour; ``solvers`` the PyTorch reference threshold search; ``operators`` the
public functions; ``losses`` their Fenchel–Young losses; ``nn`` the modules.
"""

from . import _moved, divergences, losses
from .divergences import CustomDivergence, Divergence
from .losses import _library_ops as _loss_ops  # noqa: F401  (register the losses' torch.library operators)
from .losses.functional import (
    alpha_relu_loss,
    binary_f_divergence_loss,
    entmax15_loss,
    entmax_loss,
    f_divergence_loss,
    fenchel_young_loss,
    sparsemax_loss,
)
from .losses.linear import linear_fenchel_young_loss
from .losses.normmax_budget import budget_sparsemax_loss, normmax_loss
from .operators import _library_ops as _custom_ops  # noqa: F401  (register the torch.library operators torch.compile uses)
from .operators import alpha_relu_tau as tau
from .operators import export, mappings, sampling
from .operators.alpha_relu import alpha_relu
from .operators.attention import attention
from .operators.binary import f_sigmoid, f_softplus
from .operators.budget import budget_sparsemax
from .operators.entmax import entmax, entmax15, sparsemax
from .operators.fdiv import f_softargmax, f_softmax
from .operators.mappings import normalize
from .operators.normmax import normmax
from .operators.sampling import sample
from .solvers import threshold

__version__ = "0.1.0"

# the module paths of earlier releases (softargmax.fdiv, ...), once every module above is loaded
_moved.install()

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
    "sample",
    "Divergence",
    "CustomDivergence",
    "divergences",
    "export",
    "losses",
    "mappings",
    "sampling",
    "tau",
    "threshold",
]


_LAZY = ("nn", "analysis", "inspect", "compat")


def __getattr__(name):  # lazy submodules that import torch.nn
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'softargmax' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
