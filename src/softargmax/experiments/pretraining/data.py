"""Penn Treebank at the word level (Mikolov's preprocessing): the vocabulary, token streams and batches.

Each line of ``ptb.{train,valid,test}.txt.gz`` is a sentence; its words are followed by
``<eos>``, and the sentences are concatenated into one stream per split, as in the usual
word-level language-model setup (10,000 types including ``<unk>`` and ``<eos>``).  Every
token keeps the index of its sentence, so that evaluations can be resampled by sentence.

With a subword vocabulary (:func:`subword_streams`) a BPE model (sentencepiece) is learned on
the training split's sentences alone, and every split is encoded with it, each sentence
followed by the tokenizer's end-of-sentence id; the streams keep the sentence index of every
token in the same way.

Training batches are ``batch`` windows of ``context + 1`` tokens at random offsets; the
offsets of step ``s`` come from a generator seeded with ``(seed, s)`` alone, so a run resumed
at step ``s`` sees exactly the batches an uninterrupted run would, with no generator state to
save.  Evaluation covers every token of a split once, in consecutive windows of ``context``
tokens (each window's first prediction has no context).

:func:`load_data` finds the corpus (:func:`.datasets.find`) and reads it as a preset of
``softargmax reproduce lm`` asks, with the :class:`Vocabulary` that turns token ids back into text.
"""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from .. import datasets

if TYPE_CHECKING:
    from .._common import Log
    from ..nmt.tokenizer import Tokenizer

EOS = "<eos>"
SPLITS = {"train": "ptb.train.txt.gz", "valid": "ptb.valid.txt.gz", "test": "ptb.test.txt.gz"}


@dataclass
class Stream:
    """One split as a token stream: ``ids [N]`` and ``sentence [N]``, the sentence index of every token."""

    ids: Tensor
    sentence: Tensor

    def head(self, tokens: Optional[int]) -> "Stream":
        """The first ``tokens`` tokens (all of them for ``None``)."""
        if tokens is None:
            return self
        return Stream(self.ids[:tokens], self.sentence[:tokens])


def read_lines(folder: Path, split: str) -> list[list[str]]:
    with gzip.open(Path(folder) / SPLITS[split], "rt", encoding="utf-8") as f:
        return [line.split() for line in f]


def build_vocabulary(lines: list[list[str]]) -> list[str]:
    """The word types of ``lines`` and ``<eos>``, most frequent first (ties by spelling): index → word."""
    counts = Counter(w for line in lines for w in line)
    counts[EOS] = len(lines)
    return sorted(counts, key=lambda w: (-counts[w], w))


def encode(lines: list[list[str]], index: dict) -> Stream:
    """The stream of ``lines`` (each followed by ``<eos>``); ``KeyError`` names a word outside the vocabulary."""
    ids: list[int] = []
    sentence: list[int] = []
    eos = index[EOS]
    for j, line in enumerate(lines):
        try:
            ids.extend(index[w] for w in line)
        except KeyError as e:
            raise KeyError(f"sentence {j}: word {e.args[0]!r} is not in the vocabulary") from None
        ids.append(eos)
        sentence.extend([j] * (len(line) + 1))
    return Stream(torch.tensor(ids, dtype=torch.long), torch.tensor(sentence, dtype=torch.long))


def subword_streams(lines: dict[str, list[list[str]]], vocab_size: int) -> tuple["Tokenizer", dict[str, Stream]]:
    """A BPE tokenizer of ``vocab_size`` pieces learned on ``lines["train"]`` and the stream of every split.

    Args:
        lines: ``{split: sentences as lists of words}`` (:func:`read_lines`).
        vocab_size: the number of pieces (PAD, UNK, BOS and EOS included).

    Returns:
        ``(tokenizer, {split: Stream})``: each sentence's pieces, then the EOS id. BPE training
        is deterministic: the same lines give the same tokenizer (its ``digest()``).
    """
    from ..nmt.tokenizer import EOS as SUB_EOS
    from ..nmt.tokenizer import Tokenizer

    tok = Tokenizer.train((" ".join(line) for line in lines["train"]), vocab_size)
    streams = {}
    for split, sentences in lines.items():
        ids: list[int] = []
        sentence: list[int] = []
        for j, pieces in enumerate(tok.encode(" ".join(line) for line in sentences)):
            ids.extend(pieces)
            ids.append(SUB_EOS)
            sentence.extend([j] * (len(pieces) + 1))
        streams[split] = Stream(torch.tensor(ids, dtype=torch.long), torch.tensor(sentence, dtype=torch.long))
    return tok, streams


def train_batch(ids: Tensor, context: int, batch: int, seed: int, step: int) -> tuple[Tensor, Tensor]:
    """``(inputs, targets)``, each ``[batch, context]``: windows at offsets drawn from a generator seeded by ``(seed, step)``."""
    if len(ids) < context + 2:
        raise ValueError(f"ids: {len(ids)} tokens, fewer than a window of context + 1 = {context + 1}")
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(step))
    start = torch.randint(0, len(ids) - context - 1, (batch,), generator=gen)
    window = ids[start[:, None] + torch.arange(context + 1)]
    return window[:, :-1], window[:, 1:]


def eval_windows(stream: Stream, context: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Consecutive windows ``(inputs [n, T], targets [n, T], target sentences [n, T])`` that predict every token but the
    first exactly once: full windows of ``context`` tokens, then one shorter window for the remainder."""
    ids, sent = stream.ids, stream.sentence
    n_targets = len(ids) - 1
    full = n_targets // context
    out = []
    if full:
        out.append((ids[: full * context].view(full, context), ids[1: full * context + 1].view(full, context),
                    sent[1: full * context + 1].view(full, context)))
    rest = n_targets - full * context
    if rest:
        s = full * context
        out.append((ids[s: s + rest].view(1, rest), ids[s + 1: s + rest + 1].view(1, rest),
                    sent[s + 1: s + rest + 1].view(1, rest)))
    return out


class Vocabulary:
    """Token ids to text: the words of a word-level vocabulary, or the pieces of a BPE tokenizer."""

    def __init__(self, words: Optional[list] = None, tokenizer: Any = None) -> None:
        self.words, self.tokenizer = words, tokenizer

    def __len__(self) -> int:
        return len(self.words) if self.words is not None else len(self.tokenizer)

    def text(self, ids: torch.Tensor) -> str:
        if self.words is not None:
            return " ".join(self.words[i] for i in ids.tolist())
        sp = self.tokenizer.sp
        return "".join(sp.id_to_piece(i) for i in ids.tolist()).replace("\u2581", " ").strip()


def load_data(P: dict, data_dir: Optional[str], download: bool, log: Log) -> tuple[Path, Vocabulary, dict, Optional[str]]:
    """``(folder, vocabulary, {split: Stream}, tokenizer digest or None)`` of Penn Treebank as the preset ``P`` reads it:
    word-level (``vocab`` None) or with a BPE tokenizer of ``P["vocab"]`` pieces learned on the training split."""
    folder = datasets.find("ptb", data_dir, download_missing=download, log=log)
    lines = {s: read_lines(folder, s) for s in SPLITS}
    if P.get("vocab") is None:
        words = build_vocabulary(lines["train"])
        index = {w: i for i, w in enumerate(words)}
        return folder, Vocabulary(words=words), {s: encode(lines[s], index) for s in SPLITS}, None
    tok, streams = subword_streams(lines, P["vocab"])
    return folder, Vocabulary(tokenizer=tok), streams, tok.digest()
