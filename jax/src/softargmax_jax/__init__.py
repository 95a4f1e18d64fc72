"""softargmax_jax: sparse and f-divergence softargmax operators and their Fenchel–Young losses for JAX.

The same mathematics and conventions as the PyTorch package ``softargmax``, as pure functions that
work under ``jax.jit``, ``jax.vmap``, ``jax.grad``, ``jax.jvp`` and ``jax.vjp``, with closed-form
derivatives (never through the solver's iterations).  It depends on ``jax`` and ``numpy`` only.

Operators: :func:`sparsemax`, :func:`entmax15`, :func:`entmax` (α a number or one per row, with its
α-gradient), :func:`alpha_relu`, :func:`f_softargmax` and :func:`f_softmax` for every divergence of
:mod:`softargmax_jax.divergences`, :func:`f_sigmoid` and :func:`f_softplus`, :func:`budget_sparsemax`, :func:`normmax`; sparse :func:`attention` and :func:`attention_weights`; entmax sampling, :func:`sample`
(:mod:`softargmax_jax.sampling`).  Losses (per example, as
optax's): :func:`fenchel_young_loss` and its named forms, :func:`binary_f_divergence_loss`, :func:`normmax_loss` and
:func:`budget_sparsemax_loss`, the chunked
:func:`linear_fenchel_young_loss` (with a teacher's top-k, :func:`teacher_target`), and the vocabulary-parallel :func:`vocab_parallel_fenchel_young_loss`
for ``shard_map``.  Choosing α-ReLU's threshold: :mod:`softargmax_jax.alpha_relu_tau`.
"""

from . import alpha_relu_tau, divergences, sampling
from .attention import attention, attention_weights
from .budget import budget_sparsemax
from .divergences import Divergence, get_divergence
from .linear import linear_fenchel_young_loss
from .losses import (
    alpha_relu_loss,
    binary_f_divergence_loss,
    entmax15_loss,
    entmax_loss,
    f_divergence_loss,
    fenchel_young_loss,
    sparsemax_loss,
)
from .normmax import budget_sparsemax_loss, normmax, normmax_loss
from .operators import (
    alpha_relu,
    entmax,
    entmax15,
    entmax_alpha_derivative,
    f_sigmoid,
    f_softargmax,
    f_softmax,
    f_softplus,
    safe_softmax,
    sparsemax,
)
from .parallel import vocab_parallel_fenchel_young_loss
from .sampling import sample
from .teacher import teacher_target

__version__ = "0.1.0"

__all__ = [
    "sparsemax",
    "entmax15",
    "entmax",
    "entmax_alpha_derivative",
    "alpha_relu",
    "f_softargmax",
    "f_softmax",
    "f_sigmoid",
    "f_softplus",
    "safe_softmax",
    "budget_sparsemax",
    "normmax",
    "sample",
    "teacher_target",
    "sampling",
    "attention",
    "attention_weights",
    "fenchel_young_loss",
    "sparsemax_loss",
    "entmax15_loss",
    "entmax_loss",
    "alpha_relu_loss",
    "f_divergence_loss",
    "normmax_loss",
    "budget_sparsemax_loss",
    "binary_f_divergence_loss",
    "linear_fenchel_young_loss",
    "vocab_parallel_fenchel_young_loss",
    "Divergence",
    "get_divergence",
    "divergences",
    "alpha_relu_tau",
]
