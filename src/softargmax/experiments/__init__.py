"""Reproducible experiments (``softargmax reproduce NAME``).  They use the public API only."""

EXPERIMENTS = {
    "translation": "softargmax.experiments.translation",
    "tau-table": "softargmax.experiments.tau_table",
    "bisection": "softargmax.experiments.bisection",
}
