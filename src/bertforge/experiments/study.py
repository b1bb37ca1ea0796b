"""A study file: the variants of an ablation, the pre-training they share, the tasks they are scored on.

A study is YAML (or JSON) with these keys; paths are as on the command line (relative to the current
folder), so that the bundled studies run from the folder holding a user's data::

    name: table5-mini                 # the report's name
    title: "Effect of the pre-training tasks"
    seeds: [0, 1, 2]                  # every (variant, task) is fine-tuned once per seed
    pretraining:                      # what every variant shares: the same data and the same budget
      corpus: wikipedia-leads         # a built-in text (`bertforge.experiments.datasets`) or a text file
      held_out: ""                    # held-out text for the pre-training's evaluation (built-in: its own)
      vocab_size: 8000                # a WordPiece vocab learned from the corpus, or ...
      vocab: ""                       # ... an existing vocab / checkpoint folder
      prepare: {max_seq_length: 128}  # `bertforge prepare` settings (PrepareConfig)
      pretrain: {model: mini, max_steps: 2000, batch_size: 32, lr: 1e-3}   # `bertforge pretrain` (PretrainConfig)
    finetune: {epochs: 3, lr: 1e-4}   # every task's recipe (FinetuneConfig), before each task's own
    tasks:                            # the report's columns
      - name: MR
        source: movie-reviews         # built-in labelled data; or task / train_file / dev_file as for finetune
        max_train: 2000
      - name: POS (feature-based)
        source: brown-pos
        features: concat-last-4       # any FinetuneConfig setting
    variants:                         # the report's rows
      - name: BERT
        pretrain: {objective: mlm+nsp}
      - name: "+ BiLSTM"
        pretrain: {objective: ltr}
        finetune: {bilstm: true}      # applied to every task of this row
        tasks: [MR]                   # only these columns (default: all)
    figure:                           # optional: score against pre-training steps (the paper's Figure 5)
      task: MR
      variants: [BERT, "LTR & No NSP"]
      every: 500                      # a checkpoint every this many pre-training steps is fine-tuned too

A variant may instead start from an existing checkpoint (``checkpoint: PATH``) and skip pre-training.
Variants whose data and pre-training settings are the same share one pre-training run.

`load_study` checks all the file decides, every error naming the file and the field: each setting
against the type of the config field it sets (`bertforge.settings.check_value`: a bool is no integer,
``1e-4`` is a number), no setting the runner makes itself (where runs write, seeds, evaluation), each
run's config built and so in range, each metric one its task reports.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.settings import SettingValueError, check_device, check_value, field_types

__all__ = ["Study", "TaskSpec", "Variant", "FigureSpec", "Pretraining", "load_study", "bundled_studies",
           "StudyError", "metric_names", "metric_fits", "pretrain_config", "TYPE_F1"]


class StudyError(ValueError):
    """A study file that cannot be run: the message names the file and the field."""


@dataclass(frozen=True)
class TaskSpec:
    """A column: a fine-tuning task and its recipe."""

    name: str
    settings: dict[str, Any]
    """FinetuneConfig fields: the files (or ``source``'s) and the recipe, the study's defaults merged in."""
    source: str = ""
    """Built-in labelled data (`bertforge.experiments.datasets.SOURCES`), or "" for the files in settings."""
    max_train: int = 0
    max_dev: int = 0
    split_seed: int = 0
    metric: str = ""
    """The reported metric (default: the family's main one: accuracy, Pearson, ...)."""


@dataclass(frozen=True)
class Variant:
    """A row: how its model is pre-trained (or which checkpoint it starts from), and fine-tuning changes."""

    name: str
    prepare: dict[str, Any] = field(default_factory=dict)
    pretrain: dict[str, Any] = field(default_factory=dict)
    finetune: dict[str, Any] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()
    checkpoint: str = ""


@dataclass(frozen=True)
class FigureSpec:
    """Fine-tuning score against pre-training steps, from checkpoints saved along the way."""

    task: str
    variants: tuple[str, ...]
    every: int


@dataclass(frozen=True)
class Pretraining:
    """What every variant's pre-training shares."""

    corpus: str = "wikipedia-leads"
    held_out: str = ""
    max_documents: int = 0
    vocab_size: int = 8000
    vocab: str = ""
    prepare: dict[str, Any] = field(default_factory=dict)
    pretrain: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    title: str
    seeds: tuple[int, ...]
    pretraining: Pretraining
    tasks: tuple[TaskSpec, ...]
    variants: tuple[Variant, ...]
    figure: FigureSpec | None = None
    keep_models: bool = False
    """Keep each fine-tuned cell's model folder (off: its metrics and predictions are kept, the weights removed)."""
    description: str = ""
    paper: dict[str, dict[str, float]] = field(default_factory=dict)
    """The paper's figures for the same rows and columns (variant -> task -> value), shown beside the measured."""

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def task(self, name: str) -> TaskSpec:
        return next(t for t in self.tasks if t.name == name)

    def cells(self) -> list[tuple[Variant, TaskSpec]]:
        """The table's filled cells, row by row."""
        return [(v, t) for v in self.variants for t in self.tasks if not v.tasks or t.name in v.tasks]

    def field(self, item: Variant | TaskSpec) -> str:
        """Where ``item`` stands in the study file, as errors name it: "tasks[0] (MR)", "variants[2] (LTR)"."""
        kind, items = ("variants", self.variants) if isinstance(item, Variant) else ("tasks", self.tasks)
        return f"{kind}[{items.index(item)}] ({item.name})"

    def error(self, where: str, message: str) -> "StudyError":
        """An error about the field ``where`` of the study file."""
        return StudyError(f"{self.path}: {where}: {message}")


def slug(name: str) -> str:
    """A folder name for a row or column name ("LTR & No NSP" -> "ltr-no-nsp")."""
    text = re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")
    return text or "x"


def bundled_studies() -> dict[str, Path]:
    """The study files that ship with bertforge: name -> path."""
    root = importlib.resources.files("bertforge.experiments") / "studies"
    found = {Path(str(p)).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")}
    return dict(sorted(found.items()))


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


class _Reader:
    """Checks a study's values, each error naming the file and the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, message: str) -> StudyError:
        return StudyError(f"{self.path}: {where}: {message}")

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        return dict(value)

    def keys(self, data: dict[str, Any], allowed: set[str], where: str) -> None:
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise self.fail(where, f"unknown key{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}; "
                                   f"expected {', '.join(sorted(allowed))}")

    def typed(self, value: Any, annotation: Any, where: str) -> Any:
        """``value`` held to the type ``annotation`` (`bertforge.settings.check_value`)."""
        try:
            return check_value(value, annotation)
        except SettingValueError as e:
            raise self.fail(where, str(e)) from None

    def settings(self, data: Any, cls: type, where: str, owned: dict[str, str] | None = None,
                 mappings: tuple[str, ...] = ()) -> dict[str, Any]:
        """``data`` as settings of the config dataclass ``cls``: each name one of its fields, each value of
        that field's type (``mappings``: fields that may instead hold a mapping, checked elsewhere). A
        setting the runner makes itself (``owned``: name -> why) is refused."""
        data = self.mapping(data, where)
        owned = owned or {}
        for key in data:
            if key in owned:
                raise self.fail(f"{where}.{key}", f"set by the runner, not the study: {owned[key]}")
        kinds = field_types(cls)
        self.keys(data, set(kinds) - set(owned), where)
        checked = {}
        for key, value in data.items():
            if key in mappings and isinstance(value, dict):
                checked[key] = value
                continue
            value = self.typed(value, kinds[key], f"{where}.{key}")
            if key == "lr" and value <= 0:
                raise self.fail(f"{where}.lr", f"expected a learning rate > 0, got {value!r}")
            if key == "seed" and value < 0:  # numpy's generators take none below 0
                raise self.fail(f"{where}.seed", f"expected an integer >= 0, got {value!r}")
            if key == "device":
                try:
                    check_device(value)
                except ValueError as e:
                    raise self.fail(f"{where}.device", str(e)) from None
            checked[key] = value
        return checked

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"expected a non-empty string, got {value!r}")
        return value

    def string(self, value: Any, where: str, default: str = "") -> str:
        """An optional string: ``default`` when not given."""
        return default if value is None else self.typed(value, str, where)

    def integer(self, value: Any, where: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def file(self, value: Any) -> str:
        """A path in the study (as on the command line: relative to the current folder)."""
        return str(Path(str(value)).expanduser())


# Settings the runner decides for every run (where it writes, what it resumes, what it starts from, the
# seed of each cell) rather than the study: name -> why, as a study that sets one is told.
_RESUMES = "a rerun resumes what is unfinished and skips what is finished"
_PRETRAIN_OWNED = {
    "out": "each pre-training writes to its own folder under --out",
    "resume": _RESUMES,
    "overwrite": _RESUMES,
    "data": "the study's corpus, prepared with its prepare settings",
    "eval_data": "the study's held-out text (pretraining.held_out)",
    "tokenizer": "the study's vocab (pretraining.vocab or vocab_size)",
    "progress": "the study logs its progress",
}
_FINETUNE_OWNED = {
    "out": "each cell writes to its own folder under --out",
    "resume": _RESUMES,
    "overwrite": _RESUMES,
    "grid": "a cell is one run; give other recipes as tasks or variants of their own",
    "seed": "the study's seeds (or --seeds) are the cells' seeds",
    "model": "each cell starts from its variant's pre-trained model or checkpoint",
    "keep_best": "each cell keeps the model it is scored by",
    "metric_for_best": "a task's metric key names it",
    "eval_every": "each cell is scored once, after its last step",
    "progress": "the study logs its progress",
}
_FIGURE_OWNED = {
    "checkpoint_every": "a figure variant saves a checkpoint every figure.every steps",
    "keep_checkpoints": "a figure variant keeps every checkpoint, each a point of the figure",
}
_TASK_KEYS = {"name", "source", "max_train", "max_dev", "split_seed", "metric"}
_FILE_SETTINGS = ("train_file", "dev_file")


def load_study(spec: str | Path) -> Study:
    """A study from a file path, or a bundled study's name (`bundled_studies`), with everything the file
    alone decides checked: names, types and ranges of every setting (each run's config built as the
    runner builds it), metrics. What depends on the machine and the data (devices, files, the rows of
    the task files) is checked when the study runs, before any work (`bertforge.experiments.runner`)."""
    from bertforge.data.prepare import PrepareConfig
    from bertforge.experiments.datasets import PRETRAINING_SOURCES, SOURCES
    from bertforge.tasks.finetune import FinetuneConfig
    from bertforge.train.pretrain import PretrainConfig

    bundled = bundled_studies()
    path = Path(spec)
    if not path.exists():
        if str(spec) in bundled:
            path = bundled[str(spec)]
        else:
            raise StudyError(f"{spec}: no such study file, and not a bundled study ({', '.join(bundled)})")
    r = _Reader(path)
    data = r.mapping(_read(path), "top level")
    r.keys(data, {"name", "title", "description", "seeds", "pretraining", "finetune", "tasks", "variants", "figure",
                  "keep_models", "paper"}, "top level")

    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds:
        raise r.fail("seeds", f"expected a non-empty list of integers, got {seeds!r}")
    seeds = tuple(r.integer(s, f"seeds[{i}]") for i, s in enumerate(seeds))
    if len(set(seeds)) != len(seeds):
        raise r.fail("seeds", f"repeated seeds in {list(seeds)}")

    pre = r.mapping(data.get("pretraining"), "pretraining")
    r.keys(pre, _fields(Pretraining), "pretraining")
    corpus = r.text(pre["corpus"], "pretraining.corpus") if "corpus" in pre else Pretraining.corpus
    held_out = r.string(pre.get("held_out"), "pretraining.held_out")
    vocab = r.string(pre.get("vocab"), "pretraining.vocab")
    pretraining = Pretraining(
        corpus=corpus if corpus in PRETRAINING_SOURCES else r.file(corpus),
        held_out=r.file(held_out) if held_out else "",
        max_documents=r.integer(pre.get("max_documents", 0), "pretraining.max_documents"),
        vocab_size=r.integer(pre.get("vocab_size", Pretraining.vocab_size), "pretraining.vocab_size", 100),
        vocab=r.file(vocab) if vocab else "",
        prepare=r.settings(pre.get("prepare"), PrepareConfig, "pretraining.prepare"),
        pretrain=_pretrain_setting(r, r.settings(pre.get("pretrain"), PretrainConfig, "pretraining.pretrain",
                                                 _PRETRAIN_OWNED, mappings=("model",)), "pretraining.pretrain"),
    )

    common = r.settings(data.get("finetune"), FinetuneConfig, "finetune", _FINETUNE_OWNED)
    raw_tasks = data.get("tasks")
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise r.fail("tasks", "expected a non-empty list of tasks (the report's columns)")
    tasks = []
    for i, raw in enumerate(raw_tasks):
        where = f"tasks[{i}]"
        raw = r.mapping(raw, where)
        name = r.text(raw.get("name"), f"{where}.name")
        where = f"tasks[{i}] ({name})"
        settings = r.settings({k: v for k, v in raw.items() if k not in _TASK_KEYS}, FinetuneConfig, where,
                              _FINETUNE_OWNED)
        source = r.string(raw.get("source"), f"{where}.source")
        if source and source not in SOURCES:
            raise r.fail(f"{where}.source", f"unknown built-in data {source!r}; choose from {', '.join(SOURCES)}, or "
                                            "give task, train_file and dev_file")
        if source and any(k in settings for k in ("task", *_FILE_SETTINGS)):
            raise r.fail(where, "give either source or task / train_file / dev_file, not both")
        if not source:
            for key in ("task", *_FILE_SETTINGS):
                if not settings.get(key):
                    raise r.fail(where, f"needs {key} (or a built-in source: {', '.join(SOURCES)})")
            for key in _FILE_SETTINGS:
                settings[key] = ",".join(r.file(p) for p in str(settings[key]).split(","))
        settings = {**common, **settings}
        metric = r.string(raw.get("metric"), f"{where}.metric")
        if metric:
            _check_metric(r, metric, settings.get("task", ""), f"{where}.metric")
        tasks.append(TaskSpec(name=name, settings=settings, source=source,
                              max_train=r.integer(raw.get("max_train", 0), f"{where}.max_train"),
                              max_dev=r.integer(raw.get("max_dev", 0), f"{where}.max_dev"),
                              split_seed=r.integer(raw.get("split_seed", 0), f"{where}.split_seed"),
                              metric=metric))
    task_names = [t.name for t in tasks]
    _unique(r, task_names, "tasks")

    raw_variants = data.get("variants")
    if not isinstance(raw_variants, list) or not raw_variants:
        raise r.fail("variants", "expected a non-empty list of variants (the report's rows)")
    variants = []
    for i, raw in enumerate(raw_variants):
        raw = r.mapping(raw, f"variants[{i}]")
        name = r.text(raw.get("name"), f"variants[{i}].name")
        where = f"variants[{i}] ({name})"
        r.keys(raw, _fields(Variant), where)
        only = raw.get("tasks") or []
        if not isinstance(only, list) or any(not isinstance(t, str) or t not in task_names for t in only):
            raise r.fail(f"{where}.tasks", f"expected a list of the study's task names ({', '.join(task_names)}), "
                                           f"got {only!r}")
        checkpoint = r.string(raw.get("checkpoint"), f"{where}.checkpoint")
        checkpoint = r.file(checkpoint) if checkpoint else ""
        if checkpoint and (raw.get("prepare") or raw.get("pretrain")):
            raise r.fail(where, "a variant with a checkpoint is not pre-trained: drop its prepare / pretrain")
        variants.append(Variant(
            name=name, checkpoint=checkpoint, tasks=tuple(only),
            prepare=r.settings(raw.get("prepare"), PrepareConfig, f"{where}.prepare"),
            pretrain=_pretrain_setting(r, r.settings(raw.get("pretrain"), PretrainConfig, f"{where}.pretrain",
                                                     _PRETRAIN_OWNED, mappings=("model",)), f"{where}.pretrain"),
            finetune=r.settings(raw.get("finetune"), FinetuneConfig, f"{where}.finetune", _FINETUNE_OWNED)))
    _unique(r, [v.name for v in variants], "variants")
    _unique(r, [slug(v.name) for v in variants], "variants (as folder names)")
    _unique(r, [slug(t) for t in task_names], "tasks (as folder names)")

    figure = None
    if data.get("figure"):
        raw = r.mapping(data["figure"], "figure")
        r.keys(raw, {"task", "variants", "every"}, "figure")
        if raw.get("task") not in task_names:
            raise r.fail("figure.task", f"expected one of the study's tasks ({', '.join(task_names)}), "
                                        f"got {raw.get('task')!r}")
        names = raw.get("variants") or [v.name for v in variants if not v.checkpoint]
        if not isinstance(names, list):
            raise r.fail("figure.variants", f"expected a list of the study's pre-trained variants, got {names!r}")
        known = {v.name: v for v in variants}
        bad = [n for n in names if not isinstance(n, str) or n not in known or known[n].checkpoint]
        if bad:
            raise r.fail("figure.variants", f"{', '.join(map(repr, bad))} is not a pre-trained variant of the study")
        figure = FigureSpec(task=raw["task"], variants=tuple(names),
                            every=r.integer(raw.get("every"), "figure.every", 1))
        for name in figure.variants:
            for key, why in _FIGURE_OWNED.items():
                if key in known[name].pretrain:
                    raise r.fail(f"variants[{variants.index(known[name])}] ({name}).pretrain.{key}",
                                 f"set by the runner for the figure's variants, not the study: {why}")
                if key in pretraining.pretrain:
                    raise r.fail(f"pretraining.pretrain.{key}", f"set by the runner for the figure's variants "
                                                                f"({', '.join(figure.variants)}), not the study: {why}")

    paper = r.mapping(data.get("paper"), "paper")
    for row, values in paper.items():
        if row not in {v.name for v in variants}:
            raise r.fail(f"paper.{row}", "not a variant of the study")
        for col, value in r.mapping(values, f"paper.{row}").items():
            if col not in task_names:
                raise r.fail(f"paper.{row}.{col}", "not a task of the study")
            r.typed(value, float, f"paper.{row}.{col}")
    keep = data.get("keep_models", False)
    if not isinstance(keep, bool):
        raise r.fail("keep_models", f"expected true or false, got {keep!r}")
    study = Study(name=r.string(data.get("name"), "name") or path.stem, path=path,
                  title=r.string(data.get("title"), "title"), seeds=seeds, pretraining=pretraining,
                  tasks=tuple(tasks), variants=tuple(variants), figure=figure, keep_models=keep,
                  description=r.string(data.get("description"), "description").strip(), paper=paper)
    _check_configs(r, study, common)
    return study


def _check_configs(r: _Reader, study: Study, common: dict[str, Any]) -> None:
    """Every run's settings in range: the config dataclasses built from the study's settings (paths and
    what the runner sets left at placeholders), each error prefixed by the file and the field whose
    settings it comes from (the shared ones first, then each task's and variant's on top of them). A
    variant's fine-tuning settings with each of its tasks are the runner's to check (`check_study`)."""
    from bertforge.data.prepare import PrepareConfig
    from bertforge.tasks.finetune import FinetuneConfig

    def build(where: str, make: Any, *args: Any, **settings: Any) -> None:
        try:
            make(*args, **settings)
        except (TypeError, ValueError) as e:
            raise r.fail(where, str(e)) from None

    pre = study.pretraining
    build("pretraining.prepare", PrepareConfig, **pre.prepare)
    build("pretraining.pretrain", pretrain_config, pre.pretrain)
    build("finetune", FinetuneConfig, **common)
    for t in study.tasks:
        build(study.field(t), FinetuneConfig, **t.settings)
    for v in study.variants:
        where = study.field(v)
        if not v.checkpoint:
            build(f"{where}.prepare", PrepareConfig, **{**pre.prepare, **v.prepare})
            build(f"{where}.pretrain", pretrain_config, {**pre.pretrain, **v.pretrain})
        if v.finetune:  # on each of its tasks: when the study runs, once the built-in data gives their task
            build(f"{where}.finetune", FinetuneConfig, **v.finetune)


def pretrain_config(settings: dict[str, Any], **runner: Any) -> Any:
    """The `PretrainConfig` of a study's ``pretrain`` settings: its recipe's settings, the study's over
    them, and ``runner``'s (paths, resume, ...) over both. A model given as a mapping of BertConfig
    fields is ``runner``'s to replace by a config.json (a placeholder name here)."""
    from bertforge.train.pretrain import PretrainConfig

    settings = dict(settings)
    recipe = settings.pop("recipe", "paper")
    if isinstance(settings.get("model"), dict):
        settings["model"] = "model_config.json"
    return PretrainConfig.from_recipe(recipe, **{**settings, **runner})


TYPE_F1 = "f1_"
"""The prefix of a tagging task's per-type entity F1 (``f1_PER``)."""


def metric_names(task: str) -> tuple[str, ...]:
    """The metrics fine-tuning on ``task`` reports for a dev file (`bertforge.tasks`' families): a GLUE
    task's (`bertforge.metrics.GLUE_METRICS`); accuracy and F1 (two classes) for classification, Pearson
    and Spearman for regression; token accuracy and, for entity tags, precision, recall, F1 and
    ``f1_TYPE`` per entity type for tagging; SQuAD's exact match and F1 (v2.0: also HasAns / NoAns and
    the best threshold's); accuracy for multiple choice. With several dev files each is prefixed by its
    file's name (``dev_matched_accuracy``)."""
    from bertforge.metrics import GLUE_METRICS
    from bertforge.tasks import family_for
    from bertforge.tasks.classification import GLUE_TASKS

    family = family_for(task).name
    if task in GLUE_TASKS:
        return GLUE_METRICS[task]
    if family == "classification":
        return ("pearson", "spearman") if task == "regression" else ("accuracy", "f1")
    if family == "tagging":
        return ("accuracy", "precision", "recall", "f1", f"{TYPE_F1}TYPE")
    if family == "squad":
        v1 = ("exact_match", "f1", "total")
        return v1 if task == "squad" else (*v1, *(f"{part}_{m}" for part in ("HasAns", "NoAns")
                                                   for m in ("exact", "f1", "total")),
                                           "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")
    return ("accuracy",)


def metric_fits(metric: str, names: tuple[str, ...] | set[str], prefixed: bool = True) -> bool:
    """Whether ``metric`` is one of ``names`` (``f1_TYPE`` for any type where names hold it), or, with
    ``prefixed``, one of them after a dev file's name and "_" (several dev files)."""
    def fits(name: str) -> bool:
        return name in names or (f"{TYPE_F1}TYPE" in names and name.startswith(TYPE_F1) and len(name) > len(TYPE_F1))

    if fits(metric):
        return True
    parts = metric.split("_")
    return prefixed and any(fits("_".join(parts[k:])) for k in range(1, len(parts)))


def _check_metric(r: _Reader, metric: str, task: str, where: str) -> None:
    """``metric`` one the task can report (a built-in source's task: any family's)."""
    from bertforge.tasks import task_names

    if task:
        names = metric_names(task)
        if not metric_fits(metric, names):
            raise r.fail(where, f"{metric!r} is not a metric of task {task} (it reports {', '.join(names)})")
    elif not any(metric_fits(metric, metric_names(t)) for t in task_names()):
        raise r.fail(where, f"{metric!r} is not a metric of any task")


def _read(path: Path) -> Any:
    """A study file's content: YAML (``.yaml`` / ``.yml``) or JSON."""
    from bertforge.io import read_settings_file

    try:
        return read_settings_file(path, "study file")
    except ValueError as e:
        raise StudyError(str(e)) from None


def _pretrain_setting(r: _Reader, settings: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``pretrain`` mapping: its ``recipe`` one of `bertforge.train.pretrain.RECIPES`, its model as
    `_model_setting` checks it."""
    from bertforge.train.pretrain import RECIPES

    recipe = settings.get("recipe")
    if recipe is not None and recipe not in RECIPES:
        raise r.fail(f"{where}.recipe", f"expected one of {', '.join(RECIPES)}, got {recipe!r}")
    return _model_setting(r, settings, where)


def _model_setting(r: _Reader, settings: dict[str, Any], where: str) -> dict[str, Any]:
    """``model`` may be a preset name, a config.json path, or a mapping of BertConfig fields (Table 6's
    sizes); a mapping and a name are checked here, a path when the run starts."""
    from bertforge.model.config import PRESETS, BertConfig

    model = settings.get("model")
    if isinstance(model, dict):
        try:
            BertConfig.from_dict({"vocab_size": 100, **model}, source=f"{r.path}: {where}.model")
        except (TypeError, ValueError) as e:
            raise r.fail(f"{where}.model", str(e)) from None
    elif isinstance(model, str) and (model.endswith(".json") or "/" in model or Path(model).is_dir()):
        settings = {**settings, "model": r.file(model)}
    elif model is not None and model not in PRESETS:
        raise r.fail(f"{where}.model", f"expected a model size ({', '.join(PRESETS)}), a config.json path, or a "
                                       f"mapping of BertConfig fields; got {model!r}")
    return settings


def _unique(r: _Reader, names: list[str], where: str) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise r.fail(where, f"{n!r} appears twice")
        seen.add(n)


def settings_key(settings: dict[str, Any]) -> str:
    """A stable text of a settings mapping (what a run folder's settings are compared by)."""
    return json.dumps(settings, sort_keys=True, default=str)
