"""The feature-based approach (the paper's Table 7): a BiLSTM trained on a frozen encoder's features,
computed once; and the "+ BiLSTM" head on a fine-tuned encoder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from finetune_fixtures import base, root, write  # noqa: F401 - fixtures: a tiny "pre-trained" checkpoint, a folder
from test_tagging import config, ner_sentence, write_conll

from bertforge import cli
from bertforge.model.bert import BertModel
from bertforge.model.checkpoint import read_state_dict
from bertforge.model.heads import (BertFeatureBiLSTMForSequenceClassification, BertFeatureBiLSTMForTokenClassification,
                                   feature_layers)
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune, load_finetuned
from bertforge.tasks.tagging import encode_sentences, read_sentences


@pytest.fixture(scope="module")
def files(root) -> tuple[Path, Path]:
    rng = random.Random(3)
    train = write_conll(root / "train.conll", [ner_sentence(rng) for _ in range(64)])
    dev = write_conll(root / "dev.conll", [ner_sentence(rng) for _ in range(24)])
    return train, dev


class EncoderCalls:
    """Counts the sequences every `BertModel` forward pass runs over."""

    def __init__(self, monkeypatch):
        self.sequences = 0
        call = BertModel.__call__

        def counting(module, input_ids, *args, **kwargs):
            self.sequences += int(input_ids.shape[0])
            return call(module, input_ids, *args, **kwargs)

        monkeypatch.setattr(BertModel, "__call__", counting)


def features_run(base: Path, out: Path, train: Path, features: str, **overrides) -> FinetuneConfig:
    return config(base, out, train_file=str(train), features=features, bilstm_size=64, lr=1e-2, epochs=40,
                  batch_size=8, max_seq_length=16, checkpoint_every=1000, log_every=4, keep_best=False,
                  **overrides)


@pytest.mark.parametrize("features", ["last", "weighted-sum-all"])
def test_the_bilstm_learns_on_cached_features_of_a_frozen_encoder(root, base, files, monkeypatch, features):
    train, dev = files
    out = root / f"features-{features}"
    calls = EncoderCalls(monkeypatch)
    result = finetune(features_run(base, out, train, features))
    encoded = calls.sequences
    # one pass over the training windows, whatever the epochs: 40 epochs ran on the cache
    ft = load_finetuned(out / "model")
    sentences, _ = read_sentences(train)
    assert encoded == len(encode_sentences(sentences, ft.tokenizer, 16))
    assert result.train.step >= 40 * (encoded // 8)
    # the encoder's weights are the pre-trained ones; the head and BiLSTM are new
    before, after = read_state_dict(base), read_state_dict(out / "model")
    shared = [k for k in after if k.startswith("bert.") and k in before]
    assert shared and all(torch.equal(before[k], after[k]) for k in shared)
    assert isinstance(ft.model, BertFeatureBiLSTMForTokenClassification)
    assert json.loads((out / "model" / "config.json").read_text())["bertforge_features"] == {
        "features": features, "freeze": True, "bilstm_size": 64}
    if features == "weighted-sum-all":  # the softmax weights over the layers are learned
        assert after["mix.scalar_weights"].shape == (2,) and after["mix.scalar_weights"].abs().max() > 1e-3
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in lines if r["split"] == "train"]
    assert train_lines[-1]["loss"] < train_lines[0]["loss"] / 2
    # the saved model evaluates with its encoder (no cache): well above chance on held-out sentences
    assert evaluate(out / "model", file=dev)["f1"] >= 0.6


def test_feature_choices_resolve_to_the_papers_layers():
    assert feature_layers("embeddings", 12) == ([0], "concat")
    assert feature_layers("second-to-last", 12) == ([11], "concat")
    assert feature_layers("last", 12) == ([12], "concat")
    assert feature_layers("sum-last-4", 12) == ([12, 11, 10, 9], "sum")
    assert feature_layers("concat-last-4", 12) == ([12, 11, 10, 9], "concat")
    assert feature_layers("weighted-sum-all", 12) == (list(range(1, 13)), "weighted")
    assert feature_layers("0,-1", 12) == ([0, 12], "concat")


def test_bad_features_are_clear_errors(root, base, files):
    with pytest.raises(ValueError, match="features='penultimate': choose one of embeddings, second-to-last"):
        FinetuneConfig(task="ner", features="penultimate")
    with pytest.raises(ValueError, match="give one of them"):
        FinetuneConfig(task="ner", features="last", bilstm=True)
    with pytest.raises(ValueError, match="features='5': layer 5 does not exist: the model has 2 layers"):
        finetune(features_run(base, root / "bad-layer", files[0], "5"))
    with pytest.raises(ValueError, match="features applies to tagging and classification, not to squad"):
        FinetuneConfig(task="squad", features="last")


def test_cli_finetune_with_features_then_evaluate(root, base, files, capsys):
    train, dev = files
    out = root / "cli-features"
    assert cli.main(["finetune", "--task", "ner", "--model", str(base), "--train-file", str(train),
                     "--dev-file", str(dev), "--out", str(out), "--features", "0,-1", "--bilstm-size", "8",
                     "--max-steps", "3", "--batch-size", "8", "--max-seq-length", "16", "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["evaluate", str(out / "best"), "--file", str(dev)]) == 0
    assert {"f1", "accuracy"} <= set(json.loads(capsys.readouterr().out))
    assert cli.main(["predict", str(out / "best"), str(dev), "--out", str(root / "cli-features.conll")]) == 0
    blocks = [b for b in (root / "cli-features.conll").read_text().split("\n\n") if b]
    assert len(blocks) == 24  # one block of predicted tags per dev sentence
    assert cli.main(["finetune", "--task", "ner", "--model", str(base), "--train-file", str(train),
                     "--out", str(root / "cli-bad"), "--features", "top", "--no-keep-best"]) == 2
    assert "--features top: choose one of" in capsys.readouterr().err


def test_classification_on_cached_features(root, base, monkeypatch):
    from test_finetune import polar, write_csv

    rng = random.Random(1)
    train = write_csv(root / "polar-train.csv", [polar(rng) for _ in range(64)])
    dev = write_csv(root / "polar-dev.csv", [polar(rng) for _ in range(32)])
    out = root / "polar-features"
    calls = EncoderCalls(monkeypatch)
    finetune(FinetuneConfig(task="classification", model=str(base), out=str(out), train_file=str(train),
                            text_column="review", label_column="sentiment", features="weighted-sum-all",
                            bilstm_size=32, lr=1e-2, epochs=30, batch_size=8, weight_decay=0.0, progress=False,
                            seed=7, keep_best=False, checkpoint_every=1000))
    assert calls.sequences == 64  # the training texts, once (one window each)
    ft = load_finetuned(out / "model")
    assert isinstance(ft.model, BertFeatureBiLSTMForSequenceClassification)
    assert evaluate(out / "model", file=train)["accuracy"] >= 0.95
    assert evaluate(out / "model", file=dev)["accuracy"] >= 0.75


def test_bilstm_on_a_fine_tuned_encoder(root, base, files):
    train, dev = files
    out = root / "bilstm"
    finetune(config(base, out, train_file=str(train), bilstm=True, bilstm_size=16, lr=3e-3, epochs=2,
                    batch_size=8, max_seq_length=16, checkpoint_every=1000, keep_best=False))
    before, after = read_state_dict(base), read_state_dict(out / "model")
    shared = [k for k in after if k.startswith("bert.encoder.") and k in before]
    assert shared and not all(torch.equal(before[k], after[k]) for k in shared)  # the encoder trained
    assert json.loads((out / "model" / "config.json").read_text())["bertforge_features"] == {
        "features": "last", "freeze": False, "bilstm_size": 16}
    assert "lstm.weight_ih_l1" in after
    assert {"f1", "accuracy"} <= set(evaluate(out / "model", file=dev))
