"""The feature-based approach's speed-up: seconds per training epoch of ``finetune --features``
(after the first, which computes the frozen encoder's features once) against seconds per epoch of
fine-tuning, in the same run on the same data and machine. The target: feature-based epochs after
the first are at least 5x faster than fine-tuning epochs (the encoder no longer runs).

Model: ``--model`` (a checkpoint folder with its tokenizer), or by default a randomly initialised
BERT-base (12 layers, hidden 768: the paper's Table 7 encoder; weights do not change the time)
saved with a small vocabulary in the run folder. Data: ``--sentences`` generated CoNLL sentences of
5-30 words with random entity tags (the tags do not change the time either). Both runs train with
batch ``--batch-size`` at ``--max-seq-length``, no dev file; fine-tuning ``--finetune-epochs``
epochs; the feature-based run ``--epochs`` epochs with ``--features`` and a BiLSTM of ``--bilstm-size`` per direction (the
paper's 768).

Figures (seconds): "fine-tune epochs" are the Trainer's own clock (``time`` of metrics.jsonl) per
fine-tuning epoch; "cache" the one pass of the frozen encoder over the training windows (wall
clock of `bertforge.tasks.feature_based.cache_features`); "feature epochs" the Trainer's clock per
epoch of the feature-based run (it never includes the cache: the pass runs before training);
"first feature epoch" its first plus the cache. The first epoch of either run also pays one-time
costs (allocations, kernels set up per shape), so the speed-up compares epochs after the first:
the mean fine-tuning epoch after the first (the first when it ran one) over the mean feature
epoch after the first.

    python benchmarks/feature_based.py --sentences 256 --out runs/bench-features
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path
from statistics import mean

import torch

from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForPreTraining
from bertforge.tasks import feature_based, finetune as recipe
from bertforge.tasks.finetune import FinetuneConfig, finetune

WORDS = ["the", "a", "river", "city", "walked", "stone", "green", "house", "road", "over", "under", "through",
         "garden", "field", "tree", "singer", "painter", "teacher", "mountain", "young", "old", "by", "and", "of"]
TAGS = ["O", "O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def write_vocab_model(folder: Path) -> None:
    """A random BERT-base with a vocabulary of ``WORDS`` (plus the specials)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512)
    BertForPreTraining(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text("".join(w + "\n" for w in vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}) + "\n", encoding="utf-8")


def write_conll(path: Path, sentences: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        lines += [f"{rng.choice(WORDS)} {rng.choice(TAGS)}" for _ in range(rng.randint(5, 30))] + [""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def epoch_times(out: Path) -> list[float]:
    """The Trainer's seconds per epoch (its train lines are logged once per epoch)."""
    times = [r["time"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]
    return [b - a for a, b in zip([0.0, *times], times)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="checkpoint folder (default: a random BERT-base)")
    p.add_argument("--out", default="runs/bench-features")
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=64)
    p.add_argument("--features", default="concat-last-4")
    p.add_argument("--bilstm-size", type=int, default=768)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--finetune-epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if not model:
        model = str(out / "bert-base-random")
        if not (Path(model) / "config.json").is_file():
            write_vocab_model(Path(model))
    train = out / "train.conll"
    write_conll(train, args.sentences, seed=1)
    common = dict(task="ner", model=model, train_file=str(train), batch_size=args.batch_size,
                  max_seq_length=args.max_seq_length, keep_best=False, progress=False, overwrite=True,
                  checkpoint_every=10**9)

    steps = len(recipe.prepare_data(FinetuneConfig(**common, out=str(out / "probe"))).train.encoded) // args.batch_size
    finetune(FinetuneConfig(**common, out=str(out / "finetune"), epochs=args.finetune_epochs, log_every=steps))
    tuned_epochs = epoch_times(out / "finetune")
    tuned = mean(tuned_epochs[1:] or tuned_epochs)

    cache_seconds: list[float] = []
    original = feature_based.cache_features

    def timed(*a, **k):
        start = time.perf_counter()
        got = original(*a, **k)
        cache_seconds.append(time.perf_counter() - start)
        return got

    recipe.cache_features = timed  # the recipe's own name for it
    try:
        finetune(FinetuneConfig(**common, out=str(out / "features"), epochs=args.epochs, log_every=steps,
                                features=args.features, bilstm_size=args.bilstm_size, lr=1e-3))
    finally:
        recipe.cache_features = original
    per_epoch = epoch_times(out / "features")
    feature_epoch = mean(per_epoch[1:] or per_epoch)
    result = {"model": model, "sentences": args.sentences, "steps_per_epoch": steps, "features": args.features,
              "bilstm_size": args.bilstm_size, "finetune_epochs_s": [round(t, 3) for t in tuned_epochs],
              "cache_s": round(cache_seconds[0], 3),
              "feature_epochs_s": [round(t, 3) for t in per_epoch],
              "first_feature_epoch_s": round(per_epoch[0] + cache_seconds[0], 3),
              "speedup": round(tuned / feature_epoch, 2), "target": 5.0}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
