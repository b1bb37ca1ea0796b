"""Raw text in -> documents out, streamed: each a `RawDocument` whose ``sentences()`` are strings.

Formats (``fmt``): ``google`` (a sentence per line, a blank line between documents), ``text``, ``jsonl``
(a ``text`` field per line), ``wiki-json`` (``title -> {"extract": ...}``) and ``auto`` (by extension).
Nothing stops the stream: invalid UTF-8, over-long lines and empty documents are counted in `CorpusStats`.
"""

from __future__ import annotations

import functools
import glob
import json
import lzma
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.io import COMPRESSED_SUFFIXES, open_binary

__all__ = ["FORMATS", "CorpusStats", "RawDocument", "expand_inputs", "iter_documents", "split_sentences"]

FORMATS = ("auto", "google", "text", "jsonl", "wiki-json")
MAX_LINE_CHARS = 1_000_000  # a "line" longer than this is not prose (base64, a table dump): skipped


@dataclass
class RawDocument:
    """One document as read: sentences, or prose that ``sentences()`` splits (in the worker processes)."""

    texts: list[str]
    presplit: bool

    def sentences(self) -> list[str]:
        # Prose lines of one block are joined first, so hard-wrapped text is not cut mid-sentence.
        return self.texts if self.presplit else split_sentences(" ".join(self.texts))


@dataclass
class CorpusStats:
    """What reading the input met, beyond well-formed documents."""

    files: int = 0
    documents: int = 0
    characters: int = 0
    invalid_utf8_lines: int = 0
    long_lines_skipped: int = 0
    empty_documents: int = 0
    bad_json_records: int = 0
    first_problem: dict[str, str] = field(default_factory=dict)  # kind -> "file:line"

    def note(self, kind: str, where: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.first_problem.setdefault(kind, where)


def expand_inputs(patterns: Iterable[str | Path]) -> list[Path]:
    """Globs -> files, each pattern expanded in sorted order; a pattern matching nothing is an error."""
    files: list[Path] = []
    for pattern in patterns:
        pattern = str(pattern)
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if not Path(m).is_dir()]
        if not matches or not all(Path(m).is_file() for m in matches):
            raise FileNotFoundError(f"no input file matches {pattern!r}")
        files.extend(Path(m) for m in matches)
    return files


def _base_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _lines(path: Path, stats: CorpusStats) -> Iterator[tuple[int, str]]:
    """(line number, text) with invalid UTF-8 replaced and over-long lines skipped (both counted)."""
    try:
        with open_binary(path) as f:
            for number, raw in enumerate(f, 1):
                raw = raw.rstrip(b"\r\n")  # the line ending does not count towards the limit
                if len(raw) > 4 * MAX_LINE_CHARS:
                    stats.note("long_lines_skipped", f"{path}:{number}")
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    stats.note("invalid_utf8_lines", f"{path}:{number}")
                    line = raw.decode("utf-8", errors="replace")
                if len(line) > MAX_LINE_CHARS:
                    stats.note("long_lines_skipped", f"{path}:{number}")
                    continue
                yield number, line
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise ValueError(f"{path}: cannot read ({e}); a truncated or corrupt compressed file?") from e


# ------------------------------------------------------------------------------ sentence splitting
_FALLBACK_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]*[A-Z0-9])")


def _regex_split(text: str) -> list[str]:
    return [s.strip() for s in _FALLBACK_BOUNDARY.split(text) if s.strip()]


@functools.cache
def _sentence_splitter() -> Callable[[str], list[str]]:
    try:
        import blingfire  # Microsoft's rule-based (finite-state) splitter: fast, no model download
    except (ImportError, OSError):  # its native library is not built for every platform
        return _regex_split

    def split(text: str) -> list[str]:
        return [s.strip() for s in blingfire.text_to_sentences(text).split("\n") if s.strip()]

    return split


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences (blingfire where available, a punctuation rule otherwise)."""
    text = text.strip()
    return _sentence_splitter()(text) if text else []


# ------------------------------------------------------------------------------ formats
def _blocks(path: Path, stats: CorpusStats, presplit: bool) -> Iterator[RawDocument]:
    """Blank-line separated blocks of stripped lines."""
    doc: list[str] = []
    for _, line in _lines(path, stats):
        line = line.strip()
        if line:
            doc.append(line)
        elif doc:
            yield RawDocument(doc, presplit)
            doc = []
    if doc:
        yield RawDocument(doc, presplit)


def _jsonl(path: Path, stats: CorpusStats, text_field: str) -> Iterator[RawDocument]:
    for number, line in _lines(path, stats):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            text = record[text_field]
            if not isinstance(text, str):
                raise TypeError(f"field {text_field!r} is not a string")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            stats.note("bad_json_records", f"{path}:{number} ({type(e).__name__}: {e})")
            continue
        yield RawDocument([text], presplit=False)


def _wiki_json(path: Path, stats: CorpusStats, text_field: str) -> Iterator[RawDocument]:
    with open_binary(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # as for line formats: count the lines, decode with replacements
        for number, line in enumerate(raw.split(b"\n"), 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                stats.note("invalid_utf8_lines", f"{path}:{number}")
        text = raw.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a valid JSON document ({e})") from e
    records = data.values() if isinstance(data, dict) else data
    if not isinstance(records, Iterable):
        raise ValueError(f"{path}: expected a JSON object or list of articles")
    for number, record in enumerate(records, 1):
        text = (record.get(text_field) or record.get("extract")) if isinstance(record, dict) else None
        if not isinstance(text, str):
            stats.note("bad_json_records", f"{path}: article {number}")
            continue
        yield RawDocument([text], presplit=False)


def iter_documents(files: Iterable[str | Path], *, fmt: str = "auto", text_field: str = "text",
                   stats: CorpusStats | None = None) -> Iterator[RawDocument]:
    """Stream documents from ``files``; problems go into ``stats``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; choose from {', '.join(FORMATS)}")
    stats = stats if stats is not None else CorpusStats()
    for path in map(Path, files):
        stats.files += 1
        kind = fmt
        if kind == "auto":
            kind = {".jsonl": "jsonl", ".json": "wiki-json"}.get(_base_suffix(path), "google")
        if kind in ("google", "text"):
            docs = _blocks(path, stats, presplit=kind == "google")
        elif kind == "jsonl":
            docs = _jsonl(path, stats, text_field)
        else:
            docs = _wiki_json(path, stats, text_field)
        for doc in docs:
            if not any(t.strip() for t in doc.texts):
                stats.note("empty_documents", str(path))
                continue
            stats.documents += 1
            stats.characters += sum(len(t) for t in doc.texts)
            yield doc


