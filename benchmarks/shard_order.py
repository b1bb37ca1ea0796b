"""Held-out MLM accuracy of the same pre-training with the shards read one by one and shuffled together.

A shard is a stretch of the corpus (its documents, each ``dupe_factor`` times), so a loader that reads
shards one at a time trains on one stretch for a while and ends the run on whichever came last. This
pre-trains the demo's model (budget recipe, tiny, its fitted schedule) on a demo run's prepared data for
the same minutes of training clock at each ``--shuffle-shards`` value, alone on the machine, and scores
each final model on the whole held-out set (the same instances and masks for every arm).

Run (from the repository root, after ``bertforge demo --out runs/demo`` has prepared its data; two arms of
9 minutes take about 19)::

    .venv/bin/python benchmarks/shard_order.py --demo runs/demo --minutes 9 --arms 1,8 \\
        --json docs/results/shard_order.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", type=Path, required=True, help="a demo run folder (pretrain-data, pretrain-heldout, vocab)")
    p.add_argument("--minutes", type=float, default=9.0, help="training clock of each arm")
    p.add_argument("--arms", default="1,8", help="--shuffle-shards values, comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from bertforge.demo.run import DemoConfig
    from bertforge.train.precision import cpu_name, native_bf16
    from bertforge.train.pretrain import pretrain

    import torch

    precision = "bf16" if native_bf16(torch.device("cpu")) else "fp32"
    cfg = DemoConfig(seed=args.seed)
    arms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for window in (int(a) for a in args.arms.split(",")):
            pcfg = cfg.pretraining(
                data=str(args.demo / "pretrain-data"), eval_data=str(args.demo / "pretrain-heldout"),
                tokenizer=str(args.demo / "vocab"), out=str(Path(tmp) / f"w{window}"), budget_minutes=args.minutes,
                max_steps=10**9, max_time_minutes=2 * args.minutes, precision=precision, eval_every=10**9,
                eval_batches=10**6, log_every=20, checkpoint_every=10**9, keep_checkpoints=0,
                shuffle_shards=window, progress=False)
            result = pretrain(pcfg)
            arms[str(window)] = {"steps": result.step, "heldout": result.eval_metrics}
            print(window, arms[str(window)], file=sys.stderr, flush=True)
    out = {"cpu": cpu_name(), "precision": precision, "model": cfg.model, "recipe": cfg.pretrain_recipe,
           "minutes": args.minutes, "seed": args.seed, "data": str(args.demo / "pretrain-data"),
           "shuffle_shards": arms}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
