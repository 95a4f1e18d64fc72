"""Helpers every layer uses, none of which knows about divergences or operators: argument checks
(:mod:`.checks`), the ``[R, k]`` row layout (:mod:`.rows`), what a call may do while
``torch.compile`` traces it (:mod:`.tracing`), optional dependencies (:mod:`.extras`) and atomic file
writes (:mod:`.files`, used by the benchmarks and the experiments)."""
