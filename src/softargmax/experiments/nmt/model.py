"""An encoder-decoder Transformer (``torch.nn.Transformer``, pre-norm) with a swappable output layer.

The output layer is one of ``softmax``, ``sparsemax``, ``entmax15``, ``alpha_relu``
(1.5-ReLU) or ``f:<divergence>`` (any f-divergence softargmax); every system is trained
with its own Fenchel–Young loss.  The output projection is a bias-free linear map
initialized Xavier-uniform and applied after the decoder's final LayerNorm, the setting
of Tezekbayev et al., "Speeding Up Entmax", Findings of NAACL 2022
(https://arxiv.org/abs/2111.06832), Lemma 3 (logit std ``sqrt(2 d / (d + V))`` at initialization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import softargmax as sa

from .tokenizer import PAD

SYSTEMS = ("softmax", "sparsemax", "entmax15", "alpha_relu")


@dataclass
class ModelConfig:
    vocab_size: int
    d_model: int = 256
    heads: int = 4
    layers: int = 3
    ff: int = 1024
    dropout: float = 0.1
    max_len: int = 256


class OutputLayer:
    """Prediction map and loss of one system (``τ`` set later for α-ReLU).

    ``label_smoothing`` ε trains against ``(1 - ε) e_y + ε / V`` (0: the one-hot target).
    """

    def __init__(self, system: str, alpha: float = 1.5, label_smoothing: float = 0.0) -> None:
        if system not in SYSTEMS and not system.startswith("f:"):
            raise ValueError(f"system must be one of {SYSTEMS} or 'f:<divergence>', got {system!r}")
        self.system = system
        self.alpha = alpha
        self.tau = 0.0
        self.label_smoothing = label_smoothing

    @property
    def mapping(self) -> str:
        if self.system.startswith("f:"):
            return self.system[2:]
        return {"softmax": "softmax", "sparsemax": "sparsemax", "entmax15": "entmax15", "alpha_relu": "alpha_relu"}[self.system]

    def loss(self, logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
        extra: dict[str, Any] = {"alpha": self.alpha, "tau": self.tau} if self.system == "alpha_relu" else {}
        if self.label_smoothing:
            extra["label_smoothing"] = self.label_smoothing
        return sa.fenchel_young_loss(logits, target, self.mapping, ignore_index=PAD, reduction=reduction, **extra)

    def probs(self, logits: Tensor) -> Tensor:
        """Next-token scores: probabilities (unnormalized for α-ReLU)."""
        if self.system == "softmax":
            return torch.softmax(logits, -1)
        if self.system == "alpha_relu":
            return sa.alpha_relu(logits, self.alpha, self.tau)
        return sa.mappings.normalize(logits, self.mapping)

    def log_probs(self, logits: Tensor) -> Tensor:
        if self.system == "softmax":
            return torch.log_softmax(logits, -1)
        return torch.log(self.probs(logits))


class PositionalEncoding(nn.Module):
    pe: Tensor  # a buffer

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.pe[: x.shape[1]]


class Seq2Seq(nn.Module):
    """Shared source/target embeddings, pre-norm Transformer, Xavier-uniform output projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, 0.0, cfg.d_model ** -0.5)
        self.pos = PositionalEncoding(cfg.d_model, cfg.max_len)
        self.drop = nn.Dropout(cfg.dropout)
        kw: dict[str, Any] = dict(d_model=cfg.d_model, nhead=cfg.heads, dim_feedforward=cfg.ff, dropout=cfg.dropout,
                  batch_first=True, norm_first=True)
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), cfg.layers, norm=nn.LayerNorm(cfg.d_model),
                                        enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), cfg.layers, norm=nn.LayerNorm(cfg.d_model))
        self.transformer = nn.Transformer(d_model=cfg.d_model, nhead=cfg.heads, custom_encoder=encoder,
                                          custom_decoder=decoder, batch_first=True)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.xavier_uniform_(self.out.weight)

    def _emb(self, ids: Tensor) -> Tensor:
        return self.drop(self.pos(self.embed(ids) * math.sqrt(self.cfg.d_model)))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        mask = src == PAD
        return self.transformer.encoder(self._emb(src), src_key_padding_mask=mask), mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        T = tgt_in.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt_in.device), diagonal=1)
        h = self.transformer.decoder(
            self._emb(tgt_in), memory, tgt_mask=causal, tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src_mask, tgt_is_causal=True,
        )
        return self.out(h)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask)
