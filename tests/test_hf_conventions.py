"""transformers' calling conventions on bertforge's models, checked against transformers on the same
weights: ``output_attentions=True`` (each layer's attention probabilities, in ``attentions``) and
``return_dict=False`` (the plain tuple, in transformers' order), for the reference model and for the
same model prepared by `bertforge.fast.speed_up`; and the default call, which computes no attentions.

Attention rows of padding queries are zero in ours (as the hidden states there, see
`bertforge.model.bert`) and compared at real queries only; every key column is compared.
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
from bertforge.model.bert import BertSelfAttention

PADDED = (11, 7, 4)


@pytest.fixture(params=["reference", "fast"])
def build(request):
    """``build(model)`` -> the model as built (the reference) or prepared by `bertforge.fast.speed_up`."""
    return (lambda model: model) if request.param == "reference" else speed_up


@pytest.fixture
def pair(hf_twin, randomize, build):
    """``pair(cls, config)`` -> (ours with random weights, transformers' twin with eager attention, whose
    probabilities transformers can return), both in eval mode."""

    def make(cls, config):
        ours = randomize(cls(config)).eval()
        theirs = hf_twin(ours)
        theirs.set_attn_implementation("eager")
        return build(ours), theirs

    return make


def _config(cls, tiny_config):
    """A tiny config for ``cls``: 3 labels, but QA's 2 (transformers sizes its span layer by num_labels)."""
    return tiny_config(num_labels=2 if cls is BertForQuestionAnswering else 3)


def _inputs(cls, config, make_batch, lengths=PADDED, labels: bool = False) -> tuple[dict, torch.Tensor]:
    """(keyword arguments for ``cls``: a batch, with its labels if asked; the (rows, T) mask of the
    sequences the encoder sees)."""
    if cls is BertForMultipleChoice:  # 2 examples x 3 choices of one batch's sequences
        batch = {k: v.view(2, 3, -1) for k, v in make_batch(config, lengths * 2).items()}
        kwargs = dict(batch, labels=torch.tensor([2, 0])) if labels else batch
        return kwargs, batch["attention_mask"].reshape(6, -1)
    batch = make_batch(config, lengths)
    mask = batch["attention_mask"]
    B, T = mask.shape
    if not labels:
        return batch, mask
    token_labels = torch.randint(0, config.vocab_size, (B, T)).masked_fill(mask == 0, -100)
    tags = torch.randint(0, config.num_labels, (B, T)).masked_fill(mask == 0, -100)
    extra = {
        BertModel: {},
        BertForPreTraining: {"labels": token_labels, "next_sentence_label": torch.tensor([0, 1, 1])},
        BertForMaskedLM: {"labels": token_labels},
        BertForSequenceClassification: {"labels": torch.tensor([0, 2, 1])},
        BertForTokenClassification: {"labels": tags},
        BertForQuestionAnswering: {"start_positions": torch.tensor([3, 0, 2]),
                                   "end_positions": torch.tensor([5, 0, 3])},
    }[cls]
    return dict(batch, **extra), mask


def _assert_same(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor, what: str, atol: float = 1e-5) -> None:
    """Equal at the real positions of ``mask`` (rows, T): a per-token output (rows, T, ...) there, an
    attention map (rows, A, T, T) at its real queries; any other output in full."""
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    keep = mask.bool()
    if ours.dim() == 4:  # (rows, A, T, T) -> the real queries' rows, every key
        ours, theirs = ours.transpose(1, 2)[keep], theirs.transpose(1, 2)[keep]
    elif ours.shape[:2] == keep.shape:
        ours, theirs = ours[keep], theirs[keep]
    diff = (ours.float() - theirs.float()).abs().max().item()
    assert diff <= atol, f"{what}: max abs diff {diff:.3g} > {atol}"


def _assert_attentions(ours: tuple, theirs: tuple, mask: torch.Tensor, config) -> None:
    assert isinstance(ours, tuple) and len(ours) == len(theirs) == config.num_hidden_layers
    rows, T = mask.shape
    padding_queries = ~mask.bool()[:, None, :, None].expand(-1, config.num_attention_heads, -1, T)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == (rows, config.num_attention_heads, T, T)
        _assert_same(a, b, mask, f"attentions[{i}]")
        assert torch.all(a[padding_queries] == 0), f"attentions[{i}]: a padding query's row is not zero"
        real = mask.bool()[:, None, :].expand(-1, config.num_attention_heads, -1)  # (rows, A, T) real queries
        sums = a.sum(-1)[real]
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)  # probabilities over the keys
        assert torch.all(a.transpose(-1, -2)[~mask.bool()[:, None, :].expand_as(real)] == 0)  # padding keys


# ---------------------------------------------------------------------------- output_attentions
LAYOUTS = ["padded", "holes"]


@pytest.mark.parametrize("overrides", [{}, {"num_hidden_layers": 3, "hidden_size": 48, "num_attention_heads": 6}],
                         ids=["L2-A4", "L3-A6"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bert_model_attentions_equal_transformers(overrides, layout, tiny_config, pair, make_batch):
    config = tiny_config(**overrides)
    ours, theirs = pair(BertModel, config)
    batch = make_batch(config, PADDED)
    if layout == "holes":  # left padding, a hole in the middle: any mask layout
        batch = make_batch(config, (11, 11, 9))
        batch["attention_mask"][0, :4] = 0
        batch["attention_mask"][1, 5:7] = 0
    with torch.no_grad():
        a = ours(**batch, output_attentions=True)
        b = theirs(**batch, output_attentions=True)
    _assert_attentions(a.attentions, b.attentions, batch["attention_mask"], config)
    _assert_same(a.last_hidden_state, b.last_hidden_state, batch["attention_mask"], "last_hidden_state")


HEADS = [BertForPreTraining, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
         BertForQuestionAnswering, BertForMultipleChoice]


@pytest.mark.parametrize("cls", HEADS, ids=[c.__name__ for c in HEADS])
def test_head_attentions_equal_transformers(cls, tiny_config, pair, make_batch):
    """Through every head, those that ask the encoder for [CLS] alone (`output_positions`) included."""
    config = _config(cls, tiny_config)
    ours, theirs = pair(cls, config)
    kwargs, mask = _inputs(cls, config, make_batch)
    with torch.no_grad():
        a = ours(**kwargs, output_attentions=True)
        b = theirs(**kwargs, output_attentions=True)
    _assert_attentions(a.attentions, b.attentions, mask, config)
    assert a.hidden_states is None


def test_causal_attentions_equal_the_reference(tiny_config, randomize, make_batch):
    """A left-to-right encoder (``is_decoder``): a query's row covers the real keys at or before it; the
    sped-up model returns the reference's, right or left padded."""
    config = tiny_config(is_decoder=True)
    reference = randomize(BertModel(config)).eval()
    fast = speed_up(randomize(BertModel(config)))
    fast.load_state_dict(reference.state_dict())
    fast.eval()
    batch = make_batch(config, PADDED)
    batch["attention_mask"][1, :2] = 0  # left padding too
    with torch.no_grad():
        a = reference(**batch, output_attentions=True).attentions
        b = fast(**batch, output_attentions=True).attentions
    mask = batch["attention_mask"]
    for x, y in zip(a, b):
        _assert_same(x, y, mask, "attentions")
        T = mask.shape[1]
        above = torch.ones(T, T, dtype=torch.bool).triu(1)  # keys after the query
        assert torch.all(x[..., above] == 0)
    assert torch.all(a[0][1, :, 3, 2:4] > 0) and torch.all(a[0][1, :, 3, :2] == 0)


@pytest.mark.parametrize("mode", ["train", "eval-grad"])
def test_fast_attentions_with_gradients_equal_the_reference(mode, tiny_config, randomize, make_batch):
    """With gradients on (training's rider rows on CPU), the sped-up model's attentions are the reference's,
    and differentiable."""
    config = tiny_config()
    reference = randomize(BertForSequenceClassification(config))
    fast = speed_up(randomize(BertForSequenceClassification(config)))
    fast.load_state_dict(reference.state_dict())
    reference.train(mode == "train")
    fast.train(mode == "train")
    batch = make_batch(config, PADDED)
    a = reference(**batch, output_attentions=True).attentions
    b = fast(**batch, output_attentions=True).attentions
    for x, y in zip(a, b):
        _assert_same(x, y, batch["attention_mask"], "attentions")
    b[-1][:, :, 0, 1].sum().backward()
    assert fast.bert.encoder.layer[-1].attention.self.query.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------- return_dict=False
@pytest.mark.parametrize("cls", [BertModel, *HEADS], ids=[c.__name__ for c in [BertModel, *HEADS]])
@pytest.mark.parametrize("asked", [{}, {"output_attentions": True},
                                   {"output_hidden_states": True, "output_attentions": True}],
                         ids=["plain", "attentions", "hidden+attentions"])
@pytest.mark.parametrize("labels", [False, True], ids=["no-labels", "labels"])
def test_return_dict_false_gives_transformers_tuple(cls, asked, labels, tiny_config, pair, make_batch):
    config = _config(cls, tiny_config)
    ours, theirs = pair(cls, config)
    # ours leaves padding out of the span loss and transformers does not: QA's loss compares unpadded
    lengths = (11, 11, 11) if labels and cls is BertForQuestionAnswering else PADDED
    kwargs, mask = _inputs(cls, config, make_batch, lengths, labels)
    with torch.no_grad():
        a = ours(**kwargs, **asked, return_dict=False)
        b = theirs(**kwargs, **asked, return_dict=False)
        named = ours(**kwargs, **asked)
    assert type(a) is tuple and type(b) is tuple
    if cls is BertModel and asked.get("output_attentions"):
        # transformers 5 appends `cross_attentions`, an empty tuple from an encoder without
        # cross-attention (transformers 4 left it out); bertforge has no cross-attention to report
        assert b[-1] == (), b[-1]
        b = b[:-1]
    assert len(a) == len(b), (cls.__name__, len(a), len(b))
    assert len(a) == len(named.to_tuple())
    if labels and cls is not BertModel:
        assert a[0].dim() == 0  # the loss first
    for i, (got, want) in enumerate(zip(a, b)):
        if isinstance(want, tuple):  # hidden_states, attentions
            assert isinstance(got, tuple) and len(got) == len(want), (cls.__name__, i)
            for j, (g, w) in enumerate(zip(got, want)):
                _assert_same(g, w, mask, f"{cls.__name__}[{i}][{j}]")
        else:
            _assert_same(got, want, mask, f"{cls.__name__}[{i}]")


@pytest.mark.parametrize("cls", [BertModel, *HEADS], ids=[c.__name__ for c in [BertModel, *HEADS]])
def test_return_dict_true_or_none_gives_the_named_outputs(cls, tiny_config, randomize, make_batch, build):
    config = _config(cls, tiny_config)
    model = build(randomize(cls(config))).eval()
    kwargs, _ = _inputs(cls, config, make_batch, labels=True)
    with torch.no_grad():
        default, true, none = model(**kwargs), model(**kwargs, return_dict=True), model(**kwargs, return_dict=None)
    assert type(default) is type(true) is type(none) and not isinstance(default, tuple)
    for x, y, z in zip(default.to_tuple(), true.to_tuple(), none.to_tuple()):
        assert torch.equal(x, y) and torch.equal(x, z)


# ---------------------------------------------------------------------------- the default call
@pytest.mark.parametrize("cls", [BertModel, *HEADS], ids=[c.__name__ for c in [BertModel, *HEADS]])
def test_default_call_computes_no_attentions(cls, tiny_config, randomize, make_batch, build, monkeypatch):
    """Without ``output_attentions`` no probability is written out (the fused attention alone runs) and
    ``attentions`` is None; asking for them changes no other output."""
    config = _config(cls, tiny_config)
    model = build(randomize(cls(config))).eval()
    kwargs, _ = _inputs(cls, config, make_batch)
    with torch.no_grad():
        asked = model(**kwargs, output_attentions=True)

        def refuse(*args, **kwargs):
            raise AssertionError("attention probabilities written out though not asked for")

        monkeypatch.setattr(BertSelfAttention, "probabilities", refuse)
        plain = model(**kwargs)
    assert plain.attentions is None
    assert len(asked.attentions) == config.num_hidden_layers
    assert len(asked.to_tuple()) == len(plain.to_tuple()) + 1
    for x, y in zip(plain.to_tuple(), asked.to_tuple()):
        assert torch.equal(x, y)
