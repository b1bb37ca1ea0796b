"""Inputs for the pre-training data tests: a small hand-written WordPiece vocab (Google's layout,
with multi-piece words so whole-word masking has something to do), generated corpora written in the
real input formats (optionally compressed), and helpers to read prepared shards back.

Imported by tests/test_data_*.py (``from data_fixtures import ...``); each test module defines its
own fixtures from these helpers. Nothing here is a test.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import random
from pathlib import Path

import numpy as np

from bertforge.data.instances import SpecialIds, TrainingInstance
from bertforge.data.shards import read_shard
from bertforge.text.tokenizer import BertTokenizer

# ------------------------------------------------------------------------------ the vocabulary
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
NUM_UNUSED = 99

PLAIN_WORDS = ["the", "a", "an", "of", "to", "in", "on", "at", "by", "for", "with", "from", "and", "or", "but", "not", "no", "yes", "is", "are", "was", "were", "be", "been", "has", "have", "had", "do", "does", "did", "will", "would", "can", "could", "may", "might", "must", "shall", "this", "that", "these", "those", "it", "its", "he", "she", "they", "we", "you", "i", "me", "him", "her", "them", "my", "your", "our", "their", "who", "what", "when", "where", "why", "how", "all", "any", "some", "many", "much", "more", "most", "few", "other", "such", "only", "own", "same", "so", "than", "too", "very", "just", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "grey", "blue", "green", "small", "large", "old", "new", "good", "bad", "long", "short", "high", "low", "early", "late", "young", "big", "little", "house", "river", "tree", "stone", "cloud", "city", "road", "field", "book", "door", "window", "table", "garden", "mountain"]
ROOTS = ["walk", "talk", "jump", "play", "read", "build", "sing", "paint", "climb", "dream", "teach", "fish"]
SUFFIXES = ["##ing", "##ed", "##er", "##ly", "##ness", "##s"]
PREFIXES = ["un", "re"]
PUNCT = [".", ",", "!", "?", "[", "]"]
EXTRA = ["mask", "sep", "cls", "unk", "pad"]  # so a literal "[MASK]" in text tokenizes to [ mask ]


def vocab_tokens() -> list[str]:
    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(NUM_UNUSED)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += PUNCT + PLAIN_WORDS + EXTRA + PREFIXES + ROOTS + SUFFIXES + [f"##{r}" for r in ROOTS]
    assert len(set(tokens)) == len(tokens), "duplicate vocab entry"
    return tokens


TOKENS = vocab_tokens()
VOCAB_SIZE = len(TOKENS)
IS_CONTINUATION = np.array([t.startswith("##") for t in TOKENS])
SPECIAL = SpecialIds(cls=CLS, sep=SEP, mask=MASK, vocab_size=VOCAB_SIZE, continuation=IS_CONTINUATION)
assert TOKENS[UNK] == "[UNK]" and TOKENS[CLS] == "[CLS]" and TOKENS[SEP] == "[SEP]" and TOKENS[MASK] == "[MASK]"


def write_tokenizer(folder: Path) -> Path:
    BertTokenizer(TOKENS).save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------ generated text
def _word(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.70:
        return rng.choice(PLAIN_WORDS)
    root = rng.choice(ROOTS)
    if r < 0.85:
        return root + rng.choice(SUFFIXES)[2:]  # 2 pieces: walk ##ing
    if r < 0.95:
        return rng.choice(PREFIXES) + root + rng.choice(SUFFIXES)[2:]  # 3 pieces: re ##walk ##ing
    return rng.choice(PREFIXES) + root  # 2 pieces: un ##walk


def sentence(rng: random.Random, min_words: int = 5, max_words: int = 12) -> str:
    words = [_word(rng) for _ in range(rng.randint(min_words, max_words))]
    for k in range(1, len(words) - 1):
        if rng.random() < 0.08:
            words[k] += ","
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "!", "?"])


def documents(seed: int, n_docs: int, min_sents: int, max_sents: int) -> list[list[str]]:
    """``n_docs`` documents of random sentences (a list of sentence strings each)."""
    rng = random.Random(seed)
    return [[sentence(rng) for _ in range(rng.randint(min_sents, max_sents))] for _ in range(n_docs)]


def _open_write(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix
    if suffix == ".gz":
        return gzip.open(path, "wb")
    if suffix == ".bz2":
        return bz2.open(path, "wb")
    if suffix == ".xz":
        return lzma.open(path, "wb")
    return open(path, "wb")


def write_bytes(path: Path, data: bytes) -> Path:
    with _open_write(path) as f:
        f.write(data)
    return path


def write_google(path: Path, docs: list[list[str]]) -> Path:
    """Google's format: one sentence per line, a blank line between documents."""
    return write_bytes(path, ("\n\n".join("\n".join(d) for d in docs) + "\n").encode("utf-8"))


def write_text(path: Path, docs: list[list[str]]) -> Path:
    """Plain prose: a document is a paragraph (one line), paragraphs separated by blank lines."""
    return write_bytes(path, ("\n\n".join(" ".join(d) for d in docs) + "\n").encode("utf-8"))


def write_jsonl(path: Path, docs: list[list[str]]) -> Path:
    lines = [json.dumps({"id": i, "text": " ".join(d)}) for i, d in enumerate(docs)]
    return write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def write_wiki_json(path: Path, docs: list[list[str]]) -> Path:
    """The Wikipedia-leads file: one JSON object title -> {"extract": text, ...}."""
    data = {f"Article {i}": {"pageid": 1000 + i, "extract": " ".join(d)} for i, d in enumerate(docs)}
    return write_bytes(path, json.dumps(data, indent=1).encode("utf-8"))


def tokenize_docs(tok: BertTokenizer, docs: list[list[str]]) -> list[list[list[int]]]:
    """Token ids per sentence per document, empty sentences / documents dropped (as prepare does)."""
    out = []
    for d in docs:
        ids = [s for s in tok.encode_batch_ids(d) if s]
        if ids:
            out.append(ids)
    return out


# ------------------------------------------------------------------------------ reading results back
def original_ids(inst: TrainingInstance) -> np.ndarray:
    """The instance's tokens before masking (labels put back at the masked positions)."""
    ids = np.array(inst.input_ids, dtype=np.int64, copy=True)
    ids[np.asarray(inst.masked_positions, dtype=np.int64)] = inst.masked_labels
    return ids


def read_instances(folder: Path) -> list[TrainingInstance]:
    manifest = json.loads((Path(folder) / "manifest.json").read_text())
    out = []
    for entry in manifest["shards"]:
        shard = read_shard(Path(folder) / entry["file"], vocab_hash=manifest["vocab_hash"], sha256=entry["sha256"])
        out.extend(shard.instance(i) for i in range(len(shard)))
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def shard_hashes(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(Path(folder).glob("shard-*.safetensors"))}


def google_words(ids, cls: int = CLS, sep: int = SEP, is_cont=IS_CONTINUATION) -> list[list[int]]:
    """Google's whole-word candidate groups (``create_masked_lm_predictions``): a ``##`` piece joins
    the previous candidate word, even when a [SEP] lies between them."""
    words: list[list[int]] = []
    for i, t in enumerate(ids):
        if t in (cls, sep):
            continue
        if words and is_cont[t]:
            words[-1].append(i)
        else:
            words.append([i])
    return words


def check_layout(inst: TrainingInstance, max_seq_length: int, nsp: bool = True) -> None:
    """[CLS] A [SEP] B [SEP] (or [CLS] A [SEP]), no [CLS]/[SEP] inside A or B, none empty."""
    ids = original_ids(inst)
    L = len(ids)
    assert 3 <= L <= max_seq_length
    assert ids[0] == CLS and ids[-1] == SEP and ids[inst.num_a - 1] == SEP
    if nsp:
        assert 3 <= inst.num_a <= L - 2, (inst.num_a, L)  # A and B non-empty
        inner = np.concatenate([ids[1:inst.num_a - 1], ids[inst.num_a:-1]])
    else:
        assert inst.num_a == L and not inst.is_random_next
        inner = ids[1:-1]
    assert not np.isin(inner, [CLS, SEP]).any()


def expected_mask_count(length: int, max_predictions: int, prob: float = 0.15) -> int:
    return min(max_predictions, max(1, round(length * prob)))


def check_tokenizer(tok: BertTokenizer) -> BertTokenizer:
    """The vocab gives the multi-piece words the tests rely on."""
    assert tok.tokenize("Walking rewalking unwalk") == ["walk", "##ing", "re", "##walk", "##ing", "un", "##walk"]
    assert tok.vocab_size == VOCAB_SIZE
    return tok
