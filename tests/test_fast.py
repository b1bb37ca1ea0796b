"""`bertforge.fast.speed_up` pinned to the reference model: the outputs and the gradient of every
parameter of every head class on padded batches, fp32 and bf16, train mode (dropout 0) and eval, for
bidirectional and causal (left-to-right) encoders; and the pieces on their own: length groups,
riders, causal masks, the written-out attention, frozen-weight caches, the state dict, idempotence,
the export fallback and the distributed guard."""

from __future__ import annotations

import contextlib
import copy
import itertools

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
from bertforge.fast import attention as fast_attention
from bertforge.fast import dropout as fast_dropout
from bertforge.fast import embedding as fast_embedding
from bertforge.fast import layout as fast_layout
from bertforge.fast import freeze_weights, frozen_weights, is_sped_up, speed_up
from bertforge.fast import unpad as fast_unpad
from bertforge.fast.frozen import is_frozen
from bertforge.model.bert import make_attention_mask
from bertforge.model.heads import (FEATURE_KEY, BertFeatureBiLSTMForSequenceClassification,
                                   BertFeatureBiLSTMForTokenClassification)

LENGTHS = (11, 7, 4, 9)  # padded: three of four rows shorter than the batch


def _inputs(cls, batch: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Each class's inputs with labels, so that its loss (and every head parameter) takes part."""
    mask = batch["attention_mask"]
    B = mask.shape[0]
    if cls is BertModel:
        return dict(batch, output_hidden_states=True)
    if cls in (BertForPreTraining, BertForMaskedLM):
        labels = torch.randint(0, config.vocab_size, mask.shape).masked_fill(mask == 0, -100)
        extra = {"next_sentence_label": torch.arange(B) % 2} if cls is BertForPreTraining else {}
        return dict(batch, labels=labels, output_hidden_states=True, **extra)
    if issubclass(cls, BertForSequenceClassification):
        return dict(batch, labels=torch.arange(B) % config.num_labels)
    if issubclass(cls, BertForTokenClassification):
        return dict(batch, labels=torch.randint(0, config.num_labels, mask.shape).masked_fill(mask == 0, -100))
    if cls is BertForQuestionAnswering:
        return dict(batch, start_positions=torch.arange(B) % 3, end_positions=torch.arange(B) % 3 + 1)
    # multiple choice: the B sequences as B / 2 questions of 2 choices
    return dict({k: v.view(B // 2, 2, -1) for k, v in batch.items()}, labels=torch.arange(B // 2) % 2)


def _sparse_mlm(cls, batch: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Pre-training as the loop runs it: (B, P) masked positions, some slots unused, compact logits."""
    positions = torch.tensor([[1, 4, 9], [2, 3, 6], [1, 2, 0], [5, 8, 0]])
    labels = torch.tensor([[5, 17, 42], [8, 1, 98], [33, 7, -100], [3, 4, -100]])
    extra = {"next_sentence_label": torch.tensor([0, 1, 0, 1])} if cls is BertForPreTraining else {}
    return dict(batch, labels=labels, masked_positions=positions, prediction_mask=labels != -100, **extra)


def _left_to_right(cls, batch: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Left-to-right pre-training as `LeftToRightObjective` runs it: every position but the last asked for,
    the next token predicted where it is real."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    B, T = ids.shape
    targets = mask[:, 1:].bool()
    return dict(batch, labels=ids[:, 1:].masked_fill(~targets, -100),
                masked_positions=torch.arange(T - 1).expand(B, T - 1), prediction_mask=targets)


def _left_to_right_unpadded(cls, batch: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """`_left_to_right` on a batch without padding: the last layer at the chosen positions only."""
    return _left_to_right(cls, dict(batch, attention_mask=torch.ones_like(batch["attention_mask"])), config)


CLASSES = [BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
           BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice]
CASES = [(cls, _inputs) for cls in CLASSES] + [(cls, _sparse_mlm) for cls in (BertForPreTraining, BertForMaskedLM)]
CASE_IDS = [c.__name__ for c in CLASSES] + ["BertForPreTraining-masked_positions", "BertForMaskedLM-masked_positions"]
# A causal encoder under every head: pre-training's (ltr: BertForMaskedLM at every position), and
# fine-tuning's, the BiLSTM heads of Table 5's "+ BiLSTM" row included
BILSTM_CLASSES = [BertFeatureBiLSTMForSequenceClassification, BertFeatureBiLSTMForTokenClassification]
CAUSAL_CASES = CASES + [(cls, _inputs) for cls in BILSTM_CLASSES] + [
    (BertForMaskedLM, _left_to_right), (BertForMaskedLM, _left_to_right_unpadded)]
CAUSAL_CASE_IDS = CASE_IDS + [c.__name__ for c in BILSTM_CLASSES] + [
    "BertForMaskedLM-left_to_right", "BertForMaskedLM-left_to_right-unpadded"]


def _build(cls, config):
    """``cls`` on ``config``; a BiLSTM head fine-tunes its encoder (``--bilstm``) over the last layer."""
    if cls in BILSTM_CLASSES:
        config.extra[FEATURE_KEY] = {"features": "last", "freeze": False, "bilstm_size": 8}
    return cls(config)


def _tensors(out) -> dict[str, torch.Tensor]:
    """Every tensor of a model output, by name (hidden states numbered)."""
    found = {}
    for name, value in vars(out).items():
        if isinstance(value, torch.Tensor):
            found[name] = value
        elif isinstance(value, tuple):
            found.update({f"{name}[{i}]": v for i, v in enumerate(value)})
    return found


def _scalar(out) -> torch.Tensor:
    """What to differentiate: the loss, or (BertModel) a fixed random projection of every output."""
    if getattr(out, "loss", None) is not None:
        return out.loss
    g = torch.Generator().manual_seed(1)
    return sum((t.float() * torch.randn(t.shape, generator=g)).sum() for t in _tensors(out).values())


# `_close`'s tolerances, relative to each tensor's scale: float32 within about 80 of its ulps (2**-23), room for
# two kernels' summation orders; bfloat16 keeps 8 bits (an ulp of 2**-7 at scale 1): outputs within 8 of its ulps,
# gradients, rounded again at every layer of the backward pass, within 16. The fp32 cases pin the maths; the bf16
# cases that bf16 runs the same maths to its precision (a CPU that emulates bf16 rounds differently).
REL = {"fp32": 1e-5, "bf16": 8 * 2**-7}
REL_GRAD = {"fp32": 1e-5, "bf16": 16 * 2**-7}


def _close(a: torch.Tensor, b: torch.Tensor, rel: float, what: str) -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    a, b = a.detach().float(), b.detach().float()
    scale = max(float(b.abs().max()), 1e-1)  # the floor: gradients that are zero in exact arithmetic
    err = float((a - b).abs().max())
    assert err <= rel * scale, f"{what}: max diff {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fast_equals_reference(case, mode, precision, tiny_config, randomize, make_batch):
    """Outputs at every position (both are zero at padding) and the gradient of every parameter."""
    _check_fast_equals_reference(*case, tiny_config(num_labels=3), mode, precision, randomize, make_batch)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("case", CAUSAL_CASES, ids=CAUSAL_CASE_IDS)
def test_causal_fast_equals_reference(case, mode, precision, tiny_config, randomize, make_batch):
    """The same for a causal (left-to-right, ``is_decoder``) encoder, which `speed_up` unpads too."""
    _check_fast_equals_reference(*case, tiny_config(num_labels=3, is_decoder=True), mode, precision, randomize,
                                 make_batch)


def _check_fast_equals_reference(cls, inputs, config, mode, precision, randomize, make_batch) -> None:
    reference = randomize(_build(cls, config)).train(mode == "train")
    fast = speed_up(copy.deepcopy(reference))
    assert is_sped_up(fast)
    kwargs = inputs(cls, make_batch(config, LENGTHS), config)
    rel, rel_grad = REL[precision], REL_GRAD[precision]
    amp = torch.autocast("cpu", torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    outputs = []
    for model in (reference, fast):
        with amp:
            out = model(**kwargs)
        _scalar(out).backward()
        outputs.append(out)
    want, got = _tensors(outputs[0]), _tensors(outputs[1])
    assert want.keys() == got.keys() and want
    for name in want:
        _close(got[name], want[name], rel, name)
    params = dict(fast.named_parameters())
    # the BiLSTM classifier reads the BiLSTM's final states, not the pooler
    unused = {"bert.pooler.dense.weight", "bert.pooler.dense.bias"} if cls in BILSTM_CLASSES else set()
    for name, p in reference.named_parameters():
        if name in unused:
            assert p.grad is None and params[name].grad is None, name
            continue
        assert p.grad is not None and params[name].grad is not None, name
        if precision == "bf16" and config.is_decoder and name.endswith("attention.self.key.bias"):
            # Zero in exact arithmetic (softmax ignores a shift shared by every key's score): in bf16
            # both models return rounding noise, rounded differently by the reference's masked kernel
            # and the causal one (is_causal), up to twice the floor's tolerance; fp32 compares it.
            continue
        _close(params[name].grad, p.grad, rel_grad, f"grad {name}")
    assert float(reference.bert.embeddings.word_embeddings.weight.grad.abs().max()
                 if hasattr(reference, "bert") else reference.embeddings.word_embeddings.weight.grad.abs().max()) > 0


@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification], ids=lambda c: c.__name__)
def test_unpadded_batch_and_no_mask(cls, tiny_config, randomize, make_batch, assert_close):
    """No padding in the batch (every slot through the dense layers), with and without a mask."""
    config = tiny_config(num_labels=2)
    reference = randomize(cls(config)).eval()
    fast = speed_up(copy.deepcopy(reference))
    batch = make_batch(config, (9, 9))
    key = "last_hidden_state" if cls is BertModel else "logits"
    with torch.no_grad():
        want = reference(**batch)[key]
        assert_close(fast(**batch)[key], want)
        assert_close(fast(batch["input_ids"], token_type_ids=batch["token_type_ids"])[key], want)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_output_positions_anywhere(mode, causal, tiny_config, randomize, make_batch):
    """The last layer at chosen positions only: real positions as the full layer, padding ones zero."""
    config = tiny_config(is_decoder=causal)
    reference = randomize(BertModel(config)).train(mode == "train")
    fast = speed_up(copy.deepcopy(reference))
    batch = make_batch(config, (11, 7, 4))
    positions = torch.tensor([[0, 10, 3], [0, 9, 6], [0, 3, 7]])  # (1, 1) and (2, 2) are padding
    want, got = reference(**batch, output_positions=positions), fast(**batch, output_positions=positions)
    assert got.last_hidden_state.shape == (3, 3, config.hidden_size)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=1e-5)
    assert torch.all(got.last_hidden_state[[1, 2], [1, 2]] == 0)


# ---------------------------------------------------------------------------- the sped-up model itself
def test_state_dict_unchanged_and_prepare_idempotent(tiny_config, make_batch, tmp_path):
    model = BertForPreTraining(tiny_config())
    before = model.state_dict()
    speed_up(model)
    forwards = {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__}
    assert "bert" in forwards and "bert.encoder.layer.1" in forwards and "bert.embeddings.dropout" in forwards
    assert speed_up(model) is model
    assert {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__} == forwards
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(after[k] is before[k] or after[k].data_ptr() == before[k].data_ptr() for k in before)
    assert BertModel.__dict__["forward"].__module__ == "bertforge.model.bert"  # the class is untouched
    assert "forward" not in BertForPreTraining(tiny_config()).bert.__dict__  # a fresh instance is the reference
    assert is_sped_up(model) and not is_sped_up(BertModel(tiny_config()))
    model.save_pretrained(tmp_path)
    loaded = BertForPreTraining.from_pretrained(tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in after.items())


def test_a_copy_of_a_prepared_model_runs_its_own_weights(tiny_config, make_batch):
    config = tiny_config()
    model = speed_up(BertModel(config)).eval()
    twin = copy.deepcopy(model)
    assert twin.__dict__["forward"].__self__ is twin
    with torch.no_grad():
        twin.encoder.layer[0].output.dense.weight.mul_(2.0)
    batch = make_batch(config)
    with torch.no_grad():
        assert not torch.allclose(model(**batch).last_hidden_state, twin(**batch).last_hidden_state)


def test_subclass_with_its_own_forward_is_left_alone(tiny_config):
    class Custom(BertModel):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    model = speed_up(Custom(tiny_config()))
    assert "forward" not in model.__dict__ and not is_sped_up(model)


def test_export_runs_the_reference_forward(tiny_config, randomize, make_batch, monkeypatch):
    """While traced by torch.export, a sped-up model takes the reference path (every slot through
    the dense layers; no shape depends on the mask): same outputs, hidden states included."""
    reference = randomize(BertModel(tiny_config())).eval()
    fast = speed_up(copy.deepcopy(reference))
    batch = make_batch(reference.config, (11, 7, 1))
    calls = []
    real_layer = fast_unpad.layer_forward

    def spy(self, x, padding=None, shape=None, select=None):
        calls.append(x.dim())
        return real_layer(self, x, padding, shape, select)

    for layer in fast.encoder.layer:
        layer.forward = spy.__get__(layer)
    monkeypatch.setattr(fast_unpad, "exporting", lambda: True)
    with torch.no_grad():
        want, got = reference(**batch, output_hidden_states=True), fast(**batch, output_hidden_states=True)
    assert calls == [3, 3]  # (B, T, H): the reference layout
    for a, b in zip(want.hidden_states + (want.pooler_output,), got.hidden_states + (got.pooler_output,)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_row_gradient_only_on_one_process(tiny_config, make_batch, monkeypatch):
    """Under a process group (DDP, FSDP) the embedding gradient is PyTorch's own, which the wrappers hook."""
    model = speed_up(BertModel(tiny_config())).train()
    ids = make_batch(model.config)["input_ids"]
    assert type(fast_embedding.words(model.embeddings, ids).grad_fn).__name__ == "_LookupRowGradBackward"
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    assert type(fast_embedding.words(model.embeddings, ids).grad_fn).__name__ == "EmbeddingBackward0"


def test_cheap_dropout_statistics_in_a_prepared_model(tiny_config):
    """The sped-up model's dropout modules drop about p of the values and rescale the rest."""
    model = speed_up(BertForSequenceClassification(tiny_config(hidden_dropout_prob=0.1))).train()
    x = torch.ones(400, 500)
    for drop in (model.bert.embeddings.dropout, model.bert.encoder.layer[1].output.dropout, model.dropout):
        y = drop(x)
        kept = float((y != 0).float().mean())
        assert abs(kept - 0.9) < 0.005 and abs(float(y.mean()) - 1.0) < 0.01
        values = torch.unique(y).tolist()
        assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(65536 / (65536 - 6554))


# ---------------------------------------------------------------------------- riders (CPU training)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("lengths, riders",
                         [((11, 7, 4), 11), ((50, 10, 10), 58), ((40, 33, 30), 17), ((40, 40, 39), 1)])
def test_rider_rows_change_nothing(lengths, riders, causal, tiny_config, make_batch, monkeypatch):
    """CPU training rounds the unpadded row count up to a multiple of 64 with padding slots (or to
    every slot): outputs equal the un-rounded forward's, with zeros at padding."""
    seen = []
    real_round = fast_layout.Padding.round_rows

    def spy(self, keep, multiple=64):
        real_round(self, keep, multiple)
        seen.append((self.indices.numel(), self.riders))

    monkeypatch.setattr(fast_layout.Padding, "round_rows", spy)
    config = tiny_config(is_decoder=causal)
    model = speed_up(BertModel(config)).train()  # dropout 0: train mode is deterministic
    batch = make_batch(config, lengths)
    rounded = model(**batch)  # gradient enabled: riders
    with torch.no_grad():
        plain = model(**batch)  # no gradient, train mode: neither riders nor length groups
    N = sum(lengths)
    assert seen == [(N + riders, riders)]
    assert (N + riders) % 64 == 0 or N + riders == len(lengths) * max(lengths)
    torch.testing.assert_close(rounded.last_hidden_state.detach(), plain.last_hidden_state, rtol=0, atol=1e-6)
    pad = batch["attention_mask"] == 0
    assert torch.equal(rounded.last_hidden_state[pad], torch.zeros_like(rounded.last_hidden_state[pad]))


# ---------------------------------------------------------------------------- length groups (CPU inference)
def _masks(T: int = 40) -> dict[str, torch.Tensor]:
    def right(lengths):
        return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()

    holes = right([40, 31, 9, 22])
    holes[:, 2::5] = 0
    return {"mixed": right([3, 40, 17, 39, 1, 8, 25, 40, 2, 33]), "left": right([40, 6, 19, 2]).flip(1),
            "holes": holes, "empty-row": right([0, 12, 40, 5]), "one": right([9])}


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mask", list(_masks()), ids=list(_masks()))
def test_inference_path_equals_reference(mask, precision, causal, tiny_config, randomize):
    """Eval without gradients on CPU runs attention per length group (and bf16 attention written out):
    real positions match the reference and the sped-up model's path with gradients on; padding is zero."""
    reference = randomize(BertModel(tiny_config(is_decoder=causal))).eval()
    model = speed_up(copy.deepcopy(reference))
    attention_mask = _masks()[mask]
    input_ids = torch.randint(1, model.config.vocab_size, attention_mask.shape) * attention_mask
    token_type_ids = torch.randint(0, 2, attention_mask.shape)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with amp:
        with_grad = model(input_ids, attention_mask, token_type_ids, output_hidden_states=True)
        with torch.no_grad():
            got = model(input_ids, attention_mask, token_type_ids, output_hidden_states=True)
            want = reference(input_ids, attention_mask, token_type_ids, output_hidden_states=True)
    real = attention_mask.bool()
    atol = 1e-5 if precision == "fp32" else 3e-2
    for ref in (with_grad, want):
        for a, b in zip(ref.hidden_states, got.hidden_states):
            assert (a[real].float() - b[real].float()).abs().max() <= atol
        rows = real.any(1)
        assert (ref.pooler_output[rows].float() - got.pooler_output[rows].float()).abs().max() <= atol
    assert torch.all(got.last_hidden_state[~real] == 0)


def test_length_groups_layout():
    keep = _masks()["mixed"].bool()
    indices = keep.reshape(-1).nonzero().squeeze(1)
    groups = fast_layout.LengthGroups.build(keep, indices)
    assert 1 < len(groups.shapes) <= fast_layout.LengthGroups.MAX_GROUPS
    assert sum(b for b, _ in groups.shapes) == keep.shape[0]
    assert sum(b * t * t for b, t in groups.shapes) < keep.numel() * keep.shape[1]  # less attention work
    # every real token once: each group's real slots read the unpadded rows its targets name
    for gather, real, targets in zip(groups.gathers, groups.real, groups.targets):
        assert torch.equal(gather.index_select(0, real), targets)
    assert torch.equal(torch.cat(groups.targets).sort().values, torch.arange(indices.numel()))


@pytest.mark.parametrize("seed", range(5))
def test_length_cuts_are_optimal(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = sorted(torch.randint(1, 60, (7,), generator=g).tolist())
    fixed = lengths[-1] ** 2

    def work(cuts):
        bounds = [0, *cuts]
        return sum((e - s) * lengths[e - 1] ** 2 + fixed for s, e in zip(bounds, bounds[1:]))

    best = min(work([*c, 7]) for k in range(4) for c in itertools.combinations(range(1, 7), k))
    assert work(fast_layout.length_cuts(lengths, 4)) == best


# ---------------------------------------------------------------------------- causal attention
def test_causal_mask_is_the_references_at_real_queries():
    """`causal_mask` equals the reference's `make_attention_mask` (causal) wherever the query is real,
    for every query position or chosen ones; a query also sees itself, so none sees no key at all."""
    for name, mask in _masks().items():
        keep = mask.bool()
        want = make_attention_mask(mask, causal=True)  # (B, 1, T, T)
        got = fast_layout.causal_mask(keep)
        assert got.shape == want.shape
        real = keep[:, None, :, None].expand_as(want)  # the rows of real queries
        assert torch.equal(got[real], want[real]), name
        assert torch.all(got.diagonal(dim1=-2, dim2=-1)), name
        B, T = keep.shape
        positions = torch.randint(0, T, (B, 5))
        chosen = got[:, 0].gather(1, positions.unsqueeze(-1).expand(-1, -1, T)).unsqueeze(1)  # (B, 1, 5, T)
        assert torch.equal(fast_layout.causal_mask(keep, positions), chosen), name
        assert fast_layout.right_padded(keep) == (name in ("mixed", "empty-row", "one")), name


@pytest.mark.parametrize("mask", ["causal", "padding-anywhere", "chosen-queries"])
def test_written_out_causal_attention_and_its_gradients_equal_sdpa(mask):
    """The hand-written path with a causal mask (``causal``: PyTorch's is_causal; a (B, 1, T, T) mask;
    queries at chosen positions) equals SDPA in float64, outputs and q, k, v gradients, with and
    without gradients."""
    torch.manual_seed(0)
    B, T, A, D = 3, 7, 2, 4
    keep = torch.tensor([[True] * 7, [False] * 3 + [True] * 4, [True, False] * 3 + [True]])
    positions = torch.tensor([[0, 6], [2, 5], [1, 4]])
    K = 2 if mask == "chosen-queries" else T
    qkv = torch.randn(B, T, 3 * A * D, dtype=torch.float64)
    grad = torch.randn(B, A, K, D, dtype=torch.float64)
    attn_mask = {"causal": None, "padding-anywhere": fast_layout.causal_mask(keep),
                 "chosen-queries": fast_layout.causal_mask(keep, positions)}[mask]
    is_causal = mask == "causal"

    def split(x):
        q, k, v = x.view(B, T, 3, A, D).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, D)
        if mask == "chosen-queries":
            q = q.gather(2, positions[:, None, :, None].expand(-1, A, -1, D))  # (B, A, K, D)
        return q, k, v

    results = []
    for attend in (lambda q, k, v: fast_attention.written_out_attention(q, k, v, attn_mask, 0.0, is_causal),
                   lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                       q, k, v, attn_mask=attn_mask, is_causal=is_causal)):
        x = qkv.clone().requires_grad_()
        y = attend(*split(x))
        y.backward(grad)
        results.append((y.detach(), x.grad))
    (y0, g0), (y1, g1) = results
    torch.testing.assert_close(y0, y1, rtol=0, atol=1e-12)
    torch.testing.assert_close(g0, g1, rtol=0, atol=1e-12)
    assert float(g0.abs().max()) > 0.1
    with torch.no_grad():
        y = fast_attention.written_out_attention(*split(qkv), attn_mask, 0.0, is_causal)
    torch.testing.assert_close(y, y1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attention", ["fused", "written-out"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("head", [BertForMaskedLM, BertForSequenceClassification], ids=lambda c: c.__name__)
@pytest.mark.parametrize("mask", list(_masks()), ids=list(_masks()))
def test_causal_training_with_padding_anywhere(mask, head, precision, attention, tiny_config, randomize,
                                               monkeypatch):
    """CPU training of a causal model on right- and left-padded rows, rows with holes and an empty row:
    riders (left padding gives some with no real key at or before them), PyTorch's fused kernel
    (dropout 0) or, with dropout, the written-out attention (its masks forced to keep everything).
    The left-to-right LM (every position) and a sentence classifier (its last real token): outputs
    and every gradient equal the reference's (dropout 0)."""
    if head is BertForSequenceClassification and mask == "empty-row":
        pytest.skip("a sentence classifier reads the last real token, which an empty row lacks")
    config = tiny_config(is_decoder=True, num_labels=3)
    reference = randomize(head(config)).train()
    dropout = 0.1 if attention == "written-out" else 0.0
    fast = head(config.replace(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    fast.load_state_dict(reference.state_dict())
    speed_up(fast).train()
    attention_mask = _masks()[mask]
    B, T = attention_mask.shape
    batch = dict(input_ids=torch.randint(1, config.vocab_size, (B, T)) * attention_mask,
                 attention_mask=attention_mask, token_type_ids=torch.randint(0, 2, (B, T)) * attention_mask)
    kwargs = _left_to_right(head, batch, config) if head is BertForMaskedLM else dict(batch, labels=torch.arange(B) % 3)
    drawn = []

    def keep_all(shape, p, device, dtype):
        drawn.append(len(shape))
        return torch.ones(shape, dtype=dtype, device=device)

    monkeypatch.setattr(fast_dropout, "dropout_mask", keep_all)
    rel = REL[precision]
    outputs = []
    for model in (reference, fast):
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            out = model(**kwargs)
        out.loss.backward()
        outputs.append(out)
    assert (4 in drawn) == (attention == "written-out")  # the attention probabilities' dropout
    assert torch.isfinite(outputs[1].logits).all()
    _close(outputs[1].logits, outputs[0].logits, rel, "logits")
    _close(outputs[1].loss, outputs[0].loss, rel, "loss")
    params = dict(fast.named_parameters())
    for name, p in reference.named_parameters():
        _close(params[name].grad, p.grad, REL_GRAD[precision], f"grad {name}")


# ---------------------------------------------------------------------------- frozen-weight caches (inference)
def test_frozen_weights_cache_follows_replaced_weights(tiny_config, make_batch, assert_close):
    """Frozen layers (`freeze_weights`) reuse their stacked, cast weights in inference: the outputs
    still follow `load_state_dict`, in-place changes, a dtype round trip, and autocast on and off,
    and equal an unfrozen twin's."""
    config = tiny_config()
    model, fresh = speed_up(BertModel(config)).eval(), speed_up(BertModel(config)).eval()
    batch = make_batch(config)
    real = batch["attention_mask"].bool()

    def out(m, **autocast):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bool(autocast)):
            return m(**batch).last_hidden_state.float()

    def same(**autocast):
        fresh.load_state_dict(model.state_dict())
        assert_close(out(model, **autocast), out(fresh, **autocast), real, atol=0)

    with frozen_weights(model):
        first = out(model)
        assert any(model.encoder.layer[0].attention.self.query.__dict__["_frozen_weights"].values())  # cached
        same()
        with torch.no_grad():
            model.encoder.layer[0].attention.self.value.weight.mul_(3.0)  # in place: the version counter moves
        assert (out(model) - first)[real].abs().max() > 1e-3
        same()
        model.load_state_dict(BertModel(config).state_dict())  # copied into the same storage
        same()
        same(autocast=True)
        same()  # the fp32 stack again, not the bf16 one
        model.to(torch.bfloat16).to(torch.float32)  # new storage holding rounded values
        same()
    assert not any(is_frozen(m) for m in model.modules())
    assert list(model.state_dict()) == list(fresh.state_dict())


@pytest.mark.parametrize("frozen", [False, True], ids=["unfrozen", "frozen"])
def test_eval_between_steps_follows_a_fused_optimizer(frozen, tiny_config, make_batch, assert_close):
    """Eval between training steps sees every step, even a fused AdamW's, which moves no version
    counter: unfrozen layers cache nothing, and a forward in train mode drops frozen layers' caches."""
    config = tiny_config()
    model = speed_up(BertModel(config), freeze=frozen)
    batch = make_batch(config)
    real = batch["attention_mask"].bool()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        model.train()
        model(**batch).last_hidden_state.sum().backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            got = model(**batch).last_hidden_state
        fresh = BertModel(config).eval()
        fresh.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert_close(got, fresh(**batch).last_hidden_state, real, atol=1e-5)


def test_linear_calls_replaced_or_hooked_layers(tiny_config, make_batch, assert_close):
    """A projection replaced by another module, or carrying a forward hook, is called, not bypassed."""
    config = tiny_config()
    model = freeze_weights(speed_up(BertModel(config)).eval())
    batch = make_batch(config)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        before = model(**batch).last_hidden_state
    attention = model.encoder.layer[0].attention.self
    attention.value = torch.nn.Sequential(attention.value, torch.nn.Tanh())  # e.g. an adapter wrapping it
    model.encoder.layer[1].output.dense.register_forward_hook(lambda m, i, o: o * 2)
    with torch.no_grad():
        after = model(**batch).last_hidden_state
    assert (after - before)[real].abs().max() > 1e-3
    value, dense = attention.value, model.encoder.layer[1].output.dense
    attention.value = value[0]
    dense._forward_hooks.clear()
    with torch.no_grad():
        assert_close(model(**batch).last_hidden_state, before, real, atol=0)


def test_a_batch_with_an_empty_row_trains_to_finite_gradients_with_dropout(tiny_config):
    """A sequence with no real token (an all-padding row) sends its padding slots through the layers as
    riders; with no key to attend to, their attention would be NaN, and a masked NaN key still turns
    its zero weight into NaN (0 x NaN) in every real row's output."""
    torch.manual_seed(0)
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = speed_up(BertForMaskedLM(config)).train()
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1] = 0  # the empty row
    mask[2, 5:] = 0
    ids = torch.randint(5, config.vocab_size, mask.shape) * mask
    labels = ids.masked_fill(mask == 0, -100)
    loss = model(ids, mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
