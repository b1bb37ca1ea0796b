"""benchmarks/pretraining_crossing.py's pure parts: ``--arms`` and the pre-training data an arm reads, and
when a stored cell result is reused (only where it ran with the cell's settings)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import pretraining_crossing as crossing  # noqa: E402

from bertforge.demo.curve import Cell, FinetuneSettings  # noqa: E402


def test_arms_parse_presets_and_settings_and_name_their_pretraining_data():
    tiny, cased, last = crossing.parse_arms("tiny,cased:cased=true,last:tag_piece=last:finetune_epochs=3")
    assert tiny == crossing.Arm("tiny", {"model": "tiny"})
    assert cased.settings == {"cased": True} and last.settings == {"tag_piece": "last", "finetune_epochs": 3.0}
    assert (tiny.data_key(), cased.data_key(), last.data_key()) == ("data", "data-cased=True", "data")
    with pytest.raises(SystemExit, match="expected setting=value"):
        crossing.parse_arms("tiny:cased")
    with pytest.raises(SystemExit, match="names must differ"):
        crossing.parse_arms("tiny,tiny:cased=true")
    with pytest.raises(SystemExit, match="tag_piece"):
        crossing.parse_arms("odd:tag_piece=middle")


def _cell(piece: str, epochs: float = 10.0) -> Cell:
    settings = FinetuneSettings(epochs=epochs, min_steps=300, batch_size=32, max_seq_length=64, dropout=0.1,
                                precision="bf16")
    return Cell("60 min", 100, 0, "ckpt", "train.conll", "heldout.conll", 300, {"task": "tagging", "tag_piece": piece},
                settings, "out")


def test_a_stored_cell_is_reused_only_when_it_ran_with_the_same_settings(tmp_path):
    path = tmp_path / "cell.json"
    assert not crossing.reusable(path, _cell("first"))
    path.write_text(json.dumps({"key": "k", "accuracy": 0.9, "ran_with": crossing.ran(_cell("first"))}))
    assert crossing.reusable(path, _cell("first"))
    assert not crossing.reusable(path, _cell("last"))  # a changed default runs the cell again
    assert not crossing.reusable(path, _cell("first", epochs=30))
    older = {k: v for k, v in crossing.ran(_cell("first")).items() if k != "range_rule"}
    path.write_text(json.dumps({"key": "k", "accuracy": 0.9, "ran_with": older}))
    assert not crossing.reusable(path, _cell("first"))  # chosen by an earlier range-test rule: run again
    path.write_text(json.dumps({"key": "k", "accuracy": 0.9}))  # a result that does not say how it ran
    assert not crossing.reusable(path, _cell("first"))
