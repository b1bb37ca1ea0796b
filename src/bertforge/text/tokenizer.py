"""BERT's WordPiece tokenizer with the semantics of Google's release, run by the `tokenizers` library.

Three layers, as in Google's ``tokenization.py``: basic tokenization (``basic_tokenize``: clean-up,
lower-casing and accent stripping, CJK and punctuation split off), greedy longest-match-first WordPiece
(``tokenize``), and model inputs (``__call__``: ``[CLS] A [SEP] B [SEP]``, truncation, padding, tensors).

The basic tokenization is not ``tokenizers``' ``BertNormalizer``/``BertPreTokenizer``, which differ from
Google's code on rare characters (private use, the final sigma ``ς``, newer Unicode): it is built from
``tokenizers`` primitives driven by character classes from this Python's ``unicodedata``, as Google's
code consults it. On ordinary text both give the same tokens.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bertforge.io import atomic_write_texts
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

__all__ = ["BatchEncoding", "BertTokenizer", "VocabError", "bert_normalizer", "bert_pre_tokenizer", "read_vocab_file"]

VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
TOKENIZER_FILE = "tokenizer.json"

# transformers writes int(1e30) as model_max_length to mean "no limit"; BERT's position table has 512.
_DEFAULT_MODEL_MAX_LENGTH = 512
_UNSET_MAX_LENGTH = 10**12
# Settings saved to (and read from) tokenizer_config.json, and the special tokens' names.
_SETTINGS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "max_input_chars_per_word",
             "model_max_length", "split_special_tokens")
_SPECIAL_NAMES = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

TruncationArg = bool | Literal["longest_first", "only_first", "only_second", "do_not_truncate"] | None
PaddingArg = bool | Literal["longest", "max_length", "do_not_pad"] | None


class VocabError(ValueError):
    """A vocabulary that cannot be used; the message names the file (or list) and the line."""


# ------------------------------------------------------------------------------ character classes
# The "CJK Unified Ideographs" blocks Google's _is_chinese_char checks (Hangul, kana are not in it).
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


@dataclass(frozen=True)
class _UnicodeTables:
    drop: str  # NUL, U+FFFD, Cc and Cf except \t \n \r: removed
    space: str  # \t \n \r and Zs other than " ": become " "
    marks: str  # Mn: removed when stripping accents
    punct: str  # ASCII non-alphanumerics and P*: each its own word
    cjk: str  # CJK ideographs: each its own word
    final_sigma: str  # a capital sigma that str.lower() turns into the final form
    nfd_fixes: tuple[tuple[str, str], ...]  # characters whose NFD the Rust tables get wrong


def _regex_class(codepoints: Iterable[int]) -> str:
    """Codepoints (sorted) -> an Oniguruma character class of ``\\x{..}`` ranges."""
    parts: list[str] = []
    start = prev = -2
    for cp in codepoints:
        if cp != prev + 1:
            if prev >= 0:
                parts.append(_range(start, prev))
            start = cp
        prev = cp
    if prev >= 0:
        parts.append(_range(start, prev))
    # An empty class is invalid; U+10FFFF (a noncharacter) is never in any of ours.
    return "[" + ("".join(parts) or "\\x{10FFFF}") + "]"


def _range(a: int, b: int) -> str:
    return f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}"


@functools.cache
def _unicode_tables() -> _UnicodeTables:
    """Build the character classes once per process (a few tenths of a second)."""
    cats = list(map(unicodedata.category, map(chr, range(sys.maxunicode + 1))))
    drop, space, marks, punct, cased, ignorable, decomposable = [], [], [], [], [], [], []
    for cp, cat in enumerate(cats):
        if cat == "Cn" or cat == "Co" or cat == "Cs":
            continue  # kept as ordinary characters (Google only drops Cc and Cf)
        ch = chr(cp)
        if unicodedata.decomposition(ch)[:1] not in ("", "<"):
            decomposable.append(ch)
        if cat == "Cc" or cat == "Cf":
            if ch not in "\t\n\r":
                drop.append(cp)
                continue
        if cat == "Zs" or ch in "\t\n\r":
            if cp != 0x20:  # " " is already what the others become
                space.append(cp)
            continue
        if cat == "Mn":
            marks.append(cp)
        if cat[0] == "P" or (cp < 128 and not ch.isalnum() and 33 <= cp <= 126):
            punct.append(cp)
        # Unicode's Final_Sigma rule needs "cased" and "case-ignorable", which Python does not
        # expose: read them off str.lower().
        if (ch + "\u03a3").lower()[-1] == "\u03c2":
            cased.append(cp)  # cased and not case-ignorable
        elif ("\u0391" + ch + "\u03a3").lower()[-1] == "\u03c2":
            ignorable.append(cp)
    drop = sorted(drop + [0, 0xFFFD])
    c_cls, i_cls = _regex_class(cased), _regex_class(ignorable)
    # `\K` keeps the context out of the match (a look-behind with `*` is quadratic in Oniguruma).
    final_sigma = f"{c_cls}{i_cls}*\\K\u03a3(?!{i_cls}*{c_cls})"
    # Canonical decompositions newer than the Rust crate's tables: patched with literal replacements.
    ours = normalizers.NFD().normalize_str("\n".join(decomposable)).split("\n")
    fixes = tuple((ch, unicodedata.normalize("NFD", ch)) for ch, got in zip(decomposable, ours)
                  if got != unicodedata.normalize("NFD", ch))
    cjk = "[" + "".join(_range(a, b) for a, b in CJK_RANGES) + "]"
    return _UnicodeTables(drop=_regex_class(drop), space=_regex_class(sorted(space)), marks=_regex_class(marks),
                          punct=_regex_class(punct), cjk=cjk, final_sigma=final_sigma, nfd_fixes=fixes)


def bert_normalizer(*, do_lower_case: bool = True, strip_accents: bool | None = None) -> normalizers.Normalizer:
    """The text clean-up, lower-casing and accent stripping of Google's ``BasicTokenizer``;
    ``strip_accents=None`` follows ``do_lower_case``. CJK and punctuation: :func:`bert_pre_tokenizer`."""
    t = _unicode_tables()
    steps: list[normalizers.Normalizer] = [
        normalizers.Replace(Regex(t.drop), ""),
        normalizers.Replace(Regex(t.space), " "),
    ]
    if do_lower_case:
        steps += [normalizers.Replace(Regex(t.final_sigma), "\u03c2"), normalizers.Lowercase()]
    if strip_accents if strip_accents is not None else do_lower_case:
        steps.append(normalizers.NFD())
        steps += [normalizers.Replace(a, b) for a, b in t.nfd_fixes]
        steps.append(normalizers.Replace(Regex(t.marks), ""))
    return normalizers.Sequence(steps)


def bert_pre_tokenizer(*, tokenize_chinese_chars: bool = True) -> pre_tokenizers.PreTokenizer:
    """Whitespace split, then every punctuation character (and CJK ideograph) as its own word."""
    t = _unicode_tables()
    cls = t.punct[:-1] + t.cjk[1:] if tokenize_chinese_chars else t.punct
    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(cls), behavior="isolated"),
    ])


# ------------------------------------------------------------------------------ vocabulary files
def read_vocab_file(path: str | os.PathLike[str]) -> list[str]:
    """Read ``vocab.txt`` (line i = id i-1; CRLF and a BOM are fine); a :class:`VocabError` names the
    line of invalid UTF-8, an empty line or a duplicate token."""
    path = Path(path)
    lines = path.read_bytes().removeprefix(b"\xef\xbb\xbf").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    tokens = []
    for lineno, raw in enumerate(lines, 1):
        raw = raw.removesuffix(b"\r")
        try:
            tokens.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise VocabError(f"{path}, line {lineno}: invalid UTF-8 at byte {e.start} of the line "
                             f"({raw[e.start:e.start + 4]!r}); a vocabulary must be UTF-8 text") from None
    _check_tokens(tokens, str(path), "line")
    return tokens


def _check_tokens(tokens: Sequence[str], source: str, unit: str) -> None:
    if not tokens:
        raise VocabError(f"{source}: the vocabulary is empty")
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens, 1):
        if not isinstance(tok, str):
            raise VocabError(f"{source}, {unit} {i}: token {tok!r} is not a string")
        if tok == "":
            raise VocabError(f"{source}, {unit} {i}: empty token (every {unit} must hold one token)")
        if tok in seen:
            raise VocabError(f"{source}, {unit} {i}: duplicate token {tok!r} (first on {unit} {seen[tok]})")
        seen[tok] = i


def _tokens_from_mapping(vocab: Mapping[str, int]) -> list[str]:
    tokens: list[str | None] = [None] * len(vocab)
    for tok, idx in vocab.items():
        if not isinstance(idx, int) or not 0 <= idx < len(vocab):
            raise VocabError(f"vocabulary (dict): id {idx!r} of token {tok!r} is not in 0..{len(vocab) - 1}")
        if tokens[idx] is not None:
            raise VocabError(f"vocabulary (dict): id {idx} is given to both {tokens[idx]!r} and {tok!r}")
        tokens[idx] = tok
    _check_tokens(tokens, "vocabulary (dict)", "id")  # type: ignore[arg-type]
    return tokens  # type: ignore[return-value]


class BatchEncoding(dict):
    """What :meth:`BertTokenizer.__call__` returns: a dict whose keys can also be read as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: Any) -> BatchEncoding:
        """Move every tensor to ``device`` (for ``return_tensors="pt"``)."""
        return BatchEncoding({k: v.to(device) if hasattr(v, "to") else v for k, v in self.items()})


class BertTokenizer:
    """BERT's WordPiece tokenizer (Google's ``FullTokenizer`` semantics, transformers' call interface).

    Args:
        vocab: path to a ``vocab.txt``, a list of tokens (index = id) or a dict token -> id.
        do_lower_case: lower-case, and (by default) strip accents, as the uncased models expect.
        strip_accents: NFD + drop combining marks; ``None`` follows ``do_lower_case``.
        tokenize_chinese_chars: make every CJK ideograph its own word.
        max_input_chars_per_word: longer words become ``[UNK]`` (transformers' 100; Google's: 200).
        model_max_length: the length ``truncation=True`` and ``padding="max_length"`` use by default.
        split_special_tokens: ``"[MASK]"`` written in the text is the special token (as in transformers)
            unless ``True``: then it is split like any text, as Google's release does.

    Example (a vocabulary holding ``un``, ``##aff`` and ``##able``)::

        >>> tok = BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able"])
        >>> tok.tokenize("Unaffable")
        ['un', '##aff', '##able']
        >>> tok("unaffable")["input_ids"]
        [2, 5, 6, 7, 3]
    """

    def __init__(self, vocab: str | os.PathLike[str] | Sequence[str] | Mapping[str, int], *,
                 do_lower_case: bool = True, strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 max_input_chars_per_word: int = 100, model_max_length: int = _DEFAULT_MODEL_MAX_LENGTH,
                 split_special_tokens: bool = False, unk_token: str = "[UNK]", sep_token: str = "[SEP]",
                 pad_token: str = "[PAD]", cls_token: str = "[CLS]", mask_token: str = "[MASK]") -> None:
        if isinstance(vocab, (str, os.PathLike)):
            source, tokens = str(vocab), read_vocab_file(vocab)
        elif isinstance(vocab, Mapping):
            source, tokens = "vocabulary (dict)", _tokens_from_mapping(vocab)
        else:
            source, tokens = "vocabulary (list)", list(vocab)
            _check_tokens(tokens, source, "entry")
        if max_input_chars_per_word < 1:
            raise ValueError(f"max_input_chars_per_word must be >= 1, got {max_input_chars_per_word}")
        if model_max_length < 1:
            raise ValueError(f"model_max_length must be >= 1, got {model_max_length}")
        self._tokens: list[str] = tokens
        self._vocab: dict[str, int] = {t: i for i, t in enumerate(tokens)}
        self._special = dict(zip(_SPECIAL_NAMES, (unk_token, sep_token, pad_token, cls_token, mask_token)))
        missing = [f"{t!r} ({name})" for name, t in self._special.items() if t not in self._vocab]
        if missing:
            raise VocabError(f"{source}: the vocabulary has no {', '.join(missing)} token")
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.max_input_chars_per_word = max_input_chars_per_word
        self.model_max_length = model_max_length
        self.split_special_tokens = split_special_tokens
        self.vocab_hash: str = hashlib.sha256("".join(t + "\n" for t in tokens).encode("utf-8")).hexdigest()
        """sha256 of the tokens in id order, one per line: the sha256 of the saved ``vocab.txt``."""
        self._start_backends()

    # -- construction -----------------------------------------------------------------------------
    def _start_backends(self) -> None:
        # `_tok` is never reconfigured; `_tok_call` gets per-call truncation/padding under the lock.
        self._tok = self._build_backend()
        self._tok_call = self._build_backend()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # The lock cannot be pickled, and the backends are cheaper to rebuild than to serialise.
        return {k: v for k, v in self.__dict__.items() if k not in ("_tok", "_tok_call", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_backends()

    def _build_backend(self) -> Tokenizer:
        tok = Tokenizer(models.WordPiece(self._vocab, unk_token=self.unk_token, continuing_subword_prefix="##",
                                         max_input_chars_per_word=self.max_input_chars_per_word))
        tok.normalizer = bert_normalizer(do_lower_case=self.do_lower_case, strip_accents=self.strip_accents)
        tok.pre_tokenizer = bert_pre_tokenizer(tokenize_chinese_chars=self.tokenize_chinese_chars)
        tok.post_processor = processors.BertProcessing((self.sep_token, self.sep_token_id),
                                                       (self.cls_token, self.cls_token_id))
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        specials = sorted(set(self._special.values()), key=self._vocab.__getitem__)
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        tok.encode_special_tokens = self.split_special_tokens
        return tok

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **overrides: Any) -> BertTokenizer:
        """Load from a folder (``vocab.txt`` or a WordPiece ``tokenizer.json``, plus ``tokenizer_config.json``
        if present) or a ``vocab.txt`` path. Keyword arguments override the stored settings."""
        path = Path(path)
        if path.is_file():
            return cls(path, **overrides)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such tokenizer folder or vocab file")
        kwargs: dict[str, Any] = {}
        has_vocab, has_config = (path / VOCAB_FILE).is_file(), (path / CONFIG_FILE).is_file()
        backend_json: dict[str, Any] | None = None
        if (path / TOKENIZER_FILE).is_file() and not (has_vocab and has_config):
            # transformers 5 saves no vocab.txt (its truncation/padding settings are ignored)
            backend_json = json.loads((path / TOKENIZER_FILE).read_text(encoding="utf-8"))
            kwargs.update(_settings_from_tokenizer_json(backend_json))
        if has_config:
            config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
            kwargs.update(_settings_from_config(config, path / CONFIG_FILE))
        kwargs.update(overrides)
        if has_vocab:
            vocab: Any = path / VOCAB_FILE
        elif backend_json is not None and backend_json.get("model", {}).get("type") == "WordPiece":
            vocab = backend_json["model"]["vocab"]
        else:
            raise FileNotFoundError(f"{path}: no {VOCAB_FILE} (nor a WordPiece {TOKENIZER_FILE})")
        return cls(vocab, **kwargs)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> Path:
        """Write ``vocab.txt``, ``tokenizer_config.json``, ``special_tokens_map.json`` and ``tokenizer.json``
        (all replaced or none), as transformers' ``AutoTokenizer`` loads them. Returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"tokenizer_class": "BertTokenizer", **{k: getattr(self, k) for k in _SETTINGS}, **self._special}
        atomic_write_texts(folder, {VOCAB_FILE: "".join(t + "\n" for t in self._tokens),
                                    TOKENIZER_FILE: self._tok.to_str(pretty=True),
                                    SPECIAL_TOKENS_FILE: json.dumps(self._special, indent=2) + "\n",
                                    CONFIG_FILE: json.dumps(config, indent=2, ensure_ascii=False) + "\n"})
        return folder

    # -- vocabulary -------------------------------------------------------------------------------
    @property
    def vocab(self) -> dict[str, int]:
        """token -> id (a copy)."""
        return dict(self._vocab)

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def normalization(self) -> dict[str, bool]:
        """The settings that, with the vocabulary, fix which ids a text gets (recorded by data and models)."""
        strip = self.strip_accents if self.strip_accents is not None else self.do_lower_case
        return {"do_lower_case": bool(self.do_lower_case), "strip_accents": bool(strip),
                "tokenize_chinese_chars": bool(self.tokenize_chinese_chars)}

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """``{"unk_token": "[UNK]", "sep_token": "[SEP]", ...}`` (a copy)."""
        return dict(self._special)

    unk_token = property(lambda self: self._special["unk_token"])
    sep_token = property(lambda self: self._special["sep_token"])
    pad_token = property(lambda self: self._special["pad_token"])
    cls_token = property(lambda self: self._special["cls_token"])
    mask_token = property(lambda self: self._special["mask_token"])
    unk_token_id = property(lambda self: self._vocab[self.unk_token])
    sep_token_id = property(lambda self: self._vocab[self.sep_token])
    pad_token_id = property(lambda self: self._vocab[self.pad_token])
    cls_token_id = property(lambda self: self._vocab[self.cls_token])
    mask_token_id = property(lambda self: self._vocab[self.mask_token])

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of [UNK], [SEP], [PAD], [CLS], [MASK] (transformers' order)."""
        return [self._vocab[t] for t in dict.fromkeys(self._special.values())]

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self._special.values()))

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token(s) -> id(s); tokens not in the vocabulary map to the [UNK] id."""
        unk = self.unk_token_id
        if isinstance(tokens, str):
            return self._vocab.get(tokens, unk)
        return [self._vocab.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        """Id(s) -> token(s); an id outside the vocabulary is an error."""
        if hasattr(ids, "tolist"):  # tensors, arrays and their scalars
            ids = ids.tolist()
        if isinstance(ids, int):
            return self._tokens[self._check_id(ids)]
        return [self._tokens[self._check_id(i)] for i in ids]

    def _check_id(self, i: Any) -> int:
        i = int(i)
        if not 0 <= i < len(self._tokens):
            raise ValueError(f"token id {i} is outside the vocabulary (0..{len(self._tokens) - 1})")
        return i

    # -- tokenizing -------------------------------------------------------------------------------
    def basic_tokenize(self, text: str) -> list[str]:
        """Google's ``BasicTokenizer``: the normalised words before WordPiece.

        >>> tok.basic_tokenize("Héllo, WORLD!")  # uncased
        ['hello', ',', 'world', '!']
        """
        _check_text(text)
        return [w for w, _ in self._tok.pre_tokenizer.pre_tokenize_str(self._tok.normalizer.normalize_str(text))]

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of ``text``, without [CLS]/[SEP].

        >>> tok.tokenize("UNAFFABLE")  # with un, ##aff, ##able in the vocabulary
        ['un', '##aff', '##able']
        """
        _check_text(text)
        return self._tok.encode(text, add_special_tokens=False).tokens

    def encode_batch_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens: the fast path for corpus preparation."""
        texts = texts if isinstance(texts, list) else list(texts)
        try:
            encodings = self._tok.encode_batch_fast(texts, add_special_tokens=False)
        except TypeError:
            for i, t in enumerate(texts):
                _check_text(t, f"texts[{i}]")
            raise
        return [e.ids for e in encodings]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text: ``##`` pieces joined to their word, spaces before ``.,?!`` removed
        (transformers' ``decode``). Lower-casing and accent stripping are not undone.

        >>> tok.decode([2, 5, 6, 7, 3])  # [CLS] un ##aff ##able [SEP], vocabulary of the class example
        'unaffable'
        """
        ids = [self._check_id(i) for i in _as_list(ids)]
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = True) -> list[str]:
        """:meth:`decode` for each sequence."""
        return [self.decode(s, skip_special_tokens) for s in _as_list(sequences)]

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None, *,
                 add_special_tokens: bool = True, max_length: int | None = None, truncation: TruncationArg = None,
                 padding: PaddingArg = False, pad_to_multiple_of: int | None = None,
                 return_tensors: Literal["pt", "np"] | None = None, return_offsets_mapping: bool = False,
                 return_special_tokens_mask: bool = False, return_word_ids: bool = False) -> BatchEncoding:
        """Encode one text (or pair) or a batch, with transformers' conventions: a ``str`` gives flat
        lists, a list a list of lists, ``return_tensors`` a ``(batch, length)`` tensor.

        Args:
            truncation: ``True``/``"longest_first"``, ``"only_first"``, ``"only_second"`` or ``False``;
                ``None``: ``"longest_first"`` if ``max_length`` is given. Lengths count [CLS]/[SEP].
            padding: ``True``/``"longest"``, ``"max_length"`` (``max_length`` or ``model_max_length``),
                or ``False``. Pads on the right.
            return_word_ids: add ``word_ids``, each token's word within its sequence (``None``, or
                ``-1`` in tensors, for special and padding tokens).
            return_offsets_mapping: add ``offset_mapping``, each token's ``(start, end)`` characters.
        """
        inputs, batched = _model_inputs(text, text_pair)
        strategy = _truncation_strategy(truncation, max_length)
        if strategy == "only_second" and text_pair is None:
            raise ValueError('truncation="only_second" needs a text_pair')
        limit = max_length if max_length is not None else self.model_max_length
        pad_mode = _padding_mode(padding)
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        encodings = self._encode_inputs(inputs, add_special_tokens, strategy, limit, pad_mode, pad_to_multiple_of)
        fields = _encoding_fields(encodings, offsets=return_offsets_mapping,
                                  special_tokens_mask=return_special_tokens_mask, word_ids=return_word_ids)
        if return_tensors is None:
            return BatchEncoding({k: v if batched else v[0] for k, v in fields.items()})
        return BatchEncoding(_to_tensors(fields, return_tensors))

    def _encode_inputs(self, inputs: list[Any], add_special_tokens: bool, strategy: str | None, limit: int,
                       pad_mode: str | None, pad_to_multiple_of: int | None) -> list[Any]:
        """The backend's encodings of ``inputs``, truncated and padded as asked (settings of the backend,
        so set and cleared under the lock on a backend kept for these calls)."""
        if strategy is None and pad_mode is None:
            return self._tok.encode_batch(inputs, add_special_tokens=add_special_tokens)
        with self._lock:
            tok = self._tok_call
            try:
                if strategy is not None:
                    tok.enable_truncation(limit, stride=0, strategy=strategy, direction="right")
                if pad_mode is not None:
                    tok.enable_padding(direction="right", pad_id=self.pad_token_id, pad_type_id=0,
                                       pad_token=self.pad_token, length=limit if pad_mode == "max_length" else None,
                                       pad_to_multiple_of=pad_to_multiple_of)
                return tok.encode_batch(inputs, add_special_tokens=add_special_tokens)
            except Exception as e:  # tokenizers raises a plain Exception("Truncation error: ...")
                if "truncat" not in str(e).lower():
                    raise
                raise ValueError(f"cannot truncate to max_length={limit} with truncation={strategy!r}: {e}") from None
            finally:
                tok.no_truncation()
                tok.no_padding()

    def __repr__(self) -> str:
        settings = "".join(f", {k}={getattr(self, k)}" for k in _SETTINGS if k != "split_special_tokens")
        return f"BertTokenizer(vocab_size={self.vocab_size}{settings})"


# ------------------------------------------------------------------------------ call arguments and settings
def _check_text(text: Any, what: str = "text") -> None:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} holds the lone surrogate {text[e.start]!r} at index {e.start}, which is "
                         "not valid Unicode; decode the input properly (e.g. errors='replace')") from None


def _model_inputs(text: str | Sequence[str], text_pair: str | Sequence[str] | None) -> tuple[list[Any], bool]:
    """The backend's inputs (texts, or (text, pair) tuples) of a call, checked, and whether it is batched."""
    if isinstance(text, str):
        _check_text(text, "text")
        if text_pair is not None:
            _check_text(text_pair, "text_pair")  # type: ignore[arg-type]
        return [text if text_pair is None else (text, text_pair)], False
    texts = list(text)
    for i, t in enumerate(texts):
        _check_text(t, f"text[{i}]")
    if text_pair is None:
        return texts, True
    if isinstance(text_pair, str):
        raise TypeError("text is a batch, so text_pair must be a list of the same length")
    pairs = list(text_pair)
    if len(pairs) != len(texts):
        raise ValueError(f"text has {len(texts)} items but text_pair has {len(pairs)}")
    for i, t in enumerate(pairs):
        _check_text(t, f"text_pair[{i}]")
    return list(zip(texts, pairs)), True


def _encoding_fields(encodings: list[Any], *, offsets: bool, special_tokens_mask: bool,
                     word_ids: bool) -> dict[str, list[Any]]:
    """The model inputs of each encoding, and the extras asked for, as lists per field."""
    wanted = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask",
              "offset_mapping": "offsets" if offsets else None,
              "special_tokens_mask": "special_tokens_mask" if special_tokens_mask else None,
              "word_ids": "word_ids" if word_ids else None}
    return {key: [getattr(e, attr) for e in encodings] for key, attr in wanted.items() if attr is not None}


def _as_list(x: Any) -> list[Any]:
    if hasattr(x, "tolist"):  # torch tensors and numpy arrays
        x = x.tolist()
    return list(x)


def _truncation_strategy(truncation: TruncationArg, max_length: int | None) -> str | None:
    if truncation is None:
        return "longest_first" if max_length is not None else None
    if truncation is False or truncation == "do_not_truncate":
        return None
    if truncation is True:
        return "longest_first"
    if truncation in ("longest_first", "only_first", "only_second"):
        return truncation
    raise ValueError(f"truncation must be a bool or 'longest_first', 'only_first', 'only_second'; got {truncation!r}")


def _padding_mode(padding: PaddingArg) -> str | None:
    if padding is None or padding is False or padding == "do_not_pad":
        return None
    if padding is True or padding == "longest":
        return "longest"
    if padding == "max_length":
        return "max_length"
    raise ValueError(f"padding must be a bool, 'longest' or 'max_length'; got {padding!r}")


def _to_tensors(fields: dict[str, list[Any]], kind: str) -> dict[str, Any]:
    lengths = sorted({len(ids) for ids in fields["input_ids"]})
    if len(lengths) > 1:
        raise ValueError(f"cannot make {kind!r} tensors: the sequences have different lengths "
                         f"({lengths[0]}..{lengths[-1]}); pass padding=True (or padding='max_length' with "
                         "truncation) to make them equal")
    if "word_ids" in fields:
        fields["word_ids"] = [[-1 if w is None else w for w in seq] for seq in fields["word_ids"]]
    if kind == "pt":
        import torch

        return {k: torch.tensor(v, dtype=torch.long) for k, v in fields.items()}
    if kind == "np":
        import numpy as np

        return {k: np.asarray(v, dtype=np.int64) for k, v in fields.items()}
    raise ValueError(f"return_tensors must be None, 'pt' or 'np'; got {kind!r}")


def _settings_from_config(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """BertTokenizer keyword arguments from a transformers ``tokenizer_config.json``."""
    if config.get("do_basic_tokenize", True) is False:
        raise ValueError(f"{where}: do_basic_tokenize=false is not supported")
    out = {k: config[k] for k in _SETTINGS if k in config and k != "model_max_length"}
    if isinstance(config.get("model_max_length"), (int, float)):
        n = int(config["model_max_length"])
        out["model_max_length"] = n if n < _UNSET_MAX_LENGTH else _DEFAULT_MODEL_MAX_LENGTH
    for key in _SPECIAL_NAMES:
        value = config.get(key)
        if isinstance(value, dict):  # an AddedToken serialised by older transformers
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _settings_from_tokenizer_json(data: dict[str, Any]) -> dict[str, Any]:
    """Settings stored in a ``tokenizer.json`` that holds transformers' BERT pipeline."""
    out: dict[str, Any] = {}
    model = data.get("model") or {}
    if model.get("type") == "WordPiece":
        out.update({k: model[k] for k in ("max_input_chars_per_word", "unk_token") if k in model})
    norm = data.get("normalizer") or {}
    if norm.get("type") == "BertNormalizer":
        out["do_lower_case"] = norm.get("lowercase", True)
        out["strip_accents"] = norm.get("strip_accents")
        out["tokenize_chinese_chars"] = norm.get("handle_chinese_chars", True)
    return out
