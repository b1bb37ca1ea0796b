"""Golden loss curves: a tiny pre-training and a tiny fine-tuning, run in fp32 on one thread, whose
per-step losses (and held-out scores) are kept in ``tests/golden/`` and compared on every run, to 1e-6
relative. Any change of behaviour (initialisation, data order, masking, dropout draws, the optimizer,
the schedule, the speed layer's arithmetic) shows as a diff here.

Float sums come out the same only from the same kernels: each file records the CPU it was written on
(vendor, family and model, and torch's CPU capability) and the torch version. On another kind of CPU
(AVX2 against AVX-512, Intel against AMD) or another torch the kernels round differently, and the
curves are compared to 1e-4 relative: still far below what any change of behaviour moves (the first
step's loss alone moves by 1e-2 with another seed).

The fine-tuning run learns: its loss falls and its dev accuracy rises over the pinned steps, so the
file pins learning, not only arithmetic.

A change meant to alter the numbers rewrites the files: ``BERTFORGE_WRITE_GOLDEN=1 pytest
tests/test_golden.py``, and the diff of ``tests/golden/`` goes into the same commit."""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path

import pytest
from finetune_fixtures import base, root, write  # noqa: F401 - fixtures
from pretrain_fixtures import config as pretrain_config
from pretrain_fixtures import make_data, one_thread  # noqa: F401 - fixtures
from data_fixtures import write_tokenizer

from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.train.pretrain import pretrain

GOLDEN = Path(__file__).parent / "golden"
REL = 1e-6
"""On the kind of CPU a curve was written on."""
REL_OTHER_CPU = 1e-4
"""On another kind, or with another torch, whose kernels round differently."""


def _machine() -> dict[str, str]:
    """What decides how float sums round: the CPU (vendor, family, model, torch's capability) and torch."""
    import torch

    info: dict[str, str] = {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model"}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in keys and keys[key.strip()] not in info:
                info[keys[key.strip()]] = value.strip()
    return info


def _curve(out: Path) -> dict[str, list]:
    """Per-step losses (and their parts), and the held-out lines, from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    keep = ("step", "loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "accuracy", "lr", "grad_norm")
    train = [{k: r[k] for k in keep if k in r} for r in rows if r["split"] == "train"]
    held = [{k: v for k, v in r.items() if k not in ("time", "seconds", "split", "tokens_per_s")}
            for r in rows if r["split"] == "eval"]
    return {"train": train, "eval": held}


def _compare(name: str, curve: dict[str, list]) -> None:
    path = GOLDEN / f"{name}.json"
    if os.environ.get("BERTFORGE_WRITE_GOLDEN") == "1":
        path.write_text(json.dumps({"machine": _machine(), **curve}, indent=1) + "\n")
        pytest.skip(f"wrote {path}")
    golden = json.loads(path.read_text())
    rel = REL if golden.get("machine") == _machine() else REL_OTHER_CPU  # another CPU or another torch
    for split in ("train", "eval"):
        assert [r.get("step") for r in curve[split]] == [r.get("step") for r in golden[split]], split
        for now, then in zip(curve[split], golden[split]):
            assert set(now) == set(then), (split, now["step"])
            for key, value in then.items():
                if isinstance(value, float):
                    assert now[key] == pytest.approx(value, rel=rel, abs=1e-12), (split, now["step"], key, rel)
                else:
                    assert now[key] == value, (split, now["step"], key)


def test_the_golden_pretraining_curve(tmp_path):
    """12 steps of the tiny preset on NSP data, dropout 0.1, with a held-out evaluation every 4 steps."""
    tok = write_tokenizer(tmp_path / "tok")
    data = make_data(tmp_path, tok, "nsp")
    out = tmp_path / "run"
    pretrain(pretrain_config(data, tok, out, max_steps=12, dropout=0.1, eval_shards=1, eval_every=4,
                             precision="fp32", lr=2e-3, warmup_steps=3))
    _compare("pretrain", _curve(out))


def test_the_golden_finetuning_curve(root, base):
    """Ten epochs of a classification task (the word "good" or "bad" decides) on the tiny model, dropout
    on, the dev set scored every epoch: the run learns the task (the loss falls from chance, the dev
    accuracy rises to all but perfect), so the curve pins learning, not only arithmetic."""
    rng = random.Random(3)
    words = ["the", "house", "river", "old", "road", "by", "a", "of"]

    def rows(n: int) -> str:
        out = []
        for _ in range(n):
            label = rng.choice(["pos", "neg"])
            text = [rng.choice(words) for _ in range(rng.randint(3, 9))]
            text.insert(rng.randint(0, len(text)), "good" if label == "pos" else "bad")
            out.append(f'"{" ".join(text)}",{label}\n')
        return "review,sentiment\n" + "".join(out)

    train, dev = write(root / "train.csv", rows(48)), write(root / "dev.csv", rows(16))
    out = root / "golden-finetune"
    finetune(FinetuneConfig(task="classification", model=str(base), out=str(out), train_file=str(train),
                            dev_file=str(dev), text_column="review", label_column="sentiment", lr=3e-3,
                            batch_size=8, epochs=10, warmup_ratio=0.1, log_every=1, progress=False, seed=7,
                            precision="fp32", device="cpu", checkpoint_every=1000))
    curve = _curve(out)
    losses, dev = [r["loss"] for r in curve["train"]], [r["accuracy"] for r in curve["eval"]]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.3  # from chance (0.69) to well below it
    assert dev[0] < 0.6 and dev[-1] >= 0.9
    _compare("finetune", curve)
