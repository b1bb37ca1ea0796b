"""How long the demo's fine-tunings must run: held-out accuracy of the demo's curve cells at several
fine-tuning lengths, so that the demo's recipe runs long enough that more steps no longer help either
starting point.

For each task of the demo (movie reviews, Brown part-of-speech tagging), each size of ``--sizes``, each
start (random initialisation and a pre-trained checkpoint of the demo's model, ``--own``) and each seed
of ``--seeds``, a cell runs exactly as the demo runs it (`bertforge.demo.curve.run_cell`: the range test
on the subset, then the fine-tuning) under each recipe of ``--lengths`` (``EPOCHS:MIN_STEPS``). The
cells of two lengths share subset, seed and head, so the longer minus the shorter is paired.

The choice is made on data the demo's report never sees: the seeds differ from the demo's (100, 101,
... by default, the demo's are 0 to 4), and the cells are scored on a pilot set of training examples
(the last ``--pilot`` of a fixed permutation of the training set, outside every pilot subset), not on
the held-out set the demo reports.

Run (from the repository root; about 10 minutes on 2 cores)::

    .venv/bin/python benchmarks/demo_finetune_steps.py --own 'own pre-training=runs/demo/pretrain/model' \
        --vocab runs/demo/vocab --json docs/results/demo_finetune_steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--own", action="append", required=True, help="NAME=FOLDER: a pre-trained checkpoint of the "
                   "demo's model (repeat to compare several, e.g. pre-trained with and without NSP)")
    p.add_argument("--vocab", type=Path, required=True, help="the demo's vocab folder")
    p.add_argument("--sizes", default="100,1000")
    p.add_argument("--seeds", default="100,101,102")
    p.add_argument("--lengths", default="10:300,20:600", help="EPOCHS:MIN_STEPS,... fine-tuning lengths")
    p.add_argument("--pilot", type=int, default=1000, help="training examples held apart as the pilot set")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--precision", default="auto")
    p.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertforge-steps")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()

    import torch

    from bertforge import resources
    from bertforge.demo.curve import CurveTask, FinetuneSettings, Start, run_curve
    from bertforge.demo.run import DemoConfig, _random_init
    from bertforge.experiments.datasets import brown_split
    from bertforge.stats import mean_interval, paired_difference
    from bertforge.text.tokenizer import BertTokenizer
    from bertforge.train.precision import cpu_name, resolve_precision

    demo = DemoConfig()
    sizes = [int(s) for s in args.sizes.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    lengths = [tuple(float(x) for x in part.split(":")) for part in args.lengths.split(",")]
    precision = resolve_precision(args.precision, torch.device("cpu"))
    (mr_x, mr_y), _ = resources.movie_review_split(demo.mr_split_seed)
    pos_train, _ = brown_split(demo.seed, 0.1)
    tasks = []
    for name, family, examples in (("movie reviews", "classification", list(zip(mr_x, mr_y))),
                                   ("pos", "tagging", pos_train)):
        order = np.random.default_rng(12345).permutation(len(examples))
        pool = [examples[i] for i in order[:-args.pilot]]
        pilot = [examples[i] for i in order[-args.pilot:]]
        tasks.append(CurveTask(name, family, pool, pilot))
    tok = BertTokenizer.from_pretrained(args.vocab)
    owns = [tuple(spec.split("=", 1)) if "=" in spec else ("own pre-training", spec) for spec in args.own]
    starts = [_random_init(args.work / "random-init", demo, tok),
              *(Start(name, lambda seed, f=Path(folder): f) for name, folder in owns)]
    workers = args.workers or os.cpu_count() or 1
    results: dict = {"meta": {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpu": cpu_name(),
                              "cores": os.cpu_count(), "precision": precision, "own": dict(owns),
                              "seeds": seeds, "sizes": sizes, "pilot_examples": args.pilot,
                              "loadavg_before": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
                     "accuracy": {}, "lr": {}, "longer_minus_shorter": {}}
    for task in tasks:
        for epochs, min_steps in lengths:
            key = f"{epochs:g} epochs, at least {min_steps:g} steps"
            recipe = FinetuneSettings(epochs=epochs, min_steps=int(min_steps), batch_size=demo.finetune_batch_size,
                            max_seq_length=demo.finetune_max_seq_length, dropout=demo.finetune_dropout,
                            precision=precision, range_top=demo.range_top, range_steps=demo.range_steps)
            t0 = time.perf_counter()
            curve = run_curve(starts, task, sizes, lambda n: seeds, recipe, args.work / "cells", float("inf"),
                              workers=workers)
            print(f"{task.name}, {key}: " + ", ".join(f"{s} {n}: {curve.mean(s, n):.4f}" for s in curve.accuracy
                                                        for n in sizes) + f" ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
            results["accuracy"].setdefault(task.name, {})[key] = {
                s: {str(n): v for n, v in by.items()} for s, by in curve.accuracy.items()}
            results["lr"].setdefault(task.name, {})[key] = {s: {str(n): v for n, v in by.items()}
                                                           for s, by in curve.lr.items()}
    for task in results["accuracy"]:
        keys = list(results["accuracy"][task])
        short, long = keys[0], keys[-1]
        out = results["longer_minus_shorter"].setdefault(task, {})
        for start in results["accuracy"][task][short]:
            for n in map(str, sizes):
                d = paired_difference(results["accuracy"][task][long][start][n],
                                      results["accuracy"][task][short][start][n])
                out[f"{start}, {n}"] = {**d.to_json(), "resolved": d.resolved,
                                        "shorter": mean_interval(results["accuracy"][task][short][start][n]).to_json()}
    results["meta"]["loadavg_after"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    for task, by in results["longer_minus_shorter"].items():
        for k, v in by.items():
            print(f"{task}, {k}: longer minus shorter {100 * v['mean']:+.1f} [{v['low'] and 100 * v['low']:+.1f}, "
                  f"{v['high'] and 100 * v['high']:+.1f}] {'resolved' if v['resolved'] else 'not resolved'}")


if __name__ == "__main__":
    main()
