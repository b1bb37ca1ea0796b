"""A study file: the variants of an ablation, the pre-training they share, the tasks they are scored on.

A study is YAML (or JSON); docs/experiments.md lists its keys. Paths are as on the command line
(relative to the current folder)::

    name: table5-mini
    seeds: [0, 1, 2]                  # every (variant, task) is fine-tuned once per seed
    pretraining:                      # what every variant shares: the same data and the same budget
      corpus: wikipedia-leads         # a built-in text or a text file
      vocab_size: 8000                # a WordPiece vocab learned from the corpus (or vocab: a folder)
      prepare: {max_seq_length: 128}  # PrepareConfig settings
      pretrain: {model: mini, max_steps: 2000}   # PretrainConfig settings
    finetune: {epochs: 3, lr: 1e-4}   # every task's FinetuneConfig settings, before each task's own
    tasks:                            # the report's columns
      - {name: MR, source: movie-reviews, max_train: 2000}
    variants:                         # the report's rows
      - {name: BERT, pretrain: {objective: mlm+nsp}}
      - {name: "+ BiLSTM", pretrain: {objective: ltr}, finetune: {bilstm: true}, tasks: [MR]}
    figure: {task: MR, variants: [BERT], every: 500}   # optional: score against pre-training steps
    orderings: ["BERT > + BiLSTM"]    # optional: the paper's findings, tested per task (paired by seed)

A variant may instead start from a checkpoint (``checkpoint: PATH``); variants with the same data and
pre-training settings share one pre-training run. `load_study` checks everything the file decides,
each error naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from bertforge.data.prepare import PrepareConfig
from bertforge.settings import (
    AS_GIVEN,
    OTHER_KEYS,
    FieldError,
    HugeNumber,
    SettingValueError,
    check_keys,
    check_value,
    field_types,
    from_mapping,
    out_of_range,
    read_mapping,
    read_settings,
    read_value,
)
from bertforge.tasks.finetune import FinetuneConfig
from bertforge.text.vocab import MAX_VOCAB_SIZE
from bertforge.train.pretrain import PretrainConfig

__all__ = ["Study", "TaskSpec", "Variant", "FigureSpec", "Pretraining", "StudyFolder", "load_study", "bundled_studies",
           "StudyError", "metric_names", "metric_fits", "pretrain_config", "TYPE_F1"]


class StudyError(ValueError):
    """A study file that cannot be run: the message names the file and the field."""


# Settings the runner decides for every run rather than the study: name -> why, as a study is told.
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
_FILE_SETTINGS = ("train_file", "dev_file")


# ---------------------------------------------------------------------------- field checks
# Each is ``check(value, where) -> value`` (`bertforge.settings.read_value`): rules beyond a field's type.
class _AtLeast:
    """An integer >= ``minimum`` (and <= ``maximum``, if given)."""

    def __init__(self, minimum: int, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def __call__(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise SettingValueError(f"an integer >= {self.minimum}", value)
        if self.maximum is not None and value > self.maximum:
            raise SettingValueError(f"an integer in [{self.minimum}, {self.maximum:,}]", HugeNumber.shown(value))
        return value


def _non_empty(value: Any, where: str) -> str:
    """A name: a string with more than blanks."""
    if not isinstance(value, str) or not value.strip():
        raise SettingValueError("a non-empty string", value)
    return value


def _text(value: Any) -> str:
    """An optional string: "" when not given."""
    return "" if value is None else check_value(value, str)


def _file(value: Any, where: str) -> str:
    """An optional path, as on the command line (relative to the current folder): "" when not given."""
    value = _text(value)
    return str(Path(value).expanduser()) if value else ""


def _corpus(value: Any, where: str) -> str:
    """The built-in pre-training text's name, or a text file's path."""
    from bertforge.experiments.datasets import PRETRAINING_SOURCES

    value = _non_empty(value, where)
    return value if value in PRETRAINING_SOURCES else str(Path(value).expanduser())


def _builtin_data(value: Any, where: str) -> str:
    """A built-in labelled data set's name, or "" (the task's files are its settings)."""
    from bertforge.experiments.datasets import SOURCES

    value = _text(value)
    if value and value not in SOURCES:
        raise FieldError(where, f"unknown built-in data {value!r}; choose from {', '.join(SOURCES)}, or give task, "
                                "train_file and dev_file")
    return value


def _seeds(value: Any, where: str) -> Any:
    """Fine-tuning seeds: each a value of FinetuneConfig's ``seed``, at least one, none twice."""
    if not isinstance(value, list) or not value:
        raise SettingValueError("a non-empty list of integers", value)
    for i, seed in enumerate(value):
        try:
            _AtLeast(0)(seed, where)
        except SettingValueError as e:
            raise FieldError(f"{where}[{i}]", str(e)) from None
        if problem := out_of_range(FinetuneConfig, "seed", seed):
            raise FieldError(f"{where}[{i}]", problem)
    if len(set(value)) != len(value):
        raise FieldError(where, f"repeated seeds in {list(value)}")
    return value


class _NonEmptyList:
    """A list with at least one item (the items are read by their type)."""

    def __init__(self, what: str):
        self.what = what

    def __call__(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list) or not value:
            raise FieldError(where, f"expected a non-empty list of {self.what}")
        return value


def _none_if_empty(value: Any, where: str) -> Any:
    """An optional part: left out, null or empty, there is none."""
    return value or None


def _model_mapping(value: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``model:`` mapping of BertConfig fields, the whole a valid config (the vocab size a stand-in)."""
    from bertforge.model.config import BertConfig

    kinds = {k: v for k, v in field_types(BertConfig).items() if k != "extra"}
    check_keys(value, set(kinds), where)
    for key, item in value.items():
        try:
            check_value(item, kinds[key])
        except SettingValueError as e:
            raise FieldError(f"{where}.{key}", str(e)) from None
    try:
        BertConfig(**{"vocab_size": 30522, **value})
    except (ValueError, TypeError) as e:
        raise FieldError(where, str(e)) from None
    return value


class _Settings:
    """Settings of the config dataclass ``config`` (`bertforge.settings.read_settings`); ``mappings``:
    fields that may hold a mapping of model settings; ``owned`` (name -> why): refused settings."""

    def __init__(self, config: type, owned: dict[str, str] | None = None, mappings: tuple[str, ...] = ()):
        self.config = config
        self.refused = {name: f"set by the runner, not the study: {why}" for name, why in (owned or {}).items()}
        self.mappings = mappings

    def __call__(self, value: Any, where: str) -> dict[str, Any]:
        data = read_mapping(value, where)
        models = {k: _model_mapping(v, f"{where}.{k}") for k, v in data.items()
                  if k in self.mappings and isinstance(v, dict)}
        checked = read_settings(self.config, {k: v for k, v in data.items() if k not in models}, where,
                                refused=self.refused)
        return {k: models[k] if k in models else checked[k] for k in data}


Name = Annotated[str, _non_empty]
Count = Annotated[int, _AtLeast(0)]
File = Annotated[str, _file]
PrepareSettings = Annotated[dict[str, Any], _Settings(PrepareConfig)]
PretrainSettings = Annotated[dict[str, Any], _Settings(PretrainConfig, _PRETRAIN_OWNED, mappings=("model",))]
FinetuneSettings = Annotated[dict[str, Any], _Settings(FinetuneConfig, _FINETUNE_OWNED)]


# ---------------------------------------------------------------------------- the study's parts
@dataclass(frozen=True)
class TaskSpec:
    """A column: a fine-tuning task and its settings."""

    name: Name
    settings: FinetuneSettings = field(metadata=OTHER_KEYS)
    """FinetuneConfig fields (in the file beside the task's other keys), the study's defaults merged in."""
    source: Annotated[str, _builtin_data] = ""
    """Built-in labelled data (`bertforge.experiments.datasets.SOURCES`), or "" for the files in settings."""
    max_train: Count = 0
    max_dev: Count = 0
    split_seed: Count = 0
    metric: str = ""
    """The reported metric (default: the family's main one: accuracy, Pearson, ...)."""


@dataclass(frozen=True)
class Variant:
    """A row: how its model is pre-trained (or which checkpoint it starts from), and fine-tuning changes."""

    name: Name
    prepare: PrepareSettings = field(default_factory=dict)
    pretrain: PretrainSettings = field(default_factory=dict)
    finetune: FinetuneSettings = field(default_factory=dict)
    tasks: tuple[str, ...] = field(default=(), metadata=AS_GIVEN)
    """Only these of the study's tasks (default: all)."""
    checkpoint: File = ""


@dataclass(frozen=True, kw_only=True)
class FigureSpec:
    """Fine-tuning score against pre-training steps, from checkpoints saved along the way."""

    task: str = field(metadata=AS_GIVEN)
    variants: tuple[str, ...] = field(default=(), metadata=AS_GIVEN)
    """The variants drawn (default: every pre-trained one)."""
    every: Annotated[int, _AtLeast(1)]


@dataclass(frozen=True)
class Pretraining:
    """What every variant's pre-training shares."""

    corpus: Annotated[str, _corpus] = "wikipedia-leads"
    held_out: File = ""
    max_documents: Count = 0
    vocab_size: Annotated[int, _AtLeast(100, MAX_VOCAB_SIZE)] = 8000
    vocab: File = ""
    prepare: PrepareSettings = field(default_factory=dict)
    pretrain: PretrainSettings = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Study:
    """A study file's content (module docstring); ``path`` is the file's."""

    name: str = ""
    path: Path
    title: str = ""
    seeds: Annotated[tuple[int, ...], _seeds] = (0,)
    pretraining: Pretraining = field(default_factory=Pretraining)
    finetune: FinetuneSettings = field(default_factory=dict)
    """Every task's fine-tuning settings, before each task's own (already merged into each task's settings)."""
    tasks: Annotated[tuple[TaskSpec, ...], _NonEmptyList("tasks (the report's columns)")]
    variants: Annotated[tuple[Variant, ...], _NonEmptyList("variants (the report's rows)")]
    figure: Annotated[FigureSpec | None, _none_if_empty] = None
    keep_models: bool = False
    """Keep each fine-tuned cell's model folder (off: its metrics and predictions are kept, the weights removed)."""
    description: str = ""
    paper: dict[str, dict[str, float]] = field(default_factory=dict, metadata=AS_GIVEN)
    """The paper's figures for the same rows and columns (variant -> task -> value), shown beside the measured."""
    orderings: tuple[tuple[str, str], ...] = field(default=(), metadata=AS_GIVEN)
    """The paper's findings as (above, below) pairs of rows, from ``"A > B"`` strings."""

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
        return StudyError(f"{self.path}: {where}: {message}")


def slug(name: str) -> str:
    """A folder name for a row or column name ("LTR & No NSP" -> "ltr-no-nsp")."""
    text = re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")
    return text or "x"


@dataclass(frozen=True)
class StudyFolder:
    """Where a study's runs and report lie in its folder (``--out``; see `bertforge.experiments.runner`)."""

    root: Path

    @property
    def data(self) -> Path:
        """The built-in task files and pre-training text, as real files."""
        return self.root / "data"

    @property
    def vocab(self) -> Path:
        """The WordPiece vocab learned from the corpus (when the study gives none)."""
        return self.root / "vocab"

    def prepared(self, name: str) -> Path:
        """Pre-training shards of one prepare setting."""
        return self.root / "prepared" / name

    def pretraining(self, run: str) -> Path:
        """A pre-training shared by one or more variants: its records, and its run (`pretraining_run`)."""
        return self.root / "pretrain" / run

    def pretraining_run(self, run: str) -> Path:
        """The `bertforge pretrain` run folder of a pre-training (its ``model/`` the pre-trained model)."""
        return self.pretraining(run) / "run"

    @property
    def classic_baselines(self) -> Path:
        """Each task's classic baselines, fitted once (`bertforge.experiments.baselines.task_baselines`)."""
        return self.root / "classic_baselines.json"

    def cell(self, variant: str, task: str, seed: int) -> Path:
        """A table cell's fine-tuning run: ``variant`` fine-tuned on ``task`` with ``seed``."""
        return self.root / "cells" / slug(variant) / slug(task) / f"seed-{seed}"

    def figure_cell(self, variant: str, task: str, step: int, seed: int) -> Path:
        """A figure point's fine-tuning run: from ``variant``'s pre-training checkpoint at ``step``."""
        return self.root / "figure" / slug(variant) / slug(task) / f"step-{step:08d}" / f"seed-{seed}"

    def cell_files(self, name: str) -> list[Path]:
        """The file ``name`` of every table cell there is, in order."""
        return sorted(self.root.glob(f"cells/*/*/seed-*/{name}"))

    def figure_cell_files(self, name: str) -> list[Path]:
        """The file ``name`` of every figure cell there is, in order."""
        return sorted(self.root.glob(f"figure/*/*/step-*/seed-*/{name}"))

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def report_data(self) -> Path:
        """The report's numbers, cells and machine as JSON."""
        return self.root / "report.json"

    @property
    def scores_plot(self) -> Path:
        return self.root / "scores.png"

    @property
    def figure_plot(self) -> Path:
        return self.root / "figure.png"


def bundled_studies() -> dict[str, Path]:
    """The study files that ship with bertforge: name -> path."""
    root = importlib.resources.files("bertforge.experiments") / "studies"
    found = {Path(str(p)).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")}
    return dict(sorted(found.items()))


def load_study(spec: str | Path) -> Study:
    """A study from a file path or a bundled study's name, with everything the file alone decides
    checked; what depends on the machine and the data is checked when it runs (`check_study`)."""
    bundled = bundled_studies()
    path = Path(spec)
    if not path.exists():
        if str(spec) in bundled:
            path = bundled[str(spec)]
        else:
            raise StudyError(f"{spec}: no such study file, and not a bundled study ({', '.join(bundled)})")
    try:
        study = from_mapping(Study, _read(path), given={"path": path})
    except FieldError as e:
        raise StudyError(f"{path}: {e}") from None
    pre = study.pretraining
    study = dataclasses.replace(
        study, name=study.name or path.stem, description=study.description.strip(),
        pretraining=dataclasses.replace(pre, pretrain=_pretrain_setting(study, pre.pretrain, "pretraining.pretrain")))
    study = _with_task_files(study)
    study = _with_variant_tasks(study)
    study = _with_figure_variants(study)
    study = _with_paper(study)
    study = _with_orderings(study)
    _check_configs(study)
    return study


def _with_task_files(study: Study) -> Study:
    """Each task's data (a built-in source, or a task and its files), the study's settings under its own."""
    from bertforge.experiments.datasets import SOURCES

    tasks = []
    for i, t in enumerate(study.tasks):
        where, settings = f"tasks[{i}] ({t.name})", dict(t.settings)
        if t.source and any(k in settings for k in ("task", *_FILE_SETTINGS)):
            raise study.error(where, "give either source or task / train_file / dev_file, not both")
        if not t.source:
            for key in ("task", *_FILE_SETTINGS):
                if not settings.get(key):
                    raise study.error(where, f"needs {key} (or a built-in source: {', '.join(SOURCES)})")
            for key in _FILE_SETTINGS:
                settings[key] = ",".join(str(Path(p).expanduser()) for p in str(settings[key]).split(","))
        settings = {**study.finetune, **settings}
        if t.metric:
            _check_metric(study, t.metric, settings.get("task", ""), f"{where}.metric")
        tasks.append(dataclasses.replace(t, settings=settings))
    _unique(study, [t.name for t in tasks], "tasks")
    return dataclasses.replace(study, tasks=tuple(tasks))


def _with_variant_tasks(study: Study) -> Study:
    """Each variant's tasks among the study's, its pre-training checked; names unique, also as folders."""
    names = [t.name for t in study.tasks]
    variants = []
    for i, v in enumerate(study.variants):
        where = f"variants[{i}] ({v.name})"
        only = v.tasks or []
        if not isinstance(only, list) or any(not isinstance(t, str) or t not in names for t in only):
            raise study.error(f"{where}.tasks", f"expected a list of the study's task names ({', '.join(names)}), "
                                                f"got {only!r}")
        if v.checkpoint and (v.prepare or v.pretrain):
            raise study.error(where, "a variant with a checkpoint is not pre-trained: drop its prepare / pretrain")
        variants.append(dataclasses.replace(v, tasks=tuple(only),
                                            pretrain=_pretrain_setting(study, v.pretrain, f"{where}.pretrain")))
    _unique(study, [v.name for v in variants], "variants")
    _unique(study, [slug(v.name) for v in variants], "variants (as folder names)")
    _unique(study, [slug(t) for t in names], "tasks (as folder names)")
    return dataclasses.replace(study, variants=tuple(variants))


def _with_figure_variants(study: Study) -> Study:
    """The figure's task and pre-trained variants (default: all), none setting the checkpoints it needs."""
    fig = study.figure
    if fig is None:
        return study
    task_names = [t.name for t in study.tasks]
    if fig.task not in task_names:
        raise study.error("figure.task", f"expected one of the study's tasks ({', '.join(task_names)}), "
                                         f"got {fig.task!r}")
    names = fig.variants or [v.name for v in study.variants if not v.checkpoint]
    if not isinstance(names, list):
        raise study.error("figure.variants", f"expected a list of the study's pre-trained variants, got {names!r}")
    known = {v.name: v for v in study.variants}
    bad = [n for n in names if not isinstance(n, str) or n not in known or known[n].checkpoint]
    if bad:
        raise study.error("figure.variants", f"{', '.join(map(repr, bad))} is not a pre-trained variant of the study")
    for name in names:
        for key, why in _FIGURE_OWNED.items():
            if key in known[name].pretrain:
                raise study.error(f"{study.field(known[name])}.pretrain.{key}",
                                  f"set by the runner for the figure's variants, not the study: {why}")
            if key in study.pretraining.pretrain:
                raise study.error(f"pretraining.pretrain.{key}", f"set by the runner for the figure's variants "
                                                                 f"({', '.join(names)}), not the study: {why}")
    return dataclasses.replace(study, figure=dataclasses.replace(fig, variants=tuple(names)))


def _with_paper(study: Study) -> Study:
    """The paper's figures: row -> column -> number (names checked first: a misspelling is likelier)."""
    variants, tasks = {v.name for v in study.variants}, {t.name for t in study.tasks}
    try:
        paper = read_mapping(study.paper, "paper")
        for row, values in paper.items():
            if row not in variants:
                raise FieldError(f"paper.{row}", "not a variant of the study")
            for col, value in read_mapping(values, f"paper.{row}").items():
                if col not in tasks:
                    raise FieldError(f"paper.{row}.{col}", "not a task of the study")
                read_value(value, float, f"paper.{row}.{col}")
    except FieldError as e:
        raise StudyError(f"{study.path}: {e}") from None
    return dataclasses.replace(study, paper=paper)


def _with_orderings(study: Study) -> Study:
    """``orderings``: a list of ``"A > B"`` strings, A and B two different rows of the study, as (A, B) pairs."""
    given = study.orderings
    if not isinstance(given, (list, tuple)):
        raise study.error("orderings", f'expected a list of "A > B" strings (A, B rows of the study), got {given!r}')
    names = {v.name for v in study.variants}
    pairs = []
    for i, item in enumerate(given):
        where = f"orderings[{i}]"
        if isinstance(item, (list, tuple)) and len(item) == 2:  # already parsed (a study rebuilt from one)
            above, below = item
        elif isinstance(item, str) and item.count(" > ") == 1:
            above, below = (part.strip() for part in item.split(" > "))
        else:
            raise study.error(where, f'expected "A > B" (A above B, two rows of the study), got {item!r}')
        for name in (above, below):
            if name not in names:
                raise study.error(where, f"{name!r} is not a variant of the study ({', '.join(sorted(names))})")
        if above == below:
            raise study.error(where, f"{item!r} orders a row against itself")
        pairs.append((above, below))
    return dataclasses.replace(study, orderings=tuple(pairs))


def _check_configs(study: Study) -> None:
    """Every run's settings in range: each config built (the runner's settings left at placeholders),
    an error naming the field; a variant's fine-tuning with each task is `check_study`'s."""

    def build(where: str, make: Any, *args: Any, **settings: Any) -> None:
        try:
            make(*args, **settings)
        except (TypeError, ValueError) as e:
            raise study.error(where, str(e)) from None

    pre = study.pretraining
    build("pretraining.prepare", PrepareConfig, **pre.prepare)
    build("pretraining.pretrain", pretrain_config, pre.pretrain)
    build("finetune", FinetuneConfig, **study.finetune)
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
    """The `PretrainConfig` of a study's ``pretrain`` settings: its recipe's, the study's over them,
    ``runner``'s over both (a model mapping stands as a placeholder config.json)."""
    settings = dict(settings)
    recipe = settings.pop("recipe", "paper")
    if isinstance(settings.get("model"), dict):
        settings["model"] = "model_config.json"
    return PretrainConfig.from_recipe(recipe, **{**settings, **runner})


TYPE_F1 = "f1_"
"""The prefix of a tagging task's per-type entity F1 (``f1_PER``)."""


def metric_names(task: str) -> tuple[str, ...]:
    """The metrics fine-tuning on ``task`` reports for a dev file (several dev files prefix each by the
    file's name: ``dev_matched_accuracy``)."""
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
    """Whether ``metric`` is one of ``names`` (``f1_TYPE`` any type), or with ``prefixed`` one after a dev
    file's name and "_"."""
    def fits(name: str) -> bool:
        return name in names or (f"{TYPE_F1}TYPE" in names and name.startswith(TYPE_F1) and len(name) > len(TYPE_F1))

    if fits(metric):
        return True
    parts = metric.split("_")
    return prefixed and any(fits("_".join(parts[k:])) for k in range(1, len(parts)))


def _check_metric(study: Study, metric: str, task: str, where: str) -> None:
    """``metric`` one the task can report (a built-in source's task: any family's)."""
    from bertforge.tasks import task_names

    if task:
        names = metric_names(task)
        if not metric_fits(metric, names):
            raise study.error(where, f"{metric!r} is not a metric of task {task} (it reports {', '.join(names)})")
    elif not any(metric_fits(metric, metric_names(t)) for t in task_names()):
        raise study.error(where, f"{metric!r} is not a metric of any task")


def _read(path: Path) -> Any:
    """A study file's content: YAML (``.yaml`` / ``.yml``) or JSON."""
    from bertforge.io import read_settings_file

    try:
        return read_settings_file(path, "study file")
    except ValueError as e:
        raise StudyError(str(e)) from None


def _pretrain_setting(study: Study, settings: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``pretrain`` mapping: its ``recipe`` one of RECIPES, its model as `_model_setting` checks it."""
    from bertforge.train.pretrain import RECIPES

    recipe = settings.get("recipe")
    if recipe is not None and recipe not in RECIPES:
        raise study.error(f"{where}.recipe", f"expected one of {', '.join(RECIPES)}, got {recipe!r}")
    return _model_setting(study, settings, where)


def _model_setting(study: Study, settings: dict[str, Any], where: str) -> dict[str, Any]:
    """``model`` may be a preset name, a config.json path, or a mapping of BertConfig fields (Table 6's
    sizes); a mapping and a name are checked here, a path when the run starts."""
    from bertforge.model.config import PRESETS, BertConfig

    model = settings.get("model")
    if isinstance(model, dict):
        try:
            BertConfig.from_dict({"vocab_size": 100, **model}, source=f"{study.path}: {where}.model")
        except (TypeError, ValueError) as e:
            raise study.error(f"{where}.model", str(e)) from None
    elif isinstance(model, str) and (model.endswith(".json") or "/" in model or Path(model).is_dir()):
        settings = {**settings, "model": str(Path(model).expanduser())}
    elif model is not None and model not in PRESETS:
        raise study.error(f"{where}.model", f"expected a model size ({', '.join(PRESETS)}), a config.json path, or a "
                                           f"mapping of BertConfig fields; got {model!r}")
    return settings


def _unique(study: Study, names: list[str], where: str) -> None:
    for i, n in enumerate(names):
        if n in names[:i]:
            raise study.error(where, f"{n!r} appears twice")


def settings_key(settings: dict[str, Any]) -> str:
    """A stable text of a settings mapping (what a run folder's settings are compared by)."""
    return json.dumps(settings, sort_keys=True, default=str)
