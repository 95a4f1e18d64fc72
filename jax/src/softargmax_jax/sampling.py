r"""Sampling from a sparse distribution over classes: sparsemax, entmax, any f-softargmax of the scores.

Entmax sampling (Martins, Marinho & Martins, *Sparse Text Generation*, EMNLP 2020,
https://arxiv.org/abs/2004.02644) draws the next token from :math:`p = \operatorname{entmax}_\alpha(\ell / T)`
instead of :math:`\operatorname{softmax}(\ell / T)`: tokens off the support have probability exactly zero,
so the tail is cut by the model itself rather than by a top-k or top-p threshold.  The same holds for
every f-softargmax with a sparse generator, and with a reference measure ``q`` (Roulet et al., 2025).
:func:`log_probabilities` gives :math:`\log p` (``-inf`` off the support), what
``jax.random.categorical`` takes; :func:`sample` draws with it.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_array, concrete
from .divergences import Divergence
from .operators import f_softargmax

Array = jax.Array

__all__ = ["probabilities", "log_probabilities", "sample"]

_NAMES = {"softmax": ("kl", {}), "sparsemax": ("chi_square", {}), "entmax15": ("alpha", {"alpha": 1.5})}


def probabilities(logits: Array, mapping: Union[str, Divergence] = "entmax15", *, alpha: Optional[float] = None,
                  q: Optional[Array] = None, temperature: float = 1.0) -> Array:
    r"""The distribution to sample from: a mapping of the logits at a temperature, over the last axis.

    .. math::

        p = \operatorname{mapping}(\ell / T) = \operatorname{f\_softargmax}_f(\ell;\ q,\ \beta = T),

    a constant (no derivative: ``jax.lax.stop_gradient``), in float32 (float64 for float64 logits).
    Sparse mappings give exactly zero probability off their support (Martins et al., 2020).

    Args:
        logits: ``[..., V]`` scores; ``-inf`` entries get probability 0 (a row needs a finite one).
        mapping: ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, ``"entmax"`` (with ``alpha``), a divergence
            name or a :class:`~softargmax_jax.divergences.Divergence`. Default: ``"entmax15"``.
        alpha: α of ``"entmax"`` / ``"alpha"``. Default: ``None`` (1.5).
        q: optional reference measure, positive, broadcastable to ``logits`` (e.g. ``[V]``). Default: ``None``.
        temperature: :math:`T > 0`. Default: ``1.0``.

    Returns:
        the probabilities, of ``logits``' shape.

    Raises:
        ValueError: where the logits are not traced, a row with no finite logit, or NaN logits.

    Examples:
        >>> import numpy as np, jax.numpy as jnp
        >>> from softargmax_jax.sampling import probabilities
        >>> logits = jnp.array([2.0, 1.8, 0.0, -1.0])
        >>> print(np.round(np.asarray(probabilities(logits, "sparsemax")), 4))
        [0.6 0.4 0.  0. ]
        >>> print(np.round(np.asarray(probabilities(logits, "sparsemax", temperature=4.0)), 4))
        [0.5167 0.4667 0.0167 0.    ]

    References:
        Pedro Henrique Martins, Zita Marinho and André F. T. Martins, *Sparse Text Generation*,
        EMNLP 2020, https://arxiv.org/abs/2004.02644
    """
    logits = check_array(logits, "logits")
    if logits.ndim < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (class) axis, got shape {logits.shape}")
    v = concrete(logits)
    if v is not None and v.size:
        if bool(np.any(np.max(v, -1) == -np.inf)):
            raise ValueError("logits: a row has no finite entry (nothing can be sampled)")
        if bool(np.any(np.isnan(v))):
            raise ValueError("logits: NaN entries")
    x = jax.lax.stop_gradient(logits)
    x = x.astype(jnp.float64 if x.dtype == jnp.float64 else jnp.float32)
    params: dict[str, Any] = {}
    if isinstance(mapping, str) and mapping in _NAMES:
        div, params = _NAMES[mapping]
        if alpha is not None:
            raise ValueError(f"alpha is a parameter of 'entmax' and 'alpha', not of {mapping!r}")
    elif mapping in ("entmax", "alpha"):
        div, params = "alpha", {"alpha": 1.5 if alpha is None else alpha}
    else:
        div = mapping  # type: ignore[assignment]
        if alpha is not None:
            raise ValueError(f"alpha is a parameter of 'entmax' and 'alpha', not of {mapping!r}")
    qq = None if q is None else jax.lax.stop_gradient(jnp.asarray(q)).astype(x.dtype)
    return f_softargmax(x, div, q=qq, temperature=temperature, **params)


def log_probabilities(logits: Array, mapping: Union[str, Divergence] = "entmax15", *,
                      alpha: Optional[float] = None, q: Optional[Array] = None, temperature: float = 1.0) -> Array:
    r"""The log-probabilities of :func:`probabilities`: exactly :math:`-\infty` off the support.

    .. math::

        \log p = \log \operatorname{mapping}(\ell / T), \qquad \operatorname{softmax}(\log p) = p,

    so ``jax.random.categorical(key, log_probabilities(logits))`` draws from :math:`p` exactly.

    Args:
        logits, mapping, alpha, q, temperature: as in :func:`probabilities`.

    Returns:
        :math:`\log p`, of ``logits``' shape.

    Examples:
        >>> import numpy as np, jax, jax.numpy as jnp
        >>> from softargmax_jax.sampling import log_probabilities
        >>> logp = log_probabilities(jnp.array([2.0, 1.8, 0.0, -1.0]), "sparsemax")
        >>> print(np.round(np.asarray(logp), 4))
        [-0.5108 -0.9163    -inf    -inf]
        >>> print(np.round(np.asarray(jax.nn.softmax(logp)), 4))
        [0.6 0.4 0.  0. ]

    References:
        Pedro Henrique Martins, Zita Marinho and André F. T. Martins, *Sparse Text Generation*,
        EMNLP 2020, https://arxiv.org/abs/2004.02644
    """
    return jnp.log(probabilities(logits, mapping, alpha=alpha, q=q, temperature=temperature))


def sample(key: Array, logits: Array, mapping: Union[str, Divergence] = "entmax15", *,
           alpha: Optional[float] = None, q: Optional[Array] = None, temperature: float = 1.0,
           num_samples: int = 1) -> Array:
    r"""Draw class indices from a sparse distribution of the logits: entmax sampling and its relatives.

    .. math::

        i \sim p = \operatorname{mapping}(\ell / T),

    with :math:`p` from :func:`probabilities`: an index off the support (:math:`p_i = 0`) is never drawn
    (Martins et al., 2020).  The draws are ``jax.random.categorical`` of :func:`log_probabilities`.

    Args:
        key: a ``jax.random`` key.
        logits: ``[..., V]`` scores.
        mapping, alpha, q, temperature: as in :func:`probabilities`.
        num_samples: draws per row, with replacement (a positive int). Default: ``1``.

    Returns:
        ``[..., num_samples]`` integer indices.

    Examples:
        >>> import numpy as np, jax, jax.numpy as jnp, softargmax_jax as sj
        >>> logits = jnp.array([[2.0, 1.8, 0.0, -1.0], [0.0, 0.0, 5.0, 0.0]])
        >>> draws = sj.sample(jax.random.key(0), logits, "sparsemax", num_samples=1000)
        >>> draws.shape
        (2, 1000)
        >>> np.unique(np.asarray(draws[0])), np.unique(np.asarray(draws[1]))  # only the support
        (array([0, 1], dtype=int32), array([2], dtype=int32))

    References:
        Pedro Henrique Martins, Zita Marinho and André F. T. Martins, *Sparse Text Generation*,
        EMNLP 2020, https://arxiv.org/abs/2004.02644
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    logp = log_probabilities(logits, mapping, alpha=alpha, q=q, temperature=temperature)
    draws = jax.random.categorical(key, logp, axis=-1, shape=(num_samples,) + logp.shape[:-1])
    return jnp.moveaxis(draws, 0, -1)
