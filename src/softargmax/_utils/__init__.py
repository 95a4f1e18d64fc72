"""Helpers every layer uses, none of which knows about divergences or operators: argument checks
(:mod:`.checks`), the ``[R, k]`` row layout (:mod:`.rows`), what a call may do while
``torch.compile`` traces it (:mod:`.tracing`) and optional dependencies (:mod:`.extras`)."""
