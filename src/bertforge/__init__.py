"""bertforge: BERT as the paper describes it, in one coherent package.

The names mirror transformers' so users feel at home::

    from bertforge import BertConfig, BertForPreTraining, BertTokenizer
    model = BertForPreTraining(BertConfig.preset("mini"))
"""

__version__ = "0.1.0"

from bertforge.config import BertConfig  # noqa: E402
from bertforge.heads import (  # noqa: E402
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.modeling import BertModel  # noqa: E402

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


def __getattr__(name: str):
    # The tokenizer imports `tokenizers`; load it only when asked for.
    if name == "BertTokenizer":
        from bertforge.tokenization import BertTokenizer

        return BertTokenizer
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")
