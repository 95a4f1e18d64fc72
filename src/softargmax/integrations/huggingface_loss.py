r"""A Transformers causal LM trained with a fused Fenchel–Young loss: :func:`apply` and :func:`revert`.

``apply(model, loss="entmax15")`` patches one model instance (its ``forward``; the class and
other instances are untouched) so that, when ``labels`` are given, the training loss is

    ``linear_fenchel_young_loss(hidden, lm_head.weight, shifted labels, lm_head.bias, mapping, ...)``

(:func:`softargmax.losses.linear.linear_fenchel_young_loss`): the ``[tokens, vocabulary]``
logits are never materialized, only one chunk of them at a time.  This is the approach of
Liger-Kernel's ``fused_linear_cross_entropy`` and Cut-Cross-Entropy's ``cce_patch``, for every
mapping (softmax, sparsemax, entmax, any f-softargmax) instead of cross-entropy only.

How: the model's own ``forward`` runs unchanged with ``labels=None``, while a forward pre-hook on
its output embedding (``lm_head``; ``embed_out`` for GPT-NeoX) takes the final hidden states
(after the final norm, exactly what the head would have seen) and hands the head an empty
sequence instead, so no logits are computed.  Everything else (cache, hidden states, attention
weights, the output class) is the model's own.  The loss is then computed from the captured
hidden states as Transformers' ``ForCausalLMLoss`` does for cross-entropy:

* labels are shifted (``labels[..., 1:]``, the last position padded with ``ignore_index``);
  ``shift_labels=`` (already shifted labels, as Transformers accepts) is taken as is;
* ``ignore_index`` (default -100) marks positions without a loss;
* without ``num_items_in_batch`` the loss is the mean over the counted tokens; with it (as
  ``Trainer`` passes under gradient accumulation) the loss is their sum divided by
  ``num_items_in_batch``, so that accumulated micro-batches add up to the mean over the whole
  batch;
* Gemma 2's final logit soft-capping (``config.final_logit_softcapping``) is applied inside the
  fused loss (``softcap=``).

With ``loss="softmax"`` the patched loss is Transformers' cross-entropy (float32 rounding apart).

Logits.  Without ``labels`` the forward is the model's own (``generate`` is unaffected).  With
``labels``, ``logits`` is ``None`` in training mode (that is the point: no ``[tokens, vocabulary]``
tensor) and computed in evaluation mode (``model.eval()``), where ``Trainer.evaluate`` and metrics
need them and no gradient is kept; ``return_logits=True`` / ``False`` (in :func:`apply`, or per call
as a keyword of the forward) overrides this rule.  Returned logits are the model's (soft-capped
where the family caps them), while the loss stays the fused one.

Families: the head must be a plain linear layer on the final hidden states (plus Gemma 2's
soft-cap).  :data:`TESTED_FAMILIES` are tested; a model whose family scales its logits in other
ways (Cohere's ``logit_scale``, Granite's ``logits_scaling``, ...) would get a wrong loss, so
other families are refused unless ``allow_untested=True``.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn

from ..divergences import Divergence
from ..losses.linear import linear_fenchel_young_loss
from .huggingface_attention import register

__all__ = ["apply", "revert", "TESTED_FAMILIES"]

#: ``config.model_type`` of the families tested on tiny random configs
TESTED_FAMILIES = ("llama", "qwen2", "mistral", "gemma2", "gpt2", "gpt_neox")

#: config attributes of families whose heads scale the logits in ways the fused loss does not reproduce
_UNSUPPORTED_SCALES = ("logit_scale", "logits_scaling", "output_multiplier_scale", "mup_width_multiplier")

#: loss options set by the model or the call, not by apply
_RESERVED = ("reduction", "ignore_index", "softcap", "multilabel", "process_group", "class_weight")

_STATE = "_softargmax_fused_loss"

#: bytes for one chunk's buffers when ``memory_budget`` is not given: smaller than the fused loss's own
#: default (1 GiB), which at a 32k vocabulary holds ~2700 tokens at once, about as much as the unfused head
#: (``benchmarks/run_cpu_hf_lm.py``); a few hundred MiB keeps the GEMMs large
DEFAULT_MEMORY_BUDGET = 2**28


def apply(model: nn.Module, loss: Union[str, Divergence, None] = "entmax15", attention: Optional[str] = None, *,
          return_logits: Optional[bool] = None, allow_untested: bool = False, **loss_options: Any) -> nn.Module:
    r"""Make a Transformers causal LM compute its training loss with a fused Fenchel–Young loss.

    .. math::

        \mathcal{L} = \frac{1}{N} \sum_{t} \ell_\Omega\big(W h_t + b,\ y_{t+1}\big),
        \qquad \ell_\Omega(\theta, y) = \langle \theta, p - y\rangle + \Omega(y) - \Omega(p),

    over the :math:`N` counted positions (labels shifted by one, ``-100`` ignored), computed by
    :func:`~softargmax.losses.linear.linear_fenchel_young_loss` from the final hidden states :math:`h_t`
    and the head :math:`(W, b)` without materializing the logits (the module docstring).

    Args:
        model: a ``*ForCausalLM`` instance (Llama, Qwen2, Mistral, Gemma 2, GPT-2, GPT-NeoX, ...);
            patched in place and returned.
        loss: the mapping of the loss: a name (``"softmax"``, ``"sparsemax"``, ``"entmax15"``,
            ``"entmax"`` with ``alpha=``, a divergence name such as ``"jensen_shannon"``) or a
            :class:`~softargmax.divergences.Divergence`; ``None`` keeps the model's own loss (only
            ``attention`` is set). Default: ``"entmax15"``.
        attention: optional attention implementation to set at the same time, e.g. ``"entmax15"``
            or ``"sparsemax"`` (registered by :mod:`softargmax.integrations.huggingface`), or any name
            Transformers knows (``"eager"``, ``"sdpa"``).
        return_logits: ``None`` (default): logits are returned with ``labels`` only in evaluation
            mode; ``True`` / ``False``: always / never (see the module docstring).
        allow_untested: accept a family outside :data:`TESTED_FAMILIES` (its head must be a plain
            linear layer on the final hidden states). Default: ``False``.
        \*\*loss_options: passed to :func:`~softargmax.losses.linear.linear_fenchel_young_loss`:
            ``alpha``, ``q``, ``temperature``, ``label_smoothing``, ``chunk_size``, ``memory_budget``
            and the mapping's parameters (``memory_budget`` defaults to :data:`DEFAULT_MEMORY_BUDGET`,
            256 MiB).  ``reduction``, ``ignore_index`` and ``softcap`` come from
            Transformers (``num_items_in_batch``, the call's ``ignore_index``, the config).

    Returns:
        ``model``. :func:`revert` restores the original forward.

    Examples:
        A tiny randomly initialized Llama (nothing is downloaded):

        >>> import torch
        >>> from transformers import AutoModelForCausalLM, LlamaConfig
        >>> from softargmax.integrations.huggingface import apply, revert
        >>> _ = torch.manual_seed(0)
        >>> config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=2)
        >>> model = AutoModelForCausalLM.from_config(config)
        >>> ids = torch.randint(0, 64, (2, 6))
        >>> reference = model(input_ids=ids, labels=ids).loss        # Transformers' cross-entropy
        >>> model = apply(model, "softmax")
        >>> out = model(input_ids=ids, labels=ids)
        >>> out.logits is None, torch.allclose(out.loss, reference)  # no logits, the same loss
        (True, True)
        >>> model = apply(model, "entmax15", attention="entmax15")   # the 1.5-entmax loss and attention
        >>> bool(model(input_ids=ids, labels=ids).loss > 0)
        True

    References:
        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324

        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a Transformers *ForCausalLM), got {type(model).__name__}")
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_output_embeddings"):
        raise TypeError(f"model must be a Transformers PreTrainedModel, got {type(model).__name__}")
    # a Transformers model (or a wrapper of one, e.g. PEFT's): its methods are Transformers' (not typed here)
    lm: Any = model
    if return_logits is not None and not isinstance(return_logits, bool):
        raise TypeError(f"return_logits must be None, True or False, got {return_logits!r}")
    if attention is not None:
        if not isinstance(attention, str):
            raise TypeError(f"attention must be an implementation name (str), got {type(attention).__name__}")
        register()
        lm.set_attn_implementation(attention)
    if loss is None:
        if loss_options:
            raise ValueError(f"loss=None: loss options {sorted(loss_options)} would not be used")
        return model
    head, text_config = _head_and_text_config(lm, config, allow_untested)
    if "return_stats" in loss_options:
        raise ValueError("return_stats: the patched loss is the scalar Transformers expects; for per-token losses "
                         "and statistics call linear_fenchel_young_loss on the hidden states (reduction='none', "
                         "return_stats=True)")
    bad = sorted(set(loss_options) & set(_RESERVED))
    if bad:
        raise ValueError(f"loss options {bad} are set by Transformers or the model, not by apply")
    softcap = getattr(text_config, "final_logit_softcapping", None)
    loss_options.setdefault("memory_budget", DEFAULT_MEMORY_BUDGET)
    # validate the options now, on one token, rather than at the first training step
    with torch.no_grad():
        w = head.weight.detach()
        linear_fenchel_young_loss(w.new_zeros(1, w.shape[1]), w, torch.zeros(1, dtype=torch.long, device=w.device),
                                  None if head.bias is None else head.bias.detach(), loss, softcap=softcap,
                                  **loss_options)
    if _STATE in vars(model):
        revert(model)
    state = _Fused(model, head, loss, dict(loss_options), softcap, return_logits)
    original = model.forward  # bound method of the class (or of a previous wrapper, e.g. PEFT's)

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return state.forward(original, *args, **kwargs)

    state.handle = head.register_forward_pre_hook(state.pre_hook)
    vars(model)[_STATE] = state
    model.forward = forward
    return model


def _head_and_text_config(model: Any, config: Any, allow_untested: bool) -> tuple[nn.Linear, Any]:
    """The model's LM head (a ``nn.Linear``) and its text config, once the family and the config's logit
    scales are checked to be what the fused loss computes."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"model: the output embedding must be a torch.nn.Linear (a causal LM head), got "
                         f"{type(head).__name__}")
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", None)
    if model_type not in TESTED_FAMILIES and not allow_untested:
        raise ValueError(f"model: the {model_type!r} family is not tested with the fused loss (tested: "
                         f"{', '.join(TESTED_FAMILIES)}); pass allow_untested=True if its head is a plain linear "
                         "layer on the final hidden states")
    for attr in _UNSUPPORTED_SCALES:
        value = getattr(text_config, attr, None)
        if value is not None and value != 1:
            raise ValueError(f"model: config.{attr}={value!r} scales the logits, which the fused loss does not do")
    return head, text_config


def revert(model: nn.Module) -> nn.Module:
    """Undo :func:`apply`: the model's own forward and loss again (the attention implementation stays).

    Args:
        model: a model patched by :func:`apply`.

    Returns:
        ``model``, with its own forward.

    Raises:
        ValueError: the model is not patched.

    Examples:
        >>> import torch
        >>> from transformers import AutoModelForCausalLM, LlamaConfig
        >>> from softargmax.integrations.huggingface import apply, revert
        >>> config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=2)
        >>> model = apply(AutoModelForCausalLM.from_config(config), "sparsemax")
        >>> ids = torch.zeros(1, 4, dtype=torch.long)
        >>> model(input_ids=ids, labels=ids).logits is None
        True
        >>> model = revert(model)
        >>> model(input_ids=ids, labels=ids).logits.shape  # Transformers' own loss, with the logits
        torch.Size([1, 4, 64])
    """
    state = vars(model).pop(_STATE, None)
    if state is None:
        raise ValueError("model: not patched by softargmax.integrations.huggingface.apply")
    state.handle.remove()
    if "forward" in vars(model):
        del model.forward
    return model


class _Fused:
    """The patch of one model: the hook's switch, the captured hidden states and the loss options."""

    def __init__(self, model: nn.Module, head: nn.Linear, mapping: Union[str, Divergence], options: dict[str, Any],
                 softcap: Optional[float], return_logits: Optional[bool]) -> None:
        self.model, self.head, self.mapping, self.options = model, head, mapping, options
        self.softcap, self.return_logits = softcap, return_logits
        self.capturing = False
        self.hidden: Optional[Tensor] = None
        self.handle: Any = None  # the hook's RemovableHandle
        self.signature: Optional[inspect.Signature] = None

    def pre_hook(self, module: nn.Module, args: tuple[Tensor, ...]) -> Optional[tuple[Tensor]]:
        if not self.capturing:
            return None
        (hidden,) = args
        self.hidden = hidden
        return (hidden[..., :0, :],)  # an empty sequence: the head computes no logits

    def forward(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.signature is None:
            self.signature = inspect.signature(original)
        bound = self.signature.bind(*args, **kwargs)
        call = dict(bound.arguments)
        for name, p in self.signature.parameters.items():
            if p.kind == inspect.Parameter.VAR_KEYWORD:
                call.update(call.pop(name, {}))
        labels = call.pop("labels", None)
        shift_labels = call.pop("shift_labels", None)
        return_logits = call.pop("return_logits", self.return_logits)
        if labels is None and shift_labels is None:
            return original(**call)
        ignore_index = call.pop("ignore_index", -100)
        num_items = call.get("num_items_in_batch")  # the model's own forward receives it as well
        if return_logits is None:
            return_logits = not self.model.training
        return_dict = call.pop("return_dict", None)
        self.capturing, self.hidden = True, None
        try:
            out = original(**call, labels=None, return_dict=True)
        finally:
            self.capturing = False
        hidden, self.hidden = self.hidden, None
        if hidden is None:
            raise RuntimeError("the model's forward did not call its output embedding: is it a causal LM head?")
        if shift_labels is None:
            if labels.shape != hidden.shape[:-1]:
                raise ValueError(f"labels: shape {tuple(labels.shape)} must be that of the positions the head sees, "
                                 f"{tuple(hidden.shape[:-1])} (logits_to_keep keeps fewer: pass shift_labels)")
            shift_labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        elif shift_labels.shape != hidden.shape[:-1]:
            raise ValueError(f"shift_labels: shape {tuple(shift_labels.shape)} must be {tuple(hidden.shape[:-1])}")
        fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
        fields["loss"] = self.loss(hidden, shift_labels.to(hidden.device), ignore_index, num_items)
        if return_logits:
            logits = self.head(hidden)
            if self.softcap is not None:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            fields["logits"] = logits
        out = type(out)(**fields)  # a ModelOutput drops None fields: logits stays absent, not empty
        if return_dict is False:
            return out.to_tuple()
        return out

    def loss(self, hidden: Tensor, shift_labels: Tensor, ignore_index: int, num_items: object) -> Tensor:
        head = self.head
        reduction = "mean" if num_items is None else "sum"
        value = linear_fenchel_young_loss(hidden, head.weight, shift_labels, head.bias, self.mapping,
                                          ignore_index=ignore_index, reduction=reduction, softcap=self.softcap,
                                          **self.options)
        if num_items is not None:
            if isinstance(num_items, Tensor):
                num_items = num_items.to(value.device)
            elif not isinstance(num_items, (int, float)) or isinstance(num_items, bool) or math.isnan(num_items):
                raise TypeError(f"num_items_in_batch must be a number or a tensor, got {num_items!r}")
            value = value / num_items
        return value
