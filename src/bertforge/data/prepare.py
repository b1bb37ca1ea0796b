"""``bertforge prepare``: raw text -> a folder of pre-training shards, streamed, in parallel.

The input is read once, as a stream, and cut into *windows* of whole documents (``shard_chars``
characters each); each window becomes one shard, built by a worker process with Google's instance
algorithm. Unlike Google's script, which holds the whole corpus in memory, a NotNext segment B comes
from another document of the same window, and instances are shuffled within their shard.

A window's content depends only on the input, and its random generator only on the seed and its
index: the same inputs and settings give byte-identical shards whatever the number of workers or
machines. Finished shards (a sidecar ``.json`` of the same settings) are skipped when run again.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import logging
import multiprocessing as mp
import os
import random
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.console import progress_bar
from bertforge.data.corpus import FORMATS, MAX_LINE_CHARS, CorpusStats, RawDocument, expand_inputs, iter_documents
from bertforge.data.instances import (DocumentPool, InstanceBatch, MaskingConfig, SpecialIds, create_instances,
                                      mask_batch)
from bertforge.data.shards import ShardError, shard_name, write_shard
from bertforge.io import atomic_write_text
from bertforge.settings import HugeNumber, check_settings, option, setting

__all__ = ["PrepareConfig", "prepare", "load_manifest", "format_stats", "special_ids"]

logger = logging.getLogger("bertforge")

MANIFEST = "manifest.json"
MAX_WORKERS = 1024
"""More worker processes than any machine runs: a larger --workers is a typo."""
SETTINGS = "settings.json"
# The counts of each shard's sidecar that the manifest's totals add up.
_COUNTS = ("instances", "tokens", "input_tokens", "documents", "one_sentence_documents", "sentences", "not_next")


@dataclass
class PrepareConfig:
    """Settings of ``bertforge prepare`` (defaults: Google's ``create_pretraining_data.py``)."""

    max_seq_length: int = setting(128, at_least=8, at_most=65535)
    """Longest instance, in tokens, special tokens included."""
    max_predictions_per_seq: int = setting(20, at_least=1, at_most=65535)
    """Masked-LM predictions per instance at most (the paper: 20 at 128, about 80 at 512)."""
    masked_lm_prob: float = setting(0.15, above=0, below=1)
    """Share of tokens to predict."""
    mask_token_prob: float = setting(0.8, at_least=0, at_most=1)
    """Of the predicted tokens, the share replaced by [MASK]."""
    random_token_prob: float = setting(0.1, at_least=0, at_most=1)
    """Of the predicted tokens, the share replaced by a random token (the rest stay unchanged)."""
    whole_word_mask: bool = False
    """Mask whole words (a piece and its ## continuations) together."""
    short_seq_prob: float = setting(0.1, at_least=0, at_most=1)
    """Probability of a shorter random target length, so the model also sees short inputs."""
    dupe_factor: int = setting(10, at_least=1, at_most=1000)
    """Passes over the data, each with fresh masks and fresh A/B splits."""
    seed: int = setting(12345, at_least=0)
    """Seed of every random choice; with the inputs, it fixes the output exactly."""
    nsp: bool = True
    """Next sentence prediction pairs (the paper). Off: pack whole sentences, MLM only (RoBERTa)."""
    dynamic_masking: bool = False
    """Store instances unmasked; the loader masks them afresh each epoch (off: the paper's static masks)."""
    format: str = "auto"
    """Input format: auto, google, text, jsonl, wiki-json."""
    text_field: str = "text"
    """The JSON field holding the text, for jsonl / wiki-json input."""
    shard_chars: int = setting(2_000_000, at_least=1)
    """Characters of input per shard: the window NotNext documents are drawn from and the unit of work."""

    def __post_init__(self) -> None:
        check_settings(self)  # the ranges declared on the fields
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r}; choose from {', '.join(FORMATS)}")
        self.masking  # the masking shares together

    @property
    def masking(self) -> MaskingConfig:
        return MaskingConfig(self.masked_lm_prob, self.max_predictions_per_seq, self.mask_token_prob,
                             self.random_token_prob, self.whole_word_mask)

    def fingerprint(self, vocab_hash: str, inputs: list | None = None,
                    normalization: dict[str, bool] | None = None) -> str:
        """What the shards are a function of: settings, vocab, normalisation and input files."""
        return _digest(self, vocab_hash, inputs, normalization=normalization)


def _digest(cfg: PrepareConfig, vocab_hash: str, inputs: list | None, **more: Any) -> str:
    """The SHA-256 of ``cfg``'s settings, the vocab, the inputs and ``more``, as a data folder records it."""
    blob = json.dumps({**dataclasses.asdict(cfg), "vocab_hash": vocab_hash, "inputs": inputs, **more}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# ------------------------------------------------------------------------------ one shard (a worker)
@dataclass
class _ShardJob:
    index: int
    documents: list[RawDocument]
    out_dir: str
    tokenizer_dir: str
    config: PrepareConfig
    fingerprint: str


@functools.cache
def _tokenizer(folder: str):
    from bertforge.text.tokenizer import BertTokenizer

    # Corpus text is plain text: "[MASK]" written in it is no special token (as in Google's tokenizer).
    return BertTokenizer.from_pretrained(folder, split_special_tokens=True)


def shard_rngs(seed: int, index: int) -> tuple[random.Random, np.random.Generator]:
    """The generators of shard ``index`` (structure, masks): independent of workers and other shards."""
    return random.Random(f"bertforge-prepare:{seed}:{index}"), np.random.default_rng([seed, index])


def special_ids(tok) -> SpecialIds:
    """A tokenizer's [CLS] / [SEP] / [MASK] ids and ``##`` flags, as masking needs them."""
    vocab = tok.vocab
    continuation = np.zeros(len(vocab), dtype=bool)
    continuation[[i for token, i in vocab.items() if token.startswith("##")]] = True
    return SpecialIds(cls=tok.cls_token_id, sep=tok.sep_token_id, mask=tok.mask_token_id,
                      vocab_size=len(vocab), continuation=continuation)


def passes(cfg: PrepareConfig) -> int:
    """Dupe passes actually built: without NSP the passes are identical token sequences, so with dynamic
    masking one is stored."""
    return 1 if not cfg.nsp and cfg.dynamic_masking else cfg.dupe_factor


def build_instances(pool: DocumentPool, cfg: PrepareConfig, special: SpecialIds, rng: random.Random,
                    mask_rng: np.random.Generator) -> InstanceBatch:
    """Google's main loop over one pool of tokenized documents, then static masks unless dynamic."""
    batch = create_instances(pool, max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob,
                             dupe_factor=passes(cfg), nsp=cfg.nsp, special=special, rng=rng)
    if not cfg.dynamic_masking:  # static masks, drawn per instance: fresh for every dupe pass (the paper)
        batch = mask_batch(batch, special, cfg.masking, mask_rng)
    return batch


def _instance_stats(batch: InstanceBatch, cfg: PrepareConfig, special: SpecialIds) -> dict[str, Any]:
    npred = np.diff(batch.mask_offsets)
    at = batch.input_ids[np.repeat(batch.offsets[:-1], npred) + batch.masked_positions]
    # A random replacement that happens to draw the original token counts as "keep" (1 in V).
    mask = int((at == special.mask).sum())
    keep = int(((at == batch.masked_labels) & (at != special.mask)).sum())
    return {
        "not_next": int(batch.next_sentence.sum()),
        "length_histogram": np.bincount(batch.lengths(), minlength=cfg.max_seq_length + 1).tolist(),
        "predictions_histogram": np.bincount(npred, minlength=cfg.max_predictions_per_seq + 1).tolist(),
        "replacements": {"mask": mask, "random": len(at) - mask - keep, "keep": keep},
    }


def build_shard(task: _ShardJob) -> dict[str, Any]:
    """Tokenize one window, build its instances, write its shard; return the sidecar entry."""
    t0 = time.perf_counter()
    cfg = task.config
    tok = _tokenizer(task.tokenizer_dir)
    special = special_ids(tok)
    sentences_per_doc = [doc.sentences() for doc in task.documents]
    flat = [s for doc in sentences_per_doc for s in doc]
    pool = DocumentPool.from_sentences(tok.encode_batch_ids(flat), [len(d) for d in sentences_per_doc])
    batch = build_instances(pool, cfg, special, *shard_rngs(cfg.seed, task.index))
    notes = []
    if cfg.nsp and len(pool) == 1:
        notes.append(f"shard {task.index}: its window holds a single document, so every NotNext segment B "
                     f"is drawn from that same document (raise {option('shard_chars')}, or give more documents)")
    counts = pool.sentence_counts()
    info = {
        "index": task.index,
        "fingerprint": task.fingerprint,
        "documents": len(pool),
        "one_sentence_documents": int((counts == 1).sum()),
        "sentences": int(counts.sum()),
        "input_tokens": len(pool.tokens),
        "seconds": 0.0,
        "warnings": notes,
        **_instance_stats(batch, cfg, special),
    }
    info["seconds"] = round(time.perf_counter() - t0, 3)
    return write_shard(Path(task.out_dir) / shard_name(task.index), batch, vocab_size=special.vocab_size,
                       vocab_hash=tok.vocab_hash, info=info)


# ------------------------------------------------------------------------------ the driver
def _windows(docs: Iterator[RawDocument], shard_chars: int) -> Iterator[list[RawDocument]]:
    window: list[RawDocument] = []
    size = 0
    for doc in docs:
        window.append(doc)
        size += sum(len(t) for t in doc.texts)
        if size >= shard_chars:
            yield window
            window, size = [], 0
    if window:
        yield window


def _finished(out: Path, index: int, fingerprint: str) -> dict[str, Any] | None:
    sidecar = (out / shard_name(index)).with_suffix(".json")
    if not sidecar.is_file() or not (out / shard_name(index)).is_file():
        return None
    try:
        entry = json.loads(sidecar.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return entry if entry.get("fingerprint") == fingerprint else None


def prepare(inputs: list[str | Path], out_dir: str | Path, tokenizer: str | Path, config: PrepareConfig | None = None,
            *, workers: int = 1, num_shards: int = 1, shard_index: int = 0, progress: bool = True) -> dict[str, Any]:
    """Prepare pre-training shards from ``inputs`` into ``out_dir`` with the tokenizer of a checkpoint or
    vocab folder; return the manifest. This call builds the windows whose index is ``shard_index``
    modulo ``num_shards``. Inputs too small for any instance are a ``ValueError``."""
    from bertforge.text.tokenizer import BertTokenizer

    cfg = config or PrepareConfig()
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1 (the machines the work is split across), got {num_shards}")
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index must be in [0, {num_shards}) (one of the {option('num_shards')} parts), got "
                         f"{shard_index}")
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be in [1, {MAX_WORKERS}] (processes on this machine), got "
                         f"{HugeNumber.shown(workers)!r}")
    files = expand_inputs(inputs)
    tok = BertTokenizer.from_pretrained(tokenizer)
    tokenizer_dir = str(Path(tokenizer).resolve())
    settings = _settings(cfg, tok, files)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fingerprint = settings["fingerprint"] = _resumable_fingerprint(out, settings, cfg, files, tokenizer_dir)
    atomic_write_text(out / SETTINGS, json.dumps(settings, indent=1) + "\n")
    if passes(cfg) < cfg.dupe_factor:
        warnings.warn(f"no NSP with dynamic masking: the {cfg.dupe_factor} dupe passes would be identical copies, "
                      "so one is stored (the loader masks afresh every epoch; train more epochs instead)",
                      stacklevel=2)

    corpus = CorpusStats()
    total_windows = 0
    shards = _Progress(progress)
    pool = _worker_pool(workers)
    pending: collections.deque = collections.deque()
    try:
        for index, window in enumerate(_windows(iter_documents(files, fmt=cfg.format, text_field=cfg.text_field,
                                                               stats=corpus), cfg.shard_chars)):
            total_windows = index + 1
            if index % num_shards != shard_index:
                continue
            finished = _finished(out, index, fingerprint)
            if finished is not None:
                shards.record(finished)
                continue
            task = _ShardJob(index, window, str(out), tokenizer_dir, cfg, fingerprint)
            if pool is None:
                shards.record(build_shard(task))
                continue
            pending.append(pool.apply_async(build_shard, (task,)))
            while len(pending) >= 2 * workers:  # bounded: at most 2 windows per worker in flight
                shards.record(pending.popleft().get())
        while pending:
            shards.record(pending.popleft().get())
    finally:
        if pool is not None:
            pool.terminate()
        shards.bar.close()
    manifest = _checked_manifest(out, settings, corpus, total_windows, files, cfg)
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    if progress:
        shards.log_summary(manifest)
    return manifest


def _settings(cfg: PrepareConfig, tok: Any, files: list[Path]) -> dict[str, Any]:
    """settings.json: what the shards of a folder are made with and of, and its fingerprint."""
    # Name and size, not the path: machines that mount the corpus elsewhere can share a folder.
    input_files = [[f.name, f.stat().st_size] for f in files]
    return {"format": "bertforge-pretraining-v1", "config": dataclasses.asdict(cfg),
            "vocab_hash": tok.vocab_hash, "vocab_size": tok.vocab_size, "normalization": tok.normalization,
            "fingerprint": cfg.fingerprint(tok.vocab_hash, input_files, tok.normalization),
            "inputs": [str(f) for f in files], "input_files": input_files}


def _resumable_fingerprint(out: Path, settings: dict[str, Any], cfg: PrepareConfig, files: list[Path],
                           tokenizer_dir: str) -> str:
    """The fingerprint this run's shards carry in ``out``: ``settings``', or that of a folder prepared
    before the normalisation was recorded. A folder prepared otherwise is a ValueError naming what differs."""
    fingerprint, vocab_hash, normalization = settings["fingerprint"], settings["vocab_hash"], settings["normalization"]
    settings_path = out / SETTINGS
    if not settings_path.is_file():
        return fingerprint
    old = json.loads(settings_path.read_text(encoding="utf-8"))
    # kept for an older folder's shards once shown to be what this tokenizer makes
    earlier = _digest(cfg, vocab_hash, settings["input_files"])
    if old.get("fingerprint") == earlier and old.get("normalization", normalization) == normalization:
        if "normalization" not in old:
            _check_unrecorded_normalization(out, files, cfg, tokenizer_dir, earlier)
        return earlier
    if old.get("fingerprint") != fingerprint:
        diff = [k for k in settings["config"] if old.get("config", {}).get(k) != settings["config"][k]]
        if old.get("vocab_hash") != vocab_hash:
            diff.append("vocab")
        if "normalization" in old and old["normalization"] != normalization:
            diff.append("tokenizer normalization")
        raise ValueError(f"{out} holds data prepared with other settings ({', '.join(diff) or 'inputs'}); "
                         "use a new output folder")
    return fingerprint


class _Progress:
    """The shards of this run as they come in (built, or found finished): a progress bar, their warnings."""

    def __init__(self, show: bool) -> None:
        self.entries: dict[int, dict[str, Any]] = {}
        self.t0 = time.perf_counter()
        self.bar = progress_bar(desc="prepare", unit=" docs", disable=not show)
        self.done_tokens = 0

    def record(self, entry: dict[str, Any]) -> None:
        self.entries[entry["index"]] = entry
        for note in entry.get("warnings", ()):
            warnings.warn(note, stacklevel=3)  # where `prepare` was called
        self.done_tokens += entry["input_tokens"]
        self.bar.update(entry["documents"])
        elapsed = time.perf_counter() - self.t0
        self.bar.set_postfix(shards=len(self.entries), instances=sum(e["instances"] for e in self.entries.values()),
                             tok_s=f"{self.done_tokens / max(elapsed, 1e-9):,.0f}")

    def log_summary(self, manifest: dict[str, Any]) -> None:
        elapsed = time.perf_counter() - self.t0
        logger.info(f"prepare: {len(self.entries)} shards this run, {self.done_tokens:,} input tokens in "
                    f"{elapsed:.1f} s ({self.done_tokens / max(elapsed, 1e-9):,.0f} tokens/s); "
                    f"manifest {'complete' if manifest['complete'] else 'partial'}")


def _worker_pool(workers: int) -> Any:
    """A pool of ``workers`` spawned processes (None for one worker: shards are built in this process)."""
    if workers == 1:
        return None
    # Single-threaded workers (tokenizers' threads would oversubscribe the cores), set while spawning.
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return mp.get_context("spawn").Pool(workers)
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _checked_manifest(out: Path, settings: dict[str, Any], corpus: CorpusStats, total_windows: int,
                      files: list[Path], cfg: PrepareConfig) -> dict[str, Any]:
    """The manifest of ``out``, or a ValueError saying why the inputs gave nothing to train on."""
    if total_windows == 0:
        raise ValueError(f"{_names(files)}: no documents to prepare ({_input_counts(corpus)})")
    manifest = _build_manifest(out, settings, corpus, total_windows)
    if manifest["complete"] and manifest["totals"]["instances"] == 0:
        t = manifest["totals"]
        raise ValueError(f"{_names(files)}: no {'sentence pairs' if cfg.nsp else 'instances'} could be built: "
                         f"{t['documents']} document(s) with tokens, {t['sentences']} sentence(s), "
                         f"{t['input_tokens']} token(s) (read: {_input_counts(corpus)}); give more text")
    return manifest


def _check_unrecorded_normalization(out: Path, files: list[Path], cfg: PrepareConfig, tokenizer_dir: str,
                                    fingerprint: str) -> None:
    """Establish that the finished shards of ``out``, prepared before the tokenizer's normalisation was
    recorded, are what the tokenizer in ``tokenizer_dir`` makes, or raise a ValueError. A window where a
    setting not yet established shows (flipping it changes the ids) is rebuilt and must equal its shard."""
    import tempfile

    from bertforge.text.tokenizer import CJK_RANGES, BertTokenizer

    current = _tokenizer(tokenizer_dir)
    norm = current.normalization
    cjk = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in CJK_RANGES) + "]")
    shows = {"do_lower_case": lambda text: text != text.lower(),
             "strip_accents": lambda text: not text.isascii(),
             "tokenize_chinese_chars": lambda text: cjk.search(text) is not None}
    finished = {i: e for i in range(_last_index(out) + 1) if (e := _finished(out, i, fingerprint)) is not None}
    doubt, rebuilt, last = set(norm), 0, max(finished, default=-1)
    described = ", ".join(f"{k}={v}" for k, v in norm.items())
    with tempfile.TemporaryDirectory(prefix="bertforge-prepare-") as tmp:
        docs = iter_documents(files, fmt=cfg.format, text_field=cfg.text_field, stats=CorpusStats())
        for index, window in enumerate(_windows(docs, cfg.shard_chars)):
            if not doubt or index > last:
                break
            if index not in finished:
                continue
            text = "\n".join(t for doc in window for t in doc.texts)
            candidates = [k for k in sorted(doubt) if shows[k](text)]
            if not candidates:
                continue
            sentences = [s for doc in window for s in doc.sentences()]
            ids = current.encode_batch_ids(sentences)
            showing = set()
            for k in candidates:
                flipped = BertTokenizer.from_pretrained(tokenizer_dir, split_special_tokens=True,
                                                        **{**norm, k: not norm[k]})
                if flipped.encode_batch_ids(sentences) != ids:
                    showing.add(k)
            if not showing:
                continue
            entry = build_shard(_ShardJob(index, window, tmp, tokenizer_dir, cfg, fingerprint))
            rebuilt += 1
            if entry["sha256"] != finished[index]["sha256"]:
                raise ValueError(f"{out}: prepared by an earlier version that did not record the tokenizer's "
                                 f"normalization, and {entry['file']} made again with this tokenizer ({described}) "
                                 "differs from it: pass the tokenizer the data was prepared with (the same "
                                 "vocab.txt and do_lower_case / strip_accents / tokenize_chinese_chars), or prepare "
                                 "into a new output folder")
            doubt -= showing
    logger.info(f"prepare: {out} was prepared before the tokenizer's normalization was recorded; its "
                f"{len(finished)} finished shard(s) are what this tokenizer ({described}) makes ({rebuilt} rebuilt "
                "to check): adding to it")


def _last_index(out: Path) -> int:
    """The highest shard index with a file in ``out`` (-1: none)."""
    names = (re.fullmatch(r"shard-(\d+)\.json", p.name) for p in out.glob("shard-*.json"))
    return max((int(m.group(1)) for m in names if m), default=-1)


def _names(files: list[Path]) -> str:
    return ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def _input_counts(corpus: CorpusStats) -> str:
    """What reading the input met, for an error that says why nothing came of it."""
    parts = [f"{corpus.files} file(s), {corpus.documents} document(s), {corpus.characters:,} characters"]
    if corpus.empty_documents:
        parts.append(f"{corpus.empty_documents} empty or blank document(s)")
    if corpus.long_lines_skipped:
        parts.append(f"{corpus.long_lines_skipped} line(s) over the limit of {MAX_LINE_CHARS:,} characters skipped "
                     f"(first at {corpus.first_problem.get('long_lines_skipped', '?')})")
    if corpus.invalid_utf8_lines:
        parts.append(f"{corpus.invalid_utf8_lines} line(s) of invalid UTF-8")
    if corpus.bad_json_records:
        parts.append(f"{corpus.bad_json_records} bad JSON record(s) "
                     f"(first at {corpus.first_problem.get('bad_json_records', '?')})")
    return ", ".join(parts)


def _build_manifest(out: Path, settings: dict[str, Any], corpus: CorpusStats, total: int) -> dict[str, Any]:
    entries = {index: _finished(out, index, settings["fingerprint"]) for index in range(total)}
    shards = [e for e in entries.values() if e is not None]
    missing = [index for index, e in entries.items() if e is None]
    L = settings["config"]["max_seq_length"] + 1
    P = settings["config"]["max_predictions_per_seq"] + 1
    totals: dict[str, Any] = {
        "shards": len(shards),
        **{k: sum(e[k] for e in shards) for k in _COUNTS},
        "length_histogram": np.sum([e["length_histogram"] for e in shards], axis=0).tolist() if shards else [0] * L,
        "predictions_histogram": (np.sum([e["predictions_histogram"] for e in shards], axis=0).tolist()
                                  if shards else [0] * P),
        "replacements": dict(sum((collections.Counter(e["replacements"]) for e in shards), collections.Counter())),
    }
    return {**settings, "complete": not missing, "missing_shards": missing, "total_shards": total,
            "corpus": dataclasses.asdict(corpus), "totals": totals, "shards": shards}


def load_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest.json of a prepared folder, checked: every key read later is present with the right
    type, else a `ShardError` naming the file and the key (``shards[3].sha256``)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ShardError(f"{folder}: no {MANIFEST} (not a prepared dataset, or prepare has not finished)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{path}: corrupt manifest ({e})") from e

    count, number = "a whole number", "a number"
    kinds: dict[str, Any] = {count: (int,), number: (int, float), "true or false": (bool,), "a string": (str,),
                             "a list": (list,), "an object": (dict,)}
    top = {"format": "a string", "vocab_hash": "a string", "vocab_size": count, "complete": "true or false",
           "missing_shards": "a list", "total_shards": count, "config": "an object", "totals": "an object",
           "corpus": "an object", "shards": "a list"}
    config = {"max_seq_length": count, "max_predictions_per_seq": count, "masked_lm_prob": number,
              "mask_token_prob": number, "random_token_prob": number, "whole_word_mask": "true or false",
              "dupe_factor": count, "nsp": "true or false", "dynamic_masking": "true or false"}
    totals = {**dict.fromkeys(("shards", *_COUNTS), count),
              "length_histogram": "a list", "predictions_histogram": "a list", "replacements": "an object"}
    corpus = dict.fromkeys(("files", "documents", "invalid_utf8_lines", "long_lines_skipped", "empty_documents",
                            "bad_json_records"), count)
    shard = {"file": "a string", "sha256": "a string", "instances": count}

    def check(obj: Any, keys: dict[str, str], where: str) -> None:
        for key, kind in keys.items():
            name = f"{where}{key}"
            if key not in obj:
                raise ShardError(f"{path}: {name} is missing (re-run `bertforge prepare` to rewrite the manifest)")
            value = obj[key]
            if (isinstance(value, bool) and kind != "true or false") or not isinstance(value, kinds[kind]):
                raise ShardError(f"{path}: {name} must be {kind}, got {json.dumps(value)[:80]}")

    if not isinstance(manifest, dict):
        raise ShardError(f"{path}: corrupt manifest (expected a JSON object)")
    check(manifest, top, "")
    check(manifest["config"], config, "config.")
    check(manifest["totals"], totals, "totals.")
    check(manifest["corpus"], corpus, "corpus.")
    for i, entry in enumerate(manifest["shards"]):
        if not isinstance(entry, dict):
            raise ShardError(f"{path}: shards[{i}] must be an object, got {json.dumps(entry)[:80]}")
        check(entry, shard, f"shards[{i}].")
    return manifest


def format_stats(manifest: dict[str, Any]) -> str:
    """A readable summary of what was written, to compare with Google's script's output."""
    t = manifest["totals"]
    n = max(t["instances"], 1)
    lengths = np.array(t["length_histogram"])
    preds = np.array(t["predictions_histogram"])
    rep = t["replacements"]
    n_rep = max(sum(rep.values()), 1)
    cfg = manifest["config"]
    full = int(lengths[cfg["max_seq_length"]])
    mean_len = float((lengths * np.arange(len(lengths))).sum() / n)
    mean_pred = float((preds * np.arange(len(preds))).sum() / n)
    c = manifest["corpus"]
    lines = [
        f"shards {t['shards']}/{manifest['total_shards']}{'' if manifest['complete'] else ' (incomplete)'}; "
        f"instances {t['instances']:,}; tokens {t['tokens']:,} from {t['input_tokens']:,} input tokens "
        f"(dupe_factor {cfg['dupe_factor']})",
        f"documents {t['documents']:,} ({t['one_sentence_documents']:,} of one sentence); sentences {t['sentences']:,}",
        f"NotNext share {t['not_next'] / n:.3f}" if cfg["nsp"] else "no NSP (packed sentences)",
        f"length: mean {mean_len:.1f}, full-length ({cfg['max_seq_length']}) {full / n:.1%}, "
        f"<= half {lengths[: cfg['max_seq_length'] // 2 + 1].sum() / n:.1%}",
        f"masked positions per instance: mean {mean_pred:.2f}, max {int(np.nonzero(preds)[0].max()) if preds.any() else 0}",
        f"replacements: [MASK] {rep.get('mask', 0) / n_rep:.3f}, random {rep.get('random', 0) / n_rep:.3f}, "
        f"unchanged {rep.get('keep', 0) / n_rep:.3f}" if not cfg["dynamic_masking"] else "masking: dynamic (in the loader)",
        f"input: {c['files']} files, {c['documents']:,} documents; invalid UTF-8 lines {c['invalid_utf8_lines']}, "
        f"long lines skipped {c['long_lines_skipped']}, empty documents {c['empty_documents']}, "
        f"bad JSON records {c['bad_json_records']}",
    ]
    for kind, where in c.get("first_problem", {}).items():
        lines.append(f"  first {kind.replace('_', ' ')}: {where}")
    return "\n".join(lines)
