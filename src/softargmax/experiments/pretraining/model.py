r"""A small decoder-only Transformer with the features of NanoDO (Liu et al., 2024) as the f-divergence paper uses it.

Pre-norm blocks (LayerNorm without bias) of causal self-attention and a GELU MLP (no biases),
rotary position embeddings (Su et al., 2024) on queries and keys, and qk-layernorm (Dehghani et
al., 2023; Wortsman et al., 2024): a LayerNorm over each head's queries and keys before the
rotation, which keeps the attention logits bounded.  The output layer is tied to the input
embedding, as NanoDO's ``embed.attend``: the logits are :math:`h E^\top` for the final normalized
hidden state :math:`h`.  The model returns :math:`h`; the experiment hands :math:`h` and :math:`E` to the
fused ``linear_fenchel_young_loss``, so the ``[tokens, V]`` logits are never stored during training.
Tying also follows Press & Wolf (2017), who found tied embeddings better for small word-level
models, and halves the parameters here (the ``[V, d]`` embedding is most of them).

Rotary embedding.  For a head of even size :math:`D` and position :math:`m`, each pair of features
:math:`(x_{2i}, x_{2i+1})` read as the complex number :math:`x_{2i} + \mathrm{i}\, x_{2i+1}` is multiplied by
:math:`e^{\mathrm{i} m \omega_i}` with :math:`\omega_i = b^{-2i/D}` (:math:`b = 10^4`), so that
:math:`\langle R_m q, R_n k\rangle` depends on :math:`m - n` only.

References:

* Peter J. Liu, Roman Novak, Jaehoon Lee, Mitchell Wortsman, Lechao Xiao et al., *NanoDO: A minimal Transformer decoder-only language model implementation in JAX*, 2024, https://github.com/google-deepmind/nanodo
* Jianlin Su, Yu Lu, Shengfeng Pan, Ahmed Murtadha, Bo Wen and Yunfeng Liu, *RoFormer: Enhanced Transformer with Rotary Position Embedding*, Neurocomputing 2024, https://arxiv.org/abs/2104.09864
* Mostafa Dehghani et al., *Scaling Vision Transformers to 22 Billion Parameters*, ICML 2023, https://arxiv.org/abs/2302.05442
* Mitchell Wortsman et al., *Small-scale proxies for large-scale Transformer training instabilities*, ICLR 2024, https://arxiv.org/abs/2309.14322
* Ofir Press and Lior Wolf, *Using the Output Embedding to Improve Language Models*, EACL 2017, https://arxiv.org/abs/1608.05859
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class DecoderConfig:
    vocab: int
    d: int = 128
    heads: int = 4
    layers: int = 2
    ff: int = 512
    context: int = 64
    rope_base: float = 10000.0


def rotary_tables(length: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``[length, head_dim // 2]``: the angles ``m ω_i`` of positions ``m`` and pairs ``i``."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    omega = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the feature pairs ``(x_{2i}, x_{2i+1})`` of ``x`` ``[..., T, D]`` by the angles of ``cos``/``sin`` ``[T, D/2]``."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    cos: Tensor  # buffers: the rotary tables
    sin: Tensor

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        if cfg.d % cfg.heads:
            raise ValueError(f"d ({cfg.d}) must be a multiple of heads ({cfg.heads})")
        self.heads, self.head_dim = cfg.heads, cfg.d // cfg.heads
        self.qkv = nn.Linear(cfg.d, 3 * cfg.d, bias=False)
        self.out = nn.Linear(cfg.d, cfg.d, bias=False)
        self.q_norm = nn.LayerNorm(self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, bias=False)
        cos, sin = rotary_tables(cfg.context, self.head_dim, cfg.rope_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        if T > self.cos.shape[0]:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.cos.shape[0]}")
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = self.cos[:T], self.sin[:T]
        q = apply_rotary(self.q_norm(q), cos, sin)
        k = apply_rotary(self.k_norm(k), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, d))


class Block(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.d, cfg.ff, bias=False), nn.GELU(), nn.Linear(cfg.ff, cfg.d, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """``forward(ids [B, T]) -> h [B, T, d]``; the logits are ``h @ self.embed.weight.T`` (:meth:`logits`)."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.d, bias=False)
        # NanoDO's initializers: embeddings N(0, 1/d) (variance scaling on the fan-in), so that the tied logits of
        # a unit-scale h start with standard deviation 1; Xavier-uniform kernels
        nn.init.normal_(self.embed.weight, std=1 / math.sqrt(cfg.d))
        for name, p in self.named_parameters():
            if p.dim() == 2 and not name.startswith("embed"):
                nn.init.xavier_uniform_(p)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    @property
    def output_weight(self) -> Tensor:
        """The ``[V, d]`` output projection (the tied input embedding)."""
        return self.embed.weight

    def logits(self, h: Tensor) -> Tensor:
        return h @ self.embed.weight.T
