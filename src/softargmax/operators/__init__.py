"""The operators: scores in, a point of the simplex (or of the non-negative orthant) out.

The public functions of this layer are re-exported at the package root
(``softargmax.entmax15`` is :func:`softargmax.operators.entmax.entmax15`):

* :mod:`.entmax`: sparsemax, 1.5-entmax and α-entmax (any α > 0, learnable);
* :mod:`.fdiv`: f-softargmax and f-softmax of every f-divergence;
* :mod:`.binary`: the two-class f-sigmoid and f-softplus;
* :mod:`.alpha_relu`: α-ReLU, and :mod:`.alpha_relu_tau`, choosing its threshold τ;
* :mod:`.normmax` and :mod:`.budget`: normmax and budget (capped) sparsemax;
* :mod:`.mappings`: the one table of mapping names, and :func:`~.mappings.normalize`;
* :mod:`.attention`: sparse scaled-dot-product attention, and :mod:`.decoding`: its decoding step over a
  key/value cache;
* :mod:`.sampling`: drawing from sparsemax, entmax or any f-softargmax of the scores (entmax sampling).

Private: ``_autograd`` (the autograd functions: JVP backward, gradients in q and α),
``_library_ops`` (the ``torch.library`` operators that ``torch.compile`` captures),
``_dtensor`` (operators on ``DTensor`` inputs).

Imports come from the layers below only: :mod:`softargmax.divergences`,
:mod:`softargmax.backends` and :mod:`softargmax.solvers`.
"""
