"""``bertforge features``: contextual token vectors and sentence embeddings from a BERT checkpoint,
as the TF release's ``extract_features.py`` computes them (the paper's feature-based approach). Inputs
longer than ``max_seq_length`` are cut into windows, each token's vector taken from the window where it
has the most context. The user guide: docs/finetuning.md, "Feature extraction".

Files, by suffix:

- ``.jsonl``: Google's layout, a line ``{"linex_index", "features": [{"token", "layers": [{"index",
  "values"}, ...]}, ...]}`` per input, values rounded to 6 decimals (``combine="sum"``: one entry per
  token, whose ``index`` lists the layers summed). Pooled: ``{"linex_index", "pooling", "layers", "values"}``.
- ``.npy``: ``OUT.npy`` float32 (total_tokens, D), every input's tokens in input order; ``OUT.offsets.npy``
  int64 (N + 1,): input ``i`` is rows ``offsets[i]:offsets[i + 1]``; ``OUT.token_ids.npy`` int32. Pooled:
  ``OUT.npy`` (N, D).
- ``.safetensors``: the same arrays as tensors ``features``, ``offsets`` and ``token_ids``, with the
  settings in its metadata (``layers``, ``combine``, ``pooling``, ``hidden_size``).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import struct
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from bertforge.console import progress_bar
from bertforge.io import atomic_path, open_binary
from bertforge.fast import frozen_weights, speed_up
from bertforge.fast.int8 import int8_weights
from bertforge.model.bert import BertModel
from bertforge.model.heads import resolve_layers
from bertforge.tasks.encoding import Windows, max_context_window, window_starts
from bertforge.settings import check_settings, option, setting
from bertforge.train.precision import InferencePrecision, autocast, check_precision, resolve_precision

__all__ = ["FeatureSettings", "Extracted", "Written", "extract_features", "write_features", "embed", "read_inputs",
           "split_pair", "parse_layers", "output_format", "POOLINGS", "Pooling", "check_pooling", "SUFFIXES",
           "DEFAULT_LAYERS"]

logger = logging.getLogger("bertforge")

DEFAULT_LAYERS = (-1, -2, -3, -4)
DEFAULT_MAX_SEQ_LENGTH = 128  # the TF script's; lowered to the model's positions when it has fewer
Combine = Literal["concat", "sum"]
Pooling = Literal["mean", "cls", "pooler"]
POOLINGS: tuple[str, ...] = typing.get_args(Pooling)
SUFFIXES = (".jsonl", ".npy", ".safetensors")
_CHUNK_BYTES = 256 << 20  # float32 vectors held at once (one chunk of inputs)
_ENCODE_BATCH = 4096  # texts per call to the tokenizer


# ---------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class FeatureSettings:
    """Which vectors to take and how inputs run through the model (checked when made)."""

    layers: tuple[int, ...] | None = None
    """comma-separated hidden-state indexes: -1 the last layer, 0 the embedding output (none: -1,-2,-3,-4, or -1
    alone with pooling)"""
    combine: Combine = "concat"
    """put the layers side by side (concat) or add them up (sum)"""
    pooling: Pooling | None = None
    """one vector per input: its tokens' mean, the vector at [CLS] (not for left-to-right models), or the trained
    pooler's output, as sentence heads read it (at [CLS]; a left-to-right model's at its last token); none: a
    vector per token"""
    max_seq_length: int | None = setting(None, at_least=4)
    """tokens per forward pass; longer inputs are cut into windows (none: 128, or the model's positions if fewer)"""
    stride: int = setting(0, at_least=0)
    """tokens between window starts (0: half a window)"""
    batch_size: int = setting(32, at_least=1)
    """sequences per forward pass"""
    precision: InferencePrecision = "fp32"
    """auto, fp32, bf16, fp16 (CUDA) or int8 (CPU), resolved for the device (`bertforge.train.precision`)"""
    device: str = "auto"
    """where a checkpoint runs: auto, cpu, cuda or cuda:K (`embed` runs on its model's device)"""
    progress: bool = False
    """show a progress bar on stderr"""

    def __post_init__(self) -> None:
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))  # any sequence given, held as a tuple
        check_precision(self.precision, inference=True)
        check_settings(self)


def _settings(settings: FeatureSettings | None, options: dict[str, Any], base: FeatureSettings) -> FeatureSettings:
    """``settings`` (default ``base``) with the fields named in ``options`` replaced."""
    settings = settings if settings is not None else base
    return replace(settings, **options) if options else settings


# ---------------------------------------------------------------------------- input
def split_pair(line: str) -> tuple[str, str | None]:
    """A line as the TF script reads it: stripped; ``a ||| b`` (the last `` ||| ``) is a pair."""
    line = line.strip()
    a, sep, b = line.rpartition(" ||| ")
    return (a, b) if sep else (line, None)


def read_inputs(path: str | Path) -> list[tuple[str, str | None]]:
    """Every line of a UTF-8 text file (``-``: stdin) as (text_a, text_b or None), blank lines included."""
    name = "<stdin>" if str(path) == "-" else str(path)
    out: list[tuple[str, str | None]] = []
    with (contextlib.nullcontext(sys.stdin.buffer) if str(path) == "-" else open_binary(path)) as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{name}, line {lineno}: invalid UTF-8 ({raw[e.start:e.start + 4]!r}); "
                                 "the input must be UTF-8 text") from None
            out.append(split_pair(line.removeprefix("\ufeff") if lineno == 1 else line))
    if not out:
        raise ValueError(f"{name}: no input (the file is empty)")
    return out


def parse_layers(spec: str) -> tuple[int, ...]:
    """``"-1,-2,-3,-4"`` -> (-1, -2, -3, -4)."""
    try:
        return tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(f"layers must be comma-separated integers such as -1,-2,-3,-4, got {spec!r}") from None


# ---------------------------------------------------------------------------- windows
@dataclass
class _Window:
    """One forward pass over (part of) an input and which of its vectors the input keeps."""

    ids: np.ndarray  # (t,) [CLS] ... [SEP]
    num_a: int  # tokens of segment 0
    src: np.ndarray  # positions in the window whose vectors are kept
    dest: np.ndarray  # their positions in the input's token sequence


def _windows(a: np.ndarray, b: np.ndarray | None, cls: int, sep: int, max_len: int, stride: int,
             index: int) -> tuple[np.ndarray, list[_Window]]:
    """The input's tokens ``[CLS] a [SEP] (b [SEP])`` and the windows covering them; a pair's shorter
    segment stays whole in every window, [CLS] comes from the first and the final [SEP] from the last."""
    parts = [[cls], a, [sep]] + ([b, [sep]] if b is not None else [])
    seq = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    n, n_a = len(seq), len(a) + 2
    pos = np.arange(n)
    if n <= max_len:
        return seq, [_Window(seq, n_a, pos, pos)]
    piece_in_a = b is None or len(a) > len(b)  # the shorter segment of a pair (a on ties) stays whole
    room = max_len - (2 if b is None else 3)
    if b is not None:
        short = len(b) if piece_in_a else len(a)
        if short > room // 2:
            raise ValueError(f"input {index}: a pair of {len(a)} + {len(b)} tokens whose shorter segment is longer "
                             f"than half a window ({room // 2} tokens at max_seq_length {max_len}); raise "
                             "max_seq_length")
        room -= short
    if piece_in_a:  # a single text is one long segment between [CLS] and [SEP]
        pre, long, post = pos[:1], pos[1:n_a - 1], pos[n_a - 1:]
    else:
        pre, long, post = pos[:n_a], pos[n_a:-1], pos[-1:]
    step = stride or max(1, room // 2)
    if step > room:
        raise ValueError(f"stride {stride} is longer than a window's room ({room} tokens): tokens between "
                         "windows would be skipped")
    m = len(long)
    starts = np.array(window_starts(m, room, step), dtype=np.int64)
    # The max-context rule: each token of the cut segment keeps the window where it sits most centrally.
    owner = max_context_window(starts, np.minimum(starts + room, m) - starts, np.arange(m))
    windows = []
    for k, s in enumerate(starts):
        j = np.arange(s, min(s + room, m))
        where = np.concatenate([pre, long[j], post])
        keep = np.concatenate([np.full(len(pre), k == 0), owner[j] == k, np.full(len(post), k == len(starts) - 1)])
        src = np.flatnonzero(keep)
        windows.append(_Window(seq[where], len(j) + 2 if piece_in_a else n_a, src, where[src]))
    return seq, windows


# ---------------------------------------------------------------------------- the model pass
@dataclass
class _Spec:
    """`FeatureSettings` made concrete for one model on one device."""

    settings: FeatureSettings
    layers: tuple[int, ...]  # the indexes as given, or the default ones
    positions: list[int]  # the same layers as positions in hidden_states
    max_seq_length: int
    precision: str  # resolved: fp32, bf16, fp16 or int8
    device: torch.device
    dim: int
    pooled_at: int  # the token a cls / pooler pooling reads: 0 ([CLS]), or -1 (a left-to-right model's last)


def _collate(windows: list[_Window], device: torch.device) -> dict[str, torch.Tensor]:
    batch = Windows([w.ids for w in windows], np.array([w.num_a for w in windows]), np.zeros(len(windows)),
                    len(windows)).collate(range(len(windows)))
    return {k: t.to(device) for k, t in batch.items()}


def _run_chunk(model: BertModel, inputs: list[tuple[np.ndarray, np.ndarray | None]], items: list[int],
               spec: _Spec, cls: int, sep: int, bar: Any) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(input index, token ids, (n, D) vectors) of ``items``, in order."""
    seqs, windows, owners = [], [], []
    for k, i in enumerate(items):
        seq, wins = _windows(*inputs[i], cls, sep, spec.max_seq_length, spec.settings.stride, i)
        seqs.append(seq)
        windows += wins
        owners += [k] * len(wins)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
    vectors = np.empty((int(offsets[-1]), spec.dim), dtype=np.float32)
    order = np.argsort([len(w.ids) for w in windows], kind="stable")  # similar lengths batch together
    amp = autocast(spec.precision, spec.device)
    batch_size = spec.settings.batch_size
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        batch = [windows[w] for w in chosen]
        rows = np.concatenate([np.full(len(w.src), r) for r, w in enumerate(batch)])  # the kept (window, position)s
        cols = np.concatenate([w.src for w in batch])
        dest = np.concatenate([offsets[owners[w]] + windows[w].dest for w in chosen])  # their rows in `vectors`
        with torch.inference_mode(), amp:
            hidden = model(**_collate(batch, spec.device), output_hidden_states=True).hidden_states  # L+1 x (B, T, H)
            r, c = torch.from_numpy(rows).to(spec.device), torch.from_numpy(cols).to(spec.device)
            picked = [hidden[layer][r, c].float() for layer in spec.positions]  # each (R, H)
            out = torch.cat(picked, -1) if spec.settings.combine == "concat" else torch.stack(picked).sum(0)
        vectors[dest] = out.cpu().numpy()
        if bar is not None:
            bar.update(len(dest))
    for k, i in enumerate(items):
        yield i, seqs[k], vectors[offsets[k]:offsets[k + 1]]


def _length(a: np.ndarray, b: np.ndarray | None) -> int:
    return len(a) + 2 + (len(b) + 1 if b is not None else 0)


def _run(model: BertModel, inputs: list[tuple[np.ndarray, np.ndarray | None]], spec: _Spec, cls: int, sep: int,
         add: Callable[[int, np.ndarray, np.ndarray], None]) -> None:
    """Every input's vectors (pooled when asked) handed to ``add(index, token_ids, vectors)`` in input order."""
    bar = None
    pooling = spec.settings.pooling
    if spec.settings.progress:
        bar = progress_bar(total=sum(_length(*x) for x in inputs), desc="features", unit="tok")
    limit = max(spec.max_seq_length, _CHUNK_BYTES // (4 * spec.dim))

    def flush(items: list[int]) -> None:
        done = list(_run_chunk(model, inputs, items, spec, cls, sep, bar))
        if pooling == "mean":
            pooled = [vectors.mean(0, dtype=np.float64).astype(np.float32) for _, _, vectors in done]
        elif pooling:
            pooled = [vectors[spec.pooled_at] for _, _, vectors in done]
            if pooling == "pooler" and done:
                pooled = list(_pool(model, np.stack(pooled), spec.precision))
        for k, (i, seq, vectors) in enumerate(done):
            add(i, seq, pooled[k] if pooling else vectors)

    with (frozen_weights(speed_up(model)), int8_weights(model, spec.precision == "int8"),
          bar or contextlib.nullcontext()):
        chunk: list[int] = []
        tokens = 0
        for i, x in enumerate(inputs):
            n = _length(*x)
            if chunk and tokens + n > limit:
                flush(chunk)
                chunk, tokens = [], 0
            chunk.append(i)
            tokens += n
        flush(chunk)


@torch.inference_mode()
def _pool(model: BertModel, vectors: np.ndarray, precision: str) -> np.ndarray:
    """The pooler's output (tanh of its dense layer) for the (N, H) vectors it reads."""
    pooler = model.pooler
    param = next(pooler.parameters())
    with autocast(precision, param.device):
        out = pooler(torch.from_numpy(vectors).to(param.device, param.dtype)[:, None])  # (N, 1, H) -> (N, H)
    return out.float().cpu().numpy()


# ---------------------------------------------------------------------------- setting up
class BertModelWithoutPooler(BertModel):
    """`BertModel` without the pooler features never use, so checkpoints without one load quietly."""

    def __init__(self, config: Any):
        super().__init__(config, add_pooling_layer=False)


@dataclass
class _Setup:
    model: BertModel
    tokenizer: Any
    inputs: list[tuple[np.ndarray, np.ndarray | None]]
    spec: _Spec
    windowed: int


def _encode(tok: Any, texts: Sequence[str | tuple[str, str | None]]) -> list[tuple[np.ndarray, np.ndarray | None]]:
    out: list[tuple[np.ndarray, np.ndarray | None]] = []
    for start in range(0, len(texts), _ENCODE_BATCH):
        part = [(t, None) if isinstance(t, str) else (t[0], t[1]) for t in texts[start:start + _ENCODE_BATCH]]
        ids_a = tok.encode_batch_ids([a for a, _ in part])
        pair_at = [k for k, (_, b) in enumerate(part) if b is not None]
        ids_b: dict[int, list[int]] = dict(zip(pair_at, tok.encode_batch_ids([part[k][1] for k in pair_at])))
        for k, a in enumerate(ids_a):
            b = ids_b.get(k)
            out.append((np.asarray(a, dtype=np.int32), None if b is None else np.asarray(b, dtype=np.int32)))
    return out


def check_pooling(model: BertModel, settings: FeatureSettings, what: str, loaded: Any = None) -> None:
    """A left-to-right model's [CLS] has seen nothing after itself: its "cls" pooling is refused; "pooler"
    needs a trained pooler (not one ``loaded``, the model ``model`` is part of, made fresh when it loaded) and
    reads the last layer alone."""
    pooling, causal = settings.pooling, model.config.is_decoder
    trained = _trained_pooler(model, model if loaded is None else loaded)
    if pooling == "cls" and causal:
        raise ValueError(f"{what}: a left-to-right model (config is_decoder: true), whose [CLS] vector has seen "
                         "[CLS] alone and nothing of the text, so pooling cls carries no sentence; use pooling mean"
                         + (" (or pooler, which reads its last token)" if trained else ""))
    if pooling == "pooler" and not trained:
        raise ValueError(f"{what} has no trained pooler; use pooling mean" + ("" if causal else " or cls"))
    if pooling == "pooler" and settings.layers not in (None, (-1,)):
        raise ValueError(f"pooling pooler reads the last layer, not layers {','.join(map(str, settings.layers))}: "
                         f"leave {option('layers')} unset")


def _trained_pooler(model: BertModel, loaded: Any) -> bool:
    """Whether ``model`` has a pooler its checkpoint trained (not one made fresh when ``loaded`` loaded)."""
    report = getattr(loaded, "load_report", None)
    fresh = report.newly_initialized if report is not None else []
    return getattr(model, "pooler", None) is not None and not any("pooler." in k for k in fresh)


def _resolve(settings: FeatureSettings, config: Any, device: torch.device | str) -> _Spec:
    """``settings`` for a model of ``config`` on ``device`` (a name: set up once the settings fit)."""
    from bertforge.train.distributed import setup

    max_seq_length = settings.max_seq_length
    if max_seq_length is None:
        max_seq_length = min(DEFAULT_MAX_SEQ_LENGTH, config.max_position_embeddings)
    elif max_seq_length > config.max_position_embeddings:
        raise ValueError(f"max_seq_length {max_seq_length} exceeds the model's {config.max_position_embeddings} "
                         "positions")
    layers = settings.layers if settings.layers is not None else ((-1,) if settings.pooling else DEFAULT_LAYERS)
    positions = resolve_layers(layers, config.num_hidden_layers)
    if isinstance(device, str):
        device = setup(device).device
    precision = resolve_precision(settings.precision, device, inference=True)
    dim = config.hidden_size * (len(positions) if settings.combine == "concat" else 1)
    pooled_at = -1 if settings.pooling == "pooler" and config.is_decoder else 0
    return _Spec(settings, layers, positions, max_seq_length, precision, device, dim, pooled_at)


def _setup(checkpoint: str | Path, texts: Sequence[str | tuple[str, str | None]], settings: FeatureSettings) -> _Setup:
    from bertforge.text.tokenizer import BertTokenizer

    if len(texts) == 0:
        raise ValueError("no texts to extract features from")
    model = (BertModel if settings.pooling == "pooler" else BertModelWithoutPooler).from_pretrained(checkpoint)
    check_pooling(model, settings, str(checkpoint))
    spec = _resolve(settings, model.config, settings.device)
    model.to(spec.device).eval()
    tok = BertTokenizer.from_pretrained(checkpoint)
    inputs = _encode(tok, texts)
    windowed = sum(_length(*x) > spec.max_seq_length for x in inputs)
    if windowed:
        logger.info("%d of %d inputs are longer than max_seq_length %d: cut into windows", windowed, len(inputs),
                    spec.max_seq_length)
    return _Setup(model, tok, inputs, spec, windowed)


# ---------------------------------------------------------------------------- results
@dataclass
class Extracted:
    """Features of N inputs, the arrays of the ``.npy`` layout (pooled: values only)."""

    values: np.ndarray
    offsets: np.ndarray | None
    token_ids: np.ndarray | None
    layers: tuple[int, ...]  # the indexes as given
    combine: str
    pooling: str | None
    hidden_size: int
    windowed: int = 0  # inputs longer than max_seq_length

    def __len__(self) -> int:
        return len(self.values) if self.offsets is None else len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        """Input i's (n_i, D) token vectors, or its (D,) pooled vector."""
        if self.offsets is None:
            return self.values[i]
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    @property
    def num_tokens(self) -> int:
        return len(self.values) if self.token_ids is not None else 0


def _layout(s: _Setup) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Name -> (dtype, shape) of the result's arrays."""
    N, D = len(s.inputs), s.spec.dim
    if s.spec.settings.pooling:
        return {"features": (np.dtype(np.float32), (N, D))}
    total = sum(_length(*x) for x in s.inputs)
    return {"features": (np.dtype(np.float32), (total, D)), "offsets": (np.dtype(np.int64), (N + 1,)),
            "token_ids": (np.dtype(np.int32), (total,))}


def _extract(s: _Setup, make: Callable[[str, np.dtype, tuple[int, ...]], np.ndarray]) -> Extracted:
    """The features of ``s`` in the arrays ``make(name, dtype, shape)`` provides (memory maps: flushed)."""
    arrays = {name: make(name, dtype, shape) for name, (dtype, shape) in _layout(s).items()}
    values, offsets, token_ids = arrays["features"], arrays.get("offsets"), arrays.get("token_ids")
    if offsets is not None:
        offsets[0] = 0
        np.cumsum([_length(*x) for x in s.inputs], out=offsets[1:])

    def add(i: int, seq: np.ndarray, vectors: np.ndarray) -> None:
        if offsets is None:
            values[i] = vectors
        else:
            a, b = offsets[i], offsets[i + 1]
            values[a:b] = vectors
            token_ids[a:b] = seq  # type: ignore[index]

    _run(s.model, s.inputs, s.spec, s.tokenizer.cls_token_id, s.tokenizer.sep_token_id, add)
    for array in arrays.values():
        if isinstance(array, np.memmap):
            array.flush()
    return Extracted(values, offsets, token_ids, s.spec.layers, s.spec.settings.combine, s.spec.settings.pooling,
                     s.model.config.hidden_size, s.windowed)


def extract_features(checkpoint: str | Path, texts: Sequence[str | tuple[str, str | None]],
                     settings: FeatureSettings | None = None, **options: Any) -> Extracted:
    """Token (or pooled) vectors of texts or (a, b) pairs, in memory; ``options`` override ``settings``."""
    s = _setup(checkpoint, texts, _settings(settings, options, FeatureSettings()))
    return _extract(s, lambda name, dtype, shape: np.zeros(shape, dtype=dtype))


def embed(model: BertModel, tokenizer: Any, texts: Sequence[str | tuple[str, str | None]],
          settings: FeatureSettings | None = None, **options: Any) -> np.ndarray:
    """(N, D) float32 pooled vectors of ``texts`` from a `BertModel` already loaded, on its device."""
    settings = _settings(settings, options, FeatureSettings(pooling="mean"))
    if settings.pooling is None:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got None")
    check_pooling(model, settings, f"this {type(model).__name__}")
    spec = _resolve(settings, model.config, next(model.parameters()).device)
    s = _Setup(model, tokenizer, _encode(tokenizer, texts), spec, windowed=0)
    return _extract(s, lambda name, dtype, shape: np.zeros(shape, dtype=dtype)).values


# ---------------------------------------------------------------------------- files
def _jsonl(s: _Setup, out: Path) -> list[Path]:
    spec, H = s.spec, s.model.config.hidden_size
    layers, pooling = spec.layers, spec.settings.pooling
    tokens = s.tokenizer.convert_ids_to_tokens
    # A token's entries: one per layer (concat), or one for the layers summed; (index, the row's values).
    groups = ([(list(layers), slice(None))] if spec.settings.combine == "sum"
              else [(given, slice(k * H, (k + 1) * H)) for k, given in enumerate(layers)])

    def rounded(v: np.ndarray) -> list[float]:
        return [round(x, 6) for x in v.tolist()]  # as the TF script rounds: round(float(x), 6)

    with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        def add(i: int, seq: np.ndarray, vectors: np.ndarray) -> None:
            if pooling:
                record: dict[str, Any] = {"linex_index": i, "pooling": pooling, "layers": list(layers),
                                          "values": rounded(vectors)}
            else:
                record = {"linex_index": i, "features": [
                    {"token": token, "layers": [{"index": at, "values": rounded(row[part])} for at, part in groups]}
                    for token, row in zip(tokens(seq.tolist()), vectors)]}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

        _run(s.model, s.inputs, spec, s.tokenizer.cls_token_id, s.tokenizer.sep_token_id, add)
    return [out]


def _allocate_file(path: Path, header: bytes, size: int) -> None:
    """``header``, then ``size`` bytes allocated now: a full disk is ENOSPC at once, not a SIGBUS later."""
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + size)
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(f.fileno(), 0, len(header) + size)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                logger.debug("%s: blocks not allocated ahead (%s)", path, e)


def _npy(s: _Setup, out: Path) -> list[Path]:
    paths = {"features": out, "offsets": out.with_suffix(".offsets.npy"),
             "token_ids": out.with_suffix(".token_ids.npy")}

    def open_map(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.memmap:
        tmp = stack.enter_context(atomic_path(paths[name]))
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                      "fortran_order": False, "shape": shape})
        _allocate_file(tmp, header.getvalue(), dtype.itemsize * int(np.prod(shape)))
        return np.memmap(tmp, dtype=dtype, mode="r+", offset=header.tell(), shape=shape)

    with contextlib.ExitStack() as stack:
        _extract(s, open_map)
    return [paths[name] for name in _layout(s)]


_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32"}


def _safetensors(s: _Setup, out: Path) -> list[Path]:
    """The safetensors layout written by hand, so the tensors can be memory-mapped in place."""
    header: dict[str, Any] = {"__metadata__": {
        "format": "bertforge-features", "layers": ",".join(map(str, s.spec.layers)),
        "combine": s.spec.settings.combine, "pooling": s.spec.settings.pooling or "none",
        "hidden_size": str(s.model.config.hidden_size)}}
    begin = 0
    for name, (dtype, shape) in _layout(s).items():
        end = begin + dtype.itemsize * int(np.prod(shape))
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [begin, end]}
        begin = end
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    data_start = 8 + len(text)
    with atomic_path(out) as tmp:
        _allocate_file(tmp, struct.pack("<Q", len(text)) + text, begin)
        _extract(s, lambda name, dtype, shape: np.memmap(
            tmp, dtype=dtype.newbyteorder("<"), mode="r+", offset=data_start + header[name]["data_offsets"][0],
            shape=shape))
    return [out]


_WRITERS = {".jsonl": _jsonl, ".npy": _npy, ".safetensors": _safetensors}


@dataclass
class Written:
    """What `write_features` wrote."""

    files: list[Path]
    inputs: int
    tokens: int
    dim: int
    windowed: int

    def summary(self) -> str:
        windowed = f"; {self.windowed:,} inputs longer than max_seq_length were cut into windows"
        return (f"wrote {self.inputs:,} inputs ({self.tokens:,} tokens) as {self.dim}-value vectors to "
                + ", ".join(map(str, self.files)) + (windowed if self.windowed else ""))


def output_format(out: str | Path) -> str:
    """The format ``out``'s suffix names (``.jsonl``, ``.npy``, ``.safetensors``); anything else is an error."""
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{out}: unknown output format {suffix or '(no suffix)'!r}; name the file "
                         f"{' / '.join('*' + x for x in SUFFIXES)}")
    return suffix


def write_features(checkpoint: str | Path, texts: Sequence[str | tuple[str, str | None]], out: str | Path,
                   settings: FeatureSettings | None = None, **options: Any) -> Written:
    """`extract_features` streamed into ``out``: ``.jsonl``, ``.npy`` or ``.safetensors``."""
    out = Path(out)
    writer = _WRITERS[output_format(out)]
    s = _setup(checkpoint, texts, _settings(settings, options, FeatureSettings()))
    return Written(writer(s, out), len(s.inputs), sum(_length(*x) for x in s.inputs), s.spec.dim, s.windowed)
