"""Inference on raw text with whatever head a checkpoint has: fill-mask, classification, tagging,
extractive QA, multiple choice, or pooled sentence embeddings (any checkpoint).

    from bertforge.serving.predictor import Predictor

    p = Predictor.from_pretrained("runs/sst2/best", device="cpu", dtype=torch.bfloat16)
    p(["a gripping film", "a dull one"])        # records, by the checkpoint's head
    p.classify(["a gripping film"])             # or a head's own method: fill_mask, classify, tag, answer,
    p.embed(["a gripping film"], pooling="mean")  # choose, embed (a (N, H) array)

The head comes from config.json's ``architectures``: BertForMaskedLM / BertForPreTraining ->
fill-mask, BertForSequenceClassification -> classification (regression, multi-label),
BertForTokenClassification -> tagging, BertForQuestionAnswering -> qa, BertForMultipleChoice ->
multiple-choice, BertModel -> embeddings; ``head="embeddings"`` takes sentence embeddings of any
checkpoint. A fine-tuned checkpoint is read with the settings it was fine-tuned with (lengths,
windows, SQuAD's limits, the tag scheme; `bertforge.tasks.finetune`), which keyword arguments override.

Inputs. A string, ``"a ||| b"`` for a pair (QA: ``"question ||| context"``; multiple choice:
``"context ||| choice 1 ||| choice 2 ..."``), a list of strings, or a mapping: ``{"text",
"text_pair"}``, ``{"question", "context"}``, ``{"context", "choices"}``. Texts are used as given
(not stripped), so every character offset in a record points into the record's own text.

Records, one JSON-able dict per input, with its ``index`` and its text(s):

- fill-mask: ``masks``: per [MASK] token (written as the tokenizer's mask token, several allowed),
  its ``start`` / ``end`` characters and the ``top_k`` most likely tokens, each ``{"token", "id",
  "score", "sequence"}`` (softmax probability, best first; ``sequence``: the text with that mask
  filled in). A text without a mask, or longer than the model's positions, is an `InputError`.
- classification: ``label``, its ``score`` and ``probabilities`` of every label (softmax; for a
  multi-label head, sigmoids, and ``labels``: those above 0.5); regression: ``score``.
- tagging: ``words`` (the tokenizer's words with their characters and tags) and ``entities``,
  ``{"type", "start", "end", "text"}`` with character offsets (end exclusive).
- qa: ``answer``, ``start`` / ``end`` in the context, ``score`` (its n-best probability) and
  ``no_answer``; SQuAD 2.0 checkpoints (task squad2) may answer nothing, others always answer.
- multiple-choice: ``choice`` (index), its ``text`` and the ``probabilities`` of every choice.
- embeddings: ``embedding``: ``pooling`` "mean" (over the input's tokens, [CLS] and [SEP]
  included), "cls" (the last layer at [CLS]) or "pooler" (BERT's tanh pooler over [CLS]).

The work is the fine-tuning families' own (`bertforge.tasks`): windows for long inputs and their
averaging or max-context rules, first-WordPiece tags and conlleval's entity spans, SQuAD's n-best
post-processing, and the features module's windows and pooling for embeddings. Inputs run in
batches of similar length (sorted, then put back in order); the model skips padding in its dense
layers. ``dtype=torch.bfloat16`` runs under bf16 autocast (CPU or CUDA).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings
from collections.abc import Container, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.train.distributed import resolve_device
from bertforge.train.precision import native_bf16
from bertforge.fast import prepare

__all__ = ["Predictor", "InputError", "HEADS", "POOLINGS", "SEPARATOR", "parse_input", "checkpoint_head",
           "format_record", "format_records"]

HEADS = ("fill-mask", "classification", "tagging", "qa", "multiple-choice", "embeddings")
POOLINGS = ("mean", "cls", "pooler")
SEPARATOR = " ||| "
"""Between the texts of one input line (the TF release's extract_features convention)."""

_ARCHITECTURE_HEADS = {"BertForMaskedLM": "fill-mask", "BertForPreTraining": "fill-mask",
                       "BertForSequenceClassification": "classification", "BertForTokenClassification": "tagging",
                       "BertForQuestionAnswering": "qa", "BertForMultipleChoice": "multiple-choice",
                       "BertModel": "embeddings"}
FINE_TUNED_HEADS = ("classification", "tagging", "qa", "multiple-choice")
"""Heads read through their fine-tuning family (and able to predict on the family's files)."""
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}
_INPUT_KEYS = (("text", "text_pair"), ("question", "context"), ("context", "choices"))


class InputError(ValueError):
    """An input the model cannot take (no [MASK] for fill-mask, a QA input without a context, ...)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message if index is None else f"input {index}: {message}")
        self.index = index


# ---------------------------------------------------------------------------- inputs
def parse_input(x: Any, index: int | None = None) -> tuple[str, ...]:
    """One input as its texts: ``"a ||| b"`` -> ("a", "b"); a list of strings; or a mapping with the
    keys of a pair (``text`` / ``text_pair``), a question (``question`` / ``context``) or a choice
    (``context`` / ``choices``)."""
    if isinstance(x, str):
        return tuple(x.split(SEPARATOR))
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, str) for t in x):
        return tuple(x)
    if isinstance(x, Mapping):
        for first, second in _INPUT_KEYS:
            if first not in x or not set(x) <= {first, second} or not isinstance(x[first], str):
                continue
            rest = x.get(second)
            if second == "choices":
                if isinstance(rest, list) and rest and all(isinstance(t, str) for t in rest):
                    return (x[first], *rest)
            elif rest is None or isinstance(rest, str):
                return (x[first],) if rest is None else (x[first], rest)
    raise InputError(f"expected a string ('a{SEPARATOR}b' for a pair), a list of strings or an object with "
                     f"{', '.join(' + '.join(k) for k in _INPUT_KEYS)}; got {json.dumps(x, default=str)[:80]}", index)


def checkpoint_head(path: str | Path) -> str:
    """The head a checkpoint folder has, from its config.json's architectures (else its weights)."""
    from bertforge.model.heads import infer_model_class

    return _ARCHITECTURE_HEADS[infer_model_class(path).__name__]


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """The autocast dtype asked for (None: float32)."""
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(_DTYPES)}")
        dtype = _DTYPES[dtype]
    if dtype is None or dtype == torch.float32:
        return None
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    return dtype


def precision(device: torch.device | str, dtype: torch.dtype | str | None) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` on ``device`` ("auto": CUDA if present), or nothing for float32."""
    amp = _dtype(dtype)
    kind = resolve_device(device).type
    if amp == torch.float16 and kind != "cuda":
        raise ValueError("float16 needs a CUDA device; on CPU use bfloat16")
    if amp == torch.bfloat16 and not native_bf16(torch.device(kind)):
        warnings.warn(f"bfloat16 on a {kind} without native bf16 (a CPU without AVX-512 BF16 or AMX, a GPU before "
                      "Ampere) is emulated, far slower than float32; use float32 here", stacklevel=2)
    return torch.autocast(kind, dtype=amp) if amp is not None else contextlib.nullcontext()


# ---------------------------------------------------------------------------- the predictor
class Predictor:
    """A checkpoint's model, tokenizer and settings, ready for raw text (module docstring).

    Not for concurrent calls from several threads: serialise them (`bertforge.serving.http` holds a lock).
    Its model is prepared for fast inference with frozen weights (`bertforge.fast.prepare`): do not train it."""

    def __init__(self, model: nn.Module, tokenizer: Any, head: str, *, device: torch.device,
                 dtype: torch.dtype | str | None = None, settings: Any = None, family: Any = None,
                 batch_size: int = 32, max_seq_length: int = 0, stride: int = 0, name: str = ""):
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; choose one of: {', '.join(HEADS)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = prepare(model.eval(), freeze=True)
        self.tokenizer = tokenizer
        self.head = head
        self.device = device
        self.autocast = _dtype(dtype)
        precision(device, self.autocast)  # fp16 on CPU fails here, not at the first call
        self.settings = settings
        """The fine-tuning settings (a `FinetuneConfig`) of a fine-tuned head; None otherwise."""
        self.family = family
        self.batch_size = batch_size
        positions = model.config.max_position_embeddings
        self.max_seq_length = min(max_seq_length or positions, positions)
        """Tokens per forward pass (fill-mask, embeddings): longer texts are an error for fill-mask,
        windows for embeddings."""
        self.stride = stride
        self.name = name

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "auto", dtype: torch.dtype | str | None = None, *,
                        head: str | None = None, batch_size: int = 32, **settings: Any) -> Predictor:
        """Load a checkpoint folder for inference. ``head``: None (the checkpoint's) or "embeddings".
        ``settings``: `bertforge.tasks.finetune.INPUT_SETTINGS` (task, max_seq_length, stride, SQuAD's limits,
        tag_scheme, ...) overriding those the checkpoint was fine-tuned with."""
        from bertforge.model.heads import infer_model_class
        from bertforge.model.config import BertConfig
        from bertforge.train.distributed import setup
        from bertforge.tasks.finetune import INPUT_SETTINGS, SETTINGS_KEY, _load_finetuned
        from bertforge.text.tokenizer import BertTokenizer

        model_class = infer_model_class(path)
        own = _ARCHITECTURE_HEADS[model_class.__name__]
        if head not in (None, own, "embeddings"):
            raise ValueError(f"{path}: a {model_class.__name__} has no {head} head (it has {own}; any checkpoint "
                             "gives embeddings)")
        head = head or own
        unknown = sorted(set(settings) - set(INPUT_SETTINGS))
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(unknown)} (known: {', '.join(INPUT_SETTINGS)})")
        settings = {k: v for k, v in settings.items() if v is not None}
        device = settings.pop("device", None) or device
        batch_size = settings.pop("eval_batch_size", None) or batch_size
        if head in FINE_TUNED_HEADS:
            if head == "qa" and not settings.get("task") and not BertConfig.load(path).extra.get(SETTINGS_KEY):
                settings["task"] = "squad"  # fine-tuned elsewhere: always answer (task squad2 allows no answer)
            family, model, tok, cfg, dev = _load_finetuned(path, {**settings, "device": device})
            positions = model.config.max_position_embeddings
            cfg = dataclasses.replace(cfg, max_seq_length=min(cfg.max_seq_length, positions),
                                      eval_batch_size=batch_size)
            return cls(model, tok, head, device=dev, dtype=dtype, settings=cfg, family=family, batch_size=batch_size,
                       max_seq_length=cfg.max_seq_length, stride=cfg.stride, name=str(path))
        dev = setup(device).device
        model = model_class.from_pretrained(path).to(dev)
        return cls(model, BertTokenizer.from_pretrained(path), head, device=dev, dtype=dtype, batch_size=batch_size,
                   max_seq_length=settings.get("max_seq_length", 0), stride=settings.get("stride", 0), name=str(path))

    # -------------------------------------------------------------------- helpers
    @property
    def labels(self) -> list[str] | None:
        """Class (tag) names in id order, for the heads that have them."""
        if self.head not in ("classification", "tagging") or self.model.config.num_labels == 1:
            return None
        id2label = self.model.config.id2label or {}
        return [id2label.get(i, str(i)) for i in range(self.model.config.num_labels)]

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        with torch.inference_mode(), precision(self.device, self.autocast):
            yield

    def _texts(self, inputs: Sequence[Any], counts: Container[int], what: str) -> list[tuple[str, ...]]:
        """Every input parsed (`parse_input`), with a number of texts in ``counts``."""
        if isinstance(inputs, (str, Mapping)):
            raise TypeError("inputs must be a list of inputs (a single string or mapping: wrap it in a list)")
        out = []
        for i, x in enumerate(inputs):
            texts = parse_input(x, i)
            if len(texts) not in counts:
                raise InputError(f"{what}, got {len(texts)} text{'s' * (len(texts) != 1)}", i)
            out.append(texts)
        return out

    def _pairs(self, inputs: Sequence[Any]) -> list[tuple[str, str | None]]:
        return [(t[0], t[1] if len(t) > 1 else None)
                for t in self._texts(inputs, (1, 2), f"expected a text or a pair (a{SEPARATOR}b)")]

    def _need(self, *heads: str) -> None:
        if self.head not in heads:
            raise ValueError(f"{self.name or 'this model'} has a {self.head} head, not {' / '.join(heads)}")

    @staticmethod
    def _record(i: int, a: str, b: str | None, **fields: Any) -> dict[str, Any]:
        return {"index": i, "text": a, **({"text_pair": b} if b is not None else {}), **fields}

    # -------------------------------------------------------------------- heads
    def __call__(self, inputs: Sequence[Any], *, head: str | None = None, top_k: int = 5,
                 pooling: str = "mean") -> list[dict[str, Any]]:
        """Records of the model's head (or of ``head="embeddings"``) for ``inputs``."""
        head = head or self.head
        if head == "embeddings":
            vectors = self.embed(inputs, pooling=pooling)
            return [self._record(i, a, b, embedding=v.tolist())
                    for i, ((a, b), v) in enumerate(zip(self._pairs(inputs), vectors))]
        self._need(head)
        if head == "fill-mask":
            return self.fill_mask(inputs, top_k=top_k)
        run = {"classification": self.classify, "tagging": self.tag, "qa": self.answer,
               "multiple-choice": self.choose}[head]
        return run(inputs)

    def fill_mask(self, inputs: Sequence[Any], top_k: int = 5) -> list[dict[str, Any]]:
        """The ``top_k`` most likely tokens at every [MASK] of each input (module docstring)."""
        from bertforge.model.heads import MaskedLMOutput
        from bertforge.tasks.base import predict_items
        from bertforge.tasks.classification import Features

        self._need("fill-mask")
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        tok = self.tokenizer
        mask_id, vocab = tok.mask_token_id, tok.vocab_size
        items = self._pairs(inputs)
        encoded = self._tokenize(items)
        for i, (ids, _, _) in enumerate(encoded):
            if mask_id not in ids:
                raise InputError(f"no {tok.mask_token} in the text: fill-mask predicts the tokens written as "
                                 f"{tok.mask_token}", i)
            if len(ids) > self.max_seq_length:
                raise InputError(f"{len(ids)} tokens, more than the model's {self.max_seq_length}", i)
        k = min(top_k, vocab)

        def run(m: nn.Module, batch: dict[str, torch.Tensor], idx: Sequence[int]) -> list[tuple[np.ndarray, ...]]:
            ids = batch["input_ids"]
            is_mask = ids == mask_id  # (B, T)
            counts = is_mask.sum(1)
            P = int(counts.max())
            positions = torch.argsort((~is_mask).to(torch.int8), dim=1, stable=True)[:, :P]  # masks first, in order
            slots = torch.arange(P, device=ids.device)[None, :] < counts[:, None]  # (B, P): the real ones
            out = m(ids, batch["attention_mask"], batch["token_type_ids"], masked_positions=positions,
                    prediction_mask=slots)
            logits = out.logits if isinstance(out, MaskedLMOutput) else out.prediction_logits  # (M, V)
            probs, top = logits.float().softmax(-1).topk(k, dim=-1)  # (M, k), best first
            split = np.cumsum(counts.cpu().numpy())[:-1]
            return list(zip(np.split(top.cpu().numpy(), split), np.split(probs.cpu().numpy(), split)))

        features = Features([np.asarray(ids, dtype=np.int64) for ids, _, _ in encoded],
                            np.array([types.count(0) for _, types, _ in encoded], dtype=np.int64),
                            np.arange(len(items)), len(items))
        with self._running():
            found = predict_items(self.model, features, self.batch_size, self.device, run)
        records = []
        for i, ((a, b), (ids, types, offsets), (top, probs)) in enumerate(zip(items, encoded, found)):
            masks = []
            for slot, p in enumerate(q for q, t in enumerate(ids) if t == mask_id):
                text = a if types[p] == 0 else b
                start, end = offsets[p]
                preds = []
                for t, s in zip(top[slot].tolist(), probs[slot].tolist()):
                    token = tok.convert_ids_to_tokens(t)
                    preds.append({"token": token, "id": t, "score": s,
                                  "sequence": text[:start] + token.removeprefix("##") + text[end:]})
                masks.append({"start": start, "end": end, **({"segment": types[p]} if b is not None else {}),
                              "predictions": preds})
            records.append(self._record(i, a, b, masks=masks))
        return records

    def _tokenize(self, items: Sequence[tuple[str, str | None]]) -> list[tuple[list[int], list[int], list]]:
        """(ids, token types, character offsets in its own text) of ``[CLS] a [SEP] (b [SEP])`` per item."""
        out: list[Any] = [None] * len(items)
        singles = [i for i, (_, b) in enumerate(items) if b is None]
        pairs = [i for i, (_, b) in enumerate(items) if b is not None]
        for where, texts in ((singles, ([items[i][0] for i in singles],)),
                             (pairs, ([items[i][0] for i in pairs], [items[i][1] for i in pairs]))):
            if where:
                enc = self.tokenizer(*texts, return_offsets_mapping=True)
                for i, ids, types, offs in zip(where, enc["input_ids"], enc["token_type_ids"], enc["offset_mapping"]):
                    out[i] = (ids, types, offs)
        return out

    def classify(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """Label and probabilities (regression: the score) of each text or pair; a long input is cut
        into windows whose logits are averaged (`bertforge.tasks.classification`)."""
        from bertforge.tasks.classification import Example, encode_examples, predict_logits

        self._need("classification")
        items = self._pairs(inputs)
        cfg = self.settings
        features = encode_examples([Example(a, b, None, i + 1) for i, (a, b) in enumerate(items)], self.tokenizer,
                                   cfg.max_seq_length, cfg.stride)
        with self._running():
            logits = predict_logits(self.model, features, self.batch_size, self.device)  # (N, C)
        config = self.model.config
        records = []
        if config.num_labels == 1 or config.problem_type == "regression":
            return [self._record(i, a, b, score=float(row[0])) for i, ((a, b), row) in enumerate(zip(items, logits))]
        names = self.labels or []
        multi = config.problem_type == "multi_label_classification"
        probs = 1 / (1 + np.exp(-logits)) if multi else np.exp(logits - logits.max(1, keepdims=True))
        if not multi:
            probs /= probs.sum(1, keepdims=True)
        for i, ((a, b), p) in enumerate(zip(items, probs)):
            best = int(p.argmax())
            fields: dict[str, Any] = {"label": names[best], "score": float(p[best])}
            if multi:
                fields["labels"] = [names[c] for c in np.flatnonzero(p > 0.5)]
            records.append(self._record(i, a, b, **fields, probabilities=dict(zip(names, p.tolist()))))
        return records

    def tag(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """A tag per word and the entities they make, with character offsets (`bertforge.tasks.tagging`:
        first-WordPiece tags, max-context windows, conlleval's chunks). Words are the tokenizer's
        (whitespace and punctuation split), as in CoNLL files."""
        from bertforge.metrics import entity_spans
        from bertforge.tasks.squad import _through_marks
        from bertforge.tasks.tagging import Sentence, _by_sentence, _tag_names, encode_sentences, predict_tags, \
            resolve_scheme

        self._need("tagging")
        texts = [t[0] for t in self._texts(inputs, (1,), "tagging takes one text")]
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, return_word_ids=True)
        spans: list[list[tuple[int, int]]] = []  # per text: each word's characters
        for text, offs, words in zip(texts, enc["offset_mapping"], enc["word_ids"]):
            offs = _through_marks(text, np.array(offs, dtype=np.int64).reshape(-1, 2))
            found: dict[int, list[int]] = {}
            for (s, e), w in zip(offs.tolist(), words):
                found.setdefault(w, [s, e])[1] = e
            spans.append([(s, e) for s, e in found.values()])
        sentences = [Sentence([text[s:e] for s, e in words], None, [i + 1] * len(words))
                     for i, (text, words) in enumerate(zip(texts, spans))]
        cfg = self.settings
        features = encode_sentences(sentences, self.tokenizer, cfg.max_seq_length, cfg.stride)
        with self._running():
            ids = predict_tags(self.model, features, self.batch_size, self.device)
        labels = self.labels or []
        tags = _by_sentence(_tag_names(ids, dict(enumerate(labels))), features.word_offsets)
        scheme = resolve_scheme(cfg.tag_scheme, "tagging", labels, tags)
        records = []
        for i, (text, words, seq) in enumerate(zip(texts, spans, tags)):
            entities = [{"type": kind, "start": words[a][0], "end": words[b - 1][1],
                         "text": text[words[a][0]:words[b - 1][1]]}
                        for kind, a, b in (entity_spans(seq, scheme) if scheme else [])]
            records.append(self._record(i, text, None, entities=entities,
                                        words=[{"text": text[s:e], "start": s, "end": e, "tag": t}
                                               for (s, e), t in zip(words, seq)]))
        return records

    def answer(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """The answer span of each ``question ||| context`` (`bertforge.tasks.squad`: doc_stride windows,
        n-best over the windows, SQuAD 2.0's null score and threshold for task squad2)."""
        from bertforge.tasks.squad import VERSIONS, Question, SquadData, encode_squad

        self._need("qa")
        items = self._texts(inputs, (2,), f"expected a question and a context (question{SEPARATOR}context)")
        cfg = self.settings
        data = SquadData([c for _, c in items],
                         [Question(str(i), q, i, (), -1, False, f"input {i}") for i, (q, _) in enumerate(items)],
                         VERSIONS[cfg.task], [])
        features = encode_squad(data, self.tokenizer, cfg.max_seq_length, cfg.stride, cfg.max_query_length)
        with self._running():
            predictions = self.family._predictions(self.model, data, features, cfg, self.device)
        records = []
        for i, ((q, c), p) in enumerate(zip(items, predictions)):
            answered = p.text != ""
            record = {"index": i, "question": q, "context": c, "answer": p.text,
                      "start": p.start if answered else None, "end": p.end if answered else None,
                      "score": p.probability, "no_answer": not answered}
            if p.null_odds is not None:
                record["null_odds"] = p.null_odds
            records.append(record)
        return records

    def choose(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """The most likely choice of each ``context ||| choice 1 ||| choice 2 ...`` (every input of a call
        with the same number of choices; `bertforge.tasks.multiple_choice`)."""
        from bertforge.tasks.multiple_choice import ChoiceExample, choice_scores, encode_choices

        self._need("multiple-choice")
        items = self._texts(inputs, range(2, 1 << 31), f"expected a context and choices (context{SEPARATOR}"
                                                           f"choice{SEPARATOR}choice ...)")
        for i, t in enumerate(items):
            if len(t) != len(items[0]):
                raise InputError(f"{len(t) - 1} choices where input 0 has {len(items[0]) - 1}", i)
        features = encode_choices([ChoiceExample(t[0], t[1:], None, i + 1) for i, t in enumerate(items)],
                                  self.tokenizer, self.settings.max_seq_length)
        with self._running():
            scores = choice_scores(self.model, features, self.batch_size, self.device)  # (N, C)
        probs = np.exp(scores - scores.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        return [{"index": i, "context": t[0], "choices": list(t[1:]), "choice": int(p.argmax()),
                 "text": t[1 + int(p.argmax())], "probabilities": p.tolist()}
                for i, (t, p) in enumerate(zip(items, probs))]

    def embed(self, inputs: Sequence[Any], pooling: str = "mean") -> np.ndarray:
        """(N, H) float32 sentence embeddings of any checkpoint (module docstring). Long inputs are cut
        into windows, each token taken from the window where it has the most context
        (`bertforge.serving.features`)."""
        from bertforge.serving.features import _encode, _run, _Spec

        if pooling not in POOLINGS:
            raise InputError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        items = self._pairs(inputs)
        bert = getattr(self.model, "bert", self.model)
        report = getattr(self.model, "load_report", None)
        fresh = report.newly_initialized if report is not None else []
        if pooling == "pooler" and (bert.pooler is None or any("pooler." in k for k in fresh)):
            raise InputError(f"{self.name or 'this checkpoint'} has no trained pooler (a "
                             f"{type(self.model).__name__}); use pooling mean or cls")
        config = bert.config
        spec = _Spec([config.num_hidden_layers], "concat", "cls" if pooling == "pooler" else pooling,
                     self.max_seq_length, self.stride, self.batch_size, self.autocast, self.device, config.hidden_size)
        out = np.zeros((len(items), config.hidden_size), dtype=np.float32)

        def add(i: int, seq: np.ndarray, vector: np.ndarray) -> None:
            out[i] = vector

        _run(bert, _encode(self.tokenizer, items), spec, self.tokenizer.cls_token_id, self.tokenizer.sep_token_id,
             add, progress=False)
        if pooling == "pooler":
            with torch.inference_mode():
                cls = torch.from_numpy(out).to(self.device, next(bert.pooler.parameters()).dtype)
                out = bert.pooler(cls[:, None]).float().cpu().numpy()  # (N, 1, H) -> (N, H)
        return out


# ---------------------------------------------------------------------------- output
def _score(x: float) -> str:
    return f"{x:.4f}"


def format_record(record: Mapping[str, Any], head: str) -> str:
    """One record as readable text (one or more lines, no trailing newline)."""
    text = record.get("text", "")
    if "text_pair" in record:
        text += SEPARATOR + record["text_pair"]
    if head == "embeddings":
        return f"{text}\t" + " ".join(f"{v:.6f}" for v in record["embedding"])
    if head == "fill-mask":
        lines = [text]
        for m in record["masks"]:
            best = ", ".join(f"{p['token']} {_score(p['score'])}" for p in m["predictions"])
            lines.append(f"  [{m['start']}:{m['end']}] {best}")
        return "\n".join(lines)
    if head == "classification":
        if "label" not in record:
            return f"{_score(record['score'])}\t{text}"
        labels = ",".join(record["labels"]) if "labels" in record else record["label"]
        return f"{labels}\t{_score(record['score'])}\t{text}"
    if head == "tagging":
        found = [f"  {e['type']}\t[{e['start']}:{e['end']}]\t{e['text']}" for e in record["entities"]]
        return "\n".join([text, *(found or ["  (no entities)"])])
    if head == "qa":
        answer = ("(no answer)" if record["no_answer"]
                  else f"{record['answer']}\t[{record['start']}:{record['end']}]")
        return f"{answer}\t{_score(record['score'])}\t{record['question']}"
    if head == "multiple-choice":
        return f"{record['choice']}\t{_score(record['probabilities'][record['choice']])}\t{record['text']}"
    raise ValueError(f"unknown head {head!r}")


def format_records(records: Sequence[Mapping[str, Any]], head: str, fmt: str = "text") -> str:
    """``fmt`` "jsonl": one JSON object per line; "text": `format_record` of each."""
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r}; choose text or jsonl")
    return "".join(format_record(r, head) + "\n" for r in records)
