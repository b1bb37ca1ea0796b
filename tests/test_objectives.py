"""Pre-training objectives on the same prepared data (the paper's Table 5 ablations): mlm+nsp (BERT),
mlm (No NSP) and ltr (LTR & No NSP), and the causal encoder ltr trains."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers

from data_fixtures import VOCAB_SIZE
from finetune_fixtures import FILLER
from pretrain_fixtures import config, lines, make_data, nsp_data, one_thread, no_plots, root, tok  # noqa: F401

from bertforge.data.loader import PretrainingDataset, PretrainingLoader
from bertforge.data.prepare import special_ids
from bertforge.fast import is_sped_up, speed_up
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForMaskedLM, BertForSequenceClassification
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune
from bertforge.text.tokenizer import BertTokenizer
from bertforge.train.pretrain import PretrainingObjective, original_tokens, pretrain


def causal_config(**overrides) -> BertConfig:
    return BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, is_decoder=True, **overrides)


def padded_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB_SIZE, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    return ids, mask


# ------------------------------------------------------------------------------ the causal encoder
@pytest.mark.parametrize("prepared", [False, True])
def test_with_a_causal_mask_a_tokens_output_does_not_change_when_later_tokens_do(prepared):
    torch.manual_seed(0)
    model = BertModel(causal_config()).eval()
    if prepared:
        speed_up(model)
        assert is_sped_up(model)  # the unpadded encoder, with the causal mask
    ids, mask = padded_batch()
    later = ids.clone()
    later[:, 4:] = torch.randint(5, VOCAB_SIZE, (3, 8))
    with torch.no_grad():
        before, after = model(ids, mask).last_hidden_state, model(later, mask).last_hidden_state
    torch.testing.assert_close(before[:, :4], after[:, :4], rtol=0, atol=0)
    assert (before[:, 4] - after[:, 4]).abs().amax() > 1e-3  # position 4 itself changed
    bidirectional = BertModel(causal_config().replace(is_decoder=False)).eval()
    bidirectional.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (bidirectional(ids, mask).last_hidden_state[:, :4]
                - bidirectional(later, mask).last_hidden_state[:, :4]).abs().amax() > 1e-3


@pytest.mark.parametrize("prepared", [False, True])
def test_a_causal_sentence_head_reads_the_last_real_token_wherever_the_padding_is(prepared):
    torch.manual_seed(0)
    model = BertForSequenceClassification(causal_config(num_labels=2)).eval()
    if prepared:
        speed_up(model)
    ids, _ = padded_batch()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: the last real token is the last position
    mask[1, 2:4] = 0  # a hole
    mask[1, 9:] = 0  # then right padding: the last real token is position 8
    mask[2, 7:] = 0
    with torch.no_grad():
        pooled = model.bert(ids, mask, output_positions=torch.tensor([[11], [8], [6]])).pooler_output
        torch.testing.assert_close(model(ids, mask).logits, model.classifier(pooled))


def test_a_causal_model_equals_transformers_bert_with_is_decoder(tmp_path):
    torch.manual_seed(1)
    ours = BertModel(causal_config()).eval()
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["is_decoder"] is True
    theirs = transformers.BertModel.from_pretrained(tmp_path).eval()
    assert theirs.config.is_decoder and BertModel.from_pretrained(tmp_path).config.is_decoder
    ids, mask = padded_batch(2)
    with torch.no_grad():
        a = ours(ids, mask, output_hidden_states=True).hidden_states
        b = theirs(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y * mask[..., None], atol=1e-5, rtol=1e-5)
        full = torch.ones_like(ids)  # no mask given: causal all the same
        torch.testing.assert_close(ours(ids).last_hidden_state, theirs(ids, attention_mask=full).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)



def test_a_causal_classifier_pools_the_last_real_token():
    """[CLS] of a causal encoder sees only itself; the classifier reads the final token, which saw it all."""
    torch.manual_seed(3)
    model = BertForSequenceClassification(causal_config()).eval()
    ids, mask = padded_batch(3)
    other = ids.clone()
    other[0, 11], other[1, 7], other[2, 4] = 1, 1, 1  # each sequence's last real token
    with torch.no_grad():
        a, b = model(ids, mask).logits, model(other, mask).logits
        assert ((a - b).abs().amax(-1) > 1e-4).all()
        padded_away = ids.clone()
        padded_away[1, 8:] = 2  # padding's content changes nothing
        torch.testing.assert_close(model(padded_away, mask).logits, a)


# ------------------------------------------------------------------------------ objectives
def test_mlm_on_nsp_data_trains_without_nsp_on_the_same_batches(root, tok, nsp_data, monkeypatch):
    seen: dict[str, list[torch.Tensor]] = {}
    forward = PretrainingObjective.forward

    def recording(self, model, batch):
        seen.setdefault(current, []).append(batch["input_ids"].clone())
        return forward(self, model, batch)

    monkeypatch.setattr(PretrainingObjective, "forward", recording)
    for current in ("mlm+nsp", "mlm"):
        pretrain(config(nsp_data, tok, root / f"objective-{current}", objective=current, max_steps=30, lr=3e-3,
                        warmup_steps=3))
    assert len(seen["mlm"]) == 30 and all(torch.equal(a, b) for a, b in zip(seen["mlm+nsp"], seen["mlm"]))
    both, mlm = lines(root / "objective-mlm+nsp"), lines(root / "objective-mlm")
    assert "nsp_loss" in both[-1] and "nsp_accuracy" in both[-1]
    assert "nsp_loss" not in mlm[-1] and "nsp_accuracy" not in mlm[-1]
    assert mlm[-1]["loss"] < 0.5 * mlm[0]["loss"]
    folder = root / "objective-mlm" / "model"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert not BertForMaskedLM.from_pretrained(folder).config.is_decoder


def test_the_objective_is_part_of_the_runs_identity(root, tok, nsp_data):
    out = root / "objective-resume"
    pretrain(config(nsp_data, tok, out, max_steps=1))  # auto: mlm+nsp on NSP data
    recorded = json.loads((out / "run_config.json").read_text())
    assert "objective" not in recorded and "is_decoder" not in recorded["model_config"]  # as runs without the options
    with pytest.raises(ValueError, match=r"settings differ \(objective: 'mlm\+nsp' -> 'mlm'\)"):
        pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, objective="mlm"))
    with pytest.raises(ValueError, match=r"objective: 'mlm\+nsp' -> 'ltr'"):
        pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, objective="ltr"))
    assert pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, objective="mlm+nsp")).step == 2


def test_mlm_plus_nsp_needs_nsp_data_and_unknown_objectives_are_refused(root, tok):
    data = make_data(root, tok, "objective-no-nsp", nsp=False)
    with pytest.raises(ValueError, match="mlm\\+nsp needs data prepared with next sentence prediction"):
        pretrain(config(data, tok, root / "refused", objective="mlm+nsp", max_steps=1))
    with pytest.raises(ValueError, match="objective must be one of"):
        config(data, tok, root / "refused", objective="nsp")


def test_original_tokens_undo_the_masks(root, tok):
    data = make_data(root, tok, "objective-dynamic", dynamic_masking=True)
    dataset, special = PretrainingDataset(data), special_ids(BertTokenizer.from_pretrained(tok))
    masked = next(iter(PretrainingLoader(dataset, 8, seed=0, special=special)))
    unmasked = PretrainingLoader(dataset, 8, seed=0, special=special)
    unmasked.masking = None  # the instances as stored
    plain = next(iter(unmasked))
    assert not torch.equal(masked["input_ids"], plain["input_ids"])
    assert torch.equal(original_tokens(masked), plain["input_ids"])


@pytest.fixture(scope="module")
def ltr_run(root, tok, nsp_data):
    out = root / "objective-ltr"
    result = pretrain(config(nsp_data, tok, out, objective="ltr", max_steps=40, lr=3e-3, warmup_steps=3,
                             eval_shards=1, eval_every=40))
    return out, result


def test_the_ltr_loss_falls_on_a_tiny_corpus(ltr_run):
    out, result = ltr_run
    train = lines(out)
    assert {"ltr_accuracy", "ltr_perplexity"} <= set(train[-1]) and "mlm_accuracy" not in train[-1]
    assert "nsp_loss" not in train[-1]
    assert sum(r["loss"] for r in train[-5:]) < 0.5 * sum(r["loss"] for r in train[:5])
    assert train[-1]["ltr_accuracy"] > 0.5
    assert {"ltr_loss", "ltr_accuracy"} <= set(result.eval_metrics) and "mlm_loss" not in result.eval_metrics
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["is_decoder"] is True and saved["architectures"] == ["BertForMaskedLM"]
    assert json.loads((out / "run_config.json").read_text())["objective"] == "ltr"


def test_an_ltr_checkpoint_fine_tunes_and_evaluates_as_a_left_to_right_model(ltr_run, root):
    out, _ = ltr_run
    rng = random.Random(0)

    def rows(n):
        label = [rng.choice(["pos", "neg"]) for _ in range(n)]
        return [(" ".join(rng.choice(FILLER) for _ in range(4)) + (" good" if y == "pos" else " bad"), y)
                for y in label]

    train, dev = root / "ltr-train.csv", root / "ltr-dev.csv"
    for path, n in ((train, 32), (dev, 16)):
        path.write_text("review,sentiment\n" + "".join(f"{t},{y}\n" for t, y in rows(n)), encoding="utf-8")
    tuned = root / "ltr-finetuned"
    finetune(FinetuneConfig(model=str(out / "model"), out=str(tuned), task="classification", train_file=str(train),
                            dev_file=str(dev), text_column="review", label_column="sentiment", epochs=15,
                            batch_size=16, lr=1e-3, log_every=1, progress=False, seed=7))
    assert json.loads((tuned / "best" / "config.json").read_text())["is_decoder"] is True
    metrics = evaluate(tuned / "best", file=dev)
    assert metrics["accuracy"] >= 0.9, metrics  # the word deciding the label is read: pooled at the last token
