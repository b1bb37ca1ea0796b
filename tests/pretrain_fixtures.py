"""Inputs and helpers for the pre-training tests (tests/test_pretrain*.py): tiny prepared datasets
built with the data tests' vocab and corpora, a tiny run configuration, and readers for what a run
leaves behind. Nothing here is a test; the fixtures are imported by the test modules that use them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_fixtures import documents, write_google, write_tokenizer

from bertforge.data.loader import PretrainingDataset, PretrainingLoader
from bertforge.data.prepare import PrepareConfig, prepare
from bertforge.train import pretrain as pretrain_module
from bertforge.train.pretrain import PretrainConfig, PretrainingObjective

# 8 documents cut into windows of 400 characters: 3 shards of 8, 5 and 8 NSP instances (13 + 8
# held out with eval_shards=1), each at most 32 tokens with at most 5 predictions.
N_DOCS, SHARD_CHARS, LENGTH = 8, 400, 32


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and the machine's cores are shared by the test workers."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """Runs in the test process skip drawing curves.png (about a second each); module-scoped runs,
    set up before this fixture, and runs in subprocesses still draw it."""
    monkeypatch.setattr(pretrain_module, "_plot", lambda out: None)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pretrain")


@pytest.fixture(scope="module")
def tok(root) -> Path:
    return write_tokenizer(root / "tok")


@pytest.fixture(scope="module")
def nsp_data(root, tok) -> Path:
    return make_data(root, tok, "nsp")


def make_data(root: Path, tok_dir: Path, name: str, **overrides) -> Path:
    """A prepared folder ``root/name`` of the fixed tiny corpus (static masks unless overridden)."""
    corpus = root / "corpus.txt"
    if not corpus.is_file():
        write_google(corpus, documents(1, N_DOCS, 3, 6))
    settings = dict(max_seq_length=LENGTH, max_predictions_per_seq=5, dupe_factor=1, shard_chars=SHARD_CHARS)
    prepare([corpus], root / name, tok_dir, PrepareConfig(**{**settings, **overrides}), progress=False)
    return root / name


def config(data: Path, tok: Path, out: Path, **overrides) -> PretrainConfig:
    """A few steps of the tiny preset on ``data``: fp32, CPU, no progress bar, a metrics line a step."""
    settings = dict(data=str(data), tokenizer=str(tok), out=str(out), model="tiny", batch_size=8, max_steps=4,
                    lr=1e-3, warmup_steps=1, log_every=1, checkpoint_every=1000, eval_every=0, progress=False,
                    device="cpu", dropout=0.0)
    return PretrainConfig(**{**settings, **overrides})


def cli_args(cfg: PretrainConfig) -> list[str]:
    """``cfg`` as ``bertforge pretrain`` flags."""
    args = []
    for key, value in vars(cfg).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            args += [flag, str(value)]
    return args


def lines(out: Path, split: str = "train") -> list[dict]:
    """The ``split`` lines of a run's metrics.jsonl, in file order."""
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == split]


def losses_by_step(out: Path) -> dict[int, float]:
    rows = lines(out)
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows}


def subprocess_env() -> dict[str, str]:
    """One thread per process (the machine is shared), unbuffered output."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def bertforge_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertforge", *args]


def run_cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def evaluate_folder(model: torch.nn.Module, data: Path, shards: list[int] | None = None) -> dict[str, float]:
    """MLM (/ NSP) loss and accuracy of ``model`` over every instance of ``data`` (or of ``shards``)."""
    dataset = PretrainingDataset(data, shards=shards)
    task = PretrainingObjective(nsp=bool(dataset.config["nsp"]))
    batch = next(iter(PretrainingLoader(dataset, len(dataset), seed=0)))  # all of it, in one batch
    model.eval()
    with torch.no_grad():
        terms, stats = task.forward(model, batch)
    counts = task.counts(batch)
    out = {f"{k}_loss": float(v) / counts[k] for k, v in terms.items()}
    return out | {f"{k}_accuracy": float(stats[f"{k}_correct"]) / counts[k] for k in terms}
