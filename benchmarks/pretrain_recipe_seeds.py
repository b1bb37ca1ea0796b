"""The budget recipe's settings decided over seeds: held-out MLM accuracy of the demo's pre-training
with each setting changed, several seeds per setting, paired by seed.

Each ``--setting NAME:key=value,...`` is the budget recipe (`bertforge.train.pretrain.RECIPES`) with
those keys changed (an empty list: the recipe as it is). Every setting runs on every seed of
``--seeds``; a seed fixes the initialisation, the data order and the masks, so two settings on the
same seed differ by the setting alone and are compared seed by seed (`bertforge.stats`).

The data is the demo's: ``bertforge demo``'s corpus (95 % of the Wikipedia leads and the movie-review
training sentences without labels), its 8,192-piece vocab and instances of 64 tokens (sentence pairs,
dupe_factor 5), the other 5 % of the leads as the held-out set; prepared once under ``--work``.

Measurement. The runs of one seed train at the same time, one process each with ``--threads``
threads, so that whatever else loads the machine loads every setting of a seed alike, and each
gets ``--minutes`` of its own training clock (the budget recipe lays its schedule over it). With four
settings on two cores, a run has about half a core: ``--minutes 16`` gives each about the updates of
8 minutes of one core. Each run ends with the held-out evaluation (MLM accuracy over every held-out
instance; NSP accuracy where the objective has NSP).

Run (from the repository root; about 50 minutes for 4 settings x 3 seeds at 16 minutes)::

    .venv/bin/python benchmarks/pretrain_recipe_seeds.py --minutes 16 --seeds 0,1,2 \
        --setting 'recipe:' --setting 'nsp:objective=mlm+nsp' --setting 'dropout:dropout=0.1' \
        --setting 'nsp+dropout:objective=mlm+nsp,dropout=0.1' --json docs/results/pretrain_recipe_seeds.json

The report: each setting's mean held-out MLM accuracy with its 95 % interval, and each setting's
paired difference from the first with its interval and whether it is resolved (the interval
excludes 0). With a 2 x 2 design (the first setting, two single changes and both), each change's
main effect is also given: per seed, the mean over the other factor's two levels.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def parse_setting(spec: str) -> tuple[str, dict[str, Any]]:
    """``"nsp:objective=mlm+nsp,dropout=0.1"`` -> ("nsp", {"objective": "mlm+nsp", "dropout": 0.1})."""
    name, _, rest = spec.partition(":")
    changes = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            raise SystemExit(f"--setting {spec!r}: {part!r} is not key=value")
        changes[key.strip()] = yaml.safe_load(value)
    return name.strip(), changes


def prepare_data(work: Path) -> dict[str, str]:
    """The demo's vocab and prepared instances under ``work`` (built once)."""
    from bertforge.demo import run as demo

    cfg = demo.DemoConfig(out=str(work), published_checkpoint=False)
    if not (work / "pretrain-heldout" / "manifest.json").is_file():
        state = demo._Run(cfg, work, demo._Step(), {}, {})
        data = demo._fetch_data(state)
        corpus, held_out = demo._write_pretraining_text(state, data)
        demo._learn_vocab(state, corpus, data)
        demo._prepare_instances(state, corpus, held_out)
    return {"data": str(work / "pretrain-data"), "eval_data": str(work / "pretrain-heldout"),
            "tokenizer": str(work / "vocab")}


def worker(spec: str) -> None:
    """One run (in its own process): the budget recipe with the changes in ``spec`` (JSON)."""
    import torch

    from bertforge.train.pretrain import PretrainConfig, pretrain

    job = json.loads(spec)
    torch.set_num_threads(job["threads"])
    cfg = PretrainConfig.from_recipe("budget", **job["paths"], out=job["out"], seed=job["seed"],
                                     budget_minutes=job["minutes"], max_steps=10**9, precision=job["precision"],
                                     eval_every=10**9, eval_batches=10**6, log_every=100, checkpoint_every=10**9,
                                     keep_checkpoints=1, overwrite=True, progress=False, **job["changes"])
    t0 = time.perf_counter()
    result = pretrain(cfg)
    print(json.dumps({"steps": result.step, "wall_seconds": round(time.perf_counter() - t0, 1),
                      "objective": cfg.resolve_objective(True), "dropout": cfg.dropout,
                      **{k: float(v) for k, v in result.eval_metrics.items()}}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setting", action="append", default=[], help="NAME:key=value,... (repeat; the first is the "
                   "reference the others are compared with)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--minutes", type=float, default=16.0, help="each run's training clock")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", default="auto")
    p.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertforge-recipe-seeds")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    from bertforge.stats import mean_interval, paired_difference
    from bertforge.train.precision import cpu_name

    settings = [parse_setting(s) for s in args.setting] or [("recipe", {})]
    seeds = [int(s) for s in args.seeds.split(",")]
    paths = prepare_data(args.work)
    meta = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpu": cpu_name(), "cores": os.cpu_count(),
            "python": platform.python_version(), "loadavg_before": os.getloadavg(), "minutes": args.minutes,
            "threads": args.threads, "seeds": seeds, "settings": {n: c for n, c in settings},
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in settings}
    for seed in seeds:  # the settings of a seed side by side: a load on the machine hits them alike
        procs = {}
        for name, changes in settings:
            job = {"paths": paths, "out": str(args.work / "runs" / f"{name}-seed{seed}"), "seed": seed,
                   "minutes": args.minutes, "threads": args.threads, "precision": args.precision, "changes": changes}
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            procs[name] = subprocess.Popen([sys.executable, __file__, "--json", "-", "--worker", json.dumps(job)],
                                           stdout=subprocess.PIPE, text=True, env=env)
        for name, proc in procs.items():
            out, _ = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"{name} seed {seed}: exit {proc.returncode}")
            runs[name].append({"seed": seed, **json.loads(out.strip().splitlines()[-1])})
            print(f"seed {seed} {name}: {runs[name][-1]}", flush=True)
    meta["loadavg_after"] = os.getloadavg()
    acc = {name: [r["mlm_accuracy"] for r in rs] for name, rs in runs.items()}
    ref = settings[0][0]
    summary: dict[str, Any] = {
        "mlm_accuracy": {n: mean_interval(a).to_json() for n, a in acc.items()},
        f"minus {ref}": {n: (d := paired_difference(a, acc[ref])).to_json() | {"resolved": d.resolved}
                         for n, a in acc.items() if n != ref}}
    names = [n for n, _ in settings]
    if len(names) == 4:  # a 2 x 2 design: reference, change A, change B, both
        a, b, both = names[1:]
        effect_a = [((x - r) + (y - z)) / 2 for r, x, z, y in zip(acc[ref], acc[a], acc[b], acc[both])]
        effect_b = [((x - r) + (y - z)) / 2 for r, x, z, y in zip(acc[ref], acc[b], acc[a], acc[both])]
        for name, eff in ((a, effect_a), (b, effect_b)):
            iv = mean_interval(eff)
            summary[f"main effect of {name}"] = iv.to_json() | {"resolved": iv.resolved, "per_seed": eff}
    result = {"meta": meta, "runs": runs, "summary": summary}
    text = json.dumps(result, indent=1) + "\n"
    if str(args.json) == "-":
        print(text)
    else:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    for n, iv in summary["mlm_accuracy"].items():
        print(f"{n}: MLM accuracy {iv['mean']:.4f} [{iv['low']}, {iv['high']}] over {iv['n']} seeds")
    for key, value in summary.items():
        if key != "mlm_accuracy":
            print(key, json.dumps(value))


if __name__ == "__main__":
    main()
