"""Drop-in replacements for the public APIs of other packages, built on softargmax's operators.

* :mod:`softargmax.compat.entmax`: the ``entmax`` package (deep-spin/entmax, 1.3 and the
  1.4 development branch): ``import softargmax.compat.entmax as entmax`` or
  ``from softargmax.compat.entmax import entmax15, EntmaxBisect, ...``.
"""
