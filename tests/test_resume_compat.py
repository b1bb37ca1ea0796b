"""Continuing what an earlier version left, and refusing clearly what cannot be continued: a pre-training
run resumed with another objective is refused in one short line naming the objectives; runs recorded
before the warmup settings could be left unset resume when their warmup is the same, and otherwise say
which flag to pass; a data folder prepared before the tokenizer's normalisation was recorded is added to
when its shards are what the tokenizer makes, and refused with what to do when not; the demo refuses a
time budget that is not a finite number above 0 before it does anything."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from torch import nn

from data_fixtures import documents, write_google
from pretrain_fixtures import LENGTH, N_DOCS, SHARD_CHARS, config
from pretrain_fixtures import no_plots, nsp_data, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge import cli
from bertforge.data.loader import PretrainingDataset
from bertforge.data.prepare import PrepareConfig, prepare
from bertforge.text.tokenizer import BertTokenizer
from bertforge.train.config import TrainConfig
from bertforge.train.loop import Trainer
from bertforge.train.state import check_compatible
from bertforge.train.rundir import latest_checkpoint
from bertforge.train.pretrain import pretrain


def _refusal(cfg) -> str:
    with pytest.raises(ValueError) as e:
        pretrain(cfg)
    return str(e.value)


# ------------------------------------------------------------------------------ the objective


def test_a_changed_objective_is_named_with_both_objectives_in_one_short_line(root, tok, nsp_data):
    out = root / "objective-mlm"
    pretrain(config(nsp_data, tok, out, max_steps=1, objective="mlm"))
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2, objective="mlm+nsp"))
    assert "objective: 'mlm' -> 'mlm+nsp'" in message and "None" not in message
    # auto resolves to the data's own objective, mlm+nsp on NSP data
    assert "objective: 'mlm' -> 'mlm+nsp'" in _refusal(config(nsp_data, tok, out, resume=True, max_steps=2))
    # to and from ltr: the objective first, and of the model's config only the field it implies
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2, objective="ltr"))
    assert "differ (objective: 'mlm' -> 'ltr'; model_config.is_decoder: False -> True)" in message
    assert len(message) < 300 and "hidden_size" not in message and "\n" not in message

    out = root / "objective-ltr"
    pretrain(config(nsp_data, tok, out, max_steps=1, objective="ltr"))
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2))
    assert "differ (objective: 'ltr' -> 'mlm+nsp'; model_config.is_decoder: True -> False)" in message
    assert len(message) < 300 and "hidden_size" not in message
    assert pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, objective="ltr")).step == 2


def test_a_changed_model_config_names_only_the_fields_that_differ(root, tok, nsp_data, tmp_path):
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                 "intermediate_size": 64, "vocab_size": 2}))
    out = root / "model-config"
    pretrain(config(nsp_data, tok, out, max_steps=1, model=str(small)))
    small.write_text(json.dumps({**json.loads(small.read_text()), "intermediate_size": 128}))
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2, model=str(small)))
    assert "differ (model_config.intermediate_size: 64 -> 128)" in message and "hidden_size" not in message


# ------------------------------------------------------------------------------ runs of earlier versions


def _as_recorded_before_unset_warmup(out: Path, warmup_steps: int, warmup_ratio: float) -> None:
    """Rewrite a run's recorded settings as versions before "not given" warmup settings wrote them: both
    warmup settings always recorded (0.0: no ratio), no warmup_steps_used, nor settings added since."""
    checkpoint = latest_checkpoint(out)
    for path in (checkpoint / "trainer_state.json", out / "run_config.json"):
        record = json.loads(path.read_text())
        settings = record["run_config"] if "run_config" in record else record
        for later in ("warmup_steps_used", "budget_minutes", "recipe", "masked_lm_prob"):
            del settings[later]
        settings.update(warmup_steps=warmup_steps, warmup_ratio=warmup_ratio)
        path.write_text(json.dumps(record, indent=1) + "\n")


def test_a_run_recorded_with_the_earlier_warmup_defaults_resumes(root, tok, nsp_data):
    out = root / "earlier-default-warmup"
    pretrain(config(nsp_data, tok, out, max_steps=1, warmup_steps=None))  # the default warmup
    _as_recorded_before_unset_warmup(out, 10_000, 0.0)
    assert pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, warmup_steps=None)).step == 2
    # the checkpoints from here on record the settings as today's version does (the default warmup of a
    # run shorter than the paper's 10,000 warmup steps: its 1% share, 0 steps of 2)
    recorded = json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())["run_config"]
    assert (recorded["warmup_steps"], recorded["warmup_ratio"], recorded["warmup_steps_used"]) == (None, None, 0)
    # Another warmup now is a change, and the message says what to pass.
    _as_recorded_before_unset_warmup(out, 10_000, 0.0)
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=3, warmup_steps=2))
    assert "warmup_steps: 10000 -> 2" in message and "pass warmup_steps=10000 to resume this run" in message


def _as_recorded_before_shard_windows(out: Path) -> None:
    """Rewrite a run's records as versions that read shards one by one wrote them: no shuffle_shards."""
    def drop(record):
        if isinstance(record, dict):
            record.pop("shuffle_shards", None)
            for v in record.values():
                drop(v)
    for path in (latest_checkpoint(out) / "trainer_state.json", out / "run_config.json"):
        record = json.loads(path.read_text())
        drop(record)
        path.write_text(json.dumps(record, indent=1) + "\n")


def test_a_run_recorded_before_shard_windows_resumes_shard_by_shard_only(root, tok, nsp_data):
    out = root / "earlier-shard-order"
    pretrain(config(nsp_data, tok, out, max_steps=1, shuffle_shards=1))
    _as_recorded_before_shard_windows(out)
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2))  # today's default: 8
    assert "shuffle_shards: 1 -> 8" in message
    assert pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, shuffle_shards=1)).step == 2


def test_a_run_recorded_with_an_earlier_given_warmup_says_which_flag_resumes_it(root, tok, nsp_data):
    out = root / "earlier-given-warmup"
    pretrain(config(nsp_data, tok, out, max_steps=1, warmup_steps=1))
    _as_recorded_before_unset_warmup(out, 1, 0.0)
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2, warmup_steps=None))
    assert "(warmup_steps: 1 -> None); pass warmup_steps=1 to resume this run, or use a new output folder" \
        in message
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2, warmup_steps=None, warmup_ratio=0.5))
    assert "pass warmup_steps=1 instead of warmup_ratio to resume this run" in message
    assert pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, warmup_steps=1)).step == 2

    out = root / "earlier-given-ratio"
    pretrain(config(nsp_data, tok, out, max_steps=1, warmup_steps=None, warmup_ratio=0.5))
    _as_recorded_before_unset_warmup(out, 10_000, 0.5)  # the ratio won over the steps when above 0
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2, warmup_steps=None))
    assert "pass warmup_ratio=0.5 to resume this run" in message
    assert pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, warmup_steps=None,
                           warmup_ratio=0.5)).step == 2


def test_a_warmup_setting_given_differently_says_which_flag_resumes_the_run(root, tok, nsp_data):
    out = root / "given-warmup"
    pretrain(config(nsp_data, tok, out, max_steps=1, warmup_steps=1))
    message = _refusal(config(nsp_data, tok, out, resume=True, max_steps=2, warmup_steps=None, lr=2e-3))
    assert "(lr: 0.001 -> 0.002; warmup_steps: 1 -> None); pass warmup_steps=1 and the other settings as " \
           "they were to resume this run, or use a new output folder" in message


@dataclasses.dataclass
class _TenPercentWarmup(TrainConfig):
    """A recipe that warms up over a tenth of the steps unless told otherwise, as fine-tuning does."""

    DEFAULT_WARMUP_RATIO = 0.1


def test_an_earlier_record_of_a_ratio_default_recipe_resumes_on_its_default(tmp_path):
    cfg = _TenPercentWarmup(device="cpu", batch_size=1, max_steps=10, progress=False)
    trainer = Trainer(nn.Linear(2, 2), None, None, cfg, tmp_path)
    earlier = {**trainer.run_config, "warmup_steps": 10_000, "warmup_ratio": 0.1}  # its default then
    check_compatible(earlier, trainer.run_config, trainer.resume_rules, tmp_path)
    with pytest.raises(ValueError, match=r"pass warmup_ratio=0.2 to resume this run"):
        check_compatible({**earlier, "warmup_ratio": 0.2}, trainer.run_config, trainer.resume_rules, tmp_path)


# ------------------------------------------------------------------------------ data of earlier versions


def _fingerprint_before_normalization(settings: dict) -> str:
    """The fingerprint versions before the tokenizer's normalisation was recorded wrote."""
    blob = json.dumps({**settings["config"], "vocab_hash": settings["vocab_hash"], "inputs": settings["input_files"]},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@pytest.fixture
def earlier_half(tok, tmp_path) -> tuple[Path, Path, PrepareConfig]:
    """Half the shards of a folder (the other half to be made on another machine), rewritten as versions
    before the tokenizer's normalisation was recorded left them: no "normalization" in settings.json or
    manifest.json, and the fingerprint without it in both and in every shard's sidecar."""
    corpus = tmp_path / "corpus.txt"
    write_google(corpus, documents(1, N_DOCS, 3, 6))
    cfg = PrepareConfig(max_seq_length=LENGTH, max_predictions_per_seq=5, dupe_factor=1, shard_chars=SHARD_CHARS)
    out = tmp_path / "data"
    prepare([corpus], out, tok, cfg, num_shards=2, shard_index=0, progress=False)
    settings = json.loads((out / "settings.json").read_text())
    earlier = _fingerprint_before_normalization(settings)
    for path in [out / "settings.json", out / "manifest.json", *out.glob("shard-*.json")]:
        record = json.loads(path.read_text())
        record.pop("normalization", None)
        record["fingerprint"] = earlier
        for entry in record.get("shards", ()):
            entry["fingerprint"] = earlier
        path.write_text(json.dumps(record, indent=1) + "\n")
    return corpus, out, cfg


def test_data_prepared_before_normalisation_was_recorded_is_added_to(earlier_half, tok, caplog):
    corpus, out, cfg = earlier_half
    made = {p.name: p.read_bytes() for p in out.glob("shard-*")}
    assert sorted(made) == ["shard-00000.json", "shard-00000.safetensors", "shard-00002.json",
                            "shard-00002.safetensors"]
    with caplog.at_level("INFO", logger="bertforge"):
        manifest = prepare([corpus], out, tok, cfg, num_shards=2, shard_index=1, progress=False)
    assert manifest["complete"] and [e["index"] for e in manifest["shards"]] == [0, 1, 2]
    normalization = BertTokenizer.from_pretrained(tok).normalization
    assert manifest["normalization"] == normalization
    assert json.loads((out / "settings.json").read_text())["normalization"] == normalization
    assert {name: (out / name).read_bytes() for name in made} == made  # the earlier shards kept as they were
    assert "prepared before the tokenizer's normalization was recorded" in caplog.text
    # The folder now records the normalisation: pre-training checks it, and prepare runs again on it.
    dataset = PretrainingDataset(out, normalization=normalization)
    dataset.check_files()
    assert prepare([corpus], out, tok, cfg, progress=False)["shards"] == manifest["shards"]


def test_data_prepared_before_normalisation_was_recorded_with_another_one_is_refused_saying_what_to_do(
        earlier_half, tok, tmp_path):
    corpus, out, cfg = earlier_half
    cased = tmp_path / "cased-tok"  # the same vocab.txt (and vocab hash), read cased
    BertTokenizer.from_pretrained(tok, do_lower_case=False).save_pretrained(cased)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError) as e:
        prepare([corpus], out, cased, cfg, num_shards=2, shard_index=1, progress=False)
    message = str(e.value)
    assert "did not record the tokenizer's normalization" in message and "do_lower_case=False" in message
    assert "pass the tokenizer the data was prepared with" in message and "new output folder" in message
    assert "\n" not in message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # through the command line: exit 2 and the one line
    assert cli.main(["prepare", str(corpus), "--out", str(out), "--tokenizer", str(cased),
                     "--max-seq-length", str(LENGTH), "--max-predictions-per-seq", "5", "--dupe-factor", "1",
                     "--shard-chars", str(SHARD_CHARS), "--num-shards", "2", "--shard-index", "1"]) == 2


# ------------------------------------------------------------------------------ the demo's settings


@pytest.mark.parametrize("flag, value, expected", [
    ("--minutes", "nan", "minutes must be a finite number in [0.05, 52560000], got nan"),
    ("--minutes", "inf", "minutes must be a finite number in [0.05, 52560000], got inf"),
    ("--minutes", "-inf", "minutes must be a finite number in [0.05, 52560000], got -inf"),
    ("--minutes", "1e-9", "minutes must be a finite number in [0.05, 52560000], got 1e-09"),
    ("--finetune-epochs", "nan", "finetune_epochs must be a finite number in (0, 1000], got nan"),
    ("--finetune-epochs", "inf", "finetune_epochs must be a finite number in (0, 1000], got inf"),
    ("--finetune-dropout", "nan", "finetune_dropout must be a finite number in [0, 1), got nan"),
    ("--curve-seeds", "1000000", "curve_seeds must be in [1, 100], got 1000000"),
])
def test_the_demo_refuses_a_setting_that_is_not_a_finite_number_in_range_before_any_work(
        flag, value, expected, tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr("bertforge.demo.run.run_demo", started.append)
    out = tmp_path / "demo"
    assert cli.main(["demo", flag, value, "--out", str(out)]) == 2
    assert not started and not out.exists()
    err = capsys.readouterr().err
    assert err == f"bertforge demo: error: {expected}\n"
