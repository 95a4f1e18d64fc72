r"""The attention benchmark's inputs: random, or structured like trained causal attention.

**Random** (:func:`random_inputs`): ``q, k, v, dO`` with independent standard normal entries, drawn in that
order from one seeded generator (the benchmark's inputs since it began).  The scores
``s_ij = q_i · k_j / √D`` are then about ``N(0, 1)`` everywhere: 1.5-entmax keeps a few dozen keys per
query, scattered over the whole row, so nearly every ``64 × 64`` score tile holds one of them and the
fused kernels skip almost no tile (0.02 % of the causal band's tiles at L = 4096, 1.3 % at 16384).

**Structured** (:func:`structured_inputs`): the same random draw, with four of the ``D`` dimensions of
``q`` and ``k`` replaced so that the scores gain two position-dependent terms:

.. math::

    s_{ij} = \frac{c_i \cdot c_j}{\sqrt D} + \lambda \frac{j}{L}
             + [\, j < n_\text{sink} \,] \Big( \lambda \frac{i}{L} + \sigma \Big),

with ``c`` the ``D - 4`` random content dimensions (the noise: about ``N(0, 1)``), ``λ`` the
**locality** (the knob) and ``n_sink = 4`` sink keys at level ``σ = 1``:

* *locality*: for causal attention ``λ j / L`` is a linear recency bias ``-λ (i - j) / L`` plus
  ``λ i / L``, which is the same for every key of query ``i`` and so changes no α-entmax weight (a
  row's weights do not move when a constant is added to its scores).  This is ALiBi's bias (Press,
  Smith & Lewis, *Train Short, Test Long: Attention with Linear Biases Enables Input Length
  Extrapolation*, ICLR 2022, https://arxiv.org/abs/2108.12409), with the slope ``λ / L`` per key: each
  query's high scores sit just before its position, as in the local heads of trained models, and the
  support shrinks towards the diagonal as ``λ`` grows.  The dot product carries it as ``q_i[0:2] = 1``
  and ``k_j[0:2]`` the bfloat16 head and tail of ``λ √D j / L`` (two entries, so that the bias survives
  bfloat16 rounding to about ``2⁻¹⁶`` relative);
* *sinks*: keys ``0 … 3`` score ``σ = 1`` above the bias at the query's own position, for every query
  (``q_i[2:4]`` the head and tail of ``λ i / L + σ``, ``k_j[2:4] = √D`` for a sink, else 0): every
  query keeps the first keys in its support with a good share of the weight (about 0.4 of it), as the
  "attention sinks" of trained language models (Xiao, Tian, Chen, Han & Lewis, *Efficient Streaming
  Language Models with Attention Sinks*, ICLR 2024, https://arxiv.org/abs/2309.17453, whose models keep
  4 initial tokens).

The kept tiles are then the diagonal, the first key column (the sinks) and a band of
width about ``Δ L / λ`` keys before the diagonal (``Δ``, a few units of the content noise: the
largest noise among a tile's 4096 scores decides whether it is kept), so the block sparsity grows with
``λ`` and, at fixed ``λ``, slowly with ``L`` (the diagonal and sink tiles weigh less, and more keys near
the top raise the threshold).  ``benchmarks/calibrate_attention_inputs.py`` measures it on the CPU and
picks ``λ`` for each target; ``v`` and ``dO`` stay random.

:func:`block_sparsity` is the CPU reference of
:func:`softargmax.backends.triton.flash_attention.forward_stats`'s ``block_sparsity`` for causal
1.5-entmax (``1 - kept / tiles`` over the score tiles of the causal band; a tile is kept when one of its
weights is positive), computed from the scores in float64 without the kernels.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

#: keys that every query attends to in the structured inputs
SINKS = 4
#: the sinks' score above the locality bias at the query's own position (units of the content noise)
SINK_LEVEL = 1.0
#: the dimensions of ``q`` and ``k`` that carry the structure (the rest is the random content)
STRUCTURED_DIMS = 4


def _check(batch: int, heads: int, kv_heads: int, length: int, head_dim: int) -> None:
    for name, value in (("batch", batch), ("heads", heads), ("kv_heads", kv_heads), ("length", length),
                        ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")


def random_inputs(batch: int, heads: int, kv_heads: int, length: int, head_dim: int, seed: int = 0) -> list[Tensor]:
    """``[q, k, v, dO]``, float32 on the CPU, standard normal entries drawn in that order from
    ``torch.Generator().manual_seed(seed)``: ``q`` and ``dO`` ``[batch, heads, length, head_dim]``,
    ``k`` and ``v`` ``[batch, kv_heads, length, head_dim]``.

    Example::

        >>> q, k, v, do = random_inputs(1, 4, 2, 8, 16)
        >>> tuple(q.shape), tuple(k.shape)
        ((1, 4, 8, 16), (1, 2, 8, 16))
    """
    _check(batch, heads, kv_heads, length, head_dim)
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads if i in (0, 3) else kv_heads, length, head_dim, generator=gen)
            for i in range(4)]


def _head_and_tail(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` (float64) as two bfloat16-representable float32 parts whose sum is ``x`` to ``2⁻¹⁶`` relative."""
    head = x.to(torch.bfloat16).double()
    return head.float(), (x - head).to(torch.bfloat16).float()


def structured_inputs(batch: int, heads: int, kv_heads: int, length: int, head_dim: int, locality: float,
                      seed: int = 0, sinks: int = SINKS, sink_level: float = SINK_LEVEL) -> list[Tensor]:
    r"""``[q, k, v, dO]`` of :func:`random_inputs` (same shapes, same draw) with the locality bias and
    the attention sinks of the module docstring written into the first four dimensions of ``q`` and ``k``.

    With ``s_ij = q_i · k_j / √D`` (``D = head_dim``) the scores are the random content's plus
    ``locality · j / length`` plus, for the first ``sinks`` keys, ``locality · i / length + sink_level``;
    every value written is exact in bfloat16 up to a relative ``2⁻¹⁶``, so casting the result to
    bfloat16 (as the benchmark does) keeps the structure.

    Args:
        batch, heads, kv_heads, length, head_dim: the shapes (``heads`` a multiple of ``kv_heads``;
            ``head_dim > 4``).
        locality: ``λ ≥ 0``, the recency bias's total slope over the sequence (0: random inputs but
            for the sinks); larger is sparser.
        seed: the generator's seed (the same inputs for the same arguments).
        sinks: how many leading keys are sinks (``0 ≤ sinks ≤ length``).
        sink_level: the sinks' score above the bias at the query's position.

    Returns:
        ``[q, k, v, dO]``, float32 CPU tensors.

    Example::

        >>> q, k, v, do = structured_inputs(1, 2, 1, 64, 16, locality=20.0)
        >>> s = q[0, 0] @ k[0, 0].T / 4
        >>> bool(s[63, 62] > s[63, 20])  # near keys score higher (here by 20 · 42 / 64, in expectation)
        True
    """
    _check(batch, heads, kv_heads, length, head_dim)
    if head_dim <= STRUCTURED_DIMS:
        raise ValueError(f"head_dim must exceed {STRUCTURED_DIMS} (the structured dimensions), got {head_dim}")
    if isinstance(locality, bool) or not isinstance(locality, (int, float)) or not 0 <= locality < math.inf:
        raise ValueError(f"locality must be a finite number >= 0, got {locality!r}")
    if isinstance(sinks, bool) or not isinstance(sinks, int) or not 0 <= sinks <= length:
        raise ValueError(f"sinks must be a whole number in [0, length], got {sinks!r}")
    if isinstance(sink_level, bool) or not isinstance(sink_level, (int, float)) or not math.isfinite(sink_level):
        raise ValueError(f"sink_level must be a finite number, got {sink_level!r}")
    q, k, v, do = random_inputs(batch, heads, kv_heads, length, head_dim, seed)
    root = math.sqrt(head_dim)
    position = torch.arange(length, dtype=torch.float64) / length
    k[..., 0], k[..., 1] = _head_and_tail(locality * root * position)  # λ j / L once divided by √D
    q[..., 0] = 1.0
    q[..., 1] = 1.0
    q[..., 2], q[..., 3] = _head_and_tail(locality * position + sink_level)  # λ i / L + σ
    sink = torch.zeros(length)
    sink[:sinks] = root
    k[..., 2] = sink
    k[..., 3] = sink
    return [q, k, v, do]


def _tau(z: Tensor, iterations: int = 60) -> Tensor:
    """1.5-entmax's threshold of each row of ``z = s / 2`` (float64, ``-inf`` masked): ``Σ_j (z_j - τ)₊² = 1``,
    by bisection on ``[max - 1, max]`` over the entries above ``max - 1`` (the only ones that can count)."""
    top = z.max(-1, keepdim=True).values
    width = int((z > top - 1).sum(-1).max())
    cand = z.topk(width, dim=-1).values
    lo, hi = top - 1, top
    for _ in range(iterations):
        mid = (lo + hi) / 2
        big = ((cand - mid).clamp(min=0) ** 2).sum(-1, keepdim=True) > 1
        lo, hi = torch.where(big, mid, lo), torch.where(big, hi, mid)
    return lo


def block_sparsity(q: Tensor, k: Tensor, block_m: int, block_n: int, scale: Optional[float] = None,
                   rows: int = 256) -> float:
    r"""Causal 1.5-entmax's block sparsity from the scores, without the kernels: ``1 - kept / tiles``
    over the ``block_m × block_n`` score tiles of the causal band (top-left aligned), a tile kept when
    one of its weights ``p_ij = (s_ij / 2 - τ_i)₊²`` is positive, the scores ``s = scale · q kᵀ`` and the
    thresholds ``τ`` in float64 (:func:`softargmax.backends.triton.flash_attention.forward_stats`'s
    ``block_sparsity``, which the kernels count, up to weights within rounding of the threshold).

    Args:
        q: ``[B, H, L, D]`` queries (any float dtype; a benchmark's bfloat16 inputs as they are).
        k: ``[B, Hkv, S, D]`` keys, ``H`` a multiple of ``Hkv`` (query head ``h`` reads key head
            ``h // (H / Hkv)``).
        block_m, block_n: the tile (query rows × keys).
        scale: the score scale, ``1/√D`` by default.
        rows: query rows per chunk (memory: ``rows × S`` float64 scores at a time).

    Returns:
        The fraction of the band's tiles that hold no positive weight.

    Example::

        >>> q, k, _, _ = structured_inputs(1, 1, 1, 256, 16, locality=40.0)
        >>> 0.2 < block_sparsity(q, k, 32, 32) < 1
        True
    """
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must be [B, H, L, D] and [B, Hkv, S, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"the query heads ({H}) must be a multiple of the key heads ({Hkv})")
    for name, value in (("block_m", block_m), ("block_n", block_n), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    rows = max(block_m, rows // block_m * block_m)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    nq, nk = -(-L // block_m), -(-S // block_n)
    qi = torch.arange(nq)[:, None]
    kj = torch.arange(nk)[None, :]
    band = kj * block_n < torch.clamp((qi + 1) * block_m, max=S)
    kept = 0
    for b in range(B):
        for h in range(H):
            keys = k[b, h // (H // Hkv)].double()
            hit = torch.zeros(nq, nk, dtype=torch.bool)
            for r0 in range(0, L, rows):
                r1 = min(L, r0 + rows)
                cols = min(S, r1)  # the causal band's keys of these rows
                z = (q[b, h, r0:r1].double() @ keys[:cols].T) * (scale / 2)
                i = torch.arange(r0, r1)[:, None]
                z = z.masked_fill(torch.arange(cols)[None, :] > i, -math.inf)
                pos = z > _tau(z)
                pad_r, pad_c = (-(r1 - r0)) % block_m, (-cols) % block_n
                pos = torch.nn.functional.pad(pos, (0, pad_c, 0, pad_r))
                tiles = pos.view(pos.shape[0] // block_m, block_m, pos.shape[1] // block_n, block_n).any(3).any(1)
                hit[r0 // block_m:r0 // block_m + tiles.shape[0], :tiles.shape[1]] |= tiles
            kept += int((hit & band).sum())
    return 1.0 - kept / (int(band.sum()) * B * H)
