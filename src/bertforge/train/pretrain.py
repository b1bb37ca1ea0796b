"""``bertforge pretrain``: the paper's pre-training (masked LM + next sentence prediction) on prepared shards.

A model (a preset size, a ``config.json``, or a checkpoint's weights), the data of ``bertforge prepare``, an
objective (`PretrainingObjective` for mlm+nsp and mlm, `LeftToRightObjective` for ltr: Table 5's ablations)
and the shared loop. The paper's two phases are two runs, the second with ``--init-from`` the first's model/.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from bertforge.data.instances import MaskingConfig
from bertforge.data.loader import PretrainingDataset, PretrainingLoader
from bertforge.data.prepare import load_manifest, special_ids
from bertforge.model import losses
from bertforge.model.config import BertConfig, dropout_overrides
from bertforge.model.heads import BertForMaskedLM, BertForPreTraining
from bertforge.settings import option, setting
from bertforge.text.tokenizer import BertTokenizer
from bertforge.train.config import TrainConfig
from bertforge.train.history import objective_metrics
from bertforge.train.loop import BatchSource, Objective, TrainResult
from bertforge.train.plot import plot_run
from bertforge.train.run import Evaluate, TrainingRun

__all__ = ["RECIPES", "LeftToRightObjective", "PretrainConfig", "PretrainRun", "PretrainingObjective",
           "build_pretraining_model", "original_tokens", "pretrain"]

logger = logging.getLogger("bertforge")

ObjectiveName = Literal["auto", "mlm+nsp", "mlm", "ltr"]
RecipeName = Literal["paper", "budget"]


@dataclass
class PretrainConfig(TrainConfig):
    """A pre-training run: the loop's settings (the paper's defaults) plus model and data."""

    data: str = ""
    """Folder prepared by `bertforge prepare` (its manifest fixes the vocab, length and NSP mode)."""
    out: str = setting("runs/pretrain", resumable=True)
    """Run folder: metrics.jsonl, curves.png, checkpoints/, and the final model/."""
    tokenizer: str = ""
    """Vocab or checkpoint folder of the data's tokenizer (default: the --init-from folder)."""
    model: str = "base"
    """Model size preset (tiny, mini, small, medium, base, large) or a config.json path."""
    init_from: str = ""
    """Start from these weights (a checkpoint folder, e.g. phase 1's model/) instead of a fresh init."""
    dropout: float = setting(0.1, at_least=0, below=1)
    """Dropout on hidden states and attention probabilities."""
    eval_data: str = ""
    """Prepared folder of held-out data for evaluation (the objective's loss and accuracy)."""
    eval_shards: int = setting(0, at_least=0)
    """Hold out the last this many shards of --data for evaluation (when no --eval-data)."""
    eval_batches: int = setting(20, resumable=True, at_least=1)
    """Batches per evaluation at most."""
    shuffle_shards: int = setting(8, absent=1, at_least=1)
    """Shards whose instances are shuffled together, and held in memory at once: a shard is a stretch of the
    corpus, so one at a time would train on one stretch for a while (1: shard by shard, as runs recorded
    without this setting read)."""
    objective: ObjectiveName = "auto"
    """mlm+nsp (the paper's BERT; NSP data), mlm (masked LM only: the ablation "No NSP", also on NSP data),
    ltr (left-to-right LM with a causal mask, no NSP: "LTR & No NSP"), or auto (mlm+nsp on NSP data, else mlm)."""
    masked_lm_prob: float | None = setting(None, absent=None, above=0, below=1)
    """Mask this share of each sequence's tokens afresh at every pass over the data (dynamic masking, also on
    statically masked data, whose masks are undone first; [MASK] / random / unchanged in the shares the data
    was prepared with, 80/10/10 by default); none: the data's masks as prepared. The held-out evaluation keeps
    its prepared masks."""
    recipe: RecipeName = setting("paper", absent="paper")
    """Named settings to start from: paper (the defaults) or budget (what learns most in a fixed time: give
    --budget-minutes, or --max-steps); a --config file and flags override the recipe's settings."""
    resume: bool = False
    """Continue the run in --out from its latest checkpoint."""
    overwrite: bool = False
    """Delete an earlier run's files in --out (metrics, checkpoints, model) and start afresh."""

    def __post_init__(self) -> None:
        super().__post_init__()
        size = RECIPES.get(self.recipe, {}).get("model", "base")
        if self.init_from and self.model not in (size, ""):
            raise ValueError(f"{option('model', self.model)} and {option('init_from', self.init_from)}: the model's "
                             f"size and shape are the checkpoint's (its config.json); drop {option('model')}")
        # A recipe named but not applied (every setting it sets still at the paper's default) would be
        # recorded and ignored: `from_recipe` (``--recipe``, ``recipe:`` in a config file) applies one.
        preset = RECIPES.get(self.recipe)
        paper = {f.name: f.default for f in dataclasses.fields(self)}
        if preset and all(getattr(self, name) == paper[name] for name in preset):
            raise ValueError(f"recipe {self.recipe!r} is named but none of its settings is applied: build the "
                             f"config with PretrainConfig.from_recipe({self.recipe!r}, ...)")

    @classmethod
    def from_recipe(cls, name: str, **settings: Any) -> "PretrainConfig":
        """The recipe ``name``'s settings (`RECIPES`), with ``settings`` given on top of them."""
        if name not in RECIPES:
            raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
        return cls(**{**RECIPES[name], **settings, "recipe": name})

    def masking(self, data: Mapping[str, Any]) -> Any:
        """The `MaskingConfig` of ``masked_lm_prob`` for data prepared with settings ``data``: its length sets
        the slots, what replaces a chosen token stays as prepared. None: the data's masks as prepared."""
        if self.masked_lm_prob is None:
            return None
        slots = max(1, math.ceil(self.masked_lm_prob * int(data["max_seq_length"])))
        return MaskingConfig(self.masked_lm_prob, slots, float(data.get("mask_token_prob", 0.8)),
                             float(data.get("random_token_prob", 0.1)), bool(data.get("whole_word_mask", False)))

    def resolve_objective(self, nsp_data: bool) -> str:
        """The objective trained on data prepared with (``nsp_data``) or without next sentence prediction."""
        if self.objective == "auto":
            return data_objective(nsp_data)
        if self.objective == "mlm+nsp" and not nsp_data:
            raise ValueError(f"{self.data}: objective mlm+nsp needs data prepared with next sentence prediction "
                             f"(this data was prepared with {option('nsp', False)}); use "
                             f"{option('objective', 'mlm')} or ltr")
        return self.objective


RECIPES: dict[str, dict[str, Any]] = {
    "paper": {},
    "budget": {"objective": "mlm", "masked_lm_prob": 0.15, "dropout": 0.0, "lr": 2e-3, "adam_beta2": 0.98,
               "warmup_ratio": 0.06, "batch_size": 32, "model": "tiny"},
}
"""Named pre-training settings. ``paper``: the paper's (the defaults). ``budget``: what learns most in a
fixed time budget (with ``budget_minutes``; measured in docs/pretraining.md)."""


def data_objective(nsp_data: bool) -> str:
    """The objective the data was prepared for: mlm+nsp on sentence pairs, mlm on --no-nsp data."""
    return "mlm+nsp" if nsp_data else "mlm"


def _correct(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many rows of ``logits`` (M, C) score their label highest: the label's logit equals the
    row's maximum (a tie counts as right). ``amax`` is several times cheaper than ``argmax`` over V."""
    logits = logits.detach()
    return (logits.gather(-1, labels.unsqueeze(-1)) >= logits.amax(-1, keepdim=True)).sum()


class PretrainingObjective:
    """MLM (+ NSP) losses and accuracies. MLM logits are built at the masked positions only."""

    def __init__(self, nsp: bool = True):
        self.nsp = nsp

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        out = {"mlm": float((batch["labels"] != losses.IGNORE_INDEX).sum())}
        if self.nsp:
            out["nsp"] = float(batch["next_sentence_label"].numel())
        return out

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        filled = batch["labels"] != losses.IGNORE_INDEX  # (B, P): about a third of the slots are unused
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    masked_positions=batch["masked_positions"], prediction_mask=filled)
        labels = batch["labels"][filled]  # (M,)
        # (M, V) in float32: the loss needs it so, and reductions over V are much slower on bf16
        mlm_logits = (out.prediction_logits if self.nsp else out.logits).float()
        terms = {"mlm": losses.masked_lm_loss(mlm_logits, labels, reduction="sum")}
        stats = {"mlm_correct": _correct(mlm_logits, labels)}
        if self.nsp:
            nsp_labels = batch["next_sentence_label"]
            nsp_logits = out.seq_relationship_logits  # (B, 2)
            terms["nsp"] = losses.next_sentence_loss(nsp_logits, nsp_labels, reduction="sum")
            stats["nsp_correct"] = _correct(nsp_logits, nsp_labels)
        return terms, stats

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float], stats: dict[str, float]
                ) -> dict[str, float]:
        out = {"mlm_accuracy": stats.get("mlm_correct", 0.0) / max(counts.get("mlm", 0.0), 1.0)}
        if self.nsp:
            out["nsp_accuracy"] = stats.get("nsp_correct", 0.0) / max(counts.get("nsp", 0.0), 1.0)
        return out


def original_tokens(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) the tokens before masking: each label written back at its masked position."""
    ids, positions, labels = batch["input_ids"], batch["masked_positions"].long(), batch["labels"]
    filled = labels != losses.IGNORE_INDEX  # unused slots point at position 0 and rewrite what is there
    return ids.scatter(1, positions, torch.where(filled, labels, ids.gather(1, positions)))


class LeftToRightObjective:
    """A left-to-right language model on the same prepared instances: the masks undone
    (`original_tokens`), the model causal, and at every real position t < L - 1 the token t + 1
    predicted by the MLM head (tied to the word embeddings). No NSP; token type ids as prepared."""

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        return {"ltr": float(batch["attention_mask"][:, 1:].sum())}

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        ids, mask = original_tokens(batch), batch["attention_mask"]
        B, T = ids.shape
        positions = torch.arange(T - 1, device=ids.device).expand(B, T - 1)  # (B, T - 1): each predicts its next
        targets = mask[:, 1:].bool()  # (B, T - 1): the next token is real
        out = model(ids, mask, batch["token_type_ids"], masked_positions=positions, prediction_mask=targets)
        logits = out.logits.float()  # (M, V)
        labels = ids[:, 1:][targets]  # (M,)
        return ({"ltr": losses.masked_lm_loss(logits, labels, reduction="sum")},
                {"ltr_correct": _correct(logits, labels)})

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float], stats: dict[str, float]
                ) -> dict[str, float]:
        n = max(counts.get("ltr", 0.0), 1.0)
        return {"ltr_accuracy": stats.get("ltr_correct", 0.0) / n,
                "ltr_perplexity": math.exp(min(loss_sums.get("ltr", 0.0) / n, 50.0))}


def build_pretraining_model(cfg: PretrainConfig, vocab_size: int, nsp: bool, max_seq_length: int,
                            objective: str | None = None) -> nn.Module:
    """The model ``objective`` trains (default: the data's own), fresh or from --init-from:
    `BertForPreTraining` for mlm+nsp; `BertForMaskedLM` for mlm (nothing in the checkpoint that was not
    trained) and, causal (``is_decoder``), for ltr. ``nsp``: whether the data holds sentence pairs."""
    objective = objective or cfg.resolve_objective(nsp)
    cls = BertForPreTraining if objective == "mlm+nsp" else BertForMaskedLM
    overrides: dict[str, Any] = dict(dropout_overrides(cfg.dropout), is_decoder=objective == "ltr")
    if cfg.init_from:
        model = cls.from_pretrained(cfg.init_from, **overrides)
        config = model.config
        # a head the checkpoint lacks (an encoder-only checkpoint's MLM head) trains alone first (the loop)
        model.fresh_head = [k for k in model.load_report.newly_initialized if k.startswith(cls._fresh_head_prefixes)]
    else:
        if cfg.model.endswith(".json") or Path(cfg.model).is_dir():
            config = BertConfig.load(cfg.model).replace(vocab_size=vocab_size, **overrides)
        else:
            config = BertConfig.preset(cfg.model, vocab_size=vocab_size, **overrides)
        model = cls(config)
    if nsp and config.type_vocab_size < 2:
        # NSP instances give segment B token type 1: an IndexError in the embedding otherwise
        source = Path(cfg.init_from or cfg.model)
        source = source / "config.json" if source.is_dir() else source
        raise ValueError(f"{source}: type_vocab_size is {config.type_vocab_size}, but the data was prepared with "
                         "next sentence prediction, whose segment B has token type 1: NSP needs type_vocab_size >= 2 "
                         f"(or prepare the data with {option('nsp', False)})")
    if config.vocab_size != vocab_size:
        raise ValueError(f"the model has {config.vocab_size} word embeddings but the data's vocab has "
                         f"{vocab_size} entries")
    if max_seq_length > config.max_position_embeddings:
        raise ValueError(f"the data has sequences of {max_seq_length} tokens; the model takes at most "
                         f"{config.max_position_embeddings}")
    return model


def _evaluator(dataset: Any, objective: PretrainingObjective, cfg: PretrainConfig, dist: Any, special: Any):
    """The objective's held-out loss and accuracy over the same instances at every evaluation: one loader,
    rewound to its first batch each time, so that a held-out set within one shard window is read once."""
    batch = min(cfg.micro_batch(dist.world_size), max(1, len(dataset) // dist.world_size))
    loader = PretrainingLoader(dataset, batch, seed=cfg.seed, rank=dist.rank, world_size=dist.world_size,
                               special=special, shuffle_shards=cfg.shuffle_shards)
    start = loader.state_dict()

    def evaluate(model: nn.Module, step: int) -> dict[str, float]:
        loader.load_state_dict(start)
        names: list[str] = []
        totals: torch.Tensor | None = None
        for i, b in enumerate(loader):
            if i >= cfg.eval_batches:
                break
            counts = objective.counts(b)
            terms, stats = objective.forward(model, {k: v.to(dist.device) for k, v in b.items()})
            values = {**{f"loss:{k}": v.float() for k, v in terms.items()},
                      **{f"count:{k}": torch.tensor(c, device=dist.device) for k, c in counts.items()},
                      **{f"stat:{k}": v.float() for k, v in stats.items()}}
            names = list(values)
            row = torch.stack([values[k].double() for k in names])
            totals = row if totals is None else totals + row
        if totals is None:
            return {}
        got = dict(zip(names, dist.all_reduce_sum(totals).tolist()))
        pick = lambda kind: {k.split(":", 1)[1]: v for k, v in got.items() if k.startswith(kind + ":")}  # noqa: E731
        return objective_metrics(objective, pick("loss"), pick("count"), pick("stat"))

    return evaluate


def pretrain(cfg: PretrainConfig) -> TrainResult:
    """Run (or resume) a pre-training run, holding its folder's lock; return the loop's final state."""
    return PretrainRun(cfg).run()


class PretrainRun(TrainingRun[TrainResult]):
    """Pre-training: prepared shards, the objective and model, and a held-out evaluation."""

    cfg: PretrainConfig

    def __init__(self, cfg: PretrainConfig):
        super().__init__(cfg)
        if not cfg.data:
            raise ValueError(f"pretrain needs {option('data')} (a folder written by `bertforge prepare`)")
        tokenizer_dir = cfg.tokenizer or cfg.init_from
        if not tokenizer_dir:
            raise ValueError(f"pretrain needs {option('tokenizer')} (the vocab folder the data was prepared with) or "
                             f"{option('init_from')}")
        self.tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)

    def setup_data(self) -> None:
        """The training shards (checked now, not hours in), their loader, the objective and the evaluation."""
        cfg, dist, tok = self.cfg, self.dist, self.tokenizer
        self.manifest = load_manifest(cfg.data)
        self.data_cfg = data_cfg = self.manifest["config"]
        n_shards = len(self.manifest["shards"])
        if cfg.eval_shards and not cfg.eval_data and cfg.eval_shards >= n_shards:
            raise ValueError(f"{option('eval_shards', cfg.eval_shards)} would hold out all {n_shards} shards of "
                             f"{cfg.data}")
        held_out = range(n_shards - cfg.eval_shards, n_shards) if cfg.eval_shards and not cfg.eval_data else range(0)
        made_with = {"vocab_hash": tok.vocab_hash, "normalization": tok.normalization}  # the data's must match
        self.dataset = PretrainingDataset(cfg.data, **made_with,
                                          shards=[i for i in range(n_shards) if i not in held_out])
        self.dataset.check_files()  # every shard's size and checksum now, not hours in when the loader reaches it
        self.masking = cfg.masking(data_cfg)
        special = special_ids(tok) if data_cfg.get("dynamic_masking") or self.masking else None
        self.loader = PretrainingLoader(self.dataset, cfg.micro_batch(dist.world_size), seed=cfg.seed, rank=dist.rank,
                                        world_size=dist.world_size, special=special, masking=self.masking,
                                        shuffle_shards=cfg.shuffle_shards)
        self.nsp = nsp = bool(data_cfg["nsp"])
        self.objective_name = objective = cfg.resolve_objective(nsp)
        self.objective = (LeftToRightObjective() if objective == "ltr"
                          else PretrainingObjective(nsp=objective == "mlm+nsp"))
        self.evaluate: Evaluate | None = None
        if cfg.eval_data or held_out:
            eval_set = PretrainingDataset(cfg.eval_data or cfg.data, **made_with,
                                          shards=None if cfg.eval_data else list(held_out))
            if objective == "mlm+nsp" and not eval_set.config["nsp"]:
                raise ValueError(f"{cfg.eval_data}: prepared without next sentence prediction, which objective "
                                 "mlm+nsp evaluates")
            eval_set.check_files()
            self.evaluate = _evaluator(eval_set, self.objective, cfg, dist, special)

    def build_model(self) -> nn.Module:
        return build_pretraining_model(self.cfg, self.tokenizer.vocab_size, self.nsp,
                                       int(self.data_cfg["max_seq_length"]), self.objective_name)

    def setup_training(self, model: nn.Module) -> tuple[Objective, BatchSource, Evaluate | None]:
        return self.objective, self.loader, self.evaluate

    def recorded_settings(self) -> dict[str, Any]:
        settings = super().recorded_settings()
        del settings["objective"]
        if self.cfg.init_from:  # the size is the checkpoint's (model_config), not a preset's
            settings["model"] = ""
        if self.objective_name != data_objective(self.nsp):
            # part of the run's identity; absent means the data's own objective (mlm+nsp or mlm), as "auto" gives
            settings["objective"] = self.objective_name
        return settings

    def run_facts(self, model: nn.Module) -> dict[str, Any]:
        model_config = model.config.to_dict() | {"bertforge_version": None}
        if not model.config.is_decoder:  # recorded when true only: older records read the same
            del model_config["is_decoder"]
        return {"data_vocab_hash": self.manifest["vocab_hash"], "model_config": model_config}

    def facts_absent_mean(self) -> Mapping[str, Any]:
        # an absent objective is the data's own; is_decoder is recorded when true only
        return {"objective": data_objective(self.nsp), "model_config.is_decoder": False}

    def log_start(self) -> None:
        cfg, dist, trainer = self.cfg, self.dist, self.trainer
        if not dist.is_main or trainer is None:
            return
        model = trainer.model
        precision = trainer.precision + (" (auto)" if cfg.precision == "auto" else "")
        logger.info(f"pretrain: {type(model).__name__} {model.num_parameters():,} parameters; "
                    f"{len(self.dataset):,} training instances (length {self.data_cfg['max_seq_length']}"
                    f"{', sentence pairs' if self.nsp else ''}); objective {self.objective_name}; "
                    f"{dist.world_size} process(es) on {dist.device}; global batch {cfg.batch_size}; "
                    + (f"{cfg.budget_minutes:.1f} minutes of training, warmup {cfg.budget_warmup_share:.0%} of them"
                       if cfg.budget_minutes else f"warmup {cfg.warmup:,} steps")
                    + (f"; fresh masks on {cfg.masked_lm_prob:.0%} of the tokens" if self.masking else "")
                    + f"; precision {precision}")
        if cfg.warmup_scaled and not cfg.budget_minutes:
            logger.warning(f"pretrain: the paper's {cfg.DEFAULT_WARMUP_STEPS:,} warmup steps are longer than this run's "
                           f"{cfg.max_steps:,}: warming up over {cfg.warmup:,} (the paper's share, 1%) instead; "
                           f"{option('warmup_steps')} or {option('warmup_ratio')} chooses")
        fresh = getattr(model, "fresh_head", ())
        if fresh and trainer.head_share:
            head = ".".join(fresh[0].split(".")[:2])
            logger.info(f"pretrain: {cfg.init_from} has no {head} head: it trains alone over the first "
                        f"{trainer.head_share:.0%} of the run, then with the encoder ({option('head_warmup_ratio')})")

    def finish(self, result: TrainResult) -> TrainResult:
        if self.dist.is_main:
            _plot(self.out)
        return result


def _plot(out: Path) -> None:
    try:
        logger.info(f"pretrain: curves in {plot_run(out)}")
    except ImportError as e:  # matplotlib missing: the metrics are still in metrics.jsonl
        logger.warning("no plot (%s); metrics are in %s", e, out / "metrics.jsonl")
