"""Real weights: the pinned all-MiniLM-L6-v2 checkpoint, against transformers and known similarities."""

from __future__ import annotations

import pytest
import torch
import transformers

from bertforge import BertForSequenceClassification, BertModel

pytestmark = pytest.mark.real_data

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "Hi!",
    "The quick brown fox jumps over the lazy dog, while the farmer's cat watches from the barn roof.",
    "Transformers use self-attention.",
    "BERT was pre-trained on BooksCorpus and English Wikipedia with masked language modelling and "
    "next sentence prediction, then fine-tuned on GLUE, SQuAD and SWAG.",
    "Naïve café owners résumé their crème brûlée.",
    "Is it raining?",
    "A woman is playing the violin on a busy street corner.",
    "Two dogs run through a field of tall grass.",
    "Stocks fell sharply after the announcement.",
    "1, 2, 3 ... 42 — numbers & symbols!",
    "He said: \"I'll be back\".",
    "Paris is the capital of France.",
    "unaffable",
]


@pytest.fixture(scope="module")
def tokenized(minilm):
    # transformers' tokenizer on the folder's vocab.txt (independent of bertforge's own tokenizer)
    tokenizer = transformers.BertTokenizer(vocab=str(minilm / "vocab.txt"), do_lower_case=True)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    # guard against a silently wrong vocabulary: Google's uncased ids
    assert batch["input_ids"][0, :8].tolist() == [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() <= 5 and lengths.max() >= 30  # mixed lengths: real padding in the batch
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def models(minilm):
    ours = BertModel.from_pretrained(minilm).eval()
    theirs = transformers.BertModel.from_pretrained(minilm).eval()
    return ours, theirs


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


def test_loads_cleanly(models):
    ours, _ = models
    assert ours.config.hidden_size == 384 and ours.config.num_hidden_layers == 6
    report = ours.load_report
    assert report.newly_initialized == [] and report.ignored == [] and report.reinitialized_mismatched == []


def test_hidden_states_match_transformers(models, tokenized):
    ours, theirs = models
    with torch.no_grad():
        a = ours(**tokenized)
        b = theirs(**tokenized)
    real = tokenized["attention_mask"].bool()
    diff = (a.last_hidden_state - b.last_hidden_state)[real].abs().max().item()
    assert diff <= 1e-5, f"last_hidden_state max abs diff {diff:.3g}"
    assert (a.pooler_output - b.pooler_output).abs().max().item() <= 1e-5


def test_sentence_similarities(models, tokenized):
    ours, _ = models
    with torch.no_grad():
        hidden = ours(**tokenized).last_hidden_state
    emb = _mean_pool(hidden, tokenized["attention_mask"])
    cos = torch.nn.functional.cosine_similarity
    food_bread = cos(emb[0], emb[1], dim=0).item()
    food_movie = cos(emb[0], emb[2], dim=0).item()
    assert food_bread == pytest.approx(0.755, abs=0.01)
    assert abs(food_movie) < 0.15
    # the same figures from the sentences encoded alone: padding does not move them
    alone = []
    for i in (0, 1):
        n = int(tokenized["attention_mask"][i].sum())
        one = {k: v[i:i + 1, :n] for k, v in tokenized.items()}
        with torch.no_grad():
            alone.append(ours(**one).last_hidden_state.mean(1)[0])
    assert cos(alone[0], alone[1], dim=0).item() == pytest.approx(food_bread, abs=1e-5)


def test_sequence_classification_from_real_encoder(minilm, tokenized, tmp_path):
    model = BertForSequenceClassification.from_pretrained(minilm, num_labels=3).eval()
    assert sorted(model.load_report.newly_initialized) == ["classifier.bias", "classifier.weight"]
    encoder = BertModel.from_pretrained(minilm)
    assert torch.equal(model.bert.encoder.layer[5].output.dense.weight, encoder.encoder.layer[5].output.dense.weight)

    model.save_pretrained(tmp_path)
    theirs, info = transformers.BertForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert theirs.num_labels == 3
    with torch.no_grad():
        a = model(**tokenized).logits
        b = theirs.eval()(**tokenized).logits
    assert a.shape == (len(SENTENCES), 3)
    assert (a - b).abs().max().item() <= 1e-5
    back = BertForSequenceClassification.from_pretrained(tmp_path)
    assert back.load_report.newly_initialized == []
    assert torch.equal(back.classifier.weight, model.classifier.weight)
