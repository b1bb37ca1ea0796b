"""The BERT encoder as the paper describes it: embeddings, self-attention, post-LN Transformer
blocks, pooler, `BertModel`. This is the reference: it computes every slot of the padded (B, T)
batch and runs the same code on every device, precision and wrapper. The speed paths (unpadding,
cheaper dropout masks, cached weights, ...) are applied to a built model from outside by
`bertforge.fast.speed_up`, whose tests pin it to this file.

Shape letters used in comments:
    B batch, T sequence length, H hidden size, A attention heads, D head size (H / A),
    I intermediate size, K chosen positions per sequence, V vocab size.

Module and parameter names are transformers' (``encoder.layer.N.attention.self.query``, ...): the
state dict *is* the checkpoint format, so weights move between the two libraries unconverted.

Padding positions: every hidden state `BertModel` returns is zero there. A padding slot holds no
token; a value computed there would depend on what fills the slot (transformers returns such
values). Real positions never see padding: padding keys are masked in attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.config import BertConfig

__all__ = ["BertModel", "BertModelOutput", "BertPreTrainedModel", "activation", "attention_probabilities",
           "check_inputs", "encoder_parameters", "gather_positions", "make_attention_mask"]


def activation(name: str):
    """The feed-forward non-linearity named by ``hidden_act`` (transformers' names)."""
    if name in ("gelu", "gelu_python"):
        return F.gelu  # exact erf form
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")  # the TF release's approximation
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unknown hidden_act {name!r}")


def make_attention_mask(mask: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """(B, T) with 1 = real token, 0 = padding -> (B, 1, 1, T) bool, True = may be attended to.

    The one place where the mask attention obeys is made. BERT is bidirectional: every query sees
    every real key. A left-to-right model (``causal``, config ``is_decoder``) ANDs in a
    lower-triangular matrix: query t sees keys <= t only, and the mask is (B, 1, T, T)."""
    keep = mask.bool()[:, None, None, :]
    if causal:
        T = mask.shape[1]
        keep = keep & torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()
    return keep


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """hidden (B, T, H), positions (B, K) -> (B, K, H): the states at the given positions."""
    index = positions.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, index)


class BertEmbeddings(nn.Module):
    """word + learned position + token type embeddings, summed, LayerNorm, dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        # input_ids, token_type_ids: (B, T) -> (B, T, H)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,), broadcast over B
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention: softmax(Q K^T / sqrt(D)) V per head, dropout on the
    probabilities, masked keys excluded."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def split_heads(self, projection: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> the projection split into its heads, (B, A, T, D)."""
        B, T, _ = x.shape
        return projection(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # x: (B, T, H); mask: (B, 1, 1 or T, T) bool from `attention_mask`, or None (attend everywhere)
        q, k, v = (self.split_heads(proj, x) for proj in (self.query, self.key, self.value))  # (B, A, T, D) each
        p = self.dropout_p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, A, T, D)
        return y.transpose(1, 2).flatten(2)  # heads side by side: (B, T, H)

    def probabilities(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(Q K^T / sqrt(D)) with masked keys at zero, before dropout: (B, A, T, T), the weights
        `forward` averages the values with. Its fused kernel never forms them; this writes them out."""
        q, k = self.split_heads(self.query, x), self.split_heads(self.key, x)  # (B, A, T, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, A, T, T)
        if mask is not None:
            # the dtype's lowest value, not -inf: a query with no key to see (padding) stays finite, its gradient too
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return scores.softmax(-1)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(y)))  # post-LN: (B, T, H)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)  # LN(x + Dropout(Dense(Attention(x))))


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(h))  # (B, T, I)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(y)))  # (I -> H), post-LN: (B, T, H)


class BertLayer(nn.Module):
    """One post-LN block: h = LN(x + Attn(x)); out = LN(h + FFN(h))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        h = self.attention(x, mask)  # (B, T, H)
        return self.output(self.intermediate(h), h)  # (B, T, H)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
        """x: (B, T, H) embeddings -> L + 1 states (B, T, H): the embeddings, then each layer's output."""
        states = [x]
        for layer in self.layer:
            states.append(layer(states[-1], mask))
        return states


class BertPooler(nn.Module):
    """tanh(Dense(h_[CLS])): the sentence representation fed to NSP and sentence classifiers."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden[:, 0]))  # (B, T, H) -> (B, H)


class BertPreTrainedModel(nn.Module):
    """Base of every bertforge model: weight initialisation and checkpoint folders."""

    base_model_prefix = "bert"
    _fresh_head_prefixes: tuple[str, ...] = ()  # key prefixes a checkpoint may lack: the task head, made fresh

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm."""
        self.apply(self._init_module)

    def _init_module(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    @classmethod
    def from_pretrained(cls, folder, **kwargs):
        """Load a bertforge or transformers BERT checkpoint folder (`bertforge.model.checkpoint.load_pretrained`)."""
        from bertforge.model.checkpoint import load_pretrained

        return load_pretrained(cls, folder, **kwargs)

    def save_pretrained(self, folder, tokenizer=None) -> None:
        """Write ``config.json`` + ``model.safetensors`` (+ the tokenizer files) atomically."""
        from bertforge.model.checkpoint import save_pretrained

        save_pretrained(self, folder, tokenizer=tokenizer)


@dataclass
class BertModelOutput:
    """What `BertModel` returns (transformers' field names)."""

    last_hidden_state: torch.Tensor  # (B, T, H); (B, K, H) with output_positions
    pooler_output: torch.Tensor | None = None  # (B, H)
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 tensors (B, T, H): embeddings, each layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L tensors (B, A, T, T): each layer's probabilities

    def to_tuple(self) -> tuple[Any, ...]:
        """The outputs that are set, in this order (transformers'): what ``return_dict=False`` returns."""
        return tuple(v for v in (self.last_hidden_state, self.pooler_output, self.hidden_states, self.attentions)
                     if v is not None)

    def __getitem__(self, key: str | int | slice) -> Any:
        """``out["pooler_output"]``, or ``out[0]`` / ``out[1]`` as transformers' tuple outputs read."""
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]


class BertModel(BertPreTrainedModel):
    """The bare encoder: embeddings -> L post-LN blocks -> (optional) pooler."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_positions: torch.Tensor | None = None,
        output_attentions: bool = False,
        return_dict: bool | None = None,
    ) -> BertModelOutput | tuple[Any, ...]:
        """input_ids, attention_mask (1 = real token, 0 = padding), token_type_ids: (B, T).

        ``output_positions`` (B, K): ``last_hidden_state`` holds the last layer at these positions
        only, (B, K, H), and the pooler reads the first of them (put [CLS], 0, first for it). Heads
        ask here so that a faster encoder (`bertforge.fast`) may compute the last layer there alone.
        ``output_attentions``: also each layer's attention probabilities (`attention_probabilities`).
        ``return_dict=False``: the outputs as transformers' plain tuple (`BertModelOutput.to_tuple`).
        """
        check_inputs(input_ids, attention_mask, self.config.max_position_embeddings)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        causal = self.config.is_decoder
        if attention_mask is None and causal:
            attention_mask = torch.ones_like(input_ids)  # the causal mask is needed all the same
        mask = make_attention_mask(attention_mask, causal) if attention_mask is not None else None  # (B, 1, 1|T, T)
        states = self.encoder(self.embeddings(input_ids, token_type_ids), mask)  # L + 1 x (B, T, H)
        attentions = attention_probabilities(self, states[:-1], attention_mask) if output_attentions else None
        if attention_mask is not None:  # zeros at padding (module docstring)
            padding = ~attention_mask.bool().unsqueeze(-1)  # (B, T, 1)
            states = [h.masked_fill(padding, 0.0) for h in states]
        last = states[-1]  # (B, T, H)
        if output_positions is not None:
            last = gather_positions(last, output_positions)  # (B, K, H)
        out = BertModelOutput(
            last_hidden_state=last,
            pooler_output=self.pooler(last) if self.pooler is not None else None,
            hidden_states=tuple(states) if output_hidden_states else None,
            attentions=attentions,
        )
        return out if return_dict is not False else out.to_tuple()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings


def attention_probabilities(model: BertModel, inputs: Sequence[torch.Tensor],
                            attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Each layer's attention probabilities, L x (B, A, T, T), from the L states (B, T, H) entering
    the layers: what ``output_attentions`` returns. Written out from the same weights and masks, and
    only when asked, so the encoder's own attention stays the fused kernel. In training they are the
    probabilities before dropout. A padding query's row is zero, as the hidden states there are."""
    causal = model.config.is_decoder
    if attention_mask is None and causal:
        attention_mask = torch.ones(inputs[0].shape[:2], dtype=torch.long, device=inputs[0].device)
    mask = make_attention_mask(attention_mask, causal) if attention_mask is not None else None  # (B, 1, 1|T, T)
    probs = [layer.attention.self.probabilities(h, mask) for layer, h in zip(model.encoder.layer, inputs)]
    if attention_mask is not None:
        padding = ~attention_mask.bool()[:, None, :, None]  # (B, 1, T, 1): the padding queries
        probs = [p.masked_fill(padding, 0.0) for p in probs]
    return tuple(probs)


def encoder_parameters(config: BertConfig) -> int:
    """Parameters of the encoder ``config`` describes, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in BertModel(config).parameters())


def check_inputs(input_ids: torch.Tensor, mask: torch.Tensor | None, max_positions: int) -> None:
    """Shape errors with a message naming the argument, before they surface deep in a matrix product."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] > max_positions:
        raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings ({max_positions})")
    if mask is not None and mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
