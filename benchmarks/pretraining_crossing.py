"""How many minutes of bertforge's own pre-training until its model beats what a practitioner would use
instead: the paper's Figure 5 taken to where it answers that.

Each arm of ``--arms`` (by default presets: the demo's tiny one and a larger one) is pre-trained once on
the demo's text (Wikipedia lead sections and the movie-review training sentences without labels, the demo's
vocab and instances) with the budget recipe laid over ``--minutes`` of training clock, keeping checkpoints near
``--at`` minutes. Each checkpoint, the same model from random initialisation, all-MiniLM-L6-v2 and the
classic baselines (a CRF and the most-frequent-tag floor on part-of-speech tagging, TF-IDF logistic regression
on movie reviews; `bertforge.experiments.baselines`) are then fine-tuned / fitted on ``--sizes`` examples of
both demo tasks under the demo's protocol (`bertforge.demo.curve.run_cell`: a learning-rate range test on the
subset, then the fine-tuning; nothing chosen on the held-out sentences), on the demo's subsets and seeds, so
every line pairs by seed. Reported per arm, task and size: the first checkpoint whose paired difference
from random initialisation, and from the best classic baseline, has a 95% interval above 0, or "not within
N minutes".

``--arms`` names what is pre-trained: a size preset (``tiny``), or a name with demo settings that differ
from the demo's (``brown:tagging_text_in_pretraining=true``, ``cased:cased=true``,
``mini128:model=mini:max_seq_length=128``, ``tiny-s1:seed=1``, ``last:tag_piece=last``), each its own
pre-training (and its own text, vocab and instances where its settings change them; an arm that changes only
fine-tuning settings fine-tunes the earlier arm's pre-training; the tasks' data stay the demo's whatever the
arm's seed). Every arm after the first is also reported against the first, checkpoint by checkpoint, paired
by seed. ``--pilot`` runs the whole study on pilot data instead, to choose a recipe change that the reported
scores never see: a tenth of the Brown training texts (whole texts) and a tenth of the movie-review training
sentences become the held-out sets, and neither is in the pre-training text; the report's held-out sentences
are not scored.

Resumable: every step leaves its result in ``--work`` (pre-training resumes from its last checkpoint, each
fine-tuning is a JSON file), so rerunning the same command continues where a stopped run left off. The
pre-training's minutes are its training clock: run nothing else on the machine meanwhile.

Run (from the repository root; several hours on 2 cores, over as many sittings as it takes)::

    .venv/bin/python benchmarks/pretraining_crossing.py --work runs/crossing \\
        --json docs/results/pretraining_crossing.json --plot docs/images/pretraining_crossing.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any


logger = logging.getLogger("bertforge")

TASKS = ("pos", "movie reviews")
CLASSIC = {"pos": ("CRF", "most frequent tag"), "movie reviews": ("TF-IDF + logistic regression",)}
"""Each task's classic lines; the first is the one the crossing is measured against (the practitioner's choice)."""


def cpu_description() -> dict[str, Any]:
    """The CPU as /proc/cpuinfo names it (vendor, family, model, name) and bertforge's unit summary."""
    from bertforge.train.precision import cpu_name

    info: dict[str, Any] = {"summary": cpu_name(), "cores": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key in ("vendor_id", "cpu family", "model", "model name") and key not in info:
                info[key] = value
            if not line.strip() and "model" in info:
                break
    except OSError:
        pass
    limits = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
              if k in os.environ}
    if limits:
        info["kernel_limits"] = limits
    return info


def write_json(path: Path, value: Any) -> None:
    from bertforge.io import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(value, indent=1) + "\n")


# ---------------------------------------------------------------------------- arms and the demo's data
PRETRAINING_DATA = ("task_text_in_pretraining", "tagging_text_in_pretraining", "vocab_size", "cased",
                    "max_seq_length", "dupe_factor", "seed")
"""The demo settings that change the pre-training text, vocab or instances: an arm that changes one gets its
own."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One pre-training of the study: its name and the demo settings it changes."""

    name: str
    settings: dict[str, Any]

    def config(self, demo: Any) -> Any:
        return dataclasses.replace(demo, **self.settings)

    def data_key(self) -> str:
        """The folder name of its pre-training data: "data" for the demo's, else one named by what differs."""
        changed = [f"{k}={self.settings[k]}" for k in PRETRAINING_DATA if k in self.settings]
        return "-".join(["data", *changed]).replace("_in_pretraining", "")


def parse_arms(text: str) -> list[Arm]:
    """``--arms``: comma-separated ``NAME[:setting=value...]``; a bare preset name sets the model size."""
    from bertforge.demo.run import DemoConfig
    from bertforge.model.config import PRESETS
    from bertforge.settings import read_settings

    arms = []
    for spec in filter(None, text.split(",")):
        name, *pairs = spec.split(":")
        raw: dict[str, Any] = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq:
                raise SystemExit(f"--arms {spec}: expected setting=value, got {pair!r}")
            try:
                raw[key] = json.loads(value)
            except json.JSONDecodeError:
                raw[key] = value
        if "model" not in raw and name in PRESETS:
            raw["model"] = name
        try:
            settings = read_settings(DemoConfig, raw, f"--arms {name}")
        except ValueError as e:
            raise SystemExit(str(e)) from None
        arms.append(Arm(name, settings))
    if len({a.name for a in arms}) != len(arms):
        raise SystemExit(f"--arms: names must differ, got {text!r}")
    return arms


def demo_data(work: Path, pilot: bool) -> tuple[Any, Any]:
    """(DemoConfig, the fetched data): the demo's, or with ``pilot`` its pilot split, the tenths of the
    training sets that stand in for the held-out sets."""
    from bertforge.demo.run import DemoConfig, _fetch_data, _Run, _Step

    cfg = DemoConfig(out=str(work / "data"))
    data = _fetch_data(_Run(cfg, work, _Step(), {}, {}))
    if pilot:
        data = pilot_split(data, cfg)
    return cfg, data


def pilot_split(data: Any, cfg: Any) -> Any:
    """The demo's data with a tenth of each training set as the held-out set: Brown texts (whole, the
    demo's number of sentences drawn from them) and movie-review sentences, both seeded."""
    from bertforge.experiments.datasets import brown_pilot_split, seeded_first, split_order

    pos_train, pos_dev = brown_pilot_split(cfg.seed, 0.1, 0.1)
    pos_dev = seeded_first(pos_dev, cfg.seed, cfg.pos_heldout)
    dev, train = split_order(len(data.mr_train), cfg.mr_split_seed + 1, 0.1)
    pick = lambda items, idx: [items[i] for i in idx]  # noqa: E731
    logger.info(f"pilot split: movie reviews {len(train):,} training / {len(dev):,} held-out sentences, Brown corpus "
                f"{len(pos_train):,} training / {len(pos_dev):,} held-out tagged sentences (held-out texts whole)")
    return data._replace(mr_train=pick(data.mr_train, train), mr_train_y=pick(data.mr_train_y, train),
                         mr_dev=pick(data.mr_train, dev), mr_dev_y=pick(data.mr_train_y, dev), pos_train=pos_train,
                         pos_heldout=pos_dev)


def pretraining_data(work: Path, cfg: Any, data: Any, key: str) -> dict[str, Path]:
    """The pre-training text, vocab and instances of settings ``cfg`` under ``work/key`` (made once):
    {"vocab", "data", "eval"} folders."""
    from bertforge.demo.run import _learn_vocab, _prepare_instances, _Run, _Step, _write_pretraining_text

    out = work / key
    out.mkdir(parents=True, exist_ok=True)
    folders = {"vocab": out / "vocab", "data": out / "pretrain-data", "eval": out / "pretrain-heldout"}
    if not (out / "prepared.json").is_file():
        run = _Run(dataclasses.replace(cfg, out=str(out)), out, _Step(), {}, {})
        corpus, held_out = _write_pretraining_text(run, data)
        _learn_vocab(run, corpus, data)
        _prepare_instances(run, corpus, held_out)
        write_json(out / "prepared.json", {k: str(v) for k, v in folders.items()})
    return folders


# ---------------------------------------------------------------------------- pre-training with checkpoints
def pretrain_model(arm: Arm, cfg: Any, minutes: float, at: list[float], work: Path,
                   folders: dict[str, Path]) -> list[dict[str, Any]]:
    """Pre-train ``arm`` (demo settings ``cfg``) with the budget recipe over ``minutes`` of training clock
    (resuming a stopped run), checkpoints every half minute of steps; keep those nearest ``at`` and the final
    model. Returns [{"minutes", "folder", "heldout_mlm_accuracy"}] by minutes."""
    import torch

    from bertforge.demo.run import time_pretraining_step
    from bertforge.text.tokenizer import BertTokenizer
    from bertforge.train.pretrain import pretrain
    from bertforge.train.state import read_info

    run = work / f"pretrain-{arm.name}"
    record = run / "crossing.json"
    if record.is_file():
        return json.loads(record.read_text())["checkpoints"]
    cpu, started = cpu_description(), run / "cpu.json"
    if started.is_file() and json.loads(started.read_text()) != cpu:  # minutes on two CPUs do not add up
        logger.warning(f"{run} was started on another CPU ({started.read_text().strip()}): pre-training afresh")
        shutil.rmtree(run)
    if not started.is_file():
        write_json(started, cpu)
    vocab_size = BertTokenizer.from_pretrained(folders["vocab"]).vocab_size
    seconds = time_pretraining_step(cfg, vocab_size, "bf16" if _native_bf16() else "fp32", torch.device("cpu"))
    every = max(1, int(30 / seconds))  # a checkpoint (and a held-out evaluation) every ~30 s of training
    pcfg = cfg.pretraining(data=str(folders["data"]), eval_data=str(folders["eval"]), tokenizer=str(folders["vocab"]),
                           out=str(run), budget_minutes=minutes, max_steps=10**9, precision="auto",
                           eval_every=every, eval_batches=20, log_every=50, checkpoint_every=every,
                           keep_checkpoints=0, progress=False, resume=(run / "run_config.json").is_file())
    logger.info(f"pre-training {arm.name}: {minutes:g} minutes of training clock, a checkpoint every {every} steps "
                f"(a step timed at {seconds:.3f} s)")
    result = pretrain(pcfg)
    if result.interrupted:
        raise KeyboardInterrupt(f"pre-training stopped at step {result.step}: rerun to resume")
    evals = {r["step"]: r["mlm_accuracy"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r.get("split") == "eval" and "mlm_accuracy" in r}
    found = sorted((float(read_info(p)["elapsed_seconds"]) / 60, int(read_info(p)["step"]), p)
                   for p in (run / "checkpoints").iterdir() if p.is_dir())
    found = [f for f in found if f[1] < result.step]  # the last checkpoint is the final model
    picked = {min(found, key=lambda f: abs(f[0] - m))[2] for m in at if m < minutes and found}
    checkpoints = [{"minutes": round(m, 2), "step": step, "folder": str(p), "heldout_mlm_accuracy": evals.get(step)}
                   for m, step, p in found if p in picked]
    for _, _, p in found:
        if p not in picked:
            shutil.rmtree(p)
    checkpoints.append({"minutes": round(result.elapsed_seconds / 60, 2), "step": result.step, "folder": str(run / "model"),
                        "heldout_mlm_accuracy": result.eval_metrics.get("mlm_accuracy")})
    write_json(record, {"model": arm.name, "settings": arm.settings, "checkpoints": checkpoints,
                        "step_seconds_timed": seconds})
    return checkpoints


def _native_bf16() -> bool:
    import torch

    from bertforge.train.precision import native_bf16

    return native_bf16(torch.device("cpu"))


# ---------------------------------------------------------------------------- the cells
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("runs/crossing"))
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--plot", type=Path)
    p.add_argument("--arms", default="tiny,mini", help="what to pre-train, comma-separated: a preset, or "
                   "NAME:setting=value:... (demo settings; the first arm is the one the others are compared with)")
    p.add_argument("--pilot", action="store_true", help="the pilot split: held-out sets from the training sets")
    p.add_argument("--minutes", type=float, default=60.0, help="training clock of each pre-training")
    p.add_argument("--at", default="2,4,8,15,30", help="minutes of the checkpoints fine-tuned besides the last")
    p.add_argument("--sizes", default="100,1000")
    p.add_argument("--seeds", type=int, default=5, help="paired seeds: the demo's 0, 1, ...")
    p.add_argument("--workers", type=int, default=0, help="fine-tunings at once (0: one per core)")
    p.add_argument("--stage", choices=("all", "data", "pretrain"), default="all",
                   help="data: stop after preparing the pre-training text, vocab and instances (nothing timed); "
                   "pretrain: stop after pre-training")
    p.add_argument("--quick", action="store_true", help="a smoke run of the script: fine-tunings of 8 + 10 steps")
    args = p.parse_args()

    from bertforge.console import show_logs

    show_logs(verbose=False)
    from bertforge import resources
    from bertforge.demo.curve import Cell, CurveTask, Start, baseline_seconds, finetune_steps, run_cells, subset
    from bertforge.demo.run import MOVIE_REVIEWS, POS, _finetuning, _random_init
    from bertforge.experiments.baselines import require_baselines
    from bertforge.text.tokenizer import BertTokenizer

    require_baselines()
    work = args.work
    arms = parse_arms(args.arms)
    at = [float(m) for m in args.at.split(",")]
    sizes = [int(n) for n in args.sizes.split(",")]
    seeds = list(range(args.seeds))
    workers = args.workers or os.cpu_count() or 1

    demo, data = demo_data(work, args.pilot)
    configs = {a.name: a.config(demo) for a in arms}
    folders = {a.name: pretraining_data(work, configs[a.name], data, a.data_key()) for a in arms}
    if args.stage == "data":
        return
    checkpoints: dict[str, list[dict[str, Any]]] = {}
    pretraining = {a.name: (a.data_key(), configs[a.name].pretraining()) for a in arms}  # what a pre-training reads
    for a in arms:  # an arm that changes only fine-tuning settings fine-tunes an earlier arm's pre-training
        same = next(b for b in arms if pretraining[b.name] == pretraining[a.name])
        checkpoints[a.name] = checkpoints[same.name] if same is not a else \
            pretrain_model(a, configs[a.name], args.minutes, at, work, folders[a.name])
    if args.stage == "pretrain":
        return

    precision = "bf16" if _native_bf16() else "fp32"
    finetuning = {name: _finetuning(cfg, precision) for name, cfg in configs.items()}
    finetuning["published"] = finetuning["classic"] = _finetuning(demo, precision)
    if args.quick:
        finetuning = {k: dataclasses.replace(f, epochs=0.1, min_steps=10, range_steps=8) for k, f in finetuning.items()}
        demo = dataclasses.replace(demo, published_min_steps=10, published_epochs=0.1)
    tasks = {MOVIE_REVIEWS: CurveTask(MOVIE_REVIEWS, "classification", list(zip(data.mr_train, data.mr_train_y)),
                                      list(zip(data.mr_dev, data.mr_dev_y)), "sentences"),
             POS: CurveTask(POS, "tagging", data.pos_train, data.pos_heldout, "tagged sentences")}
    files = work / "files"
    files.mkdir(parents=True, exist_ok=True)
    heldout = {name: task.write(files / f"heldout-{name.replace(' ', '-')}{task.suffix}", task.heldout)
               for name, task in tasks.items()}
    subsets = {}
    for name, task in tasks.items():
        for n in sizes:
            for s in seeds:
                path = files / f"train-{name.replace(' ', '-')}-{n}-seed{s}{task.suffix}"
                if not path.is_file():
                    task.write(path, [task.train[i] for i in subset(len(task.train), n, s)])
                subsets[name, n, s] = path
    published = resources.minilm_folder()

    # every fine-tuned line as (arm, its Start); the published checkpoint runs the demo's own length for it
    lines: list[tuple[str, Start]] = []
    for a in arms:
        tok = BertTokenizer.from_pretrained(folders[a.name]["vocab"])
        lines.append((a.name, _random_init(work / f"random-{a.name}", configs[a.name], tok)))
        lines += [(a.name, Start(f"{c['minutes']:g} min", lambda seed, f=c["folder"]: Path(f)))
                  for c in checkpoints[a.name]]
    lines.append(("published", Start("all-MiniLM-L6-v2", lambda seed: published, min_steps=demo.published_min_steps,
                                     epochs=demo.published_epochs)))

    cells, keys = [], []
    for model, start in lines:
        for task_name, task in tasks.items():
            for n in sizes:
                for s in seeds:
                    key = f"{model}|{start.name}|{task_name}|{n}|{s}"
                    steps = finetune_steps(n, finetuning[model], start)
                    settings = dataclasses.replace(task, tag_piece=configs[model].tag_piece).settings() \
                        if model in configs else task.settings()
                    cells.append(Cell(start.name, n, s, str(start.folder(s)), str(subsets[task_name, n, s]),
                                      str(heldout[task_name]), steps, settings, finetuning[model],
                                      str(work / "runs" / _slug(key)), cost=steps * (8 if model == "published" else 1)))
                    keys.append(key)
    for task_name, task in tasks.items():
        for b in CLASSIC[task_name]:
            for n in sizes:
                for s in seeds:
                    key = f"classic|{b}|{task_name}|{n}|{s}"
                    cells.append(Cell(b, n, s, "", str(subsets[task_name, n, s]), str(heldout[task_name]), 0,
                                      task.settings(), finetuning["classic"], str(work / "runs" / _slug(key)),
                                      cost=baseline_seconds(b, n), baseline=b))
                    keys.append(key)
    results_dir = work / "cells"
    results_dir.mkdir(exist_ok=True)
    left = [i for i, (key, cell) in enumerate(zip(keys, cells))
            if not reusable(results_dir / f"{_slug(key)}.json", cell)]
    cells, keys = [cells[i] for i in left], [keys[i] for i in left]
    for cell in cells:  # what a stopped run left half-done starts afresh
        shutil.rmtree(cell.out, ignore_errors=True)
    logger.info(f"{len(cells)} fine-tunings and fits left, {workers} at once")
    t0 = time.perf_counter()

    def done(i: int, result: dict[str, Any]) -> None:
        write_json(results_dir / f"{_slug(keys[i])}.json", {"key": keys[i], **result, "ran_with": ran(cells[i])})
        logger.info(f"  [{time.perf_counter() - t0:6.0f} s] {keys[i]}: {result['accuracy']:.4f}")

    run_cells(cells, workers, done)
    report = summarise(work, arms, checkpoints, sizes, seeds, args.minutes, precision, args.pilot)
    write_json(args.json, report)
    if args.plot:
        plot(report, args.plot)
    logger.info(f"wrote {args.json}")


def ran(cell: Any) -> dict[str, Any]:
    """What a cell's result depends on besides its key: the task's and the fine-tuning's settings, its steps and
    the range test's rule."""
    from bertforge.demo.curve import RANGE_RULE

    return json.loads(json.dumps({"task": cell.task_settings, "finetuning": dataclasses.asdict(cell.finetuning),
                                  "steps": cell.steps, "baseline": cell.baseline,
                                  **({} if cell.baseline else {"range_rule": RANGE_RULE})}))


def reusable(path: Path, cell: Any) -> bool:
    """Whether the result at ``path`` is this cell's: there, and run with the same settings (a changed
    setting or default, such as the demo's tag piece, runs the cell again)."""
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("ran_with") == ran(cell)


def _slug(key: str) -> str:
    return key.replace("|", "__").replace(" ", "-").replace("+", "plus").replace("/", "-")


# ---------------------------------------------------------------------------- the report
def summarise(work: Path, arms: list[Arm], checkpoints: dict[str, list[dict[str, Any]]], sizes: list[int],
              seeds: list[int], minutes: float, precision: str, pilot: bool) -> dict[str, Any]:
    """The JSON: per arm ("model"), task and size, every line's per-seed accuracies (paired by index), each
    checkpoint's, and the first checkpoint resolved above random initialisation and above the classic baseline;
    every arm after the first also minus the first's checkpoint of the same rank."""
    from bertforge.demo.run import DemoConfig
    from bertforge.stats import paired_difference

    got = {}
    for f in (work / "cells").glob("*.json"):
        r = json.loads(f.read_text())
        got[r["key"]] = r["accuracy"]

    def accs(model: str, line: str, task: str, n: int) -> list[float]:
        return [got[f"{model}|{line}|{task}|{n}|{s}"] for s in seeds]

    runs, base = [], arms[0].name
    for a in arms:
        m = a.name
        for task in TASKS:
            for n in sizes:
                random, classic = accs(m, "random initialisation", task, n), accs("classic", CLASSIC[task][0], task, n)
                block: dict[str, Any] = {
                    "model": m, "settings": a.settings, "task": task, "size": n, "seeds": seeds,
                    **({"tag_piece": a.config(DemoConfig()).tag_piece} if task == "pos" else {}),
                    "random initialisation": random,
                    "classic baseline": classic, "classic baseline name": CLASSIC[task][0],
                    "all-MiniLM-L6-v2": accs("published", "all-MiniLM-L6-v2", task, n),
                    **{f"classic: {b}": accs("classic", b, task, n) for b in CLASSIC[task][1:]}, "checkpoints": []}
                first = {"random initialisation": None, "classic baseline": None}
                for rank, c in enumerate(checkpoints[m]):
                    own = accs(m, f"{c['minutes']:g} min", task, n)
                    point = {"minutes": c["minutes"], "step": c["step"], "heldout_mlm_accuracy": c["heldout_mlm_accuracy"],
                             "accuracy": own}
                    for line, other in (("random initialisation", random), ("classic baseline", classic)):
                        d = paired_difference(own, other)
                        point[f"minus {line}"] = {**d.to_json(), "resolved": d.resolved}
                        if first[line] is None and d.resolved and d.mean > 0:
                            first[line] = c["minutes"]
                    if m != base and rank < len(checkpoints[base]):
                        c0 = checkpoints[base][rank]
                        d = paired_difference(own, accs(base, f"{c0['minutes']:g} min", task, n))
                        point[f"minus {base}"] = {"minutes": c0["minutes"], **d.to_json(), "resolved": d.resolved}
                    block["checkpoints"].append(point)
                block["first resolved above"] = {k: v if v is not None else f"not within {minutes:g} minutes"
                                                 for k, v in first.items()}
                runs.append(block)
    heldout = ("the pilot split's held-out sets (a tenth of the Brown training texts, a tenth of the movie-review "
               "training sentences; neither in the pre-training text)" if pilot else "the demo's held-out sentences")
    return {"cpu": cpu_description(), "precision": precision, "minutes": minutes, "pilot": pilot, "protocol": (
        "the demo's: each line fine-tuned on the same subsets (seeds 0, 1, ...) after a learning-rate range test on "
        f"the subset; held-out accuracy on {heldout}, scored once"), "runs": runs}


def plot(report: dict[str, Any], path: Path) -> None:
    """Accuracy against minutes of pre-training, a panel per task and size, a line per model, with the
    classic baseline, random initialisation and all-MiniLM-L6-v2 as bands (mean and 95% interval)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from bertforge.stats import mean_interval

    panels = sorted({(r["task"], r["size"]) for r in report["runs"]})
    fig = Figure(figsize=(5.2 * len(panels), 4.4))
    FigureCanvasAgg(fig)
    for k, (task, n) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        blocks = [r for r in report["runs"] if (r["task"], r["size"]) == (task, n)]
        top = max(c["minutes"] for r in blocks for c in r["checkpoints"])
        for line, colour in (("classic baseline", "grey"), ("all-MiniLM-L6-v2", "tab:green")):
            iv = mean_interval(blocks[0][line])
            ax.axhspan(iv.low, iv.high, color=colour, alpha=0.2, linewidth=0)
            name = blocks[0]["classic baseline name"] if line == "classic baseline" else line
            ax.axhline(iv.mean, color=colour, linestyle="--", linewidth=1, label=name)
        for r in blocks:
            iv = mean_interval(r["random initialisation"])
            (ln,) = ax.plot([r["checkpoints"][0]["minutes"] / 2], [iv.mean], marker="x", linestyle="none")
            ivs = [mean_interval(c["accuracy"]) for c in r["checkpoints"]]
            xs = [c["minutes"] for c in r["checkpoints"]]
            ax.plot(xs, [i.mean for i in ivs], marker="o", color=ln.get_color(),
                    label=f"own pre-training, {r['model']} (x: random init.)")
            ax.fill_between(xs, [i.low for i in ivs], [i.high for i in ivs], color=ln.get_color(), alpha=0.15,
                            linewidth=0)
        ax.set_xscale("log")
        ax.set_xlim(right=top * 1.2)
        ax.set_xlabel("minutes of pre-training (log scale)")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(f"{task}, {n:,} labelled examples", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
