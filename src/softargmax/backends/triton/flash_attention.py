r"""Fused α-entmax attention: the autograd function and the coverage test behind :func:`softargmax.attention`.

:func:`maybe_attention` is the dispatch hook of :func:`softargmax.attention`: it returns the
output of the fused Triton kernels of :mod:`softargmax.backends.triton.attention_kernels` (FlashAttention
style: ``O(L)`` memory, the ``[L, S]`` weights never exist) when they cover the call, else
``None`` and the materialized path (the reference) runs.  Covered:

* ``mapping`` ``"sparsemax"``, ``"entmax15"``, ``"entmax"``/``"alpha"`` with α ∈ (1.01, 2]
  as a float, or as a tensor with one α per head (shape ``()``, ``(H,)``, ``(H, 1, 1)`` or
  ``(1, H, 1, 1)``; learnable: its gradient is computed by the kernels);
* ``query`` ``[B, H, L, D]`` (or ``[H, L, D]``), ``key``/``value`` ``[B, Hkv, S, D]`` with
  ``H`` a multiple of ``Hkv`` (grouped-query attention), ``D`` a power of two in [16, 128];
  float16, bfloat16 or float32 (the same for all three), any strides with a unit last stride;
* ``is_causal`` (top-left aligned, as SDPA), or ``attn_mask`` boolean or additive float,
  broadcastable to ``[B, H, L, S]``, without ``requires_grad``, read in place by the kernels
  (broadcast dimensions as stride 0, booleans as bytes: never expanded nor converted); ``scale``;
* a causal sliding ``window`` (query ``i`` sees keys ``i - window < j ≤ i``), alone or with
  ``attn_mask`` (both must allow a key): the key tiles outside the band are never read, in the
  forward and in both backward kernels (no dense mask is built);
* packed variable-length batches (:class:`Packed`: ``query [total_q, H, D]``,
  ``key``/``value`` ``[total_k, Hkv, D]`` and the offsets of each sequence, FlashAttention's
  varlen layout), causal or not, without ``attn_mask``;
* ``dropout_p = 0`` and ``return_weights=False`` (dropout and the weights need the
  materialized path);
* CUDA tensors (CPU tensors under Triton's interpreter when
  :func:`softargmax.backends.triton.rows.set_cpu_interpret` is on, for tests).

``SOFTARGMAX_FLASH_ATTENTION=0`` (or :func:`set_enabled`) turns the automatic choice off.
:func:`flash_attention` runs the fused path explicitly (tests, benchmarks) and
:func:`forward_stats` returns per-row ``Σp`` and the block sparsity reached.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, NamedTuple, Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..._utils.checks import check_window
from ..._utils.extras import LazyModule
from ..switch import Switch
from .launch import current_attention, merged

__all__ = ["maybe_attention", "flash_attention", "forward_stats", "set_enabled", "available", "Packed"]

#: Newton passes per query block at most (the row solver's safeguard)
MAX_ITER = 100
#: the smallest α the fused path takes (the α gradient's closed form loses accuracy towards 1)
ALPHA_MIN = 1.01
#: the general power (α other than 1.5 and 2, or learned) takes ``log2`` from the GPU's ``lg2.approx.f32``
#: when every head's α is at least this (``FAST_LOG``: one instruction instead of a software logarithm of
#: about 30); below it the α gradient, whose terms cancel as α → 1, would amplify its error
#: (:func:`softargmax.backends.triton.attention_kernels._log2`) past 1e-3, and ``tl.log2`` runs instead
ALPHA_FAST_LOG = 1.25
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_switch = Switch("SOFTARGMAX_FLASH_ATTENTION")


def _load() -> ModuleType:
    from . import attention_kernels as _triton_attention

    return _triton_attention


_module = LazyModule(_load)  # the kernel module, or False where Triton is unavailable


def available() -> bool:
    """Whether Triton imports and the attention kernels compile to Python objects."""
    return bool(_module())


def set_enabled(flag: bool) -> bool:
    """Turn the automatic choice of the fused path on or off; returns the old setting."""
    return _switch.set(flag)


def blocks(head_dim: int, device: torch.device, dtype: torch.dtype = torch.bfloat16,
           masked: bool = False, software_log: bool = False) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps)`` of the forward kernel (the backward kernels use the same
    tiles, whose kept/skipped map they read, with :func:`backward_warps`).  On a GPU, half
    inputs: 64×64 tiles and 4 warps (one warpgroup: a 64-row tile is one ``wgmma`` row block)
    up to ``D = 64`` (64×32 with ``software_log``: the general power below ``ALPHA_FAST_LOG``, whose
    software ``log2`` spills 44 bytes in the forward and 24 in ``dK, dV`` at 64×64), 64×32 and 8 warps with
    an ``attn_mask`` (``masked``: 4 warps spill 370–420 bytes there in 64×32 tiles; 64×64 spilled 16 bytes
    in the forward with a window and 92–212 in ``dK, dV``); 64×16 tiles and 8
    warps at ``D = 128``; 2 pipeline stages (:data:`NUM_STAGES`); float32 inputs: 32×32 with 8 warps.
    Chosen from sm_90a compile reports (registers, spills, shared memory; ``ptxas`` of the Triton
    wheel), to keep every kernel free of spills with the most query rows in flight per multiprocessor,
    and from the instructions each score costs (``benchmarks/attention_proxies.py``: 64-key tiles halve
    the per-tile work per score):

    * ``D = 64`` (Triton 3.6.0, causal bfloat16): forward 230 registers (a learned α: 190 with ``FAST_LOG``,
      236 in 64×32 without), ``dK, dV`` 255 (254; 248), ``dQ`` 128 (196; 135), no spills, 2 programs per
      multiprocessor in the forward (128 query rows in flight); in 64×32 tiles (Triton 3.9) the forward
      took 227, ``dK, dV`` 206 and ``dQ`` 189;
    * ``D = 128``: forward 208 registers with 8 warps (1 program, 64 rows; 4 warps: 255 and
      96 bytes of spills), ``dK, dV`` 158 and ``dQ`` 190 with 4 warps (2–3 programs; 8 warps
      spill 144–200 bytes); the former 32×32 with 8 warps kept 32 rows in flight.

    GPU timings are owed.  Under the interpreter 16×16 (small test sizes still span several
    tiles).  A tuning run replaces them (:func:`softargmax.backends.triton.launch.overridden`;
    its ``warps`` then apply to the backward too)."""
    if device.type != "cuda":
        chosen = (16, 16, 4)
    elif dtype == torch.float32:
        chosen = (32, 32, 8)
    else:
        chosen = (64, 32 if software_log or masked else 64, 8 if masked else 4) if head_dim <= 64 else (64, 16, 8)
    return merged(current_attention(), chosen)


def backward_warps(head_dim: int, device: torch.device, dtype: torch.dtype = torch.bfloat16,
                   masked_window: bool = False) -> int:
    """Warps per program of the backward kernels (see :func:`blocks`): 4 for half inputs on a
    GPU, else the forward's; 8 at ``D = 128`` with both an ``attn_mask`` and a sliding window
    (``masked_window``: the ``dK, dV`` kernel with a boolean mask spills 12 bytes at 255 registers with
    4 warps, none at 238 with 8, one program per multiprocessor instead of two: the same warps)."""
    override = current_attention().warps
    if override is not None:
        return override
    if device.type == "cuda" and dtype != torch.float32:
        return 8 if masked_window and head_dim > 64 else 4
    return blocks(head_dim, device, dtype)[2]


#: software-pipelining depth of the attention kernels on a GPU (the compile reports' setting)
NUM_STAGES = 2


# -- coverage --------------------------------------------------------------------------------

class Packed(NamedTuple):
    """A packed batch of variable-length sequences: sequence ``b`` is rows ``cu_q[b]:cu_q[b+1]`` of
    the queries and ``cu_k[b]:cu_k[b+1]`` of the keys (int32, on the device), at most ``max_q``
    queries and ``max_k`` keys long."""

    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int


#: what :func:`_prepare` returns for a covered call: ``(q, k, v, mask4, a, alpha_h, layout, packed)``
#: with ``q, k, v`` 4-D (``[1, H, total, D]`` views of a packed batch) and ``layout`` ``"4d"``,
#: ``"3d"`` (squeezed) or ``"packed"``
_Prepared = tuple[Tensor, Tensor, Tensor, Optional[Tensor], float, Optional[Tensor], str, Optional[Packed]]


def _exponent(mapping: str, alpha: object) -> Optional[tuple[float, Optional[Tensor]]]:
    """``(a, alpha_tensor)`` with ``a = α - 1`` for a float α, or ``None`` if not covered."""
    if mapping == "sparsemax":
        return 1.0, None
    if mapping == "entmax15":
        return 0.5, None
    if mapping not in ("entmax", "alpha") or alpha is None:
        return None
    if isinstance(alpha, Tensor):
        return 0.0, alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        return None
    if not ALPHA_MIN <= float(alpha) <= 2.0:
        return None
    return float(alpha) - 1.0, None


def _per_head(alpha: Tensor, H: int) -> Optional[Tensor]:
    """α as a differentiable ``[H]`` tensor (one per head), or ``None`` if it varies along another axis."""
    if alpha.dim() == 1 and alpha.shape[0] == H:
        return alpha
    shape = [1] * max(0, 4 - alpha.dim()) + list(alpha.shape)
    if len(shape) != 4 or shape[0] != 1 or shape[2] != 1 or shape[3] != 1 or shape[1] not in (1, H):
        return None
    return alpha.reshape(shape[1]).expand(H)


def _mask4(attn_mask: Tensor, like: Tensor, B: int, H: int, L: int, S: int) -> Optional[Tensor]:
    """The mask as a ``[B, H, L, S]`` view (broadcast strides 0): additive float, or a boolean
    mask viewed as bytes; ``None`` if not covered."""
    if attn_mask.requires_grad or attn_mask.dim() > 4 or attn_mask.device != like.device:
        return None
    if attn_mask.dtype == torch.bool:
        attn_mask = attn_mask.view(torch.uint8)  # read as bytes (1: may attend), never converted
    elif not attn_mask.is_floating_point():
        return None
    m = attn_mask.reshape([1] * (4 - attn_mask.dim()) + list(attn_mask.shape))
    try:
        return m.expand(B, H, L, S)
    except RuntimeError:
        return None


def _usable_device(t: Tensor) -> bool:
    from . import rows as _triton_rows

    return _switch.on and _triton_rows.usable_device(t) and available()


def _prepare(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor], is_causal: bool, mapping: str,
             alpha: object, packed: Optional[Packed] = None) -> Optional[_Prepared]:
    """The 4-D inputs and the settings of a covered call, or ``None``."""
    ex = _exponent(mapping, alpha)
    if ex is None:
        return None
    a, alpha_t = ex
    if not (query.dtype in _DTYPES and key.dtype == query.dtype and value.dtype == query.dtype):
        return None
    if packed is not None:
        if attn_mask is not None or not (query.dim() == key.dim() == value.dim() == 3):
            return None
        layout = "packed"
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))  # [1, heads, total, D]
    else:
        if not (query.dim() == key.dim() == value.dim() and query.dim() in (3, 4)):
            return None
        layout = "3d" if query.dim() == 3 else "4d"
        q, k, v = (t.unsqueeze(0) if layout == "3d" else t for t in (query, key, value))
    B, H, L, D = q.shape
    Bk, Hkv, S, Dk = k.shape
    if not (Bk == B and v.shape[:3] == k.shape[:3] and v.shape[3] == D and Dk == D):
        return None
    if not (Hkv > 0 and H % Hkv == 0 and 16 <= D <= 128 and D & (D - 1) == 0 and L > 0 and S > 0):
        return None
    mask4 = None
    if attn_mask is not None:
        mask4 = _mask4(attn_mask, q, B, H, L, S)
        if mask4 is None:
            return None
    alpha_h = None
    if alpha_t is not None:
        if alpha_t.device != q.device or not alpha_t.is_floating_point():
            return None
        alpha_h = _per_head(alpha_t, H)
        if alpha_h is None:
            return None
        lo, hi = torch.stack(torch.aminmax(alpha_h.detach())).tolist()  # one small synchronization
        if not (ALPHA_MIN <= lo and hi <= 2.0):
            return None
        a = lo - 1.0  # the smallest a = α - 1 (the kernels read α per head: this chooses FAST_LOG)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return q, k, v, mask4, a, alpha_h, layout, packed


def maybe_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor], dropout_p: float,
                    is_causal: bool, scale: float, mapping: str, alpha: object,
                    return_weights: bool, packed: Optional[Packed] = None,
                    window: Optional[int] = None) -> Optional[Tensor]:
    """The fused output when the kernels cover the call (module docstring), else ``None``."""
    if return_weights or dropout_p > 0 or not _usable_device(query):
        return None
    prep = _prepare(query, key, value, attn_mask, is_causal, mapping, alpha, packed)
    if prep is None:
        return None
    return _apply(prep, is_causal, scale, window=window)


def flash_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                    is_causal: bool = False, scale: Optional[float] = None, mapping: str = "entmax15",
                    alpha: Union[float, Tensor, None] = None, block_m: Optional[int] = None,
                    block_n: Optional[int] = None, packed: Optional[Packed] = None,
                    window: Optional[int] = None) -> Tensor:
    """The fused path explicitly, whatever the device (CPU tensors need ``TRITON_INTERPRET=1``);
    raises ``ValueError`` where it does not cover the call.  ``packed``: a packed batch
    (``query [total_q, H, D]``, ``key``/``value`` ``[total_k, Hkv, D]``; checked by
    :func:`softargmax.attention`, trusted here).  ``window``: the causal sliding window of
    :func:`softargmax.attention` (query ``i`` sees keys ``i - window < j ≤ i``)."""
    if not available():
        raise RuntimeError("flash_attention needs Triton")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal cannot both be set")
    window = check_window(window)
    prep = _prepare(query, key, value, attn_mask, is_causal, mapping, alpha, packed)
    if prep is None:
        raise ValueError("flash_attention: the fused kernels do not cover these arguments (see the module docstring)")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _apply(prep, is_causal, scale, block_m, block_n, window)


def _config(prep: _Prepared, block_m: Optional[int], block_n: Optional[int],
            windowed: bool = False) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, forward warps, backward warps)`` (``windowed``: the kernels' sliding window is on)."""
    q, masked, a, alpha_h = prep[0], prep[3] is not None, prep[4], prep[5]
    exact = _exact(a, alpha_h is not None)
    bm, bn, warps = blocks(q.shape[-1], q.device, q.dtype, masked=masked,
                           software_log=exact == 0 and not _fast_log(a, exact))
    return (block_m or bm, block_n or bn, warps, backward_warps(q.shape[-1], q.device, q.dtype, masked and windowed))


def _kernel_window(window: Optional[int], q: Tensor, packed: Optional[Packed]) -> int:
    """The kernels' ``window``: 0 (none) where it cuts no key, a window at least as long as the longest
    query sequence (query ``i < L`` then sees every key ``j ≤ i`` anyway)."""
    if window is None:
        return 0
    longest = packed.max_q if packed is not None else q.shape[2]
    return 0 if window >= longest else int(window)


def _apply(prep: _Prepared, is_causal: bool, scale: float, block_m: Optional[int] = None,
           block_n: Optional[int] = None, window: Optional[int] = None) -> Tensor:
    q, k, v, mask4, a, alpha_h, layout, packed = prep
    causal = bool(is_causal) or window is not None  # a window is causal (alone or with attn_mask)
    win = _kernel_window(window, q, packed)
    out = FlashEntmaxAttention.apply(q, k, v, alpha_h, a, mask4, causal, float(scale),
                                     _config(prep, block_m, block_n, win > 0), packed, win)
    if layout == "3d":
        return out.squeeze(0)
    if layout == "packed":
        return out.squeeze(0).transpose(0, 1)  # [total_q, H, D], contiguous
    return out


def _exact(a: float, per_head: bool) -> int:
    if per_head:
        return 0
    return 1 if a == 1.0 else 2 if a == 0.5 else 0


def _fast_log(a: float, exact: int) -> bool:
    """``FAST_LOG`` of the kernels: the general power (``exact`` 0) with every α at least
    :data:`ALPHA_FAST_LOG` (``a``: the smallest ``α - 1``); off for the exact powers (no logarithm)."""
    return exact == 0 and a >= ALPHA_FAST_LOG - 1.0


def _dot_mode(q: Tensor) -> int:
    """0: tensor-core dots of half inputs, 1: IEEE float32, 2: the interpreter's widened bfloat16."""
    if q.dtype == torch.float32:
        return 1
    return 2 if (q.dtype == torch.bfloat16 and q.device.type == "cpu") else 0


def _mask_args(mask4: Optional[Tensor], like: Tensor) -> tuple[Tensor, tuple[int, ...], int]:
    if mask4 is None:
        return like, (0, 0, 0, 0), 0
    return mask4, tuple(mask4.stride()), 2 if mask4.dtype == torch.uint8 else 1


def _grid(q: Tensor, k: Tensor, cfg: tuple[int, ...], packed: Optional[Packed]) -> tuple[int, int, int]:
    """``(sequences, query blocks, key blocks)`` of the launch grids and the tile map (:func:`tile_words`)."""
    B, L, S = q.shape[0], q.shape[2], k.shape[2]
    if packed is not None:
        B, L, S = packed.cu_q.numel() - 1, max(packed.max_q, 1), max(packed.max_k, 1)
    return B, -(-L // cfg[0]), -(-S // cfg[1])


def tile_words(rows: int, nq: int, nk: int, device: torch.device) -> Tensor:
    """The forward's tile map, uninitialized (its kernel writes every word): ``[rows, nq, ⌈nk / 32⌉]`` int32, one
    bit per tile, bit ``b`` of word ``w`` of ``[r, i]`` for the tile of query block ``i`` and key block ``32 w + b``
    (:func:`kept_tiles` unpacks it).  One bit instead of a float32 per tile: at ``L = 16384``, ``B = 2``,
    ``H = 16`` in 64×32 tiles 0.5 MB instead of 16.8 MB (64×64: 0.26 MB instead of 8.4 MB)."""
    return torch.empty(rows, nq, -(-nk // 32), dtype=torch.int32, device=device)


def kept_tiles(words: Tensor, nk: int) -> Tensor:
    """The tile map of :func:`tile_words` as booleans, ``[rows, nq, nk]``: ``True`` on the kept tiles.

    Example: ``kept_tiles(torch.tensor([[[5]]], dtype=torch.int32), 3)`` is ``[[[True, False, True]]]``."""
    if words.dtype != torch.int32:
        raise TypeError(f"kept_tiles: words must be int32, got {words.dtype}")
    if words.dim() < 1 or words.shape[-1] != -(-nk // 32):
        raise ValueError(f"kept_tiles: nk = {nk} needs {-(-nk // 32)} words per row, words has shape "
                         f"{tuple(words.shape)}")
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [..., words, 32], bit b of word w: key block 32 w + b
    return bits.flatten(-2)[..., :nk] != 0


def _offsets(packed: Optional[Packed], device: torch.device) -> tuple[Tensor, Tensor]:
    """The kernels' ``CU_Q``, ``CU_K``: a packed batch's offsets, else an unused int32 placeholder."""
    if packed is not None:
        return packed.cu_q, packed.cu_k
    none = torch.empty(1, dtype=torch.int32, device=device)
    return none, none


def _launch_options(q: Tensor, warps: int) -> dict:
    return dict(num_warps=warps, num_stages=NUM_STAGES) if q.device.type == "cuda" else dict(num_warps=warps)


def _forward(q: Tensor, k: Tensor, v: Tensor, A: Tensor, exact: int, mask4: Optional[Tensor], causal: bool,
             scale: float, cfg: tuple[int, int, int, int], packed: Optional[Packed] = None, fast: bool = False,
             window: int = 0, stats: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Launch the forward kernel (``fast``: its ``FAST_LOG``, :func:`_fast_log`; ``window``: the kernels'
    sliding window, 0 for none, with ``causal``; ``stats``: its ``STATS``, ``Σp`` per row for sparsemax and
    1.5-entmax too, which their training forward does not sum); returns the output (4-D,
    a view of a ``[total, H, D]`` tensor for a packed batch), ``W``, the saved rows, the tile map (one bit per
    tile: :func:`tile_words`), the Newton
    passes per query block and the lists of kept tiles (``[B·H, query blocks, 2 · key blocks + 3]`` int32:
    two halves the passes alternate between, then per query block the number of kept tiles, the offset
    of the half that lists them and how many of them need no mask)."""
    K = _module()
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    BM, BN, warps, _ = cfg
    nb, nq, nk = _grid(q, k, cfg, packed)
    dev = q.device
    if packed is not None:
        o = torch.empty(L, H, D, dtype=q.dtype, device=dev).transpose(0, 1).unsqueeze(0)
    else:
        o = torch.empty(B, H, L, D, dtype=q.dtype, device=dev)
    w = torch.empty(B, H, L, D, dtype=q.dtype, device=dev)  # per-row layout
    rows = _row_buffers(6, B * H * L, dev)  # m, t, Σs, Σp, Σ p log p, the shift (τ = a m + t: attention_kernels._u)
    kept = tile_words(nb * H, nq, nk, dev)
    iters = torch.empty(nb * H, nq, dtype=torch.int32, device=dev)
    lists = torch.empty(nb * H, nq, 2 * nk + 3, dtype=torch.int32, device=dev)
    cu_q, cu_k = _offsets(packed, q.device)
    mask, ms, has_mask = _mask_args(mask4, q)
    tol = 2 * torch.finfo(torch.float32).eps
    # the general power's second launch goes on with the rows whose last Newton step the output pass's evaluation did
    # not confirm (attention_kernels.PREDICT_RESIDUAL, marked in redo): its programs without one return at once
    predict = _predicts(exact, q)
    redo = torch.empty(B * H * L, dtype=torch.float32, device=dev) if predict else rows[0]  # (untouched without)
    for repair in (False, True) if predict else (False,):
        K.attention_fwd[(nq, nb * H)](
            q, k, v, o, w, mask, A, rows[0], rows[1], rows[5], rows[2], rows[3], rows[4], redo, kept, iters, lists,
            cu_q, cu_k, H, Hkv, L, S, nq, nk, scale, tol, MAX_ITER, window,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2), *ms,
            EXACT=exact, CAUSAL=causal, HAS_MASK=has_mask, DOT=_dot_mode(q), VARLEN=packed is not None,
            FAST_LOG=fast, WINDOWED=window > 0, BLOCK_M=BM, BLOCK_N=BN, HEAD_DIM=D, STATS=stats, REPAIR=repair,
            PREDICT=predict, POS_SCALE=scale > 0, **_launch_options(q, warps))
    return o, w, rows, kept, iters, lists


def _predicts(exact: int, q: Tensor) -> bool:
    """Whether the forward takes the general power's last Newton step without a pass at its iterate (the kernels'
    ``PREDICT``; ``attention_kernels.PREDICT_RESIDUAL``): not for float32 inputs at head dim 128, whose forward the
    pending rows' bookkeeping tips into spills (sm_90a, Triton 3.6: 128 registers and 296 bytes of spills instead of
    120 and none), nor for sparsemax and 1.5-entmax, whose rows end on a certified root."""
    return exact == 0 and not (_dot_mode(q) == 1 and q.shape[-1] > 64)


def _row_buffers(n: int, length: int, device: torch.device) -> Tensor:
    """``[n, length]`` float32 rows whose starts are 128-byte aligned whatever ``length``: the
    kernels are specialized on the 16-byte alignment of their pointers, and ``rows[i]`` of a
    plain ``[n, length]`` buffer is aligned or not depending on the sequence length (one more
    compilation per length class)."""
    padded = -(-max(length, 1) // 32) * 32
    return torch.empty(n, padded, dtype=torch.float32, device=device)[:, :length]


def _kernel_a(q: Tensor, alpha_h: Optional[Tensor], a: float) -> Tensor:
    H = q.shape[1]
    if alpha_h is not None:
        return (alpha_h.detach().to(device=q.device, dtype=torch.float32) - 1.0).contiguous()
    return torch.full((H,), a, dtype=torch.float32, device=q.device)


def _row_dot(x: Tensor, y: Tensor) -> Tensor:
    """``Σ_d x·y`` per row ``(b·H + h)·L + i`` of two strided ``[B, H, L, D]`` tensors, float32
    ``[B·H·L]``, without float32 copies of the operands."""
    B, H, L, D = x.shape
    out = torch.empty(B * H * L, dtype=torch.float32, device=x.device)
    block = max(1, 1024 // D)  # 1024 elements per program (no spills for sm_90)
    _module().row_dot[(-(-out.numel() // block),)](x, y, out, out.numel(), H, L, x.stride(0), x.stride(1),
                                                    x.stride(2), y.stride(0), y.stride(1), y.stride(2),
                                                    BLOCK_R=block, HEAD_DIM=D)
    return out


class FlashEntmaxAttention(torch.autograd.Function):
    """``O = entmax_α(scale · q kᵀ + mask) v`` by the fused kernels (see :mod:`softargmax.backends.triton.attention_kernels`)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, alpha_h: Optional[Tensor], a: float,
                mask4: Optional[Tensor], causal: bool, scale: float, cfg: tuple[int, int, int, int],
                packed: Optional[Packed] = None, window: int = 0) -> Tensor:
        A = _kernel_a(q, alpha_h, a)
        exact = _exact(a, alpha_h is not None)
        fast = _fast_log(a, exact)
        o, w, rows, kept, _, lists = _forward(q, k, v, A, exact, mask4, causal, scale, cfg, packed, fast, window)
        ctx.save_for_backward(q, k, v, o, w, rows, kept, lists, A)
        ctx.mask4, ctx.causal, ctx.scale, ctx.cfg, ctx.exact, ctx.packed = mask4, causal, scale, cfg, exact, packed
        ctx.window = window
        ctx.alpha_h, ctx.fast = alpha_h is not None, fast
        ctx.alpha_dtype = alpha_h.dtype if alpha_h is not None else None
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, do: Tensor) -> tuple[Optional[Tensor], ...]:
        q, k, v, o, w, rows, kept, lists, A = ctx.saved_tensors
        K = _module()
        B, H, L, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        BM, BN, _, warps = ctx.cfg
        packed = ctx.packed
        nb, nq, nk = _grid(q, k, ctx.cfg, packed)
        do = do if do.stride(-1) == 1 else do.contiguous()
        c = _row_dot(do, w)  # Σ_j s_j g_j / Σs = dO·W per row
        mask, ms, has_mask = _mask_args(ctx.mask4, q)
        alpha_grad = ctx.alpha_h and ctx.needs_input_grad[3]
        dq = torch.empty(B, H, L, D, dtype=q.dtype, device=q.device)  # per-row layouts
        dk = torch.empty(B, Hkv, S, D, dtype=k.dtype, device=q.device)
        dv = torch.empty(B, Hkv, S, D, dtype=v.dtype, device=q.device)
        plg = torch.empty(B * H * L, dtype=torch.float32, device=q.device) if alpha_grad else rows[0]
        cu_q, cu_k = _offsets(packed, q.device)
        strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2), *ms)
        consts = dict(EXACT=ctx.exact, CAUSAL=ctx.causal, HAS_MASK=has_mask, DOT=_dot_mode(q),
                      VARLEN=packed is not None, FAST_LOG=ctx.fast, WINDOWED=ctx.window > 0, BLOCK_M=BM, BLOCK_N=BN,
                      HEAD_DIM=D, **_launch_options(q, warps))
        columns = torch.empty(nb * H, nk, nq, dtype=torch.int32, device=q.device)  # dK, dV's lists of kept tiles
        K.attention_bwd_dkdv[(nk, nb * Hkv)](q, k, v, do, dk, dv, mask, A, rows[0], rows[1], rows[5], c, kept, columns,
                                             cu_q, cu_k, H, Hkv, L, S, nq, nk, ctx.scale, ctx.window, *strides,
                                             **consts)
        K.attention_bwd_dq[(nq, nb * H)](q, k, v, do, dq, mask, A, rows[0], rows[1], rows[5], c, plg, lists, cu_q, cu_k,
                                         H, Hkv, L, S, nq, nk, ctx.scale, ctx.window, *strides, ALPHA_GRAD=alpha_grad,
                                         **consts)
        dalpha = None
        if alpha_grad:
            # ⟨g, ∂p/∂α⟩ = (⟨g,p⟩ - c)/a² - (⟨g, p log p⟩ + H(p) c)/a per row, H(p) = -Σ p log p
            a = A.double().view(1, H, 1)
            gp = _row_dot(do, o).double().view(B, H, L)  # ⟨g, p⟩ = dO·O
            cc = c.double().view(B, H, L)
            ent = -rows[4].double().view(B, H, L)
            per_row = (gp - cc) / (a * a) - (plg.double().view(B, H, L) + ent * cc) / a
            dalpha = per_row.sum((0, 2)).to(ctx.alpha_dtype)
        return dq, dk, dv, dalpha, None, None, None, None, None, None, None


@torch.no_grad()
def forward_stats(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                  is_causal: bool = False, scale: Optional[float] = None, mapping: str = "entmax15",
                  alpha: Union[float, Tensor, None] = None, block_m: Optional[int] = None,
                  block_n: Optional[int] = None, packed: Optional[Packed] = None,
                  window: Optional[int] = None) -> dict:
    """One fused forward's diagnostics: ``psum`` (``Σ_j p_j`` per query row, ``[B, H, L]``, or
    ``[1, H, total]`` for a packed batch; 0 for empty rows), ``tiles`` and ``kept`` (the score
    tiles inside the causal band, or the sliding window's, and those the output pass used),
    ``block_sparsity = 1 - kept / tiles``, ``newton_passes`` (``[B, H, query blocks]``: the
    Newton passes each block of query rows took, with the general power's output passes that went on to more
    passes, each counted as one; blocks past a packed sequence's end count 0) and
    ``tile_map`` (``[B, H, query blocks, key blocks]`` bool, the forward's tile map unpacked by
    :func:`kept_tiles`: ``True`` on the tiles the output pass kept, those ``dK, dV`` walk; ``B`` the sequences
    of a packed batch, its blocks counted from each sequence's start)."""
    window = check_window(window)
    prep = _prepare(query, key, value, attn_mask, is_causal, mapping, alpha, packed)
    if prep is None:
        raise ValueError("forward_stats: the fused kernels do not cover these arguments")
    q, k, v, mask4, a, alpha_h, _, _ = prep
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    cfg = _config(prep, block_m, block_n)
    A = _kernel_a(q, alpha_h, a)
    exact = _exact(a, alpha_h is not None)
    is_causal = bool(is_causal) or window is not None
    win = _kernel_window(window, q, packed)
    _, _, rows, words, iters, _ = _forward(q, k, v, A, exact, mask4, is_causal, scale, cfg, packed,
                                        _fast_log(a, exact), win, stats=True)
    B, H, L, _ = q.shape
    BM, BN = cfg[0], cfg[1]
    nb, nq, nk = _grid(q, k, cfg, packed)
    if packed is None:
        lengths = [(L, k.shape[2])] * B
    else:
        cq, ck = packed.cu_q.tolist(), packed.cu_k.tolist()
        lengths = [(cq[i + 1] - cq[i], ck[i + 1] - ck[i]) for i in range(nb)]
    qi = torch.arange(nq, device=q.device)[:, None]
    kj = torch.arange(nk, device=q.device)[None, :]
    band = torch.stack([(qi * BM < Lb) & (kj * BN < (torch.clamp((qi + 1) * BM, max=Sb) if is_causal else Sb))
                        & ((kj + 1) * BN - 1 > qi * BM - win if win else True)
                        for Lb, Sb in lengths])  # [sequences, nq, nk]
    band = band.repeat_interleave(H, 0)
    tiles = int(band.sum())
    tile_map = kept_tiles(words, nk)
    kept = int((tile_map & band).sum())
    passes = torch.where(band.any(-1), iters, torch.zeros_like(iters))
    return {"psum": rows[3].view(B, H, L), "tiles": tiles, "kept": kept,
            "block_sparsity": 1.0 - kept / max(tiles, 1), "newton_passes": passes.view(nb, H, -1),
            "tile_map": tile_map.reshape(nb, H, nq, nk)}
