"""Continuing pre-training from a published checkpoint (domain-adaptive pre-training) without its traps:
an encoder-only checkpoint's missing MLM head trains alone first (the encoder held still), then
everything with a warmup of its own; the checkpoint's pooler is kept in what masked-LM pre-training
saves; a size preset beside --init-from is refused; the paper's 10,000 warmup steps give way to its
share in a shorter run (with a message) and a given warmup longer than the run is refused."""

from __future__ import annotations

import logging

import pytest
import torch
from pretrain_fixtures import config, lines, make_data, no_plots, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge.model.bert import BertModel
from bertforge.model.checkpoint import read_state_dict
from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForPreTraining
from bertforge.train.config import TrainConfig
from bertforge.train.optim import build_optimizer, build_schedule
from bertforge.train.pretrain import PretrainConfig, pretrain
from bertforge.train.rundir import checkpoint_dir


@pytest.fixture(scope="module")
def mlm_data(root, tok):
    return make_data(root, tok, "mlm", nsp=False)


def tiny(tok_dir) -> BertConfig:
    from data_fixtures import VOCAB_SIZE

    return BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)


def saved(model: torch.nn.Module, folder, tok_dir):
    import shutil

    model.save_pretrained(folder)
    for f in tok_dir.iterdir():
        shutil.copy(f, folder / f.name)
    return folder


def test_an_encoder_without_mlm_head_trains_its_head_alone_first(root, tok, mlm_data, tmp_path, caplog):
    torch.manual_seed(0)
    encoder = saved(BertModel(tiny(tok)), tmp_path / "encoder", tok)  # no cls.* weights, as all-MiniLM-L6-v2
    out = tmp_path / "dapt"
    with caplog.at_level(logging.INFO, logger="bertforge"):
        pretrain(config(mlm_data, "", out, model="base", init_from=str(encoder), max_steps=8, warmup_steps=1,
                        head_warmup_ratio=0.5, checkpoint_every=1, keep_checkpoints=0))
    assert any("has no cls.predictions head: it trains alone over the first 50% of the run" in r.getMessage()
               for r in caplog.records)
    source = read_state_dict(encoder)

    def encoder_moved(step: int) -> bool:
        state = read_state_dict(checkpoint_dir(out, step))
        assert all(f"bert.{k}" in state for k in source)
        return any(not torch.equal(state[f"bert.{k}"], v) for k, v in source.items())

    head = "cls.predictions.transform.dense.weight"
    assert not encoder_moved(4)  # positions 0-3 of 8: the head alone
    assert not torch.equal(read_state_dict(checkpoint_dir(out, 4))[head], read_state_dict(checkpoint_dir(out, 1))[head])
    assert encoder_moved(6)
    assert lines(out)[-1]["loss"] < lines(out)[0]["loss"]


def test_the_schedule_holds_the_body_still_then_warms_it_up_on_its_own():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    optimizer = build_optimizer(model, lr=1.0, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8, head={"1.weight",
                                                                                                    "1.bias"})
    assert [len(g["params"]) for g in optimizer.param_groups] == [1, 1, 1, 1]
    assert [bool(g.get("head")) for g in optimizer.param_groups] == [False, False, True, True]
    schedule = build_schedule(optimizer, total_steps=10, warmup_steps=2, schedule="linear", head_share=0.4)
    rates = []
    for _ in range(10):
        rates.append((optimizer.param_groups[0]["lr"], optimizer.param_groups[2]["lr"]))
        optimizer.step()
        schedule.step()
    assert [body for body, _ in rates] == pytest.approx([0, 0, 0, 0, 0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    assert [head for _, head in rates] == pytest.approx([0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])


def test_masked_lm_pretraining_keeps_the_checkpoints_pooler(root, tok, mlm_data, tmp_path):
    torch.manual_seed(1)
    full = saved(BertForPreTraining(tiny(tok)), tmp_path / "full", tok)
    out = tmp_path / "kept"
    pretrain(config(mlm_data, "", out, model="base", init_from=str(full), max_steps=2, warmup_steps=1))
    before, after = read_state_dict(full), read_state_dict(out / "model")
    for name in ("bert.pooler.dense.weight", "bert.pooler.dense.bias"):
        assert torch.equal(after[name], before[name])


def test_a_size_preset_beside_init_from_is_refused(tmp_path):
    with pytest.raises(ValueError, match="model='mini' and init_from='x': the model's size and shape are the "
                                         "checkpoint's .*; drop model"):
        PretrainConfig(data="d", init_from="x", model="mini")
    PretrainConfig(data="d", init_from="x")  # the default preset: not given
    PretrainConfig.from_recipe("budget", data="d", init_from="x", max_steps=100)  # the recipe's preset


def test_a_warmup_longer_than_the_run_is_scaled_or_refused(root, tok, mlm_data, tmp_path, caplog):
    assert TrainConfig(max_steps=40).warmup == 0 and TrainConfig(max_steps=5000).warmup == 50
    assert TrainConfig(max_steps=20_000).warmup == 10_000 and TrainConfig().warmup == 10_000
    assert TrainConfig(max_steps=40, warmup_ratio=0.25).warmup == 10
    with pytest.raises(ValueError, match="warmup_steps 100 is longer than the run \\(max_steps 40\\)"):
        TrainConfig(max_steps=40, warmup_steps=100)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        pretrain(config(mlm_data, tok, tmp_path / "short", max_steps=200, warmup_steps=None))
    assert any("the paper's 10,000 warmup steps are longer than this run's 200: warming up over 2" in r.getMessage()
               for r in caplog.records)
