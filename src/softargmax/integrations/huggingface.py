r"""Hugging Face Transformers: language models end to end (one import for the three parts).

* :func:`apply` (:mod:`.huggingface_loss`): train a causal LM with a fused Fenchel–Young loss
  (the logits never materialized), optionally with sparse attention;
* :class:`SparseSamplingProcessor` (:mod:`.huggingface_sampling`): ``generate(do_sample=True)``
  draws from sparsemax, entmax or any f-softargmax of the logits;
* :func:`register` (:mod:`.huggingface_attention`): ``attn_implementation="entmax15"`` /
  ``"sparsemax"`` (registered on import).

The guide "Language models with Hugging Face" (``docs/huggingface.md``) walks through all three.
Transformers is an optional dependency (the ``hf`` extra); nothing is downloaded.
"""

from .huggingface_attention import DEFAULT_IMPLEMENTATIONS, attention_function, register
from .huggingface_loss import TESTED_FAMILIES, apply, revert
from .huggingface_sampling import SparseSamplingProcessor

__all__ = ["apply", "revert", "TESTED_FAMILIES", "SparseSamplingProcessor", "register", "attention_function",
           "DEFAULT_IMPLEMENTATIONS"]
