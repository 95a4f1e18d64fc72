"""A joint subword vocabulary learned on the training data with sentencepiece (BPE)."""

from __future__ import annotations

import io
from pathlib import Path

PAD, UNK, BOS, EOS = 0, 1, 2, 3


class Tokenizer:
    """sentencepiece model with ids ``pad=0, unk=1, bos=2, eos=3``."""

    def __init__(self, model_proto: bytes):
        import sentencepiece as spm

        self.proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def train(cls, sentences, vocab_size: int, seed: int = 0) -> "Tokenizer":
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

    def encode(self, sentences) -> list:
        return self.sp.encode(list(sentences))

    def decode(self, ids) -> list:
        out = []
        for seq in ids:
            seq = [int(i) for i in seq if int(i) not in (PAD, BOS)]
            if EOS in seq:
                seq = seq[: seq.index(EOS)]
            out.append(self.sp.decode(seq))
        return out
