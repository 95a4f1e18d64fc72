"""The threshold search: scores and a divergence in, the threshold τ and the support out.

:mod:`.threshold` is the PyTorch reference solver (pruning to the candidates that can be in
the support, then a safeguarded Newton iteration); it asks :func:`softargmax.backends.select`
first and hands a call to a fused backend where one covers it.  Every solver returns a
:class:`softargmax.backends.solution.Solution`.
"""
