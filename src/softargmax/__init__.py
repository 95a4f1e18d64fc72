"""softargmax: sparse and f-divergence softargmax operators for PyTorch.

Operators: :func:`sparsemax`, :func:`entmax15`, :func:`entmax` (any
α > 0, learnable), :func:`alpha_relu`, :func:`f_softargmax` / :func:`f_softmax`
for every f-divergence, and the binary :func:`f_sigmoid` / :func:`f_softplus`.
Modules live in :mod:`softargmax.nn`, generators in :mod:`softargmax.divergences`,
the threshold solvers in :mod:`softargmax.solvers.threshold`, α-ReLU's threshold estimates in
``softargmax.alpha_relu_tau`` (the module :mod:`softargmax.operators.alpha_relu_tau`).

``softargmax.__all__`` holds the public functions and classes and the public modules
``divergences``, ``losses``, ``mappings``, ``sampling`` and ``alpha_relu_tau``.  The attributes
``softargmax.tau`` and ``softargmax.threshold`` of earlier releases still resolve (to
:mod:`softargmax.operators.alpha_relu_tau` and :mod:`softargmax.solvers.threshold`) but are no
longer exported.

The folders are the layers, and imports run one way (``tests/test_imports.py`` checks it):

    _utils → divergences → backends → solvers → operators → losses → nn, compat, integrations
    → tools (analysis, experiments, bench, cli)

``divergences`` holds the mathematics (the generators f and their conjugates); ``backends``
the fused kernels (C on CPU, Triton on GPU), chosen in one place, and the ``Solution``
contract they honour; ``solvers`` the PyTorch reference threshold search; ``operators`` the
public functions; ``losses`` their Fenchel–Young losses; ``nn`` the modules.
"""

from types import ModuleType as _ModuleType

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
from .losses.teacher import teacher_target
from .operators import _library_ops as _custom_ops  # noqa: F401  (register the torch.library operators torch.compile uses)
from .operators import alpha_relu_tau, export, mappings, sampling
from .operators.alpha_relu import alpha_relu
from .operators.attention import attention
from .operators.binary import f_sigmoid, f_softplus
from .operators.budget import budget_sparsemax
from .operators.decoding import decode_attention
from .operators.entmax import entmax, entmax15, sparsemax
from .operators.fdiv import f_softargmax, f_softmax
from .operators.mappings import normalize
from .operators.normmax import normmax
from .operators.sampling import sample

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
    "teacher_target",
    "attention",
    "decode_attention",
    "normalize",
    "sample",
    "Divergence",
    "CustomDivergence",
    "divergences",
    "export",
    "losses",
    "mappings",
    "sampling",
    "alpha_relu_tau",
]


_LAZY = ("nn", "analysis", "inspect", "compat")


def __getattr__(name: str) -> _ModuleType:  # lazy submodules that import torch.nn, and the old module paths
    # an old path of softargmax._moved is an attribute too (softargmax.fdiv.f_softargmax after `import softargmax.fdiv`,
    # which finds the alias in sys.modules and so sets no attribute), except where a function now has its name
    # (softargmax.entmax, alpha_relu, normmax, attention: found before this is called)
    if name in _LAZY or name in _moved.MOVED:
        import importlib

        return importlib.import_module(f".{name if name in _LAZY else _moved.MOVED[name]}", __name__)
    raise AttributeError(f"module 'softargmax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
