"""The fused C row solver for the common CPU cases (:mod:`.rows`, its source ``rows.c``)."""
