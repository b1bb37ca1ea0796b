"""The ``bertforge`` command line: a table of plain functions, one per command (`COMMANDS`).

A command's signature is its command line, built by tyro: a parameter ``max_seq_length`` is the flag
``--max-seq-length`` (``--max_seq_length`` works too), a bool ``x`` is ``--x`` / ``--no-x``, the
fields of a config dataclass parameter (``cfg``) are flags with the fields' docstrings as their help,
and the docstring's Args are the other flags' help. ``--config FILE.json|.yaml`` sets a command's
``cfg`` fields; flags override the file. ``bertforge --help`` lists the commands, each with the
first line of its function's docstring.

Every command that runs a model for inference takes ``--precision {auto,fp32,bf16,fp16,int8}``
(`bertforge.train.precision`; int8: `bertforge.fast.int8`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import inspect
import json
import logging
import os
import signal
import sys
import threading
import types
import typing
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal


def _interrupted_at_start_up(signum: int, frame: Any) -> None:
    """Ctrl-C while the commands (and torch) are imported: one line and exit code 130, not a
    traceback from inside an import. `main` handles it once a command runs."""
    print("bertforge: interrupted", file=sys.stderr)
    raise SystemExit(130)


def _quiet_start_up() -> Any:
    """Install `_interrupted_at_start_up` for the imports below; returns the handler to restore
    after them (None: nothing installed, e.g. in a notebook with its own handler, or with -v, which
    shows the traceback)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or {"-v", "--verbose"} & set(sys.argv[1:])):
        return None
    return signal.signal(signal.SIGINT, _interrupted_at_start_up)


# The imports below take seconds (torch): Ctrl-C during them meets the start-up handler.
_SIGINT_BEFORE_START_UP = _quiet_start_up()

import tyro
from tyro.conf import OmitArgPrefixes, Positional, PositionalMetavarFromFieldName, arg
from tyro.constructors import ConstructorRegistry, PrimitiveConstructorSpec, PrimitiveTypeInfo

from bertforge.console import show_logs
from bertforge.convert.onnx import ATOL, ONNX_OPSET
from bertforge.data.prepare import PrepareConfig
from bertforge.demo.run import DemoConfig
from bertforge.experiments.runner import AblateConfig
from bertforge.model.heads import MODEL_CLASSES
from bertforge.serving.features import FeatureSettings, Pooling, parse_layers
from bertforge.serving.http import MAX_BATCH, MAX_REQUEST_BYTES, MAX_REQUEST_TOKENS
from bertforge.settings import config_from_file, read_config_file, speaking_in_flags
from bertforge.tasks.finetune import INPUT_SETTINGS, FinetuneConfig
from bertforge.train.rundir import RUN_CONFIG, STOP_MARKER, read_stop_marker, stopped_where
from bertforge.train.precision import InferencePrecision as Precision
from bertforge.train.pretrain import PretrainConfig

__all__ = ["main", "run", "COMMANDS", "read_config_file", "config_from_file"]

# Choices as types (the settings' own, declared where they are used): tyro shows them as {a,b,c} and refuses
# anything else.
ModelClass = Literal[tuple(sorted(MODEL_CLASSES))]  # type: ignore[valid-type]
Dtype = Literal["float32", "bfloat16", "float16"]

_REGISTRY = ConstructorRegistry()


@_REGISTRY.primitive_rule
def _comma_separated(info: PrimitiveTypeInfo) -> PrimitiveConstructorSpec | None:
    """A tuple of integers as one comma-separated value (``--layers -1,-2,-3,-4``)."""
    if info.type != tuple[int, ...]:
        return None
    return PrimitiveConstructorSpec(nargs=1, metavar="STR", instance_from_str=lambda args: parse_layers(args[0]),
                                    is_instance=lambda value: isinstance(value, tuple),
                                    str_from_instance=lambda value: [",".join(map(str, value))])


_METAVAR_OF: list[PrimitiveTypeInfo] = []
"""The optional types `_optional_metavar` is building tyro's own spec of (its rule stands aside for them)."""


@_REGISTRY.primitive_rule
def _optional_metavar(info: PrimitiveTypeInfo) -> PrimitiveConstructorSpec | None:
    """``X | None`` shown as X is (``STR``, ``INT``, ``{a,b}``; tyro's own: ``{None}|STR``): a flag's help says
    what leaving it unset means. Parsing is tyro's own, unchanged (``None`` still reads as None)."""
    args = typing.get_args(info.type)
    if (info.type_origin not in (typing.Union, types.UnionType) or type(None) not in args
            or any(seen is info for seen in _METAVAR_OF)):
        return None
    _METAVAR_OF.append(info)
    try:
        spec = ConstructorRegistry.get_primitive_spec(info)  # tyro's own (this rule stands aside)
        given = ConstructorRegistry.get_primitive_spec(PrimitiveTypeInfo.make(
            functools.reduce(lambda a, b: a | b, [a for a in args if a is not type(None)]), info.markers))
    finally:
        _METAVAR_OF.pop()
    if not isinstance(spec, PrimitiveConstructorSpec) or not isinstance(given, PrimitiveConstructorSpec):
        return None
    return dataclasses.replace(spec, metavar=given.metavar)


_PRECISION_HELP = ("the model's number format: auto (the faster of fp32 and bf16 on this CPU or GPU), fp32, bf16, "
                   "fp16 (CUDA), or int8 (CPU: int8 dense layers, the rest as auto)")
PrecisionFlag = Annotated[Precision, arg(help=_PRECISION_HELP)]


# ---------------------------------------------------------------------------- vocab / prepare / tokenize
def vocab(files: Positional[tuple[str, ...]], out: Annotated[str, arg(aliases=("-o",))], vocab_size: int = 30522,
          cased: bool = False, min_frequency: int = 2, limit_alphabet: int = 1000, num_unused: int = 99) -> int:
    """Learn a WordPiece vocab.txt from text files.

    Args:
        files: text files (plain, .gz, .bz2 or .xz), read line by line
        out: folder to write vocab.txt and tokenizer settings into
        vocab_size: size of the vocab, special tokens included
        cased: keep case and accents (off: lower-case, strip accents)
        min_frequency: ignore pieces seen fewer times
        limit_alphabet: keep at most this many distinct characters
        num_unused: [unused] slots (99 reproduces Google's layout: [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103)
    """
    from bertforge.text.vocab import learn_vocab

    if not files:
        raise ValueError("vocab needs text files to learn from")
    tok = learn_vocab(files, out, vocab_size=vocab_size, do_lower_case=not cased, min_frequency=min_frequency,
                      limit_alphabet=limit_alphabet, num_unused=num_unused)
    print(f"wrote {Path(out) / 'vocab.txt'}: {tok.vocab_size} entries")
    return 0


def prepare(inputs: Positional[tuple[str, ...]] = (), out: Annotated[str | None, arg(aliases=("-o",))] = None,
            tokenizer: Annotated[str | None, arg(aliases=("-t",))] = None, workers: int = 1, num_shards: int = 1,
            shard_index: int = 0, stats: Annotated[str | None, arg(metavar="FOLDER")] = None, progress: bool = True,
            config: Annotated[str | None, arg(metavar="FILE")] = None,
            cfg: Annotated[PrepareConfig, arg(name="")] = PrepareConfig()) -> int:
    """Turn raw text into pre-training shards (Google's create_pretraining_data, streamed).

    Args:
        inputs: input files or globs (.gz/.bz2/.xz read transparently)
        out: output folder for shards + manifest.json (needed unless --stats)
        tokenizer: checkpoint or vocab folder (vocab.txt + tokenizer settings) (needed unless --stats)
        workers: processes building shards in parallel
        num_shards: split the work across this many machines
        shard_index: which part of --num-shards this run builds
        stats: print the statistics of a prepared folder and exit
        progress: show a progress bar on stderr
        config: JSON or YAML file of the settings below (flags override it)
    """
    from bertforge.data.prepare import format_stats, load_manifest, prepare

    if stats:
        print(format_stats(load_manifest(stats)))
        return 0
    if not inputs or not out or not tokenizer:
        raise ValueError("prepare needs input files, --out and --tokenizer (or --stats FOLDER)")
    manifest = prepare(list(inputs), out, tokenizer, cfg, workers=workers, num_shards=num_shards,
                       shard_index=shard_index, progress=progress)
    print(format_stats(manifest))
    return 0


def tokenize(tokenizer: Annotated[str, arg(aliases=("-t",))], text: Positional[tuple[str, ...]] = (),
             pair: str | None = None, jsonl: bool = False) -> int:
    """Show the WordPiece tokens and ids of text.

    Args:
        tokenizer: checkpoint folder or vocab.txt
        text: texts to tokenize (none: one per line from stdin)
        pair: a second segment, encoded as [CLS] text [SEP] pair [SEP]
        jsonl: print JSON lines (tokens, input_ids, token_type_ids)
    """
    from bertforge.text.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(tokenizer)
    for line in text or [line.rstrip("\n") for line in sys.stdin]:
        enc = tok(line, pair)
        tokens = tok.convert_ids_to_tokens(enc["input_ids"])
        if jsonl:
            print(json.dumps({"text": line, "tokens": tokens, "input_ids": enc["input_ids"],
                              "token_type_ids": enc["token_type_ids"]}, ensure_ascii=False))
        else:
            print(" ".join(tokens))
    return 0


# ---------------------------------------------------------------------------- convert / info / export-onnx
def convert(src: Positional[str], dst: Positional[str], model_class: ModelClass | None = None,
            dtype: Dtype | None = None) -> int:
    """Re-write a BERT checkpoint folder (transformers <-> bertforge, .bin -> safetensors, Google's TF checkpoints).

    SRC is a BERT checkpoint folder (bertforge or transformers; safetensors or pytorch_model.bin), or Google's
    TensorFlow checkpoint: a folder with bert_model.ckpt.index / .data-* + bert_config.json + vocab.txt, or a
    checkpoint path prefix (read without TensorFlow).

    Args:
        src: a checkpoint folder (bertforge, transformers, or Google's TensorFlow one) or a TF checkpoint prefix
        dst: folder to write config.json + model.safetensors (+ tokenizer files) into
        model_class: class to load as (none: config.json's architectures, else inferred from the weights)
        dtype: cast the weights (none: keep float32)
    """
    import torch

    from bertforge.convert.folders import convert

    cls = convert(src, dst, model_class=model_class, dtype=getattr(torch, dtype) if dtype else None)
    print(f"wrote {dst} as {cls.__name__}")
    return 0


def info(checkpoint: Positional[str]) -> int:
    """Describe a checkpoint folder.

    Args:
        checkpoint: a checkpoint folder
    """
    from bertforge.convert.folders import describe_tokenizer
    from bertforge.model.checkpoint import read_state_dict
    from bertforge.model.config import BertConfig
    from bertforge.model.heads import infer_model_class

    config = BertConfig.load(checkpoint)
    state = read_state_dict(checkpoint)
    cls = infer_model_class(checkpoint)
    params = sum(t.numel() for t in state.values())
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in state.values()})
    print(f"{checkpoint}: {cls.__name__}, {params:,} parameters ({', '.join(dtypes)})")
    print(f"  L={config.num_hidden_layers} H={config.hidden_size} A={config.num_attention_heads} "
          f"I={config.intermediate_size} V={config.vocab_size} positions={config.max_position_embeddings} "
          f"act={config.hidden_act}")
    if config.id2label:
        print(f"  labels: {config.id2label}")
    print(f"  tokenizer: {describe_tokenizer(checkpoint)}")
    stopped = read_stop_marker(checkpoint)
    if stopped is not None:
        print(f"  training: stopped early at {stopped_where(stopped)} ({stopped.get('reason', 'unknown reason')}): "
              f"a partial model ({STOP_MARKER})")
    return 0


def export_onnx(checkpoint: Positional[str], out: Positional[str], model_class: ModelClass | None = None,
                opset: int = ONNX_OPSET, atol: float = ATOL, verify: bool = True) -> int:
    """Export a checkpoint to ONNX (dynamic batch and sequence axes), checked with onnxruntime.

    Args:
        checkpoint: a BERT checkpoint folder (bertforge or transformers)
        out: folder to write model.onnx, config.json and the tokenizer files into (optimum's layout)
        model_class: class to export (none: config.json's architectures, else inferred from the weights)
        opset: ONNX opset (the default is the lowest PyTorch's exporter implements)
        atol: largest difference from PyTorch allowed in the onnxruntime check, per unit of an output's scale
            (logits: their largest magnitude, at least 1; hidden states and pooler: 1)
        verify: check the exported model against PyTorch with onnxruntime
    """
    import torch

    from bertforge.convert.onnx import export_onnx
    from bertforge.model.checkpoint import load_pretrained
    from bertforge.model.heads import infer_model_class

    cls = MODEL_CLASSES[model_class] if model_class else infer_model_class(checkpoint)
    model = load_pretrained(cls, checkpoint, dtype=torch.float32)
    folder = Path(out)
    try:
        result = export_onnx(model, folder / "model.onnx", opset=opset, verify=verify, atol=atol)
    except ImportError as e:
        print(f"bertforge export-onnx: error: {e}", file=sys.stderr)
        return 2
    model.config.replace(architectures=[cls.__name__]).save(folder / "config.json")
    if (Path(checkpoint) / "vocab.txt").is_file():
        from bertforge.text.tokenizer import BertTokenizer

        BertTokenizer.from_pretrained(checkpoint).save_pretrained(folder)
    print(result.summary())
    return 0


# ---------------------------------------------------------------------------- pretrain / plot
def _report_stop(command: str, result: Any) -> int:
    """Say that a run stopped before its end and return the command's exit code (130 / 143 for a run a
    SIGINT / SIGTERM stopped, so that a script does not take its partial model for a finished one).
    ``result``: the loop's `TrainResult`."""
    if not result.stopped_early:
        return 0
    where = stopped_where({"step": result.step, "max_steps": result.max_steps, "budget_minutes": result.budget_minutes,
                           "minutes": result.elapsed_seconds / 60})
    print(f"{command}: stopped at {where}; model/ holds the partial model "
          f"(marked by {STOP_MARKER}); continue with --resume")
    return result.exit_code


def pretrain(config: Annotated[str | None, arg(metavar="FILE")] = None,
             cfg: Annotated[PretrainConfig, arg(name="")] = PretrainConfig()) -> int:
    """Pre-train BERT (masked LM + next sentence prediction) on prepared shards; torchrun for many processes.

    Args:
        config: JSON or YAML file of the settings below (flags override it)
    """
    from bertforge.train.pretrain import pretrain

    return _report_stop("pretrain", pretrain(cfg))


def plot(run_dir: Positional[str], out: str | None = None) -> int:
    """Draw a run's training curves (metrics.jsonl -> curves.png).

    Args:
        run_dir: a run folder holding metrics.jsonl
        out: PNG file to write (none: RUN_DIR/curves.png)
    """
    from bertforge.train.plot import plot_run

    print(f"wrote {plot_run(run_dir, out)}")
    return 0


# ---------------------------------------------------------------------------- finetune / evaluate / predict
def finetune(config: Annotated[str | None, arg(metavar="FILE")] = None,
             cfg: Annotated[FinetuneConfig, arg(name="")] = FinetuneConfig()) -> int:
    """Fine-tune: classification / regression (GLUE, or CSV / TSV / JSONL / a JSON array of records / Parquet,
    plain or .gz / .bz2 / .xz), NER (CoNLL), SQuAD v1.1 / v2.0, multiple choice (SWAG); --grid for the paper's
    search (--grid alone: the paper's grid).

    Args:
        config: JSON or YAML file of the settings below (flags override it)
    """
    from bertforge.tasks.finetune import finetune, finetune_grid

    if cfg.grid:
        grid = finetune_grid(cfg)
        if grid.stopped_early:
            print("finetune: the grid stopped early; continue with --resume")
            return grid.exit_code
        if grid.best is not None:
            print(json.dumps({k: grid.best[k] for k in ("lr", "batch_size", "epochs", "metric", "value")}))
        return 0
    result = finetune(cfg)
    code = _report_stop("finetune", result.train)
    if result.eval_metrics:
        print(json.dumps(result.eval_metrics))
    return code


_COLUMN_SETTINGS = ("text_column", "text_pair_column", "label_column", "label_names")
_SQUAD_SETTINGS = ("max_query_length", "max_answer_length", "n_best_size", "null_score_diff_threshold")
_TAGGING_SETTINGS = ("tag_column", "tag_scheme")
_FILE_ONLY_SETTINGS = ("text_column", "text_pair_column", "label_column", "label_names", "tag_column", "skip_bad_rows")
"""`INPUT_SETTINGS` that only reading a task file uses (what the columns hold, what a label id is named, bad rows):
serve, which reads no files, does not take them."""


@functools.cache
def _setting_docs_and_types() -> tuple[dict[str, str], dict[str, Any]]:
    """FinetuneConfig's fields' docstrings (on one line) and types."""
    import docstring_parser

    docs = {p.arg_name: " ".join((p.description or "").split()) for klass in reversed(FinetuneConfig.__mro__[:-1])
            for p in docstring_parser.parse_from_object(klass).params}
    return docs, typing.get_type_hints(FinetuneConfig)


def _checkpoint_settings(name: str, doc: str, names: tuple[str, ...] | None = None,
                         leave_out: tuple[str, ...] = ()) -> type:
    """A dataclass of FinetuneConfig's `INPUT_SETTINGS` (those of ``names``, or those no family group holds, less
    ``leave_out``) with their docstrings as help, each unset (None) unless given: the checkpoint's own fine-tuning
    settings stand for the rest. A bool is a plain flag (unset: off). ``doc``: the help under its heading."""
    grouped = _COLUMN_SETTINGS + _SQUAD_SETTINGS + _TAGGING_SETTINGS
    docs, hints = _setting_docs_and_types()
    fields: list[tuple[str, Any, Any]] = []
    for setting in INPUT_SETTINGS:
        if setting in leave_out or (setting in grouped if names is None else setting not in names):
            continue
        if hints[setting] is bool:
            fields.append((setting, Annotated[bool, arg(help=docs.get(setting))], False))
        else:
            hint = arg(help=docs.get(setting), help_behavior_hint="(default: the checkpoint's)")
            fields.append((setting, Annotated[hints[setting] | None, hint], None))
    return dataclasses.make_dataclass(name, fields, namespace={"__doc__": doc})


# The settings of evaluate, predict and serve: those every fine-tuned checkpoint takes as the command's own
# flags, those of one task family under a heading naming it (the flags' names are the same either way).
CheckpointSettings = _checkpoint_settings("CheckpointSettings", "Settings every fine-tuned checkpoint takes.")
ServeSettings = _checkpoint_settings("ServeSettings", "Settings every fine-tuned checkpoint takes.",
                                     leave_out=_FILE_ONLY_SETTINGS)
ColumnSettings = _checkpoint_settings(
    "ColumnSettings", "Only for classification / regression and multiple-choice (SWAG) checkpoints: the columns of "
    "their CSV / TSV / JSONL files (--label-names: classification only).", _COLUMN_SETTINGS)
SquadSettings = _checkpoint_settings(
    "SquadSettings", "Only for SQuAD (question answering) checkpoints (task squad / squad2).", _SQUAD_SETTINGS)
TaggingSettings = _checkpoint_settings(
    "TaggingSettings", "Only for tagging (NER) checkpoints (task ner / tagging).", _TAGGING_SETTINGS)
ServeTaggingSettings = _checkpoint_settings(
    "ServeTaggingSettings", "Only for tagging (NER) checkpoints (task ner / tagging).",
    tuple(s for s in _TAGGING_SETTINGS if s not in _FILE_ONLY_SETTINGS))

ColumnFlags = Annotated[ColumnSettings, arg(name="classification and multiple choice"), OmitArgPrefixes]
SquadFlags = Annotated[SquadSettings, arg(name="SQuAD (question answering)"), OmitArgPrefixes]
TaggingFlags = Annotated[TaggingSettings, arg(name="tagging"), OmitArgPrefixes]
ServeTaggingFlags = Annotated[ServeTaggingSettings, arg(name="tagging"), OmitArgPrefixes]


def _overrides(*groups: Any) -> dict[str, Any]:
    """The settings given on the command line (the checkpoint's stand for the others), from every group of them."""
    return {k: v for settings in groups for k, v in vars(settings).items() if v is not None and v is not False}


def evaluate(checkpoint: Positional[str], file: str, out: Annotated[str | None, arg(aliases=("-o",))] = None,
             precision: PrecisionFlag = "fp32",
             settings: Annotated[CheckpointSettings, arg(name="")] = CheckpointSettings(),
             columns: ColumnFlags = ColumnSettings(), squad: SquadFlags = SquadSettings(),
             tagging: TaggingFlags = TaggingSettings()) -> int:
    """Metrics of a fine-tuned model on labelled data.

    Args:
        checkpoint: a fine-tuned checkpoint folder (e.g. RUN/best or RUN/model)
        file: labelled file(s), comma-separated, or a GLUE task folder (dev)
        out: folder for the per-example predictions (predictions.tsv, predictions.conll, SQuAD's predictions.json, ...)
    """
    from bertforge.tasks.finetune import evaluate

    print(json.dumps(evaluate(checkpoint, file, out=out, precision=precision,
                              settings=_overrides(settings, columns, squad, tagging))))
    return 0


@dataclasses.dataclass
class Inference:
    """How predict and serve run a checkpoint's model."""

    embeddings: bool = False
    """Pooled sentence embeddings, whatever the head."""
    pooling: Annotated[Pooling | None, arg(help_behavior_hint="(default: mean)")] = None
    """Embeddings: the mean over the tokens, the last layer at [CLS], or BERT's tanh pooler."""
    top_k: Annotated[int | None, arg(help_behavior_hint="(default: 5 for fill-mask, every label for "
                                                        "classification)")] = None
    """Fill-mask: tokens per [MASK]; classification: the most likely labels shown (another head refuses it)."""
    batch_size: Annotated[int | None, arg(help_behavior_hint="(default: 32)")] = None
    """Sequences per forward pass."""
    precision: PrecisionFlag = "fp32"

    def __post_init__(self) -> None:
        for name in ("top_k", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def _inference_overrides(inference: Inference, *groups: Any) -> dict[str, Any]:
    """`_overrides`, with --batch-size as the fine-tuning settings' evaluation batch size."""
    given = _overrides(*groups)
    if inference.batch_size:
        given["eval_batch_size"] = inference.batch_size
    return given


def _load_predictor(checkpoint: str, settings: dict[str, Any], inference: Inference) -> Any:
    """``settings``: `_inference_overrides`."""
    from bertforge.serving.predictor import Predictor

    return Predictor.from_pretrained(checkpoint, precision=inference.precision,
                                     head="embeddings" if inference.embeddings else None, settings=settings)


def predict(checkpoint: Positional[str], inputs: Positional[tuple[str, ...]] = (),
            file: Annotated[str | None, arg(aliases=("-f",))] = None,
            out: Annotated[str | None, arg(aliases=("-o",))] = None, format: Literal["text", "jsonl"] | None = None,
            inference: Annotated[Inference, arg(name="")] = Inference(),
            settings: Annotated[CheckpointSettings, arg(name="")] = CheckpointSettings(),
            columns: ColumnFlags = ColumnSettings(), squad: SquadFlags = SquadSettings(),
            tagging: TaggingFlags = TaggingSettings()) -> int:
    """A checkpoint's head on texts (fill-mask, classification, tagging, QA, multiple choice, embeddings;
    readable text or JSONL), or a fine-tuned model on a task file.

    The checkpoint's head (config.json's architectures) decides what is predicted: fill-mask, classification,
    tagging, QA, multiple choice, or embeddings (BertModel). INPUTS are texts: 'a ||| b' for a pair, for QA
    a 'question ||| context', for multiple choice a 'context ||| choice ||| choice ...'; a - reads them
    from stdin, one per line. Or, for a fine-tuned checkpoint, INPUTS is one existing task file or folder, read as
    evaluate reads it (GLUE TSV, CSV, JSONL, CoNLL, SQuAD JSON, SWAG CSV); its predictions go to --out as .jsonl
    records or in the task's format (GLUE TSV, CoNLL, SQuAD JSON).

    Args:
        checkpoint: a checkpoint folder
        inputs: texts ('a ||| b' for a pair; - for stdin), or one task file
        file: texts, one per line as INPUTS (.gz/.bz2/.xz read transparently; - for stdin)
        out: write the predictions here (none: stdout)
        format: for texts: readable lines or JSON records (none: jsonl for an --out ending in .jsonl, else text)
    """
    from bertforge.io import atomic_write_text
    from bertforge.serving.features import read_inputs
    from bertforge.serving.predictor import FINE_TUNED_HEADS, SEPARATOR, checkpoint_head, format_records

    given = _inference_overrides(inference, settings, columns, squad, tagging)
    head = "embeddings" if inference.embeddings else checkpoint_head(checkpoint)
    if (head in FINE_TUNED_HEADS and file is None and len(inputs) == 1 and inputs[0].strip() not in ("", "-")
            and Path(inputs[0]).exists()):  # "" is a text (Path("") is the working folder)
        return _predict_task_file(checkpoint, inputs[0], out, inference, given)

    def lines(path: str) -> list[str]:  # stripped, UTF-8 checked; blank lines are inputs too (as features reads)
        return [SEPARATOR.join(t for t in pair if t is not None) for pair in read_inputs(path)]

    texts = [t for x in inputs for t in (lines("-") if x == "-" else [x])]
    if file:
        texts += lines(file)
    if not texts:
        raise ValueError("no inputs: give texts, --file FILE, or - to read them from stdin")
    predictor = _load_predictor(checkpoint, given, inference)
    records = predictor(texts, top_k=inference.top_k, pooling=inference.pooling)
    fmt = format or ("jsonl" if out and out.endswith(".jsonl") else "text")
    text = format_records(records, predictor.head, fmt)
    if out:
        atomic_write_text(out, text)
        print(f"wrote {len(records):,} predictions to {out}")
    else:
        sys.stdout.write(text)
    return 0


def _predict_task_file(checkpoint: str, file: str, out: str | None, inference: Inference,
                       settings: dict[str, Any]) -> int:
    """A fine-tuned model on a task file: the family's records (`bertforge.tasks.finetune.predict`).
    ``settings``: `_inference_overrides`."""
    from bertforge.tasks.finetune import predict

    records = predict(checkpoint, file, out, precision=inference.precision, settings=settings)
    if out:
        print(f"wrote {len(records):,} predictions to {out}")
    else:
        sys.stdout.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return 0


# ---------------------------------------------------------------------------- serve
def serve(checkpoint: Positional[str], host: str = "127.0.0.1", port: int = 8000, max_batch: int = MAX_BATCH,
          max_request_bytes: int = MAX_REQUEST_BYTES, max_request_tokens: int = MAX_REQUEST_TOKENS,
          inference: Annotated[Inference, arg(name="")] = Inference(),
          settings: Annotated[ServeSettings, arg(name="")] = ServeSettings(), squad: SquadFlags = SquadSettings(),
          tagging: ServeTaggingFlags = ServeTaggingSettings()) -> int:
    """Serve a checkpoint's head over HTTP: JSON in and out, a health route, request limits.

    Args:
        checkpoint: a checkpoint folder; its head (config.json's architectures) decides what is predicted
        host: address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)
        port: port to listen on
        max_batch: most inputs in one request
        max_request_bytes: largest request body
        max_request_tokens: most tokens in one request (its texts' WordPiece tokens, [CLS] and [SEP])
    """
    from bertforge.serving.http import serve

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(f"bertforge serve: error: {e.name} is not installed; pip install 'bertforge[serve]'", file=sys.stderr)
        return 2
    predictor = _load_predictor(checkpoint, _inference_overrides(inference, settings, squad, tagging), inference)
    serve(predictor, host=host, port=port, max_batch=max_batch,
          max_request_bytes=max_request_bytes, max_request_tokens=max_request_tokens, top_k=inference.top_k or 5,
          pooling=inference.pooling or "mean")
    return 0


# ---------------------------------------------------------------------------- features
def features(checkpoint: Positional[str], input: Positional[str], out: Annotated[str, arg(aliases=("-o",))],
             settings: Annotated[FeatureSettings, arg(name="")] = FeatureSettings(progress=True)) -> int:
    """Per-token vectors of chosen layers, or pooled sentence embeddings (JSONL as Google's
    extract_features.py, NumPy's .npy or .safetensors).

    INPUT has one input per line ('text_a ||| text_b' for a pair; .gz/.bz2/.xz read transparently). The output
    is .jsonl (the layout of Google's extract_features.py), .npy or .safetensors (arrays for large runs; layout in
    bertforge.serving.features). Inputs longer than --max-seq-length are cut into windows, each token's vector
    taken from the window where it has the most context.

    Args:
        checkpoint: a BERT checkpoint folder (bertforge or transformers) holding the tokenizer
        input: text file, one input per line, or - for stdin
        out: output file: .jsonl, .npy or .safetensors
        settings: the layers, pooling, windows and batches (its flags; a progress bar unless --no-progress)
    """
    from bertforge.serving.features import output_format, read_inputs, write_features

    output_format(out)  # before reading the input
    print(write_features(checkpoint, read_inputs(input), out, settings).summary())
    return 0


# ---------------------------------------------------------------------------- demo
def demo(config: Annotated[str | None, arg(metavar="FILE")] = None,
         cfg: Annotated[DemoConfig, arg(name="")] = DemoConfig()) -> int:
    """Run the end-to-end demo on real data.

    Args:
        config: JSON or YAML file of the settings below (flags override it; configs/demo.yaml lists them all)
    """
    from bertforge.demo.run import run_demo
    from bertforge.experiments.baselines import require_baselines

    try:
        require_baselines()  # the curves' classic lines: a missing extra is one line, before any work
    except ImportError as e:
        print(f"bertforge demo: error: {e}", file=sys.stderr)
        return 2
    run_demo(cfg)
    return 0


# ---------------------------------------------------------------------------- fetch
Fetchable = Literal["all-minilm-l6-v2", "movie-reviews", "sentiment-tweets", "sentiment-nyt", "sentiment-amazon",
                    "brown-pos", "wikipedia-leads"]


def fetch(what: Positional[Fetchable], out: str = "data") -> int:
    """Fetch real data or a published checkpoint (once, into the cache), and say how the commands read it.

    all-minilm-l6-v2: a published BERT checkpoint (6 layers, hidden 384), a --model for finetune, predict,
    features and pretrain --init-from. movie-reviews (sentence polarity), sentiment-tweets / -nyt / -amazon
    (valence scores), brown-pos (part-of-speech tags): train and dev files in --out, with the finetune flags
    that read them. wikipedia-leads: 10,033 Wikipedia lead sections as pre-training text in --out (every 20th
    held out), for prepare.

    Args:
        what: all-minilm-l6-v2, movie-reviews, sentiment-tweets, sentiment-nyt, sentiment-amazon, brown-pos or
            wikipedia-leads
        out: folder the task and text files are written to
    """
    from bertforge import resources
    from bertforge.experiments.datasets import pretraining_text, task_files

    if what == "all-minilm-l6-v2":
        folder = resources.minilm_folder()
        print(f"{what}: {folder}")
        print(f"  bertforge finetune --model {folder} ...")
    elif what == "wikipedia-leads":
        train, held_out = pretraining_text(what, Path(out))
        print(f"{what}: {train} (held out: {held_out})")
        print(f"  bertforge vocab {train} --out vocab; bertforge prepare {train} --tokenizer vocab --out data128")
    else:
        settings = task_files(what, Path(out))
        print(f"{what}: {settings['train_file']}, {settings['dev_file']}")
        print("  bertforge finetune " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in settings.items())
              + " --model ... --out ...")
    return 0


# ---------------------------------------------------------------------------- ablate
def ablate(study: Positional[str | None] = None, list_studies: Annotated[bool, arg(aliases=("--list",))] = False,
           cfg: Annotated[AblateConfig, arg(name="")] = AblateConfig()) -> int:
    """Run one of the paper's ablation studies (Tables 5 to 8, Figure 5) from a study file, and report it.

    STUDY is a study file (YAML or JSON: variants, the pre-training they share, tasks, seeds; see
    docs/experiments.md) or the name of a bundled one (--list shows them). Each cell is a run folder under
    --out: a rerun skips finished cells and resumes interrupted ones (--out alone reruns the study the folder
    recorded). The report (report.md, report.json,
    scores.png, figure.png) is rewritten as cells finish.

    Args:
        study: a study file, or a bundled study's name
        list_studies: list the bundled studies and exit
    """
    from bertforge.experiments.runner import run_study
    from bertforge.experiments.study import bundled_studies, load_study

    if list_studies:
        studies = bundled_studies()
        for name, path in studies.items():
            print(f"{name:<12} {load_study(path).title}")
        print(f"\nthe files: {next(iter(studies.values())).parent} (copy one and point its paths at your data)")
        return 0
    if not study and not cfg.out:
        raise ValueError("give a study file or a bundled study's name (bertforge ablate --list shows them), or "
                         "--out a study folder to rerun")
    report = run_study(study, cfg)
    print(f"report: {report}")
    return 0


COMMANDS: dict[str, Callable[..., int]] = {
    "vocab": vocab,
    "prepare": prepare,
    "tokenize": tokenize,
    "convert": convert,
    "info": info,
    "export-onnx": export_onnx,
    "pretrain": pretrain,
    "finetune": finetune,
    "evaluate": evaluate,
    "predict": predict,
    "serve": serve,
    "features": features,
    "plot": plot,
    "demo": demo,
    "ablate": ablate,
    "fetch": fetch,
}
"""Command name -> the function it runs: its signature gives the command's flags, its docstring the help."""

DATA_COMMANDS = ("tokenize", "evaluate", "predict", "features")
"""Commands whose stdout may be data to pipe on: their log goes to stderr."""
_BARE_FLAGS = {"--grid": "paper"}
"""Flags that may stand alone, and the value that means."""
_GONE_FLAGS = {"--bf16": "--precision bf16"}
"""Flags that no longer exist, and what replaces them."""


# ---------------------------------------------------------------------------- main
def _summary(fn: Callable[..., Any]) -> str:
    """The first paragraph of ``fn``'s docstring, on one line."""
    return " ".join((fn.__doc__ or "").split("\n\n")[0].split()).rstrip(".")


def _parser() -> argparse.ArgumentParser:
    """``bertforge [-v] COMMAND ...``: picks the command; the command's own flags are tyro's."""
    from bertforge.version import __version__

    table = "\n".join(f"  {name:<12} {_summary(fn)}" for name, fn in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="bertforge", description="BERT, as the paper describes it.", formatter_class=argparse.RawTextHelpFormatter,
        epilog=f"commands:\n{table}\n\n'bertforge COMMAND --help' lists its flags.")
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages; a traceback on errors")
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="one of the commands below")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _files_first(args: list[str]) -> argparse.Namespace:
    """The ``--config FILE``, ``--recipe NAME``, ``--out DIR`` and ``--resume`` among ``args`` (None where not
    given; the last one given wins, as for every flag), read before the other flags so that those override
    what they name."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for flag in ("--config", "--recipe", "--out"):
        early.add_argument(flag)
    early.add_argument("--resume", action="store_true")
    early.add_argument("--no-resume", dest="resume", action="store_false")
    try:
        return early.parse_known_args(args)[0]
    except argparse.ArgumentError:  # "--config" with no value: the command's own parser says so
        return argparse.Namespace(config=None, recipe=None, out=None, resume=False)


def _settings_file(early: argparse.Namespace) -> str | None:
    """The file a command's settings start from: ``--config``, or on ``--resume`` the run folder's own record
    of its settings (``OUT/run_config.json``), so that a run resumes without its flags typed again."""
    if early.config is not None:
        return early.config
    if early.resume and early.out:
        record = Path(early.out) / RUN_CONFIG
        if not record.is_file():  # written once a run is accepted, before its first checkpoint
            raise ValueError(f"--resume: {early.out} holds no {RUN_CONFIG}, so no run there got as far as its first "
                             "checkpoint; start it without --resume (or give its settings with --config)")
        return str(record)
    return None


def _run(command: str, args: list[str]) -> int:
    """Parse ``args`` into ``command``'s function and call it. A ``--config`` file (and a ``--recipe``)
    fills the function's ``cfg`` first, so that flags override it: the function's ``config`` parameter
    declares the flag for ``--help``, and it is read here."""
    for flag, replacement in _GONE_FLAGS.items():
        if flag in args:
            raise ValueError(f"{flag} is gone: use {replacement}")
    given: list[str] = []
    for i, a in enumerate(args):
        given.append(a)
        if a in _BARE_FLAGS and (i + 1 == len(args) or args[i + 1].startswith("-")):
            given.append(_BARE_FLAGS[a])
    fn = COMMANDS[command]
    early = _files_first(given)
    cfg = inspect.signature(fn).parameters.get("cfg")
    resumable = cfg is not None and "resume" in getattr(cfg.default, "__dataclass_fields__", {})
    file = _settings_file(early) if resumable else early.config
    if cfg is not None and (file is not None or early.recipe is not None):
        cls = type(cfg.default)
        # a recipe's settings first, a config file's (or the run's record) over them, the flags over all
        base = cls.from_recipe(early.recipe) if early.recipe is not None and hasattr(cls, "from_recipe") else None
        if file is not None:
            base = config_from_file(cls, file, base)
            if early.config is None:
                logging.getLogger("bertforge").info("resuming with the settings %s records; flags given override them",
                                                    file)
        fn = functools.partial(fn, cfg=base or cfg.default)
    with _one_line_value_errors(given), speaking_in_flags():
        return tyro.cli(fn, args=given, prog=f"bertforge {command}", config=(PositionalMetavarFromFieldName,),
                        registry=_REGISTRY)


_EXPECTED = {"INT": "an integer", "FLOAT": "a number", "STR": "a value", "PATH": "a path"}


def _one_line_value_errors(args: list[str]) -> contextlib.AbstractContextManager:
    """A flag's value that is not of its type or not among its choices (``--vocab-size 1e26``) as the
    ValueError every other bad value is: one line naming the flag, what it takes and what it got. The command
    line's other errors (an unknown flag, a missing one) keep their own message with its suggestions."""
    try:
        from tyro import _errors as events  # the parser's hook for its errors (where this version has it)

        hook = events.on_parse_error
    except (ImportError, AttributeError):
        return contextlib.nullcontext()

    def one_line(event: Any) -> None:
        argument = getattr(event, "argument", None)
        if argument is None or not isinstance(event, (events.InstantiationFailure, events.InvalidChoice,
                                                      events.BadValue)):
            return
        flags = tuple(argument.lowered.name_or_flags)
        name = next((f for f in flags if f.startswith("--")), flags[0] if flags else str(argument.lowered.metavar))
        metavar = str(argument.lowered.metavar)
        choices = tuple(metavar.strip("{}").split(",")) if metavar.startswith("{") else getattr(event, "choices", None)
        expected = f"one of {', '.join(map(str, choices))}" if choices else _EXPECTED.get(metavar, metavar)
        value = _flag_value(args, flags)
        raise ValueError(f"{name}: expected {expected}" + (f", got {value!r}" if value is not None else " after it"))

    return hook(one_line)


def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value given to the last of ``flags`` in ``args`` (``--flag VALUE`` or ``--flag=VALUE``)."""
    value = None
    for i, a in enumerate(args):
        if a in flags and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        elif a.split("=", 1)[0] in flags and "=" in a:
            value = a.split("=", 1)[1]
    return value


@contextlib.contextmanager
def _console(verbose: bool, stream: str) -> Iterator[None]:
    """The library's log messages on the console while a command runs (`show_logs`). The logger is
    left as it was found, so that main() can run many times in one process (tests, notebooks)."""
    logger = logging.getLogger("bertforge")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    show_logs(verbose, stream)
    shown = warnings.showwarning

    def one_line(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        """A library's warning as the command's own line, not Python's with its source line (-v: both)."""
        if verbose:
            shown(message, category, filename, lineno, file, line)
        else:
            logger.warning("%s", message)

    warnings.showwarning = one_line
    try:
        yield
    finally:
        warnings.showwarning = shown
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def main(argv: list[str] | None = None) -> int:
    """Run ``bertforge COMMAND ...``: 0 on success; bad input is one line on stderr and exit code 2."""
    global _LEFT_PROCESS_GROUP
    try:
        top = _parser().parse_args(argv)
    except KeyboardInterrupt:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    with _console(top.verbose, "stderr" if top.command in DATA_COMMANDS else "stdout"):
        try:
            return _run(top.command, top.args)
        except BrokenPipeError:
            # The reader of our output stopped (``| head``): stop too, quietly, as a process that a
            # SIGPIPE ends (exit 128 + 13); what is still buffered goes nowhere.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except (ValueError, OSError) as e:
            # Bad input (or a full disk: "no space left on PATH") is the user's to fix: one clear line, no
            # traceback (use -v to see one).
            if top.verbose:
                raise
            _say(f"bertforge {top.command}: error: {e}")
            return 2
        except KeyboardInterrupt as e:
            _say(f"bertforge {top.command}: interrupted{f' ({e})' if str(e) else ''}")
            return 130
        finally:
            _LEFT_PROCESS_GROUP = _close_process_group() or _LEFT_PROCESS_GROUP


def _say(line: str) -> None:
    """``line`` on stderr in one write: the processes of a torchrun launch share the stream, and a line
    written in pieces (``print``'s text, then its newline) can interleave with another process's."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _close_process_group() -> bool:
    """Leave the process group a torchrun-launched command joined (True if there was one). Objects held
    only in reference cycles are collected first, while the group and the interpreter are alive."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
        return True
    return False


def run() -> None:
    """The ``bertforge`` program (console script, ``python -m bertforge``, ``torchrun -m bertforge``):
    `main`, then exit with its code.

    A process that joined a process group leaves with ``os._exit`` once its output is flushed and its
    exit handlers have run, skipping the interpreter's and the C++ libraries' teardown. DDP and FSDP tie
    the gloo process group into reference cycles through autograd hooks on the parameters (parameter ->
    hook -> reducer or FSDP state -> group) that no collector can see, so ``destroy_process_group``
    leaves the group and its three worker threads alive until the process ends. Torn down at exit
    with those threads running, the group now and then aborts the process ("terminate called without
    an active exception", exit 1 from torchrun) after a complete, saved run; ending the process
    without that teardown closes the sockets and threads with it."""
    code = main()
    if not _LEFT_PROCESS_GROUP:
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()  # what a normal exit runs (logging's flush among them)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


_LEFT_PROCESS_GROUP = False
"""Whether `main` left a process group (then `run` ends the process without the teardown)."""


if _SIGINT_BEFORE_START_UP is not None:  # imported: Ctrl-C is KeyboardInterrupt again, which main() handles
    signal.signal(signal.SIGINT, _SIGINT_BEFORE_START_UP)


if __name__ == "__main__":
    run()
