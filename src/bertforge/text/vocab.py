"""Learn a WordPiece vocabulary from raw text, laid out like Google's BERT ``vocab.txt``.

The learned pieces come from ``tokenizers``' ``WordPieceTrainer`` run on exactly the words
:class:`~bertforge.text.tokenizer.BertTokenizer` produces (same normaliser and pre-tokenizer), so every
word the trainer saw can be segmented by the result. The file starts with the layout of the released
uncased vocabulary::

    id 0               [PAD]
    ids 1..num_unused  [unused0] .. [unused{num_unused-1}]   (free slots for task-specific tokens)
    then               [UNK] [CLS] [SEP] [MASK]
    then               the learned pieces: characters, "##" characters, longer pieces, "##" ones last,
                       each group sorted (the same text gives the same vocab.txt on every run)

so with ``num_unused=99``: [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
"""

from __future__ import annotations

import collections
import os
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, models, trainers

from bertforge.io import open_binary
from bertforge.settings import HugeNumber
from bertforge.text.tokenizer import CJK_RANGES, BertTokenizer, bert_normalizer, bert_pre_tokenizer

__all__ = ["learn_vocab", "iter_text_lines", "MAX_VOCAB_SIZE"]

MAX_VOCAB_SIZE = 2 ** 32
"""The largest vocab: prepared shards store token ids as uint32."""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _canonical(piece: str) -> tuple[bool, bool, str]:
    """Sort key of a learned piece: characters, then "##" characters, then longer pieces ("##" ones last)."""
    return len(piece.removeprefix("##")) > 1, piece.startswith("##"), piece


def _own_word(ch: str) -> bool:
    """A character the pre-tokenizer always makes a word of its own (punctuation, CJK ideograph):
    it never continues a word, so it needs no ``##`` piece."""
    cp = ord(ch)
    if 33 <= cp <= 126 and not ch.isalnum():
        return True
    return unicodedata.category(ch).startswith("P") or any(a <= cp <= b for a, b in CJK_RANGES)


def _alphabet(text: Callable[[], Iterable[str]], do_lower_case: bool, limit: int) -> list[str]:
    """The characters the vocabulary keeps: the ``limit`` most frequent of the normalised text, ties
    broken by code point, so the choice does not depend on the trainer's hash-map order."""
    normalizer = bert_normalizer(do_lower_case=do_lower_case)
    counts: collections.Counter[str] = collections.Counter()
    for line in text():
        counts.update(normalizer.normalize_str(line))
    chars = [c for c in counts if not c.isspace()]
    return sorted(sorted(chars, key=lambda c: (-counts[c], c))[:limit])


def iter_text_lines(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield the non-blank lines of a UTF-8 text file (``.gz``/``.bz2``/``.xz`` decompressed); invalid
    UTF-8 is a ``ValueError`` naming the file, the line and the byte offset in the (decompressed) text."""
    path = Path(path)
    offset = 0
    with open_binary(path) as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}, line {lineno}: invalid UTF-8 at byte offset {offset + e.start} "
                    f"({raw[e.start:e.start + 4]!r}); the text must be UTF-8"
                ) from None
            offset += len(raw)
            line = line.rstrip("\r\n")
            if line.strip():
                yield line


def learn_vocab(files: Iterable[str | os.PathLike[str]] | Iterable[str], out_dir: str | os.PathLike[str], *,
                vocab_size: int = 30522, do_lower_case: bool = True, min_frequency: int = 2, limit_alphabet: int = 1000,
                num_unused: int = 99, show_progress: bool = True) -> BertTokenizer:
    """Learn a WordPiece vocabulary, save the tokenizer to ``out_dir`` and return it.

    Args:
        files: text to learn from. A list or tuple (or a single path) names files, read line by
            line, ``.gz``/``.bz2``/``.xz`` transparently; any other iterable yields the text itself
            and is held in memory (the text is read twice: for the alphabet, then to train).
        out_dir: where :meth:`BertTokenizer.save_pretrained` writes ``vocab.txt`` and the rest.
        vocab_size: upper bound on the size of the whole vocabulary, special and ``[unused]``
            tokens included (a small corpus can give fewer pieces).
        do_lower_case: learn an uncased vocabulary (lower-case, strip accents).
        min_frequency: a merge must occur at least this often.
        limit_alphabet: keep at most this many distinct characters; rarer ones become [UNK].
        num_unused: number of ``[unusedN]`` slots after [PAD].

    Example::

        tok = learn_vocab(["corpus.txt.gz"], "my_vocab", vocab_size=8000)
        tok.tokenize("unaffable")
    """
    n_reserved = len(SPECIAL_TOKENS) + num_unused
    if num_unused < 0:
        raise ValueError(f"num_unused must be >= 0, got {num_unused}")
    if vocab_size <= n_reserved:
        raise ValueError(f"vocab_size={vocab_size} leaves no room beside {n_reserved} special and unused tokens")
    if vocab_size > MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at most {MAX_VOCAB_SIZE:,} (token ids are stored as uint32), got "
                         f"{HugeNumber.shown(vocab_size)!r}")
    text = _rereadable(files)
    # The trainer's size counts the special tokens it is given; the [unused] slots come on top.
    pieces = _learn_pieces(text, vocab_size - num_unused, do_lower_case=do_lower_case, min_frequency=min_frequency,
                           limit_alphabet=limit_alphabet, show_progress=show_progress)
    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(num_unused)), "[UNK]", "[CLS]", "[SEP]", "[MASK]", *pieces]
    tokenizer = BertTokenizer(tokens, do_lower_case=do_lower_case)
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def _rereadable(files: Iterable[str | os.PathLike[str]] | Iterable[str]) -> Callable[[], Iterable[str]]:
    """A function giving the text afresh at each call (the alphabet, then the trainer read it): files
    (a path, or a list or tuple of paths, each checked to exist) are re-read, other iterables held."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    if isinstance(files, (list, tuple)):
        paths = [Path(p) for p in files]
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such text file")

        def text() -> Iterable[str]:
            return (line for p in paths for line in iter_text_lines(p))
    else:
        held = list(files)  # type: ignore[arg-type]

        def text() -> Iterable[str]:
            return iter(held)
    return text


def _learn_pieces(text: Callable[[], Iterable[str]], trainer_size: int, *, do_lower_case: bool, min_frequency: int,
                  limit_alphabet: int, show_progress: bool) -> list[str]:
    """WordPiece pieces learned from ``text`` (``trainer_size``: their number with the special tokens),
    the same on every run for the same text, in the canonical order."""
    # tokenizers' trainer alone is not deterministic (tokenizers #1794): it numbers the "##" characters,
    # breaks ties between equally frequent merges by those numbers, and cuts the alphabet among equal
    # counts, all in hash-map order. So the alphabet is chosen here (frequency, then code point) and every
    # "##" character is given to the trainer up front, in code point order: the same ties on every run.
    alphabet = _alphabet(text, do_lower_case, limit_alphabet)
    continuations = [f"##{c}" for c in alphabet if not _own_word(c)]

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    backend.normalizer = bert_normalizer(do_lower_case=do_lower_case)
    backend.pre_tokenizer = bert_pre_tokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=trainer_size, min_frequency=min_frequency,
                                        limit_alphabet=len(alphabet), initial_alphabet=alphabet,
                                        special_tokens=[*SPECIAL_TOKENS, *continuations],
                                        continuing_subword_prefix="##", show_progress=show_progress)
    backend.train_from_iterator(text(), trainer=trainer)
    # WordPiece's greedy longest match depends on the set only, so the order is the canonical one.
    return sorted((t for t in backend.get_vocab() if t not in SPECIAL_TOKENS), key=_canonical)
