"""SQuAD with a BiLSTM between the fine-tuned encoder and the span output layer (the paper's Table 5
row "LTR & No NSP + BiLSTM"): the head reads the BiLSTM's per-token outputs; a tiny model trains
with ``--bilstm``, its folder names the BiLSTM class and reloads through ``evaluate`` / ``predict``
with the same answers; ``--features`` (a frozen encoder's cached features) stays refused for SQuAD,
and both stay refused for multiple choice."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from finetune_fixtures import base, root  # noqa: F401 - fixtures: a tiny "pre-trained" checkpoint, a folder
from test_squad import config, generated, write_json

from bertforge import cli
from bertforge.model.checkpoint import read_state_dict
from bertforge.model.config import BertConfig
from bertforge.model.heads import (FEATURE_KEY, FEATURE_MODEL_CLASSES, MODEL_CLASSES,
                                   BertFeatureBiLSTMForQuestionAnswering, BertFeatureBiLSTMForSequenceClassification,
                                   BertFeatureBiLSTMForTokenClassification, BertForQuestionAnswering)
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune, load_finetuned, predict


def tiny_config(features: str = "last", freeze: bool = False, size: int = 6, **overrides) -> BertConfig:
    return BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      extra={FEATURE_KEY: {"features": features, "freeze": freeze, "bilstm_size": size}}, **overrides)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "left-to-right"])
def test_the_span_head_reads_the_bilstm_outputs(causal):
    torch.manual_seed(0)
    model = BertFeatureBiLSTMForQuestionAnswering(tiny_config(is_decoder=causal)).eval()
    assert isinstance(model, BertForQuestionAnswering)
    assert (model.qa_outputs.in_features, model.qa_outputs.out_features) == (12, 2)  # Linear(2S, 2)
    assert model.lstm.input_size == 16 and model.lstm.hidden_size == 6 and model.lstm.bidirectional
    assert not hasattr(model, "classifier")
    ids = torch.randint(5, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0  # the second row has 6 real tokens
    with torch.no_grad():
        out = model(ids, mask)
        alone = model(ids[1:, :6], mask[1:, :6])
        cached = model(ids, mask, features=model.encode_features(ids, mask))
    assert out.start_logits.shape == out.end_logits.shape == (2, 9)
    # padding changes nothing at the real tokens: the BiLSTM runs over each row's real length
    torch.testing.assert_close(out.start_logits[1, :6], alone.start_logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.end_logits[1, :6], alone.end_logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.start_logits, out.start_logits)
    starts, ends = torch.tensor([2, 0]), torch.tensor([4, 0])
    loss = model(ids, mask, start_positions=starts, end_positions=ends).loss
    assert loss is not None and loss.ndim == 0 and torch.isfinite(loss)


def test_every_bilstm_head_rebuilds_its_own_output_layer():
    config = tiny_config(num_labels=3)
    assert BertFeatureBiLSTMForQuestionAnswering._fresh_head_prefixes == ("qa_outputs.", "mix.", "lstm.")
    for cls, layer, outputs in ((BertFeatureBiLSTMForTokenClassification, "classifier", 3),
                                (BertFeatureBiLSTMForSequenceClassification, "classifier", 3),
                                (BertFeatureBiLSTMForQuestionAnswering, "qa_outputs", 2)):
        model = cls(config)
        assert model.output_layer == layer and cls.__name__ in MODEL_CLASSES
        linear = getattr(model, layer)
        assert (linear.in_features, linear.out_features) == (12, outputs)
        assert model.lstm.dropout == 0.0  # the head's dropout (hidden_dropout_prob 0 here) between the layers
    assert FEATURE_MODEL_CLASSES[BertForQuestionAnswering] is BertFeatureBiLSTMForQuestionAnswering


def test_squad_takes_bilstm_and_features_stays_refused_where_it_was():
    assert FinetuneConfig(task="squad", bilstm=True).bilstm
    assert FinetuneConfig(task="squad2", bilstm=True, bilstm_size=8).bilstm_size == 8
    with pytest.raises(ValueError, match=r"features applies to tagging and classification, not to squad "
                                         r"\(squad2\); bilstm=True puts the BiLSTM on a fine-tuned encoder"):
        FinetuneConfig(task="squad2", features="last")
    for task in ("swag", "multiple_choice"):
        with pytest.raises(ValueError, match=rf"bilstm=True applies to tagging, classification and SQuAD, not to "
                                             rf"multiple_choice \({task}\)"):
            FinetuneConfig(task=task, bilstm=True)
        with pytest.raises(ValueError, match=rf"features applies to tagging and classification, not to "
                                             rf"multiple_choice \({task}\)$"):
            FinetuneConfig(task=task, features="last")


def train_lines(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]


@pytest.fixture(scope="module")
def learned(root, base) -> tuple[Path, Path]:
    """SQuAD 1.1 with ``bilstm``: 64 generated questions (dev = train); (run folder, training file)."""
    train = write_json(root / "train-squad.json", generated(random.Random(1), 64, v2=False))
    out = root / "squad-bilstm"
    finetune(config(base, out, task="squad", train_file=str(train), dev_file=str(train), bilstm=True,
                    bilstm_size=16, epochs=8))
    return out, train


def test_squad_with_a_bilstm_trains_saves_and_reloads(learned, base, tmp_path):
    out, train = learned
    lines = train_lines(out)
    assert np.mean([r["loss"] for r in lines[-5:]]) < 0.6 * lines[0]["loss"]
    for folder in (out / "model", out / "best"):
        saved = json.loads((folder / "config.json").read_text())
        assert saved["architectures"] == ["BertFeatureBiLSTMForQuestionAnswering"]
        assert saved["bertforge_features"] == {"features": "last", "freeze": False, "bilstm_size": 16}
        assert saved["finetuning_task"] == "squad"
    before, after = read_state_dict(base), read_state_dict(out / "model")
    assert after["qa_outputs.weight"].shape == (2, 32) and "lstm.weight_ih_l1_reverse" in after
    shared = [k for k in after if k.startswith("bert.encoder.") and k in before]
    assert shared and not all(torch.equal(before[k], after[k]) for k in shared)  # the encoder fine-tuned

    ft = load_finetuned(out / "best")
    assert type(ft.model) is BertFeatureBiLSTMForQuestionAnswering and ft.family.name == "squad"
    best = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert best["metrics"]["f1"] > 50  # well above what an untrained span head finds
    assert evaluate(out / "best", file=train, out=tmp_path / "ev") == pytest.approx(best["metrics"])
    for name in ("predictions.json", "nbest_predictions.json"):  # the same answers as in training's evaluation
        assert (tmp_path / "ev" / name).read_text() == (out / "best" / name).read_text()
    records = predict(out / "best", train)
    assert {r["id"]: r["answer"] for r in records} == json.loads((out / "best" / "predictions.json").read_text())


def test_cli_finetune_squad2_with_bilstm_then_evaluate(root, base, capsys, tmp_path):
    train = write_json(root / "cli-train.json", generated(random.Random(3), 32, v2=True))
    out = root / "cli-bilstm"
    assert cli.main(["finetune", "--task", "squad2", "--model", str(base), "--train-file", str(train), "--dev-file",
                     str(train), "--out", str(out), "--bilstm", "--bilstm-size", "8", "--max-steps", "3",
                     "--batch-size", "8", "--max-seq-length", "32", "--stride", "8", "--max-query-length", "8",
                     "--no-progress"]) == 0
    capsys.readouterr()
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == [
        "BertFeatureBiLSTMForQuestionAnswering"]
    assert cli.main(["evaluate", str(out / "model"), "--file", str(train), "--out", str(tmp_path / "ev")]) == 0
    assert {"f1", "best_f1_thresh", "NoAns_total"} <= set(json.loads(capsys.readouterr().out))
    assert sorted(p.name for p in (tmp_path / "ev").iterdir()) == ["nbest_predictions.json", "null_odds.json",
                                                                    "predictions.json"]
    assert cli.main(["predict", str(out / "model"), str(train), "--out", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads(
        (tmp_path / "ev" / "predictions.json").read_text())
    assert cli.main(["finetune", "--task", "squad", "--model", str(base), "--train-file", str(train),
                     "--out", str(root / "cli-bad"), "--features", "last", "--no-keep-best"]) == 2
    assert "--features applies to tagging and classification, not to squad" in capsys.readouterr().err


def test_table5_pre_flight_takes_the_bilstm_row_on_squad(tmp_path, monkeypatch):
    """The bundled Table 5 study checks every cell, "+ BiLSTM" x SQuAD included, before it needs the data."""
    from bertforge.experiments.runner import AblateConfig, check_study
    from bertforge.experiments.study import load_study

    study = load_study("table5")
    assert any(v.finetune.get("bilstm") and t.settings["task"] == "squad" for v, t in study.cells())
    monkeypatch.chdir(tmp_path)
    for path in [study.pretraining.corpus, *(t.settings[k] for t in study.tasks for k in ("train_file", "dev_file"))]:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).touch()  # the files' rows are read later, once the vocab is ready
    check_study(study, AblateConfig(out=str(tmp_path / "out"), precision="fp32", device="cpu"))
