"""What int8 inference costs in accuracy: bertforge's ``--precision int8`` against fp32 on real weights
and real tasks.

Three measurements, each in fp32, int8 as this CPU runs it, int8 with 6-bit weights (what a CPU
without VNNI gets, `bertforge.fast.int8`: the product of 7-bit weights would saturate there; on this
CPU it is computed exactly, so the figures are those such a CPU gives) and, where the CPU has native
bf16, bf16:

* **Sentence vectors.** all-MiniLM-L6-v2 (`bertforge.resources.minilm_folder`, real weights), the
  mean over the last layer's tokens of the first ``--sentences`` (2,000) Wikipedia-lead sentences in
  corpus order, through ``bertforge features``' API (`bertforge.serving.features.extract_features`),
  128 tokens at most. Reported: the cosine of each sentence's vector with its fp32 vector, min and
  mean.
* **A movie-review classifier.** all-MiniLM-L6-v2 fine-tuned on the movie-review polarity sentences
  (`bertforge.experiments.datasets.task_files("movie-reviews")`: 90 % training, 10 % held out),
  ``--epochs`` (2) at lr 5e-5, batch 32, length 64, in bf16 where native (fp32 elsewhere); then
  ``bertforge evaluate``'s API (`bertforge.tasks.finetune.evaluate`) on the held-out 10 % in each
  precision: accuracy.
* **A tagger.** all-MiniLM-L6-v2 fine-tuned on Brown-corpus part-of-speech tags
  (``task_files("brown-pos")``, ``--tag-train`` sentences, ``--tag-dev`` held out), the same way:
  accuracy over words.

The targets (cosine >= 0.99 min and >= 0.995 mean; each task within 0.5 points of fp32) are printed
beside the figures. The fine-tuned models are kept in ``--work`` and reused by a later run with the
same settings.

Run (from the repository root)::

    .venv/bin/python benchmarks/int8_accuracy.py --json docs/results/int8_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inference import leads_sentences  # noqa: E402

from bertforge import resources  # noqa: E402
from bertforge.fast import int8 as int8_module  # noqa: E402
from bertforge.train.precision import cpu_name, native_bf16  # noqa: E402

SIX_BIT = "int8 (6-bit weights)"
TARGETS = {"cosine_min": 0.99, "cosine_mean": 0.995, "task_points": 0.5}


@contextmanager
def six_bit_weights():
    """int8 as a CPU without VNNI runs it: weights quantized to +-63."""
    saved = int8_module._kernel
    int8_module._kernel = lambda: (saved()[0], 63)
    try:
        yield
    finally:
        int8_module._kernel = saved


def precisions() -> list[str]:
    runs = ["fp32", "int8", SIX_BIT]
    return runs + (["bf16"] if native_bf16(torch.device("cpu")) else [])


def run_in(name: str, fn):
    """``fn(precision)`` for the run called ``name``."""
    if name == SIX_BIT:
        with six_bit_weights():
            return fn("int8")
    return fn(name)


def sentence_vectors(count: int) -> dict:
    from bertforge.serving.features import extract_features

    folder = resources.minilm_folder()
    texts = leads_sentences()[:count]
    got = {}
    for name in precisions():
        t0 = time.perf_counter()
        got[name] = run_in(name, lambda p: extract_features(folder, texts, pooling="mean", max_seq_length=128,
                                                            precision=p, device="cpu", progress=False).values)
        print(f"  sentence vectors, {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    ref = got["fp32"] / np.linalg.norm(got["fp32"], axis=1, keepdims=True)
    out = {}
    for name, vectors in got.items():
        cos = np.sum(ref * vectors / np.linalg.norm(vectors, axis=1, keepdims=True), axis=1)
        out[name] = {"cosine_min": round(float(cos.min()), 5), "cosine_mean": round(float(cos.mean()), 5)}
    return {"sentences": len(texts), "runs": out}


def fine_tuned(source: str, work: Path, epochs: float, **limits) -> tuple[Path, dict]:
    """all-MiniLM-L6-v2 fine-tuned on ``source``'s training split (kept in ``work``); its model folder
    and the task's settings."""
    from bertforge.experiments.datasets import task_files
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    settings = task_files(source, work / "data", **limits)
    out = work / "-".join([source, f"e{epochs:g}", *(f"{k}{v}" for k, v in sorted(limits.items()))])
    model = out / "model"
    if not (model / "config.json").is_file():
        t0 = time.perf_counter()
        finetune(FinetuneConfig(model=str(resources.minilm_folder()), out=str(out), overwrite=True, epochs=epochs,
                                lr=5e-5, batch_size=32, max_seq_length=64, precision="auto", keep_best=False,
                                progress=False, seed=0, **settings))
        print(f"  fine-tuned {source} in {time.perf_counter() - t0:.0f} s", flush=True)
    return model, settings


def task_scores(source: str, work: Path, epochs: float, **limits) -> dict:
    from bertforge.tasks.finetune import evaluate

    model, settings = fine_tuned(source, work, epochs, **limits)
    dev = settings.pop("dev_file")
    settings.pop("train_file")
    runs = {}
    for name in precisions():
        metrics = run_in(name, lambda p: evaluate(model, dev, precision=p, settings=settings))
        runs[name] = {"accuracy": round(float(metrics["accuracy"]), 5)}
        print(f"  {source}, {name}: accuracy {runs[name]['accuracy']:.4f}", flush=True)
    return {"task": settings["task"], "epochs": epochs, **limits, "dev_file": Path(dev).name, "runs": runs}


def table(results: dict) -> str:
    lines = ["| measure | " + " | ".join(precisions()) + " |", "|---" * (len(precisions()) + 1) + "|"]
    vec = results["sentence_vectors"]["runs"]
    for key in ("cosine_min", "cosine_mean"):
        lines.append(f"| MiniLM sentence vectors, {key.replace('_', ' ')} vs fp32 | "
                     + " | ".join(f"{vec[p][key]:.4f}" for p in precisions()) + " |")
    for name in ("movie_reviews", "brown_pos"):
        runs = results[name]["runs"]
        lines.append(f"| {name.replace('_', ' ')} accuracy (points vs fp32) | "
                     + " | ".join(f"{100 * runs[p]['accuracy']:.2f} ({100 * (runs[p]['accuracy'] - runs['fp32']['accuracy']):+.2f})"
                                  for p in precisions()) + " |")
    return "\n".join(lines)


def verdicts(results: dict) -> dict[str, bool]:
    out = {}
    vec = results["sentence_vectors"]["runs"]
    for name in ("int8", SIX_BIT):
        out[f"{name}: cosine min >= {TARGETS['cosine_min']}"] = vec[name]["cosine_min"] >= TARGETS["cosine_min"]
        out[f"{name}: cosine mean >= {TARGETS['cosine_mean']}"] = vec[name]["cosine_mean"] >= TARGETS["cosine_mean"]
        for task in ("movie_reviews", "brown_pos"):
            runs = results[task]["runs"]
            gap = 100 * abs(runs[name]["accuracy"] - runs["fp32"]["accuracy"])
            out[f"{name}: {task} within {TARGETS['task_points']} points"] = gap <= TARGETS["task_points"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Accuracy of int8 inference against fp32 (see the module docstring).")
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--tag-train", type=int, default=5000)
    p.add_argument("--tag-dev", type=int, default=1000)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "bertforge-bench" / "int8-accuracy"))
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    kernel, w_max = int8_module._kernel()
    machine = {"cpu": cpu_name(), "int8_kernel": kernel, "int8_w_max": w_max, "threads": torch.get_num_threads(),
               "torch": torch.__version__, "python": platform.python_version()}
    print(f"{machine['cpu']}; int8 kernel {kernel}, weights +-{w_max}", flush=True)
    results = {"machine": machine, "settings": vars(args) | {"work": None}, "targets": TARGETS}
    results["sentence_vectors"] = sentence_vectors(args.sentences)
    results["movie_reviews"] = task_scores("movie-reviews", work, args.epochs)
    results["brown_pos"] = task_scores("brown-pos", work, args.epochs, max_train=args.tag_train, max_dev=args.tag_dev)
    results["verdicts"] = verdicts(results)
    print(table(results))
    for what, ok in results["verdicts"].items():
        print(f"{'met' if ok else 'MISSED'}: {what}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
