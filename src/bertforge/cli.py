"""The ``bertforge`` command line: a table of subcommands, each a thin wrapper over a plain function.

    bertforge vocab      learn a WordPiece vocab.txt from text files   (bertforge.text.vocab.learn_vocab)
    bertforge prepare    raw text -> pre-training shards               (bertforge.data.prepare.prepare)
    bertforge tokenize   show WordPiece tokens / ids of text          (bertforge.BertTokenizer)
    bertforge convert    re-write a BERT checkpoint folder             (bertforge.convert.folders.convert)
    bertforge info       describe a checkpoint folder                  (bertforge.model.checkpoint)
    bertforge export-onnx  a checkpoint as ONNX, checked with onnxruntime (bertforge.convert.onnx.export_onnx)
    bertforge pretrain   MLM + NSP pre-training on prepared shards     (bertforge.train.pretrain.pretrain)
    bertforge finetune   fine-tune: classification, tagging, SQuAD, multiple choice (bertforge.tasks.finetune.finetune)
    bertforge evaluate   metrics of a fine-tuned model on labelled data (bertforge.tasks.finetune.evaluate)
    bertforge predict    a checkpoint's head on texts, or a task file  (bertforge.serving.predictor.Predictor, finetune.predict)
    bertforge serve      a checkpoint's head as an HTTP JSON service   (bertforge.serving.http.serve)
    bertforge features   token vectors / sentence embeddings of texts  (bertforge.serving.features.write_features)
    bertforge plot       redraw a run's training curves                (bertforge.train.plot.plot_run)
    bertforge demo       the end-to-end demo on real data              (bertforge.demo.run.run_demo)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import logging
import sys
import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any


__all__ = ["main", "COMMANDS"]

_DTYPES = ("float32", "bfloat16", "float16")  # torch is imported only by the commands that need it


# ---------------------------------------------------------------------------- typed configs <-> flags
@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (they become ``--help`` texts)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _scalar_type(annotation: Any) -> type:
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(typing), {})  # "int | None" etc. from `from __future__ import annotations`
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return args[0] if len(args) == 1 else str
    return annotation


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = (),
                         only: tuple[str, ...] | None = None, title: str = "") -> None:
    """One ``--flag`` per dataclass field (or per field named in ``only``), typed, with the field's
    default and docstring."""
    docs = field_docs(cls)
    group = parser.add_argument_group(title or f"{cls.__name__} (also settable with --config FILE.json|.yaml)")
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init or (only is not None and f.name not in only):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        kind = _scalar_type(f.type)
        help_text = f"{docs.get(f.name, '')} (default: {default})".replace("%", "%%")  # argparse formats help
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind in (int, float, str):
            group.add_argument(flag, type=kind, default=None, metavar=kind.__name__.upper(), help=help_text)


def read_config_file(file: str | Path) -> dict[str, Any]:
    """Settings from a JSON or (``.yaml`` / ``.yml``) YAML file holding one mapping."""
    try:
        text = Path(file).read_text(encoding="utf-8")
        if str(file).endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read the config file ({e})") from e
    except Exception as e:  # noqa: BLE001 - yaml's errors (YAMLError) without importing yaml up front
        raise ValueError(f"{file}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a mapping of setting names to values")
    return data


def _file_value(value: Any, kind: type, name: str, file: str) -> Any:
    """A config file's value checked against its field's type. Numbers for float fields are
    converted: YAML 1.1 reads ``lr: 1e-4`` (no dot) as a string, JSON ``1`` as an int."""
    if kind is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    elif kind not in (int, float, str, bool) or type(value) is kind:  # a bool is no int here
        return value
    raise ValueError(f"{file}: {name} must be {'a number' if kind is float else kind.__name__}, got {value!r}")


def config_from_args(cls: type, args: argparse.Namespace, *, file: str | None = None) -> Any:
    """Defaults <- the JSON / YAML ``file`` <- flags given on the command line."""
    values: dict[str, Any] = {}
    if file:
        values.update(read_config_file(file))
        kinds = {f.name: _scalar_type(f.type) for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(kinds))
        if unknown:
            raise ValueError(f"{file}: unknown {cls.__name__} settings: {', '.join(unknown)}")
        values = {k: _file_value(v, kinds[k], k, file) for k, v in values.items()}
    for f in dataclasses.fields(cls):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
    return cls(**values)


# ---------------------------------------------------------------------------- vocab
def _vocab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", help="text files (plain, .gz, .bz2 or .xz), read line by line")
    p.add_argument("--out", "-o", required=True, help="folder to write vocab.txt and tokenizer settings into")
    p.add_argument("--vocab-size", type=int, default=30522, help="size of the vocab, special tokens included")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case, strip accents)")
    p.add_argument("--min-frequency", type=int, default=2, help="ignore pieces seen fewer times")
    p.add_argument("--limit-alphabet", type=int, default=1000, help="keep at most this many distinct characters")
    p.add_argument("--num-unused", type=int, default=99,
                   help="[unused] slots (99 reproduces Google's layout: [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103)")


def _vocab(a: argparse.Namespace) -> int:
    from bertforge.text.vocab import learn_vocab

    tok = learn_vocab(a.files, a.out, vocab_size=a.vocab_size, do_lower_case=not a.cased,
                      min_frequency=a.min_frequency, limit_alphabet=a.limit_alphabet, num_unused=a.num_unused)
    print(f"wrote {Path(a.out) / 'vocab.txt'}: {tok.vocab_size} entries")
    return 0


# ---------------------------------------------------------------------------- prepare
def _prepare_args(p: argparse.ArgumentParser) -> None:
    from bertforge.data.prepare import PrepareConfig

    p.add_argument("inputs", nargs="*", help="input files or globs (.gz/.bz2/.xz read transparently)")
    p.add_argument("--out", "-o", help="output folder for shards + manifest.json")
    p.add_argument("--tokenizer", "-t", help="checkpoint or vocab folder (vocab.txt + tokenizer settings)")
    p.add_argument("--workers", type=int, default=1, help="processes building shards in parallel")
    p.add_argument("--num-shards", type=int, default=1, help="split the work across this many machines")
    p.add_argument("--shard-index", type=int, default=0, help="which part of --num-shards this run builds")
    p.add_argument("--stats", metavar="FOLDER", help="print the statistics of a prepared folder and exit")
    p.add_argument("--config", metavar="FILE", help="JSON file of settings (flags override it)")
    add_config_arguments(p, PrepareConfig)


def _prepare(a: argparse.Namespace) -> int:
    from bertforge.data.prepare import PrepareConfig, format_stats, load_manifest, prepare

    if a.stats:
        print(format_stats(load_manifest(a.stats)))
        return 0
    if not a.inputs or not a.out or not a.tokenizer:
        raise ValueError("prepare needs input files, --out and --tokenizer (or --stats FOLDER)")
    cfg = config_from_args(PrepareConfig, a, file=a.config)
    manifest = prepare(a.inputs, a.out, a.tokenizer, cfg, workers=a.workers, num_shards=a.num_shards,
                       shard_index=a.shard_index)
    print(format_stats(manifest))
    return 0


# ---------------------------------------------------------------------------- tokenize
def _tokenize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", "-t", required=True, help="checkpoint folder or vocab.txt")
    p.add_argument("text", nargs="*", help="texts to tokenize (default: one per line from stdin)")
    p.add_argument("--pair", help="a second segment, encoded as [CLS] text [SEP] pair [SEP]")
    p.add_argument("--jsonl", action="store_true", help="print JSON lines (tokens, input_ids, token_type_ids)")


def _tokenize(a: argparse.Namespace) -> int:
    from bertforge.text.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(a.tokenizer)
    texts = a.text or [line.rstrip("\n") for line in sys.stdin]
    for text in texts:
        enc = tok(text, a.pair)
        tokens = tok.convert_ids_to_tokens(enc["input_ids"])
        if a.jsonl:
            print(json.dumps({"text": text, "tokens": tokens, "input_ids": enc["input_ids"],
                              "token_type_ids": enc["token_type_ids"]}, ensure_ascii=False))
        else:
            print(" ".join(tokens))
    return 0


# ---------------------------------------------------------------------------- convert / info
def _convert_args(p: argparse.ArgumentParser) -> None:
    from bertforge.model.heads import MODEL_CLASSES

    p.add_argument("src", help="a BERT checkpoint folder (bertforge or transformers; safetensors or pytorch_model.bin), "
                               "or Google's TensorFlow checkpoint: a folder with bert_model.ckpt.index / .data-* + "
                               "bert_config.json + vocab.txt, or a checkpoint path prefix (read without TensorFlow)")
    p.add_argument("dst", help="folder to write config.json + model.safetensors (+ tokenizer files) into")
    p.add_argument("--model-class", choices=sorted(MODEL_CLASSES),
                   help="class to load as (default: config.json's architectures, else inferred from the weights)")
    p.add_argument("--dtype", choices=_DTYPES, help="cast the weights (default: keep float32)")


def _convert(a: argparse.Namespace) -> int:
    from bertforge.convert.folders import convert

    import torch

    cls = convert(a.src, a.dst, model_class=a.model_class, dtype=getattr(torch, a.dtype) if a.dtype else None)
    print(f"wrote {a.dst} as {cls.__name__}")
    return 0


def _info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a checkpoint folder")


def _info(a: argparse.Namespace) -> int:
    from bertforge.model.checkpoint import read_state_dict
    from bertforge.model.heads import infer_model_class
    from bertforge.model.config import BertConfig

    config = BertConfig.load(a.checkpoint)
    state = read_state_dict(a.checkpoint)
    cls = infer_model_class(a.checkpoint)
    params = sum(t.numel() for t in state.values())
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in state.values()})
    print(f"{a.checkpoint}: {cls.__name__}, {params:,} parameters ({', '.join(dtypes)})")
    print(f"  L={config.num_hidden_layers} H={config.hidden_size} A={config.num_attention_heads} "
          f"I={config.intermediate_size} V={config.vocab_size} positions={config.max_position_embeddings} "
          f"act={config.hidden_act}")
    if config.id2label:
        print(f"  labels: {config.id2label}")
    has_vocab = (Path(a.checkpoint) / "vocab.txt").is_file()
    print(f"  tokenizer: {'vocab.txt present' if has_vocab else 'none in this folder'}")
    return 0


# ---------------------------------------------------------------------------- export-onnx
def _export_onnx_args(p: argparse.ArgumentParser) -> None:
    from bertforge.model.heads import MODEL_CLASSES
    from bertforge.convert.onnx import ATOL, ONNX_OPSET

    p.add_argument("checkpoint", help="a BERT checkpoint folder (bertforge or transformers)")
    p.add_argument("out", help="folder to write model.onnx, config.json and the tokenizer files into "
                               "(optimum's layout)")
    p.add_argument("--model-class", choices=sorted(MODEL_CLASSES),
                   help="class to export (default: config.json's architectures, else inferred from the weights)")
    p.add_argument("--opset", type=int, default=ONNX_OPSET, help=f"ONNX opset (default: {ONNX_OPSET}, the lowest "
                                                                 "PyTorch's exporter implements)")
    p.add_argument("--atol", type=float, default=ATOL,
                   help=f"largest difference from PyTorch allowed in the onnxruntime check (default: {ATOL})")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip the onnxruntime check")


def _export_onnx(a: argparse.Namespace) -> int:
    import torch

    from bertforge.model.checkpoint import load_pretrained
    from bertforge.model.heads import MODEL_CLASSES, infer_model_class
    from bertforge.convert.onnx import export_onnx

    cls = MODEL_CLASSES[a.model_class] if a.model_class else infer_model_class(a.checkpoint)
    model = load_pretrained(cls, a.checkpoint, dtype=torch.float32)
    out = Path(a.out)
    try:
        result = export_onnx(model, out / "model.onnx", opset=a.opset, verify=a.verify, atol=a.atol)
    except ImportError as e:
        print(f"bertforge export-onnx: error: {e}", file=sys.stderr)
        return 2
    model.config.replace(architectures=[cls.__name__]).save(out / "config.json")
    if (Path(a.checkpoint) / "vocab.txt").is_file():
        from bertforge.text.tokenizer import BertTokenizer

        BertTokenizer.from_pretrained(a.checkpoint).save_pretrained(out)
    print(result.summary())
    return 0


# ---------------------------------------------------------------------------- pretrain / plot
def _run_config_arguments(p: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """A training recipe's flags: --config FILE plus one flag per field of its config dataclass."""
    p.add_argument("--config", metavar="FILE", help="JSON or YAML file of settings (flags override it)")
    add_config_arguments(p, cls, skip=skip)


def _report_stop(command: str, result: Any) -> None:
    """``result``: the loop's `TrainResult`."""
    if result.stopped_early:
        print(f"{command}: stopped at step {result.step}; continue with --resume")


def _pretrain_args(p: argparse.ArgumentParser) -> None:
    from bertforge.train.pretrain import PretrainConfig

    _run_config_arguments(p, PretrainConfig)


def _pretrain(a: argparse.Namespace) -> int:
    from bertforge.train.pretrain import PretrainConfig, pretrain

    _report_stop("pretrain", pretrain(config_from_args(PretrainConfig, a, file=a.config)))
    return 0


def _plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run folder holding metrics.jsonl")
    p.add_argument("--out", help="PNG file to write (default: RUN_DIR/curves.png)")


def _plot(a: argparse.Namespace) -> int:
    from bertforge.train.plot import plot_run

    print(f"wrote {plot_run(a.run_dir, a.out)}")
    return 0


# ---------------------------------------------------------------------------- finetune / evaluate / predict
def _finetune_args(p: argparse.ArgumentParser) -> None:
    from bertforge.tasks.finetune import FinetuneConfig

    _run_config_arguments(p, FinetuneConfig, skip=("grid",))
    p.add_argument("--grid", nargs="?", const="paper", default=None, metavar="SPEC",
                   help=field_docs(FinetuneConfig)["grid"] + " (--grid alone: the paper's)")


def _finetune(a: argparse.Namespace) -> int:
    from bertforge.tasks.finetune import FinetuneConfig, finetune, finetune_grid

    cfg = config_from_args(FinetuneConfig, a, file=a.config)
    if cfg.grid:
        grid = finetune_grid(cfg)
        if grid.stopped_early:
            print("finetune: the grid stopped early; continue with --resume")
        elif grid.best is not None:
            print(json.dumps({k: grid.best[k] for k in ("lr", "batch_size", "epochs", "metric", "value")}))
        return 0
    result = finetune(cfg)
    _report_stop("finetune", result.train)
    if result.eval_metrics:
        print(json.dumps(result.eval_metrics))
    return 0


def _model_input_args(p: argparse.ArgumentParser,
                      checkpoint_help: str = "a fine-tuned checkpoint folder (e.g. RUN/best or RUN/model)") -> None:
    """Arguments evaluate, predict and serve share; unset ones are the checkpoint's fine-tuning settings."""
    from bertforge.tasks.finetune import INPUT_SETTINGS, FinetuneConfig

    p.add_argument("checkpoint", help=checkpoint_help)
    add_config_arguments(p, FinetuneConfig, only=INPUT_SETTINGS,
                         title="settings (unset: the ones the checkpoint was fine-tuned with)")


def _model_inputs(a: argparse.Namespace) -> dict[str, Any]:
    from bertforge.tasks.finetune import INPUT_SETTINGS

    return {k: getattr(a, k) for k in INPUT_SETTINGS if getattr(a, k, None) is not None}


def _evaluate_args(p: argparse.ArgumentParser) -> None:
    _model_input_args(p)
    p.add_argument("--file", required=True, help="labelled file(s), comma-separated, or a GLUE task folder (dev)")
    p.add_argument("--out", "-o", help="folder for the task's prediction files (SQuAD: predictions.json, ...)")


def _evaluate(a: argparse.Namespace) -> int:
    from bertforge.tasks.finetune import evaluate

    print(json.dumps(evaluate(a.checkpoint, a.file, out=a.out, **_model_inputs(a))))
    return 0


def _inference_args(p: argparse.ArgumentParser) -> None:
    """What predict and serve share: the checkpoint, its settings and how the model runs."""
    from bertforge.serving.predictor import POOLINGS

    _model_input_args(p, "a checkpoint folder; its head (config.json's architectures) decides what is predicted: "
                         "fill-mask, classification, tagging, QA, multiple choice, embeddings (BertModel)")
    group = p.add_argument_group("inference")
    group.add_argument("--embeddings", action="store_true", help="pooled sentence embeddings, whatever the head")
    group.add_argument("--pooling", choices=POOLINGS, default="mean",
                       help="embeddings: the mean over the tokens, the last layer at [CLS], or BERT's tanh pooler "
                            "(default: mean)")
    group.add_argument("--top-k", type=int, default=5, help="fill-mask: tokens per [MASK] (default: 5)")
    group.add_argument("--batch-size", type=int, help="sequences per forward pass (default: 32)")
    group.add_argument("--bf16", action="store_true", help="run the model under bf16 autocast")


def _predictor(a: argparse.Namespace) -> Any:
    from bertforge.serving.predictor import Predictor

    settings = _model_inputs(a)
    if a.batch_size:
        settings["eval_batch_size"] = a.batch_size
    return Predictor.from_pretrained(a.checkpoint, dtype="bf16" if a.bf16 else None,
                                     head="embeddings" if a.embeddings else None, **settings)


class _IntermixedParser(argparse.ArgumentParser):
    """Options may also stand between the checkpoint and the texts: argparse (Python 3.11 among
    others) ends a ``*`` positional at the first option, so ``predict CKPT --top-k 3 TEXT`` failed."""

    _parsing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._parsing:  # the intermixed parse calls back here for its two passes
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False


def _predict_args(p: argparse.ArgumentParser) -> None:
    p.__class__ = _IntermixedParser
    _inference_args(p)
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="texts: 'a ||| b' for a pair, 'question ||| context' for QA, 'context ||| choice ||| choice "
                        "...' for multiple choice; - reads them from stdin, one per line. Or, for a fine-tuned "
                        "checkpoint, one existing task file or folder, read as evaluate reads it (GLUE TSV, CSV, "
                        "JSONL, CoNLL, SQuAD JSON, SWAG CSV)")
    p.add_argument("--file", "-f", help="texts, one per line as INPUT (.gz/.bz2/.xz read transparently; - for stdin)")
    p.add_argument("--out", "-o",
                   help="write the predictions here (default: stdout). A task file's: .jsonl records, else the "
                        "task's format (GLUE TSV, CoNLL, SQuAD JSON)")
    p.add_argument("--format", choices=("text", "jsonl"),
                   help="for texts: readable lines or JSON records (default: jsonl for an --out ending in .jsonl, "
                        "else text)")


def _predict(a: argparse.Namespace) -> int:
    from bertforge.serving.features import read_inputs
    from bertforge.serving.predictor import FINE_TUNED_HEADS, SEPARATOR, checkpoint_head, format_records
    from bertforge.io import atomic_write_text

    head = "embeddings" if a.embeddings else checkpoint_head(a.checkpoint)
    if (head in FINE_TUNED_HEADS and a.file is None and len(a.inputs) == 1 and a.inputs[0] != "-"
            and Path(a.inputs[0]).exists()):
        return _predict_task_file(a)

    def lines(path: str) -> list[str]:  # stripped, UTF-8 checked; blank lines are inputs too (as features reads)
        return [SEPARATOR.join(t for t in pair if t is not None) for pair in read_inputs(path)]

    texts = [t for x in a.inputs for t in (lines("-") if x == "-" else [x])]
    if a.file:
        texts += lines(a.file)
    if not texts:
        raise ValueError("no inputs: give texts, --file FILE, or - to read them from stdin")
    predictor = _predictor(a)
    records = predictor(texts, top_k=a.top_k, pooling=a.pooling)
    fmt = a.format or ("jsonl" if a.out and a.out.endswith(".jsonl") else "text")
    text = format_records(records, predictor.head, fmt)
    if a.out:
        atomic_write_text(a.out, text)
        print(f"wrote {len(records):,} predictions to {a.out}")
    else:
        sys.stdout.write(text)
    return 0


def _predict_task_file(a: argparse.Namespace) -> int:
    """A fine-tuned model on a task file: the family's records (`bertforge.tasks.finetune.predict`)."""
    from bertforge.tasks.finetune import predict

    settings = _model_inputs(a)
    if a.batch_size:
        settings["eval_batch_size"] = a.batch_size
    records = predict(a.checkpoint, a.inputs[0], a.out, precision="bf16" if a.bf16 else "fp32", **settings)
    if a.out:
        print(f"wrote {len(records):,} predictions to {a.out}")
    else:
        sys.stdout.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return 0


# ---------------------------------------------------------------------------- serve
def _serve_args(p: argparse.ArgumentParser) -> None:
    from bertforge.serving.http import MAX_BATCH, MAX_REQUEST_BYTES

    _inference_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--max-batch", type=int, default=MAX_BATCH,
                   help=f"most inputs in one request (default: {MAX_BATCH})")
    p.add_argument("--max-request-bytes", type=int, default=MAX_REQUEST_BYTES,
                   help=f"largest request body (default: {MAX_REQUEST_BYTES})")


def _serve(a: argparse.Namespace) -> int:
    from bertforge.serving.http import serve

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(f"bertforge serve: error: {e.name} is not installed; pip install 'bertforge[serve]'", file=sys.stderr)
        return 2
    serve(_predictor(a), host=a.host, port=a.port, max_batch=a.max_batch, max_request_bytes=a.max_request_bytes,
          top_k=a.top_k, pooling=a.pooling)
    return 0


# ---------------------------------------------------------------------------- features
def _features_args(p: argparse.ArgumentParser) -> None:
    import re

    from bertforge.serving.features import COMBINES, POOLINGS

    # Let "--layers -1,-2" read as a value, not as an unknown option (Python >= 3.13 does this itself).
    if hasattr(p, "_negative_number_matcher"):
        p._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(,-?\d+)+$")
    p.add_argument("checkpoint", help="a BERT checkpoint folder (bertforge or transformers) holding the tokenizer")
    p.add_argument("input", help="text file, one input per line ('text_a ||| text_b' for a pair; .gz/.bz2/.xz "
                                 "read transparently), or - for stdin")
    p.add_argument("--out", "-o", required=True,
                   help="output file: .jsonl (the layout of Google's extract_features.py), .npy or .safetensors "
                        "(arrays for large runs; layout in bertforge.serving.features)")
    p.add_argument("--layers", help="comma-separated hidden-state indexes: -1 the last layer, 0 the embedding output "
                                    "(default: -1,-2,-3,-4; with --pooling: -1)")
    p.add_argument("--combine", choices=COMBINES, default="concat",
                   help="put the layers side by side or add them up (default: concat)")
    p.add_argument("--pooling", choices=POOLINGS,
                   help="one vector per input: the one at [CLS], or the mean over its tokens (default: one per token)")
    p.add_argument("--max-seq-length", type=int,
                   help="tokens per forward pass (default: 128, or the model's positions if fewer); longer inputs "
                        "are cut into windows, each token taken from the window where it has the most context")
    p.add_argument("--stride", type=int, default=0, help="tokens between window starts (0: half a window)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per forward pass")
    p.add_argument("--bf16", action="store_true", help="run the model under bf16 autocast")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:K")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="show a progress bar on stderr")


def _features(a: argparse.Namespace) -> int:
    from bertforge.serving.features import output_format, parse_layers, read_inputs, write_features

    output_format(a.out)  # before reading the input
    written = write_features(a.checkpoint, read_inputs(a.input), a.out,
                             layers=parse_layers(a.layers) if a.layers else None, combine=a.combine,
                             pooling=a.pooling, max_seq_length=a.max_seq_length, stride=a.stride,
                             batch_size=a.batch_size, precision="bf16" if a.bf16 else "fp32", device=a.device,
                             progress=a.progress)
    print(written.summary())
    return 0


# ---------------------------------------------------------------------------- demo
def _demo_args(p: argparse.ArgumentParser) -> None:
    from bertforge.demo.run import DemoConfig

    _run_config_arguments(p, DemoConfig)


def _demo(a: argparse.Namespace) -> int:
    from bertforge.demo.run import DemoConfig, run_demo

    run_demo(config_from_args(DemoConfig, a, file=a.config))
    return 0


# name -> (help, add arguments, run)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "vocab": ("learn a WordPiece vocab.txt from text files", _vocab_args, _vocab),
    "prepare": ("turn raw text into pre-training shards (Google's create_pretraining_data, streamed)",
                _prepare_args, _prepare),
    "tokenize": ("show the WordPiece tokens and ids of text", _tokenize_args, _tokenize),
    "convert": ("re-write a BERT checkpoint folder (transformers <-> bertforge, .bin -> safetensors, Google's TF "
                "checkpoints)",
                _convert_args, _convert),
    "info": ("describe a checkpoint folder", _info_args, _info),
    "export-onnx": ("export a checkpoint to ONNX (dynamic batch and sequence axes), checked with onnxruntime",
                    _export_onnx_args, _export_onnx),
    "pretrain": ("pre-train BERT (masked LM + next sentence prediction) on prepared shards; torchrun for many "
                 "processes", _pretrain_args, _pretrain),
    "finetune": ("fine-tune: classification / regression (GLUE or CSV / TSV / JSONL), NER (CoNLL), SQuAD v1.1 / "
                 "v2.0, multiple choice (SWAG); --grid for the paper's search", _finetune_args, _finetune),
    "evaluate": ("metrics of a fine-tuned model on labelled data", _evaluate_args, _evaluate),
    "predict": ("a checkpoint's head on texts (fill-mask, classification, tagging, QA, multiple choice, "
                "embeddings; readable text or JSONL), or a fine-tuned model on a task file", _predict_args, _predict),
    "serve": ("serve a checkpoint's head over HTTP: JSON in and out, a health route, request limits",
              _serve_args, _serve),
    "features": ("per-token vectors of chosen layers, or pooled sentence embeddings (JSONL as Google's "
                 "extract_features.py, .npy or .safetensors)", _features_args, _features),
    "plot": ("draw a run's training curves (metrics.jsonl -> curves.png)", _plot_args, _plot),
    "demo": ("run the end-to-end demo on real data", _demo_args, _demo),
}


def build_parser() -> argparse.ArgumentParser:
    from bertforge import __version__

    parser = argparse.ArgumentParser(prog="bertforge", description="BERT, as the paper describes it.")
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more detail")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_args, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_args(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, OSError) as e:
        # Bad input is the user's to fix: one clear line, no traceback (use -v to see one).
        if args.verbose:
            raise
        print(f"bertforge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"bertforge {args.command}: interrupted{f' ({e})' if str(e) else ''}", file=sys.stderr)
        return 130
    finally:
        _close_process_group()


def _close_process_group() -> None:
    """Leave the process group a torchrun-launched command joined: exiting with its communication
    threads still running aborts the process ("terminate called without an active exception")."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
