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
Variants whose data and pre-training settings are the same share one pre-training run. Every error
names the file and the field.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Study", "TaskSpec", "Variant", "FigureSpec", "Pretraining", "load_study", "bundled_studies",
           "StudyError"]


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

    def settings(self, data: Any, cls: type, where: str, refused: tuple[str, ...] = ()) -> dict[str, Any]:
        """``data`` as settings of the config dataclass ``cls`` (unknown names are an error)."""
        data = self.mapping(data, where)
        allowed = _fields(cls) - set(refused)
        self.keys(data, allowed, where)
        return data

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"expected a non-empty string, got {value!r}")
        return value

    def integer(self, value: Any, where: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def file(self, value: Any) -> str:
        """A path in the study (as on the command line: relative to the current folder)."""
        return str(Path(str(value)).expanduser())


# Settings the runner decides for every run (where it writes, what it resumes, what it starts from, the
# seed of each cell) rather than the study.
_PRETRAIN_OWNED = ("out", "resume", "overwrite", "data", "eval_data", "tokenizer", "progress")
_FINETUNE_OWNED = ("out", "resume", "overwrite", "grid", "seed", "model", "keep_best", "metric_for_best", "progress")
_TASK_KEYS = {"name", "source", "max_train", "max_dev", "split_seed", "metric"}
_FILE_SETTINGS = ("train_file", "dev_file")


def load_study(spec: str | Path) -> Study:
    """A study from a file path, or a bundled study's name (`bundled_studies`)."""
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
    pretraining = Pretraining(
        corpus=str(pre.get("corpus", Pretraining.corpus)),
        held_out=r.file(pre["held_out"]) if pre.get("held_out") else "",
        max_documents=r.integer(pre.get("max_documents", 0), "pretraining.max_documents"),
        vocab_size=r.integer(pre.get("vocab_size", Pretraining.vocab_size), "pretraining.vocab_size", 100),
        vocab=r.file(pre["vocab"]) if pre.get("vocab") else "",
        prepare=r.settings(pre.get("prepare"), PrepareConfig, "pretraining.prepare"),
        pretrain=_pretrain_setting(r, r.settings(pre.get("pretrain"), PretrainConfig, "pretraining.pretrain",
                                              _PRETRAIN_OWNED), "pretraining.pretrain"),
    )
    if pretraining.corpus not in PRETRAINING_SOURCES:
        pretraining = dataclasses.replace(pretraining, corpus=r.file(pretraining.corpus))

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
        settings = {k: v for k, v in raw.items() if k not in _TASK_KEYS}
        r.settings(settings, FinetuneConfig, where, _FINETUNE_OWNED)
        source = str(raw.get("source", ""))
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
        tasks.append(TaskSpec(name=name, settings={**common, **settings}, source=source,
                              max_train=r.integer(raw.get("max_train", 0), f"{where}.max_train"),
                              max_dev=r.integer(raw.get("max_dev", 0), f"{where}.max_dev"),
                              split_seed=r.integer(raw.get("split_seed", 0), f"{where}.split_seed"),
                              metric=str(raw.get("metric", ""))))
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
        if not isinstance(only, list) or any(t not in task_names for t in only):
            raise r.fail(f"{where}.tasks", f"expected a list of the study's task names ({', '.join(task_names)}), "
                                           f"got {only!r}")
        checkpoint = r.file(raw["checkpoint"]) if raw.get("checkpoint") else ""
        if checkpoint and (raw.get("prepare") or raw.get("pretrain")):
            raise r.fail(where, "a variant with a checkpoint is not pre-trained: drop its prepare / pretrain")
        variants.append(Variant(
            name=name, checkpoint=checkpoint, tasks=tuple(only),
            prepare=r.settings(raw.get("prepare"), PrepareConfig, f"{where}.prepare"),
            pretrain=_pretrain_setting(r, r.settings(raw.get("pretrain"), PretrainConfig, f"{where}.pretrain",
                                                  _PRETRAIN_OWNED), f"{where}.pretrain"),
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
        known = {v.name: v for v in variants}
        bad = [n for n in names if n not in known or known[n].checkpoint]
        if bad:
            raise r.fail("figure.variants", f"{', '.join(map(repr, bad))} is not a pre-trained variant of the study")
        figure = FigureSpec(task=raw["task"], variants=tuple(names),
                            every=r.integer(raw.get("every"), "figure.every", 1))

    paper = r.mapping(data.get("paper"), "paper")
    for row, values in paper.items():
        if row not in {v.name for v in variants}:
            raise r.fail(f"paper.{row}", "not a variant of the study")
        for col in r.mapping(values, f"paper.{row}"):
            if col not in task_names:
                raise r.fail(f"paper.{row}.{col}", "not a task of the study")
    keep = data.get("keep_models", False)
    if not isinstance(keep, bool):
        raise r.fail("keep_models", f"expected true or false, got {keep!r}")
    return Study(name=str(data.get("name") or path.stem), path=path, title=str(data.get("title", "")),
                 seeds=seeds, pretraining=pretraining, tasks=tuple(tasks), variants=tuple(variants), figure=figure,
                 keep_models=keep, description=str(data.get("description", "")).strip(), paper=paper)


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
    sizes); a mapping is checked here, the rest when the run starts."""
    from bertforge.model.config import BertConfig

    model = settings.get("model")
    if isinstance(model, dict):
        try:
            BertConfig.from_dict({"vocab_size": 100, **model}, source=f"{r.path}: {where}.model")
        except (TypeError, ValueError) as e:
            raise r.fail(f"{where}.model", str(e)) from None
    elif isinstance(model, str) and (model.endswith(".json") or "/" in model):
        settings = {**settings, "model": r.file(model)}
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
