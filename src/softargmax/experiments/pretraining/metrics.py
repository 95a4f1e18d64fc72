r"""Metrics of the language-model experiment: ε-perplexity, n-gram diversity, repetition, and a paired bootstrap test of
next-token accuracy over seeds and sentences.

**ε-perplexity** (Martins, Marinho & Martins, *Sparse Text Generation*, EMNLP 2020): a sparse
model gives probability 0 to some observed tokens, so its perplexity is infinite.  Adding
:math:`\epsilon` to every probability and renormalizing over the :math:`V` types,

.. math::

    \epsilon\text{-ppl} = \exp\Big(-\frac{1}{T} \sum_{t=1}^{T} \log \frac{p_t(y_t) + \epsilon}{1 + \epsilon V}\Big),

which is the perplexity of the mixture :math:`(1 - \lambda) p + \lambda / V` with
:math:`\epsilon = \lambda / ((1 - \lambda) V)`.  The negative log-likelihood is convex in
:math:`\lambda`, so the :math:`\epsilon` that minimizes it on held-out tokens (the authors'
evaluation picks this optimum) is found by a ternary search (:func:`best_epsilon`).

**Distinct-n** (Li et al., NAACL 2016): the number of distinct n-grams of a set of samples over
their total number of n-grams.  **Repetition** ``rep/w``: the share of sampled tokens that
already occur among the ``w`` tokens before them (after Welleck et al., ICLR 2020).

**Paired bootstrap of accuracy.**  Two systems evaluated on the same test tokens, each with the
same training seeds, are compared by resampling both the seeds (paired: seed ``s`` of A with
seed ``s`` of B, which share the initialization and the data order) and the test sentences
(the same resampled sentences for both), with replacement.  Each draw gives the difference of
the pooled accuracies; the two-sided p-value is that of the centred bootstrap distribution,
:math:`p = (1 + \#\{i : |\delta_i - \bar\delta| \ge |\delta|\}) / (1 + n)`.  With one seed
the test covers the noise of the test set only; with few seeds it under-states the seed noise
(the bootstrap variance of a mean of :math:`S` values is :math:`(S - 1)/S` of the usual
estimate).  Several comparisons use Bonferroni's threshold ``level / m``.

References:

* Pedro Henrique Martins, Zita Marinho and André F. T. Martins, *Sparse Text Generation*, EMNLP 2020, https://arxiv.org/abs/2004.02644
* Jiwei Li, Michel Galley, Chris Brockett, Jianfeng Gao and Bill Dolan, *A Diversity-Promoting Objective Function for Neural Conversation Models*, NAACL 2016, https://arxiv.org/abs/1510.03055
* Sean Welleck, Ilia Kulikov, Stephen Roller, Emily Dinan, Kyunghyun Cho and Jason Weston, *Neural Text Generation with Unlikelihood Training*, ICLR 2020, https://arxiv.org/abs/1908.04319
* Philipp Koehn, *Statistical Significance Tests for Machine Translation Evaluation*, EMNLP 2004, https://aclanthology.org/W04-3250/
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: significance level of the report's claims, before the Bonferroni correction
LEVEL = 0.05


def epsilon_perplexity(p_true: Sequence[float], vocab: int, epsilon: float) -> float:
    """``exp(-mean log((p + ε) / (1 + ε V)))`` of the probabilities ``p_true`` given to the observed tokens."""
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    p = np.asarray(p_true, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return float(np.exp(-np.mean(np.log((p + epsilon) / (1.0 + epsilon * vocab)))))


def best_epsilon(p_true: Sequence[float], vocab: int, iters: int = 200) -> float:
    """The ``ε >= 0`` that minimizes :func:`epsilon_perplexity` of ``p_true`` (ternary search over the mixture weight λ).

    ``0`` when no smoothing helps (every ``p_true > 0`` and ``λ = 0`` is best); a very large ε when the uniform
    distribution itself does best (λ → 1: a model no better than uniform, e.g. barely trained).
    """
    p = np.asarray(p_true, dtype=np.float64)

    def nll(lam: float) -> float:
        with np.errstate(divide="ignore"):
            return -np.mean(np.log((1 - lam) * p + lam / vocab))

    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(iters):
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if nll(a) <= nll(b):
            hi = b
        else:
            lo = a
    lam = 0.5 * (lo + hi)
    if np.all(p > 0) and nll(0.0) <= nll(lam):
        return 0.0
    return lam / ((1 - lam) * vocab)


def distinct_n(samples: Sequence[Sequence], n: int) -> float:
    """Distinct n-grams over all n-grams of ``samples`` (each a sequence of tokens); ``nan`` if there are none."""
    grams = [tuple(s[i: i + n]) for s in samples for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else math.nan


def repetition(samples: Sequence[Sequence], window: int = 16) -> float:
    """Share of tokens that occur among the ``window`` tokens before them in their sample (the first token excluded)."""
    hits = total = 0
    for s in samples:
        s = list(s)
        for i in range(1, len(s)):
            hits += s[i] in s[max(0, i - window): i]
            total += 1
    return hits / total if total else math.nan


def paired_bootstrap_accuracy(correct_a: np.ndarray, correct_b: np.ndarray, tokens: np.ndarray,
                              n_samples: int = 2000, seed: int = 12345, keep_draws: bool = False) -> dict:
    """Compare the accuracies of systems A and B over seeds and sentences (see the module docstring).

    Args:
        correct_a, correct_b: ``[seeds, sentences]`` numbers of correct predictions per seed and sentence
            (row ``s`` of both: the same training seed).
        tokens: ``[sentences]`` predictions per sentence.

    Returns:
        ``acc_a``, ``acc_b`` (pooled over seeds, %), ``delta = acc_a - acc_b``, a 95% interval of the difference
        (``ci``), the two-sided ``p_value``, ``n_samples``, ``seeds`` and ``sentences``; with ``keep_draws`` also
        ``draws``, the bootstrap differences.
    """
    A = np.asarray(correct_a, dtype=np.float64)
    B = np.asarray(correct_b, dtype=np.float64)
    n = np.asarray(tokens, dtype=np.float64)
    if A.shape != B.shape or A.ndim != 2 or A.shape[1] != n.shape[0]:
        raise ValueError(f"correct_a {A.shape}, correct_b {B.shape} and tokens {n.shape} do not match")
    if n_samples < 1:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    S, J = A.shape
    acc = lambda C: 100.0 * C.sum() / (S * n.sum())
    delta = acc(A) - acc(B)
    rng = np.random.default_rng(seed)
    draws = np.empty(n_samples)
    for i in range(n_samples):
        s = rng.integers(0, S, S)
        w = np.bincount(rng.integers(0, J, J), minlength=J).astype(np.float64)
        D = (A[s] - B[s]).sum(0)
        draws[i] = 100.0 * (w @ D) / (S * (w @ n))
    p = (1 + int(np.sum(np.abs(draws - draws.mean()) >= abs(delta)))) / (1 + n_samples)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    out = {"acc_a": acc(A), "acc_b": acc(B), "delta": delta, "ci": [float(lo), float(hi)], "p_value": p,
           "n_samples": n_samples, "seeds": S, "sentences": J}
    if keep_draws:
        out["draws"] = draws
    return out


def bonferroni_threshold(m: int, level: float = LEVEL) -> float:
    """``level / m``: the p-value a difference needs when ``m`` comparisons are tested together."""
    return level / max(int(m), 1)
