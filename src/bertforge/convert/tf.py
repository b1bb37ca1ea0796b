"""Google's original TensorFlow BERT checkpoints, read without TensorFlow and converted to a checkpoint folder.

google-research/bert's checkpoints are TF 1 *tensor bundles* (``bert_model.ckpt.index`` +
``.data-00000-of-00001``): the ``.index`` is a LevelDB-style table (CRC-checked blocks) whose values
are ``BundleEntryProto`` messages, decoded by hand; a variable is ``size`` bytes at ``offset`` in a
data shard, CRC-checked on every read. Compressed blocks and partitioned variables are refused.

`convert_tf_checkpoint` maps Google's names to transformers' (dense kernels transposed, LayerNorm
``gamma`` / ``beta`` as ``weight`` / ``bias``); the release's ``"gelu"`` (the tanh form) is written as
``"gelu_new"``. See docs/interop.md.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from bertforge.model.checkpoint import (BIN_INDEX, BIN_NAME, SAFETENSORS_INDEX, SAFETENSORS_NAME, CheckpointError,
                                        save_pretrained, short_list)
from bertforge.model.config import BertConfig
from bertforge.model.heads import MODEL_CLASSES

if TYPE_CHECKING:
    import torch

__all__ = ["TFCheckpointReader", "TFConversionReport", "convert_tf_checkpoint", "find_tf_checkpoint", "load_tf_config",
           "bertforge_name", "google_name", "crc32c", "masked_crc32c"]

logger = logging.getLogger("bertforge")


# ---------------------------------------------------------------------------- CRC-32C
_CRC_CHUNK = 1 << 24  # bytes copied at a time: google-crc32c reads only immutable bytes


def crc32c(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """CRC-32C (Castagnoli) of ``data``'s bytes (an array's elements, in order), as TensorFlow's."""
    if isinstance(data, np.ndarray):
        buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    else:
        buf = np.frombuffer(data, dtype=np.uint8)
    crc = 0
    for start in range(0, buf.size, _CRC_CHUNK):
        crc = google_crc32c.extend(crc, buf[start:start + _CRC_CHUNK].tobytes())
    return crc


def masked_crc32c(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """The CRC-32C as TF stores it (``crc32c::Mask``: rotated right by 15, plus a constant)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------- the .index table
_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the 8-byte magic
_TRAILER_SIZE = 5  # after each block: compression type (1 byte) + masked CRC-32C (4 bytes)
_COMPRESSION = {0: None, 1: "snappy", 2: "zlib"}


def _varint(buf: bytes, pos: int, where: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise CheckpointError(f"{where}: malformed varint (corrupt file?)")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _block(raw: bytes, handle: bytes, path: Path) -> bytes:
    """The contents of the block a handle (varint offset, varint size) points at, checked."""
    offset, pos = _varint(handle, 0, str(path))
    size, _ = _varint(handle, pos, str(path))
    end = offset + size
    if end + _TRAILER_SIZE > len(raw) - _FOOTER_SIZE:
        raise CheckpointError(f"{path}: a block at byte {offset} runs past the end of the file (truncated?)")
    stored = int.from_bytes(raw[end + 1:end + _TRAILER_SIZE], "little")
    if masked_crc32c(memoryview(raw)[offset:end + 1]) != stored:
        raise CheckpointError(f"{path}: checksum mismatch in the block at byte {offset} (corrupt file)")
    kind = raw[end]
    if kind != 0:
        name = _COMPRESSION.get(kind) or f"type {kind}"
        raise CheckpointError(f"{path}: the block at byte {offset} is {name}-compressed; TensorFlow writes "
                              "checkpoint indexes uncompressed and only those are read")
    return raw[offset:end]


def _block_entries(block: bytes, path: Path) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) pairs of a block: each key shares a prefix with the one before it."""
    where = f"{path}: corrupt block"
    if len(block) < 4:
        raise CheckpointError(where)
    restarts = int.from_bytes(block[-4:], "little")
    limit = len(block) - 4 * (restarts + 1)  # the restart offsets only serve seeking: a scan skips them
    if limit < 0:
        raise CheckpointError(where)
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos, where)
        unshared, pos = _varint(block, pos, where)
        size, pos = _varint(block, pos, where)
        if shared > len(key) or pos + unshared + size > limit:
            raise CheckpointError(where)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + size]
        pos += size


def _table(path: Path) -> Iterator[tuple[bytes, bytes]]:
    raw = path.read_bytes()
    if len(raw) < _FOOTER_SIZE or int.from_bytes(raw[-8:], "little") != _TABLE_MAGIC:
        raise CheckpointError(f"{path}: not a TensorFlow checkpoint index (no table footer; truncated?)")
    footer = raw[-_FOOTER_SIZE:]
    _, pos = _varint(footer, 0, str(path))  # metaindex offset and size: TF writes an empty metaindex
    _, pos = _varint(footer, pos, str(path))
    for _, handle in _block_entries(_block(raw, footer[pos:], path), path):
        yield from _block_entries(_block(raw, handle, path), path)


# ---------------------------------------------------------------------------- protobuf messages
def _fields(buf: bytes, where: str) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a protobuf message: ints for varint / fixed fields, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos, where)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos, where)
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = int.from_bytes(buf[pos:pos + width], "little"), pos + width
        elif wire == 2:
            size, pos = _varint(buf, pos, where)
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise CheckpointError(f"{where}: unexpected protobuf wire type {wire} (corrupt index?)")
        if pos > len(buf):
            raise CheckpointError(f"{where}: truncated protobuf message (corrupt index?)")
        yield number, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# TF DataType enum -> (name, numpy dtype of the stored bytes, little-endian)
_DTYPES: dict[int, tuple[str, str]] = {
    1: ("float32", "<f4"), 2: ("float64", "<f8"), 3: ("int32", "<i4"), 4: ("uint8", "u1"), 5: ("int16", "<i2"),
    6: ("int8", "i1"), 9: ("int64", "<i8"), 10: ("bool", "?"), 14: ("bfloat16", "<u2"), 17: ("uint16", "<u2"),
    19: ("float16", "<f2"), 22: ("uint32", "<u4"), 23: ("uint64", "<u8"),
}
_OTHER_DTYPES = {7: "string", 8: "complex64", 18: "complex128", 20: "resource", 21: "variant"}


@dataclass(frozen=True)
class TensorEntry:
    """One variable's ``BundleEntryProto``: where its bytes are and what they hold."""

    name: str
    dtype: int  # TF's DataType enum (1 = float32, 9 = int64, ...)
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int  # masked, as stored
    partitioned: bool = False

    @property
    def dtype_name(self) -> str:
        return _DTYPES[self.dtype][0] if self.dtype in _DTYPES else _OTHER_DTYPES.get(self.dtype, f"dtype {self.dtype}")


def _entry(name: str, value: bytes, where: str) -> TensorEntry:
    fields: dict[str, Any] = {"dtype": 0, "shape": (), "shard": 0, "offset": 0, "size": 0, "crc32c": 0}
    numbers = {1: "dtype", 3: "shard", 4: "offset", 5: "size", 6: "crc32c"}
    for number, v in _fields(value, where):
        if number == 2:  # TensorShapeProto: repeated Dim dim = 2 {int64 size = 1}; bool unknown_rank = 3
            dims = []
            for n, dim in _fields(v, where):
                if n == 3 and dim:
                    raise CheckpointError(f"{where}: {name} has an unknown rank")
                if n == 2:
                    dims.append(next((_int64(s) for k, s in _fields(dim, where) if k == 1), 0))
            if any(d < 0 for d in dims):
                raise CheckpointError(f"{where}: {name} has an unknown dimension {dims}")
            fields["shape"] = tuple(dims)
        elif number == 7:  # TensorSliceProto: a partitioned variable, stored as slices
            fields["partitioned"] = True
        elif number in numbers:
            fields[numbers[number]] = v
    return TensorEntry(name=name, **fields)


# ---------------------------------------------------------------------------- the reader
class TFCheckpointReader:
    """The variables of a TF 1 checkpoint (``PREFIX.index`` + ``PREFIX.data-*``), as
    ``tf.train.load_checkpoint(PREFIX)`` reads them, without TensorFlow."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        self.index_path = Path(f"{self.prefix}.index")
        if not self.index_path.is_file():
            raise CheckpointError(f"{self.index_path}: no such checkpoint index")
        where = str(self.index_path)
        header: dict[int, int] | None = None
        self.entries: dict[str, TensorEntry] = {}
        for key, value in _table(self.index_path):
            if key == b"":  # BundleHeaderProto: int32 num_shards = 1; Endianness endianness = 2
                header = {n: v for n, v in _fields(value, where) if n in (1, 2)}
            elif key[:1] == b"\0":
                continue  # the slices of partitioned variables, under encoded keys
            else:
                try:
                    name = key.decode("utf-8")
                except UnicodeDecodeError:
                    raise CheckpointError(f"{where}: a variable name that is not UTF-8 (corrupt index?)") from None
                self.entries[name] = _entry(name, value, where)
        if header is None:
            raise CheckpointError(f"{where}: no bundle header (not a TF 1 checkpoint index?)")
        self.num_shards = header.get(1, 1)
        self.big_endian = header.get(2, 0) == 1
        self.data_paths = [Path(f"{self.prefix}.data-{i:05d}-of-{self.num_shards:05d}")
                           for i in range(self.num_shards)]
        missing = [str(p) for p in self.data_paths if not p.is_file()]
        if missing:
            raise CheckpointError(f"{where}: shard files missing (the index lists {self.num_shards}): "
                                  f"{', '.join(missing)}")
        for entry in self.entries.values():
            if not 0 <= entry.shard < self.num_shards:
                raise CheckpointError(f"{where}: {entry.name} is in shard {entry.shard} of {self.num_shards}")

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every variable's shape by name, sorted (``tf.train.list_variables``)."""
        return {name: self.entries[name].shape for name in sorted(self.entries)}

    def read(self, name: str) -> np.ndarray:
        """The variable's value (bfloat16 as float32), after checking its bytes' CRC-32C."""
        entry = self.entries.get(name)
        if entry is None:
            raise CheckpointError(f"{self.index_path}: no variable {name!r}")
        if entry.partitioned:
            raise CheckpointError(f"{self.index_path}: {name} is a partitioned variable; these are not supported")
        if entry.dtype not in _DTYPES:
            raise CheckpointError(f"{self.index_path}: {name} is of type {entry.dtype_name}, which is not read")
        stored = np.dtype(_DTYPES[entry.dtype][1])
        if self.big_endian:
            stored = stored.newbyteorder(">")
        count = int(np.prod(entry.shape, dtype=np.int64))
        if entry.size != count * stored.itemsize:
            raise CheckpointError(f"{self.index_path}: {name} is {entry.size} bytes, but {entry.dtype_name} "
                                  f"{list(entry.shape)} takes {count * stored.itemsize} (corrupt index?)")
        path = self.data_paths[entry.shard]
        file_size = path.stat().st_size
        if entry.offset + entry.size > file_size:
            raise CheckpointError(f"{path}: truncated: {name} is bytes {entry.offset}..{entry.offset + entry.size} "
                                  f"but the file has {file_size}")
        buf = bytearray(entry.size)
        with open(path, "rb") as f:
            f.seek(entry.offset)
            f.readinto(buf)
        if masked_crc32c(buf) != entry.crc32c:
            raise CheckpointError(f"{path}: checksum mismatch for {name}: its bytes are corrupt")
        array = np.frombuffer(buf, dtype=stored).reshape(entry.shape)
        if _DTYPES[entry.dtype][0] == "bfloat16":  # the upper half of a float32
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array.astype(stored.newbyteorder("="), copy=False)


def find_tf_checkpoint(path: str | Path) -> Path | None:
    """The prefix of the TF checkpoint ``path`` names (a prefix, its ``.index`` or ``.data-*`` file, or a
    folder: its one checkpoint, or the latest), or None when it names none."""
    path = Path(path)
    if path.is_dir():
        if any((path / name).is_file() for name in (SAFETENSORS_NAME, SAFETENSORS_INDEX, BIN_NAME, BIN_INDEX)):
            return None
        prefixes = sorted(p.with_suffix("") for p in path.glob("*.index") if p.is_file())
        if not prefixes:
            return None
        latest = _latest_checkpoint(path)
        if latest is not None:
            return latest
        if len(prefixes) == 1:
            return prefixes[0]
        raise CheckpointError(f"{path}: holds several TensorFlow checkpoints ({', '.join(p.name for p in prefixes)}) "
                              f"and no 'checkpoint' file naming the latest; pass one's path, e.g. {prefixes[-1]}")
    text = str(path)
    if text.endswith(".index") and path.is_file():
        return Path(text[: -len(".index")])
    data = re.fullmatch(r"(.+)\.data-\d{5}-of-\d{5}", text)
    if data and path.is_file():
        return Path(data.group(1))
    return path if Path(text + ".index").is_file() else None


def _latest_checkpoint(folder: Path) -> Path | None:
    """The prefix TF's ``checkpoint`` state file names (``model_checkpoint_path: "model.ckpt-1000"``)."""
    state = folder / "checkpoint"
    if not state.is_file():
        return None
    match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', state.read_text(encoding="utf-8", errors="replace"),
                      re.MULTILINE)
    if match is None:
        return None
    named = Path(match.group(1))
    # relative to the folder; an absolute path from where the run was may have moved with it
    for prefix in (named if named.is_absolute() else folder / named, folder / named.name):
        if Path(f"{prefix}.index").is_file():
            return prefix
    return None


# ---------------------------------------------------------------------------- names
_KERNEL = r"(?:kernel|bias)"
_LN = r"LayerNorm/(?:gamma|beta)"
_GOOGLE_NAMES = re.compile("|".join([  # google-research/bert modeling.py's variables
    r"bert/embeddings/(?:word|position|token_type)_embeddings",
    rf"bert/embeddings/{_LN}",
    rf"bert/encoder/layer_\d+/attention/self/(?:query|key|value)/{_KERNEL}",
    rf"bert/encoder/layer_\d+/(?:attention/output|intermediate|output)/dense/{_KERNEL}",
    rf"bert/encoder/layer_\d+/(?:attention/)?output/{_LN}",
    rf"(?:bert/pooler|cls/predictions/transform)/dense/{_KERNEL}",
    rf"cls/predictions/transform/{_LN}",
]))
# Heads whose weights TF keeps as (out, in) and multiplies with transpose_b=True: no transposition.
_HEADS = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "output_weights": "classifier.weight",  # run_classifier.py
    "output_bias": "classifier.bias",
    "cls/squad/output_weights": "qa_outputs.weight",  # run_squad.py: row 0 start, row 1 end
    "cls/squad/output_bias": "qa_outputs.bias",
}
_OPTIMIZER_SLOTS = ("adam_m", "adam_v", "Adam", "Adam_1")  # AdamWeightDecayOptimizer; tf.train.AdamOptimizer
_TRAINING_VARIABLES = ("global_step", "beta1_power", "beta2_power")


def bertforge_name(tf_name: str) -> tuple[str, bool] | None:
    """bertforge's name of one of Google's BERT variables and whether it is transposed, or None."""
    if tf_name in _HEADS:
        return _HEADS[tf_name], False
    if not _GOOGLE_NAMES.fullmatch(tf_name):
        return None
    *scopes, leaf = tf_name.split("/")
    path = ".".join(scopes).replace("layer_", "layer.")
    if leaf.endswith("_embeddings"):
        return f"{path}.{leaf}.weight", False
    return f"{path}.{'bias' if leaf in ('bias', 'beta') else 'weight'}", leaf == "kernel"


def google_name(name: str) -> str:
    """The TF variable name of a bertforge parameter (the inverse of `bertforge_name`)."""
    for tf_name, ours in _HEADS.items():
        if ours == name:
            return tf_name
    *modules, leaf = name.split(".")
    path = re.sub(r"\blayer/(\d+)", r"layer_\1", "/".join(modules))
    if modules[-1].endswith("_embeddings"):
        return path
    if modules[-1] == "LayerNorm":
        return f"{path}/{'gamma' if leaf == 'weight' else 'beta'}"
    return f"{path}/{'kernel' if leaf == 'weight' else 'bias'}"


def _is_training_state(name: str) -> bool:
    return name in _TRAINING_VARIABLES or name.rsplit("/", 1)[-1] in _OPTIMIZER_SLOTS


_CLASS_BY_HEAD = (("qa_outputs.weight", "BertForQuestionAnswering"),
                  ("classifier.weight", "BertForSequenceClassification"),
                  ("cls.seq_relationship.weight", "BertForPreTraining"), ("cls.predictions.", "BertForMaskedLM"))


def _infer_class(targets: set[str]) -> str:
    """The class of the first head (in `_CLASS_BY_HEAD` order) with a parameter among ``targets``."""
    return next((cls for head, cls in _CLASS_BY_HEAD if any(t.startswith(head) for t in targets)), "BertModel")


# ---------------------------------------------------------------------------- conversion
def load_tf_config(path: str | Path) -> BertConfig:
    """A ``bert_config.json`` as a BertConfig; the TF release's ``"gelu"`` (tanh form) becomes ``"gelu_new"``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read the BERT config ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    act = data.get("hidden_act", "gelu")
    if isinstance(act, str) and act.lower() == "gelu":
        data["hidden_act"] = "gelu_new"
    try:
        return BertConfig.from_dict(data, source=str(path))
    except ValueError as e:
        raise CheckpointError(str(e)) from e


def _vocab_is_cased(path: Path) -> bool:
    """Google's cased vocabs hold upper-case tokens; the uncased ones none (special tokens aside)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        token = line.strip()
        if not (token.startswith("[") and token.endswith("]")) and token != token.lower():
            return True
    return False


@dataclass
class TFConversionReport:
    """What `convert_tf_checkpoint` did (also logged: unused variables as a warning)."""

    checkpoint: Path  # the checkpoint prefix read
    model_class: str  # the bertforge class written (``architectures`` in config.json)
    converted: dict[str, str] = field(default_factory=dict)  # TF variable name -> bertforge parameter name
    training_state: list[str] = field(default_factory=list)  # not converted: global_step, optimizer variables
    unused: list[str] = field(default_factory=list)  # not converted: other heads' variables, names not BERT's
    newly_initialized: list[str] = field(default_factory=list)  # fresh head parameters: train before use
    do_lower_case: bool | None = None  # the tokenizer's lower-casing, from the vocab (None: no vocab.txt)


def convert_tf_checkpoint(src: str | Path, dst: str | Path, *, model_class: str | None = None,
                          dtype: torch.dtype | None = None, config: str | Path | None = None) -> TFConversionReport:
    """Write Google's TF checkpoint ``src`` (`find_tf_checkpoint`) as a checkpoint folder ``dst``;
    ``config``: its ``bert_config.json`` (default: beside it). A ``vocab.txt`` beside it becomes the
    tokenizer, with Google's settings."""
    prefix, config_path = _checkpoint_files(src, config)
    bert_config = load_tf_config(config_path)
    reader = TFCheckpointReader(prefix)
    report = TFConversionReport(checkpoint=prefix, model_class="")
    mapped = _map_names(reader, report)
    cls_name = report.model_class = model_class or _infer_class({t for t, _ in mapped.values()})
    if cls_name not in MODEL_CLASSES:
        raise CheckpointError(f"unknown model class {cls_name!r}; choose from {', '.join(MODEL_CLASSES)}")
    if cls_name in ("BertForSequenceClassification", "BertForTokenClassification") and "output_weights" in mapped:
        bert_config = bert_config.replace(num_labels=reader.entries["output_weights"].shape[0])
    model = MODEL_CLASSES[cls_name](bert_config)
    used = _match_parameters(reader, mapped, model, bert_config, config_path, report)
    _load_variables(reader, used, model, report)
    if dtype is not None:
        model.to(dtype=dtype)
    tokenizer = _tokenizer(prefix, bert_config, config_path, report)
    save_pretrained(model, dst, tokenizer=tokenizer)
    _log(report, reader.index_path)
    return report


def _checkpoint_files(src: str | Path, config: str | Path | None) -> tuple[Path, Path]:
    """The checkpoint prefix ``src`` names and its ``bert_config.json``, or a `CheckpointError`."""
    prefix = find_tf_checkpoint(src)
    if prefix is None:
        raise CheckpointError(f"{src}: not a TensorFlow checkpoint (no .index file)")
    config_path = Path(config) if config is not None else prefix.parent / "bert_config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: no bert_config.json beside the checkpoint (a fine-tuning output "
                              "folder has none: copy the one of the model it started from)")
    return prefix, config_path


def _map_names(reader: TFCheckpointReader, report: TFConversionReport) -> dict[str, tuple[str, bool]]:
    """TF name -> (bertforge name, transposed) of each of Google's BERT variables; the rest to ``report``."""
    mapped: dict[str, tuple[str, bool]] = {}
    for name in sorted(reader.entries):
        target = None if _is_training_state(name) else bertforge_name(name)
        if target is not None:
            mapped[name] = target
        else:
            (report.training_state if _is_training_state(name) else report.unused).append(name)
    if not any(t.startswith("bert.") for t, _ in mapped.values()):
        raise CheckpointError(f"{reader.index_path}: no variables of Google's BERT (bert/embeddings/..., "
                              f"bert/encoder/...); it holds: {short_list(sorted(reader.entries))}")
    return mapped


def _match_parameters(reader: TFCheckpointReader, mapped: dict[str, tuple[str, bool]], model: Any,
                      bert_config: BertConfig, config_path: Path,
                      report: TFConversionReport) -> dict[str, tuple[str, bool]]:
    """The model's parameter -> (TF name, transposed) of every variable it takes; encoder variables or
    shapes the config does not give, and missing variables (fresh heads aside), are errors."""
    where, cls_name = reader.index_path, report.model_class
    expected = model.state_dict()
    bare = cls_name == "BertModel"  # its parameters have no "bert." prefix
    used: dict[str, tuple[str, bool]] = {}
    beyond, mismatched = [], []
    for name, (target, transpose) in mapped.items():
        key = target[len("bert."):] if bare and target.startswith("bert.") else target
        if key not in expected:
            (beyond if target.startswith(("bert.embeddings.", "bert.encoder.")) else report.unused).append(name)
            continue
        needed = tuple(expected[key].shape)[::-1] if transpose else tuple(expected[key].shape)
        if reader.entries[name].shape != needed:
            mismatched.append(f"{name} is {list(reader.entries[name].shape)}, the config gives {list(needed)}")
        used[key] = (name, transpose)
    sizes = ", ".join(f"{k}={getattr(bert_config, k)}" for k in ("num_hidden_layers", "hidden_size",
                      "intermediate_size", "vocab_size", "max_position_embeddings", "type_vocab_size"))
    if beyond:
        raise CheckpointError(f"{where}: encoder variables {config_path} does not describe ({sizes}): "
                              f"{short_list(beyond)}")
    if mismatched:
        raise CheckpointError(f"{where}: shapes differ from {config_path} ({sizes}): "
                              f"{short_list(mismatched, 10, '; ')}")
    fresh = tuple(MODEL_CLASSES[cls_name]._fresh_head_prefixes) + ("bert.pooler.", "pooler.")
    missing = [k for k in expected if k not in used]
    absent = [google_name(("bert." if bare else "") + k) for k in missing if not k.startswith(fresh)]
    if absent:
        raise CheckpointError(f"{where}: variables {cls_name} needs are not in the checkpoint: {short_list(absent)}")
    report.newly_initialized = missing
    report.unused.sort()
    return used


def _load_variables(reader: TFCheckpointReader, used: dict[str, tuple[str, bool]], model: Any,
                    report: TFConversionReport) -> None:
    """Read each used variable (checked against its CRC-32C), transpose the dense kernels, load them."""
    import torch

    state = {}
    for key, (name, transpose) in used.items():
        array = reader.read(name)
        if array.dtype.kind != "f":
            raise CheckpointError(f"{reader.index_path}: {name} holds {reader.entries[name].dtype_name}, "
                                  "not floating point")
        state[key] = torch.from_numpy(np.ascontiguousarray(array.T if transpose else array))
        report.converted[name] = key
    model.load_state_dict(state, strict=False)  # what is missing was checked before: fresh heads only


def _tokenizer(prefix: Path, bert_config: BertConfig, config_path: Path, report: TFConversionReport) -> Any:
    """The tokenizer of the ``vocab.txt`` beside the checkpoint, with Google's settings (None: no vocab)."""
    vocab = prefix.parent / "vocab.txt"
    if not vocab.is_file():
        logger.warning("%s: no vocab.txt beside the checkpoint; no tokenizer written", prefix.parent)
        return None
    from bertforge.text.tokenizer import BertTokenizer

    report.do_lower_case = not _vocab_is_cased(vocab)
    tokenizer = BertTokenizer(vocab, do_lower_case=report.do_lower_case, max_input_chars_per_word=200)
    if tokenizer.vocab_size > bert_config.vocab_size:
        raise CheckpointError(f"{vocab}: {tokenizer.vocab_size} tokens, more than {config_path}'s vocab_size "
                              f"{bert_config.vocab_size}")
    return tokenizer


def _log(report: TFConversionReport, where: Path) -> None:
    logger.info("%s: %d variables converted to %s", where, len(report.converted), report.model_class)
    if report.training_state:
        slots = [n for n in report.training_state if n.rsplit("/", 1)[-1] in _OPTIMIZER_SLOTS]
        others = [n for n in report.training_state if n not in slots]
        logger.info("%s: training state not converted: %s%s", where, ", ".join(others),
                    f" and {len(slots)} optimizer slots" if slots else "")
    if report.unused:
        logger.warning("%s: variables not converted (not part of %s): %s", where, report.model_class,
                       short_list(report.unused))
    if report.newly_initialized:
        logger.warning("%s: newly initialised (train before use): %s", report.model_class,
                       short_list(report.newly_initialized))
