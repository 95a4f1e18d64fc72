"""``softargmax bench``: every benchmark times our functions against PyTorch's in one run, prints a
table and returns JSON with the device, the versions and the sizes.

* :mod:`.operators`: the operators against ``torch.softmax`` (and the ``entmax`` package);
* :mod:`.losses`: the losses against ``F.cross_entropy``, and the fused linear + loss;
* :mod:`.attention`: sparse attention against ``F.scaled_dot_product_attention``;
* :mod:`.timing`: interleaved medians, peak memory, the device; the targets, in ``targets.json``;
* :mod:`.memory`: one memory measurement per process (``python -m softargmax.bench.memory``).
"""

from .attention import ATTENTION_LENGTHS, ATTENTION_VARIANTS, run_attention
from .losses import FUSED_SHAPE, LOSS_SHAPES, fused_case, run_losses
from .operators import FULL_SHAPES, LONG, OPERATORS, QUICK_SHAPES, SHORT, entmax_package, run, target_ratio
from .timing import device_name, header, save, targets, time_calls, time_thunks

__all__ = ["run", "entmax_package", "run_losses", "run_attention", "fused_case", "target_ratio", "targets", "time_thunks", "time_calls",
           "device_name", "header", "save", "FULL_SHAPES", "LONG", "OPERATORS", "SHORT", "QUICK_SHAPES", "LOSS_SHAPES", "FUSED_SHAPE",
           "ATTENTION_LENGTHS", "ATTENTION_VARIANTS"]
