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


def convert(src: str | Path, dst: str | Path, *, model_class: str | None = None,
            dtype: torch.dtype | None = None) -> type[BertPreTrainedModel]:
    """Re-write any BERT checkpoint folder (Google's TF checkpoints too: `convert_tf_checkpoint`) as a
    canonical bertforge / transformers folder, with its tokenizer if it has one (`read_tokenizer`: one
    that cannot be read as BERT's is an error). Returns the class used."""
    if find_tf_checkpoint(src) is not None:
        return MODEL_CLASSES[convert_tf_checkpoint(src, dst, model_class=model_class, dtype=dtype).model_class]
    cls = MODEL_CLASSES[model_class] if model_class else infer_model_class(src)
    model = load_pretrained(cls, src, dtype=dtype)
    tokenizer = read_tokenizer(src) if Path(src).is_dir() else None  # before writing anything
    save_pretrained(model, dst, tokenizer=tokenizer)
    return cls


def read_tokenizer(folder: str | Path) -> BertTokenizer | None:
    """The tokenizer of a checkpoint folder, or None when it holds none.

    Read from ``vocab.txt`` (+ ``tokenizer_config.json``), else from ``tokenizer.json``'s WordPiece vocab
    and BertNormalizer (or ``tokenizer_config.json``) settings. One that is not BERT's WordPiece, or whose
    normalisation cannot be known, is a ValueError: a tokenizer guessed wrong would change every input.
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
