"""The model configuration: a typed dataclass whose defaults are BERT-base. `BertConfig` reads and
writes transformers' ``config.json`` keys unchanged, keeping those it does not use in ``extra``, so a
folder moves between the two libraries and round-trips through bertforge losing nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.version import __version__
from bertforge.io import atomic_write_text, read_json_object

__all__ = ["BertConfig", "PRESETS", "ACTIVATIONS", "dropout_overrides"]

# hidden_act names as transformers spells them. "gelu" is the exact erf form (transformers' default);
# Google's TF release used the tanh approximation, which transformers calls "gelu_new".
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_python", "relu", "silu", "swish")


@dataclass
class BertConfig:
    """BERT hyper-parameters (defaults: BERT-base, uncased English vocab)."""

    vocab_size: int = 30522  # rows of the word-embedding matrix (Google's English uncased vocab)
    hidden_size: int = 768  # H
    num_hidden_layers: int = 12  # L: Transformer blocks
    num_attention_heads: int = 12  # A; H must be divisible by A
    intermediate_size: int = 3072  # the feed-forward inner width (4H in the paper)
    hidden_act: str = "gelu"  # the feed-forward activation, one of ACTIVATIONS
    hidden_dropout_prob: float = 0.1  # on embeddings and on each residual branch
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512  # learned absolute positions: the longest sequence the model accepts
    type_vocab_size: int = 2  # segments A and B
    initializer_range: float = 0.02  # std of the normal initialiser for weights
    layer_norm_eps: float = 1e-12  # everywhere (BERT uses 1e-12, not PyTorch's 1e-5)
    is_decoder: bool = False  # causal (left-to-right) self-attention: the paper's "LTR" ablation
    pad_token_id: int = 0  # the padding_idx of the word embeddings
    classifier_dropout: float | None = None  # before task classifiers; None: hidden_dropout_prob
    num_labels: int = 2  # outputs of the sequence / token classification heads (1 = regression)
    problem_type: str | None = None  # "regression", "single_label_classification", "multi_label_classification"
    id2label: dict[int, str] | None = None  # label names by class index, saved with fine-tuned checkpoints
    architectures: list[str] | None = None  # class names the weights were saved from (transformers' convention)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # config.json keys bertforge does not use

    def __post_init__(self) -> None:
        # checked here: torch would fail on a size of 64.0 or -1 deep inside nn.Linear, naming no field
        for name in _SIZES:
            _check_int(name, getattr(self, name), minimum=1)
        if self.pad_token_id is not None:
            _check_int("pad_token_id", self.pad_token_id, minimum=0)
            if self.pad_token_id >= self.vocab_size:
                raise ValueError(f"pad_token_id ({self.pad_token_id}) must be below vocab_size ({self.vocab_size})")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None or name != "classifier_dropout":
                _check_number(name, value, low=0.0, high=1.0)
        _check_number("initializer_range", self.initializer_range, low=0.0)
        _check_number("layer_norm_eps", self.layer_norm_eps, low=0.0)
        if self.layer_norm_eps == 0:
            raise ValueError("layer_norm_eps must be > 0, got 0")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                             f"({self.num_attention_heads})")
        if not isinstance(self.is_decoder, bool):
            raise ValueError(f"is_decoder must be true or false, got {self.is_decoder!r}")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.problem_type not in (None, "regression", "single_label_classification", "multi_label_classification"):
            raise ValueError(f"unknown problem_type {self.problem_type!r}")
        if self.architectures is not None and (not isinstance(self.architectures, list)
                                               or not all(isinstance(a, str) for a in self.architectures)):
            raise ValueError(f"architectures must be a list of class names, got {self.architectures!r}")
        if self.id2label is not None:
            if not isinstance(self.id2label, dict):
                raise ValueError(f"id2label must map class indices to names, got {self.id2label!r}")
            try:
                self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            except (TypeError, ValueError):
                raise ValueError(f"id2label keys must be class indices (0, 1, ...), "
                                 f"got {list(self.id2label)}") from None
            self.num_labels = len(self.id2label)
            if self.num_labels < 1:
                raise ValueError("id2label is empty: num_labels must be >= 1")

    # ---------------------------------------------------------------- derived
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.id2label is None else {v: k for k, v in self.id2label.items()}

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """One of the paper's sizes: tiny, mini, small, medium, base, large (A = H/64, I = 4H)."""
        try:
            layers, hidden = PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
        sizes = dict(num_hidden_layers=layers, hidden_size=hidden,
                     num_attention_heads=hidden // 64, intermediate_size=4 * hidden)
        return cls(**{**sizes, **overrides})

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """transformers-compatible ``config.json`` contents."""
        out: dict[str, Any] = dict(self.extra)
        out.update((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                   if f.name not in ("extra", "id2label", "num_labels"))
        if self.architectures is None:
            out.pop("architectures")
        if self.id2label is not None:
            out["id2label"] = {str(k): v for k, v in self.id2label.items()}
            out["label2id"] = self.label2id
        else:
            # transformers derives num_labels from id2label; with no names it reads num_labels.
            out["num_labels"] = self.num_labels
        out["model_type"] = "bert"
        # the MLM decoder is the word-embedding matrix, saved once: a reader must tie them
        out["tie_word_embeddings"] = True
        out["bertforge_version"] = __version__
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> "BertConfig":
        """Build from transformers' ``config.json`` keys; unknown keys go to ``extra``."""
        data = dict(data)
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"{source}: model_type is {model_type!r}, expected 'bert'")
        if data.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{source}: only absolute position embeddings are supported "
                             f"(got {data['position_embedding_type']!r})")
        if data.get("add_cross_attention"):
            raise ValueError(f"{source}: cross-attention BERT variants are not supported")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: data.pop(k) for k in list(data) if k in known}
        # not kept in `extra`: keys `to_dict` writes itself, and where a file came from (stale once saved)
        for key in _NOT_EXTRA:
            data.pop(key, None)
        if (kwargs.get("id2label") is not None and "num_labels" in kwargs
                and int(kwargs["num_labels"]) != len(kwargs["id2label"])):
            raise ValueError(f"{source}: num_labels {kwargs['num_labels']} does not match "
                             f"{len(kwargs['id2label'])} entries of id2label")
        # transformers writes default id2label {"0": "LABEL_0", ...}; keep it only if meaningful.
        if kwargs.get("id2label") and all(v == f"LABEL_{k}" for k, v in kwargs["id2label"].items()):
            kwargs["num_labels"] = len(kwargs.pop("id2label"))
        try:
            return cls(**kwargs, extra=data)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from e

    def save(self, path: str | Path) -> None:
        """Write ``config.json`` atomically."""
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "BertConfig":
        """Read a ``config.json`` (or the folder holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        return cls.from_dict(read_json_object(path), source=str(path))

    def replace(self, **changes: Any) -> "BertConfig":
        # a new num_labels must not be overruled by the old label names (id2label decides it)
        if ("num_labels" in changes and "id2label" not in changes and self.id2label is not None
                and len(self.id2label) != changes["num_labels"]):
            changes["id2label"] = None
        changes.setdefault("extra", dict(self.extra))  # the copy must not share the dict
        return dataclasses.replace(self, **changes)


_NOT_EXTRA = ("label2id", "bertforge_version", "model_type", "tie_word_embeddings", "_name_or_path",
              "transformers_version")
# Fields that size a tensor: whole numbers >= 1.
_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "max_position_embeddings", "type_vocab_size", "num_labels")


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    """``value`` is a whole number (an int, not a bool or a float such as 64.0) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_number(name: str, value: Any, *, low: float, high: float | None = None) -> None:
    """``value`` is a real number (not a bool or a string) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        bounds = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise ValueError(f"{name} must be {bounds}, got {value}")


# (layers, hidden) of the paper's models and of Google's 24 smaller BERTs.
PRESETS: dict[str, tuple[int, int]] = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "medium": (8, 512),
                                       "base": (12, 768), "large": (24, 1024)}


def dropout_overrides(p: float) -> dict[str, float]:
    """Config changes that set both dropouts (hidden states, attention probabilities) to ``p``."""
    return {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}
