"""Re-writing checkpoint folders: any BERT folder (bertforge, transformers, Google's TF release) as a
canonical bertforge / transformers folder."""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge.convert.tf import convert_tf_checkpoint, find_tf_checkpoint
from bertforge.model.bert import BertPreTrainedModel
from bertforge.model.checkpoint import load_pretrained, save_pretrained
from bertforge.model.heads import MODEL_CLASSES, infer_model_class
from bertforge.text.tokenizer import BertTokenizer

__all__ = ["convert"]


def convert(src: str | Path, dst: str | Path, *, model_class: str | None = None,
            dtype: torch.dtype | None = None) -> type[BertPreTrainedModel]:
    """Re-write any BERT checkpoint folder as a canonical bertforge / transformers folder.

    The tokenizer (``vocab.txt`` and settings) is carried over when present. Returns the class used.
    Google's TensorFlow checkpoints (a folder with ``bert_model.ckpt.index``, or a checkpoint path
    prefix) are read without TensorFlow by `convert_tf_checkpoint`.
    """
    if find_tf_checkpoint(src) is not None:
        return MODEL_CLASSES[convert_tf_checkpoint(src, dst, model_class=model_class, dtype=dtype).model_class]
    cls = MODEL_CLASSES[model_class] if model_class else infer_model_class(src)
    model = load_pretrained(cls, src, dtype=dtype)
    tokenizer = None
    if (Path(src) / "vocab.txt").is_file():
        tokenizer = BertTokenizer.from_pretrained(src)
    save_pretrained(model, dst, tokenizer=tokenizer)
    return cls
