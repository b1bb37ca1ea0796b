"""`bertforge.train.precision`: "auto" follows the device's native bf16, fp16 is refused off CUDA with a
clear error (by the module and by the training loop), autocast runs in the chosen dtype, and the loop
and the demo share the module's names instead of tables of their own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bertforge.train import precision as prec
from bertforge.train.loop import PRECISIONS, TrainConfig, Trainer


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_is_bf16_where_the_device_runs_it_natively_else_fp32(monkeypatch, native, expected):
    monkeypatch.setattr(prec, "native_bf16", lambda device: native)
    assert prec.resolve_precision("auto", "cpu") == expected
    with prec.autocast("auto", "cpu"):
        y = nn.Linear(4, 4)(torch.ones(2, 4))
    assert y.dtype == (torch.bfloat16 if native else torch.float32)


def test_explicit_precisions_resolve_to_themselves_and_bf16_warns_where_emulated(monkeypatch, caplog):
    monkeypatch.setattr(prec, "native_bf16", lambda device: False)
    assert prec.resolve_precision("fp32", "cpu") == "fp32"
    assert caplog.text == ""
    assert prec.resolve_precision("bf16", "cpu") == "bf16"
    assert "emulated" in caplog.text
    assert [prec.dtype_of(p) for p in ("fp32", "bf16", "fp16")] == [None, torch.bfloat16, torch.float16]
    assert [prec.needs_grad_scaler(p) for p in ("fp32", "bf16", "fp16")] == [False, False, True]


def test_fp16_on_cpu_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="precision fp16 needs a CUDA device"):
        prec.resolve_precision("fp16", "cpu")
    config = TrainConfig(precision="fp16", device="cpu")  # a valid setting; the CPU is what refuses it
    with pytest.raises(ValueError, match="precision fp16 needs a CUDA device .*on CPU use bf16"):
        Trainer(nn.Linear(2, 2), None, None, config, "unused")  # type: ignore[arg-type]


def test_unknown_precisions_are_refused_naming_the_choices():
    for bad in ("fp8", "bfloat16", ""):
        with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, fp16"):
            TrainConfig(precision=bad)
        with pytest.raises(ValueError, match="precision must be one of"):
            prec.resolve_precision(bad, "cpu")
    assert TrainConfig(precision="auto").precision == "auto"
    assert TrainConfig().precision == "fp32"  # the default stays fp32: a run's numbers do not depend on the CPU


def test_the_loop_uses_the_precision_modules_names():
    assert PRECISIONS is prec.PRECISIONS


def test_the_trainer_resolves_auto_once_and_runs_in_it(monkeypatch):
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)
    config = TrainConfig(precision="auto", device="cpu")
    trainer = Trainer(nn.Linear(4, 4), None, None, config, "unused")  # type: ignore[arg-type]
    assert trainer.precision == "bf16" and trainer.scaler is None
    monkeypatch.setattr(prec, "native_bf16", lambda device: False)  # resolved already: no second look
    with trainer._autocast():
        assert trainer.model(torch.ones(1, 4)).dtype == torch.bfloat16
