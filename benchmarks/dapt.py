"""Domain-adaptive pre-training, measured: all-MiniLM-L6-v2 continued with masked LM on the movie-review
sentences, then fine-tuned on a few labelled ones, against fine-tuning it directly.

Data. The movie-review snippets of Pang & Lee (2005) (``../shared/DATA.md``), split as
``benchmarks/finetune_mr.py`` splits them (`bertforge.resources.movie_review_split`, seed 2005):
9,511 training and 1,057 held-out sentences. The held-out sentences are the test set: no choice is made
on them, and their text is never pre-trained on. Pre-training reads the text of the 9,511 training
sentences only (no labels), packed 20 to a document, masked afresh at every pass (15 %, 80/10/10).

The two arms, paired by seed. For each size N and seed s, the same N training sentences (a permutation
seeded with s) fine-tune (a) all-MiniLM-L6-v2 itself ("direct") and (b) the checkpoint continued on the
training text ("dapt"), with the same settings and seed; each final model is scored on the test set.
Everything was fixed before any run, on no data (there is no dev set here to tune on, and both arms get
the same settings): fine-tuning lr 1e-4, batch 32, 10 epochs, warmup 10 %, dropout 0.1, max length 64,
bf16 where the CPU computes it natively; continued pre-training ``--steps`` steps of batch 32 at length
128, lr 1e-4 with warmup 6 %, linear decay, dropout 0.1. MiniLM has no MLM head: bertforge trains the
fresh head alone over the first 10 % of the steps, then everything (`--head-warmup-ratio`).

Reported: accuracy per arm with 95 % t intervals over the seeds, and the paired difference dapt - direct
with its interval (resolved when the interval excludes 0), per N; the continued pre-training's masked-LM
loss and accuracy at its start and end. Run from the repository root:

    .venv/bin/python benchmarks/dapt.py --json docs/results/dapt.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.data.prepare import PrepareConfig, prepare
from bertforge.resources import minilm_folder, movie_review_split
from bertforge.stats import mean_interval, paired_difference
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune
from bertforge.train.precision import cpu_name
from bertforge.train.pretrain import PretrainConfig, pretrain


def continue_pretraining(texts: list[str], model: Path, out: Path, steps: int) -> dict:
    """Masked LM on ``texts`` from ``model``; the run's first and last training metrics."""
    corpus = out / "corpus.txt"
    out.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(t + "\n" + ("\n" if (i + 1) % 20 == 0 else "") for i, t in enumerate(texts)),
                      encoding="utf-8")
    data = out / "data"
    if not (data / "manifest.json").is_file():
        prepare([corpus], data, model, PrepareConfig(max_seq_length=128, nsp=False, dynamic_masking=True,
                                                     dupe_factor=1), progress=False)
    run = out / "run"
    if not (run / "model" / "config.json").is_file():
        pretrain(PretrainConfig(data=str(data), init_from=str(model), out=str(run), objective="mlm",
                                masked_lm_prob=0.15, max_steps=steps, batch_size=32, lr=1e-4, warmup_ratio=0.06,
                                dropout=0.1, precision="auto", eval_every=0, checkpoint_every=steps, log_every=10,
                                progress=False))
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["split"] == "train"]
    keep = ("step", "loss", "mlm_accuracy")
    return {"first": {k: train[0].get(k) for k in keep}, "last": {k: train[-1].get(k) for k in keep},
            "model": str(run / "model")}


def fine_tuned_accuracy(model: str, train: list[dict], test: list[dict], out: Path, seed: int) -> float:
    if not (out / "model" / "config.json").is_file():
        finetune(FinetuneConfig(task="classification", model=model, out=str(out), lr=1e-4, batch_size=32,
                                epochs=10.0, warmup_ratio=0.1, dropout=0.1, max_seq_length=64, seed=seed,
                                keep_best=False, precision="auto", checkpoint_every=100_000, progress=False,
                                overwrite=True), train=train)
    return evaluate(out / "model", test, precision="auto")["accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="continued pre-training steps")
    parser.add_argument("--sizes", default="100,300,1000", help="labelled training sentences per run")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="runs/dapt", help="working folder (a rerun reuses finished runs)")
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    (train_texts, train_labels), (test_texts, test_labels) = movie_review_split(seed=2005)
    test = [{"text": t, "label": y} for t, y in zip(test_texts, test_labels)]
    minilm = minilm_folder()
    started = time.perf_counter()
    dapt = continue_pretraining(train_texts, minilm, out / "pretrain", args.steps)
    pretrain_minutes = (time.perf_counter() - started) / 60
    results = []
    for size in map(int, args.sizes.split(",")):
        rows = {"direct": [], "dapt": []}
        for seed in range(1, args.seeds + 1):
            pick = np.random.default_rng(seed).permutation(len(train_texts))[:size]
            train = [{"text": train_texts[i], "label": train_labels[i]} for i in pick]
            for arm, model in (("direct", str(minilm)), ("dapt", dapt["model"])):
                accuracy = fine_tuned_accuracy(model, train, test, out / f"n{size}" / f"{arm}-{seed}", seed)
                rows[arm].append(accuracy)
                print(f"N={size} seed={seed} {arm}: {accuracy:.4f}", flush=True)
        difference = paired_difference(rows["dapt"], rows["direct"])
        results.append({"size": size, "accuracy": rows, "direct": mean_interval(rows["direct"]).to_json(),
                        "dapt": mean_interval(rows["dapt"]).to_json(), "dapt_minus_direct": difference.to_json(),
                        "resolved": difference.resolved})
    report = {"what": "all-MiniLM-L6-v2 continued with masked LM on the movie-review training sentences, then "
                      "fine-tuned on N of them, against fine-tuning it directly (test accuracy, paired by seed)",
              "cpu": cpu_name(), "threads": args.threads, "torch": torch.__version__,
              "python": platform.python_version(), "steps": args.steps, "seeds": args.seeds,
              "pretrain_minutes": round(pretrain_minutes, 2), "pretrain": dapt, "results": results,
              "minutes": round((time.perf_counter() - started) / 60, 2)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
