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
finished, resumes what was interrupted (from its last checkpoint), and refuses a folder made with other
settings rather than mixing results. Ctrl-C stops at the next step boundary with a checkpoint saved.
"""

from __future__ import annotations

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
from bertforge.experiments.study import Study, StudyError, TaskSpec, Variant, load_study, settings_key, slug
from bertforge.io import atomic_write_text
from bertforge.train.loop import checkpoints, latest_checkpoint

__all__ = ["AblateConfig", "run_study", "Cell", "read_cells", "read_pretraining"]

logger = logging.getLogger("bertforge")

SETTINGS_FILE = "study_settings.json"
DONE_FILE = "done.json"
CELL_FILE = "cell.json"


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
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")


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
            changed = sorted(k for k in set(before) | set(key) if before.get(k) != key.get(k))
            raise StudyError(f"{folder} holds a {what} made with other settings ({', '.join(changed)} differ): "
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
    """"text" for the built-in text (a document a paragraph); else the study's own, or prepare's auto-detection."""
    tasks: dict[str, dict[str, Any]]
    """Task name -> its FinetuneConfig settings with the files."""


def _inputs(study: Study, out: Path) -> _Inputs:
    """The task files, the pre-training text and the vocab (made once, reused by a rerun)."""
    from bertforge.experiments.datasets import PRETRAINING_SOURCES, pretraining_text, task_files
    from bertforge.text.vocab import learn_vocab

    data = out / "data"
    tasks = {}
    for t in study.tasks:
        settings = dict(t.settings)
        if t.source:
            settings.update(task_files(t.source, data, seed=t.split_seed, max_train=t.max_train, max_dev=t.max_dev))
        tasks[t.name] = settings
    pre = study.pretraining
    corpus, held_out = pretraining_text(pre.corpus, data, max_documents=pre.max_documents)
    if pre.held_out:
        held_out = Path(pre.held_out)
    vocab = Path(pre.vocab) if pre.vocab else out / "vocab"
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

    @property
    def key(self) -> dict[str, Any]:
        return {"prepare": self.prepare, "pretrain": self.pretrain}


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
        if key not in by_key:
            by_key[key] = _Pretraining(slug(v.name), prep, pre, [], False)
        run = by_key[key]
        run.variants.append(v.name)
        run.figure |= v.name in figure
        runs[v.name] = run
    return runs


def _prepared(run: _Pretraining, inputs: _Inputs, out: Path, workers: int) -> tuple[Path, Path | None]:
    """The run's pre-training shards (and held-out shards), prepared once per distinct prepare setting."""
    from bertforge.data.prepare import PrepareConfig, prepare

    folder = out / "prepared" / f"data-{_short_hash(run.prepare)}"
    _claim(folder, {"prepare": run.prepare, "corpus": str(inputs.corpus), "vocab": str(inputs.vocab)},
           "prepared data")
    train, held = folder / "train", folder / "held-out"
    settings = {"format": inputs.corpus_format, **run.prepare}
    if not (train / "manifest.json").is_file():
        logger.info(f"ablate: preparing pre-training data ({_describe(run.prepare) or 'the defaults'})")
        prepare([inputs.corpus], train, inputs.vocab, PrepareConfig(**settings), workers=workers, progress=False)
    if inputs.held_out is None:
        return train, None
    if not (held / "manifest.json").is_file():
        prepare([inputs.held_out], held, inputs.vocab, PrepareConfig(**{**settings, "dupe_factor": 1}),
                workers=workers, progress=False)
    return train, held


def _short_hash(settings: dict[str, Any]) -> str:
    """A short name for a settings mapping (folders of prepared data are named by their settings)."""
    return hashlib.sha256(settings_key(settings).encode()).hexdigest()[:10]


def _describe(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in settings.items())


def _model_file(model: Any, folder: Path, vocab: Path) -> str:
    """``model`` as PretrainConfig takes it: a mapping of BertConfig fields becomes a config.json
    (with the size of ``vocab``)."""
    if not isinstance(model, dict):
        return model
    from bertforge.model.config import BertConfig
    from bertforge.text.tokenizer import BertTokenizer

    path = folder / "model_config.json"
    if not path.is_file():
        vocab_size = BertTokenizer.from_pretrained(str(vocab)).vocab_size
        BertConfig.from_dict({"vocab_size": vocab_size, **model}, source=str(path)).save(path)
    return str(path)


def _pretrain(study: Study, run: _Pretraining, inputs: _Inputs, out: Path, cfg: AblateConfig) -> dict[str, Any]:
    """Run (or resume, or skip) one pre-training; its ``done.json``: steps, minutes, held-out metrics."""
    from bertforge.data.prepare import load_manifest
    from bertforge.train.pretrain import RECIPES, PretrainConfig, pretrain

    folder = out / "pretrain" / run.name
    done = folder / DONE_FILE
    _claim(folder, {**run.key, "corpus": str(inputs.corpus), "vocab": str(inputs.vocab)}, "pre-training")
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    data, held = _prepared(run, inputs, out, cfg.workers or min(2, os.cpu_count() or 1))
    settings = dict(run.pretrain)
    recipe = settings.pop("recipe", "paper")  # the named settings the study's own start from (checked at load)
    model = settings.get("model", RECIPES[recipe].get("model", "base"))
    settings["model"] = _model_file(model, folder, inputs.vocab)
    steps = int(settings.get("max_steps", PretrainConfig.max_steps))
    if run.figure:  # the checkpoints Figure 5 fine-tunes from, all kept
        settings.update(checkpoint_every=study.figure.every, keep_checkpoints=0)
    else:
        settings.setdefault("checkpoint_every", max(1, steps // 4))
        settings.setdefault("keep_checkpoints", 1)
    settings.setdefault("precision", cfg.precision)
    settings.setdefault("device", cfg.device)
    settings.setdefault("log_every", max(1, steps // 100))
    if held is not None:
        settings.setdefault("eval_every", max(1, steps // 5))
    run_dir = folder / "run"
    resume = latest_checkpoint(run_dir) is not None
    pcfg = PretrainConfig.from_recipe(recipe, **settings, data=str(data), eval_data=str(held or ""),
                                      tokenizer=str(inputs.vocab), out=str(run_dir), progress=False, resume=resume,
                                      overwrite=not resume)
    what = "resuming" if pcfg.resume else "pre-training"
    if isinstance(model, dict):
        model = f"L{model.get('num_hidden_layers')} H{model.get('hidden_size')} A{model.get('num_attention_heads')}"
    objective = pcfg.resolve_objective(load_manifest(data)["config"]["nsp"])
    logger.info(f"ablate: {what} {' / '.join(run.variants)}: {model} model, objective {objective}, "
                f"{steps:,} steps of {pcfg.batch_size}")
    t0 = time.perf_counter()
    with errors_only():
        result = pretrain(pcfg)
    if result.stopped_early:
        raise KeyboardInterrupt(f"pre-training stopped at step {result.step}; rerun the study to resume it")
    record = {"variants": run.variants, "steps": result.step, "batch_size": pcfg.batch_size,
              "objective": objective,
              "minutes": (time.perf_counter() - t0) / 60, "eval_metrics": result.eval_metrics,
              "final_metrics": result.final_metrics, "model": str(run_dir / "model"),
              "model_description": _model_description(run_dir / "model")}
    atomic_write_text(done, json.dumps(record, indent=1) + "\n")
    ev = result.eval_metrics
    held_text = ", ".join(f"{k} {v:.3f}" for k, v in ev.items() if k.endswith("accuracy")) or "no held-out data"
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
    found = {}
    for name, run in _pretrainings(study).items():
        done = out / "pretrain" / run.name / DONE_FILE
        if done.is_file():
            found[name] = json.loads(done.read_text(encoding="utf-8"))
    return found


# ---------------------------------------------------------------------------- fine-tuning cells
def _finetune_cell(folder: Path, start: Path, variant: Variant, task: TaskSpec, seed: int,
                   inputs: _Inputs, cfg: AblateConfig, keep_model: bool, pretrain_step: int | None = None) -> Cell:
    """Run (or resume, or read) one fine-tuning cell."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    done = folder / CELL_FILE
    settings = {**inputs.tasks[task.name], **variant.finetune}
    _claim(folder, {"start": str(start), "seed": seed, "finetune": settings, "metric": task.metric}, "fine-tuning")
    if done.is_file():
        return Cell(**json.loads(done.read_text(encoding="utf-8")))
    settings.setdefault("precision", cfg.precision)
    settings.setdefault("device", cfg.device)
    resume = latest_checkpoint(folder) is not None
    fcfg = FinetuneConfig(**settings, model=str(start), out=str(folder), seed=seed, keep_best=True,
                          metric_for_best=task.metric, eval_every=10**9, progress=False, resume=resume,
                          overwrite=not resume)
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


def read_cells(out: Path) -> tuple[list[Cell], list[Cell]]:
    """The finished cells of a study folder: (the table's, the figure's)."""
    def read(pattern: str) -> list[Cell]:
        return [Cell(**json.loads(p.read_text(encoding="utf-8"))) for p in sorted(out.glob(pattern))]

    return read(f"cells/*/*/seed-*/{CELL_FILE}"), read(f"figure/*/*/step-*/seed-*/{CELL_FILE}")


# ---------------------------------------------------------------------------- the study
def run_study(study: str | Path | Study, cfg: AblateConfig | None = None) -> Path:
    """Run every unfinished cell of ``study`` (a study file, a bundled study's name, or a loaded
    `Study`), then write its report; return the report's path."""
    from bertforge.experiments.report import write_report

    cfg = cfg or AblateConfig()
    study = study if isinstance(study, Study) else load_study(study)
    if cfg.seeds:
        try:
            seeds = tuple(int(s) for s in cfg.seeds.split(","))
        except ValueError:
            raise ValueError(f"--seeds must be comma-separated integers, got {cfg.seeds!r}") from None
        study = dataclasses.replace(study, seeds=seeds)
    out = Path(cfg.out or Path("runs") / "ablate" / study.name)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.report_only:
        return write_report(study, out, *read_cells(out), read_pretraining(study, out))

    t0 = time.perf_counter()
    runs = _pretrainings(study)
    cells = study.cells()
    total = len(cells) * len(study.seeds)
    logger.info(f"ablate: {study.name}: {len(study.variants)} variants ({len(set(map(id, runs.values())))} "
                f"pre-trainings) x {len(study.tasks)} tasks x {len(study.seeds)} seeds = {total} fine-tunings -> {out}")
    inputs = _inputs(study, out)
    pretrained: dict[str, dict[str, Any]] = {}
    done = 0
    for variant in study.variants:
        if variant.checkpoint:
            start = Path(variant.checkpoint)
        else:
            run = runs[variant.name]
            pretrained[variant.name] = _pretrain(study, run, inputs, out, cfg)
            start = out / "pretrain" / run.name / "run" / "model"
        for v, task in cells:
            if v is not variant:
                continue
            for seed in study.seeds:
                folder = out / "cells" / slug(v.name) / slug(task.name) / f"seed-{seed}"
                cell = _finetune_cell(folder, start, v, task, seed, inputs, cfg, study.keep_models)
                done += 1
                logger.info(f"ablate: [{done}/{total}] {v.name} | {task.name} | seed {seed}: {cell.metric} "
                            f"{cell.value:.4f} ({cell.seconds:.0f} s)")
        write_report(study, out, *read_cells(out), read_pretraining(study, out))
    if study.figure:
        _figure(study, runs, inputs, out, cfg)
    path = write_report(study, out, *read_cells(out), read_pretraining(study, out))
    logger.info(f"ablate: {study.name} finished in {(time.perf_counter() - t0) / 60:.1f} minutes; report -> {path}")
    return path


def _figure(study: Study, runs: dict[str, Any], inputs: _Inputs, out: Path, cfg: AblateConfig) -> None:
    """Figure 5: the figure's task fine-tuned from every saved checkpoint of the figure's variants. The
    last checkpoint holds the finished model's weights: its point is the table's cell, not a rerun."""
    fig = study.figure
    task = study.task(fig.task)
    for name in fig.variants:
        variant = study.variant(name)
        run_dir = out / "pretrain" / runs[name].name / "run"
        last = json.loads((out / "pretrain" / runs[name].name / DONE_FILE).read_text(encoding="utf-8"))["steps"]
        for step, checkpoint in checkpoints(run_dir):
            for seed in study.seeds:
                folder = out / "figure" / slug(name) / slug(task.name) / f"step-{step:08d}" / f"seed-{seed}"
                table_cell = out / "cells" / slug(name) / slug(task.name) / f"seed-{seed}" / CELL_FILE
                if step == last and table_cell.is_file() and not (folder / CELL_FILE).is_file():
                    cell = dataclasses.replace(Cell(**json.loads(table_cell.read_text(encoding="utf-8"))),
                                               pretrain_step=step, seconds=0.0)
                    folder.mkdir(parents=True, exist_ok=True)
                    atomic_write_text(folder / CELL_FILE, json.dumps(dataclasses.asdict(cell), indent=1) + "\n")
                    continue
                cell = _finetune_cell(folder, checkpoint, variant, task, seed, inputs, cfg, False, pretrain_step=step)
                logger.info(f"ablate: figure: {name} at pre-training step {step:,} | {task.name} | seed {seed}: "
                            f"{cell.metric} {cell.value:.4f} ({cell.seconds:.0f} s)")
