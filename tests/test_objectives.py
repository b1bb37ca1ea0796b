"""Pre-training objectives on the same prepared data (the paper's Table 5 ablations): mlm+nsp (BERT)
and mlm (No NSP)."""

from __future__ import annotations

import json

import pytest
import torch

from pretrain_fixtures import config, lines, make_data
from pretrain_fixtures import no_plots, nsp_data, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge.model.heads import BertForMaskedLM
from bertforge.train.pretrain import PretrainingTask, pretrain


# ------------------------------------------------------------------------------ objectives
def test_mlm_on_nsp_data_trains_without_nsp_on_the_same_batches(root, tok, nsp_data, monkeypatch):
    seen: dict[str, list[torch.Tensor]] = {}
    forward = PretrainingTask.forward

    def recording(self, model, batch):
        seen.setdefault(current, []).append(batch["input_ids"].clone())
        return forward(self, model, batch)

    monkeypatch.setattr(PretrainingTask, "forward", recording)
    for current in ("mlm+nsp", "mlm"):
        pretrain(config(nsp_data, tok, root / f"objective-{current}", objective=current, max_steps=30, lr=3e-3,
                        warmup_steps=3))
    assert len(seen["mlm"]) == 30 and all(torch.equal(a, b) for a, b in zip(seen["mlm+nsp"], seen["mlm"]))
    both, mlm = lines(root / "objective-mlm+nsp"), lines(root / "objective-mlm")
    assert "nsp_loss" in both[-1] and "nsp_accuracy" in both[-1]
    assert "nsp_loss" not in mlm[-1] and "nsp_accuracy" not in mlm[-1]
    assert mlm[-1]["loss"] < 0.5 * mlm[0]["loss"]
    folder = root / "objective-mlm" / "model"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_the_objective_is_part_of_the_runs_identity(root, tok, nsp_data):
    out = root / "objective-resume"
    pretrain(config(nsp_data, tok, out, max_steps=1))  # auto: mlm+nsp on NSP data
    with pytest.raises(ValueError, match=r"settings differ \(.*objective: None -> 'mlm'"):
        pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, objective="mlm"))
    assert pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, objective="mlm+nsp")).step == 2


def test_mlm_plus_nsp_needs_nsp_data_and_unknown_objectives_are_refused(root, tok):
    data = make_data(root, tok, "objective-no-nsp", nsp=False)
    with pytest.raises(ValueError, match="mlm\\+nsp needs data prepared with next sentence prediction"):
        pretrain(config(data, tok, root / "refused", objective="mlm+nsp", max_steps=1))
    with pytest.raises(ValueError, match="objective must be one of"):
        config(data, tok, root / "refused", objective="nsp")
