"""Reproducible experiments (``softargmax reproduce NAME``).  They use the public API only."""

EXPERIMENTS = {
    "translation": "softargmax.experiments.translation",
    "tau-table": "softargmax.experiments.tau_table",
    "bisection": "softargmax.experiments.bisection",
    "adaptive-attention": "softargmax.experiments.adaptive_attention",
    "nli-attention": "softargmax.experiments.nli_attention",
    "label-proportions": "softargmax.experiments.label_proportions",
    "multilabel": "softargmax.experiments.multilabel",
    "classification": "softargmax.experiments.classification",
    "distillation": "softargmax.experiments.distillation",
    "lm": "softargmax.experiments.lm",
}

#: the presets each experiment accepts (its module's ``PRESETS``; a test checks that they agree), for the command
#: line's help without importing every experiment
PRESET_NAMES: dict[str, tuple[str, ...]] = {name: ("smoke", "default") for name in EXPERIMENTS}
PRESET_NAMES["translation"] = ("smoke", "default", "full", "gpu", "gpu-1call")
PRESET_NAMES["lm"] = ("smoke", "default", "full", "gpu")
