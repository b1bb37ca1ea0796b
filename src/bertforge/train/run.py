"""The shape every training run has, which pre-training and fine-tuning fill in.

A training run checks its settings when it is made. Running it (`TrainingRun.run`) then joins the processes
(`bertforge.train.distributed.setup`), holds its folder's lock (`bertforge.train.lock.run_lock`) from
before it reads its inputs until its last process is done, admits itself into the folder
(`bertforge.train.rundir.open_run_dir`), builds its model from one seed on every process and then
reseeds each process for its own dropout, records its settings, trains with the shared
`bertforge.train.loop.Trainer`, saves the final model (marked when the run stopped early) and waits
for every process. Pre-training and fine-tuning say only what differs, in these steps:

    read_inputs()          what is read before the folder is admitted (fine-tuning's task files)
    settled_config()       the settings with what the inputs decide filled in (fine-tuning's steps)
    setup_data()           after admission, before the model: the training data (pre-training's shards)
    build_model()          under the run's seed, the same on every process
    setup_training(model)  the `Objective`, the batch source and the evaluation
    run_facts(model)       what the run records besides its settings (the model's config, the labels)
    log_start(), finish(result)

The speed layer (`bertforge.fast.speed_up`) and distributed wrapping are applied here (`build_trainer`), so
the model the trainer gets is ready to train and the model code knows nothing of either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from bertforge.fast import speed_up
from bertforge.train.distributed import Distributed, unwrap_model, wrap_model
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
    """The `Trainer` of ``model``, wired as every run wires its own: the model on this process's device,
    with the speed paths of `bertforge.fast` (its state dict unchanged) and, with several processes,
    wrapped for DDP or FSDP (``cfg.strategy``). ``options``: the Trainer's keyword arguments. Runs,
    benchmarks and step timers all build their trainer here."""
    dist = dist or Distributed()
    ready = wrap_model(speed_up(unwrap_model(model).to(dist.device)), dist, cfg.strategy)
    return Trainer(ready, objective, batches, cfg, out, dist=dist, **options)  # type: ignore[arg-type]


class TrainingRun(Generic[Outcome]):
    """A training run: the steps every run takes (`run`), with hooks for those that differ.

    ``cfg``: the run's settings, a `TrainConfig` with the run folder's ``out``, ``resume`` and
    ``overwrite``; its fields declare which of them a resumed run may change (`resume_rules`)."""

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
        from bertforge.train.distributed import setup

        self.dist = setup(self.cfg.device)
        with run_lock(self.out, self.dist):
            return self._run()

    def _run(self) -> Outcome:
        dist = self.dist
        self.read_inputs()
        self.cfg = self.settled_config()  # the settings every later step reads
        resume_from = open_run_dir(self.out, self.cfg.resume, self.cfg.overwrite, outputs=self.outputs, dist=dist)
        self.setup_data()
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every process
        model = self.build_model()
        torch.manual_seed(self.cfg.seed + dist.rank)  # dropout: a stream of its own per process
        objective, batches, evaluate = self.setup_training(model)
        run_config = self.run_config(model)
        # `fit` writes the settings once a resume's are accepted: a refused resume changes nothing
        self.trainer = build_trainer(model, objective, batches, self.cfg, self.out, dist=dist, evaluate=evaluate,
                                     tokenizer=self.tokenizer, run_config=run_config,
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
        """The run's settings once its inputs are read: what it derives from them filled in (the settings as
        given by default). The one place the settings change: every later step reads these."""
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
        """What an entry missing from an earlier run's record means, for entries whose meaning depends on the
        run (``"a.b"``: field ``b`` of a nested record ``a``); a config field declares its own (`setting`)."""
        return {}

    def resume_rules(self) -> ResumeRules:
        """What a resumed run may change: the settings its config's fields declare resumable, and the warmup
        they resolve to (`run_config`'s ``warmup_steps_used``: a longer run warms up longer)."""
        return ResumeRules.of(type(self.cfg)).with_facts(("warmup_steps_used",), self.facts_absent_mean())

    def log_start(self) -> None:
        """Say what the run trains, once the trainer exists (nothing by default)."""

    def finish(self, result: TrainResult) -> Outcome:
        """The run's outcome, once the final model is saved (every process calls this)."""
        return result  # type: ignore[return-value]

    # ------------------------------------------------------------------ shared
    def run_config(self, model: nn.Module) -> dict[str, Any]:
        """What the run records (`bertforge.train.rundir.RUN_CONFIG`, every checkpoint): its settings as given
        (None: not given), the warmup they resolve to, and the run's `run_facts`."""
        config = self.recorded_settings()
        # a time budget's warmup is a share of it, not steps
        config["warmup_steps_used"] = None if self.cfg.budget_minutes else self.cfg.warmup
        return {**config, **self.run_facts(model)}
