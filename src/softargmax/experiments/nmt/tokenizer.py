"""A joint subword vocabulary learned on the training data with sentencepiece (BPE)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Iterable, Sequence

PAD, UNK, BOS, EOS = 0, 1, 2, 3


class Tokenizer:
    """sentencepiece model with ids ``pad=0, unk=1, bos=2, eos=3``."""

    def __init__(self, model_proto: bytes) -> None:
        import sentencepiece as spm

        self.proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def train(cls, sentences: Iterable[str], vocab_size: int, seed: int = 0) -> "Tokenizer":
        """Learn a BPE model (BPE training is deterministic; ``seed`` is kept for the interface)."""
        import sentencepiece as spm

        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buf,
            vocab_size=vocab_size,
            model_type="bpe",
            character_coverage=1.0,
            pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
            hard_vocab_limit=False,
            num_threads=2,
            minloglevel=2,
        )
        return cls(buf.getvalue())

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        return cls(Path(path).read_bytes())

    def save(self, path: Path) -> None:
        """Write the model to ``path`` atomically (a killed run never leaves half a tokenizer)."""
        from .._files import atomic_write

        atomic_write(path, self.proto)

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def digest(self) -> str:
        """The first 16 hex digits of the SHA-256 of the pieces and their scores, in id order.

        Two tokenizers with the same digest split every sentence alike, whatever the
        sentencepiece version that wrote their model files (whose bytes may differ).
        """
        table = [[self.sp.id_to_piece(i), self.sp.get_score(i)] for i in range(len(self))]
        return hashlib.sha256(json.dumps(table, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]

    def encode(self, sentences: Iterable[str]) -> list[list[int]]:
        return self.sp.encode(list(sentences))

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        out = []
        for seq in ids:
            kept = [int(i) for i in seq if int(i) not in (PAD, BOS)]
            if EOS in kept:
                kept = kept[: kept.index(EOS)]
            out.append(self.sp.decode(kept))
        return out
