"""Task heads on top of `BertModel`: pre-training (MLM + NSP), masked LM, sequence classification /
regression, token classification, span QA and multiple choice; and the BiLSTM heads of the paper's
feature-based approach (a BiLSTM over chosen encoder layers, frozen or fine-tuned, before the output layer).

Attribute names are transformers' (``cls.predictions``, ``classifier``, ...), so a state dict is its
checkpoint format. Heads compute logits; losses come from `bertforge.model.losses`. The task heads take
transformers' ``output_attentions`` and ``return_dict=False`` (the plain tuple, `ModelOutput.to_tuple`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model import losses
from bertforge.model.config import BertConfig
from bertforge.model.checkpoint import CheckpointError, load_config, read_state_dict
from bertforge.model.bert import BertModel, BertModelOutput, BertPreTrainedModel, activation, gather_positions
from bertforge.settings import option

__all__ = ["MODEL_CLASSES", "infer_model_class", "BertForPreTraining", "BertForMaskedLM",
           "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
           "BertForMultipleChoice", "gather_positions", "tagged_positions", "FEATURE_KEY", "FEATURE_CHOICES",
           "resolve_layers",
           "feature_layers", "check_features", "ScalarMix",
           "BertFeatureBiLSTMForTokenClassification", "BertFeatureBiLSTMForSequenceClassification",
           "BertFeatureBiLSTMForQuestionAnswering", "FEATURE_MODEL_CLASSES"]


# ---------------------------------------------------------------------------- outputs
@dataclass
class ModelOutput:
    """Named outputs, also read as transformers' outputs are: ``out["logits"]``, or ``out[0]`` / ``loss, logits =
    out[:2]`` and `to_tuple` over the outputs that are set, in transformers' order."""

    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 x (B, T, H) with output_hidden_states
    attentions: tuple[torch.Tensor, ...] | None = None  # L x (B, A, T, T) with output_attentions

    def keys(self) -> list[str]:
        """The names of the outputs that are set, in transformers' order."""
        last = ("hidden_states", "attentions")
        names = [f.name for f in fields(self) if f.name not in ("loss", *last)]
        return [n for n in ("loss", *names, *last) if getattr(self, n) is not None]

    def to_tuple(self) -> tuple[Any, ...]:
        """The outputs that are set, in transformers' order: what ``return_dict=False`` returns."""
        return tuple(getattr(self, n) for n in self.keys())

    def __getitem__(self, key: str | int | slice) -> Any:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]


@dataclass
class BertForPreTrainingOutput(ModelOutput):
    prediction_logits: torch.Tensor | None = None  # (B, T, V); (B, P, V) at masked_positions; (M, V) masked
    seq_relationship_logits: torch.Tensor | None = None  # (B, 2): 0 = IsNext, 1 = NotNext


@dataclass
class MaskedLMOutput(ModelOutput):
    logits: torch.Tensor | None = None  # (B, T, V); (B, P, V) at masked_positions; (M, V) masked


@dataclass
class SequenceClassifierOutput(ModelOutput):
    logits: torch.Tensor | None = None  # (B, num_labels)


@dataclass
class TokenClassifierOutput(ModelOutput):
    logits: torch.Tensor | None = None  # (B, T, num_labels)


@dataclass
class QuestionAnsweringModelOutput(ModelOutput):
    start_logits: torch.Tensor | None = None  # (B, T)
    end_logits: torch.Tensor | None = None  # (B, T)


@dataclass
class MultipleChoiceModelOutput(ModelOutput):
    logits: torch.Tensor | None = None  # (B, C): one score per choice


# ---------------------------------------------------------------------------- MLM / NSP heads
class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """Dense -> act -> LayerNorm -> decoder tied to the word embeddings, plus an output bias (V,). The
    decoder weight *is* the word-embedding matrix, passed in at call time, so tying can never come undone
    (load, ``.to()``, DDP, FSDP wrapping)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(hidden), word_embeddings, self.bias)  # (..., V)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class _MLMMixin:
    """Shared MLM logic: logits at every position, or only where predictions are wanted."""

    bert: BertModel
    cls: BertOnlyMLMHead | BertPreTrainingHeads

    def _mlm(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor | None,
             labels: torch.Tensor | None, masked_positions: torch.Tensor | None, output_hidden_states: bool,
             prediction_mask: torch.Tensor | None, with_cls: bool, output_attentions: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        """(MLM logits: (B, T, V), (B, P, V) at ``masked_positions``, or (M, V) at the slots
        ``prediction_mask`` marks; ``labels`` aligned with them; encoder output). The (H -> V) projection
        dominates the cost of small BERTs: with ``masked_positions`` it runs at the P positions only, and
        the encoder computes its last layer there alone (plus [CLS] for the pooler)."""
        if prediction_mask is not None and (masked_positions is None
                                            or prediction_mask.shape != masked_positions.shape):
            raise ValueError("prediction_mask needs masked_positions of the same shape (B, P)")
        if masked_positions is None:
            out = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states,
                            output_attentions=output_attentions)
            states = out.last_hidden_state  # (B, T, H)
        else:
            positions = masked_positions.long()
            if with_cls:  # [CLS] first, for the pooler (NSP)
                positions = torch.cat([positions.new_zeros(positions.shape[0], 1), positions], 1)
            out = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states, output_positions=positions,
                            output_attentions=output_attentions)
            states = out.last_hidden_state[:, 1:] if with_cls else out.last_hidden_state  # (B, P, H)
            if prediction_mask is not None:  # (M, H) and (M,): the filled slots only, row-major
                states = states[prediction_mask.bool()]
                labels = labels[prediction_mask.bool()] if labels is not None else None
        return self.cls.predictions(states, self.bert.embeddings.word_embeddings.weight), labels, out  # (..., V)


class BertForPreTraining(_MLMMixin, BertPreTrainedModel):
    """BERT with the paper's two pre-training heads: masked LM and next sentence prediction."""

    _fresh_head_prefixes = ("cls.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, masked_positions: torch.Tensor | None = None,
                output_hidden_states: bool = False, prediction_mask: torch.Tensor | None = None,
                output_attentions: bool = False,
                return_dict: bool | None = None) -> BertForPreTrainingOutput | tuple[Any, ...]:
        """labels: (B, T) token ids to predict, -100 elsewhere; or (B, P) aligned with
        ``masked_positions`` (B, P) (-100 on unused prediction slots). next_sentence_label: (B,).
        ``prediction_mask`` (B, P) bool: build MLM logits only for the True slots (the filled ones):
        ``prediction_logits`` is then (M, V), the slots in row-major order; ``labels`` stay (B, P)."""
        prediction_logits, labels, out = self._mlm(input_ids, attention_mask, token_type_ids, labels, masked_positions,
                                                   output_hidden_states, prediction_mask, with_cls=True,
                                                   output_attentions=output_attentions)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        loss = None
        if labels is not None:
            loss = losses.pretraining_loss(prediction_logits, nsp_logits, labels, next_sentence_label)
        output = BertForPreTrainingOutput(loss=loss, prediction_logits=prediction_logits,
                                          seq_relationship_logits=nsp_logits, hidden_states=out.hidden_states,
                                          attentions=out.attentions)
        return output if return_dict is not False else output.to_tuple()


class BertForMaskedLM(_MLMMixin, BertPreTrainedModel):
    """BERT with the masked-LM head only (no pooler, no NSP): fill-mask, MLM-only pre-training."""

    _fresh_head_prefixes = ("cls.",)
    _carries_pooler = True  # a loaded checkpoint's pooler, unused here, is saved again (`load_pretrained`)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None, output_hidden_states: bool = False,
                prediction_mask: torch.Tensor | None = None, output_attentions: bool = False,
                return_dict: bool | None = None) -> MaskedLMOutput | tuple[Any, ...]:
        """As `BertForPreTraining.forward`, without NSP."""
        logits, labels, out = self._mlm(input_ids, attention_mask, token_type_ids, labels, masked_positions,
                                        output_hidden_states, prediction_mask, with_cls=False,
                                        output_attentions=output_attentions)
        loss = losses.masked_lm_loss(logits, labels) if labels is not None else None
        output = MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)
        return output if return_dict is not False else output.to_tuple()


# ---------------------------------------------------------------------------- fine-tuning heads
def _pooled(bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
            token_type_ids: torch.Tensor | None, output_hidden_states: bool,
            output_attentions: bool = False) -> BertModelOutput:
    """The encoder for a head that reads only the pooled [CLS] output: the last layer is asked for at
    [CLS] alone (``last_hidden_state`` is then (B, 1, H)). A causal encoder's [CLS] has seen only
    itself: it is pooled at its last real token instead (the final [SEP]), wherever the padding is."""
    B, T = input_ids.shape
    cls = torch.zeros(B, 1, dtype=torch.long, device=input_ids.device)  # (B, 1)
    if bert.config.is_decoder:
        if attention_mask is None:
            cls += T - 1
        else:
            positions = torch.arange(1, T + 1, device=input_ids.device)
            cls += ((attention_mask > 0) * positions).amax(1, keepdim=True).sub(1).clamp_min(0)
    return bert(input_ids, attention_mask, token_type_ids, output_hidden_states, output_positions=cls,
                output_attentions=output_attentions)


class _DropoutLinear(BertPreTrainedModel):
    """An encoder with Dropout + Linear(H, ``outputs``) on top (the classifier heads' shared parts)."""

    _fresh_head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig, outputs: int, add_pooling_layer: bool):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=add_pooling_layer)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, outputs)
        self.init_weights()


class BertForSequenceClassification(_DropoutLinear):
    """Dropout + Linear on the pooled [CLS] output: classification, or regression with num_labels=1."""

    def __init__(self, config: BertConfig):
        super().__init__(config, config.num_labels, add_pooling_layer=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                return_dict: bool | None = None) -> SequenceClassifierOutput | tuple[Any, ...]:
        """labels: (B,) class ids, (B,) floats for regression, or (B, C) multi-hot for multi-label."""
        out = _pooled(self.bert, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, C)
        loss = None
        if labels is not None:
            loss = losses.sequence_classification_loss(logits, labels, self.config.problem_type)
        output = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                          attentions=out.attentions)
        return output if return_dict is not False else output.to_tuple()


class BertForTokenClassification(_DropoutLinear):
    """Dropout + Linear on every token's final hidden state (tagging, e.g. NER), or on the tagged ones."""

    def __init__(self, config: BertConfig):
        super().__init__(config, config.num_labels, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                return_dict: bool | None = None, positions: torch.Tensor | None = None
                ) -> TokenClassifierOutput | tuple[Any, ...]:
        """labels: (B, T) tag ids, -100 on sub-word continuations, specials and padding.

        ``positions`` (B, K): logits at these tokens only, (B, K, C), and ``labels`` (B, K) aligned with
        them (`tagged_positions` makes both): the head and, with a faster encoder (`bertforge.fast`), the
        last layer's queries and feed-forward run at one token a word instead of every token."""
        out = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states, output_positions=positions,
                        output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, C); (B, K, C) at positions
        loss = losses.token_classification_loss(logits, labels) if labels is not None else None
        output = TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                       attentions=out.attentions)
        return output if return_dict is not False else output.to_tuple()


def tagged_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) labels, -100 where untagged -> ((B, K) the tagged positions of each row in order, padded with
    untagged ones; (B, K) their labels, -100 on the padding), K the most tags a row has (at least 1)."""
    tagged = labels != losses.IGNORE_INDEX
    k = max(1, int(tagged.sum(1).max()))
    positions = torch.sort(tagged.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :k]  # (B, K)
    return positions, labels.gather(1, positions)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Linear(H, 2) on every token: a start and an end score for extractive span QA (SQuAD)."""

    _fresh_head_prefixes = ("qa_outputs.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False,
                return_dict: bool | None = None) -> QuestionAnsweringModelOutput | tuple[Any, ...]:
        """start_positions / end_positions: (B,) token indices; 0 ([CLS]) for no answer. The logits are
        transformers'; the loss leaves padding out (`losses.span_loss`)."""
        out = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states,
                        output_attentions=output_attentions)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(-1)  # 2 x (B, T)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = losses.span_loss(start_logits, end_logits, start_positions, end_positions,
                                    attention_mask=attention_mask)
        output = QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits.contiguous(),
                                              end_logits=end_logits.contiguous(), hidden_states=out.hidden_states,
                                              attentions=out.attentions)
        return output if return_dict is not False else output.to_tuple()


class BertForMultipleChoice(_DropoutLinear):
    """One score per (context, choice) sequence from the pooled output; softmax over the choices."""

    def __init__(self, config: BertConfig):
        super().__init__(config, 1, add_pooling_layer=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                return_dict: bool | None = None) -> MultipleChoiceModelOutput | tuple[Any, ...]:
        """input_ids, attention_mask, token_type_ids: (B, C, T), C choices; labels: (B,) right choice."""
        if input_ids.dim() != 3:
            raise ValueError(f"input_ids must be (batch, choices, length), got {tuple(input_ids.shape)}")
        B, C, T = input_ids.shape

        def flat(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.reshape(B * C, T)

        out = _pooled(self.bert, flat(input_ids), flat(attention_mask), flat(token_type_ids), output_hidden_states,
                      output_attentions)
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # (B, C)
        loss = losses.multiple_choice_loss(logits, labels) if labels is not None else None
        output = MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                           attentions=out.attentions)
        return output if return_dict is not False else output.to_tuple()


# ---------------------------------------------------------------------------- the feature-based approach
FEATURE_KEY = "bertforge_features"
"""The config.json entry of a BiLSTM head's settings: ``features`` (a `FEATURE_CHOICES` name or layer
indexes), ``freeze`` (the encoder's weights fixed: the feature-based approach) and ``bilstm_size``."""

FEATURE_CHOICES: dict[str, tuple[tuple[int, ...] | None, str]] = {
    "embeddings": ((0,), "concat"),
    "second-to-last": ((-2,), "concat"),
    "last": ((-1,), "concat"),
    "sum-last-4": ((-1, -2, -3, -4), "sum"),
    "concat-last-4": ((-1, -2, -3, -4), "concat"),
    "weighted-sum-last-4": ((-1, -2, -3, -4), "weighted"),
    "weighted-sum-all": (None, "weighted"),
}
"""The paper's Table 7 features: name -> (indexes into ``hidden_states``: 0 the embedding output, -1 the
last layer, None every Transformer layer 1..L; how they combine, ``weighted`` by `ScalarMix`)."""


def check_features(spec: str) -> None:
    """An error for a ``--features`` value that is neither a `FEATURE_CHOICES` name nor layer indexes."""
    if spec in FEATURE_CHOICES:
        return
    try:
        [int(x) for x in spec.split(",")]
    except ValueError:
        raise ValueError(f"{option('features', spec)}: choose one of {', '.join(FEATURE_CHOICES)}, or layer indexes "
                         "such as -1,-2 (concatenated; 0 is the embedding output, -1 the last layer)") from None


def resolve_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """Layer indexes as given -> positions in ``hidden_states`` (0..L)."""
    if not layers:
        raise ValueError("no layers chosen")
    out: list[int] = []
    for given in layers:
        if not -(num_layers + 1) <= given <= num_layers:
            raise ValueError(f"layer {given} does not exist: the model has {num_layers} layers (1..{num_layers}, "
                             f"0 = the embedding output; or -1..-{num_layers + 1} counted from the last)")
        index = given % (num_layers + 1)
        if index in out:
            raise ValueError(f"layers {list(layers)}: hidden state {index} is chosen twice")
        out.append(index)
    return out


def feature_layers(spec: str, num_layers: int) -> tuple[list[int], str]:
    """``--features`` -> (positions in ``hidden_states``, combine: concat, sum or weighted). Layer
    indexes (``"-1,-2"``) are concatenated in the order given."""
    check_features(spec)
    if spec in FEATURE_CHOICES:
        layers, combine = FEATURE_CHOICES[spec]
    else:
        layers, combine = tuple(int(x) for x in spec.split(",")), "concat"
    if layers is None:
        layers = tuple(range(1, num_layers + 1))
    try:
        return resolve_layers(layers, num_layers), combine
    except ValueError as e:
        raise ValueError(f"{option('features', spec)}: {e}") from None


class ScalarMix(nn.Module):
    """gamma * sum_k softmax(w)_k h_k over the chosen layers (ELMo's scalar mix; the paper's weighted
    sums): the weights start equal and are learned with the head."""

    def __init__(self, n: int):
        super().__init__()
        self.scalar_weights = nn.Parameter(torch.zeros(n))
        self.gamma = nn.Parameter(torch.ones(1))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """(B, n, T, H) -> (B, T, H)."""
        weights = torch.softmax(self.scalar_weights, 0).to(states.dtype)
        return self.gamma.to(states.dtype) * torch.einsum("n,bnth->bth", weights, states)


class _FeatureBiLSTM:
    """The chosen layers' hidden states, combined, through a randomly initialised two-layer BiLSTM
    (``bilstm_size`` S per direction, the head's dropout between its layers) before the task's output
    layer ``output_layer``, rebuilt as Linear(2S, outputs). With ``freeze`` the encoder's weights are
    fixed and it always runs in eval mode, so training can run on features computed once (``features=``)."""

    bert: BertModel
    config: BertConfig
    output_layer = "classifier"
    _fresh_head_prefixes = ("classifier.", "mix.", "lstm.")

    def __init__(self, config: BertConfig):
        super().__init__(config)  # the task head's, next in the subclass's MRO
        settings = config.extra.get(FEATURE_KEY)
        if not isinstance(settings, dict) or "features" not in settings:
            raise ValueError(f"{type(self).__name__} needs config.extra[{FEATURE_KEY!r}] with its features")
        self.feature_layers, self.combine = feature_layers(str(settings["features"]), config.num_hidden_layers)
        self.frozen = bool(settings.get("freeze", True))
        size = int(settings.get("bilstm_size", 768))
        if size < 1:
            raise ValueError(f"bilstm_size must be >= 1, got {size}")
        n, H = len(self.feature_layers), config.hidden_size
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.mix = ScalarMix(n) if self.combine == "weighted" else None
        self.lstm = nn.LSTM(H * n if self.combine == "concat" else H, size, num_layers=2, bidirectional=True,
                            batch_first=True, dropout=p)
        output = nn.Linear(2 * size, getattr(self, self.output_layer).out_features)
        self._init_module(output)
        setattr(self, self.output_layer, output)
        if self.frozen:
            self.bert.requires_grad_(False)

    def train(self, mode: bool = True):
        nn.Module.train(self, mode)
        if self.frozen:
            self.bert.eval()
        return self

    def encode_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, n, T, H): the hidden states of the chosen layers (no gradient when frozen)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            out = self.bert(input_ids, attention_mask, token_type_ids, True)
        return torch.stack([out.hidden_states[i] for i in self.feature_layers], 1)

    def _bilstm(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                token_type_ids: torch.Tensor | None, features: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(BiLSTM outputs (B, T, 2S), last layer's final states of both directions (B, 2S))."""
        if features is None:
            features = self.encode_features(input_ids, attention_mask, token_type_ids)
        if self.combine == "weighted":
            x = self.mix(features)
        elif self.combine == "sum":
            x = features.sum(1)
        else:
            x = features.permute(0, 2, 1, 3).flatten(2)  # (B, T, n * H), the layers side by side
        B, T = x.shape[:2]
        lengths = (attention_mask.sum(1) if attention_mask is not None
                   else torch.full((B,), T, dtype=torch.long, device=x.device))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu().clamp(min=1), batch_first=True,
                                                   enforce_sorted=False)
        out, (h, _) = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
        return out, torch.cat([h[-2], h[-1]], -1)


class BertFeatureBiLSTMForTokenClassification(_FeatureBiLSTM, BertForTokenClassification):
    """Tagging from a BiLSTM over the encoder's chosen layers (the paper's Table 7 setup)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, features: torch.Tensor | None = None) -> TokenClassifierOutput:
        """As `BertForTokenClassification.forward`; ``features`` (B, n, T, H): the chosen layers computed
        beforehand (`encode_features`), so the encoder does not run."""
        out, _ = self._bilstm(input_ids, attention_mask, token_type_ids, features)
        logits = self.classifier(self.dropout(out))  # (B, T, C)
        loss = losses.token_classification_loss(logits, labels) if labels is not None else None
        return TokenClassifierOutput(loss=loss, logits=logits)


class BertFeatureBiLSTMForSequenceClassification(_FeatureBiLSTM, BertForSequenceClassification):
    """Classification / regression from a BiLSTM over the encoder's chosen layers: the output layer
    reads the final states of both directions."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, features: torch.Tensor | None = None) -> SequenceClassifierOutput:
        """As `BertForSequenceClassification.forward`; ``features`` as the token classifier's."""
        _, final = self._bilstm(input_ids, attention_mask, token_type_ids, features)
        logits = self.classifier(self.dropout(final))  # (B, C)
        loss = None
        if labels is not None:
            loss = losses.sequence_classification_loss(logits, labels, self.config.problem_type)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class BertFeatureBiLSTMForQuestionAnswering(_FeatureBiLSTM, BertForQuestionAnswering):
    """Span QA from a BiLSTM over the encoder's chosen layers: Linear(2S, 2) on every token's BiLSTM
    output gives its start and end scores (the paper's "+ BiLSTM" row for SQuAD)."""

    output_layer = "qa_outputs"
    _fresh_head_prefixes = ("qa_outputs.", "mix.", "lstm.")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None, output_hidden_states: bool = False,
                features: torch.Tensor | None = None) -> QuestionAnsweringModelOutput:
        """As `BertForQuestionAnswering.forward`; ``features`` as the token classifier's."""
        out, _ = self._bilstm(input_ids, attention_mask, token_type_ids, features)
        start_logits, end_logits = self.qa_outputs(out).unbind(-1)  # 2 x (B, T)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = losses.span_loss(start_logits, end_logits, start_positions, end_positions,
                                    attention_mask=attention_mask)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits.contiguous(),
                                            end_logits=end_logits.contiguous())


FEATURE_MODEL_CLASSES: dict[type, type] = {
    BertForTokenClassification: BertFeatureBiLSTMForTokenClassification,
    BertForSequenceClassification: BertFeatureBiLSTMForSequenceClassification,
    BertForQuestionAnswering: BertFeatureBiLSTMForQuestionAnswering,
}
"""A task head -> its BiLSTM variant: the task families that take ``--bilstm``, and but for SQuAD
``--features`` (whose cache would hold every training window's hidden states)."""


# ---------------------------------------------------------------------------- the registry of head classes
MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    c.__name__: c
    for c in (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
              BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice,
              BertFeatureBiLSTMForTokenClassification, BertFeatureBiLSTMForSequenceClassification,
              BertFeatureBiLSTMForQuestionAnswering)
}


def infer_model_class(folder: str | Path) -> type[BertPreTrainedModel]:
    """The class a folder was saved from: ``architectures`` in config.json, else from its keys."""
    config = load_config(folder)
    for name in config.architectures or []:
        if name in MODEL_CLASSES:
            return MODEL_CLASSES[name]
    keys = set(read_state_dict(folder))
    if any("seq_relationship" in k for k in keys):
        return BertForPreTraining
    if any(k.startswith("cls.predictions") for k in keys):
        return BertForMaskedLM
    if any(k.startswith("qa_outputs") for k in keys):
        return BertForQuestionAnswering
    if "classifier.weight" in keys:
        raise CheckpointError(f"{folder}: has a classifier but config.json names no architecture; "
                              "pass the model class explicitly")
    return BertModel
