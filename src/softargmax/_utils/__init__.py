"""Helpers every layer uses: argument checks and row layouts (:mod:`.checks`), optional
dependencies and switches (:mod:`.extras`).  Nothing here knows about divergences or operators."""
