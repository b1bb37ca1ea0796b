"""bertforge: BERT as the paper describes it, in one coherent package.

The names mirror transformers' so users feel at home::

    from bertforge import BertConfig, BertForPreTraining, BertTokenizer
    model = BertForPreTraining(BertConfig.preset("mini"))

Names are imported on first use, so ``import bertforge.text.tokenizer`` (e.g. in data-preparation
workers) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from bertforge.version import __version__

_EXPORTS = {
    "BertConfig": "bertforge.model.config",
    "BertModel": "bertforge.model.bert",
    "BertForPreTraining": "bertforge.model.heads",
    "BertForMaskedLM": "bertforge.model.heads",
    "BertForSequenceClassification": "bertforge.model.heads",
    "BertForTokenClassification": "bertforge.model.heads",
    "BertForQuestionAnswering": "bertforge.model.heads",
    "BertForMultipleChoice": "bertforge.model.heads",
    "BertTokenizer": "bertforge.text.tokenizer",
}
__all__ = [
    "BertConfig",
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "BertTokenizer",
]

if TYPE_CHECKING:
    from bertforge.model.config import BertConfig
    from bertforge.model.heads import (
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bertforge.model.bert import BertModel
    from bertforge.text.tokenizer import BertTokenizer


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
