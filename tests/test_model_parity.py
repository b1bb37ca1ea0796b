"""Parity with transformers on identical weights: every class, outputs, losses and gradients, for
the reference model and for the same model prepared by `bertforge.fast.speed_up`.

Per-token outputs are compared at real (non-padding) positions; at padding ours returns zeros by
design (see `bertforge.model.bert`). Sequence-level outputs (pooler, NSP, classification, multiple
choice) are compared in full.
"""

from __future__ import annotations

import pytest
import torch

from bertforge import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.fast import speed_up
from bertforge.model.heads import gather_positions

CONFIGS = {
    "L2-A4-gelu": dict(),
    "L3-A6-gelu_new-I64-types3": dict(num_hidden_layers=3, hidden_size=48, num_attention_heads=6,
                                      intermediate_size=64, hidden_act="gelu_new", type_vocab_size=3),
    "L1-A8-gelu-I128-types1": dict(num_hidden_layers=1, num_attention_heads=8, intermediate_size=128,
                                   type_vocab_size=1),
}
PADDING = {"unpadded": (11, 11, 11), "padded": (11, 7, 4)}
FP32_ULPS = 16 * 2**-23
"""A scalar summed in two orders (a loss over every position or over the gathered ones) agrees within 16 float32
ulps of its own size."""

config_params = pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
padding_params = pytest.mark.parametrize("lengths", PADDING.values(), ids=PADDING.keys())


def _mlm_labels(batch, vocab_size: int, share: float = 0.3) -> torch.Tensor:
    """(B, T) labels: a random id at ~30% of real positions (at least one per row), -100 elsewhere."""
    mask = batch["attention_mask"].bool()
    chosen = (torch.rand(mask.shape) < share) & mask
    chosen[:, 1] = True
    labels = torch.randint(0, vocab_size, mask.shape)
    return labels.masked_fill(~chosen, -100)


@pytest.fixture(params=["reference", "fast"])
def build(request):
    """``build(model)`` -> the model as built (the reference) or prepared by `bertforge.fast.speed_up`."""
    return (lambda model: model) if request.param == "reference" else speed_up


@pytest.fixture
def pair(hf_twin, randomize, build):
    """``pair(cls, config)`` -> (ours with random weights, transformers' twin), both in eval mode."""

    def make(cls, config):
        ours = randomize(cls(config)).eval()
        return build(ours), hf_twin(ours)

    return make


# ---------------------------------------------------------------------------- BertModel
@config_params
@padding_params
def test_bert_model(overrides, lengths, tiny_config, pair, make_batch, assert_close):
    config = tiny_config(**overrides)
    ours, theirs = pair(BertModel, config)
    batch = make_batch(config, lengths)
    mask = batch["attention_mask"]
    with torch.no_grad():
        a = ours(**batch, output_hidden_states=True)
        b = theirs(**batch, output_hidden_states=True)
    assert a.last_hidden_state.shape == (3, 11, config.hidden_size)
    assert_close(a.last_hidden_state, b.last_hidden_state, mask, what="last_hidden_state")
    assert_close(a.pooler_output, b.pooler_output, what="pooler_output")
    assert len(a.hidden_states) == len(b.hidden_states) == config.num_hidden_layers + 1
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        assert_close(x, y, mask, what=f"hidden_states[{i}]")
    # by design: exact zeros at padding positions
    assert torch.all(a.last_hidden_state[~mask.bool()] == 0)


def test_left_padding_and_holes(tiny_config, pair, make_batch, assert_close):
    """Any mask layout works, not only right padding: masked positions simply take no part."""
    config = tiny_config()
    ours, theirs = pair(BertModel, config)
    batch = make_batch(config, (11, 11, 11))
    mask = batch["attention_mask"]
    mask[0, :4] = 0  # left padding
    mask[1, 5:7] = 0  # a hole in the middle
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert_close(a.last_hidden_state, b.last_hidden_state, mask, what="last_hidden_state")
    assert_close(a.pooler_output[1:], b.pooler_output[1:], what="pooler_output")  # row 0's [CLS] is masked


def test_token_type_ids_matter_and_match(tiny_config, pair, make_batch, assert_close):
    config = tiny_config()
    ours, theirs = pair(BertModel, config)
    batch = make_batch(config)
    without = {k: v for k, v in batch.items() if k != "token_type_ids"}
    with torch.no_grad():
        a, b = ours(**batch).last_hidden_state, theirs(**batch).last_hidden_state
        a0, b0 = ours(**without).last_hidden_state, theirs(**without).last_hidden_state
    m = batch["attention_mask"]
    assert_close(a, b, m)
    assert_close(a0, b0, m)
    assert (a - a0)[m.bool()].abs().max() > 1e-3  # segments do change the encoding


def test_no_attention_mask_equals_all_ones(tiny_config, make_batch, assert_close, build):
    config = tiny_config()
    model = build(BertModel(config)).eval()
    batch = make_batch(config, (9, 9))
    with torch.no_grad():
        a = model(batch["input_ids"], token_type_ids=batch["token_type_ids"]).last_hidden_state
        b = model(**batch).last_hidden_state
    assert_close(a, b, atol=0)


# ---------------------------------------------------------------------------- pre-training heads
@config_params
@padding_params
def test_pretraining(overrides, lengths, tiny_config, pair, make_batch, assert_close):
    config = tiny_config(**overrides)
    ours, theirs = pair(BertForPreTraining, config)
    batch = make_batch(config, lengths)
    labels = _mlm_labels(batch, config.vocab_size)
    nsp = torch.tensor([0, 1, 1])
    with torch.no_grad():
        a = ours(**batch, labels=labels, next_sentence_label=nsp)
        b = theirs(**batch, labels=labels, next_sentence_label=nsp)
    assert a.prediction_logits.shape == (3, 11, config.vocab_size)
    assert_close(a.prediction_logits, b.prediction_logits, batch["attention_mask"], what="prediction_logits")
    assert_close(a.seq_relationship_logits, b.seq_relationship_logits, what="seq_relationship_logits")
    assert_close(a.loss, b.loss, what="loss")
    assert a.loss.item() > 1.0  # a real loss near ln(V) + ln(2), not a degenerate zero


@config_params
@padding_params
def test_masked_lm(overrides, lengths, tiny_config, pair, make_batch, assert_close):
    config = tiny_config(**overrides)
    ours, theirs = pair(BertForMaskedLM, config)
    batch = make_batch(config, lengths)
    labels = _mlm_labels(batch, config.vocab_size)
    with torch.no_grad():
        a, b = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert_close(a.logits, b.logits, batch["attention_mask"], what="logits")
    assert_close(a.loss, b.loss, what="loss")


# ---------------------------------------------------------------------------- fine-tuning heads
SEQ_TASKS = {
    "classification": (3, lambda: torch.tensor([0, 2, 1])),
    "regression": (1, lambda: torch.tensor([0.5, -1.0, 2.0])),
    "multi_label": (3, lambda: torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])),
}


@config_params
@padding_params
@pytest.mark.parametrize("task", SEQ_TASKS, ids=SEQ_TASKS.keys())
def test_sequence_classification(task, overrides, lengths, tiny_config, pair, make_batch, assert_close):
    num_labels, make_labels = SEQ_TASKS[task]
    config = tiny_config(**overrides, num_labels=num_labels)
    ours, theirs = pair(BertForSequenceClassification, config)
    batch = make_batch(config, lengths)
    labels = make_labels()
    with torch.no_grad():
        a, b = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert a.logits.shape == (3, num_labels)
    assert_close(a.logits, b.logits, what="logits")
    assert_close(a.loss, b.loss, what="loss")
    assert a.loss.item() > 0


def test_outputs_read_as_transformers_tuples_do(tiny_config, pair, make_batch, assert_close):
    """``out[0]``, ``out[1]``, slices and `to_tuple`: the outputs that are set, in transformers' order."""
    config = tiny_config(num_labels=3)
    batch = make_batch(config, (11, 7, 4))
    labels = torch.tensor([0, 2, 1])
    for cls, kwargs in ((BertForSequenceClassification, {}), (BertForSequenceClassification, {"labels": labels}),
                        (BertModel, {}), (BertModel, {"output_hidden_states": True})):
        ours, theirs = pair(cls, config)
        with torch.no_grad():
            a, b = ours(**batch, **kwargs), theirs(**batch, **kwargs)
        assert len(a.to_tuple()) == len(b.to_tuple()), (cls.__name__, kwargs, a.keys(), list(b.keys()))
        for got, want in zip(a.to_tuple(), b.to_tuple()):
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert_close(g, w, batch["attention_mask"] if g.dim() == 3 else None)
        assert a[0] is a.to_tuple()[0] and a[-1] is a.to_tuple()[-1] and len(a[:2]) == min(2, len(a.to_tuple()))
    assert ours(**batch)["last_hidden_state"] is not None  # by name, as before


@config_params
@padding_params
def test_token_classification(overrides, lengths, tiny_config, pair, make_batch, assert_close):
    config = tiny_config(**overrides, num_labels=5)
    ours, theirs = pair(BertForTokenClassification, config)
    batch = make_batch(config, lengths)
    mask = batch["attention_mask"]
    labels = torch.randint(0, 5, mask.shape).masked_fill(mask == 0, -100)
    labels[:, 0] = -100  # [CLS]: no tag
    with torch.no_grad():
        a, b = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert a.logits.shape == (3, 11, 5)
    assert_close(a.logits, b.logits, mask, what="logits")
    assert_close(a.loss, b.loss, what="loss")


@config_params
@padding_params
def test_question_answering(overrides, lengths, tiny_config, pair, make_batch, assert_close):
    config = tiny_config(**overrides)
    ours, theirs = pair(BertForQuestionAnswering, config)
    batch = make_batch(config, lengths)
    mask = batch["attention_mask"]
    start, end = torch.tensor([3, 0, 2]), torch.tensor([5, 0, 3])
    with torch.no_grad():
        a = ours(**batch, start_positions=start, end_positions=end)
        b = theirs(**batch, start_positions=start, end_positions=end)
    assert a.start_logits.shape == a.end_logits.shape == (3, 11)
    assert_close(a.start_logits, b.start_logits, mask, what="start_logits")
    assert_close(a.end_logits, b.end_logits, mask, what="end_logits")
    if lengths == PADDING["unpadded"]:
        # With padding, ours leaves padding out of the softmax over positions and transformers does
        # not: the losses differ by design (see test_question_answering_loss_leaves_padding_out).
        assert_close(a.loss, b.loss, what="loss")


def test_question_answering_out_of_range_positions(tiny_config, pair, make_batch, assert_close):
    config = tiny_config()
    ours, theirs = pair(BertForQuestionAnswering, config)
    batch = make_batch(config, PADDING["unpadded"])
    T = batch["input_ids"].shape[1]
    start, end = torch.tensor([3, 40, -2]), torch.tensor([T + 7, 4, 1])  # beyond T: ignored; < 0: [CLS]
    with torch.no_grad():
        a = ours(**batch, start_positions=start, end_positions=end)
        b = theirs(**batch, start_positions=start, end_positions=end)
    assert_close(a.loss, b.loss, what="loss")
    # the same loss by hand: start over rows 0 and 2 (2 -> position 0), end over rows 1 and 2
    ce = torch.nn.functional.cross_entropy
    expected = (ce(a.start_logits[[0, 2]], torch.tensor([3, 0]))
                + ce(a.end_logits[[1, 2]], torch.tensor([4, 1]))) / 2
    assert_close(a.loss, expected, atol=1e-6)


def test_question_answering_loss_leaves_padding_out(tiny_config, make_batch, assert_close, build, randomize):
    """The head's loss on a padded batch is the mean of each row's loss alone: padding positions are
    not in the softmax over start / end positions (a target on padding is ignored like one beyond T)."""
    config = tiny_config()
    model = build(randomize(BertForQuestionAnswering(config))).eval()
    batch = make_batch(config, PADDING["padded"])  # lengths 11, 7, 4
    start, end = torch.tensor([3, 0, 2]), torch.tensor([5, 6, 3])
    with torch.no_grad():
        together = model(**batch, start_positions=start, end_positions=end).loss
        rows = [model(**{k: v[i:i + 1, :n] for k, v in batch.items()}, start_positions=start[i:i + 1],
                      end_positions=end[i:i + 1]).loss for i, n in enumerate(PADDING["padded"])]
        on_padding = model(**batch, start_positions=torch.tensor([3, 9, 2]), end_positions=end).loss
    assert_close(together, torch.stack(rows).mean(), atol=1e-6, what="loss")
    # start 9 of row 1 (7 tokens) is padding: ignored, so the start term averages rows 0 and 2
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        out = model(**batch)
    pad = batch["attention_mask"] == 0
    s, e = out.start_logits.masked_fill(pad, float("-inf")), out.end_logits.masked_fill(pad, float("-inf"))
    expected = (ce(s[[0, 2]], torch.tensor([3, 2])) + ce(e, end)) / 2
    assert_close(on_padding, expected, atol=1e-6, what="loss with a target on padding")


def test_question_answering_padding_logits_are_constant(tiny_config, make_batch, build):
    """The documented deviation behind the padded QA loss: padding scores are exactly the head bias."""
    config = tiny_config()
    model = build(BertForQuestionAnswering(config)).eval()
    torch.nn.init.normal_(model.qa_outputs.bias)
    batch = make_batch(config, PADDING["padded"])
    with torch.no_grad():
        out = model(**batch)
    pad = batch["attention_mask"] == 0
    assert torch.equal(out.start_logits[pad], model.qa_outputs.bias[0].expand(int(pad.sum())))
    assert torch.equal(out.end_logits[pad], model.qa_outputs.bias[1].expand(int(pad.sum())))


@config_params
@padding_params
def test_multiple_choice(overrides, lengths, tiny_config, pair, make_batch, assert_close):
    config = tiny_config(**overrides)
    ours, theirs = pair(BertForMultipleChoice, config)
    B, C = 2, 3
    flat = make_batch(config, lengths * 2)  # B * C = 6 sequences of length 11
    batch = {k: v.view(B, C, -1) for k, v in flat.items()}
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        a, b = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert a.logits.shape == (B, C)
    assert_close(a.logits, b.logits, what="logits")
    assert_close(a.loss, b.loss, what="loss")


# ---------------------------------------------------------------------------- sparse MLM
@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
def test_masked_positions_equal_dense(cls, tiny_config, make_batch, assert_close, build):
    config = tiny_config()
    model = build(cls(config)).eval()
    torch.nn.init.normal_(model.cls.predictions.bias)  # make the output bias count
    batch = make_batch(config, PADDING["padded"])
    # (B, P) with P = 3; row 2 uses only two slots: its third slot points at 0 with label -100
    positions = torch.tensor([[1, 4, 9], [2, 3, 6], [1, 2, 0]])
    sparse_labels = torch.tensor([[5, 17, 42], [8, 1, 98], [33, 7, -100]])
    dense_labels = torch.full(batch["input_ids"].shape, -100)
    for row in range(3):
        for pos, lab in zip(positions[row], sparse_labels[row]):
            if lab != -100:
                dense_labels[row, pos] = lab
    extra = {"next_sentence_label": torch.tensor([0, 1, 0])} if cls is BertForPreTraining else {}
    key = "prediction_logits" if cls is BertForPreTraining else "logits"
    with torch.no_grad():
        dense = model(**batch, labels=dense_labels, **extra)
        sparse = model(**batch, labels=sparse_labels, masked_positions=positions, **extra)
        filled = sparse_labels != -100
        compact = model(**batch, labels=sparse_labels, masked_positions=positions, prediction_mask=filled, **extra)
    assert sparse[key].shape == (3, 3, config.vocab_size)
    assert_close(sparse[key], gather_positions(dense[key], positions), what="logits at positions")
    assert_close(sparse.loss, dense.loss, atol=FP32_ULPS * abs(dense.loss.item()), what="loss")
    assert compact[key].shape == (8, config.vocab_size)  # the filled slots only
    assert_close(compact[key], sparse[key][filled], what="logits of the filled slots")
    assert_close(compact.loss, dense.loss, atol=FP32_ULPS * abs(dense.loss.item()), what="loss (filled slots)")
    with pytest.raises(ValueError, match="prediction_mask needs masked_positions"):
        model(**batch, prediction_mask=filled)


@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
@pytest.mark.parametrize("lengths", PADDING.values(), ids=PADDING.keys())
def test_masked_positions_gradients_equal_dense(cls, lengths, tiny_config, make_batch, randomize, build):
    """With masked_positions the last layer runs at [CLS] + the predicted positions only: the loss
    and every gradient must still be the dense model's."""
    config = tiny_config()
    model = build(randomize(cls(config)))
    batch = make_batch(config, lengths)
    positions = torch.tensor([[1, 2, 3], [2, 3, 1], [1, 2, 0]])  # inside every row's real tokens
    sparse_labels = torch.tensor([[5, 17, 42], [8, 1, 98], [33, 7, -100]])
    dense_labels = torch.full(batch["input_ids"].shape, -100)
    dense_labels.scatter_(1, positions, sparse_labels)
    dense_labels[2, 0] = -100  # the unused slot points at [CLS] with label -100
    extra = {"next_sentence_label": torch.tensor([0, 1, 0])} if cls is BertForPreTraining else {}
    grads = []
    for kwargs in ({"labels": dense_labels}, {"labels": sparse_labels, "masked_positions": positions},
                   {"labels": sparse_labels, "masked_positions": positions, "prediction_mask": sparse_labels != -100}):
        model.zero_grad()
        model(**batch, **kwargs, **extra).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    dense = grads[0]
    for sparse in grads[1:]:
        assert dense.keys() == sparse.keys()
        worst = max((float((dense[n] - sparse[n]).abs().max()), n) for n in dense)
        assert worst[0] < 1e-5, f"gradient of {worst[1]} differs by {worst[0]:.2e}"


# ---------------------------------------------------------------------------- padding invariance
@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification, BertForTokenClassification])
def test_padding_invariance(cls, tiny_config, make_batch, assert_close, build):
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)  # eval() must disable it
    model = build(cls(config)).eval()
    batch = make_batch(config, (13, 5, 9))
    alone = {k: v[1:2, :5] for k, v in batch.items()}
    with torch.no_grad():
        together, single = model(**batch), model(**alone)
    if cls is BertModel:
        assert_close(together.last_hidden_state[1:2, :5], single.last_hidden_state, what="last_hidden_state")
        assert_close(together.pooler_output[1:2], single.pooler_output, what="pooler_output")
    elif cls is BertForTokenClassification:
        assert_close(together.logits[1:2, :5], single.logits, what="token logits")
    else:
        assert_close(together.logits[1:2], single.logits, what="logits")


# ---------------------------------------------------------------------------- gradients
def _pretraining_inputs(batch, config):
    return dict(batch, labels=_mlm_labels(batch, config.vocab_size), next_sentence_label=torch.tensor([1, 0, 1]))


def _classification_inputs(batch, config):
    return dict(batch, labels=torch.tensor([1, 0, 1]))


def _multiple_choice_inputs(batch, config):  # the 3 sequences as 1 question with 3 choices
    return dict({k: v[None] for k, v in batch.items()}, labels=torch.tensor([2]))


GRADIENT_CASES = {  # the pooled heads run their last layer at [CLS] only: gradients must not change
    "pretraining": (BertForPreTraining, _pretraining_inputs),
    "classification": (BertForSequenceClassification, _classification_inputs),
    "multiple_choice": (BertForMultipleChoice, _multiple_choice_inputs),
}


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=GRADIENT_CASES.keys())
@pytest.mark.parametrize("lengths", PADDING.values(), ids=PADDING.keys())
def test_gradients_match(case, lengths, tiny_config, pair, make_batch):
    cls, inputs = GRADIENT_CASES[case]
    config = tiny_config(num_hidden_layers=2, hidden_act="gelu_new", num_labels=2)
    ours, theirs = pair(cls, config)
    ours.train(), theirs.train()  # dropout is 0: train mode must still agree
    kwargs = inputs(make_batch(config, lengths), config)
    ours(**kwargs).loss.backward()
    theirs(**kwargs).loss.backward()
    their_params = dict(theirs.named_parameters())
    compared = 0
    for name, p in ours.named_parameters():
        q = their_params[name]
        assert p.grad is not None and q.grad is not None, name
        scale = q.grad.abs().max().item()
        err = (p.grad - q.grad).abs().max().item()
        # the floor 1e-6 covers gradients that are zero in exact arithmetic (multiple choice's bias: a sum of
        # softmax - one-hot terms, which float32 rounding leaves at a few 1e-7 on some CPUs)
        assert err <= 1e-5 * max(scale, 1e-1), f"{name}: grad max diff {err:.3g} (scale {scale:.3g})"
        compared += 1
    assert compared == len(their_params)  # every parameter, the tied decoder counted once
    assert ours.bert.embeddings.word_embeddings.weight.grad.abs().max() > 0


# ---------------------------------------------------------------------------- tied weights
def test_mlm_decoder_is_the_word_embedding_matrix(tiny_config, make_batch, assert_close, build):
    config = tiny_config()
    model = build(BertForMaskedLM(config)).eval()
    batch = make_batch(config)
    batch["input_ids"][batch["input_ids"] == 7] = 8  # token 7 is not in the input: only the decoder uses it
    assert "cls.predictions.decoder.weight" not in model.state_dict()
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())

    def check() -> torch.Tensor:
        with torch.no_grad():
            hidden = model.bert(**batch).last_hidden_state
            logits = model(**batch).logits
            expected = model.cls.predictions.transform(hidden) @ model.bert.embeddings.word_embeddings.weight.T
        assert_close(logits, expected + model.cls.predictions.bias, batch["attention_mask"], atol=1e-5)
        return logits

    before = check()
    with torch.no_grad():  # change only the output side of token 7: its logit must move, others not
        model.bert.embeddings.word_embeddings.weight[7] *= 3.0
    after = check()
    real = batch["attention_mask"].bool()
    assert_close(after[..., 7], 3.0 * before[..., 7] - 2.0 * model.cls.predictions.bias[7], real)
    assert_close(torch.cat([after[..., :7], after[..., 8:]], -1),
                 torch.cat([before[..., :7], before[..., 8:]], -1), real, atol=0)


def test_tied_after_from_pretrained(tmp_path, tiny_config, make_batch, build):
    config = tiny_config()
    build(BertForPreTraining(config)).save_pretrained(tmp_path)
    model = build(BertForPreTraining.from_pretrained(tmp_path)).eval()
    batch = make_batch(config)
    with torch.no_grad():
        before = model(**batch).prediction_logits
        model.bert.embeddings.word_embeddings.weight[:, 0] += 1.0
        hidden = model.bert(**batch).last_hidden_state
        after = model(**batch).prediction_logits
        expected = model.cls.predictions.transform(hidden) @ model.bert.embeddings.word_embeddings.weight.T
    assert not torch.allclose(before, after)
    real = batch["attention_mask"].bool()
    assert (after - expected - model.cls.predictions.bias)[real].abs().max() < 1e-5


# ---------------------------------------------------------------------------- dropout
def test_dropout_only_in_train_mode(tiny_config, make_batch, build):
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = build(BertForSequenceClassification(config))
    batch = make_batch(config)
    model.train()
    with torch.no_grad():
        t1, t2 = model(**batch).logits, model(**batch).logits
    model.eval()
    with torch.no_grad():
        e1, e2 = model(**batch).logits, model(**batch).logits
    assert not torch.equal(t1, t2)
    assert torch.equal(e1, e2)


@pytest.mark.parametrize("which", ["hidden_dropout_prob", "attention_probs_dropout_prob"])
def test_each_dropout_is_applied_in_train(which, tiny_config, make_batch, assert_close, build):
    config = tiny_config(**{which: 0.5})
    model = build(BertModel(config))
    batch = make_batch(config)
    model.eval()
    with torch.no_grad():
        reference = model(**batch).last_hidden_state
    model.train()
    with torch.no_grad():
        noisy = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (noisy - reference)[real].abs().max() > 1e-2
    # and eval equals a twin built without dropout
    twin = build(BertModel(config.replace(**{which: 0.0}))).eval()
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert_close(twin(**batch).last_hidden_state, reference, atol=0)
