"""The unpadded encoder: every dense layer runs on the N real tokens of a padded (B, T) batch only;
attention alone sees the padded layout. And the last layer at chosen positions only: pre-training
reads [CLS] and the masked positions, sentence heads [CLS].

These forwards replace those of one model's `BertModel`, `BertLayer` and `BertPooler` instances
(`bertforge.fast.speed_up`) and call the model's own Linear, LayerNorm and Dropout modules, so replaced
or hooked layers apply. Their outputs equal the reference's, zeros at padding included.
"""

from __future__ import annotations

import torch

from bertforge.fast.attention import self_attention
from bertforge.fast.layout import LengthGroups, Padding, causal_mask, right_padded
from bertforge.fast.frozen import linear
from bertforge.fast.int8 import int8_feed_forward
from bertforge.fast.tracing import exporting
from bertforge.model.bert import (BertLayer, BertModel, BertModelOutput, BertPooler, attention_probabilities,
                                  check_inputs, gather_positions)

__all__ = ["layer_forward", "model_forward", "pooler_forward"]


def model_forward(self: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                  output_positions: torch.Tensor | None = None, output_attentions: bool = False,
                  return_dict: bool | None = None) -> BertModelOutput | tuple:
    """`BertModel.forward` with unpadded dense layers, the last layer computed at ``output_positions``
    only, and on CPU: riders in training (`Padding.round_rows`), length groups in inference. While
    ``torch.export`` traces it, the reference forward (one graph cannot have mask-dependent shapes).
    ``output_attentions``: the reference's `attention_probabilities`, from the states entering each
    layer laid out padded, after the layers have run their own attention."""
    if exporting():
        return type(self).forward(self, input_ids, attention_mask, token_type_ids, output_hidden_states,
                                  output_positions, output_attentions, return_dict)
    check_inputs(input_ids, attention_mask, self.config.max_position_embeddings)
    B, T = input_ids.shape
    causal = self.config.is_decoder
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    keep, padding = None, None
    if attention_mask is not None:
        keep = attention_mask.bool()
        if not bool(keep.all()):
            # A sequence with no real token: its slots see its first one, as no query may see no key (its
            # rider rows' NaN would reach every real row through their zero weights as masked keys)
            keys = keep
            empty = ~keep.any(1, keepdim=True)  # (B, 1)
            if bool(empty.any()):
                keys = keep | (empty & (torch.arange(T, device=keep.device) == 0))
            padding = Padding(indices=keep.reshape(-1).nonzero().squeeze(1), key_mask=keys[:, None, None, :],
                              batch=B, length=T)
            if input_ids.device.type == "cpu" and not self.training and not torch.is_grad_enabled():
                padding.groups = LengthGroups.build(keep, padding.indices, causal)
            else:
                if input_ids.device.type == "cpu" and torch.is_grad_enabled():
                    padding.round_rows(keep)
                if causal and not right_padded(keep):
                    padding.causal_mask = causal_mask(keep)  # (B, 1, T, T), once for every layer
    if padding is not None:
        x = self.embeddings(input_ids, token_type_ids, padding.indices)  # (N, H)
    else:
        x = self.embeddings(input_ids, token_type_ids).reshape(B * T, -1)  # (B*T, H)
    # every layer in full was asked for: the last one too, positions gathered afterwards
    select = output_positions if not output_hidden_states else None
    if select is not None and select.numel() >= x.shape[0]:
        select = None  # as many positions as rows (a left-to-right LM reads them all): the rows cost less
    layers = [x]
    last_index = len(self.encoder.layer) - 1
    for i, layer in enumerate(self.encoder.layer):
        x = layer(x, padding, (B, T), select if i == last_index else None, causal)
        layers.append(x)

    def full(h: torch.Tensor) -> torch.Tensor:  # (N, H) -> (B, T, H), zeros at padding
        return padding.pad(h, real_only=True) if padding is not None else h.view(B, T, -1)

    states = [full(h) for h in layers] if output_hidden_states else None
    attentions = None
    if output_attentions:  # the inputs of the layers: every row, even where the last layer ran at `select` only
        attentions = attention_probabilities(self, [full(h) for h in layers[:-1]], attention_mask)
    if select is not None:
        last = x.view(B, select.shape[1], -1)  # (B, K, H)
        if padding is not None:  # a chosen padding position reads zero, as in the full output
            last = last.masked_fill(~keep.gather(1, select.long()).unsqueeze(-1), 0.0)
    else:
        last = states[-1] if states is not None else full(x)
        if output_positions is not None:
            last = gather_positions(last, output_positions)
    out = BertModelOutput(
        last_hidden_state=last,
        pooler_output=self.pooler(last) if self.pooler is not None else None,
        hidden_states=tuple(states) if states is not None else None,
        attentions=attentions,
    )
    return out if return_dict is not False else out.to_tuple()


def layer_forward(self: BertLayer, x: torch.Tensor, padding: Padding | torch.Tensor | None = None,
                  shape: tuple[int, int] | None = None, select: torch.Tensor | None = None,
                  causal: bool = False) -> torch.Tensor:
    """`BertLayer.forward` on unpadded rows: x (N, H) -> (N, H); or, with ``select`` (B, K)
    positions, (B*K, H) at those positions only (only the keys and values need every position).
    ``causal``: a left-to-right model's layer. Called with the reference's arguments (no ``shape``),
    as the reference encoder does while exporting, it is the reference block.
    """
    if shape is None:
        return type(self).forward(self, x, padding)
    attention, out = self.attention.output, self.output
    if select is None:
        residual = x
        y = self_attention(self.attention.self, x, padding, shape, causal=causal)  # (N, H)
    else:
        B, T = shape
        full = padding.pad(x) if padding is not None else x.view(B, T, -1)  # (B, T, H)
        residual = gather_positions(full, select).reshape(-1, x.shape[-1])  # (B*K, H)
        y = self_attention(self.attention.self, x, padding, shape, queries=residual, positions=select,
                           causal=causal)  # (B*K, H)
    fused = int8_feed_forward(self, residual, y)  # int8 inference: the rest of the block in three passes
    if fused is not None:
        return fused
    h = attention.LayerNorm(residual + attention.dropout(linear(y, attention.dense)))  # post-LN
    f = self.intermediate.act(linear(h, self.intermediate.dense))  # (N, I)
    return out.LayerNorm(h + out.dropout(linear(f, out.dense)))  # (N, H)


def pooler_forward(self: BertPooler, hidden: torch.Tensor) -> torch.Tensor:
    """`BertPooler.forward` with its dense layer through `linear` (frozen weights cached)."""
    return self.activation(linear(hidden[:, 0], self.dense))  # (B, T, H) -> (B, H)
