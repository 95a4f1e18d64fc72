"""The threshold search: scores and a divergence in, the threshold τ and the support out.

:mod:`.threshold` is the PyTorch reference solver (pruning to the candidates that can be in
the support, then a safeguarded Newton iteration); it asks :func:`softargmax.backends.select`
first and hands a call to a fused backend where one covers it.  :mod:`.newton` is the Newton
iteration itself, shared with the vocabulary-parallel solver of :mod:`softargmax.losses.distributed`
(which injects the all-reduce of the row sums); :mod:`.steep_power` solves α-entmax with α > 2 in
the entmax variable.  The solvers read a divergence's mathematics and its
:class:`~softargmax.divergences.SolverHints`.  Every solver returns a
:class:`softargmax.backends.solution.Solution`.
"""
