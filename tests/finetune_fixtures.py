"""What the fine-tuning tests share: a tiny "pre-trained" BERT folder with the test vocab's
tokenizer, a folder per test module, and small file writers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from data_fixtures import PLAIN_WORDS, VOCAB_SIZE, write_tokenizer

from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForPreTraining

FILLER = [w for w in PLAIN_WORDS if w not in ("good", "bad")]
"""Words that carry no label in the generated tasks ("good" / "bad" decide)."""


@pytest.fixture(scope="module")
def root(tmp_path_factory, request) -> Path:
    """A folder for the whole test module."""
    return tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))


@pytest.fixture(scope="module")
def base(root) -> Path:
    """A "pre-trained" tiny BERT (random weights, dropout 0.1) saved with the test vocab's tokenizer."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    folder = root / "base"
    BertForPreTraining(config).save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def saved(folder: Path, cls: type, seed: int, positions: int = 64, **config) -> Path:
    """A tiny ``cls`` with every weight drawn at random (std 0.5, so outputs are far from uniform and
    rankings have no near-ties), saved with the test vocab's tokenizer."""
    torch.manual_seed(seed)
    model = cls(BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=positions, **config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return folder
