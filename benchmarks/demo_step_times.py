"""The demo's step times on this CPU, as its plan times them: a fine-tuning step of the tiny model and of
all-MiniLM-L6-v2 on each task in one thread, the tagger's both at its tagged tokens only (one a word, what
the demo runs) and at every token (the head and last layer over sub-word continuations and padding too),
and a pre-training step of the demo's model in two threads.

What the demo's plan reads, so a figure here says how much of the 20 minutes each line costs on a CPU class.
Run it natively and under the AVX2-only kernel limits (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2``), alone on the machine; the JSON names the CPU and any limit.

Run (from the repository root; about a minute each, after the demo's data is cached)::

    .venv/bin/python benchmarks/demo_step_times.py --json docs/results/demo_step_times.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python benchmarks/demo_step_times.py --json docs/results/demo_step_times-avx2.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()

    from bertforge import resources
    from bertforge.demo.run import DemoConfig, _finetuning, _random_init, time_finetuning_step, time_pretraining_step
    from bertforge.experiments.datasets import brown_split
    from bertforge.io import atomic_write_text
    from bertforge.text.vocab import learn_vocab
    from bertforge.train.precision import cpu_name, native_bf16

    cfg, device = DemoConfig(), torch.device("cpu")
    precision = "bf16" if native_bf16(device) else "fp32"
    finetuning = _finetuning(cfg, precision)
    (reviews, _), _ = resources.movie_review_split(cfg.mr_split_seed)
    brown, _ = brown_split(cfg.seed, 0.1)
    texts = {"movie reviews": reviews[:2000], "pos": [" ".join(words) for words, _ in brown[:2000]]}
    tags = len({t for _, ts in brown for t in ts})
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "text.txt"  # the demo's pre-training text: its vocab, its model's size
        corpus.write_text("\n\n".join([*resources.iter_wikipedia_leads(), *reviews]), encoding="utf-8")
        tok = learn_vocab([corpus], Path(tmp) / "vocab", vocab_size=cfg.vocab_size, show_progress=False)
        models = {"tiny": _random_init(Path(tmp) / "random", cfg, tok).folder(cfg.seed),
                  "all-MiniLM-L6-v2": resources.minilm_folder()}
        seconds: dict[str, float] = {}
        torch.set_num_threads(1)
        for name, folder in models.items():
            for task, text in texts.items():
                seconds[f"{name}, {task}"] = time_finetuning_step(folder, text, finetuning, device,
                                                                  tags=tags if task == "pos" else 0)
            seconds[f"{name}, pos, every token"] = time_finetuning_step(folder, texts["pos"], finetuning, device,
                                                                        tags=tags, tagged_only=False)
        torch.set_num_threads(2)
        seconds["tiny, pre-training (2 threads)"] = time_pretraining_step(cfg, tok.vocab_size, precision, device)
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpu": cpu_name(),
              "precision": precision, "batch_size": finetuning.batch_size,
              "seconds": {k: round(v, 4) for k, v in seconds.items()}}
    atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
