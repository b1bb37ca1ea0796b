"""A refused resume loses nothing: `bertforge pretrain --resume` / `bertforge finetune --resume` with a
setting the run was not started with is refused, and every file in --out (run_config.json included)
is byte-identical afterwards; an accepted resume records its settings as usual."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from data_fixtures import sentence
from finetune_fixtures import base  # noqa: F401 - a fixture
from pretrain_fixtures import cli_args, config
from pretrain_fixtures import no_plots, nsp_data, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge import cli
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.train.lock import LOCK_FILE


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``folder``, hidden ones included."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def test_a_refused_pretrain_resume_changes_no_file(root, tok, nsp_data, capsys):
    out = root / "refused-pretrain"
    pretrain_cfg = config(nsp_data, tok, out, max_steps=2)
    assert cli.main(["pretrain", *cli_args(pretrain_cfg)]) == 0
    before = _snapshot(out)
    assert "run_config.json" in before and "checkpoints/step-00000002/trainer_state.json" in before
    capsys.readouterr()

    changed = config(nsp_data, tok, out, max_steps=3, lr=2e-3, resume=True)
    assert cli.main(["pretrain", *cli_args(changed)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "settings differ (lr: 0.001 -> 0.002)" in err
    assert _snapshot(out) == before
    assert json.loads((out / "run_config.json").read_text())["lr"] == 1e-3

    # accepted: the run's settings are written as the run goes on (max_steps may change on a resume)
    assert cli.main(["pretrain", *cli_args(config(nsp_data, tok, out, max_steps=3, resume=True))]) == 0
    assert json.loads((out / "run_config.json").read_text())["max_steps"] == 3
    assert not (out / LOCK_FILE).exists()


def _task(folder: Path) -> tuple[Path, Path]:
    rng = random.Random(0)
    files = []
    for split in ("train", "dev"):
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"text": f"{['bad', 'good'][i % 2]} {sentence(rng, 3, 6)}",
                                            "label": i % 2}) + "\n" for i in range(32)), encoding="utf-8")
        files.append(path)
    return files[0], files[1]


def test_a_refused_finetune_resume_changes_no_file(root, base, tmp_path):
    train, dev = _task(tmp_path)
    out = root / "refused-finetune"

    def settings(**changes) -> FinetuneConfig:
        return FinetuneConfig(**{**dict(task="classification", model=str(base), train_file=str(train),
                                        dev_file=str(dev), text_column="text", label_column="label", out=str(out),
                                        max_steps=2, batch_size=16, max_seq_length=32, lr=1e-3, log_every=1,
                                        progress=False, device="cpu"), **changes})

    finetune(settings())
    before = _snapshot(out)
    assert {"run_config.json", "best/eval_metrics.json", "checkpoints/step-00000002/trainer_state.json"} <= set(before)
    with pytest.raises(ValueError, match=r"settings differ \(.*lr: 0\.001 -> 0\.002"):
        finetune(settings(max_steps=3, lr=2e-3, resume=True))
    assert _snapshot(out) == before
    assert finetune(settings(max_steps=3, resume=True)).train.step == 3
    assert json.loads((out / "run_config.json").read_text())["max_steps"] == 3
