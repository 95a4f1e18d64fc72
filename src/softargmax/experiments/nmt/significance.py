"""Paired bootstrap resampling of corpus BLEU between two systems, pooled over training seeds.

Koehn, "Statistical Significance Tests for Machine Translation Evaluation", EMNLP 2004,
https://aclanthology.org/W04-3250/: draw test sets of the same size with replacement
from the test sentences, score both systems on each draw, and ask how often the
difference is as large as the observed one by chance.  The statistic and the p-value are
those of sacreBLEU's paired bootstrap (``sacrebleu.significance``, after Moses'
``bootstrap-hypothesis-difference-significance.pl``): with ``d_i = |BLEU_A(i) - BLEU_B(i)|``
on draw ``i``, ``p = (#{i : d_i - mean(d) > |BLEU_A - BLEU_B|} + 1) / (n + 1)``.

With several training seeds, sentence ``j`` of a draw contributes the BLEU sufficient
statistics (n-gram matches, lengths) of *all* seeds' translations of sentence ``j``: the
score of a draw is the BLEU of the seeds' translations pooled into one corpus, and the
seeds of a sentence are resampled together, since they share the source and reference.
With one seed this is exactly sacreBLEU's test (same draws for the same RNG seed).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _metric() -> Any:  # a sacrebleu BLEU
    from sacrebleu.metrics import BLEU

    return BLEU()


def sentence_stats(metric: Any, hyps_per_seed: Sequence[Sequence[str]], refs: Sequence[str]) -> np.ndarray:
    """BLEU sufficient statistics per test sentence, summed over seeds: ``[sentences, stats]``."""
    total = None
    for hyps in hyps_per_seed:
        if len(hyps) != len(refs):
            raise ValueError(f"hypotheses: {len(hyps)} sentences for {len(refs)} references")
        s = np.array(metric._extract_corpus_statistics(list(hyps), [list(refs)]), dtype="float64")
        total = s if total is None else total + s
    assert total is not None  # at least one seed (paired_bootstrap checks it)
    return total


def paired_bootstrap(hyps_a: Sequence[Sequence[str]], hyps_b: Sequence[Sequence[str]], refs: Sequence[str],
                     n_samples: int = 1000, seed: int = 12345) -> dict[str, Any]:
    """Compare system A with system B; ``hyps_a[k]`` is A's translation of the test set with training seed k.

    Returns the pooled corpus BLEU of each (``bleu_a``, ``bleu_b``), their difference
    ``delta = bleu_a - bleu_b``, a 95% bootstrap interval of the difference (``ci``,
    2.5th and 97.5th percentiles of the draws) and the p-value above.
    """
    if not hyps_a or len(hyps_a) != len(hyps_b):
        raise ValueError("hyps_a and hyps_b need the same positive number of seeds")
    if n_samples < 1:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    metric = _metric()
    sa_ = sentence_stats(metric, hyps_a, refs)
    sb_ = sentence_stats(metric, hyps_b, refs)
    score = lambda stats: metric._compute_score_from_stats(list(stats)).score  # noqa: E731
    bleu_a, bleu_b = score(sa_.sum(0)), score(sb_.sum(0))
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(refs), size=(n_samples, len(refs)), replace=True)
    draws_a = np.array([score(sa_[i].sum(0)) for i in idx])
    draws_b = np.array([score(sb_[i].sum(0)) for i in idx])
    diffs = np.abs(draws_a - draws_b)
    observed = abs(bleu_a - bleu_b)
    p = (int(np.sum(diffs - diffs.mean() > observed)) + 1) / (n_samples + 1)
    lo, hi = np.percentile(draws_a - draws_b, [2.5, 97.5])
    return {"bleu_a": bleu_a, "bleu_b": bleu_b, "delta": bleu_a - bleu_b, "ci": [float(lo), float(hi)],
            "p_value": p, "n_samples": n_samples, "seeds": len(hyps_a), "sentences": len(refs)}
