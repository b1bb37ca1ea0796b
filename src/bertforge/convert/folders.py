"""Re-writing checkpoint folders: any BERT folder (bertforge, transformers, Google's TF release) as a
canonical bertforge / transformers folder, and reading the tokenizer a folder holds."""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge.convert.tf import convert_tf_checkpoint, find_tf_checkpoint
from bertforge.io import read_json_object
from bertforge.model.bert import BertPreTrainedModel
from bertforge.model.checkpoint import load_pretrained, save_pretrained
from bertforge.model.heads import MODEL_CLASSES, infer_model_class
from bertforge.text.tokenizer import BertTokenizer

__all__ = ["convert", "read_tokenizer", "describe_tokenizer"]

VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"

# Keys of tokenizer_config.json that give the normalisation a tokenizer.json without BERT's
# normalizer leaves unknown.
_NORMALIZATION_KEYS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars")


def convert(src: str | Path, dst: str | Path, *, model_class: str | None = None,
            dtype: torch.dtype | None = None) -> type[BertPreTrainedModel]:
    """Re-write any BERT checkpoint folder as a canonical bertforge / transformers folder.

    The tokenizer is carried over when present: ``vocab.txt`` and its settings, or the WordPiece
    vocab and normaliser settings of ``tokenizer.json`` (what transformers 5 saves); one that
    cannot be read as BERT's is an error (`read_tokenizer`). Returns the class used.
    Google's TensorFlow checkpoints (a folder with ``bert_model.ckpt.index``, or a checkpoint path
    prefix) are read without TensorFlow by `convert_tf_checkpoint`.
    """
    if find_tf_checkpoint(src) is not None:
        return MODEL_CLASSES[convert_tf_checkpoint(src, dst, model_class=model_class, dtype=dtype).model_class]
    cls = MODEL_CLASSES[model_class] if model_class else infer_model_class(src)
    model = load_pretrained(cls, src, dtype=dtype)
    tokenizer = read_tokenizer(src) if Path(src).is_dir() else None  # before writing anything
    save_pretrained(model, dst, tokenizer=tokenizer)
    return cls


def read_tokenizer(folder: str | Path) -> BertTokenizer | None:
    """The tokenizer of a checkpoint folder, or None when it holds none.

    Read from ``vocab.txt`` (+ ``tokenizer_config.json``) or, when there is no ``vocab.txt``, from
    ``tokenizer.json``: its WordPiece vocab, and the lower-casing, accent and Chinese-character
    settings of its BertNormalizer (or of ``tokenizer_config.json``). A ``tokenizer.json`` that is
    not BERT's WordPiece, or whose normalisation cannot be known, raises a ValueError naming the
    file and field: a tokenizer guessed wrong would silently change every input.
    """
    folder = Path(folder)
    if (folder / VOCAB_FILE).is_file():
        return BertTokenizer.from_pretrained(folder)
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        return None
    data = read_json_object(path)
    model = data.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "WordPiece":
        raise ValueError(f"{path}: model.type is {kind!r}; bertforge reads BERT's WordPiece tokenizers "
                         "(model.type 'WordPiece' with its vocab)")
    if not isinstance(model.get("vocab"), dict) or not model["vocab"]:
        raise ValueError(f"{path}: model.vocab must map the WordPiece tokens to their ids")
    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise ValueError(f"{path}: model.continuing_subword_prefix is {prefix!r}; BERT's WordPiece uses '##'")
    normalizer = data.get("normalizer")
    norm_kind = normalizer.get("type") if isinstance(normalizer, dict) else None
    config = read_json_object(folder / CONFIG_FILE) if (folder / CONFIG_FILE).is_file() else {}
    if norm_kind != "BertNormalizer" and "do_lower_case" not in config:
        raise ValueError(f"{path}: normalizer is {norm_kind!r}, not 'BertNormalizer', and there is no "
                         f"{CONFIG_FILE} with do_lower_case: the lower-casing and accent settings cannot be read")
    return BertTokenizer.from_pretrained(folder)


def describe_tokenizer(folder: str | Path) -> str:
    """One line on the tokenizer of a checkpoint folder: its file, size and normalisation, that
    there is none, or why it cannot be used."""
    folder = Path(folder)
    try:
        tok = read_tokenizer(folder)
    except (ValueError, OSError) as e:
        return f"not usable ({e})"
    if tok is None:
        return "none in this folder"
    source = VOCAB_FILE if (folder / VOCAB_FILE).is_file() else TOKENIZER_FILE
    accents = tok.strip_accents if tok.strip_accents is not None else tok.do_lower_case
    return (f"{source}, {tok.vocab_size:,} entries, {'lower-cased' if tok.do_lower_case else 'cased'}, "
            f"accents {'stripped' if accents else 'kept'}"
            f"{'' if tok.tokenize_chinese_chars else ', Chinese characters not split'}")
