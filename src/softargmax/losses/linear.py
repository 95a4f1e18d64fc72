r"""Output layer fused with its Fenchel–Young loss: the ``[tokens × vocab]`` logits are never held at once.

``linear_fenchel_young_loss(hidden, weight, target, bias)`` equals
``fenchel_young_loss(hidden @ weight.T + bias, target, ...)`` in value and gradients.
Tokens are processed in chunks; for each chunk the logits are computed, turned into
``w_i/denominator · (p - y)`` in place (the gradient of the reduced loss with respect
to the logits, ``p`` from the forward's own solve), and immediately multiplied into
the gradients of ``hidden``, ``weight`` and ``bias``, which the forward returns to
autograd pre-computed (the approach of Liger-Kernel / Cut-Cross-Entropy, here for every
Fenchel–Young loss).  Peak extra memory is one chunk of logits plus the gradients of
the parameters, instead of two ``tokens × vocab`` tensors.

``reduction`` is ``"mean"`` or ``"sum"`` (the pre-computed gradients are scaled by the
incoming scalar gradient), or ``"none"``: the loss of every token, of the target's batch shape
(ignored tokens give 0 and item weights multiply each token's loss, as in
``torch.nn.functional.cross_entropy``), whose backward takes any per-token gradient.  Its backward
computes each chunk's logits again (one more GEMM per chunk).  With float32 chunks the forward keeps
one threshold per token and the backward forms the prediction from it in one elementwise pass
(re-solving would cost a second threshold search in PyTorch; storing the prediction, ``[tokens, V]``
memory); with half-precision chunks on the kernels' route the backward solves each chunk again with
the kernel that writes the scaled gradient, as the reduced loss's forward does (below).

``return_stats=True`` also returns :class:`PredictionStats`: per token, the number of non-zero
entries of the prediction :math:`p` and its Shannon entropy :math:`-\sum_j p_j \log p_j` (nats),
computed chunk by chunk from the forward's own prediction, for logging (how sparse the model is)
and RL-style uses (an entropy bonus, filtering tokens by entropy).  They are detached.

Precision and memory:

* float16/bfloat16 inputs on a GPU (the Triton kernels' route), every ``reduction`` (with
  ``return_stats``, for the mappings whose solver writes ``p``: not the softmax and
  α-ReLU losses, whose kernels never form it): every chunk stays in the input's dtype.  The GEMM writes the logits; the row
  solver reads them and writes the prediction (float32 inside the kernels); one loss kernel
  turns it, in place, into the chunk's gradient ``w_i/denominator · (p - y)`` (for the softmax
  loss and the α-ReLU loss with :math:`1 < \alpha \le 2`, whose ``p`` needs no threshold, one kernel
  does the whole row and writes the gradient over the logits); the loss values come from the
  kernels' float32 row sums.  The chunk's buffers are then 4 bytes per token and class in
  bfloat16 (2 for the softmax and α-ReLU losses), against 16 when a chunk is converted
  to float32 (elsewhere: on the CPU, whose solvers need float32, for the statistics of the
  softmax and α-ReLU losses, and in the vocabulary-parallel loss, whose split solver runs in
  PyTorch).  With ``reduction="none"`` the forward takes the values from the same kernels and keeps
  nothing per token, and the backward solves each chunk again, its row scale the incoming
  per-token gradient times the item weight: the same buffers in both passes, and ``G`` that of the
  reduced loss (with a gradient of ones, equal to the ``"sum"`` loss's).  With ``softcap=c`` the capped
  logits are rounded to the chunk's dtype before the solve, in every reduction (about ``c · 2⁻⁹`` per logit
  in bfloat16).  With ``return_stats`` the prediction is kept
  beside its gradient (2 more bytes) and its statistics are computed in float32, 64 rows at a
  time.  No value is read on the host.
* the weight gradient is accumulated over the chunks in the weight's dtype, one GEMM per chunk
  that accumulates in float32 inside and rounds the running sum once (as Liger-Kernel does):
  no float32 ``[V, d]`` buffer (2 GiB at V = 131072, d = 4096) and no final copy.  ``n``
  chunks add at most ``n`` roundings; measured in bfloat16 against float64, the largest error
  is 1.0, 1.4, 2.5 and 6.3 units of bfloat16's rounding of the largest entry at 4, 8, 32 and
  128 chunks (0.7 with one chunk, that is a float32 accumulator).  The default budget makes
  4 to 8 chunks of 8192 tokens at V = 131072.  The bias's gradient is accumulated in float32.
* chunks are sized by a memory budget (``memory_budget`` bytes, default
  :data:`DEFAULT_MEMORY_BUDGET`, 384 MiB) for the per-chunk ``[tokens, V]`` buffers
  (:func:`~softargmax.losses._linear_chunks.chunk_tokens`).  Peak extra memory is the weight
  gradient, the hidden states' gradient and one chunk: at V = 131072, d = 4096 in bfloat16,
  1 GiB + 8 KiB per token + 384 MiB.
* ``softcap=c`` caps the logits as :math:`c \tanh(\theta / c)` (Gemma 2) before the loss;
  the gradient is multiplied in place by ``1 - tanh²``.
* the sparse losses (1.5-entmax, sparsemax, α-ReLU, every mapping whose gradient ``p - y`` has exact
  zeros), where the GPU kernels run: the loss kernel that writes a chunk's gradient also marks its
  ``64 × 64`` (tokens × classes) tiles that hold a non-zero entry (with ``reduction="none"`` and in
  the vocabulary-parallel loss they are marked from ``G``), and the products ``G W`` and ``Gᵀ h`` are
  Triton GEMMs that walk the marked tiles only (:mod:`softargmax.backends.triton.tile_gemms`), read
  on the device: equal to the dense products up to the order of their float32 sums.  The softmax loss
  (no zero in ``G``) keeps the dense GEMMs, and so do shapes whose vocabulary or width is not a
  multiple of 16.

Distillation from a teacher's top-k.  ``target=(probs, indices)``, as ``torch.topk`` returns them
(``teacher_probs.topk(k)``), both ``[..., k]``: the teacher keeps only its ``k`` most likely
classes, and the remaining mass :math:`r = 1 - \sum_i \mathrm{probs}_i` is spread evenly over the :math:`V - k` other
classes, :math:`y_j = r / (V - k)`.  The target ``y`` is then a point of the simplex, so the loss is
still the Fenchel–Young loss :math:`\ell(\theta, y) = \Omega^*(\theta) + \Omega(y) - \langle \theta, y\rangle \ge 0`, zero exactly when the
prediction equals ``y``, with gradient ``p - y`` (Blondel, Martins & Niculae, *Learning with
Fenchel-Young Losses*, JMLR 2020, https://arxiv.org/abs/1901.02324).  Dropping the tail
(renormalizing the top-k) would also give a point of the simplex but would teach the student
that the tail has no mass at all, which a sparse student then learns literally; the even spread
keeps the teacher's total tail mass, the one number the top-k still knows about it, and is the
maximum-entropy completion of the top-k.  The dense target is built one chunk at a time
(``[chunk, V]``, counted in the memory budget), never for all tokens.  Top-k targets take no
``label_smoothing``, ``class_weight`` or ``process_group``; every row counts (select the rows to
train on, e.g. ``hidden[mask]``, before the call).  A teacher given as logits becomes the dense
target ``softmax(teacher_logits / T)`` or its top-k pair by
:func:`~softargmax.losses.teacher.teacher_target`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch import Tensor

from .._utils.checks import check_positive_number, compute_dtype
from .._utils.rows import MetaRows
from ..backends import TileFlags, kernel_device
from ..divergences import Divergence
from ._linear_chunks import (
    LinearFY,
    check_chunking,
    check_linear_arguments,
    chunk_tokens,
    projection_arguments,
    skips_zero_tiles,
    target_rows,
)
from ._linear_recompute import ElementwisePrediction, LinearFYPerToken, ThresholdPrediction
from ._options import LossOptions, LossOutput
from ._prediction_stats import PredictionStats, StatsSink
from ._row_losses import AlphaReLURowLoss, FenchelYoungRowLoss, resolve_loss
from ._rows import RowLoss
from ._targets import Target, mean_denominator_tensor, parse_target, top_k_target

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["linear_fenchel_young_loss", "PredictionStats"]


def linear_fenchel_young_loss(
    hidden: Tensor,
    weight: Optional[Tensor] = None,
    target: Optional[Union[Tensor, tuple[Tensor, Tensor]]] = None,
    bias: Optional[Tensor] = None,
    mapping: Union[str, Divergence] = "entmax15",
    chunk_size: Optional[int] = None,
    *,
    linear_weight: Optional[Tensor] = None,
    linear_bias: Optional[Tensor] = None,
    q: Optional[Tensor] = None,
    temperature: float = 1.0,
    multilabel: bool = False,
    ignore_index: Optional[int] = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    class_weight: Optional[Tensor] = None,
    softcap: Optional[float] = None,
    memory_budget: Optional[int] = None,
    process_group: Optional[ProcessGroup] = None,
    class_offset: Optional[int] = None,
    return_stats: bool = False,
    **mapping_params: Any,
) -> LossOutput:
    r"""The Fenchel–Young loss of the logits of a linear layer, computed chunk by chunk without materializing them.

    .. math::

        \ell = \operatorname{reduce}_i\ \ell_{\Omega}\big(\theta_i, y_i\big), \qquad
        \theta_i = W h_i + b, \qquad
        \nabla_{h_i} \ell_{\Omega} = W^\top (p_i - y_i), \quad \nabla_W \ell_{\Omega} = (p_i - y_i)\, h_i^\top,

    equal in value and gradients to ``fenchel_young_loss(hidden @ weight.T + bias, target, mapping,
    ...)``; the gradients are computed in the forward, one chunk of tokens at a time, so the
    ``[tokens, V]`` logits are never held at once (the module docstring).

    The arguments follow ``torch.nn.functional.linear_cross_entropy`` (PyTorch 2.13):
    ``linear_fenchel_young_loss(h, W, t, mapping="kl")`` equals ``linear_cross_entropy(h, W, t)``
    (with ``label_smoothing`` ε, less the entropy of the smoothed target, a constant: the
    Fenchel–Young loss is :math:`\mathrm{KL}(y \,\|\, \mathrm{softmax}(\theta))`, zero where the
    prediction equals the target; the gradients are the same), and its projection and bias may be given as ``linear_weight=`` and ``linear_bias=``.  Two names
    differ, kept from earlier releases: the projection may also be given as ``weight`` (the second
    positional argument), so the class weights that ``linear_cross_entropy`` calls ``weight`` are
    ``class_weight`` here (giving both ``weight`` and ``linear_weight`` is a ``TypeError`` that says
    so), and the features are ``hidden`` (``input`` there).  Class weights agree with PyTorch's for
    class-index targets without label smoothing; otherwise they follow
    :func:`softargmax.losses.fenchel_young_loss`, which scales each item's loss by
    :math:`\langle w, y\rangle` (PyTorch weights each class's term of the cross-entropy instead).

    Args:
        hidden: ``[..., d]`` features.
        weight: ``[V, d]`` output projection (as in ``torch.nn.Linear``); or give it as
            ``linear_weight``. Required under one of the two names (the default ``None`` is
            there for ``linear_weight``).
        target: class indices ``[...]``, probability vectors ``[..., V]``, label sets
            with ``multilabel=True``, or a teacher's top-k as a pair ``(probs, indices)`` of
            ``[..., k]`` tensors (as ``torch.topk`` returns them; see the module docstring). Required
            (its default ``None`` is there for the keyword call of ``linear_cross_entropy``).
        bias: optional ``[V]``; or give it as ``linear_bias``. Default: ``None``.
        linear_weight, linear_bias: ``weight`` and ``bias`` under the names of
            ``torch.nn.functional.linear_cross_entropy``. Default: ``None``.
        ignore_index: as in :func:`softargmax.losses.fenchel_young_loss`; ``None`` means ``-100``, as in
            ``linear_cross_entropy``. Default: ``-100``.
        mapping: as in :func:`softargmax.losses.fenchel_young_loss`.
        chunk_size: tokens per chunk; default: as many as ``memory_budget`` allows (:func:`chunk_tokens`).
        class_weight: per-class weights (the ``weight`` option of the unfused loss). Default: ``None``.
        softcap: :math:`c > 0` caps the logits :math:`\theta` as :math:`c \tanh(\theta / c)` (Gemma 2), as in the
            unfused loss.
        memory_budget: bytes for one chunk's buffers; default :data:`DEFAULT_MEMORY_BUDGET` (384 MiB).
        reduction: ``"mean"`` (default), ``"sum"``, or ``"none"`` (per-token losses; see the module docstring).
        q, temperature, multilabel, label_smoothing, \*\*mapping_params:
            as in :func:`softargmax.losses.fenchel_young_loss`.
        process_group: a ``torch.distributed`` process group over which the vocabulary is
            split: ``weight`` (and ``bias``) hold this rank's contiguous rows
            (:func:`softargmax.losses.distributed.linear_fenchel_young_loss`). Default: ``None``.
        class_offset: with ``process_group``, the global index of this rank's first class,
            checked against the other ranks' slices (on every rank or none). Default: ``None``.
        return_stats: also return the per-token :class:`PredictionStats` of the prediction
            (support size and Shannon entropy; not with ``process_group``). Default: ``False``.

    Returns:
        the loss (a scalar, or the target's batch shape for ``reduction="none"``, in the compute
        dtype: float32 for half-precision inputs), and with ``return_stats`` a pair
        ``(loss, PredictionStats)``.

    Shape:
        - hidden: :math:`(*, d)`, for example :math:`(N, L, d)`.
        - weight: :math:`(V, d)`; bias: :math:`(V)`.
        - target: class indices :math:`(*)`, probabilities :math:`(*, V)`, or a top-k pair of two
          :math:`(*, k)` tensors.
        - Output: :math:`()` for ``"mean"`` and ``"sum"``, :math:`(*)` for ``"none"``.

    Examples:
        >>> import torch, softargmax as sa
        >>> _ = torch.manual_seed(0)
        >>> hidden, weight = torch.randn(2, 5, 8), torch.randn(30, 8)
        >>> labels = torch.randint(0, 30, (2, 5))
        >>> labels[0, 0] = -100                       # ignored: loss 0
        >>> loss, stats = sa.linear_fenchel_young_loss(hidden, weight, labels, reduction="none", return_stats=True)
        >>> loss.shape, float(loss[0, 0]), stats.support_size.shape
        (torch.Size([2, 5]), 0.0, torch.Size([2, 5]))
        >>> bool((stats.support_size >= 1).all() and (stats.support_size <= 30).all())
        True

        The same value and gradients as the loss of the materialized logits:

        >>> logits = hidden @ weight.T
        >>> torch.allclose(sa.linear_fenchel_young_loss(hidden, weight, labels, chunk_size=3),
        ...                sa.fenchel_young_loss(logits, labels, "entmax15"))
        True

        The call of ``torch.nn.functional.linear_cross_entropy``, with the mapping of softmax:

        >>> bias = torch.randn(30)
        >>> kl = sa.linear_fenchel_young_loss(hidden, linear_weight=weight, target=labels, linear_bias=bias,
        ...                                   mapping="kl")
        >>> torch.allclose(kl, torch.nn.functional.cross_entropy((hidden @ weight.T + bias).transpose(1, 2), labels))
        True

    References:
        Mathieu Blondel, André F. T. Martins and Vlad Niculae, *Learning with Fenchel-Young Losses*,
        JMLR 2020, https://arxiv.org/abs/1901.02324
    """
    weight, bias, ignore_index = projection_arguments(weight, linear_weight, bias, linear_bias, ignore_index)
    if target is None:
        raise TypeError("target is required")
    if not isinstance(return_stats, bool):
        raise TypeError(f"return_stats must be True or False, got {return_stats!r}")
    topk = isinstance(target, tuple)
    if topk and len(target) != 2:
        raise ValueError(f"target: a top-k teacher is a pair (probs, indices), got a tuple of {len(target)}")
    if topk and (process_group is not None or label_smoothing or class_weight is not None or multilabel):
        raise ValueError("target: a top-k teacher takes no process_group, label_smoothing, class_weight or multilabel")
    if process_group is not None and (reduction == "none" or return_stats):
        raise ValueError("process_group: the vocabulary-parallel fused loss supports reduction 'mean' or 'sum' and "
                         "no return_stats (per-token losses and statistics need every class on one process)")
    if process_group is not None:  # vocabulary split over ranks
        from .distributed.losses import linear_vocab_parallel_loss

        options = LossOptions(q=q, temperature=temperature, multilabel=multilabel, ignore_index=ignore_index,
                              reduction=reduction, label_smoothing=label_smoothing, weight=class_weight,
                              softcap=softcap, process_group=process_group, class_offset=class_offset,
                              chunk_size=chunk_size, memory_budget=memory_budget)
        return linear_vocab_parallel_loss(hidden, weight, target, bias, mapping, mapping_params, options)
    if class_offset is not None:
        raise ValueError("class_offset: only with process_group= (the vocabulary split over ranks)")
    check_linear_arguments(hidden, weight, bias, reduction, "vocab", reductions=("mean", "sum", "none"))
    V, d = weight.shape
    if softcap is not None:
        softcap = check_positive_number(softcap, "softcap")
    budget = check_chunking(chunk_size, memory_budget)
    loss = resolve_loss(mapping, mapping_params)

    hidden2d = hidden.reshape(-1, d)
    N = hidden2d.shape[0]
    # the target is validated against a [N, V] stand-in for the logits (never allocated)
    logits_meta = torch.empty(N, V, dtype=compute_dtype(hidden.dtype), device="meta")
    rows = MetaRows(N, V, compute_dtype(hidden.dtype))
    if topk:
        tgt = top_k_target(target[0], target[1], tuple(hidden.shape[:-1]), V, compute_dtype(hidden.dtype))
    else:
        tgt = parse_target(target_rows(target, hidden, V, multilabel), logits_meta, rows, multilabel=multilabel,
                           ignore_index=ignore_index, label_smoothing=label_smoothing, weight=class_weight,
                           weight_name="class_weight", caller="linear_fenchel_young_loss")
    loss = loss.bind(q, temperature, logits_meta, rows)
    # the chunks stay in the input's dtype where the GPU kernels take them (with return_stats, where they also
    # give the prediction: the threshold mappings), for every reduction
    native = (hidden.dtype != compute_dtype(hidden.dtype) and kernel_device(hidden) and N > 0
              and loss.solves_in_dtype(hidden.new_empty(1, V), prediction=return_stats))
    if chunk_size is None:
        # per-token losses and statistics keep the prediction beside its gradient: one more buffer
        # (the softmax and alpha-ReLU kernels write G over the logits: one buffer; native implies alpha-ReLU's
        # kernel takes the chunks, see AlphaReLURowLoss.solves_in_dtype)
        in_place = (isinstance(loss, FenchelYoungRowLoss) and loss.divergence.hints.softmax) or \
            isinstance(loss, AlphaReLURowLoss)
        chunk_size = chunk_tokens(V, hidden.dtype, budget, softcap is not None, chunk_target=topk,
                                  extra_buffers=int(return_stats or (reduction == "none" and not native)),
                                  native=native, in_place=native and in_place)
    return _chunked(hidden2d, weight, bias, loss, tgt, reduction, chunk_size, softcap, return_stats,
                    tuple(hidden.shape[:-1]), native)


def _chunked(hidden2d: Tensor, weight: Tensor, bias: Optional[Tensor], loss: RowLoss, tgt: Target, reduction: str,
             chunk_size: int, softcap: Optional[float], return_stats: bool, batch: tuple[int, ...],
             native: bool = False) -> LossOutput:
    """The fused loss of the bound row loss ``loss`` over ``hidden2d``'s chunks: reduced (gradients
    computed in the forward) or per token (the backward recomputes the chunks), and the statistics.
    ``native``: the chunks stay in the input's dtype (:class:`~._linear_chunks.LinearFY`,
    :class:`~._linear_recompute.LinearFYPerToken`)."""

    def compute(th: Tensor, part: Target, inplace: bool = True, scale: Optional[Tensor] = None,
                overwrite: bool = False, tiles: Optional[TileFlags] = None) -> tuple[Tensor, Tensor, Tensor]:
        return loss.rows(th, part, inplace=inplace, scale=scale, overwrite=overwrite, tiles=tiles)

    sink = StatsSink() if return_stats else None
    if reduction == "none":
        predictor: Union[ThresholdPrediction, ElementwisePrediction]
        if isinstance(loss, FenchelYoungRowLoss):
            predictor = ThresholdPrediction(loss.divergence, loss.beta, loss.q)
        else:  # α-ReLU: the prediction depends on each logit alone
            predictor = ElementwisePrediction(compute)
        value = LinearFYPerToken.apply(hidden2d, weight, bias, compute, predictor, tgt, chunk_size, softcap, sink,
                                       skips_zero_tiles(loss, hidden2d, weight, tgt), native)
        value = value.reshape(batch)
    else:
        value = LinearFY.apply(hidden2d, weight, bias, compute if sink is None else sink.recording(compute), tgt,
                               mean_denominator_tensor(tgt, reduction, compute_dtype(hidden2d.dtype)), chunk_size, softcap,
                               "native" if native else "compute", skips_zero_tiles(loss, hidden2d, weight, tgt))
    if sink is None:  # not return_stats
        return value
    return value, sink.result(batch, compute_dtype(hidden2d.dtype), hidden2d.device)
