"""BertTokenizer: parity with the pure-Python reference, edge cases, model inputs, files.

The reference is transformers' ``BertTokenizerLegacy``, a port of Google's ``tokenization.py``. It
departs from Google's code in two places, and bertforge follows Google there:

* it NFC-normalises the text before splitting (Google does not), which changes cased output for
  decomposed input such as ``"e\\u0301"``;
* it drops every character of Unicode category C* (Google drops only Cc and Cf), so private-use and
  unassigned characters vanish instead of becoming part of a word.

``google_reference`` below is the legacy tokenizer with those two steps set back to Google's.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import unicodedata
import functools
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from bertforge.text.tokenizer import BatchEncoding, BertTokenizer, VocabError, read_vocab_file

legacy_mod = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
transformers = pytest.importorskip("transformers")

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# --------------------------------------------------------------------------------------------------
# Fixtures and the Google-faithful reference
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vocab_file() -> Path:
    from bertforge.resources import minilm_folder

    return minilm_folder() / "vocab.txt"


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """3000 real sentences: 1500 holding non-ASCII characters, 1500 plain, spread over the corpus."""
    from bertforge.resources import iter_wikipedia_leads

    sents = [s.strip() for doc in iter_wikipedia_leads() for s in doc.split(". ") if s.strip()]
    non_ascii = [s for s in sents if not s.isascii()]
    plain = [s for s in sents if s.isascii()]
    return non_ascii[::2][:1500] + plain[::20][:1500]


@pytest.fixture(scope="module")
def tok(vocab_file) -> BertTokenizer:
    return BertTokenizer(vocab_file)


@pytest.fixture(scope="module")
def legacy(vocab_file):
    return legacy_mod.BertTokenizerLegacy(str(vocab_file))


def _google_is_control(ch: str) -> bool:
    # Google's tokenization.py: \t \n \r are whitespace; only categories Cc and Cf are control.
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")


class _NoNFC:
    """``unicodedata`` for the legacy module, minus its NFC step (Google has none)."""

    category = staticmethod(unicodedata.category)

    @staticmethod
    def normalize(form: str, text: str) -> str:
        return text if form == "NFC" else unicodedata.normalize(form, text)


@contextmanager
def google_semantics():
    with mock.patch.object(legacy_mod, "_is_control", _google_is_control), \
            mock.patch.object(legacy_mod, "unicodedata", _NoNFC()):
        yield


def google_basic(text: str, **cfg) -> list[str]:
    """Google's BasicTokenizer output for ``text``."""
    with google_semantics():
        return legacy_mod.BasicTokenizer(**cfg).tokenize(text)


@functools.lru_cache(maxsize=None)
def _legacy_cached(vocab_file: Path, max_chars: int, cfg: tuple):
    ref = legacy_mod.BertTokenizerLegacy(str(vocab_file), **dict(cfg))
    ref.wordpiece_tokenizer.max_input_chars_per_word = max_chars
    return ref


def legacy_with(vocab_file, *, max_chars: int = 100, **cfg):
    """The legacy reference with these settings (built once per test session)."""
    return _legacy_cached(vocab_file, max_chars, tuple(sorted(cfg.items())))


@functools.lru_cache(maxsize=None)
def _ours_cached(vocab_file: Path, cfg: tuple) -> BertTokenizer:
    return BertTokenizer(vocab_file, **dict(cfg))


def ours_with(vocab_file, **cfg) -> BertTokenizer:
    return _ours_cached(vocab_file, tuple(sorted(cfg.items())))


def tiny_vocab(*pieces: str) -> list[str]:
    return [*SPECIALS, *pieces]


# --------------------------------------------------------------------------------------------------
# Parity on real text
# --------------------------------------------------------------------------------------------------

@pytest.mark.real_data
def test_parity_with_reference_on_wikipedia_sentences(tok, legacy, sentences):
    assert len(sentences) == 3000
    assert sum(not s.isascii() for s in sentences) == 1500
    ours = tok(sentences)["input_ids"]
    n_unk = 0
    for s, ids in zip(sentences, ours):
        ref_tokens = legacy.tokenize(s)
        assert tok.tokenize(s) == ref_tokens, s
        assert ids == [101, *legacy.convert_tokens_to_ids(ref_tokens), 102], s
        n_unk += ref_tokens.count("[UNK]")
    # The sample exercises real segmentation: many pieces, a few unknown words.
    assert sum(map(len, ours)) > 80_000
    assert n_unk > 0


@pytest.mark.real_data
def test_encode_batch_ids_matches_call(tok, sentences):
    fast = tok.encode_batch_ids(sentences[:500])
    assert fast == tok(sentences[:500], add_special_tokens=False)["input_ids"]
    assert fast[0] and all(101 not in ids and 102 not in ids for ids in fast)


@functools.lru_cache(maxsize=1)
def _sweep_snippets() -> list[str]:
    """One short snippet per character: every assigned character except most of the big blocks of
    other letters (Lo, sampled), plus a sample of private-use and unassigned code points."""
    cjk_edges = [0x4E00, 0x9FFF, 0x3400, 0x4DBF, 0x20000, 0x2A6DF, 0x2A700, 0x2B73F, 0x2B740, 0x2B81F,
                 0x2B820, 0x2B91F, 0x2B920, 0x2CEAF, 0xF900, 0xFAFF, 0x2F800, 0x2FA1F, 0x2FA20, 0x33FF]
    out = []
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        if cat == "Cs":
            continue  # lone surrogates are not text (tested separately)
        keep = cat not in ("Lo", "Cn", "Co") or (cat == "Lo" and cp % 31 == 0) or cp % 997 == 0 or cp in cjk_edges
        if keep:
            c = chr(cp)
            # Inside a word after a capital, at a word start before a capital sigma, between a
            # capital alpha and a sigma (the final-sigma context).
            out.append(f"A{c}b {c}\u03a3 \u0391{c}\u03a3.")
    return out


@pytest.mark.parametrize("cfg", [
    dict(do_lower_case=True),
    dict(do_lower_case=False),
    dict(do_lower_case=True, strip_accents=False),
    dict(do_lower_case=False, strip_accents=True),
], ids=["uncased", "cased", "lower-keep-accents", "cased-strip-accents"])
def test_every_character_matches_google_basic_tokenizer(cfg):
    """Character by character, the Rust pipeline equals Google's BasicTokenizer (Python unicodedata)."""
    tok = BertTokenizer(tiny_vocab("a"), **cfg)
    snippets = _sweep_snippets()
    assert len(snippets) > 20_000
    with google_semantics():
        ref = legacy_mod.BasicTokenizer(**cfg)
        bad = []
        for i in range(0, len(snippets), 400):
            chunk = " \n ".join(snippets[i:i + 400])
            if tok.basic_tokenize(chunk) != ref.tokenize(chunk):
                bad += [(hex(ord(s[1])), tok.basic_tokenize(s), ref.tokenize(s)) for s in snippets[i:i + 400]
                        if tok.basic_tokenize(s) != ref.tokenize(s)]
    assert bad == []


# --------------------------------------------------------------------------------------------------
# Edge cases, tokens and ids against the reference
# --------------------------------------------------------------------------------------------------

EDGE_CASES = {
    "accents": "Café résumé naïve Ångström façade Zürich São Paulo Dvořák",
    "accents-caps": "CAFÉ RÉSUMÉ ÉCOLE ÑANDÚ",
    "cjk": "我爱北京天安门。BERT是一个模型！",
    "cjk-ext": "\U00020000\U0002a6df x\U0002b820y \uf900\U0002f800",
    "kana-hangul": "ひらがな カタカナ 한국어 텍스트",
    "emoji": "I \u2764\ufe0f NLP \U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f1eb\U0001f1f7",
    "control": "a\x00b\x01c\x7fd\x1be\x85f\x0bg\x0ch\x9fi",
    "replacement-char": "bad\ufffdbyte \ufffd",
    "zero-width": "a\u200bb\u200cc\u200dd\ufeffe\u00adf\u2060g\u180eh",
    "empty": "",
    "whitespace-only": " \t\n\r\u00a0\u3000 ",
    "tabs-newlines": "line one\tcol\nline two\r\nline three\u2028four\u2029five",
    "unicode-spaces": "a\u00a0b\u2002c\u2009d\u202fe\u205ff\u3000g\u1680h",
    "combining": "e\u0301 a\u0308\u0304 \u0301 \u0301abc x\u20dd n\u0303o",
    "punctuation": "Hello!!! (yes) [no] {maybe} 'q' \"dq\" \u00abg\u00bb em\u2014dash en\u2013dash \u2010 \u2026 "
                   "\u00bfque? \u00a1si! \u3001\u3002\u300c\u300d \u30fb \u2030 \u2020 \u00a7 \u00b6 "
                   "# $ % ^ & * _ + = ~ ` | \\ / < > @",
    "numbers": "$100 1,000.50 3.14e-10 e.g. U.S.A. 10:30pm 50% #1",
    "hindi": "हिन्दी भाषा भारत की राजभाषा है।",
    "arabic": "اللغة العربية مَدْرَسَةٌ، كِتَابٌ؟",
    "thai": "ภาษาไทยเป็นภาษาราชการของประเทศไทย",
    "hebrew": "שָׁלוֹם עוֹלָם",
    "greek": "ΟΔΟΣ ΑΘΗΝΑΣ. Σ ΑΣ, Ο ΚΟΣΜΟΣ'Σ όδος",
    "turkish-german": "İSTANBUL ıi STRASSE Straße ẞ",
    "cyrillic": "Привет, МИР! Ёлка",
    "special-tokens-in-text": "hello [MASK] world [SEP] [mask] x[CLS]y",
    "mixed-long": "The quick brown fox, naïvely jumping over 13 lazy dogs (again)!",
}

CONFIGS = {
    "uncased": dict(do_lower_case=True),
    "cased": dict(do_lower_case=False),
    "lower-keep-accents": dict(do_lower_case=True, strip_accents=False),
}


# Where the unmodified legacy port gives other words than Google's code: when accents are kept, its
# NFC step composes decomposed accents (e + U+0301 -> é) and maps CJK compatibility ideographs
# (U+F900, U+2F800) to unified ones. (Accent stripping's NFD makes both steps agree again.)
LEGACY_DEPARTS = {(case, config) for case in ("combining", "cjk-ext") for config in ("cased", "lower-keep-accents")}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_cases_match_reference(vocab_file, case, config):
    text = EDGE_CASES[case]
    tok = ours_with(vocab_file, **CONFIGS[config])
    ref = legacy_with(vocab_file, **CONFIGS[config])
    with google_semantics():
        ref_tokens = ref.tokenize(text)
        ref_words = ref.basic_tokenizer.tokenize(text)
    assert tok.tokenize(text) == ref_tokens
    assert tok(text)["input_ids"] == [101, *ref.convert_tokens_to_ids(ref_tokens), 102]
    if "[" not in text:  # basic_tokenize does not single out special tokens; tokenize does
        assert tok.basic_tokenize(text) == ref_words
    assert (ref.basic_tokenizer.tokenize(text) == ref_words) == ((case, config) not in LEGACY_DEPARTS)
    if case in ("empty", "whitespace-only"):
        assert ref_tokens == []


def test_edge_cases_have_the_expected_shape(tok):
    # A few outputs written out, so the parity above is not parity of two wrong answers.
    assert tok.tokenize("") == [] and tok.tokenize(" \t\n\u3000") == []
    assert tok("")["input_ids"] == [101, 102]
    assert tok.basic_tokenize("a\x00b\ufffdc\u200bd") == ["abcd"]
    assert tok.basic_tokenize("Café, NAÏVE!") == ["cafe", ",", "naive", "!"]
    assert tok.basic_tokenize("我爱BERT") == ["我", "爱", "bert"]
    assert tok.basic_tokenize("e.g. U.S.A.") == ["e", ".", "g", ".", "u", ".", "s", ".", "a", "."]
    assert tok.tokenize("ΟΔΟΣ") == ["ο", "##δ", "##ος"]  # capital sigma at the end -> final form
    assert tok.basic_tokenize("ΑΣ'Σ ΣΑ") == ["ασ", "'", "ς", "σα"]
    assert tok.tokenize("hello [MASK] world") == ["hello", "[MASK]", "world"]


@pytest.mark.parametrize("max_chars", [100, 200])
@pytest.mark.parametrize("n", [99, 100, 101, 199, 200, 201])
def test_long_words_match_reference(vocab_file, n, max_chars):
    tok = ours_with(vocab_file, max_input_chars_per_word=max_chars)
    ref = legacy_with(vocab_file, max_chars=max_chars)
    # The limit counts characters after normalisation: 'e\u0301' is one character once accents go.
    for text in ["a" * n, "x" + "ab" * (n // 2), "e\u0301" * n, f"pre {'b' * n}, post"]:
        ref_tokens = ref.tokenize(text)
        assert tok.tokenize(text) == ref_tokens
    word = tok.tokenize("a" * n)
    assert (word == ["[UNK]"]) == (n > max_chars)


def test_default_max_chars_is_transformers_and_200_is_google(vocab_file):
    assert BertTokenizer(vocab_file).max_input_chars_per_word == 100
    assert BertTokenizer(vocab_file).tokenize("a" * 150) == ["[UNK]"]
    pieces = BertTokenizer(vocab_file, max_input_chars_per_word=200).tokenize("a" * 150)
    assert len(pieces) > 1 and "".join(p.removeprefix("##") for p in pieces) == "a" * 150


def test_where_legacy_reference_departs_from_google(vocab_file):
    """The two places the legacy port differs from Google's code; bertforge follows Google."""
    cased = BertTokenizer(vocab_file, do_lower_case=False)
    ref = legacy_with(vocab_file, do_lower_case=False)
    # NFC: the legacy port composes e + U+0301 into one character; Google keeps two.
    assert ref.basic_tokenizer.tokenize("Cafe\u0301") == ["Café"]
    assert google_basic("Cafe\u0301", do_lower_case=False) == ["Cafe\u0301"]
    assert cased.basic_tokenize("Cafe\u0301") == ["Cafe\u0301"]
    # C*: private-use (U+E000) and unassigned (U+0378) characters are dropped by the port only.
    for ch in ["\ue000", "\u0378", "\U000f0000"]:
        assert ref.basic_tokenizer.tokenize(f"a{ch}b") == ["ab"]
        assert google_basic(f"a{ch}b", do_lower_case=False) == [f"a{ch}b"]
        assert cased.basic_tokenize(f"a{ch}b") == [f"a{ch}b"]
        assert cased.tokenize(f"a{ch}b") == ["[UNK]"]


def test_split_special_tokens_reproduces_google(vocab_file):
    text = "fill [MASK] here [SEP]"
    assert BertTokenizer(vocab_file).tokenize(text) == ["fill", "[MASK]", "here", "[SEP]"]
    google = BertTokenizer(vocab_file, split_special_tokens=True)
    assert google.tokenize(text) == ["fill", "[", "mask", "]", "here", "[", "sep", "]"]
    assert google.basic_tokenize(text) == google_basic(text)


def test_lone_surrogates_are_a_clear_error(tok):
    with pytest.raises(ValueError, match="surrogate"):
        tok.tokenize("a\ud800b")
    with pytest.raises(ValueError, match=r"texts\[1\]"):
        tok.encode_batch_ids(["fine", "a\udfffb"])
    with pytest.raises(TypeError, match="str"):
        tok.tokenize(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# WordPiece basics on a tiny vocabulary
# --------------------------------------------------------------------------------------------------

def test_unaffable_with_a_tiny_vocab():
    tok = BertTokenizer(tiny_vocab("un", "##aff", "##able"))
    assert tok.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert tok.tokenize("UNAFFABLE") == ["un", "##aff", "##able"]
    assert tok("unaffable")["input_ids"] == [2, 5, 6, 7, 3]
    assert tok.decode([2, 5, 6, 7, 3]) == "unaffable"
    assert tok.decode([2, 5, 6, 7, 3], skip_special_tokens=False) == "[CLS] unaffable [SEP]"
    # No full segmentation -> the whole word is [UNK]; other words are unaffected.
    assert tok.tokenize("unaffablex un") == ["[UNK]", "un"]
    assert tok.tokenize("affable") == ["[UNK]"]  # "aff" exists only as a continuation piece


def test_greedy_longest_match_first():
    tok = BertTokenizer(tiny_vocab("a", "ab", "abc", "##b", "##c", "##bc", "##d"))
    assert tok.tokenize("abcd") == ["abc", "##d"]
    assert tok.tokenize("abd") == ["ab", "##d"]
    assert tok.tokenize("abbc") == ["ab", "##bc"]


def test_vocab_accessors(tok, vocab_file):
    assert tok.vocab_size == len(tok) == 30522
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == \
        (0, 100, 101, 102, 103)
    assert tok.all_special_ids == [100, 102, 0, 101, 103]
    assert tok.convert_tokens_to_ids("hello") == 7592
    assert tok.convert_tokens_to_ids(["hello", "no-such-token"]) == [7592, 100]
    assert tok.convert_ids_to_tokens(7592) == "hello"
    assert tok.convert_ids_to_tokens([101, 7592, 102]) == ["[CLS]", "hello", "[SEP]"]
    assert tok.convert_ids_to_tokens(torch.tensor([101, 102])) == ["[CLS]", "[SEP]"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.convert_ids_to_tokens(30522)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([5, -1])
    v = tok.vocab
    v["hello"] = -5  # a copy: the tokenizer is unaffected
    assert tok.vocab["hello"] == 7592
    assert tok.vocab_hash == hashlib.sha256(vocab_file.read_bytes()).hexdigest()
    assert BertTokenizer(tiny_vocab("x")).vocab_hash != BertTokenizer(tiny_vocab("y")).vocab_hash


# --------------------------------------------------------------------------------------------------
# Model inputs
# --------------------------------------------------------------------------------------------------

def test_pair_encoding_and_token_types(tok, legacy):
    enc = tok("The cat sat.", "It was unaffable!")
    assert isinstance(enc, BatchEncoding)
    a, b = legacy.tokenize("The cat sat."), legacy.tokenize("It was unaffable!")
    assert enc["input_ids"] == [101, *legacy.convert_tokens_to_ids(a), 102, *legacy.convert_tokens_to_ids(b), 102]
    assert enc["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert enc["attention_mask"] == [1] * len(enc["input_ids"])
    assert enc.input_ids is enc["input_ids"]
    batch = tok(["one", "two three"], ["x", "y z"])
    assert batch["token_type_ids"] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1, 1]]
    nospecial = tok("one", "two", add_special_tokens=False)
    assert nospecial["input_ids"] == [2028, 2048] and nospecial["token_type_ids"] == [0, 1]


@pytest.mark.parametrize("max_length", range(5, 14))
@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
def test_truncation_matches_reference(tok, legacy, strategy, max_length):
    a, b = "one two three four five six", "seven eight nine"  # 6 and 3 tokens, 3 special tokens
    feasible = strategy == "longest_first" or (
        (strategy == "only_first" and 3 + 3 + 1 <= max_length) or (strategy == "only_second" and 6 + 3 + 1 <= max_length)
    )
    if not feasible:
        with pytest.raises(ValueError, match="cannot truncate"):
            tok(a, b, truncation=strategy, max_length=max_length)
        return
    ours = tok(a, b, truncation=strategy, max_length=max_length)
    assert ours["input_ids"] == legacy(a, b, truncation=strategy, max_length=max_length)["input_ids"]
    assert len(ours["input_ids"]) == min(max_length, 12)


def test_longest_first_vs_only_second(tok):
    a, b = "one two three four five six", "seven eight nine"
    longest = tok(a, b, truncation=True, max_length=9)["input_ids"]
    second = tok(a, b, truncation="only_second", max_length=10)["input_ids"]
    ids = dict(zip(["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"],
                   tok.convert_tokens_to_ids(["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])))
    # longest_first trims the longer sequence first: 6+3 -> 3+3.
    assert longest == [101, ids["one"], ids["two"], ids["three"], 102, ids["seven"], ids["eight"], ids["nine"], 102]
    # only_second keeps all of the first sequence.
    assert second == [101, *[ids[w] for w in a.split()], 102, ids["seven"], 102]


def test_truncation_without_max_length_uses_model_max_length(vocab_file):
    long_text = "word " * 1000
    assert len(BertTokenizer(vocab_file)(long_text, truncation=True)["input_ids"]) == 512
    small = BertTokenizer(vocab_file, model_max_length=16)
    enc = small(long_text, truncation=True)
    assert len(enc["input_ids"]) == 16 and enc["input_ids"][-1] == 102
    assert len(small(long_text)["input_ids"]) == 1002  # no truncation unless asked
    assert len(small(long_text, max_length=10)["input_ids"]) == 10  # max_length alone truncates
    assert len(small(long_text, max_length=10, truncation=False)["input_ids"]) == 1002


def test_padding_and_tensors(tok):
    texts = ["short", "a much longer sentence here"]
    enc = tok(texts, padding=True)
    assert [len(x) for x in enc["input_ids"]] == [7, 7]
    assert enc["input_ids"][0] == [101, 2460, 102, 0, 0, 0, 0]
    assert enc["attention_mask"][0] == [1, 1, 1, 0, 0, 0, 0]
    assert enc["token_type_ids"][0] == [0] * 7
    enc = tok(texts, padding="max_length", max_length=10)
    assert [len(x) for x in enc["input_ids"]] == [10, 10]
    enc = tok(texts, padding=True, pad_to_multiple_of=8, return_special_tokens_mask=True)
    assert [len(x) for x in enc["input_ids"]] == [8, 8]
    assert enc["special_tokens_mask"][0] == [1, 0, 1, 1, 1, 1, 1, 1]
    pt = tok(texts, padding=True, return_tensors="pt")
    assert isinstance(pt["input_ids"], torch.Tensor) and pt["input_ids"].dtype == torch.long
    assert tuple(pt["input_ids"].shape) == (2, 7) and pt["attention_mask"].sum().item() == 3 + 7
    npy = tok(texts, padding=True, return_tensors="np", return_word_ids=True, return_offsets_mapping=True)
    assert npy["input_ids"].dtype == np.int64 and npy["input_ids"].shape == (2, 7)
    assert npy["word_ids"][0].tolist() == [-1, 0, -1, -1, -1, -1, -1]
    assert npy["offset_mapping"].shape == (2, 7, 2)
    single = tok("hello world", return_tensors="pt")
    assert tuple(single["input_ids"].shape) == (1, 4)
    assert single.to("cpu")["input_ids"].tolist() == [[101, 7592, 2088, 102]]


def test_ragged_tensors_are_a_clear_error(tok):
    with pytest.raises(ValueError, match="padding=True"):
        tok(["short", "a much longer sentence"], return_tensors="pt")
    with pytest.raises(ValueError, match="different lengths"):
        tok(["short", "a much longer sentence " * 5], padding="max_length", max_length=8,
            truncation=False, return_tensors="np")
    with pytest.raises(ValueError, match="padding must be"):
        tok("x", padding="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="truncation must be"):
        tok("x", truncation="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="text_pair"):
        tok(["a", "b"], ["c"])


def test_settings_do_not_leak_between_calls(tok):
    long_text = "word " * 40
    assert len(tok(long_text, max_length=8, padding="max_length")["input_ids"]) == 8
    assert len(tok(long_text)["input_ids"]) == 42
    assert tok(["a", "b c"])["input_ids"] == [[101, 1037, 102], [101, 1038, 1039, 102]]
    with pytest.raises(ValueError):
        tok("a b c d e f", "x", truncation="only_second", max_length=4)
    assert len(tok(long_text, "x")["input_ids"]) == 44
    assert tok.tokenize(long_text) == ["word"] * 40
    assert tok._tok.truncation is None and tok._tok_call.truncation is None and tok._tok_call.padding is None


def test_concurrent_calls_with_different_settings(tok):
    texts = ["word " * 30, "one two"]
    errors: list[str] = []

    def worker(max_length: int) -> None:
        for _ in range(50):
            got = tok(texts, max_length=max_length, padding="max_length")["input_ids"]
            if [len(x) for x in got] != [max_length, max_length]:
                errors.append(f"{max_length}: {[len(x) for x in got]}")
            plain = tok(texts)["input_ids"]
            if [len(x) for x in plain] != [32, 4]:
                errors.append(f"plain: {[len(x) for x in plain]}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in (8, 16, 24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_pickle_and_deepcopy(tok):
    import copy
    import pickle

    for clone in (pickle.loads(pickle.dumps(tok)), copy.deepcopy(tok)):
        assert clone.vocab_hash == tok.vocab_hash
        assert clone(["ΟΔΟΣ unaffable", "x"], padding=True)["input_ids"] == \
            tok(["ΟΔΟΣ unaffable", "x"], padding=True)["input_ids"]


def test_offsets_map_back_to_the_source_text(tok):
    text = "Café owners in Zürich, naïvely unaffable: 42 €!"
    enc = tok(text, return_offsets_mapping=True, return_word_ids=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert enc["offset_mapping"][0] == (0, 0) and enc["offset_mapping"][-1] == (0, 0)

    def fold(s: str) -> str:
        return "".join(c for c in unicodedata.normalize("NFD", s.lower()) if unicodedata.category(c) != "Mn")

    words: dict[int, list[tuple[int, int]]] = {}
    for token, (start, end), w in zip(tokens[1:-1], enc["offset_mapping"][1:-1], enc["word_ids"][1:-1]):
        if token != "[UNK]":
            assert fold(text[start:end]) == token.removeprefix("##")
        words.setdefault(w, []).append((start, end))
    spans = [text[v[0][0]:v[-1][1]] for _, v in sorted(words.items())]
    assert spans == ["Café", "owners", "in", "Zürich", ",", "naïvely", "unaffable", ":", "42", "€", "!"]


def test_word_ids(tok):
    enc = tok("Hello, unaffable world!", "Second part", return_word_ids=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert tokens == ["[CLS]", "hello", ",", "una", "##ffa", "##ble", "world", "!", "[SEP]", "second", "part", "[SEP]"]
    assert enc["word_ids"] == [None, 0, 1, 2, 2, 2, 3, 4, None, 0, 1, None]


def test_decode_round_trip(tok, sentences):
    for text in ["hello world, this is unaffable!", "what? yes. no! 35 percent", "the 19th - century ( 1801 )"]:
        assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.decode(tok("Hi")["input_ids"], skip_special_tokens=False) == "[CLS] hi [SEP]"
    assert tok.decode(torch.tensor(tok("Hi there")["input_ids"])) == "hi there"
    assert tok.batch_decode([[101, 7592, 102], [2088]]) == ["hello", "world"]


@pytest.mark.real_data
def test_decode_matches_transformers(tok, vocab_file, sentences):
    hf = transformers.BertTokenizer(vocab=str(vocab_file))
    for s in sentences[::30]:
        ids = tok(s)["input_ids"]
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids)


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------

def test_save_and_from_pretrained_round_trip(vocab_file, tmp_path):
    tok = BertTokenizer(vocab_file, do_lower_case=False, max_input_chars_per_word=200, model_max_length=128,
                        split_special_tokens=True)
    folder = tok.save_pretrained(tmp_path / "tok")
    assert sorted(p.name for p in folder.iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer"
    assert (config["do_lower_case"], config["max_input_chars_per_word"], config["model_max_length"]) == (False, 200, 128)
    assert json.loads((folder / "special_tokens_map.json").read_text())["mask_token"] == "[MASK]"
    assert (folder / "vocab.txt").read_bytes() == vocab_file.read_bytes()
    back = BertTokenizer.from_pretrained(folder)
    assert (back.do_lower_case, back.max_input_chars_per_word, back.model_max_length, back.split_special_tokens) == \
        (False, 200, 128, True)
    assert back.vocab_hash == tok.vocab_hash
    text = "Héllo [MASK] World " + "a" * 150
    assert back(text)["input_ids"] == tok(text)["input_ids"]
    assert BertTokenizer.from_pretrained(folder / "vocab.txt").do_lower_case is True  # a bare vocab file
    assert BertTokenizer.from_pretrained(folder, model_max_length=64).model_max_length == 64
    # The tokenizers serialisation holds the same pipeline.
    from tokenizers import Tokenizer

    # (split_special_tokens is a run-time flag of tokenizers that its JSON does not store; the
    # tokenizer_config.json carries it, under transformers' name.)
    default = BertTokenizer(vocab_file, max_input_chars_per_word=200)
    raw = Tokenizer.from_file(str(default.save_pretrained(tmp_path / "default") / "tokenizer.json"))
    assert raw.encode(text).ids == default(text)["input_ids"]
    assert raw.encode("ΟΔΟΣ").tokens == ["[CLS]", "ο", "##δ", "##ος", "[SEP]"]
    # Saving again over the files works and leaves no temporary files behind.
    tok.save_pretrained(folder)
    assert len(list(folder.iterdir())) == 4


@pytest.mark.real_data
def test_transformers_autotokenizer_loads_our_folder(tok, tmp_path, sentences):
    folder = tok.save_pretrained(tmp_path / "tok")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert type(hf).__name__ == "BertTokenizer" and hf.model_max_length == 512
    batch = sentences[::10]
    assert hf(batch)["input_ids"] == tok(batch)["input_ids"]
    assert hf(batch[:50], batch[50:100], truncation=True, max_length=40, padding=True)["input_ids"] == \
        tok(batch[:50], batch[50:100], truncation=True, max_length=40, padding=True)["input_ids"]
    assert hf.tokenize(batch[3]) == tok.tokenize(batch[3])


def test_transformers_saved_folder_loads_here(vocab_file, tmp_path):
    hf = transformers.BertTokenizer(vocab=str(vocab_file), do_lower_case=True)
    hf.save_pretrained(str(tmp_path / "hf"))  # transformers 5 writes tokenizer.json + config only
    ours = BertTokenizer.from_pretrained(tmp_path / "hf")
    text = "Transformers saved this, we read it: unaffable Ünïcödé!"
    assert ours(text)["input_ids"] == hf(text)["input_ids"]
    assert ours.model_max_length == 512  # transformers' "no limit" sentinel -> BERT's 512
    assert ours.vocab_hash == hashlib.sha256(vocab_file.read_bytes()).hexdigest()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_bad_vocab_files_name_the_line(tmp_path):
    good = "\n".join(SPECIALS + ["a", "b"]) + "\n"
    assert read_vocab_file(_write(tmp_path / "ok.txt", good.encode())) == SPECIALS + ["a", "b"]
    assert read_vocab_file(_write(tmp_path / "crlf.txt", good.replace("\n", "\r\n").encode()))[-1] == "b"

    dup = _write(tmp_path / "dup.txt", (good + "a\n").encode())
    with pytest.raises(VocabError, match=r"dup\.txt, line 8: duplicate token 'a' \(first on line 6\)"):
        BertTokenizer(dup)
    empty = _write(tmp_path / "empty.txt", good.replace("a\n", "\n").encode())
    with pytest.raises(VocabError, match=r"empty\.txt, line 6: empty token"):
        BertTokenizer(empty)
    bad_utf8 = _write(tmp_path / "bad.txt", good.encode() + b"ok\ncaf\xe9\n")
    with pytest.raises(VocabError, match=r"bad\.txt, line 9: invalid UTF-8 at byte 3"):
        BertTokenizer(bad_utf8)
    no_mask = _write(tmp_path / "nomask.txt", good.replace("[MASK]\n", "").encode())
    with pytest.raises(VocabError, match=r"nomask\.txt: the vocabulary has no '\[MASK\]'"):
        BertTokenizer(no_mask)
    with pytest.raises(VocabError, match=r"entry 7: duplicate token 'a'"):
        BertTokenizer(SPECIALS + ["a", "a"])
    with pytest.raises(VocabError, match="id 9"):
        BertTokenizer({t: i for i, t in enumerate(SPECIALS)} | {"x": 9})
    assert isinstance(VocabError("x"), ValueError)
    with pytest.raises(FileNotFoundError):
        BertTokenizer.from_pretrained(tmp_path / "missing")
