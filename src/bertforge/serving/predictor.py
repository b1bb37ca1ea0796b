"""Inference on raw text with whatever head a checkpoint has: fill-mask, classification, tagging,
extractive QA, multiple choice, or pooled sentence embeddings (any checkpoint).

    p = Predictor.from_pretrained("runs/sst2/best", device="cpu", precision="bf16")
    p(["a gripping film", "a dull one"])          # records, by the checkpoint's head
    p.embed(["a gripping film"], pooling="mean")  # an (N, H) array

The head comes from config.json's ``architectures``; records (docs/finetuning.md) are one JSON-able dict
per input, whose character offsets point into the input's own texts, used as given. The work is the
fine-tuning families' own (``predict_texts``); embeddings are `bertforge.serving.features.embed`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import threading
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.fast import speed_up
from bertforge.serving.features import POOLINGS
from bertforge.train.distributed import resolve_device
from bertforge.train.precision import INFERENCE_PRECISIONS, autocast, dtype_of, int8_note, resolve_precision

__all__ = ["Predictor", "InputError", "HEADS", "POOLINGS", "SEPARATOR", "parse_input", "checkpoint_head",
           "format_record", "format_records", "TurnLock", "take_turns"]

logger = logging.getLogger("bertforge")

HEADS = ("fill-mask", "classification", "tagging", "qa", "multiple-choice", "embeddings")
SEPARATOR = " ||| "  # between the texts of one input line (the TF release's extract_features convention)

_ARCHITECTURE_HEADS = {"BertForMaskedLM": "fill-mask", "BertForPreTraining": "fill-mask",
                       "BertForSequenceClassification": "classification", "BertForTokenClassification": "tagging",
                       "BertForQuestionAnswering": "qa", "BertForMultipleChoice": "multiple-choice",
                       "BertModel": "embeddings"}
"""A head class -> the predictor's head; a subclass (a BiLSTM variant) reads as the head it extends."""
FINE_TUNED_HEADS = ("classification", "tagging", "qa", "multiple-choice")  # read through their fine-tuning family
_DTYPE_PRECISIONS = {torch.float32: "fp32", "float32": "fp32", torch.bfloat16: "bf16", "bfloat16": "bf16",
                     torch.float16: "fp16", "float16": "fp16", **{p: p for p in INFERENCE_PRECISIONS}}
_INPUT_KEYS = (("text", "text_pair"), ("question", "context"), ("context", "choices"))
_LEFT_TO_RIGHT = "a left-to-right model trained to predict the next token"


class InputError(ValueError):
    """An input the model cannot take (no [MASK] for fill-mask, a QA input without a context, ...)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message if index is None else f"input {index}: {message}")
        self.index = index


# ---------------------------------------------------------------------------- inputs
def parse_input(x: Any, index: int | None = None) -> tuple[str, ...]:
    """One input as its texts: ``"a ||| b"`` -> ("a", "b"), a list of strings or a mapping (`_INPUT_KEYS`)."""
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

    return next(_ARCHITECTURE_HEADS[c.__name__] for c in infer_model_class(path).__mro__
                if c.__name__ in _ARCHITECTURE_HEADS)


def _precision(precision: str, dtype: torch.dtype | str | None) -> str:
    """The precision asked for: ``precision``, or the one ``dtype`` names when given."""
    if dtype is None:
        return precision
    if dtype not in _DTYPE_PRECISIONS:
        raise ValueError(f"unknown dtype {dtype!r}; choose float32, bfloat16 or float16 (or a precision: "
                         f"{', '.join(INFERENCE_PRECISIONS)})")
    named = _DTYPE_PRECISIONS[dtype]
    if precision not in ("fp32", named):
        raise ValueError(f"precision {precision!r} and dtype {dtype!r} disagree; give one")
    return named


# ---------------------------------------------------------------------------- the predictor
def _one_or_many(method: Callable[..., Any]) -> Callable[..., Any]:
    """A method over a list of inputs that also takes one input (a string or a mapping) for its one result."""

    @functools.wraps(method)
    def run(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(inputs, (str, Mapping)):
            return method(self, [inputs], *args, **kwargs)[0]
        if not isinstance(inputs, Sequence) or isinstance(inputs, bytes):
            raise InputError(f"expected a text, a pair ({{'text': ..., 'text_pair': ...}}) or a list of them, got "
                             f"{type(inputs).__name__} {inputs!r:.40}")
        if not inputs:
            raise InputError("no inputs: nothing to predict")
        return method(self, inputs, *args, **kwargs)

    return run


class Predictor:
    """A checkpoint's model, tokenizer and settings, ready for raw text. Its weights are frozen
    (`bertforge.fast.speed_up`): do not train it. Calls from several threads must `take_turns`."""

    def __init__(self, model: nn.Module, tokenizer: Any, head: str, *, device: torch.device | str,
                 precision: str = "fp32", dtype: torch.dtype | str | None = None, settings: Any = None,
                 family: Any = None, batch_size: int = 32, max_seq_length: int = 0, stride: int = 0, name: str = ""):
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; choose one of: {', '.join(HEADS)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if head == "fill-mask" and model.config.is_decoder:
            raise ValueError(f"{name or 'this model'}: {_LEFT_TO_RIGHT} (config is_decoder: true), never the token at "
                             "a [MASK], so it cannot fill masks; take its embeddings instead (--embeddings, "
                             "head='embeddings') or fine-tune it")
        self.device = device = resolve_device(device)
        asked = _precision(precision, dtype)
        self.precision = resolve_precision(asked, device, inference=True)
        self.precision_note = int8_note() if asked == "int8" and self.precision != "int8" else ""
        """Why the precision that runs is not the one asked for ("" where it is)."""
        self.model = speed_up(model.eval(), freeze=True, int8=self.precision == "int8")
        self.tokenizer = tokenizer
        self.head = head
        if settings is not None and settings.eval_batch_size != batch_size:
            settings = dataclasses.replace(settings, eval_batch_size=batch_size)
        self.settings = settings
        if family is None and settings is not None:
            from bertforge.tasks import family_for

            family = family_for(settings.task)
        self.family = family
        self.batch_size = batch_size
        positions = model.config.max_position_embeddings
        self.max_seq_length = min(max_seq_length or positions, positions)
        self.stride = stride
        self.name = name
        self.stopped_early: dict[str, Any] | None = None  # a partial model's stop marker; None: finished

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "auto", dtype: torch.dtype | str | None = None, *,
                        precision: str = "fp32", head: str | None = None, batch_size: int = 32,
                        settings: Mapping[str, Any] | None = None) -> Predictor:
        """Load a checkpoint folder for inference; ``head``: None (the checkpoint's) or "embeddings";
        ``settings``: `bertforge.tasks.finetune.INPUT_SETTINGS` overriding the checkpoint's own."""
        from bertforge.model.config import BertConfig
        from bertforge.model.heads import infer_model_class
        from bertforge.tasks.finetune import SETTINGS_KEY, input_settings, load_finetuned
        from bertforge.text.tokenizer import BertTokenizer
        from bertforge.train.distributed import setup
        from bertforge.train.rundir import read_stop_marker, stopped_where

        model_class = infer_model_class(path)
        own = _ARCHITECTURE_HEADS[model_class.__name__]
        if head not in (None, own, "embeddings"):
            raise ValueError(f"{path}: a {model_class.__name__} has no {head} head (it has {own}; any checkpoint "
                             "gives embeddings)")
        head = head or own
        settings = input_settings(settings)
        device = settings.pop("device", None) or device
        batch_size = settings.pop("eval_batch_size", None) or batch_size
        if head in FINE_TUNED_HEADS:
            if head == "qa" and not settings.get("task") and not BertConfig.load(path).extra.get(SETTINGS_KEY):
                settings["task"] = "squad"  # fine-tuned elsewhere: always answer (task squad2 allows no answer)
            ft = load_finetuned(path, {**settings, "device": device})
            cfg = dataclasses.replace(ft.settings, max_seq_length=min(ft.settings.max_seq_length,
                                                                      ft.model.config.max_position_embeddings))
            predictor = cls(ft.model, ft.tokenizer, head, device=ft.device, precision=precision, dtype=dtype,
                            settings=cfg, family=ft.family, batch_size=batch_size, max_seq_length=cfg.max_seq_length,
                            stride=cfg.stride, name=str(path))
        else:
            dev = setup(device).device
            predictor = cls(model_class.from_pretrained(path).to(dev), BertTokenizer.from_pretrained(path), head,
                            device=dev, precision=precision, dtype=dtype, batch_size=batch_size,
                            max_seq_length=settings.get("max_seq_length", 0), stride=settings.get("stride", 0),
                            name=str(path))
        mark = predictor.stopped_early = read_stop_marker(path)
        if mark is not None:
            logger.warning("%s: a partial model: its training stopped early at %s (%s)", path, stopped_where(mark),
                           mark.get("reason", "unknown reason"))
        return predictor

    # -------------------------------------------------------------------- helpers
    @property
    def autocast(self) -> torch.dtype | None:
        """The autocast dtype the model runs under (None: float32)."""
        return dtype_of(self.precision)

    @property
    def labels(self) -> list[str] | None:
        """Class (tag) names in id order, for the heads that have them."""
        if self.head not in ("classification", "tagging") or self.model.config.num_labels == 1:
            return None
        id2label = self.model.config.id2label or {}
        return [id2label.get(i, str(i)) for i in range(self.model.config.num_labels)]

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        with torch.inference_mode(), autocast(self.precision, self.device):
            yield

    def _texts(self, inputs: Sequence[Any], counts: Container[int], what: str) -> list[tuple[str, ...]]:
        """Every input parsed (`parse_input`), with a number of texts in ``counts``."""
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
    @_one_or_many
    def __call__(self, inputs: Sequence[Any], *, head: str | None = None, top_k: int | None = None,
                 pooling: str | None = None) -> list[dict[str, Any]]:
        """Records of the model's head (or of ``head="embeddings"``) for ``inputs``. ``top_k``: fill-mask's
        tokens (5 unless given) or classification's labels; ``pooling``: the embeddings'; either given to a
        head that reads neither is refused rather than ignored."""
        head = head or self.head
        if pooling is not None and head != "embeddings":
            raise InputError(f"pooling applies to embeddings, not to the {head} head")
        if top_k is not None and head not in ("fill-mask", "classification"):
            raise InputError(f"top_k applies to fill-mask and classification, not to the {head} head")
        if head == "embeddings":
            vectors = self.embed(inputs, pooling=pooling or "mean")
            return [self._record(i, a, b, embedding=v.tolist())
                    for i, ((a, b), v) in enumerate(zip(self._pairs(inputs), vectors))]
        self._need(head)
        if head == "fill-mask":
            return self.fill_mask(inputs, top_k=5 if top_k is None else top_k)
        if head == "classification":
            return self.classify(inputs, top_k=top_k)
        return {"tagging": self.tag, "qa": self.answer, "multiple-choice": self.choose}[head](inputs)

    @_one_or_many
    def fill_mask(self, inputs: Sequence[Any], top_k: int = 5) -> list[dict[str, Any]]:
        """The ``top_k`` most likely tokens at every [MASK] of each input."""
        from bertforge.model.heads import MaskedLMOutput
        from bertforge.tasks.encoding import Windows, predict_items

        self._need("fill-mask")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise InputError(f"top_k must be an integer >= 1, got {top_k!r}")
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

        features = Windows([np.asarray(ids, dtype=np.int64) for ids, _, _ in encoded],
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
                best = top[slot].tolist()
                preds = [{"token": token, "id": t, "score": score,
                          "sequence": text[:start] + token.removeprefix("##") + text[end:]}
                         for token, t, score in zip(tok.convert_ids_to_tokens(best), best, probs[slot].tolist())]
                masks.append({"start": start, "end": end, **({"segment": types[p]} if b is not None else {}),
                              "predictions": preds})
            records.append(self._record(i, a, b, masks=masks))
        return records

    def _tokenize(self, items: Sequence[tuple[str, str | None]]) -> list[tuple[list[int], list[int], list]]:
        """(ids, token types, character offsets in its own text) of ``[CLS] a [SEP] (b [SEP])`` per item."""
        out: list[Any] = [None] * len(items)
        for paired in (False, True):  # the single texts in one call, the pairs in another
            where = [i for i, (_, b) in enumerate(items) if (b is not None) == paired]
            if where:
                enc = self.tokenizer(*([items[i][j] for i in where] for j in range(1 + paired)),
                                     return_offsets_mapping=True)
                for i, ids, types, offs in zip(where, enc["input_ids"], enc["token_type_ids"], enc["offset_mapping"]):
                    out[i] = (ids, types, offs)
        return out

    def _predict_texts(self, texts: list[tuple[str, ...]]) -> list[dict[str, Any]]:
        """The fine-tuned family's records for parsed inputs."""
        with self._running():
            return self.family.predict_texts(self.model, self.tokenizer, self.settings, texts, self.device)

    @_one_or_many
    def classify(self, inputs: Sequence[Any], top_k: int | None = None) -> list[dict[str, Any]]:
        """Label and probabilities (regression: the score) of each text or pair; ``top_k``: only the
        ``top_k`` most likely labels in ``probabilities``, best first (None: all, in order)."""
        self._need("classification")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
        records = self._predict_texts(self._texts(inputs, (1, 2), f"expected a text or a pair (a{SEPARATOR}b)"))
        for r in records if top_k is not None else ():
            if "probabilities" in r:
                r["probabilities"] = dict(sorted(r["probabilities"].items(), key=lambda kv: -kv[1])[:top_k])
        return records

    @_one_or_many
    def tag(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """A tag per (tokenizer's) word and the entities they make, with character offsets."""
        self._need("tagging")
        return self._predict_texts(self._texts(inputs, (1,), "tagging takes one text"))

    @_one_or_many
    def answer(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """The answer span of each ``question ||| context`` (`bertforge.tasks.squad`'s post-processing)."""
        self._need("qa")
        return self._predict_texts(self._texts(inputs, (2,), f"expected a question and a context "
                                                             f"(question{SEPARATOR}context)"))

    @_one_or_many
    def choose(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """The most likely choice of each ``context ||| choice 1 ||| ...`` (all with as many choices)."""
        self._need("multiple-choice")
        items = self._texts(inputs, range(2, 1 << 31), f"expected a context and choices (context{SEPARATOR}"
                                                           f"choice{SEPARATOR}choice ...)")
        for i, t in enumerate(items):
            if len(t) != len(items[0]):
                raise InputError(f"{len(t) - 1} choices where input 0 has {len(items[0]) - 1}", i)
        return self._predict_texts(items)

    def check_pooling(self, pooling: str) -> None:
        """An `InputError` if this model's embeddings cannot pool as ``pooling`` says."""
        from bertforge.serving.features import FeatureSettings, check_pooling

        if pooling not in POOLINGS:
            raise InputError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        try:
            check_pooling(getattr(self.model, "bert", self.model), FeatureSettings(pooling=pooling),
                          self.name or f"this {type(self.model).__name__}", loaded=self.model)
        except ValueError as e:
            raise InputError(str(e)) from None

    @_one_or_many
    def embed(self, inputs: Sequence[Any], pooling: str = "mean", normalize: bool = False) -> np.ndarray:
        """(N, H) float32 sentence embeddings, long inputs in windows; ``normalize``: each of unit length."""
        from bertforge.serving.features import FeatureSettings, embed

        self.check_pooling(pooling)
        if not isinstance(normalize, bool):
            raise InputError(f"normalize must be true or false, got {normalize!r}")
        bert = getattr(self.model, "bert", self.model)
        settings = FeatureSettings(pooling=pooling, max_seq_length=self.max_seq_length, stride=self.stride,
                                   batch_size=self.batch_size, precision=self.precision)
        out = embed(bert, self.tokenizer, self._pairs(inputs), settings)
        if normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


# ---------------------------------------------------------------------------- taking turns
class TurnLock:
    """A lock handed to its waiters in the order they asked (`threading.Lock` is not fair: a long call
    taking it batch after batch would keep a short one waiting to the end)."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._issued = 0  # tickets handed out
        self._serving = 0  # the ticket holding the lock

    def __enter__(self) -> None:
        with self._changed:
            ticket = self._issued
            self._issued += 1
            self._changed.wait_for(lambda: ticket == self._serving)

    def __exit__(self, *exc: Any) -> None:
        with self._changed:
            self._serving += 1
            self._changed.notify_all()


def take_turns(predictor: Predictor) -> TurnLock:
    """Make every forward pass of ``predictor``'s model, its encoder and pooler (which embeddings call alone)
    hold one `TurnLock`, and return it: threads then share the model batch by batch in arrival order."""
    lock = getattr(predictor.model, "_turns", None)
    if lock is not None:
        return lock
    lock = TurnLock()
    depth = threading.local()

    def enter(module: nn.Module, args: Any) -> None:
        level = getattr(depth, "level", 0)
        if level == 0:
            lock.__enter__()
        depth.level = level + 1

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        depth.level -= 1
        if depth.level == 0:
            lock.__exit__()

    bert = getattr(predictor.model, "bert", predictor.model)
    for module in dict.fromkeys(m for m in (predictor.model, bert, getattr(bert, "pooler", None)) if m is not None):
        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave, always_call=True)  # released if the forward pass raises too
    predictor.model._turns = lock  # on the model, which carries the hooks
    return lock


# ---------------------------------------------------------------------------- output
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
            best = ", ".join(f"{p['token']} {p['score']:.4f}" for p in m["predictions"])
            lines.append(f"  [{m['start']}:{m['end']}] {best}")
        return "\n".join(lines)
    if head == "classification":
        if "label" not in record:
            return f"{record['score']:.4f}\t{text}"
        labels = ",".join(record["labels"]) if "labels" in record else record["label"]
        return f"{labels}\t{record['score']:.4f}\t{text}"
    if head == "tagging":
        found = [f"  {e['type']}\t[{e['start']}:{e['end']}]\t{e['score']:.4f}\t{e['text']}" for e in record["entities"]]
        return "\n".join([text, *(found or ["  (no entities)"])])
    if head == "qa":
        answer = "(no answer)" if record["no_answer"] else f"{record['answer']}\t[{record['start']}:{record['end']}]"
        return f"{answer}\t{record['score']:.4f}\t{record['question']}"
    if head == "multiple-choice":
        return f"{record['choice']}\t{record['probabilities'][record['choice']]:.4f}\t{record['text']}"
    raise ValueError(f"unknown head {head!r}")


def format_records(records: Sequence[Mapping[str, Any]], head: str, fmt: str = "text") -> str:
    """``fmt`` "jsonl": one JSON object per line; "text": `format_record` of each."""
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r}; choose text or jsonl")
    return "".join(format_record(r, head) + "\n" for r in records)
