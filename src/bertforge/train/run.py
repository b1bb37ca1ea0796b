"""The shape every training run has, which pre-training and fine-tuning fill in.

Running a run (`TrainingRun.run`) joins the processes, holds its folder's lock, admits itself into the
folder, builds its model from one seed on every process, trains with the shared `bertforge.train.loop.Trainer`
and saves the final model. Pre-training and fine-tuning say only what differs, in these steps:

    read_inputs()          what is read before the folder is admitted (fine-tuning's task files)
    settled_config()       the settings with what the inputs decide filled in (fine-tuning's steps)
    setup_data()           after admission, before the model: the training data (pre-training's shards)
    build_model()          under the run's seed, the same on every process
    setup_training(model)  the `Objective`, the batch source and the evaluation
    run_facts(model)       what the run records besides its settings (the model's config, the labels)
    log_start(), finish(result)

The speed layer and distributed wrapping are applied here (`build_trainer`): the model code knows neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from bertforge.fast import speed_up
from bertforge.train.distributed import Distributed, setup, unwrap_model, wrap_model
from bertforge.train.config import ResumeRules
from bertforge.train.lock import run_lock
from bertforge.train.loop import BatchSource, Evaluation, Objective, Trainer, TrainResult
from bertforge.train.rundir import open_run_dir, stop_marker

__all__ = ["TrainingRun", "build_trainer", "Evaluate"]

Outcome = TypeVar("Outcome")
Evaluate = Callable[[nn.Module, int], dict[str, float] | Evaluation]
"""``evaluate(model, step) -> metrics`` (or an `Evaluation`): a run's evaluation, on every process."""


def build_trainer(model: nn.Module, objective: Objective, batches: BatchSource | None, cfg: Any, out: str | Path,
                  *, dist: Distributed | None = None, **options: Any) -> Trainer:
    """The `Trainer` of ``model`` as every run, benchmark and step timer wires it: on this process's device,
    with the speed paths of `bertforge.fast` and, with several processes, wrapped for DDP or FSDP
    (``cfg.strategy``). ``options``: the Trainer's keyword arguments."""
    dist = dist or Distributed()
    ready = wrap_model(speed_up(unwrap_model(model).to(dist.device)), dist, cfg.strategy)
    return Trainer(ready, objective, batches, cfg, out, dist=dist, **options)  # type: ignore[arg-type]


class TrainingRun(Generic[Outcome]):
    """A training run: the steps every run takes (`run`), with hooks for those that differ. ``cfg``: the run's
    settings, a `TrainConfig` with the run folder's ``out``, ``resume`` and ``overwrite``."""

    outputs: ClassVar[tuple[str, ...]] = ()
    """What the run writes into the run folder besides `bertforge.train.rundir.RUN_FILES` (fine-tuning's
    best/): an earlier run's are refused or deleted with them."""
    unrecorded: ClassVar[tuple[str, ...]] = ("resume", "overwrite")
    """Settings that say how the run starts, not what it is: left out of the recorded settings."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.dist = Distributed()
        self.tokenizer: Any = None
        """Saved with every checkpoint and model."""
        self.trainer: Trainer | None = None

    def run(self) -> Outcome:
        """Run (or resume) the run in its folder, whose lock it holds throughout; return `finish`'s outcome."""
        self.dist = setup(self.cfg.device)
        with run_lock(self.out, self.dist):
            return self._run()

    def _run(self) -> Outcome:
        dist = self.dist
        self.read_inputs()
        self.cfg = self.settled_config()  # the settings every later step reads
        folder = dict(run_dir=self.out, resume=self.cfg.resume, overwrite=self.cfg.overwrite, outputs=self.outputs,
                      dist=dist)
        open_run_dir(**folder, change=False)  # refused here, before the data is read, changes nothing
        self.setup_data()
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every process
        model = self.build_model()
        torch.manual_seed(self.cfg.seed + dist.rank)  # dropout: a stream of its own per process
        objective, batches, evaluate = self.setup_training(model)
        resume_from = open_run_dir(**folder)  # the data and model accepted: an earlier run's files go now
        # `fit` writes the settings once a resume's are accepted: a refused resume changes nothing
        self.trainer = build_trainer(model, objective, batches, self.cfg, self.out, dist=dist, evaluate=evaluate,
                                     tokenizer=self.tokenizer, run_config=self.run_config(model),
                                     resume_rules=self.resume_rules(), write_run_config=True)
        self.log_start()
        result = self.trainer.fit(resume_from=resume_from)
        self.trainer.save_model(self.out / "model", extra_files=stop_marker(result))
        outcome = self.finish(result)
        dist.barrier()  # no process leaves (and tears down the process group) while another still works
        return outcome

    # ------------------------------------------------------------------ what a kind of run fills in
    def read_inputs(self) -> None:
        """Read what the run needs before its folder is admitted (nothing by default)."""

    def settled_config(self) -> Any:
        """The run's settings with what it derives from its inputs filled in: every later step reads these."""
        return self.cfg

    def setup_data(self) -> None:
        """After the folder is admitted, before the model: the training data (the settings are settled by now)."""

    def build_model(self) -> nn.Module:
        """The model to train, built under the run's seed (the same on every process)."""
        raise NotImplementedError

    def setup_training(self, model: nn.Module) -> tuple[Objective, BatchSource, Evaluate | None]:
        """The objective, the batch source and the evaluation (None: none) that train ``model``."""
        raise NotImplementedError

    def recorded_settings(self) -> dict[str, Any]:
        """The run's settings as recorded with it (all but `unrecorded`)."""
        return {k: v for k, v in dataclasses.asdict(self.cfg).items() if k not in self.unrecorded}

    def run_facts(self, model: nn.Module) -> dict[str, Any]:
        """What the run records besides its settings (nothing by default)."""
        return {}

    def facts_absent_mean(self) -> Mapping[str, Any]:
        """What a run fact missing from an earlier run's record means (``"a.b"``: field ``b`` of record ``a``)."""
        return {}

    def resume_rules(self) -> ResumeRules:
        """What a resumed run may change: the settings declared resumable, and the warmup they resolve to."""
        return ResumeRules.of(type(self.cfg)).with_facts(("warmup_steps_used",), self.facts_absent_mean())

    def log_start(self) -> None:
        """Say what the run trains, once the trainer exists (nothing by default)."""

    def finish(self, result: TrainResult) -> Outcome:
        """The run's outcome, once the final model is saved (every process calls this)."""
        return result  # type: ignore[return-value]

    # ------------------------------------------------------------------ shared
    def run_config(self, model: nn.Module) -> dict[str, Any]:
        """What the run records (`RUN_CONFIG`, every checkpoint): its settings as given, the warmup they
        resolve to, and its `run_facts`."""
        config = self.recorded_settings()
        # a time budget's warmup is a share of it, not steps
        config["warmup_steps_used"] = None if self.cfg.budget_minutes else self.cfg.warmup
        return {**config, **self.run_facts(model)}
