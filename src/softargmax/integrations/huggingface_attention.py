r"""Hugging Face Transformers: the library's normalizations as attention implementations.

After :func:`register` (called for you by ``import softargmax.integrations.huggingface``
or ``softargmax.integrations.huggingface_attention``),
models that use Transformers' attention-interface registry accept
``attn_implementation="sparsemax"`` / ``"entmax15"`` (and any name registered with
:func:`register`), in ``from_pretrained``, ``from_config`` or
``model.set_attn_implementation``.

The function mirrors Transformers' eager attention: grouped key/value heads are
repeated, ``scaling`` is the model's, dropout is applied in training only, and the
returned output is ``[batch, length, heads, head_dim]`` with the per-head weights.
Masks arrive either as booleans (``True`` = may attend, SDPA style) or as additive
floats; both are handled.  Transformers is an optional dependency (``pip install
transformers``); nothing is downloaded.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from torch import Tensor

from .._utils.extras import require
from ..operators.attention import attention

require("hf", "softargmax.integrations.huggingface_attention")

__all__ = ["register", "attention_function", "DEFAULT_IMPLEMENTATIONS"]

DEFAULT_IMPLEMENTATIONS = {"sparsemax": ("sparsemax", None), "entmax15": ("entmax15", None)}


def attention_function(mapping: str, alpha: Union[float, Tensor, None] = None) -> Callable[..., tuple[Tensor, Any]]:
    """An attention function with Transformers' signature that normalizes with ``mapping``."""

    def forward(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                scaling: Optional[float] = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Any]:
        groups = getattr(module, "num_key_value_groups", 1)
        # the weights only when Transformers asks for them: without them CUDA inputs take the
        # fused kernels (O(L) memory; grouped key/value heads are read as they are)
        want = kwargs.get("output_attentions")
        if want is None:
            want = getattr(getattr(module, "config", None), "output_attentions", True)
        is_causal = False
        mask = attention_mask
        if mask is not None:
            mask = mask[..., : key.shape[-2]]
        elif query.shape[2] > 1 and kwargs.get("is_causal", getattr(module, "is_causal", False)):
            is_causal = True
        res = attention(
            query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling,
            dropout_p=dropout if module.training else 0.0, mapping=mapping, alpha=alpha, return_weights=bool(want),
            enable_gqa=groups > 1,
        )
        out, weights = res if want else (res, None)
        return out.transpose(1, 2).contiguous(), weights

    forward.__name__ = f"softargmax_{mapping}_attention"
    return forward


def register(name: Optional[str] = None, mapping: Optional[str] = None, alpha: Union[float, Tensor, None] = None) -> None:
    """Register ``name`` (default: ``"sparsemax"`` and ``"entmax15"``) in Transformers' attention interface.

    ``register("entmax13", mapping="entmax", alpha=1.3)`` adds a custom one.  The mask
    format for a custom name is the SDPA one (boolean).
    """
    from transformers import AttentionInterface

    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    except ImportError:  # older Transformers: masks are always additive floats
        ALL_MASK_ATTENTION_FUNCTIONS = sdpa_mask = None
    items = DEFAULT_IMPLEMENTATIONS.items() if name is None else [(name, (mapping or name, alpha))]
    for impl, (m, a) in items:
        AttentionInterface.register(impl, attention_function(m, a))
        if ALL_MASK_ATTENTION_FUNCTIONS is not None:
            ALL_MASK_ATTENTION_FUNCTIONS.register(impl, sdpa_mask)


register()
