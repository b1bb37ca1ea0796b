"""``bertforge ablate``: run a study (`bertforge.experiments.study`) cell by cell, resumably, and report it.

Everything lands in one folder (``--out``)::

    data/                      the built-in task files and pre-training text, as real files
    vocab/                     the study's WordPiece vocab (learned from the corpus unless given)
    prepared/<name>/           pre-training shards, one folder per distinct prepare setting (Table 8's masks)
    pretrain/<name>/           a `bertforge pretrain` run per distinct pre-training; ``done.json`` when finished
    cells/<row>/<column>/seed-<s>/          a `bertforge finetune` run; ``cell.json`` holds its score
    figure/<row>/<column>/step-<n>/seed-<s>/  the same from a pre-training checkpoint (Figure 5)
    report.md, report.json, scores.png, figure.png

Every folder records the settings it was made with (``study_settings.json``): a rerun skips what is
finished, resumes what was interrupted, and refuses a folder made with other settings. Nothing runs
until the whole study is checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.console import errors_only
from bertforge.experiments.report import study_cells
from bertforge.experiments.study import (
    TYPE_F1,
    Study,
    StudyError,
    StudyFolder,
    TaskSpec,
    Variant,
    load_study,
    metric_fits,
    metric_names,
    pretrain_config,
    settings_key,
    slug,
)
from bertforge.io import atomic_write_text
from bertforge.settings import check_device, out_of_range
from bertforge.tasks.finetune import FinetuneConfig
from bertforge.train.lock import folder_user, run_lock
from bertforge.train.rundir import METRICS_FILE, checkpoints, latest_checkpoint
from bertforge.train.state import changes_text, setting_changes

__all__ = ["AblateConfig", "run_study", "check_study", "Cell", "read_cells", "read_pretraining"]

logger = logging.getLogger("bertforge")

SETTINGS_FILE = "study_settings.json"
DONE_FILE = "done.json"
CELL_FILE = "cell.json"
MINUTES_FILE = "minutes.json"
"""In a pre-training's folder: the minutes its processes have spent on it, added up across resumes."""


@dataclass
class AblateConfig:
    """How `bertforge ablate` runs a study (the study file says what is run)."""

    out: str = ""
    """Folder of the study's runs and report (default: runs/ablate/<study name>)."""
    seeds: str = ""
    """Comma-separated fine-tuning seeds instead of the study's (e.g. 0,1)."""
    precision: str = "auto"
    """fp32, bf16, fp16 or auto (the faster of fp32 and bf16 on the device) for runs the study leaves unset."""
    device: str = "auto"
    """auto (CUDA if present), cpu, cuda or cuda:K."""
    workers: int = 0
    """Processes preparing pre-training data (0: up to 2)."""
    report_only: bool = False
    """Write the report from the cells finished so far; run nothing."""

    def __post_init__(self) -> None:
        from bertforge.train.precision import check_precision

        check_precision(self.precision)
        try:
            check_device(self.device)
        except ValueError as e:
            raise ValueError(f"--device: {e}") from None
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if self.seeds:
            flag_seeds(self.seeds)


def flag_seeds(text: str) -> tuple[int, ...]:
    """``--seeds 0,1,2`` as seeds, held to a study file's rules: integers >= 0, none twice."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        seeds = (-1,)
    if any(s < 0 for s in seeds):
        raise ValueError(f"--seeds: expected comma-separated integers >= 0, got {text!r}")
    for seed in seeds:  # each one a fine-tuning's seed
        if problem := out_of_range(FinetuneConfig, "seed", seed):
            raise ValueError(f"--seeds: {problem}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: repeated seeds in {list(seeds)}")
    return seeds


@dataclass
class Cell:
    """One fine-tuning run's outcome (``cell.json``)."""

    variant: str
    task: str
    seed: int
    metric: str
    value: float
    metrics: dict[str, float]
    steps: int
    seconds: float
    pretrain_step: int | None = None
    """For Figure 5: the pre-training checkpoint's step (None: the finished pre-training)."""


# ---------------------------------------------------------------------------- folders and their settings
def _claim(folder: Path, settings: dict[str, Any], what: str) -> None:
    """Record the settings ``folder`` is made with, or check them against the ones it was made with."""
    path = folder / SETTINGS_FILE
    key = json.loads(settings_key(settings))
    if path.is_file():
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise StudyError(f"{path}: unreadable ({e}); remove {folder} to redo the {what}") from None
        if before != key:
            changed = changes_text(setting_changes(before, key))
            raise StudyError(f"{folder} holds a {what} made with other settings ({changed}): "
                             "remove that folder to redo it, or run the study into another --out")
        return
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(key, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------- the study's inputs
@dataclass
class _Inputs:
    vocab: Path
    corpus: Path
    held_out: Path | None
    corpus_format: str
    """"text" for the built-in text (a document a paragraph), else "auto" (prepare's detection)."""
    tasks: dict[str, dict[str, Any]]


def _task_inputs(study: Study, out: StudyFolder) -> dict[str, dict[str, Any]]:
    """Task name -> its FinetuneConfig settings with the files (the built-in data's written once)."""
    from bertforge.experiments.datasets import task_files

    tasks = {t.name: dict(t.settings) for t in study.tasks}
    for t in study.tasks:
        if t.source:
            tasks[t.name].update(task_files(t.source, out.data, seed=t.split_seed, max_train=t.max_train,
                                            max_dev=t.max_dev))
    return tasks


def _inputs(study: Study, out: StudyFolder, tasks: dict[str, dict[str, Any]]) -> _Inputs:
    """The pre-training text and the vocab (made once, reused by a rerun), with the tasks' settings."""
    from bertforge.experiments.datasets import PRETRAINING_SOURCES, pretraining_text
    from bertforge.text.vocab import learn_vocab

    pre = study.pretraining
    corpus, held_out = pretraining_text(pre.corpus, out.data, max_documents=pre.max_documents)
    if pre.held_out:
        held_out = Path(pre.held_out)
    vocab = Path(pre.vocab) if pre.vocab else out.vocab
    if not pre.vocab:
        _claim(vocab, {"corpus": str(corpus), "vocab_size": pre.vocab_size}, "vocab")
        if not (vocab / "vocab.txt").is_file():
            logger.info(f"ablate: learning a {pre.vocab_size:,}-piece WordPiece vocab from {corpus}")
            learn_vocab([corpus], vocab, vocab_size=pre.vocab_size, show_progress=False)
    return _Inputs(vocab=vocab, corpus=corpus, held_out=held_out, tasks=tasks,
                   corpus_format="text" if pre.corpus in PRETRAINING_SOURCES else "auto")


# ---------------------------------------------------------------------------- pre-training
@dataclass
class _Pretraining:
    """One pre-training run that one or more variants share."""

    name: str
    prepare: dict[str, Any]
    pretrain: dict[str, Any]
    variants: list[str]
    figure: bool


def _pretrainings(study: Study) -> dict[str, _Pretraining]:
    """Variant name -> its pre-training; variants with the same data and settings share one."""
    runs: dict[str, _Pretraining] = {}
    by_key: dict[str, _Pretraining] = {}
    figure = set(study.figure.variants) if study.figure else set()
    for v in study.variants:
        if v.checkpoint:
            continue
        prep = {**study.pretraining.prepare, **v.prepare}
        pre = {**study.pretraining.pretrain, **v.pretrain}
        key = settings_key({"prepare": prep, "pretrain": pre})
        run = by_key.setdefault(key, _Pretraining(slug(v.name), prep, pre, [], False))
        run.variants.append(v.name)
        run.figure |= v.name in figure
        runs[v.name] = run
    return runs


def _prepared(run: _Pretraining, inputs: _Inputs, out: StudyFolder, workers: int) -> tuple[Path, Path | None]:
    """The run's pre-training shards (and held-out shards), prepared once per distinct prepare setting."""
    from bertforge.data.prepare import PrepareConfig, prepare

    folder = out.prepared(f"data-{hashlib.sha256(settings_key(run.prepare).encode()).hexdigest()[:10]}")
    _claim(folder, {"prepare": run.prepare, "corpus": str(inputs.corpus), "vocab": str(inputs.vocab)},
           "prepared data")
    train, held = folder / "train", folder / "held-out"
    settings = {"format": inputs.corpus_format, **run.prepare}
    if not (train / "manifest.json").is_file():
        described = ", ".join(f"{k} {v}" for k, v in run.prepare.items()) or "the defaults"
        logger.info(f"ablate: preparing pre-training data ({described})")
        prepare([inputs.corpus], train, inputs.vocab, PrepareConfig(**settings), workers=workers, progress=False)
    if inputs.held_out is None:
        return train, None
    if not (held / "manifest.json").is_file():
        prepare([inputs.held_out], held, inputs.vocab, PrepareConfig(**{**settings, "dupe_factor": 1}),
                workers=workers, progress=False)
    return train, held


def _model_file(model: Any, folder: Path, vocab: Path) -> str:
    """``model`` as PretrainConfig takes it: a mapping of BertConfig fields becomes a config.json."""
    if not isinstance(model, dict):
        return model
    from bertforge.model.config import BertConfig
    from bertforge.text.tokenizer import BertTokenizer

    path = folder / "model_config.json"
    if not path.is_file():
        vocab_size = BertTokenizer.from_pretrained(str(vocab)).vocab_size
        BertConfig.from_dict({"vocab_size": vocab_size, **model}, source=str(path)).save(path)
    return str(path)


def _model(settings: dict[str, Any]) -> Any:
    """The model a pre-training's settings build: theirs, or their recipe's (a preset name, a config.json
    path, or a mapping of BertConfig fields)."""
    from bertforge.train.pretrain import RECIPES

    return settings.get("model", RECIPES[settings.get("recipe", "paper")].get("model", "base"))


def _pretrain_owned(data: str, eval_data: str, tokenizer: str, out: str, resume: bool) -> dict[str, Any]:
    """The settings the runner gives each pre-training itself (a study may not: ``_PRETRAIN_OWNED``)."""
    return {"data": data, "eval_data": eval_data, "tokenizer": tokenizer, "out": out, "progress": False,
            "resume": resume, "overwrite": not resume}


def _pretrain_config(study: Study, run: _Pretraining, cfg: AblateConfig, model: str, held_out: bool,
                     owned: dict[str, Any]) -> Any:
    """A pre-training's `PretrainConfig`: the runner's choices where the study leaves a setting unset."""
    from bertforge.train.pretrain import PretrainConfig

    steps = run.pretrain.get("max_steps", PretrainConfig.max_steps)
    settings = {"checkpoint_every": max(1, steps // 4), "keep_checkpoints": 1, "precision": cfg.precision,
                "device": cfg.device, "log_every": max(1, steps // 100), **run.pretrain, "model": model}
    if run.figure:  # the checkpoints Figure 5 fine-tunes from, all kept (a study cannot set these for them)
        settings.update(checkpoint_every=study.figure.every, keep_checkpoints=0)
    if held_out:
        settings.setdefault("eval_every", max(1, steps // 5))
    return pretrain_config(settings, **owned)


def _minutes_spent(folder: Path) -> float:
    """The minutes earlier processes spent on the pre-training in ``folder`` (`MINUTES_FILE`; 0 if none)."""
    try:
        minutes = float(json.loads((folder / MINUTES_FILE).read_text(encoding="utf-8"))["minutes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    return minutes if minutes >= 0 else 0.0


def _training_minutes(run_dir: Path) -> float:
    """The training minutes a run's metrics record (kept across resumes, also of a killed process)."""
    seconds = 0.0
    with contextlib.suppress(OSError):
        for line in (run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                seconds = max(seconds, float(json.loads(line).get("time", 0.0)))
    return seconds / 60


def _pretrain(study: Study, run: _Pretraining, inputs: _Inputs, out: StudyFolder, cfg: AblateConfig) -> dict[str, Any]:
    """Run (or resume, or skip) one pre-training; its ``done.json``: steps, minutes, held-out metrics."""
    from bertforge.data.prepare import load_manifest
    from bertforge.train.pretrain import pretrain

    folder = out.pretraining(run.name)
    done = folder / DONE_FILE
    _claim(folder, {"prepare": run.prepare, "pretrain": run.pretrain, "corpus": str(inputs.corpus),
                    "vocab": str(inputs.vocab)}, "pre-training")
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    data, held = _prepared(run, inputs, out, cfg.workers or min(2, os.cpu_count() or 1))
    model = _model(run.pretrain)
    run_dir = out.pretraining_run(run.name)
    pcfg = _pretrain_config(study, run, cfg, _model_file(model, folder, inputs.vocab), held is not None,
                            _pretrain_owned(str(data), str(held or ""), str(inputs.vocab), str(run_dir),
                                            latest_checkpoint(run_dir) is not None))
    what = "resuming" if pcfg.resume else "pre-training"
    if isinstance(model, dict):
        model = f"L{model.get('num_hidden_layers')} H{model.get('hidden_size')} A{model.get('num_attention_heads')}"
    objective = pcfg.resolve_objective(load_manifest(data)["config"]["nsp"])
    length = (f"{pcfg.budget_minutes:g} minutes of training of batches of {pcfg.batch_size}" if pcfg.budget_minutes
              else f"{pcfg.max_steps:,} steps of {pcfg.batch_size}")
    logger.info(f"ablate: {what} {' / '.join(run.variants)}: {model} model, objective {objective}, {length}")
    spent = _minutes_spent(folder)
    t0 = time.perf_counter()
    try:
        with errors_only():
            result = pretrain(pcfg)
    finally:  # an interrupted or failed process's minutes count too: a rerun adds its own to them
        spent += (time.perf_counter() - t0) / 60
        with contextlib.suppress(OSError):
            atomic_write_text(folder / MINUTES_FILE, json.dumps({"minutes": spent}) + "\n")
    if result.stopped_early:
        raise KeyboardInterrupt(f"pre-training stopped at step {result.step}; rerun the study to resume it")
    record = {"variants": run.variants, "steps": result.step, "batch_size": pcfg.batch_size, "objective": objective,
              "minutes": max(spent, _training_minutes(run_dir)), "eval_metrics": result.eval_metrics,
              "final_metrics": result.final_metrics, "model": str(run_dir / "model"),
              "model_description": _model_description(run_dir / "model")}
    atomic_write_text(done, json.dumps(record, indent=1) + "\n")
    held_text = (", ".join(f"{k} {v:.3f}" for k, v in result.eval_metrics.items() if k.endswith("accuracy"))
                 or "no held-out data")
    logger.info(f"ablate:   {result.step:,} steps in {record['minutes']:.1f} min; held-out {held_text}")
    return record


def _model_description(folder: Path) -> str:
    """"L4 H256 A4, 4.4M" for the encoder in ``folder``: layers, hidden size, heads, parameters."""
    from bertforge.model.bert import encoder_parameters
    from bertforge.model.config import BertConfig

    config = BertConfig.load(folder / "config.json")
    params = encoder_parameters(config)
    size = f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params / 1e3:.0f}K"
    return (f"L{config.num_hidden_layers} H{config.hidden_size} A{config.num_attention_heads}, {size} parameters"
            + (", causal" if config.is_decoder else ""))


def read_pretraining(study: Study, out: Path) -> dict[str, dict[str, Any]]:
    """Variant name -> its finished pre-training's ``done.json`` (variants not yet pre-trained are left out)."""
    done = {name: StudyFolder(out).pretraining(run.name) / DONE_FILE for name, run in _pretrainings(study).items()}
    return {name: json.loads(path.read_text(encoding="utf-8")) for name, path in done.items() if path.is_file()}


# ---------------------------------------------------------------------------- fine-tuning cells
def _finetune_owned(task: TaskSpec, model: str, out: str, seed: int, resume: bool) -> dict[str, Any]:
    """The settings the runner gives each fine-tuning cell itself (a study may not: ``_FINETUNE_OWNED``)."""
    return {"model": model, "out": out, "seed": seed, "keep_best": True, "metric_for_best": task.metric,
            "eval_every": 10**9, "progress": False, "resume": resume, "overwrite": not resume}


def _cell_config(settings: dict[str, Any], cfg: AblateConfig, owned: dict[str, Any]) -> Any:
    """A cell's `FinetuneConfig`: its task's and variant's settings, --precision and --device under them."""
    from bertforge.tasks.finetune import FinetuneConfig

    return FinetuneConfig(**{"precision": cfg.precision, "device": cfg.device, **settings, **owned})


def _finetune_cell(folder: Path, start: Path, variant: Variant, task: TaskSpec, seed: int,
                   inputs: _Inputs, cfg: AblateConfig, keep_model: bool, pretrain_step: int | None = None) -> Cell:
    """Run (or resume, or read) one fine-tuning cell."""
    from bertforge.tasks.finetune import finetune

    done = folder / CELL_FILE
    settings = {**inputs.tasks[task.name], **variant.finetune}
    _claim(folder, {"start": str(start), "seed": seed, "finetune": settings, "metric": task.metric}, "fine-tuning")
    if done.is_file():
        return Cell(**json.loads(done.read_text(encoding="utf-8")))
    fcfg = _cell_config(settings, cfg, _finetune_owned(task, str(start), str(folder), seed,
                                                       latest_checkpoint(folder) is not None))
    t0 = time.perf_counter()
    with errors_only():
        result = finetune(fcfg)
    if result.train.stopped_early:
        raise KeyboardInterrupt(f"fine-tuning stopped at step {result.train.step} ({folder}); rerun to resume it")
    best = result.best or {}
    cell = Cell(variant=variant.name, task=task.name, seed=seed, metric=best.get("metric", ""),
                value=float(best.get("value", float("nan"))), metrics=best.get("metrics", result.eval_metrics),
                steps=result.train.step, seconds=time.perf_counter() - t0, pretrain_step=pretrain_step)
    if not keep_model:  # the score, the predictions and the curves stay; the weights go
        for name in ("model", "checkpoints"):
            shutil.rmtree(folder / name, ignore_errors=True)
        for weights in (folder / "best").glob("*.safetensors"):
            weights.unlink()
    atomic_write_text(done, json.dumps(dataclasses.asdict(cell), indent=1) + "\n")
    return cell


def read_cells(out: Path, study: Study | None = None) -> tuple[list[Cell], list[Cell]]:
    """The finished cells of a study folder: (the table's, the figure's); with ``study``, only its own."""
    folder = StudyFolder(out)
    cells, figure = ([Cell(**json.loads(p.read_text(encoding="utf-8"))) for p in files]
                     for files in (folder.cell_files(CELL_FILE), folder.figure_cell_files(CELL_FILE)))
    return (cells, figure) if study is None else study_cells(study, cells, figure)


# ---------------------------------------------------------------------------- checks before any work
def check_study(study: Study, cfg: AblateConfig) -> None:
    """What running ``study`` needs of this machine and the files it names, checked before any work (cells
    of built-in data follow once it is written: `_check_cells`)."""
    from bertforge.data.prepare import PrepareConfig
    from bertforge.experiments.datasets import PRETRAINING_SOURCES
    from bertforge.tasks.base import split_files

    _check_run_device(study, cfg, {})
    pre = study.pretraining
    if pre.corpus not in PRETRAINING_SOURCES and not Path(pre.corpus).is_file():
        raise study.error("pretraining.corpus", f"no such file: {pre.corpus} (or the built-in text: "
                                                f"{', '.join(PRETRAINING_SOURCES)})")
    for key, value in (("held_out", pre.held_out), ("vocab", pre.vocab)):
        if value and not Path(value).exists():
            raise study.error(f"pretraining.{key}", f"no such {'file' if key == 'held_out' else 'folder'}: {value}")
    for t in study.tasks:
        for key in () if t.source else ("train_file", "dev_file"):
            for path in split_files(t.settings[key]):
                if not path.exists():
                    raise study.error(f"{study.field(t)}.{key}", f"no such file or folder: {path}")
    for v in study.variants:
        if v.checkpoint and not Path(v.checkpoint).is_dir():
            raise study.error(f"{study.field(v)}.checkpoint", f"no such checkpoint folder: {v.checkpoint}")

    for name, run in {id(run): (name, run) for name, run in _pretrainings(study).items()}.values():
        variant = study.variant(name)
        where = f"{study.field(variant)}.pretrain"
        _check_run_device(study, cfg, {**pre.pretrain, **variant.pretrain},
                          lambda key, v=variant: f"{study.field(v)}.pretrain.{key}" if key in v.pretrain
                          else f"pretraining.pretrain.{key}")
        try:
            _pretrain_config(study, run, cfg, _model(run.pretrain), True, _pretrain_owned("", "", "", "", False))
        except (TypeError, ValueError) as e:
            raise study.error(where, str(e)) from None
        length = {"max_seq_length": PrepareConfig.max_seq_length, **run.prepare}["max_seq_length"]
        positions = _encoder_config(study, variant).max_position_embeddings
        if length > positions:
            raise study.error(where, f"the data's sequences of {length} tokens (prepare max_seq_length) are longer "
                                     f"than the model's {positions} positions (max_position_embeddings)")
    for v, t in study.cells():
        _check_run_device(study, cfg, {**t.settings, **v.finetune},
                          lambda key, v=v, t=t: f"{study.field(v)}.finetune.{key}" if key in v.finetune
                          else f"{study.field(t)}.{key}")
    _check_cells(study, {t.name: t.settings for t in study.tasks if not t.source}, cfg)


def _check_run_device(study: Study, cfg: AblateConfig, settings: dict[str, Any], origin: Any = None) -> None:
    """A run's device on this machine, fp16 only on CUDA; ``origin(key)`` names the field a key comes from."""
    from bertforge.train.distributed import resolve_device

    device = settings.get("device", cfg.device)
    where = origin("device") if "device" in settings else "--device"
    try:
        check_device(device, here=True)
    except ValueError as e:
        raise _fail(study, where, str(e)) from None
    kind = resolve_device(device).type
    if settings.get("precision", cfg.precision) == "fp16" and kind != "cuda":
        where = origin("precision") if "precision" in settings else where if "device" in settings else "--precision"
        raise _fail(study, where, f"fp16 needs a CUDA device (its gradient scaler), and the runs go on {kind}; "
                                  "use bf16, fp32 or auto")


def _fail(study: Study, where: str, message: str) -> ValueError:
    """An error about a flag (``where`` "--device") or a field of the study file."""
    return ValueError(f"{where}: {message}") if where.startswith("--") else study.error(where, message)


def _encoder_config(study: Study, variant: Variant) -> Any:
    """The `BertConfig` of the encoder ``variant`` fine-tunes."""
    from bertforge.model.config import BertConfig

    settings = {**study.pretraining.pretrain, **variant.pretrain}
    source = variant.checkpoint or settings.get("init_from") or _model(settings)
    key = ("checkpoint" if variant.checkpoint else "pretrain.init_from" if settings.get("init_from")
           else "pretrain.model")
    try:
        if isinstance(source, dict):
            return BertConfig.from_dict({"vocab_size": 100, **source})
        if source.endswith(".json") or Path(source).is_dir() or key != "pretrain.model":
            return BertConfig.load(source)
        return BertConfig.preset(source)
    except (OSError, ValueError) as e:
        raise study.error(f"{study.field(variant)}.{key}", f"cannot read the model's config ({e})") from None


def _check_cells(study: Study, tasks: dict[str, dict[str, Any]], cfg: AblateConfig) -> None:
    """Every cell of ``tasks`` (name -> settings): its config, metric, length and feature layers."""
    from bertforge.model.heads import feature_layers
    from bertforge.tasks import family_for

    models: dict[str, Any] = {}
    for v, t in study.cells():
        if t.name not in tasks:
            continue
        where = f"{study.field(v)}.finetune (with task {t.name})" if v.finetune else study.field(t)
        owned = _finetune_owned(t, "model", "cell", study.seeds[0], False)
        try:
            fcfg = _cell_config({**tasks[t.name], **v.finetune}, cfg, owned)
            fcfg = family_for(fcfg.task).configure(fcfg)
        except (TypeError, ValueError) as e:
            raise study.error(where, str(e)) from None
        if t.metric and not metric_fits(t.metric, metric_names(fcfg.task)):
            raise study.error(f"{study.field(t)}.metric", f"{t.metric!r} is not a metric of task {fcfg.task} (it "
                                                          f"reports {', '.join(metric_names(fcfg.task))})")
        if v.name not in models:
            models[v.name] = _encoder_config(study, v)
        config = models[v.name]
        if fcfg.max_seq_length > config.max_position_embeddings:
            raise study.error(where, f"max_seq_length {fcfg.max_seq_length} is longer than the "
                                     f"{config.max_position_embeddings} positions of {v.name}'s model")
        if fcfg.features:
            try:
                feature_layers(fcfg.features, config.num_hidden_layers)
            except ValueError as e:
                raise study.error(where, f"{e} ({v.name}'s model)") from None


def _check_task_files(study: Study, inputs: _Inputs, out: StudyFolder, cfg: AblateConfig) -> None:
    """Every unfinished cell's task files read as fine-tuning reads them (once per way of reading), its
    batch against the training sequences and its metric against those its dev files report."""
    from bertforge.tasks.finetune import INPUT_SETTINGS, prepare_data

    figure_task = study.figure.task if study.figure else None
    read: dict[str, tuple[int, set[str]]] = {}
    for v, t in study.cells():
        if t.name != figure_task and all((out.cell(v.name, t.name, s) / CELL_FILE).is_file() for s in study.seeds):
            continue
        settings = {**inputs.tasks[t.name], **v.finetune}
        tokenizer = v.checkpoint or str(inputs.vocab)
        fcfg = _cell_config(settings, cfg, _finetune_owned(t, tokenizer, "", study.seeds[0], False))
        key = settings_key({"tokenizer": tokenizer,
                            **{k: getattr(fcfg, k) for k in ("train_file", "dev_file", *INPUT_SETTINGS)}})
        if key not in read:
            logger.info(f"ablate: reading {t.name}'s files ({fcfg.train_file}; {fcfg.dev_file}) to check them")
            try:
                with errors_only():
                    data = prepare_data(fcfg)
            except (ValueError, OSError) as e:
                raise study.error(study.field(t), str(e)) from None
            read[key] = (len(data.train.encoded), _reported_metrics(data))
        count, metrics = read[key]
        if count < fcfg.batch_size and fcfg.drop_last:
            where = f"{study.field(v)}.finetune (with task {t.name})" if "batch_size" in v.finetune else study.field(t)
            raise study.error(where, f"{count} training sequences, fewer than one batch (batch_size {fcfg.batch_size})")
        if t.metric and t.metric not in metrics:
            raise study.error(f"{study.field(t)}.metric", f"{t.metric!r} is not among the metrics {t.name}'s dev "
                                                          f"files are scored with ({', '.join(sorted(metrics))})")


def _reported_metrics(data: Any) -> set[str]:
    """The metric names fine-tuning on the read task ``data`` (a `PreparedData`) reports."""
    import numpy as np

    family, task, labels = data.family, data.cfg.task, data.train.labels
    if family.name == "classification":
        from bertforge.tasks.classification import GLUE_TASKS, compute_metrics

        if labels is None:
            preds, gold, classes = np.array([0.0, 1.0, 2.0]), np.array([0.0, 2.0, 1.0]), 1
        else:
            preds, gold, classes = np.array([0, 1, 1]), np.array([0, 1, 0]), len(labels)
        names = set(compute_metrics(task if task in GLUE_TASKS else None, preds, gold, classes))
    elif family.name == "tagging":
        from bertforge.tasks.tagging import resolve_scheme

        if resolve_scheme(data.cfg.tag_scheme, task, labels) is None:
            names = {"accuracy"}
        else:
            names = {n for n in metric_names(task) if not n.startswith(TYPE_F1)}
            names |= {TYPE_F1 + tag[2:] for tag in labels if len(tag) > 2}
    else:
        names = set(metric_names(task))
    files = [d.path.name.split(".")[0] for d in data.dev]
    if len(files) < 2:
        return names
    if len(set(files)) < len(files):
        files = [f"{name}{k + 1}" for k, name in enumerate(files)]
    return {f"{name}_{metric}" for name in files for metric in names}


# ---------------------------------------------------------------------------- the study
STUDY_SOURCE = "study_source.json"
"""A study folder's record of the study file it runs: a rerun given only the folder (``--out``) reads it."""


def recorded_study(out: Path) -> Path:
    """The study file the folder ``out`` was run with (`STUDY_SOURCE`)."""
    record = out / STUDY_SOURCE
    if not record.is_file():
        raise ValueError(f"{out}: no {STUDY_SOURCE} (not a study folder, or made before folders recorded their "
                         "study); give the study file")
    path = Path(json.loads(record.read_text(encoding="utf-8"))["study"])
    if not path.is_file():
        raise ValueError(f"{record}: the study file {path} is gone; give the study file")
    return path


def run_study(study: str | Path | Study | None, cfg: AblateConfig | None = None) -> Path:
    """Run every unfinished cell of ``study`` (a file, a bundled name or a `Study`; None: the one the folder
    ``cfg.out`` recorded) under its folder's lock, then write its report and return its path. ``report_only``
    runs nothing and takes no lock."""
    cfg = cfg or AblateConfig()
    if study is None:
        if not cfg.out:
            raise ValueError("give a study file or a bundled study's name, or --out a study folder to rerun")
        study = recorded_study(Path(cfg.out))
    study = study if isinstance(study, Study) else load_study(study)
    if cfg.seeds:
        study = dataclasses.replace(study, seeds=flag_seeds(cfg.seeds))
    out = StudyFolder(Path(cfg.out or Path("runs") / "ablate" / study.name))
    if cfg.report_only:
        out.root.mkdir(parents=True, exist_ok=True)
        if (user := folder_user(out.root)) is not None:
            logger.info(f"ablate: {out.root} is in use by {user}: the report holds the cells finished so far")
        return _write_report(study, out)
    check_study(study, cfg)  # before any work: what the study file alone could not tell

    with run_lock(out.root):  # let go of however the study ends
        atomic_write_text(out.root / STUDY_SOURCE, json.dumps({"study": str(Path(study.path).resolve())}) + "\n")
        t0 = time.perf_counter()
        runs = _pretrainings(study)
        cells = study.cells()
        total = len(cells) * len(study.seeds)
        logger.info(f"ablate: {study.name}: {len(study.variants)} variants ({len(set(map(id, runs.values())))} "
                    f"pre-trainings) x {len(study.tasks)} tasks x {len(study.seeds)} seeds = {total} fine-tunings "
                    f"-> {out.root}")
        tasks = _task_inputs(study, out)
        _check_cells(study, {t.name: tasks[t.name] for t in study.tasks if t.source}, cfg)  # their task now known
        inputs = _inputs(study, out, tasks)
        _check_task_files(study, inputs, out, cfg)  # the last check: then the first pre-training starts
        done = 0
        for variant in study.variants:
            if variant.checkpoint:
                start = Path(variant.checkpoint)
            else:
                run = runs[variant.name]
                _pretrain(study, run, inputs, out, cfg)
                start = out.pretraining_run(run.name) / "model"
            for task in [t for v, t in cells if v is variant]:
                for seed in study.seeds:
                    folder = out.cell(variant.name, task.name, seed)
                    cell = _finetune_cell(folder, start, variant, task, seed, inputs, cfg, study.keep_models)
                    done += 1
                    logger.info(f"ablate: [{done}/{total}] {variant.name} | {task.name} | seed {seed}: {cell.metric} "
                                f"{cell.value:.4f} ({cell.seconds:.0f} s)")
            _write_report(study, out)
        if study.figure:
            _figure(study, runs, inputs, out, cfg)
        _classic_baselines(study, inputs, out)
        path = _write_report(study, out)
        logger.info(f"ablate: {study.name} finished in {(time.perf_counter() - t0) / 60:.1f} minutes; "
                    f"report -> {path}")
    return path


def _classic_baselines(study: Study, inputs: _Inputs, out: StudyFolder) -> None:
    """Each task's classic baselines (a CRF for tagging, TF-IDF logistic regression for single-text
    classification: `bertforge.experiments.baselines.task_baselines`), fitted once on its training file into
    `StudyFolder.classic_baselines` with the settings they read (a task whose settings changed is fitted
    again), the report's reference for what no pre-training gives. Skipped, with a note, without the
    baselines extra."""
    from bertforge.experiments import baselines

    path = out.classic_baselines
    done = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    settings = {t.name: json.loads(json.dumps(inputs.tasks[t.name], default=str)) for t in study.tasks}
    todo = [t for t in study.tasks if done.get(t.name, {}).get("settings") != settings[t.name]]
    if not todo:
        return
    try:
        baselines.require_baselines()
    except ImportError as e:
        logger.info(f"ablate: no classic baselines in the report ({e})")
        return
    for task in todo:
        done[task.name] = {"settings": settings[task.name], "models": baselines.task_baselines(settings[task.name])}
        for name, metrics in done[task.name]["models"].items():
            logger.info(f"ablate: classic baseline | {task.name} | {name}: "
                        + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "seconds"))
        atomic_write_text(path, json.dumps(done, indent=1) + "\n")


def _write_report(study: Study, out: StudyFolder) -> Path:
    """The report of the cells and pre-trainings finished so far."""
    from bertforge.experiments.report import write_report

    return write_report(study, out.root, *read_cells(out.root, study), read_pretraining(study, out.root))


def _figure(study: Study, runs: dict[str, Any], inputs: _Inputs, out: StudyFolder, cfg: AblateConfig) -> None:
    """Figure 5: the figure's task fine-tuned from every checkpoint (the last one's: the table's cell)."""
    fig = study.figure
    task = study.task(fig.task)
    for name in fig.variants:
        variant = study.variant(name)
        run_dir = out.pretraining_run(runs[name].name)
        last = json.loads((out.pretraining(runs[name].name) / DONE_FILE).read_text(encoding="utf-8"))["steps"]
        for step, checkpoint in checkpoints(run_dir):
            for seed in study.seeds:
                folder = out.figure_cell(name, task.name, step, seed)
                table_cell = out.cell(name, task.name, seed) / CELL_FILE
                if step == last and table_cell.is_file() and not (folder / CELL_FILE).is_file():
                    cell = dataclasses.replace(Cell(**json.loads(table_cell.read_text(encoding="utf-8"))),
                                               pretrain_step=step, seconds=0.0)
                    folder.mkdir(parents=True, exist_ok=True)
                    atomic_write_text(folder / CELL_FILE, json.dumps(dataclasses.asdict(cell), indent=1) + "\n")
                    continue
                cell = _finetune_cell(folder, checkpoint, variant, task, seed, inputs, cfg, False, pretrain_step=step)
                logger.info(f"ablate: figure: {name} at pre-training step {step:,} | {task.name} | seed {seed}: "
                            f"{cell.metric} {cell.value:.4f} ({cell.seconds:.0f} s)")
