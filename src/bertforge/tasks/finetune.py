"""``bertforge finetune / evaluate / predict``: the paper's fine-tuning, for every task family, on the shared
training loop (docs/finetuning.md is the guide). A run (`FinetuneRun`) puts the family's head on a pre-trained
checkpoint, keeps the best model on dev in ``OUT/best/`` and the final one in ``OUT/model/``: checkpoint folders
transformers loads, carrying the settings `load_finetuned` reads back for `evaluate`, `predict` and the
`Predictor`. `finetune_grid` runs the paper's search. `FinetuneConfig` is one flat class because the flags
are its fields; the task families never import this module.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from bertforge.fast import speed_up, quantize_int8
from bertforge.io import atomic_dir, atomic_write_text
from bertforge.model.config import dropout_overrides
from bertforge.model.heads import FEATURE_KEY, FEATURE_MODEL_CLASSES, check_features
from bertforge.settings import RUN_INPUTS, option, read_settings, setting
from bertforge.tasks import family_for, task_names
from bertforge.tasks.base import EvalData, ReadReport, TaskFamily, TaskSettings, TrainData
from bertforge.tasks.encoding import EncodedBatches
from bertforge.tasks.feature_based import CachedObjective, cache_features
from bertforge.tasks.memory import (input_suffix, input_text, is_in_memory, of_the_data, temporary_input,
                                    write_input)
from bertforge.train.callbacks import EarlyStopping, EvalCallback
from bertforge.train.lock import run_lock
from bertforge.train.config import TrainConfig
from bertforge.train.loop import BatchSource, Evaluation, Objective, TrainResult
from bertforge.train.run import Evaluate, TrainingRun
from bertforge.train.plot import read_metrics
from bertforge.train.precision import autocast, resolve_precision
from bertforge.train.rundir import METRICS_FILE

__all__ = ["FinetuneConfig", "FinetuneResult", "PreparedData", "prepare_data", "finetune", "finetune_grid", "GridResult",
           "parse_grid", "PAPER_GRID", "evaluate", "predict", "INPUT_SETTINGS", "MODEL_SETTINGS", "input_settings",
           "SETTINGS_KEY", "FinetunedModel", "load_finetuned"]

logger = logging.getLogger("bertforge")

SETTINGS_KEY = "bertforge_finetune"
"""The config.json entry holding the settings evaluation and prediction reuse (the family's `settings`)."""
BEST_DIR = "best"
BEST_METRICS = "eval_metrics.json"


@dataclass
class FinetuneConfig(TaskSettings, TrainConfig):
    """A fine-tuning run: the loop's settings with the paper's fine-tuning defaults, the task's settings
    (`bertforge.tasks.base.TaskSettings`, what the task family reads), and the run's model and folder."""

    batch_size: int = 32
    """Global batch: sequences (windows) per optimizer step over all processes and accumulation steps."""
    drop_last: bool = setting(False, absent=True)
    """Leave out each epoch's last incomplete batch (transformers' dataloader_drop_last); by default it is
    trained, as a smaller last step of the epoch."""
    max_steps: int = 0
    """Optimizer steps of the run (0: --epochs passes over the training data)."""
    lr: float = 2e-5
    """Peak learning rate (the paper searched 5e-5, 3e-5, 2e-5)."""
    warmup_steps: int | None = None
    """Steps of linear warmup from 0 to the peak, instead of --warmup-ratio (give one, not both)."""
    warmup_ratio: float | None = None
    """Warmup over this share of the steps, then linear decay (not given, and no --warmup-steps: 0.1, the
    paper's tenth)."""
    checkpoint_every: int = 500
    """Save a resumable checkpoint every this many steps (and at the end, and on SIGINT / SIGTERM)."""
    keep_checkpoints: int = 1
    """Keep the last this many checkpoints (0: keep all)."""
    eval_every: int = 0
    """Evaluate on --dev-file every this many steps (0: at the end of every epoch)."""
    model: str = ""
    """Pre-trained checkpoint folder (bertforge or transformers) holding the tokenizer too."""
    out: str = setting("runs/finetune", resumable=True)
    """Run folder: metrics.jsonl, checkpoints/, model/ (final) and best/ (best on dev)."""
    epochs: float = setting(3.0, resumable=True, above=0, at_most=1_000_000)
    """Passes over the training data when --max-steps is 0 (the paper searched 2, 3, 4)."""
    dropout: float | None = setting(None, at_least=0, below=1)
    """Dropout on hidden states and attention probabilities (None: the checkpoint's, 0.1 in published BERTs);
    e.g. 0.1 for a checkpoint pre-trained without dropout."""
    keep_best: bool = True
    """Keep the model that scores best on the dev set in OUT/best/."""
    metric_for_best: str = ""
    """Metric that decides the best model (default: the task's main one: MCC for CoLA, Pearson for STS-B, F1
    for MRPC / QQP / NER / SQuAD, accuracy otherwise; with several dev files, the first file's)."""
    early_stopping_patience: int = setting(0, resumable=True, at_least=0)
    """Stop once --metric-for-best (default: the task's main metric) has not improved for this many evaluations
    in a row (0: train to the end); the run then ends as a finished one."""
    early_stopping_min_delta: float = setting(0.0, resumable=True, at_least=0)
    """With --early-stopping-patience: an improvement of at most this much does not count."""
    grid: str = ""
    """Run a grid and keep the best on dev: "paper" (lr 5e-5, 3e-5, 2e-5 x batch 16, 32 x epochs 2, 3, 4) or a
    subset such as "lr=5e-5,3e-5 batch_size=32 epochs=2,3" (unnamed settings: the run's)."""
    resume: bool = False
    """Continue the run in --out from its latest checkpoint (a grid: from its unfinished runs)."""
    overwrite: bool = False
    """Delete an earlier run's files in --out (metrics, checkpoints, model, best; a grid's runs) and start afresh."""
    features: str = ""
    """The feature-based approach (the paper's Table 7), for tagging and classification: the encoder is
    frozen, its features are computed once before training, and a randomly initialised two-layer BiLSTM
    (--bilstm-size) with the task's output layer trains on them. Features: embeddings, second-to-last,
    last, sum-last-4, concat-last-4, weighted-sum-last-4, weighted-sum-all (learned softmax weights over
    the Transformer layers), or layer indexes such as -1,-2 (concatenated; 0: the embedding output)."""
    bilstm: bool = False
    """Fine-tune the encoder with a randomly initialised two-layer BiLSTM (--bilstm-size) between its last
    layer and the task's output layer (the paper's "+ BiLSTM" row); tagging, classification and SQuAD."""
    bilstm_size: int = setting(768, at_least=1)
    """Hidden units per direction of the BiLSTM of --features and --bilstm (the paper's 768)."""

    DEFAULT_WARMUP_RATIO: ClassVar[float | None] = 0.1
    """Fine-tuning warms up over a tenth of the steps unless a warmup setting is given (the paper)."""
    STEPS_FROM_DATA: ClassVar[bool] = True
    """max_steps 0: set from --epochs once the data is read (`FinetuneRun.settled_config`)."""

    def __post_init__(self) -> None:
        self.join_label_names()  # before the settings' types are checked
        TrainConfig.__post_init__(self)
        if self.task and self.task not in task_names():
            raise ValueError(f"unknown task {self.task!r}; choose one of: {', '.join(task_names())}")
        TaskSettings.__post_init__(self)
        if self.grid:
            parse_grid(self.grid)  # a malformed grid fails before any work
        if self.features:
            check_features(self.features)
        if self.features and self.bilstm:
            raise ValueError(f"{option('features')} trains a BiLSTM on a frozen encoder, {option('bilstm', True)} one "
                             "on a fine-tuned encoder: give one of them")
        if (self.features or self.bilstm) and self.task:
            family = family_for(self.task)
            if self.features and (family.name == "squad" or family.model_class not in FEATURE_MODEL_CLASSES):
                hint = (f"; {option('bilstm', True)} puts the BiLSTM on a fine-tuned encoder" if family.name == "squad"
                        else "")
                raise ValueError(f"{option('features')} applies to tagging and classification, not to {family.name} "
                                 f"({self.task}){hint}")
            if family.model_class not in FEATURE_MODEL_CLASSES:
                raise ValueError(f"{option('bilstm', True)} applies to tagging, classification and SQuAD, not to "
                                 f"{family.name} ({self.task})")


# ---------------------------------------------------------------------------- the paper's grid
PAPER_GRID = {"lr": (5e-5, 3e-5, 2e-5), "batch_size": (16, 32), "epochs": (2.0, 3.0, 4.0)}
"""The paper's fine-tuning search (Appendix A.3); it keeps the best on dev."""
_GRID_TYPES = {"lr": float, "batch_size": int, "epochs": float}


def parse_grid(spec: str) -> dict[str, tuple[Any, ...]]:
    """``"paper"`` or ``"lr=5e-5,3e-5 batch_size=32 epochs=2,3"`` (spaces or semicolons between
    settings; ``batch`` is short for batch_size) -> the values of each setting searched."""
    if spec.strip() == "paper":
        return dict(PAPER_GRID)
    grid: dict[str, tuple[Any, ...]] = {}
    for part in spec.replace(";", " ").split():
        name, sep, values = part.partition("=")
        name = {"batch": "batch_size"}.get(name, name)
        if not sep or name not in _GRID_TYPES or not values:
            raise ValueError(f"{option('grid', spec)}: expected \"paper\" or settings like \"lr=5e-5,3e-5 "
                             f"batch_size=16,32 epochs=2,3\" ({', '.join(_GRID_TYPES)}); got {part!r}")
        try:
            grid[name] = tuple(dict.fromkeys(_GRID_TYPES[name](v) for v in values.split(",") if v))
        except ValueError:
            raise ValueError(f"{option('grid')}: {name} takes {_GRID_TYPES[name].__name__} values, "
                             f"got {values!r}") from None
        if not grid[name] or not all(math.isfinite(v) and v > 0 for v in grid[name]):
            raise ValueError(f"{option('grid')}: {name} values must be finite numbers > 0, got {values!r}")
    if not grid:
        raise ValueError(f"{option('grid', spec)}: no settings")
    return grid


@dataclass
class FinetuneResult:
    train: TrainResult
    model_dir: Path
    """The final weights."""
    best_dir: Path | None
    best: dict[str, Any] | None
    """{"step", "metric", "value", "metrics"} of the best evaluation."""
    eval_metrics: dict[str, float]
    """The last evaluation's."""
    reports: list[ReadReport] = field(default_factory=list)
    """What reading each file kept and skipped."""


# ---------------------------------------------------------------------------- evaluation
def _evaluate_all(family: TaskFamily, model: nn.Module, dev: list[EvalData], cfg: FinetuneConfig,
                  device: torch.device, dist: Any = None) -> tuple[dict[str, float], str, dict[str, str]]:
    """Metrics of every file (prefixed by its name when there are several), the main metric's name
    (the first file's) and the prediction files (prefixed likewise)."""
    metrics: dict[str, float] = {}
    files: dict[str, str] = {}
    main = ""
    names = [data.path.name.split(".")[0] for data in dev]
    if len(set(names)) < len(names):  # a/dev.tsv, b/dev.tsv: dev1_, dev2_
        names = [f"{name}{k + 1}" for k, name in enumerate(names)]
    for k, data in enumerate(dev):
        got = family.evaluate(model, data, cfg, device, dist)
        prefix = f"{names[k]}_" if len(dev) > 1 else ""
        if k == 0:
            main = prefix + got.main
        metrics.update({prefix + name: float(v) for name, v in got.metrics.items()})
        files.update({prefix + name: text for name, text in got.files.items()})
    return metrics, main, files


def _fresh_head(model: nn.Module, source: str, task: str) -> None:
    """Start the task head afresh unless ``source`` was fine-tuned on the same task with the same labels
    (then training continues from its head). A head of another size is already fresh (`from_pretrained`)."""
    from bertforge.model.config import BertConfig

    prefixes = type(model)._fresh_head_prefixes
    report = model.load_report
    loaded = [k for k in model.state_dict() if k.startswith(prefixes)
              and k not in report.newly_initialized + report.reinitialized_mismatched]
    if not loaded:
        return
    old = BertConfig.load(Path(source))
    if old.extra.get("finetuning_task") == task and old.id2label == model.config.id2label:
        logger.info("%s: fine-tuned on %s with the same labels: training continues from its head", source, task)
        return
    for name, module in model.named_modules():
        if name and (name + ".").startswith(prefixes):
            model._init_module(module)
    logger.warning("%s: its %s head (task %s) starts afresh for %s", source, type(model).__name__,
                   old.extra.get("finetuning_task") or "unknown", task)


def _model_class(cfg: FinetuneConfig, family: TaskFamily) -> tuple[type, Any]:
    """The head class of a run and the config to build it with (None: the checkpoint's): the family's
    head, or with --features / --bilstm its BiLSTM variant, whose settings the config records."""
    from bertforge.model.checkpoint import load_config

    if not (cfg.features or cfg.bilstm):
        return family.model_class, None
    config = load_config(cfg.model)
    config.extra[FEATURE_KEY] = {"features": cfg.features or "last", "freeze": bool(cfg.features),
                                 "bilstm_size": cfg.bilstm_size}
    return FEATURE_MODEL_CLASSES[family.model_class], config


def _better(value: float, best: float | None) -> bool:
    return math.isfinite(value) and (best is None or value > best)


# ---------------------------------------------------------------------------- the run
@dataclass
class PreparedData:
    """A task's training and dev files, read and encoded (shared by the runs of a grid)."""

    family: TaskFamily
    cfg: FinetuneConfig
    """With the family's defaults filled in."""
    tokenizer: Any
    train: TrainData
    dev: list[EvalData]


def prepare_data(cfg: FinetuneConfig) -> PreparedData:
    """Read and encode the task's training and dev files."""
    from bertforge.text.tokenizer import BertTokenizer

    for name in ("task", "model", "train_file"):
        if not getattr(cfg, name):
            raise ValueError(f"finetune needs {option(name)}")
    family = family_for(cfg.task)
    cfg = family.configure(cfg)
    tok = BertTokenizer.from_pretrained(cfg.model)
    train = family.train_data(cfg, tok)
    dev = [family.eval_data(cfg, tok, p, train.label2id) for p in family.files(cfg, cfg.dev_file, "dev")]
    return PreparedData(family, cfg, tok, train, dev)


def finetune(cfg: FinetuneConfig, data: PreparedData | None = None, *, train: Any = None, dev: Any = None,
             callbacks: Sequence[EvalCallback] = ()) -> FinetuneResult:
    """Run (or resume) a fine-tuning run; keep the best model on dev; return the outcome. ``data``:
    the files already read by `prepare_data` with the same task, files and encoding settings. ``train`` /
    ``dev``: the data itself instead of ``cfg.train_file`` / ``cfg.dev_file`` (a `datasets.Dataset`, a pandas
    DataFrame, a list of records or a dict of columns: `bertforge.tasks.memory`), kept in ``OUT/inputs/``.
    ``callbacks``: called after every evaluation (`bertforge.train.callbacks`); one that returns true ends the
    run there. The run holds its folder's lock (`bertforge.train.lock.run_lock`) from before it reads its
    files to its end."""
    return FinetuneRun(cfg, data, train=train, dev=dev, callbacks=callbacks).run()


def _check_evaluation(cfg: FinetuneConfig, has_dev: bool, callbacks: Sequence[Any]) -> FinetuneConfig:
    """The rules between the evaluation's settings, checked before any data is read or folder changed: the
    metrics named exist for the task, callbacks are callables, early stopping has dev data to read; without
    dev data there is no best model to keep (said once), and the final model is the run's."""
    named = [(option("metric_for_best"), cfg.metric_for_best)]
    for k, callback in enumerate(callbacks):
        if not callable(callback):
            raise TypeError(f"callbacks[{k}] is {type(callback).__name__} {callback!r:.40}, not a callable "
                            "(step, metrics) -> stop")
        if isinstance(callback, EarlyStopping):
            named.append((f"callbacks[{k}] (EarlyStopping) metric", callback.metric))
    patterns = family_for(cfg.task).metric_names(cfg.task) if cfg.task else ("*",)  # no task: its own check
    for what, name in named:
        if name and not any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*_" + p) for p in patterns):
            raise ValueError(f"{what} {name!r} is not a metric of task {cfg.task}: its evaluation reports "
                             f"{', '.join(patterns)} (with several dev files, each prefixed by its file's name, "
                             f"as dev2_{patterns[0]})")
    stopping = cfg.early_stopping_patience or any(isinstance(c, EarlyStopping) for c in callbacks)
    if stopping and not has_dev:
        raise ValueError(f"early stopping reads the dev metrics: give dev data ({option('dev_file')}) or leave "
                         f"{option('early_stopping_patience')} at 0")
    if cfg.keep_best and not has_dev:
        logger.info("no dev data: the run keeps its final model only (%s)", option("keep_best", False))
        cfg = dataclasses.replace(cfg, keep_best=False)
    return cfg


class FinetuneRun(TrainingRun[FinetuneResult]):
    """Fine-tuning (`bertforge.train.run.TrainingRun`): a task family's files, its head on a pre-trained
    checkpoint, steps from --epochs, and the best model on dev kept in ``OUT/best/``."""

    outputs = (BEST_DIR,)
    cfg: FinetuneConfig

    def __init__(self, cfg: FinetuneConfig, data: PreparedData | None = None, *, train: Any = None,
                 dev: Any = None, callbacks: Sequence[EvalCallback] = ()):
        if cfg.grid:
            raise ValueError("finetune() runs one configuration; finetune_grid() runs a grid")
        for name, given in (("train", train), ("dev", dev)):
            if given is not None and (getattr(cfg, f"{name}_file") or data is not None):
                raise ValueError(f"give the {name} data once: {name}= or {name}_file (or prepared data)")
            if given is not None and not is_in_memory(given):
                cfg = dataclasses.replace(cfg, **{f"{name}_file": str(given)})
        cfg = _check_evaluation(cfg, bool(cfg.dev_file or is_in_memory(dev) or (data is not None and data.dev)),
                                callbacks)
        super().__init__(cfg)
        self.data = data
        self.given = {name: d for name, d in (("train", train), ("dev", dev)) if is_in_memory(d)}
        self.callbacks = list(callbacks)
        if cfg.early_stopping_patience:
            self.callbacks.append(EarlyStopping(cfg.metric_for_best, cfg.early_stopping_patience,
                                                cfg.early_stopping_min_delta))
        self.replayed = False
        self.best_dir = self.out / BEST_DIR
        self.best: dict[str, Any] | None = None
        """{"step", "metric", "value", "metrics"} of the best evaluation so far."""

    def _write_given(self) -> None:
        """Data given in memory written into ``OUT/inputs/`` (the main process writes, the others wait), and the
        settings pointed at it; a ClassLabel's names name the labels unless --label-names does."""
        cfg, dist, folder = self.cfg, self.dist, self.out / RUN_INPUTS
        for split, data in self.given.items():
            text, names = input_text(data, cfg, split)
            if dist.is_main:
                write_input(text, cfg, folder, split, resume=cfg.resume)
            dist.barrier()
            cfg = dataclasses.replace(cfg, **{f"{split}_file": str(folder / f"{split}{input_suffix(cfg.task)}")},
                                      label_names=cfg.label_names or (names if split == "train" else ""))
        self.cfg = cfg

    def read_inputs(self) -> None:
        """The task's files, read here unless given (then checked to have been read with this run's settings)."""
        if self.given:
            self._write_given()
        if self.data is None:
            try:
                self.data = prepare_data(self.cfg)
            except ValueError as e:  # about the data given, not the copy the run keeps of it
                message = str(e)
                for split in self.given:
                    message = of_the_data(message, Path(getattr(self.cfg, f"{split}_file")), split)
                raise type(e)(message) from None
        else:
            configured = self.data.family.configure(self.cfg)
            differ = [name for name in ("task", "model", "train_file", "dev_file", *self.data.family.settings)
                      if getattr(configured, name) != getattr(self.data.cfg, name)]
            if differ:
                raise ValueError(f"the prepared data was read with other settings: {', '.join(differ)}")
        self.tokenizer = self.data.tokenizer

    @property
    def prepared(self) -> PreparedData:
        assert self.data is not None, "read_inputs reads the data"
        return self.data

    @property
    def steps_per_epoch(self) -> int:
        n, batch = len(self.prepared.train.encoded), self.cfg.batch_size
        return n // batch if self.cfg.drop_last else -(-n // batch)

    def settled_config(self) -> FinetuneConfig:
        """The family's defaults filled in, and the run's steps: --max-steps, or --epochs passes over the
        training data; an evaluation every epoch unless --eval-every says otherwise."""
        cfg, per_epoch = self.prepared.family.configure(self.cfg), self.steps_per_epoch
        if per_epoch < 1:
            raise ValueError(f"{cfg.train_file}: {len(self.prepared.train.encoded)} training sequences, fewer than "
                             f"one batch ({cfg.batch_size}) and {option('drop_last', True)} leaves it out; lower "
                             f"{option('batch_size')} to at most that, or keep the last batch")
        max_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * per_epoch))
        return dataclasses.replace(cfg, max_steps=max_steps, eval_every=cfg.eval_every or per_epoch)

    def build_model(self) -> nn.Module:
        """The family's head on the pre-trained checkpoint (the head fresh, the same on every process), with
        the settings evaluation and prediction reuse in its config."""
        cfg, data = self.cfg, self.prepared
        dropout = {} if cfg.dropout is None else dropout_overrides(cfg.dropout)
        model_class, config = _model_class(cfg, data.family)
        model = model_class.from_pretrained(cfg.model, config=config, ignore_mismatched_sizes=True,
                                            **data.train.head, **dropout)
        _fresh_head(model, cfg.model, cfg.task)
        settings = {name: getattr(cfg, name) for name in data.family.settings}
        model.config.extra.update({SETTINGS_KEY: settings, "finetuning_task": cfg.task})
        if cfg.max_seq_length > model.config.max_position_embeddings:
            raise ValueError(f"max_seq_length {cfg.max_seq_length} exceeds the model's "
                             f"{model.config.max_position_embeddings} positions")
        return model

    def setup_training(self, model: nn.Module) -> tuple[Objective, BatchSource, Evaluate | None]:
        cfg, dist, data = self.cfg, self.dist, self.prepared
        objective = data.family.objective(model.config)
        encoded = data.train.encoded
        if cfg.features:  # the frozen encoder's features do not change: computed once, not in every epoch
            encoded = cache_features(model.to(dist.device), encoded, cfg.eval_batch_size, dist.device, dist)
            objective = CachedObjective(objective)
        batches = EncodedBatches(encoded, cfg.micro_batch(dist.world_size), seed=cfg.seed, rank=dist.rank,
                                 world_size=dist.world_size, name=cfg.train_file, drop_last=cfg.drop_last)
        if cfg.resume and (self.best_dir / BEST_METRICS).is_file():
            self.best = json.loads((self.best_dir / BEST_METRICS).read_text(encoding="utf-8"))
        return objective, batches, self.evaluate if data.dev else None

    def evaluate(self, model: nn.Module, step: int) -> Evaluation:
        """The dev files' metrics; a new best asks for the model in ``OUT/best/`` with its prediction files."""
        cfg = self.cfg
        metrics, main, files = _evaluate_all(self.prepared.family, model, self.prepared.dev, cfg, self.dist.device,
                                             self.dist)
        main = cfg.metric_for_best or main
        if main not in metrics:
            raise ValueError(f"{option('metric_for_best', main)} is not among the metrics ({', '.join(metrics)})")
        stop = self._callbacks(step, metrics, main)
        if not (cfg.keep_best and _better(metrics[main], self.best["value"] if self.best else None)):
            return Evaluation(metrics, stop=stop)
        self.best = {"step": step, "metric": main, "value": metrics[main], "metrics": metrics}
        return Evaluation(metrics, save_to=self.best_dir, stop=stop,
                          files={BEST_METRICS: json.dumps(self.best, indent=1) + "\n", **files})

    def _callbacks(self, step: int, metrics: dict[str, float], main: str) -> str:
        """The callbacks' answer on the main process (a reason to stop, or ""); a resumed run's early stopping
        first replays the evaluations the run logged before this step."""
        if not (self.callbacks and self.dist.is_main):
            return ""
        if not self.replayed:  # the first evaluation of this process: the metric is known, the history logged
            self.replayed = True
            logged = read_metrics(self.out).get("eval", []) if (self.out / METRICS_FILE).is_file() else []
            history = [(int(r["step"]), r) for r in logged if r["step"] < step]
            for callback in self.callbacks:
                if isinstance(callback, EarlyStopping):
                    callback.metric = callback.metric or main
                    callback.replay(history)
        for callback in self.callbacks:
            answer = callback(step, metrics)
            if answer:
                return answer if isinstance(answer, str) else f"{getattr(callback, '__name__', 'a callback')} " \
                                                               "asked to stop"
        return ""

    def run_facts(self, model: nn.Module) -> dict[str, Any]:
        return {"labels": self.prepared.train.labels}

    def _inputs(self) -> list[str]:
        """How the training and dev files were read (long inputs: windows or truncation)."""
        data = self.prepared
        return [f"train {data.train.summary}", *(f"dev {d.path.name} {d.summary}" for d in data.dev)]

    def log_start(self) -> None:
        cfg, dist, data = self.cfg, self.dist, self.prepared
        if not dist.is_main:
            return
        labels = data.train.labels
        more = ", ..." if labels is not None and len(labels) > 10 else ""
        kind = "" if labels is None else f", {len(labels)} labels ({', '.join(labels[:10])}{more})"
        schedule = (f"{cfg.max_steps} steps of {cfg.batch_size} ({self.steps_per_epoch} per epoch, warmup "
                    f"{cfg.warmup}) on {dist.device}")
        logger.info("finetune: %s%s; %s", cfg.task, kind, "; ".join(p for p in [*self._inputs(), schedule] if p))
        for r in self._reports():
            if r.num_skipped:
                logger.info("finetune: %s", r.summary())

    def _reports(self) -> list[ReadReport]:
        return self.prepared.train.reports + [d.report for d in self.prepared.dev]

    def finish(self, result: TrainResult) -> FinetuneResult:
        best = self.best
        if self.dist.is_main:  # how long inputs were handled, beside the results they bear on
            logger.info("finetune: inputs: %s", "; ".join(self._inputs()))
        if self.dist.is_main and best is not None:
            logger.info("finetune: best %s %.4f at step %d -> %s", best["metric"], best["value"], best["step"],
                        self.best_dir)
        return FinetuneResult(train=result, model_dir=self.out / "model", best_dir=self.best_dir if best else None,
                              best=best, eval_metrics=result.eval_metrics, reports=self._reports())


@dataclass
class GridResult:
    runs: list[dict[str, Any]]
    """One row per configuration: lr, batch_size, epochs, folder, steps, minutes, best step, metric, value, metrics."""
    best: dict[str, Any] | None
    """The winning row (None if no run evaluated)."""
    best_dir: Path | None
    stopped_early: bool = False
    exit_code: int = 0
    """The stopped run's `TrainResult.exit_code` (0: none stopped by a signal)."""


GRID_DIR = "grid"
GRID_TABLE = "grid.tsv"
_RUN_RESULT = "grid_run.json"


def _grid_name(lr: float, batch_size: int, epochs: float) -> str:
    return f"lr{lr:g}-bs{batch_size}-ep{epochs:g}"


def _grid_table(rows: list[dict[str, Any]]) -> str:
    names = sorted({k for r in rows for k in r["metrics"]})
    head = ["lr", "batch_size", "epochs", "steps", "minutes", "best_step", "metric", "value", *names]
    lines = ["\t".join(head)]
    for r in rows:
        cells = [f"{r['lr']:g}", str(r["batch_size"]), f"{r['epochs']:g}", str(r["steps"]), f"{r['minutes']:.2f}",
                 str(r["best_step"]), r["metric"], f"{r['value']:.6g}",
                 *(f"{r['metrics'][n]:.6g}" if n in r["metrics"] else "" for n in names)]
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"


def finetune_grid(cfg: FinetuneConfig) -> GridResult:
    """The paper's protocol: one run per (lr, batch, epochs) of ``cfg.grid`` in ``OUT/grid/<name>/``,
    the best on dev copied to ``OUT/best/``, and ``OUT/grid.tsv``, a table of every run. The files
    are read once. With ``resume``, finished runs are kept and an interrupted one continues. The grid
    holds OUT's lock (`bertforge.train.lock.run_lock`) from before it reads its files to its end, and
    each run its own folder's."""
    from bertforge.train.distributed import setup

    if not cfg.dev_file:
        raise ValueError(f"{option('grid')} needs {option('dev_file')}: the best run is chosen on dev")
    grid = parse_grid(cfg.grid)
    dist = setup(cfg.device)
    with run_lock(cfg.out, dist):
        return _finetune_grid(cfg, grid, dist)


def _finetune_grid(cfg: FinetuneConfig, grid: dict[str, tuple[Any, ...]], dist: Any) -> GridResult:
    """`finetune_grid` in OUT, whose lock the caller holds."""
    import itertools
    import shutil
    import time

    from bertforge.train.rundir import latest_checkpoint

    single = dataclasses.replace(cfg, grid="")
    data = prepare_data(single)
    out = Path(cfg.out)
    values = [grid.get(name, (getattr(cfg, name),)) for name in ("lr", "batch_size", "epochs")]
    rows: list[dict[str, Any]] = []
    stopped, exit_code = False, 0
    for lr, batch_size, epochs in itertools.product(*values):
        folder = out / GRID_DIR / _grid_name(lr, batch_size, epochs)
        done = folder / _RUN_RESULT
        if done.is_file() and not cfg.overwrite:
            if not cfg.resume:
                raise ValueError(f"{out} already holds a grid; {option('resume', True)} continues it, "
                                 f"{option('overwrite', True)} runs it afresh, or give {option('out')} a new folder")
            rows.append(json.loads(done.read_text(encoding="utf-8")))
            continue
        # resuming a grid: a run killed before its first checkpoint starts again
        resumable = cfg.resume and latest_checkpoint(folder) is not None
        run = dataclasses.replace(single, lr=lr, batch_size=batch_size, epochs=epochs, out=str(folder),
                                  resume=resumable, overwrite=cfg.overwrite or (cfg.resume and not resumable))
        if dist.is_main:
            logger.info("finetune grid: run %d of %d: lr %g, batch %d, epochs %g -> %s", len(rows) + 1,
                        math.prod(len(v) for v in values), lr, batch_size, epochs, folder)
        start = time.perf_counter()
        result = finetune(run, data)
        if result.train.stopped_early:
            stopped, exit_code = True, result.train.exit_code
            break
        best = result.best or {"step": result.train.step, "metric": "", "value": float("nan"),
                               "metrics": result.eval_metrics}
        row = {"lr": lr, "batch_size": batch_size, "epochs": epochs, "folder": str(folder),
               "steps": result.train.step, "minutes": (time.perf_counter() - start) / 60, "best_step": best["step"],
               "metric": best["metric"], "value": best["value"], "metrics": best["metrics"]}
        rows.append(row)
        if dist.is_main:
            atomic_write_text(done, json.dumps(row, indent=1) + "\n")
    scored = [r for r in rows if math.isfinite(r["value"])]
    winner = max(scored, key=lambda r: r["value"]) if scored else None
    best_dir = out / BEST_DIR if winner is not None and not stopped else None
    if dist.is_main:
        atomic_write_text(out / GRID_TABLE, _grid_table(rows))
        if winner is not None and best_dir is not None:
            with atomic_dir(best_dir) as tmp:
                shutil.copytree(Path(winner["folder"]) / BEST_DIR, tmp, dirs_exist_ok=True)
            logger.info("%s", _grid_table(rows).rstrip("\n"))
            logger.info("finetune grid: best %s %.4f: lr %g, batch %d, epochs %g -> %s", winner["metric"],
                        winner["value"], winner["lr"], winner["batch_size"], winner["epochs"], best_dir)
    dist.barrier()
    return GridResult(runs=rows, best=winner, best_dir=best_dir, stopped_early=stopped, exit_code=exit_code)


# ---------------------------------------------------------------------------- using a fine-tuned model
INPUT_SETTINGS = ("task", "text_column", "text_pair_column", "label_column", "label_names", "max_seq_length",
                  "long_inputs", "stride", "max_query_length", "max_answer_length", "n_best_size",
                  "null_score_diff_threshold", "tag_column", "tag_scheme", "skip_bad_rows", "eval_batch_size", "device")
"""FinetuneConfig fields `evaluate`, `predict` and `load_finetuned` accept; unset ones are the checkpoint's
fine-tuning settings."""
MODEL_SETTINGS = ("tag_piece",)
"""Fine-tuning settings the weights were trained for: a fine-tuned checkpoint keeps its own, never overridden."""


def input_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The given (not None) ``settings``, each one of `INPUT_SETTINGS` and held to its FinetuneConfig field's type
    and range as every source of settings is (`bertforge.settings.read_settings`)."""
    return read_settings(FinetuneConfig, {k: v for k, v in (settings or {}).items() if v is not None},
                         only=INPUT_SETTINGS, refused={k: "the checkpoint's own: its weights were fine-tuned for it"
                                                       for k in MODEL_SETTINGS})

# The task of a checkpoint fine-tuned elsewhere (no bertforge settings in its config.json), by its head.
# (SQuAD v1.1 and v2.0 predict differently: a QA checkpoint without settings needs --task.)
_HEAD_TASKS = {"BertForSequenceClassification": "classification", "BertForTokenClassification": "ner",
               "BertForMultipleChoice": "swag"}


@dataclass
class FinetunedModel:
    """A fine-tuned checkpoint loaded for evaluation or prediction (`load_finetuned`)."""

    family: TaskFamily
    model: nn.Module
    """On ``device``, in eval mode."""
    tokenizer: Any
    settings: FinetuneConfig
    """The settings it was fine-tuned with (`INPUT_SETTINGS` and `MODEL_SETTINGS` of them), those given instead
    where given (never a `MODEL_SETTINGS` one), and the family's defaults for what neither sets."""
    device: torch.device


def load_finetuned(checkpoint: str | Path, settings: Mapping[str, Any] | None = None) -> FinetunedModel:
    """A fine-tuned checkpoint folder (a run's ``best/`` or ``model/``, or a checkpoint fine-tuned
    elsewhere) with its task family, tokenizer and settings. ``settings``: any of `INPUT_SETTINGS`
    (`input_settings`; None: unset); they override the checkpoint's. Long inputs are handled as in fine-tuning (a
    classification checkpoint whose settings name no ``long_inputs`` was trained on windows; one
    fine-tuned elsewhere, by truncation); a given ``long_inputs`` truncate drops the saved stride."""
    from bertforge.model.heads import infer_model_class
    from bertforge.train.distributed import setup
    from bertforge.text.tokenizer import BertTokenizer

    given = input_settings(settings)
    model_class = infer_model_class(checkpoint)
    model = model_class.from_pretrained(checkpoint)
    if model.load_report.newly_initialized:
        raise ValueError(f"{checkpoint}: not a fine-tuned model (no weights for "
                         f"{', '.join(model.load_report.newly_initialized)})")
    saved = dict(model.config.extra.get(SETTINGS_KEY) or {})
    task = given.get("task") or saved.get("task") or _HEAD_TASKS.get(model_class.__name__, "")
    if not task:
        qa = model_class.__name__ == "BertForQuestionAnswering"
        raise ValueError(f"{checkpoint}: a {model_class.__name__} fine-tuned elsewhere: name its task "
                         f"({option('task', 'squad')} for SQuAD v1.1, squad2 for v2.0)" if qa
                         else f"{checkpoint}: a {model_class.__name__}, not a fine-tuned model")
    if task == "classification" and model.config.num_labels == 1:
        task = "regression"
    family = family_for(task)
    if not isinstance(model, family.model_class):
        raise ValueError(f"{checkpoint}: holds a {model_class.__name__}; task {task!r} needs a "
                         f"{family.model_class.__name__}")
    if saved and "long_inputs" in family.settings:
        saved.setdefault("long_inputs", "windows")  # settings naming no long_inputs: a run that trained on windows
    if given.get("long_inputs") == "truncate":
        saved.pop("stride", None)  # the saved stride placed windows that truncation does not make
    kept = {k: v for k, v in saved.items() if k in INPUT_SETTINGS + MODEL_SETTINGS}
    cfg = family.configure(FinetuneConfig(**{**kept, **given, "task": task}))
    device = setup(cfg.device).device
    speed_up(model.to(device).eval())
    return FinetunedModel(family, model, BertTokenizer.from_pretrained(checkpoint), cfg, device)


def _label2id(model: nn.Module) -> dict[str, int] | None:
    """The label set evaluation files are checked against (None: regression, or a head without labels)."""
    config = model.config
    if config.num_labels == 1 or config.problem_type == "regression":
        return None
    return config.label2id or {str(i): i for i in range(config.num_labels)}


def evaluate(checkpoint: str | Path, file: Any, *, out: str | Path | None = None, precision: str = "fp32",
             settings: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Metrics of a fine-tuned checkpoint on labelled file(s) (a GLUE folder: its dev split), or on labelled data
    in memory (a `datasets.Dataset`, a DataFrame, records or columns: `bertforge.tasks.memory`).

    ``settings``: any of `INPUT_SETTINGS` (task, columns, max_seq_length, long_inputs, stride, SQuAD's limits, ...);
    unset ones are those the checkpoint was fine-tuned with. ``out``: a folder for the per-example
    prediction files (`bertforge.tasks.base.EvalResult.files`: predictions.tsv, predictions.conll,
    SQuAD's predictions.json, nbest_predictions.json, null_odds.json). ``precision``:
    `bertforge.train.precision.INFERENCE_PRECISIONS`: auto, fp32, bf16, fp16, int8."""
    ft = load_finetuned(checkpoint, settings)
    family, model, cfg, device = ft.family, ft.model, ft.settings, ft.device
    with temporary_input(file, cfg, "dev", labelled=True) as path:
        data = [family.eval_data(cfg, ft.tokenizer, p, _label2id(model)) for p in family.files(cfg, str(path), "dev")]
    precision = resolve_precision(precision, device, inference=True)
    quantize_int8(model, precision == "int8")
    with torch.no_grad(), autocast(precision, device):
        metrics, _, files = _evaluate_all(family, model, data, cfg, device)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            atomic_write_text(Path(out) / name, text)
    return metrics


def predict(checkpoint: str | Path, file: Any, out: str | Path | None = None, *, precision: str = "fp32",
            settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Predictions of a fine-tuned checkpoint for every example of ``file`` or of data in memory (as `evaluate`;
    labels not needed): one JSON-able record per example (the family's: label and scores, tags, answer, choice).

    ``out``: ``.jsonl`` writes the records, anything else the task's own format (GLUE's
    ``index <TAB> prediction`` TSV, CoNLL columns, SQuAD's predictions.json). ``settings`` and
    ``precision``: as `evaluate`."""
    ft = load_finetuned(checkpoint, settings)
    family, cfg, device = ft.family, ft.settings, ft.device
    precision = resolve_precision(precision, device, inference=True)
    quantize_int8(ft.model, precision == "int8")
    with temporary_input(file, cfg, "test", labelled=False) as path:
        files = family.files(cfg, str(path), "test")
        if len(files) != 1:
            raise ValueError(f"{file}: holds {len(files)} test files; name one")
        with torch.no_grad(), autocast(precision, device):
            records = family.predict(ft.model, ft.tokenizer, cfg, files[0], device)
    if out is not None:
        out = Path(out)
        if out.suffix == ".jsonl":
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        else:
            text = family.format_predictions(records, out)
        atomic_write_text(out, text)
    return records
