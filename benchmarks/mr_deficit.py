"""Why the demo's own pre-trained model falls below random initialisation on 1,000 movie reviews, by
measurement:

1. **The learning rate.** Random initialisation and each ``--own`` checkpoint are fine-tuned on the demo's
   subsets of ``--size`` movie reviews (the demo's seeds 0, 1, ...) at each rate of ``--rates``, the same
   rates for every start (no range test), and scored on the demo's held-out sentences. Own minus random at
   each rate, paired by seed: if the own model is below at every rate, the range test's choice does not
   explain the deficit.
2. **What the classifier reads.** For each model, the last layer's [CLS] vectors of ``--probe`` training
   sentences: their mean pairwise cosine (near 1: every sentence looks alike to the classifier) and the
   share of their variance off the mean vector; and the scale of the weights (RMS by group), since
   pre-training moves weights away from the initialisation's scale.

Every figure is reported, none chosen: the rates are a grid fixed in advance, and the held-out scores say
how each start does at each, as the demo's table does at the range test's rate.

Run (from the repository root; about 15 minutes on 2 cores for two starts and four rates)::

    .venv/bin/python benchmarks/mr_deficit.py --vocab runs/demo/vocab \\
        --own 'own pre-training=runs/demo/pretrain/model' --json docs/results/mr_deficit.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def cls_geometry(folder: Path, vocab: Path, texts: list[str]) -> dict[str, float]:
    """The last layer's [CLS] vectors of ``texts`` through the encoder in ``folder``: mean pairwise cosine, and
    the share of their total variance that lies off their mean (1 - |mean|^2 / mean |v|^2)."""
    import torch

    from bertforge.serving.features import BertModelWithoutPooler
    from bertforge.text.tokenizer import BertTokenizer

    model = BertModelWithoutPooler.from_pretrained(folder).eval()
    tok = BertTokenizer.from_pretrained(vocab)
    vectors = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            batch = tok(texts[i:i + 64], padding=True, truncation=True, max_length=64, return_tensors="pt")
            vectors.append(model(**batch).last_hidden_state[:, 0].float())
    v = torch.cat(vectors).double()
    unit = torch.nn.functional.normalize(v, dim=1)
    n = len(unit)
    cos = (unit @ unit.T).sum().item()
    mean_cos = (cos - n) / (n * (n - 1))
    spread = 1 - float(v.mean(0).pow(2).sum() / v.pow(2).sum(1).mean())
    return {"mean_pairwise_cosine": round(mean_cos, 4), "variance_off_the_mean": round(spread, 4),
            "norm_mean": round(float(v.norm(dim=1).mean()), 3)}


def weight_scale(folder: Path) -> dict[str, float]:
    """RMS of the encoder's weights by group, averaged over layers."""
    from bertforge.serving.features import BertModelWithoutPooler

    model = BertModelWithoutPooler.from_pretrained(folder)
    groups: dict[str, list[float]] = {}
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            continue
        group = ("word embeddings" if "word_embeddings" in name else "position embeddings" if "position" in name
                 else "LayerNorm gains" if "LayerNorm" in name else "attention" if "attention" in name
                 else "feed-forward" if "intermediate" in name or "output.dense" in name else "other")
        groups.setdefault(group, []).append(float(p.detach().float().pow(2).mean().sqrt()))
    return {g: round(float(np.mean(v)), 4) for g, v in groups.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--own", action="append", required=True, help="NAME=FOLDER: a pre-trained checkpoint of the "
                   "demo's model (repeat for several, e.g. checkpoints after more minutes of pre-training)")
    p.add_argument("--vocab", type=Path, required=True, help="the demo's vocab folder")
    p.add_argument("--size", type=int, default=1000)
    p.add_argument("--seeds", type=int, default=5, help="the demo's seeds 0, 1, ...")
    p.add_argument("--rates", default="1e-4,3e-4,1e-3,3e-3")
    p.add_argument("--probe", type=int, default=1000, help="training sentences whose [CLS] vectors are compared")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertforge-mr-deficit")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()

    import torch

    from bertforge import resources
    from bertforge.demo.curve import Cell, CurveTask, finetune_steps, run_cells, subset
    from bertforge.demo.run import DemoConfig, _finetuning, _random_init
    from bertforge.stats import mean_interval, paired_difference
    from bertforge.text.tokenizer import BertTokenizer
    from bertforge.train.precision import cpu_name, native_bf16

    demo = DemoConfig()
    precision = "bf16" if native_bf16(torch.device("cpu")) else "fp32"
    finetuning = _finetuning(demo, precision)
    (mr_x, mr_y), (dev_x, dev_y) = resources.movie_review_split(demo.mr_split_seed)
    task = CurveTask("movie reviews", "classification", list(zip(mr_x, mr_y)), list(zip(dev_x, dev_y)))
    args.work.mkdir(parents=True, exist_ok=True)
    heldout = task.write(args.work / "heldout.jsonl", task.heldout)
    seeds = list(range(args.seeds))
    files = {s: task.write(args.work / f"train-{s}.jsonl", [task.train[i] for i in subset(len(task.train), args.size, s)])
             for s in seeds}
    tok = BertTokenizer.from_pretrained(args.vocab)
    random = _random_init(args.work / "random-init", demo, tok)
    starts = {"random initialisation": random.folder}
    starts.update({name: (lambda seed, f=Path(folder): f) for name, folder in
                   (spec.split("=", 1) if "=" in spec else ("own pre-training", spec) for spec in args.own)})
    rates = [float(r) for r in args.rates.split(",")]
    steps = finetune_steps(args.size, finetuning)
    cells = [Cell(name, args.size, s, str(folder(s)), str(files[s]), str(heldout), steps, task.settings(),
                  finetuning, str(args.work / f"run-{k}"), cost=1.0, lr=lr)
             for k, (name, folder, lr, s) in enumerate((n, f, lr, s) for n, f in starts.items() for lr in rates
                                                        for s in seeds)]
    t0 = time.perf_counter()
    results = run_cells(cells, args.workers or os.cpu_count() or 1)
    accuracy: dict[str, dict[str, list[float]]] = {}
    for cell, r in zip(cells, results):
        accuracy.setdefault(cell.start, {}).setdefault(f"{cell.lr:g}", []).append(r["accuracy"])
    differences = {name: {rate: {**(d := paired_difference(accs, accuracy["random initialisation"][rate])).to_json(),
                                 "resolved": d.resolved} for rate, accs in by.items()}
                   for name, by in accuracy.items() if name != "random initialisation"}
    probe = [mr_x[i] for i in np.random.default_rng(0).permutation(len(mr_x))[:args.probe]]
    geometry = {name: {**cls_geometry(folder(seeds[0]), args.vocab, probe), "weights": weight_scale(folder(seeds[0]))}
                for name, folder in starts.items()}
    report = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpu": cpu_name(),
              "precision": precision, "size": args.size, "seeds": seeds, "steps": steps, "rates": rates,
              "accuracy": accuracy, "interval": {n: {r: mean_interval(a).to_json() for r, a in by.items()}
                                                 for n, by in accuracy.items()},
              "own minus random initialisation": differences, "cls_and_weights": geometry,
              "seconds": round(time.perf_counter() - t0, 1)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for name, by in differences.items():
        for rate, d in by.items():
            print(f"{name} minus random initialisation at lr {rate}: {100 * d['mean']:+.1f} "
                  f"({'resolved' if d['resolved'] else 'not resolved'})")
    for name, g in geometry.items():
        print(f"{name}: [CLS] mean pairwise cosine {g['mean_pairwise_cosine']}, variance off the mean "
              f"{g['variance_off_the_mean']}; weights {g['weights']}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
